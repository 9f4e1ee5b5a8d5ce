#!/usr/bin/env bash
# Per-kernel GPU times of one `tpf bench` call under Nsight Compute (gpu__time_duration), summed
# by kernel name. Usage (on the GPU machine): scripts/device_kernel_times.sh TPF_BINARY ARGS...
set -euo pipefail
bin=$1; shift
ncu --csv --metrics gpu__time_duration.sum "$bin" bench --iters 1 "$@" 2>/dev/null > /tmp/ncu_times.csv || true
python3 - <<'PY'
import csv, collections, re
rows = list(csv.reader(open('/tmp/ncu_times.csv')))
hdr = next(i for i, r in enumerate(rows) if 'Kernel Name' in r)
h = rows[hdr]; k = h.index('Kernel Name'); v = h.index('Metric Value'); u = h.index('Metric Unit')
tot = collections.defaultdict(float); cnt = collections.Counter()
for r in rows[hdr + 1:]:
    if len(r) <= v: continue
    name = re.sub(r'tpf::trimul::|tpf::attn::|\(anonymous namespace\)::|<unnamed>::|void |tpf::', '', r[k])
    name = re.sub(r'\(trimul::Operand.*|\(const .*|\(trimul::WeightSet.*|\(trimul::PairRef.*|\(T1 .*|\(unsigned char.*', '', name)[:110]
    scale = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1.0, 'usecond': 1.0, 'ms': 1e3, 'msecond': 1e3}[r[u]]
    tot[name] += float(r[v].replace(',', '')) * scale; cnt[name] += 1
# each kernel ran (3 warm-up + 1 timed) times per pass in tpf bench: report per call
for name, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{t / cnt[name]:9.1f} us x{cnt[name]:3d}  {name}")
PY
