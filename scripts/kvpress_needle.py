#!/usr/bin/env python3
"""The needle in real text (scripts/needle.py) through kvpress' pipeline: kvpress' presses beside fastgen's
methods as presses (fastgen.kvpress) and fastgen's own engine (fastgen.transformers), on the same token ids.

kvpress' shape: the document is prefilled and compressed before the question is known; the question and
the answer follow in the same user turn. SmolLM2-135M-Instruct loaded by transformers from our GGUF file
(fp32), greedy answers of at most 12 tokens; a case counts when the answer holds the code.

    python3 scripts/kvpress_needle.py --split test --ratios 0.5,0.75
    python3 scripts/kvpress_needle.py --form questions --only kvzip,tova   # three questions a document
    (needs torch, transformers, gguf, kvpress: pip install -r python/requirements-torch.txt)

--form questions: needle.py's three facts a document, each question asked after the same compressed
document (a kvpress press compresses the context before it sees the question, so asking each in turn
is what forking the compressed cache gives); a case then counts its questions answered.

Not in CI: 15 cases x 14 runs take ~20 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time

import torch
import transformers
from transformers import pipeline

from kvpress import (AdaKVPress, ExpectedAttentionPress, KeyDiffPress, KVzipPress, SnapKVPress, StreamingLLMPress,
                     TOVAPress)

import fastgen
import fastgen.transformers as fgt
from fastgen.bench import cpu_name
from fastgen.kvpress import FastGenPress

HERE = os.path.dirname(os.path.abspath(__file__))


def cases(split: str, count: int, form: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """(document, [(key, question, answer prefix), ...]) per case."""
    out = subprocess.run([sys.executable, os.path.join(HERE, "needle.py"), "--split", split, "--form",
                          "turns" if form == "turns" else "questions", "--plain", "--count", str(count)],
                         capture_output=True, text=True, check=True).stdout
    unescape = lambda s: s.replace("\\n", "\n").replace("\\\\", "\\")  # noqa: E731
    rows = []
    for line in out.splitlines():
        f = line.split("\t")
        keys, turns = [f[0]] + f[3::2], f[2::2]
        asks = []
        for key, turn in zip(keys, turns):  # --plain turns: "QUESTION ANSWER-PREFIX"
            question, prefix = unescape(turn).split("? ", 1)
            asks.append((key, question + "?", prefix))
        rows.append((unescape(f[1]), asks))
    return rows


def engine_answer(model, tok, pipe, doc: str, question: str, prefix: str, method: str,
                  ratio: float) -> tuple[str, float]:
    """fastgen's own engine in kvpress' shape: the document's ids prefilled (and compressed), then the
    question's appended, then greedy decoding, on the ids kvpress' pipeline makes."""
    inputs = pipe.preprocess(doc, [question], answer_prefix=prefix, max_context_length=1 << 30)
    engine = fgt.enable(model, tok, method, **({"budget": 1 - ratio} if ratio else {}))
    try:
        cache = engine.new_cache()
        with torch.no_grad():
            model(input_ids=inputs["context_ids"], past_key_values=cache)
            kept = cache.memory()
            out = model(input_ids=inputs["questions_ids"][0], past_key_values=cache)
            ids = []
            for _ in range(12):
                nxt = int(out.logits[0, -1].argmax())
                ids.append(nxt)
                if nxt == tok.eos_token_id:
                    break
                out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache)
        cache.close()
    finally:
        fgt.disable(model)
    return tok.decode(ids, skip_special_tokens=True), kept["rows_kept"] / kept["rows_full"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=("dev", "test"))
    ap.add_argument("--count", type=int, default=15)
    ap.add_argument("--form", default="turns", choices=("turns", "questions"),
                    help="one question a document, or needle.py's three")
    ap.add_argument("--ratios", default="0.5,0.75", help="compression ratios (share of rows dropped)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--verbose", action="store_true", help="print every answer")
    ap.add_argument("--only", default="", help="comma-separated words: run the methods whose label holds one "
                    "(case-insensitive; default: all)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = fgt.from_gguf()
    # KVzipPress loads the tokenizer from the model's name_or_path, which a GGUF file does not give it
    tok_dir = tempfile.mkdtemp(prefix="fastgen-tok-")
    tok.save_pretrained(tok_dir)
    model.config._name_or_path = tok_dir
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok)
    data = cases(args.split, args.count, args.form)
    n_q = sum(len(asks) for _, asks in data)
    ratios = [float(r) for r in args.ratios.split(",")]
    only = [w.strip().lower() for w in args.only.split(",") if w.strip()]

    def presses(r: float) -> dict:
        return {
            "fastgen engine: fastgen-adaptive": ("engine", "fastgen-adaptive"),
            "FastGenPress fastgen-adaptive": FastGenPress(r, tokenizer=tok),
            "FastGenPress snapkv": FastGenPress(r, method="snapkv", tokenizer=tok),
            "FastGenPress tova": FastGenPress(r, method="tova", tokenizer=tok),
            "kvpress SnapKV": SnapKVPress(r),
            "kvpress AdaKV(SnapKV)": AdaKVPress(SnapKVPress(r)),
            "kvpress TOVA": TOVAPress(r),
            "kvpress KeyDiff": KeyDiffPress(r),
            "kvpress ExpectedAttention": ExpectedAttentionPress(r),
            "kvpress StreamingLLM": StreamingLLMPress(r),
            "kvpress KVzip": KVzipPress(r),
        }

    table: dict[str, dict[float, list]] = {}
    full_hits = 0
    t0 = time.time()
    for i, (doc, asks) in enumerate(data):
        for key, question, prefix in asks:
            answer = pipe(doc, question=question, answer_prefix=prefix, max_new_tokens=12)["answer"]
            full_hits += key in answer
            if args.verbose:
                print(f"{key} full: {answer!r}", file=sys.stderr)
        for r in ratios:
            for label, press in presses(r).items():
                if only and not any(w in label.lower() for w in only):
                    continue
                for key, question, prefix in asks:
                    if isinstance(press, tuple):
                        answer, kept = engine_answer(model, tok, pipe, doc, question, prefix, press[1], r)
                    else:
                        answer = pipe(doc, question=question, answer_prefix=prefix, press=press,
                                      max_new_tokens=12)["answer"]
                        kept = getattr(press, "kept_share", None)
                        kept = 1 - r if kept is None else kept
                    if args.verbose:
                        print(f"{key} {label} {r}: {answer!r}", file=sys.stderr)
                    cell = table.setdefault(label, {}).setdefault(r, [0, 0.0])
                    cell[0] += key in answer
                    cell[1] += kept
        print(f"# case {i + 1}/{len(data)} done at {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    print(f"# {cpu_name()}, torch {torch.__version__}, transformers {transformers.__version__}, kvpress "
          f"{importlib.metadata.version('kvpress')}, fastgen {fastgen.__version__}; "
          f"needle {args.split} split, {len(data)} documents, {n_q} questions ({args.form}), kvpress' pipeline "
          f"shape (question after compression)")
    print(f"full cache (no press): {full_hits} of {n_q}")
    head = " | ".join(f"{100 * (1 - r):.0f} % kept: found (rows kept)" for r in ratios)
    print(f"| method | {head} |")
    print("| --- |" + " --- |" * len(ratios))
    for label, by_r in table.items():
        cells = " | ".join(f"{by_r[r][0]} ({100 * by_r[r][1] / n_q:.0f} %)" for r in ratios)
        print(f"| {label} | {cells} |")


if __name__ == "__main__":
    main()
