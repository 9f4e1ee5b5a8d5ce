set -u
for v in "new|" "new|--no-dbias" "exp|" "exp|--no-dbias"; do b=${v%%|*}; f=${v#*|}; echo "== $b $f"; .devbin_$b/tpf bench --n 768 --d 32 --iters 20 $f 2>&1 | tail -1; done
