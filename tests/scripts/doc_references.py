"""Checks that the file paths and code names the documents write in backticks exist in the tree.

What is checked, in the inline code spans of each document (fenced blocks are code, not references):
  paths       a token with a '/' whose first part is an entry of the repository root (core/..., docs/...,
              .ci/...) or that ends like a file or folder (x.h, x/), and a bare file name with a source extension (zero_plan.h, plot_run.py): each
              must exist relative to the repository ROOT, so a file that moves, or a bare name the
              reader cannot place, fails. {a,b} expands and * globs (each must match something).
              Inside a longer span (a command line) only tokens with a '/' count.
  links       a Markdown link's relative target, from the document's own folder (as Markdown reads it).
  code names  Type::member, ns::function, function(...), obj.method(...).field: every qualified pair
              A::b must appear as written in the sources or b must occur in a file that declares
              class/struct/enum/namespace A; every called name f(...) must occur as f( in the sources;
              a .field after a call must occur as a word. The leading variable of obj.method() and the
              arguments are not checked.
The sources are the tree's C++ (comments left out), CUDA, Python, shell and CMake files (documents and
this checker excluded), with build*/,
data/ and .git/ left out, as .gitignore does.
Not checked: absolute paths (/usr/local/cuda), $VARS, and paths under the folders of NOT_IN_TREE (what
a build, a run or an install makes); names of external things are listed in EXTERNAL.

usage: doc_references.py --source DIR [FILE.md...]   (default README.md and docs/*.md; exit 1 and one
                                                     line per stale reference)
       doc_references.py --self-test                 (the checker finds planted stale references)
"""
import argparse
import glob
import os
import re
import sys
import tempfile

# Names of things outside this tree that the documents name and the checks below would look for.
EXTERNAL = {
    "stage_1_and_2.py",               # DeepSpeed's ZeRO stages 1 and 2
    "std::condition_variable::wait",  # the C++ standard library
}
# First folders of paths that are not in the tree: what a build, a run, an install or a bundle makes,
# the documents' placeholders (DIR, path/to.txt), and DeepSpeed's source tree.
NOT_IN_TREE = ("build/", "build-bundle/", "data/", "DIR/", "path/", "include/", "lib/", "bin/", "share/",
               "pmix/", "deepspeed/", "runtime/")

SOURCE_EXT = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".def", ".py", ".sh", ".cmake", ".in")
CXX_EXT = (".h", ".hpp", ".cpp", ".cu", ".cuh", ".def")
CXX_COMMENT = re.compile(r"\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])'|//[^\n]*|/\*.*?\*/", re.S)
BARE_FILE = re.compile(r"^(?:[\w\-]+\.(?:h|hpp|cpp|cu|cuh|def|py|sh|md|cmake|\{[\w,]+\})|[a-z][\w\-]*\.\*)$")
PATH_TOKEN = re.compile(r"^\.?[\w\-]+(?:/[\w.\-*{},]*)+$")
IDENT = r"[A-Za-z_]\w*"
ARGS = r"\((?:[^()]|\([^()]*\))*\)"
QUALIFIED = re.compile(rf"^{IDENT}(?:::~?{IDENT})+(?:{ARGS})?(?:(?:\.|->){IDENT}(?:{ARGS})?)*$")
CALL_CHAIN = re.compile(rf"^\.?(?:{IDENT}(?:{ARGS})?(?:\[\w+\])?(?:\.|->))*{IDENT}{ARGS}"
                        rf"(?:(?:\[\w+\])?(?:\.|->){IDENT}(?:{ARGS})?)*$")
SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def load_sources(root):
    """(words, calls, pairs, scopes): what the tree's source files contain."""
    words, calls, pairs, scopes = set(), set(), set(), {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        dirnames[:] = [d for d in dirnames if not (d.startswith("build") or d in (".git", "__pycache__")
                                                   or (rel == "." and d == "data"))]
        for name in filenames:
            if not (name.endswith(SOURCE_EXT) or name == "CMakeLists.txt"):
                continue
            if os.path.samefile(os.path.join(dirpath, name), __file__):
                continue  # this checker names the planted stale references of its self-test
            text = open(os.path.join(dirpath, name), encoding="utf-8", errors="replace").read()
            if name.endswith(CXX_EXT):  # a name only a comment mentions does not exist
                text = CXX_COMMENT.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else " ", text)
            file_words = set(re.findall(r"~?[A-Za-z_]\w*", text))
            words |= file_words
            calls |= set(re.findall(rf"({IDENT})\s*(?:<[^<>()]*>)?\(", text))
            pairs |= set(re.findall(rf"({IDENT})\s*::\s*(~?{IDENT})", text))
            for decl in re.findall(rf"\b(?:class|struct|union|namespace|enum(?:\s+class)?)\s+({IDENT}(?:::{IDENT})*)"
                                   r"\s*(?:final\s*)?(?::[^;{()]*)?\{", text):
                for scope in decl.split("::"):
                    scopes.setdefault(scope, set()).update(file_words)
    return words, calls, pairs, scopes


def spans(path):
    """(line number, text) of every inline code span, and ('link', target) of every Markdown link."""
    fenced = False
    for n, line in enumerate(open(path, encoding="utf-8"), 1):
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in SPAN.finditer(line):
            yield n, "span", m.group(2).strip()
        for m in LINK.finditer(SPAN.sub("", line)):
            yield n, "link", m.group(1)


def expand(path):
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [q for alt in m.group(1).split(",") for q in expand(path[:m.start()] + alt + path[m.end():])]


def path_problem(base, path):
    """None if every expansion of `path` exists under `base`, else what is missing."""
    for p in expand(path):
        full = os.path.join(base, p)
        if "*" in p:
            if not glob.glob(full):
                return f"nothing matches {p}"
        elif not os.path.exists(full) or (p.endswith("/") and not os.path.isdir(full)):
            return f"no {p}"
    return None


class Checker:
    def __init__(self, root):
        self.root = root
        self.top = {e for e in os.listdir(root) if e not in ("data", ".git") and not e.startswith("build")}
        self.words, self.calls, self.pairs, self.scopes = load_sources(root)
        self.counts = {"path": 0, "link": 0, "name": 0}
        self.allowed = set()

    def pair_exists(self, scope, member):
        return (scope, member) in self.pairs or member in self.scopes.get(scope, ())

    def name_problem(self, text):
        """None if the code name `text` exists in the sources, else why not."""
        chain = re.sub(ARGS, "()", text)
        chain = re.sub(r"\[\w+\]", "", chain)
        if QUALIFIED.match(text):
            parts = re.split(r"\.|->", chain)
            qualified = parts[0].rstrip("()").split("::")
            for a, b in zip(qualified, qualified[1:]):
                if not self.pair_exists(a, b):
                    return f"no {b} in {a}"
            if parts[0].endswith("()") and qualified[-1] not in self.calls:
                return f"no function {qualified[-1]}"
            members = parts[1:]
        else:
            parts = [p for p in re.split(r"\.|->", chain) if p]
            # obj.method(): the leading variable names nothing in the tree
            members = parts[1:] if len(parts) > 1 and not parts[0].endswith("()") else parts
        for m in members:
            name = m.rstrip("()")
            if m.endswith("()") and name not in self.calls:
                return f"no function {name}"
            if not m.endswith("()") and name not in self.words:
                return f"no member {name}"
        return None

    def check_span(self, doc, n, text):
        """The problems of one inline code span (a list of one-line messages)."""
        out = []
        if text in EXTERNAL:
            self.allowed.add(text)
            return out
        tokens = text.split()
        single = len(tokens) == 1
        for tok in tokens:
            tok = tok.strip("\"'<>,;")
            if not tok or tok in EXTERNAL:
                continue
            # a path: from a folder of the root, or shaped like one (a file name with an extension at its
            # end, or a trailing /), so a misspelt first folder is caught too
            is_path = PATH_TOKEN.match(tok) and (tok.split("/")[0] in self.top or
                                                 re.search(r"(?:\.\w+|/)$", tok) and not tok.startswith("."))
            is_bare = single and BARE_FILE.match(tok) and not tok.startswith(".")
            if tok.startswith(NOT_IN_TREE) or not (is_path or is_bare):
                continue
            self.counts["path"] += 1
            why = path_problem(self.root, tok)
            if why:
                hint = " (name files by their path from the repository root)" if is_bare else ""
                out.append(f"{doc}:{n}: `{text}`: {why} in the repository root{hint}")
        shape = re.sub(ARGS, "()", text)  # the arguments are not checked, so their spaces do not count
        if " " not in shape and "/" not in shape and (QUALIFIED.match(shape) or CALL_CHAIN.match(shape)):
            self.counts["name"] += 1
            why = self.name_problem(shape)
            if why:
                out.append(f"{doc}:{n}: `{text}`: {why} in the sources")
        return out

    def check_doc(self, doc, path=None, folder=None):
        """Problems of document `doc` (read from `path`, links resolved in `folder`; both default to doc's)."""
        out = []
        path = path or os.path.join(self.root, doc)
        folder = folder or os.path.dirname(path)
        for n, kind, text in spans(path):
            if kind == "span":
                out += self.check_span(doc, n, text)
            elif not re.match(r"^(?:[a-z]+:|#)", text):
                self.counts["link"] += 1
                target = text.split("#")[0]
                why = path_problem(folder, target)
                if why:
                    out.append(f"{doc}:{n}: link ({text}): {why} beside {doc}")
        return out


def self_test(source):
    """The checker must flag planted stale references and pass their correct forms."""
    good = ["`docs/zero.md`", "`core/backend.h`", "`tests/scripts/doc_references.py`", "`core/{tensor,storage}.h`",
            "`Tensor::set_data`", "`autograd::backward`", "`named_parameters()`", "`opt.flat_params()`",
            "`scripts/launch.sh -n N`", "[zero](zero.md)", "`build/bin/train_gpt`", "`std::condition_variable::wait`"]
    bad = ["`docs/zer0.md`", "`core/backend_renamed.h`", "`zero_plan.h`", "`core/{tensor,storge}.h`",
           "`Tensor::set_dataa`", "`autograd::backwards`", "`named_parameter()`", "`opt.flat_paramz()`",
           "`scripts/launch_renamed.sh -n N`", "[zero](zer0.md)", "`core/nothing/*.h`", "`ZeroOptimizer::wait_for_oldest`",
           "`distrbuted/zero_plan.h`"]
    checker = Checker(source)
    with tempfile.TemporaryDirectory() as tmp:
        planted = os.path.join(tmp, "planted.md")
        with open(planted, "w", encoding="utf-8") as f:
            f.write("\n".join(good + ["", "```", "`not/checked/in/a/block.h`", "```", ""] + bad) + "\n")
        found = checker.check_doc("docs/planted.md", planted, os.path.join(source, "docs"))
    flagged = {int(line.split(":")[1]) for line in found}
    want = set(range(len(good) + 6, len(good) + 6 + len(bad)))
    for line in found:
        print(line)
    missed = [bad[i - len(good) - 6] for i in sorted(want - flagged)]
    wrong = sorted(flagged - want)
    print(f"self-test: {len(flagged & want)} of {len(bad)} planted stale references found"
          f"{'; missed: ' + ', '.join(missed) if missed else ''}"
          f"{'; good lines flagged: ' + str(wrong) if wrong else ''}")
    return 1 if missed or wrong else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    source = os.path.abspath(args.source)
    if args.self_test:
        return self_test(source)
    if not args.files:  # every document, so a new one is checked without registering it
        args.files = ["README.md"] + sorted(os.path.relpath(p, source) for p in glob.glob(os.path.join(source, "docs", "*.md")))
    checker = Checker(source)
    problems = []
    for doc in args.files:
        problems += checker.check_doc(doc)
    for p in problems:
        print(p)
    c = checker.counts
    print(f"doc references: {sum(c.values())} checked in {len(args.files)} document(s) ({c['path']} paths, "
          f"{c['link']} links, {c['name']} code names; {len(checker.allowed)} external names allowed), "
          f"{len(problems)} stale")
    return 1 if problems or sum(c.values()) == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
