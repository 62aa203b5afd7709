#!/usr/bin/env bash
# The perplexity figures of docs/llama.cpp.md: llama-perplexity --kl-divergence
# of every --kv-compress method at 50 % and 25 % kept against stock llama.cpp
# (-fa on: the base), and stock -fa off's own divergence (the arithmetic's noise).
#
#   bash scripts/llama_cpp_kl.sh MODEL.gguf [TEXT] [CHUNKS]   # TEXT default: Debian's licences, joined
#
# -c 2048 -b 1024: each chunk's first 1024 tokens are a prompt (fastgen
# compresses it), its next 1024 an appended turn under each head's policy, and
# llama-perplexity scores exactly those (the second half of each chunk): the
# KL of a continuation read through a compressed prompt. Binaries from
# scripts/llama-cpp.sh (--print; LLAMA_BIN= others); two threads, nothing else
# beside it. METHODS="snapkv h2o" runs those presets only, after the references.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=${1:?usage: llama_cpp_kl.sh MODEL.gguf [TEXT] [CHUNKS]}
chunks=${3:-3}
bin=${LLAMA_BIN:-$(bash "$root/scripts/llama-cpp.sh" --print)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
text=${2:-}
if [ -z "$text" ]; then
  text=$tmp/licences.txt
  cat /usr/share/common-licenses/{GPL-3,Apache-2.0,MPL-2.0,LGPL-3,GFDL-1.3,Artistic} > "$text"
fi
run() { "$bin/llama-perplexity" -m "$model" -f "$text" -c 2048 -b 1024 --chunks "$chunks" -t 2 "$@" 2>&1; }
grep -m1 "model name" /proc/cpuinfo || true
echo "model: $model; text: $text ($(wc -c < "$text") bytes); -c 2048 -b 1024 --chunks $chunks"
run -fa on --kl-divergence-base "$tmp/base.kld" | grep -E "Final estimate" | sed 's/^.*Final/stock -fa on (base): Final/'
kl() {
  local out
  out=$(run --kl-divergence-base "$tmp/base.kld" --kl-divergence "$@")
  printf '%-48s %s   %s\n' "$*" "$(echo "$out" | grep -E 'Mean +KLD:' | sed 's/ \+/ /g')" \
    "$(echo "$out" | grep -E 'Same top p:' | sed 's/ \+/ /g')"
}
kl -fa off
kl -fa off --kv-compress full
kl -fa off --kv-compress fastgen
for r in 0.5 0.25; do
  # with MODEL.fgscore beside the model, fastgen-adaptive ranks by that scorer (llama.cpp's tools add it):
  # the tail's row beside it
  tail_row=""
  [ -f "$model.fgscore" ] && tail_row=fastgen-adaptive:$r:observe=tail
  for m in ${METHODS:-fastgen-adaptive $tail_row fastgen-adaptive:$r:observe=predicted h2o tova snapkv streamingllm}; do
    case $m in *:*) spec=$m ;; *) spec=$m:$r ;; esac
    kl -fa off --kv-compress "$spec"
  done
done
