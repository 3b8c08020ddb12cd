// Dense matrix-vector products for decode: y[t, r] (+)= W[r, :] . x[t, :] + b[r], bf16
// weights, fp32 activations and accumulation, one weight pass for up to GEMV_MAX_TOKENS tokens.
// With accumulate != 0 the result is added to y (the residual add of o_proj fused in).
// With norm_w non-null the input is RMSNorm(x) · norm_w, folded into the dot products (see
// gemv_partial), and the normalised input is also written to x_out (each block a slice), so
// the norm costs no launch and no pass of its own.
// The weight rows are prefetched into L2 before the wait on the previous kernel (PDL).
// gemv_bf16 / gemv_bf16_norm: one warp per row, for many rows (o; qkv and lm_head with the
// norm).
// gemv_bf16_wide: one block of 8 warps per row, for few rows (the router), so the few rows
// still spread over the whole chip.
#define GEMV_MAX_TOKENS 4
#define GEMV_ROWS_PER_BLOCK 8

// One token's step: acc += wf · (a, b), and with SQ ss += the squares of (a, b).
template <bool SQ>
__device__ __forceinline__ void dot8_add(const float (&wf)[8], float4 a, float4 b, float& acc, float& ss) {
    acc += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w +
           wf[4] * b.x + wf[5] * b.y + wf[6] * b.z + wf[7] * b.w;
    if (SQ)
        ss += a.x * a.x + a.y * a.y + a.z * a.z + a.w * a.w +
              b.x * b.x + b.y * b.y + b.z * b.z + b.w * b.w;
}

// wf *= the eight norm weights nv (bf16): the folded norm's scaling of a chunk's weights.
__device__ __forceinline__ void scale8_by_norm(float (&wf)[8], uint4 nv) {
    float nf[8];
    bf16x8_to_f32(nv, nf);
#pragma unroll
    for (int e = 0; e < 8; ++e) wf[e] *= nf[e];
}

// acc[t] += wf · x[t, 8c … 8c + 7] for tokens t < nt (token t at x + t * cols), and with SQ
// ss[t] += the squares of those x: the 8-element step both partial-sum loops take.
// NT: the most tokens a block takes (GEMV_MAX_TOKENS; 1 for the one-token router, whose code
// then holds no loop over absent tokens).
template <bool SQ, int NT>
__device__ __forceinline__ void gemv_dot8(const float (&wf)[8], const float* __restrict__ x,
                                          int cols, int c, int nt, float (&acc)[NT],
                                          float (&ss)[NT]) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t < nt) {
            const float4* xp = reinterpret_cast<const float4*>(x + (size_t)t * cols) + 2 * c;
            dot8_add<SQ>(wf, xp[0], xp[1], acc[t], ss[t]);
        }
    }
}

// Partial dot products of row `wr` with tokens 0..nt-1 of x (token t at x + t * cols) over
// 8-element chunks start, start+stride… (16-byte loads, four in flight per thread).
// NORM: the input is RMSNorm(x) · nw, folded into the dot product: each weight is scaled by
// nw and the squares of x are summed in ss, so the caller finishes with
// acc · rsqrt(ss / cols + eps) — no normalised copy of x and no block-wide pass first.
// ANY_COLS: whether cols may be other than a multiple of 8 (else the scalar loop is not
// compiled: the one-token router's entry, which the host picks only for such widths).
template <bool NORM, int NT = GEMV_MAX_TOKENS, bool ANY_COLS = true>
__device__ __forceinline__ void gemv_partial(const bf16_t* __restrict__ wr, const float* __restrict__ x,
                                             const bf16_t* __restrict__ nw, int cols, int nt,
                                             int start, int stride, float (&acc)[NT],
                                             float (&ss)[NT]) {
    if (NT == 1 && (!ANY_COLS || (cols & 7) == 0)) {
        // One token: every load of the four chunks issued before any of their sums (written
        // as the loop below, each chunk's norm weights and x were loaded only after the
        // previous chunk's sums, one L2 round trip more a chunk); the same sums, same order.
        const uint4* w4 = reinterpret_cast<const uint4*>(wr);
        const uint4* n4 = reinterpret_cast<const uint4*>(nw);
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const int n8 = cols >> 3;
        for (int c0 = start; c0 < n8; c0 += 4 * stride) {
            uint4 wv[4], nv[4];
            float4 xa[4], xb[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int c = c0 + u * stride;
                if (c < n8) {
                    wv[u] = __ldg(w4 + c);
                    if (NORM) nv[u] = __ldg(n4 + c);
                    xa[u] = x4[2 * c];
                    xb[u] = x4[2 * c + 1];
                }
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                if (c0 + u * stride < n8) {
                    float wf[8];
                    bf16x8_to_f32(wv[u], wf);
                    if (NORM) scale8_by_norm(wf, nv[u]);
                    dot8_add<NORM>(wf, xa[u], xb[u], acc[0], ss[0]);
                }
            }
        }
    } else if (!ANY_COLS || (cols & 7) == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(wr);
        const uint4* n4 = reinterpret_cast<const uint4*>(nw);
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
                    if (NORM) scale8_by_norm(wf, __ldg(n4 + c));
                    gemv_dot8<NORM, NT>(wf, x, cols, c, nt, acc, ss);
                }
            }
        }
    } else if (ANY_COLS) {
        for (int c = start; c < cols; c += stride) {
            const float wf = bf2f(wr[c]) * (NORM ? bf2f(nw[c]) : 1.0f);
#pragma unroll
            for (int t = 0; t < NT; ++t)
                if (t < nt) {
                    const float v = x[(size_t)t * cols + c];
                    acc[t] += wf * v;
                    if (NORM) ss[t] += v * v;
                }
        }
    }
}

// gemv_partial for nr <= GEMV_WIDE_R rows wr, wr + cols, …: chunk by chunk, each chunk of x
// read once for the nr rows, whose loads are in flight together. A thread takes the same
// chunks in the same order as gemv_partial, so each row's sums are the same as there.
#define GEMV_WIDE_R 4
template <bool NORM, int NT>
__device__ __forceinline__ void gemv_partial_rows(const bf16_t* __restrict__ wr, int nr,
                                                  const float* __restrict__ x, const bf16_t* __restrict__ nw,
                                                  int cols, int nt, int start, int stride,
                                                  float (&acc)[GEMV_WIDE_R][NT], float (&ss)[NT]) {
    if ((cols & 7) == 0) {
        const uint4* w4 = reinterpret_cast<const uint4*>(wr);
        const uint4* n4 = reinterpret_cast<const uint4*>(nw);
        const int n8 = cols >> 3;
        for (int c = start; c < n8; c += stride) {
            uint4 wv[GEMV_WIDE_R];
#pragma unroll
            for (int j = 0; j < GEMV_WIDE_R; ++j)
                if (j < nr) wv[j] = __ldg(w4 + (size_t)j * n8 + c);
            float nf[8];
            if (NORM) bf16x8_to_f32(__ldg(n4 + c), nf);
#pragma unroll
            for (int j = 0; j < GEMV_WIDE_R; ++j) {
                if (j >= nr) break;
                float wf[8];
                bf16x8_to_f32(wv[j], wf);
                if (NORM) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) wf[e] *= nf[e];
                }
                // The squares once per chunk: with the first row.
                if (NORM && j == 0)
                    gemv_dot8<true, NT>(wf, x, cols, c, nt, acc[j], ss);
                else
                    gemv_dot8<false, NT>(wf, x, cols, c, nt, acc[j], ss);
            }
        }
    } else {
        for (int c = start; c < cols; c += stride) {
            const float n = NORM ? bf2f(nw[c]) : 1.0f;
#pragma unroll
            for (int j = 0; j < GEMV_WIDE_R; ++j) {
                if (j >= nr) break;
                const float wf = bf2f(wr[(size_t)j * cols + c]) * n;
#pragma unroll
                for (int t = 0; t < NT; ++t)
                    if (t < nt) {
                        const float v = x[(size_t)t * cols + c];
                        acc[j][t] += wf * v;
                        if (NORM && j == 0) ss[t] += v * v;
                    }
            }
        }
    }
}

// The several-token wide GEMV's partial sums (NT > 1, cols a multiple of 8): the sums of
// gemv_partial (R = 1) and gemv_partial_rows, in their order, but every load of a pass's chunks
// (the nr rows' weights, the norm weights, the nt tokens' x) issued before any of its sums.
// Written as those loops, each token's x was loaded under its `t < nt` branch right before its
// products, so a chunk cost a round trip for the norm weights and one per token (the SASS: two
// LDG.128 then their FFMAs, four times a chunk), ~10 L2 round trips a thread at 2880 columns
// where the one-token router (gemv_partial, NT = 1) pays one. A slot past the row, a row past
// nr or a token past nt loads valid memory (the last chunk, row or token) that no sum reads.
// A pass takes U chunks: 2 for up to two rows a block, 1 for more (registers: at four rows
// two chunks' loads would not fit the two blocks an SM the router's grid is sized for). An
// entry compiled for two rows (two chunks a pass where the four-row entry takes one) measured
// the same at 9-16 tokens (docs/perf.md run 286) and was not kept.
#ifndef ROUTER_AHEAD
#define ROUTER_AHEAD 1
#endif
// Whether the several-token router counts its block before writing its slice of the
// normalised input (gemv_wide_body).
#ifndef ROUTER_XO_AFTER
#define ROUTER_XO_AFTER 1
#endif
template <bool NORM, int NT, int R>
__device__ __forceinline__ void gemv_partial_ahead(const bf16_t* __restrict__ wr, int nr,
                                                   const float* __restrict__ x, const bf16_t* __restrict__ nw,
                                                   int cols, int nt, int start, int stride,
                                                   float (&acc)[GEMV_WIDE_R][NT], float (&ss)[NT]) {
    constexpr int U = R <= 2 ? 2 : 1;
    const uint4* w4 = reinterpret_cast<const uint4*>(wr);
    const uint4* n4 = reinterpret_cast<const uint4*>(nw);
    const int n8 = cols >> 3;
    for (int c0 = start; c0 < n8; c0 += U * stride) {
        uint4 wv[U][R], nv[U];
        float4 xa[U][NT], xb[U][NT];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = min(c0 + u * stride, n8 - 1);
#pragma unroll
            for (int j = 0; j < R; ++j) wv[u][j] = __ldg(w4 + (size_t)min(j, nr - 1) * n8 + c);
            if (NORM) nv[u] = __ldg(n4 + c);
#pragma unroll
            for (int t = 0; t < NT; ++t) {
                const float4* xp = reinterpret_cast<const float4*>(x + (size_t)min(t, nt - 1) * cols) + 2 * c;
                xa[u][t] = xp[0];
                xb[u][t] = xp[1];
            }
        }
        // Every loaded value is used whatever nr, nt and the slot's place (a slot past the row
        // adds zeros: x zeroed, so its products and squares are 0), so that ptxas keeps the
        // loads above the sums: where a token's or row's sums sat under its branch, it sank
        // that token's loads into it, after the first sums, a round trip again. Rows past nr and
        // tokens past nt sum what was loaded for them into acc entries nothing reads.
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const bool in = c0 + u * stride < n8;
            float nf[8];
            if (NORM) bf16x8_to_f32(nv[u], nf);
#pragma unroll
            for (int j = 0; j < R; ++j) {
                float wf[8];
                bf16x8_to_f32(wv[u][j], wf);
                if (NORM) {
#pragma unroll
                    for (int e = 0; e < 8; ++e) wf[e] *= nf[e];
                }
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
                    const float4 a = in ? xa[u][t] : z, b = in ? xb[u][t] : z;
                    // The squares once per chunk: with the first row.
                    if (NORM && j == 0)
                        dot8_add<true>(wf, a, b, acc[j][t], ss[t]);
                    else
                        dot8_add<false>(wf, a, b, acc[j][t], ss[t]);
                }
            }
        }
    }
}

// x_out[t, c] = x[t, c] · rs[t] · nw[c] for tokens t < nt and columns c = c_start, c_start +
// step, … below c_end.
template <int NT>
__device__ __forceinline__ void write_normed(const float* __restrict__ x, const bf16_t* __restrict__ nw,
                                             float* __restrict__ x_out, int cols, int nt,
                                             const float (&rs)[NT], int c_start, int c_end, int step) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
        if (t < nt)
            for (int c = c_start; c < c_end; c += step)
                x_out[(size_t)t * cols + c] = x[(size_t)t * cols + c] * rs[t] * bf2f(nw[c]);
}

// The columns of block `blockIdx.x`'s share of the normalised input: [c0, c1).
__device__ __forceinline__ void normed_slice(int cols, int& c0, int& c1) {
    const int per = (cols + gridDim.x - 1) / gridDim.x;
    c0 = blockIdx.x * per;
    c1 = min(cols, c0 + per);
}

// Block `blockIdx.x` of `gridDim.x` writes its share of the normalised input
// x_out = x · rs[t] · nw (the next kernels' input), so no single block serialises it.
template <int NT = GEMV_MAX_TOKENS>
__device__ __forceinline__ void write_normed_slice(const float* __restrict__ x, const bf16_t* __restrict__ nw,
                                                   float* __restrict__ x_out, int cols, int nt,
                                                   const float (&rs)[NT], int lane, int nlanes) {
    int c0, c1;
    normed_slice(cols, c0, c1);
    write_normed<NT>(x, nw, x_out, cols, nt, rs, c0 + lane, c1, nlanes);
}

// Router top-k: the k largest logits of a token (ties: lower expert index first) and the
// softmax over those k only, by one warp; `vals` is shared scratch of n_experts floats. The
// router GEMV (gemv_bf16_wide) runs this in its last block to finish, so routing costs no
// launch of its own. Logits are read past L1 (other blocks wrote them).
//
// Up to TOPK_LANE_MAX logits a lane (gpt-oss's 128 and 32 experts; TOPK_REDUX 1) the rounds
// run on registers and two `redux.sync` a round: the round's largest key (topk_key: the order
// take_better uses, as an unsigned), then the lowest expert holding it, and the owner's value
// by a shuffle; a round of the warp-wide butterfly took five dependent steps of two shuffles.
// The same picks in the same order, with the same removal (the winner's logit becomes -inf).
#ifndef TOPK_REDUX
#define TOPK_REDUX 1
#endif
#define TOPK_LANE_MAX 4
// take_better's order as an unsigned key: a larger value a larger key, -0 as +0 (they tie
// there), NaN (never taken) and absent entries 0, below -inf's key.
__device__ __forceinline__ unsigned topk_key(float v) {
    if (v != v) return 0u;
    const unsigned b = __float_as_uint(v + 0.0f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ unsigned redux_max_u32(unsigned v) {
    unsigned r;
    asm volatile("redux.sync.max.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}
__device__ __forceinline__ unsigned redux_min_u32(unsigned v) {
    unsigned r;
    asm volatile("redux.sync.min.u32 %0, %1, 0xffffffff;" : "=r"(r) : "r"(v));
    return r;
}

// The one-token router's logits by mailbox (ROUTER_POLL): each block stores its row's logit
// with a flag, {bits, 1}, as one relaxed 64-bit word (it carries its own value: no fence, no
// count), and the routing warp polls each expert's word until its flag is set, then zeroes it
// for the next launch; a word that never fills traps after MOE_POLL_LIMIT reads. Up to 128
// experts a lane polls its words together (logits_take_lane); past that, the butterfly's loop
// takes them one at a time (logit_take).
#ifndef ROUTER_POLL
#define ROUTER_POLL 1
#endif
// ROUTER_POLL_N 1: the several-token router entries take the same mailbox, one per token
// (token t's words from 2 t rows on): block 0 of each token group routes, one warp a token,
// from its tokens' words, and no block counts itself (0: the group's last block routes from
// the logits, by the count).
#ifndef ROUTER_POLL_N
#define ROUTER_POLL_N 1
#endif
// Expert e's word of the mailbox mb (common.cuh's mail_ words): post it, and take it
// (polled until its flag is set, then zeroed).
__device__ __forceinline__ void logit_post(unsigned* mb, int e, float v) { mail_post(mb + 2 * e, v); }
__device__ __forceinline__ float logit_take(unsigned* mb, int e) {
    unsigned lo, hi, polls = 0;
    do {
        mail_peek(mb + 2 * e, lo, hi);
        if (++polls == MOE_POLL_LIMIT) __trap();
    } while (hi == 0u);
    mail_clear(mb + 2 * e);
    return __uint_as_float(lo);
}

// The lane's TOPK_LANE_MAX logits (experts lane, lane + 32, …; -inf past n) from the mailbox:
// each poll reads every word still empty at once, so the last logit to come
// costs one round trip, not one a word the lane still has to read.
__device__ __forceinline__ void logits_take_lane(unsigned* mb, int lane, int n, float (&v)[TOPK_LANE_MAX]) {
    unsigned need = 0u, polls = 0;
#pragma unroll
    for (int j = 0; j < TOPK_LANE_MAX; ++j) {
        v[j] = -INFINITY;
        if (lane + 32 * j < n) need |= 1u << j;
    }
    while (need) {
        unsigned lo[TOPK_LANE_MAX], hi[TOPK_LANE_MAX];
#pragma unroll
        for (int j = 0; j < TOPK_LANE_MAX; ++j) {
            hi[j] = 0u;
            if (need >> j & 1u) mail_peek(mb + 2 * (lane + 32 * j), lo[j], hi[j]);
        }
#pragma unroll
        for (int j = 0; j < TOPK_LANE_MAX; ++j)
            if ((need >> j & 1u) && hi[j]) {
                v[j] = __uint_as_float(lo[j]);
                need &= ~(1u << j);
            }
        if (++polls == MOE_POLL_LIMIT) __trap();
    }
#pragma unroll
    for (int j = 0; j < TOPK_LANE_MAX; ++j)
        if (lane + 32 * j < n) mail_clear(mb + 2 * (lane + 32 * j));
}

// mb non-null: the logits come from the mailbox words mb (logit_take), else from `logits`
// (global memory written by other blocks, read past L1).
__device__ void topk_softmax_warp(const float* logits, int n_experts, int k, int* __restrict__ idx,
                                  float* __restrict__ weights, float* vals,
                                  unsigned* __restrict__ ready, unsigned* __restrict__ done,
                                  unsigned* __restrict__ mb = nullptr) {
    const int lane = threadIdx.x & 31;
    float top_v[32];
    int top_i[32];
    // Slot s's pick, by either loop: recorded, and announced to its gate_up blocks as soon as
    // it is known, with its gate_up count zeroed (moe_count_done), which gate_up adds to only
    // past its wait on this grid.
    auto pick = [&](int s, int bi, float bv) {
        top_v[s] = bv;
        top_i[s] = bi;
        if (ready && lane == 0) {
            done[s] = 0u;
            moe_ready_set(ready + s, bi);
        }
    };
    if (TOPK_REDUX && n_experts <= 32 * TOPK_LANE_MAX) {
        float v[TOPK_LANE_MAX];
        unsigned kk[TOPK_LANE_MAX];
        if (mb) {
            logits_take_lane(mb, lane, n_experts, v);
        } else {
#pragma unroll
            for (int j = 0; j < TOPK_LANE_MAX; ++j) {
                const int e = lane + 32 * j;
                v[j] = e < n_experts ? __ldcg(logits + e) : -INFINITY;
            }
        }
#pragma unroll
        for (int j = 0; j < TOPK_LANE_MAX; ++j) kk[j] = lane + 32 * j < n_experts ? topk_key(v[j]) : 0u;
        for (int s = 0; s < k; ++s) {
            // The lane's best: the largest key, its lowest expert on ties (j ascending).
            unsigned bk = 0u;
            int be = 0;
            float bvl = -INFINITY;
#pragma unroll
            for (int j = 0; j < TOPK_LANE_MAX; ++j)
                if (kk[j] > bk) {
                    bk = kk[j];
                    be = lane + 32 * j;
                    bvl = v[j];
                }
            const unsigned mk = redux_max_u32(bk);
            int bi = 0;  // only NaN left: stay in bounds, NaN shows downstream (as below)
            float bv = -INFINITY;
            if (mk != 0u) {  // warp-uniform
                bi = (int)redux_min_u32(bk == mk ? (unsigned)be : 0xffffffffu);
                bv = __shfl_sync(0xffffffffu, bvl, bi & 31);
            }
            pick(s, bi, bv);
#pragma unroll
            for (int j = 0; j < TOPK_LANE_MAX; ++j)
                if (lane + 32 * j == bi) {
                    v[j] = -INFINITY;
                    kk[j] = topk_key(-INFINITY);
                }
        }
    } else {
        for (int e = lane; e < n_experts; e += 32) vals[e] = (mb ? logit_take(mb, e) : __ldcg(logits + e));
        __syncwarp();
        for (int s = 0; s < k; ++s) {
            float bv = -INFINITY;
            int bi = 0x7fffffff;
            for (int e = lane; e < n_experts; e += 32) take_better(bv, bi, vals[e], e);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                take_better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
            if (bi >= n_experts) bi = 0;  // only NaN/-inf left: stay in bounds, NaN shows downstream
            pick(s, bi, bv);
            __syncwarp();
            if (lane == 0) vals[bi] = -INFINITY;
            __syncwarp();
        }
    }
    if (lane != 0) return;
    float sum = 0.0f;
    for (int s = 0; s < k; ++s) sum += expf(top_v[s] - top_v[0]);
    for (int s = 0; s < k; ++s) {
        idx[s] = top_i[s];
        weights[s] = expf(top_v[s] - top_v[0]) / sum;
    }
}

// One warp per row. NORM is a template parameter so each entry point is compiled for its own
// path: the folded norm costs registers the plain GEMV (o_proj) should not pay.
template <bool NORM>
__device__ __forceinline__ void gemv_rows(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
                                          const float* __restrict__ x, float* __restrict__ y,
                                          int rows, int cols, int tokens, int accumulate,
                                          const bf16_t* __restrict__ norm_w, float eps,
                                          float* __restrict__ x_out, int row, int lane) {
    const int t0 = blockIdx.y * GEMV_MAX_TOKENS;
    const int nt = min(GEMV_MAX_TOKENS, tokens - t0);
    if (row >= rows) return;
    const float* xt = x + (size_t)t0 * cols;
    float acc[GEMV_MAX_TOKENS], ss[GEMV_MAX_TOKENS], rs[GEMV_MAX_TOKENS];
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) acc[t] = ss[t] = 0.0f;
    // Each warp covers the whole row, so its own squares give the norm: no block sync.
    gemv_partial<NORM>(w + (size_t)row * cols, xt, norm_w, cols, nt, lane, 32, acc, ss);
    const float b = bias ? bf2f(bias[row]) : 0.0f;
#pragma unroll
    for (int t = 0; t < GEMV_MAX_TOKENS; ++t) {
        float s = warp_sum(acc[t]);
        rs[t] = NORM ? rsqrtf(warp_sum(ss[t]) / (float)cols + eps) : 1.0f;
        s *= rs[t];
        if (lane == 0 && t < nt) {
            float* yp = y + (size_t)(t0 + t) * rows + row;
            *yp = accumulate ? *yp + s + b : s + b;
        }
    }
    if (NORM && x_out && threadIdx.x < 32)
        write_normed_slice(xt, norm_w, x_out + (size_t)t0 * cols, cols, nt, rs, lane, 32);
}

// grid = (ceil(rows / 8), ceil(tokens / GEMV_MAX_TOKENS)), block = 256: the plain GEMV.
extern "C" __global__ void __launch_bounds__(256, GEMV_MINB)
gemv_bf16(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
          const float* __restrict__ x, float* __restrict__ y,
          int rows, int cols, int tokens, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
#if GEMV_PREFETCH
    if (row < rows && blockIdx.y == 0) prefetch_l2(w + (size_t)row * cols, (size_t)cols * 2, lane, 32);
#endif
    pdl_enter();
    gemv_rows<false>(w, bias, x, y, rows, cols, tokens, accumulate, nullptr, 0.0f, nullptr, row, lane);
}

// The same with RMSNorm(x) · norm_w as the input (qkv, lm_head); x_out may be null.
extern "C" __global__ void __launch_bounds__(256, GEMV_NORM_MINB)
gemv_bf16_norm(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
               const float* __restrict__ x, float* __restrict__ y,
               int rows, int cols, int tokens, int accumulate,
               const bf16_t* __restrict__ norm_w, float eps, float* __restrict__ x_out) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
#if GEMV_PREFETCH
    if (row < rows && blockIdx.y == 0) prefetch_l2(w + (size_t)row * cols, (size_t)cols * 2, lane, 32);
#endif
    pdl_enter();
    gemv_rows<true>(w, bias, x, y, rows, cols, tokens, accumulate, norm_w, eps, x_out, row, lane);
}

// grid = (ceil(rows / rpb), ceil(tokens / GEMV_MAX_TOKENS)), block = 256: gemv_bf16_wide
// one row a block (rpb = 1), gemv_bf16_wide_rows rpb (2 … GEMV_WIDE_R) rows a block, its
// threads splitting K, so each block reads its tokens' activations once for its rows (at 16
// tokens and one row a block, the router's blocks read 30 times as many activation bytes as
// weight bytes). A row's sums are the same in either. With topk_idx non-null (the router)
// the last block to finish a token group — counted in counter[blockIdx.y], which it resets
// to 0 for the next launch or graph replay — picks each token's top-k experts of the finished
// logits: topk_idx/topk_w [tokens, k]. Dynamic shared memory (with top-k):
// GEMV_MAX_TOKENS * rows floats, one copy of the logits per routing warp.
// Whether a wide GEMV folds a norm in: NORMC 1 always, 0 never, -1 as norm_w says. A macro
// (a bool variable, or an inline function, took 256 more instructions in gemv_bf16_wide).
#define WIDE_NORM (NORMC < 0 ? norm_w != nullptr : NORMC == 1)

// NT, NORMC, ANY_COLS: the one-token router entry (gemv_router_t1) compiles NT = 1, the norm
// always on (NORMC = 1; -1: as norm_w says) and no scalar loop for odd widths.
template <int R, int NT = GEMV_MAX_TOKENS, int NORMC = -1, bool ANY_COLS = true>
__device__ __forceinline__ void gemv_wide_body(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
                                               const float* __restrict__ x, float* __restrict__ y,
                                               int rows, int cols, int tokens, int accumulate,
                                               const bf16_t* __restrict__ norm_w, float eps,
                                               float* __restrict__ x_out, int* __restrict__ topk_idx,
                                               float* __restrict__ topk_w, int k,
                                               unsigned* __restrict__ counter,
                                               unsigned* __restrict__ ready,
                                               unsigned* __restrict__ done, int row0, int nr) {
    extern __shared__ float vals[];
    __shared__ float part[R + 1][NT][8];
    __shared__ float rs_s[NT];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = blockIdx.y * GEMV_MAX_TOKENS;
    const int nt = min(NT, tokens - t0);
    const float* xt = x + (size_t)t0 * cols;
    const bf16_t* wr = w + (size_t)row0 * cols;
    float acc[GEMV_WIDE_R][NT], ss[NT], rs[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        ss[t] = 0.0f;
#pragma unroll
        for (int j = 0; j < GEMV_WIDE_R; ++j) acc[j][t] = 0.0f;
    }
    // One token (the batch-1 router): read now what the block's last steps need, so they wait
    // on no load: the rows' biases and the thread's first element of the normalised input's
    // slice. (The several-token entries load them where they are used: at batch 8-16 the
    // early loads measured 0.2-0.3 % slower, docs/perf.md run 205.)
    float bpre[R];
#pragma unroll
    for (int j = 0; j < R; ++j) bpre[j] = NT == 1 && bias && j < nr ? bf2f(bias[row0 + j]) : 0.0f;
    int xo_c, xo_c1;
    normed_slice(cols, xo_c, xo_c1);
    xo_c += threadIdx.x;
    const bool xo_first = NT == 1 && WIDE_NORM && x_out && xo_c < xo_c1;
    float xo_x = 0.0f, xo_n = 0.0f;
    if (xo_first) {
        xo_x = xt[xo_c];
        xo_n = bf2f(norm_w[xo_c]);
    }
    if (ROUTER_AHEAD && NT > 1 && (cols & 7) == 0) {
        if (WIDE_NORM)
            gemv_partial_ahead<true, NT, R>(wr, nr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, acc, ss);
        else
            gemv_partial_ahead<false, NT, R>(wr, nr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, acc, ss);
    } else if (R == 1) {
        float (&a0)[NT] = acc[0];
        if (WIDE_NORM)
            gemv_partial<true, NT, ANY_COLS>(wr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, a0, ss);
        else
            gemv_partial<false, NT, ANY_COLS>(wr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, a0, ss);
    } else if (WIDE_NORM) {
        gemv_partial_rows<true, NT>(wr, nr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, acc, ss);
    } else {
        gemv_partial_rows<false, NT>(wr, nr, xt, norm_w, cols, nt, threadIdx.x, blockDim.x, acc, ss);
    }
    // One block reduction carries the dot products and the squares, for the group's nt tokens
    // only (nt and nr are uniform over the block: the shuffles of absent ones are skipped).
#pragma unroll
    for (int t = 0; t < NT; ++t) {
        if (t >= nt) break;
#pragma unroll
        for (int j = 0; j < R; ++j) {
            if (j >= nr) break;
            const float s = warp_sum(acc[j][t]);
            if (lane == 0) part[j][t][warp] = s;
        }
        const float q = WIDE_NORM ? warp_sum(ss[t]) : 0.0f;
        if (lane == 0) part[R][t][warp] = q;
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            if (t >= nt) break;
            const float q = warp_sum(lane < 8 ? part[R][t][lane] : 0.0f);
            const float r = WIDE_NORM ? rsqrtf(q / (float)cols + eps) : 1.0f;
            if (lane == 0) rs_s[t] = r;
#pragma unroll
            for (int j = 0; j < R; ++j) {
                if (j >= nr) break;
                const float s = warp_sum(lane < 8 ? part[j][t][lane] : 0.0f);
                const float b = NT == 1 ? bpre[j] : bias ? bf2f(bias[row0 + j]) : 0.0f;
                if (lane == 0) {
                    float* yp = y + (size_t)(t0 + t) * rows + row0 + j;
                    const float v = accumulate ? *yp + s * r + b : s * r + b;
                    *yp = v;
                    if (NT == 1 && ROUTER_POLL && topk_idx) logit_post(counter, row0 + j, v);
                    if (NT > 1 && ROUTER_POLL_N && topk_idx)
                        logit_post(counter + 2 * (size_t)(t0 + t) * rows, row0 + j, v);
                }
            }
        }
    }
    __syncthreads();
    // With several tokens and a top-k, the block counts itself before it writes its slice of
    // the normalised input, so the group's last block starts routing one L2 round trip sooner;
    // there the routing warps (one a token) leave the slice to the others.
    constexpr bool XO_AFTER = ROUTER_XO_AFTER && NT > 1;
    if (XO_AFTER && topk_idx) {
        // ROUTER_POLL_N: block 0 routes from the mailbox (no count, so no barrier to publish
        // one: the one above already ordered rs_s).
        __shared__ unsigned last_a;
        if (!ROUTER_POLL_N) {
            if (threadIdx.x == 0) last_a = count_block_last(&counter[blockIdx.y], gridDim.x);
            __syncthreads();
        }
        const bool route = ROUTER_POLL_N ? blockIdx.x == 0 : last_a != 0u;
        if (route && warp < nt) {
            topk_softmax_warp(y + (size_t)(t0 + warp) * rows, rows, k, topk_idx + (size_t)(t0 + warp) * k,
                              topk_w + (size_t)(t0 + warp) * k, vals + warp * rows,
                              ready ? ready + (size_t)(t0 + warp) * k : nullptr,
                              ready ? done + (size_t)(t0 + warp) * k : nullptr,
                              ROUTER_POLL_N ? counter + 2 * (size_t)(t0 + warp) * rows : nullptr);
            return;
        }
        if (WIDE_NORM && x_out) {
            // (token, column) pairs of the slice flattened over the writing threads: one round
            // trip for the whole slice (a loop per token made one a token).
            const int first = route ? nt * 32 : 0;
            int c0, c1;
            normed_slice(cols, c0, c1);
            const int wd = max(0, c1 - c0);
            for (int i = (int)threadIdx.x - first; i < nt * wd; i += (int)blockDim.x - first) {
                const int t = i / wd, c = c0 + i % wd;
                x_out[(size_t)(t0 + t) * cols + c] = xt[(size_t)t * cols + c] * rs_s[t] * bf2f(norm_w[c]);
            }
        }
        return;
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) rs[t] = t < nt ? rs_s[t] : 1.0f;
    if (WIDE_NORM && x_out) {
        if (NT == 1) {  // write_normed_slice, its first element from the early loads
            float* xo = x_out + (size_t)t0 * cols;
            if (xo_first) xo[xo_c] = xo_x * rs[0] * xo_n;
            write_normed<NT>(xt, norm_w, xo, cols, nt, rs, xo_c + blockDim.x, xo_c1, blockDim.x);
        } else {
            write_normed_slice<NT>(xt, norm_w, x_out + (size_t)t0 * cols, cols, nt, rs, threadIdx.x, blockDim.x);
        }
    }
    if (!topk_idx) return;
    // Publish this block's logits, then count it; the last block of the group routes, one
    // warp per token (in parallel: a token's top-k is a serial chain of warp reductions). One
    // token (ROUTER_POLL): no count; block 0's warp routes from the mailbox as the logits come.
    constexpr bool POLL = NT == 1 ? ROUTER_POLL : ROUTER_POLL_N;
    __shared__ unsigned last_s;
    if (threadIdx.x == 0) last_s = POLL ? blockIdx.x == 0 : count_block_last(&counter[blockIdx.y], gridDim.x);
    __syncthreads();
    if (!last_s) return;
    if (warp < nt)
        topk_softmax_warp(y + (size_t)(t0 + warp) * rows, rows, k, topk_idx + (size_t)(t0 + warp) * k,
                          topk_w + (size_t)(t0 + warp) * k, vals + warp * rows,
                          ready ? ready + (size_t)(t0 + warp) * k : nullptr,
                          ready ? done + (size_t)(t0 + warp) * k : nullptr,
                          !POLL ? nullptr : NT == 1 ? counter : counter + 2 * (size_t)(t0 + warp) * rows);
}

#undef WIDE_NORM

// The _late entries (the router from ROUTER_LATE_FROM rows, ops.rs) let the next kernel (the
// MoE's gate_up) launch only when this grid ends (pdl_enter_as(2)); the others at its start.
#define GEMV_WIDE_ENTRY(name, R, NT, NORMC, ANY_COLS, MODE)                                     \
    extern "C" __global__ void __launch_bounds__(256, GEMV_MINB)                                \
    name(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,                         \
         const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int tokens,    \
         int accumulate, const bf16_t* __restrict__ norm_w, float eps,                          \
         float* __restrict__ x_out, int* __restrict__ topk_idx, float* __restrict__ topk_w,     \
         int k, unsigned* __restrict__ counter, int rpb, unsigned* __restrict__ ready,          \
         unsigned* __restrict__ done) {                                                         \
        const int rpb_ = max(1, min(rpb, R));                                                   \
        const int row0 = blockIdx.x * rpb_, nr = min(rpb_, rows - row0);                        \
        if (GEMV_PREFETCH && blockIdx.y == 0) prefetch_l2(w + (size_t)row0 * cols, (size_t)nr * cols * 2, threadIdx.x, blockDim.x); \
        param_touch(blockDim.x, norm_w, topk_w, ready);                                         \
        pdl_enter_as(MODE);                                                                     \
        gemv_wide_body<R, NT, NORMC, ANY_COLS>(w, bias, x, y, rows, cols, tokens, accumulate,  \
                                               norm_w, eps, x_out, topk_idx, topk_w, k, counter, \
                                               ready, done, row0, nr);                          \
    }
GEMV_WIDE_ENTRY(gemv_bf16_wide, 1, GEMV_MAX_TOKENS, -1, true, ROUTER_TRIGGER)
// The router of one token (batch 1), cols a multiple of 8: the same sums as gemv_bf16_wide,
// from a third of its code (docs/perf.md run 195: code the hot path jumps over costs time).
GEMV_WIDE_ENTRY(gemv_router_t1, 1, 1, 1, false, ROUTER_TRIGGER)
GEMV_WIDE_ENTRY(gemv_bf16_wide_rows, GEMV_WIDE_R, GEMV_MAX_TOKENS, -1, true, ROUTER_TRIGGER)
GEMV_WIDE_ENTRY(gemv_bf16_wide_late, 1, GEMV_MAX_TOKENS, -1, true, 2)
GEMV_WIDE_ENTRY(gemv_bf16_wide_rows_late, GEMV_WIDE_R, GEMV_MAX_TOKENS, -1, true, 2)

// The router of a prefill chunk: logits[t, e] = W[e, :] . x[t, :] + b[e] for many tokens, then
// each token's top-k and softmax (topk_softmax_warp), in one launch. A block takes RR_TM tokens
// and all experts, RR_TE at a time, through K in chunks of RR_TK staged in shared memory as
// fp32, k-major (x as is, W widened from bf16); each thread sums 2 tokens x 4 experts in fp32,
// k in ascending order (the same order for every token, whatever its block: deterministic).
// The next chunk's 16-byte loads are issued into registers before the current chunk's sums.
// The decode router (gemv_bf16_wide) reads its weights once per 4 tokens, which at 2048 tokens
// re-reads them 512 times; here once per RR_TM. Then the block's 8 warps route its tokens from
// the logits it wrote (visible to the block after the barrier).
// grid = ceil(tokens / RR_TM), block = 256; dynamic shared memory: 8 * experts floats (the
// routing scratch). cols a multiple of 8 (the host checks); experts any.
#define RR_TM 16
#define RR_TE 128
#define RR_TK 64
// Per thread and chunk: RR_TE * RR_TK / 8 / 256 = 4 weight words (8 bf16 each) and
// RR_TM * RR_TK / 4 / 256 = 1 activation float4.
#define RR_WV 4
extern "C" __global__ void __launch_bounds__(256)
router_rows(const bf16_t* __restrict__ w, const bf16_t* __restrict__ bias,
            const float* __restrict__ x, float* __restrict__ logits, int experts, int cols,
            int tokens, int* __restrict__ topk_idx, float* __restrict__ topk_w, int k) {
    extern __shared__ float vals[];
    __shared__ float xs[RR_TK][RR_TM + 1];
    __shared__ float ws[RR_TK][RR_TE + 1];
    pdl_enter();
    const int tid = threadIdx.x, tx = tid & 31, ty = tid >> 5;
    const int t0 = blockIdx.x * RR_TM;
    // This thread's staging: weight words (row tid / 8 + 32 u, columns 8 (tid % 8) …) and one
    // activation float4 (row tid / 16, columns 4 (tid % 16) …).
    const int wr = tid >> 3, wc = (tid & 7) * 8, xr = tid >> 4, xc = (tid & 15) * 4;
    uint4 wv[RR_WV];
    float4 xv;
    auto load = [&](int e0, int c0) {
#pragma unroll
        for (int u = 0; u < RR_WV; ++u) {
            const int e = e0 + wr + 32 * u, c = c0 + wc;
            wv[u] = e < experts && c < cols
                        ? __ldg(reinterpret_cast<const uint4*>(w + (size_t)e * cols + c))
                        : make_uint4(0u, 0u, 0u, 0u);
        }
        const int t = t0 + xr, c = c0 + xc;
        xv = t < tokens && c < cols ? *reinterpret_cast<const float4*>(x + (size_t)t * cols + c)
                                    : make_float4(0.f, 0.f, 0.f, 0.f);
    };
    auto store = [&]() {
#pragma unroll
        for (int u = 0; u < RR_WV; ++u) {
            float f[8];
            bf16x8_to_f32(wv[u], f);
#pragma unroll
            for (int j = 0; j < 8; ++j) ws[wc + j][wr + 32 * u] = f[j];
        }
        xs[xc][xr] = xv.x;
        xs[xc + 1][xr] = xv.y;
        xs[xc + 2][xr] = xv.z;
        xs[xc + 3][xr] = xv.w;
    };
    for (int e0 = 0; e0 < experts; e0 += RR_TE) {
        float acc[2][4] = {};
        load(e0, 0);
        for (int c0 = 0; c0 < cols; c0 += RR_TK) {
            store();
            __syncthreads();
            if (c0 + RR_TK < cols) load(e0, c0 + RR_TK);
#pragma unroll 8
            for (int c = 0; c < RR_TK; ++c) {
                float xa[2], wa[4];
#pragma unroll
                for (int i = 0; i < 2; ++i) xa[i] = xs[c][ty * 2 + i];
#pragma unroll
                for (int j = 0; j < 4; ++j) wa[j] = ws[c][tx + 32 * j];
#pragma unroll
                for (int i = 0; i < 2; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xa[i], wa[j], acc[i][j]);
            }
            __syncthreads();
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const int t = t0 + ty * 2 + i;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int e = e0 + tx + 32 * j;
                if (t < tokens && e < experts)
                    logits[(size_t)t * experts + e] = acc[i][j] + (bias ? bf2f(bias[e]) : 0.0f);
            }
        }
    }
    __syncthreads();
    for (int r = ty; r < RR_TM; r += 8) {
        const int t = t0 + r;
        if (t >= tokens) break;  // warp-uniform
        topk_softmax_warp(logits + (size_t)t * experts, experts, k, topk_idx + (size_t)t * k,
                          topk_w + (size_t)t * k, vals + ty * experts, nullptr, nullptr);
    }
}
