#!/usr/bin/env python3
"""Speed on SmolLM2-135M-Instruct: fastgen against llama.cpp (llama-cpp-python)
on the same machine in the same run (scripts/smollm2-check.sh --bench runs it).

For each context (prompt tokens + --steps) it times, each in its own process
(so each peak RSS is its own): llama.cpp with flash attention off and on
(`x llama.cpp` is against the faster of the two); fastgen with the full
cache, fastgen-adaptive at half and a quarter of the cache, and the paper's
mode (T = 0.95). fastgen keeps its KV cache in f16 like llama.cpp. Prompt: Debian's licence texts (/usr/share/common-licenses),
one after another, cut to the length. Decode: --steps greedy tokens, EOS
ignored. Figures: prefill and decode tokens/s, peak RSS, KV bytes.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

LICENSES = ["GPL-3", "LGPL-2.1", "GPL-2", "Apache-2.0", "MPL-2.0"]

LLAMA_CHILD = r"""
import json, sys, time
import llama_cpp
model, n_ctx, threads, steps, fa = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
ids = json.loads(sys.stdin.read())
llm = llama_cpp.Llama(model, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, flash_attn=fa,
                      verbose=False)
t0 = time.perf_counter()
llm.eval(ids)
t1 = time.perf_counter()
tok = ids[-1]
for _ in range(steps):
    llm.eval([tok])
    tok = 504  # any token: the timing does not depend on which
t2 = time.perf_counter()
print(json.dumps({"prefill_s": t1 - t0, "decode_s": t2 - t1}))
"""


def run(cmd, stdin=None):
    """Runs cmd and returns (stdout, its peak RSS in MiB)."""
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if stdin is not None:
        p.stdin.write(stdin)
    p.stdin.close()
    out = p.stdout.read()
    err = p.stderr.read()
    _, status, ru = os.wait4(p.pid, 0)
    if status:
        sys.exit(f"bench_smollm2: {' '.join(cmd[:4])} failed: {err.decode()[-800:]}")
    return out, ru.ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fastgen", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--contexts", default="1024,4096,8192")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--fastgen-args", default="", help="more options for fastgen, e.g. --f32-activations")
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args()

    text = "\n\n".join(open(os.path.join("/usr/share/common-licenses", f), encoding="utf-8").read() for f in LICENSES)
    ids = [int(t) for t in subprocess.run([a.fastgen, "tokenize", "--ids", "-m", a.model, "-f", "-"], input=text.encode(),
                                          capture_output=True, check=True).stdout.split()]
    rows = []
    print(f"SmolLM2-135M-Instruct Q4_1, {a.threads} threads, {a.steps} decode steps after the prompt; "
          f"fastgen {a.fastgen_args or '(default options: 8-bit activations)'}, KV cache f16 in both")
    print(f"{'context':>7} {'engine':<26} {'prefill tok/s':>13} {'decode tok/s':>12} {'x llama.cpp':>11} "
          f"{'peak RSS MiB':>12} {'KV held/full':>12}")
    for ctx in (int(c) for c in a.contexts.split(",")):
        n_prompt = ctx - a.steps
        if n_prompt > len(ids):
            sys.exit(f"bench_smollm2: the texts give {len(ids)} tokens, fewer than {n_prompt}")
        prompt = ids[:n_prompt]
        base = 0.0
        for fa in (0, 1):
            out, rss = run([sys.executable, "-c", LLAMA_CHILD, a.model, str(ctx), str(a.threads), str(a.steps), str(fa)],
                           json.dumps(prompt).encode())
            r = json.loads(out)
            base = max(base, a.steps / r["decode_s"])
            rows.append({"context": ctx, "engine": "llama.cpp" + (" flash-attn" if fa else ""),
                         "prefill_tps": n_prompt / r["prefill_s"], "decode_tps": a.steps / r["decode_s"],
                         "peak_rss_mib": rss})
        # fastgen reads the prompt as ids: the text decoded back would not give exactly them
        prompt_file = f"/tmp/fastgen-bench-{os.getpid()}.txt"
        with open(prompt_file, "w") as f:
            f.write(" ".join(map(str, prompt)))
        runs = (("full", ["--policy", "full"]), ("adaptive 0.5", ["--policy", "fastgen-adaptive", "--budget", "0.5"]),
                ("adaptive 0.25", ["--policy", "fastgen-adaptive", "--budget", "0.25"]),
                ("paper T=0.95", ["--policy", "fastgen"]))
        for name, policy in runs:
            cmd = [a.fastgen, "generate", "-m", a.model, "--prompt-ids", prompt_file, "-n", str(a.steps), "--temp", "0",
                   "-t", str(a.threads), "--dtype", "f16", "--ignore-eos", "--json"] + policy + a.fastgen_args.split()
            out, rss = run(cmd)
            g = json.loads(out)
            rows.append({"context": ctx, "engine": f"fastgen {name}", "prefill_tps": n_prompt / g["prefill_s"],
                         "decode_tps": g["tokens_per_s"], "peak_rss_mib": rss,
                         "kv_held": g["kv_bytes_held"], "kv_full": g["kv_bytes_full"]})
        os.unlink(prompt_file)
        for row in rows[-2 - len(runs):]:
            kv = f"{row['kv_held'] / row['kv_full']:.1%}" if "kv_held" in row else "-"
            print(f"{ctx:>7} {row['engine']:<26} {row['prefill_tps']:>13.0f} {row['decode_tps']:>12.1f} "
                  f"{row['decode_tps'] / base:>11.2f} {row['peak_rss_mib']:>12.0f} {kv:>12}")
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
