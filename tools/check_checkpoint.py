"""Reads a train_gpt checkpoint with Python's standard library only (struct, json, zlib): an
independent reader of model.safetensors and the optimizer shards, run by ctest.

It trains a tiny model with the train_gpt binary given, then checks, from the public safetensors
layout (8-byte little-endian header length, JSON header, raw little-endian data) and nothing else:
  - model.safetensors holds exactly the GPT's parameters, named and shaped as nanoGPT / PyTorch name
    them (the list is built here from state.json's "model", the fields nn::GPTConfig::to_json writes:
    sizes, bias, norm), all F32, back to back in that order, with data_offsets that tile the data
    section and a file exactly as long as the header says;
  - every value is finite, LayerNorm weights are near 1 after a few steps;
  - the CRC-32 of every file equals state.json's (zlib.crc32);
  - the optimizer shards' flat ranges tile [0, numel) and each holds exp_avg / exp_avg_sq of that length.

usage: python3 tools/check_checkpoint.py build/bin/train_gpt
"""
import json, math, os, shutil, struct, subprocess, sys, tempfile, zlib


def read_safetensors(path):
    with open(path, 'rb') as f:
        blob = f.read()
    (n,) = struct.unpack('<Q', blob[:8])
    header = json.loads(blob[8:8 + n].decode('utf-8'))
    return header, blob[8 + n:], len(blob)


def expected_params(m):
    """The parameters of the GPT that state.json's "model" describes. "bias" and "norm" default as
    GPTConfig::from_json defaults them (a checkpoint written before the field existed)."""
    C, V, T = m['n_embd'], m['vocab_size'], m['block_size']
    bias, norm = m.get('bias', True), m.get('norm', 'layernorm')
    assert norm in ('layernorm', 'rmsnorm'), norm

    def norm_layer(name):  # LayerNorm has a weight and a bias, RMSNorm a weight only
        return [(name + '.weight', [C])] + ([(name + '.bias', [C])] if norm == 'layernorm' else [])

    def linear(name, n_out, n_in):  # biases only when the config has them
        return [(name + '.weight', [n_out, n_in])] + ([(name + '.bias', [n_out])] if bias else [])

    out = [('wte.weight', [V, C]), ('wpe.weight', [T, C])]
    for i in range(m['n_layer']):
        b = f'blocks.{i}.'
        out += (norm_layer(b + 'ln1') + linear(b + 'attn.qkv', 3 * C, C) + linear(b + 'attn.proj', C, C) +
                norm_layer(b + 'ln2') + linear(b + 'mlp.fc', 4 * C, C) + linear(b + 'mlp.fc2', C, 4 * C))
    return out + norm_layer('lnf')


def check(ckpt):
    with open(os.path.join(ckpt, 'state.json')) as f:
        state = json.load(f)
    for name, info in state['files'].items():
        with open(os.path.join(ckpt, name), 'rb') as f:
            data = f.read()
        assert len(data) == info['bytes'], (name, len(data), info['bytes'])
        assert zlib.crc32(data) == info['crc32'], f'{name}: CRC-32 differs from state.json'

    header, data, size = read_safetensors(os.path.join(ckpt, 'model.safetensors'))
    header.pop('__metadata__', None)
    want = expected_params(state['model'])
    assert sorted(header) == sorted(n for n, _ in want), (sorted(header), want)
    offset = 0
    for name, shape in want:
        e = header[name]
        assert e['dtype'] == 'F32', (name, e['dtype'])
        assert e['shape'] == shape, (name, e['shape'], shape)
        count = math.prod(shape)
        assert e['data_offsets'] == [offset, offset + 4 * count], (name, e['data_offsets'], offset)
        values = struct.unpack(f'<{count}f', data[offset:offset + 4 * count])
        assert all(math.isfinite(v) for v in values), name
        if name.endswith(('ln1.weight', 'ln2.weight', 'lnf.weight')):
            assert all(abs(v - 1.0) < 0.1 for v in values), name
        offset += 4 * count
    assert offset == len(data), (offset, len(data))
    numel = offset // 4
    assert numel == state['numel'], (numel, state['numel'])

    covered = 0
    for s in sorted(state['shards'], key=lambda s: s['flat_begin']):
        h, d, _ = read_safetensors(os.path.join(ckpt, s['file']))
        meta = h.pop('__metadata__')
        assert int(meta['flat_begin']) == s['flat_begin'] and int(meta['flat_end']) == s['flat_end'], s
        length = s['flat_end'] - s['flat_begin']
        if length:
            assert s['flat_begin'] == covered, (s, covered)
            covered = s['flat_end']
        for t in ('exp_avg', 'exp_avg_sq'):
            assert h[t]['dtype'] == 'F32' and h[t]['shape'] == [length], (s['file'], t, h[t])
        v = struct.unpack(f'<{length}f', d[h['exp_avg_sq']['data_offsets'][0]:h['exp_avg_sq']['data_offsets'][1]])
        assert all(x >= 0 for x in v), 'exp_avg_sq must be non-negative'
    assert covered == numel, (covered, numel)
    return len(want), numel


def main():
    train_gpt = os.path.abspath(sys.argv[1])
    work = tempfile.mkdtemp(prefix='zero_ckpt_py_')
    try:
        text = os.path.join(work, 'text.txt')
        with open(text, 'w') as f:
            f.write(''.join(f'All the world is a stage, and all the men and women merely players {i}\n'
                            for i in range(50)))
        for norm in ('layernorm', 'rmsnorm'):
            save = os.path.join(work, 'ck_' + norm)
            subprocess.run([train_gpt, '--data', text, '--n-layer', '2', '--n-head', '2', '--n-embd', '16',
                            '--block', '16', '--batch', '8', '--steps', '3', '--eval-iters', '1', '--sample', '0',
                            '--threads', '1', '--norm', norm, '--save-dir', save], check=True,
                           stdout=subprocess.DEVNULL)
            with open(os.path.join(save, 'latest')) as f:
                ckpt = os.path.join(save, f.read().strip())
            with open(os.path.join(ckpt, 'state.json')) as f:
                assert json.load(f)['model']['norm'] == norm, 'state.json does not record the norm'
            tensors, numel = check(ckpt)
            print(f'ok: {ckpt}: {tensors} tensors, {numel} parameters, names/shapes/dtypes/offsets/CRC-32 '
                  'verified')
    finally:
        shutil.rmtree(work)


if __name__ == '__main__':
    main()
