#!/usr/bin/env python3
"""layers.py: the shape rules of src/ (`make layers`, the first step of `make check`).

Checks, for every .c and .h file under src/ (the folder is the layer):
  - a quoted #include names its folder ("kernels/matmul.h", not "matmul.h") and the file exists;
  - it points at its own folder or a lower layer, never up the stack or across siblings:
        base < kernels < {io, net} < {model, text, vision} < {runtime, convert} < server
    (model/text/vision are siblings, runtime/convert are siblings); include/dsflash.h (the public
    API) may be included anywhere; system headers (<...>) are ignored;
  - no include cycle among the files of src/;
  - no file over MAX_LINES lines, no function over MAX_FUNC lines (a brace-depth scan that
    ignores comments, strings, character literals and preprocessor lines).
tools/ and tests/ may include anything and are not checked.

Prints one line per problem, "path:line: what", and exits 1; prints one summary line and
exits 0 when the tree is clean. Usage: scripts/layers.py [ROOT] (default: the current folder).
"""
import os
import re
import sys

MAX_LINES = 900
MAX_FUNC = 150
RANK = {"base": 0, "kernels": 1, "io": 2, "net": 2, "model": 3, "text": 3, "vision": 3, "runtime": 4, "convert": 4, "server": 5}
PUBLIC = {"dsflash.h"}  # include/dsflash.h

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^">]+)[">]')


def strip_code(src):
    """src with preprocessor lines, comments, string and character literals blanked (newlines
    kept, so line numbers stay)."""
    lines, cont = src.split("\n"), False
    for k, l in enumerate(lines):  # preprocessor lines, with their backslash continuations
        if cont or l.lstrip().startswith("#"):
            cont = l.endswith("\\")
            lines[k] = ""
    src = "\n".join(lines)
    out = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join("\n" if ch == "\n" else " " for ch in src[i:j]))
            i = j
        elif src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and src[j] != c and src[j] != "\n":
                if src[j] == "\\":
                    j += 1
                j += 1
            out.append(c + " " * max(0, j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def long_functions(src, limit):
    """(first line, length, name) of each function body longer than limit lines."""
    s = strip_code(src)
    found = []
    depth, start = 0, None
    for m in re.finditer(r"[{}]", s):
        if m.group() == "{":
            if depth == 0:
                head = s[max(0, m.start() - 600):m.start()].rstrip()
                name = None
                if head.endswith(")"):  # a function: '{' right after its parameter list
                    k, lvl = len(head) - 1, 0
                    while k >= 0:
                        lvl += {")": 1, "(": -1}.get(head[k], 0)
                        if lvl == 0:
                            break
                        k -= 1
                    mm = re.search(r"(\w+)\s*$", head[:k])
                    name = mm.group(1) if mm else "?"
                start = (s.count("\n", 0, m.start()) + 1, name)
            depth += 1
        else:
            depth -= 1
            if depth == 0 and start:
                line, name = start
                length = s.count("\n", 0, m.start()) + 1 - line + 1
                if name and name not in ("if", "for", "while", "switch") and length > limit:
                    found.append((line, length, name))
                start = None
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    src = os.path.join(root, "src")
    files = sorted(os.path.relpath(os.path.join(d, f), src)
                   for d, _, fs in os.walk(src) for f in fs if f.endswith((".c", ".h")))
    problems, edges, n_inc = [], {}, 0
    for rel in files:
        path = "src/" + rel
        folder = rel.split("/")[0] if "/" in rel else ""
        text = open(os.path.join(src, rel), encoding="utf-8", errors="replace").read()
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        if folder not in RANK:
            problems.append(f"{path}:1: is not in a layer folder ({', '.join(RANK)})")
        if len(lines) > MAX_LINES:
            problems.append(f"{path}:1: {len(lines)} lines (at most {MAX_LINES})")
        for line, length, name in long_functions(text, MAX_FUNC):
            problems.append(f"{path}:{line}: function {name} is {length} lines (at most {MAX_FUNC})")
        edges[rel] = []
        for ln, l in enumerate(lines, 1):
            m = INCLUDE.match(l)
            if not m or m.group(1) == "<":
                continue
            inc = m.group(2)
            n_inc += 1
            if inc in PUBLIC:
                continue
            parts = inc.split("/")
            if len(parts) != 2 or parts[0] not in RANK:
                problems.append(f'{path}:{ln}: #include "{inc}" does not name its folder (write "FOLDER/{parts[-1]}")')
                continue
            if not os.path.isfile(os.path.join(src, inc)):
                problems.append(f'{path}:{ln}: #include "{inc}": no such file under src/')
                continue
            edges[rel].append((inc, ln))
            to = parts[0]
            if folder not in RANK or to == folder:
                continue
            if RANK[to] > RANK[folder]:
                problems.append(f'{path}:{ln}: #include "{inc}": {folder} may not include {to} (up the stack)')
            elif RANK[to] == RANK[folder]:
                problems.append(f'{path}:{ln}: #include "{inc}": {folder} may not include {to} (siblings)')
    # include cycles: a depth-first search that reports each cycle once, at its first edge
    state, stack, seen = {}, [], set()

    def visit(f):
        state[f] = 1
        stack.append(f)
        for to, ln in edges.get(f, []):
            if state.get(to) == 1:
                cyc = stack[stack.index(to):] + [to]
                key = frozenset(cyc)
                if key not in seen:
                    seen.add(key)
                    problems.append(f"src/{f}:{ln}: include cycle: " + " -> ".join(cyc))
            elif not state.get(to):
                visit(to)
        stack.pop()
        state[f] = 2

    for f in files:
        if not state.get(f):
            visit(f)
    for p in problems:
        print(p)
    if problems:
        print(f"layers: {len(problems)} problem(s) in src/ ({len(files)} files)", file=sys.stderr)
        return 1
    print(f"layers: ok: {len(files)} files of src/, {n_inc} quoted includes: each names its folder and points to its "
          f"own layer or below, no include cycle, files <= {MAX_LINES} lines, functions <= {MAX_FUNC} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
