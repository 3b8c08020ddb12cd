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
