"""python -m fastgen.bench: what a decode step costs through the binding against the same calls from C.

A context of SmolLM2-135M's attention shape (30 layers, 9 query heads, 3 KV heads, head_dim 64, f16 cache)
holds one prompt of --prompt random tokens; then decode steps of every layer alternate, in blocks, between a
Python loop of Context.decode calls and the same fg_decode calls looped in C (the extension's
_bench_decode_c), so both see the same cache lengths. Prints each side's time per 30-layer step and the
binding's overhead, with out= given (as an engine calls it) and without (a new array per call).
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

import fastgen


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens (default 1024)")
    ap.add_argument("--steps", type=int, default=200, help="decode steps on each side (default 200)")
    ap.add_argument("--block", type=int, default=10, help="steps per block before switching sides")
    ap.add_argument("--method", default="full", help="compression preset (default full)")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()

    L, hq, hkv, d = 30, 9, 3, 64
    rng = np.random.default_rng(1)
    n = args.prompt
    total = n + 3 * args.steps + 8
    ctx = fastgen.Context(L, hq, hkv, d, vocab_size=49152, backend=args.backend, max_seqs=1, max_seq_len=total,
                          threads=args.threads, method=args.method)
    seq = ctx.create(rng.integers(0, 49152, n).astype(np.int32))
    for layer in range(L):
        q = rng.standard_normal((n, hq, d), dtype=np.float32)
        k = rng.standard_normal((n, hkv, d), dtype=np.float32)
        v = rng.standard_normal((n, hkv, d), dtype=np.float32)
        ctx.prefill(seq, layer, q, k, v)
    q = rng.standard_normal((1, hq, d), dtype=np.float32)
    k = rng.standard_normal((1, hkv, d), dtype=np.float32)
    v = rng.standard_normal((1, hkv, d), dtype=np.float32)
    out = np.empty((1, hq, d), dtype=np.float32)
    seqs, tokens = np.array([seq], dtype=np.int32), np.array([7], dtype=np.int32)

    def python_steps(reps: int, give_out: bool) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            for layer in range(L):
                if give_out:
                    ctx.decode(layer, seqs, tokens, q, k, v, out)
                else:
                    ctx.decode(layer, seqs, tokens, q, k, v)
        return time.perf_counter() - t0

    t_py = t_c = t_alloc = 0.0
    done = 0
    while done < args.steps:
        b = min(args.block, args.steps - done)
        t_py += python_steps(b, True)
        t_c += ctx._bench_decode_c(seqs, tokens, q, k, v, out, b)
        t_alloc += python_steps(b, False)
        done += b
    us = lambda t: 1e6 * t / args.steps  # noqa: E731
    print(f"fastgen {fastgen.__version__}, backend {ctx.backend}, {cpu_name()}, threads {args.threads or 'all'}")
    print(f"context: {L} layers x {hkv} KV heads x {d}, prompt {n}, then {3 * args.steps} steps; method "
          f"{args.method}")
    print(f"decode step from C:               {us(t_c):9.1f} us")
    print(f"decode step from Python (out=):   {us(t_py):9.1f} us   overhead {100 * (t_py / t_c - 1):+.1f}%")
    print(f"decode step from Python (new out): {us(t_alloc):8.1f} us   overhead {100 * (t_alloc / t_c - 1):+.1f}%")
    print(f"per call: {1e6 * (t_py - t_c) / (args.steps * L):.2f} us through the binding")
    ctx.close()


if __name__ == "__main__":
    main()
