#!/usr/bin/env bash
# The main job: build, then check accuracy and determinism against the FP64 reference, and
# time the kernels where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n 2,3p "$0"; exit 0; fi
bash scripts/install.sh
build/tpf info
build/tpf check
if build/tpf info | grep -q '^GPU 0'; then
  build/tpf bench
  build/tpf bench --op trimul
else
  echo "no CUDA GPU: skipping 'tpf bench'"
fi
