#!/usr/bin/env bash
# Compares builds on the GPU machine, one after another in one call: for each BIN_DIR, the op's
# GPU tests, `tpf bench` and (trimul) per-kernel times; with ACC=1 (trimul) also
# `tpf trimul-table` (N = 384, 768) and the Python accuracy table (384, 768); with MEM=1 (trimul)
# the peak memory and time of forward + backward, low_memory off and on, at N = 768, 2048, 4096
# (dev/scripts/device_trimul_memory.py on the build's library).
# OP=trimul (default) or OP=attention (GPU tests *Attention*, `tpf bench --n 384,768 --d 16,32`).
# At most 8 files come back from $OUT: tar them when comparing more than one build.
# Usage: [OP=attention] [ACC=1] [MEM=1] dev/scripts/device_variants.sh BIN_DIR...
set -u
OUT=${OUT:-/tmp/out}
OP=${OP:-trimul}
for BIN in "$@"; do
  o="$OUT/$(basename "$BIN")"; mkdir -p "$o"
  if [ "$OP" = attention ]; then
    timeout 300 "$BIN/tpf_gpu_tests" --gtest_filter='*Attention*' --gtest_brief=1 > "$o/gtest.txt" 2>&1
    echo "== $BIN gtests rc=$? $(tail -1 "$o/gtest.txt")"; grep -E "^\[  FAILED" "$o/gtest.txt" | head -6
    "$BIN/tpf" bench --n 384,768 --d 16,32 --iters 20 > "$o/bench.txt" 2>&1
    continue
  fi
  timeout 150 "$BIN/tpf_gpu_tests" --gtest_filter='*Trimul*:-*Large*' --gtest_brief=1 > "$o/gtest.txt" 2>&1
  echo "== $BIN gtests rc=$? $(tail -1 "$o/gtest.txt")"; grep -E "^\[  FAILED|error/floor" "$o/gtest.txt" | head -6
  "$BIN/tpf" bench --op trimul --n 384,768 --iters 20 > "$o/bench.txt" 2>&1
  bash scripts/device.sh profile "$BIN/tpf" --op trimul --n 768 > "$o/kernel_times.txt" 2>&1
  if [ "${MEM:-0}" = 1 ]; then
    TPF_LIBRARY="$PWD/$BIN/libturbopairformer_c.so" PYTHONPATH=python:dev/scripts timeout 240 \
      python3 dev/scripts/device_trimul_memory.py --n 768,2048,4096 --label "$(basename "$BIN")" > "$o/memory.txt" 2>&1
    echo "memory rc=$?"
  fi
  if [ "${ACC:-0}" = 1 ]; then
    timeout 200 "$BIN/tpf" trimul-table --n 384,768 --ref-max-n 768 --iters 20 --out "$o" > "$o/table_log.txt" 2>&1
    echo "table rc=$?"; tail -2 "$o/trimul.md"
    TPF_LIBRARY="$PWD/$BIN/libturbopairformer_c.so" PYTHONPATH=python timeout 200 python -m turbopairformer.bench \
      --trimul-accuracy 384,768 --out "$o" > "$o/acc_log.txt" 2>&1
    echo "accuracy rc=$?"; tail -2 "$o/trimul_accuracy.md"
  fi
done
for BIN in "$@"; do
  o="$OUT/$(basename "$BIN")"
  echo "== $BIN"
  [ -f "$o/kernel_times.txt" ] && head -6 "$o/kernel_times.txt"
  [ -f "$o/memory.txt" ] && cat "$o/memory.txt"
  tail -5 "$o/bench.txt"
done
