#!/usr/bin/env python3
"""Measures the length of every C++ function in the library and the examples, longest first.

A function's length is counted in lines, from the first line of its signature to its closing brace.
Found by brace matching on the source with comments, strings and preprocessor lines removed: a `{`
whose head (the text since the previous `;`, `{` or `}`) has a parameter list and no `=` outside
parentheses opens a function, unless a function is already open (lambdas and local blocks count toward
the function around them). Brace-initialised data (`const std::vector<Row> table = {...}`), classes,
structs, enums and namespaces are not functions; their member functions are. A function whose body is
only a table of data (`return {...};`) is not counted either.

usage: function_lengths.py [--root DIR] [--top N] [--max LINES]
  --root   the repository root (default: the parent of this script's folder)
  --top    how many of the longest functions to list (default 15)
  --max    exit 1 when a function is longer than LINES, listing each one
Prints "longest function: N lines (file:line name)" last. Python 3 standard library only.
"""
import argparse
import os
import re
import sys

FOLDERS = ["core", "autograd", "nn", "optim", "distributed", "examples"]
EXTENSIONS = (".cpp", ".h", ".cu", ".cuh")


def strip_code(text):
    """The text with comments, string and character literals blanked and preprocessor lines removed;
    newlines kept, so line numbers stay."""
    out = []
    i, n = 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append("\n" * text.count("\n", i, end))
            i = end
            continue
        m = re.compile(r'R"([^(\s]*)\(').match(text, i)
        if m and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + m.group(1) + '"', m.end())
            end = n if end < 0 else end + len(m.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator: 1'000'000
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        if c == "\n":
            at_line_start = True
        out.append(c)
        i += 1
    return "".join(out)


# A function whose body is one table of data (`return {{...}, ...};`, or a static table it returns) is
# data, not logic: it is not counted.
DATA_TABLE = re.compile(r"^\s*(return\s*\{|static\s+const\s+[^;(]*=\s*\{[^;]*\};\s*return\s+\w+;\s*$)", re.S)


def is_function_head(head):
    head = head.strip()
    if "(" not in head or re.search(r"\b(class|struct|union|enum|namespace)\b", head.split("(")[0]):
        return False
    if re.match(r"^(if|for|while|switch|catch|do|else|try)\b", head):
        return False
    depth = 0
    for k, ch in enumerate(head):
        if ch in "([<" and not (ch == "<" and head[k - 1:k + 1] == "<<"):
            depth += ch == "("
        elif ch == ")":
            depth -= 1
        elif ch == "=" and depth == 0:
            before = head[:k].rstrip()
            if not before.endswith("operator") and head[k + 1:k + 2] != "=" and before[-1:] not in "=!<>":
                return False
    return True


def functions(path):
    """(first line, last line, name) of every function defined in the file."""
    code = strip_code(open(path, encoding="utf-8", errors="replace").read())
    found = []
    body_start = {}  # first line of an open function -> offset of its body
    stack = []  # per open brace: "fn", "in" (inside a function) or "other"
    head_start = 0
    line = 1
    head_line = None
    for k, ch in enumerate(code):
        if ch == "\n":
            line += 1
            continue
        if ch in ";{}":
            if ch == "{":
                head = code[head_start:k]
                inside = any(kind in ("fn", "in") for kind, _, _ in stack)
                if not inside and is_function_head(head):
                    body_start[head_line or line] = k + 1
                    name = re.findall(r"([~\w:]+|operator\W+)\s*\(", head)
                    stack.append(("fn", head_line or line, name[0] if name else "?"))
                else:
                    stack.append(("in" if inside else "other", line, ""))
            elif ch == "}" and stack:
                kind, first, name = stack.pop()
                if kind == "fn" and not DATA_TABLE.match(code[body_start.pop(first, k):k]):
                    found.append((first, line, name))
            head_start = k + 1
            head_line = None
            continue
        if head_line is None and not ch.isspace():
            head_line = line
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--max", type=int, default=0)
    args = ap.parse_args()
    rows = []
    for folder in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(args.root, folder)):
            for f in sorted(files):
                if f.endswith(EXTENSIONS):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, args.root)
                    rows += [(last - first + 1, rel, first, name) for first, last, name in functions(path)]
    if not rows:
        print(f"error: no C++ functions found under {args.root} ({', '.join(FOLDERS)})", file=sys.stderr)
        return 1
    rows.sort(key=lambda r: (-r[0], r[1], r[2]))
    for length, rel, first, name in rows[:args.top]:
        print(f"{length:5d}  {rel}:{first}  {name}")
    length, rel, first, name = rows[0]
    print(f"longest function: {length} lines ({rel}:{first} {name}); {len(rows)} functions")
    if args.max and length > args.max:
        over = [r for r in rows if r[0] > args.max]
        print(f"error: {len(over)} function(s) longer than {args.max} lines", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
