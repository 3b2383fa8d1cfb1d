#!/usr/bin/env bash
# identity_cost.sh: what checking every collective's identity costs (Note [Identity records] in
# distributed/comm/mpi_communicator.cpp): train_gpt's ms/step under mpirun with the check on and off
# (ZERO_COLLECTIVE_IDENTITY=1 / 0), side by side in one run.
#
#   bench/identity_cost.sh [--ranks 4] [--stages "2 3"] [--rounds 5] [--steps 40] [--bin build/bin] [--data FILE] [-- extra flags]
#
# For each stage, the two settings run alternately --rounds times, each going first every other round
# (so load from other jobs, and whatever favours a first or second run, spreads over both) with the
# default model, one thread per rank; each run's ms/step is train_gpt's own figure
# (steps after the first five). Prints the medians and on/off. Anything after "--" goes to every run.
set -euo pipefail
cd "$(dirname "$0")/.."

ranks=4 stages="2 3" rounds=5 steps=40 bin=build/bin data=data/tinyshakespeare.txt
extra=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ranks) ranks=$2; shift 2 ;;
    --stages) stages=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin/train_gpt ]] || { echo "error: $bin/train_gpt not found; build it first (scripts/test.sh)" >&2; exit 2; }
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
mpirun_flags=(--oversubscribe)
[[ $(id -u) -eq 0 ]] && mpirun_flags+=(--allow-run-as-root)

out=$(mktemp -d /tmp/identity_cost.XXXXXX)
trap 'rm -rf "$out"' EXIT
for stage in $stages; do
  for r in $(seq "$rounds"); do
    order="1 0"; (( r % 2 == 0 )) && order="0 1"  # which goes first alternates too
    for check in $order; do
      log="$out/s${stage}_c${check}_$r.log"
      mpirun "${mpirun_flags[@]}" -np "$ranks" -x ZERO_COLLECTIVE_IDENTITY="$check" -x OMP_NUM_THREADS=1 \
        "$bin/train_gpt" --data "$data" --steps "$steps" --log-every "$steps" --eval-every 0 --eval-iters 1 \
        --sample 0 --threads 1 --zero-stage "$stage" --metrics "$out/s${stage}_c${check}_$r.json" "${extra[@]}" \
        > "$log" 2>&1 || { echo "error: stage $stage, check $check failed:" >&2; tail -3 "$log" >&2; exit 1; }
    done
  done
done
/usr/bin/env python3 - "$out" "$stages" "$rounds" "$ranks" <<'PY'
import json, statistics, sys
out, stages, rounds, ranks = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4]
for s in stages:
    ms = {c: [json.load(open(f"{out}/s{s}_c{c}_{r}.json"))["ms_per_step"] for r in range(1, rounds + 1)] for c in "10"}
    on, off = statistics.median(ms["1"]), statistics.median(ms["0"])
    print(f"stage {s}, {ranks} ranks: identity check on {on:.2f} ms/step, off {off:.2f} ms/step, "
          f"on/off {on / off:.4f} (medians of {rounds}; per round on/off: "
          + ", ".join(f"{a / b:.3f}" for a, b in zip(ms["1"], ms["0"])) + ")")
PY
