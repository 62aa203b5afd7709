#!/usr/bin/env python3
"""Runs the RULER-style suite of scripts/ruler.py through `fastgen eval
--passkey` and prints kvpress' kind of table: a row per method and budget, a
column per task, the average last (the scores in %, the share of each
answer's references found).

Each (length, task) is one `fastgen eval` run: every method at the KV memory
the driven method (the first) kept on each prompt, `full` the full cache.
The files and the JSON of each run go to --out, with the settings that made
it (.args.json). Run again with the same settings, a suite cut short goes on
where it stopped (runs whose settings match are not repeated; others are);
--report prints the tables from what --out holds, running nothing. A
(length, task) whose prompts do not fit the model's context is reported as
such, and the others go on.

Usage: ruler_eval.py -m MODEL [--fastgen PATH] [--out DIR] [--split test] [--form turns|prompt]
                     [--lengths 2048,4096,8192] [--tasks single,...] [--count N] [--methods LIST]
                     [--budgets 0.5,0.25] [--plain] [--report] [-- EXTRA EVAL ARGS...]
  --methods: the driven one first. Default: fastgen-adaptive:observe=scores when MODEL.fgscore
  exists (then full,snapkv,tova,streamingllm,h2o,fastgen-adaptive), else fastgen-adaptive (then
  full,snapkv,tova,streamingllm,h2o)."""
import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from ruler import TASKS  # noqa: E402

PEERS = "full,snapkv,tova,streamingllm,h2o"


def main():
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--fastgen", default=os.environ.get("FASTGEN", os.path.join(HERE, "..", "build", "tools",
                                                                                  "fastgen")))
    ap.add_argument("--out", default="ruler-out")
    ap.add_argument("--split", choices=("dev", "test"), default="test")
    ap.add_argument("--form", choices=("turns", "prompt"), default="turns")
    ap.add_argument("--lengths", default="2048,4096,8192")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--count", type=int, default=5)
    ap.add_argument("--methods")
    ap.add_argument("--budgets", default="0.5,0.25")
    ap.add_argument("--plain", action="store_true", help="no ChatML (models without a chat template)")
    ap.add_argument("--report", action="store_true", help="the tables from --out's JSON only, no run")
    args = ap.parse_args(argv)
    tasks = args.tasks.split(",")
    for t in tasks:
        if t not in TASKS:
            ap.error(f"--tasks: {t} is not one of {', '.join(TASKS)}")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths takes comma-separated token counts: {args.lengths}")
    methods = args.methods
    if not methods:
        scored = os.path.exists(args.model + ".fgscore") and "--scorer" not in extra
        methods = ("fastgen-adaptive:observe=scores," + PEERS + ",fastgen-adaptive" if scored
                   else "fastgen-adaptive," + PEERS)
    os.makedirs(args.out, exist_ok=True)

    results = {}  # (length, task) -> the eval's JSON, or None: no prompt fitted the context
    for length in lengths:
        for task in tasks:
            stem = os.path.join(args.out, f"{args.split}-{args.form}-{length}-{task}")
            settings = {"model": os.path.abspath(args.model), "methods": methods, "budgets": args.budgets,
                        "count": args.count, "plain": args.plain, "extra": extra}
            done = os.path.exists(stem + ".json")
            if done and not args.report:  # made with these settings, or run again
                try:
                    done = json.load(open(stem + ".args.json")) == settings
                except (OSError, ValueError):
                    done = False
            if done:
                text = open(stem + ".json").read()
                results[(length, task)] = json.loads(text) if text.strip() else None
                continue
            if args.report:
                continue
            with open(stem + ".txt", "w") as f:
                subprocess.run([sys.executable, os.path.join(HERE, "ruler.py"), "--task", task, "--length",
                                str(length), "--split", args.split, "--form", args.form, "--count",
                                str(args.count)] + (["--plain"] if args.plain else []), stdout=f, check=True)
            cmd = [args.fastgen, "eval", "-m", args.model, "--passkey", stem + ".txt", "--methods", methods,
                   "--budgets", args.budgets, "-n", str(TASKS[task]), "--json", "-q"] + extra
            print(f"ruler_eval: {length} {task}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True)
            for line in r.stderr.splitlines():  # prompts that did not fit, the scorer's line
                print(f"  {line}", file=sys.stderr)
            if r.returncode != 0 and "no prompt fits the context" not in r.stderr:
                sys.exit(f"ruler_eval: {length} {task}: fastgen eval failed")
            with open(stem + ".json", "w") as f:
                f.write(r.stdout if r.returncode == 0 else "")
            with open(stem + ".args.json", "w") as f:
                json.dump(settings, f)
            results[(length, task)] = json.loads(r.stdout) if r.returncode == 0 else None
    if not results:
        sys.exit(f"ruler_eval: no results in {args.out}")
    report(results, lengths, tasks)


def runs(result):
    """{(budget, method): [(kept, score) per prompt that ran]} of one eval's JSON."""
    out = {}
    for point in result["points"]:
        for m in point["methods"]:
            # per prompt [kept, KL, top-1, agree, score]; kept 0: the prompt did not fit, no run
            out[(point["budget"], m["method"])] = [(pp[0], pp[4]) for pp in m["per_prompt"] if pp[0] > 0]
    return out


def report(results, lengths, tasks):
    """Per length and over them all: a row per (budget, method), the score of each task in %."""
    made = {k: runs(v) for k, v in results.items() if v}
    rows = []  # (budget, method) in the first run's order
    for r in made.values():
        rows += [k for k in r if k not in rows]
    for (length, task), v in sorted(results.items()):
        if v is None:
            print(f"\n{task} at {length} tokens: no prompt fitted the model's context")
    for scope in lengths + (["all"] if len(lengths) > 1 else []):
        keys = [(L, t) for L in (lengths if scope == "all" else [scope]) for t in tasks if (L, t) in made]
        if not keys:
            continue
        shown = [t for t in tasks if any(k[1] == t for k in keys)]
        title = f"{scope} tokens" if scope != "all" else f"all lengths ({', '.join(map(str, lengths))})"
        cases = [sum(max(len(made[k].get(row, [])) for row in rows) for k in keys if k[1] == t) for t in shown]
        print(f"\n### {title}: score in % (cases per task: {', '.join(map(str, cases))})\n")
        print("| budget | method | KV kept | " + " | ".join(shown) + " | average |")
        print("| --- " * (len(shown) + 4) + "|")
        for budget, method in rows:
            cells, kept = [], []
            for t in shown:
                got = [x for k in keys if k[1] == t for x in made[k].get((budget, method), [])]
                kept += [x[0] for x in got]
                cells.append(100.0 * sum(x[1] for x in got) / len(got) if got else math.nan)
            have = [c for c in cells if not math.isnan(c)]
            avg = f"**{sum(have) / len(have):.1f}**" + ("" if len(have) == len(cells) else " (of the tasks run)")
            print(f"| {budget:.2f} | {method} | {sum(kept) / max(1, len(kept)):.3f} | " +
                  " | ".join("-" if math.isnan(c) else f"{c:.1f}" for c in cells) + f" | {avg if have else '-'} |")


if __name__ == "__main__":
    main()
