// Dense projections in MXFP4 (`--mxfp4-layers moe,qkv,o[,lm_head]`): attention qkv and o (and
// the lm_head) quantized from bf16 at load, on the device, then multiplied in that format.
// Blocks [rows, cols/32, 16] u8 and scales [rows, cols/32] UE8M0, as the experts; the blocks'
// 32-bit words in the bf16 layout (common.cuh `fp4b_to_bf16x2`, made at load by
// `mxfp4_word_layout`): every kernel here and the tensor-core GEMVs of gemv_tc.cu read that
// layout, which holds scales up to 2^1 (a matrix with a larger one is refused at load).
//
// mxfp4_quantize_bf16: the quantizer (in the checkpoint's layout, before the bf16 one),
//   bit-identical to the host's (src/engine/mxfp4.rs, which documents the definition once):
//   per block of 32, the scale exponent is the smallest e with amax <= 6 * 2^e (from amax's
//   float bits), each value the nearest E2M1 code of v / 2^e, ties to the even code,
//   saturating at 6.
// mxfp4_word_layout: the blocks' words into a layout (the bf16 one here; the experts' fp16 one).
// gemv_mxfp4: decode GEMV, the features of gemv_bf16 (bias, accumulate, fused RMSNorm, up to
//   FP4_GEMV_TOKENS tokens per weight pass) with the activations staged in padded shared memory.
// gemm_mxfp4_tc: prefill GEMM on tensor cores, the weights dequantized to bf16 in shared memory
//   one TC_BK stage at a time (fp4_stage_store), never a bf16 copy of the matrix.
#define FP4_GEMV_TOKENS 4
#define FP4_GEMV_ROWS 8

// ---- Quantizer --------------------------------------------------------------------------

// E8M0 scale byte of a block whose largest finite magnitude has float bits amax_bits.
__device__ __forceinline__ unsigned mxfp4_scale_byte(unsigned amax_bits) {
    if (amax_bits == 0u) return 127u;  // all-zero block: the fixed scale 2^0
    int e = (int)(amax_bits >> 23) - 129 + ((amax_bits & 0x7fffffu) > 0x400000u ? 1 : 0);
    e = min(max(e, -127), 127);
    return (unsigned)(e + 127);
}

// E2M1 code (sign in bit 3) of v under the block scale unit = 2^e: the number of midpoints
// |v| passes, a midpoint whose upper code is even also counting when hit exactly. The
// midpoints times 2^e are exact f32 products (or +inf), as on the host.
__device__ __forceinline__ unsigned e2m1_code(float v, float unit) {
    const float a = fabsf(v);
    const unsigned m = (a > 0.25f * unit ? 1u : 0u) + (a >= 0.75f * unit ? 1u : 0u) +
                       (a > 1.25f * unit ? 1u : 0u) + (a >= 1.75f * unit ? 1u : 0u) +
                       (a > 2.5f * unit ? 1u : 0u) + (a >= 3.5f * unit ? 1u : 0u) +
                       (a > 5.0f * unit ? 1u : 0u);
    return m | ((__float_as_uint(v) >> 31) << 3);
}

// Quantize nblocks consecutive blocks of 32 bf16 (a row-major [rows, cols] matrix with cols a
// multiple of 32 is exactly that) into blocks [nblocks, 16] and scales [nblocks]; one thread
// per block, grid-stride. Non-finite inputs are counted into *nonfinite (the loader refuses
// the tensor then). src must be 16-byte aligned.
extern "C" __global__ void mxfp4_quantize_bf16(const bf16_t* __restrict__ src, u8* __restrict__ blocks,
                                               u8* __restrict__ scales, unsigned long long nblocks,
                                               unsigned* __restrict__ nonfinite) {
    pdl_enter();
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long b = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; b < nblocks;
         b += stride) {
        const uint4* s4 = reinterpret_cast<const uint4*>(src) + 4 * b;
        unsigned w[16];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const uint4 v = __ldg(s4 + i);
            w[4 * i] = v.x; w[4 * i + 1] = v.y; w[4 * i + 2] = v.z; w[4 * i + 3] = v.w;
        }
        unsigned amax = 0u, bad = 0u;
#pragma unroll
        for (int i = 0; i < 32; ++i) {
            const unsigned m = (w[i >> 1] >> (16 * (i & 1))) & 0x7fffu;
            if (m >= 0x7f80u) ++bad;
            else amax = max(amax, m);
        }
        const unsigned sc = mxfp4_scale_byte(amax << 16);
        const float unit = e8m0_value(sc);
        unsigned out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            unsigned o = 0u;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int el = 8 * k + i;
                const float v = __uint_as_float(((w[el >> 1] >> (16 * (el & 1))) & 0xffffu) << 16);
                o |= e2m1_code(v, unit) << (4 * i);
            }
            out[k] = o;
        }
        reinterpret_cast<uint4*>(blocks)[b] = make_uint4(out[0], out[1], out[2], out[3]);
        scales[b] = (u8)sc;
        if (bad) atomicAdd(nonfinite, bad);
    }
}

// A word layout of MXFP4 blocks (the experts' fp16 one, fp4l_to_f16x2 in common.cuh; the dense
// matrices' bf16 one, fp4b_to_bf16x2), made in place once at load: stored bit k of each 32-bit
// word is the parity of masks[k] & (the word in the standard layout). masks: 32 words (ops.rs
// builds them as the inverse of the layout's decode map). Grid-stride.
extern "C" __global__ void mxfp4_word_layout(unsigned* __restrict__ w, unsigned long long n,
                                             const unsigned* __restrict__ masks) {
    pdl_enter();
    __shared__ unsigned m[32];
    if (threadIdx.x < 32) m[threadIdx.x] = masks[threadIdx.x];
    __syncthreads();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned v = w[i];
        unsigned o = 0u;
#pragma unroll
        for (int k = 0; k < 32; ++k) o |= (__popc(m[k] & v) & 1u) << k;
        w[i] = o;
    }
}

// ---- Decode GEMV ------------------------------------------------------------------------

// Stage tokens t0 .. t0 + nt of x (or their RMSNorm · norm_w, also written to x_out by block
// 0) into padded shared memory: token t's group g of 32 at xs + t * (cols / 32) * STAGE_PAD +
// g * STAGE_PAD. x is read from global memory once (stage_padded); the norm then rescales the
// staged values in place, with the arithmetic of a stand-alone RMSNorm. Whole block must call
// it.
__device__ __forceinline__ void fp4_stage_input(const float* __restrict__ x,
                                                const bf16_t* __restrict__ norm_w, float eps,
                                                float* __restrict__ x_out, int cols, int t0, int nt,
                                                float* xs) {
    __shared__ float scratch[32];
    const int tstride = (cols >> 5) * STAGE_PAD;
    for (int t = 0; t < nt; ++t) stage_padded(x + (size_t)(t0 + t) * cols, xs + t * tstride, cols);
    if (norm_w) {
        __syncthreads();
        for (int t = 0; t < nt; ++t) {
            float* st = xs + t * tstride;
            float ss = 0.0f;
            for (int c = threadIdx.x; c < cols; c += blockDim.x) {
                const float v = st[(c >> 5) * STAGE_PAD + (c & 31)];
                ss += v * v;
            }
            ss = block_sum(ss, scratch);
            const float r = rsqrtf(ss / (float)cols + eps);
            for (int c = threadIdx.x; c < cols; c += blockDim.x) {
                float* p = st + (c >> 5) * STAGE_PAD + (c & 31);
                const float v = *p * r * bf2f(norm_w[c]);
                *p = v;
                if (blockIdx.x == 0 && x_out) x_out[(size_t)(t0 + t) * cols + c] = v;
            }
        }
    }
    __syncthreads();
}

// acc[t] += the 32-element block q (scale byte sc) . the staged activations of token t at
// xb + t * tstride, for t < nt; the nibbles are decoded (and scaled, exactly) once for all
// tokens.
__device__ __forceinline__ void fp4_block_dot_tokens(uint4 q, unsigned sc, const float* xb, int tstride,
                                                     int nt, float (&acc)[FP4_GEMV_TOKENS]) {
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    const unsigned s2 = fp4_scale_bf16x2<FP4_BF16L>(sc);
    float part[FP4_GEMV_TOKENS];
#pragma unroll
    for (int t = 0; t < FP4_GEMV_TOKENS; ++t) part[t] = 0.0f;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
        unsigned p[4];
        fp4_bf16x2<FP4_BF16L>(wq[wi], p);
        float f[8];
        bf16x8_to_f32(make_uint4(bf16x2_mul(p[0], s2), bf16x2_mul(p[1], s2), bf16x2_mul(p[2], s2),
                                 bf16x2_mul(p[3], s2)),
                      f);
#pragma unroll
        for (int t = 0; t < FP4_GEMV_TOKENS; ++t) {
            if (t < nt) {
                const float4* x4 = reinterpret_cast<const float4*>(xb + t * tstride) + 2 * wi;
                const float4 a = x4[0], b = x4[1];
                part[t] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w +
                           f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
            }
        }
    }
#pragma unroll
    for (int t = 0; t < FP4_GEMV_TOKENS; ++t) acc[t] += part[t];
}

// y[t, r] (+)= W[r, :] . in[t, :] + b[r], in = x or RMSNorm(x) · norm_w (then also written to
// x_out by block 0). grid = (ceil(rows / FP4_GEMV_ROWS), ceil(tokens / FP4_GEMV_TOKENS)),
// block = 256: one warp per row, its lanes striding over the row's 32-element blocks, two
// blocks per lane in flight (the first loaded before the staging). Dynamic shared memory:
// min(tokens, FP4_GEMV_TOKENS) * cols / 32 * STAGE_PAD floats. cols must be a multiple of 32.
extern "C" __global__ void __launch_bounds__(256, GEMV_MINB)
gemv_mxfp4(const u8* __restrict__ blocks, const u8* __restrict__ scales,
           const bf16_t* __restrict__ bias, const float* __restrict__ x, float* __restrict__ y,
           int rows, int cols, int tokens, int accumulate, const bf16_t* __restrict__ norm_w,
           float eps, float* __restrict__ x_out) {
    extern __shared__ float xs[];
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * FP4_GEMV_ROWS + (threadIdx.x >> 5);
#if GEMV_PREFETCH
    if (row < rows && blockIdx.y == 0) prefetch_l2(blocks + (size_t)row * (cols >> 5) * 16, (size_t)(cols >> 5) * 16, lane, 32);
#endif
    pdl_enter();
    const int t0 = blockIdx.y * FP4_GEMV_TOKENS;
    const int nt = min(FP4_GEMV_TOKENS, tokens - t0);
    const int nb = cols >> 5;
    const bool live = row < rows;
    const uint4* wb = reinterpret_cast<const uint4*>(blocks) + (size_t)(live ? row : 0) * nb;
    const u8* ws = scales + (size_t)(live ? row : 0) * nb;
    uint4 nq[2];
    unsigned ns[2];
    auto fetch = [&](int slot, int b) {
        if (live && b < nb) {
            nq[slot] = __ldg(wb + b);
            ns[slot] = ws[b];
        }
    };
    fetch(0, lane);
    fetch(1, lane + 32);
    fp4_stage_input(x, norm_w, eps, x_out, cols, t0, nt, xs);
    if (!live) return;
    const int tstride = nb * STAGE_PAD;
    float acc[FP4_GEMV_TOKENS];
#pragma unroll
    for (int t = 0; t < FP4_GEMV_TOKENS; ++t) acc[t] = 0.0f;
    for (int b0 = lane; b0 < nb; b0 += 64) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            const int b = b0 + 32 * slot;
            if (b < nb) {
                const uint4 q = nq[slot];
                const unsigned sc = ns[slot];
                fetch(slot, b + 64);
                fp4_block_dot_tokens(q, sc, xs + b * STAGE_PAD, tstride, nt, acc);
            }
        }
    }
    const float bv = bias ? bf2f(bias[row]) : 0.0f;
#pragma unroll
    for (int t = 0; t < FP4_GEMV_TOKENS; ++t) {
        const float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) {
            float* yp = y + (size_t)(t0 + t) * rows + row;
            *yp = accumulate ? *yp + s + bv : s + bv;
        }
    }
}

// ---- Prefill GEMM on tensor cores ---------------------------------------------------------

// y[m, n] (+)= sum_k x[m, k] W[n, k] + b[n]: fp32 activations x [M, K] rounded to bf16 on
// their way into shared memory, MXFP4 weights W [N, K] (blocks [N, K/32, 16], scales
// [N, K/32]) dequantized to bf16 in shared memory (exact), fp32 accumulation and output;
// accumulate != 0 adds into y. K must be a multiple of 32 (= TC_BK: one MXFP4 block per row
// and stage). grid = (ceil(N / TC_BN), ceil(M / TC_BM)), block = 256.
extern "C" __global__ void __launch_bounds__(256, TC_MINB)
gemm_mxfp4_tc(const float* __restrict__ x, const u8* __restrict__ blocks,
              const u8* __restrict__ scales, const bf16_t* __restrict__ bias,
              float* __restrict__ y, int M, int N, int K, int accumulate) {
    pdl_enter();
    __shared__ __align__(16) bf16_t As[2][TC_BM * TC_LD];
    __shared__ __align__(16) bf16_t Bs[2][TC_BN * TC_LD];
    const int tid = threadIdx.x;
    const int m0 = blockIdx.y * TC_BM, n0 = blockIdx.x * TC_BN;
    // This thread's load assignments: a quarter row of A, half a block of one weight row.
    const int arow = tid >> 2, aq = tid & 3;
    const int brow = tid >> 1, bh = tid & 1;
    const int nb = K >> 5;
    const float* asrc = m0 + arow < M ? x + (size_t)(m0 + arow) * K : nullptr;
    const int n = n0 + brow;
    const uint2* wq = n < N ? reinterpret_cast<const uint2*>(blocks) + (size_t)n * nb * 2 : nullptr;
    const u8* wsc = n < N ? scales + (size_t)n * nb : nullptr;
    float acc[2][4][4] = {};
    float4 ar[2][2];  // [register set] (tc_mainloop)
    uint2 bq[2];
    unsigned bs[2];
    auto load = [&](int ks, int set) {
        tc_load_act(asrc ? asrc + ks * TC_BK : nullptr, aq, ar[set]);
        fp4_stage_load(wq, wsc, ks, bh, bq[set], bs[set]);
    };
    auto store = [&](int s, int set) {
        tc_store_act(As[s], arow, aq, ar[set]);
        fp4_stage_store<FP4_BF16L>(Bs[s], brow, bh, bq[set], bs[set]);
    };
    tc_mainloop(nb, load, store, As, Bs, acc);
    tc_epilogue(acc, [&](int r, int c, float v0, float v1) {
        if (m0 + r < M) tc_store_pair(y, bias, N, m0 + r, n0 + c, v0, v1, accumulate);
    });
}
