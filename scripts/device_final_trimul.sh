#!/usr/bin/env bash
# On the GPU machine with binaries built here (BIN_DIR): the multiplicative-update table of
# issue 5 (with its accuracy at every N from an FP64 reference on the GPU), every GPU test,
# tpf check, synccheck on small trimul cases and the Python tests.
# Each step is time-limited so that a slow one cannot lose the others' output. PART=1 runs the
# table, the accuracy table and the Python tests; PART=2 the GPU tests, tpf check and the
# sanitizers (each part fits one 10-minute device call); unset: both.
# Usage: [PART=1|2] scripts/device_final_trimul.sh BIN_DIR
set -u
BIN=${1:-.devbin}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/table"
start=$SECONDS
part1() {
timeout 300 "$BIN/tpf" trimul-table --n 384,768,1024,2048 --ref-max-n 768 --iters 20 --out "$OUT/table" \
  > "$OUT/table/trimul_table_log.txt" 2>&1
echo "trimul-table rc=$? ($((SECONDS - start)) s)"; tail -5 "$OUT/table/trimul.md"
TPF_LIBRARY="$PWD/$BIN/libturbopairformer_c.so" PYTHONPATH=python timeout 240 python -m turbopairformer.bench \
  --trimul-accuracy 384,768,1024,2048 --out "$OUT/table" > "$OUT/table/trimul_accuracy_log.txt" 2>&1
echo "trimul accuracy (FP64 on the GPU) rc=$?"; tail -6 "$OUT/table/trimul_accuracy.md" 2>/dev/null
TPF_LIBRARY="$PWD/$BIN/libturbopairformer_c.so" PYTHONPATH=python timeout 120 python -m pytest tests/python -q -x \
  -p no:cacheprovider > "$OUT/pytest.txt" 2>&1
echo "pytest rc=$? $(tail -1 "$OUT/pytest.txt") ($((SECONDS - start)) s)"
}
part2() {
timeout 200 "$BIN/tpf_gpu_tests" --gtest_brief=1 > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt") ($((SECONDS - start)) s)"
timeout 90 "$BIN/tpf" check > "$OUT/tpf_check.txt" 2>&1; echo "tpf check rc=$?"; tail -2 "$OUT/tpf_check.txt"
timeout 90 compute-sanitizer --tool synccheck --error-exitcode 9 "$BIN/tpf_gpu_tests" \
  --gtest_filter='*GpuTrimul*B2_N17*:*GpuTrimul*B1_N7_C64_Ch64_out*' --gtest_brief=1 > "$OUT/sanitize_trimul_synccheck.txt" 2>&1
echo "synccheck rc=$?"
for tool in memcheck racecheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/tpf_gpu_tests" \
    --gtest_filter='*GpuTrimul*B2_N17*:*GpuTrimul*B1_N7_C64_Ch64_out*:*GpuTrimul*B1_N64_C128*:*GpuTrimul*B2_N40*' \
    --gtest_brief=1 > "$OUT/sanitize_trimul_$tool.txt" 2>&1
  echo "$tool rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/sanitize_trimul_$tool.txt" | tail -1)"
done
echo "($((SECONDS - start)) s)"
}
case "${PART:-all}" in
  1) part1 ;;
  2) part2 ;;
  *) part1; part2 ;;
esac
