#!/usr/bin/env bash
# One device call per multiplicative-update kernel iteration (on the GPU machine, binaries built
# here): GPU tests (the N = 3072 case only with FULL=1), timings at N = 384 and 768, per-kernel
# times, and an Nsight Compute stall summary of the kernels named by NCU_KERNELS (regex).
# Usage: scripts/device_trimul_iter.sh BIN_DIR
set -u
BIN=${1:-.devbin}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
filter='*Trimul*:-*Large*'; [ "${FULL:-0}" = 1 ] && filter='*Trimul*'
"$BIN/tpf_gpu_tests" --gtest_filter="$filter" > "$OUT/gtest_trimul.txt" 2>&1
echo "gtests: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/gtest_trimul.txt" | tr '\n' ' ')"
grep -E "FAILED|error/floor" "$OUT/gtest_trimul.txt" | head -4
if [ "${SAN:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    compute-sanitizer --tool $tool "$BIN/tpf_gpu_tests" \
      --gtest_filter='*GpuTrimul*B2_N17*:*GpuTrimul*B1_N7_C64_Ch64_out*:*GpuTrimul*B1_N64_C128*:*GpuTrimul*B2_N40*' > "$OUT/san_$tool.txt" 2>&1
    echo "$tool: $(grep -E 'ERROR SUMMARY|PASSED|FAILED' "$OUT/san_$tool.txt" | tr '\n' ' ')"
  done
fi
"$BIN/tpf" bench --op trimul --n 384,768 --iters 20 > "$OUT/bench.txt" 2>&1
bash scripts/device_kernel_times.sh "$BIN/tpf" --op trimul --n 768 > "$OUT/kernel_times.txt" 2>&1
if [ -n "${NCU_KERNELS:-}" ]; then
  ncu --clock-control none --kernel-name-base mangled -k "regex:${NCU_KERNELS}" -c "${NCU_COUNT:-2}" \
      --section SpeedOfLight --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active" \
      "$BIN/tpf" bench --op trimul --n 768 --iters 1 > "$OUT/ncu.txt" 2>&1
  grep -E "gemm_kernel|Duration|Issue Slots Busy|No Eligible|L2 Cache Throughput|DRAM Throughput|inst_executed.sum|hmma_cycles|Shared.*Bank" "$OUT/ncu.txt" | cut -c1-150
  grep -E "issue_stalled" "$OUT/ncu.txt" | awk '$NF+0 > 0.3 {sub("smsp__average_warps_issue_stalled_",""); print}' | head -20
fi
echo "--- per-kernel (ncu clocks), N = 768"; head -16 "$OUT/kernel_times.txt"
echo "--- timings"; tail -4 "$OUT/bench.txt"
