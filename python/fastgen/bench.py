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
    ap.add_argument("--steps", type=int, default=300, help="decode steps on each side (default 200)")
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

    py, c, alloc = [], [], []  # seconds per block, side by side
    done = 0
    while done < args.steps:
        b = min(args.block, args.steps - done)
        sides = [lambda: py.append(python_steps(b, True) / b),
                 lambda: c.append(ctx._bench_decode_c(seqs, tokens, q, k, v, out, b) / b),
                 lambda: alloc.append(python_steps(b, False) / b)]
        for i in range(3):  # each side first in turn: neither always sees the shorter cache or the warmer one
            sides[(i + done // b) % 3]()
        done += b
    py, c, alloc = np.array(py), np.array(c), np.array(alloc)
    med = lambda x: float(np.median(x))  # noqa: E731 (each block's ratio: the machine's drift cancels)
    print(f"fastgen {fastgen.__version__}, backend {ctx.backend}, {cpu_name()}, threads {args.threads or 'all'}")
    print(f"context: {L} layers x {hkv} KV heads x {d}, prompt {n}, then {3 * args.steps} steps in blocks of "
          f"{args.block}; method {args.method}")
    print(f"decode step (30 layers) from C:             median {1e6 * med(c):9.1f} us")
    print(f"decode step from Python, out= given:        median {1e6 * med(py):9.1f} us   overhead "
          f"{100 * (med(py / c) - 1):+.2f}% (median of the blocks' ratios)")
    print(f"decode step from Python, a new out a call:  median {1e6 * med(alloc):9.1f} us   overhead "
          f"{100 * (med(alloc / c) - 1):+.2f}%")
    print(f"per call through the binding: {1e6 * med(py - c) / L:.2f} us (out= given), "
          f"{1e6 * med(alloc - c) / L:.2f} us (new out)")
    ctx.close()


if __name__ == "__main__":
    main()
