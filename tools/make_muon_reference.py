"""Writes tests/data/muon_reference.json, the PyTorch reference that zero.cpp's Muon test compares against.

Independent of zero.cpp's optim/muon.cpp: plain torch ops (PyTorch 1.13 has no torch.optim.Muon), written from
the published descriptions:
  - the quintic Newton-Schulz iteration of K. Jordan's Muon (blog post "Muon: An optimizer for hidden layers in
    neural networks", 2024; the nanoGPT speedrun): X = G / (||G||_F + 1e-7), transposed when rows > cols, then
    5 times A = X X^T, B = b A + c A A, X = a X + B X with (a, b, c) = (3.4445, -4.7750, 2.0315); run in fp32
    here (zero.cpp's choice, Note [Newton-Schulz precision] in optim/muon.cpp);
  - Nesterov momentum as torch.optim.Muon (PyTorch 2.9) writes it: buf = lerp(buf, g, 1 - mu),
    update = lerp(g, buf, mu);
  - Moonlight's update scale (Liu et al., arXiv 2502.16982, eq. 4): W = W (1 - lr wd) - lr 0.2 sqrt(max(m, n)) O.
The model, weights and batch are tools/make_gpt_reference.py's (same seed, same draw order). Muon takes the
2-D hidden matrices (blocks.*.attn.qkv/proj, blocks.*.mlp.fc/fc2 weights); AdamW takes wte, wpe (decayed)
and the 1-D parameters (not decayed), as the speedrun and Moonlight split them.

The JSON holds:
  newton_schulz  two random matrices (3x5 wide, 6x4 tall) and their 5-step Newton-Schulz results
  muon           the hyperparameters, the names of the Muon matrices, the losses of 5 steps from the initial
                 weights on the same batch (forward, record loss, zero_grad, backward, clip_grad_norm_(1.0),
                 step), and every parameter after the 5 steps
Floats are written with 9 significant digits (exact round trip for float32).

usage (from the repo root, with Debian's /usr/bin/python3 and python3-torch, as make_gpt_reference.py):
  /usr/bin/python3 tools/make_muon_reference.py
Deterministic (fixed seed, one thread). CI never runs it: the test reads the committed file.
"""
import copy, json, math, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_gpt_reference as ref  # noqa: E402  (exits with one line when torch is missing)
import torch  # noqa: E402

NS_A, NS_B, NS_C, NS_EPS = 3.4445, -4.7750, 2.0315, 1e-7
LR, MOMENTUM, NS_STEPS, BETAS, EPS, WD, CLIP, STEPS = 0.01, 0.95, 5, (0.9, 0.99), 1e-8, 0.1, 1.0, 5


def newton_schulz(G, steps=NS_STEPS):
    X = G.clone().float()
    tall = X.shape[0] > X.shape[1]
    if tall:
        X = X.t()
    X = X / (X.norm() + NS_EPS)
    for _ in range(steps):
        A = X @ X.t()
        B = NS_B * A + NS_C * (A @ A)
        X = NS_A * X + B @ X
    return X.t() if tall else X


def is_muon(name, p):
    return p.dim() == 2 and name.startswith('blocks.')


class Muon:
    """Muon for the hidden matrices, AdamW (torch.optim.AdamW) for the rest; one lr for both."""

    def __init__(self, model):
        named = list(model.named_parameters())
        self.muon = [p for n, p in named if is_muon(n, p)]
        decay = [p for n, p in named if not is_muon(n, p) and p.dim() >= 2]
        no_decay = [p for n, p in named if p.dim() < 2]
        self.adamw = torch.optim.AdamW([{'params': decay, 'weight_decay': WD},
                                        {'params': no_decay, 'weight_decay': 0.0}], lr=LR, betas=BETAS, eps=EPS)
        self.bufs = [torch.zeros_like(p) for p in self.muon]

    @torch.no_grad()
    def step(self):
        for p, buf in zip(self.muon, self.bufs):
            g = p.grad
            buf.lerp_(g, 1 - MOMENTUM)
            u = g.lerp(buf, MOMENTUM)
            o = newton_schulz(u)
            p.mul_(1 - LR * WD)
            p.add_(o, alpha=-LR * 0.2 * math.sqrt(max(p.shape)))
        self.adamw.step()

    def zero_grad(self):
        for p in self.muon:
            p.grad = None
        self.adamw.zero_grad()


def main():
    torch.manual_seed(ref.SEED); torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    m = ref.GPT(ref.V, ref.C, ref.L, ref.H, ref.T)
    idx = torch.randint(0, ref.V, (ref.B, ref.T)); tgt = torch.randint(0, ref.V, (ref.B, ref.T))
    wide, tall = torch.randn(3, 5), torch.randn(6, 4)
    names = [n for n, p in m.named_parameters() if is_muon(n, p)]

    opt = Muon(m)
    losses = []
    for _ in range(STEPS):
        _, l = m(idx, tgt)
        losses.append(ref.flt(l.item()))
        opt.zero_grad(); l.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), CLIP); opt.step()

    def mat(t): return {'shape': list(t.shape), 'data': ref.flat(t)}
    out = {
        'newton_schulz': {'steps': NS_STEPS, 'inputs': [mat(wide), mat(tall)],
                          'outputs': [mat(newton_schulz(wide)), mat(newton_schulz(tall))]},
        'muon': {'lr': LR, 'momentum': MOMENTUM, 'nesterov': True, 'ns_steps': NS_STEPS, 'betas': list(BETAS),
                 'eps': EPS, 'weight_decay': WD, 'clip': CLIP, 'muon_params': names, 'losses': losses},
        'params': {n: ref.flat(p) for n, p in m.named_parameters()},
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'data', 'muon_reference.json')
    with open(path, 'w') as f: f.write(ref.dump(out))
    print(f'wrote {os.path.normpath(path)} ({os.path.getsize(path)} bytes) muon losses {losses}')


if __name__ == '__main__':
    main()
