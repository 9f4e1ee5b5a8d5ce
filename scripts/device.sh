#!/usr/bin/env bash
# The maintainer's driver on a machine with an sm_90a GPU (H100/H200), run from the repository
# root. Outputs go to $OUT (default /tmp/out); every step is time-limited.
#
#   scripts/device.sh validate [BUILD]        everything the committed results come from: GPU tests,
#                                             sanitizers, accuracy table, tpf bench, trimul table
#   scripts/device.sh gpu-tests [BUILD]       the C++ GPU suite of a build tree (default build/)
#   scripts/device.sh sanitize [BUILD]        memcheck, racecheck, synccheck on small cases of both ops
#   scripts/device.sh accuracy [TPF] [DIR]    attention accuracy and determinism tables
#   scripts/device.sh ab ROUNDS "ARGS" BIN... alternating A/B rounds of `tpf bench ARGS` over builds
#                                             (each BIN a folder with a tpf binary), then medians;
#                                             rounds in $OUT/ab_rounds_<n>.txt, n counting calls
#   scripts/device.sh profile TPF [ARGS...]   per-kernel times of one `tpf bench ARGS` (Nsight Compute)
#   scripts/device.sh install [WHEEL]         wheel-test's environment and install, without the tests
#   scripts/device.sh peers-ops DIR           cuequivariance-ops-cu13 from DIR into /tmp/peers-ops
#                                             (scripts/peer_wheels.sh downloads it elsewhere)
#   scripts/device.sh peers-site TARBALL      every peer wheel, unpacked (scripts/peer_wheels.sh's
#                                             DIR.tar.xz), into /tmp/peersite in one call; run
#                                             the bench with PYTHONPATH=python:/tmp/peersite
#   scripts/device.sh peers DIR [WHEEL]       install, then the other peer wheels from DIR into
#                                             that environment, /tmp/peers-ops linked in
#   scripts/device.sh wheel-test [WHEEL]      a fresh virtual environment, `pip install` of a wheel
#                                             built elsewhere (default dist/*.whl), `tpf info`, and
#                                             the whole pytest suite against it
#   scripts/device.sh head-dims [DIR]         our attention at every head dim, padded and native
#   scripts/device.sh report [DIR] [BUDGET]   the comparison report against the installed peers
#                                             (attention N = 384-4096, D = 16, 32; multiplicative
#                                             update N = 256-4096, both directions, bf16 and fp32
#                                             weights), cut at BUDGET seconds (default 420);
#                                             after peers, with PY=$TPF_VENV/bin/python
#   scripts/device.sh pairformer [FROM] [N] [BUDGET] [BACKENDS] [MODES]  the Pairformer training
#                                             step, every installed backend (or BACKENDS, comma-
#                                             separated), eager and compiled (or MODES, e.g.
#                                             compile-ro) (default N:
#                                             256-1024), into $OUT/pairformer: it continues the
#                                             table in FROM (default bench/results/h200/
#                                             pairformer_sweep; --resume) and starts no case
#                                             after BUDGET s (default 480). Copy $OUT/pairformer
#                                             back to FROM and call again until nothing is left
#   scripts/device.sh small-n [N] [VARIANTS]  the small-N step's wall time against its kernel
#                                             time, ours and plain PyTorch: eager, compiled,
#                                             compiled with CUDA graphs, captured whole
#                                             (dev/scripts/device_compiled_step.py; default N
#                                             256, every variant) into $OUT/compiled_step.txt
#   scripts/device.sh breakdown [DIR] [N] [MODES]  each pair-track module alone against a fixed
#                                             output gradient, our kernels' share, eager and
#                                             compiled (MODES: default eager,compile)
#   scripts/device.sh peaked-accuracy [DIR] [N]  attention gradients on peaked softmax rows, peers too
#
# PyTorch comes from the machine's python3. wheel-test links its site-packages into the fresh
# environment, as a user's existing PyTorch would be; TPF_VENV=DIR keeps that environment at DIR,
# and PY=DIR/bin/python then runs head-dims and pairformer on the installed wheel.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PY:-python3}
cmd=${1:-}
[ $# -gt 0 ] && shift

sanitize() {  # small cases of each op under every compute-sanitizer tool
  local build=${1:-build} spec prefix filter tool
  for spec in "sanitize_|*S3_N7_*:*S3_N64_*:*S3_N100_D128*:*S13_N40*:*S5_N77*" \
              "sanitize_trimul_|*GpuTrimul*B2_N17*:*GpuTrimul*B1_N7_C64_Ch64_out*"; do
    prefix=${spec%%|*} filter=${spec#*|}
    for tool in memcheck racecheck synccheck; do
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 "$build/tests/cpp/tpf_gpu_tests" \
        --gtest_filter="$filter" --gtest_brief=1 > "$OUT/$prefix$tool.txt" 2>&1
      echo "$prefix$tool rc=$? $(tail -1 "$OUT/$prefix$tool.txt")"
    done
  done
}

case "$cmd" in
  validate)
    build=${1:-build}
    nvidia-smi --query-gpu=name,driver_version --format=csv | tee "$OUT/gpu.txt"
    timeout 300 "$build/tests/cpp/tpf_gpu_tests" --gtest_brief=1 > "$OUT/gpu_tests.txt" 2>&1
    echo "gpu tests rc=$? $(tail -1 "$OUT/gpu_tests.txt")"
    sanitize "$build"
    timeout 300 "$build/tpf" accuracy --n 384,640,768 --d 16,32 --heads 4 --out "$OUT" > /dev/null 2>&1
    echo "accuracy rc=$?"
    timeout 200 "$build/tpf" trimul-table --n 384,768,1024,2048 --ref-max-n 768 --out "$OUT" > /dev/null 2>&1
    echo "trimul table rc=$?"
    timeout 300 "$build/tpf" bench --n 384,640,768 --d 16,32 2>/dev/null | tee "$OUT/attention_bench.txt"
    timeout 120 "$build/tpf" check > "$OUT/tpf_check.txt" 2>&1; echo "tpf check rc=$?"
    ;;
  gpu-tests)
    "${1:-build}/tests/cpp/tpf_gpu_tests" --gtest_brief=1
    ;;
  sanitize)
    sanitize "${1:-build}"
    ;;
  accuracy)
    "${1:-build/tpf}" accuracy --n 384,640,768 --d 16,32 --heads 4 --out "${2:-bench/results/h200}"
    ;;
  ab)
    rounds=${1:?rounds}; args=${2:?bench args}; shift 2
    n=1; while [ -e "$OUT/ab_rounds_$n.txt" ]; do n=$((n + 1)); done
    rounds_file="$OUT/ab_rounds_$n.txt"  # one file per call: a second ab keeps the first's rounds
    for r in $(seq 1 "$rounds"); do
      for b in "$@"; do  # alternating: lent machines differ by 2-3% from call to call
        "$b/tpf" bench $args 2>/dev/null | awk -v b="$(basename "$b")" -v r="$r" '/^ +[0-9]/ {print b, r, $0}'
      done
    done | tee "$rounds_file"
    "$PY" - "$rounds_file" "$args" <<'PY'
import collections, statistics, sys
# build, round, then tpf bench's columns: attention N D fwd_ms TFLOP/s exp% fwd+bwd_ms ...;
# the multiplicative update (--op trimul) N fwd_ms TFLOP/s fwd+bwd_ms ...
trimul = "trimul" in sys.argv[2].split()
key_cols, ms_cols = ((2,), (3, 5)) if trimul else ((2, 3), (4, 7))
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    rows[(f[0],) + tuple(f[i] for i in key_cols)].append(f)
print(f"median over rounds (build N{'' if trimul else ' D'}: fwd ms, fwd+bwd ms):")
for key, cols in sorted(rows.items(), key=lambda kv: (kv[0][0],) + tuple(int(v) for v in kv[0][1:])):
    print(" ", " ".join(key), " ".join(f"{statistics.median(float(c[i]) for c in cols):.3f}" for i in ms_cols))
PY
    ;;
  profile)
    bin=${1:?tpf binary}; shift
    ncu --clock-control none --csv --metrics gpu__time_duration.sum "$bin" bench --iters 1 "$@" \
      2>/dev/null > "$OUT/ncu_times.csv"
    "$PY" - "$OUT/ncu_times.csv" <<'PY'
import collections, csv, re, sys
rows = list(csv.reader(open(sys.argv[1])))
hdr = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
h = rows[hdr]; k, v, u = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
tot, cnt = collections.defaultdict(float), collections.Counter()
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
for r in rows[hdr + 1:]:
    if len(r) > v:
        name = re.sub(r"\(.*|void |tpf::(attn::|trimul::)?|\(anonymous namespace\)::", "", r[k])[:100]
        tot[name] += float(r[v].replace(",", "")) * scale[r[u]]
        cnt[name] += 1
for name, t in sorted(tot.items(), key=lambda x: -x[1]):
    print(f"{t / cnt[name]:9.1f} us x{cnt[name]:3d}  {name}")
PY
    ;;
  install|wheel-test)
    wheel=${1:-$(ls dist/turbopairformer-*.whl | head -n 1)}
    venv=${TPF_VENV:-$(mktemp -d)/venv}
    rm -rf "$venv"
    python3 -m venv "$venv" || exit 1
    site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    python3 -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))" > "$site/host-torch.pth"
    "$venv/bin/python" -m pip install -q --no-index "$wheel" || exit 1
    "$venv/bin/tpf" info
    [ "$cmd" = install ] && exit 0
    (cd /tmp && "$venv/bin/python" -c "import turbopairformer as t; print('imported', t.__version__, 'from', t.LIBRARY_PATH)")
    "$venv/bin/python" -m pytest tests/python -q -rs -p no:cacheprovider
    ;;
  peers-ops)
    rm -rf /tmp/peers-ops
    python3 -m pip install -q --no-index --no-deps --target /tmp/peers-ops "${1:?wheel folder}"/*.whl || exit 1
    ls /tmp/peers-ops
    ;;
  peers-site)
    rm -rf /tmp/peersite
    tar -C /tmp -xJf "${1:?peer_wheels.sh tarball}" || exit 1
    python3 -c "import sys; sys.path[:0] = ['/tmp/peersite']; import cuequivariance_torch, trifast; print('peers: cuequivariance', cuequivariance_torch.__version__, '+ trifast')" || exit 1
    echo "PYTHONPATH=$PWD/python:/tmp/peersite"
    ;;
  peers)
    from=${1:?wheel folder}; shift
    [ -d /tmp/peers-ops ] || { echo "scripts/device.sh: run peers-ops first, in the call before" >&2; exit 2; }
    export TPF_VENV=${TPF_VENV:-/tmp/tv}
    bash "$0" install "$@" || exit 1
    site=$("$TPF_VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    echo /tmp/peers-ops > "$site/peers-ops.pth"
    "$TPF_VENV/bin/python" -m pip install -q --no-index --no-deps "$from"/*.whl || exit 1
    "$TPF_VENV/bin/python" -c "import cuequivariance_torch, trifast; print('peers: cuequivariance', cuequivariance_torch.__version__, '+ trifast')"
    ;;
  head-dims)
    "$PY" -m turbopairformer.bench --head-dims 8,16,24,32,48,64,96,128 --n 384,768 --out "${1:-bench/results/h200}"
    ;;
  report)
    "$PY" -m turbopairformer.bench --n 384,640,768,1024,2048,4096 --d 16,32 \
      --trimul-n 256,384,768,1024,1536,2048,3072,4096 --trimul-directions outgoing,incoming \
      --trimul-weights bf16,fp32 --backends turbopairformer,cuequivariance,trifast \
      --budget "${2:-420}" --out "${1:-bench/results/h200}/report"
    ;;
  pairformer)
    from=${1:-bench/results/h200/pairformer_sweep}
    mkdir -p "$OUT/pairformer"
    [ -f "$from/pairformer.json" ] && cp "$from/pairformer.json" "$OUT/pairformer/"
    "$PY" -m turbopairformer.bench --pairformer --n "${2:-256,384,512,640,768,1024}" --resume \
      --budget "${3:-480}" ${4:+--backends "$4"} ${5:+--modes "$5"} --out "$OUT/pairformer"
    ;;
  small-n)
    variants=${2:-pytorch compile,pytorch compile-ro,pytorch graph,ours eager,ours compile composed,ours compile-ro,ours graph,ours compile nodes+ckpt+boundary}
    PYTHONPATH=${PYTHONPATH:-python} timeout 580 "$PY" dev/scripts/device_compiled_step.py \
      --n "${1:-256}" --variants "$variants" --budget 500 2>&1 | tee "$OUT/compiled_step.txt"
    ;;
  peaked-accuracy)
    "$PY" -m turbopairformer.bench --attention-accuracy "${2:-256,384}" --d 16,32 --out "${1:-bench/results/h200}"
    ;;
  breakdown)
    "$PY" -m turbopairformer.bench --pairformer --breakdown --n "${2:-768}" --modes "${3:-eager,compile}" \
      --out "${1:-bench/results/h200}"
    ;;
  -h|--help|"")
    sed -n '2,/^set -uo/p' "$0" | sed '$d'
    ;;
  *)
    echo "scripts/device.sh: unknown command '$cmd' (see --help)" >&2; exit 2
    ;;
esac
