# Sourced by scripts/count-instructions.sh and scripts/count-misses.sh: builds the stub driver
# (scripts/stub-libcuda.c) into target/stub-libcuda and examples/host_cost.rs, and sets `stub`
# (the stub's folder, for LD_LIBRARY_PATH) and `bin` (the example).
stub=target/stub-libcuda
mkdir -p "$stub"
gcc -O2 -shared -fPIC scripts/stub-libcuda.c -o "$stub/libcuda.so"
ln -sf libcuda.so "$stub/libcuda.so.1"
cargo build --release --example host_cost --quiet
bin=target/release/examples/host_cost
# count CASE N: the instructions callgrind counts for `host_cost CASE N` over the stub.
count() {
  local out
  if ! out=$(LD_LIBRARY_PATH="$PWD/$stub" valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1); then
    # A case that fails under the stub (it refuses what the driver refuses) is a failure, not a
    # count: the few instructions before the error would pass any ceiling.
    echo "host_cost $1 $2 failed under the stub driver:" >&2
    echo "$out" | grep -v '^==' >&2
    return 1
  fi
  echo "$out" | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

