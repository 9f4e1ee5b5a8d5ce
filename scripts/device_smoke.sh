#!/usr/bin/env bash
# On the GPU machine: run the prebuilt GPU tests, tpf check, a sanitizer pass and tpf bench.
# Usage: scripts/device_smoke.sh BIN_DIR   (BIN_DIR holds tpf and tpf_gpu_tests)
set -u
BIN=${1:-.devbin}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
"$BIN/tpf_gpu_tests" --gtest_brief=1 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
"$BIN/tpf" check 2>&1 | tee "$OUT/check.txt"
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/tpf_gpu_tests" \
      --gtest_filter='*S3_N7_*:*S3_N64_D32*:*S3_N100_D128*' --gtest_brief=1 > "$OUT/sanitize_$tool.txt" 2>&1
    echo "compute-sanitizer $tool rc=$? ($(grep -c 'ERROR SUMMARY: 0' "$OUT/sanitize_$tool.txt") clean summaries)"
    tail -3 "$OUT/sanitize_$tool.txt"
  done
fi
"$BIN/tpf" bench ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.txt"
