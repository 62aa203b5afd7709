#!/usr/bin/env python3
"""Runs the RULER-style suite of scripts/ruler.py through `fastgen eval
--passkey` and prints kvpress' kind of table: a row per method and budget, a
column per task, the average last (the scores in %, the share of each
answer's references found).

Each (length, task) is one `fastgen eval` run: every method at the KV memory
the driven method (the first) kept on each prompt, `full` the full cache.
The files and the JSON of each run go to --out; --report reads them back
(a suite cut short is reported as far as it went, and resumed by running it
again: runs with a JSON already there are not repeated).

Usage: ruler_eval.py -m MODEL [--fastgen PATH] [--out DIR] [--split test] [--form turns|prompt]
                     [--lengths 2048,4096,8192] [--tasks single,...] [--count N] [--methods LIST]
                     [--budgets 0.5,0.25] [--report] [-- EXTRA EVAL ARGS...]
  --methods: the driven one first (default: fastgen-adaptive:observe=scores when MODEL.fgscore
  exists, else fastgen-adaptive), then full,fastgen-adaptive,snapkv,tova,streamingllm,h2o."""
import argparse
import json
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
    lengths = [int(x) for x in args.lengths.split(",")]
    methods = args.methods
    if not methods:
        scored = os.path.exists(args.model + ".fgscore") and "--scorer" not in extra
        driven = "fastgen-adaptive:observe=scores" if scored else "fastgen-adaptive"
        methods = driven + "," + PEERS + ("" if driven == "fastgen-adaptive" else ",fastgen-adaptive")
    os.makedirs(args.out, exist_ok=True)

    results = {}  # (length, task) -> the eval's JSON
    for length in lengths:
        for task in tasks:
            stem = os.path.join(args.out, f"{args.split}-{args.form}-{length}-{task}")
            if os.path.exists(stem + ".json"):
                results[(length, task)] = json.load(open(stem + ".json"))
                continue
            if args.report:
                continue
            with open(stem + ".txt", "w") as f:
                subprocess.run([sys.executable, os.path.join(HERE, "ruler.py"), "--task", task, "--length",
                                str(length), "--split", args.split, "--form", args.form, "--count",
                                str(args.count)] + (["--plain"] if args.plain else []),
                               stdout=f, stderr=subprocess.DEVNULL, check=True)
            cmd = [args.fastgen, "eval", "-m", args.model, "--passkey", stem + ".txt", "--methods", methods,
                   "--budgets", args.budgets, "-n", str(TASKS[task]), "--json", "-q"] + extra
            print(f"ruler_eval: {length} {task}: {' '.join(cmd)}", file=sys.stderr, flush=True)
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"ruler_eval: {length} {task}: fastgen eval failed: {r.stderr.strip()}")
            for line in r.stderr.splitlines():  # prompts that did not fit, the scorer's line
                print(f"  {line}", file=sys.stderr)
            with open(stem + ".json", "w") as f:
                f.write(r.stdout)
            results[(length, task)] = json.loads(r.stdout)
    if not results:
        sys.exit(f"ruler_eval: no results in {args.out}")
    report(results, lengths, tasks)


def report(results, lengths, tasks):
    """Per length and over them all: a row per (budget, method), the score of each task in %."""
    first = next(iter(results.values()))
    budgets = [p["budget"] for p in first["points"]]
    methods = [m["method"] for m in first["points"][0]["methods"]]
    for scope in lengths + ["all"]:
        keys = [(L, t) for L in (lengths if scope == "all" else [scope]) for t in tasks if (L, t) in results]
        if not keys:
            continue
        shown = [t for t in tasks if any(k[1] == t for k in keys)]
        title = f"{scope} tokens" if scope != "all" else f"all lengths ({', '.join(map(str, lengths))})"
        print(f"\n### {title}: score in % (cases per task: "
              f"{', '.join(str(sum(results[k]['prompts'] for k in keys if k[1] == t)) for t in shown)})\n")
        print("| budget | method | KV kept | " + " | ".join(shown) + " | average |")
        print("| --- " * (len(shown) + 4) + "|")
        for b, budget in enumerate(budgets):
            for m, method in enumerate(methods):
                cells, kept, n_kept = [], 0.0, 0
                for t in shown:
                    score, n = 0.0, 0
                    for k in keys:
                        if k[1] != t:
                            continue
                        rec = results[k]["points"][b]["methods"][m]
                        for pp in rec["per_prompt"]:  # [kept, KL, top-1, agree, score]
                            if pp[0] == 0:  # a prompt that did not fit the context: no run
                                continue
                            score += pp[4]
                            kept += pp[0]
                            n += 1
                            n_kept += 1
                    cells.append(100.0 * score / n if n else float("nan"))
                avg = sum(cells) / len(cells)
                print(f"| {budget:.2f} | {method} | {kept / max(1, n_kept):.3f} | " +
                      " | ".join(f"{c:.1f}" for c in cells) + f" | **{avg:.1f}** |")


if __name__ == "__main__":
    main()
