#!/usr/bin/env bash
# The GPU check: one command, run on a machine with one NVIDIA GPU, that
#   0. looks for the GPU (nvidia-smi, /dev/nvidia*, and a probe's cudaGetDeviceCount) and compares the
#      driver's CUDA version with the runtime the build uses, stopping within seconds when either fails,
#   1. builds Release with CUDA for that GPU (or uses a prebuilt bundle, see below),
#   2. runs every CUDA / NCCL / ZeRO-on-device unit and distributed test (1 rank; 2 ranks host-staged),
#   3. trains 200 steps of fp16 ZeRO-2 on the GPU, and fp16 ZeRO-2 with 2 ranks sharing the GPU through
#      the host-staged MPI communicator,
#   4. benchmarks nanoGPT's shakespeare_char config (6 layers, 6 heads, 384 channels, block 256,
#      batch 64) in fp32, TF32 and bf16: tokens/s, TFLOP/s, MFU,
# and writes everything to one JSON file whose top-level "status" is
#   "ok"              every step ran and passed;
#   "no_gpu"          no usable GPU is visible (nothing was built or run);
#   "driver_too_old"  the driver supports an older CUDA than the runtime the build uses;
#   "tests_skipped"   every step passed but a GPU test reported itself skipped (it tested nothing);
#   "failed"          anything else: a step failed, timed out or could not run;
# with "reason" saying why. The exit status is 0 for "ok" only.
#
#   scripts/gpu_check.sh [--out FILE] [--prebuilt DIR]     on the GPU machine
#   scripts/gpu_check.sh --bundle DIR                       on a build machine (no GPU needed)
#
# --out FILE      the JSON file (default: $OUT/gpu_check.json when $OUT is set, else
#                 build-gpu/gpu_check.json).
# --prebuilt DIR  skip the build: run the binaries of a bundle made by --bundle (for a GPU machine that
#                 lacks Eigen, fmt, MPI or GoogleTest). Libraries the bundle does not hold (cuBLAS, the
#                 CUDA runtime, NCCL when it was too large to carry) come from the machine: the CUDA
#                 toolkit's lib64 or lib, or the nvidia-* Python wheels.
# --bundle DIR    scripts/gpu_bundle.sh DIR: builds here for a portable CPU level and packs a
#                 self-contained folder (see that script).
# Data: $ZERO_DATA, else data/tinyshakespeare.txt, else the bundle's data/corpus.txt; without any, a
# deterministic synthetic corpus (throughput is unaffected; losses are then not comparable, and the
# JSON says so).
# Budget: every step has its own time limit, and each limit is cut to what is left of the whole
# budget, $ZERO_GPU_CHECK_BUDGET_S seconds (default 420: 7 minutes, so start-up included a run fits in
# 8). ZERO_GPU_BUILD=DIR builds in DIR instead of build-gpu; CUDA_ARCHS overrides the CUDA
# architectures (default: the GPU's own compute capability). ZERO_GPU_CHECK_DRY_RUN=1 skips looking for
# a GPU, to test this script on a machine without one: the status is then never "ok".
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
ROOT=$(cd "$(dirname "$SELF")/.." && pwd)
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }  # paths given are the caller's

out="" prebuilt="" bundle=""
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$(absolute "${2:?--out needs a file}"); shift 2 ;;
    --prebuilt) prebuilt=$(absolute "${2:?--prebuilt needs a folder}"); shift 2 ;;
    --bundle) bundle=$(absolute "${2:?--bundle needs a folder}"); shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$SELF"; exit 0 ;;
    *) echo "gpu_check: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ -n "$bundle" ]; then exec "$ROOT/scripts/gpu_bundle.sh" "$bundle"; fi
if [ -n "$prebuilt" ]; then
  [ -x "$prebuilt/bin/zero_tests" ] || { echo "gpu_check: $prebuilt is not a bundle (no bin/zero_tests)" >&2; exit 2; }
  prebuilt=$(cd "$prebuilt" && pwd)
fi
[ -n "${ZERO_DATA:-}" ] && ZERO_DATA=$(absolute "$ZERO_DATA")
[ -n "${ZERO_GPU_BUILD:-}" ] && ZERO_GPU_BUILD=$(absolute "$ZERO_GPU_BUILD")
cd "$ROOT" || exit 2

BUILD="${ZERO_GPU_BUILD:-$ROOT/build-gpu}"
BUDGET="${ZERO_GPU_CHECK_BUDGET_S:-420}"
# ZERO_GPU_CHECK_DRY_RUN=1 skips looking for the GPU, to test this script where there is none
# (tests/bundle/check_bundle.sh): every GPU test then skips and the status can never be "ok".
DRY_RUN="${ZERO_GPU_CHECK_DRY_RUN:-0}"
export DRY_RUN
if [ -z "$out" ]; then
  if [ -n "${OUT:-}" ]; then out="$OUT/gpu_check.json"; else out="$BUILD/gpu_check.json"; fi
fi
mkdir -p "$(dirname "$out")"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
RESULTS="$WORK/results"  # one JSON fragment per step, merged by finish
mkdir -p "$RESULTS"
T_START=$(date +%s)

# Every CUDA, NCCL and ZeRO-on-device test: the Cuda* suites, the op table's *_cuda rows, Backend's
# mixed-device test, NCCL and ZeroCuda. Left out: TrainGptCli.* (CudaWithoutADevice is the opposite
# case: it skips when a GPU is there), and the op-table rows that skip on every device (dropout's
# forward has no reference: its own tests check it). tests/bundle/check_bundle.sh checks that no test
# named for a GPU falls outside the filter and that no *_cuda test in it has a CPU twin that skips.
UNIT_FILTER='*Cuda*:*cuda*:*Nccl*:*Gpu*:Backend.*-TrainGptCli.*:Ops/OpTable.ForwardMatchesReference/dropout_training_cuda'
DIST_FILTER_NP1='*Cuda*:*cuda*:*Nccl*:*Gpu*'
DIST_FILTER_NP2='CudaHostStaged.*:ZeroCuda.*'  # NCCL proper needs a GPU per rank; the host-staged path shares one

# record NAME STATUS SECONDS [KEY=FILE.json ...] [note=TEXT] [reason=TEXT]: one fragment per step.
record() {
  local name="$1" status="$2" seconds="$3"; shift 3
  python3 - "$RESULTS/$(printf '%02d' "$(ls "$RESULTS" | wc -l)")_$name.json" "$name" "$status" "$seconds" "$@" <<'PY'
import json, sys
path, name, status, seconds, *extra = sys.argv[1:]
frag = {"status": status, "seconds": float(seconds)}
for item in extra:
    key, _, value = item.partition("=")
    if key in ("note", "reason"):
        frag[key] = value
        continue
    try:
        with open(value) as f:
            frag[key] = json.load(f)
    except Exception as e:  # a missing or broken file is itself a result
        frag[key] = {"error": f"could not read {value}: {e}"}
json.dump({name: frag}, open(path, "w"), indent=1)
PY
}

# finish [STATUS REASON]: merges the fragments into $out and exits. Without arguments the status comes
# from the steps: "failed" if any step is not ok, else "tests_skipped" if any test skipped, else "ok".
finish() {
  python3 - "$RESULTS" "$out" "$(( $(date +%s) - T_START ))" "$BUDGET" "$@" <<'PY'
import glob, json, os, sys
results_dir, out, total, budget, *forced = sys.argv[1:]
steps = {}
for path in sorted(glob.glob(os.path.join(results_dir, "*.json"))):
    steps.update(json.load(open(path)))
machine = steps.pop("machine", {}).get("info", {})

# H200 SXM peaks (NVIDIA datasheet, dense) for metrics that carry none: bf16/fp16 989 TFLOP/s, TF32
# 495, fp32 without tensor cores 67.
PEAK = {"bf16": 989e12, "f16": 989e12, "fp16": 989e12, "tf32": 495e12, "f32": 67e12, "fp32": 67e12}
summary = {}
for key, step in steps.items():
    m = step.get("metrics")
    if not isinstance(m, dict) or "tokens_per_s" not in m:
        continue
    tok, flops = m["tokens_per_s"], m.get("flops_per_token")
    tflops = m.get("tflops", tok * flops / 1e12 if flops else None)
    precision = "tf32" if m.get("dtype") in ("f32", "fp32") and m.get("tf32") else m.get("dtype", "f32")
    peak = m.get("peak_flops") or PEAK.get(precision)
    mfu = m.get("mfu")
    if mfu is None and tflops and peak:
        mfu = tflops * 1e12 / peak
    summary[key] = {"precision": precision, "device": m.get("device"), "tokens_per_s": tok, "tflops": tflops,
                    "mfu": mfu, "peak_flops_used": peak, "train_loss": m.get("train_loss"),
                    "val_loss": m.get("val_loss")}

statuses = {k: v.get("status") for k, v in steps.items()}
if forced:
    status, reason = forced[0], forced[1]
else:
    bad = [k for k, s in statuses.items() if s != "ok"]
    skipped = sorted({t for v in steps.values() for t in v.get("skipped_tests", [])})
    if bad:
        status = "failed"
        reason = "; ".join(f"{k}: {steps[k].get('reason') or steps[k].get('status')}" for k in bad)
        if skipped:
            reason += f"; and {len(skipped)} GPU test(s) skipped"
    elif skipped:
        status = "tests_skipped"
        reason = f"{len(skipped)} GPU test(s) skipped: " + ", ".join(skipped[:20])
    elif not steps:
        status, reason = "failed", "no step ran"
    else:
        status, reason = "ok", "every step ran and passed"
if status == "ok" and os.environ.get("DRY_RUN") == "1":
    status, reason = "failed", "dry run (ZERO_GPU_CHECK_DRY_RUN=1): no GPU was used"
result = {"status": status, "reason": reason, "machine": machine, "steps": steps, "statuses": statuses,
          "summary": summary, "total_seconds": int(total), "budget_seconds": int(budget)}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(result, f, indent=1)
os.replace(tmp, out)
print(json.dumps({"status": status, "reason": reason, "statuses": statuses, "summary": summary,
                  "total_seconds": int(total)}, indent=1))
print("gpu_check: wrote", out)
sys.exit(0 if status == "ok" else 1)
PY
  exit $?
}

# jget FILE EXPR: a Python expression over the JSON in FILE (named d), printed.
jget() { python3 -c "import json, math, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }

# limit WANTED: WANTED seconds, cut to what is left of the budget (10 s kept for the JSON).
limit() {
  local left=$(( BUDGET - ($(date +%s) - T_START) - 10 ))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}

# run_step NAME TIMEOUT COMMAND...: runs with a timeout (cut to the budget), keeps the log tail in
# $WORK/NAME.tail.json, sets STEP_SECONDS and STEP_REASON, returns the exit code.
run_step() {
  local name="$1" want="$2"; shift 2
  local lim; lim=$(limit "$want")
  STEP_SECONDS=0 STEP_REASON=""
  if [ "$lim" -lt 5 ]; then
    STEP_REASON="not run: the ${BUDGET}s budget was used up"
    echo "== $name: $STEP_REASON"
    python3 -c 'import json,sys; json.dump({"log_tail": ""}, open(sys.argv[1], "w"))' "$WORK/$name.tail.json"
    return 125
  fi
  local t0; t0=$(date +%s)
  echo "== $name (limit ${lim}s): $*"
  timeout --kill-after=10 "$lim" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  STEP_SECONDS=$(( $(date +%s) - t0 ))
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    STEP_REASON="timed out after ${lim}s"
  elif [ $rc -ne 0 ]; then
    STEP_REASON="exit status $rc"
  fi
  echo "   exit $rc in ${STEP_SECONDS}s${STEP_REASON:+ ($STEP_REASON)}"
  python3 -c 'import json,sys; json.dump({"log_tail": open(sys.argv[1], errors="replace").read()[-4000:]}, open(sys.argv[2], "w"))' \
    "$WORK/$name.log" "$WORK/$name.tail.json"
  return $rc
}

# ---- 0. the GPU, before anything is built --------------------------------------------------------------
no_gpu() {
  if [ -s "$WORK/smi.txt" ] && [ "$(cat "$WORK/machine.json")" = '{}' ]; then
    python3 -c 'import json,sys; json.dump({"nvidia_smi": open(sys.argv[1]).read().strip()}, open(sys.argv[2], "w"))' \
      "$WORK/smi.txt" "$WORK/machine.json"
  fi
  record machine no_gpu 0 info="$WORK/machine.json" 2>/dev/null
  echo "gpu_check: no GPU: $1" >&2
  finish no_gpu "$1"
}
echo '{}' >"$WORK/machine.json"
command -v python3 >/dev/null || { echo "gpu_check: python3 is needed to write the JSON" >&2; exit 1; }
if [ "$DRY_RUN" = 1 ]; then
  echo '{"dry_run": "ZERO_GPU_CHECK_DRY_RUN=1: no GPU looked for"}' >"$WORK/machine.json"
else
  command -v nvidia-smi >/dev/null || no_gpu "nvidia-smi not found (no NVIDIA driver installed)"
  timeout 20 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$WORK/smi.txt" 2>&1 ||
    no_gpu "nvidia-smi failed: $(head -n 1 "$WORK/smi.txt")"
  timeout 20 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: *[0-9.]*' | head -n 1 | grep -o '[0-9.]*$' >"$WORK/smi_cuda.txt"
  compgen -G '/dev/nvidia[0-9]*' >/dev/null || no_gpu "no /dev/nvidia[0-9]* device node"
fi

# The probe: from the bundle, else compiled here from tools/gpu_probe.cpp (seconds).
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
if [ -n "$prebuilt" ]; then
  BIN="$prebuilt/bin"
  # Libraries the bundle leaves to the machine: the toolkit's, then the nvidia-* wheels' (NCCL among them).
  wheels=$(python3 - <<'PY' 2>/dev/null
import importlib, os
dirs = []
for mod in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia"):
    try:
        for p in importlib.import_module(mod).__path__:
            for sub in ("lib", "lib64"):
                if os.path.isdir(os.path.join(p, sub)): dirs.append(os.path.join(p, sub))
    except Exception:
        pass
print(":".join(dict.fromkeys(dirs)))
PY
)
  LD_LIBRARY_PATH="$prebuilt/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  PROBE="$BIN/gpu_probe"
  # The bundle's Open MPI: its plugins and help files (OPAL_PREFIX), PMIx's plugins, its orted (PATH:
  # an MPI singleton starts one), and none of hwloc's optional plugins a different hwloc might have.
  if [ -x "$BIN/mpirun" ]; then
    export OPAL_PREFIX="$prebuilt" PATH="$BIN:$PATH" HWLOC_PLUGINS_PATH="$prebuilt/lib/hwloc"
    [ -d "$prebuilt/pmix" ] && export PMIX_MCA_mca_base_component_path="$prebuilt/pmix/lib/pmix"
  fi
else
  BIN="$BUILD/bin"
  export LD_LIBRARY_PATH="/usr/local/cuda/lib64:/usr/local/cuda/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  PROBE="$WORK/gpu_probe"
  [ "$DRY_RUN" = 1 ] || timeout 60 "$NVCC" -O2 -o "$PROBE" tools/gpu_probe.cpp -ldl >"$WORK/probe_build.log" 2>&1 ||
    { record machine failed 0 info="$WORK/machine.json"
      finish failed "could not build tools/gpu_probe.cpp with $NVCC: $(tail -n 1 "$WORK/probe_build.log")"; }
fi
if [ "$DRY_RUN" = 1 ]; then
  GPU_CC=$(jget "${prebuilt:-/nonexistent}/manifest.json" 'd["cuda_architectures"][0]' 2>/dev/null || echo 90)
  record machine ok 0 info="$WORK/machine.json"
else
timeout 30 "$PROBE" >"$WORK/probe.json" 2>"$WORK/probe.err"
probe_rc=$?
python3 - "$WORK/smi.txt" "$WORK/smi_cuda.txt" "$WORK/probe.json" "$WORK/probe.err" "$prebuilt" "$WORK/machine.json" <<'PY'
import json, os, subprocess, sys
smi, smi_cuda, probe_path, probe_err, prebuilt, out = sys.argv[1:]
first = open(smi).read().strip().splitlines()[0].split(", ")
info = {"gpu": first[0], "driver_version": first[1] if len(first) > 1 else None,
        "gpu_memory": first[2] if len(first) > 2 else None,
        "driver_cuda_version_nvidia_smi": open(smi_cuda).read().strip() or None}
try:
    probe = json.load(open(probe_path))
except Exception:
    probe = {"error": "probe printed no JSON: " + open(probe_err, errors="replace").read()[-500:]}
info["probe"] = probe
def ver(v, nccl=False):
    if not isinstance(v, int) or v <= 0: return None
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if nccl else f"{v // 1000}.{v % 1000 // 10}"
info["driver_cuda_version"] = ver(probe.get("driver_cuda_version"))
info["cuda_runtime_version"] = ver(probe.get("runtime_cuda_version"))
info["nccl_version"] = ver(probe.get("nccl_version"), nccl=True)
info["nccl_library"] = probe.get("nccl_library")
if prebuilt:
    try: info["bundle"] = json.load(open(os.path.join(prebuilt, "manifest.json")))
    except Exception as e: info["bundle"] = {"error": str(e)}
json.dump(info, open(out, "w"), indent=1)
PY
eval "$(python3 -c '
import json, sys
i = json.load(open(sys.argv[1])); p = i.get("probe", {})
cc = [d.get("compute_capability", "") for d in p.get("devices", [])]
print("GPU_CC=" + (cc[0].replace(".", "") if cc else ""))
print("DRV=" + str(i.get("driver_cuda_version") or "none"), "RT=" + str(i.get("cuda_runtime_version") or "?"))
' "$WORK/machine.json")"
echo "gpu: $(cat "$WORK/smi.txt"); driver supports CUDA $DRV, runtime $RT; probe exit $probe_rc"
case $probe_rc in
  0) ;;
  2) no_gpu "the probe found no usable device ($(jget "$WORK/machine.json" 'd.get("probe", {}).get("error")'))" ;;
  3) record machine driver_too_old 0 info="$WORK/machine.json"
     finish driver_too_old "the driver supports CUDA $DRV, older than the CUDA $RT runtime this build uses" ;;
  *) record machine failed 0 info="$WORK/machine.json"
     finish failed "the probe failed (exit $probe_rc): $(head -c 300 "$WORK/probe.json" "$WORK/probe.err" | tr '\n' ' ')" ;;
esac
record machine ok 0 info="$WORK/machine.json"
if [ -n "$prebuilt" ]; then
  built_for=$(jget "$prebuilt/manifest.json" '" ".join(str(a) for a in d.get("cuda_architectures", []))' 2>/dev/null)
  case " $built_for " in
    *" $GPU_CC "*) ;;
    *) finish failed "the bundle's CUDA code is for sm_${built_for:-?}, the GPU is sm_$GPU_CC" ;;
  esac
  if ! grep -q '"nccl_version": [1-9]' "$WORK/probe.json"; then
    finish failed "libnccl.so.2 not found (neither in the bundle, the toolkit nor an nvidia-nccl wheel)"
  fi
fi
fi  # DRY_RUN

# ---- 1. build (or prebuilt bundle) ---------------------------------------------------------------------
if [ -z "$prebuilt" ]; then
  mkdir -p "$BUILD"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  # shellcheck disable=SC2016
  run_step build 300 bash -c '
    cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON -DZERO_BUILD_BENCH=OFF \
          -DCMAKE_CUDA_ARCHITECTURES="$3" "${@:4}" >"$2/gpu_check.configure.log" 2>&1 || exit 3
    cmake --build "$2" -j"$(nproc)" --target zero_tests zero_dist_tests train_gpt >"$2/gpu_check.build.log" 2>&1' \
    _ "$ROOT" "$BUILD" "${CUDA_ARCHS:-$GPU_CC}" "${launcher[@]}"
  rc=$?
  if [ $rc -ne 0 ]; then
    tail -n 60 "$BUILD/gpu_check.configure.log" "$BUILD/gpu_check.build.log" >"$WORK/build.tail" 2>/dev/null
    python3 -c 'import json,sys; json.dump({"log_tail": open(sys.argv[1], errors="replace").read()}, open(sys.argv[2], "w"))' \
      "$WORK/build.tail" "$WORK/build.tail.json"
    record build failed "$STEP_SECONDS" detail="$WORK/build.tail.json" \
      reason="${STEP_REASON}; logs: $BUILD/gpu_check.configure.log, $BUILD/gpu_check.build.log"
    echo "gpu_check: the build failed (missing Eigen/fmt/MPI/GTest here? use --prebuilt, see --help)" >&2
    finish
  fi
  record build ok "$STEP_SECONDS" note="CUDA architectures ${CUDA_ARCHS:-$GPU_CC}"
else
  record build ok 0 note="prebuilt bundle $prebuilt"
fi

# ---- 2. the GPU tests ----------------------------------------------------------------------------------
# One machine: Open MPI's isolated launcher starts local processes without the ssh/rsh it otherwise
# insists on finding (a bare GPU machine has neither).
export OMPI_MCA_plm=isolated
MPIRUN=(mpirun --oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
HAVE_MPIRUN=0
command -v mpirun >/dev/null && HAVE_MPIRUN=1

# gtest_step NAME WANTED FILTER JSON_PATTERN COMMAND...: runs a gtest binary and records the step from
# its JSON reports (JSON_PATTERN: a glob, one file per rank): failed if it exited non-zero, ran no test
# or a test failed; the names of skipped tests go into "skipped_tests".
gtest_step() {
  local name="$1" want="$2" pattern="$3"; shift 3
  run_step "$name" "$want" "$@"
  local rc=$?
  python3 - "$WORK/$name.verdict.json" "$rc" "$STEP_REASON" "$pattern" <<'PY'
import glob, json, sys
out, rc, reason, pattern = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ran, skipped, failed, files = set(), set(), set(), sorted(glob.glob(pattern))
for path in files:
    try:
        report = json.load(open(path))
    except Exception:
        continue
    for suite in report.get("testsuites", []):
        for t in suite.get("testsuite", []):
            name = f"{suite['name']}.{t['name']}"
            if t.get("status") == "NOTRUN": continue
            ran.add(name)
            if t.get("result") == "SKIPPED": skipped.add(name)
            if t.get("failures"): failed.add(name)
status = "ok"
if rc != 0 or failed or not files:
    status = "failed"
    reason = reason or "a test failed"
    if not files and rc != 125: reason += "; no gtest JSON report"  # 125: not run at all
elif not ran:
    status, reason = "failed", "the filter matched no test"
verdict = {"status": status, "reason": reason, "tests_run": len(ran), "skipped_tests": sorted(skipped),
           "failed_tests": sorted(failed)}
json.dump(verdict, open(out, "w"))
print(f"   {len(ran)} tests ran, {len(skipped)} skipped, {len(failed)} failed")
PY
  local st why
  st=$(jget "$WORK/$name.verdict.json" 'd["status"]')
  why=$(jget "$WORK/$name.verdict.json" 'd["reason"]')
  record "$name" "$st" "$STEP_SECONDS" result="$WORK/$name.verdict.json" detail="$WORK/$name.tail.json" reason="$why"
  # The counts at the top level of the step, where finish looks for skipped tests.
  python3 - "$RESULTS" "$name" "$WORK/$name.verdict.json" <<'PY'
import glob, json, sys
results, name, verdict = sys.argv[1:]
path = [p for p in glob.glob(f"{results}/*_{name}.json")][0]
frag = json.load(open(path)); v = json.load(open(verdict))
frag[name].update({k: v[k] for k in ("tests_run", "skipped_tests", "failed_tests")}); frag[name].pop("result", None)
json.dump(frag, open(path, "w"), indent=1)
PY
}

if [ ! -x "$BIN/zero_tests" ]; then
  record unit_tests failed 0 reason="no $BIN/zero_tests"
else
  gtest_step unit_tests 150 "$WORK/unit.json" \
    "$BIN/zero_tests" --gtest_filter="$UNIT_FILTER" --gtest_output="json:$WORK/unit.json"
  # Each rank writes its own report (Open MPI names the rank in OMPI_COMM_WORLD_RANK).
  # shellcheck disable=SC2016
  per_rank=(bash -c 'exec "$0" "$@" --gtest_output="json:$ZERO_REPORT.${OMPI_COMM_WORLD_RANK:-0}.json"' "$BIN/zero_dist_tests")
  if [ $HAVE_MPIRUN = 1 ]; then
    ZERO_REPORT="$WORK/np1" gtest_step dist_tests_np1 60 "$WORK/np1.*.json" \
      "${MPIRUN[@]}" -x ZERO_REPORT -np 1 "${per_rank[@]}" --gtest_filter="$DIST_FILTER_NP1"
    ZERO_REPORT="$WORK/np2" gtest_step dist_tests_np2 90 "$WORK/np2.*.json" \
      "${MPIRUN[@]}" -x ZERO_REPORT -np 2 "${per_rank[@]}" --gtest_filter="$DIST_FILTER_NP2"
  else  # one rank as an MPI singleton; the 2-rank tests cannot run
    ZERO_REPORT="$WORK/np1" gtest_step dist_tests_np1 60 "$WORK/np1.*.json" \
      "${per_rank[@]}" --gtest_filter="$DIST_FILTER_NP1"
    record dist_tests_np2 failed 0 reason="no mpirun on this machine (a bundle carries one)"
  fi
fi

# ---- data ----------------------------------------------------------------------------------------------
DATA="${ZERO_DATA:-}" DATA_NOTE=""
for cand in data/tinyshakespeare.txt ${prebuilt:+"$prebuilt/data/corpus.txt"}; do
  [ -z "$DATA" ] && [ -f "$cand" ] && DATA="$cand"
done
if [ -z "$DATA" ]; then
  DATA="$WORK/synthetic.txt"
  python3 "$ROOT/scripts/make_corpus.py" "$DATA" >/dev/null
  DATA_NOTE="synthetic corpus (no Tiny Shakespeare found): losses not comparable"
else
  DATA_NOTE="$DATA"
  [ -f "$DATA.source" ] && DATA_NOTE="$DATA ($(cat "$DATA.source"))"
fi
record data ok 0 note="$DATA_NOTE"

# ---- 3-4. training runs --------------------------------------------------------------------------------
TRAIN="$BIN/train_gpt"
HELP=$("$TRAIN" --help 2>/dev/null)
has_flag() { grep -q -- "$1" <<<"$HELP"; }
# nanoGPT's shakespeare_char config (config/train_shakespeare_char.py): 6/6/384, block 256, batch 64.
GPT=(--data "$DATA" --n-layer 6 --n-head 6 --n-embd 384 --block 256 --batch 64 --dropout 0.2 --lr 1e-3
     --min-lr 1e-4 --warmup 100 --beta2 0.99 --eval-every 0 --eval-iters 20 --sample 0 --log-every 50)

train_run() {  # train_run NAME TIMEOUT [launcher...] -- flags...
  local name="$1" want="$2"; shift 2
  local launcher=()
  while [ "$1" != "--" ]; do launcher+=("$1"); shift; done; shift
  run_step "$name" "$want" "${launcher[@]}" "$TRAIN" "${GPT[@]}" --metrics "$WORK/$name.metrics.json" "$@"
  local rc=$? status=ok reason=""
  if [ $rc -ne 0 ]; then
    status=failed reason="$STEP_REASON"
  elif [ "$(jget "$WORK/$name.metrics.json" \
             'd.get("device") == "cuda" and math.isfinite(d.get("train_loss") or math.nan)' 2>/dev/null)" != True ]; then
    status=failed reason="metrics missing, not on cuda, or a non-finite loss"
  fi
  record "$name" "$status" "$STEP_SECONDS" metrics="$WORK/$name.metrics.json" detail="$WORK/$name.tail.json" \
    reason="$reason"
}

TRAIN_STEPS=(train_fp16_zero2_1gpu train_fp16_zero2_2rank_host_staged bench_fp32 bench_tf32 bench_bf16)
if [ ! -x "$TRAIN" ]; then
  for s in "${TRAIN_STEPS[@]}"; do record "$s" failed 0 reason="no train_gpt binary"; done
elif ! has_flag "--device"; then
  for s in "${TRAIN_STEPS[@]}"; do record "$s" failed 0 reason="this train_gpt has no --device flag"; done
else
  train_run train_fp16_zero2_1gpu 60 -- --device cuda --dtype fp16 --zero-stage 2 --steps 200
  if [ $HAVE_MPIRUN = 0 ]; then
    record train_fp16_zero2_2rank_host_staged failed 0 reason="no mpirun on this machine"
  else
    train_run train_fp16_zero2_2rank_host_staged 60 "${MPIRUN[@]}" -np 2 -- --device cuda --comm host-staged \
      --dtype fp16 --zero-stage 2 --steps 100
  fi
  # Throughput: 100 steps each (train_gpt leaves the first 5 out of tokens/s).
  train_run bench_fp32 45 -- --device cuda --dtype fp32 --steps 100
  if has_flag "--tf32"; then
    train_run bench_tf32 45 -- --device cuda --dtype fp32 --tf32 --steps 100
  else
    record bench_tf32 failed 0 reason="this train_gpt has no --tf32 flag"
  fi
  train_run bench_bf16 45 -- --device cuda --dtype bf16 --steps 100
fi

finish
