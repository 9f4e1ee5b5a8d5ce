#!/usr/bin/env bash
# Builds everything and runs every test: CTest (C++: 'cpu' everywhere, 'gpu' on an sm_90a GPU)
# and pytest (tests/python: needs PyTorch; GPU tests need the GPU). Tests that cannot run here
# are reported as skipped, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
if ! build/tpf info | grep -q '^GPU 0'; then
  echo "note: the 'gpu' tests were skipped: no CUDA GPU on this machine (they need an sm_90a GPU)"
fi
PY=${PYTHON:-python3}
"$PY" -c "import pytest" 2>/dev/null || "$PY" -m pip install -q pytest
TPF_LIBRARY="$PWD/build/libturbopairformer_c.so" PYTHONPATH="$PWD/python" \
  "$PY" -m pytest tests/python -q -rs
