#!/usr/bin/env bash
# Builds everything and runs every test. GPU tests skip themselves (and are reported as
# skipped, with the reason) on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
if ! build/tpf info | grep -q '^GPU 0'; then
  echo "note: the 'gpu' tests were skipped: no CUDA GPU on this machine (they need an sm_90a GPU)"
fi
