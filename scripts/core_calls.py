#!/usr/bin/env python3
"""The calls between the files of core/: which file calls a function another
defines (comments and strings left out), and the circles among them. Exits 1
when there is a circle: core/ is kept a stack of rooms (docs/design.md §3).

Usage: core_calls.py [ROOT]   (default: the repository this script is in)"""
import os
import re
import sys


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def graph(root):
    core = os.path.join(root, "core")
    src = {}
    for name in sorted(os.listdir(core)):
        if name.endswith(".c"):
            with open(os.path.join(core, name), encoding="utf-8") as f:
                src[name[:-2]] = strip(f.read())
    defined = {}  # function -> the file that defines it (non-static definitions)
    for name, text in src.items():
        for m in re.finditer(r"^(?!static)[\w \*]*?\b(fg_\w+)\s*\([^;{]*\)\s*\{", text, re.M):
            defined.setdefault(m.group(1), name)
    calls = {name: set() for name in src}
    for name, text in src.items():
        for fn, where in defined.items():
            if where != name and re.search(r"\b" + fn + r"\s*\(", text):
                calls[name].add(where)
    return calls


def circles(calls):
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in calls[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in calls:
        if v not in index:
            visit(v)
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    calls = graph(root)
    for name in sorted(calls):
        print("  %-12s -> %s" % (name, ", ".join(sorted(calls[name])) or "-"))
    found = circles(calls)
    print("circles:", "; ".join(" <-> ".join(c) for c in found) if found else "none")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
