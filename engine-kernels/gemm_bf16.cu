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
    pdl_enter();
    __shared__ __align__(16) bf16_t As[2][TC_BM * TC_LD];
    __shared__ __align__(16) bf16_t Bs[2][TC_BN * TC_LD];
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * TC_BM, n0 = blockIdx.x * TC_BN;
    // This thread's load assignments: a quarter row of A, a quarter row of B twice.
    const int arow = tid >> 2, aq = tid & 3;
    const float* asrc = m0 + arow < M ? x + (size_t)(m0 + arow) * K : nullptr;
    const bf16_t* bsrc[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int n = n0 + arow + 64 * r;
        bsrc[r] = n < N ? w + (size_t)n * K : nullptr;
    }
    float acc[2][4][4] = {};
    float4 ar[2][2];  // [register set] (tc_mainloop)
    uint4 br[2][2];
    auto load = [&](int ks, int set) {
        const int k0 = ks * TC_BK;
        tc_load_act(asrc ? asrc + k0 : nullptr, aq, ar[set]);
#pragma unroll
        for (int r = 0; r < 2; ++r)
            br[set][r] = bsrc[r] ? __ldg(reinterpret_cast<const uint4*>(bsrc[r] + k0) + aq)
                                 : make_uint4(0u, 0u, 0u, 0u);
    };
    auto store = [&](int s, int set) {
        tc_store_act(As[s], arow, aq, ar[set]);
#pragma unroll
        for (int r = 0; r < 2; ++r)
            *reinterpret_cast<uint4*>(Bs[s] + (arow + 64 * r) * TC_LD + 8 * aq) = br[set][r];
    };
    tc_mainloop(K / TC_BK, load, store, As, Bs, acc);
    tc_epilogue(acc, [&](int r, int c, float v0, float v1) {
        if (m0 + r < M) tc_store_pair(y, bias, N, m0 + r, n0 + c, v0, v1, accumulate);
    });
}
