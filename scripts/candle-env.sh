#!/usr/bin/env bash
# Runs a command (a cargo build of examples/candle, say) where candle-core's `cuda` feature builds
# on a machine without a CUDA toolkit or driver: the CUDA 13.0 nvcc of the `cuda-toolkit` wheels
# (its PTX loads on the GPU machine's 13.0 driver; a newer nvcc's does not), installed with pip if
# missing; CUDA_COMPUTE_CAP=90 (no GPU to ask); and a CUDA_HOME whose lib/ holds what candle and
# cudarc link against: the wheels' libraries under their unversioned names, and a stub libcuda
# (soname libcuda.so.1: the real driver is loaded at run time) exporting every driver entry point
# cudarc declares.
#
#   scripts/candle-env.sh cargo build --release --manifest-path examples/candle/Cargo.toml
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
wheel() { python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))' 2>/dev/null; }
cu="$(wheel || true)"
if [ -z "$cu" ] || [ ! -x "$cu/bin/nvcc" ]; then
  pip install -q "cuda-toolkit[nvcc,crt,nvvm,cudart,cccl,nvrtc,curand,cublas]==13.0.2" >&2
  cu="$(wheel)"
fi
home="$root/target/candle-cuda"
if [ ! -e "$home/lib/libcuda.so" ]; then
  mkdir -p "$home/lib"
  ln -sfn "$cu/bin" "$home/bin"
  ln -sfn "$cu/include" "$home/include"
  ln -sfn "$cu/nvvm" "$home/nvvm"
  for f in "$cu"/lib/lib*.so.*; do
    base="$(basename "$f")"
    ln -sf "$f" "$home/lib/$base"
    ln -sf "$f" "$home/lib/${base%%.so.*}.so"
  done
  sys="$(find ~/.cargo/registry/src -path '*cudarc-0.19.10/src/driver/sys/mod.rs' | head -1)"
  [ -n "$sys" ] || { (cd "$root" && cargo fetch -q) && sys="$(find ~/.cargo/registry/src -path '*cudarc-0.19.10/src/driver/sys/mod.rs' | head -1)"; }
  grep -o 'pub unsafe fn cu[A-Za-z0-9_]*' "$sys" | sed 's/pub unsafe fn //' | sort -u |
    sed 's/.*/void &(void) {}/' > "$home/stub-libcuda.c"
  gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$home/lib/libcuda.so" "$home/stub-libcuda.c"
  ln -sf libcuda.so "$home/lib/libcuda.so.1" # for running on the CPU here (`decode --cpu`)
fi
export CUDA_HOME="$home" NVCC="$home/bin/nvcc" PATH="$home/bin:$PATH"
export CUDA_COMPUTE_CAP="${CUDA_COMPUTE_CAP:-90}"
exec "$@"
