#!/usr/bin/env python3
"""The RULER-style suite (scripts/ruler.py) through llama.cpp with fastgen inside.

    python3 scripts/llama_cpp_ruler.py BIN_DIR MODEL.gguf [--lengths 2048] [--tasks single,...]
        [--count 3] [--split test] [--methods fastgen-adaptive,snapkv,...] [--budgets 0.5,0.25]
        [--json FILE]

BIN_DIR holds the llama-server that scripts/llama-cpp.sh built. For every
method and budget, one llama-server (-np 1) runs with `--kv-compress
METHOD:BUDGET[:options]` and answers each case at greedy; two rows more,
stock llama.cpp (`-fa on`, its best setting) and `--kv-compress full`, are
the references. A case scores as `fastgen eval --passkey` scores it: the share
of its references (KEY=A|B|C) the answer holds, ASCII letters in either case.

The form is ruler.py's `prompt` form (the question ends the prompt, which is
prefilled and compressed as one): llama-server turns down prompt caching
under --kv-compress, so a document compressed first and a question appended
after it (the `turns` form) is not a request the server can take. The chat
template is the model's own (the server's /apply-template; --template plain
for a base model such as Gemma 3 270M's, whose GGUF carries none), the answer's start
(ruler.py's "The access code for the boathouse is") appended after it, as
`fastgen eval --passkey` feeds it. Memory: each fastgen row reports the K/V
bytes the sequence held after the answer over a full cache of the same tokens
(/slots), the spread over the cases; every method keeps its share of the
prompt (the budget), so the rows are at matched memory by construction,
within what a method's rounding keeps.

Prints a table per length as scripts/ruler_eval.py does: a row per budget and
method, a column per task, and the average over the tasks. Stdlib only.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_cpp_check as lc  # noqa: E402
import ruler  # noqa: E402

NEEDLE_TASKS = "single,multikey,multivalue,multiquery"
METHODS = "fastgen-adaptive,fastgen-adaptive:observe=predicted,h2o,tova,snapkv,streamingllm"


def score(key, answer):
    """The share of KEY's '|'-separated references that answer holds (ASCII letters in either case)."""
    refs = key.split("|")
    low = answer.encode("ascii", "replace").decode().lower()
    return sum(r.lower() in low for r in refs) / len(refs)


def cases(task, length, split, count, seed):
    """ruler.py's cases in the prompt form (the ones it writes): (key, the user turn, the answer's start)."""
    return [(key, f"{intro}\n\n{doc}\n\n{q}", a)
            for intro, doc, ((key, q, a),) in ruler.cases(task, length, split, count, seed, "prompt")]


def spec_at(method, budget):
    """'snapkv' at 0.5 -> 'snapkv:0.5'; 'fastgen-adaptive:observe=predicted' -> 'fastgen-adaptive:0.5:observe=...'."""
    name, _, opts = method.partition(":")
    return f"{name}:{budget:g}" + (":" + opts if opts else "")


# --template: "model" asks the server for the GGUF's own chat template; "plain" is ruler.py --plain's text
# (the question, then the answer's start after a space), for a base model such as Gemma 3 270M's package
# (pretrained only, no template: llama-server would fall back to ChatML, which it was not trained on)
TEMPLATES = {"plain": "{} ",
             "gemma": "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n",
             "chatml": "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"}


def templated(s, template, user):
    if template != "model":
        return TEMPLATES[template].format(user)
    st, r = s.request("POST", "/apply-template", {"messages": [{"role": "user", "content": user}]})
    if st != 200:
        lc.fail("/apply-template: HTTP %d %s" % (st, str(r)[:300]))
    return r["prompt"]


def run_row(bindir, model, args, all_cases, ctx, template):
    """One server; every (length, task)'s cases through it. Returns {(length, task): [(score, held), ...]}."""
    s = lc.Server(bindir, model, "-np", "1", "-c", str(ctx), "-b", str(ctx), *args)
    out = {}
    try:
        for (length, task), cs in all_cases.items():
            res = []
            for key, user, start in cs:
                st, r = s.request("POST", "/completion", {
                    "prompt": templated(s, template, user) + start, "n_predict": ruler.TASKS[task], "temperature": 0,
                    "cache_prompt": False, "seed": 1})
                if st != 200:
                    lc.fail("/completion: HTTP %d %s" % (st, str(r)[:300]))
                held = None
                st, slots = s.get("/slots")
                if st == 200 and slots and "kv_bytes_held" in slots[0]:
                    held = slots[0]["kv_bytes_held"] / max(1, slots[0]["kv_bytes_full"])
                res.append((score(key, r["content"]), held))
            out[(length, task)] = res
    finally:
        s.stop()
    return out


def table(rows, length, tasks):
    head = "| budget | method | " + " | ".join(tasks) + " | average | K/V held (min-max) |"
    lines = [head, "|" + "---|" * (len(tasks) + 4)]
    for (budget, method), res in rows.items():
        cells = [100 * sum(x for x, _ in res[(length, t)]) / len(res[(length, t)]) for t in tasks]
        held = [h for t in tasks for _, h in res[(length, t)] if h is not None]
        mem = "%.3f (%.3f-%.3f)" % (sum(held) / len(held), min(held), max(held)) if held else "-"
        lines.append("| %s | %s | %s | %.1f | %s |" % (budget, method, " | ".join("%.1f" % c for c in cells),
                                                         sum(cells) / len(cells), mem))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bindir")
    ap.add_argument("model")
    ap.add_argument("--lengths", default="2048")
    ap.add_argument("--tasks", default=NEEDLE_TASKS, help="ruler.py's tasks, comma-separated (default: the needles)")
    ap.add_argument("--count", type=int, default=3)
    ap.add_argument("--split", choices=("dev", "test"), default="test")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--methods", default=METHODS, help="--kv-compress presets (options after colons)")
    ap.add_argument("--budgets", default="0.5,0.25")
    ap.add_argument("--threads", default=lc.THREADS)
    ap.add_argument("--template", choices=("model",) + tuple(TEMPLATES), default="model",
                    help="the chat template: the GGUF's own (the server's /apply-template) or one named here")
    ap.add_argument("--no-references", action="store_true",
                    help="only the methods' rows: not stock llama.cpp's and --kv-compress full's")
    ap.add_argument("--json", help="write every case's score and memory here")
    a = ap.parse_args()
    lc.THREADS = a.threads
    lengths = [int(x) for x in a.lengths.split(",")]
    tasks = a.tasks.split(",")
    for t in tasks:
        if t not in ruler.TASKS:
            ap.error("unknown task %r (ruler.py --list)" % t)
    budgets = [float(b) for b in a.budgets.split(",")]
    if any(not 0 < b <= 1 for b in budgets):
        ap.error("--budgets: each in (0, 1]")
    # the context: the longest prompt, the answer, and the template's margin
    ctx = max(lengths) + max(ruler.TASKS[t] for t in tasks) + 256
    all_cases = {(n, t): cases(t, n, a.split, a.count, a.seed) for n in lengths for t in tasks}
    rows = {}
    plan = [] if a.no_references else [("-", "stock -fa on", ["-fa", "on"]), ("-", "full", ["--kv-compress", "full"])]
    plan += [("%g" % b, m, ["--kv-compress", spec_at(m, b)]) for b in budgets for m in a.methods.split(",")]
    for budget, method, args in plan:
        t0 = time.time()
        rows[(budget, method)] = run_row(a.bindir, a.model, args, all_cases, ctx, a.template)
        print("# %s %s: %.0f s" % (budget, method, time.time() - t0), file=sys.stderr, flush=True)
    print("# llama.cpp with fastgen (%s), %s, ruler.py's prompt form, %s split, %d cases a task, greedy"
          % (a.bindir, os.path.basename(a.model), a.split, a.count))
    for n in lengths:
        print("\n## %d tokens\n" % n)
        print(table(rows, n, tasks))
    if a.json:
        with open(a.json, "w") as f:
            json.dump([{"budget": b, "method": m, "length": n, "task": t, "scores": [x for x, _ in r],
                        "held": [h for _, h in r]} for (b, m), res in rows.items() for (n, t), r in res.items()],
                      f, indent=1)


if __name__ == "__main__":
    main()
