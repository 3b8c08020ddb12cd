// MoE for prefill, grouped by expert on tensor cores. The (token, slot) entries routed to each
// expert are gathered into contiguous segments (moe_group), each segment is cut into tiles of
// TC_BM (or 128) entries, and every tile multiplies its entries' activations with its expert's MXFP4
// weights, dequantized to bf16 in shared memory one TC_BK stage at a time (no bf16 copy of
// the experts ever exists). Entry i = t * k + s is token t's s-th routed expert idx[i].
//
// moe_group: one block. Counts entries per expert, lays the segments out in expert order,
// writes perm (segment position -> entry), and the tile list (expert, first, end) with its
// length in *ntiles. The order inside a segment depends on atomics, but every entry's result is
// computed by the same arithmetic wherever it lands, so the output does not depend on it.
// Dynamic shared memory: 2 * experts ints.
extern "C" __global__ void moe_group(const int* __restrict__ idx, int total, int experts, int tile,
                                     int* __restrict__ perm, int* __restrict__ tiles,
                                     int* __restrict__ ntiles) {
    pdl_enter();
    extern __shared__ int sh[];
    int* cnt = sh;
    int* cur = sh + experts;
    for (int e = threadIdx.x; e < experts; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += blockDim.x) atomicAdd(&cnt[idx[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int e = 0; e < experts; ++e) {
            cur[e] = off;
            for (int r = 0; r < cnt[e]; r += tile) {
                tiles[3 * nt] = e;
                tiles[3 * nt + 1] = off + r;
                tiles[3 * nt + 2] = off + cnt[e];
                ++nt;
            }
            off += cnt[e];
        }
        *ntiles = nt;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < total; i += blockDim.x) perm[atomicAdd(&cur[idx[i]], 1)] = i;
}

// The part both grouped GEMMs share: this block's tile (expert e, segment rows first..end, at
// most BM of them) times W_e's output rows n0 .. n0 + TC_BN (of `wrows`, each of K / 32 MXFP4
// blocks) into acc. A row r of the tile is `a + (perm[r] / a_div) * K`; each thread stages a
// quarter row of A for BM / 64 rows. False when the block has no tile.
template <int BM>
__device__ __forceinline__ bool moe_tile_mma(const u8* __restrict__ blocks,
                                             const u8* __restrict__ scales,
                                             const float* __restrict__ a, int a_div,
                                             const int* __restrict__ perm,
                                             const int* __restrict__ tiles,
                                             const int* __restrict__ ntiles, int wrows, int K,
                                             int& e, int& first, int& end,
                                             float (&acc)[BM / 32][4][4],
                                             bf16_t (*As)[BM * TC_LD],
                                             bf16_t (*Bs)[TC_BN * TC_LD]) {
    constexpr int RA = BM / 64;
    if ((int)blockIdx.y >= *ntiles) return false;
    e = tiles[3 * blockIdx.y];
    first = tiles[3 * blockIdx.y + 1];
    end = tiles[3 * blockIdx.y + 2];
    const int tid = threadIdx.x, nb = K >> 5;
    const int arow = tid >> 2, aq = tid & 3;
    const int brow = tid >> 1, bh = tid & 1;
    const float* asrc[RA];
#pragma unroll
    for (int j = 0; j < RA; ++j) {
        const int ai = first + arow + 64 * j;
        asrc[j] = ai < end ? a + (size_t)(perm[ai] / a_div) * K : nullptr;
    }
    const int n = blockIdx.x * TC_BN + brow;
    const size_t wrow = (size_t)e * wrows + n;
    const uint2* wq = n < wrows ? reinterpret_cast<const uint2*>(blocks) + wrow * nb * 2 : nullptr;
    const u8* wsc = scales + wrow * nb;
    float4 ar[2][RA][2];  // [register set] (tc_mainloop)
    uint2 bq[2];
    unsigned bs[2];
    auto load = [&](int ks, int set) {
#pragma unroll
        for (int j = 0; j < RA; ++j)
            tc_load_act(asrc[j] ? asrc[j] + ks * TC_BK : nullptr, aq, ar[set][j]);
        fp4_stage_load(wq, wsc, ks, bh, bq[set], bs[set]);
    };
    auto store = [&](int s, int set) {
#pragma unroll
        for (int j = 0; j < RA; ++j) tc_store_act(As[s], arow + 64 * j, aq, ar[set][j]);
        fp4_stage_store(Bs[s], brow, bh, bq[set], bs[set]);
    };
    tc_mainloop(nb, load, store, As, Bs, acc);
    return true;
}

// act[i, j] = swiglu(gate_j, lin_j) of entry i's expert over x[token(i)], for the units j of
// this block's TC_BN / 2 column pairs (gate_up rows interleave gate 2j and linear 2j + 1, so a
// thread's accumulator pair is one unit). grid = (ceil(2I / TC_BN), max tiles of BM rows).
#define MOE_GATE_UP_PARAMS                                                                      \
    const u8 *__restrict__ blocks, const u8 *__restrict__ scales,                               \
        const bf16_t *__restrict__ bias, const float *__restrict__ x,                           \
        const int *__restrict__ perm, const int *__restrict__ tiles,                            \
        const int *__restrict__ ntiles, float *__restrict__ act, int inter, int hidden, int k, \
        float limit, float alpha
#define MOE_GATE_UP_ARGS blocks, scales, bias, x, perm, tiles, ntiles, act, inter, hidden, k, limit, alpha

template <int BM>
__device__ __forceinline__ void moe_gate_up_tile(MOE_GATE_UP_PARAMS) {
    __shared__ __align__(16) bf16_t As[2][BM * TC_LD];
    __shared__ __align__(16) bf16_t Bs[2][TC_BN * TC_LD];
    const int rows = 2 * inter;
    int e, first, end;
    float acc[BM / 32][4][4] = {};
    if (!moe_tile_mma<BM>(blocks, scales, x, k, perm, tiles, ntiles, rows, hidden, e, first, end,
                          acc, As, Bs))
        return;
    const int n0 = blockIdx.x * TC_BN;
    tc_epilogue(acc, [&](int lr, int lc, float gv, float lv) {
        const int r = first + lr, c = n0 + lc;
        if (r >= end || c >= rows) return;
        const size_t bi = (size_t)e * rows + c;
        act[(size_t)perm[r] * inter + (c >> 1)] =
            swiglu_clamped(gv + bf2f(bias[bi]), lv + bf2f(bias[bi + 1]), limit, alpha);
    });
}

// part[i, n] = wts[i] * (W2_e[n, :] . act[i, :] + b2_e[n]) for the entries i of a tile.
// grid = (ceil(H / TC_BN), max tiles of BM rows).
#define MOE_DOWN_PARAMS                                                                    \
    const u8 *__restrict__ blocks, const u8 *__restrict__ scales,                          \
        const bf16_t *__restrict__ bias, const float *__restrict__ act,                    \
        const float *__restrict__ wts, const int *__restrict__ perm,                       \
        const int *__restrict__ tiles, const int *__restrict__ ntiles,                     \
        float *__restrict__ part, int hidden, int inter
#define MOE_DOWN_ARGS blocks, scales, bias, act, wts, perm, tiles, ntiles, part, hidden, inter

template <int BM>
__device__ __forceinline__ void moe_down_tile(MOE_DOWN_PARAMS) {
    __shared__ __align__(16) bf16_t As[2][BM * TC_LD];
    __shared__ __align__(16) bf16_t Bs[2][TC_BN * TC_LD];
    int e, first, end;
    float acc[BM / 32][4][4] = {};
    if (!moe_tile_mma<BM>(blocks, scales, act, 1, perm, tiles, ntiles, hidden, inter, e, first,
                          end, acc, As, Bs))
        return;
    const int n0 = blockIdx.x * TC_BN;
    tc_epilogue(acc, [&](int lr, int lc, float v0, float v1) {
        const int r = first + lr;
        if (r >= end) return;
        const int i = perm[r];
        const float v[2] = {v0, v1};
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const int c = n0 + lc + j;
            if (c < hidden) part[(size_t)i * hidden + c] = wts[i] * (v[j] + bf2f(bias[(size_t)e * hidden + c]));
        }
    });
}

// The entry points, one per tile height: TC_BM (64) rows, and `_m128` with 128 rows (the
// `--tile 128x128` gate; moe_group must then cut the segments into tiles of 128). The 128-row
// tile holds twice the accumulators (64 per thread): compiled for TC128_MINB blocks per SM.
extern "C" __global__ void __launch_bounds__(256, TC_MINB) moe_gate_up_grouped(MOE_GATE_UP_PARAMS) {
    pdl_enter();
    moe_gate_up_tile<TC_BM>(MOE_GATE_UP_ARGS);
}
extern "C" __global__ void __launch_bounds__(256, TC128_MINB)
moe_gate_up_grouped_m128(MOE_GATE_UP_PARAMS) {
    pdl_enter();
    moe_gate_up_tile<128>(MOE_GATE_UP_ARGS);
}
extern "C" __global__ void __launch_bounds__(256, TC_MINB) moe_down_grouped(MOE_DOWN_PARAMS) {
    pdl_enter();
    moe_down_tile<TC_BM>(MOE_DOWN_ARGS);
}
extern "C" __global__ void __launch_bounds__(256, TC128_MINB)
moe_down_grouped_m128(MOE_DOWN_PARAMS) {
    pdl_enter();
    moe_down_tile<128>(MOE_DOWN_ARGS);
}

// y[t, c] (+)= sum_s part[t * k + s, c], slots summed in order. grid = (ceil(H / 256), T).
extern "C" __global__ void moe_combine(const float* __restrict__ part, float* __restrict__ y,
                                       int hidden, int k, int accumulate) {
    pdl_enter();
    const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= hidden) return;
    float s = 0.0f;
    for (int j = 0; j < k; ++j) s += part[((size_t)t * k + j) * hidden + c];
    float* o = y + (size_t)t * hidden + c;
    *o = accumulate ? *o + s : s;
}
