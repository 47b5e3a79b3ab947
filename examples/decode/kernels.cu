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

// The WHILE body's last kernel: one step fewer to go; the loop runs again while any is left.
extern "C" __global__ void countdown(unsigned long long handle, int* remaining) {
    int r = *remaining - 1;
    *remaining = r;
    cudaGraphSetConditional(handle, r > 0 ? 1u : 0u);
}
