"""Checks that the library's folders include each other in one direction only.

The layers, lowest first, as README's "Tour" and the layout table of docs/architecture.md state them:

  core < autograd < nn < optim < distributed

and inside distributed/ three rooms: comm/ (communication) needs only core/; zero/ (the ZeRO algorithm)
may use comm/ and the layers below distributed/; run/ (the run's state) may use both; the umbrella
header distributed/distributed.h, at the folder's root, may use all three and is used by none of them.
MAY_INCLUDE below is that table; each folder is also its own CMake library, linked the same way
(CMakeLists.txt).

Every `#include "..."` of every source file (.h, .hpp, .cpp, .cu, .cuh, .def) under a folder of the
table is checked: the included path, from the repository root, must exist and lie in a folder the
including file's folder may include. A file belongs to the longest folder of the table its path starts
with (distributed/comm/x.h to distributed/comm, distributed/distributed.h to distributed). Angle-bracket
includes (the standard library, Eigen, MPI, CUDA) are not checked.

usage: include_layers.py --source DIR     (exit 1 and one line per include that breaks the table)
       include_layers.py --self-test      (a copy of the tree with bad includes planted fails, one
                                           line each; the clean copy passes)
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

LIBRARY = ("core", "autograd", "nn", "optim")
# folder -> the folders its files may include (its own included).
MAY_INCLUDE = {
    "core": ("core",),
    "autograd": ("core", "autograd"),
    "nn": ("core", "autograd", "nn"),
    "optim": ("core", "autograd", "nn", "optim"),
    "distributed/comm": ("core", "distributed/comm"),
    "distributed/zero": LIBRARY + ("distributed/comm", "distributed/zero"),
    "distributed/run": LIBRARY + ("distributed/comm", "distributed/zero", "distributed/run"),
    "distributed": LIBRARY + ("distributed/comm", "distributed/zero", "distributed/run", "distributed"),
}
SOURCE_EXT = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".def")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of(rel):
    """The folder of MAY_INCLUDE that the repository-relative path `rel` belongs to, or None."""
    best = None
    for folder in MAY_INCLUDE:
        if rel.startswith(folder + "/") and (best is None or len(folder) > len(best)):
            best = folder
    return best


def check(root):
    """(problems, includes checked, files checked): one line per include that breaks the table."""
    problems, n_includes, n_files = [], 0, 0
    for top in sorted({f.split("/")[0] for f in MAY_INCLUDE}):
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, top)):
            dirnames.sort()
            for name in sorted(filenames):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                here = folder_of(rel)
                n_files += 1
                with open(path, encoding="utf-8") as f:
                    for lineno, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m:
                            continue
                        n_includes += 1
                        target = m.group(1)
                        there = folder_of(target)
                        if not os.path.isfile(os.path.join(root, target)):
                            problems.append(f'{rel}:{lineno}: includes "{target}", which is no file of the tree '
                                            f'(includes are written from the repository root)')
                        elif there not in MAY_INCLUDE[here]:
                            problems.append(f'{rel}:{lineno}: {here}/ includes "{target}" ({there or "not a library folder"}); '
                                            f'{here}/ may include only {", ".join(f + "/" for f in MAY_INCLUDE[here])}')
    return problems, n_includes, n_files


def run(root):
    problems, n_includes, n_files = check(root)
    for p in problems:
        print(p)
    print(f"include_layers: {n_includes} includes in {n_files} files checked, {len(problems)} against the table",
          file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


def self_test(source):
    """Plants one bad include per rule in a copy of the library folders; each must be reported."""
    plants = [  # (file to append to, include line, what must be named in the report)
        ("core/tensor.h", '#include "autograd/autograd.h"', "core/tensor.h"),
        ("optim/adamw.h", '#include "distributed/zero/zero_plan.h"', "optim/adamw.h"),
        ("distributed/comm/communicator.h", '#include "distributed/zero/zero_plan.h"',
         "distributed/comm/communicator.h"),
        ("distributed/comm/quantize.cpp", '#include "nn/module.h"', "distributed/comm/quantize.cpp"),
        ("distributed/zero/zero_plan.cpp", '#include "distributed/run/config.h"', "distributed/zero/zero_plan.cpp"),
        ("distributed/run/config.cpp", '#include "distributed/distributed.h"', "distributed/run/config.cpp"),
        ("nn/module.h", '#include "examples/cli_errors.h"', "nn/module.h"),
        ("autograd/ops.h", '#include "autograd/no_such_header.h"', "autograd/ops.h"),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for top in sorted({f.split("/")[0] for f in MAY_INCLUDE}) + ["examples"]:
            shutil.copytree(os.path.join(source, top), os.path.join(tmp, top))
        problems, _, _ = check(tmp)
        if problems:
            print("self-test: the clean copy already fails:\n" + "\n".join(problems))
            return 1
        for rel, line, _ in plants:
            with open(os.path.join(tmp, rel), "a", encoding="utf-8") as f:
                f.write("\n" + line + "\n")
        problems, _, _ = check(tmp)
        missed = [rel for rel, _, named in plants if not any(p.startswith(named + ":") for p in problems)]
        for p in problems:
            print("found: " + p)
        if missed or len(problems) != len(plants):
            print(f"self-test FAILED: {len(problems)} reports for {len(plants)} planted includes; missed: {missed}")
            return 1
    print(f"self-test: all {len(plants)} planted includes reported, the clean copy passes")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."),
                    help="the repository root (default: this script's)")
    ap.add_argument("--self-test", action="store_true", help="check that planted bad includes are found")
    args = ap.parse_args()
    root = os.path.abspath(args.source)
    return self_test(root) if args.self_test else run(root)


if __name__ == "__main__":
    sys.exit(main())
