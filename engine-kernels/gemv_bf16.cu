// Dense matrix-vector products for decode: y[t, r] (+)= W[r, :] . x[t, :] + b[r], bf16
// weights, fp32 activations and accumulation, one weight pass for up to GEMV_MAX_TOKENS tokens.
// With accumulate != 0 the result is added to y (the residual add of o_proj fused in).
// With norm_w non-null the input is RMSNorm(x) · norm_w, computed by every block into shared
// memory (dynamic, tokens × cols floats) and also written to x_out by block 0, so the norm
// costs no launch of its own.
// gemv_bf16: one warp per row, for many rows (qkv, o, lm_head).
// gemv_bf16_wide: one block of 8 warps per row, for few rows (the router), so the few rows
// still spread over the whole chip.
#define GEMV_MAX_TOKENS 4
#define GEMV_ROWS_PER_BLOCK 8

// Partial dot products of row `wr` with tokens t0.. over 8-element chunks start, start+stride…
// (16-byte loads, four in flight per thread).
__device__ __forceinline__ void gemv_partial(const bf16_t* __restrict__ wr, const float* __restrict__ x,
                                             int cols, int t0, int nt, int start, int stride,
                                             float (&acc)[GEMV_MAX_TOKENS]) {
    if ((cols & 7) == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(wr);
        const int n8 = cols >> 3;
        for (int c0 = start; c0 < n8; c0 += 4 * stride) {
            uint4 wv[4];
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (c0 + u * stride < n8) wv[u] = __ldg(w4 + c0 + u * stride);
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = c0 + u * stride;
                if (c < n8) {
                    float wf[8];
                    bf16x8_to_f32(wv[u], wf);
#pragma unroll
                    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) {
                        if (t < nt) {
                            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)(t0 + t) * cols) + 2 * c;
                            const float4 a = xp[0], b = xp[1];
                            acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
                                      wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
                        }
                    }
                }
            }
        }
    } else {
        for (int c = start; c < cols; c += stride) {
            const float wf = bf2f(wr[c]);
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOKENS; ++t)
                if (t < nt) acc[t] += wf * x[(size_t)(t0 + t) * cols + c];
        }
    }
}

// The activations the block multiplies with: x itself, or its RMSNorm staged in shared memory.
// Token t of the result is at the returned pointer + t * cols. Whole block must call it.
__device__ __forceinline__ const float* gemv_input(const float* __restrict__ x,
                                                   const bf16_t* __restrict__ norm_w, float eps,
                                                   float* __restrict__ x_out, int cols, int t0,
                                                   int nt, float* xs) {
    if (!norm_w) return x + (size_t)t0 * cols;
    __shared__ float scratch[32];
    for (int t = 0; t < nt; ++t) {
        const float* xr = x + (size_t)(t0 + t) * cols;
        float ss = 0.0f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) ss += xr[c] * xr[c];
        ss = block_sum(ss, scratch);
        const float r = rsqrtf(ss / (float)cols + eps);
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = xr[c] * r * bf2f(norm_w[c]);
            xs[t * cols + c] = v;
            if (blockIdx.x == 0 && x_out) x_out[(size_t)(t0 + t) * cols + c] = v;
        }
    }
    __syncthreads();
    return xs;
}

// Router top-k: the k largest logits of a token (ties: lower expert index first) and the
// softmax over those k only, by one warp; `vals` is shared scratch of n_experts floats. The
// router GEMV (gemv_bf16_wide) runs this in its last block to finish, so routing costs no
// launch of its own. Logits are read past L1 (other blocks wrote them).
__device__ void topk_softmax_warp(const float* logits, int n_experts, int k, int* __restrict__ idx,
                                  float* __restrict__ weights, float* vals) {
    const int lane = threadIdx.x & 31;
    for (int e = lane; e < n_experts; e += 32) vals[e] = __ldcg(logits + e);
    __syncwarp();
    float top_v[32];
    int top_i[32];
    for (int s = 0; s < k; ++s) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_experts; e += 32) take_better(bv, bi, vals[e], e);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            take_better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
        if (bi >= n_experts) bi = 0;  // only NaN/-inf left: stay in bounds, NaN shows downstream
        top_v[s] = bv;
        top_i[s] = bi;
        __syncwarp();
        if (lane == 0) vals[bi] = -INFINITY;
        __syncwarp();
    }
    if (lane != 0) return;
    float sum = 0.0f;
    for (int s = 0; s < k; ++s) sum += expf(top_v[s] - top_v[0]);
    for (int s = 0; s < k; ++s) {
        idx[s] = top_i[s];
        weights[s] = expf(top_v[s] - top_v[0]) / sum;
    }
}

extern "C" __global__ void __launch_bounds__(256, GEMV_MINB)
gemv_bf16(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
          const float* __restrict__ x, float* __restrict__ y,
          int rows, int cols, int tokens, int accumulate,
          const bf16_t* __restrict__ norm_w, float eps, float* __restrict__ x_out) {
    extern __shared__ float xs[];
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * GEMV_MAX_TOKENS;
    const int nt = min(GEMV_MAX_TOKENS, tokens - t0);
    const float* xin = gemv_input(x, norm_w, eps, x_out, cols, t0, nt, xs);
    if (row >= rows) return;
    float acc[GEMV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) acc[t] = 0.0f;
    gemv_partial(w + (size_t)row * cols, xin, cols, 0, nt, lane, 32, acc);
    const float b = bias ? bf2f(bias[row]) : 0.0f;
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) {
            float* yp = y + (size_t)(t0 + t) * rows + row;
            *yp = accumulate ? *yp + s + b : s + b;
        }
    }
}

// grid = (rows, ceil(tokens / GEMV_MAX_TOKENS)), block = 256. With topk_idx non-null (the
// router) the last block to finish a token group — counted in counter[blockIdx.y], which it
// resets to 0 for the next launch or graph replay — picks each token's top-k experts of the
// finished logits: topk_idx/topk_w [tokens, k]. Dynamic shared memory: the staged input (with
// norm_w) and at least rows floats (with top-k).
extern "C" __global__ void __launch_bounds__(256, GEMV_MINB)
gemv_bf16_wide(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
               const float* __restrict__ x, float* __restrict__ y,
               int rows, int cols, int tokens, int accumulate,
               const bf16_t* __restrict__ norm_w, float eps, float* __restrict__ x_out,
               int* __restrict__ topk_idx, float* __restrict__ topk_w, int k,
               unsigned* __restrict__ counter) {
    extern __shared__ float xs[];
    __shared__ float part[GEMV_MAX_TOKENS][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x;
    const int t0 = blockIdx.y * GEMV_MAX_TOKENS;
    const int nt = min(GEMV_MAX_TOKENS, tokens - t0);
    float acc[GEMV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) acc[t] = 0.0f;
    const float* xin = gemv_input(x, norm_w, eps, x_out, cols, t0, nt, xs);
    gemv_partial(w + (size_t)row * cols, xin, cols, 0, nt, threadIdx.x, blockDim.x, acc);
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0) part[t][warp] = s;
    }
    __syncthreads();
    if (warp != 0) return;
    const float b = bias ? bf2f(bias[row]) : 0.0f;
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) {
        const float s = warp_sum(lane < 8 ? part[t][lane] : 0.0f);
        if (lane == 0 && t < nt) {
            float* yp = y + (size_t)(t0 + t) * rows + row;
            *yp = accumulate ? *yp + s + b : s + b;
        }
    }
    if (!topk_idx) return;
    // Publish this block's logits, then count it; the last block of the group routes.
    unsigned last = 0;
    if (lane == 0) {
        __threadfence();
        last = atomicAdd(&counter[blockIdx.y], 1u) == gridDim.x - 1;
        if (last) counter[blockIdx.y] = 0u;
    }
    if (!__shfl_sync(0xffffffffu, last, 0)) return;
    __threadfence();
    for (int t = 0; t < nt; ++t)
        topk_softmax_warp(y + (size_t)(t0 + t) * rows, rows, k, topk_idx + (size_t)(t0 + t) * k,
                          topk_w + (size_t)(t0 + t) * k, xs);
}
