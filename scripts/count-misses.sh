#!/usr/bin/env bash
# Counts the L1 data-cache lines the crate misses per node after driver work, without a GPU:
# examples/host_cost.rs runs against the stub libcuda (scripts/stub-libcuda.c) with
# STUB_TOUCH_KB=64, so each kernel node and launch sweeps 64 KiB of the stub's memory as a real
# driver's work does, evicting a 48 KiB L1; `valgrind --tool=cachegrind` simulates the caches, at
# 1000 and 3000 nodes. The difference over 2000, less the stub's own 1024 lines, is per node.
#
#   scripts/count-misses.sh                # every case, crate and raw
#   scripts/count-misses.sh explicit       # one case
#
# Needs gcc and valgrind. See docs/design/performance.md, "Cache lines per node".
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/stub-host-cost.sh
misses() { # case n -> D1 misses
  STUB_TOUCH_KB=64 LD_LIBRARY_PATH="$PWD/$stub" valgrind --tool=cachegrind --cache-sim=yes \
    --D1=49152,12,64 --LL=2097152,16,64 --cachegrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
    sed -n 's/.*D1  misses: *\([0-9,]*\).*/\1/p' | tr -d ,
}
cases=("${@:-raw-explicit explicit explicit-buf explicit-typed raw-capture capture capture-buf capture-typed}")
for c in ${cases[@]}; do
  a=$(misses "$c" 1000); b=$(misses "$c" 3000)
  tenths=$(( (b - a) / 200 - 10240 ))
  printf '%-14s %3d.%d L1 lines missed per node\n' "$c" $(( tenths / 10 )) $(( tenths % 10 ))
done
