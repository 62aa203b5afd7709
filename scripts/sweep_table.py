#!/usr/bin/env python3
"""The Markdown table docs/results.md shows for `fastgen eval --sweep --json`.

usage: fastgen eval ... --sweep --json | python3 scripts/sweep_table.py [--header]

One row per memory point: the driven method's kept memory (its range over the
prompts), every method's mean KL at that memory (tie: the paired 95%
interval of the difference holds 0; loses: that method is better), and the
driven method's wins / ties / losses against the others. Several JSON
objects on standard input (runs at other budgets) give rows in their order.
"""
import json
import sys


def rows(doc):
    for point in doc["points"]:
        ms = point["methods"]
        drv = ms[0]
        lo, hi = drv["kv_kept_range"]
        cells, w, t, l = [], 0, 0, 0
        for m in ms[1:]:
            a, b = m["diff_ci95"]
            if a > 0:
                w, mark = w + 1, ""
            elif b < 0:
                l, mark = l + 1, " **(loses)**"
            else:
                t, mark = t + 1, " (tie)"
            cells.append("%.4f%s" % (m["kl_mean"], mark))
        yield "| %.1f%% (%.1f-%.1f) | %.4f | %s | %d/%d/%d |" % (
            100 * drv["kv_kept"], 100 * lo, 100 * hi, drv["kl_mean"], " | ".join(cells), w, t, l)


def main():
    docs = []
    dec = json.JSONDecoder()
    text = sys.stdin.read().strip()
    while text:
        doc, end = dec.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    if "--header" in sys.argv[1:]:
        names = [m["method"] for m in docs[0]["points"][0]["methods"]]
        print("| kept | " + " | ".join(names) + " | verdict (w/t/l) |")
        print("| --- " * (len(names) + 2) + "|")
    out = [r for d in docs for r in rows(d)]
    out.sort(key=lambda r: float(r.split("%")[0].strip("| ")))
    print("\n".join(out))


if __name__ == "__main__":
    main()
