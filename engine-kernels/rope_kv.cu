// RoPE (rotate-half over the whole head, YaRN frequencies precomputed on the host) applied to
// q and k after the projection bias, with k and v written into the KV cache of element kind
// kv (KV_BF16, KV_F32 for exact comparison with an fp32 reference, or KV_FP8 E4M3).
// qkv: [T, (Hq + 2 Hkv) * D] fp32 as produced by one fused projection (q | k | v).
// Cache of a sequence-layer: [max_positions, Hkv, D], starting at element kv_off[t].
// grid = (ceil((Hq + 2 Hkv) / HB), T), block = (D / 2, HB): thread (i, j) of block x rotates the
// pair (i, i + D/2) of head x HB + j. HB = 1 for decode; a prefill chunk takes several heads a
// block (ops::rope_kv), so that 2048 tokens do not launch 160k blocks of one warp.
// What rope_kv_write reads before its wait on the projection: the row's position and cache
// offset (the step's inputs, copied in before its first kernel; no kernel writes them) and its
// rotation from the constant frequencies. c = s = 0 for v heads (no rotation).
struct RopeEarly {
    unsigned p;
    unsigned long long off;
    float c, s;
};
__device__ __forceinline__ RopeEarly rope_early(const float* __restrict__ inv_freq,
                                                const unsigned* __restrict__ pos,
                                                const unsigned long long* __restrict__ kv_off,
                                                int h, int t, int i, int hq, int hkv, float mscale) {
    RopeEarly e{0u, 0ull, 0.0f, 0.0f};
    if (h >= hq + 2 * hkv) return e;
    e.p = ld_early_u32(pos + t);
    e.off = ld_early_u64(kv_off + t);
    if (h < hq + hkv) {
        const float theta = (float)e.p * ld_early_f32(inv_freq + i);
        e.c = cosf(theta) * mscale;
        e.s = sinf(theta) * mscale;
    }
    return e;
}

// The most K splits whose partial sums rope_kv_write adds (ops::rope_kv's `deferred`).
#define ROPE_MAX_SPLIT 4
extern "C" __global__ void rope_kv_write(const float* __restrict__ qkv, float* __restrict__ q_out,
                                         void* __restrict__ k_cache, void* __restrict__ v_cache,
                                         int kv,
                                         const float* __restrict__ inv_freq,
                                         const unsigned* __restrict__ pos,
                                         const unsigned long long* __restrict__ kv_off,
                                         int hq, int hkv, int d, float mscale,
                                         const float* __restrict__ part, int nz,
                                         const bf16_t* __restrict__ bias, int cols, float eps,
                                         int tokens) {
    const int h = blockIdx.x * blockDim.y + threadIdx.y, t = blockIdx.y, i = threadIdx.x;
    const int half = d >> 1;
    // Before the wait, so after it only the projection's two values are waited on.
    const RopeEarly e = rope_early(inv_freq, pos, kv_off, h, t, i, hq, hkv, mscale);
    param_touch(blockDim.x, qkv, part, tokens);
    pdl_enter_as(ROPE_TRIGGER);
    if (h >= hq + 2 * hkv) return;
    const unsigned p = e.p;
    const unsigned long long off = e.off;
    const float c = e.c, s = e.s;
    const size_t width = (size_t)(hq + 2 * hkv) * d;
    const float* src = qkv + (size_t)t * width + (size_t)h * d;
    float a, b;
    if (nz > 0) {
        // The qkv GEMV's K split left its nz partial sums of each row (part[z][t][row]) and
        // its squares of each token (after them, [z][t]): its finish, here — the same
        // operations in the same order (gemv_tc_body's last block), so the same bits.
        const int ra = h * d + i, rb = ra + half;
        const float* sqp = part + (size_t)nz * tokens * width;
        float pa[ROPE_MAX_SPLIT], pb[ROPE_MAX_SPLIT], qz[ROPE_MAX_SPLIT];
#pragma unroll
        for (int z = 0; z < ROPE_MAX_SPLIT; ++z) {
            const size_t o = ((size_t)z * tokens + t) * width;
            pa[z] = z < nz ? __ldcg(part + o + ra) : 0.0f;
            pb[z] = z < nz ? __ldcg(part + o + rb) : 0.0f;
            qz[z] = z < nz ? __ldcg(sqp + (size_t)z * tokens + t) : 0.0f;
        }
        const float ba = bias ? bf2f(bias[ra]) : 0.0f, bb = bias ? bf2f(bias[rb]) : 0.0f;
        float sa = 0.0f, sb = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int z = 0; z < ROPE_MAX_SPLIT; ++z)
            if (z < nz) {
                sa += pa[z];
                sb += pb[z];
                s2 += qz[z];
            }
        const float rs = rsqrtf(s2 / (float)cols + eps);
        a = sa * rs + ba;
        b = sb * rs + bb;
    } else {
        a = src[i];
        b = src[i + half];
    }
    if (h >= hq + hkv) {
        const size_t o = off + ((size_t)p * hkv + (h - hq - hkv)) * d;
        kv_store(v_cache, kv, o + i, a);
        kv_store(v_cache, kv, o + i + half, b);
        return;
    }
    const float o1 = a * c - b * s, o2 = b * c + a * s;
    if (h < hq) {
        float* dst = q_out + ((size_t)t * hq + h) * d;
        dst[i] = o1;
        dst[i + half] = o2;
    } else {
        const size_t o = off + ((size_t)p * hkv + (h - hq)) * d;
        kv_store(k_cache, kv, o + i, o1);
        kv_store(k_cache, kv, o + i + half, o2);
    }
}
