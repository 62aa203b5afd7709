"""An engine's loop on fastgen.Context: the attention of every layer goes through fastgen, the rest is the engine's.

Here the "model" is random projections (NumPy), so the example runs anywhere; an engine passes its own q, k
(after RoPE) and v. Run: python examples/python/engine_loop.py
"""

import numpy as np

import fastgen

LAYERS, HQ, HKV, D, VOCAB = 4, 8, 2, 64, 1000
rng = np.random.default_rng(0)


def qkv(n):
    """What an engine's projections would give for n tokens of one layer."""
    return (rng.standard_normal((n, HQ, D), dtype=np.float32), rng.standard_normal((n, HKV, D), dtype=np.float32),
            rng.standard_normal((n, HKV, D), dtype=np.float32))


# which ids are punctuation or special: from the vocabulary's pieces (here: a few made up)
pieces = [f"tok{i}" for i in range(VOCAB)]
pieces[10], pieces[11] = ".", ","
classes = fastgen.TokenClasses(VOCAB, pieces)
classes.set(1, "special")  # BOS

with fastgen.Context(LAYERS, HQ, HKV, D, classes=classes, max_seqs=2, max_seq_len=2048,
                     method="fastgen-adaptive", budget=0.25) as ctx:
    prompt = rng.integers(12, VOCAB, 1500)
    prompt[0] = 1
    seq = ctx.create(prompt)
    for layer in range(LAYERS):
        out = ctx.prefill(seq, layer, *qkv(len(prompt)))  # [n, HQ, D]: the layer's attention output
    out = np.empty((1, HQ, D), dtype=np.float32)
    for step in range(32):
        token = int(rng.integers(12, VOCAB))
        for layer in range(LAYERS):
            ctx.decode(layer, [seq], [token], *qkv(1), out=out)
    mem = ctx.memory(seq)
    print(f"{ctx}\nafter {len(prompt)} prompt tokens and 32 steps: {mem['kv_bytes_held'] / 2**20:.2f} MiB of KV held "
          f"against {mem['kv_bytes_full'] / 2**20:.2f} MiB for the full cache ({mem['rows_kept']} of "
          f"{mem['rows_full']} rows)")
    heads = ctx.heads(seq)
    for layer in range(LAYERS):
        print(f"layer {layer}: " + ", ".join(f"{c} keeps {k}" for c, k in zip(heads["components"][layer],
                                                                           heads["kept"][layer])))
    print("head (0, 0) keeps positions", ctx.positions(seq, 0, 0)[:12], "...")
