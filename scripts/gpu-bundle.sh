#!/usr/bin/env bash
# Builds every test, bench and example binary in release and copies them, with what they load,
# into gpu-bundle/ (git-ignored), together with run-all.sh, which runs the whole suite on a
# machine that has a GPU but no cargo:
#
#   scripts/gpu-bundle.sh            # here
#   bash gpu-bundle/run-all.sh       # there (from the repository root, or anywhere)
#   SANITIZE=1 bash gpu-bundle/run-all.sh   # the GPU suite and a short soak under compute-sanitizer memcheck
#   SANITIZE=1 SANITIZE_API=1 ...           # ... also listing driver calls that returned errors
#   (run-all.sh puts /usr/local/cuda/lib64 on LD_LIBRARY_PATH, where cudarc finds libcublas,
#   and the lib folder of the `nvidia-nccl` Python wheel if one is installed, where the crate's
#   `nccl` feature finds libnccl.so.2; the NCCL tests are ignored without it)
#   SOAK_CYCLES=100000 gpu-bundle/example-soak   # the full leak soak; run-all.sh runs it with
#                                                # its default of 2000 cycles per loop
#   CANDLE=1 scripts/gpu-bundle.sh   # also examples/candle (candle-core with `cuda`: nvcc, minutes),
#                                    # gzipped to stay under the 64 MiB the device tool carries
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out"

exes() { # cargo subcommand args... -> executable paths
  cargo "$@" --message-format=json |
    python3 -c 'import json,sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["kind"][0], m["target"]["name"], m["executable"])'
}

# Tests and examples with the `cudarc`, `nvrtc` and `nccl` features: the adapters' GPU tests,
# examples/cublas_capture.rs, the NVRTC tests, examples/quickstart.rs and
# examples/tensor_parallel.rs exist only with them.
{
  exes test --release --no-run --tests --features cudarc,nvrtc,half,nccl
  exes bench --no-run
  exes build --release --examples --features cudarc,nvrtc,half,nccl
} | sort -u | while read -r kind name path; do
  [ "$kind $name" = "test ui" ] && continue  # trybuild needs cargo; CI runs it
  case "$kind" in
    test) dest="$out/test-$name" ;;
    bench) dest="$out/bench-$name" ;;
    example) dest="$out/example-$name" ;;
    lib) dest="$out/unit-$name" ;;
    *) dest="$out/$kind-$name" ;;
  esac
  cp "$path" "$dest"
  strip "$dest" 2>/dev/null || true
done
# The PyTorch peer of examples/serve, run beside it when the machine has PyTorch.
cp benches/peers/torch_serve.py "$out/"

# The README's quick start, pasted into a crate of its own (path dependency on this one, as a
# user's crate would depend on the release): it must build as written, and run-all.sh runs it.
fresh=target/readme-quickstart
scripts/readme-crate.sh "$fresh"
CARGO_TARGET_DIR="$PWD/target" cargo build --release --quiet --manifest-path "$fresh/Cargo.toml"
cp target/release/readme-quickstart "$out/example-readme-quickstart"
strip "$out/example-readme-quickstart" 2>/dev/null || true

# The candle example (examples/candle, a crate of its own): with CANDLE=1, built through
# scripts/candle-env.sh (the first build compiles candle's kernels with nvcc: minutes).
if [ "${CANDLE:-0}" = 1 ]; then
  scripts/candle-env.sh cargo build --release --quiet --manifest-path examples/candle/Cargo.toml \
    --target-dir target/candle
  cp target/candle/release/candle-capture "$out/example-candle-capture"
  strip "$out/example-candle-capture" 2>/dev/null || true
  # Compressed (about a quarter of its size) so that the benches fit beside it; run-all.sh
  # unpacks it.
  gzip -9 "$out/example-candle-capture"
  # The PyTorch peer of its decode mode, run beside it when the machine has PyTorch.
  cp benches/peers/torch_llama2c.py "$out/"
  # The trained checkpoint its decode mode reads (../shared/data, beside the checkout).
  [ -f ../shared/data/stories260K.bin ] && cp ../shared/data/stories260K.bin "$out/"
fi

cat > "$out/run-all.sh" <<'RUN'
#!/usr/bin/env bash
# Runs the bundled suite. Exit status: non-zero if anything failed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
status=0
# cudarc opens libcublas (the cuBLAS test and example) by name on the library path only.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# libnccl from the nvidia-nccl wheel (PyTorch's), where no system NCCL is installed.
nccl_lib="$(python3 -c 'import nvidia.nccl as m, os; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)"
[ -n "$nccl_lib" ] && [ -d "$nccl_lib" ] && export LD_LIBRARY_PATH="$nccl_lib:$LD_LIBRARY_PATH"
run() { echo "=== $*"; "$@" || { echo "!!! FAILED: $*"; status=1; }; }
for t in "$here"/unit-* "$here"/test-*; do
  [ -x "$t" ] || continue
  if [ "${SANITIZE:-0}" = 1 ] && [ "$(basename "$t")" = test-gpu ]; then
    # Memory errors fail the run. API errors (calls returning an error) are listed with
    # SANITIZE_API=1; the negative tests make some on purpose.
    api=no; [ "${SANITIZE_API:-0}" = 1 ] && api=explicit
    # One test fails under memcheck only (docs/design/performance.md, "Running under compute-sanitizer").
    run compute-sanitizer --tool memcheck --report-api-errors "$api" --error-exitcode 1 "$t" \
      --skip safety::conditional_execs_updated_while_their_launches_run
  else
    run "$t"
  fi
done
# The candle example travels compressed.
[ -f "$here/example-candle-capture.gz" ] && gunzip -kf "$here/example-candle-capture.gz"
for e in "$here"/example-*; do
  case "$e" in *.gz) continue ;; esac
  [ -x "$e" ] || continue
  if [ "${SANITIZE:-0}" = 1 ] && [ "$(basename "$e")" = example-soak ]; then
    # The soak under memcheck: a short run (the sanitizer is slow; growth figures mean nothing
    # there), for memory errors only. Its failed-update loop makes API errors on purpose.
    # --in-process: both sides in the sanitized process itself (children need the tool to follow them).
    run compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$e" --cycles 50 --warmup 5 --report-only --in-process
  else
    run "$e"
  fi
done
# The serving example's PyTorch peer (per-bucket CUDA graphs in one pool), beside it.
if [ -f "$here/torch_serve.py" ] && python3 -c 'import torch' 2>/dev/null; then
  run python3 "$here/torch_serve.py" 200 7
fi
# The candle example's decode mode: the reference, candle eager and the captured step agree.
if [ -x "$here/example-candle-capture" ] && [ -f "$here/stories260K.bin" ]; then
  peers="$(mktemp -d)"
  run "$here/example-candle-capture" decode --checkpoint "$here/stories260K.bin" --steps 256 \
    --save-tokens "$peers/stories260K.tokens"
  run "$here/example-candle-capture" decode --random 15m --steps 256 \
    --save-checkpoint "$peers/15m.bin" --save-tokens "$peers/15m.tokens"
  # The same checkpoints in PyTorch (eager, CUDA graph, torch.compile), tokens compared.
  if python3 -c 'import torch' 2>/dev/null; then
    run python3 "$here/torch_llama2c.py" "$here/stories260K.bin" --steps 256 --expect "$peers/stories260K.tokens"
    run python3 "$here/torch_llama2c.py" "$peers/15m.bin" --steps 256 --expect "$peers/15m.tokens"
  fi
  rm -rf "$peers"
fi
if [ "${BENCH:-0}" = 1 ]; then
  for b in "$here"/bench-*; do
    [ -x "$b" ] && run "$b" --bench
  done
fi
echo "=== run-all: $([ $status = 0 ] && echo ok || echo FAILED)"
exit $status
RUN
chmod +x "$out/run-all.sh"

# Two device calls' worth (each under the device tool's 10-minute limit). Each prints a summary
# and leaves its logs in one archive under $OUT (the device tool brings back only a few files):
#   bash gpu-bundle/verify-1.sh   # the suite, the candle decode and its PyTorch peer, serve and
#                                 # its peer, decode with PDL, bench-pdl, the probes, a short soak,
#                                 # the small examples (about 4 minutes on an H100)
#   bash gpu-bundle/verify-2.sh   # the stress test with threads left out, the overhead bench, the
#                                 # GPU suite under memcheck
cat > "$out/verify-1.sh" <<'V1'
set -u
here="$(cd "$(dirname "$0")" && pwd)"; out="${OUT:-/tmp/verify}"; logs="$(mktemp -d)"
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
t0=$(date +%s)
r() { # name timeout command...: its log in the archive, its status and time here
  local n=$1 t=$2; shift 2; local s=$(date +%s)
  timeout "$t" "$@" > "$logs/$n.log" 2>&1; local rc=$?
  echo "## $n rc=$rc $(( $(date +%s) - s ))s (at $(( $(date +%s) - t0 ))s)"
}
for t in unit-cuda_graph test-graph_set test-readme test-refusal_kinds; do
  r $t 60 "$here/$t"; grep -h "test result" "$logs/$t.log"
done
r test-gpu 200 "$here/test-gpu"; grep -E "test result|FAILED|^---- " "$logs/test-gpu.log" | head -20
if [ -f "$here/example-candle-capture.gz" ]; then
  gunzip -kf "$here/example-candle-capture.gz"
  p="$logs/peers"; mkdir -p "$p"
  r candle-forward 30 "$here/example-candle-capture"; tail -3 "$logs/candle-forward.log"
  r candle-260k 90 "$here/example-candle-capture" decode --checkpoint "$here/stories260K.bin" --steps 256 --save-tokens "$p/260k.tokens"
  grep -v "^ *[0-9]*: " "$logs/candle-260k.log" | tail -14
  r candle-15m 90 "$here/example-candle-capture" decode --random 15m --steps 256 --save-checkpoint "$p/15m.bin" --save-tokens "$p/15m.tokens"
  grep -v "^ *[0-9]*: " "$logs/candle-15m.log" | tail -14
  r torch-260k 60 python3 "$here/torch_llama2c.py" "$here/stories260K.bin" --steps 256 --expect "$p/260k.tokens"; tail -6 "$logs/torch-260k.log"
  r torch-15m 60 python3 "$here/torch_llama2c.py" "$p/15m.bin" --steps 256 --expect "$p/15m.tokens"; tail -6 "$logs/torch-15m.log"
  rm -f "$p/15m.bin"
  for f in --event-tracking --per-thread; do r candle$f 15 "$here/example-candle-capture" $f; grep -v "^ *[0-9]*: " "$logs/candle$f.log" | tail -2; done
fi
r serve 75 "$here/example-serve"; tail -30 "$logs/serve.log"
[ -f "$here/torch_serve.py" ] && { r torch-serve 60 python3 "$here/torch_serve.py" 200 7; tail -14 "$logs/torch-serve.log"; }
r decode 70 "$here/example-decode" tiny 3; grep -E "^decode,|^#|error" "$logs/decode.log" | head -20
[ -x "$here/bench-pdl" ] && { r bench-pdl 30 "$here/bench-pdl" --bench; tail -6 "$logs/bench-pdl.log"; }
r toggle-probe 25 "$here/example-toggle_probe"; tail -8 "$logs/toggle-probe.log"
r soak 50 "$here/example-soak" --cycles 500; tail -11 "$logs/soak.log"
for e in quickstart readme-quickstart explicit fork_join decode_loop device_loop cublas_capture host_cost ptx_fuzz; do
  [ -x "$here/example-$e" ] && { r ex-$e 20 "$here/example-$e"; tail -1 "$logs/ex-$e.log"; }
done
echo "total $(( $(date +%s) - t0 ))s"
mkdir -p "$out"; tar -czf "$out/verify-1-logs.tar.gz" -C "$logs" .
V1
cat > "$out/verify-2.sh" <<'V2'
set -u
here="$(cd "$(dirname "$0")" && pwd)"; out="${OUT:-/tmp/verify}"; logs="$(mktemp -d)"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The stress test with threads left out (CUDA_GRAPH_STRESS_OFF), to tell which ones it needs.
for off in "" toggles updates "updates,memsets,stream2" "toggles,memsets,stream2"; do
  echo "## stress, left out: [$off]"
  CUDA_GRAPH_STRESS_OFF="$off" timeout 30 "$here/test-gpu" safety::replaced_operands 2>&1 |
    grep -E "launches|test result"
done
OVERHEAD_SIZES=100,1000 timeout 150 "$here/bench-overhead" --bench > "$logs/bench.log" 2>&1; echo "bench rc=$?"
grep -iE "ratio|/raw" "$logs/bench.log" | tail -30
timeout 300 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 "$here/test-gpu" \
  --skip nccl:: --skip safety::conditional_execs_updated_while_their_launches_run > "$logs/memcheck.log" 2>&1
echo "memcheck rc=$?"; grep -E "ERROR SUMMARY|test result|FAILED" "$logs/memcheck.log" | tail -20
mkdir -p "$out"; tar -czf "$out/verify-2-logs.tar.gz" -C "$logs" .
V2
du -sh "$out"
ls -l "$out"
