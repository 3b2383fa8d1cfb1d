"""PyTorch peer of train_gpt for bench/compare_torch.sh: the same character-level GPT, data and recipe,
timed the same way, so tokens/s compare like for like.

Model (as nn/gpt.h): token + position embeddings, L pre-LN blocks x + attn(ln1(x)), x + mlp(ln2(x)),
causal multi-head attention with one fused qkv Linear, MLP Linear(C, 4C) -> tanh GELU -> Linear(4C, C),
final LayerNorm, LM head tied to the token embedding; biases on; initialisation of GPT-2 / nanoGPT
(N(0, 0.02), residual projections N(0, 0.02 / sqrt(2L)), zero biases).
Recipe (train_gpt's defaults, nanoGPT's CPU recipe): 4 layers, 4 heads, 128 channels, block 64, batch
12, AdamW lr 1e-3 (betas 0.9, 0.99, weight decay 0.1 on matrices only), 100 warm-up steps then cosine
to 1e-4, gradient clipping at 1.0, dropout 0.
Data: the file's distinct bytes are the vocabulary; first 90% train, last 10% validation; each step draws
`batch` random windows from a seeded generator.
Timing: wall time of each whole step (batch, forward, backward, clip, AdamW); the first min(5, steps - 1)
steps are left out of tokens/s, as in train_gpt.

usage (Debian's python3-torch, so /usr/bin/python3):
  /usr/bin/python3 bench/torch_gpt.py --data data/tinyshakespeare.txt --steps 100 --threads 1
The last line is "done: ... tokens_per_s N ..."; --metrics writes the same keys as train_gpt's
(tokens_per_s, ms_per_step, train_loss, val_loss, params, ...).
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ModuleNotFoundError as e:  # one line naming the package and how to get it, as the programs fail
    if e.name.split(".")[0] != "torch":
        raise
    sys.exit(f"error: bench/torch_gpt.py needs torch, which {sys.executable} cannot import: "
             "apt-get install python3-torch, then run it with /usr/bin/python3")


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0: the fused kernel
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // self.n_head))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = scores.masked_fill(mask, float("-inf")).softmax(dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.fc2 = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.lnf = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif ".ln" in name or name.startswith("lnf."):
                nn.init.ones_(p)
            elif name.endswith("proj.weight") or name.endswith("fc2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def add_recipe_args(p):
    """The flags train_gpt and both PyTorch peers share, with train_gpt's defaults."""
    p.add_argument("--data", default="data/tinyshakespeare.txt")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=12, help="sequences per step, all ranks together")
    p.add_argument("--block", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.99)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--eval-iters", type=int, default=20)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--metrics", default="", help="write a JSON summary here")


def load_text(path, block):
    """Byte-level vocabulary, 90/10 split: (train, val, vocab_size) with tensors of token ids."""
    with open(path, "rb") as f:
        raw = f.read()
    vocab = sorted(set(raw))
    if len(raw) < 10 * (block + 1):
        raise SystemExit(f"error: {path} is too short for --block {block}")
    lut = torch.zeros(256, dtype=torch.long)
    lut[torch.tensor(vocab)] = torch.arange(len(vocab))
    ids = lut[torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()]
    n = int(0.9 * len(ids))
    return ids[:n], ids[n:], len(vocab)


def get_batch(ids, batch, block, gen):
    starts = torch.randint(0, len(ids) - block, (batch,), generator=gen)
    x = torch.stack([ids[s:s + block] for s in starts.tolist()])
    y = torch.stack([ids[s + 1:s + block + 1] for s in starts.tolist()])
    return x, y


def lr_at(step, a):
    """Linear warm-up to lr, then cosine to min_lr at the last step (train_gpt's schedule)."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    span = max(1, a.steps - a.warmup)
    progress = min(1.0, (step - a.warmup) / span)
    return a.min_lr + 0.5 * (a.lr - a.min_lr) * (1.0 + math.cos(math.pi * progress))


def param_groups(model, weight_decay):
    """nanoGPT's rule: decay matrices (dim >= 2), not biases or LayerNorm weights."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate(model, ids, a, gen, micro):
    model.eval()
    losses = [model(*get_batch(ids, micro, a.block, gen)).item() for _ in range(a.eval_iters)]
    model.train()
    return sum(losses) / len(losses)


def write_metrics(path, metrics):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(metrics, f, indent=2)
    os.replace(tmp, path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_recipe_args(p)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    torch.set_num_threads(a.threads)
    train, val, vocab = load_text(a.data, a.block)
    model = GPT(vocab, a.block, a.n_layer, a.n_head, a.n_embd)
    params = sum(t.numel() for t in model.parameters())
    opt = torch.optim.AdamW(param_groups(model, a.weight_decay), lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8)
    gen = torch.Generator().manual_seed(a.seed + 1)
    warmup_steps = min(5, a.steps - 1)
    train_seconds = 0.0
    loss = float("nan")
    for step in range(a.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, y = get_batch(train, a.batch, a.block, gen)
        out = model(x, y)
        opt.zero_grad(set_to_none=True)
        out.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= warmup_steps:
            train_seconds += dt
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            loss = out.item()
            print(f"step {step + 1:5d}/{a.steps} | loss {loss:.4f} | {1000 * dt:.1f} ms/step", flush=True)
    timed = a.steps - warmup_steps
    tokens_per_s = timed * a.batch * a.block / train_seconds
    val_loss = evaluate(model, val, a, gen, a.batch)
    print(f"done: params {params} | train loss {loss:.4f} | val loss {val_loss:.4f} | "
          f"tokens_per_s {tokens_per_s:.0f} | ms_per_step {1000 * train_seconds / timed:.2f} | "
          f"torch {torch.__version__}, {a.threads} thread(s)")
    if a.metrics:
        write_metrics(a.metrics, {"params": params, "steps": a.steps, "batch": a.batch, "block": a.block,
                                  "threads": a.threads, "world_size": 1, "tokens_per_s": tokens_per_s,
                                  "ms_per_step": 1000 * train_seconds / timed, "train_loss": loss,
                                  "val_loss": val_loss, "torch": torch.__version__})


if __name__ == "__main__":
    main()
