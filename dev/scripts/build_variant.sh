#!/usr/bin/env bash
# Here (no GPU needed): a `tpf` binary with some kernel sources recompiled under experiment
# knobs (phase timers: rather `cmake -DTPF_BUILD_DEV=ON` and its tpf_phases target), for A/B rounds on the GPU machine (scripts/device.sh ab). Uses build/'s compile
# commands and objects, so run `cmake --build build` first.
# Usage: dev/scripts/build_variant.sh NAME "SOURCES" "-DKNOB=V ..."   (SOURCES e.g. "forward backward")
# Output: .devbin_NAME/tpf (stripped), with src/attention/SOURCE.cu compiled with the knobs.
set -eu
NAME=${1:?name}; SOURCES=${2:?sources}; FLAGS=${3-}
ROOT=$(cd "$(dirname "$0")/.." && pwd); cd "$ROOT/build"
OBJS=()
for src in $SOURCES; do
  obj=/tmp/tpf_variant_${NAME}_${src}.o
  cmd=$(ninja -t commands "CMakeFiles/turbopairformer.dir/src/attention/$src.cu.o" | tail -1)
  cmd=${cmd/ -o CMakeFiles\/turbopairformer.dir\/src\/attention\/$src.cu.o/ $FLAGS -o $obj}
  bash -c "$cmd" 2>&1 | grep -A2 "Compiling entry" | grep -E "spill|Used" | sort | uniq -c | sort -rn | head -4 || true
  OBJS+=("$obj")
done
mkdir -p "$ROOT/.devbin_$NAME"
c++ -O3 -DNDEBUG CMakeFiles/tpf.dir/src/cli/{tpf,check,bench,accuracy,trimul_table}.cpp.o "${OBJS[@]}" \
  -o "$ROOT/.devbin_$NAME/tpf" -L/usr/local/cuda/targets/x86_64-linux/lib libtpf_harness.a \
  libturbopairformer.a /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a \
  -lcudadevrt -lcudart_static -lrt -lpthread -ldl
strip "$ROOT/.devbin_$NAME/tpf"
ls -la "$ROOT/.devbin_$NAME/tpf"
