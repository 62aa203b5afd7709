#!/usr/bin/env bash
# Installs what fastgen builds with, from Debian's archive (run as root).
set -euo pipefail
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends \
    build-essential meson ninja-build pkg-config libopenblas-dev python3 python3-dev python3-venv >/dev/null
else
  echo "scripts/deps.sh: not root or no apt-get; assuming meson, ninja, pkg-config, OpenBLAS and a C compiler are installed" >&2
fi
