set -u
B=.devbin_new
timeout 300 $B/tpf_gpu_tests --gtest_filter='*Attention*' --gtest_brief=1 > $OUT/gtest.txt 2>&1; echo "gtests rc=$? $(tail -1 $OUT/gtest.txt)"; grep -E "^\[  FAILED" $OUT/gtest.txt | head
F='*S3_N7_*:*S3_N64_*:*S3_N100_D128*:*S13_N40*:*S5_N77*'
for tool in memcheck racecheck; do timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/tpf_gpu_tests --gtest_filter="$F" --gtest_brief=1 > $OUT/san_$tool.txt 2>&1; echo "$tool rc=$? $(tail -1 $OUT/san_$tool.txt)"; done
for b in main new; do .devbin_$b/tpf bench --n 384,768 --d 16,32 --iters 20 > $OUT/bench_$b.txt 2>&1; .devbin_$b/tpf bench --n 384 --d 64,128 --iters 20 | tail -2 >> $OUT/bench_$b.txt 2>&1; done
for b in main new; do echo "== $b"; grep -E "^ +[0-9]" $OUT/bench_$b.txt; done
bash scripts/device_ncu_source.sh $B backward_kernel 384 32 >/dev/null 2>&1; bash scripts/device_ncu_source.sh $B forward_kernel 384 32 > /dev/null 2>&1
cd $OUT && tar czf ncu.tgz *.csv *_details.txt && rm -f *.csv *_log.txt *_details.txt; ls
