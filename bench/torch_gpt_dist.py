"""Data-parallel PyTorch peer of `mpirun -np N train_gpt`: the GPT of bench/torch_gpt.py on N CPU
processes over gloo, with DistributedDataParallel (gradients all-reduced in buckets during backward:
ZeRO stage 0) or, with --zero, DDP plus torch.distributed.optim.ZeroRedundancyOptimizer (each rank
keeps and steps the AdamW state of its shard of the parameters, then broadcasts it: optimizer-state
partitioning, ZeRO stage 1).

As train_gpt, --batch is the global batch: every rank draws the same global batch from the same seeded
generator and trains on rows [rank * B/N, (rank + 1) * B/N), so runs with different N follow the same
trajectory; tokens/s counts the whole batch, timed from rank 0 as in torch_gpt.py.

usage (Debian's python3-torch; the script starts its N processes itself, on 127.0.0.1):
  /usr/bin/python3 bench/torch_gpt_dist.py --world-size 2 [--zero] --data data/tinyshakespeare.txt --steps 100
"""
import argparse
import os
import socket
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.nn.parallel import DistributedDataParallel
except ModuleNotFoundError as e:  # one line naming the package and how to get it, as the programs fail
    if e.name.split(".")[0] != "torch":
        raise
    sys.exit(f"error: bench/torch_gpt_dist.py needs torch, which {sys.executable} cannot import: "
             "apt-get install python3-torch, then run it with /usr/bin/python3")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_gpt import GPT, add_recipe_args, evaluate, get_batch, load_text, lr_at, param_groups, write_metrics  # noqa: E402


def run(rank, a, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=a.world_size)
    torch.manual_seed(a.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    torch.set_num_threads(a.threads)
    train, val, vocab = load_text(a.data, a.block)
    micro = a.batch // a.world_size
    model = DistributedDataParallel(GPT(vocab, a.block, a.n_layer, a.n_head, a.n_embd))
    params = sum(t.numel() for t in model.parameters())
    groups = param_groups(model.module, a.weight_decay)
    kw = dict(lr=a.lr, betas=(a.beta1, a.beta2), eps=1e-8)
    if a.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        opt = ZeroRedundancyOptimizer(groups[0]["params"], optimizer_class=torch.optim.AdamW,
                                      weight_decay=groups[0]["weight_decay"], **kw)
        opt.add_param_group(groups[1])
    else:
        opt = torch.optim.AdamW(groups, **kw)
    gen = torch.Generator().manual_seed(a.seed + 1)
    warmup_steps = min(5, a.steps - 1)
    train_seconds = 0.0
    loss = float("nan")
    for step in range(a.steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, y = get_batch(train, a.batch, a.block, gen)
        out = model(x[rank * micro:(rank + 1) * micro], y[rank * micro:(rank + 1) * micro])
        opt.zero_grad(set_to_none=True)
        out.backward()
        if a.clip > 0:  # gradients are already averaged over ranks: the global norm on every rank
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        dt = time.perf_counter() - t0
        if step >= warmup_steps:
            train_seconds += dt
        if (step + 1) % a.log_every == 0 or step + 1 == a.steps:
            mean = out.detach().clone()
            dist.all_reduce(mean)
            loss = mean.item() / a.world_size
            if rank == 0:
                print(f"step {step + 1:5d}/{a.steps} | loss {loss:.4f} | {1000 * dt:.1f} ms/step", flush=True)
    timed = a.steps - warmup_steps
    tokens_per_s = timed * a.batch * a.block / train_seconds
    val_loss = torch.tensor(evaluate(model.module, val, a, gen, micro))
    dist.all_reduce(val_loss)
    val_loss = val_loss.item() / a.world_size
    if rank == 0:
        scheme = "DDP + ZeroRedundancyOptimizer" if a.zero else "DDP"
        print(f"done: params {params} | train loss {loss:.4f} | val loss {val_loss:.4f} | "
              f"tokens_per_s {tokens_per_s:.0f} | ms_per_step {1000 * train_seconds / timed:.2f} | "
              f"{scheme}, gloo, {a.world_size} rank(s) x {a.threads} thread(s), torch {torch.__version__}")
        if a.metrics:
            write_metrics(a.metrics, {"params": params, "steps": a.steps, "batch": a.batch, "micro_batch": micro,
                                      "block": a.block, "threads": a.threads, "world_size": a.world_size,
                                      "zero_stage": 1 if a.zero else 0, "tokens_per_s": tokens_per_s,
                                      "ms_per_step": 1000 * train_seconds / timed, "train_loss": loss,
                                      "val_loss": val_loss, "torch": torch.__version__})
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_recipe_args(p)
    p.add_argument("--world-size", type=int, default=2, help="processes (ranks)")
    p.add_argument("--zero", action="store_true", help="ZeroRedundancyOptimizer (optimizer states sharded)")
    a = p.parse_args()
    if a.world_size < 1 or a.batch % a.world_size != 0:
        p.error(f"--batch {a.batch} must be a positive multiple of --world-size {a.world_size}")
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(a, port), nprocs=a.world_size, join=True)


if __name__ == "__main__":
    main()
