// MoE for decode: only the k routed experts' MXFP4 weights are read.
// MXFP4 layout (checkpoint order): blocks [E, rows, cols/32, 16] u8, byte j of a block holds
// element 2j in the low nibble and 2j+1 in the high nibble; scales [E, rows, cols/32] UE8M0.
// gate_up rows interleave gate (even) and linear (odd) units; bias bf16 [E, rows].
//
// Each lane multiplies whole 32-element blocks, so it needs 32 consecutive activations; read
// from global memory, a warp's 32 lanes would touch 32 different cache lines per load. The
// activations are therefore staged once per thread block in shared memory (stage_padded in
// common.cuh), each group of 32 padded to STAGE_PAD floats.
// Dot product of one 32-element MXFP4 block with 32 staged activations (scale applied by the
// caller).
__device__ __forceinline__ float fp4_block_dot(uint4 q, const float* xs) {
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
        float f[8];
        fp4x8_to_f32(wq[wi], f);
        const float4 a = x4[2 * wi], b = x4[2 * wi + 1];
        s += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w +
             f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
    }
    return s;
}

// ---- Activation formats (`--activation`). Each kernel body below is a template over a policy
// that stages a block's activations in shared memory (`stage`) and dots one MXFP4 block with
// one staged group of 32 (`dot`, returning the sum scaled by the activation's scale; the
// weight's scale is the caller's):
// * ActF32 (`bf16`, the reference path): fp32 copies padded to STAGE_PAD floats per group.
// * ActQ8 (llama.cpp style): int8 codes q = rint(x / d), d = amax / 127 per group, dotted by
//   __dp4a with the weights decoded to int8 as twice their E2M1 value; the int32 sum is scaled
//   by d / 2 (stored halved).
// * ActFp8: FP8 E4M3 codes of x / d, d = amax / 448 per group (round to nearest even,
//   saturating), multiplied by the fp32-decoded weights in fp32.
// The 8-bit groups take ACT8_PAD bytes (32 codes + 16 padding: a lane's two 16-byte reads of
// group b, at 48 b, fall in distinct banks for the 8 lanes of a phase), followed by one fp32
// scale per group. A lane then reads 36 bytes of shared memory per group instead of 128.
//
// Where the quantization happens: each block quantizes its own staged copy. The staging reads
// the fp32 row once per block anyway, and the per-group amax is a 3-step shuffle over the 8
// lanes holding a group, so quantizing there adds a few instructions per staged element; a
// separate quantize kernel would add two launches (graph nodes) per layer and a global round
// trip of the codes, and would need a second buffer. The blocks all compute bit-identical
// codes from the same fp32 inputs with the same IEEE operations (division, reciprocal,
// round-to-nearest-even), which the host mirrors exactly (src/engine/cuda/quant.rs).
#define ACT8_PAD 48
// The fp16 dot (ActF16): a group of 32 fp16 codes takes F16_PAD bytes (64 + 16 padding: the
// 8 lanes of a phase reading group b at 80 b fall in distinct banks), then one fp32 scale per
// group. Codes are x / D · F16_CODE_SCALE with |x / D| <= 1 (at most 2^15, below fp16's
// 65 504); the weights are read in the fp16 layout (fp4l_to_f16x2: E2M1 · 2^-14), so a product
// is at most 6 · 2 and an fp16 accumulator of 16 of them at most 192; a code stays normal down
// to 2^-29 of the group's amax. The stored scale carries the weights' 2^14 back:
// D / F16_CODE_SCALE · F16_W_INV.
#define F16_PAD 80
#define F16_CODE_SCALE 32768.0f
#define F16_W_INV 16384.0f

// Largest code magnitude of each 8-bit format, and the smallest scale d quantized normally:
// below it (amax < QMAX * 2^-126, or amax = 0) 1/d would overflow, and the group's codes are 0.
#define Q8_MAX 127.0f
#define FP8_MAX 448.0f
#define ACT8_MIN_SCALE 0x1p-126f

// max that returns NaN if either input is NaN (sm_80+), so a NaN activation poisons its
// group's scale (and the output) instead of vanishing.
__device__ __forceinline__ float fmax_nan(float a, float b) {
    float r;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Four values (already divided by d) to int8 codes, round to nearest even (a NaN gives 0).
__device__ __forceinline__ unsigned q8_pack4(float a, float b, float c, float e) {
    auto q = [](float v) {
        const int r = __float2int_rn(v);
        return (unsigned)min(max(r, -127), 127) & 0xffu;
    };
    return q(a) | (q(b) << 8) | (q(c) << 16) | (q(e) << 24);
}

// Four values (already divided by d) to E4M3 codes, round to nearest even, saturating to
// ±448 (sm_89+); the value given as the instruction's second operand lands in the low byte.
__device__ __forceinline__ unsigned e4m3_pack4(float a, float b, float c, float e) {
    unsigned short lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(b), "f"(a));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(e), "f"(c));
    return (unsigned)lo | ((unsigned)hi << 16);
}

// The per-group quantizers the staging below takes: each turns a group's amax into the scale
// stored after the groups (`stored`) and the multiplier the values are coded with (`inv`),
// and stores one lane's 4 coded values.
// * Q8Codes / E4M3Codes: d = amax / QMAX; 4 one-byte codes a lane; stored d / 2 (q8) or d.
// * F16Codes: D = the smallest power of two >= amax (at least 2^-100), the values coded as the
//   fp16 of x / D · F16_CODE_SCALE, 4 two-byte codes a lane; stored D / F16_CODE_SCALE ·
//   F16_W_INV (the weights' fp16 layout decodes them times 2^-14). A NaN
//   amax stores NaN and an infinite one infinity, so the output shows it.
struct Q8Codes {
    static constexpr int PAD = ACT8_PAD, LANE_BYTES = 4;
    static __device__ __forceinline__ void scale(float m, float& stored, float& inv) {
        const float d = m / Q8_MAX;
        inv = d >= ACT8_MIN_SCALE ? 1.0f / d : 0.0f;
        stored = 0.5f * d;
    }
    static __device__ __forceinline__ void store(u8* p, float4 x, float id) {
        *reinterpret_cast<unsigned*>(p) = q8_pack4(x.x * id, x.y * id, x.z * id, x.w * id);
    }
};
struct E4M3Codes {
    static constexpr int PAD = ACT8_PAD, LANE_BYTES = 4;
    static __device__ __forceinline__ void scale(float m, float& stored, float& inv) {
        const float d = m / FP8_MAX;
        inv = d >= ACT8_MIN_SCALE ? 1.0f / d : 0.0f;
        stored = d;
    }
    static __device__ __forceinline__ void store(u8* p, float4 x, float id) {
        *reinterpret_cast<unsigned*>(p) = e4m3_pack4(x.x * id, x.y * id, x.z * id, x.w * id);
    }
};
struct F16Codes {
    static constexpr int PAD = F16_PAD, LANE_BYTES = 8;
    static __device__ __forceinline__ void scale(float m, float& stored, float& inv) {
        // Round amax's bits up to the next power of two (m already one: itself); NaN and
        // infinity keep their exponent field, so D is infinite and stored NaN or infinite.
        const unsigned b = __float_as_uint(m);
        float d = __uint_as_float((b + 0x007fffffu) & 0x7f800000u);
        d = fmaxf(d, 0x1p-100f);
        if (m != m) d = m;
        stored = d * (F16_W_INV / F16_CODE_SCALE);
        // F16_CODE_SCALE / d by the exponent (d = 2^(E - 127), E in [27, 254]: 2^(142 - E + 127)),
        // the same value as the division without its ~10 instructions and slow-path call: 0
        // for an infinite D, NaN for a NaN one.
        static_assert(F16_CODE_SCALE == 32768.0f, "the exponent below is 2^15's");
        const unsigned e = __float_as_uint(d) >> 23;  // d > 0: no sign bit
        inv = e < 255u ? __uint_as_float((269u - e) << 23) : (d != d ? d : 0.0f);
    }
    static __device__ __forceinline__ void store(u8* p, float4 x, float id) {
        *reinterpret_cast<uint2*>(p) = make_uint2(f16x2_rn(x.x * id, x.y * id), f16x2_rn(x.z * id, x.w * id));
    }
};

// Quantize n fp32 (n a multiple of 32) into groups of 32 codes by Q: codes at g * Q::PAD,
// the fp32 scales after the ng = n / 32 groups. Whole block must call it; each warp takes 4
// groups per step, 8 lanes per group, 4 consecutive values per lane, and issues the loads of
// up to ACT8_STEPS steps before quantizing any (gpt-oss: 3 steps).
#define ACT8_STEPS 4
// One lane's four values x of group gi (lanes 8 apart share a group): the group's scale from
// their largest magnitude, then the codes.
template <class Q>
__device__ __forceinline__ void stage_quad(u8* sm, float* scale, int gi, int ng, int sub, float4 x) {
    float m = fmax_nan(fmax_nan(fabsf(x.x), fabsf(x.y)), fmax_nan(fabsf(x.z), fabsf(x.w)));
    m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, 2));
    m = fmax_nan(m, __shfl_xor_sync(0xffffffffu, m, 4));
    float stored, id;
    Q::scale(m, stored, id);
    if (gi < ng) {
        Q::store(sm + gi * Q::PAD + Q::LANE_BYTES * sub, x, id);
        if (sub == 0) scale[gi] = stored;
    }
}
template <class Q>
__device__ __forceinline__ void stage_groups(const float* __restrict__ src, u8* sm, int n) {
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const int stride = (blockDim.x >> 5) * 4;  // groups per step of the whole block
    const int ng = n >> 5;
    float* scale = reinterpret_cast<float*>(sm + ng * Q::PAD);
    for (int g0 = (threadIdx.x >> 5) * 4; g0 < ng; g0 += stride * ACT8_STEPS) {
        float4 v[ACT8_STEPS];
#pragma unroll
        for (int u = 0; u < ACT8_STEPS; ++u) {
            const int gi = g0 + u * stride + (lane >> 3);
            v[u] = gi < ng ? __ldcg(reinterpret_cast<const float4*>(src) + gi * 8 + sub)
                           : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < ACT8_STEPS; ++u) {
            if (g0 + u * stride >= ng) break;  // warp-uniform
            stage_quad<Q>(sm, scale, g0 + u * stride + (lane >> 3), ng, sub, v[u]);
        }
    }
}

// stage_groups of RMSNorm(src) · nw (nw bf16; x · rs · w, the order the router writes its
// normalised copy in, rs = 1 / rms): where one step of loads covers the row (n up to 4096 at
// 256 threads) the values and their norm weights are loaded once, the sum of squares taken
// from the registers; longer rows are read twice.
template <class Q>
__device__ __forceinline__ void stage_groups_norm(const float* __restrict__ src, u8* sm, int n,
                                                  const bf16_t* __restrict__ nw, float eps) {
    const int lane = threadIdx.x & 31, sub = lane & 7;
    const int stride = (blockDim.x >> 5) * 4;
    const int ng = n >> 5;
    float* scale = reinterpret_cast<float*>(sm + ng * Q::PAD);
    const int g0 = (threadIdx.x >> 5) * 4;
    if (ng > stride * ACT8_STEPS) {
        const float rs = block_rms_inv(src, n, eps);
        for (int g = g0; g < ng; g += stride) {
            const int gi = g + (lane >> 3);
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (gi < ng) x = norm4(__ldcg(reinterpret_cast<const float4*>(src) + gi * 8 + sub), nw, rs, 32 * gi + 4 * sub);
            stage_quad<Q>(sm, scale, gi, ng, sub, x);
        }
        return;
    }
    __shared__ float norm_part[32];
    float4 v[ACT8_STEPS];
    uint2 w[ACT8_STEPS];
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < ACT8_STEPS; ++u) {
        const int gi = g0 + u * stride + (lane >> 3);
        v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        w[u] = make_uint2(0u, 0u);
        if (gi < ng) {
            v[u] = __ldcg(reinterpret_cast<const float4*>(src) + gi * 8 + sub);
            w[u] = *reinterpret_cast<const uint2*>(nw + 32 * gi + 4 * sub);
        }
    }
#pragma unroll
    for (int u = 0; u < ACT8_STEPS; ++u)
        ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    const float rs = rsqrtf(block_sum(ss, norm_part) / (float)n + eps);
#pragma unroll
    for (int u = 0; u < ACT8_STEPS; ++u) {
        if (g0 + u * stride >= ng) break;  // warp-uniform
        stage_quad<Q>(sm, scale, g0 + u * stride + (lane >> 3), ng, sub, norm4w(v[u], w[u], rs));
    }
}

// Eight MXFP4 elements (one 32-bit word, element i in bits 4i..4i+3) as int8 twice their E2M1
// value (0, ±1, ±2, ±3, ±4, ±6, ±8, ±12): elements 0-3 in lo, 4-7 in hi, element order kept.
// The magnitudes are looked up in a positive and a negative table by PRMT, and a third PRMT
// per word picks each byte from one of them by its sign bit.
__device__ __forceinline__ void fp4x8_to_i8x8(unsigned w, int& lo, int& hi) {
    const unsigned p0 = 0x03020100u, p1 = 0x0C080604u;  // 0 1 2 3 | 4 6 8 12
    const unsigned n0 = 0xFDFEFF00u, n1 = 0xF4F8FAFCu;  // 0 -1 -2 -3 | -4 -6 -8 -12
    const unsigned m = w & 0x77777777u, mh = m >> 16;
    // Selector nibble j = j + 4 · sign_j (bit 3 of the element's nibble moved to bit 2).
    const unsigned s = (w >> 1) & 0x44444444u;
    const unsigned pl = __byte_perm(p0, p1, m), nl = __byte_perm(n0, n1, m);
    const unsigned ph = __byte_perm(p0, p1, mh), nh = __byte_perm(n0, n1, mh);
    lo = (int)__byte_perm(pl, nl, 0x3210u | (s & 0xffffu));
    hi = (int)__byte_perm(ph, nh, 0x3210u | (s >> 16));
}

// Four E4M3 codes (byte j = element j) as fp32 times 2^-120, exactly: the code's exponent and
// mantissa bits placed under the fp32 exponent field (bias 127 instead of 7), subnormal codes
// becoming fp32 subnormals. Integer operations only (no conversion unit); callers multiply
// the sum by 2^120. NaN codes do not occur (satfinite; a NaN input makes the scale NaN).
__device__ __forceinline__ void e4m3x4_to_f32_2m120(unsigned w, float (&f)[4]) {
    f[0] = __uint_as_float((unsigned)((int)(w << 24) >> 4) & 0x87f00000u);
    f[1] = __uint_as_float((unsigned)((int)(w << 16) >> 4) & 0x87f00000u);
    f[2] = __uint_as_float((unsigned)((int)(w << 8) >> 4) & 0x87f00000u);
    f[3] = __uint_as_float((unsigned)((int)w >> 4) & 0x87f00000u);
}

// fp32 activations, as staged since the first MoE kernels.
struct ActF32 {
    static __device__ __forceinline__ void stage(const float* __restrict__ src, u8* sm, int n) {
        stage_padded(src, reinterpret_cast<float*>(sm), n);
    }
    // RMSNorm(src) · nw: the row read twice, for its sum of squares and for the copy.
    static __device__ __forceinline__ void stage_norm(const float* __restrict__ src, u8* sm, int n,
                                                      const bf16_t* __restrict__ nw, float eps) {
        stage_padded(src, reinterpret_cast<float*>(sm), n, nw, block_rms_inv(src, n, eps));
    }
    static __device__ __forceinline__ float dot(uint4 q, const u8* sm, int b, int) {
        return fp4_block_dot(q, reinterpret_cast<const float*>(sm) + b * STAGE_PAD);
    }
};

struct ActQ8 {
    static __device__ __forceinline__ void stage(const float* __restrict__ src, u8* sm, int n) {
        stage_groups<Q8Codes>(src, sm, n);
    }
    static __device__ __forceinline__ void stage_norm(const float* __restrict__ src, u8* sm, int n,
                                                      const bf16_t* __restrict__ nw, float eps) {
        stage_groups_norm<Q8Codes>(src, sm, n, nw, eps);
    }
    // nb: groups staged (where the scales start).
    static __device__ __forceinline__ float dot(uint4 q, const u8* sm, int b, int nb) {
        const uint4* a = reinterpret_cast<const uint4*>(sm + b * ACT8_PAD);
        const uint4 a0 = a[0], a1 = a[1];
        const unsigned aw[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const unsigned wq[4] = {q.x, q.y, q.z, q.w};
        int s = 0;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
            int lo, hi;
            fp4x8_to_i8x8(wq[wi], lo, hi);
            s = __dp4a(lo, (int)aw[2 * wi], s);
            s = __dp4a(hi, (int)aw[2 * wi + 1], s);
        }
        // |s| <= 32 * 12 * 127 < 2^24: exact in fp32.
        return (float)s * reinterpret_cast<const float*>(sm + nb * ACT8_PAD)[b];
    }
};

struct ActFp8 {
    static __device__ __forceinline__ void stage(const float* __restrict__ src, u8* sm, int n) {
        stage_groups<E4M3Codes>(src, sm, n);
    }
    static __device__ __forceinline__ void stage_norm(const float* __restrict__ src, u8* sm, int n,
                                                      const bf16_t* __restrict__ nw, float eps) {
        stage_groups_norm<E4M3Codes>(src, sm, n, nw, eps);
    }
    static __device__ __forceinline__ float dot(uint4 q, const u8* sm, int b, int nb) {
        const uint4* a = reinterpret_cast<const uint4*>(sm + b * ACT8_PAD);
        const uint4 a0 = a[0], a1 = a[1];
        const unsigned aw[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const unsigned wq[4] = {q.x, q.y, q.z, q.w};
        float s = 0.0f;
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
            float f[8], x0[4], x1[4];
            fp4x8_to_f32(wq[wi], f);
            e4m3x4_to_f32_2m120(aw[2 * wi], x0);
            e4m3x4_to_f32_2m120(aw[2 * wi + 1], x1);
            s += f[0] * x0[0] + f[1] * x0[1] + f[2] * x0[2] + f[3] * x0[3] +
                 f[4] * x1[0] + f[5] * x1[1] + f[6] * x1[2] + f[7] * x1[3];
        }
        // Every product is exact (4 × 2 significant bits); 2^120 undoes the decode's offset.
        return s * 0x1p120f * reinterpret_cast<const float*>(sm + nb * ACT8_PAD)[b];
    }
};

// fp16 codes of x / D per group (F16Codes), dotted with the weights (in the experts' fp16
// layout) decoded to fp16 pairs (fp4l_to_f16x2) by fma.f16x2: two accumulators of 8 products
// per half (words 0-1 and 2-3), added and widened to fp32 once per block. About half the
// instructions per weight of ActF32 (no widening of the weights to fp32, two products per
// instruction); fp16 products and sums keep 11 significant bits where bf16 activations keep 8.
struct ActF16 {
    static __device__ __forceinline__ void stage(const float* __restrict__ src, u8* sm, int n) {
        stage_groups<F16Codes>(src, sm, n);
    }
    static __device__ __forceinline__ void stage_norm(const float* __restrict__ src, u8* sm, int n,
                                                      const bf16_t* __restrict__ nw, float eps) {
        stage_groups_norm<F16Codes>(src, sm, n, nw, eps);
    }
    static __device__ __forceinline__ float dot(uint4 q, const u8* sm, int b, int nb) {
        const uint4* a = reinterpret_cast<const uint4*>(sm + b * F16_PAD);
        const unsigned wq[4] = {q.x, q.y, q.z, q.w};
        unsigned acc[2] = {0u, 0u};
#pragma unroll
        for (int wi = 0; wi < 4; ++wi) {
            const uint4 xa = a[wi];
            unsigned h[4];
            fp4l_to_f16x2(wq[wi], h);
            unsigned& c = acc[wi >> 1];
            c = f16x2_fma(h[0], xa.x, c);
            c = f16x2_fma(h[1], xa.y, c);
            c = f16x2_fma(h[2], xa.z, c);
            c = f16x2_fma(h[3], xa.w, c);
        }
        return f16x2_hsum(f16x2_add(acc[0], acc[1])) * reinterpret_cast<const float*>(sm + nb * F16_PAD)[b];
    }
};

// The grouped kernels' fp16 dot: one MXFP4 block q decoded once and dotted with group b of
// each of NT tokens (token i's staging at sm + i * stride, as ActF16 stages one token); out[i]
// += the sum times its activation scale times ws. Per token the same operations in the same
// order as ActF16::dot, so each token's sums are bit-identical to the one-token kernels'. NT
// is the exact token count (the kernels dispatch on it): no per-token branches in the loop.
template <int NT>
__device__ __forceinline__ void f16_dot_n(uint4 q, const u8* sm, int stride, int b, int nb,
                                          float ws, float (&out)[NT]) {
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    unsigned acc[NT][2];
#pragma unroll
    for (int i = 0; i < NT; ++i) acc[i][0] = acc[i][1] = 0u;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
        unsigned h[4];
        fp4l_to_f16x2(wq[wi], h);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const uint4 xa = reinterpret_cast<const uint4*>(sm + i * stride + b * F16_PAD)[wi];
            unsigned& c = acc[i][wi >> 1];
            c = f16x2_fma(h[0], xa.x, c);
            c = f16x2_fma(h[1], xa.y, c);
            c = f16x2_fma(h[2], xa.z, c);
            c = f16x2_fma(h[3], xa.w, c);
        }
    }
#pragma unroll
    for (int i = 0; i < NT; ++i) {
        const float xd = reinterpret_cast<const float*>(sm + i * stride + nb * F16_PAD)[b];
        out[i] += f16x2_hsum(f16x2_add(acc[i][0], acc[i][1])) * xd * ws;
    }
}

// The dynamic shared memory of the decode MoE kernels (the policy's staged activations).
extern __shared__ float moe_smem[];

// The `_slots` kernels' weights: a unit's two rows (row 0 at bw, row 1 nb blocks further; unit
// uu at 2 uu nb) as MOE_SLOTS_NI fixed slots of 32-block items per lane, item i at block
// lane + 32 i (the host launches these kernels only for ni <= MOE_SLOTS_NI).
//
// Knobs for the loop's instruction count (the same sums in the same order whichever is set;
// docs/perf.md session 38). MOE_SLOTS_PTR 1: where a row has exactly MOE_SLOTS_NI items (ni, as
// 120b's and 20b's 90 blocks), items 0 … ni − 2 lie inside the row for every lane, so their
// loads are the unit's pointer plus a constant and only the last item's offset is clamped;
// otherwise (and with 0) each load's offset is computed and clamped, ~45 instructions of 64-bit
// arithmetic a unit (the grouped kernels keep that loop: the second one made them spill).
// MOE_SCALE_LUT 1: the UE8M0 scales through a 256-entry table in shared memory (an index and a
// load) instead of e8m0_value's shift, two compares and two selects; the table holds
// e8m0_value's values. Two ways of removing the ~30 moves a unit that copy the next unit's
// slots back (its loads, hoisted above the sums, take fresh registers) were slower: the unit
// loop unrolled by two with two banks of slots, and each slot loaded after its sums (runs
// 290, 292).
#ifndef MOE_SLOTS_PTR
#define MOE_SLOTS_PTR 1
#endif
#ifndef MOE_SCALE_LUT
#define MOE_SCALE_LUT 1
#endif
// MOE_SLOTS_FULL_IN 1: in MOE_SLOTS_PTR's loop the sums of items 0 … ni − 2 run without the
// in-row test (they are in the row for every lane), only the last item's under it.
#ifndef MOE_SLOTS_FULL_IN
#define MOE_SLOTS_FULL_IN 1
#endif
#if MOE_SCALE_LUT
__shared__ float moe_e8m0_lut[256];
#endif
// Fills the scale table: every kernel using MoeSlots, before the __syncthreads that follows its
// staging (blocks of 256 threads).
__device__ __forceinline__ void moe_scales_fill() {
#if MOE_SCALE_LUT
    moe_e8m0_lut[threadIdx.x & 255] = e8m0_value(threadIdx.x & 255);
#endif
}
__device__ __forceinline__ float moe_scale(unsigned s) {
#if MOE_SCALE_LUT
    return moe_e8m0_lut[s];
#else
    return e8m0_value(s);
#endif
}

struct MoeSlots {
    const uint4* bw;
    const u8* sw;
    int nb, ni, lane;
    uint4 w0[MOE_SLOTS_NI], w1[MOE_SLOTS_NI];
    unsigned s0[MOE_SLOTS_NI], s1[MOE_SLOTS_NI];

    // Unconditional loads: a block past the row's end (b >= nb: item i's lanes beyond the row,
    // or an item past ni) loads the row's last block instead, which the sums skip. A predicated
    // load would have to keep the slot's old words in its destination, so the compiler copied
    // every slot before reloading it (~10 moves an item).
    template <bool FULL>
    __device__ __forceinline__ void load(int uu, int i) {
        if constexpr (FULL) {
            // The unit's rows as pointers, the items' blocks as constant offsets from them
            // (the last item's clamped: off_last).
            const int o = 2 * uu * nb;
            const uint4* p0 = bw + o;
            const uint4* p1 = p0 + nb;
            const u8* q0 = sw + o;
            const u8* q1 = q0 + nb;
            const int d = i < MOE_SLOTS_NI - 1 ? 32 * i : off_last();
            w0[i] = __ldg(p0 + d);
            w1[i] = __ldg(p1 + d);
            s0[i] = q0[d];
            s1[i] = q1[d];
        } else {
            const size_t o = 2 * (size_t)uu * nb + min(32 * i, nb - 1 - lane);
            w0[i] = __ldg(bw + o);
            w1[i] = __ldg(bw + o + nb);
            s0[i] = sw[o];
            s1[i] = sw[o + nb];
        }
    }
    __device__ __forceinline__ void load_unit(int uu) {
#pragma unroll
        for (int i = 0; i < MOE_SLOTS_NI; ++i) load<false>(uu, i);
    }
    // Whether item i's block b (lane + 32 i) is in the row: with FULL (MOE_SLOTS_FULL_IN) every
    // item but the last is, for every lane, with no test or branch.
    template <bool FULL>
    __device__ __forceinline__ bool in_row(int i, int b) const {
        if (MOE_SLOTS_FULL_IN && FULL && i < MOE_SLOTS_NI - 1) return true;
        return i < ni && b < nb;
    }
    // The last item's block from the lane's, clamped to the row's last block.
    __device__ __forceinline__ int off_last() const {
        return min(32 * (MOE_SLOTS_NI - 1), nb - 1 - lane);
    }
    // The lane's partial sums of unit uu's two rows against the staged activations xs, in item
    // order as the item sequence sums them; item i of unit uu + 1 is loaded into slot i as soon
    // as the slot is consumed, so the warp streams its units (the last unit reloads itself, from
    // L1, rather than branch around the loads).
    template <class A, bool FULL>
    __device__ __forceinline__ void sums(const u8* xs, int uu, int nu, float& t0, float& t1) {
        t0 = t1 = 0.0f;
#pragma unroll
        for (int i = 0; i < MOE_SLOTS_NI; ++i) {
            const uint4 c0 = w0[i], c1 = w1[i];
            const unsigned cs0 = s0[i], cs1 = s1[i];
            load<FULL>(min(uu + 1, nu - 1), i);
            const int b = lane + 32 * i;
            if (in_row<FULL>(i, b)) {
                t0 += A::dot(c0, xs, b, nb) * moe_scale(cs0);
                t1 += A::dot(c1, xs, b, nb) * moe_scale(cs1);
            }
        }
    }
    // sums with FULL from a flag (slots_each's `full`, a constant in each of its loops).
    template <class A>
    __device__ __forceinline__ void sums_at(bool full, const u8* xs, int uu, int nu, float& t0, float& t1) {
        if (full) sums<A, true>(xs, uu, nu, t0, t1);
        else sums<A, false>(xs, uu, nu, t0, t1);
    }
    // sums for NT tokens of fp16 codes staged stride bytes apart (f16_dot_n): each block
    // decoded once for all of them; per token the same sums in the same order as sums<ActF16>.
    template <int NT>
    __device__ __forceinline__ void sums_n(const u8* xs, int stride, int uu, int nu,
                                           float (&t0)[NT], float (&t1)[NT]) {
#pragma unroll
        for (int j = 0; j < NT; ++j) t0[j] = t1[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < MOE_SLOTS_NI; ++i) {
            const uint4 c0 = w0[i], c1 = w1[i];
            const unsigned cs0 = s0[i], cs1 = s1[i];
            load<false>(min(uu + 1, nu - 1), i);
            const int b = lane + 32 * i;
            if (i < ni && b < nb) {
                f16_dot_n<NT>(c0, xs, stride, b, nb, moe_scale(cs0), t0);
                f16_dot_n<NT>(c1, xs, stride, b, nb, moe_scale(cs1), t1);
            }
        }
    }
};

// f(uu, full) for the warp's units uu = 0 … nu − 1: full true (a constant in that loop, which
// f passes on to sums_at) in a loop for rows of exactly MOE_SLOTS_NI items where w's rows have
// them (MOE_SLOTS_PTR), else false. (The grouped kernels loop over their units directly, on
// the general loop: a second one made them spill.)
//
// Which of the two loops a kernel holds (LOOPS): SLOTS_BOTH, the one its rows take at run
// time; SLOTS_FULL, only the full-row loop (the host launches such a kernel only for rows of
// exactly MOE_SLOTS_NI items); SLOTS_GENERAL, only the other. A loop a kernel holds but does
// not run still costs its launches time (the branch jumps over its ~500 instructions: ~0.6 %
// of a batch-1 step, docs/perf.md run 366), so the fp16 dot's kernels come one per loop.
#define SLOTS_BOTH 0
#define SLOTS_FULL 1
#define SLOTS_GENERAL 2
template <int LOOPS, class F>
__device__ __forceinline__ void slots_each(const MoeSlots& w, int nu, const F& f) {
    if (LOOPS == SLOTS_FULL && w.ni != MOE_SLOTS_NI) __trap();  // the host's mistake: loudly
#if MOE_SLOTS_PTR
    if (LOOPS == SLOTS_FULL || (LOOPS == SLOTS_BOTH && w.ni == MOE_SLOTS_NI)) {
        for (int uu = 0; uu < nu; ++uu) f(uu, true);
        return;
    }
#endif
    for (int uu = 0; uu < nu; ++uu) f(uu, false);
}

// The per-pair kernels' unit epilogue (`_slots` and grouped). Each unit ends with its two
// rows' sums over the warp; with MOE_LANE_EPI 1 (the default) the lane of the unit's index
// in the warp (at most 32 units a warp, MOE_MAX_UNITS) keeps them in two registers, and once
// the warp's units are done every lane finishes its own unit, all at once: gate_up's bias,
// SwiGLU and act store, down's bias, weighting and part or mailbox store. With 0 lane 0
// finished each unit as it ended, the other 31 lanes idle through its SwiGLU, the bias
// shuffles and the store: ~40 of the 499 SASS instructions of gate_up's unit loop (sm_90a:
// 499 -> 462, down 480 -> 461). The same operations on the same values, so the same bits.
// (Summing the two rows in one butterfly, each half of the warp keeping one row from the
// first level on, took 5 more instructions off a unit, measured no faster and spilled in
// the grouped gate_up: docs/perf.md run 412.)
#ifndef MOE_LANE_EPI
#define MOE_LANE_EPI 1
#endif
struct LaneUnits {
    float m0 = 0.0f, m1 = 0.0f;
    // Unit uu's two row partials a and b of this lane (every lane takes part).
    __device__ __forceinline__ void put(float a, float b, int uu, int lane) {
        a = warp_sum(a);
        b = warp_sum(b);
        if (lane == uu) {
            m0 = a;
            m1 = b;
        }
    }
};

// The warp's nu units summed against the staged xs, each unit's sums kept by its lane.
template <class A, int LOOPS>
__device__ __forceinline__ LaneUnits lane_units(MoeSlots& w, const u8* xs, int nu, int lane) {
    LaneUnits lu;
    slots_each<LOOPS>(w, nu, [&](int uu, bool full) {
        float a, b;
        w.sums_at<A>(full, xs, uu, nu, a, b);
        lu.put(a, b, uu, lane);
    });
    return lu;
}

// The `_slots` kernels' share of n units (gate_up's row pairs, down's pairs of output rows)
// for the block's warp: units u0 … u1 - 1, the n spread evenly over the grid's 8 gridDim.y
// warps of a pair, so a grid sized to whole waves of the slots (ops::moe_ranges: more blocks
// than n / (8 units)) gives every warp its share rather than leaving the last blocks short;
// where 8 gridDim.y units is n (down's grids) it is units w units … w units + units - 1.
// A row's sums do not depend on the warp that makes them.
// 32-bit products: the host keeps 8 gridDim.y within n + 7 (at most a unit a warp) and n below
// 2^16 (MoeShape::check).
__device__ __forceinline__ unsigned slots_at(unsigned w, unsigned n) {
    return w * n / (gridDim.y * 8u);
}
__device__ __forceinline__ void slots_share(int n, int& u0, int& u1) {
    const unsigned w = blockIdx.y * 8 + (threadIdx.x >> 5);
    u0 = (int)slots_at(w, n);
    u1 = (int)slots_at(w + 1, n);
}

// Grid order of both kernels: the (token, slot) pairs p = t * k + s are blockIdx.x, the row
// ranges blockIdx.y, so the blocks launched together are every pair's blocks of one row range:
// pairs routed to the same expert (at batch 16, 64 pairs name ~50 distinct experts) read the
// same rows at about the same time, and all but the first find them in L2. With the row range
// fastest, a shared expert's second read came one pair's whole matrix (8.8 MB for 120b's
// gate_up) or more after the first, mostly evicted.
//
// act[t, s, j] = swiglu(gate_j, lin_j) for expert idx[t, s]; grid = (T k, ceil(I / (8 U))),
// block = 256, U = `units`: each warp owns U consecutive units j (rows 2j and 2j + 1, read
// against one staged x), so one staging of x serves 16 U weight rows. The lanes stride over a
// row's 32-element blocks (item i: block lane + 32 i); the warp walks its units' items in one
// sequence with two items in flight, the next unit's first loads issued while the current one
// finishes, so the pipeline does not drain between units. The first loads are issued before
// the staging. Dynamic shared memory: the policy's staged x (ActF32: hidden / 32 * STAGE_PAD
// floats; 8-bit: hidden / 32 * (ACT8_PAD + 4) bytes). units <= 32 (a lane holds one unit's bias).
// norm_w null: x is the router's normalised copy; non-null (the decode step, with the router's
// announcements): x is the residual, which each block normalises itself before its wait.
template <class A, bool SLOTS, int LOOPS>
__device__ __forceinline__ void moe_gate_up_body(const u8* __restrict__ blocks,
                                                 const u8* __restrict__ scales,
                                                 const bf16_t* __restrict__ bias,
                                                 const float* __restrict__ x,
                                                 const int* __restrict__ idx,
                                                 float* __restrict__ act, int inter, int hidden,
                                                 int k, float limit, float alpha, int units,
                                                 const unsigned* __restrict__ ready,
                                                 unsigned* __restrict__ done,
                                                 const bf16_t* __restrict__ norm_w, float eps) {
    u8* xs = reinterpret_cast<u8*>(moe_smem);
    const int lane = threadIdx.x & 31;
    int j0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * units, ju = min(inter, j0 + units);
    if constexpr (SLOTS) slots_share(inter, j0, ju);
    const int s = blockIdx.x % k, t = blockIdx.x / k;
    // With norm_w, x is the residual stream itself, which the kernel before the router (o's
    // projection, its residual add) wrote: complete before the router passed its wait, and so
    // before this grid launched. The block normalises it (RMSNorm · norm_w, as the router's
    // normalised copy) and stages it first, before the announcement and the wait, which then
    // guards nothing the sums read; without norm_w, x is the router's normalised copy, staged
    // after the wait.
    if (norm_w) A::stage_norm(x + (size_t)t * hidden, xs, hidden, norm_w, eps);
    // With `ready` the router announces each pair's expert (moe_ready_wait): the block takes it
    // and issues its first weight loads before its wait, which then only guards the staged x.
    int e;
    if (ready) {
        e = moe_ready_wait(ready + t * k + s);
    } else {
        pdl_enter_as(GATE_UP_TRIGGER);
        e = idx[t * k + s];
    }
    const int nb = hidden >> 5, ni = (nb + 31) >> 5;
    const size_t rows = 2 * (size_t)inter;
    const uint4* be = reinterpret_cast<const uint4*>(blocks) + (size_t)e * rows * nb;
    const u8* se = scales + (size_t)e * rows * nb;
    // Lane u holds unit u's biases (read with the first weights, used at the unit's end).
    const int jb = j0 + lane;
    const bool bl = lane < ju - j0;
    const float bgate = bl ? bf2f(bias[(size_t)e * rows + 2 * jb]) : 0.0f;
    const float blin = bl ? bf2f(bias[(size_t)e * rows + 2 * jb + 1]) : 0.0f;
    if constexpr (SLOTS) {
        // All of a unit's items in flight at once (MoeSlots); the same sums in the same order
        // as the item sequence below.
        const int nu = ju - j0;  // this warp's units (none for a tail warp)
        MoeSlots w{be + 2 * (size_t)j0 * nb + lane, se + 2 * (size_t)j0 * nb + lane, nb, ni, lane};
        if (nu > 0) w.load_unit(0);
        moe_scales_fill();
        if (ready) pdl_enter_as(GATE_UP_TRIGGER);
        if (!norm_w) A::stage(x + (size_t)t * hidden, xs, hidden);
        __syncthreads();
#if MOE_LANE_EPI
        const LaneUnits lu = lane_units<A, LOOPS>(w, xs, nu, lane);
        if (bl) act[((size_t)t * k + s) * inter + jb] = swiglu_clamped(lu.m0 + bgate, lu.m1 + blin, limit, alpha);
#else
        slots_each<LOOPS>(w, nu, [&](int uu, bool full) {
            float g, l;
            w.sums_at<A>(full, xs, uu, nu, g, l);
            g = warp_sum(g);
            l = warp_sum(l);
            const float bg = __shfl_sync(0xffffffffu, bgate, uu);
            const float bli = __shfl_sync(0xffffffffu, blin, uu);
            if (lane == 0)
                act[((size_t)t * k + s) * inter + j0 + uu] = swiglu_clamped(g + bg, l + bli, limit, alpha);
        });
#endif
        if (done) moe_count_done(done + blockIdx.x);
        return;
    }
    uint4 ng[2], nl[2];
    unsigned nsg[2], nsl[2];
    int fu = 0, fi = 0;  // the next item to load: unit fu, item fi
    auto fetch = [&](int slot) {
        const int j = j0 + fu, b = lane + 32 * fi;
        if (fu < units && j < inter && b < nb) {
            const size_t o = 2 * (size_t)j * nb + b;
            ng[slot] = __ldg(be + o);
            nl[slot] = __ldg(be + o + nb);
            nsg[slot] = se[o];
            nsl[slot] = se[o + nb];
        }
        if (++fi == ni) {
            fi = 0;
            ++fu;
        }
    };
    fetch(0);
    fetch(1);
    if (ready) pdl_enter_as(GATE_UP_TRIGGER);
    if (!norm_w) A::stage(x + (size_t)t * hidden, xs, hidden);
    __syncthreads();
    const int total = units * ni;
    int cu = 0, ci = 0;  // the item consumed: unit cu, item ci
    float g = 0.0f, l = 0.0f;
    for (int f = 0; f < total; f += 2) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            if (f + slot >= total) break;  // warp-uniform
            const int j = j0 + cu, b = lane + 32 * ci;
            const uint4 cg = ng[slot], cl = nl[slot];
            const unsigned csg = nsg[slot], csl = nsl[slot];
            fetch(slot);
            if (j < inter && b < nb) {
                g += A::dot(cg, xs, b, nb) * e8m0_value(csg);
                l += A::dot(cl, xs, b, nb) * e8m0_value(csl);
            }
            if (++ci == ni) {  // the unit's last item: finish it (warp-uniform)
                g = warp_sum(g);
                l = warp_sum(l);
                const float bg = __shfl_sync(0xffffffffu, bgate, cu);
                const float bli = __shfl_sync(0xffffffffu, blin, cu);
                if (lane == 0 && j < inter)
                    act[((size_t)t * k + s) * inter + j] = swiglu_clamped(g + bg, l + bli, limit, alpha);
                g = l = 0.0f;
                ci = 0;
                ++cu;
            }
        }
    }
    if (done) moe_count_done(done + blockIdx.x);
}

#define MOE_GATE_UP_KERNEL(name, policy, slots, loops, minb)                                   \
    extern "C" __global__ void __launch_bounds__(256, minb)                                     \
    name(const u8* __restrict__ blocks, const u8* __restrict__ scales,                          \
         const bf16_t* __restrict__ bias, const float* __restrict__ x,                          \
         const int* __restrict__ idx, float* __restrict__ act, int inter, int hidden, int k,    \
         float limit, float alpha, int units, const unsigned* __restrict__ ready,               \
         unsigned* __restrict__ done, const bf16_t* __restrict__ norm_w, float eps) {          \
        moe_gate_up_body<policy, slots, loops>(blocks, scales, bias, x, idx, act, inter, hidden,\
                                               k, limit, alpha, units, ready, done, norm_w,     \
                                               eps);                                            \
    }
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu, ActF32, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_q8, ActQ8, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_fp8, ActFp8, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_slots, ActF32, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_q8_slots, ActQ8, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_fp8_slots, ActFp8, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_h2, ActF16, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_h2_slots, ActF16, true, SLOTS_GENERAL, MOE_SLOTS_MINB)
MOE_GATE_UP_KERNEL(moe_gate_up_swiglu_h2_slots_full, ActF16, true, SLOTS_FULL, MOE_SLOTS_MINB)

// y[t, r] (+)= the k slots' rows part[t, s, r] summed in slot order, for rows r0 <= r < r1
// (the whole block strides over them): the down kernels' combine, by the last slot block of a
// (row range, token) once every slot's rows are visible (read past L1).
#ifndef MOE_COMBINE_Y_FIRST
#define MOE_COMBINE_Y_FIRST 1
#endif
__device__ __forceinline__ void moe_combine_rows(const float* __restrict__ part,
                                                 float* __restrict__ y, int t, int k, int hidden,
                                                 int r0, int r1, int accumulate) {
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
        float* o = y + (size_t)t * hidden + r;
        // The output it adds to is loaded with the slots' rows: ptxas had issued it after their
        // sums, one L2 round trip more at the end of every down (MOE_COMBINE_Y_FIRST 0: so).
        const float prev = MOE_COMBINE_Y_FIRST && accumulate ? *o : 0.0f;
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += __ldcg(part + ((size_t)t * k + j) * hidden + r);
        *o = accumulate ? (MOE_COMBINE_Y_FIRST ? prev : *o) + sum : sum;
    }
}

// The `_slots` down kernels' combine without a count (`mail` non-null): each slot block posts
// its weighted rows into a mailbox of 64-bit words, {value bits, 1}, word (t k + s) H + r
// (common.cuh's mail_ words), and returns; the last slot's block (s = k − 1) of
// a (row range, token) polls every slot's word of each of its rows in one round of loads,
// sums them in slot order and adds the output as moe_combine_rows does (the same bits), then
// zeroes the words for the next launch. No count and no reload of the rows: the combine
// begins one round trip after the last slot's rows land, not two (the count's atomic, then
// the reload). No deadlock: the slot blocks of a (row range, token) are consecutive in the
// grid's order, the combining one last, so the blocks it polls for were dispatched before
// it. A word that never fills traps after MOE_POLL_LIMIT polls.
#define MOE_MAIL_SLOTS 8
__device__ __forceinline__ void moe_combine_mail(unsigned* __restrict__ mail, float* __restrict__ y,
                                                 int t, int k, int hidden, int r0, int r1,
                                                 int accumulate) {
    for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x) {
        float* o = y + (size_t)t * hidden + r;
        const float prev = accumulate ? *o : 0.0f;
        float sum = 0.0f;
        for (int j0 = 0; j0 < k; j0 += MOE_MAIL_SLOTS) {
            const int n = min(MOE_MAIL_SLOTS, k - j0);
            unsigned* w0 = mail + 2 * (((size_t)t * k + j0) * hidden + r);
            const size_t ws = 2 * (size_t)hidden;  // u32s from one slot's word to the next's
            unsigned lo[MOE_MAIL_SLOTS], need = (1u << n) - 1u, polls = 0;
            while (need) {
                unsigned v[MOE_MAIL_SLOTS], f[MOE_MAIL_SLOTS];
#pragma unroll
                for (int j = 0; j < MOE_MAIL_SLOTS; ++j) {
                    f[j] = 0u;
                    if (need >> j & 1u) mail_peek(w0 + j * ws, v[j], f[j]);
                }
#pragma unroll
                for (int j = 0; j < MOE_MAIL_SLOTS; ++j)
                    if ((need >> j & 1u) && f[j]) {
                        lo[j] = v[j];
                        need &= ~(1u << j);
                    }
                if (++polls == MOE_POLL_LIMIT) __trap();
            }
#pragma unroll
            for (int j = 0; j < MOE_MAIL_SLOTS; ++j)
                if (j < n) {
                    sum += __uint_as_float(lo[j]);
                    mail_clear(w0 + j * ws);
                }
        }
        *o = accumulate ? prev + sum : sum;
    }
}

// part[t, s, r] = w[t, s] * (W2_e[r, :] . act[t, s, :] + b2_e[r]) for e = idx[t, s] (the down
// bias inside the weighted sum), then y[t, r] (+)= the k slots' rows summed in slot order
// (deterministic, as moe_combine): the last of the k slot blocks of a (row range, token) to
// finish — counted in ctr[t * gridDim.y + blockIdx.y], which it resets to 0 for the next launch
// or graph replay — adds them, so the combine costs no launch of its own. grid = (T k, ceil(H / (16 U))), block = 256, U = `units`: each warp
// owns U units of two adjacent output rows (one staged activation read serves both), walked
// as one item sequence with two items in flight as in moe_gate_up_body. One block per (rows,
// slot) keeps the staged activations small (I floats). The first weights are loaded before
// the staging. Dynamic shared memory: the policy's staged activations of one slot (ActF32:
// inter / 32 * STAGE_PAD floats; 8-bit: inter / 32 * (ACT8_PAD + 4) bytes). units <= 32.
// The down kernel's start on its pair's gate_up count (gu_blocks blocks; moe_await_done), in
// place of the wait on gate_up's grid: then the trigger the wait would have given.
#define MOE_DOWN_AWAIT()                                                      \
    do {                                                                      \
        moe_await_done(done + blockIdx.x, (unsigned)gu_blocks);               \
        if (DOWN_TRIGGER == 0 && !PDL_NO_TRIGGER) pdl_trigger();              \
    } while (0)

template <class A, bool SLOTS, int LOOPS>
__device__ __forceinline__ void moe_down_body(const u8* __restrict__ blocks,
                                              const u8* __restrict__ scales,
                                              const bf16_t* __restrict__ bias,
                                              const float* __restrict__ act,
                                              const int* __restrict__ idx,
                                              const float* __restrict__ wts,
                                              float* __restrict__ part, int hidden, int inter,
                                              int k, int units, float* __restrict__ y,
                                              int accumulate, unsigned* __restrict__ ctr,
                                              unsigned* __restrict__ ready,
                                              const unsigned* __restrict__ done, int gu_blocks,
                                              unsigned* __restrict__ mail) {
    u8* as = reinterpret_cast<u8*>(moe_smem);
    const int lane = threadIdx.x & 31;
    // The warp's first row and its units (row pairs): the `_slots` kernels by slots_share.
    int p0 = (blockIdx.y * 8 + (threadIdx.x >> 5)) * units, p1 = min((hidden + 1) / 2, p0 + units);
    if constexpr (SLOTS) slots_share(hidden / 2, p0, p1);
    const int rw = 2 * p0;
    const int s = blockIdx.x % k, t = blockIdx.x / k;
#if !MOE_DOWN_EARLY
    pdl_enter_as(DOWN_TRIGGER);
#endif
    // idx comes from the router, two kernels back: complete and visible once the previous
    // kernel (gate_up) has passed its own wait, which it did before letting this one launch.
    // Read from L2 (an SM's L1 may hold an older step's line).
    const int e = __ldcg(idx + t * k + s);
    const float wt = __ldcg(wts + t * k + s);  // the slot's weight, from the router too
    const int nb = inter >> 5, ni = (nb + 31) >> 5;
    const uint4* be = reinterpret_cast<const uint4*>(blocks) + (size_t)e * hidden * nb;
    const u8* se = scales + (size_t)e * hidden * nb;
    // Lane u holds unit u's two biases.
    const int rb = rw + 2 * lane;
    const bool bl = lane < p1 - p0;
    const float b0v = bl && rb < hidden ? bf2f(bias[(size_t)e * hidden + rb]) : 0.0f;
    const float b1v = bl && rb + 1 < hidden ? bf2f(bias[(size_t)e * hidden + rb + 1]) : 0.0f;
    if constexpr (SLOTS) {
        // As moe_gate_up_body's slots (same sums, same order). hidden is a multiple of 32, so
        // a unit's second row exists whenever its first does.
        const int nu = p1 - p0;
        MoeSlots w{be + (size_t)rw * nb + lane, se + (size_t)rw * nb + lane, nb, ni, lane};
        if (nu > 0) w.load_unit(0);
        moe_scales_fill();
#if MOE_DOWN_EARLY
        if (gu_blocks) MOE_DOWN_AWAIT();
        else pdl_enter_as(DOWN_TRIGGER);
#endif
        A::stage(act + ((size_t)t * k + s) * inter, as, inter);
        __syncthreads();
#if MOE_LANE_EPI
        const LaneUnits lu = lane_units<A, LOOPS>(w, as, nu, lane);
        if (bl) {
            const size_t o = ((size_t)t * k + s) * hidden + rb;
            if (mail) {
                mail_post2(mail + 2 * o, wt * (lu.m0 + b0v), wt * (lu.m1 + b1v));
            } else {
                part[o] = wt * (lu.m0 + b0v);
                part[o + 1] = wt * (lu.m1 + b1v);
            }
        }
#else
        slots_each<LOOPS>(w, nu, [&](int uu, bool full) {
            float t0, t1;
            w.sums_at<A>(full, as, uu, nu, t0, t1);
            t0 = warp_sum(t0);
            t1 = warp_sum(t1);
            const float bb0 = __shfl_sync(0xffffffffu, b0v, uu);
            const float bb1 = __shfl_sync(0xffffffffu, b1v, uu);
            if (lane == 0) {
                if (mail) {
                    mail_post2(mail + 2 * (((size_t)t * k + s) * hidden + rw + 2 * uu),
                               wt * (t0 + bb0), wt * (t1 + bb1));
                } else {
                    float* pp = part + ((size_t)t * k + s) * hidden + rw + 2 * uu;
                    pp[0] = wt * (t0 + bb0);
                    pp[1] = wt * (t1 + bb1);
                }
            }
        });
#endif
    } else {
    uint4 n0[2], n1[2];
    unsigned ns0[2], ns1[2];
    int fu = 0, fi = 0;  // the next item to load
    auto fetch = [&](int slot) {
        const int r = rw + 2 * fu, b = lane + 32 * fi;
        if (fu < units && r < hidden && b < nb) {
            const size_t o = (size_t)r * nb + b;
            n0[slot] = __ldg(be + o);
            ns0[slot] = se[o];
            if (r + 1 < hidden) {
                n1[slot] = __ldg(be + o + nb);
                ns1[slot] = se[o + nb];
            }
        }
        if (++fi == ni) {
            fi = 0;
            ++fu;
        }
    };
    fetch(0);
    fetch(1);
#if MOE_DOWN_EARLY
    if (gu_blocks) MOE_DOWN_AWAIT();
    else pdl_enter_as(DOWN_TRIGGER);
#endif
    A::stage(act + ((size_t)t * k + s) * inter, as, inter);
    __syncthreads();
    const int total = units * ni;
    int cu = 0, ci = 0;  // the item consumed
    float t0 = 0.0f, t1 = 0.0f;
    for (int f = 0; f < total; f += 2) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            if (f + slot >= total) break;  // warp-uniform
            const int r = rw + 2 * cu, b = lane + 32 * ci;
            const uint4 c0 = n0[slot], c1 = n1[slot];
            const unsigned cs0 = ns0[slot], cs1 = ns1[slot];
            fetch(slot);
            if (r < hidden && b < nb) {
                t0 += A::dot(c0, as, b, nb) * e8m0_value(cs0);
                if (r + 1 < hidden) t1 += A::dot(c1, as, b, nb) * e8m0_value(cs1);
            }
            if (++ci == ni) {  // the unit's last item (warp-uniform)
                t0 = warp_sum(t0);
                t1 = warp_sum(t1);
                const float bb0 = __shfl_sync(0xffffffffu, b0v, cu);
                const float bb1 = __shfl_sync(0xffffffffu, b1v, cu);
                if (lane == 0 && r < hidden) {
                    float* pp = part + ((size_t)t * k + s) * hidden + r;
                    pp[0] = wt * (t0 + bb0);
                    if (r + 1 < hidden) pp[1] = wt * (t1 + bb1);
                }
                t0 = t1 = 0.0f;
                ci = 0;
                ++cu;
            }
        }
    }
    }
    // Staged on the pair's count: the wait on gate_up's grid (long ended by now) before the
    // count and combine, which read the residual (the rows above went to `part`, which only
    // this kernel touches); it also records the block for the timeline (no trigger: given
    // above).
    if (gu_blocks) pdl_enter_as(2);
    // Past the wait gate_up has ended, so no block reads the pair's announcement any more:
    // clear it for the next layer's router (moe_ready_wait).
    if (ready && blockIdx.y == 0 && threadIdx.x == 0) ready[blockIdx.x] = 0u;
    // The block's rows: its warps' (slots_share of the pairs for the `_slots` kernels).
    int r0 = blockIdx.y * 16 * units, r1 = min(hidden, (int)(blockIdx.y + 1) * 16 * units);
    if constexpr (SLOTS) {
        r0 = 2 * (int)slots_at(blockIdx.y * 8, hidden / 2);
        r1 = 2 * (int)slots_at(blockIdx.y * 8 + 8, hidden / 2);
        // The rows went to the mailbox: the last slot's block combines them (moe_combine_mail).
        if (mail) {
            if (s == k - 1) moe_combine_mail(mail, y, t, k, hidden, r0, r1, accumulate);
            return;
        }
    }
    // Publish this block's rows, then count it; the last slot block combines.
    __shared__ unsigned last_s;
    __syncthreads();
    if (threadIdx.x == 0) last_s = count_block_last(ctr + (size_t)t * gridDim.y + blockIdx.y, k);
    __syncthreads();
    if (!last_s) return;
    moe_combine_rows(part, y, t, k, hidden, r0, r1, accumulate);
}

#define MOE_DOWN_KERNEL(name, policy, slots, loops, minb)                                      \
    extern "C" __global__ void __launch_bounds__(256, minb)                                     \
    name(const u8* __restrict__ blocks, const u8* __restrict__ scales,                          \
         const bf16_t* __restrict__ bias, const float* __restrict__ act,                        \
         const int* __restrict__ idx, const float* __restrict__ wts, float* __restrict__ part,  \
         int hidden, int inter, int k, int units, float* __restrict__ y, int accumulate,        \
         unsigned* __restrict__ ctr, unsigned* __restrict__ ready,                              \
         const unsigned* __restrict__ done, int gu_blocks, unsigned* __restrict__ mail) {       \
        moe_down_body<policy, slots, loops>(blocks, scales, bias, act, idx, wts, part, hidden,  \
                                            inter, k, units, y, accumulate, ctr, ready, done,  \
                                            gu_blocks, mail);                                   \
    }
MOE_DOWN_KERNEL(moe_down, ActF32, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_DOWN_KERNEL(moe_down_q8, ActQ8, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_DOWN_KERNEL(moe_down_fp8, ActFp8, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_DOWN_KERNEL(moe_down_slots, ActF32, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_DOWN_KERNEL(moe_down_q8_slots, ActQ8, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_DOWN_KERNEL(moe_down_fp8_slots, ActFp8, true, SLOTS_BOTH, MOE_SLOTS_MINB)
MOE_DOWN_KERNEL(moe_down_h2, ActF16, false, SLOTS_BOTH, MOE_DECODE_MINB)
MOE_DOWN_KERNEL(moe_down_h2_slots, ActF16, true, SLOTS_GENERAL, MOE_SLOTS_MINB)
MOE_DOWN_KERNEL(moe_down_h2_slots_full, ActF16, true, SLOTS_FULL, MOE_SLOTS_MINB)

// ---- The grouped decode MoE (`MXTUNE_MOE_LOOP=grouped`, the fp16 dot): one block per (row
// range, distinct expert of a group of up to TCG_TOKENS tokens; tcg_group), so an expert that
// several tokens route to is read and decoded once per step, and each 32-weight block is
// decoded once for all of the expert's tokens (f16_dot_n) where the `_slots` kernels decode it
// once per (token, slot) pair. The members are taken cap <= MOE_GRP_NT at a time (cap tokens'
// fp16 stagings, stride bytes apart, in dynamic shared memory; the unit's weights reloaded from
// L2 for a further chunk). Per pair the sums are those of the `_slots` kernels, in the same
// order. grid = (row ranges, min(T, TCG_TOKENS) * k, ceil(T / TCG_TOKENS)); blocks past the
// group's distinct experts return.
#ifndef MOE_GRP_NT
#define MOE_GRP_NT 3
#endif

// CALL(NT) for NT = nm in 1..MOE_GRP_NT (at most 4): the loops compiled for each exact count.
#if MOE_GRP_NT > 4
#error "MOE_GRP_NT is at most 4"
#endif
#define GRP_DISPATCH(nm, CALL)                      \
    switch (nm) {                                   \
    case 1: CALL(1); break;                         \
    case 2: if (MOE_GRP_NT >= 2) CALL(2); break;    \
    case 3: if (MOE_GRP_NT >= 3) CALL(3); break;    \
    case 4: if (MOE_GRP_NT >= 4) CALL(4); break;    \
    default: break;                                 \
    }

// A warp's units for NT members staged stride bytes apart at xs: each unit's two row sums per
// member (sums_n), reduced over the warp, plus the unit's two biases (lane u holds unit u's:
// b0v, b1v); lane 0 hands them to put(member, unit, sum0, sum1) as each unit ends, or with
// MOE_LANE_EPI each unit's lane once the warp's units are done (LaneUnits: the same bits).
template <int NT, class Put>
__device__ __forceinline__ void grp_units(MoeSlots& w, const u8* xs, int stride, int nu, float b0v,
                                          float b1v, const Put& put) {
#if MOE_LANE_EPI
    LaneUnits lu[NT];
    for (int uu = 0; uu < nu; ++uu) {
        float t0[NT], t1[NT];
        w.sums_n<NT>(xs, stride, uu, nu, t0, t1);
#pragma unroll
        for (int i = 0; i < NT; ++i) lu[i].put(t0[i], t1[i], uu, w.lane);
    }
#pragma unroll
    for (int i = 0; i < NT; ++i)
        if (w.lane < nu) put(i, w.lane, lu[i].m0 + b0v, lu[i].m1 + b1v);
#else
    for (int uu = 0; uu < nu; ++uu) {
        float t0[NT], t1[NT];
        w.sums_n<NT>(xs, stride, uu, nu, t0, t1);
        const float bb0 = __shfl_sync(0xffffffffu, b0v, uu);
        const float bb1 = __shfl_sync(0xffffffffu, b1v, uu);
#pragma unroll
        for (int i = 0; i < NT; ++i) {
            const float s0 = warp_sum(t0[i]), s1 = warp_sum(t1[i]);
            if (w.lane == 0) put(i, uu, s0 + bb0, s1 + bb1);
        }
    }
#endif
}

// act[p, j] = swiglu(gate_j, lin_j) for the pairs p routed to the block's expert; units, rows
// and biases as moe_gate_up_body's slots.
__device__ __forceinline__ void moe_gate_up_grp_body(const u8* __restrict__ blocks,
                                                     const u8* __restrict__ scales,
                                                     const bf16_t* __restrict__ bias,
                                                     const float* __restrict__ x,
                                                     const int* __restrict__ idx,
                                                     float* __restrict__ act, int inter, int hidden,
                                                     int k, int tokens, float limit, float alpha,
                                                     int units, int cap, int stride) {
    __shared__ TcgGroup grp;
    if (!tcg_group(idx, tokens, k, grp)) return;
    u8* xs = reinterpret_cast<u8*>(moe_smem);
    moe_scales_fill();  // visible past the first member loop's __syncthreads
    const int lane = threadIdx.x & 31;
    const int j0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * units;
    const int e = grp.e, n = grp.n;
    const int nb = hidden >> 5, ni = (nb + 31) >> 5;
    const size_t rows = 2 * (size_t)inter;
    const uint4* be = reinterpret_cast<const uint4*>(blocks) + (size_t)e * rows * nb;
    const u8* se = scales + (size_t)e * rows * nb;
    const int jb = j0 + lane;
    const bool bl = lane < units && jb < inter;
    const float bgate = bl ? bf2f(bias[(size_t)e * rows + 2 * jb]) : 0.0f;
    const float blin = bl ? bf2f(bias[(size_t)e * rows + 2 * jb + 1]) : 0.0f;
    const int nu = min(units, inter - j0);
    MoeSlots w{be + 2 * (size_t)j0 * nb + lane, se + 2 * (size_t)j0 * nb + lane, nb, ni, lane};
    cap = min(cap, MOE_GRP_NT);  // the host sizes the stagings for cap (at least this many)
    for (int m0 = 0; m0 < n; m0 += cap) {
        const int nm = min(cap, n - m0);
        if (m0 > 0) __syncthreads();  // every warp done with the previous members' stagings
        if (nu > 0) w.load_unit(0);
        for (int i = 0; i < nm; ++i)
            ActF16::stage(x + (size_t)(grp.p[m0 + i] / k) * hidden, xs + i * stride, hidden);
        __syncthreads();
        const int* pm = grp.p + m0;
        auto put = [&](int i, int uu, float g, float l) {
            act[(size_t)pm[i] * inter + j0 + uu] = swiglu_clamped(g, l, limit, alpha);
        };
#define GATE_UP_UNITS(NT) grp_units<NT>(w, xs, stride, nu, bgate, blin, put)
        GRP_DISPATCH(nm, GATE_UP_UNITS)
#undef GATE_UP_UNITS
    }
}

extern "C" __global__ void __launch_bounds__(256, MOE_SLOTS_MINB)
moe_gate_up_swiglu_h2_grp(const u8* __restrict__ blocks, const u8* __restrict__ scales,
                          const bf16_t* __restrict__ bias, const float* __restrict__ x,
                          const int* __restrict__ idx, float* __restrict__ act, int inter,
                          int hidden, int k, int tokens, float limit, float alpha, int units,
                          int cap, int stride) {
    pdl_enter_as(GATE_UP_TRIGGER);
    moe_gate_up_grp_body(blocks, scales, bias, x, idx, act, inter, hidden, k, tokens, limit, alpha,
                         units, cap, stride);
}

// part[p, r] = w[p] * (W2_e[r, :] . act[p, :] + b2_e[r]) for the pairs p routed to the block's
// expert, then, as moe_down_body, the last of the k slot blocks of a (row range, token) sums
// the token's slots into y (counter ctr[t * gridDim.x + blockIdx.x], reset to 0 by it); a
// block counts each of its members once its rows are written. The grouping reads idx (the
// router's, two kernels back, complete once gate_up passed its wait) and the first weights are
// loaded before the wait on gate_up, as in moe_down_body.
__device__ __forceinline__ void moe_down_grp_body(const u8* __restrict__ blocks,
                                                  const u8* __restrict__ scales,
                                                  const bf16_t* __restrict__ bias,
                                                  const float* __restrict__ act,
                                                  const int* __restrict__ idx,
                                                  const float* __restrict__ wts,
                                                  float* __restrict__ part, int hidden, int inter,
                                                  int k, int tokens, int units,
                                                  float* __restrict__ y, int accumulate,
                                                  unsigned* __restrict__ ctr, int cap, int stride) {
    __shared__ TcgGroup grp;
#if !MOE_DOWN_EARLY
    pdl_enter_as(DOWN_TRIGGER);
#endif
    if (!tcg_group(idx, tokens, k, grp)) return;
    u8* as = reinterpret_cast<u8*>(moe_smem);
    moe_scales_fill();  // visible past the first member loop's __syncthreads
    const int lane = threadIdx.x & 31;
    const int rw = (blockIdx.x * 8 + (threadIdx.x >> 5)) * 2 * units;
    const int e = grp.e, n = grp.n;
    const int nb = inter >> 5, ni = (nb + 31) >> 5;
    const uint4* be = reinterpret_cast<const uint4*>(blocks) + (size_t)e * hidden * nb;
    const u8* se = scales + (size_t)e * hidden * nb;
    const int rb = rw + 2 * lane;
    const bool bl = lane < units;
    const float b0v = bl && rb < hidden ? bf2f(bias[(size_t)e * hidden + rb]) : 0.0f;
    const float b1v = bl && rb + 1 < hidden ? bf2f(bias[(size_t)e * hidden + rb + 1]) : 0.0f;
    const int nu = min(units, (hidden - rw + 1) / 2);
    MoeSlots w{be + (size_t)rw * nb + lane, se + (size_t)rw * nb + lane, nb, ni, lane};
    if (nu > 0) w.load_unit(0);
#if MOE_DOWN_EARLY
    pdl_enter_as(DOWN_TRIGGER);
#endif
    cap = min(cap, MOE_GRP_NT);  // the host sizes the stagings for cap (at least this many)
    for (int m0 = 0; m0 < n; m0 += cap) {
        const int nm = min(cap, n - m0);
        if (m0 > 0) {
            __syncthreads();
            if (nu > 0) w.load_unit(0);
        }
        for (int i = 0; i < nm; ++i)
            ActF16::stage(act + (size_t)grp.p[m0 + i] * inter, as + i * stride, inter);
        __syncthreads();
        const int* pm = grp.p + m0;
        auto put = [&](int i, int uu, float s0, float s1) {
            const int p = pm[i];
            const float wt = wts[p];
            float* pp = part + (size_t)p * hidden + rw + 2 * uu;
            pp[0] = wt * s0;
            pp[1] = wt * s1;
        };
#define DOWN_UNITS(NT) grp_units<NT>(w, as, stride, nu, b0v, b1v, put)
        GRP_DISPATCH(nm, DOWN_UNITS)
#undef DOWN_UNITS
    }
    // Publish this block's rows, then count each member; the last slot block of a token
    // combines it.
    __shared__ unsigned last_s;
    __syncthreads();
    if (threadIdx.x < 32) {
        // Lane i counts member i (the members are distinct tokens: distinct counters).
        const bool mine = lane < n && count_block_last(ctr + (size_t)(grp.p[lane] / k) * gridDim.x + blockIdx.x, k);
        const unsigned last = __ballot_sync(0xffffffffu, mine);
        if (lane == 0) last_s = last;
    }
    __syncthreads();
    unsigned last = last_s;
    if (!last) return;
    const int r0 = blockIdx.x * 16 * units, r1 = min(hidden, r0 + 16 * units);
    while (last) {
        const int t = grp.p[__ffs(last) - 1] / k;
        last &= last - 1u;
        moe_combine_rows(part, y, t, k, hidden, r0, r1, accumulate);
    }
}

extern "C" __global__ void __launch_bounds__(256, MOE_SLOTS_MINB)
moe_down_h2_grp(const u8* __restrict__ blocks, const u8* __restrict__ scales,
                const bf16_t* __restrict__ bias, const float* __restrict__ act,
                const int* __restrict__ idx, const float* __restrict__ wts,
                float* __restrict__ part, int hidden, int inter, int k, int tokens, int units,
                float* __restrict__ y, int accumulate, unsigned* __restrict__ ctr, int cap,
                int stride) {
    moe_down_grp_body(blocks, scales, bias, act, idx, wts, part, hidden, inter, k, tokens, units,
                      y, accumulate, ctr, cap, stride);
}
