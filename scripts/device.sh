#!/usr/bin/env bash
# Maintainer's driver for a machine with an sm_90a GPU (H100/H200). Run from the repository root.
#
#   scripts/device.sh wheel-test [WHEEL]   # a fresh virtual environment, `pip install` of a wheel
#                                          # built elsewhere (default dist/*.whl), `tpf info`, then
#                                          # the whole pytest suite (GPU tests included) against it
#   scripts/device.sh gpu-tests [BUILD]    # the C++ GPU suite of a build tree (default build/)
#   scripts/device.sh head-dims [OUT]      # bench of every head dim, padded and native
#
# PyTorch is taken from the machine's python3 (its site-packages are linked into the fresh
# environment), as a user's existing PyTorch would be. TPF_VENV=DIR keeps the environment at DIR;
# PY=DIR/bin/python then runs head-dims with the installed wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
case "$cmd" in
  wheel-test)
    wheel=${2:-$(ls dist/turbopairformer-*.whl | head -n 1)}
    venv=${TPF_VENV:-$(mktemp -d)/venv}
    rm -rf "$venv"
    python3 -m venv "$venv"
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$site/host-torch.pth"
    "$venv/bin/python" -m pip install -q --no-index "$wheel"
    "$venv/bin/tpf" info
    (cd /tmp && "$venv/bin/python" -c "import turbopairformer as t; print('imported', t.__version__, 'from', t.LIBRARY_PATH)")
    "$venv/bin/python" -m pytest tests/python -q -rs -p no:cacheprovider
    ;;
  gpu-tests)
    "${2:-build}/tests/cpp/tpf_gpu_tests" --gtest_brief=1
    ;;
  head-dims)
    "${PY:-python3}" -m turbopairformer.bench --head-dims 8,16,24,32,48,64,96,128 --n 384,768 --out "${2:-bench/results/h200}"
    ;;
  -h|--help|"")
    sed -n 2,12p "$0"
    ;;
  *)
    echo "scripts/device.sh: unknown command '$cmd' (see --help)" >&2; exit 2
    ;;
esac
