// Dense matrix-vector product for decode: y[t, r] (+)= W[r, :] . x[t, :] + b[r], bf16 weights,
// fp32 activations and accumulation. One warp per output row reads the row once with 16-byte
// loads and applies it to up to GEMV_MAX_TOKENS tokens, so small batches cost one weight pass.
// With accumulate != 0 the result is added to y (the residual add of o_proj fused in).
#define GEMV_MAX_TOKENS 4
#define GEMV_ROWS_PER_BLOCK 8

extern "C" __global__ void __launch_bounds__(256)
gemv_bf16(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
          const float* __restrict__ x, float* __restrict__ y,
          int rows, int cols, int tokens, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * GEMV_MAX_TOKENS;
    if (row >= rows) return;
    const int nt = min(GEMV_MAX_TOKENS, tokens - t0);
    float acc[GEMV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) acc[t] = 0.0f;
    const bf16_t* wr = w + (size_t)row * cols;
    if ((cols & 7) == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(wr);
        const int n8 = cols >> 3;
        for (int c = lane; c < n8; c += 32) {
            float wf[8];
            bf16x8_to_f32(__ldg(w4 + c), wf);
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
    } else {
        for (int c = lane; c < cols; c += 32) {
            const float wf = bf2f(wr[c]);
#pragma unroll
            for (int t = 0; t < GEMV_MAX_TOKENS; ++t)
                if (t < nt) acc[t] += wf * x[(size_t)(t0 + t) * cols + c];
        }
    }
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
