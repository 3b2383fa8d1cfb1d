"""Loads a train_gpt checkpoint's model.safetensors into a PyTorch GPT of the same shape and compares its
logits on a fixed input with zero.cpp's (sample_gpt --logits): interop of the weights file.

The PyTorch model is tools/make_gpt_reference.py's (same math and parameter names as zero.cpp's GPT).
The file is read with struct + json (Debian's torch 1.13 has no safetensors module). Use an fp32
checkpoint: a 16-bit run's sample_gpt computes with the weights rounded to 16 bits, PyTorch here in fp32.

usage (needs Debian's python3-torch, so /usr/bin/python3; CI does not run this):
  /usr/bin/python3 tools/compare_torch_logits.py --bin build/bin --checkpoint out/ [--prompt "ROMEO:"]
  /usr/bin/python3 tools/compare_torch_logits.py --bin build/bin --data data/tinyshakespeare.txt
      (no --checkpoint: trains train_gpt's default model for 50 steps into a temporary directory first)
Prints the largest absolute logit difference and exits non-zero if it exceeds --tol (1e-5).
"""
import argparse, json, os, struct, subprocess, sys, tempfile

try:
    import torch
except ModuleNotFoundError as e:  # one line naming the package and how to get it, as the programs fail
    if e.name.split(".")[0] != "torch":
        raise
    sys.exit(f"error: tools/compare_torch_logits.py needs torch, which {sys.executable} cannot import: "
             "apt-get install python3-torch, then run it with /usr/bin/python3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_gpt_reference import GPT  # noqa: E402


def read_safetensors(path):
    with open(path, 'rb') as f:
        blob = f.read()
    (n,) = struct.unpack('<Q', blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop('__metadata__', None)
    data = blob[8 + n:]
    out = {}
    for name, e in header.items():
        assert e['dtype'] == 'F32', (name, e['dtype'])
        b, end = e['data_offsets']
        count = (end - b) // 4
        out[name] = torch.tensor(struct.unpack(f'<{count}f', data[b:end]), dtype=torch.float32).reshape(e['shape'])
    return out


def resolve(path):
    if os.path.exists(os.path.join(path, 'state.json')):
        return path
    with open(os.path.join(path, 'latest')) as f:
        return os.path.join(path, f.read().strip())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--bin', required=True, help='directory holding train_gpt and sample_gpt')
    ap.add_argument('--checkpoint', help='checkpoint or save directory (default: train one)')
    ap.add_argument('--data', help='text to train on when no --checkpoint is given')
    ap.add_argument('--prompt', default='ROMEO:\nWhat light through yonder window breaks?')
    ap.add_argument('--tol', type=float, default=1e-5)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix='zero_torch_')
    ckpt = args.checkpoint
    if ckpt is None:
        assert args.data, 'give --checkpoint or --data'
        ckpt = os.path.join(work, 'ck')
        subprocess.run([os.path.join(args.bin, 'train_gpt'), '--data', args.data, '--steps', '50', '--eval-iters', '2',
                        '--sample', '0', '--save-dir', ckpt], check=True, stdout=subprocess.DEVNULL)
    ckpt = resolve(ckpt)
    with open(os.path.join(ckpt, 'state.json')) as f:
        state = json.load(f)
    m = state['model']
    assert state['dtype'] == 'f32', 'compare an fp32 checkpoint (see the docstring)'
    logits_path = os.path.join(work, 'logits.safetensors')
    subprocess.run([os.path.join(args.bin, 'sample_gpt'), '--checkpoint', ckpt, '--prompt', args.prompt,
                    '--logits', logits_path], check=True)
    ours = read_safetensors(logits_path)

    torch.set_num_threads(1)
    model = GPT(m['vocab_size'], m['n_embd'], m['n_layer'], m['n_head'], m['block_size'])
    missing, unexpected = model.load_state_dict(read_safetensors(os.path.join(ckpt, 'model.safetensors')), strict=False)
    assert missing == ['head.weight'] and not unexpected, (missing, unexpected)  # head is tied to wte
    assert model.head.weight is model.wte.weight
    model.eval()
    idx = ours['idx'].to(torch.int64)
    with torch.no_grad():
        theirs, _ = model(idx, idx)
    diff = (theirs - ours['logits']).abs().max().item()
    print(f'{ckpt}: logits {list(theirs.shape)} on a {idx.shape[1]}-character prompt; '
          f'max |torch - zero.cpp| = {diff:.3g} (largest |logit| {theirs.abs().max().item():.3g})')
    sys.exit(0 if diff <= args.tol else 1)


if __name__ == '__main__':
    main()
