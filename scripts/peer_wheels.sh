#!/usr/bin/env bash
# Downloads the comparison peers' wheels (cuEquivariance 0.13 for CUDA 13, trifast, and the small
# pure-Python dependencies a lent GPU machine may lack) on a machine with network, for a GPU
# machine without it. cuequivariance-ops-cu13 alone goes to DIR/ops (it and the torch ops wheel
# together pass one call's 64 MiB carry), the rest to DIR/rest, and all of them unpacked into
# one xz tarball DIR.tar.xz (~30 MB, under the carry). On the GPU machine, in one call:
#   scripts/device.sh peers-site DIR.tar.xz        # into /tmp/peersite; prints the PYTHONPATH
# or, for our installed wheel beside them, two calls back to back (the machine still warm):
#   scripts/device.sh peers-ops DIR/ops            # into /tmp/peers-ops, outside the tree
#   TPF_VENV=/tmp/tv scripts/device.sh peers DIR/rest [WHEEL]   # our wheel + the rest, linked
#   scripts/peer_wheels.sh [DIR] [PYTHON_VERSION]   (defaults: dist/peers, 3.12)
set -euo pipefail
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then sed -n 2,11p "$0"; exit 0; fi
dir=${1:-dist/peers}
py=${2:-3.12}
mkdir -p "$dir/ops" "$dir/rest"
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 "$@"; }
get -d "$dir/ops" cuequivariance-ops-cu13==0.13.*
get -d "$dir/rest" cuequivariance-ops-torch-cu13==0.13.* cuequivariance-torch==0.13.* cuequivariance==0.13.* \
  trifast opt_einsum nvidia-ml-py einops tqdm platformdirs
du -sh "$dir/ops" "$dir/rest"
site=$(mktemp -d)/peersite
mkdir -p "$site"
for w in "$dir"/ops/*.whl "$dir"/rest/*.whl; do python3 -m zipfile -e "$w" "$site"; done
tar -C "$(dirname "$site")" -cf - peersite | xz -T0 -6 > "$dir.tar.xz"
rm -rf "$(dirname "$site")"
ls -la "$dir.tar.xz"
