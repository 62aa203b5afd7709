#!/usr/bin/env python3
"""A real model through the GPU backend's decode kernels against ref: the
same greedy tokens.

    scripts/gpu_generate_check.py FASTGEN MODEL [--backend hip|cuda] [--mma 0,1] [--prompts N] [-n N]

Runs `FASTGEN generate` on MODEL (SmolLM2: d = 64, G = 3, the tensor-core
kernel's d = 64 shape) with f32 activations, once with the `ref` backend and
twice with the GPU backend: its default decode kernel and the other one
(FASTGEN_GPU_DECODE_MMA=0 and =1: attend_chunks and attend_mma; under HIP-CPU
both are emulated), with the full cache and with fastgen-adaptive at half of
it. Every run must give ref's tokens and keep as many rows: the kernels
agree with ref to f32 rounding (test_backend_ops), which greedy decoding of
these prompts does not feel. Exit 1 on any difference, naming it. --mma
picks the kernels (CI: 1 alone, the one no other real-model run reaches
under HIP-CPU), --prompts how many of the two prompts, -n the tokens.
"""
import argparse
import json
import os
import subprocess
import sys

PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


def run(fastgen, model, prompt, backend, policy, mma, n):
    env = dict(os.environ)
    if mma is not None:
        env["FASTGEN_GPU_DECODE_MMA"] = mma
    cmd = [fastgen, "generate", "-m", model, "-p", prompt, "-n", str(n), "--backend", backend, "--policy", policy,
           "--f32-activations", "--json"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"gpu_generate_check: {' '.join(cmd)} failed:\n{out.stderr}")
    d = json.loads(out.stdout)
    return d["tokens"], d["rows_kept"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fastgen")
    ap.add_argument("model")
    ap.add_argument("--backend", default="hip", choices=("hip", "cuda"))
    ap.add_argument("--mma", default="0,1", help="FASTGEN_GPU_DECODE_MMA values to run (default 0,1)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1))
    ap.add_argument("-n", type=int, default=32, help="tokens to generate (default 32)")
    a = ap.parse_args()
    kernels = a.mma.split(",")
    if not kernels or any(k not in ("0", "1") for k in kernels):
        sys.exit("gpu_generate_check: --mma takes 0, 1 or 0,1")
    bad = 0
    for prompt in PROMPTS[:a.prompts]:
        for policy in ("full", "fastgen-adaptive"):
            want = run(a.fastgen, a.model, prompt, "ref", policy, None, a.n)
            for mma in kernels:
                got = run(a.fastgen, a.model, prompt, a.backend, policy, mma, a.n)
                same = got == want
                bad += not same
                print(f"{a.backend} FASTGEN_GPU_DECODE_MMA={mma} {policy:16s} {len(got[0])} tokens, "
                      f"{got[1]} rows kept: {'same as ref' if same else 'DIFFERS from ref'}")
    print(f"gpu_generate_check: {'passed' if not bad else f'{bad} runs differ'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
