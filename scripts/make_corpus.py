"""Writes a stand-in training text when Tiny Shakespeare is not at hand (a GPU machine with no network):
the repository's own source and documentation files, in sorted path order, concatenated and repeated
until the output has exactly as many bytes as Tiny Shakespeare (1,115,394). It needs neither git nor a
network, and the same tree always gives the same bytes. Throughput measured on it is comparable with
Tiny Shakespeare's (same length, similar vocabulary size); losses are not.

usage: python3 scripts/make_corpus.py OUT [--bytes N] [--root DIR]
"""
import argparse
import os
import sys

TEXT_SUFFIXES = (".md", ".h", ".cpp", ".cu", ".py", ".sh", ".cmake", ".txt", ".json")
SKIP_DIRS = {".git", "data", "__pycache__"}


def source_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        # Build trees (build*, as .gitignore has it) and data/ are not the repository's text.
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("build")
                             and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(TEXT_SUFFIXES):
                yield os.path.join(dirpath, name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--bytes", type=int, default=1115394)
    parser.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = parser.parse_args()
    if args.bytes <= 0:
        sys.exit(f"make_corpus: --bytes must be positive, not {args.bytes}")
    text = b"".join(open(p, "rb").read() for p in sorted(source_files(args.root),
                                                            key=lambda p: os.path.relpath(p, args.root)))
    if not text:
        sys.exit(f"make_corpus: no text files under {args.root}")
    out = (text * (args.bytes // len(text) + 1))[: args.bytes]
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, args.out)
    print(f"make_corpus: {len(out)} bytes from {len(text)} bytes of repository text -> {args.out}")


if __name__ == "__main__":
    main()
