#!/usr/bin/env bash
# On the GPU machine: the forward's TMA paths (v19: fp32 bias at D = 32, D = 16, 64) in one call: the
# attention GPU tests, the three sanitizers on their small cases, then alternating A/B rounds of
# `tpf bench` with a 16-bit and with an fp32 bias over the builds given.
# Usage: scripts/device_fwd_tma_check.sh TESTS_DIR ROUNDS "BENCH ARGS" BIN_DIR...
set -u
T=${1:?dir with tpf_gpu_tests}; R=${2:?rounds}; ARGS=${3:?bench args}; shift 3
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout 240 "$T/tpf_gpu_tests" --gtest_brief=1 --gtest_filter='*Attention*:*GpuReference*' > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt")"; grep -E "^\[  FAILED" "$OUT/gpu_tests.txt" | head
F='*S3_N8_D32_bf16_biasfp32*:*S4_N96_D32_bf16_biasfp32*:*S3_N8_D16*:*S4_N96_D16*:*S3_N8_D64*:*S4_N96_D64*'
for tool in memcheck racecheck synccheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 "$T/tpf_gpu_tests" --gtest_filter="$F" \
    --gtest_brief=1 > "$OUT/sanitize_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.txt" | tail -1)"
  grep -E "Race reported|Invalid|Barrier" "$OUT/sanitize_$tool.txt" | grep -v "backward.cu" | head -3
done
for bias in same fp32; do
  OUT="$OUT/$bias" scripts/device_ab.sh "$R" "$ARGS --bias-dtype $bias" "$@" | tail -$(( $# * 4 + 1 ))
done
