#!/usr/bin/env bash
# Builds `tpf`, the GPU tests and the C library of several revisions side by side on this
# machine (no GPU needed), for one device call that compares them: each REV (commit, branch or
# tag) in a temporary worktree, its binaries into .devbin/NAME/ (NAME: REV with '/' as '-'), then
# all of them xz-compressed into .devbin/bins.tar.xz, the file to carry.
#   dev/scripts/build_revs.sh REV...          e.g. main next/integrate
# On the GPU machine: tar -C .devbin -xJf .devbin/bins.tar.xz, then for example
#   MEM=1 dev/scripts/device_variants.sh .devbin/main .devbin/next-integrate
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -eq 0 ] || [ "$1" = "--help" ] || [ "$1" = "-h" ]; then sed -n 2,8p "$0"; exit 0; fi
NVCC=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
names=()
for rev in "$@"; do
  git rev-parse --verify --quiet "$rev^{commit}" >/dev/null || { echo "error: no revision '$rev'" >&2; exit 1; }
  name=${rev//\//-}
  wt=$(mktemp -d /tmp/tpf-rev-XXXXXX)
  trap 'git worktree remove --force "$wt" 2>/dev/null || true' EXIT
  git worktree add -q --detach "$wt" "$rev"
  echo "== $rev ($(git rev-parse --short "$rev")) -> .devbin/$name"
  cmake -S "$wt" -B "$wt/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$NVCC" >/dev/null
  cmake --build "$wt/build" -j "$(nproc)" --target tpf tpf_gpu_tests turbopairformer_c | tail -1
  rm -rf ".devbin/$name" && mkdir -p ".devbin/$name"
  cp "$wt/build/tpf" "$wt/build/tests/cpp/tpf_gpu_tests" "$wt/build/libturbopairformer_c.so" ".devbin/$name/"
  git rev-parse "$rev" > ".devbin/$name/REVISION"
  git worktree remove --force "$wt"
  trap - EXIT
  names+=("$name")
done
tar -C .devbin -cJf .devbin/bins.tar.xz "${names[@]}"
ls -l .devbin/bins.tar.xz
