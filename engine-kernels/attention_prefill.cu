// Attention for prefill rows: one query row per token (its own position and KV slot, so a row
// sees exactly its causal / sliding-window range), all G = Hq / Hkv query heads of one KV
// head in one block — one warp per query head — so each key and value row is read from the
// cache once per (row, KV head) instead of once per query head. Keys are taken a tile at a
// time into shared memory (fp32, K rows padded by one float so lane j reading key j hits its
// own bank); lane j scores key j, the warp keeps a running max / sum (online softmax) and each
// lane accumulates its d / 32 output dims. The sink enters as a key of value zero: the running
// max starts at the sink logit and the sum at 1 (sinks off: -inf and 0).
// grid = (Hkv, T), block = G * 32 threads (G <= 32); keys are staged `tile` at a time (32,
// 64, 96 or 128: lane j scores keys j, j + 32, …). Dynamic shared memory:
// (tile * (d + 1) + tile * d + G * d) floats. d a multiple of 32, at most 128. The cache's
// element kind is kv (KV_BF16, KV_F32 or KV_FP8), widened to fp32 on its way into shared memory.
#define PF_MAX_KPL 4
#define PF_MAX_DPL 4

extern "C" __global__ void attn_prefill(const float* __restrict__ q, const void* __restrict__ k_cache,
                                        const void* __restrict__ v_cache, int kv,
                                        const unsigned* __restrict__ pos,
                                        const unsigned long long* __restrict__ kv_off,
                                        const bf16_t* __restrict__ sinks, float* __restrict__ out,
                                        int hq, int hkv, int d, int window, float scale, int tile) {
    pdl_enter();
    extern __shared__ float sm[];
    const int kvh = blockIdx.x, t = blockIdx.y;
    const int group = hq / hkv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = kvh * group + warp;
    const int dpl = d >> 5;
    const int kpl = tile >> 5;
    float* ks = sm;                      // [tile][d + 1]
    float* vs = ks + tile * (d + 1);     // [tile][d]
    float* qs = vs + tile * d;           // [group][d]
    const int p = (int)pos[t];
    const int lo = window > 0 ? max(0, p + 1 - window) : 0;
    for (int i = threadIdx.x; i < group * d; i += blockDim.x)
        qs[i] = q[((size_t)t * hq + kvh * group) * d + i] * scale;
    float m = sinks ? bf2f(sinks[h]) : -INFINITY;
    float l = sinks ? 1.0f : 0.0f;
    float acc[PF_MAX_DPL];
#pragma unroll
    for (int j = 0; j < PF_MAX_DPL; ++j) acc[j] = 0.0f;
    const size_t base = kv_off[t] + (size_t)kvh * d;
    const size_t stride = (size_t)hkv * d;
    const float* qh = qs + warp * d;
    for (int k0 = lo; k0 <= p; k0 += tile) {
        const int nk = min(tile, p + 1 - k0);
        __syncthreads();
        for (int i = threadIdx.x; i < nk * d; i += blockDim.x) {
            const int kj = i / d, c = i - kj * d;
            const size_t at = base + (size_t)(k0 + kj) * stride + c;
            ks[kj * (d + 1) + c] = kv_load(k_cache, kv, at);
            vs[kj * d + c] = kv_load(v_cache, kv, at);
        }
        __syncthreads();
        float s[PF_MAX_KPL];
        float mt = -INFINITY;
#pragma unroll
        for (int u = 0; u < PF_MAX_KPL; ++u) {
            const int kj = lane + 32 * u;
            s[u] = -INFINITY;
            if (u < kpl && kj < nk) {
                const float* kr = ks + kj * (d + 1);
                float dot = 0.0f;
                for (int c = 0; c < d; ++c) dot += qh[c] * kr[c];
                s[u] = dot;
            }
            mt = fmaxf(mt, s[u]);
        }
        mt = warp_max(mt);
        const float mn = fmaxf(m, mt);
        // mn is finite once any key is seen (every row sees at least its own key).
        const float corr = m == -INFINITY ? 0.0f : expf(m - mn);
        float pj[PF_MAX_KPL], psum = 0.0f;
#pragma unroll
        for (int u = 0; u < PF_MAX_KPL; ++u) {
            pj[u] = s[u] == -INFINITY ? 0.0f : expf(s[u] - mn);
            psum += pj[u];
        }
        l = l * corr + warp_sum(psum);
#pragma unroll
        for (int j = 0; j < PF_MAX_DPL; ++j) acc[j] *= corr;
#pragma unroll
        for (int u = 0; u < PF_MAX_KPL; ++u) {
            if (u >= kpl || 32 * u >= nk) break;  // warp-uniform
            const int n = min(32, nk - 32 * u);
            for (int kk = 0; kk < n; ++kk) {
                const float pk = __shfl_sync(0xffffffffu, pj[u], kk);
                const float* vr = vs + (32 * u + kk) * d + lane * dpl;
#pragma unroll
                for (int j = 0; j < PF_MAX_DPL; ++j)
                    if (j < dpl) acc[j] += pk * vr[j];
            }
        }
        m = mn;
    }
    float* o = out + ((size_t)t * hq + h) * d + lane * dpl;
#pragma unroll
    for (int j = 0; j < PF_MAX_DPL; ++j)
        if (j < dpl) o[j] = acc[j] / l;
}

// ---- attn_prefill_tc: the same attention on tensor cores (flash-attention style), for a bf16
// cache. A block takes one tile of up to 16 consecutive prompt rows of one sequence (the host
// cuts the rows into such tiles: `tiles` holds each tile's first row and row count) and one
// KV head; warp w computes query head kvh * G + w for the tile's rows, so each key and value
// row is staged once for the G heads sharing it. Per tile of PFT_KT keys: S = Q K^T on
// mma.sync m16n8k16 (the queries, times scale · log2 e, as bf16 A fragments held in registers;
// K staged row-major, its rows the B operand's columns), each row masked to its own causal /
// sliding range, an online softmax in log2 units over the accumulators, then O += P V with P
// taken from the S accumulators as bf16 A fragments (their layouts coincide) and V staged
// transposed. The sink enters the denominator once: the running max starts at the sink logit
// and the sum at 1. bf16 operands, fp32 accumulation: as HF transformers runs attention in
// bf16. grid = (Hkv, tiles, splits), block = G * 32 (G <= PFT_MAX_G); d a multiple of 16, at
// most PFT_MAX_D (`attn_prefill_tc_d64`: at most 64). Dynamic shared memory: PFT_KT * (d +
// PFT_PAD) + d * (PFT_KT + PFT_PAD) bf16.
// Split keys (a pass of few rows over a long context, whose grid alone would leave most SMs
// idle): block z takes its share of the tile's key tiles, only split 0 counts the sink, and
// each row and head's unnormalised output, running max and sum go to part (n rows; `n * hq *
// d` floats of outputs a split, then `n * hq * 2` of max and sum a split after all the
// outputs); attn_split_combine merges them. One split (grid z = 1) writes out directly.
#define PFT_KT 64
#define PFT_PAD 8
#define PFT_MAX_D 128
#define PFT_MAX_G 8
#define PFT_LOG2E 1.4426950408889634f

// The body for head dims up to DMAX (its fragment arrays sized for DMAX, so the 64-dim entry
// point needs about half the registers of the 128-dim one and fits two blocks per SM).
template <int DMAX>
__device__ __forceinline__ void attn_prefill_tc_body(
    const float* __restrict__ q, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const unsigned* __restrict__ pos,
    const unsigned long long* __restrict__ kv_off, const bf16_t* __restrict__ sinks,
    float* __restrict__ out, const unsigned* __restrict__ tiles, int hq, int hkv, int d,
    int window, float scale, float* __restrict__ part, int nrows) {
    extern __shared__ __align__(16) unsigned char pft_smem[];
    __shared__ int s_lo[16], s_p[16], s_range[2];
    const int kvh = blockIdx.x, tile = blockIdx.y;
    const int G = hq / hkv;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    const int r0 = (int)tiles[2 * tile], nr = (int)tiles[2 * tile + 1];
    const int h = kvh * G + warp;
    const int ksd = d + PFT_PAD, vtd = PFT_KT + PFT_PAD;
    bf16_t* ks = reinterpret_cast<bf16_t*>(pft_smem);  // [PFT_KT][ksd]
    bf16_t* vt = ks + PFT_KT * ksd;                     // [d][vtd]
    if (threadIdx.x < 16) {
        const int i = threadIdx.x;
        const int p = i < nr ? (int)pos[r0 + i] : -1;
        s_p[i] = p;
        s_lo[i] = i < nr ? (window > 0 ? max(0, p + 1 - window) : 0) : 0x7fffffff;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int kmin = 0x7fffffff, kmax = -1;
        for (int i = 0; i < nr; ++i) {
            kmin = min(kmin, s_lo[i]);
            kmax = max(kmax, s_p[i]);
        }
        s_range[0] = kmin;
        s_range[1] = kmax;
    }
    __syncthreads();
    // This split's key tiles of the tile's kmin .. kmax.
    const int kt = (s_range[1] - s_range[0]) / PFT_KT + 1, splits = gridDim.z;
    const int per = (kt + splits - 1) / splits, z = blockIdx.z;
    const int kmin = s_range[0] + z * per * PFT_KT;
    const int kmax = min(s_range[1], kmin + per * PFT_KT - 1);
    const int pa = s_p[g], pb = s_p[g + 8], la = s_lo[g], lb = s_lo[g + 8];
    const size_t base = kv_off[r0] + (size_t)kvh * d;
    const size_t stride = (size_t)hkv * d;
    const int nks = d >> 4, nd8 = d >> 3;
    // The queries of rows g and g + 8 as A fragments, one per 16 head dims.
    const float qscale = scale * PFT_LOG2E;
    unsigned qa[DMAX / 16][4];
#pragma unroll
    for (int s = 0; s < DMAX / 16; ++s) {
        if (s >= nks) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = g + 8 * (j & 1), col = 16 * s + 2 * qd + 8 * (j >> 1);
            float2 v = make_float2(0.0f, 0.0f);
            if (row < nr) v = *reinterpret_cast<const float2*>(q + ((size_t)(r0 + row) * hq + h) * d + col);
            qa[s][j] = pack_bf16x2(v.x * qscale, v.y * qscale);
        }
    }
    const bool with_sink = sinks && z == 0;
    const float sink = with_sink ? bf2f(sinks[h]) * PFT_LOG2E : -INFINITY;
    float m[2] = {sink, sink};
    float l[2] = {with_sink && qd == 0 ? 1.0f : 0.0f, with_sink && qd == 0 ? 1.0f : 0.0f};
    float o[DMAX / 8][4];
#pragma unroll
    for (int n = 0; n < DMAX / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int k0 = kmin; k0 <= kmax; k0 += PFT_KT) {
        __syncthreads();
        for (int i = threadIdx.x; i < PFT_KT * nd8; i += blockDim.x) {
            const int kj = i / nd8, c8 = (i - kj * nd8) * 8;
            uint4 kw = make_uint4(0u, 0u, 0u, 0u), vw = kw;
            if (k0 + kj <= kmax) {
                const size_t at = base + (size_t)(k0 + kj) * stride + c8;
                kw = *reinterpret_cast<const uint4*>(k_cache + at);
                vw = *reinterpret_cast<const uint4*>(v_cache + at);
            }
            *reinterpret_cast<uint4*>(ks + kj * ksd + c8) = kw;
            const unsigned vv[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                vt[(c8 + 2 * e) * vtd + kj] = (bf16_t)(vv[e] & 0xffffu);
                vt[(c8 + 2 * e + 1) * vtd + kj] = (bf16_t)(vv[e] >> 16);
            }
        }
        __syncthreads();
        float sc[PFT_KT / 8][4];
#pragma unroll
        for (int nb = 0; nb < PFT_KT / 8; ++nb) {
            sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
#pragma unroll
            for (int s = 0; s < DMAX / 16; ++s) {
                if (s >= nks) break;
                const bf16_t* kr = ks + (nb * 8 + g) * ksd + 16 * s + 2 * qd;
                mma_bf16_16816(sc[nb], qa[s], *reinterpret_cast<const unsigned*>(kr),
                               *reinterpret_cast<const unsigned*>(kr + 8));
            }
        }
        // Mask each row to its own keys, then the online softmax of rows g and g + 8.
#pragma unroll
        for (int nb = 0; nb < PFT_KT / 8; ++nb) {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int key = k0 + nb * 8 + 2 * qd + (j & 1);
                const bool ok = j < 2 ? (key >= la && key <= pa) : (key >= lb && key <= pb);
                if (!ok) sc[nb][j] = -INFINITY;
            }
        }
        mma_softmax_step(sc, m, l, o);
        // O += P V: P's accumulators of key blocks 2j, 2j + 1 are the A fragment of keys
        // 16 j … 16 j + 15.
#pragma unroll
        for (int j = 0; j < PFT_KT / 16; ++j) {
            const unsigned pa4[4] = {pack_bf16x2(sc[2 * j][0], sc[2 * j][1]),
                                     pack_bf16x2(sc[2 * j][2], sc[2 * j][3]),
                                     pack_bf16x2(sc[2 * j + 1][0], sc[2 * j + 1][1]),
                                     pack_bf16x2(sc[2 * j + 1][2], sc[2 * j + 1][3])};
#pragma unroll
            for (int n = 0; n < DMAX / 8; ++n) {
                if (n >= nd8) break;
                const bf16_t* vr = vt + (n * 8 + g) * vtd + 16 * j + 2 * qd;
                mma_bf16_16816(o[n], pa4, *reinterpret_cast<const unsigned*>(vr),
                               *reinterpret_cast<const unsigned*>(vr + 8));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    if (splits > 1) {
        float* po = part + (size_t)z * nrows * hq * d;
        float* pml = part + (size_t)splits * nrows * hq * d + (size_t)z * nrows * hq * 2;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = g + 8 * r;
            if (row >= nr) continue;
            const size_t rh = (size_t)(r0 + row) * hq + h;
            if (qd == 0) *reinterpret_cast<float2*>(pml + rh * 2) = make_float2(m[r], l[r]);
#pragma unroll
            for (int c = 0; c < DMAX / 8; ++c) {
                if (c >= nd8) break;
                *reinterpret_cast<float2*>(po + rh * d + c * 8 + 2 * qd) =
                    make_float2(o[c][2 * r], o[c][2 * r + 1]);
            }
        }
        return;
    }
#pragma unroll
    for (int n = 0; n < DMAX / 8; ++n) {
        if (n >= nd8) break;
        const int col = n * 8 + 2 * qd;
        if (g < nr)
            *reinterpret_cast<float2*>(out + ((size_t)(r0 + g) * hq + h) * d + col) =
                make_float2(o[n][0] / l[0], o[n][1] / l[0]);
        if (g + 8 < nr)
            *reinterpret_cast<float2*>(out + ((size_t)(r0 + g + 8) * hq + h) * d + col) =
                make_float2(o[n][2] / l[1], o[n][3] / l[1]);
    }
}

#define PFT_ARGS                                                                                \
    const float* __restrict__ q, const bf16_t* __restrict__ k_cache,                            \
        const bf16_t* __restrict__ v_cache, const unsigned* __restrict__ pos,                   \
        const unsigned long long* __restrict__ kv_off, const bf16_t* __restrict__ sinks,        \
        float* __restrict__ out, const unsigned* __restrict__ tiles, int hq, int hkv, int d,    \
        int window, float scale, float* __restrict__ part, int nrows
// Head dims up to PFT_MAX_D.
extern "C" __global__ void __launch_bounds__(PFT_MAX_G * 32) attn_prefill_tc(PFT_ARGS) {
    pdl_enter();
    attn_prefill_tc_body<PFT_MAX_D>(q, k_cache, v_cache, pos, kv_off, sinks, out, tiles, hq, hkv,
                                    d, window, scale, part, nrows);
}
// Head dims up to 64 (gpt-oss), compiled for two blocks per SM.
extern "C" __global__ void __launch_bounds__(PFT_MAX_G * 32, 2) attn_prefill_tc_d64(PFT_ARGS) {
    pdl_enter();
    attn_prefill_tc_body<64>(q, k_cache, v_cache, pos, kv_off, sinks, out, tiles, hq, hkv, d,
                             window, scale, part, nrows);
}

// out[r, h, :] from the splits of attn_prefill_tc: each split's output scaled by 2^(m_z - M)
// (M the largest running max), over the sum of its sums scaled the same. A split that saw no
// key of the row (max -inf) adds nothing. grid = ceil(n * hq * d / 256), block = 256.
extern "C" __global__ void attn_split_combine(const float* __restrict__ part,
                                              float* __restrict__ out, int n, int hq, int d,
                                              int splits) {
    pdl_enter();
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, all = (size_t)n * hq * d;
    if (i >= all) return;
    const size_t rh = i / d;
    const float* ml = part + (size_t)splits * all;
    float mx = -INFINITY;
    for (int z = 0; z < splits; ++z) mx = fmaxf(mx, ml[(z * (size_t)n * hq + rh) * 2]);
    float num = 0.0f, den = 0.0f;
    for (int z = 0; z < splits; ++z) {
        const float mz = ml[(z * (size_t)n * hq + rh) * 2];
        if (mz == -INFINITY) continue;
        const float c = exp2f(mz - mx);
        num += c * part[z * all + i];
        den += c * ml[(z * (size_t)n * hq + rh) * 2 + 1];
    }
    out[i] = num / den;
}
