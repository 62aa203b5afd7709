#!/usr/bin/env bash
# How much slower fastgen gets when another CPU-bound process shares the
# machine (issue: threads that spin at barriers wait out their partners' time
# slices). Times, idle and beside the competitor, each the median of three:
#   fastgen generate on SmolLM2 (16 tokens after a short prompt), default options
#   bench_decode --quick --model llama2-7b
# Competitors: a shell busy loop, and a second fastgen process (eval on SmolLM2).
# Target: at most 2x the idle time beside a busy loop.
#
# usage: scripts/busy_machine.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
fastgen=$build/tools/fastgen
bench=$build/bench/bench_decode
model=$(bash scripts/get-models.sh --offline smollm2 | awk '$1 == "smollm2" { print $2 }')
[ -n "$model" ] || { echo "SmolLM2 is not in the cache: bash scripts/get-models.sh" >&2; exit 1; }

seconds() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
median3() { local a b c; a=$(seconds "$@"); b=$(seconds "$@"); c=$(seconds "$@"); printf '%s\n' "$a" "$b" "$c" | sort -n | sed -n 2p; }
gen() { median3 "$fastgen" generate -m "$model" -p "The capital of France is" -n 16; }
dec() { median3 "$bench" --quick --model llama2-7b; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2fx", a / b }'; }

echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; $("$fastgen" version | head -n 1)"
g0=$(gen); d0=$(dec)
(while :; do :; done) & loop=$!
sleep 0.3
g1=$(gen); d1=$(dec)
kill $loop; wait $loop 2>/dev/null || true
"$fastgen" eval -m "$model" --limit 8 -n 64 -q >/dev/null 2>&1 & other=$!
sleep 0.5
g2=$(gen)
kill $other; wait $other 2>/dev/null || true
printf '%-34s %10s %18s %22s\n' "" "idle ms" "beside a busy loop" "beside a fastgen eval"
printf '%-34s %10s %12s %5s %16s %5s\n' "generate SmolLM2, 16 tokens" "$g0" "$g1" "$(ratio "$g1" "$g0")" "$g2" "$(ratio "$g2" "$g0")"
printf '%-34s %10s %12s %5s\n' "bench_decode --quick (llama2-7b)" "$d0" "$d1" "$(ratio "$d1" "$d0")"
