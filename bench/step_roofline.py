#!/usr/bin/python3
"""A roofline of one train_gpt step on the CPU: where the time goes, and how far each part is from
what this machine can do.

    bench/step_roofline.py [--threads "1 2"] [--steps 100] [--build build] [--data FILE]
                           [--n-layer 4 --n-head 4 --n-embd 128 --block 64 --batch 12] [-- train_gpt flags]

For each thread count it measures the machine's peaks, then profiles two runs of train_gpt:
- GEMM peak: `gemm_peak` (1024^2 fp32 product; the best of Eigen and zero.cpp's own GEMM, best of 10
  rounds) on one thread; t cores can do t times that (a t-thread measurement on a shared machine
  measures the other jobs too), so the peak of t threads is t x the one-thread peak, or the t-thread
  measurement where that is higher;
- bandwidth: `gemm_peak --copy-mib` memcpy (bytes read + written) on two buffer sizes: the largest
  activation (tokens x 4C floats: what one pointwise op streams) and the optimizer's state (parameters,
  gradients, two moments: 16 bytes a parameter);
- the step: bench/profile_step.sh (perf, CPU-clock samples of train_gpt alone, pinned to the first t
  cores) splits its CPU time into op families, in a run of --steps steps and in one of a fifth as many;
  the difference over the difference of steps is a step's CPU time, without what each run pays once
  (start-up, loading libraries, the final evaluation). train_gpt's own ms/step is the wall time.

Families are grouped into six parts. A part's time is its CPU time per step divided by t (with t
threads its work is spread over t cores; a thread waiting for the other is charged to the OpenMP
runtime, in the overhead). What is left of the measured wall time is a seventh row, "not running": the
time the process waited for a core (other jobs on a shared machine). Each part's roofline time is the
least time its work can take at the peaks:
- GEMMs (linear layers, LM head): 6 * (matrix weights) FLOPs per token (forward 2, backward 4), at
  the GEMM peak;
- attention (the fused causal kernels): PaLM's 12 * L * T * C FLOPs per token (scores and values,
  forward and backward, the masked half included, which the causal kernels skip: attention can beat
  its row), at the GEMM peak;
- pointwise and normalisation (LayerNorm, GELU, residual adds, bias gradients, embeddings, softmax +
  cross-entropy, copies): the bytes each op must read and write once, unfused (listed in
  pointwise_bytes below), at the activation-sized memcpy bandwidth;
- optimizer (AdamW, gradient-norm clip, zeroing the gradients): AdamW reads parameter, gradient and
  both moments and writes three of them (16-bit models: a 16-bit gradient and the rounded 16-bit
  model), the norm reads the gradients, zeroing writes them, at the state-sized bandwidth;
- communication: train_gpt's bytes per step over its ms in collectives (none on one rank);
- framework overhead (autograd, tensors, allocation, the OpenMP runtime's fork/join and waiting, the
  kernel, everything else): no work a roofline must do, so its roofline time is 0.
The step's roofline time is the sum of the parts'; the table ends with roofline / measured wall time,
and roofline / running time (the parts' CPU time over t; it can exceed the wall time, which is a
median of train_gpt's per-step times while the parts are the mean of the steady state).

Prints one table per thread count (Markdown). Needs perf (linux-perf) and a built train_gpt and
gemm_peak.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# profile_step.sh's families -> the roofline's parts.
PARTS = {
    "GEMM (linear layers, LM head)": "GEMMs",
    "attention (fused, causal)": "attention",
    "GELU": "pointwise and normalisation",
    "LayerNorm": "pointwise and normalisation",
    "softmax + cross-entropy": "pointwise and normalisation",
    "copies, fills, adds, embeddings": "pointwise and normalisation",
    "optimizer (AdamW, clip, ZeRO step)": "optimizer",
    "communication (MPI, gradient reducer)": "communication",
}
ORDER = ["GEMMs", "attention", "pointwise and normalisation", "optimizer", "communication", "framework overhead"]
EXCLUDED = "start-up (init, data, MPI_Init)"


def gemm_peak(build, threads, copy_mib=0.0):
    cmd = [os.path.join(build, "bin", "gemm_peak"), "--threads", str(threads), "--reps", "10", "--seconds", "2"]
    cmd += ["--copy-mib", f"{copy_mib:.3f}", "--backends", "none"] if copy_mib else ["--backends", "eigen,zero"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    if copy_mib:
        return float(re.search(r"gbytes_per_s=([\d.]+)", out).group(1)) * 1e9
    return float(re.search(r"peak_gflops=([\d.]+)", out).group(1)) * 1e9


def model_work(m, L, C, T, B, dtype):
    """FLOPs and unavoidable bytes of one step, per part. V comes from the parameter count (the LM head
    shares the token embedding): P = V*C + T*C + L*(12*C^2 + 13*C) + 2*C."""
    P = m["params"]
    V = (P - T * C - L * (12 * C * C + 13 * C) - 2 * C) // C
    M = B * T  # tokens per step
    gemm_flops = 6.0 * M * (L * 12 * C * C + V * C)
    attention_flops = 12.0 * L * T * C * M
    # Floats each pointwise op reads + writes once, per layer (MC = one [tokens, C] activation):
    # forward: 2 LayerNorms (x -> y: 2 MC each), GELU (4C wide: 8 MC), 2 residual adds (3 MC each) = 18 MC;
    # backward: 2 LayerNorms (x, dy -> dx: 3 MC each), GELU (x, dy -> dx: 12 MC), 2 residual gradient sums
    # (3 MC each), bias gradients (qkv 3, proj 1, fc 4, fc2 1 MC read) = 33 MC.
    MC = M * C
    pointwise_floats = L * 51 * MC
    # Embeddings (gather + position add, forward 4 MC; scatter-add and position sum, backward 2 MC),
    # the final LayerNorm (2 + 3 MC), softmax + cross-entropy (logits read, gradient written: 2 MV).
    pointwise_floats += 6 * MC + 5 * MC + 2 * M * V
    pointwise_bytes = 4.0 * pointwise_floats
    low = dtype in ("bf16", "fp16", "f16")
    adamw = (6 * 4 + 2 + 2) if low else 7 * 4  # p, m, v read and written; gradient read; model written
    grad_bytes = 2 if low else 4
    optimizer_bytes = P * (adamw + 2 * grad_bytes)  # + the norm's read and the zeroing of the gradients
    if low:
        # Each step also refreshes the f32 compute copies of the 16-bit parameters (read 2, write 4 bytes)
        # and rounds the f32 gradients into the 16-bit ones (read 4, write 2).
        pointwise_bytes += P * (6 + 6)
    return {
        "GEMMs": ("flops", gemm_flops),
        "attention": ("flops", attention_flops),
        "pointwise and normalisation": ("bytes", pointwise_bytes),
        "optimizer": ("bytes", optimizer_bytes),
        "communication": ("bytes", m.get("comm_bytes_per_step", {}).get("total", 0.0)),
        "framework overhead": (None, 0.0),
    }, P, V


def profile_run(build, threads, train_args, steps):
    """CPU ms per op family over a whole run of `steps` steps (start-up included), the metrics, and the
    per-step wall times train_gpt logged."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = os.path.join(tmp, "m.json")
        log = os.path.join(tmp, "log.jsonl")
        cpus = ",".join(str(c) for c in range(threads))
        cmd = [os.path.join(ROOT, "bench", "profile_step.sh"), "--build", build, "--cpus", cpus, "--metrics", metrics,
               "--"] + train_args + ["--steps", str(steps), "--threads", str(threads), "--eval-every", "0",
                                    "--log-file", log]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
        families = {}
        for line in out.splitlines():
            match = re.match(r"^(.*?)\s+([\d.]+)%\s+([\d.]+)\s*$", line)
            if match and not match.group(1).startswith("total"):
                families[match.group(1)] = float(match.group(3)) * steps
        m = json.load(open(metrics))
        ms = [json.loads(l)["ms"] for l in open(log) if '"ms"' in l]
    return families, m, ms


def profile(build, threads, train_args, steps):
    """CPU ms per step of each op family in the steady state: two runs, of `steps` and of a fifth as many,
    and the difference of their CPU times over the difference of their steps, so that what every run
    pays once (start-up, loading libraries, the final evaluation) cancels out whatever it costs on this
    host. Also the metrics of the long run and its median wall ms per step after the first two."""
    short = max(2, steps // 5)
    long_families, m, ms = profile_run(build, threads, train_args, steps)
    short_families, _, _ = profile_run(build, threads, train_args, short)
    families = {f: max(0.0, long_families.get(f, 0.0) - short_families.get(f, 0.0)) / (steps - short)
                for f in set(long_families) | set(short_families)}
    wall_ms = statistics.median(ms[2:] if len(ms) > 4 else ms)
    return families, m, wall_ms


def fmt_rate(kind, amount, ms):
    if kind is None or amount == 0 or ms <= 0:
        return "-"
    rate = amount / (ms * 1e-3)
    return f"{rate * 1e-9:.1f} GFLOP/s" if kind == "flops" else f"{rate * 1e-9:.1f} GB/s"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1 2")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "tinyshakespeare.txt"))
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("extra", nargs="*", help="after --: more train_gpt flags")
    a = ap.parse_args()
    if a.steps < 5:
        ap.error(f"--steps {a.steps}: at least 5 (a step's time is the difference of a run of --steps and one "
                 "of a fifth as many, at least 2)")
    L, C, T, B = a.n_layer, a.n_embd, a.block, a.batch
    train_args = ["--data", a.data, "--n-layer", str(L), "--n-head", str(a.n_head), "--n-embd", str(C), "--block",
                  str(T), "--batch", str(B), "--dtype", a.dtype] + a.extra
    for threads in [int(t) for t in a.threads.split()]:
        families, m, wall_ms = profile(a.build, threads, train_args, a.steps)
        work, P, V = model_work(m, L, C, T, B, a.dtype)
        peak_flops = max(gemm_peak(a.build, threads), threads * gemm_peak(a.build, 1))
        act_mib = B * T * 4 * C * 4 / 2**20
        state_mib = 16 * P / 2**20
        bw_act = gemm_peak(a.build, threads, act_mib)
        bw_state = gemm_peak(a.build, threads, state_mib)
        cpu_ms = {p: 0.0 for p in ORDER}
        for fam, ms in families.items():
            if fam == EXCLUDED:
                continue
            cpu_ms[PARTS.get(fam, "framework overhead")] += ms
        total_cpu = sum(cpu_ms.values())
        running_ms = total_cpu / threads
        print(f"\n### L={L} H={a.n_head} C={C} T={T} B={B} V={V}, {P:,} parameters, {a.dtype}, "
              f"--threads {threads}, {a.steps} steps\n")
        print(f"Peaks (measured now): GEMM {peak_flops * 1e-9:.1f} GFLOP/s; memcpy {bw_act * 1e-9:.1f} GB/s on "
              f"{act_mib:.2f} MiB (an activation), {bw_state * 1e-9:.1f} GB/s on {state_mib:.2f} MiB (optimizer "
              f"state). Step: {wall_ms:.2f} ms wall (median), {total_cpu:.2f} CPU ms (all threads).\n")
        print("| part | ms/step | share | work per step | achieved | of peak | roofline ms | gap ms |")
        print("|---|---|---|---|---|---|---|---|")
        roof_total = 0.0
        for part in ORDER:
            kind, amount = work[part]
            ms = cpu_ms[part] / threads
            if kind == "flops":
                peak, roof = peak_flops, amount / peak_flops * 1e3
                work_s = f"{amount * 1e-9:.3f} GFLOP"
            elif kind == "bytes":
                peak = bw_act if part == "pointwise and normalisation" else bw_state
                roof = amount / peak * 1e3
                work_s = f"{amount / 2**20:.1f} MiB"
            else:
                peak, roof, work_s = None, 0.0, "-"
            if part == "communication" and m.get("world_size", 1) == 1:
                work_s = "- (one rank)"
            roof_total += roof
            of_peak = f"{amount / (ms * 1e-3) / peak * 100:.0f}%" if peak and amount and ms > 0 else "-"
            print(f"| {part} | {ms:.2f} | {ms / wall_ms * 100:.1f}% | {work_s} | {fmt_rate(kind, amount, ms)} | "
                  f"{of_peak} | {roof:.2f} | {ms - roof:.2f} |")
        idle = max(0.0, wall_ms - running_ms)
        print(f"| not running (waiting for a core) | {idle:.2f} | {idle / wall_ms * 100:.1f}% | | | | 0.00 | {idle:.2f} |")
        print(f"| **step** | **{wall_ms:.2f}** | 100% | | {m['tokens_per_s']:.0f} tokens/s (train_gpt) | | "
              f"**{roof_total:.2f}** | {wall_ms - roof_total:.2f} |")
        print(f"\nThe step runs at **{roof_total / wall_ms * 100:.0f}%** of its roofline (roofline {roof_total:.2f} ms / "
              f"measured {wall_ms:.2f} ms); **{roof_total / running_ms * 100:.0f}%** of the time it ran "
              f"({running_ms:.2f} ms).")
        print("Families: " + "; ".join(f"{k} {v:.2f}" for k, v in sorted(families.items(), key=lambda kv: -kv[1])))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
