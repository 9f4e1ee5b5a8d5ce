#!/usr/bin/env bash
# On a GPU machine, from a source checkout: everything the committed H200 results come from, in
# one call, each step time-limited so that one slow step cannot lose the others' output.
#   OUT=<dir> scripts/device_validate.sh [--skip-build]
# Writes under $OUT: gpu_tests.txt, sanitize_*.txt, attention_accuracy.{json,md},
# attention_bench.{txt,json}, trimul.{json,md}, sanitize_trimul_*.txt, pytest.txt, report/
# (python -m turbopairformer.bench).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export CMAKE_BUILD_PARALLEL_LEVEL=$(nproc)
if [ "${1:-}" != "--skip-build" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null && cmake --build build || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout 300 build/tests/cpp/tpf_gpu_tests --gtest_brief=1 > "$OUT/gpu_tests.txt" 2>&1
echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt")"
# Small cases of each op under every compute-sanitizer tool (prefix: the output file name).
for spec in "sanitize_|*S3_N7_*:*S3_N64_*:*S3_N100_D128*:*S13_N40*:*S5_N77*" \
            "sanitize_trimul_|*GpuTrimul*B2_N17*:*GpuTrimul*B1_N7_C64_Ch64_out*"; do
  prefix=${spec%%|*} filter=${spec#*|}
  for tool in memcheck racecheck synccheck; do
    timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/cpp/tpf_gpu_tests \
      --gtest_filter="$filter" --gtest_brief=1 > "$OUT/$prefix$tool.txt" 2>&1
    echo "$prefix$tool rc=$? $(tail -1 "$OUT/$prefix$tool.txt")"
  done
done
timeout 300 scripts/attention_accuracy.sh build/tpf "$OUT" > /dev/null 2>&1; echo "accuracy rc=$?"
timeout 200 build/tpf trimul-table --n 384,768,1024,2048 --ref-max-n 768 --out "$OUT" > /dev/null 2>&1
echo "trimul table rc=$?"
timeout 300 build/tpf bench --n 384,640,768 --d 16,32 2>/dev/null | tee "$OUT/attention_bench.txt"
timeout 300 build/tpf bench --n 384,640,768 --d 16,32 --json > "$OUT/attention_bench.json" 2>/dev/null
timeout 300 python3 -m pip install --no-build-isolation --no-deps -q . > "$OUT/pip_install.txt" 2>&1
echo "pip install rc=$?"
(cd /tmp && timeout 600 python3 -m pytest "$OLDPWD/tests/python" -q -rs -p no:logging \
   -p no:cacheprovider > "$OUT/pytest.txt" 2>&1); echo "pytest rc=$? $(tail -1 "$OUT/pytest.txt")"
timeout 330 python3 -m turbopairformer.bench --budget 300 --out "$OUT/report" 2> "$OUT/report_stderr.txt"
echo "report rc=$?"
