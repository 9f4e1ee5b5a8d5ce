#!/usr/bin/env bash
# On the GPU machine (next to scripts/device_validate.sh): Nsight Compute throughput and stall summary of the attention kernels.
# Usage: scripts/device_ncu.sh BIN_DIR [N] [D]
set -u
BIN=${1:-.devbin}; N=${2:-384}; D=${3:-32}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for k in forward_kernel backward_kernel; do
  ncu --clock-control none -k "regex:$k" -c 1 \
      --section SpeedOfLight --section SchedulerStats --section Occupancy \
      --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
      "$BIN/tpf" bench --n "$N" --d "$D" --iters 1 > "$OUT/ncu_$k.txt" 2>&1
  echo "== $k"
  grep -E "Duration|Issue Slots Busy|No Eligible|Executed Ipc A|L2 Cache Throughput|DRAM Throughput" "$OUT/ncu_$k.txt"
  grep -E "issue_stalled" "$OUT/ncu_$k.txt" | awk '$NF+0 > 0.05 {sub("smsp__average_warps_issue_stalled_",""); print}' | sort -k3 -n -r | head -8
done
