"""Writes tests/data/gpt_reference.json, the PyTorch reference that zero.cpp's GPT test compares against.

The model is the same math as bench/torch_gpt.py (pre-LN nanoGPT block, tanh GELU, causal
attention, head weight tied to wte.weight), with the module names of zero.cpp's GPT so that parameter
names match its state_dict: wte, wpe, blocks.{i}.ln1, blocks.{i}.attn.qkv, blocks.{i}.attn.proj,
blocks.{i}.ln2, blocks.{i}.mlp.fc, blocks.{i}.mlp.fc2, lnf, head (tied, so absent from named_parameters()).
Tiny config: vocab 13, 2 layers, 2 heads, n_embd 12, block 8, batch 2; fp32 throughout, dropout 0.
Initial weights are deliberately large and non-trivial so every path is exercised: Linear/Embedding
weights N(0, 0.2), biases N(0, 0.1), LayerNorm weights 1 + N(0, 0.1), LayerNorm biases N(0, 0.1).

The JSON holds:
  config       the model/batch sizes
  params       every named_parameters() entry: {"shape": [...], "data": [flat row-major floats]}
  param_order  the named_parameters() order
  idx, targets the [B, T] integer batch
  logits       {"shape": [B, T, V], "data": [...]} from the initial weights
  loss         mean cross-entropy over all B*T positions
  grads        d loss / d param after one backward (head's gradient is summed into wte.weight)
  adamw        lr, betas, eps, weight_decay, clip and the losses of 5 steps from the initial weights
               on the same batch: forward, record loss, zero_grad, backward, clip_grad_norm_(1.0),
               AdamW step (weight decay 0.1 for params with dim >= 2, 0.0 otherwise); losses[0] == loss
Floats are written with 9 significant digits (exact round trip for float32).

usage (from the repo root; needs Debian's python3-torch, so Debian's /usr/bin/python3, not a pyenv python;
unsetting OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as for the benchmarks is not needed):
  /usr/bin/python3 tools/make_gpt_reference.py
The output is deterministic (fixed seed, one thread). CI never runs this script: the test only reads the
committed tests/data/gpt_reference.json. Rerun it and commit the result only if the reference must change.
"""
import copy, json, math, os, sys

try:
    import torch, torch.nn as nn, torch.nn.functional as F
except ModuleNotFoundError as e:  # one line naming the package and how to get it, as the programs fail
    if e.name.split(".")[0] != "torch":
        raise
    sys.exit(f"error: tools/make_gpt_reference.py needs torch, which {sys.executable} cannot import: "
             "apt-get install python3-torch, then run it with /usr/bin/python3")

V, L, H, C, T, B = 13, 2, 2, 12, 8, 2
SEED = 1234
LR, BETAS, EPS, WD, CLIP, STEPS = 0.01, (0.9, 0.99), 1e-8, 0.1, 1.0, 5


class Attention(nn.Module):
    def __init__(s, C, H):
        super().__init__(); s.H = H
        s.qkv = nn.Linear(C, 3 * C); s.proj = nn.Linear(C, C)

    def forward(s, x):
        B, T, C = x.shape
        q, k, v = s.qkv(x).split(C, dim=2)
        q, k, v = [t.view(B, T, s.H, C // s.H).transpose(1, 2) for t in (q, k, v)]
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.H)
        att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float('-inf')).softmax(-1)
        return s.proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(s, C):
        super().__init__()
        s.fc = nn.Linear(C, 4 * C); s.fc2 = nn.Linear(4 * C, C)

    def forward(s, x):
        return s.fc2(F.gelu(s.fc(x), approximate='tanh'))


class Block(nn.Module):
    def __init__(s, C, H):
        super().__init__()
        s.ln1 = nn.LayerNorm(C, eps=1e-5); s.attn = Attention(C, H)
        s.ln2 = nn.LayerNorm(C, eps=1e-5); s.mlp = MLP(C)

    def forward(s, x):
        x = x + s.attn(s.ln1(x))
        return x + s.mlp(s.ln2(x))


class GPT(nn.Module):
    def __init__(s, V, C, L, H, T):
        super().__init__()
        s.wte = nn.Embedding(V, C); s.wpe = nn.Embedding(T, C)
        s.blocks = nn.ModuleList([Block(C, H) for _ in range(L)])
        s.lnf = nn.LayerNorm(C, eps=1e-5)
        s.head = nn.Linear(C, V, bias=False); s.head.weight = s.wte.weight
        with torch.no_grad():
            for name, p in s.named_parameters():  # in named_parameters() order, so the draw is fixed
                is_ln = name.startswith('lnf.') or '.ln1.' in name or '.ln2.' in name
                if is_ln and name.endswith('weight'): p.copy_(1.0 + 0.1 * torch.randn_like(p))
                elif name.endswith('bias'): p.normal_(0.0, 0.1)
                else: p.normal_(0.0, 0.2)

    def forward(s, idx, tgt):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1]))
        for b in s.blocks: x = b(x)
        logits = s.head(s.lnf(x))
        return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))


def flt(x):
    return float(f'{x:.9g}')


def flat(t):
    return [flt(x) for x in t.detach().reshape(-1).tolist()]


def dump(obj):
    """Compact JSON, one top-level key (and one entry of params/grads) per line."""
    def j(v): return json.dumps(v, separators=(',', ':'))
    lines = []
    for k, v in obj.items():
        if k in ('params', 'grads'):
            inner = ',\n'.join(f'  {j(n)}:{j(e)}' for n, e in v.items())
            lines.append(f' {j(k)}:{{\n{inner}\n }}')
        else:
            lines.append(f' {j(k)}:{j(v)}')
    return '{\n' + ',\n'.join(lines) + '\n}\n'


def main():
    torch.manual_seed(SEED); torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    m = GPT(V, C, L, H, T)
    m0 = copy.deepcopy(m)  # initial weights for the AdamW run (deepcopy keeps the head/wte tie)
    idx = torch.randint(0, V, (B, T)); tgt = torch.randint(0, V, (B, T))
    names = [n for n, _ in m.named_parameters()]
    assert 'head.weight' not in names and m.head.weight is m.wte.weight

    params = {n: {'shape': list(p.shape), 'data': flat(p)} for n, p in m.named_parameters()}
    logits, loss = m(idx, tgt)
    loss.backward()
    grads = {n: flat(p.grad) for n, p in m.named_parameters()}

    decay = [p for p in m0.parameters() if p.dim() >= 2]; no_decay = [p for p in m0.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{'params': decay, 'weight_decay': WD}, {'params': no_decay, 'weight_decay': 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for _ in range(STEPS):
        _, l = m0(idx, tgt)
        losses.append(flt(l.item()))
        opt.zero_grad(); l.backward()
        torch.nn.utils.clip_grad_norm_(m0.parameters(), CLIP); opt.step()
    assert losses[0] == flt(loss.item())

    out = {
        'config': {'vocab_size': V, 'n_layer': L, 'n_head': H, 'n_embd': C, 'block_size': T, 'batch': B},
        'params': params,
        'param_order': names,
        'idx': idx.tolist(), 'targets': tgt.tolist(),
        'logits': {'shape': list(logits.shape), 'data': flat(logits)},
        'loss': flt(loss.item()),
        'grads': grads,
        'adamw': {'lr': LR, 'betas': list(BETAS), 'eps': EPS, 'weight_decay': WD, 'clip': CLIP, 'losses': losses},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'data', 'gpt_reference.json')
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f: f.write(dump(out))
    print(f'wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes) loss {out["loss"]} adamw losses {losses}')


if __name__ == '__main__':
    main()
