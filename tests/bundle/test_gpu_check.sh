#!/usr/bin/env bash
# scripts/gpu_check.sh's verdicts, without a GPU: a fake bundle (fake zero_tests, zero_dist_tests,
# train_gpt, gpu_probe and mpirun, a fake nvidia-smi and device node) is set up for one cause at a time,
# and the check must report that cause's status, never "ok"; with nothing wrong it must report "ok"
# (so the fakes are good enough to pass). Also: the plan's limits sum to at most 480 s and --dry-run
# prints them. Needs python3 only; takes a few seconds.
#
#   tests/bundle/test_gpu_check.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "test_gpu_check: FAIL: $*" >&2; exit 1; }
pass() { echo "test_gpu_check: ok: $*"; }

# ---- the fakes ----------------------------------------------------------------------------------------------
mkdir -p "$T/fake" "$T/path" "$T/dev"
touch "$T/dev/nvidia0"

# A GoogleTest binary: --gtest_list_tests, --gtest_filter (positive:patterns-negative:patterns, * and ?),
# --gtest_output=json:FILE; outcomes from the scenario ("pass", "skip" or "fail" per test).
cat >"$T/fake/gtest.py" <<'PY'
import fnmatch, json, os, sys, time
cfg = json.load(open(os.environ["FAKE_CONFIG"]))
me = sys.argv.pop(1)  # the binary this fake plays
if me in cfg.get("broken", {}):
    rc, text = cfg["broken"][me]
    print(text, file=sys.stderr)
    sys.exit(rc)
tests = cfg["tests"][me]
flt, out, listing = "*", None, False
for a in sys.argv[1:]:
    if a.startswith("--gtest_filter="): flt = a.split("=", 1)[1]
    elif a.startswith("--gtest_output=json:"): out = a.split(":", 1)[1]
    elif a == "--gtest_list_tests": listing = True
pos, _, neg = flt.partition("-")
match = lambda pats, n: any(fnmatch.fnmatchcase(n, p) for p in pats.split(":") if p)
names = [n for n in tests if match(pos or "*", n) and not match(neg, n)]
if listing:
    suite = None
    for n in names:
        s, t = n.split(".", 1)
        if s != suite:
            print(s + ".")
            suite = s
        print("  " + t)
    sys.exit(0)
time.sleep(cfg.get("test_seconds", 0))
suites = {}
for n in names:
    s, t = n.split(".", 1)
    entry = {"name": t, "status": "RUN", "result": "SKIPPED" if tests[n] == "skip" else "COMPLETED"}
    if tests[n] == "fail":
        entry["failures"] = [{"failure": "expected 1, got 2"}]
    suites.setdefault(s, []).append(entry)
if out:
    json.dump({"testsuites": [{"name": s, "testsuite": v} for s, v in suites.items()]}, open(out, "w"))
sys.exit(1 if any(v == "fail" for n, v in tests.items() if n in names) else 0)
PY

# train_gpt: --help, or a run that writes --metrics and --log-file as the real one does, with a loss curve
# from the scenario: "learn" (4.2 down to 2.4), "flat" (stays near ln 65) or "skip_all" (fp16 overflow
# on every step: nothing is updated).
cat >"$T/fake/train_gpt.py" <<'PY'
import json, math, os, sys
cfg = json.load(open(os.environ["FAKE_CONFIG"]))
if "train_gpt" in cfg.get("broken", {}):
    rc, text = cfg["broken"]["train_gpt"]
    print(text, file=sys.stderr)
    sys.exit(rc)
if "--help" in sys.argv:
    print("train_gpt: --device --dtype --zero-stage --steps --tf32 --metrics --log-file")
    sys.exit(0)
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
steps, dtype = int(args["--steps"]), {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}[args["--dtype"]]
rank, world = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
mode = cfg.get("train", "learn")
skip = mode == "skip_all" and dtype == "f16"
losses = [4.2 if skip or mode == "flat" else 2.4 + 1.8 * math.exp(-i / 30) for i in range(steps)]
if rank == 0:
    with open(args["--log-file"], "w") as f:
        for i, l in enumerate(losses):
            f.write(json.dumps({"step": i + 1, "loss": l, "skipped": skip}) + "\n")
    json.dump({"steps": steps, "world_size": world, "zero_stage": int(args["--zero-stage"]), "dtype": dtype,
               "device": args["--device"], "tf32": "--tf32" in sys.argv, "tokens_per_s": 1e5, "tflops": 7.0,
               "mfu": 0.01, "peak_flops": 989e12, "train_loss": losses[-1], "val_loss": losses[-1] + 0.1,
               "skipped_steps": steps if skip else 0}, open(args["--metrics"], "w"))
PY

# gpu_probe: the JSON the real one prints, and its exit status (0 ok, 2 no device, 3 driver too old).
cat >"$T/fake/gpu_probe.py" <<'PY'
import json, os, sys
p = json.load(open(os.environ["FAKE_CONFIG"]))["probe"]
print(json.dumps({"driver_cuda_version": p["driver"], "runtime_cuda_version": 13000, "device_count": 1,
                  "error": None, "devices": [{"name": "NVIDIA H200", "compute_capability": "9.0",
                                              "memory_bytes": 150e9}],
                  "nccl_version": p["nccl"], "nccl_library": None}))
sys.exit(p.get("exit", 0))
PY

# mpirun: -np N COMMAND..., each copy with Open MPI's rank variables; the other options are accepted.
cat >"$T/fake/mpirun.py" <<'PY'
import os, subprocess, sys
a, n = sys.argv[1:], 1
while a and a[0].startswith("-"):
    opt = a.pop(0)
    if opt == "-np": n = int(a.pop(0))
    elif opt in ("--bind-to", "-x"): a.pop(0)
procs = [subprocess.Popen(a, env=dict(os.environ, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n),
                                      OMPI_COMM_WORLD_LOCAL_RANK=str(r))) for r in range(n)]
sys.exit(max(p.wait() for p in procs))
PY

cat >"$T/path/nvidia-smi" <<'SH'
#!/usr/bin/env bash
cuda=$(grep -o '"smi_cuda": "[0-9.]*"' "$FAKE_CONFIG" | grep -o '[0-9.]*"$' | tr -d '"')
case "$*" in
  *--query-gpu*) echo "NVIDIA H200, 580.95.05, 143771 MiB" ;;
  *) echo "| NVIDIA-SMI 580.95.05      Driver Version: 580.95.05      CUDA Version: $cuda |" ;;
esac
SH
chmod +x "$T/path/nvidia-smi"

# The bundle: bin/ with the fakes, a manifest, a corpus.
B="$T/bundle"
mkdir -p "$B/bin" "$B/lib" "$B/data"
for b in zero_tests zero_dist_tests; do
  printf '#!/usr/bin/env bash\nexec python3 %q/fake/gtest.py %s "$@"\n' "$T" "$b" >"$B/bin/$b"
done
for b in train_gpt gpu_probe mpirun; do
  printf '#!/usr/bin/env bash\nexec python3 %q/fake/%s.py "$@"\n' "$T" "$b" >"$B/bin/$b"
done
chmod +x "$B"/bin/*
python3 - "$B/data/corpus.txt" <<'PY'
import sys
text = "".join(chr(ord("a") + (i * 7) % 26) + (" " if i % 5 == 0 else "") for i in range(5000))
open(sys.argv[1], "w").write(text)
PY

# A scenario: the base configuration (nothing wrong) with some fields replaced.
base_config() {
  python3 - "$root" <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1] + "/scripts")
import gpu_check as g
unit = {}
# Enough tests for every group's minimum, and the op table's cuda rows.
for name, flt, minimum, _, _ in g.UNIT_GROUPS:
    suite = (flt or "CudaRuntime").split(".")[0]  # the group's first suite
    for i in range(max(minimum, 1)):
        unit[f"{suite}.Case{i}_cuda"] = "pass"
unit["TrainGptCli.CudaWithoutADevice"] = "pass"  # outside the filter
dist = {}
for name, _, flt, minimum, _, _ in g.DIST_GROUPS:
    for pattern in flt.split(":"):
        for i in range(minimum):
            dist[f"{pattern.split('.')[0]}.Case{i}"] = "pass"
print(json.dumps({"tests": {"zero_tests": unit, "zero_dist_tests": dist}, "smi_cuda": "13.0",
                  "probe": {"driver": 13000, "nccl": 22805, "exit": 0}, "train": "learn"}))
PY
}
manifest() {  # manifest GLIBC_NEEDED
  python3 - "$B/manifest.json" "$1" <<'PY'
import json, sys
json.dump({"commit": "fake", "cuda": True, "cuda_architectures": [90], "cpu_arch": "x86-64",
           "host_needs": {"glibc": sys.argv[2], "glibc_needed_by": "lib/libevent_core-2.1.so.7: arc4random",
                          "cuda_runtime": "13.0", "cuda_driver_min": "R580 or newer", "cpu_flags": [],
                          "nccl": {"soname": "libnccl.so.2", "built_against": "2.28.7", "symbols": []}},
           "corpus": "fake"}, open(sys.argv[1], "w"))
PY
}
base_config >"$T/base.json"

# check NAME EXPECTED_STATUS [KEY=VALUE (python expression over the config c) ...] [-- ENV=VALUE ...]
check() {
  local name="$1" want="$2"; shift 2
  local edits=() envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do edits+=("$1"); shift; done
  [ "${1:-}" = -- ] && { shift; envs=("$@"); }
  python3 - "$T/base.json" "$T/$name.json" "${edits[@]}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for e in sys.argv[3:]:
    exec(e)
json.dump(c, open(sys.argv[2], "w"))
PY
  local rc=0
  env PATH="$T/path:$PATH" FAKE_CONFIG="$T/$name.json" ZERO_GPU_CHECK_DEVICES="$T/dev/nvidia[0-9]*" \
    ZERO_DATA="$B/data/corpus.txt" "${envs[@]}" \
    "$root/scripts/gpu_check.sh" --prebuilt "$B" --out "$T/$name.out.json" >"$T/$name.log" 2>&1 || rc=$?
  [ -f "$T/$name.out.json" ] || { tail -n 20 "$T/$name.log" >&2; fail "$name: no JSON written"; }
  local got; got=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$T/$name.out.json")
  if [ "$got" != "$want" ]; then
    tail -n 30 "$T/$name.log" >&2
    fail "$name: status $got, expected $want"
  fi
  { [ "$want" = ok ] && [ $rc -eq 0 ]; } || { [ "$want" != ok ] && [ $rc -ne 0 ]; } ||
    fail "$name: exit status $rc with status $got"
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(r["reason"][:160])' "$T/$name.out.json" \
    >"$T/$name.reason"
  pass "$name -> $got ($(cat "$T/$name.reason"))"
}
# reason_has NAME TEXT: the verdict names its cause.
reason_has() {
  grep -qF -- "$2" "$T/$1.reason" || fail "$1: the reason does not mention '$2': $(cat "$T/$1.reason")"
}
missing_has() {
  python3 -c 'import json,sys; sys.exit(0 if sys.argv[2] in json.load(open(sys.argv[1]))["missing"] else 1)' \
    "$T/$1.out.json" "$2" || fail "$1: \"missing\" does not name $2"
}

# ---- the plan -----------------------------------------------------------------------------------------------
manifest 2.17
"$root/scripts/gpu_check.sh" --dry-run --prebuilt "$B" >"$T/plan.txt"
total=$(sed -n 's/^ *total of the limits: \([0-9]*\) s$/\1/p' "$T/plan.txt")
[ -n "$total" ] && [ "$total" -le 480 ] || { cat "$T/plan.txt" >&2; fail "the plan's limits sum to ${total:-?} s, over 480"; }
grep -q "train_fp16_zero2_1gpu" "$T/plan.txt" || fail "--dry-run does not list the steps"
pass "--dry-run: $(grep -c '^ *[0-9]' "$T/plan.txt") steps, limits summing to $total s"
# docs/gpu.md's table of the plan is the plan: the same steps, order and limits.
python3 - "$root/docs/gpu.md" "$T/plan.txt" <<'PY' || fail "docs/gpu.md's plan table differs from --dry-run"
import re, sys
doc = open(sys.argv[1]).read()
section = doc.split("### The plan", 1)[1].split("\n#", 1)[0]
documented = []
for row in re.findall(r"^\| (`.*)$", section, re.M):
    cells = [c.strip() for c in row.split("|")]
    names = re.findall(r"`([a-z0-9_]+)`", cells[0])
    limits = [int(x) for x in re.findall(r"\d+", cells[-2] if cells[-1] == "" else cells[-1])]
    documented += list(zip(names, limits))
planned = [(m.group(1), int(m.group(2))) for m in
           re.finditer(r"^\s+\d+\s+(\S+)\s+(\d+)\s", open(sys.argv[2]).read(), re.M)]
if documented != planned:
    print("docs:", documented, "\nplan:", planned, file=sys.stderr)
    sys.exit(1)
PY
pass "docs/gpu.md's plan table matches --dry-run"

# ---- the verdicts -------------------------------------------------------------------------------------------
check nothing_wrong ok
python3 - "$T/nothing_wrong.out.json" <<'PY' || fail "nothing_wrong: the JSON lacks a learning summary"
import json, sys
r = json.load(open(sys.argv[1]))
s = r["steps"]["train_fp16_zero2_1gpu"]
assert s["final_loss"] < s["first_loss"] - 0.5 and "summary" in r and r["plan"], s
PY
check no_nccl host_incompatible 'c["probe"]["nccl"] = 0'
missing_has no_nccl nccl
check old_driver host_incompatible 'c["smi_cuda"] = "12.4"'
missing_has old_driver driver; reason_has old_driver "CUDA 12.4"
check old_driver_probe host_incompatible 'c["smi_cuda"] = ""' 'c["probe"]["exit"] = 3' 'c["probe"]["driver"] = 12040'
missing_has old_driver_probe driver
manifest 99.0
check old_glibc host_incompatible
missing_has old_glibc glibc; reason_has old_glibc "needs 99.0"
manifest 2.17
check binary_does_not_load host_incompatible \
  'c["broken"] = {"train_gpt": [127, "train_gpt: error while loading shared libraries: libcublas.so.13: cannot open shared object file: No such file or directory"]}'
missing_has binary_does_not_load libcublas.so.13; reason_has binary_does_not_load "cannot open shared object file"
check binary_crashes_at_start failed 'c["broken"] = {"zero_dist_tests": [132, "Illegal instruction (core dumped)"]}'
reason_has binary_crashes_at_start "Illegal instruction"
check fp16_skips_every_step not_learning 'c["train"] = "skip_all"'
reason_has fp16_skips_every_step "200 of 200 steps skipped"
check loss_does_not_fall not_learning 'c["train"] = "flat"'
reason_has loss_does_not_fall "not 0.5 below"
check too_few_gpu_tests too_few_tests \
  'c["tests"]["zero_tests"] = {k: v for k, v in c["tests"]["zero_tests"].items() if not k.startswith("CudaGemm")}'
reason_has too_few_gpu_tests "unit_gemm: the filter lists"
check budget_cut budget_exhausted 'c["test_seconds"] = 1' -- ZERO_GPU_CHECK_BUDGET_S=12
reason_has budget_cut "budget was used up"
check gpu_test_skipped tests_skipped 'c["tests"]["zero_tests"]["CudaGpt.Case0_cuda"] = "skip"'
check gpu_test_fails failed 'c["tests"]["zero_tests"]["CudaKernels.Case3_cuda"] = "fail"'
reason_has gpu_test_fails "CudaKernels.Case3_cuda"
check no_gpu no_gpu -- ZERO_GPU_CHECK_DEVICES="$T/dev/none[0-9]*"
echo "test_gpu_check: every cause gave its own status"
