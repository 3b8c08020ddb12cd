// RoPE (rotate-half over the whole head, YaRN frequencies precomputed on the host) applied to
// q and k after the projection bias, with k and v written into the KV cache of element kind
// kv (KV_BF16, KV_F32 for exact comparison with an fp32 reference, or KV_FP8 E4M3).
// qkv: [T, (Hq + 2 Hkv) * D] fp32 as produced by one fused projection (q | k | v).
// Cache of a sequence-layer: [max_positions, Hkv, D], starting at element kv_off[t].
// grid = (ceil((Hq + 2 Hkv) / HB), T), block = (D / 2, HB): thread (i, j) of block x rotates the
// pair (i, i + D/2) of head x HB + j. HB = 1 for decode; a prefill chunk takes several heads a
// block (ops::rope_kv), so that 2048 tokens do not launch 160k blocks of one warp.
extern "C" __global__ void rope_kv_write(const float* __restrict__ qkv, float* __restrict__ q_out,
                                         void* __restrict__ k_cache, void* __restrict__ v_cache,
                                         int kv,
                                         const float* __restrict__ inv_freq,
                                         const unsigned* __restrict__ pos,
                                         const unsigned long long* __restrict__ kv_off,
                                         int hq, int hkv, int d, float mscale) {
    const int h = blockIdx.x * blockDim.y + threadIdx.y, t = blockIdx.y, i = threadIdx.x;
    const int half = d >> 1;
    // Before the wait, so after it only the projection's two values are waited on.
    const RopeEarly e = rope_early(inv_freq, pos, kv_off, h, t, i, hq, hkv, mscale);
    pdl_enter_as(ROPE_TRIGGER);
    if (h >= hq + 2 * hkv) return;
    const size_t width = (size_t)(hq + 2 * hkv) * d;
    const float* src = qkv + (size_t)t * width + (size_t)h * d;
    rope_store_pair(src[i], src[i + half], e, h, i, t, q_out, k_cache, v_cache, kv, hq, hkv, d);
}
