// The batched decoder's kernels, compiled at run time by NVRTC. fp32. A step runs `rows` batch
// rows; row r works on the sequence in slot rows_slot[r] (its tokens, position and KV cache
// rows), so the host can hand any set of slots to a step by writing rows_slot alone. Each row's
// arithmetic is the same whatever the batch (a row's dot products run in one warp, in one
// order), so a request decodes to the same tokens alone and batched.

typedef unsigned long long u64;

// NVRTC includes no <math.h>: the one constant the kernels need from it.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

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

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// x[r] = table[token at the slot's position] (grid: rows).
extern "C" __global__ void embed(const float* table, const int* rows_slot, const int* tokens,
                                 const int* pos, float* x, int d, int max_t) {
    int r = blockIdx.x, s = rows_slot[r];
    int tok = tokens[(u64)s * max_t + pos[s]];
    const float* row = table + (u64)tok * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) x[(u64)r * d + i] = row[i];
}

// y[r] = x[r] / rms(x[r]) * w (grid: rows; one warp per row, so one summation order).
extern "C" __global__ void rmsnorm(const float* x, const float* w, float* y, int d) {
    int r = blockIdx.x;
    if (threadIdx.x >= 32) return;
    const float* xr = x + (u64)r * d;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < d; i += 32) ss += xr[i] * xr[i];
    ss = warp_sum(ss);
    float inv = rsqrtf(ss / d + 1e-5f);
    for (int i = threadIdx.x; i < d; i += 32) y[(u64)r * d + i] = xr[i] * inv * w[i];
}

// y[b][row] = W[row] . x[b] (or +=, with `accumulate`), b < batch: a warp per weight row, which
// it reads once per step for the whole batch.
extern "C" __global__ void gemv(const float* __restrict__ w, const float* __restrict__ x,
                                float* y, int out_rows, int cols, int batch, int accumulate) {
    int lane = threadIdx.x % 32;
    int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int warps = gridDim.x * blockDim.x / 32;
    for (int r = warp; r < out_rows; r += warps) {
        const float* wr = w + (u64)r * cols;
        for (int b = 0; b < batch; b++) {
            const float* xb = x + (u64)b * cols;
            float acc = 0.0f;
            for (int i = lane; i < cols; i += 32) acc += wr[i] * xb[i];
            acc = warp_sum(acc);
            if (lane == 0) {
                u64 o = (u64)b * out_rows + r;
                y[o] = accumulate ? y[o] + acc : acc;
            }
        }
    }
}

// Rotary embedding of row r's q and k at its slot's position, and the k, v append to the
// slot's cache rows (grid: rows).
extern "C" __global__ void rope_append(float* qkv, const int* rows_slot, const int* pos,
                                       float* k_cache, float* v_cache, int d, int hd,
                                       int max_t) {
    int r = blockIdx.x, s = rows_slot[r], p = pos[s];
    float* q = qkv + (u64)r * 3 * d;
    float* k = q + d;
    const float* v = q + 2 * d;
    for (int i = threadIdx.x; i < d / 2; i += blockDim.x) {
        int h = i / (hd / 2), j = i % (hd / 2), a = h * hd + 2 * j;
        float f = p * powf(10000.0f, -2.0f * j / hd);
        float c = cosf(f), sn = sinf(f);
        float q0 = q[a], q1 = q[a + 1], k0 = k[a], k1 = k[a + 1];
        q[a] = q0 * c - q1 * sn;
        q[a + 1] = q0 * sn + q1 * c;
        k[a] = k0 * c - k1 * sn;
        k[a + 1] = k0 * sn + k1 * c;
    }
    __syncthreads();
    u64 base = ((u64)s * max_t + p) * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        k_cache[base + i] = k[i];
        v_cache[base + i] = v[i];
    }
}

// Attention of row r's query, head h, over its slot's cache rows 0..=pos (grid: heads x rows;
// dynamic shared memory: max_t floats).
extern "C" __global__ void attention(const float* qkv, const int* rows_slot, const int* pos,
                                     const float* k_cache, const float* v_cache, float* out,
                                     int d, int hd, int max_t) {
    extern __shared__ float scores[];
    __shared__ float inv_sum;
    int h = blockIdx.x, r = blockIdx.y, s = rows_slot[r], p = pos[s];
    const float* q = qkv + (u64)r * 3 * d + h * hd;
    float scale = rsqrtf((float)hd);
    for (int t = threadIdx.x; t <= p; t += blockDim.x) {
        const float* kt = k_cache + ((u64)s * max_t + t) * d + h * hd;
        float acc = 0.0f;
        for (int i = 0; i < hd; i++) acc += q[i] * kt[i];
        scores[t] = acc * scale;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int t = 0; t <= p; t++) m = fmaxf(m, scores[t]);
        float sum = 0.0f;
        for (int t = 0; t <= p; t++) {
            scores[t] = expf(scores[t] - m);
            sum += scores[t];
        }
        inv_sum = 1.0f / sum;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0.0f;
        for (int t = 0; t <= p; t++)
            acc += scores[t] * v_cache[((u64)s * max_t + t) * d + h * hd + i];
        out[(u64)r * d + h * hd + i] = acc * inv_sum;
    }
}

// act[r] = silu(gate) * up, gate and up the two halves of gu[r] (grid: rows).
extern "C" __global__ void silu_mul(const float* gu, float* act, int mlp) {
    int r = blockIdx.x;
    const float* g = gu + (u64)r * 2 * mlp;
    for (int i = threadIdx.x; i < mlp; i += blockDim.x) {
        float a = g[i];
        act[(u64)r * mlp + i] = a / (1.0f + expf(-a)) * g[mlp + i];
    }
}

// The greedy next token of row r (the first of equal maxima), written after the slot's prompt,
// and the slot's position advanced (held at the last row). A slot whose prompt length is 0 is a
// padding row's: nothing is written and its position stays at 0, so it costs one cache row of
// attention per step (grid: rows).
extern "C" __global__ void argmax_next(const float* logits, const int* rows_slot,
                                       const int* prompt_len, int* tokens, int* pos,
                                       int vocab, int max_t) {
    __shared__ float best_v[32];
    __shared__ int best_i[32];
    int r = blockIdx.x, s = rows_slot[r];
    const float* l = logits + (u64)r * vocab;
    float v = -INFINITY;
    int at = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (l[i] > v) { v = l[i]; at = i; }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffff, v, o);
        int oi = __shfl_xor_sync(0xffffffff, at, o);
        if (ov > v || (ov == v && oi < at)) { v = ov; at = oi; }
    }
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) { best_v[warp] = v; best_i[warp] = at; }
    __syncthreads();
    if (threadIdx.x == 0) {
        int warps = (blockDim.x + 31) / 32;
        for (int w = 1; w < warps; w++)
            if (best_v[w] > v || (best_v[w] == v && best_i[w] < at)) { v = best_v[w]; at = best_i[w]; }
        int p = pos[s];
        if (prompt_len[s] > 0 && p + 1 < max_t) {
            if (p + 1 >= prompt_len[s]) tokens[(u64)s * max_t + p + 1] = at;
            pos[s] = p + 1;
        }
    }
}
