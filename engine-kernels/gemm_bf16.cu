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

// ---- The cp.async GEMM (`gemm_bf16_cp`, the prefill's dense projections by default): the same
// product from bf16 activations xb [M, K] (written once by rows_bf16), both operands copied
// global -> shared by cp.async, GCP_NS stages in flight (no registers hold a stage, nothing is
// converted in the loop), 128 x 128 block tiles (each warp 64 x 32: four A and two B ldmatrix
// per 16 MMAs). Dynamic shared memory: GCP_NS * 2 * 128 * TC_LD bf16 (80 KB at 4 stages).
// K must be a multiple of TC_BK. grid = (ceil(N / 128), ceil(M / 128), splits), block = 256.
// Split K (a pass of few rows, whose grid alone would leave most SMs idle): block z takes the
// `per` stages from z * per and writes its raw sums to part[z, M, N]; gemm_split_reduce then
// adds the splits in order, the bias and the residual. One split (grid z = 1) stores directly.
#define GCP_NS 4  // the launch (ops::dense_gemm, GCP_SMEM) sizes the shared memory for this many
#define GCP_BM 128
extern "C" __global__ void __launch_bounds__(256, 2)
gemm_bf16_cp(const bf16_t* __restrict__ xb, const bf16_t* __restrict__ w,
             const bf16_t* __restrict__ bias, float* __restrict__ y, int M, int N, int K,
             int accumulate, float* __restrict__ part, int per) {
    pdl_enter();
    extern __shared__ __align__(16) unsigned char gcp_smem[];
    bf16_t* As = reinterpret_cast<bf16_t*>(gcp_smem);        // [GCP_NS][GCP_BM * TC_LD]
    bf16_t* Bs = As + GCP_NS * GCP_BM * TC_LD;                // [GCP_NS][TC_BN * TC_LD]
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * GCP_BM, n0 = blockIdx.x * TC_BN;
    // Thread tid copies 16 bytes (chunk c = tid & 3 of a 64-byte stage row) of rows
    // (tid >> 2) + 64 j, j = 0, 1, of A and of B.
    const int row = tid >> 2, c = tid & 3;
    const bf16_t* asrc[2];
    const bf16_t* bsrc[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int m = m0 + row + 64 * j, n = n0 + row + 64 * j;
        asrc[j] = m < M ? xb + (size_t)m * K + 8 * c : nullptr;
        bsrc[j] = n < N ? w + (size_t)n * K + 8 * c : nullptr;
    }
    // This block's stages: s0 .. s0 + stages of the K / TC_BK.
    const int s0 = blockIdx.z * per, stages = min(K / TC_BK - s0, per);
    auto issue = [&](int s) {
        bf16_t* a = As + (s % GCP_NS) * GCP_BM * TC_LD;
        bf16_t* b = Bs + (s % GCP_NS) * TC_BN * TC_LD;
        const int k0 = (s0 + s) * TC_BK;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int r = (row + 64 * j) * TC_LD + 8 * c;
            cp_async16(a + r, asrc[j] ? asrc[j] + k0 : xb, asrc[j] != nullptr);
            cp_async16(b + r, bsrc[j] ? bsrc[j] + k0 : w, bsrc[j] != nullptr);
        }
    };
#pragma unroll
    for (int s = 0; s < GCP_NS - 1; ++s) {
        if (s < stages) issue(s);
        cp_async_commit();
    }
    const int warp = tid >> 5;
    const int wm = (warp >> 2) * 64, wn = (warp & 3) * 32;
    float acc[4][4][4] = {};
    for (int s = 0; s < stages; ++s) {
        cp_async_wait<GCP_NS - 2>();
        __syncthreads();  // stage s visible to all; stage s - 1's buffer free for reuse
        if (s + GCP_NS - 1 < stages) issue(s + GCP_NS - 1);
        cp_async_commit();
        tc_stage<4>(As + (s % GCP_NS) * GCP_BM * TC_LD, Bs + (s % GCP_NS) * TC_BN * TC_LD, wm, wn,
                    acc);
    }
    if (gridDim.z == 1) {
        tc_epilogue(acc, [&](int r, int col, float v0, float v1) {
            if (m0 + r < M) tc_store_pair(y, bias, N, m0 + r, n0 + col, v0, v1, accumulate);
        });
        return;
    }
    float* pz = part + (size_t)blockIdx.z * M * N;
    tc_epilogue(acc, [&](int r, int col, float v0, float v1) {
        if (m0 + r < M) tc_store_pair(pz, nullptr, N, m0 + r, n0 + col, v0, v1, 0);
    });
}

// y[m, n] (+)= sum over the splits z in order of part[z, m, n], + b[n]: the second half of a
// split-K gemm_bf16_cp. grid = ceil(M * N / 256), block = 256.
extern "C" __global__ void gemm_split_reduce(const float* __restrict__ part,
                                             const bf16_t* __restrict__ bias,
                                             float* __restrict__ y, int M, int N, int splits,
                                             int accumulate) {
    pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, mn = (size_t)M * N;
    if (i >= mn) return;
    float v = 0.0f;
    for (int z = 0; z < splits; ++z) v += part[z * mn + i];
    if (bias) v += bf2f(bias[i % N]);
    y[i] = accumulate ? y[i] + v : v;
}

// out[i] = bf16(x[i]) for n elements (n a multiple of 4; x and out 16- and 8-byte aligned):
// the activations of gemm_bf16_cp, rounded to nearest even as gemm_bf16_tc rounds them.
extern "C" __global__ void rows_bf16(const float* __restrict__ x, uint2* __restrict__ out,
                                     long long n4) {
    pdl_enter();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n4;
         i += (long long)gridDim.x * blockDim.x) {
        const float4 v = reinterpret_cast<const float4*>(x)[i];
        out[i] = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
    }
}
