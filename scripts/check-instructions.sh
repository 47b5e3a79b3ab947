#!/usr/bin/env bash
# CI guard for the hot paths: the host instructions the crate adds per node (and per capture
# cycle), counted without a GPU as scripts/count-instructions.sh does (examples/host_cost.rs over
# the stub driver, under callgrind: the same count for the same binary whatever the machine is
# doing), each checked against a ceiling. A change that makes a hot path dearer fails CI here;
# one that makes it cheaper should lower the ceiling in the same commit.
#
#   scripts/check-instructions.sh
#
# Needs gcc and valgrind (.ci/run installs valgrind where it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/stub-host-cost.sh
# case, ceiling per node (or per cycle for `cycle`), what the count was when the ceiling was set.
# The ceilings leave about 5 % for toolchain and dependency drift.
ceilings=(
  "capture 178 169"
  "capture-buf 214 204"
  "capture-typed 188 179"
  "stream 189 180"
  "explicit 391 372"
  "explicit-buf 432 411"
  "explicit-typed 418 398"
  "cycle 3031 2887"
)
status=0
for entry in "${ceilings[@]}"; do
  read -r c ceiling was <<<"$entry"
  if [ "$c" = cycle ]; then
    a=$(count "$c" 100); b=$(count "$c" 1100); per=$(( (b - a) / 1000 ))
  else
    a=$(count "$c" 1000); b=$(count "$c" 11000); per=$(( (b - a) / 10000 ))
  fi
  verdict=ok
  if [ "$per" -gt "$ceiling" ]; then verdict="OVER (ceiling $ceiling)"; status=1; fi
  printf '%-14s %6d instructions (ceiling %d, set at %d): %s\n' "$c" "$per" "$ceiling" "$was" "$verdict"
done
exit $status
