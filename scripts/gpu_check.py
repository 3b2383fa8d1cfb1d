#!/usr/bin/env python3
"""The GPU check (scripts/gpu_check.sh runs this): one command, on a machine with one NVIDIA GPU, that
checks the host first and then runs every GPU test, a training run that must learn, the benchmarks and
the distributed tests, in that order, writing one JSON file after every step.

  scripts/gpu_check.sh --prebuilt DIR [--out FILE]   on the GPU machine, with a bundle (gpu_bundle.sh)
  scripts/gpu_check.sh [--out FILE]                  building here (needs every dependency; slow)
  scripts/gpu_check.sh --dry-run [--prebuilt DIR]    print the plan (steps, order, limits) and exit
  scripts/gpu_check.sh --bundle DIR                  make a bundle (scripts/gpu_bundle.sh DIR)

The JSON's "status" is the first of these that applies (every step has its own status from the same
list, and "reason" names each step that is not "ok"):
  no_gpu             no usable GPU (nvidia-smi, /dev/nvidia*, the probe): stopped within seconds;
  host_incompatible  the host lacks what the bundle needs (driver for its CUDA runtime, NCCL, glibc,
                     libstdc++, a library, the CPU level, the GPU architecture) or a binary does not
                     load; "missing" names the pieces; stopped before any test;
  failed             a test failed, a step crashed or timed out, a binary did not start;
  not_learning       a training run skipped 10% of its steps or more, or its final loss is not at least
                     0.5 below ln(vocab) and below its first step's loss (or is on the wrong device,
                     dtype, stage or world size: that is "failed");
  too_few_tests      a step's test filter lists fewer tests than its minimum (a renamed suite);
  budget_exhausted   a step did not run, or was cut short, because the time budget was spent;
  tests_skipped      everything passed but a GPU test skipped itself (it tested nothing);
  ok                 every step ran and passed.
The exit status is 0 for "ok" alone. The file is rewritten after every step ("status": "running"
until the end), so a run stopped from outside still shows what passed.

Environment: ZERO_GPU_CHECK_BUDGET_S (default 540: the planned limits sum to 480, the rest absorbs
the script's own overhead; a GPU lent for 600 s per command keeps a minute of room);
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

# Unit tests in separate processes, so that a sticky device fault in one suite (an illegal address
# poisons the CUDA context for the rest of the process) cannot fail the others. min: the tests the
# filter lists today (zero_tests --gtest_list_tests); fewer means a suite was renamed or lost, and the
# step reads "too_few_tests". The first group is UNIT_FILTER less the others, so every test the filter
# selects runs in exactly one group (a new suite lands there until it gets a group of its own).
UNIT_GROUPS = [
    # name, filter (None: the rest; else patterns within UNIT_FILTER), minimum listed tests, limit (s), what
    ("unit_core", None, 12, 20, "runtime, allocator, streams, device checks, GEMM plans, backends (the rest)"),
    ("unit_kernels", "CudaKernels.*", 12, 40, "every kernel against a double-precision reference"),
    ("unit_gemm", "CudaGemm.*:CudaTensorCores.*:Devices/TensorCores.*/cuda", 10, 25,
     "cuBLAS GEMMs, TF32, 16-bit tensor-core GEMMs against double references"),
    ("unit_ops", "Ops/OpTable.*_cuda:CudaOps.*", 122, 30, "every op's forward and gradient on cuda against the CPU"),
    ("unit_gpt", "CudaGpt.*", 2, 20, "a GPT forward/backward, clipping and AdamW on cuda against the CPU"),
]

# Distributed tests (zero_dist_tests): NCCL proper needs a GPU per rank, so 2 ranks share the GPU through
# the host-staged communicator only.
DIST_GROUPS = [
    # name, ranks, filter, minimum, limit (s), what
    ("dist_staged_np1", 1, "CudaHostStaged.*:ZeroCuda.*", 2, 25, "host-staged collectives, ZeRO stages on cuda"),
    ("dist_nccl_np1", 1, "CudaNccl.*", 2, 35, "NCCL on one rank, the grouped uneven paths forced"),
    ("dist_staged_np2", 2, "CudaHostStaged.*:ZeroCuda.*", 2, 40, "the same on 2 ranks sharing the GPU"),
]

# nanoGPT's shakespeare_char config (config/train_shakespeare_char.py): 6 layers, 6 heads, 384 channels,
# block 256, batch 64.
GPT_FLAGS = ["--n-layer", "6", "--n-head", "6", "--n-embd", "384", "--block", "256", "--batch", "64",
             "--dropout", "0.2", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "100", "--beta2", "0.99",
             "--eval-every", "0", "--eval-iters", "20", "--sample", "0", "--log-every", "50"]
TRAIN_RUNS = [
    # name, ranks, dtype flag, stage, tf32, steps, limit (s), what
    ("train_fp16_zero2_1gpu", 1, "fp16", 2, False, 200, 50, "200 steps fp16 ZeRO-2: must learn"),
    ("bench_bf16", 1, "bf16", 0, False, 100, 35, "tokens/s, TFLOP/s, MFU; must learn"),
    ("bench_tf32", 1, "fp32", 0, True, 100, 35, "the same, fp32 with TF32 GEMMs"),
    ("bench_fp32", 1, "fp32", 0, False, 100, 35, "the same, plain fp32 GEMMs"),
]
TRAIN_2RANK = ("train_fp16_zero2_2rank_host_staged", 2, "fp16", 2, False, 100, 45,
               "100 steps, 2 ranks on one GPU through the host-staged communicator: must learn")
MACHINE_LIMIT = 25  # nvidia-smi twice (at most 8 + 4 s) and the probe (at most 13 s)
HOST_LIMIT = 20     # manifest against the host, ldd (at most 4 s), each binary started once (at most 5 s each)
BUILD_LIMIT = 300

# Learning: "final" is the mean train loss of the last 10 logged steps.
MAX_SKIPPED_FRACTION = 0.10
MIN_DROP_NATS = 0.5  # below ln(vocab) and below step 1's loss by at least this much

DTYPE_NAMES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}  # train_gpt's flag -> the metrics' name

STATUS_ORDER = ["no_gpu", "host_incompatible", "failed", "not_learning", "too_few_tests", "budget_exhausted",
                "tests_skipped", "ok"]


def plan_steps(prebuilt):
    """The ordered steps: (name, limit in seconds, what). Fast and informative first."""
    steps = [("machine", MACHINE_LIMIT, "nvidia-smi, /dev/nvidia*, gpu_probe: device, driver, CUDA, NCCL")]
    if not prebuilt:
        steps.append(("build", BUILD_LIMIT, "Release with CUDA for this GPU"))
    steps.append(("host", HOST_LIMIT, "the bundle's needs against the host (CPU, glibc, libraries), each "
                                      "binary starts, test counts from the binaries' own listings"))
    steps += [(g[0], g[3], g[4]) for g in UNIT_GROUPS]
    steps += [(r[0], r[6], r[7]) for r in TRAIN_RUNS]
    steps += [(g[0], g[4], g[5]) for g in DIST_GROUPS]
    steps.append((TRAIN_2RANK[0], TRAIN_2RANK[6], TRAIN_2RANK[7]))
    return steps


def print_plan(prebuilt, budget):
    steps = plan_steps(prebuilt)
    total = sum(s[1] for s in steps)
    print(f"gpu_check plan ({'bundle ' + prebuilt if prebuilt else 'building here'}; budget {budget} s):")
    print(f"  {'#':>2}  {'step':<36} {'limit':>5}  what")
    for i, (name, limit, what) in enumerate(steps, 1):
        print(f"  {i:>2}  {name:<36} {limit:>5}  {what}")
    print(f"  total of the limits: {total} s")
    if total > budget:
        print(f"  (more than the budget: the last steps would be cut; a bundle (--prebuilt) skips the build)")


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
        return m.group(1)
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
                      {"step": n, "limit_s": l, "what": w} for n, l, w in plan_steps(self.prebuilt)],
                  "steps": self.steps, "statuses": statuses, "summary": self.summary(),
                  "total_seconds": round(time.monotonic() - self.t0, 1), "budget_seconds": self.budget}
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1)
        os.replace(tmp, self.out)
        return status, reason

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
        self.steps[name] = {"status": status, "seconds": round(seconds, 1), **fields}
        reason = fields.get("reason", "")
        print(f"== {name}: {status} in {seconds:.0f}s{(' (' + reason + ')') if reason else ''}", flush=True)
        self.write(("running", f"{len(self.steps)} step(s) done, last: {name}"))

    def finish(self, final=None):
        status, reason = self.write(final)
        print(json.dumps({"status": status, "reason": reason, "statuses": {k: v["status"] for k, v in
                                                                            self.steps.items()},
                          "summary": self.summary()}, indent=1))
        print("gpu_check: wrote", self.out, flush=True)
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
        rc, _, _ = self.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                            8, log)
        text = self.read(log)
        if rc != 0:
            return self.stop_no_gpu(t, f"nvidia-smi failed: {first_lines(text, 1)}")
        if not text.strip():
            return self.stop_no_gpu(t, "nvidia-smi listed no GPU")
        first = [x.strip() for x in text.strip().splitlines()[0].split(",")]
        smi = {"gpu": first[0], "driver_version": first[1] if len(first) > 1 else None,
               "gpu_memory": first[2] if len(first) > 2 else None}
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
        nccl_needs = needs.get("nccl", {})
        if not info.get("nccl_version"):
            missing.append("nccl")
            why.append("no libnccl.so.2 found (the bundle leaves NCCL to the machine: the CUDA toolkit's lib64, "
                       "or the nvidia-nccl wheel)")
        elif nccl_needs.get("symbols") and info.get("nccl_library"):
            lacking = nccl_symbols_missing(info.get("nccl_library"), nccl_needs["symbols"])
            if lacking:
                missing.append("nccl")
                why.append(f"NCCL {self.machine['nccl_version']} at {info.get('nccl_library')} lacks "
                           f"{', '.join(lacking)} (the bundle was built against NCCL "
                           f"{nccl_needs.get('built_against')})")
        if missing:
            return self.stop_incompatible(t, "machine", missing, "; ".join(why))
        self.record("machine", "ok", time.monotonic() - t, note=f"sm_{self.gpu_cc}")

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

    def stop_incompatible(self, t, step, missing, why):
        self.host.setdefault("missing", [])
        self.host["missing"] += [m for m in missing if m not in self.host["missing"]]
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
            for lib in sorted({p["library"] for p in unresolved}):
                piece = "glibc" if lib.startswith("GLIBC_") else ("libstdc++" if lib.startswith(("GLIBCXX_", "CXXABI_"))
                                                                 else lib)
                if piece not in missing:
                    missing.append(piece)
            if unresolved:
                why.append("the loader cannot resolve: " + "; ".join(
                    f"{p['library']} (needed by {p['file']})" for p in unresolved[:5]))
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
                if piece not in missing:
                    missing.append(piece)
                why.append(f"bin/{name} does not load: {said}")
            else:
                failures.append(f"bin/{name} does not start (exit {rc}): {said}")
        self.host["test_counts"] = {n: len(v) for n, v in self.listings.items()}
        if missing:
            return self.stop_incompatible(t, "host", missing, "; ".join(why))
        if failures:
            self.record("host", "failed", time.monotonic() - t, reason="; ".join(failures))
            return
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
    def gtest_step(self, name, binary, gtest_filter, minimum, wanted, ranks=None):
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
        for path in files:
            try:
                with open(path) as f:
                    rep = json.load(f)
            except (OSError, ValueError):
                continue
            for suite in rep.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    full = f"{suite['name']}.{t['name']}"
                    if t.get("status") == "NOTRUN":
                        continue
                    ran.add(full)
                    if t.get("result") == "SKIPPED":
                        skipped.add(full)
                    if t.get("failures"):
                        failed.add(full)
        text = self.read(log)
        fields = {"tests_listed": len(listed), "min_tests": minimum, "tests_run": len(ran),
                  "skipped_tests": sorted(skipped), "failed_tests": sorted(failed), "log_tail": text[-3000:]}
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
    def train_step(self, run, data, vocab):
        name, ranks, dtype, stage, tf32, steps, wanted, _ = run
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
        status, reason = verdict_training(rc, timed_out, lim, wanted, text, m, steplog, vocab,
                                          dict(ranks=ranks, dtype=dtype, stage=stage, tf32=tf32, steps=steps),
                                          fields)
        self.record(name, status, secs, reason=reason, **fields)

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
        # One machine: Open MPI's isolated launcher starts local processes without the ssh/rsh it otherwise
        # insists on finding (a bare GPU machine has neither).
        self.env["OMPI_MCA_plm"] = "isolated"
        if shutil_which("mpirun", self.env.get("PATH")):
            self.mpirun = ["mpirun", "--oversubscribe", "--bind-to", "none"] + \
                (["--allow-run-as-root"] if os.getuid() == 0 else [])
        self.gpu_cc = ""
        self.check_machine()
        if not self.prebuilt:
            self.build_here()
        self.check_host()
        for name, flt, minimum, wanted, _ in UNIT_GROUPS:
            self.gtest_step(name, "zero_tests", group_filter(flt), minimum, wanted)
        data, note = self.corpus()
        with open(data, "rb") as f:
            vocab = len(set(f.read()))
        self.host["data"] = {"path": data, "note": note, "vocab": vocab}
        for run in TRAIN_RUNS:
            self.train_step(run, data, vocab)
        for name, ranks, flt, minimum, wanted, _ in DIST_GROUPS:
            self.gtest_step(name, "zero_dist_tests", flt, minimum, wanted, ranks=ranks)
        self.train_step(TRAIN_2RANK, data, vocab)
        self.finish()

    def setup_bundle_env(self):
        """Libraries the bundle leaves to the machine: the toolkit's, then the nvidia-* wheels' (NCCL among
        them); the bundle's Open MPI with its plugins, help files and orted."""
        import importlib
        wheels = []
        for mod in ("nvidia.nccl", "nvidia.cublas", "nvidia.cuda_runtime", "nvidia.cu13", "nvidia"):
            try:
                for p in importlib.import_module(mod).__path__:
                    for sub in ("lib", "lib64"):
                        if os.path.isdir(os.path.join(p, sub)):
                            wheels.append(os.path.join(p, sub))
            except Exception:
                pass
        paths = [os.path.join(self.prebuilt, "lib"), "/usr/local/cuda/lib64", "/usr/local/cuda/lib"] + \
            list(dict.fromkeys(wheels)) + ([self.env["LD_LIBRARY_PATH"]] if self.env.get("LD_LIBRARY_PATH") else [])
        self.env["LD_LIBRARY_PATH"] = ":".join(paths)
        if os.path.exists(os.path.join(self.bin, "mpirun")):
            self.env.update(OPAL_PREFIX=self.prebuilt, PATH=self.bin + ":" + self.env.get("PATH", ""),
                            HWLOC_PLUGINS_PATH=os.path.join(self.prebuilt, "lib", "hwloc"))
            if os.path.isdir(os.path.join(self.prebuilt, "pmix")):
                self.env["PMIX_MCA_mca_base_component_path"] = os.path.join(self.prebuilt, "pmix", "lib", "pmix")

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


def verdict_training(rc, timed_out, lim, wanted, text, m, steplog, vocab, asked, fields):
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
                  ln_vocab=round(math.log(vocab), 4))
    problems = []
    if skipped >= MAX_SKIPPED_FRACTION * asked["steps"]:
        problems.append(f"{skipped} of {asked['steps']} steps skipped (fp16 overflow: no update)")
    if final > math.log(vocab) - MIN_DROP_NATS:
        problems.append(f"final loss {final:.3f} not {MIN_DROP_NATS} below ln({vocab}) = {math.log(vocab):.3f}")
    if final > first - MIN_DROP_NATS:
        problems.append(f"final loss {final:.3f} not {MIN_DROP_NATS} below step 1's {first:.3f}")
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
    args = p.parse_args(argv)
    if args.prebuilt:
        args.prebuilt = os.path.abspath(args.prebuilt)
        if not os.path.isfile(os.path.join(args.prebuilt, "manifest.json")):
            p.error(f"{args.prebuilt} is not a bundle (no manifest.json)")
    if not args.out:
        base = os.environ.get("OUT") or os.environ.get("ZERO_GPU_BUILD") or os.path.join(ROOT, "build-gpu")
        args.out = os.path.join(base, "gpu_check.json")
    args.out = os.path.abspath(args.out)
    args.work = tempfile.mkdtemp(prefix="gpu_check.")
    return args


def main(argv):
    args = parse_args(argv)
    budget = int(os.environ.get("ZERO_GPU_CHECK_BUDGET_S", "540"))
    if args.dry_run:
        print_plan(args.prebuilt, budget)
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
