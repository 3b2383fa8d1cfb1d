"""Stop-request trials (a measurement, not a ctest test: it takes minutes): for 1 and 4 ranks, ZeRO stages
0 and 2, SIGTERM and SIGINT at random moments of a tiny-model run that saves nothing on its own:
  - 1 rank: the signal to train_gpt;
  - 4 ranks, SIGTERM: to every rank directly, each at its own random instant within 30 ms (as a
    scheduler that signals every task does), so the ranks see it during different steps;
  - 4 ranks, SIGINT: to scripts/launch.sh (Ctrl-C), which passes it on through mpirun as SIGUSR1.
Each trial checks: exit code 128 + the signal (the launcher's own for launch.sh), one "stopped by" line,
exactly one checkpoint and it is of that step and `latest`, and the run resumed with only --resume gives
the uninterrupted run's per-step log bitwise. Then second-signal trials: a second signal 0-150 ms after
the first; each must leave either that step's checkpoint complete (the second came after the commit) or
the previous one newest, never anything else. Prints a table.

usage: preemption_trials.py --source DIR --build DIR [--trials N]
"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_util  # noqa: E402

TINY = ["--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block", "16", "--batch", "24", "--eval-every", "0",
        "--eval-iters", "1", "--log-every", "100000", "--warmup", "2", "--sample", "0", "--threads", "1"]


def rank_pids(pid, np):
    """train_gpt's pid for 1 rank; the ranks under launch.sh's mpirun otherwise."""
    return [pid] if np == 1 else script_util.ranks_of(pid)


def command(root, np, stage, extra):
    base = ["--data", os.path.join(root, "text.txt"), "--zero-stage", str(stage)] + TINY + extra
    if np == 1:
        return [os.path.join(root, "build", "bin", "train_gpt")] + base
    return ["scripts/launch.sh", "-n", str(np)] + base


def steps_dirs(d):
    return sorted(f for f in os.listdir(d) if re.fullmatch(r"step_\d{8}", f)) if os.path.isdir(d) else []


def trial(root, np, stage, sig, steps, ref, rng, n):
    save, log, out_path = (os.path.join(root, f"t{n}_{x}") for x in ("ck", "log.jsonl", "out"))
    with open(out_path, "w") as out:
        p = subprocess.Popen(command(root, np, stage, ["--steps", str(steps), "--save-dir", save, "--log-file", log]),
                             cwd=root, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        at = rng.randint(5, steps // 3)
        while p.poll() is None and script_util.lines_of(log) < at:
            time.sleep(0.002)
        if np == 1 or sig == signal.SIGINT:
            p.send_signal(sig)  # train_gpt, or launch.sh
        else:
            ranks = rank_pids(p.pid, np)
            for r in ranks:
                time.sleep(rng.uniform(0, 0.03) / len(ranks))
                os.kill(r, sig)
        rc = p.wait(timeout=300)
    text = open(out_path).read()
    m = re.findall(r"^stopped by \S+ after step (\d+)/", text, re.M)
    problems = []
    if rc != 128 + sig:
        problems.append(f"exit {rc}")
    if len(m) != 1:
        problems.append(f"{len(m)} stop lines")
        return None, problems
    step = int(m[0])
    if steps_dirs(save) != [f"step_{step:08d}"]:
        problems.append(f"checkpoints {steps_dirs(save)}")
    if open(os.path.join(save, "latest")).read().strip() != f"step_{step:08d}":
        problems.append("latest is not the stop step")
    r = subprocess.run(command(root, np, stage, ["--resume", save, "--log-file", log])[:1 if np == 1 else 3] +
                       ["--threads", "1", "--resume", save, "--log-file", log], cwd=root, capture_output=True,
                       text=True)
    if r.returncode != 0:
        problems.append(f"resume exit {r.returncode}: {r.stdout[-500:]}{r.stderr[-500:]}")
    got = script_util.read_log(log)
    if len(got) != len(ref) or any(got[s]["loss"] != ref[s]["loss"] or got[s]["grad_norm"] != ref[s]["grad_norm"]
                                   for s in ref if s in got):
        problems.append(f"resumed log differs ({len(got)} of {len(ref)} steps)")
    return step, problems


def second_signal_trial(root, rng, n):
    save, log, out_path = (os.path.join(root, f"s{n}_{x}") for x in ("ck", "log.jsonl", "out"))
    # The default model's checkpoint (13 MB, fsynced) takes tens of ms to write: room for a second signal.
    with open(out_path, "w") as out:
        p = subprocess.Popen([os.path.join(root, "build", "bin", "train_gpt"), "--data", os.path.join(root, "text.txt"),
                              "--block", "16", "--batch", "4", "--eval-every", "0", "--eval-iters", "1", "--sample",
                              "0", "--threads", "1", "--steps", "100000", "--save-every", "25", "--save-dir", save,
                              "--log-file", log], cwd=root, stdout=out, stderr=subprocess.STDOUT)
        while p.poll() is None and script_util.lines_of(log) < rng.randint(30, 60):
            time.sleep(0.002)
        p.send_signal(signal.SIGTERM)
        time.sleep(rng.uniform(0, 0.15))
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=300)
    text = open(out_path).read()
    m = re.findall(r"^stopped by \S+ after step (\d+)/[^:]*: (.*)$", text, re.M)
    if len(m) != 1:
        return "?", [f"exit {rc}, {len(m)} stop lines"]
    step, what = int(m[0][0]), m[0][1]
    dirs = steps_dirs(save)
    latest = open(os.path.join(save, "latest")).read().strip()
    leftovers = [f for f in os.listdir(save) if f.startswith(".tmp-") or f.startswith(".trash-")]
    problems = [] if rc in (128 + signal.SIGTERM, 128 + signal.SIGINT) else [f"exit {rc}"]
    if leftovers:
        problems.append(f"left {leftovers}")
    if latest != dirs[-1]:
        problems.append(f"latest {latest} is not the newest directory {dirs[-1]}")
    if what.startswith("saved "):
        kind = "second signal after the commit: that step saved"
        if latest != f"step_{step:08d}":
            problems.append("saved, but latest differs")
    else:
        kind = ("second signal inside the save: abandoned" if "abandoned" in what
                else "second signal before the save: nothing saved")
        newest = int(latest[5:])
        if not (newest % 25 == 0 and step - 25 <= newest <= step):
            problems.append(f"newest {latest} after stopping at {step}")
    return kind, problems


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--trials", type=int, default=10)
    args = ap.parse_args()
    root = script_util.make(args.source, args.build, "zero_trials_")
    rng = random.Random(1)
    with open(os.path.join(root, "text.txt"), "w") as f:
        f.write("".join(f"To be, or not to be, that is the question: whether 'tis nobler {i}\n" for i in range(60)))
    rows, bad = [], 0
    try:
        for np, steps in ((1, 1500), (4, 400)):
            for stage in (0, 2):
                ref_log = os.path.join(root, f"ref_{np}_{stage}.jsonl")
                r = subprocess.run(command(root, np, stage, ["--steps", str(steps), "--log-file", ref_log]), cwd=root,
                                   capture_output=True, text=True)
                assert r.returncode == 0, r.stdout + r.stderr
                ref = script_util.read_log(ref_log)
                for sig in (signal.SIGTERM, signal.SIGINT):
                    stops, fails = [], []
                    for t in range(args.trials):
                        step, problems = trial(root, np, stage, sig, steps, ref, rng, len(rows) * 100 + t)
                        stops.append(step)
                        if problems:
                            fails.append(f"trial {t}: {'; '.join(problems)}")
                    bad += len(fails)
                    how = {1: "to train_gpt", 4: "to each rank, 0-30 ms apart" if sig == signal.SIGTERM
                           else "to launch.sh (as SIGUSR1 via mpirun)"}[np]
                    rows.append((np, stage, signal.Signals(sig).name, how, args.trials, len(fails), stops))
                    print(rows[-1], *fails, sep="\n  ", flush=True)
        kinds, second_fails = {}, []
        for t in range(args.trials):
            kind, problems = second_signal_trial(root, rng, t)
            kinds[kind] = kinds.get(kind, 0) + 1
            if problems:
                second_fails.append(f"trial {t}: {'; '.join(problems)}")
        bad += len(second_fails)
    finally:
        script_util.remove(root)
    print("\n| ranks | stage | signal | sent | trials | failed | stopped after steps |")
    print("|---|---|---|---|---|---|---|")
    for np, stage, sig, how, n, f, stops in rows:
        print(f"| {np} | {stage} | {sig} | {how} | {n} | {f} | {', '.join(str(s) for s in stops)} |")
    print(f"\nsecond signal 0-150 ms after the first ({args.trials} trials, default model, 1 rank): " +
          ", ".join(f"{v} {k}" for k, v in sorted(kinds.items())) +
          (f"; FAILED: {second_fails}" if second_fails else "; all left the newest checkpoint complete"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
