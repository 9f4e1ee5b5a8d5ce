#!/usr/bin/env bash
# On the GPU machine: alternating A/B rounds of `tpf bench` over several builds in one call
# (lent machines differ by 2-3% from call to call, so variants are only compared within one).
# Usage: scripts/device_ab.sh ROUNDS "BENCH ARGS" BIN_DIR... ; prints one line per build, round
# and shape (N, D, fwd ms, fwd+bwd ms), then the per-build medians.
set -u
R=${1:?rounds}; ARGS=${2:?bench args}; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
for r in $(seq 1 "$R"); do
  for b in "$@"; do
    "$b/tpf" bench $ARGS 2>/dev/null | awk -v b="$(basename "$b")" -v r="$r" '/^ +[0-9]/ {print b, r, $0}'
  done
done | tee "$OUT/ab_rounds.txt"
python3 - "$OUT/ab_rounds.txt" <<'PY'
import collections, statistics, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    # build, round, then tpf bench's columns: N D fwd_ms TFLOP/s exp% fwd+bwd_ms ...
    rows[(f[0], f[2], f[3])].append(line)
print("median over rounds (build N D: fwd ms, fwd+bwd ms):")
for key, lines in sorted(rows.items()):
    cols = [l.split() for l in lines]
    print(" ", " ".join(key), " ".join(f"{statistics.median(float(c[i]) for c in cols):.3f}" for i in (4, 7)))
PY
