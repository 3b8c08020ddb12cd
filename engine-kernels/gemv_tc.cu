// Decode GEMV on tensor cores: y[t, r] (+)= W[r, :] . x[t, :] + b[r] for up to TCG_TOKENS
// tokens per pass over W, so a batch of decode rows reads each weight once per step (the SIMT
// GEMV of gemv_bf16.cu takes 4 tokens per pass). bf16 weights (gemv_tc_bf16_*) or MXFP4
// (gemv_tc_fp4_*, dequantized in registers, exact as bf16); fp32 out, fp32 accumulation.
//
// One block = TCG_WARPS warps = TT m16 tiles of weight rows (TT = 1: `_t8`, `_t16`; 2:
// `_t8_r32`; 4: `_t16_r64`; 8: `_r128`, a warp a tile); a tile's TCG_WARPS / TT warps split K
// in chunks (chunk c to the tile's warp c % (TCG_WARPS / TT)) and their partial tiles are
// summed in shared memory. The tokens are the mma's n dimension: n8 tiles, TN of them (1: up
// to 8 tokens, 2: up to 16).
//
// Operand order. A dot product does not care in which order it walks K, so each lane loads its
// weights as whole 16-byte words and the activations are fed in the same permuted order: in
// chunk c, lane (g = lane / 4, q = lane % 4) holds rows g and g + 8 of the tile at columns
// c0 + q * E … c0 + q * E + E - 1 (c0 = 4 E c; E = 16 bf16 or one 32-element MXFP4 block),
// and mma j takes elements 4j, 4j + 1 as its k-pair "lo" and 4j + 2, 4j + 3 as "hi". The B
// fragment of token g is then x at the same columns: one 16-byte shared load per group of
// 8 elements. No operand goes through shared memory but the (small) activations.
//
// Activations: the block stages its tokens once, as bf16 of x · norm_w (norm) or x, in shared
// memory (rows padded by 16 bytes so the 8 tokens of a quarter-warp hit distinct banks); the
// norm's 1 / rms is applied to the sums at the end, from the squares of the fp32 x summed
// while staging (per warp and 32-float4 segment, then in a fixed order: deterministic). With
// norm_w and x_out, every block also writes its slice of the normalised input.
// A warp's first chunk of weights is loaded before the wait on the previous kernel (PDL:
// weights are immutable), so it streams in while that kernel finishes and while the
// activations are staged; the rest of the warp's first step once the staging's loads are done
// (TCG_EARLY_CHUNKS).
#define TCG_WARPS 8
// Tuning knobs (MXTUNE_KERNEL_DEFINES): activation loads in flight per warp while staging,
// and weight chunks per K-loop step (and loaded ahead) for bf16 and MXFP4 weights.
#ifndef TCG_STAGE_UNROLL
#define TCG_STAGE_UNROLL 4
#endif
#ifndef TCG_BF16_STEP
#define TCG_BF16_STEP 2
#endif
#ifndef TCG_FP4_STEP
#define TCG_FP4_STEP 1
#endif
// Chunks of its first step (W::S) a warp loads before the wait; the others once its staging
// loads are done (a define for A/B; 8: the whole step). Every block's early loads are in the
// memory system while the previous kernel ends, and that kernel's last loads and stores (the
// attention's, the MoE combine's, the embedding's) queue behind them: with the whole step
// early (2 bf16 chunks, ~10 MB for qkv's 320 blocks) the step before it ended later by more
// than the GEMV gained (docs/perf.md runs 339-340: one chunk early, 120b batch 1 / 4 / 8
// -0.9 / -1.2 / -1.3 %; none early lost, +3.8 % at batch 1).
#ifndef TCG_EARLY_CHUNKS
#define TCG_EARLY_CHUNKS 1
#endif
// Minimum resident blocks per SM the kernels are compiled for (caps their registers).
// Defaults as measured best on the H100 (docs/perf.md, runs 34-35).
#ifndef TCG_MINB
#define TCG_MINB 2
#endif
// The dense GEMV of up to 8 tokens: 3 blocks per SM (registers capped for it; its staged
// activations take 47 KB a block at K = 2880), so qkv's 320 row tiles run in one wave of 396
// slots instead of 1.21 waves of 264 (run 56: batch 1 3.573 -> 3.444 ms, batch 4 7.179 ->
// 6.922). The 16-token variant stays at TCG_MINB: its 94 KB of staging fit 2 blocks anyway,
// and capping its registers made it slower.
#ifndef TCG_MINB_T8
#define TCG_MINB_T8 3
#endif
// Bytes of padding after each staged token row.
#define TCG_XPAD 8

// How the weight structs below load a lane's words, by weight format. 1: every lane loads, at
// an index clamped into the matrix — a row past its last one reloads the last row (its sums
// are never stored), a span past a row's end reloads the row's last words (the activations
// there are fed as zeros, and finite weights times zero add nothing) — from 32-bit element
// indices (the host keeps a matrix below 2^32 elements: ops::tc_gemv_fits), so no predicate,
// no zero fill of the registers and no 64-bit index arithmetic a load; 0: the loads predicated
// on the row and the column, zeros past them. The SASS of the batch-1 MXFP4 stream's K loop
// spent 24 of its 376 instructions a chunk zeroing registers and ~60 on addresses (sm_90a:
// 376 -> 348 with the clamp); MXFP4 1. bf16 0: the bf16 entries' loops took 176 -> 147
// instructions a chunk with it, but the released 120b ran 0.2-0.6 % slower at batch 1 and 4
// (H200, docs/perf.md run 435).
#ifndef TCG_LOAD_CLAMP_FP4
#define TCG_LOAD_CLAMP_FP4 1
#endif
#ifndef TCG_LOAD_CLAMP_BF16
#define TCG_LOAD_CLAMP_BF16 0
#endif
// The K loop's two buffers of weight chunks swap roles step by step instead of the next
// chunks being copied into the current ones (tcg_tile, the 8-token kernels), by weight format:
// MXFP4 1 (the batch-1 stream's loop 348 -> 308 instructions a chunk, sm_90a), bf16 0 (its
// entries at their register caps spilled 88-128 bytes with it).
#ifndef TCG_PINGPONG_FP4
#define TCG_PINGPONG_FP4 1
#endif
#ifndef TCG_PINGPONG_BF16
#define TCG_PINGPONG_BF16 0
#endif
// A chunk inside the row takes the activations' loads without their column test (tcg_tile's
// branch a chunk, the 8-token kernels only; the row's last, partial chunk keeps it), by
// weight format: MXFP4 1 (the batch-1 stream's K loop 308 -> 296 instructions a chunk, sm_90a;
// H200, docs/perf.md runs 441-443: all-MXFP4 batch 1 0.0 to -0.8 %, batch 4 -0.2 to -0.4 %,
// 20b all-MXFP4 +0.1 to -0.6 %; in the 16-token kernels too, batch 16 went +0.1 to +1.1 %),
// bf16 0 (not measured alone: its loops are bound by their bytes, not their instructions).
// Feeding the token columns past the staged rows from the last row instead of zeros, so that
// no load was predicated, had every lane read the staged rows where at one token 4 of 32
// carry one: all-MXFP4 batch 1 +7 % (runs 440-441).
#ifndef TCG_FULL_CHUNK_FP4
#define TCG_FULL_CHUNK_FP4 1
#endif
#ifndef TCG_FULL_CHUNK_BF16
#define TCG_FULL_CHUNK_BF16 0
#endif

// bf16 weights: E = 16 elements per lane and row in a chunk (two 16-byte words); S_ chunks
// per step of the K loop (and loaded ahead).
template <int S_>
struct TcgBf16T {
    static constexpr int E = 16;
    static constexpr int S = S_;
    static constexpr bool PINGPONG = TCG_PINGPONG_BF16;
    static constexpr bool FULL_CHUNK = TCG_FULL_CHUNK_BF16;
    struct Raw {
        uint4 w[2][2];  // [row g, g + 8][word]
    };
    const bf16_t* __restrict__ w;
    int cols;
    __device__ __forceinline__ void load(Raw& f, int r0, int rows, int col) const {
        if (TCG_LOAD_CLAMP_BF16) {
            const unsigned c = min((unsigned)col, (unsigned)(cols - E));
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned r = min((unsigned)(r0 + 8 * h), (unsigned)(rows - 1));
                const uint4* p = reinterpret_cast<const uint4*>(w + (r * (unsigned)cols + c));
                f.w[h][0] = __ldg(p);
                f.w[h][1] = __ldg(p + 1);
            }
            return;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            if (r < rows && col < cols) {
                const uint4* p = reinterpret_cast<const uint4*>(w + (size_t)r * cols + col);
                f.w[h][0] = __ldg(p);
                f.w[h][1] = __ldg(p + 1);
            } else {
                f.w[h][0] = f.w[h][1] = make_uint4(0u, 0u, 0u, 0u);
            }
        }
    }
    // The bf16 pairs of group v (elements 8v … 8v + 7) of row g (lo) and g + 8 (hi).
    __device__ __forceinline__ void group(const Raw& f, int v, unsigned (&a)[4], unsigned (&b)[4]) const {
        const uint4 x = f.w[0][v], y = f.w[1][v];
        a[0] = x.x; a[1] = x.y; a[2] = x.z; a[3] = x.w;
        b[0] = y.x; b[1] = y.y; b[2] = y.z; b[3] = y.w;
    }
};

using TcgBf16 = TcgBf16T<TCG_BF16_STEP>;

// The wide 16-token kernels (`_t16_r64`): the blocks per SM they are compiled for, and the
// bf16 chunks a step (tuning knobs; at 3 blocks an SM the bf16 kernel fits 80 registers with
// one chunk a step, 4 bytes of spill, where two spill 48).
#ifndef TCG_WIDE_MINB
#define TCG_WIDE_MINB TCG_MINB
#endif
#ifndef TCG_WIDE_BF16_STEP
#define TCG_WIDE_BF16_STEP TCG_BF16_STEP
#endif

// The wide kernel's K split: the unit's last block takes every load of its sums before any of
// them (1; 0: the loop by entry, for A/B) where the unit's K is split over at most
// TCG_MAX_KSPLIT blocks (qkv of gpt-oss on an H100 / H200: 3); a larger split (the wide plan
// makes up to ops.rs TCG_WIDE_MAX_SPLIT, 8) takes the loop by entry. 4: at 8 the registers for
// the loads took the kernel from 112 to 128 with spills in its K loop (sm_90a).
#ifndef TCG_FINISH_AHEAD
#define TCG_FINISH_AHEAD 1
#endif
#ifndef TCG_MAX_KSPLIT
#define TCG_MAX_KSPLIT 4
#endif

// MXFP4 weights (blocks and scales as in mxfp4_dense.cu, the blocks' words in layout L: the
// dense matrices' bf16 layout, the experts' standard one): E = 32 NB, NB consecutive blocks of
// 32 (and their scales) per lane and row, so the 4 lanes of a row read 64 NB contiguous bytes
// per chunk.
template <int NB, int S_, int L>
struct TcgFp4T {
    static constexpr int E = 32 * NB;
    static constexpr int S = S_;
    static constexpr bool PINGPONG = TCG_PINGPONG_FP4;
    static constexpr bool FULL_CHUNK = TCG_FULL_CHUNK_FP4;
    struct Raw {
        uint4 q[2][NB];
        unsigned s[2][NB];
    };
    const u8* __restrict__ blocks;
    const u8* __restrict__ scales;
    int cols;
    __device__ __forceinline__ void load(Raw& f, int r0, int rows, int col) const {
        const int nb = cols >> 5;
        if (TCG_LOAD_CLAMP_FP4) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const unsigned rb = min((unsigned)(r0 + 8 * h), (unsigned)(rows - 1)) * (unsigned)nb;
#pragma unroll
                for (int i = 0; i < NB; ++i) {
                    const unsigned b = rb + min(((unsigned)col >> 5) + i, (unsigned)(nb - 1));
                    f.q[h][i] = __ldg(reinterpret_cast<const uint4*>(blocks) + b);
                    f.s[h][i] = __ldg(scales + b);
                }
            }
            return;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
#pragma unroll
            for (int i = 0; i < NB; ++i) {
                const int c = col + 32 * i;
                if (r < rows && c < cols) {
                    const size_t b = (size_t)r * nb + (c >> 5);
                    f.q[h][i] = __ldg(reinterpret_cast<const uint4*>(blocks) + b);
                    f.s[h][i] = scales[b];
                } else {
                    f.q[h][i] = make_uint4(0u, 0u, 0u, 0u);
                    f.s[h][i] = 127u;
                }
            }
        }
    }
    // Group v: elements 8v … 8v + 7 of the lane's span (word v % 4 of block v / 4).
    __device__ __forceinline__ void group(const Raw& f, int v, unsigned (&a)[4], unsigned (&b)[4]) const {
        const int i = v >> 2, wi = v & 3;
        const unsigned wa[4] = {f.q[0][i].x, f.q[0][i].y, f.q[0][i].z, f.q[0][i].w};
        const unsigned wb[4] = {f.q[1][i].x, f.q[1][i].y, f.q[1][i].z, f.q[1][i].w};
        fp4_bf16x2<L>(wa[wi], a);
        fp4_bf16x2<L>(wb[wi], b);
        const unsigned sa = fp4_scale_bf16x2<L>(f.s[0][i]), sb = fp4_scale_bf16x2<L>(f.s[1][i]);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            a[j] = bf16x2_mul(a[j], sa);
            b[j] = bf16x2_mul(b[j], sb);
        }
    }
};

// Blocks of 32 per lane and row: the dense GEMV's (TCG_FP4_NB) and the MoE's (TCM_NB). Run 44
// (H100, docs/perf.md) had 2 slower for the dense GEMV at batch 1 and faster for the MoE at
// batch 8-16; with today's kernels 2 is the quicker dense GEMV too (H200, runs 192, 193, 198:
// all-MXFP4 120b batch 1 -1.1 %, 20b -1.3 %, batch 4-16 -0.1 to -0.4 %; 79 registers, no spill).
#ifndef TCG_FP4_NB
#define TCG_FP4_NB 2
#endif
#ifndef TCM_NB
#define TCM_NB 2
#endif
using TcmFp4 = TcgFp4T<TCM_NB, TCG_FP4_STEP, FP4_STD>;

// Stage nt activation rows (row(n): fp32, cols) as bf16 rows of `stride` elements at xs. With
// a norm weight nw, the rows are multiplied by it and each row's sum of squares of the fp32
// values goes to ss (nt entries, shared; sq: scratch of nt * ceil(cols / 128) floats); without
// one, sq and ss are untouched. Work unit = (row, segment of 32 float4); warps take units
// round-robin, TCG_STAGE_UNROLL in flight.
// Whole block must call it. hook() runs in each thread once its loads and stores are issued,
// before the barrier.
struct TcgNoHook {
    __device__ __forceinline__ void operator()() const {}
};
// The squares of a staging round's four units (v[k]: this lane's float4 of unit u0 + 8 k; zeros
// past the last unit), each summed over the warp as warp_sum does — the same butterfly, so
// the same bits — but the four at once: at each level of xor 16 and 8 a lane sends the
// partials it no longer keeps and adds its partner's to the ones it does, so a round takes 6
// shuffles instead of 20. Unit k's sum ends in lanes 8k … 8k + 7; lane 8k stores it. With
// TCG_STAGE_UNROLL 4 only (TCG_SQ_XPOSE=0: a warp_sum a unit, for A/B). H200 (docs/perf.md run
// 402): 120b batch 8 -0.3 / -0.7 %, gpt-oss-20b batch 8 -0.6 / -0.9 %, batch 1 -0.1 to -0.3 %.
#ifndef TCG_SQ_XPOSE
#define TCG_SQ_XPOSE 1
#endif
__device__ __forceinline__ void tcg_squares4(const float4 (&v)[4], int lane, int u0, int units, float* sq) {
    float p[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) p[k] = v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    const bool hi16 = lane & 16, hi8 = lane & 8;
    const float s0 = __shfl_xor_sync(0xffffffffu, hi16 ? p[0] : p[2], 16);
    const float s1 = __shfl_xor_sync(0xffffffffu, hi16 ? p[1] : p[3], 16);
    const float a0 = (hi16 ? p[2] : p[0]) + s0, a1 = (hi16 ? p[3] : p[1]) + s1;
    float b = (hi8 ? a1 : a0) + __shfl_xor_sync(0xffffffffu, hi8 ? a0 : a1, 8);
    b += __shfl_xor_sync(0xffffffffu, b, 4);
    b += __shfl_xor_sync(0xffffffffu, b, 2);
    b += __shfl_xor_sync(0xffffffffu, b, 1);
    const int u = u0 + (lane >> 3) * TCG_WARPS;
    if ((lane & 7) == 0 && u < units) sq[u] = b;
}
template <class RowOf, class Hook = TcgNoHook>
__device__ __forceinline__ void tcg_stage(RowOf row, const bf16_t* __restrict__ nw, int cols, int nt,
                                          int stride, bf16_t* xs, float* sq, float* ss,
                                          Hook hook = Hook()) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c4 = cols >> 2, segs = (c4 + 31) >> 5, units = nt * segs;
    // Unit u is (token u / segs, segment u % segs); the warp's units step by TCG_WARPS, so
    // their (token, segment) are stepped too: a division per unit, twice, was most of the
    // loop's instructions (585 a round of 4 units on sm_90a; at 8 tokens a warp stages 23).
    int bt = warp / segs, bs = warp % segs;  // unit u0's
    for (int u0 = warp; u0 < units; u0 += TCG_STAGE_UNROLL * TCG_WARPS) {
        float4 v[TCG_STAGE_UNROLL];
        // The norm weights are loaded with x: after the squares' shuffles (where they were
        // first written) ptxas issued them only once x had arrived, a second round trip.
        uint2 nv[TCG_STAGE_UNROLL];
        int tk[TCG_STAGE_UNROLL], ik[TCG_STAGE_UNROLL];
#pragma unroll
        for (int k = 0; k < TCG_STAGE_UNROLL; ++k) {
            tk[k] = bt;
            ik[k] = bs * 32 + lane;
            bs += TCG_WARPS;
            while (bs >= segs) {  // warp-uniform; once at most where segs >= TCG_WARPS
                bs -= segs;
                ++bt;
            }
        }
#pragma unroll
        for (int k = 0; k < TCG_STAGE_UNROLL; ++k) {
            const int u = u0 + k * TCG_WARPS, t = tk[k], i = ik[k];
            const bool in = u < units && i < c4;
            v[k] = in ? reinterpret_cast<const float4*>(row(t))[i] : make_float4(0.f, 0.f, 0.f, 0.f);
            nv[k] = in && nw ? __ldg(reinterpret_cast<const uint2*>(nw) + i) : make_uint2(0u, 0u);
        }
        constexpr bool XP = TCG_SQ_XPOSE && TCG_STAGE_UNROLL == 4;
        if (XP && nw) tcg_squares4(v, lane, u0, units, sq);
#pragma unroll
        for (int k = 0; k < TCG_STAGE_UNROLL; ++k) {
            const int u = u0 + k * TCG_WARPS;
            if (u >= units) break;  // warp-uniform
            const int t = tk[k], i = ik[k];
            float4 a = v[k];
            if (!XP && nw) {
                const float s = warp_sum(a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w);
                if (lane == 0) sq[u] = s;
            }
            if (i < c4) {
                if (nw) {
                    const uint2 n = nv[k];
                    a.x *= __uint_as_float(n.x << 16);
                    a.y *= __uint_as_float(n.x & 0xffff0000u);
                    a.z *= __uint_as_float(n.y << 16);
                    a.w *= __uint_as_float(n.y & 0xffff0000u);
                }
                *reinterpret_cast<uint2*>(xs + t * stride + 4 * i) =
                    make_uint2(pack_bf16x2(a.x, a.y), pack_bf16x2(a.z, a.w));
            }
        }
    }
    hook();
    __syncthreads();
    if (nw && threadIdx.x < nt) {
        float s = 0.0f;
        for (int k = 0; k < segs; ++k) s += sq[threadIdx.x * segs + k];
        ss[threadIdx.x] = s;
    }
    __syncthreads();
}

// Chunks of a row of cols elements (4 lanes × W::E per chunk).
template <class W>
__device__ __forceinline__ int tcg_nchunks(int cols) {
    return (cols + 4 * W::E - 1) / (4 * W::E);
}

// Load this warp's first S chunks of its tile's rows (r0 = the tile's first row + g) among
// chunks c_lo … c_hi - 1.
// With TT tiles a block, the warps of a tile are TCG_WARPS / TT consecutive ones.
// Chunks S0 … S1 - 1 of those S (the entries' split at TCG_EARLY_CHUNKS: tcg_early_chunks).
template <class W, int TT, int S0 = 0, int S1 = W::S>
__device__ __forceinline__ void tcg_prefetch(const W& wp, int r0, int rows, int c_lo, int c_hi,
                                             typename W::Raw (&cur)[W::S]) {
    constexpr int CW = 4 * W::E, WG = TCG_WARPS / TT;
    const int wk = (threadIdx.x >> 5) % WG, q = threadIdx.x & 3;
#pragma unroll
    for (int s = S0; s < S1; ++s) {
        const int c = c_lo + wk + s * WG;
        if (c < c_hi) wp.load(cur[s], r0, rows, c * CW + q * W::E);
    }
}

// How many of a warp's first S chunks its entry loads before the wait.
template <class W>
__host__ __device__ constexpr int tcg_early_chunks() {
    return TCG_EARLY_CHUNKS < W::S ? TCG_EARLY_CHUNKS : W::S;
}

// The first row this thread's warp loads in the block's first unit (TT tiles a unit).
#define TCG_FIRST_ROW(TT) \
    (blockIdx.x * 16 * (TT) + ((threadIdx.x >> 5) / (TCG_WARPS / (TT))) * 16 + ((threadIdx.x & 31) >> 2))

// The chunks of this block's K split (blockIdx.z of gridDim.z): tcg_chunk_lo … tcg_chunk_hi - 1
// of the row's nchunks.
__device__ __forceinline__ int tcg_chunk_lo(int nchunks) {
    return min(nchunks, (int)blockIdx.z * (int)((nchunks + gridDim.z - 1) / gridDim.z));
}
__device__ __forceinline__ int tcg_chunk_hi(int nchunks) {
    return min(nchunks, tcg_chunk_lo(nchunks) + (int)((nchunks + gridDim.z - 1) / gridDim.z));
}

// One chunk of a warp's tile times the nt staged rows: the lane's E weights of rows g and
// g + 8 at columns col … col + E - 1 (loaded in f) against the same columns of tokens n * 8 + g,
// accumulated into acc[n] (mma_bf16_16816's C layout). Staged columns past cols are fed as
// zeros (their weights are zeros, or with the clamped loads the row's last words: finite).
// FULL: the chunk lies inside the row (the caller checks it once a chunk), so the activations'
// loads skip the column test.
template <class W, int TN, bool FULL = false>
__device__ __forceinline__ void tcg_mma_chunk(const W& wp, const typename W::Raw& f, int col,
                                              int cols, const bf16_t* xs, int stride, int nt,
                                              float (&acc)[TN][4]) {
    constexpr int E = W::E;
    const int g = (threadIdx.x & 31) >> 2;
#pragma unroll
    for (int v = 0; v < E / 8; ++v) {
        unsigned a[4], b[4];
        wp.group(f, v, a, b);
        const unsigned frag0[4] = {a[0], b[0], a[1], b[1]};
        const unsigned frag1[4] = {a[2], b[2], a[3], b[3]};
#pragma unroll
        for (int n = 0; n < TN; ++n) {
            const int tok = n * 8 + g;
            uint4 xv = make_uint4(0u, 0u, 0u, 0u);
            if (tok < nt && (FULL || col + 8 * v < cols))
                xv = *reinterpret_cast<const uint4*>(xs + tok * stride + col + 8 * v);
            mma_bf16_16816(acc[n], frag0, xv.x, xv.y);
            mma_bf16_16816(acc[n], frag1, xv.z, xv.w);
        }
    }
}

// This warp's share of its tile: chunks c_lo + wk, c_lo + wk + WG, … below nchunks (wk: the
// warp's index among the WG = TCG_WARPS / TT warps of its tile; the first S already in cur),
// S per iteration with the next S loaded meanwhile, times the nt staged rows at xs. Then the
// warp's partial sums go to red[warp][row][token] (shared).
template <class W, int TN, int TT>
__device__ __forceinline__ void tcg_tile(const W& wp, int r0, int rows, int cols, int c_lo, int nchunks,
                                         typename W::Raw (&cur)[W::S], const bf16_t* xs, int stride,
                                         int nt, float (*red)[16][8 * TN]) {
    constexpr int E = W::E, CW = 4 * E, S = W::S, WG = TCG_WARPS / TT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    typename W::Raw nxt[S];
    float acc[TN][4];
#pragma unroll
    for (int n = 0; n < TN; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    // Chunk cc of f times the tokens (W::FULL_CHUNK and one token pass: a chunk inside the row
    // without the column tests, a warp-uniform branch; the row's last, partial chunk with them).
    auto mma = [&](const typename W::Raw& f, int cc) {
        const int col = cc * CW + q * E;
        if constexpr (W::FULL_CHUNK && TN == 1) {
            if ((cc + 1) * CW <= cols)
                tcg_mma_chunk<W, TN, true>(wp, f, col, cols, xs, stride, nt, acc);
            else
                tcg_mma_chunk<W, TN>(wp, f, col, cols, xs, stride, nt, acc);
        } else {
            tcg_mma_chunk<W, TN>(wp, f, col, cols, xs, stride, nt, acc);
        }
    };
    // One step: the S chunks from c in `in` summed while the next S load into `out`.
    auto step = [&](int c, typename W::Raw (&in)[S], typename W::Raw (&out)[S]) {
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int cn = c + (S + s) * WG;
            if (cn < nchunks) wp.load(out[s], r0, rows, cn * CW + q * E);
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const int cc = c + s * WG;
            if (cc >= nchunks) break;  // warp-uniform
            // A lane whose span is past the row (last chunk) feeds zero activations: the mma
            // is warp-wide, every lane takes part.
            mma(in[s], cc);
        }
    };
    // Two steps an iteration, the buffers swapping roles (W::PINGPONG: TCG_PINGPONG_FP4 /
    // _BF16; the 8-token kernels only), where a copy of nxt into cur after each step took a
    // move a register (the batch-1 MXFP4 stream: ~20 of its K loop's instructions a chunk);
    // else the copy. (The 16-token MXFP4 stream, at 100 -> 112 registers with it, read the
    // lm_head at batch 16 in 264 µs against 254: docs/perf.md run 436.)
    if constexpr (W::PINGPONG && TN == 1) {
        for (int c = c_lo + warp % WG; c < nchunks; c += 2 * S * WG) {
            step(c, cur, nxt);
            if (c + S * WG >= nchunks) break;  // warp-uniform
            step(c + S * WG, nxt, cur);
        }
    } else {
        for (int c = c_lo + warp % WG; c < nchunks; c += S * WG) {
#pragma unroll
            for (int s = 0; s < S; ++s) {
                const int cn = c + (S + s) * WG;
                if (cn < nchunks) wp.load(nxt[s], r0, rows, cn * CW + q * E);
            }
#pragma unroll
            for (int s = 0; s < S; ++s) {
                const int cc = c + s * WG;
                if (cc >= nchunks) break;  // warp-uniform
                mma(cur[s], cc);
            }
#pragma unroll
            for (int s = 0; s < S; ++s) cur[s] = nxt[s];
        }
    }
    // acc[n]: rows g (0, 1) and g + 8 (2, 3), tokens n * 8 + 2q (+1).
#pragma unroll
    for (int n = 0; n < TN; ++n) {
        red[warp][g][n * 8 + 2 * q] = acc[n][0];
        red[warp][g][n * 8 + 2 * q + 1] = acc[n][1];
        red[warp][g + 8][n * 8 + 2 * q] = acc[n][2];
        red[warp][g + 8][n * 8 + 2 * q + 1] = acc[n][3];
    }
}

// Sum of the partials of the block's row `row` (tile row / 16, row % 16 within it), token
// `tok`: the tile's WG warps in order.
template <int TN, int TT>
__device__ __forceinline__ float tcg_sum(float (*red)[16][8 * TN], int row, int tok) {
    constexpr int WG = TCG_WARPS / TT;
    const int w0 = (row >> 4) * WG;
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < WG; ++w) s += red[w0 + w][row & 15][tok];
    return s;
}

// Dense projections. grid = (row-tile blocks, ceil(tokens / (8 TN)), K splits), block = 32 *
// TCG_WARPS; dynamic shared memory = tc_gemv_smem (ops.rs): min(tokens, 8 TN) staged rows of
// (cols + TCG_XPAD) bf16, then the staging's squares. cols a multiple of E (16 bf16, 32 MXFP4).
// A block's unit is TT consecutive row tiles (16 TT rows), each summed by TCG_WARPS / TT of its
// warps, so one staging of the tokens serves 16 TT rows: at two token passes (9-16 tokens)
// the 16-row blocks of qkv staged as many activation bytes as they read weights and filled
// the chip in 1.6 waves (H100, TT = 2: qkv at batch 16 1.66 -> 1.18 ms; TT = 4 lost to 2 at
// every batch, docs/perf.md runs 139-140). Block b takes units b, b + gridDim.x, …: one each
// where the grid covers every unit; a grid of fewer blocks (the host sizes it to the resident
// slots for a long matrix such as the lm_head) stages its tokens once and streams unit after
// unit, the next unit's first chunks loaded while the current one is summed. Each unit's sums
// are the same in either case.
// With gridDim.z > 1 (a K split, one unit a block: the o projection at 4-8 tokens, and every
// short matrix of the 16-token, four-tile kernel `_t16_r64` at 9-16 tokens) each block takes
// its share of K's chunks and stages only those columns; each writes its unit's partial sums
// to part[z][token][row] (with a norm also its columns' squares of each token, after them)
// and the last of the unit's blocks to finish (cnt[unit, pass], reset by it) adds part[0] +
// part[1] + … in that order, and the squares likewise: deterministic whichever finishes
// first. A split never writes x_out (each block has only its columns' squares).
// The entry points load the first chunks (tcg_prefetch: immutable weights only;
// tcg_early_chunks of the first step) before pdl_enter(), then run the body, which loads the
// rest of the step once its staging loads are done.
// DEFER (the `_defer` entry, a K split only): each block writes its partial sums and
// squares and returns; no count, no finish — the next kernel (rope_kv_write's `nz`) adds them
// as the unit's last block would have.
template <class W, int TN, int TT, bool DEFER = false>
__device__ __forceinline__ void gemv_tc_body(const W wp, typename W::Raw (&cur)[W::S],
                                             const bf16_t* __restrict__ bias,
                                             const float* __restrict__ x, float* __restrict__ y,
                                             int rows, int cols, int tokens, int accumulate,
                                             const bf16_t* __restrict__ norm_w, float eps,
                                             float* __restrict__ x_out, float* __restrict__ part,
                                             unsigned* __restrict__ cnt) {
    extern __shared__ __align__(16) unsigned char tcg_smem[];
    __shared__ float red[TCG_WARPS][16][8 * TN];
    __shared__ float rs_s[TCG_TOKENS];
    __shared__ unsigned last_s;
    constexpr int UR = 16 * TT;  // rows a unit
    const int g = (threadIdx.x & 31) >> 2, sub = (threadIdx.x >> 5) / (TCG_WARPS / TT);
    const int t0 = blockIdx.y * 8 * TN, nt = min(8 * TN, tokens - t0);
    const int c_lo = tcg_chunk_lo(tcg_nchunks<W>(cols)), c_hi = tcg_chunk_hi(tcg_nchunks<W>(cols));
    const int nunits = (rows + UR - 1) / UR;
    const bool split = gridDim.z > 1;

    // A K split stages its own columns only, k0 … k0 + kn - 1, as rows of the split's width
    // (the host sizes the shared memory for it, tc_gemv_smem_width); the MMAs index the
    // staging by absolute column, from xa = xs - k0. With a norm, each block's squares are
    // those of its columns: the unit's last block adds every split's (sqp, below).
    // (The 8-token kernels' split, o's at 4-8 tokens, stages into full-width rows at column
    // k0 and has no norm: their code stays as it was before the wide kernel, WIDE false.)
    constexpr bool WIDE = TT == 4;
    const int k0 = c_lo * 4 * W::E, kn = min(cols, c_hi * 4 * W::E) - k0;
    const int kw = WIDE && split ? min(cols, (int)((tcg_nchunks<W>(cols) + gridDim.z - 1) / gridDim.z) * 4 * W::E) : cols;
    const int stride = kw + TCG_XPAD;
    bf16_t* xs = reinterpret_cast<bf16_t*>(tcg_smem);
    const bf16_t* xa = WIDE ? xs - k0 : xs;
    float* sq = reinterpret_cast<float*>(tcg_smem + (size_t)nt * stride * 2);
    float* ss = sq + nt * (((cols >> 2) + 31) >> 5);
    const float* xt = x + (size_t)t0 * cols;
    // The rest of the warp's first step (the entry loaded tcg_early_chunks of it before the
    // wait), once the staging's loads of x are issued and used: they do not queue behind these.
    auto late = [&]() {
        constexpr int E0 = tcg_early_chunks<W>();
        if (E0 < W::S) tcg_prefetch<W, TT, E0>(wp, TCG_FIRST_ROW(TT), rows, c_lo, c_hi, cur);
    };
    tcg_stage([&](int n) { return xt + (size_t)n * cols + k0; }, WIDE && norm_w ? norm_w + k0 : norm_w,
              kn, nt, stride, WIDE ? xs : xs + k0, sq, ss, late);
    if (threadIdx.x < nt) rs_s[threadIdx.x] = norm_w ? rsqrtf(ss[threadIdx.x] / (float)cols + eps) : 1.0f;
    // A split's squares of each token: after the partial sums (gridDim.z floats a token).
    float* sqp = part + (size_t)gridDim.z * tokens * rows;
    // Whether the epilogue's loads are issued before the unit's sums: in the one-tile 8-token
    // kernel (batch 1-8). In the others the two registers they hold through the K loop cost
    // more (spills; batch 8-16 0.4-0.7 % slower, docs/perf.md run 204) than the loads save.
    constexpr bool EARLY = TT == 1 && TN == 1;
    static_assert(!EARLY || 16 * TT * 8 * TN <= 32 * TCG_WARPS, "one (row, token) of a unit a thread");
    for (int unit = blockIdx.x; unit < nunits; unit += gridDim.x) {
        // The thread's (row, token) of the unit's sums where it has one (EARLY): its bias and
        // the output it adds to.
        const int e_row = threadIdx.x / (8 * TN), e_tok = threadIdx.x % (8 * TN), e_r = unit * UR + e_row;
        const bool e_on = threadIdx.x < UR * 8 * TN && e_tok < nt && e_r < rows;
        float e_bias = 0.0f, e_y = 0.0f;
        if (EARLY && e_on) {
            if (bias) e_bias = bf2f(bias[e_r]);
            if (accumulate) e_y = y[(size_t)(t0 + e_tok) * rows + e_r];
        }
        tcg_tile<W, TN, TT>(wp, unit * UR + sub * 16 + g, rows, cols, c_lo, c_hi, cur, xa, stride,
                            nt, red);
        const int next = unit + gridDim.x;
        if (next < nunits) tcg_prefetch<W, TT>(wp, next * UR + sub * 16 + g, rows, c_lo, c_hi, cur);
        __syncthreads();
        if (split) {
            // This half's partial sums, then the pair's count; the second adds both halves.
            for (int i = threadIdx.x; i < UR * 8 * TN; i += blockDim.x) {
                const int row = i / (8 * TN), tok = i % (8 * TN), r = unit * UR + row;
                if (tok >= nt || r >= rows) continue;
                part[((size_t)blockIdx.z * tokens + t0 + tok) * rows + r] = tcg_sum<TN, TT>(red, row, tok);
            }
            if (WIDE && norm_w && threadIdx.x < nt) sqp[(size_t)blockIdx.z * tokens + t0 + threadIdx.x] = ss[threadIdx.x];
            __syncthreads();
            if constexpr (DEFER) continue;
            if (threadIdx.x == 0) last_s = count_block_last(cnt + (size_t)blockIdx.y * nunits + unit, gridDim.z);
            __syncthreads();
            if (!last_s) continue;
            // The wide kernel only: in the 8-token ones (o's two-block split) the same code
            // took their spills in the K loop from 12 to 32 bytes (sm_90a).
            constexpr int ZM = TCG_MAX_KSPLIT;
            if (TCG_FINISH_AHEAD && WIDE && (int)gridDim.z <= ZM) {
                // The unit's sums with every load first: each of the thread's (row, token)
                // entries' split partials, bias and output, and the splits' squares, then the
                // sums in split order as below. Written as the loop below, each entry's bias
                // and output were loaded after its partials' sums and each entry after the
                // previous one's store: at the wide kernel's four entries a thread, 8 L2 round
                // trips (and the squares' one) in the unit's last block.
                constexpr int NI = UR * 8 * TN, IT = (NI + 32 * TCG_WARPS - 1) / (32 * TCG_WARPS);
                const int gz = gridDim.z;
                float pv[IT][ZM], eb[IT], ey[IT];
#pragma unroll
                for (int it = 0; it < IT; ++it) {
                    const int i = threadIdx.x + it * 32 * TCG_WARPS, tok = i % (8 * TN);
                    const int r = unit * UR + i / (8 * TN);
                    const bool ok = i < NI && tok < nt && r < rows;
#pragma unroll
                    for (int z = 0; z < ZM; ++z)
                        pv[it][z] = ok && z < gz ? __ldcg(part + ((size_t)z * tokens + t0 + tok) * rows + r) : 0.0f;
                    eb[it] = ok && bias ? bf2f(bias[r]) : 0.0f;
                    ey[it] = ok && accumulate ? y[(size_t)(t0 + tok) * rows + r] : 0.0f;
                }
                if (WIDE && norm_w) {
                    const bool on = threadIdx.x < nt;
                    float qv[TCG_MAX_KSPLIT];
#pragma unroll
                    for (int z = 0; z < TCG_MAX_KSPLIT; ++z)
                        qv[z] = on && z < gz ? __ldcg(sqp + (size_t)z * tokens + t0 + threadIdx.x) : 0.0f;
                    if (on) {
                        float s2 = 0.0f;
#pragma unroll
                        for (int z = 0; z < TCG_MAX_KSPLIT; ++z)
                            if (z < gz) s2 += qv[z];
                        rs_s[threadIdx.x] = rsqrtf(s2 / (float)cols + eps);
                    }
                    __syncthreads();
                }
#pragma unroll
                for (int it = 0; it < IT; ++it) {
                    const int i = threadIdx.x + it * 32 * TCG_WARPS, tok = i % (8 * TN);
                    const int r = unit * UR + i / (8 * TN);
                    if (i >= NI || tok >= nt || r >= rows) continue;
                    float sum = 0.0f;
#pragma unroll
                    for (int z = 0; z < ZM; ++z)
                        if (z < gz) sum += pv[it][z];
                    const float sv = sum * rs_s[tok] + eb[it];
                    y[(size_t)(t0 + tok) * rows + r] = accumulate ? ey[it] + sv : sv;
                }
                if (next < nunits) __syncthreads();  // red is written again by the next unit
                continue;
            }
            if (WIDE && norm_w) {
                // The whole row's squares: the splits' in order (each block of a split stored
                // the same ones).
                if (threadIdx.x < nt) {
                    float s2 = 0.0f;
                    for (int z = 0; z < (int)gridDim.z; ++z) s2 += __ldcg(sqp + (size_t)z * tokens + t0 + threadIdx.x);
                    rs_s[threadIdx.x] = rsqrtf(s2 / (float)cols + eps);
                }
                __syncthreads();
            }
        }
        // Row `row`, token `tok` of the unit: its sum, scaled, biased, stored (eb, ey: its bias
        // and output when loaded early).
        auto finish = [&](int row, int tok, bool early, float eb, float ey) {
            const int r = unit * UR + row;
            if (tok >= nt || r >= rows) return;
            float sum;
            if (split) {
                sum = 0.0f;
                for (int z = 0; z < (int)gridDim.z; ++z)
                    sum += __ldcg(part + ((size_t)z * tokens + t0 + tok) * rows + r);
            } else {
                sum = tcg_sum<TN, TT>(red, row, tok);
            }
            if (!early) {
                if (bias) eb = bf2f(bias[r]);
                if (accumulate) ey = y[(size_t)(t0 + tok) * rows + r];
            }
            const float s = sum * rs_s[tok] + eb;
            y[(size_t)(t0 + tok) * rows + r] = accumulate ? ey + s : s;
        };
        if (EARLY) {
            if (e_on) finish(e_row, e_tok, true, e_bias, e_y);
        } else {
            for (int i = threadIdx.x; i < UR * 8 * TN; i += 32 * TCG_WARPS) finish(i / (8 * TN), i % (8 * TN), false, 0.0f, 0.0f);
        }
        if (next < nunits) __syncthreads();  // red is written again by the next unit
    }
    if (norm_w && x_out) {
        const int per = (cols + gridDim.x - 1) / gridDim.x;
        const int a0 = blockIdx.x * per, a1 = min(cols, a0 + per);
        for (int t = 0; t < nt; ++t)
            for (int cidx = a0 + threadIdx.x; cidx < a1; cidx += blockDim.x)
                x_out[(size_t)(t0 + t) * cols + cidx] = xt[(size_t)t * cols + cidx] * rs_s[t] * bf2f(norm_w[cidx]);
    }
}

// NORM false: an entry for GEMVs without a norm (norm_w and x_out must be null), the norm's
// code compiled out.
#define GEMV_TC_BF16_AS(name, TN, TT, MINB, STEP, NORM) GEMV_TC_BF16_X(name, TN, TT, MINB, STEP, NORM, false)
// DEFER: gemv_tc_body's (the `_defer` entry; it never writes the normalised input).
#define GEMV_TC_BF16_X(name, TN, TT, MINB, STEP, NORM, DEFER)                                  \
    extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, MINB)                         \
    name(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,                        \
         const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int tokens,   \
         int accumulate, const bf16_t* __restrict__ norm_w, float eps,                         \
         float* __restrict__ x_out, float* __restrict__ part, unsigned* __restrict__ cnt) {    \
        using W = TcgBf16T<STEP>;                                                              \
        const W wp{w, cols};                                                                   \
        typename W::Raw cur[W::S];                                                             \
        const int nch = tcg_nchunks<W>(cols);                                                  \
        const int c_lo = tcg_chunk_lo(nch), c_hi = tcg_chunk_hi(nch);                          \
        tcg_prefetch<W, TT, 0, tcg_early_chunks<W>()>(wp, TCG_FIRST_ROW(TT), rows, c_lo, c_hi,  \
                                                      cur);                                    \
        pdl_enter_as(TCG_TRIGGER);                                                             \
        gemv_tc_body<W, TN, TT, DEFER>(wp, cur, bias, x, y, rows, cols, tokens, accumulate,    \
                                       NORM ? norm_w : nullptr, eps,                           \
                                       NORM && !DEFER ? x_out : nullptr, part, cnt);           \
    }
#define GEMV_TC_BF16(name, TN, TT, MINB, STEP) GEMV_TC_BF16_AS(name, TN, TT, MINB, STEP, true)
GEMV_TC_BF16(gemv_tc_bf16_t8, 1, 1, TCG_MINB_T8, TCG_BF16_STEP)
GEMV_TC_BF16(gemv_tc_bf16_t8_r32, 1, 2, TCG_MINB_T8, TCG_BF16_STEP)
// The 8-token kernel for a GEMV without a norm whose grid fits two blocks an SM (the o
// projection up to 8 tokens: 180 blocks, no K split; ops::tc_gemv_entry): with its registers
// capped for two blocks instead of three it does not spill (99 registers; `gemv_tc_bf16_t8`
// spills 28 bytes at its 80). H200 (docs/perf.md run 395): 120b batch 1 / 2 / 3 -0.1 / -0.7 /
// -0.4 %, depth 4096 -0.7 %, 20b -0.4 %. Compiled for three blocks as well it spilled more
// than the shared entry and lost (+2.3 % at batch 1, run 394). Its 180 blocks fill 180 of the
// 264 slots, so its bytes in flight are what its blocks hold: three chunks a step (a warp's 8
// chunks of o at one token in three rounds) where the other entries take two (docs/perf.md
// runs 431-432: o 9.17 -> 8.77 µs a layer at one token, 120b batch 1 -0.1 to -0.6 %, batch 8
// -0.2 / -0.5 %; four chunks +5 %).
#ifndef TCG_PLAIN_STEP
#define TCG_PLAIN_STEP 3
#endif
GEMV_TC_BF16_AS(gemv_tc_bf16_t8_plain, 1, 1, TCG_MINB, TCG_PLAIN_STEP, false)
GEMV_TC_BF16(gemv_tc_bf16_t16, 2, 1, TCG_MINB, TCG_BF16_STEP)
GEMV_TC_BF16(gemv_tc_bf16_t16_r64, 2, 4, TCG_WIDE_MINB, TCG_WIDE_BF16_STEP)
// The wide kernel leaving its K split's finish to the next kernel (ops::TCG_DEFER_ENV: qkv at
// 9-16 tokens, whose only reader is rope_kv_write).
GEMV_TC_BF16_X(gemv_tc_bf16_t16_r64_defer, 2, 4, TCG_WIDE_MINB, TCG_WIDE_BF16_STEP, true, true)
// A streamed matrix (the lm_head: a grid of the resident slots, each block taking unit after
// unit) on units of TCG_WARPS row tiles, one a warp over all of K: a warp streams its tile's
// chunks S at a time with the next S in flight and needs no other warp's partial sums, and the
// block's two barriers and its finish come once per 128 rows. With one tile a unit (the
// `_t8` / `_t16` entries) the 8 warps of a 16-row tile share its K: an MXFP4 row of 2880 is
// 12 chunks, so each warp held 1 or 2 chunks of a unit, the second one a round trip after the
// first, and the whole block waited on it at the unit's barrier (H200, gpt-oss-120b
// all-MXFP4 lm_head 164 µs for 308 MB: 39 % of the bandwidth).
// Their blocks an SM (8 and 16 tokens, as `_t8` and `_t16`), chunks a step, and MXFP4
// blocks of 32 a lane and row. (Asking L2 for each warp's chunks 2, 4 or 8 steps ahead by
// `prefetch.global.L2` was slower at every distance: docs/perf.md run 300.)
#ifndef TCG_STREAM_MINB
#define TCG_STREAM_MINB TCG_MINB_T8
#endif
#ifndef TCG_STREAM_MINB_T16
#define TCG_STREAM_MINB_T16 TCG_MINB
#endif
#ifndef TCG_STREAM_BF16_STEP
#define TCG_STREAM_BF16_STEP TCG_BF16_STEP
#endif
#ifndef TCG_STREAM_FP4_STEP
#define TCG_STREAM_FP4_STEP TCG_FP4_STEP
#endif
#ifndef TCG_STREAM_FP4_NB
#define TCG_STREAM_FP4_NB TCG_FP4_NB
#endif
GEMV_TC_BF16(gemv_tc_bf16_t8_r128, 1, TCG_WARPS, TCG_STREAM_MINB, TCG_STREAM_BF16_STEP)
GEMV_TC_BF16(gemv_tc_bf16_t16_r128, 2, TCG_WARPS, TCG_STREAM_MINB_T16, TCG_STREAM_BF16_STEP)

#define GEMV_TC_FP4(name, TN, TT, MINB, STEP, NB) GEMV_TC_FP4_AS(name, TN, TT, MINB, STEP, NB, false)
// DEFER: gemv_tc_body's (the `_defer` entry).
#define GEMV_TC_FP4_AS(name, TN, TT, MINB, STEP, NB, DEFER)                                     \
    extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, MINB)                         \
    name(const u8* __restrict__ blocks, const u8* __restrict__ scales,                         \
         const bf16_t* __restrict__ bias, const float* __restrict__ x, float* __restrict__ y,  \
         int rows, int cols, int tokens, int accumulate, const bf16_t* __restrict__ norm_w,    \
         float eps, float* __restrict__ x_out, float* __restrict__ part,                       \
         unsigned* __restrict__ cnt) {                                                         \
        using W = TcgFp4T<NB, STEP, FP4_BF16L>;                                                \
        const W wp{blocks, scales, cols};                                                      \
        typename W::Raw cur[W::S];                                                             \
        const int nch = tcg_nchunks<W>(cols);                                                  \
        const int c_lo = tcg_chunk_lo(nch), c_hi = tcg_chunk_hi(nch);                          \
        tcg_prefetch<W, TT, 0, tcg_early_chunks<W>()>(wp, TCG_FIRST_ROW(TT), rows, c_lo, c_hi,  \
                                                      cur);                                    \
        param_touch(blockDim.x, norm_w, cnt);                                                  \
        pdl_enter_as(TCG_TRIGGER);                                                             \
        gemv_tc_body<W, TN, TT, DEFER>(wp, cur, bias, x, y, rows, cols, tokens, accumulate,    \
                                       norm_w, eps, x_out, part, cnt);                         \
    }
GEMV_TC_FP4(gemv_tc_fp4_t8, 1, 1, TCG_MINB_T8, TCG_FP4_STEP, TCG_FP4_NB)
GEMV_TC_FP4(gemv_tc_fp4_t8_r32, 1, 2, TCG_MINB_T8, TCG_FP4_STEP, TCG_FP4_NB)
GEMV_TC_FP4(gemv_tc_fp4_t16, 2, 1, TCG_MINB, TCG_FP4_STEP, TCG_FP4_NB)
GEMV_TC_FP4(gemv_tc_fp4_t16_r64, 2, 4, TCG_WIDE_MINB, TCG_FP4_STEP, TCG_FP4_NB)
GEMV_TC_FP4_AS(gemv_tc_fp4_t16_r64_defer, 2, 4, TCG_WIDE_MINB, TCG_FP4_STEP, TCG_FP4_NB, true)
// The streamed matrix's entries (units of TCG_WARPS row tiles, as `_t8_r128` above).
GEMV_TC_FP4(gemv_tc_fp4_t8_r128, 1, TCG_WARPS, TCG_STREAM_MINB, TCG_STREAM_FP4_STEP, TCG_STREAM_FP4_NB)
GEMV_TC_FP4(gemv_tc_fp4_t16_r128, 2, TCG_WARPS, TCG_STREAM_MINB_T16, TCG_STREAM_FP4_STEP, TCG_STREAM_FP4_NB)

// ---- MoE decode on tensor cores: each distinct expert of a group of up to 16 tokens is read
// once, its routed (token, slot) pairs as the n dimension (the grouping: tcg_group in
// common.cuh). grid = (row tiles, nt_max * k, ceil(T / 16)).

// The MoE kernels give each warp a whole 16-row tile over all of K (a block = TCG_WARPS tiles,
// TCM_ROWS rows), so a warp's partial sums need no reduction with the others, one staging of
// the group's inputs serves TCM_ROWS rows, and each warp keeps TCM_DEPTH chunks of its rows in
// flight (a ring refilled as it goes). Depth 2 measured best (run 43: 4 and 8 are slower).
#define TCM_ROWS (16 * TCG_WARPS)
#ifndef TCM_DEPTH
#define TCM_DEPTH 2
#endif

// Issue the first TCM_DEPTH chunks of this warp's tile (r0: its row g).
__device__ __forceinline__ void tcm_prefetch(const TcmFp4& wp, int r0, int rows, int nchunks,
                                             TcmFp4::Raw (&ring)[TCM_DEPTH]) {
    const int q = threadIdx.x & 3;
#pragma unroll
    for (int d = 0; d < TCM_DEPTH; ++d)
        if (d < nchunks) wp.load(ring[d], r0, rows, d * 4 * TcmFp4::E + q * TcmFp4::E);
}

// This warp's tile times the nt staged rows at xs: acc[n] holds rows g (0, 1) and g + 8 (2, 3)
// of the tile, tokens n * 8 + 2q (+1), as mma_bf16_16816 leaves them.
template <int TN>
__device__ __forceinline__ void tcm_tile(const TcmFp4& wp, int r0, int rows, int cols,
                                         int nchunks, TcmFp4::Raw (&ring)[TCM_DEPTH],
                                         const bf16_t* xs, int stride, int nt,
                                         float (&acc)[TN][4]) {
    constexpr int E = TcmFp4::E, CW = 4 * E;
    const int q = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < TN; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int c0 = 0; c0 < nchunks; c0 += TCM_DEPTH) {
#pragma unroll
        for (int d = 0; d < TCM_DEPTH; ++d) {
            const int c = c0 + d;
            if (c >= nchunks) break;  // warp-uniform
            const TcmFp4::Raw cur = ring[d];
            if (c + TCM_DEPTH < nchunks) wp.load(ring[d], r0, rows, (c + TCM_DEPTH) * CW + q * E);
            const int col = c * CW + q * E;
            tcg_mma_chunk<TcmFp4, TN>(wp, cur, col, cols, xs, stride, nt, acc);
        }
    }
}

// The gate_up epilogue of the tensor-core MoEs. A 16-row tile's rows interleave gate (even)
// and linear (odd) units, so the lanes of even g finish units ja = (tile row g) / 2 and ja + 4,
// the linear sums coming from the lanes 4 on. tc_swiglu_bias: those units' gate and linear
// biases (b[0], b[1] for ja; b[2], b[3] for ja + 4; zeros elsewhere), read early.
__device__ __forceinline__ void tc_swiglu_bias(const bf16_t* __restrict__ be, int ja, int inter,
                                               float (&b)[4]) {
    const bool fin = ((threadIdx.x & 31) >> 2 & 1) == 0;
    b[0] = b[1] = b[2] = b[3] = 0.0f;
    if (fin && ja < inter) { b[0] = bf2f(be[2 * ja]); b[1] = bf2f(be[2 * ja + 1]); }
    if (fin && ja + 4 < inter) { b[2] = bf2f(be[2 * ja + 8]); b[3] = bf2f(be[2 * ja + 9]); }
}

// act[p[m], j] = swiglu(gate · d + b_gate, lin · d + b_lin) for the units above and members m
// < nm (acc[n] in mma's C layout: members n * 8 + 2q, + 1), d = dm[m] (1 without dm).
template <int TN>
__device__ __forceinline__ void tc_swiglu_store(const float (&acc)[TN][4], int ja, int nm,
                                                const int* p, const float* dm,
                                                const float (&b)[4], float* __restrict__ act,
                                                int inter, float limit, float alpha) {
    const int lane = threadIdx.x & 31, q = lane & 3;
    const bool fin = ((lane >> 2) & 1) == 0;
#pragma unroll
    for (int n = 0; n < TN; ++n) {
        float lin[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) lin[i] = __shfl_down_sync(0xffffffffu, acc[n][i], 4);
        if (!fin) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int m = n * 8 + 2 * q + (i & 1), j = i < 2 ? ja : ja + 4;
            if (m >= nm || j >= inter) continue;
            const float d = dm ? dm[m] : 1.0f;
            const float gt = acc[n][i] * d + b[i < 2 ? 0 : 2];
            const float li = lin[i] * d + b[i < 2 ? 1 : 3];
            act[(size_t)p[m] * inter + j] = swiglu_clamped(gt, li, limit, alpha);
        }
    }
}

// act[p, j] = swiglu(gate_j, lin_j) for each pair p routed to the block's expert (rows 2j and
// 2j + 1 of gate_up interleave gate and linear units). x: the normalised input [T, H].
template <int TN>
__device__ __forceinline__ void moe_gate_up_tc_body(const u8* __restrict__ blocks,
                                                    const u8* __restrict__ scales,
                                                    const bf16_t* __restrict__ bias,
                                                    const float* __restrict__ x,
                                                    const int* __restrict__ idx,
                                                    float* __restrict__ act, int inter, int hidden,
                                                    int k, int tokens, float limit, float alpha) {
    extern __shared__ __align__(16) unsigned char tcg_smem[];
    __shared__ TcgGroup grp;
    if (!tcg_group(idx, tokens, k, grp)) return;
    const int rows = 2 * inter, nb = hidden >> 5;
    const TcmFp4 wp{blocks + (size_t)grp.e * rows * nb * 16, scales + (size_t)grp.e * rows * nb, hidden};
    const int g = (threadIdx.x & 31) >> 2;
    const int rt = blockIdx.x * TCM_ROWS + (threadIdx.x >> 5) * 16;  // the warp's tile
    const int nchunks = (hidden + 4 * TcmFp4::E - 1) / (4 * TcmFp4::E);
    TcmFp4::Raw ring[TCM_DEPTH];
    tcm_prefetch(wp, rt + g, rows, nchunks, ring);
    // The units this lane finishes: their biases now.
    const int ja = (rt + g) >> 1;
    float b[4];
    tc_swiglu_bias(bias + (size_t)grp.e * rows, ja, inter, b);
    const int stride = hidden + TCG_XPAD, nt = grp.n;
    bf16_t* xs = reinterpret_cast<bf16_t*>(tcg_smem);
    tcg_stage([&](int n) { return x + (size_t)(grp.p[n] / k) * hidden; }, nullptr, hidden, nt,
              stride, xs, nullptr, nullptr);
    float acc[TN][4];
    tcm_tile<TN>(wp, rt + g, rows, hidden, nchunks, ring, xs, stride, nt, acc);
    tc_swiglu_store<TN>(acc, ja, nt, grp.p, nullptr, b, act, inter, limit, alpha);
}

// part[p, r] = w[p] * (W2_e[r, :] . act[p, :] + b2_e[r]) for each pair p routed to the block's
// expert; moe_combine then sums the k slots of each token in order.
template <int TN>
__device__ __forceinline__ void moe_down_tc_body(const u8* __restrict__ blocks,
                                                 const u8* __restrict__ scales,
                                                 const bf16_t* __restrict__ bias,
                                                 const float* __restrict__ act,
                                                 const int* __restrict__ idx,
                                                 const float* __restrict__ wts,
                                                 float* __restrict__ part, int hidden, int inter,
                                                 int k, int tokens) {
    extern __shared__ __align__(16) unsigned char tcg_smem[];
    __shared__ TcgGroup grp;
    if (!tcg_group(idx, tokens, k, grp)) return;
    const int nb = inter >> 5;
    const TcmFp4 wp{blocks + (size_t)grp.e * hidden * nb * 16, scales + (size_t)grp.e * hidden * nb, inter};
    const int lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int rt = blockIdx.x * TCM_ROWS + (threadIdx.x >> 5) * 16;
    const int nchunks = (inter + 4 * TcmFp4::E - 1) / (4 * TcmFp4::E);
    TcmFp4::Raw ring[TCM_DEPTH];
    tcm_prefetch(wp, rt + g, hidden, nchunks, ring);
    const bf16_t* be = bias + (size_t)grp.e * hidden;
    const int ra = rt + g, rb = ra + 8;
    const float ba = ra < hidden ? bf2f(be[ra]) : 0.f, bb = rb < hidden ? bf2f(be[rb]) : 0.f;
    const int stride = inter + TCG_XPAD, nt = grp.n;
    bf16_t* xs = reinterpret_cast<bf16_t*>(tcg_smem);
    tcg_stage([&](int n) { return act + (size_t)grp.p[n] * inter; }, nullptr, inter, nt,
              stride, xs, nullptr, nullptr);
    float acc[TN][4];
    tcm_tile<TN>(wp, rt + g, hidden, inter, nchunks, ring, xs, stride, nt, acc);
#pragma unroll
    for (int n = 0; n < TN; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int tok = n * 8 + 2 * q + (i & 1), r = i < 2 ? ra : rb;
            if (tok >= nt || r >= hidden) continue;
            const int p = grp.p[tok];
            part[(size_t)p * hidden + r] = wts[p] * (acc[n][i] + (i < 2 ? ba : bb));
        }
    }
}

// grid = (ceil(2 I / TCM_ROWS), min(T, 16) * k, ceil(T / 16)); dynamic shared memory: 16 staged
// rows of (H + TCG_XPAD) bf16 at most (ops.rs sizes it for min(T, 16)).
#define MOE_GATE_UP_TC(name, TN)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, TCG_MINB)                     \
    name(const u8* __restrict__ blocks, const u8* __restrict__ scales,                         \
         const bf16_t* __restrict__ bias, const float* __restrict__ x,                         \
         const int* __restrict__ idx, float* __restrict__ act, int inter, int hidden, int k,   \
         int tokens, float limit, float alpha) {                                               \
        pdl_enter();                                                                           \
        moe_gate_up_tc_body<TN>(blocks, scales, bias, x, idx, act, inter, hidden, k, tokens,   \
                                limit, alpha);                                                 \
    }
MOE_GATE_UP_TC(moe_gate_up_tc_t8, 1)
MOE_GATE_UP_TC(moe_gate_up_tc_t16, 2)

// grid = (ceil(H / TCM_ROWS), min(T, 16) * k, ceil(T / 16)); dynamic shared memory: 16 staged rows
// of (I + TCG_XPAD) bf16 at most.
#define MOE_DOWN_TC(name, TN)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, TCG_MINB)                     \
    name(const u8* __restrict__ blocks, const u8* __restrict__ scales,                         \
         const bf16_t* __restrict__ bias, const float* __restrict__ act,                       \
         const int* __restrict__ idx, const float* __restrict__ wts, float* __restrict__ part, \
         int hidden, int inter, int k, int tokens) {                                           \
        pdl_enter();                                                                           \
        moe_down_tc_body<TN>(blocks, scales, bias, act, idx, wts, part, hidden, inter, k,      \
                             tokens);                                                          \
    }
MOE_DOWN_TC(moe_down_tc_t8, 1)
MOE_DOWN_TC(moe_down_tc_t16, 2)


// ---- The fp16 tensor-core decode MoE (`moe_gate_up_f16`, `moe_down_f16`): fewer
// instructions per weight than the kernels above, which spend most of theirs turning MXFP4
// into scaled bf16 (run 92: 4.6 instructions per weight and lane). Here the E2M1 values go
// into mma.sync's A operand as fp16 (exact) by byte permutations alone: the high byte of
// each value's fp16 code from a table, its sign moved to bit 7, and a zero low byte; nothing
// multiplies a weight. The UE8M0 scale is applied to the mma's fp32 sums instead, one k32
// step (two m16n8k16) being exactly one 32-element block of each of the tile's rows.
// The activations, B, are fp16 of x / D per member (routed pair), D = 2^(E - 7) for the
// row's largest magnitude in [2^E, 2^(E+1)), so |x / D| < 256 and every value above 2^-14 D
// keeps fp16's 11 bits (bf16 keeps 8); D multiplies the member's sums at the end. A row
// whose largest magnitude is below 2^-119 (or zero) is zeros; inf or NaN makes D NaN.
//
// Operand order: lane (g = lane / 4, t = lane % 4) loads word t (elements 8t … 8t + 7) of
// a block of rows g and g + 8; elements 8t + {0,1}, {2,3} are the first mma's k pairs 2t and
// 2t + 8, elements 8t + {4,5}, {6,7} the second's. B's lane (g, t) holds the same eight
// elements of member g: one 16-byte shared load of the staged fp16 row.
//
// Work: a block is 8 warps; `ks` warps (1, 2, 4 or 8: a kernel argument) split each 16-row
// tile's K, so a block covers 128 / ks rows, and the split's sums are added in warp order
// (deterministic); each warp keeps MOE16_D blocks of its two rows in flight (a register
// ring). The grouping is tcg_group's (each distinct expert of a group of up to 16 tokens read
// once, its routed pairs the n dimension; its count of the group's distinct experts is what the
// down kernel's slot combine waits for).
#ifndef MOE16_D
#define MOE16_D 4
#endif
#ifndef MOE16_MINB
#define MOE16_MINB 3
#endif
#define MOE16_MAXM TCG_TOKENS

// Byte stride of one staged member row (cols fp16), padded so that consecutive members start
// 64 bytes apart in the banks (a quarter warp's 16-byte loads: two members, 4 lanes each).
__device__ __forceinline__ int moe16_stride(int cols) {
    const int s = cols * 2;
    return s + ((64 - (s & 127)) & 127);
}

// Stage the nm members' activations (row(n): fp32, cols, a multiple of 32) as fp16 of x / D
// at xs, D at dm[n], and row zr (= min(T, 16), past every group's members) as zeros. Whole
// block must call it.
template <class RowOf>
__device__ __forceinline__ void moe16_stage(RowOf row, int cols, int nm, int zr, u8* xs, float* dm) {
    __shared__ float amax16[TCG_WARPS][MOE16_MAXM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int c4 = cols >> 2, stride = moe16_stride(cols);
    // The zero row the lanes of members past the group read (row zr, after the members).
    for (int i = threadIdx.x; i < stride / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(xs + zr * stride)[i] = make_uint4(0u, 0u, 0u, 0u);
    for (int n = 0; n < nm; ++n) {
        const float4* r = reinterpret_cast<const float4*>(row(n));
        float m = 0.0f;
        for (int i = threadIdx.x; i < c4; i += blockDim.x) {
            const float4 v = r[i];
            m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) amax16[warp][n] = m;
    }
    __syncthreads();
    if (threadIdx.x < nm) {
        float m = 0.0f;
        for (int w = 0; w < TCG_WARPS; ++w) m = fmaxf(m, amax16[w][threadIdx.x]);
        const unsigned ef = __float_as_uint(m) >> 23;  // its biased exponent
        // Below 2^-119 (or 0): zeros; inf: NaN (a NaN value stays NaN through the fp16 codes).
        const float d = ef < 8u ? 0.0f : (ef > 254u ? __uint_as_float(0x7fc00000u) : __uint_as_float((ef - 7u) << 23));
        amax16[0][threadIdx.x] = ef < 8u || ef > 254u ? 0.0f : __uint_as_float((261u - ef) << 23);
        dm[threadIdx.x] = d;
    }
    __syncthreads();
    for (int n = 0; n < nm; ++n) {
        const float id = amax16[0][n];
        const float4* r = reinterpret_cast<const float4*>(row(n));
        for (int i = threadIdx.x; i < c4; i += blockDim.x) {
            const float4 v = r[i];
            *reinterpret_cast<uint2*>(xs + n * stride + 8 * i) =
                make_uint2(f16x2_rn(v.x * id, v.y * id), f16x2_rn(v.z * id, v.w * id));
        }
    }
    __syncthreads();
}

// This warp's share of its tile: blocks kb0 … kb1 - 1 of rows g (bw: its first block; sw: its
// scales) and g + 8 (va, vb: the rows exist), times the nm staged members; acc[n] in mma's C
// layout (rows g: 0, 1; g + 8: 2, 3; members n * 8 + 2t, + 1).
__device__ __forceinline__ void moe16_tile(const u8* __restrict__ bw, const u8* __restrict__ sw,
                                           int nb, int cols, bool va, bool vb, int kb0, int kb1,
                                           const u8* xs, int nm, int zr, float (&acc)[2][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int stride = moe16_stride(cols), ntile = (nm + 7) >> 3;
    // Running pointers at block kb: rows g and g + 8 (8 rows of nb 16-byte blocks further; a
    // row past the matrix reads row g, zeroed after the load: tiles start inside it), their
    // scales, and this lane's member of each n tile (the zero row after the members past
    // the group).
    const unsigned* pa = reinterpret_cast<const unsigned*>(bw) + t + 4 * kb0;
    const unsigned* pb = pa + (vb ? 32 * nb : 0);
    const u8* sa = sw + kb0;
    const u8* sb = sa + (vb ? 8 * nb : 0);
    const unsigned ma = va ? ~0u : 0u, mb = vb ? ~0u : 0u;
    const u8* zrow = xs + zr * stride;
    const uint4* x0 = reinterpret_cast<const uint4*>((g < nm ? xs + g * stride : zrow) + t * 16) + 4 * kb0;
    const uint4* x1 = reinterpret_cast<const uint4*>((8 + g < nm ? xs + (8 + g) * stride : zrow) + t * 16) + 4 * kb0;
    unsigned qa[MOE16_D] = {}, qb[MOE16_D] = {}, ca[MOE16_D] = {}, cb[MOE16_D] = {};
    // Block kb + i's sums (the ring's slot i), then slot i refilled with block kb + i + D.
    auto step = [&](int i, bool refill) {
        unsigned ua[4], ub[4];
        fp4x8_to_f16x2(qa[i] & ma, ua);
        fp4x8_to_f16x2(qb[i] & mb, ub);
        const float fa = e8m0_fast(ca[i]), fb = e8m0_fast(cb[i]);
        if (refill) {
            qa[i] = __ldg(pa + 4 * (i + MOE16_D));
            qb[i] = __ldg(pb + 4 * (i + MOE16_D));
            ca[i] = sa[i + MOE16_D];
            cb[i] = sb[i + MOE16_D];
        }
        const unsigned a0[4] = {ua[0], ub[0], ua[1], ub[1]};
        const unsigned a1[4] = {ua[2], ub[2], ua[3], ub[3]};
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            if (n >= ntile) break;  // warp-uniform
            const uint4 b = (n ? x1 : x0)[4 * i];
            float r[4] = {0.f, 0.f, 0.f, 0.f};
            mma_f16_16816(r, a0, b.x, b.y);
            mma_f16_16816(r, a1, b.z, b.w);
            acc[n][0] = fmaf(r[0], fa, acc[n][0]);
            acc[n][1] = fmaf(r[1], fa, acc[n][1]);
            acc[n][2] = fmaf(r[2], fb, acc[n][2]);
            acc[n][3] = fmaf(r[3], fb, acc[n][3]);
        }
    };
#pragma unroll
    for (int i = 0; i < MOE16_D; ++i)
        if (kb0 + i < kb1) {
            qa[i] = __ldg(pa + 4 * i);
            qb[i] = __ldg(pb + 4 * i);
            ca[i] = sa[i];
            cb[i] = sb[i];
        }
#pragma unroll
    for (int n = 0; n < 2; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    int kb = kb0;
    for (; kb + MOE16_D <= kb1; kb += MOE16_D) {
#pragma unroll
        for (int i = 0; i < MOE16_D; ++i) step(i, kb + i + MOE16_D < kb1);
        pa += 4 * MOE16_D;
        pb += 4 * MOE16_D;
        sa += MOE16_D;
        sb += MOE16_D;
        x0 += 4 * MOE16_D;
        x1 += 4 * MOE16_D;
    }
#pragma unroll
    for (int i = 0; i < MOE16_D; ++i)
        if (kb + i < kb1) step(i, false);
}

// The K split's sums in order: warps kp > 0 of a tile publish theirs, warp kp = 0 adds them
// in kp order. True for the warps that go on to the epilogue. Whole block must call it.
__device__ __forceinline__ bool moe16_reduce(int ks, float (&acc)[2][4]) {
    __shared__ float red16[TCG_WARPS][8][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kp = warp % ks;
    if (ks == 1) return true;
    if (kp > 0) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) red16[warp][n * 4 + i][lane] = acc[n][i];
    }
    __syncthreads();
    if (kp > 0) return false;
    for (int j = 1; j < ks; ++j)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[n][i] += red16[warp + j][n * 4 + i][lane];
    return true;
}

// Split kp of ks over nb blocks.
__device__ __forceinline__ void moe16_krange(int nb, int ks, int kp, int& kb0, int& kb1) {
    kb0 = (int)((long long)nb * kp / ks);
    kb1 = (int)((long long)nb * (kp + 1) / ks);
}

// act[p, j] = swiglu(gate_j, lin_j) for the pairs p routed to the block's expert (rows 2j and
// 2j + 1 interleave gate and linear units). grid = (ceil(2 I / (128 / ks)), min(T, 16) · k
// capped at E, ceil(T / 16)); dynamic shared memory: min(T, 16) + 1 rows (the staged members,
// a zero row) of
// moe16_stride(H) bytes.
extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, MOE16_MINB)
moe_gate_up_f16(const u8* __restrict__ blocks, const u8* __restrict__ scales,
                const bf16_t* __restrict__ bias, const float* __restrict__ x,
                const int* __restrict__ idx, float* __restrict__ act, int inter, int hidden,
                int k, int tokens, float limit, float alpha, int ks) {
    extern __shared__ __align__(16) unsigned char tcg_smem[];
    __shared__ TcgGroup grp;
    __shared__ float dm[MOE16_MAXM];
    pdl_enter();
    if (!tcg_group(idx, tokens, k, grp)) return;
    const int rows = 2 * inter, nb = hidden >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
    const int ra = blockIdx.x * (16 * TCG_WARPS / ks) + (warp / ks) * 16 + g, rb = ra + 8;
    const int nm = grp.n, zr = min(tokens, TCG_TOKENS), ja = ra >> 1;
    float b[4];
    tc_swiglu_bias(bias + (size_t)grp.e * rows, ja, inter, b);
    moe16_stage([&](int n) { return x + (size_t)(grp.p[n] / k) * hidden; }, hidden, nm, zr, tcg_smem, dm);
    int kb0, kb1;
    moe16_krange(nb, ks, warp % ks, kb0, kb1);
    float acc[2][4];
    moe16_tile(blocks + ((size_t)grp.e * rows + ra) * nb * 16, scales + ((size_t)grp.e * rows + ra) * nb,
               nb, hidden, ra < rows, rb < rows, kb0, kb1, tcg_smem, nm, zr, acc);
    if (!moe16_reduce(ks, acc)) return;
    tc_swiglu_store<2>(acc, ja, nm, grp.p, dm, b, act, inter, limit, alpha);
}

// part[p, r] = w[p] (W2_e[r, :] . act[p, :] + b2_e[r]) for the pairs p routed to the block's
// expert, then y[t, r] (+)= the k slots' rows of each token in slot order (deterministic): the
// last of the token group's distinct-expert blocks of a row range (counted in ctr[z ·
// gridDim.x + x], which it leaves at zero) adds them. grid and shared memory as
// moe_gate_up_f16 with H and I swapped.
extern "C" __global__ void __launch_bounds__(32 * TCG_WARPS, MOE16_MINB)
moe_down_f16(const u8* __restrict__ blocks, const u8* __restrict__ scales,
             const bf16_t* __restrict__ bias, const float* __restrict__ act,
             const int* __restrict__ idx, const float* __restrict__ wts, float* __restrict__ part,
             int hidden, int inter, int k, int tokens, int ks, float* __restrict__ y,
             int accumulate, unsigned* __restrict__ ctr) {
    extern __shared__ __align__(16) unsigned char tcg_smem[];
    __shared__ TcgGroup grp;
    __shared__ float dm[MOE16_MAXM];
    __shared__ unsigned last16;
    pdl_enter();
    if (!tcg_group(idx, tokens, k, grp)) return;
    const int nb = inter >> 5;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int rpb = 16 * TCG_WARPS / ks;
    const int ra = blockIdx.x * rpb + (warp / ks) * 16 + g, rb = ra + 8;
    const int nm = grp.n, zr = min(tokens, TCG_TOKENS);
    moe16_stage([&](int n) { return act + (size_t)grp.p[n] * inter; }, inter, nm, zr, tcg_smem, dm);
    int kb0, kb1;
    moe16_krange(nb, ks, warp % ks, kb0, kb1);
    float acc[2][4];
    moe16_tile(blocks + ((size_t)grp.e * hidden + ra) * nb * 16, scales + ((size_t)grp.e * hidden + ra) * nb,
               nb, inter, ra < hidden, rb < hidden, kb0, kb1, tcg_smem, nm, zr, acc);
    if (moe16_reduce(ks, acc)) {
        const bf16_t* bb = bias + (size_t)grp.e * hidden;
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int mem = n * 8 + 2 * t + (i & 1), r = i < 2 ? ra : rb;
                if (mem >= nm || r >= hidden) continue;
                const int p = grp.p[mem];
                part[(size_t)p * hidden + r] = wts[p] * (acc[n][i] * dm[mem] + bf2f(bb[r]));
            }
    }
    // Publish this block's rows and count it; the group's last expert block combines.
    __syncthreads();
    if (threadIdx.x == 0) last16 = count_block_last(ctr + (size_t)blockIdx.z * gridDim.x + blockIdx.x, grp.lead);
    __syncthreads();
    if (!last16) return;
    const int t0 = blockIdx.z * TCG_TOKENS, nt = min(TCG_TOKENS, tokens - t0);
    const int r0 = blockIdx.x * rpb, nr = min(hidden, r0 + rpb) - r0;
    for (int i = threadIdx.x; i < nt * nr; i += blockDim.x) {
        const int tt = t0 + i / nr, r = r0 + i % nr;
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += __ldcg(part + ((size_t)tt * k + j) * hidden + r);
        float* o = y + (size_t)tt * hidden + r;
        *o = accumulate ? *o + sum : sum;
    }
}
