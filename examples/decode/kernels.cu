// The decoder's kernels (everything but the GEMVs, which cuBLAS does), compiled at run time by
// NVRTC (`Device::compile`). fp32, batch 1. Every kernel that depends on the step reads the
// position from device memory (`pos`), so one captured step serves every step.

#ifndef CUDARTAPI
#define CUDARTAPI
#endif
// The device runtime's builtin (as cuda.core's NVRTC tests declare it): the driver resolves it
// when the module loads, so no relocatable device code is needed.
extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(unsigned long long handle, unsigned int value);

typedef unsigned long long u64;

// Programmatic dependent launch (the module compiled with -DPDL, for `--pdl on`): each kernel of
// the fused step lets the next one begin at once, then waits, before its first access to global
// memory, until the kernel before it has ended and its writes are visible. The next kernel's
// launch and prologue then overlap this one's tail. Without PDL both are nothing.
__device__ __forceinline__ void pdl_entry() {
#if defined(PDL) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The largest head the attention kernel takes (the configurations use 64 and 128).
#define MAX_HEAD_DIM 128

// Uniform in [-scale, scale) from a hash of (seed, index): weights made on the device.
extern "C" __global__ void init_uniform(float* w, u64 n, unsigned seed, float scale) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)blockDim.x * gridDim.x) {
        u64 x = i * 0x9E3779B97F4A7C15ull ^ ((u64)seed << 32 | seed);
        x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
        x ^= x >> 27; x *= 0x94D049BB133111EBull;
        x ^= x >> 31;
        w[i] = ((float)(x >> 40) / (float)(1ull << 24) * 2.0f - 1.0f) * scale;
    }
}

extern "C" __global__ void fill(float* w, u64 n, float v) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (u64)blockDim.x * gridDim.x)
        w[i] = v;
}

// x = table[tokens[pos]] (one row of d).
extern "C" __global__ void embed(const float* table, const int* tokens, const int* pos,
                                 float* x, int d) {
    pdl_entry();
    const float* row = table + (u64)tokens[*pos] * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[i] = row[i];
}

__device__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    int warps = (blockDim.x + 31) / 32;
    v = lane < warps ? shared[lane] : 0.0f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) shared[0] = v;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

// y = x / rms(x) * w; one block.
extern "C" __global__ void rmsnorm(const float* x, const float* w, float* y, int d) {
    __shared__ float shared[32];
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += x[i] * x[i];
    ss = block_sum(ss, shared);
    float scale = rsqrtf(ss / d + 1e-5f);
    for (int i = threadIdx.x; i < d; i += blockDim.x) y[i] = x[i] * scale * w[i];
}

// Rotary embedding of q and k at position pos (pairs i, i + hd/2 of each head), then k and v
// appended to this layer's cache at row pos. qkv = [q | k | v], each d.
extern "C" __global__ void rope_append(float* qkv, const int* pos, float* k_cache,
                                       float* v_cache, int d, int head_dim) {
    int p = *pos;
    int half = head_dim / 2;
    for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
        int head = i / half, j = i % half;
        float freq = powf(10000.0f, -2.0f * j / head_dim);
        float s, c;
        sincosf(p * freq, &s, &c);
        int a = head * head_dim + j, b = a + half;
        float q0 = qkv[a], q1 = qkv[b];
        qkv[a] = q0 * c - q1 * s;
        qkv[b] = q0 * s + q1 * c;
        float k0 = qkv[d + a], k1 = qkv[d + b];
        k_cache[(u64)p * d + a] = k0 * c - k1 * s;
        k_cache[(u64)p * d + b] = k0 * s + k1 * c;
    }
    for (int i = threadIdx.x; i < d; i += blockDim.x) v_cache[(u64)p * d + i] = qkv[2 * d + i];
}

// One query (the new token) over the cache rows 0..=pos, one block per head. Shared memory:
// max_t scores.
extern "C" __global__ void attention(const float* qkv, const float* k_cache,
                                     const float* v_cache, const int* pos, float* out, int d,
                                     int head_dim) {
    extern __shared__ float scores[];
    __shared__ float shared[32];
    int head = blockIdx.x, n = *pos + 1;
    const float* q = qkv + head * head_dim;
    float scale = rsqrtf((float)head_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    // A warp per cached row: lanes split the head's dimensions.
    for (int t = warp; t < n; t += warps) {
        const float* k = k_cache + (u64)t * d + head * head_dim;
        float s = 0.0f;
        for (int j = lane; j < head_dim; j += 32) s += q[j] * k[j];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        if (lane == 0) scores[t] = s * scale;
    }
    __syncthreads();
    float m = -1e30f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, scores[t]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if (lane == 0) shared[warp] = m;
    __syncthreads();
    m = -1e30f;
    for (int w = 0; w < warps; w++) m = fmaxf(m, shared[w]);
    __syncthreads();
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float e = __expf(scores[t] - m);
        scores[t] = e;
        sum += e;
    }
    sum = block_sum(sum, shared);
    // The weighted sum of the rows: a warp per row (as for the scores), each lane a few of the
    // head's dimensions, partial sums per warp reduced through shared memory. (One thread per
    // dimension looping over every row serially waited on each row's load in turn.)
    __shared__ float partial[32][MAX_HEAD_DIM];
    float acc[MAX_HEAD_DIM / 32];
    for (int r = 0; r < MAX_HEAD_DIM / 32; r++) acc[r] = 0.0f;
    for (int t = warp; t < n; t += warps) {
        float p = scores[t];
        const float* v = v_cache + (u64)t * d + head * head_dim;
        for (int r = 0; r < MAX_HEAD_DIM / 32; r++) {
            int j = lane + 32 * r;
            if (j < head_dim) acc[r] += p * v[j];
        }
    }
    for (int r = 0; r < MAX_HEAD_DIM / 32; r++) {
        int j = lane + 32 * r;
        if (j < head_dim) partial[warp][j] = acc[r];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++) total += partial[w][j];
        out[head * head_dim + j] = total / sum;
    }
}

// act = silu(gate) * up, gu = [gate | up].
extern "C" __global__ void silu_mul(const float* gu, float* act, int mlp) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < mlp; i += blockDim.x * gridDim.x) {
        float g = gu[i];
        act[i] = g / (1.0f + __expf(-g)) * gu[mlp + i];
    }
}

// The step's end: the next token is the logits' argmax (lowest index on ties) unless the prompt
// still gives it; the position moves on. One block.
extern "C" __global__ void argmax_next(const float* logits, int vocab, int* tokens, int* pos,
                                       int prompt_len) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    float v = -1e30f;
    int at = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (logits[i] > v) { v = logits[i]; at = i; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, v, o);
        int oi = __shfl_xor_sync(0xffffffff, at, o);
        if (ov > v || (ov == v && oi < at)) { v = ov; at = oi; }
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = at; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < (int)(blockDim.x / 32); w++)
            if (best_v[w] > v || (best_v[w] == v && best_i[w] < at)) { v = best_v[w]; at = best_i[w]; }
        int p = *pos;
        if (p + 1 >= prompt_len) tokens[p + 1] = at;
        *pos = p + 1;
    }
}

// The WHILE body's last kernel (cublas set): the loop runs again while the cache has a row for
// the next step (the position the step left + 1 < max_t), as lm_head_argmax_while decides.
extern "C" __global__ void while_room(unsigned long long handle, const int* pos, int max_t) {
    cudaGraphSetConditional(handle, *pos + 1 < max_t ? 1u : 0u);
}

// ---------------------------------------------------------------------------------------------
// The "fused" kernel set: the same step in 2 + 5 · layers kernels, no cuBLAS. The GEMVs give a
// warp to a row (lanes stride over it by float4, four loads in flight per lane, a shuffle
// reduction), the RMSNorm folded into the GEMV that reads its output, the SiLU into the gate/up
// GEMV, the residual into the GEMV that produces it, the rotary embedding and the cache append
// into the attention, and the argmax into the LM head. Row lengths are multiples of 4 (the host
// checks), and every buffer starts 16-byte aligned (a device allocation), so each row is.

// The sum over a warp, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// The sum over the block, in every thread; `red` holds 33 floats. Only warp 0 reads the
// per-warp sums, and the total goes to its own slot, so no thread reads a slot being written.
// Every thread of the block must call it.
__device__ float block_total(float v, float* red) {
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = (blockDim.x + 31) / 32;
    if (lane == 0) red[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = warp_sum(lane < warps ? red[lane] : 0.0f);
        if (lane == 0) red[32] = t;
    }
    __syncthreads();
    return red[32];
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// One row of W (n4 float4s, global, read once: no L1 allocation) against v (n4 float4s, shared
// or global), summed over the warp: every lane gets the dot product.
__device__ __forceinline__ float warp_dot(const float4* __restrict__ w, const float4* v, int n4,
                                          int lane) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int i = lane;
    for (; i + 96 < n4; i += 128) {  // i, i + 32, i + 64, i + 96 all < n4
        float4 w0 = __ldcs(w + i), w1 = __ldcs(w + i + 32);
        float4 w2 = __ldcs(w + i + 64), w3 = __ldcs(w + i + 96);
        a0 += dot4(w0, v[i]);
        a1 += dot4(w1, v[i + 32]);
        a2 += dot4(w2, v[i + 64]);
        a3 += dot4(w3, v[i + 96]);
    }
    for (; i < n4; i += 32) a0 += dot4(__ldcs(w + i), v[i]);
    return warp_sum((a0 + a1) + (a2 + a3));
}

// Two rows of W (wa, wb) against the same v, as warp_dot: the gate and the up row together.
__device__ __forceinline__ float2 warp_dot2(const float4* __restrict__ wa,
                                           const float4* __restrict__ wb, const float4* v,
                                           int n4, int lane) {
    float a0 = 0.0f, a1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
    int i = lane;
    for (; i + 32 < n4; i += 64) {  // i, i + 32 both < n4
        float4 p0 = __ldcs(wa + i), p1 = __ldcs(wa + i + 32);
        float4 q0 = __ldcs(wb + i), q1 = __ldcs(wb + i + 32);
        float4 x0 = v[i], x1 = v[i + 32];
        a0 += dot4(p0, x0);
        a1 += dot4(p1, x1);
        b0 += dot4(q0, x0);
        b1 += dot4(q1, x1);
    }
    for (; i < n4; i += 32) {
        float4 x0 = v[i];
        a0 += dot4(__ldcs(wa + i), x0);
        b0 += dot4(__ldcs(wb + i), x0);
    }
    return make_float2(warp_sum(a0 + a1), warp_sum(b0 + b1));
}

// The block's copy of rmsnorm(x) ∘ norm_w (n floats) in shared memory `xn`, as `rmsnorm`
// computes it; `red` holds 33 floats. Ends with a barrier: xn is ready for every warp.
__device__ void norm_to_shared(const float* __restrict__ x, const float* __restrict__ norm_w,
                               float* xn, int n, float* red) {
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += x[i] * x[i];
    ss = block_total(ss, red);
    float scale = rsqrtf(ss / n + 1e-5f);
    for (int i = threadIdx.x; i < n; i += blockDim.x) xn[i] = x[i] * scale * norm_w[i];
    __syncthreads();
}

// y = W · (rmsnorm(x) ∘ norm_w), W row-major rows × cols, cols % 4 == 0. A warp to a row, the
// grid's warps striding over the rows. Dynamic shared memory: cols floats.
extern "C" __global__ void rms_gemv(const float* __restrict__ w, const float* __restrict__ x,
                                    const float* __restrict__ norm_w, float* __restrict__ y,
                                    int rows, int cols) {
    pdl_entry();
    extern __shared__ float4 xn4[];
    __shared__ float red[33];
    norm_to_shared(x, norm_w, (float*)xn4, cols, red);
    int lane = threadIdx.x % 32, n4 = cols / 4;
    int warps = blockDim.x / 32, all_warps = gridDim.x * warps;
    for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += all_warps) {
        float s = warp_dot((const float4*)(w + (u64)r * cols), xn4, n4, lane);
        if (lane == 0) y[r] = s;
    }
}

// act[i] = silu(g) · u, g = W[i] · h and u = W[mlp + i] · h, h = rmsnorm(x) ∘ norm_w; W is
// [gate | up], 2·mlp rows × cols. A warp to an i. Dynamic shared memory: cols floats.
extern "C" __global__ void rms_gate_up_silu(const float* __restrict__ w,
                                            const float* __restrict__ x,
                                            const float* __restrict__ norm_w,
                                            float* __restrict__ act, int mlp, int cols) {
    pdl_entry();
    extern __shared__ float4 xn4[];
    __shared__ float red[33];
    norm_to_shared(x, norm_w, (float*)xn4, cols, red);
    int lane = threadIdx.x % 32, n4 = cols / 4;
    int warps = blockDim.x / 32, all_warps = gridDim.x * warps;
    for (int i = blockIdx.x * warps + threadIdx.x / 32; i < mlp; i += all_warps) {
        float2 gu = warp_dot2((const float4*)(w + (u64)i * cols),
                              (const float4*)(w + (u64)(mlp + i) * cols), xn4, n4, lane);
        if (lane == 0) act[i] = gu.x / (1.0f + __expf(-gu.x)) * gu.y;
    }
}

// x[r] += W[r] · a, W row-major rows × cols, cols % 4 == 0: the output projection and the MLP's
// down projection with the residual. A warp to a row; no thread reads x but the one adding to
// its element, and a is not x.
extern "C" __global__ void gemv_residual(const float* __restrict__ w, const float* __restrict__ a,
                                         float* __restrict__ x, int rows, int cols) {
    pdl_entry();
    int lane = threadIdx.x % 32, n4 = cols / 4;
    int warps = blockDim.x / 32, all_warps = gridDim.x * warps;
    for (int r = blockIdx.x * warps + threadIdx.x / 32; r < rows; r += all_warps) {
        float s = warp_dot((const float4*)(w + (u64)r * cols), (const float4*)a, n4, lane);
        if (lane == 0) x[r] += s;
    }
}

// rope_append and attention in one kernel, one block per head: this head's q rotated into
// shared memory, its k rotated and its v copied into the caches' row pos (the block writes only
// its own head's columns, and only it reads them), a barrier, then the query over rows
// 0..=pos as `attention` does it. The caches are read with plain loads (not through the
// read-only cache): row pos was written by this block in this launch. Dynamic shared memory:
// max_t scores. Positions at or past max_t are refused (nothing is written). blockDim.x: a
// multiple of 32, at most 1024 (partial has a row per warp).
extern "C" __global__ void rope_attention(const float* __restrict__ qkv, const int* pos,
                                          float* k_cache, float* v_cache,
                                          float* __restrict__ out, int d, int head_dim,
                                          int max_t) {
    pdl_entry();
    extern __shared__ float scores[];
    __shared__ float q[MAX_HEAD_DIM];
    __shared__ float red[33];
    __shared__ float partial[32][MAX_HEAD_DIM];
    int head = blockIdx.x, p = *pos;
    if (p < 0 || p >= max_t || head_dim > MAX_HEAD_DIM) return;  // the same for every thread
    int n = p + 1, half = head_dim / 2, base = head * head_dim;
    float* k_row = k_cache + (u64)p * d + base;
    float* v_row = v_cache + (u64)p * d + base;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        float freq = powf(10000.0f, -2.0f * j / head_dim);
        float s, c;
        sincosf(p * freq, &s, &c);
        float q0 = qkv[base + j], q1 = qkv[base + j + half];
        q[j] = q0 * c - q1 * s;
        q[j + half] = q0 * s + q1 * c;
        float k0 = qkv[d + base + j], k1 = qkv[d + base + j + half];
        k_row[j] = k0 * c - k1 * s;
        k_row[j + half] = k0 * s + k1 * c;
    }
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) v_row[j] = qkv[2 * d + base + j];
    __syncthreads();  // q in shared memory, and this head's cache row pos, seen by the block

    float scale = rsqrtf((float)head_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int t = warp; t < n; t += warps) {
        const float* k = k_cache + (u64)t * d + base;
        float s = 0.0f;
        for (int j = lane; j < head_dim; j += 32) s += q[j] * k[j];
        s = warp_sum(s);
        if (lane == 0) scores[t] = s * scale;
    }
    __syncthreads();
    float m = -1e30f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, scores[t]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    if (lane == 0) red[warp] = m;
    __syncthreads();
    m = -1e30f;
    for (int w = 0; w < warps; w++) m = fmaxf(m, red[w]);
    __syncthreads();  // every thread has read red before block_total writes it again
    float sum = 0.0f;
    for (int t = threadIdx.x; t < n; t += blockDim.x) {
        float e = __expf(scores[t] - m);
        scores[t] = e;  // each t by the one thread that read it
        sum += e;
    }
    sum = block_total(sum, red);  // its barriers also publish the scores
    float acc[MAX_HEAD_DIM / 32];
    for (int r = 0; r < MAX_HEAD_DIM / 32; r++) acc[r] = 0.0f;
    for (int t = warp; t < n; t += warps) {
        float pr = scores[t];
        const float* v = v_cache + (u64)t * d + base;
        for (int r = 0; r < MAX_HEAD_DIM / 32; r++) {
            int j = lane + 32 * r;
            if (j < head_dim) acc[r] += pr * v[j];
        }
    }
    for (int r = 0; r < MAX_HEAD_DIM / 32; r++) {
        int j = lane + 32 * r;
        if (j < head_dim) partial[warp][j] = acc[r];
    }
    __syncthreads();
    for (int j = threadIdx.x; j < head_dim; j += blockDim.x) {
        float total = 0.0f;
        for (int w = 0; w < warps; w++) total += partial[w][j];
        out[base + j] = total / sum;
    }
}

// (v, i) beats (bv, bi): larger, or as large at a lower index — the order argmax_next keeps.
__device__ __forceinline__ bool beats(float v, int i, float bv, int bi) {
    return v > bv || (v == bv && i < bi);
}

// The best (value, index) of the block, in thread 0; every thread must call it.
__device__ void block_best(float& v, int& at, float* best_v, int* best_i) {
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, v, o);
        int oi = __shfl_xor_sync(0xffffffff, at, o);
        if (beats(ov, oi, v, at)) { v = ov; at = oi; }
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = at; }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < (int)((blockDim.x + 31) / 32); w++)
            if (beats(best_v[w], best_i[w], v, at)) { v = best_v[w]; at = best_i[w]; }
}

// The step's end in one kernel: logits = W · (rmsnorm(x) ∘ norm_w) a warp to a row (never
// stored), each block's best (value, index) to part_v/part_i[blockIdx.x], then the last block
// to arrive (a counter in part_i[gridDim.x], zero at launch) takes the best of all — larger, or
// as large at a lower index, so the order of arrival changes nothing — and ends the step as
// argmax_next does: the next token unless the prompt still gives it, pos + 1; it sets the
// counter back to zero for the next launch. Only that block reads or writes pos and tokens.
// part_v holds gridDim.x entries, part_i gridDim.x + 1. Dynamic shared memory: cols floats.
// Returns the new position in thread 0 of the last block, -1 in every other thread. xn4: the
// kernel's dynamic shared memory.
__device__ int lm_head_argmax_step(const float* __restrict__ w, const float* __restrict__ x,
                                   const float* __restrict__ norm_w, int vocab, int cols,
                                   float* part_v, int* part_i, int* tokens, int* pos,
                                   int prompt_len, int max_t, float4* xn4) {
    __shared__ float red[33];
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    __shared__ bool last;
    unsigned* counter = (unsigned*)(part_i + gridDim.x);
    norm_to_shared(x, norm_w, (float*)xn4, cols, red);
    int lane = threadIdx.x % 32, n4 = cols / 4;
    int warps = blockDim.x / 32, all_warps = gridDim.x * warps;
    // argmax_next's start: nothing at or below -1e30 beats index 0.
    float v = -1e30f;
    int at = 0;
    for (int r = blockIdx.x * warps + threadIdx.x / 32; r < vocab; r += all_warps) {
        float s = warp_dot((const float4*)(w + (u64)r * cols), xn4, n4, lane);
        if (s > v) { v = s; at = r; }  // rows ascend: a tie keeps the lower index
    }
    block_best(v, at, best_v, best_i);
    if (threadIdx.x == 0) {
        part_v[blockIdx.x] = v;
        part_i[blockIdx.x] = at;
        __threadfence();  // the partial is visible to every block before the count says so
        last = atomicAdd(counter, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return -1;  // the same for every thread of the block
    __threadfence();
    v = -1e30f;
    at = 0;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) {
        float bv = __ldcg(part_v + b);  // from L2: other blocks wrote them
        int bi = __ldcg(part_i + b);
        if (beats(bv, bi, v, at)) { v = bv; at = bi; }
    }
    block_best(v, at, best_v, best_i);
    if (threadIdx.x != 0) return -1;
    int p = *pos;
    if (p + 1 >= prompt_len && p + 1 < max_t) tokens[p + 1] = at;
    *pos = p + 1;
    *counter = 0u;
    return p + 1;
}

extern "C" __global__ void lm_head_argmax(const float* __restrict__ w, const float* __restrict__ x,
                                          const float* __restrict__ norm_w, int vocab, int cols,
                                          float* part_v, int* part_i, int* tokens, int* pos,
                                          int prompt_len, int max_t) {
    pdl_entry();
    extern __shared__ float4 xn4[];
    lm_head_argmax_step(w, x, norm_w, vocab, cols, part_v, part_i, tokens, pos, prompt_len,
                        max_t, xn4);
}

// lm_head_argmax as a WHILE body's last kernel, with the countdown folded in: the loop runs
// again while the cache has a row for the next step (the new position + 1 < max_t), the same
// steps as `countdown` from max_t - 1. One kernel fewer per step than a separate countdown.
extern "C" __global__ void lm_head_argmax_while(const float* __restrict__ w,
                                                const float* __restrict__ x,
                                                const float* __restrict__ norm_w, int vocab,
                                                int cols, float* part_v, int* part_i,
                                                int* tokens, int* pos, int prompt_len, int max_t,
                                                unsigned long long handle) {
    pdl_entry();
    extern __shared__ float4 xn4[];
    int p = lm_head_argmax_step(w, x, norm_w, vocab, cols, part_v, part_i, tokens, pos,
                                prompt_len, max_t, xn4);
    if (p >= 0) cudaGraphSetConditional(handle, p + 1 < max_t ? 1u : 0u);
}
