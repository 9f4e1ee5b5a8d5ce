#!/usr/bin/env bash
# Nsight Compute detail (speed of light, stalls, memory) of the kernels matching NCU_KERNELS
# (regex on mangled names) in one `tpf bench --op trimul --n 768 --iters 1` (on the GPU machine).
# Usage: NCU_KERNELS=regex [NCU_COUNT=4] scripts/device_ncu_kernels.sh BIN_DIR
set -u
BIN=${1:-.devbin}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
ncu --clock-control none --kernel-name-base mangled -k "regex:${NCU_KERNELS}" -c "${NCU_COUNT:-4}" \
    --section SpeedOfLight --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy \
    --section LaunchStats --section WarpStateStats \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,dram__bytes_read.sum,dram__bytes_write.sum" \
    "$BIN/tpf" bench --op trimul --n 768 --iters 1 > "$OUT/ncu.txt" 2>&1
grep -E "gemm_kernel|ln_.*kernel|Duration|Issue Slots Busy|No Eligible|DRAM Throughput|dram__bytes|inst_executed.sum|Achieved Occupancy|Registers Per|Memory Throughput" "$OUT/ncu.txt" | cut -c1-140
grep -E "issue_stalled" "$OUT/ncu.txt" | awk '$NF+0 > 0.5 {sub("smsp__average_warps_issue_stalled_",""); print}' | cut -c1-120 | head -40
