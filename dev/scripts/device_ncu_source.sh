#!/usr/bin/env bash
# On the GPU machine: per-SASS-instruction executed counts and stall samples of one attention
# kernel (Nsight Compute source page), to find where a kernel's instructions and stalls go.
# Usage: dev/scripts/device_ncu_source.sh BIN_DIR KERNEL_REGEX [N] [D]
# Writes $OUT/<name>.csv (source page, SASS) and $OUT/<name>_details.txt; summarise the csv
# with dev/scripts/ncu_source_summary.py.
set -u
BIN=${1:-.devbin}; K=${2:-backward_kernel}; N=${3:-384}; D=${4:-32}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
name=$(echo "$K" | tr -c 'A-Za-z0-9_\n' '_')
ncu --clock-control none --kernel-name-base mangled -k "regex:$K" -c 1 \
    --section SourceCounters --section WarpStateStats --section InstructionStats \
    --section SpeedOfLight --section SchedulerStats \
    -o "$OUT/$name" -f "$BIN/tpf" bench --n "$N" --d "$D" --iters 1 > "$OUT/${name}_log.txt" 2>&1
ncu --import "$OUT/$name.ncu-rep" --page details > "$OUT/${name}_details.txt" 2>&1
ncu --import "$OUT/$name.ncu-rep" --page source --csv --print-source sass > "$OUT/$name.csv" 2>&1
rm -f "$OUT/$name.ncu-rep"
echo "== $K: $(wc -l < "$OUT/$name.csv") source lines"
grep -E "Duration|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued" "$OUT/${name}_details.txt"
