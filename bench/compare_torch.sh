#!/usr/bin/env bash
# zero.cpp against PyTorch on the small-GPT training step, and both against this machine's GEMM peak
# measured in the same run. One command; docs/performance.md records its output.
#
#   bench/compare_torch.sh [--build DIR] [--data PATH] [--steps N] [--repeats R] [--torch-script PATH]
#                          [--no-gpu-config] [--no-memory]
#
# 1. GEMM peak: build/bin/gemm_peak (Eigen's GEMM, zero.cpp's, the system BLAS; 1024², best of 5) on one
#    core and on both. OpenBLAS 0.3.21 (Debian 12) does not recognise some newer CPUs and falls back to a
#    generic x86-64 kernel (~20% of the machine); the script times OPENBLAS_CORETYPE candidates and gives
#    PyTorch (and the BLAS peak) the fastest, so PyTorch runs at its best.
# 2. nanoGPT's CPU recipe (4 layers, 4 heads, 128 channels, block 64, batch 12; train_gpt's defaults and
#    torch_gpt.py's), alternating zero.cpp and PyTorch runs, each side at its best thread setting:
#      one core : taskset -c 0; zero.cpp --threads 1; PyTorch threads 1, OPENBLAS_NUM_THREADS=1
#      two cores: zero.cpp in one process with --threads 2, and as 2 data-parallel ranks (mpirun -np 2,
#                 --threads 1, ZeRO stage 0), the better median counts; PyTorch threads 1 with OpenBLAS
#                 on both cores (its best setting; torch threads 2 is slower on this machine)
#    and prints the median tokens/s of each, the ratio, and the achieved GFLOP/s (tokens/s × training
#    FLOPs per token, PaLM's 6N + 12LTC) as a fraction of the GEMM peak on the same cores.
# 3. nanoGPT's GPU recipe run on this CPU (6 layers, 6 heads, 384 channels, block 256, batch 8), zero.cpp
#    only: the whole step's GFLOP/s as a fraction of the GEMM peak, on one core and on both.
# 4. Steady-state memory: train_gpt's peak RSS after 50 and after 500 steps (should agree within 2%).
#
# The machine is shared: medians of alternating runs, and expect the two-core figures to move when
# other jobs run. Needs a Release build (train_gpt, gemm_peak), Debian's python3-torch and
# libopenblas0-pthread (/usr/bin/python3), and mpirun for the 2-rank setting (skipped if absent).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
data=data/tinyshakespeare.txt  # scripts/train.sh downloads it
torch_script=bench/torch_gpt.py
steps=100
repeats=3
gpu_config=1
memory=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --torch-script) torch_script="$2"; shift 2 ;;
    --no-gpu-config) gpu_config=0; shift ;;
    --no-memory) memory=0; shift ;;
    *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -f "$data" ] || { echo "error: --data '$data' not found (scripts/train.sh --steps 1 downloads Tiny Shakespeare)" >&2; exit 2; }
[ -f "$torch_script" ] || { echo "error: --torch-script '$torch_script' not found" >&2; exit 2; }
for b in train_gpt gemm_peak; do
  [ -x "$build/bin/$b" ] || { echo "error: $build/bin/$b missing: cmake -S . -B $build && cmake --build $build" >&2; exit 2; }
done
/usr/bin/python3 -c 'import torch' 2>/dev/null ||
  { echo "error: /usr/bin/python3 has no torch (apt-get install python3-torch libopenblas0-pthread)" >&2; exit 2; }
mpi=()
if command -v mpirun >/dev/null; then
  mpi=(mpirun -np 2)
  [ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
json() { /usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
max() { tr ' ' '\n' | grep -v '^$' | sort -n | tail -1; }
calc() { awk "BEGIN {printf \"$1\", $2}"; }

# ---- OpenBLAS kernel for PyTorch: the auto-detected one, or a faster OPENBLAS_CORETYPE ----
blas_env=(env -u OPENBLAS_L2_SIZE -u OPENBLAS_CORETYPE)
blas_rate() {  # prints "<core name> <GFLOP/s>" for the given env prefix
  "$@" taskset -c 0 "$build/bin/gemm_peak" --threads 1 --backends blas --seconds 0.5 --reps 3 |
    sed -n 's/^backend=\([^ ]*\) .*gflops=\([0-9.]*\).*/\1 \2/p'
}
read -r auto_core auto_rate < <(blas_rate "${blas_env[@]}") || true
best_rate=${auto_rate:-0}
blas_note="auto-detected ${auto_core:-none} ${auto_rate:-n/a} GFLOP/s"
for core in Haswell SkylakeX Cooperlake; do
  read -r name rate < <(blas_rate env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=$core) || continue
  blas_note+=", $core ${rate} GFLOP/s"
  if awk -v a="$rate" -v b="$best_rate" 'BEGIN {exit !(a > 1.1 * b)}'; then
    best_rate=$rate
    blas_env=(env -u OPENBLAS_L2_SIZE OPENBLAS_CORETYPE=$core)
  fi
done
echo "OpenBLAS 1024² sgemm, one core: $blas_note"
echo "PyTorch and the BLAS peak run with: ${blas_env[*]}"

# ---- GEMM peak of this machine, now ----
peak() {  # $1 = threads, rest = prefix command; writes gemm_peak's output to $tmp/peak$1
  "${blas_env[@]}" "${@:2}" "$build/bin/gemm_peak" --threads "$1" >"$tmp/peak$1"
}
peak_of() { sed -n 's/^peak_gflops=//p' "$tmp/peak$1"; }
detail_of() { sed -n 's/^backend=\([^ ]*\) .*gflops=\([0-9.na/]*\).*/\1 \2/p' "$tmp/peak$1" | paste -sd, - | sed 's/,/, /g'; }
peak 1 taskset -c 0
peak 2
peak_1=$(peak_of 1); peak_2=$(peak_of 2)
echo "GEMM peak (GFLOP/s, 1024², best of 5): one core $peak_1 [$(detail_of 1)]; two cores $peak_2 [$(detail_of 2)]"

# ---- the nanoGPT CPU recipe, side by side ----
ours() {  # $1 = threads, rest = prefix command (taskset / mpirun); prints tokens/s
  local threads="$1"; shift
  "$@" "$build/bin/train_gpt" --data "$data" --steps "$steps" --threads "$threads" --eval-iters 1 --sample 0 \
    --log-every 1000000 --metrics "$tmp/m.json" >/dev/null
  calc "%.0f" "$(json "$tmp/m.json" tokens_per_s)"
}
theirs() {  # $1 = OpenBLAS threads, rest = prefix command; prints tokens/s
  local blas="$1"; shift
  "${blas_env[@]}" OPENBLAS_NUM_THREADS="$blas" "$@" /usr/bin/python3 "$torch_script" --data "$data" \
    --steps "$steps" --threads 1 | sed -n 's/.*tokens_per_s \([0-9]*\).*/\1/p'
}
# FLOPs per token of the recipe, from a short run's metrics.
"$build/bin/train_gpt" --data "$data" --steps 2 --eval-iters 1 --sample 0 --metrics "$tmp/f.json" >/dev/null
fpt=$(json "$tmp/f.json" flops_per_token)
echo
echo "nanoGPT CPU recipe (4 layers, 4 heads, 128 channels, block 64, batch 12): $steps steps per run, $repeats" \
  "alternating runs per side, $(calc "%.2f" "$fpt / 1e6") MFLOP per token"
printf '%-10s %-34s %-30s %-7s %-22s %s\n' setting "zero.cpp tokens/s (median [runs])" \
  "PyTorch tokens/s" ratio "zero.cpp GFLOP/s" "PyTorch GFLOP/s"
row() {  # setting, our median, our runs, their median, their runs, peak
  printf '%-10s %-34s %-30s %-7s %-22s %s\n' "$1" "$2 [$3]" "$4 [$5]" "$(calc "%.2fx" "$2 / $4")" \
    "$(calc "%.1f (%.0f%% of peak)" "$2 * $fpt / 1e9, 100 * $2 * $fpt / 1e9 / $6")" \
    "$(calc "%.1f (%.0f%%)" "$4 * $fpt / 1e9, 100 * $4 * $fpt / 1e9 / $6")"
}
o=(); t=()
for r in $(seq "$repeats"); do
  o+=("$(ours 1 taskset -c 0)"); t+=("$(theirs 1 taskset -c 0)")
done
row one_core "$(echo "${o[*]}" | median)" "${o[*]}" "$(echo "${t[*]}" | median)" "${t[*]}" "$peak_1"
o=(); d=(); t=()
for r in $(seq "$repeats"); do
  o+=("$(ours 2 env)")
  [ ${#mpi[@]} -gt 0 ] && d+=("$(ours 1 "${mpi[@]}")")
  t+=("$(theirs 2 env)")
done
om=$(echo "${o[*]}" | median); tm=$(echo "${t[*]}" | median)
row two_cores "$om" "threads 2: ${o[*]}" "$tm" "${t[*]}" "$peak_2"
if [ ${#d[@]} -gt 0 ]; then
  dm=$(echo "${d[*]}" | median)
  row "" "$dm" "2 ranks: ${d[*]}" "$tm" "${t[*]}" "$peak_2"
  best=$(echo "$om $dm" | max)
  echo "two cores, zero.cpp at its best setting: $best tokens/s = $(calc "%.2fx" "$best / $tm") PyTorch's best"
fi

# ---- nanoGPT's GPU recipe on this CPU: the whole step against the GEMM peak ----
if [ "$gpu_config" = 1 ]; then
  echo
  echo "nanoGPT GPU recipe on this CPU (6 layers, 6 heads, 384 channels, block 256, batch 8), zero.cpp, 12 steps:"
  for setting in one_core two_cores; do
    if [ $setting = one_core ]; then prefix=(taskset -c 0); th=1; pk=$peak_1; else prefix=(env); th=2; pk=$peak_2; fi
    "${prefix[@]}" "$build/bin/train_gpt" --data "$data" --steps 12 --threads $th --n-layer 6 --n-head 6 --n-embd 384 \
      --block 256 --batch 8 --eval-iters 1 --sample 0 --log-every 1000000 --metrics "$tmp/g.json" >/dev/null
    tps=$(json "$tmp/g.json" tokens_per_s); f=$(json "$tmp/g.json" flops_per_token)
    printf '%-10s %6.0f tokens/s, %6.1f GFLOP/s = %3.0f%% of the GEMM peak (%s)\n' $setting "$tps" \
      "$(calc "%.1f" "$tps * $f / 1e9")" "$(calc "%.1f" "100 * $tps * $f / 1e9 / $pk")" "$pk"
  done
fi

# ---- steady-state memory ----
if [ "$memory" = 1 ]; then
  echo
  for s in 50 500; do
    "$build/bin/train_gpt" --data "$data" --steps $s --threads 1 --eval-iters 1 --sample 0 --log-every 1000000 \
      --metrics "$tmp/r$s.json" >/dev/null
  done
  r50=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory_bytes"]["peak_rss"])' "$tmp/r50.json")
  r500=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["memory_bytes"]["peak_rss"])' "$tmp/r500.json")
  echo "peak RSS: $(calc "%.1f" "$r50 / 1048576") MiB after 50 steps, $(calc "%.1f" "$r500 / 1048576") MiB after 500" \
    "($(calc "%+.2f" "100 * ($r500 - $r50) / $r50")%)"
fi
