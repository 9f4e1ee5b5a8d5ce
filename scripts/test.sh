#!/usr/bin/env bash
# Builds everything and runs every test, installing what the tests need:
#   1. CTest: the C++ suites ('cpu' everywhere, 'gpu' on an sm_90a GPU, else skipped with the reason);
#   2. the user's install route: `pip install .` into a virtual environment (.venv, made here),
#      with PyTorch and the test tools from the package registry, then an import and a CPU call;
#   3. pytest on that installed package (GPU tests skipped with the reason where there is none).
# A pytest run in which no test ran fails (tests/python/conftest.py).
#
#   scripts/test.sh              # everything
#   PYTHON=/path/python scripts/test.sh   # use that interpreter's environment instead of .venv
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n 2,10p "$0"; exit 0; fi

bash scripts/install.sh
ctest --test-dir build --output-on-failure -j "$(nproc)"
if ! build/tpf info | grep -q '^GPU 0'; then
  echo "note: the 'gpu' tests were skipped: no CUDA GPU on this machine (they need an sm_90a GPU)"
fi

PY=${PYTHON:-}
if [ -z "$PY" ]; then
  bash scripts/venv.sh .venv
  PY=$PWD/.venv/bin/python
fi
# The package itself, built the way a user builds it; the CMake build tree is kept in
# build/wheel (pyproject.toml), so a second run only relinks.
"$PY" -m pip install -q --no-deps --force-reinstall .
"$PY" -m pip install -q ".[test]"   # what the tests import (PyTorch, pytest, numpy, matplotlib)
# Outside the source tree, so that the installed package (not python/) is what is imported.
(cd /tmp && "$PY" -c "
import torch, turbopairformer as tpf
q = torch.randn(1, 2, 1, 3, 8, dtype=torch.float64)
out = tpf.triangle_attention(q, q, q, torch.zeros(1, 1, 1, 3, 3, dtype=torch.float64))
assert out.shape == q.shape and torch.isfinite(out).all()
print('installed', tpf.__version__, 'from', tpf.LIBRARY_PATH, '- CPU call ok')")
"$PY" -m pytest tests/python -q -rs -p no:cacheprovider
