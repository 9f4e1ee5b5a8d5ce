#!/usr/bin/env bash
# On the GPU machine: what the backward's reductions cost, from a TPF_EXPERIMENT_PHASES build
# (dev/scripts/build_variant.sh NAME backward "-DTPF_EXPERIMENT_PHASES=1"), whose env TPF_BWD_SKIP
# skips parts of them (wrong gradients; timing only; backward.cu's BwdSkip): 1 the dbias warps'
# sums, 2 the dQ adds, 4 the dQ turn waits; and bytes: 8 quad 1's Q / dO tile loads, 16 the old
# dbias partial's reads, 32 the dq_acc reads, 64 every tile load after the first step; and the
# math's parts: 128 the exponentials, 256 the dQ part, 512 the fp32 dS^T stores, 1024 quad 1's
# tensor products and exponentials (wgmma builds). Prints fwd+bwd
# per setting, two rounds, next to a shipped build.
# Usage: dev/scripts/device_reduction_bound.sh PHASES_BIN_DIR SHIPPED_BIN_DIR [N] [D] ["SKIPS"]
set -u
P=${1:?phases build dir}; H=${2:?shipped build dir}; N=${3:-768}; D=${4:-32}; SKIPS=${5:-0 1 4 6 7}
for r in 1 2; do
  for s in $SKIPS; do
    echo "skip=$s r=$r $(TPF_BWD_SKIP=$s timeout 60 "$P/tpf" bench --n "$N" --d "$D" --iters 20 2>/dev/null | awk '/^ +[0-9]/')"
  done
  echo "shipped r=$r $(timeout 60 "$H/tpf" bench --n "$N" --d "$D" --iters 20 2>/dev/null | awk '/^ +[0-9]/')"
done
