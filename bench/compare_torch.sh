#!/usr/bin/env bash
# train_gpt vs PyTorch (../shared/bench/torch_gpt.py: same model, initialisation and recipe), side by
# side, alternating runs, strictly on one core and on both cores, each side at its best thread setting:
#   one core : taskset -c 0; ours --threads 1; PyTorch threads 1, OPENBLAS_NUM_THREADS=1
#   two cores: ours --threads 2; PyTorch threads 1 with OpenBLAS on both cores (its best setting here)
# Prints the median tokens/s of each side and the ratio.
#   bench/compare_torch.sh [--data PATH] [--steps N] [--repeats R] [--torch-script PATH]
# Needs Debian's python3-torch and libopenblas0-pthread (run by /usr/bin/python3) and a Release build
# of train_gpt in build/.
set -euo pipefail
cd "$(dirname "$0")/.."
data=../shared/data/tinyshakespeare.txt
torch_script=../shared/bench/torch_gpt.py
steps=100
repeats=3
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --torch-script) torch_script="$2"; shift 2 ;;
    *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -f "$data" ] || { echo "error: --data '$data' not found" >&2; exit 2; }
[ -f "$torch_script" ] || { echo "error: --torch-script '$torch_script' not found" >&2; exit 2; }
[ -x build/bin/train_gpt ] || { echo "error: build/bin/train_gpt missing: cmake -S . -B build && cmake --build build" >&2; exit 2; }
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "error: /usr/bin/python3 has no torch (apt-get install python3-torch libopenblas0-pthread)" >&2; exit 2; }

metrics=$(mktemp)
trap 'rm -f "$metrics"' EXIT

ours() {  # $1 = threads, rest = prefix command
  local threads="$1"; shift
  "$@" build/bin/train_gpt --data "$data" --steps "$steps" --threads "$threads" --eval-iters 1 --sample 0 \
    --log-every 1000000 --metrics "$metrics" >/dev/null
  python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$metrics"
}
theirs() {  # $1 = OpenBLAS threads, rest = prefix command
  local blas="$1"; shift
  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$blas" "$@" /usr/bin/python3 "$torch_script" \
    --data "$data" --steps "$steps" --threads 1 | sed -n 's/.*tokens_per_s \([0-9]*\).*/\1/p'
}
median() { tr ' ' '\n' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

for setting in one_core two_cores; do
  o=(); t=()
  for r in $(seq "$repeats"); do
    if [ "$setting" = one_core ]; then
      o+=("$(ours 1 taskset -c 0)"); t+=("$(theirs 1 taskset -c 0)")
    else
      o+=("$(ours 2 env)"); t+=("$(theirs 2 env)")
    fi
  done
  om=$(echo "${o[*]}" | median); tm=$(echo "${t[*]}" | median)
  printf '%-9s  zero.cpp %7.0f tokens/s [%s]  PyTorch %7.0f tokens/s [%s]  ratio %.2fx\n' \
    "$setting" "$om" "${o[*]}" "$tm" "${t[*]}" "$(awk -v a="$om" -v b="$tm" 'BEGIN {print a / b}')"
done
