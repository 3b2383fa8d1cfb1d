"""scripts/launch.sh as a user runs it (from a scratch copy of the repository whose build/ is this
test's build, script_util.py), on a tiny model:

  1. --max-restarts 3, a rank killed with SIGKILL at three random moments: the job relaunches three
     times from the newest checkpoint and its per-step log is bitwise that of an uninterrupted run;
  2. --min-ranks 2 with a hostfile whose slots drop from 4 to 2 before a rank is killed: the job goes
     on with 2 ranks and ends within fp32 summation noise (1e-5 relative) of the uninterrupted 4-rank run;
  3. SIGINT to the launcher: the ranks stop, save, and the launcher exits 130 without relaunching.

usage: launch_restarts.py --source DIR --build DIR
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
        "--eval-iters", "1", "--log-every", "100000", "--warmup", "2", "--sample", "0"]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what, flush=True)
    if not ok:
        failures.append(what)


def launch(root, args, out, env=None):
    return subprocess.Popen(["scripts/launch.sh"] + args, cwd=root, stdout=out, stderr=subprocess.STDOUT,
                            env=env or os.environ, start_new_session=True)


def reference(root, ranks, flags):
    """The per-step log of an uninterrupted launch.sh run on `ranks` ranks."""
    log = os.path.join(root, f"ref{ranks}.jsonl")
    r = subprocess.run(["scripts/launch.sh", "-n", str(ranks)] + flags + ["--log-file", log], cwd=root,
                       capture_output=True, text=True)
    check(r.returncode == 0, f"uninterrupted {ranks}-rank run: exit {r.returncode}")
    return script_util.read_log(log)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    root = script_util.make(args.source, args.build, "zero_launch_test_")
    rng = random.Random(7)
    t_all = time.time()
    try:
        text = os.path.join(root, "text.txt")
        with open(text, "w") as f:
            for i in range(60):
                f.write(f"To be, or not to be, that is the question: whether 'tis nobler {i}\n")
        base = ["--data", text] + TINY

        # ---- 1. three kills, three restarts, bitwise ----
        steps = ["--steps", "3000", "--zero-stage", "2"]
        want = reference(root, 2, base + steps)
        out_path = os.path.join(root, "restarts.out")
        log_path = os.path.join(root, "log.jsonl")
        # Kill at random logged steps, one in each third of the run: a kill chosen by time could land after
        # the last step on a fast machine (this model trains ~2,000 steps a second).
        targets = [rng.randint(300, 900), rng.randint(1200, 1800), rng.randint(2100, 2700)]
        with open(out_path, "w") as out:
            job = launch(root, ["-n", "2", "--max-restarts", "3"] + base + steps +
                         ["--save-dir", "ck", "--save-every", "50", "--log-file", "log.jsonl"], out)
            kills = []
            for k in range(3):
                # wait for the k-th launch's training to be under way and past the k-th target step
                while job.poll() is None and (open(out_path).read().count("model states") < k + 1 or
                                              script_util.last_step(log_path) < targets[k]):
                    time.sleep(0.01)
                ranks = script_util.ranks_of(job.pid)
                if job.poll() is not None or not ranks:
                    break
                victim = rng.choice(ranks)
                os.kill(victim, signal.SIGKILL)
                kills.append(script_util.last_step(log_path))
            rc = job.wait(timeout=600)
        output = open(out_path).read()
        restarts = re.findall(r"^launch: a rank died .*$", output, re.M)
        check(rc == 0, f"--max-restarts 3 with {len(kills)} kills (at logged steps {kills}): exit {rc}")
        check(len(restarts) == 3, f"three restarts reported: {restarts}")
        got = script_util.read_log(os.path.join(root, "log.jsonl"))
        same = len(got) == len(want) and all(got[s]["loss"] == want[s]["loss"] and
                                              got[s]["grad_norm"] == want[s]["grad_norm"] for s in want)
        check(same, f"the restarted run's {len(got)} logged steps equal the uninterrupted run's {len(want)} bitwise")
        if rc != 0 or len(restarts) != 3:
            print(output[-3000:])

        # ---- 2. fewer slots: relaunch on fewer ranks ----
        steps = ["--steps", "600", "--zero-stage", "2"]
        want = reference(root, 4, base + steps)
        hosts = os.path.join(root, "hosts")
        with open(hosts, "w") as f:
            f.write("localhost slots=4\n")
        env = dict(os.environ, ZERO_MPIRUN_ARGS=f"--hostfile {hosts}")
        out_path = os.path.join(root, "shrink.out")
        with open(out_path, "w") as out:
            job = launch(root, ["-n", "4", "--max-restarts", "1", "--min-ranks", "2"] + base + steps +
                         ["--save-dir", "ck4", "--save-every", "50", "--log-file", "log4.jsonl"], out, env)
            while job.poll() is None and not os.path.exists(os.path.join(root, "ck4", "latest")):
                time.sleep(0.05)
            with open(hosts, "w") as f:
                f.write("localhost slots=2\n")  # two slots gone
            ranks = script_util.ranks_of(job.pid)
            if ranks:
                os.kill(ranks[-1], signal.SIGKILL)
            rc = job.wait(timeout=600)
        output = open(out_path).read()
        restarts = re.findall(r"^launch: a rank died .*$", output, re.M)
        check(rc == 0 and len(restarts) == 1 and "on 2 rank(s)" in restarts[0],
              f"--min-ranks 2 after two slots went: exit {rc}, {restarts}")
        got = script_util.read_log(os.path.join(root, "log4.jsonl"))
        worst = max((abs(got[s]["loss"] - want[s]["loss"]) / abs(want[s]["loss"]) for s in want if s in got),
                    default=1.0)
        check(len(got) == len(want) and worst < 1e-5,
              f"4 ranks, then 2: {len(got)} steps, max relative loss difference {worst:.3g} from the 4-rank run")
        if rc != 0:
            print(output[-3000:])

        # ---- 3. a stop request is not a failure: no relaunch ----
        out_path = os.path.join(root, "stop.out")
        with open(out_path, "w") as out:
            job = launch(root, ["-n", "2", "--max-restarts", "3"] + base + ["--steps", "100000", "--save-dir", "ck2"], out)
            while job.poll() is None and open(out_path).read().count("model states") < 1:
                time.sleep(0.05)
            time.sleep(0.5)
            os.kill(job.pid, signal.SIGINT)
            rc = job.wait(timeout=120)
        output = open(out_path).read()
        stopped = re.findall(r"^stopped by SIGUSR1 after step (\d+)/.*$", output, re.M)
        check(rc == 130 and len(stopped) == 1 and "launch: a rank died" not in output,
              f"SIGINT to launch.sh: exit {rc}, stop lines {stopped}, no relaunch")
        if stopped:
            check(os.path.isdir(os.path.join(root, "ck2", f"step_{int(stopped[0]):08d}")), "its checkpoint exists")
    finally:
        script_util.remove(root)
    print(f"launch_restarts: {len(failures)} failure(s) in {time.time() - t_all:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
