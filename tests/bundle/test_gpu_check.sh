#!/usr/bin/env bash
# scripts/gpu_check.sh's verdicts, without a GPU: a fake bundle (fake zero_tests, zero_dist_tests,
# train_gpt, gpu_probe and mpirun, a fake nvidia-smi and device node) is set up for one cause at a time,
# and the check must report that cause's status, never "ok"; with nothing wrong it must report "ok"
# (so the fakes are good enough to pass). Also: the timing model's expected total fits the budget and
# --dry-run prints the plan; without NCCL the unit steps still run; the evidence tar holds every step's
# log and report, and --steps re-runs only what is named; a model of byte frequencies alone does not
# count as learning. Needs python3 only; takes a few seconds.
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
# from the scenario, set against the corpus's own statistics: "learn" (ln V down to below the bigram
# entropy), "flat" (stays at ln V), "skip_all" (fp16 overflow on every step: nothing is updated) or
# "freq_only" (a model of byte frequencies alone, trained by Adam from uniform: it falls from ln V to the
# unigram entropy). The comparison runs (--dropout 0) log the same curve on every device, unless
# "cmp_diverge" shifts the cuda ones from step 11.
cat >"$T/fake/train_gpt.py" <<'PY'
import json, math, os, random, sys
from collections import Counter
cfg = json.load(open(os.environ["FAKE_CONFIG"]))
if "train_gpt" in cfg.get("broken", {}):
    rc, text = cfg["broken"]["train_gpt"]
    print(text, file=sys.stderr)
    sys.exit(rc)
if "--help" in sys.argv:
    print("train_gpt: --device --dtype --zero-stage --steps --tf32 --metrics --log-file")
    sys.exit(0)
args, a = {}, sys.argv[1:]
while a:
    k = a.pop(0)
    args[k] = a.pop(0) if a and not a[0].startswith("--") else True
steps, dtype = int(args["--steps"]), {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}[args.get("--dtype", "fp32")]
rank, world = int(os.environ.get("OMPI_COMM_WORLD_RANK", 0)), int(os.environ.get("OMPI_COMM_WORLD_SIZE", 1))
data = open(args["--data"], "rb").read()
uni = Counter(data)
V, n = len(uni), len(data)
mode = cfg.get("train", "learn")
skip = mode == "skip_all" and dtype == "f16"
if skip or mode == "flat":
    losses = [math.log(V)] * steps
elif mode == "freq_only":
    keys = sorted(uni)
    w, m, v, rng, losses = [0.0] * V, [0.0] * V, [0.0] * V, random.Random(0), []
    for s in range(1, steps + 1):
        e = [math.exp(x - max(w)) for x in w]
        p = [x / sum(e) for x in e]
        i = rng.randrange(n - 256)
        cnt = Counter(data[i:i + 256])
        losses.append(-sum(cnt[b] * math.log(p[j]) for j, b in enumerate(keys)) / 256)
        for j, b in enumerate(keys):
            g = p[j] - cnt[b] / 256
            m[j], v[j] = 0.9 * m[j] + 0.1 * g, 0.99 * v[j] + 0.01 * g * g
            w[j] -= 0.03 * (m[j] / (1 - 0.9 ** s)) / (math.sqrt(v[j] / (1 - 0.99 ** s)) + 1e-8)
else:  # learning: from ln V down to 0.3, below the fake corpus's bigram entropy
    losses = [0.3 + (math.log(V) - 0.3) * math.exp(-i / 25) for i in range(steps)]
if mode == "cmp_diverge" and args["--device"] == "cuda" and args.get("--dropout") == "0":
    losses = [l + (0.05 if i >= 10 else 0.0) for i, l in enumerate(losses)]
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
import json, os, subprocess, sys
a, n = sys.argv[1:], 1
while a and a[0].startswith("-"):
    opt = a.pop(0)
    if opt == "-np": n = int(a.pop(0))
    elif opt in ("--bind-to", "-x"): a.pop(0)
# "one_rank": the launcher starts only the first of the ranks asked for (each believing it is alone).
started = 1 if json.load(open(os.environ["FAKE_CONFIG"])).get("mpirun") == "one_rank" else n
procs = [subprocess.Popen(a, env=dict(os.environ, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(started),
                                      OMPI_COMM_WORLD_LOCAL_RANK=str(r))) for r in range(started)]
sys.exit(max(p.wait() for p in procs))
PY

cat >"$T/path/nvidia-smi" <<'SH'
#!/usr/bin/env bash
cuda=$(grep -o '"smi_cuda": "[0-9.]*"' "$FAKE_CONFIG" | grep -o '[0-9.]*"$' | tr -d '"')
case "$*" in
  *--query-gpu*) mode=$(grep -o '"compute_mode": "[A-Za-z_]*"' "$FAKE_CONFIG" | grep -o '[A-Za-z_]*"$' | tr -d '"')
                 echo "NVIDIA H200, 580.95.05, 143771 MiB, ${mode:-Default}" ;;
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
# The corpus: 27 symbols of skewed frequencies (geometric, ratio 0.7), each written twice, so a byte
# says something about the next: unigram entropy 2.0 nats, well below ln 27 = 3.3, bigram entropy lower.
python3 - "$B/data/corpus.txt" <<'PY'
import random, sys
rng, symbols = random.Random(7), "etaoinshrdlucmfwypvbgkjqxz "
text = []
for _ in range(6000):
    k = 0
    while k < 26 and rng.random() < 0.7:
        k += 1
    text.append(symbols[k] * 2)
open(sys.argv[1], "w").write("".join(text))
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
    "$root/scripts/gpu_check.sh" --prebuilt "$B" --out "$T/$name.out.json" --evidence "$T/$name.tar.gz" \
    ${CHECK_ARGS:+$CHECK_ARGS} >"$T/$name.log" 2>&1 || rc=$?
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
# The timing model's expected total leaves a minute of the 540 s budget for the script itself, and every
# limit is at least 1.5 x its step's expected time.
expected=$(sed -n 's/^ *total of the limits: [0-9]* s; expected in all: \([0-9]*\) s$/\1/p' "$T/plan.txt")
[ -n "$expected" ] && [ "$expected" -le 480 ] ||
  { cat "$T/plan.txt" >&2; fail "the timing model expects ${expected:-?} s, over 480 of the 540 s budget"; }
python3 - "$T/plan.txt" <<'PY' || fail "a limit is below 1.5 x its expected time"
import re, sys
for m in re.finditer(r"^\s+\d+\s+(\S+)\s+(\d+)\s+(\d+)\s", open(sys.argv[1]).read(), re.M):
    if int(m.group(2)) < 1.5 * int(m.group(3)):
        sys.exit(f"{m.group(1)}: limit {m.group(2)} s, expected {m.group(3)} s")
PY
grep -q "train_fp16_zero2_1gpu" "$T/plan.txt" || fail "--dry-run does not list the steps"
pass "--dry-run: $(grep -c '^ *[0-9]' "$T/plan.txt") steps, expected to take $expected s of the 540 s budget"
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
# Without NCCL the binaries that load it do not start; the unit tests still run, all of them.
nccl_gone='train_gpt: error while loading shared libraries: libnccl.so.2: cannot open shared object file: No such file or directory'
check no_nccl host_incompatible 'c["probe"]["nccl"] = 0' \
  "c['broken'] = {'zero_dist_tests': [127, '${nccl_gone/train_gpt/zero_dist_tests}'], 'train_gpt': [127, '$nccl_gone']}"
missing_has no_nccl nccl
step_status() {  # step_status NAME STEP: that step's status in NAME's JSON
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["steps"].get(sys.argv[2], {}).get("status"))' \
    "$T/$1.out.json" "$2"
}
for s in unit_core unit_gemm unit_ops unit_gpt unit_kernels; do
  [ "$(step_status no_nccl $s)" = ok ] || fail "no_nccl: $s is $(step_status no_nccl $s), not ok: NCCL gated it"
done
for s in dist_nccl_np1 train_fp16_zero2_1gpu cmp_nccl_zero3_np1; do
  [ "$(step_status no_nccl $s)" = host_incompatible ] || fail "no_nccl: $s is $(step_status no_nccl $s)"
done
pass "no_nccl: the 5 unit steps ran and passed; the steps of zero_dist_tests and train_gpt read host_incompatible"
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
reason_has loss_does_not_fall "not below"
check too_few_gpu_tests too_few_tests \
  'c["tests"]["zero_tests"] = {k: v for k, v in c["tests"]["zero_tests"].items() if not k.startswith("CudaGemm")}'
reason_has too_few_gpu_tests "unit_gemm: the filter lists"
check budget_cut budget_exhausted 'c["test_seconds"] = 1' -- ZERO_GPU_CHECK_BUDGET_S=12
reason_has budget_cut "budget was used up"
check gpu_test_skipped tests_skipped 'c["tests"]["zero_tests"]["CudaGpt.Case0_cuda"] = "skip"'
check gpu_test_fails failed 'c["tests"]["zero_tests"]["CudaKernels.Case3_cuda"] = "fail"'
reason_has gpu_test_fails "CudaKernels.Case3_cuda"
check no_gpu no_gpu -- ZERO_GPU_CHECK_DEVICES="$T/dev/none[0-9]*"

# "ok" means it learned: a model of byte frequencies alone falls from ln V to the corpus's unigram entropy,
# which the former bar (0.5 below ln V and below step 1) let pass; it must not pass now.
check freq_only not_learning 'c["train"] = "freq_only"'
reason_has freq_only "unigram entropy"
python3 - "$T/freq_only.out.json" <<'PY' || fail "freq_only: the curve would not have passed the former bar (the test shows nothing)"
import json, math, sys
s = json.load(open(sys.argv[1]))["steps"]["train_fp16_zero2_1gpu"]
ln_v = math.log(27)
sys.exit(0 if s["final_loss"] < ln_v - 0.5 and s["final_loss"] < s["first_loss"] - 0.5 else 1)
PY
# The 2-rank steps check that two ranks ran.
check one_rank_ran failed 'c["mpirun"] = "one_rank"'
reason_has one_rank_ran "asked for 2 rank(s), the reports show 1"
[ "$(step_status one_rank_ran train_fp16_zero2_2rank_host_staged)" = failed ] || fail "one_rank_ran: the 2-rank training passed"
check exclusive_gpu host_incompatible 'c["compute_mode"] = "Exclusive_Process"'
reason_has exclusive_gpu "compute mode is Exclusive_Process"
[ "$(step_status exclusive_gpu unit_core)" = ok ] || fail "exclusive_gpu: unit_core did not run"
# CUDA against the CPU: losses apart by more than the bound fail the comparison steps.
check cmp_diverge failed 'c["train"] = "cmp_diverge"'
reason_has cmp_diverge "cmp_nccl_zero2_np1: from step 11 the loss leaves"

# ---- the evidence and --steps ------------------------------------------------------------------------------
# gpu_test_fails above left its tar: every step's log and gtest report, the JSON, the loss logs.
tar -tzf "$T/gpu_test_fails.tar.gz" >"$T/members.txt" || fail "gpu_test_fails: no readable evidence tar"
for f in gpu_check/gpu_test_fails.out.json gpu_check/unit_kernels.log gpu_check/unit_kernels.0.json \
         gpu_check/train_fp16_zero2_1gpu.steps.jsonl gpu_check/dist_staged_np2.1.json gpu_check/bench_fp32.metrics.json; do
  grep -qx "$f" "$T/members.txt" || fail "the evidence tar lacks $f"
done
tar -xzOf "$T/gpu_test_fails.tar.gz" gpu_check/unit_kernels.0.json | grep -q '"failures"' ||
  fail "the tar's unit_kernels report does not show the failure"
size=$(stat -c %s "$T/gpu_test_fails.tar.gz")
[ "$size" -lt $((16 << 20)) ] || fail "the evidence tar is $size bytes"
pass "evidence: $(wc -l <"$T/members.txt") files in $size bytes, the failing test's report among them"
# Re-run only the failed step from the same bundle: still failing, then fixed.
CHECK_ARGS="--steps unit_kernels" check rerun_still_fails failed 'c["tests"]["zero_tests"]["CudaKernels.Case3_cuda"] = "fail"'
CHECK_ARGS="--steps unit_kernels" check rerun_fixed ok
python3 - "$T/rerun_fixed.out.json" <<'PY' || fail "--steps unit_kernels ran other steps"
import json, sys
r = json.load(open(sys.argv[1]))
sys.exit(0 if list(r["steps"]) == ["machine", "host", "unit_kernels"] and r["steps_requested"] == ["unit_kernels"] else 1)
PY
tar -tzf "$T/rerun_fixed.tar.gz" | grep -qx gpu_check/unit_kernels.log || fail "rerun_fixed: no unit_kernels log in its tar"
pass "--steps unit_kernels: machine, host and unit_kernels alone, failing then passing"
echo "test_gpu_check: every cause gave its own status"
