#!/usr/bin/env bash
# Makes (or reuses) a virtual environment at $1 (default .venv) with an up-to-date pip, installing
# Debian's python3-venv first where the interpreter lacks the venv module.
#   scripts/venv.sh [DIR]
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n 2,4p "$0"; exit 0; fi
dir=${1:-.venv}
base=${BASE_PYTHON:-python3}
if [ ! -x "$dir/bin/python" ]; then
  if ! "$base" -m venv "$dir" 2>/dev/null; then
    echo "installing: python3-venv"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv python3-pip
    rm -rf "$dir"
    "$base" -m venv "$dir"
  fi
fi
"$dir/bin/python" -m pip install -q --upgrade pip
