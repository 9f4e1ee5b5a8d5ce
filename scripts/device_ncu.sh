#!/usr/bin/env bash
# On the GPU machine: Nsight Compute stall/throughput summary of the attention kernels.
# Usage: scripts/device_ncu.sh BIN_DIR [N] [D]
set -u
BIN=${1:-.devbin}; N=${2:-384}; D=${3:-32}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for k in forward_kernel backward_kernel; do
  ncu --clock-control none -k "regex:$k" -c 1 \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
      --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      "$BIN/tpf" bench --n "$N" --d "$D" --iters 1 > "$OUT/ncu_$k.txt" 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Achieved Occupancy|Issue Slots Busy|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|Registers Per|Block Limit|Executed Ipc A|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|DRAM Throughput" "$OUT/ncu_$k.txt" | head -40
  echo "-----"
done
