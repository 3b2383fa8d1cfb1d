#!/usr/bin/env bash
# Where a training step's time goes, per op family: samples train_gpt with `perf record` (CPU-clock,
# this process only, so other jobs on a shared machine do not skew the shares) and sums the report's
# self time by function name into families. docs/performance.md's tables come from this script.
#
#   bench/profile_step.sh [--build DIR] [--cpus LIST] [--metrics FILE] [--report perf.data] [-- train_gpt flags]
#
# Default run: one thread pinned to core 0 (--cpus: taskset's list, e.g. 0,1 for --threads 2), the
# nanoGPT CPU recipe, 150 steps (start-up and the final evaluation are a few % and land in "other").
# --report re-reads an existing perf.data instead. Prints each family's share and its CPU milliseconds
# per step (samples are 1 ms of CPU time apart; with several threads, the sum over them).
# --metrics keeps the run's train_gpt --metrics JSON. bench/step_roofline.py groups these families into a step roofline.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
report=""
cpus=0
metrics=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --report) report="$2"; shift 2 ;;
    --cpus) cpus="$2"; shift 2 ;;
    --metrics) metrics="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "error: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
command -v perf >/dev/null || { echo "error: perf not found (apt-get install linux-perf)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
steps=""
if [ -z "$report" ]; then
  args=("$@")
  [ ${#args[@]} -eq 0 ] && args=(--data data/tinyshakespeare.txt --steps 150 --threads 1)
  report="$tmp/perf.data"
  # 1000 samples per second of CPU time: one sample is one millisecond.
  perf record -e cpu-clock -F 1000 -o "$report" -q taskset -c "$cpus" "$build/bin/train_gpt" "${args[@]}" --eval-iters 1 \
    --sample 0 --log-every 1000000 --metrics "$tmp/m.json" >/dev/null 2>"$tmp/perf.err" ||
    { cat "$tmp/perf.err" >&2; exit 1; }
  if [ -n "$metrics" ]; then cp "$tmp/m.json" "$metrics"; fi
  steps=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"])' "$tmp/m.json")
fi
# "  12.34%   1234  libx.so  [.] symbol": share, samples, object, kind ([.] user, [k] kernel), name. The
# object names libgomp's samples, whose symbols are stripped.
perf report -i "$report" --no-children --sort dso,symbol -g none -n --percent-limit 0 2>/dev/null | grep -v '^#' |
  awk -v steps="$steps" '
  /%/ {
    pct = $1; sub(/%/, "", pct); n = $2; dso = $3; kind = $4; $1 = ""; $2 = ""; $3 = ""; $4 = ""; sym = $0
    # Start-up: initialisation, the data file, MPI_Init (hwloc reads PCI config; the sleep it waits in
    # is charged to the wake-up, finish_task_switch).
    if (sym ~ /randn|TextData|_dl_|do_lookup|strcmp|strlen|finish_task_switch|pci_/) f = "start-up (init, data, MPI_Init)"
    else if (kind == "[k]") f = "kernel (page faults, interrupts)"
    # The OpenMP runtime: forking the team, joins and barriers (a thread waiting for the other).
    else if (dso ~ /libgomp/ || sym ~ /GOMP_|omp_get/) f = "OpenMP fork, join and wait"
    else if (dso ~ /libmpi|libopen-|mca_|libucp|libucs|libuct/ || sym ~ /Communicator|GradientReducer/) f = "communication (MPI, gradient reducer)"
    else if (sym ~ /gebp|gemm_pack|general_matrix_matrix|parallelize_gemm|ProductBlocking|gemm_rows|CpuBackend::gemm/) f = "GEMM (linear layers, LM head)"
    else if (sym ~ /attention|cpu::\(anonymous namespace\)::pack|HeadScratch|__expf|expf@plt/) f = "attention (fused, causal)"
    else if (sym ~ /layernorm/) f = "LayerNorm"
    else if (sym ~ /gelu/) f = "GELU"
    else if (sym ~ /softmax|cross_entropy|__logf/) f = "softmax + cross-entropy"
    else if (sym ~ /adamw|sum_sq|clip|to_f32_scaled|ZeroOptimizer|optim::/) f = "optimizer (AdamW, clip, ZeRO step)"
    else if (sym ~ /memmove|memcpy|memset|fill|copy|binary|add_|sum_to|sum_rows|accumulate|CpuBackend::scale|zero::add|embedding/) f = "copies, fills, adds, embeddings"
    else if (sym ~ /malloc|free|_int_|CachingAllocator|Storage|operator new|operator delete|memalign/) f = "allocation"
    else if (sym ~ /autograd|_Function_handler|shape_numel|Tensor|shared_ptr|_Sp_counted|Hashtable|_Map_base|record|zero::linear|zero::nn::/) f = "autograd, tensor and layer overhead"
    else f = "other"
    share[f] += pct; samples[f] += n; total += pct; total_n += n
  }
  END {
    for (f in share) printf "%.1f%%\t%s\t%.2f\n", share[f], f, (steps != "" ? samples[f] / steps : 0)
    printf "%.1f%%\ttotal\t%.2f\n", total, (steps != "" ? total_n / steps : 0) > "/dev/stderr"
  }' 2>"$tmp/total" | sort -rn >"$tmp/rows"
printf '%-42s %7s%s\n' family share "$([ -n "$steps" ] && echo '   CPU ms/step')"
while IFS=$'\t' read -r share family ms; do
  if [ -n "$steps" ]; then printf '%-42s %7s %13s\n' "$family" "$share" "$ms"; else printf '%-42s %7s\n' "$family" "$share"; fi
done <"$tmp/rows"
IFS=$'\t' read -r share family ms <"$tmp/total"
if [ -n "$steps" ]; then printf '%-42s %7s %13s\n' "total (over $steps steps)" "$share" "$ms"; fi
exit 0
