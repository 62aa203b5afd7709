#!/usr/bin/env python3
"""The slots of the backend op table (fg_backend_ops in backends/backend.h)
against the docs that list them: each must have a row in docs/backends.md's
op table and be named in docs/design.md's paragraph on the op table, and
neither doc may name a slot the table does not have. Exits 1 on a drift.

Usage: backend_slots.py [ROOT]   (default: the repository this script is in)"""
import os
import re
import sys


def slots(root):
    with open(os.path.join(root, "backends", "backend.h"), encoding="utf-8") as f:
        text = f.read()
    body = re.search(r"typedef struct fg_backend_ops \{(.*?)\} fg_backend_ops;", text, re.S).group(1)
    names = re.findall(r"^\s*fg_\w+_fn \*(\w+);", body, re.M)
    names += re.findall(r"^\s*void \(\*(\w+)\)\(", body, re.M)  # destroy
    return names


# the kernel slots of fg_backend_ops: each has a row in the table of where its code is
KERNELS = ("prefill_attention", "profile_stats", "compact", "decode_step", "read_slots", "adaptive_observe",
           "adaptive_errors")


def first_cells(doc, header):
    """The names in backquotes in the first cell of each row of the table under header."""
    names = set()
    for line in doc.split(header, 1)[1].split("\n\n", 1)[0].splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`(\w+)`", line.split("|")[1]))
    return names


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    table = slots(root)
    with open(os.path.join(root, "docs", "backends.md"), encoding="utf-8") as f:
        backends = f.read()
    with open(os.path.join(root, "docs", "design.md"), encoding="utf-8") as f:
        design = f.read()
    what = first_cells(backends, "| op | what it does |")
    where = first_cells(backends, "| op | ref | cpu | CUDA / HIP |")
    para = re.search(r"\*\*The op table\.\*\*(.*?)\n\n", design, re.S).group(1)
    named = set(re.findall(r"`(\w+)`", para))
    bad = []
    for name in table:
        if name not in what:
            bad.append("docs/backends.md: no row for the slot `%s` in the table of what each op does" % name)
        if name in KERNELS and name not in where:
            bad.append("docs/backends.md: no row for the kernel `%s` in the table of where each op's code is" % name)
        if name not in named:
            bad.append("docs/design.md (the op table): `%s` not named" % name)
    for name in sorted(what - set(table)):
        bad.append("docs/backends.md: a row for `%s`, which fg_backend_ops does not have" % name)
    print("%d slots of fg_backend_ops: %s" % (len(table), ", ".join(table)))
    for b in bad:
        print(b)
    print("drift: %d" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
