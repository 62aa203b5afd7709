#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each one on
# its corpus in tests/fuzz/corpus/; new interesting inputs are added there.
# usage: scripts/fuzz.sh [SECONDS per target, default 120] [libFuzzer options...]
# Needs clang and libclang-rt-14-dev (apt-get install clang libclang-rt-14-dev).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-120}
shift || true
if [ ! -d build-fuzz ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized \
    -Dcuda=disabled -Dhip=disabled -Dbench=false
fi
ninja -C build-fuzz tests/fuzz_model tests/fuzz_tokenizer tests/fuzz_gguf tests/fuzz_api
for t in model tokenizer gguf api; do
  echo "== fuzz_$t for ${secs}s"
  ./build-fuzz/tests/fuzz_$t -max_total_time="$secs" -max_len=8192 -timeout=30 -artifact_prefix=build-fuzz/ "$@" \
    tests/fuzz/corpus/$t
done
