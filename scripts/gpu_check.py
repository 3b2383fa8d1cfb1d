#!/usr/bin/env python3
"""The GPU check (scripts/gpu_check.sh runs this): one command, on a machine with one NVIDIA GPU, that
checks the host first and then runs every GPU test, a training run that must learn, ZeRO-2/3 runs on the
GPU against the same runs on the CPU, the distributed tests and the benchmarks, in that order, writing one
JSON file and a tar of every step's logs and reports after every step.

  scripts/gpu_check.sh --prebuilt DIR [--out FILE]   on the GPU machine, with a bundle (gpu_bundle.sh)
  scripts/gpu_check.sh [--out FILE]                  building here (needs every dependency; slow)
  scripts/gpu_check.sh --dry-run [--prebuilt DIR]    print the plan (steps, order, limits) and exit
  scripts/gpu_check.sh --prebuilt DIR --steps A,B    run only steps A and B (after machine and host)
  scripts/gpu_check.sh --judge-log STEPS.jsonl --data CORPUS   the learning criterion alone
  scripts/gpu_check.sh --bundle DIR                  make a bundle (scripts/gpu_bundle.sh DIR)

The JSON's "status" is the first of these that applies (every step has its own status from the same
list, and "reason" names each step that is not "ok"):
  no_gpu             no usable GPU (nvidia-smi, /dev/nvidia*, the probe): stopped within seconds;
  host_incompatible  the host lacks what the bundle needs; "missing" names the pieces. A driver for its
                     CUDA runtime, glibc, libstdc++, the CPU level or the GPU architecture stop the run
                     before any test; NCCL (or another library one binary needs) stops only the steps
                     of the binaries that load it, the others run;
  failed             a test failed, a step crashed or timed out, a binary did not start;
  not_learning       a training run skipped 10% of its steps or more, or its final loss is not below the
                     corpus's unigram entropy by half its gap to the bigram entropy, and 0.5 below its
                     first step's loss (a run on the wrong device, dtype, stage or world size: "failed");
  too_few_tests      a step's test filter lists fewer tests than its minimum (a renamed suite);
  budget_exhausted   a step did not run, or was cut short, because the time budget was spent;
  tests_skipped      everything passed but a GPU test skipped itself (it tested nothing);
  ok                 every step ran and passed.
The exit status is 0 for "ok" alone. The file is rewritten after every step ("status": "running"
until the end), so a run stopped from outside still shows what passed.

Environment: ZERO_GPU_CHECK_BUDGET_S (default 540, inside a 600 s command: the timing model below
expects about 307 s with a bundle, and the budget cuts the last steps' limits when earlier ones overrun);
OUT (the JSON and the evidence tar go there);
ZERO_DATA (the corpus); ZERO_GPU_BUILD, CUDA_ARCHS (building here); ZERO_GPU_CHECK_NO_GPU=1 runs
without looking for a GPU, to test this script on a machine without one (the status is never "ok");
ZERO_GPU_CHECK_DEVICES (default /dev/nvidia[0-9]*: where the device nodes are).
"""
import glob
import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)

# ---- the plan ---------------------------------------------------------------------------------------------
# Every CUDA, NCCL and ZeRO-on-device test. Left out: TrainGptCli.* (CudaWithoutADevice is the opposite
# case: it skips when a GPU is there), the op-table rows that skip on every device (dropout's forward has
# no reference: its own tests check it) and CudaKernelMath.* (host stand-ins of the kernels' arithmetic:
# CPU only, CI runs them). tests/bundle/check_bundle.sh checks that no test named for a GPU falls outside
# the filter and that no *_cuda test in it has a CPU twin that skips.
UNIT_FILTER = ("*Cuda*:*cuda*:*Nccl*:*Gpu*:Backend.*"
               "-TrainGptCli.*:Ops/OpTable.ForwardMatchesReference/dropout_training_cuda:CudaKernelMath.*")
DIST_FILTER = "*Cuda*:*cuda*:*Nccl*:*Gpu*"

# ---- the timing model ----------------------------------------------------------------------------------------
# Each step's expected time on the GPU machine (an H200, a bundle prebuilt), from stated assumptions, and its
# limit: 1.5 x expected + 10 s, rounded up to 5 s (a step at its limit is far off the model: "failed").
#   - a process start costs START_S (CUDA context, cuBLAS handle, module loading); NCCL's first
#     communicator NCCL_INIT_S more;
#   - training the 6-layer, 384-channel model (10.77 M parameters, about 71 MFLOP per token for forward
#     and backward) runs at TOKENS_PER_S[precision] on one process: 1% of the H200's dense 16-bit peak
#     (989 TFLOP/s) in fp16/bf16, 5% of its fp32 peak (67 TFLOP/s) in fp32; unfused kernels make this
#     pessimistic on purpose. Two ranks sharing the GPU through host staging: TWO_RANK_TOKENS_PER_S together;
#   - the unit groups: the seconds per listed test below, plus a start (the kernel tests' 2^24-element
#     references in double on one host core dominate theirs);
#   - the comparison runs (a 2-layer, 128-channel model) are start-bound.
# The budget (540 s) cuts the limits of the last steps when the earlier ones overrun; the steps run in the
# order of the plan, most informative first: the machine, the unit tests, the 200-step training run, the
# paths the CPU tests cannot reach (ZeRO-2/3 over NCCL, stage 3 on 2 ranks) against the CPU, the distributed tests,
# the 2-rank training run, and the benchmarks (figures only) last.
START_S = 3
NCCL_INIT_S = 3
TOKENS_PER_STEP = 64 * 256
TOKENS_PER_S = {"fp16": 100_000, "bf16": 100_000, "tf32": 80_000, "fp32": 50_000}
TWO_RANK_TOKENS_PER_S = 30_000


EXPECTED = {}  # step -> expected seconds (the model above)


def planned(name, expected):
    """Records a step's expected seconds; returns its limit: 1.5 x expected + 10 s, rounded up to 5 s."""
    EXPECTED[name] = round(expected, 1)
    return int(math.ceil((1.5 * expected + 10) / 5) * 5)


def train_expected(ranks, precision, steps):
    rate = TWO_RANK_TOKENS_PER_S if ranks > 1 else TOKENS_PER_S[precision]
    return START_S + steps * TOKENS_PER_STEP / rate


# Unit tests in separate processes, so that a sticky device fault in one suite (an illegal address
# poisons the CUDA context for the rest of the process) cannot fail the others. min: the tests the
# filter lists today (zero_tests --gtest_list_tests); fewer means a suite was renamed or lost, and the
# step reads "too_few_tests". The first group is UNIT_FILTER less the others, so every test the filter
# selects runs in exactly one group (a new suite lands there until it gets a group of its own).
# Seconds per test: 0.2 (runtime checks), 2.0 (kernels: 2^24-element double references), 0.6 (GEMMs up
# to 4096^2 against double references), 0.08 (op-table rows), 1.5 (a GPT step on both devices).
UNIT_GROUPS = [
    # name, filter (None: the rest; else patterns within UNIT_FILTER), minimum listed tests, limit (s), what
    ("unit_core", None, 13, planned("unit_core", START_S + 13 * 0.2),
     "runtime, allocator, streams, device checks, GEMM plans, backends (the rest)"),
    ("unit_gemm", "CudaGemm.*:CudaTensorCores.*:Devices/TensorCores.*/cuda", 10, planned("unit_gemm", START_S + 10 * 0.6),
     "cuBLAS GEMMs, TF32, 16-bit tensor-core GEMMs against double references"),
    ("unit_ops", "Ops/OpTable.*_cuda:CudaOps.*", 126, planned("unit_ops", START_S + 126 * 0.08),
     "every op's forward and gradient on cuda against the CPU"),
    ("unit_gpt", "CudaGpt.*", 2, planned("unit_gpt", START_S + 2 * 1.5), "a GPT forward/backward, clipping and AdamW on cuda against the CPU"),
    ("unit_kernels", "CudaKernels.*", 12, planned("unit_kernels", START_S + 12 * 2.0),
     "every kernel against a double-precision reference (error / bound ratios in the report)"),
]

# Distributed tests (zero_dist_tests). NCCL refuses two ranks on one GPU (ncclCommInitRank: "Duplicate
# GPU detected"; NcclCommunicator says so first), so 2 ranks share the GPU through the host-staged
# communicator only, and NCCL proper runs on one rank.
DIST_GROUPS = [
    # name, ranks, filter, minimum, limit (s), what
    ("dist_nccl_np1", 1, "CudaNccl.*", 3, planned("dist_nccl_np1", START_S + NCCL_INIT_S + 4),
     "NCCL on one rank, the grouped uneven paths forced; synchronize waits for NCCL's stream"),
    ("dist_staged_np1", 1, "CudaHostStaged.*:ZeroCuda.*", 2, planned("dist_staged_np1", START_S + 5),
     "host-staged collectives, ZeRO stages on cuda"),
    ("dist_staged_np2", 2, "CudaHostStaged.*:ZeroCuda.*", 2, planned("dist_staged_np2", START_S + 8),
     "the same on 2 ranks sharing the GPU"),
]

# nanoGPT's shakespeare_char config (config/train_shakespeare_char.py): 6 layers, 6 heads, 384 channels,
# block 256, batch 64.
GPT_FLAGS = ["--n-layer", "6", "--n-head", "6", "--n-embd", "384", "--block", "256", "--batch", "64",
             "--dropout", "0.2", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "100", "--beta2", "0.99",
             "--eval-every", "0", "--eval-iters", "20", "--sample", "0", "--log-every", "50"]
TRAIN_RUNS = [
    # name, ranks, dtype flag, stage, tf32, steps, limit (s), what
    ("train_fp16_zero2_1gpu", 1, "fp16", 2, False, 200, planned("train_fp16_zero2_1gpu", train_expected(1, "fp16", 200)),
     "200 steps fp16 ZeRO-2: must learn"),
]
TRAIN_2RANK = ("train_fp16_zero2_2rank_host_staged", 2, "fp16", 2, False, 100,
               planned("train_fp16_zero2_2rank_host_staged", train_expected(2, "fp16", 100)),
               "100 steps, 2 ranks on one GPU through the host-staged communicator: must learn")
BENCH_RUNS = [
    ("bench_bf16", 1, "bf16", 0, False, 100, planned("bench_bf16", train_expected(1, "bf16", 100)),
     "tokens/s, TFLOP/s, MFU; must learn"),
    ("bench_tf32", 1, "fp32", 0, True, 100, planned("bench_tf32", train_expected(1, "tf32", 100)),
     "the same, fp32 with TF32 GEMMs"),
    ("bench_fp32", 1, "fp32", 0, False, 100, planned("bench_fp32", train_expected(1, "fp32", 100)),
     "the same, plain fp32 GEMMs"),
]

# The paths the CPU tests cannot reach, against the same run on the CPU: ZeRO-2 and ZeRO-3 over NCCL (one rank:
# NCCL cannot put two ranks on one GPU) and ZeRO-3 on 2 ranks through the host-staged communicator (its
# uneven all-gathers, freed and refilled device storage). A small model in fp32 without TF32 and without
# dropout, so that both devices compute the same function of the same batches; the CPU run (one process,
# the whole batch: ZeRO's equivalence makes N ranks x batch/N the same run) is the reference.
CMP_FLAGS = ["--n-layer", "2", "--n-head", "4", "--n-embd", "128", "--block", "64", "--batch", "16",
             "--dropout", "0", "--lr", "1e-3", "--warmup", "0", "--eval-every", "0", "--eval-iters", "2",
             "--sample", "0", "--log-every", "1", "--dtype", "fp32", "--seed", "1234"]
CMP_STEPS = 30
# Losses within CMP_BOUND_NATS of the CPU's at every step. fp32 on both devices: the first step's losses
# differ by summation order alone; the difference may grow over 30 AdamW steps at lr 1e-3 but stays far
# below 0.02 nats, while the curve falls by about 1 nat, so a slice lost or counted twice in a
# reduce-scatter or an all-gather, or a stale gathered parameter, shows at once. On an H200 every step's
# loss was within 5e-7 of the CPU's ("max_abs_diff", rounded to 6 decimals, read 0.0; docs/gpu.md).
CMP_BOUND_NATS = 0.02
CMP_REFERENCE = ("cmp_cpu_reference", 1, "cpu", None, 0, planned("cmp_cpu_reference", START_S + 6),
                 "the comparison model on the CPU: the reference of the three steps below")
CMP_RUNS = [
    # name, ranks, device, comm, stage, limit (s), what
    ("cmp_nccl_zero2_np1", 1, "cuda", "nccl", 2, planned("cmp_nccl_zero2_np1", START_S + NCCL_INIT_S + 3),
     "ZeRO-2 over NCCL, losses against the CPU"),
    ("cmp_nccl_zero3_np1", 1, "cuda", "nccl", 3, planned("cmp_nccl_zero3_np1", START_S + NCCL_INIT_S + 3),
     "ZeRO-3 over NCCL (per-module gathers, freed and refilled storage), against the CPU"),
    ("cmp_staged_zero3_np2", 2, "cuda", "host-staged", 3, planned("cmp_staged_zero3_np2", START_S + 6),
     "ZeRO-3 on 2 ranks sharing the GPU (uneven all-gathers), against the CPU"),
]
MACHINE_LIMIT = 25  # nvidia-smi twice (at most 8 + 4 s) and the probe (at most 13 s)
HOST_LIMIT = 20     # manifest against the host, ldd (at most 4 s), each binary started once (at most 5 s each)
BUILD_LIMIT = 300
# Expected seconds of the fixed steps (the machine: nvidia-smi and one context; the host: ldd and 3 starts).
FIXED_EXPECTED = {"machine": 5, "host": 4, "build": 240}

# The binaries that load libnccl.so.2 (zero_tests does not: tests/bundle/check_bundle.sh checks it on a
# bundle with CUDA). Without a usable NCCL their steps read "host_incompatible" and the others still run.
NCCL_BINARIES = ("zero_dist_tests", "train_gpt")

# Learning: "final" is the mean train loss of the last 10 logged steps. It must be below the corpus's
# own unigram entropy H1 (what a model of byte frequencies alone reaches) by half the gap between H1 and
# the bigram conditional entropy H2 (what a model of the previous byte reaches), both computed from the
# corpus: a frequency-only model sits at H1 and fails; for Tiny Shakespeare H1 = 3.313 and H2 = 2.453 nats,
# so the margin is 0.430 and the bar 2.883. The noise of a 10-step mean of a frequency-only model is far
# below that margin: a byte's loss under it has a standard deviation of 1.07 nats, so 10 steps of 16,384
# tokens have a standard error of 0.003 nats (0.011 at 1,024 tokens a step), even counted as independent.
MAX_SKIPPED_FRACTION = 0.10
MIN_DROP_NATS = 0.5  # below step 1's loss by at least this much
LEARNING_MARGIN_OF_GAP = 0.5

EVIDENCE_FILE_BYTES = 1 << 20  # per file in the evidence tar (logs compress ~10x: the tar stays a few MiB)

DTYPE_NAMES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}  # train_gpt's flag -> the metrics' name

STATUS_ORDER = ["no_gpu", "host_incompatible", "failed", "not_learning", "too_few_tests", "budget_exhausted",
                "tests_skipped", "ok"]


def plan_steps(prebuilt):
    """The ordered steps: (name, limit in seconds, what). Fast and informative first."""
    steps = [("machine", MACHINE_LIMIT, "nvidia-smi (compute mode too), /dev/nvidia*, gpu_probe: device, driver, CUDA, NCCL")]
    if not prebuilt:
        steps.append(("build", BUILD_LIMIT, "Release with CUDA for this GPU"))
    steps.append(("host", HOST_LIMIT, "the bundle's needs against the host (CPU, glibc, libraries), each "
                                      "binary starts, test counts from the binaries' own listings"))
    steps += [(g[0], g[3], g[4]) for g in UNIT_GROUPS]
    steps += [(r[0], r[6], r[7]) for r in TRAIN_RUNS]
    steps.append((CMP_REFERENCE[0], CMP_REFERENCE[5], CMP_REFERENCE[6]))
    steps += [(c[0], c[5], c[6]) for c in CMP_RUNS]
    steps += [(g[0], g[4], g[5]) for g in DIST_GROUPS]
    steps.append((TRAIN_2RANK[0], TRAIN_2RANK[6], TRAIN_2RANK[7]))
    steps += [(r[0], r[6], r[7]) for r in BENCH_RUNS]
    return steps


def expected_seconds(name):
    """The timing model's expected seconds of a step (see above)."""
    return FIXED_EXPECTED.get(name, EXPECTED.get(name))


def print_plan(prebuilt, budget, only=None):
    steps = [s for s in plan_steps(prebuilt) if only is None or s[0] in only or s[0] in ("machine", "host", "build")]
    total = sum(s[1] for s in steps)
    expected = sum(expected_seconds(s[0]) for s in steps)
    print(f"gpu_check plan ({'bundle ' + prebuilt if prebuilt else 'building here'}; budget {budget} s; "
          f"in this order):")
    print(f"  {'#':>2}  {'step':<36} {'limit':>5} {'expect':>6} {'by':>5}  what")
    at = 0
    for i, (name, limit, what) in enumerate(steps, 1):
        at += expected_seconds(name)
        print(f"  {i:>2}  {name:<36} {limit:>5} {expected_seconds(name):>6.0f} {at:>5.0f}  {what}")
    print(f"  total of the limits: {total} s; expected in all: {expected:.0f} s")
    print(f"  (the limits give each step 1.5 x its expected time + 10 s; when earlier steps overrun, the "
          f"{budget} s budget cuts the last ones: they read \"budget_exhausted\")")


# ---- gtest filters and listings ---------------------------------------------------------------------------

def _glob_match(pattern, name):
    return re.fullmatch(re.escape(pattern).replace(r"\*", ".*").replace(r"\?", "."), name) is not None


def filter_matches(gtest_filter, name):
    """GoogleTest's --gtest_filter: positive patterns, then '-' and negative ones, ':'-separated."""
    positive, _, negative = gtest_filter.partition("-")
    pos = [p for p in positive.split(":") if p] or ["*"]
    neg = [p for p in negative.split(":") if p]
    return any(_glob_match(p, name) for p in pos) and not any(_glob_match(p, name) for p in neg)


def parse_listing(text):
    """Test names from --gtest_list_tests output ("Suite." lines, then indented names)."""
    names, suite = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split()[0]
        elif suite:
            names.append(suite + line.split()[0])
    return names


def group_filter(flt):
    """A unit group's filter: its own patterns within UNIT_FILTER, or (None) UNIT_FILTER less the other
    groups' patterns."""
    positive, _, negative = UNIT_FILTER.partition("-")
    if flt is not None:
        return flt + "-" + negative
    others = ":".join(g[1] for g in UNIT_GROUPS if g[1] is not None)
    return positive + "-" + ":".join(p for p in (negative, others) if p)


# ---- the run ------------------------------------------------------------------------------------------------

LOADER_ERROR = re.compile(r"error while loading shared libraries|version `[^']+' not found|"
                          r"cannot open shared object file|no such file or directory.*ld-linux|"
                          r"symbol lookup error|undefined symbol", re.I)


def first_lines(text, n=3, width=300):
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    return " | ".join(lines[:n])[:width]


def error_lines(text, n=3, width=400):
    """The lines of a log that say what went wrong (else its last lines)."""
    lines = [l.strip() for l in text.strip().splitlines() if l.strip()]
    bad = [l for l in lines if re.search(r"error|fail|abort|what\(\)|not found|cannot|illegal|fault|killed",
                                         l, re.I) and not re.match(r"\[\s+(OK|RUN|PASSED)\s+\]", l)]
    return " | ".join((bad or lines)[-n:])[:width]


def loader_piece(text):
    """What a loader error says is missing: a library's soname, glibc or libstdc++."""
    m = re.search(r"loading shared libraries: ([^:\s]+)", text)
    if m:
        return "nccl" if "libnccl" in m.group(1) else os.path.basename(m.group(1))
    m = re.search(r"version `(GLIBC(XX)?_[^']+)' not found", text)
    if m:
        return "glibc" if m.group(1).startswith("GLIBC_") else "libstdc++"
    m = re.search(r"undefined symbol: (\S+)", text)
    return f"symbol {m.group(1)}" if m else "a library"


def version_tuple(v):
    return tuple(int(x) for x in re.findall(r"\d+", str(v))[:3])


class Check:
    def __init__(self, args):
        self.prebuilt = args.prebuilt
        self.out = args.out
        self.no_gpu_mode = os.environ.get("ZERO_GPU_CHECK_NO_GPU") == "1"
        self.budget = int(os.environ.get("ZERO_GPU_CHECK_BUDGET_S", "540"))
        self.t0 = time.monotonic()
        self.deadline = self.t0 + self.budget
        self.build = os.environ.get("ZERO_GPU_BUILD") or os.path.join(ROOT, "build-gpu")
        self.bin = os.path.join(self.prebuilt, "bin") if self.prebuilt else os.path.join(self.build, "bin")
        self.work = args.work
        self.evidence = args.evidence
        self.only = args.steps  # None: every step; else the names --steps gave (machine and host always run)
        self.unusable = {}   # binary -> why its steps cannot run here (it does not load, no NCCL, ...)
        self.steps = {}      # name -> result, in the order run
        self.machine = {}
        self.host = {}
        self.manifest = {}
        self.listings = {}   # binary -> [test names]
        self.env = dict(os.environ)
        self.mpirun = None
        self.child = None  # the command running now (its own process group)

    # ---- output ----
    def write(self, final=None):
        """Writes the JSON file (atomically): the steps so far and the status they give."""
        statuses = {k: v["status"] for k, v in self.steps.items()}
        if final:
            status, reason = final
        else:
            bad = {k: v for k, v in self.steps.items() if v["status"] != "ok"}
            status = min((v["status"] for v in bad.values()), key=STATUS_ORDER.index, default="ok")
            worst_first = sorted(bad.items(), key=lambda kv: STATUS_ORDER.index(kv[1]["status"]))  # stable
            reason = "; ".join(f"{k}: {v.get('reason') or v['status']}" for k, v in worst_first) or \
                "every step ran and passed"
            if not self.steps:
                status, reason = "failed", "no step ran"
            if status == "ok" and self.no_gpu_mode:
                status, reason = "failed", "ZERO_GPU_CHECK_NO_GPU=1: no GPU was used"
        result = {"status": status, "reason": reason, "missing": self.host.get("missing", []),
                  "machine": self.machine, "host": self.host, "plan": [
                      {"step": n, "limit_s": l, "expected_s": expected_seconds(n), "what": w}
                      for n, l, w in plan_steps(self.prebuilt)],
                  "steps_requested": self.only, "evidence": self.evidence,
                  "steps": self.steps, "statuses": statuses, "summary": self.summary(),
                  "total_seconds": round(time.monotonic() - self.t0, 1), "budget_seconds": self.budget}
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, self.out)
        self.pack_evidence()
        return status, reason

    def pack_evidence(self):
        """The tar of every step's log, gtest JSON, metrics, per-step loss log and NCCL's debug output,
        with this JSON, rewritten after every step (a run stopped from outside still leaves one). Each file
        is cut to its first and last EVIDENCE_FILE_BYTES / 2; the corpus is left out."""
        import io
        import tarfile
        tmp = self.evidence + ".tmp"
        try:
            with tarfile.open(tmp, "w:gz") as tar:
                for path in [self.out] + sorted(glob.glob(os.path.join(self.work, "*"))):
                    if not os.path.isfile(path) or os.path.basename(path) in ("synthetic.txt", "gpu_probe"):
                        continue
                    with open(path, "rb") as f:
                        data = f.read()
                    if len(data) > EVIDENCE_FILE_BYTES:
                        half = EVIDENCE_FILE_BYTES // 2
                        data = data[:half] + b"\n[... cut by gpu_check: %d bytes ...]\n" % (len(data) - 2 * half) + \
                            data[-half:]
                    info = tarfile.TarInfo("gpu_check/" + os.path.basename(path))
                    info.size, info.mtime = len(data), int(time.time())
                    tar.addfile(info, io.BytesIO(data))
            os.replace(tmp, self.evidence)
        except OSError as e:
            print(f"gpu_check: could not write the evidence tar {self.evidence}: {e}", file=sys.stderr)

    def summary(self):
        out = {}
        for name, step in self.steps.items():
            m = step.get("metrics")
            if not isinstance(m, dict) or "tokens_per_s" not in m:
                continue
            precision = "tf32" if m.get("dtype") == "f32" and m.get("tf32") else m.get("dtype")
            out[name] = {k: m.get(k) for k in ("device", "world_size", "zero_stage", "tokens_per_s", "tflops",
                                                "mfu", "peak_flops", "train_loss", "val_loss", "skipped_steps")}
            out[name]["precision"] = precision
            out[name].update({k: step[k] for k in ("first_loss", "final_loss") if k in step})
        return out

    def record(self, name, status, seconds, **fields):
        self.steps[name] = {"status": status, "seconds": round(seconds, 1), "expected_s": expected_seconds(name),
                            **fields}
        reason = fields.get("reason", "")
        print(f"== {name}: {status} in {seconds:.0f}s{(' (' + reason + ')') if reason else ''}", flush=True)
        self.write(("running", f"{len(self.steps)} step(s) done, last: {name}"))

    def finish(self, final=None):
        status, reason = self.write(final)
        print(json.dumps({"status": status, "reason": reason, "statuses": {k: v["status"] for k, v in
                                                                            self.steps.items()},
                          "summary": self.summary()}, indent=1))
        print("gpu_check: wrote", self.out, "and", self.evidence, flush=True)
        sys.exit(0 if status == "ok" else 1)

    # ---- running commands ----
    def left(self):
        return self.deadline - time.monotonic()

    def limit(self, wanted):
        """The step's limit: its planned one, cut to what is left of the budget (5 s kept for the JSON)."""
        return int(min(wanted, self.left() - 5))

    def run(self, cmd, timeout, log, env=None):
        """Runs cmd (own process group) with a timeout; output to log. Returns (rc, seconds, timed_out)."""
        t = time.monotonic()
        with open(log, "w") as f:
            try:
                p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env or self.env,
                                     start_new_session=True, cwd=self.work)
            except OSError as e:  # not executable, not there, wrong format
                f.write(f"{cmd[0]}: {e}\n")
                return 126, time.monotonic() - t, False
            self.child = p
            try:
                rc = p.wait(timeout=max(timeout, 1))
                return rc, time.monotonic() - t, False
            except subprocess.TimeoutExpired:
                for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        break
                    try:
                        p.wait(timeout=grace)
                        break
                    except subprocess.TimeoutExpired:
                        continue
                return 124, time.monotonic() - t, True
            finally:
                self.child = None

    def read(self, path, tail=4000):
        try:
            with open(path, errors="replace") as f:
                return f.read()[-tail:]
        except OSError:
            return ""

    def budget_verdict(self, name, wanted):
        """None when the step can run, else records it as not run for want of time."""
        lim = self.limit(wanted)
        if lim >= 5:
            return lim
        self.record(name, "budget_exhausted", 0,
                    reason=f"not run: the {self.budget}s budget was used up (planned limit {wanted}s)")
        return None

    # ---- 1. the GPU ----
    def check_machine(self):
        t = time.monotonic()
        smi = {}
        if self.no_gpu_mode:
            self.machine = {"no_gpu_mode": "ZERO_GPU_CHECK_NO_GPU=1: no GPU looked for"}
            self.gpu_cc = str((self.manifest.get("cuda_architectures") or [90])[0])
            return self.record("machine", "ok", time.monotonic() - t, note="not looked for")
        if not shutil_which("nvidia-smi"):
            return self.stop_no_gpu(t, "nvidia-smi not found (no NVIDIA driver installed)")
        log = os.path.join(self.work, "smi.txt")
        rc, _, _ = self.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_mode",
                             "--format=csv,noheader"], 8, log)
        text = self.read(log)
        if rc != 0:
            return self.stop_no_gpu(t, f"nvidia-smi failed: {first_lines(text, 1)}")
        if not text.strip():
            return self.stop_no_gpu(t, "nvidia-smi listed no GPU")
        first = [x.strip() for x in text.strip().splitlines()[0].split(",")]
        smi = {"gpu": first[0], "driver_version": first[1] if len(first) > 1 else None,
               "gpu_memory": first[2] if len(first) > 2 else None,
               # Default: any number of processes may share the GPU; Exclusive_Process: one (the 2-rank
               # steps, which share it, cannot run); Prohibited: none.
               "compute_mode": first[3] if len(first) > 3 else None}
        self.run(["nvidia-smi"], 4, os.path.join(self.work, "smi_full.txt"))
        m = re.search(r"CUDA Version:\s*([0-9.]+)", self.read(os.path.join(self.work, "smi_full.txt"), 100000))
        smi["driver_cuda_version_nvidia_smi"] = m.group(1) if m else None
        self.machine.update(smi)
        pattern = os.environ.get("ZERO_GPU_CHECK_DEVICES", "/dev/nvidia[0-9]*")
        if not glob.glob(pattern):
            return self.stop_no_gpu(t, f"no device node {pattern}")
        # The driver against the CUDA runtime the bundle needs, from nvidia-smi, before anything loads it.
        needs = self.manifest.get("host_needs", {})
        runtime = needs.get("cuda_runtime")
        if runtime and smi["driver_cuda_version_nvidia_smi"] and \
                version_tuple(smi["driver_cuda_version_nvidia_smi"])[:1] < version_tuple(runtime)[:1]:
            return self.stop_incompatible(t, "machine", ["driver"],
                                          f"the driver ({smi['driver_version']}) supports CUDA "
                                          f"{smi['driver_cuda_version_nvidia_smi']}; the bundle's CUDA {runtime} "
                                          f"runtime needs a driver for CUDA {version_tuple(runtime)[0]}.x "
                                          f"({needs.get('cuda_driver_min') or 'newer'})")
        probe = self.probe_path()
        if probe is None:
            return self.record("machine", "failed", time.monotonic() - t,
                               reason="could not build tools/gpu_probe.cpp: " +
                                      error_lines(self.read(os.path.join(self.work, "probe_build.log"))))
        log = os.path.join(self.work, "probe.txt")
        rc, _, _ = self.run([probe], 13, log)
        text = self.read(log, 100000)
        try:
            info = json.loads(next(l for l in text.splitlines() if l.startswith("{")))
        except (StopIteration, ValueError):
            info = {"error": "the probe printed no JSON: " + error_lines(text)}
        self.machine["probe"] = info

        def ver(v, nccl=False):
            if not isinstance(v, int) or v <= 0:
                return None
            return f"{v // 10000}.{v // 100 % 100}.{v % 100}" if nccl else f"{v // 1000}.{v % 1000 // 10}"
        self.machine["driver_cuda_version"] = ver(info.get("driver_cuda_version"))
        self.machine["cuda_runtime_version"] = ver(info.get("runtime_cuda_version"))
        self.machine["nccl_version"] = ver(info.get("nccl_version"), nccl=True)
        self.machine["nccl_library"] = info.get("nccl_library")
        devices = info.get("devices") or []
        self.gpu_cc = devices[0].get("compute_capability", "").replace(".", "") if devices else ""
        print(f"gpu: {smi.get('gpu')}, driver {smi.get('driver_version')} (CUDA "
              f"{self.machine['driver_cuda_version']}), probe runtime {self.machine['cuda_runtime_version']}, "
              f"sm_{self.gpu_cc}, NCCL {self.machine['nccl_version']}; probe exit {rc}", flush=True)
        if rc == 2:
            return self.stop_no_gpu(t, f"the probe found no usable device ({info.get('error')})")
        if rc == 3:
            return self.stop_incompatible(t, "machine", ["driver"],
                                          f"the driver supports CUDA {self.machine['driver_cuda_version']}, older "
                                          f"than the CUDA {self.machine['cuda_runtime_version']} runtime")
        if rc != 0:
            return self.record("machine", "failed", time.monotonic() - t,
                               reason=f"the probe failed (exit {rc}): {error_lines(text)}")
        missing, why = [], []
        built_for = [str(a) for a in self.manifest.get("cuda_architectures", [])]
        if self.prebuilt and built_for and self.gpu_cc not in built_for:
            missing.append("gpu_architecture")
            why.append(f"the bundle's CUDA code is for sm_{'/'.join(built_for)}, the GPU is sm_{self.gpu_cc}")
        if missing:
            return self.stop_incompatible(t, "machine", missing, "; ".join(why))
        # NCCL gates only the binaries that load it: their steps read "host_incompatible", the rest run.
        nccl_needs = needs.get("nccl") or {}
        nccl_problem = None
        if not info.get("nccl_version"):
            nccl_problem = ("no libnccl.so.2 found (the bundle leaves NCCL to the machine: the CUDA toolkit's "
                            "lib64, or the nvidia-nccl wheel; searched: " +
                            (", ".join(self.host.get("wheel_library_dirs", [])) or "no wheel folders") + ")")
        elif nccl_needs.get("symbols") and info.get("nccl_library"):
            lacking = nccl_symbols_missing(info.get("nccl_library"), nccl_needs["symbols"])
            if lacking:
                nccl_problem = (f"NCCL {self.machine['nccl_version']} at {info.get('nccl_library')} lacks "
                                f"{', '.join(lacking)} (the bundle was built against NCCL "
                                f"{nccl_needs.get('built_against')})")
        note = f"sm_{self.gpu_cc}, compute mode {smi.get('compute_mode')}"
        if nccl_problem:
            self.add_missing("nccl")
            for b in NCCL_BINARIES:
                self.unusable.setdefault(b, nccl_problem)
            note += f"; {nccl_problem}: the steps of {', '.join(NCCL_BINARIES)} will not run"
        self.record("machine", "ok", time.monotonic() - t, note=note)

    def probe_path(self):
        if self.prebuilt:
            return os.path.join(self.bin, "gpu_probe")
        probe = os.path.join(self.work, "gpu_probe")
        nvcc = shutil_which("nvcc") or "/usr/local/cuda/bin/nvcc"
        rc, _, _ = self.run([nvcc, "-O2", "-o", probe, os.path.join(ROOT, "tools/gpu_probe.cpp"), "-ldl"], 60,
                            os.path.join(self.work, "probe_build.log"))
        return probe if rc == 0 else None

    def stop_no_gpu(self, t, why):
        self.record("machine", "no_gpu", time.monotonic() - t, reason=why)
        print(f"gpu_check: no GPU: {why}", file=sys.stderr)
        self.finish(("no_gpu", why))

    def add_missing(self, piece):
        self.host.setdefault("missing", [])
        if piece not in self.host["missing"]:
            self.host["missing"].append(piece)

    def stop_incompatible(self, t, step, missing, why):
        for m in missing:
            self.add_missing(m)
        self.record(step, "host_incompatible", time.monotonic() - t, reason=why, missing=missing)
        print(f"gpu_check: this host cannot run the bundle: {why}", file=sys.stderr)
        self.finish(("host_incompatible", f"{step}: {why}"))

    # ---- 2. the host against the bundle's needs; the binaries start ----
    def check_host(self):
        t = time.monotonic()
        needs = self.manifest.get("host_needs", {})
        missing, why = [], []
        # The CPU level the binaries were compiled for (SIGILL otherwise).
        flags = set()
        try:
            with open("/proc/cpuinfo") as f:
                flags = set(next((l.split(":", 1)[1].split() for l in f if l.startswith("flags")), []))
        except OSError:
            pass
        lacking = [x for x in needs.get("cpu_flags", []) if flags and x not in flags]
        if lacking:
            missing.append("cpu")
            why.append(f"this CPU lacks {' '.join(lacking)}, which {self.manifest.get('cpu_arch')} binaries use")
        # glibc: the newest symbol version any carried file needs.
        try:
            host_glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
        except (ValueError, OSError, AttributeError):  # not glibc
            host_glibc = ""
        self.host["glibc"] = host_glibc.replace("glibc ", "") or None
        need = needs.get("glibc")
        if need and self.host["glibc"] and version_tuple(self.host["glibc"]) < version_tuple(need):
            missing.append("glibc")
            who = needs.get("glibc_needed_by", "")
            why.append(f"glibc {self.host['glibc']} here; the bundle needs {need}{(' (' + who + ')') if who else ''}")
        # Every library of every carried binary and library, as the loader resolves it here.
        if self.prebuilt and shutil_which("ldd"):
            unresolved = self.ldd_problems()
            self.host["ldd_problems"] = unresolved[:20]
            hard = []  # what stops every step: glibc, libstdc++, a carried library's own needs
            for p in unresolved:
                lib = p["library"]
                piece = "glibc" if lib.startswith("GLIBC_") else ("libstdc++" if lib.startswith(("GLIBCXX_", "CXXABI_"))
                                                                 else lib)
                binary = p["file"][len("bin/"):] if p["file"].startswith("bin/") else None
                if piece in ("glibc", "libstdc++") or binary is None:
                    hard.append(p)
                    if piece not in missing:
                        missing.append(piece)
                else:  # one binary cannot load: its steps alone are lost
                    self.add_missing(piece)
                    self.unusable.setdefault(binary, f"the loader cannot resolve {lib} for bin/{binary}")
            if hard:
                why.append("the loader cannot resolve: " + "; ".join(
                    f"{p['library']} (needed by {p['file']})" for p in hard[:5]))
        # Each binary starts (a library the loader cannot find shows here, with the loader's own words).
        starts = [("zero_tests", ["--gtest_list_tests"]), ("zero_dist_tests", ["--gtest_list_tests"]),
                  ("train_gpt", ["--help"])]
        failures = []
        for name, args in starts:
            path = os.path.join(self.bin, name)
            log = os.path.join(self.work, f"start_{name}.txt")
            rc, _, timed_out = self.run([path] + args, 5, log)
            text = self.read(log, 200000)
            if rc == 0:
                if name != "train_gpt":
                    self.listings[name] = parse_listing(text)
                continue
            said = first_lines(text) or f"exit status {rc}"
            if timed_out:
                said = "no answer within 5 s"
            if LOADER_ERROR.search(text) or rc == 127:
                piece = loader_piece(text)
                if piece in ("glibc", "libstdc++"):
                    if piece not in missing:
                        missing.append(piece)
                    why.append(f"bin/{name} does not load: {said}")
                else:  # a library one binary needs (NCCL, say): that binary's steps alone are lost
                    self.add_missing(piece)
                    self.unusable[name] = f"bin/{name} does not load: {said}"
            else:
                failures.append(f"bin/{name} does not start (exit {rc}): {said}")
        self.host["test_counts"] = {n: len(v) for n, v in self.listings.items()}
        self.host["unusable_binaries"] = dict(self.unusable)
        if not missing and len(self.unusable) == len(starts):
            missing, why = list(self.host.get("missing", [])), [f"no binary can run: {'; '.join(self.unusable.values())}"]
        if missing:
            return self.stop_incompatible(t, "host", missing, "; ".join(why))
        if self.unusable:
            self.record("host", "host_incompatible", time.monotonic() - t, missing=self.host.get("missing", []),
                        reason="; ".join(f"{b}: {w}" for b, w in self.unusable.items()) +
                        " (the other binaries' steps still run)")
        elif failures:
            self.record("host", "failed", time.monotonic() - t, reason="; ".join(failures))
        else:
            self.record("host", "ok", time.monotonic() - t,
                        note=f"glibc {self.host['glibc']}; {self.host['test_counts']} tests listed")

    def ldd_problems(self, seconds=4):
        problems = []
        files = sorted(glob.glob(os.path.join(self.bin, "*")) + glob.glob(os.path.join(self.prebuilt, "lib", "*.so*")))
        stop = time.monotonic() + seconds
        for path in files:
            if time.monotonic() > stop:
                self.host["ldd_note"] = f"ldd stopped after {seconds}s, before {os.path.relpath(path, self.prebuilt)}"
                break
            try:
                with open(path, "rb") as f:
                    if f.read(4) != b"\x7fELF":
                        continue
            except OSError:
                continue
            try:
                out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=5, env=self.env).stdout
            except (subprocess.TimeoutExpired, OSError):
                continue
            rel = os.path.relpath(path, self.prebuilt)
            for line in out.splitlines():
                m = re.match(r"\s*(\S+) => not found", line)
                if m:
                    problems.append({"file": rel, "library": m.group(1)})
                m = re.search(r"version `([^']+)' not found", line)
                if m:
                    problems.append({"file": rel, "library": m.group(1)})
        return problems

    # ---- 3. build (without a bundle) ----
    def build_here(self):
        lim = self.budget_verdict("build", BUILD_LIMIT)
        if lim is None:
            self.finish()
        os.makedirs(self.build, exist_ok=True)
        launcher = ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache", "-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache"] \
            if shutil_which("ccache") else []
        script = ('cmake -S "$1" -B "$2" -DCMAKE_BUILD_TYPE=Release -DZERO_CUDA=ON -DZERO_BUILD_BENCH=OFF '
                  '-DCMAKE_CUDA_ARCHITECTURES="$3" "${@:4}" || exit 3; '
                  'cmake --build "$2" -j"$(nproc)" --target zero_tests zero_dist_tests train_gpt')
        log = os.path.join(self.build, "gpu_check.build.log")
        rc, secs, timed_out = self.run(["bash", "-c", script, "_", ROOT, self.build,
                                        os.environ.get("CUDA_ARCHS", self.gpu_cc)] + launcher, lim, log)
        if rc != 0:
            self.record("build", "failed", secs, reason=("timed out" if timed_out else f"exit {rc}") +
                        f": {error_lines(self.read(log))} (log: {log}; missing Eigen/fmt/MPI/GTest? use --prebuilt)")
            self.finish()
        self.record("build", "ok", secs)

    # ---- 4. tests ----
    def selected(self, name):
        return self.only is None or name in self.only

    def cannot_run(self, name, binary, ranks=1):
        """Records the step as not runnable here (True) when its binary cannot load, or it needs two
        processes on a GPU whose compute mode allows one."""
        if binary in self.unusable:
            self.record(name, "host_incompatible", 0, reason=self.unusable[binary])
            return True
        mode = (self.machine.get("compute_mode") or "").lower()
        if ranks > 1 and mode.startswith(("exclusive", "prohibited")):
            self.record(name, "host_incompatible", 0,
                        reason=f"the GPU's compute mode is {self.machine['compute_mode']}: {ranks} processes cannot share it")
            return True
        return False

    def gtest_step(self, name, binary, gtest_filter, minimum, wanted, ranks=None):
        if self.cannot_run(name, binary, ranks or 1):
            return
        lim = self.budget_verdict(name, wanted)
        if lim is None:
            return
        listed = [t for t in self.listings.get(binary, []) if filter_matches(gtest_filter, t)]
        report = os.path.join(self.work, name)
        if ranks is None:
            cmd = [os.path.join(self.bin, binary), f"--gtest_filter={gtest_filter}", f"--gtest_output=json:{report}.0.json"]
        else:
            # Each rank writes its own report (Open MPI names the rank in OMPI_COMM_WORLD_RANK).
            per_rank = ["bash", "-c", 'exec "$0" "$@" --gtest_output="json:$ZERO_REPORT.${OMPI_COMM_WORLD_RANK:-0}.json"',
                        os.path.join(self.bin, binary), f"--gtest_filter={gtest_filter}"]
            if self.mpirun:
                cmd = self.mpirun + ["-x", "ZERO_REPORT", "-np", str(ranks)] + per_rank
            elif ranks == 1:
                cmd = per_rank  # an MPI singleton
            else:
                self.record(name, "failed", 0, reason="no mpirun on this machine (a bundle carries one)")
                return
        env = dict(self.env, ZERO_REPORT=report)
        log = os.path.join(self.work, f"{name}.log")
        rc, secs, timed_out = self.run(cmd, lim, log, env)
        ran, skipped, failed = set(), set(), set()
        files = sorted(glob.glob(report + ".*.json"))
        ran_by_rank = {}         # rank -> tests its report shows run
        durations, ratios = {}, {}  # test -> seconds (the slowest rank), worst error / bound ratio
        for path in files:
            try:
                with open(path) as f:
                    rep = json.load(f)
            except (OSError, ValueError):
                continue
            rank = path[len(report) + 1:-len(".json")]
            for suite in rep.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    full = f"{suite['name']}.{t['name']}"
                    if t.get("status") == "NOTRUN":
                        continue
                    ran.add(full)
                    ran_by_rank[rank] = ran_by_rank.get(rank, 0) + 1
                    seconds = float(str(t.get("time", "0")).rstrip("s") or 0)
                    durations[full] = max(durations.get(full, 0.0), seconds)
                    # kernel_bounds.h records each comparison's worst error / bound as error_bound_ratio_K
                    worst = [float(v) for k, v in t.items() if k.startswith("error_bound_ratio")]
                    if worst:
                        ratios[full] = max(max(worst), ratios.get(full, 0.0))
                    if t.get("result") == "SKIPPED":
                        skipped.add(full)
                    if t.get("failures"):
                        failed.add(full)
        text = self.read(log)
        fields = {"tests_listed": len(listed), "min_tests": minimum, "tests_run": len(ran),
                  "skipped_tests": sorted(skipped), "failed_tests": sorted(failed), "log_tail": text[-3000:],
                  "slowest_tests": dict(sorted(durations.items(), key=lambda kv: -kv[1])[:10])}
        if ratios:
            fields["error_bound_ratios"] = dict(sorted(ratios.items(), key=lambda kv: -kv[1]))
        if ranks is not None:
            fields["tests_run_by_rank"] = ran_by_rank
        want_ranks = [str(r) for r in range(ranks or 1)]
        cut = lim < wanted
        if timed_out:
            status = "budget_exhausted" if cut else "failed"
            reason = f"timed out after {lim}s" + (f" (its limit cut from {wanted}s by the budget)" if cut else "")
        elif rc != 0 or failed or not files:
            status = "failed"
            reason = (f"{len(failed)} test(s) failed: {', '.join(sorted(failed)[:8])}" if failed
                      else f"exit status {rc}: {error_lines(text)}")
            if not files:
                reason += "; no gtest JSON report"
        elif len(ran) < len(listed):
            status, reason = "failed", f"{len(listed) - len(ran)} of {len(listed)} listed tests did not run"
        elif ranks is not None and (sorted(ran_by_rank) != want_ranks or
                                    any(ran_by_rank[r] < len(listed) for r in want_ranks)):
            status = "failed"
            reason = (f"asked for {ranks} rank(s), the reports show {len(ran_by_rank)} "
                      f"(tests run by rank: {ran_by_rank}; {len(listed)} listed)")
        elif len(listed) < minimum:
            status, reason = "too_few_tests", f"the filter lists {len(listed)} tests, fewer than its minimum {minimum}"
        elif skipped:
            status, reason = "tests_skipped", f"{len(skipped)} GPU test(s) skipped: {', '.join(sorted(skipped)[:8])}"
        else:
            status, reason = "ok", ""
        if status not in ("ok",) and len(listed) < minimum and status != "too_few_tests":
            reason += f"; and the filter lists {len(listed)} tests, fewer than its minimum {minimum}"
        print(f"   {len(ran)} tests ran ({len(listed)} listed, minimum {minimum}), {len(skipped)} skipped, "
              f"{len(failed)} failed", flush=True)
        self.record(name, status, secs, reason=reason, **fields)

    # ---- 5. training ----
    def train_step(self, run, data, corpus):
        name, ranks, dtype, stage, tf32, steps, wanted, _ = run
        if self.cannot_run(name, "train_gpt", ranks):
            return
        lim = self.budget_verdict(name, wanted)
        if lim is None:
            return
        metrics = os.path.join(self.work, f"{name}.metrics.json")
        steplog = os.path.join(self.work, f"{name}.steps.jsonl")
        flags = ["--data", data] + GPT_FLAGS + ["--device", "cuda", "--dtype", dtype, "--zero-stage", str(stage),
                                                "--steps", str(steps), "--metrics", metrics, "--log-file", steplog]
        if tf32:
            flags.append("--tf32")
        if ranks > 1:
            if not self.mpirun:
                self.record(name, "failed", 0, reason="no mpirun on this machine (a bundle carries one)")
                return
            cmd = self.mpirun + ["-np", str(ranks), os.path.join(self.bin, "train_gpt")] + flags + \
                ["--comm", "host-staged"]
        else:
            cmd = [os.path.join(self.bin, "train_gpt")] + flags
        log = os.path.join(self.work, f"{name}.log")
        rc, secs, timed_out = self.run(cmd, lim, log)
        text = self.read(log)
        fields = {"command": " ".join(shlex.quote(c) for c in cmd), "log_tail": text[-3000:]}
        try:
            with open(metrics) as f:
                m = json.load(f)
            fields["metrics"] = m
        except (OSError, ValueError):
            m = None
        status, reason = verdict_training(rc, timed_out, lim, wanted, text, m, steplog, corpus,
                                          dict(ranks=ranks, dtype=dtype, stage=stage, tf32=tf32, steps=steps),
                                          fields)
        self.record(name, status, secs, reason=reason, **fields)

    # ---- 6. the comparison runs: cuda against the CPU ----
    def compare_step(self, run, data, reference):
        """run: CMP_REFERENCE (device cpu) or a CMP_RUNS row. Returns the per-step losses (or None)."""
        name, ranks, device, comm, stage, wanted, _ = run
        if self.cannot_run(name, "train_gpt", ranks):
            return None
        if device == "cuda" and reference is None:
            ref = self.steps.get(CMP_REFERENCE[0], {}).get("status")
            self.record(name, ref if ref in ("budget_exhausted", "host_incompatible") else "failed", 0,
                        reason=f"no CPU reference losses (cmp_cpu_reference: {ref})")
            return None
        lim = self.budget_verdict(name, wanted)
        if lim is None:
            return None
        metrics = os.path.join(self.work, f"{name}.metrics.json")
        steplog = os.path.join(self.work, f"{name}.steps.jsonl")
        flags = ["--data", data] + CMP_FLAGS + ["--device", device, "--zero-stage", str(stage), "--steps",
                                                str(CMP_STEPS), "--metrics", metrics, "--log-file", steplog]
        if comm:
            flags += ["--comm", comm]
        cmd = [os.path.join(self.bin, "train_gpt")] + flags
        if ranks > 1:
            if not self.mpirun:
                self.record(name, "failed", 0, reason="no mpirun on this machine (a bundle carries one)")
                return None
            cmd = self.mpirun + ["-np", str(ranks)] + cmd
        log = os.path.join(self.work, f"{name}.log")
        rc, secs, timed_out = self.run(cmd, lim, log)
        text = self.read(log)
        fields = {"command": " ".join(shlex.quote(c) for c in cmd), "log_tail": text[-3000:]}
        m, losses = None, []
        try:
            with open(metrics) as f:
                m = json.load(f)
            fields["metrics"] = {k: m.get(k) for k in ("device", "world_size", "zero_stage", "dtype", "steps",
                                                       "comm", "train_loss", "tokens_per_s")}
            with open(steplog) as f:
                rows = [json.loads(line) for line in f if line.strip()]
            losses = [float(r["loss"]) for r in rows if "loss" in r]  # per step; an evaluation line has none
        except (OSError, ValueError, KeyError):
            pass
        if timed_out:
            cut = lim < wanted
            return self.record(name, "budget_exhausted" if cut else "failed", secs, reason=f"timed out after {lim}s",
                               **fields)
        if rc != 0 or not isinstance(m, dict):
            return self.record(name, "failed", secs, reason=f"exit status {rc}: {error_lines(text)}", **fields)
        wrong = [f"{k} {m.get(k)!r}, not {want!r}" for k, want in
                 (("device", device), ("world_size", ranks), ("zero_stage", stage), ("steps", CMP_STEPS))
                 if m.get(k) != want]
        if wrong:
            return self.record(name, "failed", secs, reason="the run was not what was asked: " + ", ".join(wrong),
                               **fields)
        if len(losses) != CMP_STEPS or not all(math.isfinite(x) for x in losses):
            return self.record(name, "failed", secs, reason=f"{len(losses)} finite losses logged, not {CMP_STEPS}",
                               **fields)
        fields["losses"] = [round(x, 6) for x in losses]
        if reference is None:  # this is the reference
            self.record(name, "ok", secs, **fields)
            return losses
        diffs = [abs(a - b) for a, b in zip(losses, reference)]
        worst = max(range(len(diffs)), key=diffs.__getitem__)
        fields.update(max_abs_diff=round(diffs[worst], 6), at_step=worst + 1, bound=CMP_BOUND_NATS,
                      first_step_diff=round(diffs[0], 7))
        if diffs[worst] > CMP_BOUND_NATS:
            i = next(k for k, d in enumerate(diffs) if d > CMP_BOUND_NATS)
            return self.record(name, "failed", secs, reason=(
                f"from step {i + 1} the loss leaves the CPU's: {losses[i]:.5f} against {reference[i]:.5f}, "
                f"{diffs[i]:.4f} apart (bound {CMP_BOUND_NATS}; worst {diffs[worst]:.4f} at step {worst + 1})"),
                **fields)
        self.record(name, "ok", secs, **fields)
        return losses

    # ---- the whole ----
    def main(self):
        if self.prebuilt:
            try:
                with open(os.path.join(self.prebuilt, "manifest.json")) as f:
                    self.manifest = json.load(f)
            except (OSError, ValueError) as e:
                self.manifest = {"error": str(e)}
            self.host["bundle"] = {k: self.manifest.get(k) for k in ("commit", "cuda", "cuda_architectures",
                                                                      "cpu_arch", "host_needs", "corpus")}
            self.setup_bundle_env()
        else:
            self.env["LD_LIBRARY_PATH"] = ":".join(
                p for p in ("/usr/local/cuda/lib64", "/usr/local/cuda/lib", self.env.get("LD_LIBRARY_PATH")) if p)
        self.setup_one_host_env()
        if shutil_which("mpirun", self.env.get("PATH")):
            self.mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none"] + \
                (["--allow-run-as-root"] if os.getuid() == 0 else [])
        self.gpu_cc = ""
        self.check_machine()
        if not self.prebuilt:
            self.build_here()
        self.check_host()
        for name, flt, minimum, wanted, _ in UNIT_GROUPS:
            if self.selected(name):
                self.gtest_step(name, "zero_tests", group_filter(flt), minimum, wanted)
        data, note = self.corpus()
        corpus = corpus_entropies(data)
        self.host["data"] = {"path": data, "note": note, **corpus}
        for run in TRAIN_RUNS:
            if self.selected(run[0]):
                self.train_step(run, data, corpus)
        cmp_names = [CMP_REFERENCE[0]] + [c[0] for c in CMP_RUNS]
        if any(self.selected(n) for n in cmp_names):
            # The CUDA runs need the CPU's losses: --steps naming one of them runs the reference too.
            reference = self.compare_step(CMP_REFERENCE, data, None)
            for run in CMP_RUNS:
                if self.selected(run[0]):
                    self.compare_step(run, data, reference)
        for name, ranks, flt, minimum, wanted, _ in DIST_GROUPS:
            if self.selected(name):
                self.gtest_step(name, "zero_dist_tests", flt, minimum, wanted, ranks=ranks)
        for run in [TRAIN_2RANK] + BENCH_RUNS:
            if self.selected(run[0]):
                self.train_step(run, data, corpus)
        self.finish()

    def setup_one_host_env(self):
        """One host, perhaps a VM: NCCL over loopback sockets without InfiniBand, its debug output to a
        file per process (in the evidence tar); Open MPI on shared memory without CMA (a VM or container
        often forbids process_vm_readv), its isolated launcher (no ssh or rsh) and single processes as
        MPI singletons that start no orted. Values already set in the environment are kept."""
        one_host = {
            "NCCL_SOCKET_IFNAME": "lo", "NCCL_IB_DISABLE": "1", "NCCL_DEBUG": "INFO",
            "NCCL_DEBUG_SUBSYS": "INIT,ENV,NET", "NCCL_DEBUG_FILE": os.path.join(self.work, "nccl.%h.%p.log"),
            "OMPI_MCA_plm": "isolated", "OMPI_MCA_btl": "self,vader",
            "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMPI_MCA_ess_singleton_isolated": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1",
        }
        for k, v in one_host.items():
            self.env.setdefault(k, v)
        self.host["environment"] = {k: self.env[k] for k in one_host}

    def setup_bundle_env(self):
        """Libraries the bundle leaves to the machine: the toolkit's, then the nvidia-* wheels' (NCCL among
        them); the bundle's Open MPI with its plugins, help files and orted."""
        wheels = wheel_library_dirs()
        self.host["wheel_library_dirs"] = wheels
        paths = [os.path.join(self.prebuilt, "lib"), "/usr/local/cuda/lib64", "/usr/local/cuda/lib"] + \
            wheels + ([self.env["LD_LIBRARY_PATH"]] if self.env.get("LD_LIBRARY_PATH") else [])
        self.env["LD_LIBRARY_PATH"] = ":".join(paths)
        if os.path.exists(os.path.join(self.bin, "mpirun")):
            self.env.update(OPAL_PREFIX=self.prebuilt, PATH=self.bin + ":" + self.env.get("PATH", ""),
                            HWLOC_PLUGINS_PATH=os.path.join(self.prebuilt, "lib", "hwloc"))
            if os.path.isdir(os.path.join(self.prebuilt, "pmix")):
                # Note [PMIx's plugin folder]: the bundle's libpmix searches its compiled-in plugin folder
                # (Debian's /usr/lib/x86_64-linux-gnu/pmix2/lib/pmix) before the folders
                # PMIX_MCA_mca_base_component_path adds. A host whose own PMIx keeps its plugins there
                # (another version) has them tried and failing ("undefined symbol: pmix_output_info",
                # then a warning of no compression library, in every process: seen on an H200 host).
                # PMIX_PKGLIBDIR replaces the compiled-in folder; both are set.
                plugins = os.path.join(self.prebuilt, "pmix", "lib", "pmix")
                self.env["PMIX_PKGLIBDIR"] = plugins
                self.env["PMIX_MCA_mca_base_component_path"] = plugins

    def corpus(self):
        for cand in [os.environ.get("ZERO_DATA"), os.path.join(ROOT, "data", "tinyshakespeare.txt"),
                     self.prebuilt and os.path.join(self.prebuilt, "data", "corpus.txt")]:
            if cand and os.path.isfile(cand):
                src = cand + ".source"
                return cand, (open(src).read().strip() if os.path.isfile(src) else cand)
        path = os.path.join(self.work, "synthetic.txt")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "make_corpus.py"), path], check=True,
                       stdout=subprocess.DEVNULL)
        return path, "synthetic corpus (no Tiny Shakespeare found): losses not comparable"


def wheel_library_dirs():
    """The lib folders of the nvidia-* pip wheels (nvidia-nccl-cu*, nvidia-cublas-cu*, the CUDA 13 wheels'
    nvidia/cu13): found by import in this Python, and by path in every usual site-packages folder, since
    the Python that runs this check need not be the one the wheels were installed for."""
    import importlib
    roots = []
    for mod in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia"):
        try:
            roots += list(importlib.import_module(mod).__path__)
        except Exception:
            pass
    prefixes = [sys.prefix, sys.base_prefix, "/usr", "/usr/local", "/opt/conda", os.path.expanduser("~/.local")] + \
        [os.environ[v] for v in ("VIRTUAL_ENV", "CONDA_PREFIX") if os.environ.get(v)]
    for prefix in prefixes:
        for site in ("site-packages", "dist-packages"):
            roots += glob.glob(os.path.join(prefix, "lib*", "python3*", site, "nvidia"))
            roots += glob.glob(os.path.join(prefix, "lib*", "python3*", site, "nvidia", "*"))
    for site in sys.path:
        if site.endswith(("site-packages", "dist-packages")):
            roots += glob.glob(os.path.join(site, "nvidia", "*"))
    dirs = []
    for root in roots:
        for sub in ("lib", "lib64"):
            d = os.path.realpath(os.path.join(root, sub))
            if os.path.isdir(d) and glob.glob(os.path.join(d, "lib*.so*")) and d not in dirs:
                dirs.append(d)
    return dirs


def corpus_entropies(path):
    """The corpus's byte statistics in nats: vocab (distinct bytes), h1 (unigram entropy: the loss of a
    model of byte frequencies alone), h2 (the entropy of a byte given the one before it: the loss of a
    bigram model) and the learning bar: h1 less LEARNING_MARGIN_OF_GAP of (h1 - h2)."""
    from collections import Counter
    with open(path, "rb") as f:
        data = f.read()
    uni = Counter(data)
    pairs = Counter(zip(data, data[1:]))
    n, n2 = len(data), max(1, len(data) - 1)
    h1 = -sum(c / n * math.log(c / n) for c in uni.values())
    prev = Counter(data[:-1])
    h2 = -sum(c / n2 * math.log(c / prev[a]) for (a, _), c in pairs.items())
    margin = LEARNING_MARGIN_OF_GAP * (h1 - h2)
    return {"vocab": len(uni), "ln_vocab": round(math.log(max(1, len(uni))), 4), "unigram_entropy": round(h1, 4),
            "bigram_entropy": round(h2, 4), "learning_margin": round(margin, 4), "learning_bar": round(h1 - margin, 4)}


def learning_problems(losses, corpus, steps, skipped=0):
    """What keeps a loss curve from counting as learning (empty: it learned). losses: the per-step train
    losses, corpus: corpus_entropies()."""
    first, final = losses[0], sum(losses[-10:]) / len(losses[-10:])
    problems = []
    if skipped >= MAX_SKIPPED_FRACTION * steps:
        problems.append(f"{skipped} of {steps} steps skipped (fp16 overflow: no update)")
    if final > corpus["learning_bar"]:
        problems.append(f"final loss {final:.3f} not below {corpus['learning_bar']:.3f}: the corpus's unigram entropy "
                        f"{corpus['unigram_entropy']:.3f} (byte frequencies alone) less {corpus['learning_margin']:.3f}, "
                        f"half its gap to the bigram entropy {corpus['bigram_entropy']:.3f}")
    if final > first - MIN_DROP_NATS:
        problems.append(f"final loss {final:.3f} not {MIN_DROP_NATS} below step 1's {first:.3f}")
    return problems


def verdict_training(rc, timed_out, lim, wanted, text, m, steplog, corpus, asked, fields):
    """(status, reason) of a training run: it ran where and as asked, and it learned."""
    if timed_out:
        cut = lim < wanted
        return ("budget_exhausted" if cut else "failed",
                f"timed out after {lim}s" + (f" (its limit cut from {wanted}s by the budget)" if cut else ""))
    if rc != 0:
        return "failed", f"exit status {rc}: {error_lines(text)}"
    if not isinstance(m, dict):
        return "failed", "no metrics file: " + error_lines(text)
    wrong = []
    for key, want in (("device", "cuda"), ("world_size", asked["ranks"]), ("zero_stage", asked["stage"]),
                      ("dtype", DTYPE_NAMES[asked["dtype"]]), ("steps", asked["steps"]), ("tf32", asked["tf32"])):
        if m.get(key) != want:
            wrong.append(f"{key} {m.get(key)!r}, not {want!r}")
    if wrong:
        return "failed", "the run was not what was asked: " + ", ".join(wrong)
    losses, skipped_logged = [], 0
    try:
        with open(steplog) as f:
            for line in f:
                d = json.loads(line)
                if "loss" in d:
                    losses.append(float(d["loss"]))
                    skipped_logged += bool(d.get("skipped"))
    except (OSError, ValueError) as e:
        return "failed", f"no per-step log ({e})"
    if not losses or not all(math.isfinite(x) for x in losses):
        return "failed", "a non-finite or missing train loss"
    first, final = losses[0], sum(losses[-10:]) / len(losses[-10:])
    skipped = max(int(m.get("skipped_steps") or 0), skipped_logged)
    fields.update(first_loss=round(first, 4), final_loss=round(final, 4), skipped_steps=skipped,
                  learning_bar=corpus["learning_bar"], unigram_entropy=corpus["unigram_entropy"])
    problems = learning_problems(losses, corpus, asked["steps"], skipped)
    if problems:
        return "not_learning", "; ".join(problems)
    return "ok", ""


def nccl_symbols_missing(library, symbols):
    import ctypes
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return list(symbols)
    return [s for s in symbols if not hasattr(lib, s)]


def shutil_which(cmd, path=None):
    import shutil
    return shutil.which(cmd, path=path)


def parse_args(argv):
    import argparse
    import tempfile
    p = argparse.ArgumentParser(prog="scripts/gpu_check.sh", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="the JSON file (default: $OUT/gpu_check.json when $OUT is set, else "
                                  "build-gpu/gpu_check.json)")
    p.add_argument("--prebuilt", help="a bundle made by scripts/gpu_bundle.sh")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    p.add_argument("--steps", help="run only these steps (comma-separated names from --dry-run; machine and host "
                                   "always run first), e.g. to re-run what failed from the same bundle")
    p.add_argument("--evidence", help="the tar of every step's logs, gtest JSON, metrics and loss logs (default: "
                                      "$OUT/gpu_check_evidence.tar.gz when $OUT is set, else beside --out)")
    p.add_argument("--judge-log", metavar="STEPS_JSONL",
                   help="only judge a train_gpt --log-file against the learning criterion on --data, print the "
                        "verdict and exit (0: it learned)")
    p.add_argument("--data", help="the corpus of --judge-log")
    args = p.parse_args(argv)
    if args.judge_log:
        if not args.data:
            p.error("--judge-log needs --data CORPUS (the corpus the run trained on)")
        return args
    names = [n for n, _, _ in plan_steps(args.prebuilt)]
    if args.steps is not None:
        asked = [x.strip() for x in args.steps.split(",") if x.strip()]
        unknown = [x for x in asked if x not in names]
        if unknown or not asked:
            p.error(f"--steps: unknown step(s) {', '.join(unknown) or '(none given)'}; the steps are: {', '.join(names)}")
        args.steps = asked
    if args.prebuilt:
        args.prebuilt = os.path.abspath(args.prebuilt)
        if not os.path.isfile(os.path.join(args.prebuilt, "manifest.json")):
            p.error(f"{args.prebuilt} is not a bundle (no manifest.json)")
    if not args.out:
        base = os.environ.get("OUT") or os.environ.get("ZERO_GPU_BUILD") or os.path.join(ROOT, "build-gpu")
        args.out = os.path.join(base, "gpu_check.json")
    args.out = os.path.abspath(args.out)
    if not args.evidence:
        args.evidence = (os.path.join(os.environ["OUT"], "gpu_check_evidence.tar.gz") if os.environ.get("OUT")
                         else os.path.splitext(args.out)[0] + "_evidence.tar.gz")
    args.evidence = os.path.abspath(args.evidence)
    args.work = tempfile.mkdtemp(prefix="gpu_check.")
    return args


def judge_log(steplog, data):
    """--judge-log: the learning criterion alone, on a per-step log (one JSON object per step with "loss")."""
    corpus = corpus_entropies(data)
    with open(steplog) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    losses = [float(r["loss"]) for r in rows if "loss" in r]
    if not losses:
        print(f"gpu_check: {steplog} holds no losses", file=sys.stderr)
        return 2
    problems = learning_problems(losses, corpus, len(losses), sum(bool(r.get("skipped")) for r in rows))
    final = sum(losses[-10:]) / len(losses[-10:])
    print(json.dumps({"verdict": "not_learning" if problems else "ok", "problems": problems, "steps": len(losses),
                      "first_loss": round(losses[0], 4), "final_loss": round(final, 4), **corpus}, indent=1))
    return 1 if problems else 0


def main(argv):
    args = parse_args(argv)
    if args.judge_log:
        return judge_log(args.judge_log, args.data)
    budget = int(os.environ.get("ZERO_GPU_CHECK_BUDGET_S", "540"))
    if args.dry_run:
        print_plan(args.prebuilt, budget, args.steps)
        return 0
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    check = Check(args)

    def interrupted(signum, _frame):
        if check.child is not None:
            try:
                os.killpg(check.child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        check.finish(("budget_exhausted", f"stopped by signal {signum} after {len(check.steps)} step(s)"))
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    try:
        check.main()
    finally:
        import shutil
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
