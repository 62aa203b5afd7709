#!/usr/bin/env bash
# SmolLM2-135M-Instruct against references outside this project:
#   token ids of tests/data/tokenizer-corpus.json against llama.cpp (llama-cpp-python)
#   and Hugging Face tokenizers; greedy ids against llama.cpp on
#   tests/data/smollm2-prompts.json (scripts/smollm2_check.py says what is compared).
#   --bench: the speed table against llama.cpp (scripts/bench_smollm2.py) as well.
#   --no-llama: HF tokenizers only (no llama.cpp build: what CI runs).
#   --numerics: the 8-bit products against ggml's own, bit for bit, and the
#     logits teacher-forced on llama.cpp's greedy ids against llama.cpp's and
#     each other (scripts/ggml_numerics.c and .py), instead of the checks above.
# The references go into a virtual environment in the model cache; installing
# llama-cpp-python builds llama.cpp from source (about 5 minutes on 2 cores,
# needs cmake and a C++ compiler; CMAKE_ARGS passes llama.cpp's options, e.g.
# "-DGGML_NATIVE=OFF -DGGML_AVX2=ON" where the native build dies).
# BUILD: the fastgen build directory (build); LLAMA_CPP_PYTHON: the version
# (0.3.36).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
bench=0 llama=1 numerics=0
for a in "$@"; do
  case $a in
    --bench) bench=1 ;;
    --no-llama) llama=0 ;;
    --numerics) numerics=1 ;;
    *) echo "usage: scripts/smollm2-check.sh [--bench] [--no-llama] [--numerics]" >&2; exit 2 ;;
  esac
done
if [ $numerics = 1 ] && { [ $llama = 0 ] || [ $bench = 1 ]; }; then
  echo "smollm2-check.sh: --numerics runs alone: not with --no-llama or --bench" >&2
  exit 2
fi
model=$(bash scripts/get-models.sh smollm2 | awk '$1 == "smollm2" { print $2 }')
cache=${FASTGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastgen}
venv=$cache/venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pkgs=(numpy gguf==0.19.0 tokenizers==0.23.3)
[ $llama = 1 ] && pkgs+=("llama-cpp-python==${LLAMA_CPP_PYTHON:-0.3.36}")
"$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}"
[ -x "$build/tools/fastgen" ] || { echo "smollm2-check.sh: no $build/tools/fastgen: build first (meson setup $build && ninja -C $build)" >&2; exit 1; }
if [ $numerics = 1 ]; then
  [ -x "$build/tools/ggml_numerics" ] || { echo "smollm2-check.sh: no $build/tools/ggml_numerics" >&2; exit 1; }
  pkg=$("$venv/bin/python" -c 'import llama_cpp, os; print(os.path.dirname(llama_cpp.__file__))')
  lib=$(find "$pkg" -name libggml-cpu.so -print -quit)  # one CPU library, not a build of variants
  [ -n "$lib" ] || { echo "smollm2-check.sh: no libggml-cpu.so under $pkg" >&2; exit 1; }
  rc=0
  "$build/tools/ggml_numerics" products "$model" "$lib" || rc=$?
  "$venv/bin/python" scripts/ggml_numerics.py --numerics "$build/tools/ggml_numerics" --fastgen "$build/tools/fastgen" \
    --model "$model" --data tests/data || rc=$?
  exit $rc
elif [ $llama = 1 ]; then
  "$venv/bin/python" scripts/smollm2_check.py --fastgen "$build/tools/fastgen" --model "$model" --data tests/data
else
  "$venv/bin/python" scripts/smollm2_check.py --fastgen "$build/tools/fastgen" --model "$model" --data tests/data --no-llama
fi
if [ $bench = 1 ]; then
  "$venv/bin/python" scripts/bench_smollm2.py --fastgen "$build/tools/fastgen" --model "$model"
fi
