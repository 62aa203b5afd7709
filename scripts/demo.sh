#!/usr/bin/env bash
# Fresh machine to `fastgen demo`: install, build, run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
[ -d build ] || meson setup build --buildtype=release -Dcuda=disabled -Dhip=disabled
ninja -C build
./build/tools/fastgen demo "$@"
