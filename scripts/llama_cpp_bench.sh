#!/usr/bin/env bash
# The llama-bench figures of docs/llama.cpp.md: stock llama.cpp (flash attention
# off and on) against --kv-compress full, fastgen-adaptive:0.5 and :0.25 on one
# model: decode (tg32) after a prompt of each depth, a first prompt of each
# length (ppN), and with APPEND=1 a second prompt of 512 tokens at each depth
# (pp512 @ dN: for fastgen an appended turn, fg_seq_append).
#
#   bash scripts/llama_cpp_bench.sh MODEL.gguf [DEPTHS] [PROMPTS] [REPS]
#   # DEPTHS default 1024,4096,8192; PROMPTS (the ppN lengths) default DEPTHS; REPS 1
#
# The binaries are scripts/llama-cpp.sh's (its --print; LLAMA_BIN overrides).
# -b 16384 makes each depth one llama_decode (for fastgen: the sequence's
# prompt, prefilled in -ub 2048 chunks, as stock computes it in -ub chunks).
# No warm-up runs (--no-warmup): each figure is one timed run after the model
# is loaded. Two threads; run nothing else beside it, and name the CPU with the
# figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: llama_cpp_bench.sh MODEL.gguf [DEPTHS] [PROMPTS] [REPS]}
depths=${2:-1024,4096,8192}
prompts=${3:-$depths}
reps=${4:-1}
bin=${LLAMA_BIN:-$(bash "$root/scripts/llama-cpp.sh" --print)}
threads=${THREADS:-2}
grep -m1 "model name" /proc/cpuinfo || true
echo "model: $model; decode at depths $depths, prompts of $prompts; $reps repetition(s); $threads threads"
tests="-n 32"
[ "${APPEND:-0}" = 1 ] && tests="-p 512 -n 32"
for cfg in "-fa 0" "-fa 1" "-fa 0 --kv-compress full" "-fa 0 --kv-compress fastgen-adaptive:0.5" \
           "-fa 0 --kv-compress fastgen-adaptive:0.25"; do
  echo "== $cfg"
  common=(-m "$model" -t "$threads" -b 16384 -ub 2048 -r "$reps" --no-warmup)
  # shellcheck disable=SC2086
  "$bin/llama-bench" "${common[@]}" -p "$prompts" -n 0 $cfg 2>&1 | grep -E '^\| .*pp[0-9]|error'
  # shellcheck disable=SC2086
  "$bin/llama-bench" "${common[@]}" -p 0 $tests -d "$depths" $cfg 2>&1 | grep -E '^\| .*(pp|tg)[0-9]|error'
done
