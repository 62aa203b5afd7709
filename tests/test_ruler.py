#!/usr/bin/env python3
"""scripts/ruler.py, the RULER-style suite's files: every task's answer is in
its document as the task says, and the files are what `fastgen eval
--passkey` reads (its scoring of them: test_cli.py).

Usage: test_ruler.py SCRIPTS_DIR"""
import collections
import os
import random
import re
import subprocess
import sys

SCRIPTS = sys.argv[1]
sys.path.insert(0, SCRIPTS)
import ruler  # noqa: E402

failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def unescape(s):
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), s)


paras = {split: ruler.prose(split) for split in ("dev", "test")}
words = ruler.common_words(paras["dev"])
check(len(paras["dev"]) > 100 and len(paras["test"]) > 50 and len(words) > 1000,
      "the splits' prose: %d and %d paragraphs, %d words" % (len(paras["dev"]), len(paras["test"]), len(words)))
check(not set(paras["dev"]) & set(paras["test"]), "dev and test share no paragraph")

for task in ruler.TASKS:
    for length in (1024, 4096):
        rng = random.Random(f"t-{task}-{length}")
        for case in range(3):
            intro, doc, qs, one = ruler.make(task, rng, paras["dev"], words, length)
            what = f"{task} at {length}, case {case}"
            keys = [q[0] for q in qs] + ([one[0]] if one else [])
            refs = [r for k in keys for r in k.split("|")]
            check(all(r and r in doc for r in refs) and all(q[1] and q[2] for q in qs),
                  f"{what}: every reference of its {len(keys)} key(s) is in the document")
            # the document's size follows the length (the prose's rate: CHARS_PER_TOKEN, the list's: measured)
            lo, hi = 0.7 * (length - ruler.RESERVE), 1.3 * (length - ruler.RESERVE)
            est = len(doc) / (ruler.CHARS_PER_TOKEN if task != "cwe" else 2.1)
            check(lo <= est <= hi, f"{what}: about {length - ruler.RESERVE} tokens of document ({est:.0f})")
            if task in ("single", "multikey"):
                check(len(qs) == 1 and one is None and len(refs) == 1, f"{what}: one question, one code")
                n_facts = len(re.findall(r"The access code for the [a-z ]+ is \d{5}\.", doc))
                check(n_facts == (1 if task == "single" else 4), f"{what}: {n_facts} codes stated")
            if task == "multiquery":
                check(len(qs) == 4 and len(set(keys[:4])) == 4 and one and sorted(one[0].split("|")) == sorted(keys[:4]),
                      f"{what}: four questions, and the prompt form's one asks for the four codes")
            if task == "multivalue":
                place = re.search(r"codes for the ([a-z ]+)\?", qs[0][1]).group(1)
                check(len(refs) == 4 and all(f"One of the access codes for the {place} is {r}." in doc for r in refs),
                      f"{what}: four codes of the {place}")
            if task == "vt":
                names = refs
                value = re.search(r"the value (\d+)", qs[0][1]).group(1)
                chain = [doc.find(f"VAR {names[0]} = {value}.")] + \
                        [doc.find(f"VAR {names[i]} = VAR {names[i - 1]}.") for i in range(1, 5)]
                check(len(names) == 5 and min(chain) >= 0 and chain == sorted(chain),
                      f"{what}: the chain of five in its order")
            if task == "cwe":
                items = re.findall(r"^\d+\. ([a-z]+)$", doc, re.M)
                count = collections.Counter(items)
                top = [w for w, _ in count.most_common(10)]
                freq = ruler.cwe_frequency(length - ruler.RESERVE)
                rare = sum(c for w, c in count.items() if w not in refs)
                check(sorted(top) == sorted(refs) and all(count[w] == freq for w in refs) and freq > 3 and
                      all(c == 3 for w, c in count.items() if w not in refs) and 2 * rare >= len(items),
                      f"{what}: the ten words {freq} times each, {len(count) - 10} others 3 times")
                check(not any(a != b and a in b for a in refs for b in count) and
                      all(len(w) >= 5 and w not in ruler.CWE_OWN_WORDS for w in refs),
                      f"{what}: no word of the answer inside another word of the list, or of 4 letters, or the "
                      "task's own")
            if task == "qa":
                quote = re.search(r'sentence "(.*)"\?', qs[0][1]).group(1)
                docs = dict(re.findall(r"^Document (\d+): (.*)$", doc, re.M))
                holding = [i for i, p in docs.items() if quote in p]
                check(holding == [refs[0]] and len(set(docs.values())) == len(docs),
                      f"{what}: the quoted sentence is in Document {refs[0]} alone, each paragraph once")

# the command line: both forms, the split, the seed, the plain form, and the refusals
run = lambda *a: subprocess.run([sys.executable, os.path.join(SCRIPTS, "ruler.py"), *a],  # noqa: E731
                                capture_output=True, text=True)
r1 = run("--task", "multiquery", "--length", "1024", "--count", "2")
r2 = run("--task", "multiquery", "--length", "1024", "--count", "2")
lines = r1.stdout.splitlines()
check(r1.returncode == 0 and r1.stdout == r2.stdout and len(lines) == 2 and
      all(len(x.split("\t")) == 9 for x in lines), "multiquery, turns form: 2 lines of KEY DOC TURN + 3 x (KEY TURN)")
f = lines[0].split("\t") if lines else [""] * 9
check("<|im_start|>user" in f[1] and f[1].endswith("<|im_end|>\\n") and "\n" not in lines[0] and
      all("<|im_start|>assistant" in f[i] for i in (2, 4, 6, 8)), "ChatML turns, escaped newlines")
r = run("--task", "multiquery", "--length", "1024", "--count", "2", "--form", "prompt", "--plain")
f = r.stdout.splitlines()[0].split("\t") if r.returncode == 0 else ["", ""]
check(len(f) == 2 and f[0].count("|") == 3 and "<|im_start|>" not in f[1] and f[1].endswith("The access codes are"),
      "prompt form, plain: one question asking for the four codes")
r = run("--task", "single", "--length", "1024", "--count", "2", "--split", "test")
check(r.returncode == 0 and r.stdout != run("--task", "single", "--length", "1024", "--count", "2").stdout,
      "the test split's file differs from dev's")
r = run("--task", "single", "--length", "1024", "--count", "1", "--seed", "2")
check(r.returncode == 0 and r.stdout.splitlines()[0] not in lines, "another seed, other cases")
r = run("--list")
check(r.returncode == 0 and [x.split()[0] for x in r.stdout.splitlines()] == list(ruler.TASKS), "--list")
r = run("--task", "single", "--length", "100000", "--split", "test")
check(r.returncode == 1 and "would repeat it" in r.stderr and r.stdout == "", "a length past the prose refused")
for bad in (["--task", "nope"], ["--length", "100", "--task", "single"], []):
    r = run(*bad)
    check(r.returncode == 2 and r.stdout == "", "refused: %s" % " ".join(bad))

print("%d failure(s)" % failures)
sys.exit(1 if failures else 0)
