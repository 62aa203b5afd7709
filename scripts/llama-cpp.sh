#!/usr/bin/env bash
# Builds llama.cpp with fastgen inside (docs/llama.cpp.md): llama-server,
# llama-cli, llama-bench and llama-perplexity with --kv-compress SPEC.
#
#   bash scripts/llama-cpp.sh            # fetch, check, patch, build
#   bash scripts/llama-cpp.sh --print    # the folder of the binaries, nothing built
#   bash scripts/llama-cpp.sh --fetch    # the sdist into the cache only (CI fetches it ahead)
#
# llama.cpp comes from PyPI, pinned: the sdist of llama-cpp-python 0.3.36
# carries it under vendor/llama.cpp (commit 0c1e57098bba, whose own build
# number the sdist does not record: it holds a shallow clone, so the binaries
# say b0-0c1e570). The sdist is checked against its sha256, its llama.cpp
# patched with integrations/llama.cpp/llama.cpp.patch (ours; its context
# lines are llama.cpp's, MIT) and built against the libfastgen of $BUILD
# (default build/, the README's meson build; CPU backend). Without
# --kv-compress the binaries are stock llama.cpp.
#
# Environment: BUILD (fastgen's meson build), LLAMA_CPP_DIR (where llama.cpp
# goes; default build-llama.cpp/ in the repository), FASTGEN_CACHE (where the
# sdist is kept, as scripts/get-models.sh keeps the models), JOBS, TARGETS (the
# tools to build, space-separated; CI builds the three its checks run),
# LLAMA_CPP_QUICK=1 (CI's: a unity build, and the C++ front ends - common,
# the server, mtmd, the tools - at -O1 while ggml and libllama keep their
# -O3; integrations/llama.cpp/quick-build.cmake; 5.0 min instead of 8.6 for
# CI's three tools on 2 cores. For checks, not for the figures a benchmark
# reports: those come from the default build).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/${BUILD:-build}
dir=${LLAMA_CPP_DIR:-$root/build-llama.cpp}
cache=${FASTGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastgen}
jobs=${JOBS:-$(nproc)}

sdist_pin=llama-cpp-python==0.3.36
sdist=llama_cpp_python-0.3.36.tar.gz
sdist_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
llama_commit=0c1e570
llama_build_number=0
patch=$root/integrations/llama.cpp/llama.cpp.patch
read -r -a targets <<< "${TARGETS:-llama-server llama-cli llama-bench llama-perplexity}"

if [ "${1:-}" = --print ]; then
  echo "$dir/build/bin"
  exit 0
fi

checked() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }
fetch() {
  mkdir -p "$cache"
  if ! checked "$cache/$sdist" "$sdist_sha256"; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    if ! python3 -m pip --version >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
    fi
    echo "llama-cpp.sh: downloading the sdist of $sdist_pin from PyPI (about 77 MB)" >&2
    python3 -m pip download --quiet --no-deps --no-binary :all: --disable-pip-version-check "$sdist_pin" -d "$tmp" >&2
    mv "$tmp/$sdist" "$cache/$sdist.part"
    if ! checked "$cache/$sdist.part" "$sdist_sha256"; then
      rm -f "$cache/$sdist.part"
      echo "llama-cpp.sh: $sdist does not have the expected sha256 $sdist_sha256" >&2
      exit 1
    fi
    mv "$cache/$sdist.part" "$cache/$sdist"
  fi
}
if [ "${1:-}" = --fetch ]; then
  fetch
  exit 0
fi

[ -f "$build/libfastgen.so" ] && [ -f "$build/include/fastgen_version.h" ] || {
  echo "llama-cpp.sh: no libfastgen in $build: build fastgen first (README: meson setup build && ninja -C build)" >&2
  exit 1
}
if ! command -v cmake >/dev/null && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends cmake >/dev/null
fi
command -v cmake >/dev/null || { echo "llama-cpp.sh: cmake is needed" >&2; exit 1; }

fetch

# the source, patched once: a stamp names the patch it carries, and a changed patch starts again from the sdist
stamp=$(sha256sum "$patch" | cut -c1-16)
if [ "$(cat "$dir/src/.fastgen-patch" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$dir/src"
  mkdir -p "$dir/src"
  tar -xzf "$cache/$sdist" -C "$dir/src" --strip-components=3 "${sdist%.tar.gz}/vendor/llama.cpp"
  rm -f "$dir/src/.git"  # the sdist's submodule link: llama.cpp is built as plain files
  patch -d "$dir/src" -p1 --quiet --forward < "$patch"
  echo "$stamp" > "$dir/src/.fastgen-patch"
fi

# GGML_NATIVE builds for this CPU; AMX off: a CPU that lists it under a kernel that does not grant the
# tile state faults on its first instruction (this project's machines do), and fastgen uses none
flags=""
case "$(uname -m)" in x86_64) flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" ;; esac
quick=(-DCMAKE_UNITY_BUILD=OFF -UCMAKE_PROJECT_INCLUDE)
[ "${LLAMA_CPP_QUICK:-0}" = 1 ] && quick=(-DCMAKE_UNITY_BUILD=ON "-DCMAKE_PROJECT_INCLUDE=$root/integrations/llama.cpp/quick-build.cmake")
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# a build folder made by another generator cannot be configured again: it starts anew
cache_generator=$(sed -n 's/^CMAKE_GENERATOR:INTERNAL=//p' "$dir/build/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$cache_generator" ] && [ "$cache_generator" != "$([ ${#generator[@]} -gt 0 ] && echo Ninja || echo 'Unix Makefiles')" ]; then
  rm -rf "$dir/build"
fi
cmake -S "$dir/src" -B "$dir/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${quick[@]}" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_SERVER=ON \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_NUMBER=$llama_build_number -DLLAMA_BUILD_COMMIT=$llama_commit \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DLLAMA_FASTGEN_GLUE="$root/integrations/llama.cpp" \
  -DLLAMA_FASTGEN_INCLUDE="$root/include;$build/include" \
  -DLLAMA_FASTGEN_LIBRARY="$build/libfastgen.so" >"$dir/cmake.log"
cmake --build "$dir/build" --target "${targets[@]}" -j "$jobs" >"$dir/build.log" 2>&1 || {
  tail -n 40 "$dir/build.log" >&2
  exit 1
}
echo "llama-cpp.sh: ${targets[*]} in $dir/build/bin" >&2
echo "$dir/build/bin"
