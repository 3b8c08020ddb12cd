// Dense GEMM for prefill on tensor cores: y[m, n] (+)= sum_k x[m, k] w[n, k] + b[n], fp32
// activations x [M, K] (rounded to bf16 on their way into shared memory), bf16 weights w
// [N, K] (the same row-major layout the decode GEMV reads), fp32 accumulation and output.
// accumulate != 0 adds into y (o_proj's residual add). K must be a multiple of TC_BK.
// grid = (ceil(N / TC_BN), ceil(M / TC_BM)), block = 256. Two shared stages: the next stage's
// global loads are issued into registers before the current stage's MMAs.
extern "C" __global__ void __launch_bounds__(256, TC_MINB)
gemm_bf16_tc(const float* __restrict__ x, const bf16_t* __restrict__ w,
             const bf16_t* __restrict__ bias, float* __restrict__ y, int M, int N, int K,
             int accumulate) {
    __shared__ __align__(16) bf16_t As[2][TC_BM * TC_LD];
    __shared__ __align__(16) bf16_t Bs[2][TC_BN * TC_LD];
    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = blockIdx.y * TC_BM, n0 = blockIdx.x * TC_BN;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
    // This thread's load assignments.
    const int arow = tid >> 2, aq = tid & 3;
    const float* asrc = m0 + arow < M ? x + (size_t)(m0 + arow) * K : nullptr;
    const int brow = tid >> 2, bq = tid & 3;
    const bf16_t* bsrc[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int n = n0 + brow + 64 * r;
        bsrc[r] = n < N ? w + (size_t)n * K : nullptr;
    }
    float acc[2][4][4] = {};
    float4 ar[2];
    uint4 br[2];
    auto load = [&](int k0) {
        tc_load_act(asrc ? asrc + k0 : nullptr, aq, ar);
#pragma unroll
        for (int r = 0; r < 2; ++r)
            br[r] = bsrc[r] ? __ldg(reinterpret_cast<const uint4*>(bsrc[r] + k0) + bq)
                            : make_uint4(0u, 0u, 0u, 0u);
    };
    auto store = [&](int s) {
        tc_store_act(As[s], arow, aq, ar);
#pragma unroll
        for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint4*>(Bs[s] + (brow + 64 * r) * TC_LD + 8 * bq) = br[r];
    };
    const int nk = K / TC_BK;
    load(0);
    store(0);
    __syncthreads();
    for (int ks = 0; ks < nk; ++ks) {
        const int s = ks & 1;
        if (ks + 1 < nk) load((ks + 1) * TC_BK);
        tc_stage(As[s], Bs[s], wm, wn, acc);
        if (ks + 1 < nk) store(s ^ 1);
        __syncthreads();
    }
    const int lane = tid & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm + mi * 16 + g + 8 * h;
                const int n = n0 + wn + ni * 8 + 2 * t;
                if (m >= M) continue;
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    if (n + c >= N) continue;
                    float v = acc[mi][ni][2 * h + c];
                    if (bias) v += bf2f(bias[n + c]);
                    float* o = y + (size_t)m * N + n + c;
                    *o = accumulate ? *o + v : v;
                }
            }
}
