#!/usr/bin/env bash
# Counts the host instructions per node that the crate adds around each driver call, without a
# GPU: examples/host_cost.rs runs against a stub libcuda (scripts/stub-libcuda.c) under
# `valgrind --tool=callgrind`, at 1000 and 11000 nodes; the difference over 10000 is per node.
#
#   scripts/count-instructions.sh                # every case
#   scripts/count-instructions.sh capture-buf    # one case
#
# Needs gcc and valgrind. See docs/design/performance.md, "Counting the crate's own instructions".
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/stub-host-cost.sh
cases=("${@:-explicit explicit-buf explicit-typed raw-explicit capture capture-buf capture-typed raw-capture}")
for c in ${cases[@]}; do
  a=$(count "$c" 1000); b=$(count "$c" 11000)
  printf '%-14s %6d instructions per node\n' "$c" $(( (b - a) / 10000 ))
done
