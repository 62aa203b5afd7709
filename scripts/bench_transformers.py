#!/usr/bin/env python3
"""Decode speed of a transformers model with fastgen's attention and cache against transformers' own.

SmolLM2-135M-Instruct loaded by transformers from our GGUF file (fp32), one prompt of --prompt tokens
(real text: the long held-out prompts, repeated), then --steps greedy decode steps, each configuration
in its own pass over the same prompt, repeated --reps times in alternating order (the best pass counts):

    transformers' sdpa attention with its DynamicCache (the full cache)
    fastgen full, fastgen-adaptive at 0.5 and 0.25 (fastgen.transformers.enable)

Prints prefill and decode tokens/s, the KV bytes each holds at the end, torch's version and threads,
and the CPU. Needs torch, transformers and gguf (pip install torch transformers gguf).

    python3 scripts/bench_transformers.py --prompt 4096 --steps 64 --threads 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import transformers
from transformers import DynamicCache

import fastgen
import fastgen.transformers as fgt
from fastgen.bench import cpu_name

HERE = os.path.dirname(os.path.abspath(__file__))


def prompt_ids(fm: fastgen.Model, n: int) -> list[int]:
    sys.path.insert(0, HERE)
    import long_prompts  # noqa: E402 (scripts/long_prompts.py)

    ids: list[int] = []
    texts = long_prompts.build(os.path.join(HERE, os.pardir, "tests", "data", "long-prompts.txt"))
    while len(ids) < n:
        for text in texts:
            ids += fm.tokenize(text)
    return ids[:n]


def run(model, ids: list[int], steps: int, cache) -> tuple[float, float, int]:
    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        t1 = time.perf_counter()
        cache = out.past_key_values
        nxt = int(out.logits[0, -1].argmax())
        for _ in range(steps):
            out = model(input_ids=torch.tensor([[nxt]]), past_key_values=cache, use_cache=True)
            nxt = int(out.logits[0, -1].argmax())
        t2 = time.perf_counter()
    if isinstance(cache, fgt.FastGenCache):
        held = cache.memory()["kv_bytes_held"]
        cache.close()
    else:
        held = sum(layer.keys.nbytes + layer.values.nbytes for layer in cache.layers)
    return t1 - t0, t2 - t1, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF file (default: SmolLM2 from scripts/get-models.sh)")
    ap.add_argument("--prompt", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-dtype", default="f16", help="fastgen's cache dtype (default f16)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    path = args.model or fastgen.find_model()
    model, tok = fgt.from_gguf(path)
    fm = fastgen.Model(path)
    ids = prompt_ids(fm, args.prompt)
    fm.close()

    configs = [("transformers sdpa (full)", None, {}), ("fastgen full", "full", {}),
               ("fastgen-adaptive 0.5", "fastgen-adaptive", {"budget": 0.5}),
               ("fastgen-adaptive 0.25", "fastgen-adaptive", {"budget": 0.25})]
    best: dict[str, tuple[float, float, int]] = {}
    for rep in range(args.reps):
        for name, method, kw in configs if rep % 2 == 0 else configs[::-1]:
            if method is None:
                r = run(model, ids, args.steps, DynamicCache(config=model.config))
            else:
                engine = fgt.enable(model, tok, method, kv_dtype=args.kv_dtype, threads=args.threads, **kw)
                try:
                    r = run(model, ids, args.steps, engine.new_cache())
                finally:
                    fgt.disable(model)
            if name not in best or r[1] < best[name][1]:
                best[name] = r

    print(f"# {cpu_name()}, torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
          f"{transformers.__version__}, fastgen {fastgen.__version__}; {os.path.basename(path)} in fp32, "
          f"prompt {len(ids)} tokens, {args.steps} decode steps, best of {args.reps}, fastgen cache {args.kv_dtype}")
    base = best["transformers sdpa (full)"]
    print(f"{'configuration':<26} {'prefill tok/s':>13} {'decode tok/s':>12} {'vs sdpa':>8} {'KV MB held':>10}")
    for name, _, _ in configs:
        pre, dec, held = best[name]
        print(f"{name:<26} {len(ids) / pre:13.1f} {args.steps / dec:12.2f} {base[1] / dec:7.2f}x "
              f"{held / 1e6:10.2f}")


if __name__ == "__main__":
    main()
