#!/usr/bin/env bash
# A model's key scorer, the retrieval-safe default of fastgen-adaptive
# (observe=scores): `fastgen calibrate` on Debian's licence texts, written
# beside the model as MODEL.fgscore, where generate, eval, demo and the
# Python Model find it. The texts are neither the evaluation's (Python's
# docstrings, scripts/needle.py) nor the demo's document (Apache-2.0).
#
#   bash scripts/calibrate.sh MODEL [fastgen calibrate options, e.g. --max-tokens 6144]
#
# $FASTGEN: the fastgen binary (default ./build/tools/fastgen).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bash scripts/calibrate.sh MODEL [fastgen calibrate options]" >&2; exit 2; }
model=$1
shift
fastgen=${FASTGEN:-./build/tools/fastgen}
texts=()
for t in GPL-3 MPL-2.0 LGPL-2.1 GFDL-1.3 GPL-2; do
  f=/usr/share/common-licenses/$t
  [ -f "$f" ] || { echo "calibrate.sh: $f is missing (Debian's base-files ships it)" >&2; exit 1; }
  texts+=(--text "$f")
done
exec "$fastgen" calibrate -m "$model" "${texts[@]}" --max-tokens 10240 -q "$@"
