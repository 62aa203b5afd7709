#!/usr/bin/env python3
"""Server throughput and memory of docs/llama.cpp.md: llama-server with 4
slots, four concurrent chat requests over ~4k-token documents, stock llama.cpp
against --kv-compress.

    python3 scripts/llama_cpp_serve_bench.py BIN_DIR MODEL.gguf [--tokens 4096] [--gen 64]

For each setting: the wall time of the four requests together, prompt and
generated tokens per second over it, the server's peak RSS (VmHWM), the KV
bytes llama.cpp reports (stock: its cache's size; fastgen: /slots' held and
full bytes per slot), and whether each answer equals stock -fa off's.
Two threads; run nothing else beside it.
"""
import argparse
import json
import os
import re
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_cpp_check import Server  # noqa: E402

LICENSES = "/usr/share/common-licenses"


def corpus():
    parts = []
    for name in sorted(os.listdir(LICENSES)):
        path = os.path.join(LICENSES, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
    return "\n\n".join(parts)


def peak_rss_mib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bindir")
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=4096, help="prompt length per request, about")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--settings", default="-fa off;-fa on;--kv-compress full;--kv-compress fastgen-adaptive:0.5",
                    help="';'-separated llama-server options, the first is the reference")
    a = ap.parse_args()
    text = corpus()
    chars = a.tokens * 4  # ~4 characters per token on English text
    step = (len(text) - chars) // 4
    docs = ["Here is a document.\n\n%s\n\nIn one sentence, what is this document about?"
            % text[i * step:i * step + chars] for i in range(4)]
    ctx = 4 * (a.tokens * 5 // 4 + a.gen + 256)
    ref = None
    print("4 slots, 4 concurrent requests of ~%d prompt tokens, %d generated each, -c %d, 2 threads"
          % (a.tokens, a.gen, ctx), flush=True)
    for setting in a.settings.split(";"):
        args = setting.split()
        s = Server(a.bindir, a.model, "-np", "4", "-c", str(ctx), "-b", "2048", "-lv", "4", *args)
        try:
            out = [None] * 4

            def ask(i):
                st, r = s.request("POST", "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": docs[i]}], "max_tokens": a.gen,
                    "temperature": 0, "seed": 1})
                out[i] = r if st == 200 else {"error": st, "body": r}
            t0 = time.time()
            threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.time() - t0
            bad = [o for o in out if "error" in o]
            if bad:
                print("%-40s failed: %s" % (setting, str(bad[0])[:300]), flush=True)
                continue
            n_prompt = sum(o["usage"]["prompt_tokens"] for o in out)
            n_gen = sum(o["usage"]["completion_tokens"] for o in out)
            texts = [o["choices"][0]["message"]["content"] for o in out]
            if ref is None:
                ref = texts
            same = sum(x == y for x, y in zip(texts, ref))
            st, slots = s.get("/slots")
            kv = ""
            if st == 200 and slots and "kv_bytes_held" in slots[0]:
                held = sum(x["kv_bytes_held"] for x in slots)
                full = sum(x["kv_bytes_full"] for x in slots)
                kv = "KV held %.1f MiB of a full cache's %.1f MiB (%.3f; slots %s)" % (
                    held / 2**20, full / 2**20, held / max(1, full),
                    ", ".join("%.3f" % (x["kv_bytes_held"] / max(1, x["kv_bytes_full"])) for x in slots))
            # what llama.cpp's own caches allocated (stock: all of it; fastgen: a model's SWA layers)
            alloc = [float(m.group(1)) for m in re.finditer(r"llama_kv_cache: size = +([0-9.]+) MiB", s.text())]
            if alloc:
                kv += "; llama.cpp's KV caches %.1f MiB" % sum(alloc)
            print("%-40s %6.1f s  prompt %5.0f t/s  gen %5.1f t/s  peak RSS %6.0f MiB  answers = first's: %d/4  %s"
                  % (setting, wall, n_prompt / wall, n_gen / wall, peak_rss_mib(s.proc.pid), same, kv), flush=True)
        finally:
            s.stop()


if __name__ == "__main__":
    main()
