#!/usr/bin/env python3
"""KL against the full cache through kvpress: kvpress' presses beside fastgen's methods as presses
(fastgen.kvpress), on the same long prompts and the same teacher-forced tokens.

SmolLM2-135M-Instruct loaded by transformers from our GGUF file (fp32). For each prompt: the full cache's
greedy continuation of --tokens tokens is the reference; each press compresses the prompt (kvpress'
prefill, KVzip's reconstruction passes included), then the continuation is fed after the compressed
cache at its own positions, and the KL(full || compressed) of the next-token distributions is averaged
over the continuation (the first token, predicted inside the prefill before any compression, left out).
Every method keeps 1 - ratio of the prompt's rows (kvpress' compression_ratio; fastgen-adaptive's budget).

    python3 scripts/kvpress_kl.py --ratios 0.5,0.75 --count 4
    python3 scripts/kvpress_kl.py --only kvzip,fastgen      # the methods whose label holds a word
    (needs torch, transformers, gguf, kvpress: pip install -r python/requirements-torch.txt)

--query-agnostic: the shape kvpress' pipeline and KVzip's authors run (their evaluation compresses the
context and appends the question uncompressed): each press compresses the prompt up to its request, the
last paragraph of the user turn; the request and the turn's end are fed after the compressed cache
(the full cache's too), then the continuation, and the KL is averaged over every continuation token, the
first one included. Without it the press also sees, and may evict, the request and the assistant's header.

fastgen's own reconstruction (observe=reconstruct) is not a press: `fastgen eval --prompts FILE --sweep
-n 64 --f32-activations` measures it on the same prompts (--emit FILE writes them as the CLI reads them).
Not in CI: ~10 minutes on 2 cores for 4 prompts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from kvpress import (AdaKVPress, ExpectedAttentionPress, KeyDiffPress, KVzipPress, SnapKVPress, StreamingLLMPress,
                     TOVAPress)
from transformers import DynamicCache

import fastgen.transformers as fgt
from fastgen.kvpress import FastGenPress

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import long_prompts  # noqa: E402


def logprobs_after(model, cache, cont: torch.Tensor, start: int) -> torch.Tensor:
    """Log-probabilities of the next token after each of cont's tokens, fed after `cache` from position start."""
    pos = torch.arange(start, start + cont.shape[1]).unsqueeze(0)
    out = model(input_ids=cont, past_key_values=cache, position_ids=pos)
    return torch.log_softmax(out.logits[0].double(), dim=-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", default=os.path.join(HERE, os.pardir, "tests", "data", "long-prompts.txt"),
                    help="a recipe of long prompts (scripts/long_prompts.py's format; default: the held-out one)")
    ap.add_argument("--count", type=int, default=4, help="the first N prompts of the recipe")
    ap.add_argument("--tokens", type=int, default=64, help="teacher-forced tokens after each prompt")
    ap.add_argument("--ratios", default="0.5,0.75", help="kvpress compression ratios (the share dropped)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated words: the methods whose label holds one")
    ap.add_argument("--emit", default="", help="also write the prompts, one per line as fastgen eval reads them")
    ap.add_argument("--query-agnostic", action="store_true",
                    help="compress the context only, the request fed after it (kvpress' pipeline, KVzip's authors)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model, tok = fgt.from_gguf()
    # every prompt opens as the chat template opens a user turn (its system turn): KVzipPress takes the
    # template's opening as the part of the context it does not reconstruct
    opening = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False).split("<|im_start|>user")[0]
    prompts = [p if p.startswith(opening) else opening + p for p in long_prompts.build(args.prompts)[:args.count]]
    if args.emit:
        with open(args.emit, "w", encoding="utf-8") as f:
            for p in prompts:
                f.write(p.replace("\\", "\\\\").replace("\n", "\\n") + "\n")
    tok_dir = tempfile.mkdtemp(prefix="fastgen-tok-")  # KVzipPress loads the tokenizer by the model's name
    tok.save_pretrained(tok_dir)
    model.config._name_or_path = tok_dir
    # the tokens before the user's content in the template (system turn and user header), as KVzipPress
    # counts them: it scores only the 4 sinks among them, so the others go first in every head; its
    # authors keep them all and let them all stand as sinks when scoring (n_sink = their count does that)
    prefix = tok.apply_chat_template([{"role": "user", "content": "X"}], tokenize=False,
                                     add_generation_prompt=True).split("X")[0]
    n_prefix = len(tok.encode(prefix, add_special_tokens=False))
    ratios = [float(r) for r in args.ratios.split(",")]
    only = [w.strip().lower() for w in args.only.split(",") if w.strip()]

    presses = {  # made when used (KVzipPress warns of its cost as each is made)
        "FastGenPress fastgen-adaptive": lambda r: FastGenPress(r, tokenizer=tok),
        "FastGenPress fastgen-adaptive, observe=predicted": lambda r: FastGenPress(
            r, tokenizer=tok, options={"observe": "predicted"}),
        "FastGenPress snapkv": lambda r: FastGenPress(r, method="snapkv", tokenizer=tok),
        "FastGenPress tova": lambda r: FastGenPress(r, method="tova", tokenizer=tok),
        "kvpress SnapKV": SnapKVPress,
        "kvpress AdaKV(SnapKV)": lambda r: AdaKVPress(SnapKVPress(r)),
        "kvpress TOVA": TOVAPress,
        "kvpress KeyDiff": KeyDiffPress,
        "kvpress ExpectedAttention": ExpectedAttentionPress,
        "kvpress StreamingLLM": StreamingLLMPress,
        "kvpress KVzip": KVzipPress,
        "kvpress KVzip, the template's opening kept (n_sink)": lambda r: KVzipPress(r, n_sink=n_prefix),
    }
    labels = [k for k in presses if not only or any(w in k.lower() for w in only)]
    kl: dict[str, dict[float, list[float]]] = {k: {r: [] for r in ratios} for k in labels}
    t0 = time.time()
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            # the part a press compresses, and (--query-agnostic) the request fed after it uncompressed
            cut = prompt.rfind("\n\n") if args.query_agnostic else len(prompt)
            if cut < 0:
                sys.exit(f"kvpress_kl.py: prompt {i + 1} has no request paragraph to keep out of the compression")
            ids = torch.tensor([tok.encode(prompt[:cut], add_special_tokens=False)])
            req = tok.encode(prompt[cut:], add_special_tokens=False) if cut < len(prompt) else []
            n = ids.shape[1]
            cache = DynamicCache()
            out = model(input_ids=torch.cat([ids, torch.tensor([req], dtype=ids.dtype)], dim=1), past_key_values=cache)
            cont = [int(out.logits[0, -1].argmax())]
            for _ in range(args.tokens - 1):  # the full cache's greedy continuation: the reference
                out = model(input_ids=torch.tensor([cont[-1:]]), past_key_values=cache,
                            position_ids=torch.tensor([[n + len(req) + len(cont) - 1]]))
                cont.append(int(out.logits[0, -1].argmax()))
            # fed after the compressed part: the request (if kept out), then the continuation; scored: the
            # positions that predict a continuation token (without the request, the first one is predicted
            # inside the prefill, before any compression, and left out)
            fed = torch.tensor([req + cont])
            scored = slice(len(req) - 1, len(req) + len(cont) - 1) if req else slice(0, len(cont) - 1)
            cache = DynamicCache()
            model.model(input_ids=ids, past_key_values=cache)
            ref = logprobs_after(model, cache, fed, n)[scored]
            for r in ratios:
                for label in labels:
                    press = presses[label](r)
                    cache = DynamicCache()
                    with press(model):
                        model.model(input_ids=ids, past_key_values=cache)
                    got = logprobs_after(model, cache, fed, n)[scored]
                    step = (ref.exp() * (ref - got)).sum(-1)  # KL(full || compressed) per position
                    kl[label][r].append(float(step.mean()))
            print(f"prompt {i + 1} of {len(prompts)}: {n} tokens ({time.time() - t0:.0f} s)", file=sys.stderr)
    print(f"KL(full || compressed), mean over {args.tokens if args.query_agnostic else args.tokens - 1} "
          f"teacher-forced tokens after each of {len(prompts)} prompts ({os.path.basename(args.prompts)}"
          f"{', the request fed after the compressed context' if args.query_agnostic else ''}), "
          f"SmolLM2-135M-Instruct in transformers (fp32):")
    print("| method | " + " | ".join(f"{1 - r:.0%} kept: mean (min-max)" for r in ratios) + " |")
    print("| --- |" + " --- |" * len(ratios))
    for label in labels:
        cells = []
        for r in ratios:
            v = kl[label][r]
            cells.append(f"{sum(v) / len(v):.4f} ({min(v):.4f}-{max(v):.4f})")
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
