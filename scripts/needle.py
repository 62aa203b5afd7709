#!/usr/bin/env python3
"""A needle in real text for `fastgen eval --passkey`: a five-digit access
code stated once, at a depth of 10% to 90%, in 900 to 3,400 tokens of
technical prose (the docstrings of Python's standard library, on every
machine that runs this script), then asked for.

Three forms (--form):
  prompt     KEY<TAB>PROMPT: the question at the end of the prompt;
  turns      KEY<TAB>DOCUMENT<TAB>TURN: the document is a first turn,
             prefilled and compressed alone, the question a second turn
             appended after it (the serving shape: a document compressed
             before its question is known);
  questions  KEY<TAB>DOCUMENT<TAB>TURN<TAB>KEY<TAB>TURN<TAB>KEY<TAB>TURN:
             three numbers in the document (the archive's access code, the
             laboratory's door code, the safe's PIN; in random order, at
             depths drawn from the first, middle and last thirds), the
             document compressed once and forked for each question.
Two splits of the modules (--split): dev (to tune on) and test (never
tuned on); a module belongs to one by a hash of its name.

Usage: needle.py [--split dev|test] [--form prompt|turns|questions] [--count N]
                 [--seed S] [--plain] > needle.txt
  --plain: no ChatML (models without a chat template)."""
import argparse
import importlib
import inspect
import pkgutil
import random
import re
import sys
import warnings
import zlib

CHARS_PER_TOKEN = 4.2  # SmolLM2's tokenizer on this prose, measured to a few %
INTRO = "Here is a document. Read it carefully; a question about it follows."
QUESTION = "What is the access code for the archive?"
ANSWER = "The access code for the archive is"
# --form questions: the first fact is the one above, each (statement, question, answer's start)
FACTS = [
    ("The access code for the archive is {}.", QUESTION, ANSWER),
    ("The door code for the laboratory is {}.", "What is the door code for the laboratory?",
     "The door code for the laboratory is"),
    ("The PIN of the office safe is {}.", "What is the PIN of the office safe?", "The PIN of the office safe is"),
]


ESC = str.maketrans({"\\": "\\\\", "\n": "\\n", "\t": " "})  # one line a case, as fastgen eval reads it


def passkey_line(intro, doc, questions, form, plain):
    """One line of `fastgen eval --passkey`: the document (intro, then doc) and its questions, each
    (key, question, the answer's start). form "prompt": one question, ending the prompt (a ChatML user
    turn holding the document and the question); "turns": the document a turn of its own, each
    question a turn after it (several: each asked of a fork of the compressed document). plain: no
    ChatML."""
    if plain:
        document = f"{intro}\n\n{doc}\n\n"
        turn = lambda q, a: f"{q} {a}"  # noqa: E731
    else:
        document = f"<|im_start|>user\n{intro}\n\n{doc}<|im_end|>\n"
        turn = lambda q, a: f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}"  # noqa: E731
    if form == "prompt":
        (key, q, a), = questions
        prompt = document + turn(q, a) if plain else \
            f"<|im_start|>user\n{intro}\n\n{doc}\n\n{q}<|im_end|>\n<|im_start|>assistant\n{a}"
        return key + "\t" + prompt.translate(ESC)
    fields = [questions[0][0], document.translate(ESC), turn(*questions[0][1:]).translate(ESC)]
    for key, q, a in questions[1:]:
        fields += [key, turn(q, a).translate(ESC)]
    return "\t".join(fields)


def split_of(name):
    return "test" if zlib.crc32(name.encode()) % 3 == 0 else "dev"


def paragraphs(split):
    """Prose paragraphs of the modules of one split, in a stable order."""
    skip = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3", "ensurepip"}
    out = []
    names = sorted(m.name for m in pkgutil.iter_modules() if m.name in sys.stdlib_module_names)
    for name in names:
        if name in skip or name.startswith("_") or split_of(name) != split:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mod = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module this platform lacks
            continue
        docs = [inspect.getdoc(mod) or ""]
        for _, obj in sorted(vars(mod).items()):
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", None) == name:
                docs.append(inspect.getdoc(obj) or "")
        for doc in docs:
            for para in re.split(r"\n\s*\n", doc):
                text = " ".join(para.split())
                letters = sum(c.isalpha() or c == " " for c in text)
                if len(text) >= 160 and letters / len(text) > 0.9 and text.count(". ") >= 1 and ">>>" not in text:
                    out.append(text)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=("dev", "test"), default="dev")
    ap.add_argument("--form", choices=("prompt", "turns", "questions"), default="prompt")
    ap.add_argument("--count", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--plain", action="store_true")
    args = ap.parse_args()
    paras = paragraphs(args.split)
    if not paras:
        sys.exit("needle.py: no prose found in this Python's standard library")
    # the text is this Python's docstrings: the sets depend on its version
    print(f"needle.py: {len(paras)} paragraphs of Python {sys.version.split()[0]}'s {args.split} modules",
          file=sys.stderr)
    rng = random.Random(f"{args.seed}-{args.split}")
    for i in range(args.count):
        tokens = 900 + (2500 * i) // max(1, args.count - 1)  # 900 .. 3400, evenly
        start = rng.randrange(len(paras))
        body, at = [], start
        while sum(len(p) + 2 for p in body) < tokens * CHARS_PER_TOKEN:
            body.append(paras[at % len(paras)])
            at += 1
        depth = 0.1 + 0.8 * rng.random()
        key = str(rng.randint(10000, 99999))
        if args.form != "questions":
            body.insert(round(len(body) * depth), FACTS[0][0].format(key))
        else:  # a fact in each third, in a random order, the last inserted first (the depths hold)
            keys = [key] + [str(rng.randint(10000, 99999)) for _ in FACTS[1:]]
            order = rng.sample(range(len(FACTS)), len(FACTS))
            depths = [(third + 0.1 + 0.8 * rng.random()) / 3 for third in range(len(FACTS))]
            n0 = len(body)
            for third in reversed(range(len(FACTS))):
                body.insert(round(n0 * depths[third]), FACTS[order[third]][0].format(keys[order[third]]))
        doc = "\n\n".join(body)
        if args.form == "questions":
            print(passkey_line(INTRO, doc, [(k, q, a) for k, (_, q, a) in zip(keys, FACTS)], "turns", args.plain))
        else:
            print(passkey_line(INTRO, doc, [(key, QUESTION, ANSWER)], args.form, args.plain))

if __name__ == "__main__":
    main()
