#!/usr/bin/env bash
# busy_core.sh: train_gpt's tokens/s with its default thread setting and with --threads 1, on the
# machine as it is and with one core kept busy by another process, side by side.
#
#   bench/busy_core.sh [--rounds 3] [--steps 120] [--bin build/bin] [--baseline BIN] [--torch] [--data FILE]
#
# Two conditions: as is, then with `yes > /dev/null` pinned to the last core (taskset). In each, the
# settings run round-robin --rounds times (so other jobs' load spreads over all of them): train_gpt's
# default (--threads 0: adaptive, Note [Threads on a busy machine] in core/cpu/threads.cpp), --threads 1,
# and, with --baseline, another train_gpt binary's default (an older build to compare against); with
# --torch, bench/torch_gpt.py with 1 and 2 threads (Debian's python3-torch, /usr/bin/python3; OpenBLAS
# given as many threads as torch, its kernel auto-detected, unlike bench/compare_torch.sh, which picks
# the fastest). The model and recipe are train_gpt's defaults. Prints each run's tokens/s (train_gpt's
# own figure: steps after the first, evaluation excluded), then the median per setting and condition,
# and the load average.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3 steps=120 bin=build/bin baseline="" torch=0 data=data/tinyshakespeare.txt
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --baseline) baseline=$2; shift 2 ;;
    --torch) torch=1; shift ;;
    --data) data=$2; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $bin/train_gpt ]] || { echo "error: $bin/train_gpt not found; build it first" >&2; exit 2; }
[[ -z $baseline || -x $baseline ]] || { echo "error: --baseline $baseline is not an executable" >&2; exit 2; }
[[ -f $data ]] || { echo "error: --data $data not found" >&2; exit 2; }
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "error: --rounds must be a positive integer, got '$rounds'" >&2; exit 2; }
command -v taskset > /dev/null || { echo "error: taskset (util-linux) is needed to pin the busy loop" >&2; exit 2; }

out=$(mktemp -d /tmp/busy_core.XXXXXX)
busy=""
trap '[[ -n $busy ]] && kill "$busy" 2> /dev/null; rm -rf "$out"' EXIT
flags=(--data "$data" --steps "$steps" --log-every "$steps" --eval-every 0 --eval-iters 1 --sample 0)

run() {  # name command...: appends "name tokens/s" to $out/results
  local name=$1; shift
  local rate
  rate=$("$@" 2>&1 | grep -oE '[0-9.]+ tokens/s|tokens_per_s [0-9.]+' | grep -oE '[0-9.]+' | tail -1 || true)
  echo "$condition $name ${rate:-failed}" | tee -a "$out/results"
}

last_core=$(( $(nproc) - 1 ))
for condition in as_is busy_core; do
  if [[ $condition == busy_core ]]; then
    taskset -c "$last_core" yes > /dev/null &
    busy=$!
    sleep 1
  fi
  echo "== $condition: load average $(cut -d' ' -f1-3 /proc/loadavg)"
  for r in $(seq "$rounds"); do
    [[ -n $baseline ]] && run baseline_default "$baseline" "${flags[@]}"
    run default "$bin/train_gpt" "${flags[@]}"
    run threads_1 "$bin/train_gpt" "${flags[@]}" --threads 1
    if [[ $torch == 1 ]]; then
      run torch_threads_1 env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/torch_gpt.py --data "$data" \
        --steps "$steps" --threads 1
      run torch_threads_2 env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=2 /usr/bin/python3 bench/torch_gpt.py --data "$data" \
        --steps "$steps" --threads 2
    fi
  done
  if [[ -n $busy ]]; then kill "$busy"; busy=""; fi
done
echo "== medians (tokens/s), load average now $(cut -d' ' -f1-3 /proc/loadavg)"
cut -d' ' -f1-2 "$out/results" | sort -u | while read -r cond name; do
  values=$(awk -v c="$cond" -v n="$name" '$1 == c && $2 == n { print $3 }' "$out/results")
  median=$(echo "$values" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  echo "$cond $name $median [$(echo $values)]"
done
