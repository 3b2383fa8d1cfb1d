"""Helpers for the tests that run the repository's scripts as a user would (scripts/train.sh,
scripts/launch.sh, the README's commands).

make() builds a scratch copy of the repository, so they run without touching the tree or building a
second time.
The scratch root holds a symlink to each top-level entry of the source tree, except:
  build/   a symlink to the build directory the tests belong to (already configured, so the scripts only
           bring it up to date, which costs nothing once the test binaries are built);
  data/    its own folder with tinyshakespeare.txt: the tree's copy when it has one, else the stand-in
           text of scripts/make_corpus.py (the scripts then never download);
  docs/    its own folder (symlinks to the documents, an empty img/), so commands that write figures
           into docs/img write here.
The scripts find their root from their own path without resolving symlinks (cd "$(dirname "$0")/.."),
so run from the scratch root they use its build/ and data/.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile


def make(source, build, prefix="zero_scratch_"):
    source = os.path.abspath(source)
    root = tempfile.mkdtemp(prefix=prefix)
    for name in sorted(os.listdir(source)):
        if name in ("build", "data", "docs", ".git") or name.startswith("build"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(root, name))
    os.symlink(os.path.abspath(build), os.path.join(root, "build"))
    os.makedirs(os.path.join(root, "docs", "img"))
    for name in sorted(os.listdir(os.path.join(source, "docs"))):
        if name != "img":
            os.symlink(os.path.join(source, "docs", name), os.path.join(root, "docs", name))
    os.makedirs(os.path.join(root, "data"))
    corpus = os.path.join(root, "data", "tinyshakespeare.txt")
    mine = os.path.join(source, "data", "tinyshakespeare.txt")
    if os.path.isfile(mine):
        shutil.copyfile(mine, corpus)
    else:
        subprocess.run([sys.executable, os.path.join(source, "scripts", "make_corpus.py"), corpus, "--root", source],
                       check=True, stdout=subprocess.DEVNULL)
    return root


def remove(root):
    shutil.rmtree(root, ignore_errors=True)


def read_log(path):
    """train_gpt's --log-file: the per-step lines by step (evaluation lines left out). Raises ValueError
    for a step logged twice."""
    out = {}
    if os.path.exists(path):
        for line in open(path):
            j = json.loads(line)
            if "loss" in j:
                if j["step"] in out:
                    raise ValueError(f"{path}: step {j['step']} logged twice")
                out[j["step"]] = j
    return out


def last_step(path):
    """The highest step of train_gpt's --log-file so far (0 before the first; a partly written last line
    is skipped)."""
    last = 0
    try:
        with open(path) as f:
            for line in f:
                try:
                    last = max(last, int(json.loads(line).get("step", 0)))
                except ValueError:
                    pass
    except FileNotFoundError:
        pass
    return last


def lines_of(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except OSError:
        return 0


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def ranks_of(pid):
    """The rank pids under `pid`: mpirun's children, or those of the mpirun that `pid` (launch.sh) runs."""
    for child in children(pid):
        try:
            if open(f"/proc/{child}/comm").read().strip() == "mpirun":
                return children(child)
        except OSError:
            pass
    return children(pid)
