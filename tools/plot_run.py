#!/usr/bin/python3
"""Plots a train_gpt run: loss curves, throughput and loss scale from its --log-file, and a per-rank
timeline from its --trace.

    /usr/bin/python3 tools/plot_run.py run.jsonl --out plots/
    /usr/bin/python3 tools/plot_run.py run.jsonl --trace trace.json --out plots/

The log is JSON lines, one object per optimizer step (step, loss, lr, grad_norm, loss_scale, skipped,
ms, tokens_per_s) and one per evaluation (step, val_loss). The trace is train_gpt's Chrome trace
(traceEvents with pid = rank, tid 0 = compute, tid 1 = communication). Writes loss.png, throughput.png,
loss_scale.png (fp16 runs) and, with --trace, timeline.png into --out. Needs Debian's python3-matplotlib.
"""
import argparse
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ModuleNotFoundError as e:  # one line naming the package and how to get it, as the programs fail
    if e.name.split(".")[0] != "matplotlib":
        raise
    sys.exit(f"error: tools/plot_run.py needs matplotlib, which {sys.executable} cannot import: "
             "apt-get install python3-matplotlib, then run it with /usr/bin/python3")


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def read_log(path):
    steps, evals = [], []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{number}: not a JSON object ({e.msg})")
                if "val_loss" in record:
                    evals.append(record)
                elif "loss" in record:
                    steps.append(record)
    except OSError as e:
        fail(f"cannot read log '{path}': {e.strerror}")
    if not steps:
        fail(f"log '{path}' has no step records (is it a train_gpt --log-file?)")
    return steps, evals


def plot_log(steps, evals, out):
    written = []
    x = [r["step"] for r in steps]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, [r["loss"] for r in steps], lw=0.8, alpha=0.7, label="train loss (per step)")
    if evals:
        ax.plot([r["step"] for r in evals], [r["val_loss"] for r in evals], "o-", label="val loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    written.append(save(fig, out, "loss.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(x, [r.get("tokens_per_s", float("nan")) for r in steps], lw=0.8)
    ax.set_xlabel("step")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput")
    ax.grid(alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot(x, [r.get("lr", float("nan")) for r in steps], color="tab:orange", lw=1, label="lr")
    ax2.set_ylabel("learning rate", color="tab:orange")
    fig.tight_layout()
    written.append(save(fig, out, "throughput.png"))

    scales = [r.get("loss_scale") for r in steps]
    if any(s is not None and s != 1 for s in scales):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        ax.semilogy(x, scales, drawstyle="steps-post")
        skipped = [r["step"] for r in steps if r.get("skipped")]
        if skipped:
            ax.plot(skipped, [scales[x.index(s)] for s in skipped], "rx", label="skipped (overflow)")
            ax.legend()
        ax.set_xlabel("step")
        ax.set_ylabel("loss scale")
        ax.set_title("fp16 dynamic loss scale")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(save(fig, out, "loss_scale.png"))
    return written


def plot_trace(path, out):
    try:
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"cannot read trace '{path}': {e}")
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        fail(f"trace '{path}' has no spans")
    ranks = sorted({e["pid"] for e in spans})
    t0 = min(e["ts"] for e in spans)
    colours = {"forward": "tab:blue", "backward": "tab:green", "step": "tab:purple", "wait": "tab:red",
               "eval": "tab:gray", "comm": "tab:orange"}
    # One lane per (rank, thread); the outermost spans are drawn first so nested ones show on top.
    lanes = [(r, tid) for r in ranks for tid in (0, 1)]
    fig, ax = plt.subplots(figsize=(14, 1.0 + 0.7 * len(lanes)))
    for lane, (rank, tid) in enumerate(lanes):
        mine = sorted((e for e in spans if e["pid"] == rank and e["tid"] == tid), key=lambda e: -e["dur"])
        for e in mine:
            if e["name"] in ("step", "forward", "backward") and tid == 0:
                height, y = 0.8, lane - 0.4  # containers: a pale band behind the per-block spans
                alpha = 0.15
            else:
                height, y, alpha = 0.5, lane - 0.25, 0.9
            ax.broken_barh([((e["ts"] - t0) / 1000.0, e["dur"] / 1000.0)], (y, height),
                           facecolors=colours.get(e.get("cat"), "tab:olive"), alpha=alpha, edgecolor="white",
                           linewidth=0.4)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels([f"rank {r} {'compute' if t == 0 else 'communication'}" for r, t in lanes])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first traced event")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
    ax.legend(handles, list(colours), ncol=len(colours), loc="upper center", bbox_to_anchor=(0.5, -0.25),
              frameon=False)
    ax.set_title("train_gpt timeline: forward/backward per block, step phases, waits (compute) and "
                 "collectives (communication)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save(fig, out, "timeline.png")


def save(fig, out, name):
    path = os.path.join(out, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", nargs="?", help="train_gpt --log-file (JSON lines)")
    parser.add_argument("--trace", help="train_gpt --trace file (Chrome trace JSON)")
    parser.add_argument("--out", required=True, help="directory for the PNGs (created if missing)")
    args = parser.parse_args()
    if not args.log and not args.trace:
        fail("give a log file, --trace, or both")
    os.makedirs(args.out, exist_ok=True)
    written = []
    if args.log:
        written += plot_log(*read_log(args.log), args.out)
    if args.trace:
        written.append(plot_trace(args.trace, args.out))
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
