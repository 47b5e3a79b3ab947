// Test kernels for the `cuda-graph` crate.
//
// Built by `scripts/build-kernels.sh` into `tests/kernels/kernels.fatbin`
// (SASS only, no PTX) and embedded in the tests with `include_bytes!`.
// See tests/kernels/README.md.
//
// Every kernel is `extern "C"`, so its symbol name is exactly the name below
// (load it with cuModuleGetFunction / cuLibraryGetKernel).
//
// Argument types, as the Rust side must pass them (each entry of the
// `kernelParams` pointer array points at a value of this type):
//   int*, float*, unsigned int*, const T*   -> device pointer, u64 (CUdeviceptr)
//   int                                      -> i32
//   unsigned int                             -> u32
//   float                                    -> f32
//   cudaGraphConditionalHandle               -> u64 (CUgraphConditionalHandle)
//   cudaGraphExec_t                          -> u64 (CUgraphExec, DeviceGraph)
//
// "thread 0 only" kernels may be launched with any grid/block shape; only
// thread (0,0,0) of block (0,0,0) does anything. Grid-stride kernels work for
// any launch shape (a 1D grid is assumed).
//
// Compiled without relocatable device code: cudaGraphSetConditional is a
// device-runtime builtin that the CUDA driver resolves at module load time
// (same mechanism as printf's `vprintf`), so no libcudadevrt link is needed.

// cudaGraphConditionalHandle is `unsigned long long` (driver_types.h), the
// same 64-bit value as the driver API's CUgraphConditionalHandle.
static_assert(sizeof(cudaGraphConditionalHandle) == 8,
              "cudaGraphConditionalHandle must be 64-bit");

// Same declaration NVIDIA's cuda.core tests use with NVRTC. Under nvcc the
// implicitly included cuda_device_runtime_api.h already declares it
// identically; the redeclaration is accepted and keeps this file NVRTC-ready.
extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

#define FIRST_THREAD_ONLY()                                                    \
    if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0 ||            \
        blockIdx.x != 0 || blockIdx.y != 0 || blockIdx.z != 0)                 \
    return

// Not unrolled: these kernels are for correctness tests, and this keeps the
// fatbin small.
#define GRID_STRIDE_LOOP(i, n)                                                 \
    _Pragma("unroll 1")                                                        \
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;       \
         i < (long long)(n); i += (long long)blockDim.x * gridDim.x)

// ---------------------------------------------------------------------------
// empty_kernel()
//   Does nothing. Zero arguments (kernelParams may be null / empty).
extern "C" __global__ void empty_kernel() {}

// ---------------------------------------------------------------------------
// add_one(int* p)
//   p[0] += 1.  Thread 0 only.
extern "C" __global__ void add_one(int* p) {
    FIRST_THREAD_ONLY();
    p[0] += 1;
}

// ---------------------------------------------------------------------------
// add_one_at(int* p, int i)
//   p[i] += 1.  Thread 0 only.
extern "C" __global__ void add_one_at(int* p, int i) {
    FIRST_THREAD_ONLY();
    p[i] += 1;
}

// ---------------------------------------------------------------------------
// affine(int* p, int m, int b)
//   p[0] = p[0] * m + b.  Thread 0 only. (Non-commuting updates: useful to
//   check the order in which graph nodes ran.)
extern "C" __global__ void affine(int* p, int m, int b) {
    FIRST_THREAD_ONLY();
    p[0] = p[0] * m + b;
}

// ---------------------------------------------------------------------------
// fill(int* p, int n, int v)
//   p[i] = v for 0 <= i < n.  Grid-stride loop.
extern "C" __global__ void fill(int* p, int n, int v) {
    GRID_STRIDE_LOOP(i, n) { p[i] = v; }
}

// ---------------------------------------------------------------------------
// set_condition(cudaGraphConditionalHandle h, unsigned int value)
//   cudaGraphSetConditional(h, value).  Thread 0 only.
extern "C" __global__ void set_condition(cudaGraphConditionalHandle h,
                                         unsigned int value) {
    FIRST_THREAD_ONLY();
    cudaGraphSetConditional(h, value);
}

// ---------------------------------------------------------------------------
// countdown(cudaGraphConditionalHandle h, int* counter, int* iterations)
//   Thread 0 only:
//     iterations[0] += 1; counter[0] -= 1;
//     cudaGraphSetConditional(h, counter[0] > 0 ? 1 : 0);
//   As the body of a WHILE conditional node whose condition starts at 1 and
//   counter[0] starts at k >= 1, the body runs exactly k times.
extern "C" __global__ void countdown(cudaGraphConditionalHandle h, int* counter,
                                     int* iterations) {
    FIRST_THREAD_ONLY();
    iterations[0] += 1;
    counter[0] -= 1;
    cudaGraphSetConditional(h, counter[0] > 0 ? 1u : 0u);
}

// ---------------------------------------------------------------------------
// set_condition_from(cudaGraphConditionalHandle h, const int* value)
//   Thread 0 only: cudaGraphSetConditional(h, (unsigned int)value[0]).
//   (Condition taken from device memory, e.g. to pick a SWITCH branch.)
extern "C" __global__ void set_condition_from(cudaGraphConditionalHandle h,
                                              const int* value) {
    FIRST_THREAD_ONLY();
    cudaGraphSetConditional(h, (unsigned int)value[0]);
}

// ---------------------------------------------------------------------------
// heat_step(const float* in, float* out, int n, float alpha)
//   One explicit step of 1D diffusion with fixed (Dirichlet) boundary:
//     out[i] = in[i] + alpha * (in[i-1] - 2*in[i] + in[i+1])   for 0 < i < n-1
//     out[0] = in[0], out[n-1] = in[n-1]
//   Grid-stride loop. `in` and `out` must not overlap. Built with
//   --fmad=false, so a host f32 loop evaluating the same expression left to
//   right gives bit-identical results. Stable for 0 <= alpha <= 0.5.
extern "C" __global__ void heat_step(const float* in, float* out, int n,
                                     float alpha) {
    GRID_STRIDE_LOOP(i, n) {
        if (i == 0 || i == (long long)n - 1) {
            out[i] = in[i];
        } else {
            out[i] = in[i] + alpha * (in[i - 1] - 2.0f * in[i] + in[i + 1]);
        }
    }
}

// ---------------------------------------------------------------------------
// max_abs_diff(const float* a, const float* b, int n, unsigned int* result_bits)
//   result_bits[0] = max(result_bits[0], bits(|a[i] - b[i]|)) over 0 <= i < n,
//   via atomicMax on the f32 bit pattern (non-negative floats order like their
//   u32 bits). The caller zeroes result_bits[0] first (0 == bits of 0.0f);
//   read it back as f32::from_bits. A NaN difference yields NaN bits (largest).
//   Grid-stride loop.
extern "C" __global__ void max_abs_diff(const float* a, const float* b, int n,
                                        unsigned int* result_bits) {
    GRID_STRIDE_LOOP(i, n) {
        atomicMax(result_bits, __float_as_uint(fabsf(a[i] - b[i])));
    }
}

// ---------------------------------------------------------------------------
// converged_check(cudaGraphConditionalHandle h, unsigned int* diff_bits,
//                 float tol, int* iterations, int max_iter)
//   Thread 0 only:
//     iterations[0] += 1;
//     float d = __uint_as_float(diff_bits[0]);
//     diff_bits[0] = 0;                       // ready for the next max_abs_diff
//     cudaGraphSetConditional(h, (d > tol && iterations[0] < max_iter) ? 1 : 0);
//   Last node of a WHILE body: keep looping until converged or max_iter.
extern "C" __global__ void converged_check(cudaGraphConditionalHandle h,
                                           unsigned int* diff_bits, float tol,
                                           int* iterations, int max_iter) {
    FIRST_THREAD_ONLY();
    iterations[0] += 1;
    float d = __uint_as_float(diff_bits[0]);
    diff_bits[0] = 0u;
    cudaGraphSetConditional(h, (d > tol && iterations[0] < max_iter) ? 1u : 0u);
}

// ---------------------------------------------------------------------------
// copy_f32(const float* src, float* dst, int n)
//   dst[i] = src[i] for 0 <= i < n.  Grid-stride loop.
extern "C" __global__ void copy_f32(const float* src, float* dst, int n) {
    GRID_STRIDE_LOOP(i, n) { dst[i] = src[i]; }
}

// ---------------------------------------------------------------------------
// spin(unsigned long long ns)
//   Thread 0 only: busy-waits (with __nanosleep) until at least `ns`
//   nanoseconds of %globaltimer have passed. A long-running kernel, for tests
//   that must observe what happens while a launch is still running.
extern "C" __global__ void spin(unsigned long long ns) {
    FIRST_THREAD_ONLY();
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
        unsigned long long now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start >= ns) {
            break;
        }
        __nanosleep(1000);
    }
}

// ---------------------------------------------------------------------------
// copy_i32(const int* src, int* dst, int n)
//   dst[i] = src[i] for 0 <= i < n.  Grid-stride loop.
extern "C" __global__ void copy_i32(const int* src, int* dst, int n) {
    GRID_STRIDE_LOOP(i, n) { dst[i] = src[i]; }
}

// ---------------------------------------------------------------------------
// launch_graph(cudaGraphExec_t g, int* status)
//   Thread 0 only: status[0] = cudaGraphLaunch(g, cudaStreamGraphFireAndForget)
//   (device graph launch; 0 is cudaSuccess). `g` is an exec instantiated for
//   device launch and uploaded; this kernel must itself run in a graph.
//   Like cudaGraphSetConditional, the device-side cudaGraphLaunch is an extern
//   the driver resolves when it loads the module: no rdc, no libcudadevrt.
extern "C" __global__ void launch_graph(cudaGraphExec_t g, int* status) {
    FIRST_THREAD_ONLY();
    status[0] = (int)cudaGraphLaunch(g, cudaStreamGraphFireAndForget);
}

// ---------------------------------------------------------------------------
// Bisection for the root of x^3 - 2 on [lo, hi], as a WHILE loop whose body
// decides with an IF/ELSE (the conditional-handle test of nested bodies).
// state = { lo, hi, mid }.
//
// bisect_eval(cudaGraphConditionalHandle branch, float* state)
//   Thread 0 only: mid = (lo + hi) / 2; set(branch, mid^3 - 2 > 0).
extern "C" __global__ void bisect_eval(cudaGraphConditionalHandle branch,
                                       float* state) {
    FIRST_THREAD_ONLY();
    float mid = 0.5f * (state[0] + state[1]);
    state[2] = mid;
    cudaGraphSetConditional(branch, (mid * mid * mid - 2.0f > 0.0f) ? 1u : 0u);
}

// bisect_take(float* state, int which)
//   Thread 0 only: state[which] = state[2] (which 1: hi = mid; 0: lo = mid).
extern "C" __global__ void bisect_take(float* state, int which) {
    FIRST_THREAD_ONLY();
    state[which] = state[2];
}

// bisect_continue(cudaGraphConditionalHandle loop, const float* state,
//                 int* iterations, float tol, int max_iter)
//   Thread 0 only: iterations[0] += 1;
//   set(loop, hi - lo > tol && iterations[0] < max_iter).
extern "C" __global__ void bisect_continue(cudaGraphConditionalHandle loop,
                                           const float* state, int* iterations,
                                           float tol, int max_iter) {
    FIRST_THREAD_ONLY();
    iterations[0] += 1;
    cudaGraphSetConditional(
        loop, (state[1] - state[0] > tol && iterations[0] < max_iter) ? 1u : 0u);
}

// ---------------------------------------------------------------------------
// Slice kernels: each buffer comes with its length, as the Rust side's typed
// `Slice<T>` parameter passes it. They touch no element past `len`, so their
// typed declarations can promise to stay in bounds for any argument.
template <typename T> struct Slice {
    T* ptr;
    unsigned long long len;
};
static_assert(sizeof(Slice<int>) == 16, "Slice<T> is { T*, u64 }");

// fill_slice(Slice<int> p, int v): p[i] = v for every i < p.len.
extern "C" __global__ void fill_slice(Slice<int> p, int v) {
    GRID_STRIDE_LOOP(i, p.len) { p.ptr[i] = v; }
}

// copy_slice_i32(Slice<const int> src, Slice<int> dst): dst[i] = src[i] for
// i < min(src.len, dst.len).
extern "C" __global__ void copy_slice_i32(Slice<const int> src, Slice<int> dst) {
    unsigned long long n = src.len < dst.len ? src.len : dst.len;
    GRID_STRIDE_LOOP(i, n) { dst.ptr[i] = src.ptr[i]; }
}

// copy_slice_f32(Slice<const float> src, Slice<float> dst): as copy_slice_i32.
extern "C" __global__ void copy_slice_f32(Slice<const float> src, Slice<float> dst) {
    unsigned long long n = src.len < dst.len ? src.len : dst.len;
    GRID_STRIDE_LOOP(i, n) { dst.ptr[i] = src.ptr[i]; }
}

// heat_step_slice(Slice<const float> in, Slice<float> out, float alpha):
// heat_step over n = min(in.len, out.len) elements.
extern "C" __global__ void heat_step_slice(Slice<const float> in, Slice<float> out,
                                           float alpha) {
    long long n = (long long)(in.len < out.len ? in.len : out.len);
    GRID_STRIDE_LOOP(i, n) {
        if (i == 0 || i == n - 1) {
            out.ptr[i] = in.ptr[i];
        } else {
            out.ptr[i] = in.ptr[i] + alpha * (in.ptr[i - 1] - 2.0f * in.ptr[i] + in.ptr[i + 1]);
        }
    }
}

// max_abs_diff_slice(Slice<const float> a, Slice<const float> b,
//                    unsigned int* result_bits): max_abs_diff over
// n = min(a.len, b.len) elements into result_bits[0].
extern "C" __global__ void max_abs_diff_slice(Slice<const float> a, Slice<const float> b,
                                              unsigned int* result_bits) {
    unsigned long long n = a.len < b.len ? a.len : b.len;
    GRID_STRIDE_LOOP(i, n) {
        atomicMax(result_bits, __float_as_uint(fabsf(a.ptr[i] - b.ptr[i])));
    }
}
