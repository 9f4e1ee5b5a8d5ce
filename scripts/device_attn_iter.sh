#!/usr/bin/env bash
# On the GPU machine: attention GPU tests + small-case memcheck/racecheck of the first build,
# then `tpf bench` (N = 384, 768 x D = 16, 32; N = 384 x D = 64, 128) of every build, one after
# another in one call, and a short table last. Usage: scripts/device_attn_iter.sh BIN_DIR...
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=$1
timeout 300 $B/tpf_gpu_tests --gtest_filter='*Attention*' --gtest_brief=1 > $OUT/gtest.txt 2>&1; echo "gtests rc=$? $(tail -1 $OUT/gtest.txt)"; grep -E "^\[  FAILED" $OUT/gtest.txt | head
F='*S3_N7_*:*S3_N64_*:*S3_N100_D128*:*S13_N40*:*S5_N77*'
for tool in memcheck racecheck; do timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/tpf_gpu_tests --gtest_filter="$F" --gtest_brief=1 > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$? $(tail -1 $OUT/san_$tool.txt)"; done
for b in "$@"; do n=$(basename $b); $b/tpf bench --n 384,768 --d 16,32 --iters 20 > $OUT/bench_$n.txt 2>&1; $b/tpf bench --n 384 --d 64,128 --iters 20 2>/dev/null | tail -2 >> $OUT/bench_$n.txt; done
for b in "$@"; do n=$(basename $b); echo "== $n"; grep -E "^ +[0-9]" $OUT/bench_$n.txt; done
