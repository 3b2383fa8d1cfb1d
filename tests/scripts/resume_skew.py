#!/usr/bin/env python3
"""Ranks of one job resuming from a save directory that another job is still writing, each rank
opening it at a different moment (Note [One resolution] in distributed/run/checkpoint.cpp).

A 2-rank writer saves every step into S; each try starts a 2-rank `train_gpt --resume S` whose rank 1
starts one second after rank 0 (mpirun's MPMD form with a `sleep 1` in front of rank 1), lets it log a
few steps, and stops it with SIGTERM. The resumed job must either continue the writer's trajectory bit
for bit (its per-step losses equal the writer's for the same steps: both ranks loaded the step rank 0
names), or stop with exactly one "error:" line. Prints one line per try and exits 1 if any try did
neither.
  tests/scripts/resume_skew.py --build BUILD [--tries 10]
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from script_util import read_log  # noqa: E402


def mpirun():
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none"]
    return cmd + (["--allow-run-as-root"] if os.getuid() == 0 else [])


def wait_for(predicate, seconds):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--tries", type=int, default=10)
    ap.add_argument("--delay", type=float, default=1.0, help="seconds rank 1 starts after rank 0")
    args = ap.parse_args()
    train = os.path.join(os.path.abspath(args.build), "bin", "train_gpt")
    work = tempfile.mkdtemp(prefix="zero_resume_skew_")
    text = os.path.join(work, "text.txt")
    with open(text, "w") as f:
        for i in range(60):
            f.write(f"To be, or not to be, that is the question: whether 'tis nobler {i}\n")
    # --steps is the schedule's length: the same for writer and resumes, far beyond what runs.
    tiny = [train, "--data", text, "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block", "16",
            "--batch", "24", "--eval-every", "0", "--eval-iters", "1", "--log-every", "100000", "--sample", "0",
            "--threads", "1", "--steps", "100000"]
    save = os.path.join(work, "S")
    writer_log = os.path.join(work, "writer.jsonl")
    writer = subprocess.Popen(mpirun() + ["-np", "2"] + tiny + ["--save-dir", save, "--save-every", "1", "--keep",
                                                               "400", "--log-file", writer_log],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    failures = 0
    try:
        if not wait_for(lambda: len(read_log(writer_log)) >= 20, 120):
            print("the writer did not start", file=sys.stderr)
            return 1
        for t in range(1, args.tries + 1):
            log = os.path.join(work, f"resume{t}.jsonl")
            resume = tiny + ["--resume", save, "--log-file", log]
            quoted = " ".join("'" + a + "'" for a in resume)
            cmd = mpirun() + ["-np", "1"] + resume + [":", "-np", "1", "sh", "-c", f"sleep {args.delay}; exec {quoted}"]
            start = time.time()
            job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
            wait_for(lambda: job.poll() is not None or len(read_log(log)) >= 5, 120)
            if job.poll() is None:
                job.send_signal(signal.SIGTERM)  # mpirun forwards it: every rank stops after the same step
            out, _ = job.communicate(timeout=120)
            seconds = time.time() - start
            errors = [line for line in out.splitlines() if line.startswith("error:")]
            m = re.search(r"resumed from (\S+) at step (\d+)", out)
            # The resumed job (no saves) runs ahead of the writer: compare the steps both logged, at least 5.
            mine = read_log(log)
            first = min(mine, default=0)
            wait_for(lambda: first + 4 in read_log(writer_log), 120)
            theirs = read_log(writer_log)
            both = [s for s in mine if s in theirs]
            same = len(both) >= 5 and all(theirs[s]["loss"] == mine[s]["loss"] for s in both)
            if m and same and not errors:
                verdict = f"ok: resumed at step {m.group(2)}, steps {min(both)}-{max(both)} equal the writer's bit for bit"
            elif job.returncode not in (0, 143) and len(errors) == 1 and job.returncode < 128:
                verdict = f"ok: stopped with one line (exit {job.returncode}): {errors[0]}"
            else:
                failures += 1
                differ = [s for s in both if theirs[s]["loss"] != mine[s]["loss"]]
                verdict = (f"FAILED: exit {job.returncode}, {len(errors)} error line(s), resumed at "
                           f"{m.group(2) if m else '?'}, {len(both)} steps compared, {len(differ)} differ from the "
                           f"writer's (first: {differ[:1]})\n{out[-1500:]}")
            print(f"try {t}: {seconds:.1f} s, {verdict}", flush=True)
    finally:
        writer.send_signal(signal.SIGTERM)
        try:
            writer.wait(timeout=60)
        except subprocess.TimeoutExpired:
            writer.kill()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.tries - failures} of {args.tries} tries ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
