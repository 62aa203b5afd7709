#!/usr/bin/env bash
# The llama-bench figures of docs/llama.cpp.md: stock llama.cpp (flash attention
# off and on) against --kv-compress full, fastgen-adaptive:0.5 and :0.25, decode
# (tg32) and a second prompt (pp512) at each depth, and a first prompt of each
# depth's length (ppN), on one model.
#
#   bash scripts/llama_cpp_bench.sh MODEL.gguf [DEPTHS] [REPS]   # DEPTHS default 1024,4096,8192; REPS 1
#
# The binaries are scripts/llama-cpp.sh's (its --print). -b 16384 makes each
# depth one llama_decode (for fastgen: the sequence's prompt, prefilled in
# -ub 2048 chunks, as stock computes it in -ub chunks); pp512 @ dN is then a
# second turn at that depth (fastgen: fg_seq_append). Two threads; run nothing
# else beside it, and name the CPU with the figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: llama_cpp_bench.sh MODEL.gguf [DEPTHS] [REPS]}
depths=${2:-1024,4096,8192}
reps=${3:-1}
bin=${LLAMA_BIN:-$(bash "$root/scripts/llama-cpp.sh" --print)}
threads=${THREADS:-2}
grep -m1 "model name" /proc/cpuinfo || true
echo "model: $model; depths $depths; $reps repetition(s); $threads threads"
for cfg in "-fa 0" "-fa 1" "-fa 0 --kv-compress full" "-fa 0 --kv-compress fastgen-adaptive:0.5" \
           "-fa 0 --kv-compress fastgen-adaptive:0.25"; do
  echo "== $cfg"
  # shellcheck disable=SC2086
  "$bin/llama-bench" -m "$model" -t "$threads" -p "$depths" -n 0 -b 16384 -ub 2048 -r "$reps" $cfg \
    2>&1 | grep -E '^\| (model|---|.*(pp|tg)[0-9])|error|kv-compress'
  # shellcheck disable=SC2086
  "$bin/llama-bench" -m "$model" -t "$threads" -p 512 -n 32 -d "$depths" -b 16384 -ub 2048 -r "$reps" $cfg \
    2>&1 | grep -E '^\| .*(pp|tg)[0-9]|error'
done
