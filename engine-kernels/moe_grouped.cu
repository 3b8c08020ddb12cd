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
template <int BM, bool LF>
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
        fp4_stage_store<LF ? FP4_F16L : FP4_STD>(Bs[s], brow, bh, bq[set], bs[set]);
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
struct TileSmem {
    bf16_t a[2][BM * TC_LD];
    bf16_t b[2][TC_BN * TC_LD];
};
template <int BM, bool LF>
__device__ __forceinline__ void moe_gate_up_tile(MOE_GATE_UP_PARAMS, TileSmem<BM>& sm) {
    auto& As = sm.a;
    auto& Bs = sm.b;
    const int rows = 2 * inter;
    int e, first, end;
    float acc[BM / 32][4][4] = {};
    if (!moe_tile_mma<BM, LF>(blocks, scales, x, k, perm, tiles, ntiles, rows, hidden, e, first,
                              end, acc, As, Bs))
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

// The down tiles' epilogue (both kernels): part[i, n] = wts[i] * (acc + b2_e[n]) for the tile's
// rows first..end of expert e, columns of this block past `hidden` skipped.
template <int WC, int MI, int NI>
__device__ __forceinline__ void moe_down_epilogue(const float (&acc)[MI][NI][4],
                                                  const bf16_t* __restrict__ bias,
                                                  const float* __restrict__ wts,
                                                  const int* __restrict__ perm,
                                                  float* __restrict__ part, int hidden, int e,
                                                  int first, int end) {
    const int n0 = blockIdx.x * TC_BN;
    tc_epilogue_w<WC>(acc, [&](int lr, int lc, float v0, float v1) {
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

// part[i, n] = wts[i] * (W2_e[n, :] . act[i, :] + b2_e[n]) for the entries i of a tile.
// grid = (ceil(H / TC_BN), max tiles of BM rows).
#define MOE_DOWN_PARAMS                                                                    \
    const u8 *__restrict__ blocks, const u8 *__restrict__ scales,                          \
        const bf16_t *__restrict__ bias, const float *__restrict__ act,                    \
        const float *__restrict__ wts, const int *__restrict__ perm,                       \
        const int *__restrict__ tiles, const int *__restrict__ ntiles,                     \
        float *__restrict__ part, int hidden, int inter
#define MOE_DOWN_ARGS blocks, scales, bias, act, wts, perm, tiles, ntiles, part, hidden, inter

template <int BM, bool LF>
__device__ __forceinline__ void moe_down_tile(MOE_DOWN_PARAMS, TileSmem<BM>& sm) {
    auto& As = sm.a;
    auto& Bs = sm.b;
    int e, first, end;
    float acc[BM / 32][4][4] = {};
    if (!moe_tile_mma<BM, LF>(blocks, scales, act, 1, perm, tiles, ntiles, hidden, inter, e,
                              first, end, acc, As, Bs))
        return;
    moe_down_epilogue<4>(acc, bias, wts, perm, part, hidden, e, first, end);
}

// ---- The register-B tiles (`moe_gate_up_rb`, `moe_down_rb`; the host's default, see
// ops::moe_grouped): the MXFP4 weights go to shared memory as they are (raw bytes, by
// cp.async) and from there straight into mma's B fragments, dequantized in registers; the
// activations come as bf16 rows already in the order the fragments need, also by cp.async.
// Nothing is dequantized into shared memory or read back with ldmatrix but A, and no
// registers hold a stage in flight.
//
// A stage is RB_BK = 64 of K: two MXFP4 blocks. mma's B fragment gives lane (g, t) of a warp
// the k positions {2t, 2t+1, 2t+8, 2t+9} of each 16-wide chunk, for column g of an n8 tile.
// A dot product does not care in which order K is summed, so the positions of each 64-wide
// stage are permuted, the same way for A and B, so that lane t owns 16 consecutive weights:
// physical k 16t + 4c + 2hi + b (c: chunk 0..3, hi: b0 / b1, b: element of the pair) sits at
// logical k 16c + 8hi + 2t + b. Lane t reads one 8-byte word of a weight row a stage (bytes
// 8t .. 8t + 7 of the row's 32: block 2s + t / 2) and that block's scale; the activation rows
// are stored in logical order by whoever writes them (moe_act_bf16, moe_gate_up_rb's
// epilogue), each row padded with zeros to a multiple of 64.
#define RB_BK 64
#define RB_LD (RB_BK + 8)

// Logical position of physical column j in a row of 64-wide permuted stages.
__device__ __forceinline__ int rb_pos(int j) {
    const int p = j & 63;
    return (j & ~63) + 16 * ((p >> 2) & 3) + 8 * ((p >> 1) & 1) + 2 * (p >> 4) + (p & 1);
}

// x [rows, K] fp32 -> out [rows, Kp] bf16 in the permuted order, zeros past K (Kp: K rounded
// up to 64). One 32-bit word (a logical pair) per thread; grid = (ceil(Kp / 512), rows).
extern "C" __global__ void moe_act_bf16(const float* __restrict__ x, unsigned* __restrict__ out,
                                        int K, int Kp) {
    pdl_enter();
    const int w = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y;
    if (2 * w >= Kp) return;
    const int wi = w & 31;  // word of the 64-wide stage: 8c + 4hi + q
    const int j = 64 * (w >> 5) + 16 * (wi & 3) + 4 * (wi >> 3) + 2 * ((wi >> 2) & 1);
    const float* src = x + (size_t)row * K;
    const float lo = j < K ? src[j] : 0.0f, hi = j + 1 < K ? src[j + 1] : 0.0f;
    out[(size_t)row * (Kp >> 1) + w] = pack_bf16x2(lo, hi);
}

// One stage of a warp's (16 MI) x (8 NI) tile: A from shared memory (logical order), B from
// the raw stage Bq (TC_BN rows of 32 bytes), dequantized in registers with scales e[ni]: the
// lane's word h holds chunks 2h and 2h + 1 (pairs p[0], p[1] and p[2], p[3]). Only the first
// `live` m16 fragments hold rows of the tile (a segment's last tile is mostly short): the
// others' loads and MMAs are skipped, and a warp with none skips the stage. Each B fragment
// dequantized serves MI MMAs, so the wider the warp's rows, the fewer decodes per MMA.
template <int MI, int NI, bool LF>
__device__ __forceinline__ void rb_stage(const bf16_t* As, const u8* Bq, int wm, int wn,
                                         int live, const unsigned (&e)[NI],
                                         float (&acc)[MI][NI][4]) {
    if (live <= 0) return;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    uint2 q[NI];
    unsigned s2[NI];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        q[ni] = *reinterpret_cast<const uint2*>(Bq + (wn + 8 * ni + g) * 32 + 8 * t);
        s2[ni] = e8m0_bf16x2(e[ni]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        unsigned b[NI][4];
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) {
            unsigned p[4];
            fp4_bf16x2<LF ? FP4_F16L : FP4_STD>(h ? q[ni].y : q[ni].x, p);
#pragma unroll
            for (int j = 0; j < 4; ++j) b[ni][j] = bf16x2_mul(p[j], s2[ni]);
        }
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const int kk = (2 * h + cc) * 16;
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                if (mi < live) {
                    unsigned a[4];
                    ldmatrix_x4(a, As + (wm + mi * 16 + (lane & 15)) * RB_LD + kk + (lane >> 4) * 8);
#pragma unroll
                    for (int ni = 0; ni < NI; ++ni)
                        mma_bf16_16816(acc[mi][ni], a, b[ni][2 * cc], b[ni][2 * cc + 1]);
                }
        }
    }
}

// Shared memory of a register-B tile: NS stages of A (BM rows) and raw B (TC_BN rows x 32 B).
template <int BM, int NS>
struct RbSmem {
    bf16_t a[NS][BM * RB_LD];
    u8 b[NS][TC_BN * 32];
};

// moe_tile_mma's contract with the register-B stages: this block's tile of expert e (segment
// rows first..end) times W_e's rows n0 .. n0 + TC_BN (of `wrows`, K / 32 blocks each) into
// acc. A row r of the tile is row perm[r] / a_div of `a` (bf16, permuted, Kp = K rounded up
// to 64 per row). NS stages in flight through cp.async (NS - 1 ahead of the MMAs). The 8 warps
// stand WC across the columns and 8 / WC down the rows (RbWarps).
template <int BM, int WC>
struct RbWarps {
    static constexpr int WR = 8 / WC, MI = BM / (16 * WR), NI = TC_BN / (8 * WC);
};
template <int BM, int NS, int WC, bool LF>
__device__ __forceinline__ bool moe_tile_mma_rb(const u8* __restrict__ blocks,
                                                const u8* __restrict__ scales,
                                                const bf16_t* __restrict__ a, int a_div,
                                                const int* __restrict__ perm,
                                                const int* __restrict__ tiles,
                                                const int* __restrict__ ntiles, int wrows, int K,
                                                int& e, int& first, int& end,
                                                float (&acc)[RbWarps<BM, WC>::MI][RbWarps<BM, WC>::NI][4],
                                                RbSmem<BM, NS>& sm) {
    constexpr int MI = RbWarps<BM, WC>::MI, NI = RbWarps<BM, WC>::NI;
    constexpr int AP = BM * 8 / 256;  // 16-byte A pieces per thread a stage
    if ((int)blockIdx.y >= *ntiles) return false;
    e = tiles[3 * blockIdx.y];
    first = tiles[3 * blockIdx.y + 1];
    end = tiles[3 * blockIdx.y + 2];
    const int tid = threadIdx.x, nb = K >> 5, stages = (nb + 1) >> 1, kp = 64 * stages;
    const int n0 = blockIdx.x * TC_BN;
    // A: piece tid + 256 j is row (tid >> 3) + 32 j, 16 bytes c8 = tid & 7 of the stage.
    const bf16_t* asrc[AP];
#pragma unroll
    for (int j = 0; j < AP; ++j) {
        const int ai = first + (tid >> 3) + 32 * j;
        asrc[j] = ai < end ? a + (size_t)(perm[ai] / a_div) * kp + 8 * (tid & 7) : nullptr;
    }
    // B: thread tid copies 16 bytes (half tid & 1: block 2s + half) of row tid >> 1.
    const int brow = n0 + (tid >> 1), bh = tid & 1;
    const u8* bsrc = brow < wrows ? blocks + ((size_t)e * wrows + brow) * nb * 16 + 16 * bh : nullptr;
    auto issue = [&](int s) {
        const int buf = s % NS;
#pragma unroll
        for (int j = 0; j < AP; ++j)
            cp_async16(sm.a[buf] + ((tid >> 3) + 32 * j) * RB_LD + 8 * (tid & 7),
                       asrc[j] ? asrc[j] + s * RB_BK : a, asrc[j] != nullptr);
        const bool bv = bsrc && 2 * s + bh < nb;
        cp_async16(sm.b[buf] + (tid >> 1) * 32 + 16 * bh, bv ? bsrc + s * 32 : blocks, bv);
    };
    // Scales: lane (g, t)'s rows n0 + wn + 8 ni + g, block 2s + t / 2.
    const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp / WC) * 16 * MI, wn = (warp % WC) * 8 * NI;
    const int live = (end - first - wm + 15) >> 4;  // m16 fragments with rows (may be <= 0)
    const u8* ssrc[NI];
#pragma unroll
    for (int ni = 0; ni < NI; ++ni) {
        const int r = n0 + wn + 8 * ni + g;
        ssrc[ni] = r < wrows ? scales + ((size_t)e * wrows + r) * nb : nullptr;
    }
    auto load_scales = [&](int s, unsigned (&sc)[NI]) {
        const int blk = 2 * s + (t >> 1);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) sc[ni] = ssrc[ni] && blk < nb ? ssrc[ni][blk] : 127u;
    };
#pragma unroll
    for (int s = 0; s < NS - 1; ++s) {
        if (s < stages) issue(s);
        cp_async_commit();
    }
    unsigned sc[NI];
    load_scales(0, sc);
    for (int s = 0; s < stages; ++s) {
        cp_async_wait<NS - 2>();
        __syncthreads();
        if (s + NS - 1 < stages) issue(s + NS - 1);
        cp_async_commit();
        unsigned scn[NI];
        if (s + 1 < stages) load_scales(s + 1, scn);
        rb_stage<MI, NI, LF>(sm.a[s % NS], sm.b[s % NS], wm, wn, live, sc, acc);
#pragma unroll
        for (int ni = 0; ni < NI; ++ni) sc[ni] = scn[ni];
    }
    return true;
}

// The register-B gate_up: act rows (bf16, permuted, padded to Ip = I rounded up to 64) from x
// rows of xb (bf16, permuted, padded: moe_act_bf16). Units of the padding get zeros so that
// the down tile's stages never meet what a scratch held before. Same grid as
// moe_gate_up_grouped; Ip / 2 units are covered exactly by ceil(2I / TC_BN) column blocks.
#define MOE_GATE_UP_RB_PARAMS                                                                   \
    const u8 *__restrict__ blocks, const u8 *__restrict__ scales,                               \
        const bf16_t *__restrict__ bias, const bf16_t *__restrict__ xb,                         \
        const int *__restrict__ perm, const int *__restrict__ tiles,                            \
        const int *__restrict__ ntiles, bf16_t *__restrict__ act, int inter, int hidden, int k, \
        float limit, float alpha
#define MOE_GATE_UP_RB_ARGS blocks, scales, bias, xb, perm, tiles, ntiles, act, inter, hidden, k, limit, alpha

template <int BM, int NS, int WC, bool LF>
__device__ __forceinline__ void moe_gate_up_rb_tile(MOE_GATE_UP_RB_PARAMS, RbSmem<BM, NS>& sm) {
    const int rows = 2 * inter, ip = (inter + 63) & ~63;
    int e, first, end;
    float acc[RbWarps<BM, WC>::MI][RbWarps<BM, WC>::NI][4] = {};
    if (!moe_tile_mma_rb<BM, NS, WC, LF>(blocks, scales, xb, k, perm, tiles, ntiles, rows, hidden, e,
                                     first, end, acc, sm))
        return;
    const int n0 = blockIdx.x * TC_BN;
    tc_epilogue_w<WC>(acc, [&](int lr, int lc, float gv, float lv) {
        const int r = first + lr, c = n0 + lc;
        if (r >= end || (c >> 1) >= ip) return;
        float v = 0.0f;
        if (c < rows) {
            const size_t bi = (size_t)e * rows + c;
            v = swiglu_clamped(gv + bf2f(bias[bi]), lv + bf2f(bias[bi + 1]), limit, alpha);
        }
        act[(size_t)perm[r] * ip + rb_pos(c >> 1)] = f2bf(v);
    });
}

// The register-B down: part[i, n] as moe_down_grouped, from act rows of moe_gate_up_rb.
#define MOE_DOWN_RB_PARAMS                                                                 \
    const u8 *__restrict__ blocks, const u8 *__restrict__ scales,                          \
        const bf16_t *__restrict__ bias, const bf16_t *__restrict__ act,                   \
        const float *__restrict__ wts, const int *__restrict__ perm,                       \
        const int *__restrict__ tiles, const int *__restrict__ ntiles,                     \
        float *__restrict__ part, int hidden, int inter
#define MOE_DOWN_RB_ARGS blocks, scales, bias, act, wts, perm, tiles, ntiles, part, hidden, inter

template <int BM, int NS, int WC, bool LF>
__device__ __forceinline__ void moe_down_rb_tile(MOE_DOWN_RB_PARAMS, RbSmem<BM, NS>& sm) {
    int e, first, end;
    float acc[RbWarps<BM, WC>::MI][RbWarps<BM, WC>::NI][4] = {};
    if (!moe_tile_mma_rb<BM, NS, WC, LF>(blocks, scales, act, 1, perm, tiles, ntiles, hidden, inter,
                                     e, first, end, acc, sm))
        return;
    moe_down_epilogue<WC>(acc, bias, wts, perm, part, hidden, e, first, end);
}

// Stages in flight: three for 64-row tiles (40 KB of shared memory), two for 128 rows (45 KB).
#ifndef RB_NS64
#define RB_NS64 3
#endif
// Warps across a register-B tile's 128 columns: 8 (the default: one row of warps, each
// BM x 16: half the B decodes per MMA, twice the A fragment loads, and every warp busy on a
// tile of BM / 2 rows or fewer) or 4 (two rows, each (BM / 2) x 32; docs/perf.md run 148).
#ifndef RB_WC
#define RB_WC 8
#endif
// The 32-row tile (`--tile auto` for passes of few entries an expert: a prompt's short tail,
// a cached prefix's new turn): a quarter of the 64-row tile's A staging, so RB_NS32 stages
// (five: 43 KB) keep four weight stages in flight a block, and three blocks share an SM.
#ifndef RB_NS32
#define RB_NS32 5
#endif
#ifndef RB32_MINB
#define RB32_MINB 3
#endif
// The entry points take the experts' layout last (`lay`: 1 for the fp16 layout, ExpertLayout
// in ops.rs); the shared memory is declared here, once for both instantiations.
#define RB_ENTRY(name, minb, body, BM, NS, PARAMS, ARGS)                               \
    extern "C" __global__ void __launch_bounds__(256, minb) name(PARAMS, int lay) {    \
        pdl_enter();                                                                  \
        __shared__ __align__(16) RbSmem<BM, NS> sm;                                   \
        if (lay)                                                                      \
            body<BM, NS, RB_WC, true>(ARGS, sm);                                      \
        else                                                                          \
            body<BM, NS, RB_WC, false>(ARGS, sm);                                     \
    }
RB_ENTRY(moe_gate_up_rb_m32, RB32_MINB, moe_gate_up_rb_tile, 32, RB_NS32, MOE_GATE_UP_RB_PARAMS, MOE_GATE_UP_RB_ARGS)
RB_ENTRY(moe_down_rb_m32, RB32_MINB, moe_down_rb_tile, 32, RB_NS32, MOE_DOWN_RB_PARAMS, MOE_DOWN_RB_ARGS)
RB_ENTRY(moe_gate_up_rb, TC_MINB, moe_gate_up_rb_tile, TC_BM, RB_NS64, MOE_GATE_UP_RB_PARAMS, MOE_GATE_UP_RB_ARGS)
RB_ENTRY(moe_gate_up_rb_m128, TC128_MINB, moe_gate_up_rb_tile, 128, 2, MOE_GATE_UP_RB_PARAMS, MOE_GATE_UP_RB_ARGS)
RB_ENTRY(moe_down_rb, TC_MINB, moe_down_rb_tile, TC_BM, RB_NS64, MOE_DOWN_RB_PARAMS, MOE_DOWN_RB_ARGS)
RB_ENTRY(moe_down_rb_m128, TC128_MINB, moe_down_rb_tile, 128, 2, MOE_DOWN_RB_PARAMS, MOE_DOWN_RB_ARGS)

// The entry points, one per tile height: TC_BM (64) rows, and `_m128` with 128 rows (the
// `--tile 128x128` gate; moe_group must then cut the segments into tiles of 128). The 128-row
// tile holds twice the accumulators (64 per thread): compiled for TC128_MINB blocks per SM.
#define TILE_ENTRY(name, minb, body, BM, PARAMS, ARGS)                               \
    extern "C" __global__ void __launch_bounds__(256, minb) name(PARAMS, int lay) {    \
        pdl_enter();                                                                  \
        __shared__ __align__(16) TileSmem<BM> sm;                                     \
        if (lay)                                                                      \
            body<BM, true>(ARGS, sm);                                                 \
        else                                                                          \
            body<BM, false>(ARGS, sm);                                                \
    }
TILE_ENTRY(moe_gate_up_grouped, TC_MINB, moe_gate_up_tile, TC_BM, MOE_GATE_UP_PARAMS, MOE_GATE_UP_ARGS)
TILE_ENTRY(moe_gate_up_grouped_m128, TC128_MINB, moe_gate_up_tile, 128, MOE_GATE_UP_PARAMS, MOE_GATE_UP_ARGS)
TILE_ENTRY(moe_down_grouped, TC_MINB, moe_down_tile, TC_BM, MOE_DOWN_PARAMS, MOE_DOWN_ARGS)
TILE_ENTRY(moe_down_grouped_m128, TC128_MINB, moe_down_tile, 128, MOE_DOWN_PARAMS, MOE_DOWN_ARGS)

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
