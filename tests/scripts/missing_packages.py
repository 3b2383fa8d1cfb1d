"""Every Python script under tools/, bench/ and scripts/ that imports a package outside the standard
library fails, when that package is missing, as the programs do: exit status non-zero and one line on
stderr that names the package and the Debian package to install ("apt-get install python3-torch"),
with no traceback.

The scripts and what they import are found by reading them (ast), so a new script is checked without
registering it; a module that is neither in the standard library, nor a script beside it, nor in
DEBIAN_PACKAGES fails the test until its Debian package is added there. Each package is hidden, whether
or not this python3 has it, by a sitecustomize.py on PYTHONPATH whose import hook refuses it.

usage: missing_packages.py --source DIR
"""
import argparse
import ast
import os
import subprocess
import sys
import tempfile

FOLDERS = ("tools", "bench", "scripts")
# Top-level module -> the Debian package that provides it for /usr/bin/python3.
DEBIAN_PACKAGES = {"torch": "python3-torch", "matplotlib": "python3-matplotlib", "numpy": "python3-numpy"}

HIDE = """import importlib.abc, os, sys
class _Hide(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == os.environ["ZERO_HIDE_MODULE"]:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Hide())
"""


def imported_packages(path):
    """Top-level names of the modules `path` imports anywhere, excluding relative imports."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    args = ap.parse_args()
    source = os.path.abspath(args.source)
    stdlib = set(sys.stdlib_module_names)
    cases, problems = [], []
    for folder in FOLDERS:
        for name in sorted(os.listdir(os.path.join(source, folder))):
            if not name.endswith(".py"):
                continue
            script = f"{folder}/{name}"
            local = {n[:-3] for n in os.listdir(os.path.join(source, folder)) if n.endswith(".py")}
            for package in sorted(imported_packages(os.path.join(source, script)) - stdlib - local):
                if package not in DEBIAN_PACKAGES:
                    problems.append(f"{script}: imports {package}, whose Debian package is not in DEBIAN_PACKAGES "
                                    f"of tests/scripts/missing_packages.py")
                    continue
                cases.append((script, package))
    with tempfile.TemporaryDirectory(prefix="zero_missing_packages_") as tmp:
        with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
            f.write(HIDE)
        for script, package in cases:
            env = dict(os.environ, PYTHONPATH=tmp, ZERO_HIDE_MODULE=package)
            r = subprocess.run([sys.executable, os.path.join(source, script)], cwd=tmp, env=env,
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            lines = r.stderr.strip().split("\n") if r.stderr.strip() else []
            want = f"apt-get install {DEBIAN_PACKAGES[package]}"
            ok = r.returncode != 0 and len(lines) == 1 and package in lines[0] and want in lines[0]
            print(f"{script} without {package}: exit {r.returncode}: {lines[-1] if lines else '(no stderr)'}")
            if not ok:
                problems.append(f"{script} without {package}: wanted a non-zero exit and one stderr line naming "
                                f"{package} and '{want}'; got exit {r.returncode} and {len(lines)} line(s):\n"
                                + r.stderr.rstrip())
    for p in problems:
        print(p)
    print(f"missing packages: {len(cases)} script/package case(s) run, {len(problems)} problem(s)")
    return 1 if problems or not cases else 0


if __name__ == "__main__":
    sys.exit(main())
