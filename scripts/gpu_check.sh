#!/usr/bin/env bash
# The GPU check (issue 4, item 7): one command, run on a machine with one NVIDIA GPU, that
#   1. builds Release with CUDA (or uses a prebuilt bundle, see below),
#   2. runs every CUDA unit test and the CUDA distributed tests (1 rank; 2 ranks host-staged),
#   3. trains 200 steps of fp16 ZeRO-2 on the GPU,
#   4. trains fp16 ZeRO-2 with 2 ranks sharing the GPU through the host-staged MPI communicator,
#   5. benchmarks nanoGPT's shakespeare_char config (6 layers, 6 heads, 384 channels, block 256,
#      batch 64) in fp32 and bf16: tokens/s, TFLOP/s, MFU,
# and writes everything to one JSON file. Budget: under 8 minutes on one H200.
#
#   scripts/gpu_check.sh [--out FILE] [--prebuilt DIR]     on the GPU machine
#   scripts/gpu_check.sh --bundle DIR                       on a build machine (no GPU needed)
#
# --out      the JSON file (default: $OUT/gpu_check.json when $OUT is set, else build-gpu/gpu_check.json).
# --prebuilt DIR  skip the build: use DIR/bin and DIR/lib made by --bundle (for a GPU machine that lacks
#            Eigen/fmt/MPI/GTest: carry DIR there). NCCL and cuBLAS are taken from the machine: the CUDA
#            toolkit's lib64, or the nvidia-nccl / nvidia-cublas Python wheels.
# --bundle DIR  builds here (build-gpu) and copies the three binaries and the non-CUDA shared libraries
#            they load into DIR/bin and DIR/lib (plus mpirun, best effort) — typically 20-40 MB.
# Data: $ZERO_DATA, else data/tinyshakespeare.txt (data/ is git-ignored: copy it there and carry it);
# without either, a synthetic corpus from the repository's text
# (throughput is unaffected; losses are then not comparable and the JSON says so).
#
# Steps that need a feature this build of train_gpt lacks (--device, --comm) are recorded as
# "missing" with the reason; the script goes on with the rest and exits 1 if
# anything failed or was missing. Each step has a timeout so the whole stays inside the budget.
# ZERO_GPU_BUILD=DIR builds in DIR instead of build-gpu; CUDA_ARCHS overrides the architecture (90).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

out="" prebuilt="" bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --prebuilt) prebuilt="$2"; shift 2 ;;
    --bundle) bundle="$2"; shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done

BUILD="${ZERO_GPU_BUILD:-$ROOT/build-gpu}"  # override to reuse another CUDA build tree
JOBS=$(nproc)
build_release() {
  mkdir -p "$BUILD"
  cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON -DZERO_BUILD_BENCH=OFF \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHS:-90}" >"$BUILD/gpu_check.configure.log" 2>&1 &&
    cmake --build "$BUILD" -j"$JOBS" --target zero_tests zero_dist_tests train_gpt >"$BUILD/gpu_check.build.log" 2>&1
}

# ---- --bundle: build here, pack binaries + libraries ----------------------------------------------------
if [ -n "$bundle" ]; then
  mkdir -p "$BUILD"
  echo "gpu_check: building Release with CUDA into $BUILD (log: $BUILD/gpu_check.build.log)"
  build_release || { echo "gpu_check: build failed, see $BUILD/gpu_check.{configure,build}.log" >&2; exit 1; }
  mkdir -p "$bundle/bin" "$bundle/lib"
  cp "$BUILD"/bin/{zero_tests,zero_dist_tests,train_gpt} "$bundle/bin/"
  # Libraries outside glibc / the compiler runtime / the CUDA toolkit and driver (those are on a CUDA image).
  for b in "$bundle"/bin/*; do ldd "$b"; done | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+|ld-linux[^/]*)\.so|/usr/local/cuda|libcuda\.so|libnvidia' |
    while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
  # mpirun and Open MPI's plugins, for the 2-rank run on a machine without MPI (best effort, never run
  # on a GPU machine yet: with OPAL_PREFIX=DIR Open MPI looks for its components and help files under
  # DIR + the configured paths minus the configured prefix, so the /usr layout is mirrored).
  if command -v mpirun >/dev/null && command -v ompi_info >/dev/null; then
    cp -L "$(command -v mpirun)" "$bundle/bin/mpirun" 2>/dev/null || true
    command -v orted >/dev/null && cp -L "$(command -v orted)" "$bundle/bin/orted"  # MPI singletons start one
    prefix=$(ompi_info --path prefix --parsable 2>/dev/null | awk -F: '{print $NF}')
    for key in libdir pkgdatadir; do
      dir=$(ompi_info --path "$key" --parsable 2>/dev/null | awk -F: '{print $NF}')
      [ -n "$prefix" ] && [ -d "$dir" ] && mkdir -p "$bundle/${dir#$prefix/}" &&
        cp -rL "$dir/." "$bundle/${dir#$prefix/}/" 2>/dev/null
    done
    for b in "$bundle"/bin/mpirun "$bundle"/bin/orted; do [ -e "$b" ] && ldd "$b"; done | awk '/=> \//{print $3}' |
      grep -Ev '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' |
      while read -r lib; do cp -nL "$lib" "$bundle/lib/" 2>/dev/null; done
  fi
  du -sh "$bundle"
  echo "gpu_check: bundle ready; on the GPU machine: scripts/gpu_check.sh --prebuilt $bundle"
  exit 0
fi

# ---- on the GPU machine ---------------------------------------------------------------------------------
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out="$OUT/gpu_check.json"; else out="$BUILD/gpu_check.json"; fi
fi
mkdir -p "$(dirname "$out")"
WORK=$(mktemp -d)
RESULTS="$WORK/results"  # one JSON fragment per step, merged at the end
mkdir -p "$RESULTS"
T_START=$(date +%s)

# record NAME STATUS SECONDS [KEY=FILE.json ...] [note=TEXT]: one fragment per step.
record() {
  local name="$1" status="$2" seconds="$3"; shift 3
  python3 - "$RESULTS/$name.json" "$name" "$status" "$seconds" "$@" <<'PY'
import json, sys
path, name, status, seconds, *extra = sys.argv[1:]
frag = {"status": status, "seconds": float(seconds)}
for item in extra:
    key, _, value = item.partition("=")
    if key == "note":
        frag["note"] = value
        continue
    try:
        with open(value) as f:
            frag[key] = json.load(f)
    except Exception as e:  # a missing or broken file is itself a result
        frag[key] = {"error": f"could not read {value}: {e}"}
json.dump({name: frag}, open(path, "w"), indent=1)
PY
}

# run_step NAME TIMEOUT COMMAND...: runs with a timeout, keeps the log tail, returns the exit code.
run_step() {
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  STEP_SECONDS=$(( $(date +%s) - t0 ))
  tail -n 40 "$WORK/$name.log" >"$WORK/$name.tail"
  [ $rc -eq 124 ] && echo "   timed out after ${limit}s"
  echo "   exit $rc in ${STEP_SECONDS}s"
  return $rc
}

tail_json() { python3 -c 'import json,sys; print(json.dumps({"log_tail": open(sys.argv[1]).read()}))' "$1" >"$1.json"; echo "$1.json"; }

# ---- 0. the machine ----
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader >"$WORK/gpu.txt" 2>&1
python3 - "$WORK/gpu.txt" "$WORK/device.json" <<'PY'
import json, sys, subprocess
text = open(sys.argv[1]).read().strip()
info = {"nvidia_smi": text}
try:
    info["nvcc"] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
except Exception as e:
    info["nvcc"] = f"unavailable: {e}"
json.dump(info, open(sys.argv[2], "w"))
PY
record device ok 0 info="$WORK/device.json"
echo "gpu: $(cat "$WORK/gpu.txt")"

# ---- 1. build (or prebuilt bundle) ----
BIN="$BUILD/bin"
if [ -n "$prebuilt" ]; then
  BIN="$(cd "$prebuilt" && pwd)/bin"
  LIBS="$(cd "$prebuilt" && pwd)/lib"
  extra=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime"):
    try:
        m = importlib.import_module(mod)
        for p in m.__path__:
            if os.path.isdir(os.path.join(p, "lib")): dirs.append(os.path.join(p, "lib"))
    except Exception:
        pass
print(":".join(dirs))
PY
)
  export LD_LIBRARY_PATH="$LIBS:/usr/local/cuda/lib64:${extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -x "$BIN/mpirun" ] && export OPAL_PREFIX="$(cd "$prebuilt" && pwd)" PATH="$BIN:$PATH"
  record build ok 0 note="prebuilt bundle $prebuilt"
else
  t0=$(date +%s)
  echo "== build (Release, CUDA, $JOBS jobs)"
  if build_release; then
    record build ok $(( $(date +%s) - t0 ))
  else
    tail -n 60 "$BUILD.configure.log" "$BUILD.build.log" >"$WORK/build.tail" 2>/dev/null
    record build failed $(( $(date +%s) - t0 )) detail="$(tail_json "$WORK/build.tail")"
    echo "gpu_check: the build failed (missing Eigen/fmt/MPI/GTest here? use --prebuilt, see --help)" >&2
  fi
fi

MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)
[ "$(id -u)" = 0 ] && MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2)

# ---- 2. CUDA tests ----
if [ -x "$BIN/zero_tests" ]; then
  run_step unit_tests 180 "$BIN/zero_tests" --gtest_filter='*Cuda*' --gtest_output="json:$WORK/unit.json"
  rc=$?; record unit_tests "$([ $rc -eq 0 ] && echo ok || echo failed)" "$STEP_SECONDS" \
    gtest="$WORK/unit.json" detail="$(tail_json "$WORK/unit_tests.tail")"
  # One rank: under mpirun when there is one, else as an MPI singleton.
  if command -v mpirun >/dev/null; then NP1=("${MPIRUN[@]:0:${#MPIRUN[@]}-1}" 1); else NP1=(); fi
  run_step dist_tests_np1 120 "${NP1[@]}" "$BIN/zero_dist_tests" --gtest_filter='Cuda*'
  rc=$?; record dist_tests_np1 "$([ $rc -eq 0 ] && echo ok || echo failed)" "$STEP_SECONDS" \
    detail="$(tail_json "$WORK/dist_tests_np1.tail")"
  if command -v mpirun >/dev/null; then
    run_step dist_tests_np2 120 "${MPIRUN[@]}" "$BIN/zero_dist_tests" --gtest_filter='Cuda*'
    rc=$?; record dist_tests_np2 "$([ $rc -eq 0 ] && echo ok || echo failed)" "$STEP_SECONDS" \
      detail="$(tail_json "$WORK/dist_tests_np2.tail")"
  else
    record dist_tests_np2 missing 0 note="no mpirun on this machine (carry one with --bundle)"
  fi
else
  record unit_tests missing 0 note="no zero_tests binary (build failed)"
fi

# ---- data ----
DATA="${ZERO_DATA:-}"
for cand in data/tinyshakespeare.txt; do
  [ -z "$DATA" ] && [ -f "$cand" ] && DATA="$cand"
done
DATA_NOTE="$DATA"
if [ -z "$DATA" ]; then
  DATA="$WORK/synthetic.txt"
  while [ "$(stat -c %s "$DATA" 2>/dev/null || echo 0)" -lt 1100000 ]; do
    git ls-files '*.md' '*.h' '*.cpp' | xargs cat >>"$DATA" 2>/dev/null || break
  done
  DATA_NOTE="synthetic (tinyshakespeare not found): losses not comparable"
fi
record data ok 0 note="$DATA_NOTE"

# ---- 3-5. training runs ----
TRAIN="$BIN/train_gpt"
HELP=$("$TRAIN" --help 2>/dev/null)
has_flag() { grep -q -- "$1" <<<"$HELP"; }
# nanoGPT's shakespeare_char config (config/train_shakespeare_char.py): 6/6/384, block 256, batch 64.
GPT=(--data "$DATA" --n-layer 6 --n-head 6 --n-embd 384 --block 256 --batch 64 --dropout 0.2 --lr 1e-3
     --min-lr 1e-4 --warmup 100 --beta2 0.99 --eval-every 0 --eval-iters 20 --sample 0 --log-every 50)

train_run() {  # train_run NAME TIMEOUT [launcher...] -- flags...
  local name="$1" limit="$2"; shift 2
  local launcher=()
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done; shift
  run_step "$name" "$limit" "${launcher[@]}" "$TRAIN" "${GPT[@]}" --metrics "$WORK/$name.metrics.json" "$@"
  local rc=$?
  record "$name" "$([ $rc -eq 0 ] && echo ok || echo failed)" "$STEP_SECONDS" \
    metrics="$WORK/$name.metrics.json" detail="$(tail_json "$WORK/$name.tail")"
}

if [ ! -x "$TRAIN" ]; then
  for s in train_fp16_zero2_1gpu train_fp16_zero2_2rank_host_staged bench_fp32 bench_bf16; do
    record "$s" missing 0 note="no train_gpt binary"
  done
elif ! has_flag "--device"; then
  for s in train_fp16_zero2_1gpu train_fp16_zero2_2rank_host_staged bench_fp32 bench_bf16; do
    record "$s" missing 0 note="this train_gpt has no --device flag"
  done
else
  train_run train_fp16_zero2_1gpu 120 -- --device cuda --dtype fp16 --zero-stage 2 --steps 200
  if ! has_flag "--comm"; then
    record train_fp16_zero2_2rank_host_staged missing 0 note="this train_gpt has no --comm flag"
  elif ! command -v mpirun >/dev/null; then
    record train_fp16_zero2_2rank_host_staged missing 0 note="no mpirun on this machine"
  else
    train_run train_fp16_zero2_2rank_host_staged 120 "${MPIRUN[@]}" -- --device cuda --comm host-staged \
      --dtype fp16 --zero-stage 2 --steps 100
  fi
  # Throughput: 300 steps each (the first 5 are excluded from tokens/s by train_gpt).
  train_run bench_fp32 120 -- --device cuda --dtype fp32 --steps 300
  train_run bench_bf16 120 -- --device cuda --dtype bf16 --steps 300
fi

# ---- the JSON ----
python3 - "$RESULTS" "$out" "$(( $(date +%s) - T_START ))" <<'PY'
import glob, json, os, sys
results_dir, out, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
merged = {}
for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
    merged.update(json.load(open(path)))

# H200 SXM peaks (NVIDIA datasheet, dense): bf16/fp16 989 TFLOP/s, TF32 495, fp32 (no tensor cores) 67.
PEAK = {"bf16": 989e12, "f16": 989e12, "fp16": 989e12, "f32": 67e12, "fp32": 67e12}
bench = {}
for key in ("bench_fp32", "bench_bf16", "train_fp16_zero2_1gpu"):
    m = merged.get(key, {}).get("metrics")
    if not isinstance(m, dict) or "tokens_per_s" not in m:
        continue
    tok = m["tokens_per_s"]
    flops = m.get("flops_per_token")
    tflops = m.get("tflops", tok * flops / 1e12 if flops else None)
    dtype = m.get("dtype", "f32")
    peak = m.get("peak_flops", PEAK.get(dtype))
    bench[key] = {"dtype": dtype, "tokens_per_s": tok, "tflops": tflops,
                  "mfu": m.get("mfu", tflops * 1e12 / peak if tflops and peak else None),
                  "peak_flops_used": peak, "val_loss": m.get("val_loss"), "train_loss": m.get("train_loss")}
merged["summary"] = bench
statuses = {k: v.get("status") for k, v in merged.items() if isinstance(v, dict) and "status" in v}
merged["all_ok"] = all(s == "ok" for s in statuses.values())
merged["statuses"] = statuses
merged["total_seconds"] = total
tmp = out + ".tmp"
json.dump(merged, open(tmp, "w"), indent=1)
os.replace(tmp, out)
print(json.dumps({"statuses": statuses, "summary": bench, "total_seconds": total}, indent=1))
print("gpu_check: wrote", out)
sys.exit(0 if merged["all_ok"] else 1)
PY
rc=$?
rm -rf "$WORK"
exit $rc
