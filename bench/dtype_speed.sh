#!/usr/bin/env bash
# dtype_speed.sh: train_gpt's tokens/s with --dtype fp32, bf16 and fp16, side by side in one run.
#
#   bench/dtype_speed.sh [--threads "1 2"] [--rounds 3] [--steps 40] [--bin build/bin] [--data FILE] [-- extra flags]
#
# For each thread count, the three dtypes run round-robin --rounds times (so load from other jobs
# spreads over all of them) on one rank with the default model; each run's ms/step is train_gpt's own
# figure (steps after the first, evaluation excluded). Prints the median ms/step and tokens/s per
# dtype and the 16-bit/fp32 tokens/s ratios. Anything after "--" is passed to every run.
set -euo pipefail
cd "$(dirname "$0")/.."

threads="1 2" rounds=3 steps=40 bin=build/bin data=data/tinyshakespeare.txt
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin/train_gpt ]] || { echo "error: $bin/train_gpt not found; build it first (scripts/test.sh)" >&2; exit 2; }
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }

out=$(mktemp -d /tmp/dtype_speed.XXXXXX)
trap 'rm -rf "$out"' EXIT
for t in $threads; do
  for r in $(seq "$rounds"); do
    for dt in fp32 bf16 fp16; do
      "$bin/train_gpt" --data "$data" --steps "$steps" --log-every "$steps" --eval-every 0 --eval-iters 1 --sample 0 \
        --threads "$t" --dtype "$dt" --metrics "$out/t${t}_${dt}_$r.json" "${extra[@]}" > "$out/t${t}_${dt}_$r.log" 2>&1 ||
        { echo "error: train_gpt --dtype $dt --threads $t failed:" >&2; tail -3 "$out/t${t}_${dt}_$r.log" >&2; exit 1; }
      echo "threads $t round $r $dt $(grep -o '[0-9.]* ms/step' "$out/t${t}_${dt}_$r.log" | tail -1)"
    done
  done
done
/usr/bin/env python3 - "$out" "$threads" <<'PY'
import glob, json, statistics, sys
out, threads = sys.argv[1], sys.argv[2].split()
print(f"\n{'threads':>7} {'dtype':>5} {'ms/step':>8} {'tokens/s':>9} {'vs fp32':>8}   (medians)")
for t in threads:
    med = {}
    for dt in ("fp32", "bf16", "fp16"):
        runs = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/t{t}_{dt}_*.json"))]
        med[dt] = (statistics.median(r["ms_per_step"] for r in runs), statistics.median(r["tokens_per_s"] for r in runs))
    for dt, (ms, tps) in med.items():
        print(f"{t:>7} {dt:>5} {ms:8.1f} {tps:9.0f} {tps / med['fp32'][1]:8.3f}")
PY
