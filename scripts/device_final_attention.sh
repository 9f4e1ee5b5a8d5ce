#!/usr/bin/env bash
# On the GPU machine, in one call: everything the attention results in bench/results/h200/ come
# from, for the build in BIN_DIR (tpf, tpf_gpu_tests, libturbopairformer_c.so): all GPU tests,
# the three sanitizers on small attention cases, `tpf check`, the accuracy + determinism table
# (scripts/attention_accuracy.sh), the speed tables (D = 64, 128 in the large one; an fp32 bias
# and fp16 in the tar), and the Python tests. At most 8 files come back from $OUT: the logs go
# into one tar. Usage: scripts/device_final_attention.sh BIN_DIR
set -u
BIN=${1:-.devbin}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/logs"
timeout 300 "$BIN/tpf_gpu_tests" --gtest_brief=1 > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt")"; grep -E "^\[  FAILED" "$OUT/gpu_tests.txt" | head
F='*S3_N8_*:*S3_N7_*:*S3_N64_*:*S3_N100_D128*:*S3_N100_D32*:*S13_N40*:*S5_N77*'
for tool in memcheck racecheck synccheck; do
  timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/tpf_gpu_tests" --gtest_filter="$F" \
    --gtest_brief=1 > "$OUT/logs/sanitize_$tool.txt" 2>&1
  echo "$tool rc=$? $(tail -1 "$OUT/logs/sanitize_$tool.txt")"
done
timeout 60 "$BIN/tpf" check > "$OUT/logs/tpf_check.txt" 2>&1; echo "tpf check rc=$? $(tail -1 "$OUT/logs/tpf_check.txt")"
timeout 200 scripts/attention_accuracy.sh "$BIN/tpf" "$OUT" > "$OUT/logs/accuracy_log.txt" 2>&1; echo "accuracy rc=$?"
tail -1 "$OUT/attention_accuracy.md"
timeout 100 "$BIN/tpf" bench --n 384,640,768 --d 16,32 > "$OUT/attention_bench.txt" 2>/dev/null
timeout 100 "$BIN/tpf" bench --n 384,640,768 --d 16,32 --json > "$OUT/attention_bench.json" 2>/dev/null
timeout 100 "$BIN/tpf" bench --n 1024,2048 --d 32 --iters 5 > "$OUT/attention_bench_large.txt" 2>/dev/null
timeout 100 "$BIN/tpf" bench --n 384,768 --d 64,128 --iters 10 >> "$OUT/attention_bench_large.txt" 2>/dev/null
timeout 100 "$BIN/tpf" bench --n 384,640,768 --d 16,32 --bias-dtype fp32 > "$OUT/logs/attention_bench_fp32bias.txt" 2>/dev/null
timeout 100 "$BIN/tpf" bench --n 384,640,768 --d 16,32 --dtype fp16 > "$OUT/logs/attention_bench_fp16.txt" 2>/dev/null
(TPF_LIBRARY="$PWD/$BIN/libturbopairformer_c.so" PYTHONPATH=python timeout 150 python3 -m pytest tests/python -q -x \
   -p no:cacheprovider > "$OUT/logs/pytest.txt" 2>&1); echo "pytest rc=$? $(tail -1 "$OUT/logs/pytest.txt")"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
cat "$OUT/attention_bench.txt" "$OUT/attention_bench_large.txt"
