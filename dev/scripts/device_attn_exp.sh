#!/usr/bin/env bash
# On the GPU machine: what the backward's bias gradient and its ordered dQ hand-off cost, at
# N = 768, D = 32. BIN: a normal build; EXP: a build configured with
# -DCMAKE_CUDA_FLAGS=-DTPF_EXPERIMENT_NO_DQ_ORDER=1 (wrong dQ: it skips waiting for the turn).
# Usage: dev/scripts/device_attn_exp.sh BIN_DIR EXP_DIR
set -u
BIN=${1:?normal build folder}; EXP=${2:?no-dQ-order build folder}
for v in "$BIN|" "$BIN|--no-dbias" "$EXP|" "$EXP|--no-dbias"; do
  b=${v%%|*}; f=${v#*|}
  echo "== $b $f"; "$b/tpf" bench --n 768 --d 32 --iters 20 $f 2>&1 | tail -1
done
