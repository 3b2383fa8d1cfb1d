#!/usr/bin/env bash
# recompute_memory.sh: activation memory and step time of train_gpt with --recompute none, full and
# selective, side by side, beside zero_explain's prediction of the activation bytes.
#
#   bench/recompute_memory.sh [--rounds 3] [--steps 6] [--bin build/bin] [--data FILE] [-- extra flags]
#
# Default model: --n-layer 8 --block 256 --batch 8 --dropout 0.1 (a config where activations dominate
# the model states), one rank, one thread. The three modes run round-robin --rounds times (so load
# from other jobs spreads over all of them); ms/step is train_gpt's own figure (steps after the first,
# evaluation excluded) and activations its metrics' memory_bytes.activations. Prints medians, the
# ratios to "none", and zero_explain's predicted bytes. Anything after "--" is passed to every
# train_gpt and zero_explain run (model flags such as --n-embd go to both).
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 steps=6 bin=build/bin data=data/tinyshakespeare.txt
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for b in train_gpt zero_explain; do
  [[ -x $bin/$b ]] || { echo "error: $bin/$b not found; build it first (scripts/test.sh)" >&2; exit 2; }
done
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
[[ $steps =~ ^[0-9]+$ && $steps -ge 2 ]] || { echo "error: --steps must be >= 2, got '$steps'" >&2; exit 2; }

model=(--n-layer 8 --block 256 --batch 8 --dropout 0.1)
out=$(mktemp -d /tmp/recompute_memory.XXXXXX)
trap 'rm -rf "$out"' EXIT
for r in $(seq "$rounds"); do
  for m in none full selective; do
    "$bin/train_gpt" --data "$data" "${model[@]}" --steps "$steps" --log-every "$steps" --eval-every 0 --eval-iters 1 \
      --sample 0 --threads 1 --recompute "$m" --metrics "$out/${m}_$r.json" "${extra[@]}" > "$out/${m}_$r.log" 2>&1 ||
      { echo "error: train_gpt --recompute $m failed:" >&2; tail -3 "$out/${m}_$r.log" >&2; exit 1; }
    echo "round $r $m: $(grep -o '[0-9.]* ms/step' "$out/${m}_$r.log" | tail -1)"
  done
done
for m in none full selective; do
  "$bin/zero_explain" --data "$data" "${model[@]}" --recompute "$m" --format json "${extra[@]}" > "$out/${m}_explain.json"
done
/usr/bin/env python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
med = {}
for m in ("none", "full", "selective"):
    runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/{m}_[0-9]*.json"))]
    predicted = json.load(open(f"{out}/{m}_explain.json"))["activations_bytes"]["total"]
    med[m] = (statistics.median(r["memory_bytes"]["activations"] for r in runs),
              statistics.median(r["ms_per_step"] for r in runs), predicted,
              runs[0]["memory_bytes"]["params"] + runs[0]["memory_bytes"]["grads"] + runs[0]["memory_bytes"]["optimizer_states"])
print(f"\n{'recompute':>9} {'activations MiB':>15} {'vs none':>7} {'ms/step':>8} {'vs none':>7} {'predicted MiB':>13} "
      f"{'model states MiB':>16}   (medians of {len(runs)})")
for m, (act, ms, pred, states) in med.items():
    print(f"{m:>9} {act / 2**20:15.2f} {act / med['none'][0]:7.3f} {ms:8.1f} {ms / med['none'][1]:7.3f} "
          f"{pred / 2**20:13.2f} {states / 2**20:16.2f}")
PY
