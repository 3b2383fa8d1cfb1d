"""Runs every shell command block of the given Markdown files (```sh, ```bash) as written, from a scratch
copy of the repository (script_util.py) whose build/ is the build this test belongs to, with
ZERO_MAX_STEPS (default 10) capping every training run's steps, evaluation batches and sampled
characters (train_gpt honours it, so the scripts do too). A block fails the test when it exits non-zero.

A block preceded by an HTML comment is treated as it says (the comment is invisible on the rendered
page):
  <!-- doc-test: skip (REASON) -->       not run (it needs several machines, or runs this very test)
  <!-- doc-test: needs MODULE -->        run only where /usr/bin/python3 can import MODULE
The placeholder paths the documents use exist in the scratch root: path/to.txt (a text file).

usage: doc_commands.py --source DIR --build DIR FILE.md...
"""
import argparse
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import script_util  # noqa: E402

FENCE = re.compile(r"^\s*```(\w*)\s*$")  # indented too: a block inside a list item
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(skip|needs)\s*(.*?)\s*-->\s*$")


def blocks(path):
    """(line number, language, text, marker) of each fenced block; marker = (kind, arg) or None."""
    out, lines = [], open(path, encoding="utf-8").read().split("\n")
    i, marker = 0, None
    while i < len(lines):
        m = MARKER.match(lines[i])
        if m:
            marker = (m.group(1), m.group(2).strip("() "))
            i += 1
            continue
        f = FENCE.match(lines[i])
        if f:
            start, lang, body = i + 1, f.group(1), []
            i += 1
            while i < len(lines) and not lines[i].lstrip().startswith("```"):
                body.append(lines[i])
                i += 1
            out.append((start, lang, "\n".join(body) + "\n", marker))
            marker = None
        elif lines[i].strip():
            marker = None  # a marker applies to the block right after it
        i += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("files", nargs="+")
    args = ap.parse_args()
    root = script_util.make(args.source, args.build, "zero_doc_test_")
    os.makedirs(os.path.join(root, "path"))
    with open(os.path.join(root, "data", "tinyshakespeare.txt"), "rb") as src, \
            open(os.path.join(root, "path", "to.txt"), "wb") as dst:
        dst.write(src.read(200_000))
    env = dict(os.environ)
    env.setdefault("ZERO_MAX_STEPS", "10")
    ran, skipped, failed = 0, [], []
    t_all = time.time()
    try:
        for md in args.files:
            for line, lang, text, marker in blocks(os.path.join(args.source, md)):
                if lang not in ("sh", "bash"):
                    continue
                where = f"{md}:{line}"
                if marker and marker[0] == "skip":
                    skipped.append(f"{where} ({marker[1]})")
                    continue
                if marker and marker[0] == "needs":
                    probe = subprocess.run(["/usr/bin/python3", "-c", f"import {marker[1]}"], capture_output=True)
                    if probe.returncode != 0:
                        skipped.append(f"{where} (no {marker[1]} for /usr/bin/python3 here)")
                        continue
                t0 = time.time()
                r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", text], cwd=root, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   errors="replace")
                ran += 1
                first = text.strip().split("\n")[0]
                print(f"{where}: exit {r.returncode} in {time.time() - t0:.1f} s: {first}", flush=True)
                if r.returncode != 0:
                    failed.append(where)
                    print(f"---- {where} failed; the block:\n{text}---- its output (last 40 lines):")
                    print("\n".join(r.stdout.rstrip("\n").split("\n")[-40:]))
                    print("----", flush=True)
    finally:
        script_util.remove(root)
    print(f"doc commands: {ran} block(s) run in {time.time() - t_all:.0f} s, {len(failed)} failed"
          f"{': ' + ', '.join(failed) if failed else ''}; {len(skipped)} skipped"
          f"{': ' + '; '.join(skipped) if skipped else ''}")
    return 1 if failed or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
