#!/usr/bin/env bash
# Build tests/kernels/kernels.cu into tests/kernels/kernels.fatbin.
#
# - Installs a pinned CUDA 13.0 nvcc from PyPI (pip --target) into
#   target/nvcc (git-ignored); reused on later runs while the pins match.
# - Emits SASS for sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120 and NO PTX
#   (PTX from a newer nvcc cannot be JIT-compiled by an older driver).
# - Needs: python3 with pip, a host C++ compiler (g++; override with CCBIN=...).
#   No GPU or driver needed.
#
# Usage: scripts/build-kernels.sh        (from any directory)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRC="$ROOT/tests/kernels/kernels.cu"
OUT="$ROOT/tests/kernels/kernels.fatbin"
TOOLS="$ROOT/target/nvcc"
PYTHON="${PYTHON:-python3}"
CCBIN="${CCBIN:-g++}"
# Compress the cubins inside the fatbin (~31 KB instead of ~204 KB). Uses the
# classic fatbin compression every driver decompresses on load (not zstd
# --compress-mode=size). COMPRESS=0 for a plain fatbin.
COMPRESS="${COMPRESS:-1}"

# Pinned wheels. nvcc/crt/nvvm/runtime are the CUDA 13.0 Update 2 compiler
# (13.0.88), matching the 13.0 driver of our GPU machine. cuobjdump/nvdisasm
# are only used to inspect the output; 13.2.86 is their oldest cu13 wheel.
PACKAGES=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.88
  nvidia-cuda-cuobjdump==13.2.86
  nvidia-cuda-nvdisasm==13.2.86
)

ARCHS=(75 80 86 89 90 100 120)

STAMP="$TOOLS/.installed"
WANT="${PACKAGES[*]}"
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT" ]]; then
  echo "==> installing ${WANT} into $TOOLS"
  rm -rf "$TOOLS"
  mkdir -p "$TOOLS"
  "$PYTHON" -m pip install --quiet --disable-pip-version-check \
    --no-deps --only-binary=:all: --target "$TOOLS" "${PACKAGES[@]}"
  echo "$WANT" > "$STAMP"
fi

CUDA_HOME="$TOOLS/nvidia/cu13"
export PATH="$CUDA_HOME/bin:$PATH"
NVCC="$CUDA_HOME/bin/nvcc"

if ! command -v "$CCBIN" >/dev/null 2>&1; then
  echo "error: host compiler '$CCBIN' not found (apt-get install g++, or set CCBIN)" >&2
  exit 1
fi

"$NVCC" --version | tail -n 2

GENCODE=()
for a in "${ARCHS[@]}"; do
  GENCODE+=("-gencode=arch=compute_${a},code=sm_${a}")   # SASS only, no PTX
done

NVCC_FLAGS=(
  -fatbin
  -std=c++17
  -O3
  --fmad=false
  -Werror=all-warnings
  -ccbin "$CCBIN"
  "${GENCODE[@]}"
)
if [[ "$COMPRESS" == 1 ]]; then
  NVCC_FLAGS+=(-Xfatbin=-compress-all)
else
  NVCC_FLAGS+=(--compress-mode=none)
fi

echo "==> nvcc ${NVCC_FLAGS[*]} $SRC -o $OUT"
TMP_OUT="$OUT.tmp.$$"
trap 'rm -f "$TMP_OUT"' EXIT
"$NVCC" "${NVCC_FLAGS[@]}" "$SRC" -o "$TMP_OUT"

if [[ -n "$(cuobjdump --list-ptx "$TMP_OUT" 2>/dev/null || true)" ]]; then
  echo "error: fatbin unexpectedly contains PTX" >&2
  exit 1
fi
mv "$TMP_OUT" "$OUT"
trap - EXIT

echo "==> $OUT ($(wc -c < "$OUT") bytes), embedded ELF images:"
cuobjdump --list-elf "$OUT"
