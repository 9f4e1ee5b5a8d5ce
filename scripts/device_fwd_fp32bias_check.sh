#!/usr/bin/env bash
# On the GPU machine: the fp32-bias forward's TMA path (v19) in one call: the attention GPU
# tests, the three sanitizers on its small cases, then alternating A/B rounds of
# `tpf bench --bias-dtype fp32` over the builds given.
# Usage: scripts/device_fwd_fp32bias_check.sh TESTS_DIR ROUNDS BIN_DIR...
set -u
T=${1:?dir with tpf_gpu_tests}; R=${2:?rounds}; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 240 "$T/tpf_gpu_tests" --gtest_brief=1 --gtest_filter='*Attention*:*GpuReference*' > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt")"; grep -E "^\[  FAILED" "$OUT/gpu_tests.txt" | head
F='*S3_N8_D32_bf16_biasfp32*:*S3_N64_D32*:*S4_N96_D32_bf16_biasfp32*'
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 "$T/tpf_gpu_tests" --gtest_filter="$F" \
    --gtest_brief=1 > "$OUT/sanitize_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.txt" | tail -1) $(tail -1 "$OUT/sanitize_$tool.txt")"
done
scripts/device_ab.sh "$R" "--n 384,768 --d 32 --bias-dtype fp32 --iters 20" "$@" | tail -8
