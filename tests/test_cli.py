"""The fastgen CLI on the real model: usage manners, bad files, outputs.

usage: test_cli.py FASTGEN MODEL_DIR DATA_DIR
"""
import json
import os
import struct
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

FASTGEN, MODEL_DIR, DATA_DIR = sys.argv[1:4]
FASTGEN = os.path.abspath(FASTGEN)
MODEL = os.path.join(MODEL_DIR, "stories260K.bin")
TOK = os.path.join(MODEL_DIR, "tok512.bin")
REFERENCE = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
             "One day, she saw a big, red ball. She wanted to play with it, but it was too high.\nLily")
passed = failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print("FAILED:", what, file=sys.stderr)


# an empty model cache unless a test gives one: SmolLM2 fetched by the demo must not become these tests' model
EMPTY_CACHE = tempfile.mkdtemp()


def run(*args, env=None):
    return subprocess.run([FASTGEN, *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FASTGEN_CACHE": EMPTY_CACHE, **(env or {})})


def model_args():
    return ["-m", MODEL, "-z", TOK]


# --- manners: help, bad usage (exit 2, one line), no crash on any argument
check(run("--help").returncode == 0, "fastgen --help")
r = run()
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "no command: one line, exit 2: %r" % r.stderr)
r = run("frobnicate")
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "unknown command: one line, exit 2")
for cmd in ["generate", "profile", "eval", "demo"]:
    r = run(cmd, "--help")
    check(r.returncode == 0 and "usage: fastgen " + cmd in r.stdout, cmd + " --help")
bad_usage = [
    ["generate", "-n", "abc"], ["generate", "--policy", "bogus"], ["generate", "-T", "1.5"], ["generate", "-T", "0"],
    ["generate", "--bogus"], ["generate", "-m"], ["generate", "--dtype", "f8"], ["generate", "--top-p", "0"],
    ["generate", "--ratio-local", "-0.5"], ["profile", "-n", "-3"], ["eval", "--limit", "0"], ["eval", "--wat"],
    ["demo", "--layers", "0"], ["demo", "--heads", "32/5"], ["demo", "--dim", "8"], ["generate", "--csv"],
    ["generate", "-n", " 5"], ["generate", "-T", " 0.5"], ["generate", "-n", "99999999999999999999"],
]
for args in bad_usage:
    r = run(*args, *model_args())
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and lines[0].startswith("fastgen "),
          "bad usage %s: rc %d, stderr %r" % (args, r.returncode, r.stderr))

# --- bad files: a clear message, exit 1, no crash
with tempfile.TemporaryDirectory() as tmp:
    model_bytes = open(MODEL, "rb").read()
    tok_bytes = open(TOK, "rb").read()
    cases = {
        "truncated.bin": (model_bytes[:100000], TOK, "truncated"),
        "header.bin": (model_bytes[:4] + b"\x07\x00\x00\x00" + model_bytes[8:], TOK, "header"),
        "empty.bin": (b"", TOK, "header"),
    }
    for name, (data, tok, word) in cases.items():
        path = os.path.join(tmp, name)
        open(path, "wb").write(data)
        r = run("generate", "-m", path, "-z", tok)
        check(r.returncode == 1 and word in r.stderr, "%s: rc %d %r" % (name, r.returncode, r.stderr))
    short_tok = os.path.join(tmp, "short_tok.bin")
    open(short_tok, "wb").write(tok_bytes[:3000])
    r = run("generate", "-m", MODEL, "-z", short_tok)
    check(r.returncode == 1 and "entries" in r.stderr, "short tokenizer: %r" % r.stderr)
    r = run("generate", "-m", os.path.join(tmp, "missing.bin"), "-z", TOK)
    check(r.returncode == 1 and "missing.bin" in r.stderr, "missing model: %r" % r.stderr)
    r = run("generate", *model_args(), "-p", "x" * 2000)
    check(r.returncode == 1 and "longer than" in r.stderr, "prompt past the context: %r" % r.stderr)
    # a directory (or a device) where a file belongs: refused by the one file reader, never read
    for args in (["generate", "-m", tmp, "-z", TOK], ["generate", "-m", MODEL, "-z", tmp],
                 ["eval", *model_args(), "--prompts", tmp], ["generate", "-m", "/dev/zero", "-z", TOK]):
        r = run(*args)
        check(r.returncode == 1 and "not a file or a pipe" in r.stderr, "%s: rc %d %r" % (args, r.returncode, r.stderr))
    # a pipe is read to its end: process substitution, and - for standard input
    r = subprocess.run(["bash", "-c", '"$0" eval -m "$1" -z "$2" --prompts <(printf "Once upon a time\\n") -n 4', FASTGEN,
                        MODEL, TOK], capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "h2o" in r.stdout, "eval --prompts <(...): %r" % r.stderr)
    r = subprocess.run([FASTGEN, "eval", *model_args(), "--prompts", "-", "-n", "4"], input="Once upon a time\n",
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0 and "h2o" in r.stdout, "eval --prompts - (standard input): %r" % r.stderr)
    # a tokenizer with bytes after its entries
    long_tok = os.path.join(tmp, "long_tok.bin")
    open(long_tok, "wb").write(tok_bytes + b"\0\0\0\0")
    r = run("generate", "-m", MODEL, "-z", long_tok)
    check(r.returncode == 1 and "after its" in r.stderr, "tokenizer with trailing bytes: %r" % r.stderr)
    # prompt files with no prompt: an error, not a table of zeros
    for name, text in (("empty.txt", ""), ("blank.txt", "\n   \n\t\n\n"), ("comments.txt", "# one\n# two\n")):
        path = os.path.join(tmp, name)
        open(path, "w").write(text)
        r = run("eval", *model_args(), "--prompts", path, "-n", "4")
        check(r.returncode == 1 and "no prompt" in r.stderr and r.stdout == "",
              "%s: rc %d %r" % (name, r.returncode, r.stderr))
    # demo on a model whose context is shorter than the prompt, or just longer
    dim, hidden, layers, heads, kv_heads, vocab, seq_len = struct.unpack("<7i", model_bytes[:28])
    rope_bytes = 4 * seq_len * (dim // heads)  # the legacy RoPE tables close the file (shared classifier)
    for ctx_len, rc, word in ((4, 1, "context of 4"), (6, 0, "1 generated"), (40, 0, "KV cache")):
        d = os.path.join(tmp, "ctx%d" % ctx_len)
        os.mkdir(d)
        open(os.path.join(d, "stories260K.bin"), "wb").write(
            struct.pack("<7i", dim, hidden, layers, heads, kv_heads, vocab, ctx_len) +
            model_bytes[28:len(model_bytes) - rope_bytes] + model_bytes[-rope_bytes:][:4 * ctx_len * (dim // heads)])
        open(os.path.join(d, "tok512.bin"), "wb").write(tok_bytes)
        r = run("demo", env={"FASTGEN_MODEL": d})
        check(r.returncode == rc and word in r.stdout + r.stderr,
              "demo, context %d: rc %d\n%s%s" % (ctx_len, r.returncode, r.stdout[-300:], r.stderr))

    # --- generate
    r = run("generate", *model_args(), "--policy", "full", "-n", "60", "--json")
    out = json.loads(r.stdout) if r.returncode == 0 else {}
    for key in ["text", "tokens", "kv_bytes_held", "kv_bytes_full"]:
        check(key in out, "generate --json has " + key)
    check(out.get("text") == REFERENCE, "full-cache text is llama2.c's reference: %r" % out.get("text"))
    check(out.get("kv_bytes_held") == out.get("kv_bytes_full"), "full cache holds everything")
    r = run("generate", *model_args(), "-n", "100", "--json")
    out = json.loads(r.stdout)
    check(0 < out["kv_bytes_held"] < out["kv_bytes_full"], "FastGen holds less: %r" % out)
    a, b, c = (json.loads(run("generate", *model_args(), "--temp", "1.0", "--seed", s, "-n", "40", "--json").stdout)["text"]
               for s in ["5", "5", "6"])
    check(a == b and a != c, "top-p sampling is seeded")
    r = run("generate", *model_args(), "-n", "20", "--backend", "ref")
    check(r.returncode == 0 and "backend ref" in r.stdout, "--backend ref")
    r = run("generate", *model_args(), "--backend", "cuda")
    check(r.returncode == 1 and "cuda" in r.stderr, "unavailable backend: %r" % r.stderr)

    # --- profile
    svg = os.path.join(tmp, "profile.svg")
    r = run("profile", *model_args(), "--json", "--svg", svg)
    prof = json.loads(r.stdout)
    check(len(prof["layers"]) == 5 and all(len(l["heads"]) == 4 for l in prof["layers"]), "profile shape")
    for layer in prof["layers"]:
        for h in layer["heads"]:
            rec = h["recovery"]
            first = next((i for i, x in enumerate(rec) if x >= prof["threshold"] - 1e-6), len(rec) - 1)
            check(h["policy"] == prof["shortlist"][first], "head takes the first entry over T: %r" % h)
            check(abs(rec[-1] - 1.0) < 1e-6 and all(0 <= x <= 1 + 1e-6 for x in rec), "recoveries in [0, 1]")
            check(0 < h["kept"] <= h["length"], "kept rows")
    root = ET.parse(svg).getroot()
    check(root.tag.endswith("svg") and len(root.findall(".//{http://www.w3.org/2000/svg}rect")) >= 20,
          "profile SVG parses, with a cell per head")
    tips = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title") if "KV head" in (t.text or "")]
    texts = [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")]
    check(len(tips) == len(prof["layers"]) * len(prof["layers"][0]["heads"]) and
          all("recovery: special " in t and "keeps" in t for t in tips),
          "profile SVG: every head's tooltip has its policy and recoveries: %r" % tips[:1])
    check(any("stories260K.bin" in t and "T = 0.95" in t and "KV rows kept" in t for t in texts),
          "profile SVG: a title with the model, T and the memory kept")
    r = run("profile", *model_args(), "-n", "40")
    check(r.returncode == 0 and "policies per layer" in r.stdout, "profile table")

    # --- eval (small): json, csv, svg; no progress bar when stderr is not a terminal
    prompts = os.path.join(DATA_DIR, "..", "..", "tools", "prompts.txt")
    r = run("eval", *model_args(), "--prompts", prompts, "--limit", "2", "-n", "8", "--json")
    ev = json.loads(r.stdout)
    check(len(ev["results"]) == 15, "eval: 3 FastGen runs and 12 baselines")
    check(all(0 < x["kv_kept"] <= 1 and 0 <= x["top1"] <= 1 and x["kl_mean"] >= -1e-9 for x in ev["results"]),
          "eval figures in range")
    check(r.stderr == "", "no progress bar off a terminal: %r" % r.stderr)
    r = run("eval", *model_args(), "--prompts", prompts, "--limit", "1", "-n", "4", "--csv", "--svg",
            os.path.join(tmp, "eval.svg"))
    check(r.stdout.splitlines()[0].startswith("policy,") and len(r.stdout.splitlines()) == 16, "eval --csv")
    check(ET.parse(os.path.join(tmp, "eval.svg")).getroot().tag.endswith("svg"), "eval SVG parses")

    def chart_axes(path):
        """Per chart: (x label, x tick values, y tick values)."""
        ns = "{http://www.w3.org/2000/svg}"
        out = []
        for g in ET.parse(path).getroot().findall(ns + "g"):
            texts = g.findall(ns + "text")
            xs = [float(t.text) for t in texts if t.get("text-anchor") == "middle" and t.get("y") and
                  t.text.replace(".", "", 1).replace("-", "", 1).isdigit()]
            ys = [float(t.text) for t in texts if t.get("text-anchor") == "end" and
                  t.text.replace(".", "", 1).replace("-", "", 1).isdigit()]
            labels = [t.text for t in texts if t.get("text-anchor") == "middle" and not
                      t.text.replace(".", "", 1).replace("-", "", 1).isdigit()]
            out.append((labels[0] if labels else "", xs, ys))
        return out

    def round_ticks(v):
        steps = [round(b - a, 9) for a, b in zip(v, v[1:])]
        if len(v) < 3 or len(set(steps)) != 1:
            return False
        step = steps[0]
        mant = step / 10 ** __import__("math").floor(__import__("math").log10(step))
        return any(abs(mant - m) < 1e-6 for m in (1, 2, 5)) and all(abs(x / step - round(x / step)) < 1e-6 for x in v)

    axes = chart_axes(os.path.join(tmp, "eval.svg"))
    check(len(axes) == 2 and all(a[0] == "KV rows kept / full" and round_ticks(a[1]) and round_ticks(a[2]) and
                                 0 <= a[1][0] and a[1][-1] <= 1 for a in axes) and 0 <= axes[1][2][0] and
          axes[1][2][-1] <= 1, "eval SVG: KL and top-1 charts, round ticks, shares inside [0, 1]: %r" % axes)
    # --sweep: the driven method at 6 budgets, the others at its memory on each prompt, one chart per axis
    r = run("eval", *model_args(), "--prompts", prompts, "--limit", "2", "-n", "8", "--sweep", "--methods",
            "fastgen-adaptive:window=8:defer=8,h2o,tova", "--json", "--svg", os.path.join(tmp, "sweep.svg"))
    sw = json.loads(r.stdout) if r.returncode == 0 else {"points": []}
    pts = sw["points"]
    check(len(pts) == 6 and all([m["method"] for m in p["methods"]] == ["fastgen-adaptive:window=8:defer=8", "h2o",
                                                                          "tova"] for p in pts),
          "eval --sweep: 6 budgets x 3 methods: %r" % r.stderr)
    check(all(0 < m["kv_kept"] <= 1 and m["kl_mean"] >= -1e-9 and 0 <= m["top1"] <= 1 and len(m["per_prompt"]) == 2
              for p in pts for m in p["methods"]), "sweep fields in range")
    check(pts and pts[0]["methods"][0]["kv_kept"] < 0.6 and pts[-1]["methods"][0]["kv_kept"] > 0.8,
          "the driven method follows its budget")
    # (a fixed policy's rows move in steps of one per head and decode step: coarse on these short prompts)
    check(all(abs(m["per_prompt"][i][0] - p["methods"][0]["per_prompt"][i][0]) < 0.08
              for p in pts for m in p["methods"][1:2] for i in range(2)), "h2o at the driven method's memory per prompt")
    svg_root = ET.parse(os.path.join(tmp, "sweep.svg")).getroot()
    check(len(svg_root.findall("{http://www.w3.org/2000/svg}g")) == 2, "sweep SVG: two charts")
    axes = chart_axes(os.path.join(tmp, "sweep.svg"))
    check(all(a[0] == "KV rows kept / full" and round_ticks(a[1]) and a[1][-1] <= 1 for a in axes),
          "sweep SVG: the same memory axis, round ticks inside [0, 1]: %r" % axes)
    r = run("eval", *model_args(), "--prompts", prompts, "--sweep", "--methods", "fastgen-adaptive:window=8:bogus=1")
    check(r.returncode == 2 and "bogus" in r.stderr, "a method option it does not know is refused: %r" % r.stderr)
    r = run("eval", *model_args(), "--prompts", prompts, "--sweep", "--methods", "fastgen-adaptive,tova:alloc=adakv")
    check(r.returncode == 2 and "alloc=adakv" in r.stderr, "alloc takes shortlist or layer: %r" % r.stderr)
    r = run("generate", *model_args(), "--budget", "0.4", "-n", "60", "--json")
    bj = json.loads(r.stdout) if r.returncode == 0 else {}
    check(0 < bj.get("rows_kept", 0) <= 0.45 * bj.get("rows_full", 0), "--budget 0.4 keeps at most ~40%% of the rows: %r" % bj)
    # --chat: turns appended to one sequence; --samples: forks of one prompt, shared pages counted once
    chat = os.path.join(tmp, "chat.txt")
    open(chat, "w").write("Once upon a time, there was a dog.\n\nThe dog saw a ball.\n\n\nWhat did it do?\n")
    r = run("generate", *model_args(), "--chat", chat, "-n", "12", "--json", "--policy", "fastgen")
    cj = json.loads(r.stdout) if r.returncode == 0 else {}
    check([t["user"] for t in cj.get("turns", [])] == ["Once upon a time, there was a dog.", "The dog saw a ball.",
                                                        "What did it do?"] and all(t["reply"] for t in cj["turns"]),
          "--chat: three turns, each answered: %r" % r.stderr)
    check(0 < cj.get("kv_bytes_held", 0) <= cj.get("kv_bytes_full", 0), "--chat memory")
    r = run("generate", *model_args(), "--chat", chat, "-n", "12", "--json", "--append", "reprofile", "--policy",
            "fastgen")
    rj = json.loads(r.stdout) if r.returncode == 0 else {}
    check(len(rj.get("turns", [])) == 3 and rj["turns"][0] == cj["turns"][0],
          "--chat --append reprofile: three turns, the first as with keep: %r" % r.stderr)
    for bad in (["--append", "sometimes"], ["--append", "reprofile", "--budget", "0.5"]):
        r = run("generate", *model_args(), "--chat", chat, *bad)
        check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "bad usage %s: %r" % (bad, r.stderr))
    # --chat edge cases: no turn but blanks, a turn longer than the context (refused at once, with a reason),
    # more turns than fit (the ones that fit printed, "stopped" says why, exit 1)
    blank = os.path.join(tmp, "blank.txt")
    open(blank, "w").write("   \t \n\n  \n")
    r = run("generate", *model_args(), "--chat", blank)
    check(r.returncode == 1 and "holds no turn" in r.stderr, "--chat: spaces and tabs are no turn: %r" % r.stderr)
    huge = os.path.join(tmp, "huge.txt")
    open(huge, "w").write("word " * 200000)
    r = run("generate", *model_args(), "--chat", huge, "--json")
    hj = json.loads(r.stdout) if r.stdout.strip() else {}
    check(r.returncode == 1 and "turn 1 does not fit" in r.stderr and hj.get("turns") == [] and
          "turn 1" in (hj.get("stopped") or ""), "--chat: a 1 MB turn: %r %r" % (r.stdout, r.stderr))
    many = os.path.join(tmp, "many.txt")
    open(many, "w").write("\n\n".join("The dog ran to the big tree in the park." for _ in range(70)))
    r = run("generate", *model_args(), "--chat", many, "-n", "4", "--json")
    mj = json.loads(r.stdout) if r.stdout.strip() else {}
    check(r.returncode == 1 and 0 < len(mj.get("turns", [])) < 70 and "does not fit" in (mj.get("stopped") or "") and
          "stopped after" in r.stderr, "--chat: 70 turns stop where the context ends: %r" % r.stderr)
    check(cj.get("stopped", 1) is None, "--chat: stopped is null when every turn was answered")
    # --json is JSON for any bytes: ill-formed UTF-8 becomes U+FFFD
    r = run("generate", *model_args(), "-p", os.fsdecode(b"Hi \xff\xfe there \xc3"), "-n", "4", "--json")
    try:
        bj = json.loads(r.stdout)
    except ValueError:
        bj = {}
    check(r.returncode == 0 and bj.get("text", "").startswith("Hi \ufffd\ufffd there"),
          "--json with ill-formed UTF-8 in the prompt: %r" % r.stdout[:80])
    # eval --chat: keep against re-profile, teacher-forced on the full cache's replies
    convs = os.path.join(tmp, "convs.txt")
    open(convs, "w").write("Once upon a time, there was a little girl named Lily. She liked to play in the park."
                           "\n\nOne day, she saw a big dog near the tree.\n\nThe dog wanted her red ball.\n---\n"
                           "Tom had a small boat. He liked to sail it on the lake.\n\nThe wind was very strong that "
                           "day.\n")
    # (f32 rows: with f16 rows the first turns of the two modes differ in the sixth decimal, as they did
    # before f16 became the default; the modes' equality is checked where the arithmetic is exact)
    r = run("eval", *model_args(), "--chat", convs, "-n", "24", "--json", "--dtype", "f32")
    ej = json.loads(r.stdout) if r.returncode == 0 else {}
    res = ej.get("results", [])
    check(ej.get("conversations") == 2 and ej.get("turns") == 5 and len(res) == 6 and
          sorted({x["append"] for x in res}) == ["keep", "reprofile"] and
          all(0 < x["kv_kept"] <= 1 and x["kl_mean"] >= 0 and 0 <= x["top1"] <= 1 and x["steps"] > 0 for x in res),
          "eval --chat: six rows, both modes: %r" % r.stderr)
    by = {(x["T"], x["append"]): x for x in res}
    check(all(by[(t, "keep")]["kl_mean_turn1"] == by[(t, "reprofile")]["kl_mean_turn1"] for t in (0.9, 0.95, 0.98)),
          "eval --chat: the first turn is the same under both modes")
    check(any(by[(t, "keep")]["kv_kept"] != by[(t, "reprofile")]["kv_kept"] or
              by[(t, "keep")]["kl_mean"] != by[(t, "reprofile")]["kl_mean"] for t in (0.9, 0.95, 0.98)),
          "eval --chat: re-profiling changes the later turns")
    open(os.path.join(tmp, "empty_chat.txt"), "w").write("\n\n")
    r = run("generate", *model_args(), "--chat", os.path.join(tmp, "empty_chat.txt"))
    check(r.returncode == 1 and "no turn" in r.stderr, "--chat on an empty file: %r" % r.stderr)
    r = run("generate", *model_args(), "--samples", "3", "-n", "20", "--policy", "full", "--json", "-p",
            "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog.")
    sj = json.loads(r.stdout) if r.returncode == 0 else {}
    check(len(sj.get("samples", [])) == 3 and len(set(sj["samples"])) > 1, "--samples 3: three different samples")
    check(0 < sj.get("kv_bytes_held", 0) < sj.get("kv_bytes_alone", 0), "--samples: the prompt's pages are shared")
    r = run("generate", *model_args(), "--samples", "65")
    check(r.returncode == 2, "--samples past 64 is bad usage")
    # --prefill-chunk: a prompt of over 128 tokens in chunks of 64 (the cpu backend's row tiles) gives the
    # one-shot prefill's text and cache
    long_prompt = ("Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
                   "with her dog. " * 6)
    outs = []
    for extra in ([], ["--prefill-chunk", "64"]):
        r = run("generate", *model_args(), "-n", "30", "--json", "-p", long_prompt, *extra)
        outs.append(json.loads(r.stdout) if r.returncode == 0 else {})
    check(outs[0].get("n_prompt", 0) > 128 and outs[0].get("text") and
          all(outs[0].get(f) == outs[1].get(f) for f in ("text", "kv_bytes_held", "rows_kept")),
          "--prefill-chunk 64: the one-shot text and memory: %r / %r" % (outs[0].get("text"), outs[1].get("text")))
    r = run("generate", *model_args(), "--prefill-chunk", "0")
    check(r.returncode == 2, "--prefill-chunk 0 is bad usage")
    r = run("eval", *model_args(), "--prompts", os.path.join(tmp, "nope.txt"))
    check(r.returncode == 1 and "nope.txt" in r.stderr, "missing prompt file")

# --- --observe reconstruct: the prompt read again decides the adaptive mode's compression
prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her dog."
r = run("generate", *model_args(), "-p", prompt, "--policy", "fastgen-adaptive", "--budget", "0.25", "--observe",
        "reconstruct", "-n", "8", "--json")
out = json.loads(r.stdout) if r.returncode == 0 else {}
check(out.get("reconstruct_s", 0) > 0 and 0 < out.get("rows_kept", 0) <= 0.26 * out.get("rows_full", 0),
      "generate --observe reconstruct compresses within the budget and times its pass: %r" % (r.stderr or out))
r = run("generate", *model_args(), "-p", prompt, "--policy", "fastgen-adaptive", "--observe", "reconstruct", "-n", "4")
check(r.returncode == 0 and "reconstruct:" in r.stdout, "generate --observe reconstruct prints its time: %r" % r.stdout)
for bad in (["--policy", "h2o", "--observe", "reconstruct"], ["--observe", "again"],
            ["--policy", "fastgen-adaptive", "--observe", "reconstruct", "--samples", "2"]):
    r = run("generate", *model_args(), *bad)
    check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "generate %s refused: %r" % (bad, r.stderr))
with tempfile.TemporaryDirectory() as tmp:
    # --passkey's two forms: the number asked for in the prompt, or in a turn appended after the document
    story = "Lily had a red ball. " * 12
    one = os.path.join(tmp, "one.txt")
    two = os.path.join(tmp, "two.txt")
    open(one, "w").write("Lily\tOnce upon a time, %s The girl was called" % story + "\n")
    open(two, "w").write("Lily\tOnce upon a time, %s\t The girl was called" % story + "\n")
    for path in (one, two):
        r = run("eval", *model_args(), "--passkey", path, "--methods", "fastgen-adaptive:observe=reconstruct,h2o",
                "--budgets", "0.5", "-n", "4")
        check(r.returncode == 0 and "reconstruction passes" in r.stdout and "h2o" in r.stdout,
              "eval --passkey %s with observe=reconstruct: %r" % (os.path.basename(path), r.stderr))
    bad = os.path.join(tmp, "bad.txt")
    open(bad, "w").write("Lily\tdoc\tturn\nLily\tno turn here\n")
    r = run("eval", *model_args(), "--passkey", bad)
    check(r.returncode == 1 and "line 2" in r.stderr, "a passkey file mixing its forms: %r" % r.stderr)
    # several questions about one document, each asked of a fork of it: a space is in an answer of a
    # few words, "QQQ" in none, so a run answers half of them (or none, if it stops at once)
    many = os.path.join(tmp, "many.txt")
    open(many, "w").write(" \tOnce upon a time, %s\t The girl was called\tQQQ\t The boy was called\n" % story)
    r = run("eval", *model_args(), "--passkey", many, "--methods", "fastgen-adaptive:observe=reconstruct,h2o",
            "--budgets", "0.5", "-n", "6", "--json")
    shares = [m["per_prompt"][0][4] for m in json.loads(r.stdout)["points"][0]["methods"]] if r.returncode == 0 else []
    check(len(shares) == 2 and set(shares) <= {0.0, 0.5} and max(shares) == 0.5,
          "eval --passkey, two questions of one document: a run answers one: %r %r"
          % (shares, r.stderr))
    # a key of several references scores the share of them the answer holds, letters in either case: the
    # story's answer (" a small ball") holds "BALL" and not "QQQ"
    multi = os.path.join(tmp, "multi.txt")
    open(multi, "w").write("BALL|QQQ\tOnce upon a time, %s The girl was called\n" % story)
    r = run("eval", *model_args(), "--passkey", multi, "--methods", "fastgen-adaptive,h2o", "--budgets", "0.5",
            "-n", "6", "--json")
    shares = [m["per_prompt"][0][4] for m in json.loads(r.stdout)["points"][0]["methods"]] if r.returncode == 0 else []
    check(shares == [0.5, 0.5], "eval --passkey BALL|QQQ: half of the references found: %r %r" % (shares, r.stderr))
    for line in ("e\tdoc\tturn\tQQQ\n", "e\tdoc\tturn\t\tturn\n", "e\tdoc\tturn" + "\te\tturn" * 8 + "\n",
                 "|e\tdoc\n", "e|\tdoc\n", "e||f\tdoc\n", "e\tdoc\tturn\tf|\tturn\n"):
        open(bad, "w").write(line)
        r = run("eval", *model_args(), "--passkey", bad)
        check(r.returncode == 1 and "line 1" in r.stderr, "a passkey line %r refused: %r" % (line[:30], r.stderr))

# --- GGUF: the same text from the f32 file, its own tokenizer, fastgen info
GGUF = os.path.join(MODEL_DIR, "gguf")
r = run("generate", "-m", os.path.join(GGUF, "stories260K-f32.gguf"), "--policy", "full", "-n", "60", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["text"] == REFERENCE, "GGUF f32: llama2.c's text: %r" % r.stderr)
r = run("generate", "-m", os.path.join(GGUF, "babyllama105-q8_0.gguf"), "-n", "20")
check(r.returncode == 0 and "Once upon a time" in r.stdout, "GGUF q8_0 BabyLlama generates: %r" % r.stderr)
# q8_0 weights: 8-bit activations by default (ggml's products), f32 ones on request
q8_args = ("-m", os.path.join(GGUF, "babyllama105-q8_0.gguf"), "-n", "24", "--temp", "0", "--json")
by_default, q8, f32 = (run("generate", *q8_args, *more) for more in ((), ("--q8-activations",), ("--f32-activations",)))
check(all(x.returncode == 0 for x in (by_default, q8, f32)), "generate --q8/--f32-activations run: %r" % f32.stderr)
check(json.loads(by_default.stdout)["text"] == json.loads(q8.stdout)["text"], "8-bit activations are the default")
check(json.loads(f32.stdout)["text"].startswith("Once upon a time"), "--f32-activations generates")
r = run("generate", "-m", os.path.join(GGUF, "stories260K-f32.gguf"), "-z", TOK)
check(r.returncode == 2 and "carries its own tokenizer" in r.stderr, "-z with a GGUF model: %r" % r.stderr)
r = run("info", os.path.join(GGUF, "stories260K-q4_k_m.gguf"))
check(r.returncode == 0 and "q5_0" in r.stdout and "can run it" in r.stdout, "fastgen info: %r" % r.stdout)
r = run("info", os.path.join(GGUF, "quants.gguf"))
check(r.returncode == 1 and "cannot run it" in r.stdout, "fastgen info on quants.gguf: %r" % r.stdout)
r = run("info", MODEL)
check(r.returncode == 0 and "llama2.c" in r.stdout, "fastgen info on a .bin")
r = run("info")
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "fastgen info without a file")
r = run("demo", "-m", os.path.join(GGUF, "babyllama105-q4_k_m.gguf"))
check(r.returncode == 0 and "KV cache" in r.stdout and "babyllama105" in r.stdout, "demo -m FILE.gguf: %r" % r.stderr)

# --- llama.cpp's habits: -t threads, --temp, -f FILE, - for standard input
tmp_opts = tempfile.mkdtemp()
r = run("generate", *model_args(), "-t", "1", "-n", "24", "--json")
r2 = run("generate", *model_args(), "--threads", "2", "-n", "24", "--json")
check(r.returncode == 0 and r2.returncode == 0 and json.loads(r.stdout)["text"] == json.loads(r2.stdout)["text"],
      "-t 1 and --threads 2 give the same greedy text: %r %r" % (r.stderr, r2.stderr))
for args in (["-t", "0"], ["-t", "4.5"], ["--threads", "2000"]):
    r = run("generate", *model_args(), *args)
    check(r.returncode == 2 and "bad value for" in r.stderr, "generate %s is refused: %r" % (args, r.stderr))
hot = [json.loads(run("generate", *model_args(), "--temp", "1.5", "--seed", s, "-n", "24", "--json").stdout)["text"]
       for s in ("1", "2")]
check(hot[0] != hot[1], "--temp 1.5 samples: two seeds, two texts")
# llama.cpp's names: -s, --top-k, --n-predict, -c, -ctk/-ctv, -e, --repeat-penalty; --top-p alone samples
j = lambda *a: json.loads(run("generate", *model_args(), "--json", *a).stdout or "{}")
a1, a2 = j("-s", "5", "--top-k", "20", "--temp", "0.9", "-n", "16"), j("--seed", "5", "--top-k", "20", "--temp",
                                                                       "0.9", "--n-predict", "16")
check(a1.get("text") and a1.get("text") == a2.get("text"), "-s/--seed and -n/--n-predict mean the same")
g1 = j("-n", "16", "--top-k", "1", "--temp", "1.0")
check(g1.get("text") == j("-n", "16").get("text"), "--top-k 1 samples the greedy text")
r = run("generate", *model_args(), "--top-p", "0.5", "-n", "8")
check(r.returncode == 0 and "--temp 0.8" in r.stderr, "--top-p alone samples at llama.cpp's 0.8: %r" % r.stderr)
r = run("generate", *model_args(), "-n", "8")
check(r.returncode == 0 and "prompt eval:" in r.stdout and "tokens per second" in r.stdout and
      "KV cache of a full context" in r.stderr, "llama-cli's timing and KV lines: %r %r" % (r.stdout[-300:], r.stderr))
c1 = j("-c", "20", "-n", "100")
check(c1.get("n_prompt", 0) + c1.get("n_generated", 99) <= 20, "-c 20 holds 20 positions: %r" % c1)
q1, q2 = j("-ctk", "q8_0", "-ctv", "q8_0", "-n", "12"), j("--dtype", "q8_0", "-n", "12")
check(q1.get("text") and q1.get("text") == q2.get("text"), "-ctk q8_0 -ctv q8_0 is --dtype q8_0")
e1 = j("-e", "-p", "Once upon\\na time", "-n", "1")
check(e1.get("text", "").startswith("Once upon\na time"), "-e turns \\n into a newline: %r" % e1.get("text"))
rp = j("--repeat-penalty", "1.5", "-n", "40")
check(rp.get("text") and rp.get("text") != j("-n", "40").get("text"), "--repeat-penalty changes the greedy text")
r = run("bench", *model_args(), "-p", "40", "-n", "8", "-d", "40,60", "-r", "1", "--json")
bj = json.loads(r.stdout) if r.returncode == 0 else {}
rows = bj.get("rows", [])
check(len(rows) == 9 and [x["test"] for x in rows[::3]] == ["pp40", "tg8 @ d40", "tg8 @ d60"] and
      all(x["vs_full"] == 1.0 and x["kv_kept"] == 1.0 for x in rows[::3]) and
      all(0 < x["kv_kept"] < 1 and x["tokens_per_s"] > 0 for x in rows if x["method"] != "full"),
      "bench: pp and tg rows, full first, compression holding less: %r %r" % (rows[:2], r.stderr))
tg = [x for x in rows if x["test"].startswith("tg")]
pr = bj.get("probes", {})
check(all(pr.get(k, 0) > 0 for k in ("read_bandwidth_gbs", "i8_gmacs", "fma_gmacs", "f16_widen_g")) and
      bj.get("weights_read_bytes", 0) > 0, "bench: the roofline's probes: %r" % pr)
def phases_ok(x):
    ph = x.get("phases", [])
    return ([p["phase"] for p in ph] == ["weights", "attention", "rest"] and
            all(abs(p["floor_us"] - max(p["bytes_us"], p["ops_us"])) < 1e-3 for p in ph) and
            abs(1e6 / x["roofline_tokens_per_s"] - sum(p["floor_us"] for p in ph)) < 1e-2 * (1e6 / x["roofline_tokens_per_s"]) and
            ph[0]["measured_us"] > 0 and ph[1]["measured_us"] > 0 and
            0.3 < sum(p["measured_us"] for p in ph) / (1e6 / x["tokens_per_s"]) <= 1.01)
check(all(x.get("roofline_tokens_per_s", 0) > 0 and abs(x["of_roofline"] - x["tokens_per_s"] / x["roofline_tokens_per_s"]) < 1e-3
          and phases_ok(x) for x in rows) and
      all(x["phases"][0]["bytes_us"] == 0 for x in rows if x["test"].startswith("pp")) and
      all(x["kv_bytes"] < tg[0]["kv_bytes"] and x["roofline_tokens_per_s"] > tg[0]["roofline_tokens_per_s"] and
          x["phases"][1]["floor_us"] < tg[0]["phases"][1]["floor_us"] for x in tg[1:3]),
      "bench: each row's roofline, phase by phase, beside the time measured in each: %r" % rows[:2])
r = run("bench", *model_args(), "-p", "16", "-n", "4", "-d", "8", "-r", "1")
check(r.returncode == 0 and "| full |" in r.stdout and "vs full" in r.stdout, "bench's table: %r" % r.stdout[:300])
for bad in (["--methods", "h2o"], ["--methods", "full,h2o:0.5:bogus=1"], ["-p", "0", "-n", "0"], ["-d", "1,2,x"], ["-d", "0"],
            ["--n-predict", "-1"]):
    r = run("bench", *model_args(), *bad)
    check(r.returncode == 2, "bench %s is refused: %r" % (bad, r.stderr))
prompt_file = os.path.join(tmp_opts, "prompt.txt")
open(prompt_file, "w").write("Once upon a time, there was a dog")
by_p = json.loads(run("generate", *model_args(), "-p", "Once upon a time, there was a dog", "-n", "16",
                      "--json").stdout)
r = run("generate", *model_args(), "-f", prompt_file, "-n", "16", "--json")
check(r.returncode == 0 and json.loads(r.stdout)["tokens"] == by_p["tokens"], "generate -f FILE: %r" % r.stderr)
r = subprocess.run([FASTGEN, "generate", *model_args(), "-f", "-", "-n", "16", "--json"], capture_output=True,
                   text=True, input="Once upon a time, there was a dog")
check(r.returncode == 0 and json.loads(r.stdout)["tokens"] == by_p["tokens"], "generate -f - reads stdin: %r" % r.stderr)
r = run("generate", *model_args(), "-p", "x", "-f", prompt_file)
check(r.returncode == 2 and "pass one" in r.stderr, "-p and -f together are refused: %r" % r.stderr)
ids_file = os.path.join(tmp_opts, "ids.txt")
open(ids_file, "w").write(" ".join(str(t) for t in by_p["tokens"][:by_p["n_prompt"]]))
r = run("profile", *model_args(), "--prompt-ids", ids_file, "-n", "8", "--json")
pj = json.loads(r.stdout) if r.returncode == 0 else {}
check(pj.get("prompt_tokens") == by_p["n_prompt"] and pj.get("generated_tokens") == 8,
      "profile --prompt-ids FILE: %r" % r.stderr)
r = run("profile", *model_args(), "-f", prompt_file, "-n", "8")
check(r.returncode == 0 and "and 8 generated greedily" in r.stdout.splitlines()[0],
      "profile's header says it profiles generated tokens: %r" % r.stdout[:200])
r = run("profile", *model_args(), "-f", prompt_file, "-n", "0")
check(r.returncode == 0 and r.stdout.startswith("profile of the prompt's"), "profile -n 0: the prompt alone")
# eval reads its prompts from a pipe (the README's `--prompts <(...)`) and finds its default set from anywhere
r = subprocess.run([FASTGEN, "eval", *model_args(), "--prompts", "-", "-n", "4", "--json"], capture_output=True,
                   text=True, input="Once upon a time\nThe cat sat\n")
check(r.returncode == 0 and json.loads(r.stdout).get("prompts") == 2, "eval --prompts - (a pipe): %r" % r.stderr)
r = subprocess.run([FASTGEN, "eval", *model_args(), "--limit", "1", "-n", "4", "--json"], capture_output=True,
                   text=True, cwd=tmp_opts)
check(r.returncode == 0 and json.loads(r.stdout).get("prompts") == 1,
      "eval from another directory runs its built-in prompts: %r" % r.stderr)
# tokenize: pieces beside ids, --ids alone
r = run("tokenize", *model_args(), "-p", "Once upon a time")
ri = run("tokenize", *model_args(), "-p", "Once upon a time", "--ids")
lines = r.stdout.strip().splitlines()
check(r.returncode == 0 and len(lines) == len(ri.stdout.split()) and "-> ' Once'" in lines[0] and
      [int(x.split("->")[0]) for x in lines] == [int(x) for x in ri.stdout.split()],
      "tokenize: id -> 'piece' a line, --ids the ids: %r %r" % (r.stdout, ri.stdout))
# f16 rows by default, as llama.cpp's cache
d16 = json.loads(run("generate", *model_args(), "-n", "8", "--json").stdout)
d32 = json.loads(run("generate", *model_args(), "-n", "8", "--json", "--dtype", "f32").stdout)
check(d32["kv_bytes_full"] == 2 * d16["kv_bytes_full"], "--dtype defaults to f16: %d vs %d bytes" %
      (d16["kv_bytes_full"], d32["kv_bytes_full"]))
# q8_0 / q4_0 rows: the bytes of ggml's blocks (stories260K: d = 8, one scale per 8 values)
for name, row in (("q8_0", 2 + 8), ("q4_0", 2 + 4)):
    r = run("generate", *model_args(), "-n", "8", "--json", "--dtype", name)
    dq = json.loads(r.stdout) if r.returncode == 0 else {"kv_bytes_full": -1, "rows_full": 0}
    check(dq["kv_bytes_full"] * 16 == d16["kv_bytes_full"] * row and dq["rows_full"] == d16["rows_full"],
          "--dtype %s holds %d bytes a row against f16's 16: %r" % (name, row, dq))
    r = run("generate", *model_args(), "-n", "8", "--dtype", name)
    check(r.returncode == 0 and ("stored as %s" % name) in r.stdout and "of an f16 full cache" in r.stdout,
          "generate --dtype %s reports the bytes against f16's: %r" % (name, r.stdout[-300:]))
# K and V apart (llama.cpp's -ctk / -ctv): each row in its own blocks, on ref and cpu alike
r = run("generate", *model_args(), "-n", "8", "--json", "-ctk", "q8_0", "-ctv", "f16")
dm = json.loads(r.stdout) if r.returncode == 0 else {"kv_bytes_full": -1, "rows_full": 0}
check(dm["kv_bytes_full"] * 32 == d16["kv_bytes_full"] * (10 + 16) and dm["rows_full"] == d16["rows_full"],
      "-ctk q8_0 -ctv f16 holds 10 + 16 bytes a row pair against f16's 32: %r" % dm)
texts = []
for backend in ("ref", "cpu"):
    r = run("generate", *model_args(), "-n", "12", "-ctk", "q4_0", "-ctv", "f16", "--backend", backend)
    texts.append(r.stdout.split("\n")[0] if r.returncode == 0 else None)
    check(r.returncode == 0 and "stored as K q4_0, V f16" in r.stdout, "-ctk q4_0 -ctv f16 on %s: %r %r" %
          (backend, r.stdout[-300:], r.stderr[-300:]))
check(texts[0] and texts[0] == texts[1], "K q4_0 and V f16: ref and cpu write the same text: %r" % texts)
r = run("eval", *model_args(), "--dtypes", "f16,q8_0")
check(r.returncode == 2 and "--dtypes" in r.stderr, "--dtypes without --sweep is refused: %r" % r.stderr)
r = run("eval", *model_args(), "--sweep", "--dtypes", "f16,q5_0", "--limit", "1")
check(r.returncode == 2 and "q5_0" in r.stderr, "--dtypes with an unknown dtype is refused: %r" % r.stderr)
r = run("eval", *model_args(), "--sweep", "--dtypes", "f16,q8_0,q4_0", "--budgets", "0.5", "--limit", "2", "-n", "16",
        "--methods", "fastgen-adaptive,h2o", "--json")
ok = r.returncode == 0
js = json.loads(r.stdout) if ok else {}
dts = js.get("dtypes", [])
check(ok and [d["dtype"] for d in dts] == ["f16", "q8_0", "q4_0"] and js.get("reference_dtype") == "f16" and
      abs(dts[1]["bytes_per_row"] - 10 / 16) < 1e-6 and
      all(abs(m["kv_bytes"] - m["kv_kept"] * d["bytes_per_row"]) < 1e-3 for d in dts for p in d["points"]
          for m in p["methods"]),
      "eval --sweep --dtypes: one block per dtype, bytes against f16's: %r" % r.stdout[:400])
# a tokenizer that does not fit: which file was tried, and -z
r = run("generate", "-m", os.path.join(MODEL_DIR, "babyllama105.bin"), "-n", "4")
check(r.returncode == 1 and "tok512.bin" in r.stderr and "-z" in r.stderr, "a default tokenizer that does not fit "
      "says which file it tried and that -z picks another: %r" % r.stderr)

# --- no option is silently ignored: each command refuses (exit 2, one line) what it would not use
refused = [
    (["eval", "-T", "0.5"], "-T is not an option of eval"),
    (["eval", "--policy", "h2o"], "--policy is not an option of eval"),
    (["eval", "--ratio-local", "0.01"], "--ratio-local is not an option of eval"),
    (["eval", "--temp", "1"], "--temp is not an option of eval"),
    (["eval", "--csv", "--json"], "pass one"),
    (["eval", "--chat", prompt_file, "--prompts", prompt_file], "--prompts does not go with it"),
    (["eval", "--chat", prompt_file, "--svg", "x.svg"], "--svg does not go with it"),
    (["eval", "--sweep", "--csv"], "--csv"),
    (["generate", "--samples", "3", "--temp", "0"], "copies of the greedy text"),
    (["generate", "--temp", "0", "--top-p", "0.5"], "--temp 0 is greedy"),
    (["generate", "--temp", "0", "-s", "3"], "--temp 0 is greedy"),
    (["generate", "-cnv"], "--chat FILE"),
    (["generate", "--repeat-last-n", "8"], "off without it"),
    (["eval", "--n-predict", "-1"], "generate's"),
    (["generate", "-ngl", "99"], "--backend cuda"),
    (["generate", "-fa"], "nothing to turn on"),
    (["generate", "-b", "512"], "--prefill-chunk"),
    (["generate", "--dtype", "q8_0", "-ctk", "q4_0"], "pass one or the other"),
    (["eval", "--sweep", "--dtypes", "f16,q8_0", "-ctk", "q8_0"], "do not go with it"),
    (["eval", "-c", "512"], "-c is not an option of eval"),
    (["generate", "--chat", prompt_file, "--repeat-penalty", "1.1"], "plain generate"),
    (["generate", "--svg", "x.svg"], "--svg is not an option of generate"),
    (["tokenize", "-q"], "-q is not an option of tokenize"),
    (["generate", "--append", "keep"], "it needs --chat"),
    (["generate", "--chat", prompt_file, "-p", "hi"], "-p, -f and --prompt-ids do not go with it"),
    (["profile", "--temp", "0.5"], "--temp is not an option of profile"),
    (["generate", "--policy", "h2o", "-T", "0.5"], "does not choose that way"),
    (["generate", "--budget", "0.5", "-T", "0.9"], "does not choose that way"),
    (["generate", "--policy", "fastgen-adaptive", "-T", "0.9"], "does not choose that way"),
    (["generate", "--policy", "full", "--ratio-local", "0.1"], "has none"),
    (["generate", "--policy", "local", "--ratio-frequent", "0.1"], "keeps none"),
    (["generate", "--policy", "tova", "--ratio-local", "0.1"], "has none"),
    (["generate", "--samples", "2", "--ignore-eos"], "do not go with it"),
    (["profile", "--csv"], "--csv is not an option of profile"),
    (["tokenize", "--policy", "h2o"], "--policy is not an option of tokenize"),
    (["tokenize", "-n", "3"], "-n is not an option of tokenize"),
]
for args, why in refused:
    r = run(*args, *model_args())
    lines = r.stderr.strip().splitlines()
    check(r.returncode == 2 and len(lines) == 1 and why in lines[0], "refused %s: rc %d, %r" % (args, r.returncode,
                                                                                                r.stderr))
# progress on a terminal only: a line that updates (prefill, eval), none with -q or into a pipe
def on_tty(*args):
    import pty
    master, slave = pty.openpty()
    p = subprocess.run([FASTGEN, *args], stdout=subprocess.DEVNULL, stderr=slave, timeout=300)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.returncode, b"".join(chunks).decode("utf-8", "replace")


rc, err = on_tty("generate", *model_args(), "-f", prompt_file, "-n", "4")
check(rc == 0 and "\r  prefill" in err and "100%" not in err, "generate on a terminal: prefill progress %r" % err[:200])
rc, err = on_tty("generate", *model_args(), "-f", prompt_file, "-n", "4", "-q")
check(rc == 0 and "prefill" not in err, "generate -q: no progress %r" % err[:200])
r = run("generate", *model_args(), "-f", prompt_file, "-n", "4")
check(r.returncode == 0 and "prefill" not in r.stderr, "generate into a pipe: no progress %r" % r.stderr[:200])
rc, err = on_tty("eval", *model_args(), "--limit", "2", "-n", "4")
check(rc == 0 and "2/2 prompts" in err, "eval on a terminal: its progress bar %r" % err[:300])

# eval --chat --limit: the first K conversations
convs2 = os.path.join(tmp_opts, "convs.txt")
open(convs2, "w").write("Lily liked the park.\n\nShe saw a dog.\n---\nTom had a boat.\n\nThe wind was strong.\n")
r = run("eval", *model_args(), "--chat", convs2, "--limit", "1", "-n", "8", "--json")
check(r.returncode == 0 and json.loads(r.stdout).get("conversations") == 1, "eval --chat --limit 1: %r" % r.stderr)
# --help lists --dtype, -t and --q8-activations where they work
for cmd in ("generate", "profile", "eval"):
    h = run(cmd, "--help").stdout
    check("--dtype" in h and "--threads" in h and "--q8-activations" in h and "--f32-activations" in h,
          cmd + " --help lists --dtype, -t, --q8-activations, --f32-activations")
# demo on a model that adds no BOS keeps the prompt's first word
nobos = os.path.join(tmp_opts, "nobos.gguf")
blob = bytearray(open(os.path.join(GGUF, "stories260K-f32.gguf"), "rb").read())
at = blob.find(b"tokenizer.ggml.add_bos_token") + len(b"tokenizer.ggml.add_bos_token")
check(blob[at:at + 5] == b"\x07\x00\x00\x00\x01", "the test GGUF says add_bos_token = true")
blob[at + 4] = 0
open(nobos, "wb").write(blob)
r = run("demo", "-m", nobos, "--svg", os.path.join(tmp_opts, "nobos.svg"))
out = r.stdout.split("full cache:\n", 1)
check(r.returncode == 0 and len(out) == 2 and out[1].startswith("  Once upon a time"),
      "demo -m MODEL without BOS keeps the first word: %r" % r.stdout[:400])
shutil.rmtree(tmp_opts)

# --- demo: the real model when found, else the synthetic workload
r = run("demo", env={"FASTGEN_MODEL": MODEL_DIR})
check(r.returncode == 0 and "stories260K" in r.stdout and "KV cache" in r.stdout, "demo with the model")
tmp_root = tempfile.mkdtemp()
cache = os.path.join(tmp_root, "cache")
os.mkdir(cache)
os.symlink(os.path.abspath(os.path.join(GGUF, "babyllama105-q8_0.gguf")),
           os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf"))
r = run("demo", "--svg", os.path.join(tmp_root, "demo.svg"), env={"FASTGEN_CACHE": cache, "FASTGEN_MODEL": ""})
check(r.returncode == 0 and "SmolLM2-135M-Instruct.Q4_1.gguf" in r.stdout and "FastGen adaptive" in r.stdout and
      "policy of every KV head" in r.stdout, "demo finds the model in the cache: %r" % r.stderr)
check(ET.parse(os.path.join(tmp_root, "demo.svg")).getroot().tag.endswith("svg"), "demo --svg: the policy map")
r = run("demo", "-m", MODEL, "--layers", "2")
check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, "demo -m with a synthetic option: %r" % r.stderr)
r = run("demo", "--synthetic", "--prompt", "128", "--steps", "8", "--layers", "1")
check(r.returncode == 0 and "agreement" in r.stdout, "synthetic demo")

shutil.rmtree(tmp_root)

# --- issue 38: the sweep's options as strict as the others, writers that escape, no text dropped
tmp_strict = tempfile.mkdtemp()
prompts1 = os.path.join(tmp_strict, "p.txt")
open(prompts1, "w").write("Once upon a time, there was a cat.\n")
strict_bad = [
    "fastgen-adaptive:families=" + "0" * 200, "fastgen-adaptive:families=" + "0" * 9,
    "fastgen-adaptive:window=64abc", "fastgen-adaptive:floor=0.5junk", "fastgen-adaptive:window=4294967360",
    "fastgen-adaptive:window= 8", "fastgen-adaptive:flags=" + "mass+" * 60 + "mass",
    "fastgen-adaptive:" + ":".join(["window=8"] * 40),
]
for m in strict_bad:
    r = run("eval", *model_args(), "--prompts", prompts1, "-n", "4", "--sweep", "--methods", m)
    check(r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1,
          "--methods %s...: rc %d, %r" % (m[:40], r.returncode, r.stderr[-200:]))
for budgets in ["0.5," * 200 + "0.5", "0.5junk", "0", " 0.5"]:
    r = run("eval", *model_args(), "--prompts", prompts1, "-n", "4", "--sweep", "--budgets", budgets)
    check(r.returncode == 2, "--budgets %r...: rc %d" % (budgets[:20], r.returncode))
# a model file name full of what JSON and XML must escape, in --json and in profile --svg's subtitle
odd_model = os.path.join(tmp_strict, os.fsdecode(b"m \"<&'\x01\x7f\xff\xc3.bin"))
shutil.copy(MODEL, odd_model)
r = run("eval", "-m", odd_model, "-z", TOK, "--prompts", prompts1, "-n", "4", "--sweep", "--budgets", "0.5",
        "--methods", "fastgen-adaptive:window=8:defer=8,h2o", "--json", "--svg", os.path.join(tmp_strict, "s.svg"))
try:
    sj = json.loads(r.stdout)
except ValueError:
    sj = {}
check(r.returncode == 0 and sj.get("driven") == "fastgen-adaptive:window=8:defer=8" and
      "\ufffd" in sj.get("model", ""), "eval --sweep --json with an odd model path: %r" % r.stdout[:200])
for svg in [os.path.join(tmp_strict, "s.svg"), os.path.join(tmp_strict, "p.svg")]:
    if svg.endswith("p.svg"):
        run("profile", "-m", odd_model, "-z", TOK, "--svg", svg)
    try:
        ok = ET.parse(svg).getroot().tag.endswith("svg")
    except (ET.ParseError, OSError) as e:
        ok = False
        print(e, file=sys.stderr)
    check(ok, "%s is well-formed XML with an odd model path" % os.path.basename(svg))
# a NUL byte drops nothing silently: refused
nul = os.path.join(tmp_strict, "nul.txt")
open(nul, "wb").write(b"Once upon a time.\n\x00\nThe dog ran.\n")
for args in [["eval", "--prompts", nul, "-n", "4", "--limit", "2"], ["eval", "--passkey", nul, "-n", "4"],
             ["eval", "--chat", nul, "-n", "4"], ["generate", "--chat", nul, "-n", "4"], ["generate", "-f", nul]]:
    r = run(*args, *model_args())
    check(r.returncode == 1 and "NUL byte" in r.stderr, "%s with a NUL byte: rc %d %r" % (args[:2], r.returncode,
                                                                                       r.stderr[-200:]))
# eval --chat: a conversation ends at a line that is "---", and at nothing else
convs2 = os.path.join(tmp_strict, "convs2.txt")
open(convs2, "w").write("---\nOnce upon a time, there was a cat.\n\nThe cat sat\n-----\non a mat.\n--- \r\n"
                        "Tom had a boat.\n\nThe wind was strong.\n---\n")
r = run("eval", *model_args(), "--chat", convs2, "-n", "4", "--json", "--dtype", "f32")
ej = json.loads(r.stdout) if r.returncode == 0 else {}
check(ej.get("conversations") == 2 and ej.get("turns") == 4,
      "eval --chat: two conversations of two turns each: %r %r" % (r.stdout[:120], r.stderr[-200:]))
shutil.rmtree(tmp_strict)

# the model the demo fetched is every command's default after $FASTGEN_MODEL, and the line says so
tmp_cache = tempfile.mkdtemp()
os.symlink(os.path.abspath(os.path.join(GGUF, "babyllama105-q8_0.gguf")), os.path.join(tmp_cache, "SmolLM2-135M-Instruct.Q4_1.gguf"))
r = run("generate", "-p", "Once upon a time", "-n", "4", env={"FASTGEN_CACHE": tmp_cache, "FASTGEN_MODEL": ""})
check(r.returncode == 0 and "SmolLM2-135M-Instruct.Q4_1.gguf (from the cache" in r.stderr,
      "generate finds the cached model and names it: %r" % r.stderr[-300:])
r = run("generate", "-p", "Once upon a time", "-n", "4", env={"FASTGEN_CACHE": tmp_cache, "FASTGEN_MODEL": MODEL})
check(r.returncode == 0 and "stories260K.bin (from $FASTGEN_MODEL" in r.stderr, "$FASTGEN_MODEL first: %r" % r.stderr)
shutil.rmtree(tmp_cache)
# calibrate: a key scorer for observe=scores, found beside the model, refused where it does not fit
tmp_sc = tempfile.mkdtemp()
scorer = os.path.join(tmp_sc, "s.fgscore")
r = run("calibrate", *model_args(), "--text", os.path.join(DATA_DIR, "long-prompts.txt"), "--chunk", "128",
        "--max-tokens", "512", "-o", scorer, "-t", "1", "-q")
check(r.returncode == 0 and os.path.getsize(scorer) == 8 + 16 + 5 * 4 * 65 * 4 and "held-out chunk" in r.stdout,
      "calibrate writes a scorer of 5 layers x 4 KV heads x 65 weights: %r %r" % (r.stdout, r.stderr[-300:]))
overlap = float(r.stdout.split("top 25 %: ")[1].split()[0]) if "top 25 %: " in r.stdout else 0.0
check(overlap > 0.35, "the scorer finds the reconstruction's top keys better than chance (0.25): %r" % r.stdout)
r = run("calibrate", *model_args())
check(r.returncode == 2 and "--text" in r.stderr, "calibrate without a text: %r" % r.stderr)
prompt = "Once upon a time there was a girl who liked to play in the park with her dog and her cat."
r = run("generate", *model_args(), "--policy", "fastgen-adaptive", "--observe", "scores", "--scorer", scorer,
        "-n", "8", "-p", prompt)
check(r.returncode == 0 and "rows kept" in r.stdout, "generate --observe scores: %r" % r.stderr[-300:])
r = run("generate", *model_args(), "--policy", "fastgen-adaptive", "--observe", "scores", "-n", "8", "-p", prompt)
check(r.returncode == 1 and "calibrated scorer" in r.stderr, "observe=scores with no scorer: %r" % r.stderr[-300:])
shutil.copy(MODEL, os.path.join(tmp_sc, "m.bin"))
shutil.copy(scorer, os.path.join(tmp_sc, "m.bin.fgscore"))
r = run("generate", "-m", os.path.join(tmp_sc, "m.bin"), "-z", TOK, "--policy", "fastgen-adaptive", "--observe", "scores",
        "-n", "8", "-p", prompt)
check(r.returncode == 0, "MODEL.fgscore found beside the model: %r" % r.stderr[-300:])
r = run("generate", "-m", os.path.join(tmp_sc, "m.bin"), "-z", TOK, "--scorer", "none", "--policy",
        "fastgen-adaptive", "--observe", "scores", "-n", "8", "-p", prompt)
check(r.returncode == 1 and "calibrated scorer" in r.stderr, "--scorer none: %r" % r.stderr[-300:])
sc_bytes = open(scorer, "rb").read()
for name, data, word in [("short", sc_bytes[:20], "FGSCORE1"), ("cut", sc_bytes[:-4], "bytes where"),
                         ("magic", b"X" + sc_bytes[1:], "FGSCORE1"),
                         ("shape", sc_bytes[:8] + struct.pack("<i", 6) + sc_bytes[12:], "bytes where"),
                         ("nan", sc_bytes[:24] + struct.pack("<f", float("nan")) + sc_bytes[28:], "not finite")]:
    path = os.path.join(tmp_sc, name + ".fgscore")
    open(path, "wb").write(data)
    r = run("generate", *model_args(), "--scorer", path, "-n", "4")
    check(r.returncode == 1 and word in r.stderr, "a %s scorer: %r" % (name, r.stderr[-300:]))
open(os.path.join(tmp_sc, "m.bin.fgscore"), "wb").write(sc_bytes[:-4])  # found, not asked for: said, not fatal
r = run("generate", "-m", os.path.join(tmp_sc, "m.bin"), "-z", TOK, "-n", "4", "-p", prompt)
check(r.returncode == 0 and "not using the scorer found beside the model" in r.stderr,
      "a bad MODEL.fgscore found by default: %r" % r.stderr[-300:])
other = os.path.join(tmp_sc, "other.fgscore")
open(other, "wb").write(sc_bytes[:8] + struct.pack("<iiii", 5, 2, 64, 0) + sc_bytes[24:24 + 5 * 2 * 65 * 4])
r = run("generate", *model_args(), "--scorer", other, "-n", "4")
check(r.returncode == 1 and "calibrated for 5 layers, 2 KV heads" in r.stderr, "another model's scorer: %r" % r.stderr)
shutil.rmtree(tmp_sc)
shutil.rmtree(EMPTY_CACHE)

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
