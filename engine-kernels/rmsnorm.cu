// RMSNorm in fp32, one block per token row: y = x * rsqrt(mean(x^2) + eps) * w.
// With `delta` non-null the residual add is fused: x += delta is written back first, so the
// residual stream makes one pass through memory instead of two.
extern "C" __global__ void rmsnorm_residual(float* __restrict__ x, const float* __restrict__ delta,
                                            const bf16_t* __restrict__ w, float* __restrict__ y,
                                            int n, float eps) {
    pdl_enter();
    __shared__ float scratch[32];
    float* xr = x + (size_t)blockIdx.x * n;
    float* yr = y + (size_t)blockIdx.x * n;
    const float* dr = delta ? delta + (size_t)blockIdx.x * n : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float v = xr[i];
        if (dr) { v += dr[i]; xr[i] = v; }
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * bf2f(w[i]);
}
