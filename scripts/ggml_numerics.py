#!/usr/bin/env python3
"""How far fastgen's logits are from llama.cpp's, and from each other
(scripts/smollm2-check.sh --numerics runs it, with scripts/ggml_numerics.c built).

For each prompt of tests/data/smollm2-prompts.json, llama.cpp (llama-cpp-python,
f16 cache, flash attention off) generates --steps greedy ids; fastgen is then
teacher-forced on the same ids (`ggml_numerics logits`), with 8-bit or f32
activations, on the cpu and the ref backend. Printed per pair: mean |difference|
of the logits (median, max over steps), mean KL(first || second) and how
often the argmax agrees. Pairs of fastgen runs that differ only in the
attention's rounding (cpu against ref: the order of sums, the cpu kernels'
vector exponential) show how much a rounding difference grows
through the model with 8-bit activations and with f32 ones.
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


def softmax_log(z):
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--numerics", required=True, help="the built scripts/ggml_numerics.c")
    ap.add_argument("--fastgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="tests/data")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    a = ap.parse_args()
    import llama_cpp
    from smollm2_check import greedy_llama  # beside this script: llama.cpp's greedy ids and logits

    llm = llama_cpp.Llama(a.model, n_ctx=1024, n_threads=a.threads, n_batch=512, logits_all=True, verbose=False)
    prompts = json.load(open(os.path.join(a.data, "smollm2-prompts.json"), encoding="utf-8"))
    runs = {"llama.cpp": []}
    forced = []
    for p in prompts:
        g = json.loads(subprocess.run([a.fastgen, "generate", "-m", a.model, "-p", p, "-n", "1", "--temp", "0",
                                       "--policy", "full", "--json"], capture_output=True, check=True).stdout)
        ids = g["tokens"][:g["n_prompt"]]
        out, z = greedy_llama(llm, ids, a.steps, llm.token_eos())
        forced.append((ids, out))
        runs["llama.cpp"].append(np.array(z, dtype=np.float64))
    for act in ("q8", "f32"):
        for backend in ("cpu", "ref"):
            name = f"fastgen {act} {backend}"
            runs[name] = []
            for ids, out in forced:
                stdin = f"{len(ids)} {' '.join(map(str, ids))} {len(out)} {' '.join(map(str, out))}".encode()
                r = subprocess.run([a.numerics, "logits", a.model, act, backend], input=stdin, capture_output=True,
                                   check=True)
                runs[name].append(np.frombuffer(r.stdout, dtype=np.float32).reshape(len(out), -1).astype(np.float64))
    pairs = [("llama.cpp", "fastgen q8 cpu"), ("llama.cpp", "fastgen q8 ref"), ("llama.cpp", "fastgen f32 cpu"),
             ("fastgen q8 cpu", "fastgen q8 ref"), ("fastgen f32 cpu", "fastgen f32 ref"),
             ("fastgen f32 cpu", "fastgen q8 cpu")]
    print(f"SmolLM2, {len(prompts)} prompts x {a.steps} steps teacher-forced on llama.cpp "
          f"{llama_cpp.__version__}'s greedy ids (its f16 cache, flash attention off)")
    print(f"  {'first':<16} {'second':<16} {'mean |dz|':>9} {'median':>7} {'max':>6} {'mean KL':>9} "
          f"{'argmax equal':>13}")
    for x, y in pairs:
        zx, zy = np.concatenate(runs[x]), np.concatenate(runs[y])
        d = np.abs(zx - zy).mean(axis=1)
        lx, ly = softmax_log(zx), softmax_log(zy)
        kl = (np.exp(lx) * (lx - ly)).sum(axis=1)
        same = int((zx.argmax(1) == zy.argmax(1)).sum())
        print(f"  {x:<16} {y:<16} {d.mean():9.4f} {np.median(d):7.4f} {d.max():6.3f} {kl.mean():9.2e} "
              f"{same:>6} of {len(d)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
