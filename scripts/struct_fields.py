#!/usr/bin/env python3
"""The fields of the public structs (include/fastgen.h) against the rings
that mirror them: the Python binding's field tables (FIELD(...) in
python/fastgen/_fastgen.c; its keyword lists and dicts for the structs
without a table), the package's dataclasses
(python/fastgen/__init__.py) and the Python docs (docs/python.md, with
fastgen.h's own comments for the C side). A field a ring leaves out must be
named below with the reason; anything else is a drift and exits 1.

Usage: struct_fields.py [ROOT]   (default: the repository this script is in)"""
import os
import re
import sys

# struct -> the rings that mirror it
RINGS = {
    "fg_policy": ("binding", "package", "docs"),
    "fg_compression_params": ("binding", "package", "docs"),
    "fg_context_params": ("binding",),
    "fg_head_info": ("binding",),
    "fg_memory_stats": ("binding",),
}
# fields the binding converts by hand beside its field tables (a policy name, the list of policies)
SHAPED = ("components", "shortlist")
# fields a ring leaves out on purpose
APART = {
    ("fg_compression_params", "n_policies"): "the shortlist's length in Python",
    ("fg_context_params", "threadpool"): "a C handle: Python contexts take n_threads",
    ("fg_context_params", "log_fn"): "a C callback",
    ("fg_context_params", "log_user"): "the C callback's pointer",
    ("fg_head_info", "n_policies"): "the recovery list's length in Python",
}


def strip(text):
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def fields(header, name):
    body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (name, name), strip(header), re.S).group(1)
    out = []
    for decl in body.split(";"):
        decl = re.sub(r"\[[^\]]*\]", "", decl).strip()
        if not decl:
            continue
        decl = re.sub(r"\(\s*\*\s*(\w+)\s*\)\s*\(.*", r"\1", decl, flags=re.S)  # a function pointer's name
        parts = [p.strip() for p in decl.split(",")]
        out.append(re.findall(r"(\w+)\s*$", parts[0])[0])
        out += [re.sub(r"^\**", "", p) for p in parts[1:]]
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

    def read(*path):
        with open(os.path.join(root, *path), encoding="utf-8") as f:
            return f.read()

    header = read("include", "fastgen.h")
    binding = strip(read("python", "fastgen", "_fastgen.c"))
    rings = {"binding": binding,
             "package": read("python", "fastgen", "__init__.py"),
             "docs": read("docs", "python.md")}
    bad = 0
    for struct, where in RINGS.items():
        names = fields(header, struct)
        print("%s: %d fields" % (struct, len(names)))
        # a struct the binding converts through a field table (FIELD(struct, member, ...)) is checked against
        # that table, its fields with a shape of their own by name; the others by their names in the binding
        table = set(re.findall(r"FIELD\(%s, (\w+)," % struct, binding))
        for ring in where:
            for name in names:
                if ring == "binding" and table:
                    if name in table or (name in SHAPED and re.search(r'"%s"' % name, binding)):
                        continue
                elif re.search(r"\b%s\b" % name, rings[ring]):
                    continue
                why = APART.get((struct, name))
                if why:
                    print("  %-8s leaves out %s: %s" % (ring, name, why))
                else:
                    print("  %-8s DRIFT: no %s" % (ring, name))
                    bad += 1
    print("drift: %d" % bad)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
