#!/usr/bin/env python3
"""How much of ZeRO stage 3's parameter gathering a trace shows hidden behind compute.

Reads a Chrome trace written by `train_gpt --zero-stage 3 --trace FILE --trace-steps A:B` and, per rank
(the trace's pid) and over all ranks, sums two kinds of events of category "stage3":

  "gather <unit>"       complete events on the communication lane: from the moment the unit's
                        all-gather was issued to the moment the training thread saw it done;
  "wait gather <unit>"  spans on the compute lane: the time the training thread was blocked on it.

hidden = 1 - sum(wait gather) / sum(gather): the share of gather time during which the training thread
did something else (a prefetched unit that was ready before it was needed counts as fully hidden).

  python3 tools/stage3_gather_overlap.py trace.json [--units]

--units adds a line per gather unit (summed over ranks). Python's standard library only.
"""
import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="Chrome trace JSON from train_gpt --trace")
    ap.add_argument("--units", action="store_true", help="also print one line per gather unit")
    args = ap.parse_args()
    try:
        with open(args.trace) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        sys.exit(f"error: {args.trace}: {e}")
    events = doc["traceEvents"] if isinstance(doc, dict) else doc

    gather = collections.defaultdict(float)  # (rank, unit) -> us
    wait = collections.defaultdict(float)
    count = collections.Counter()
    for e in events:
        if e.get("cat") != "stage3" or e.get("ph") != "X":
            continue
        name, rank, dur = e.get("name", ""), e.get("pid", 0), float(e.get("dur", 0))
        if name.startswith("wait gather "):
            wait[(rank, name[len("wait gather "):])] += dur
        elif name.startswith("gather "):
            unit = name[len("gather "):]
            gather[(rank, unit)] += dur
            count[(rank, unit)] += 1
    if not gather:
        sys.exit(f"error: {args.trace}: no stage-3 'gather' events (was the run --zero-stage 3 with --trace-steps?)")

    def line(label, g, w, n):
        share = 1 - w / g if g > 0 else float("nan")
        print(f"{label:>10s} {n:8d} {g / 1000:12.2f} {w / 1000:12.2f} {100 * share:9.1f}%")

    print(f"{'':>10s} {'gathers':>8s} {'gather ms':>12s} {'waited ms':>12s} {'hidden':>10s}")
    ranks = sorted({r for r, _ in gather})
    for r in ranks:
        keys = [k for k in gather if k[0] == r]
        line(f"rank {r}", sum(gather[k] for k in keys), sum(wait[k] for k in keys), sum(count[k] for k in keys))
    line("all", sum(gather.values()), sum(wait.values()), sum(count.values()))
    if args.units:
        for u in dict.fromkeys(u for _, u in gather):
            keys = [k for k in gather if k[1] == u]
            line(u, sum(gather[k] for k in keys), sum(wait[k] for k in keys), sum(count[k] for k in keys))


if __name__ == "__main__":
    main()
