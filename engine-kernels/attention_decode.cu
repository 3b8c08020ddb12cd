// Decode attention (one query token per row t) over the KV cache (bf16, fp32 or fp8), split-K
// (flash-decoding): attn_split computes, for each (head, split), the running max m, the sum
// l and the unnormalised output of its key range; attn_combine merges the splits and adds
// the sink logit exactly once in the denominator.
// Keys seen by a query at position p: [lo, p] with lo = max(0, p + 1 - window) when window > 0.
// Head dims up to 128 in multiples of 32: lane holds the dpl = d / 32 consecutive dims lane * dpl...
#define ATTN_WARPS 4
#define ATTN_MAX_DPL 4

// Load the dpl consecutive head dims of one cached row, element offset i, as fp32. FP8: an
// E4M3 cache; otherwise bf16, or fp32 when kv == KV_F32. i is a multiple of dpl (rows start at
// multiples of d), so the paired loads are aligned.
template <bool FP8>
__device__ __forceinline__ void load_row(const void* __restrict__ cache, int kv, size_t i, int dpl,
                                         float (&o)[ATTN_MAX_DPL]) {
    if (FP8) {
        // The dpl bytes as one word (zero bytes beyond dpl: exact zeros), converted pairwise.
        const u8* p = static_cast<const u8*>(cache) + i;
        unsigned w;
        if (dpl == 2) {
            w = *reinterpret_cast<const unsigned short*>(p);
        } else if (dpl == 4) {
            w = *reinterpret_cast<const unsigned*>(p);
        } else {
            w = 0u;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j)
                if (j < dpl) w |= (unsigned)p[j] << (8 * j);
        }
        e4m3x2_to_f32((unsigned short)(w & 0xffffu), o[0], o[1]);
        e4m3x2_to_f32((unsigned short)(w >> 16), o[2], o[3]);
        return;
    }
    if (kv == KV_F32) {
        const float* p = static_cast<const float*>(cache) + i;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j) o[j] = j < dpl ? p[j] : 0.0f;
        return;
    }
    const bf16_t* p = static_cast<const bf16_t*>(cache) + i;
    if (dpl == 2) {
        const unsigned w = *reinterpret_cast<const unsigned*>(p);
        o[0] = __uint_as_float(w << 16);
        o[1] = __uint_as_float(w & 0xffff0000u);
#pragma unroll
        for (int j = 2; j < ATTN_MAX_DPL; ++j) o[j] = 0.0f;
    } else {
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j) o[j] = j < dpl ? bf2f(p[j]) : 0.0f;
    }
}

// grid = (Hq, nsplit, T), block = ATTN_WARPS warps; split s of row t takes the s-th even share
// of the row's keys (at least min_split keys; later splits may be empty and exit at once).
// Each warp takes ATTN_KEYS keys at a time
// (their K and V rows loaded together, their dot products reduced side by side), so a warp
// has 2 * ATTN_KEYS row loads in flight instead of one.
#define ATTN_KEYS 4

// One warp's keys of the split [lo, hi): running max m, sum l and the unnormalised output acc
// of this lane's dpl dims. Compiled twice: for an fp8 cache, and for bf16/fp32 (switched on kv
// at run time inside, as before fp8 existed: one loop for all three kinds needs ~96 registers
// on sm_90 instead of 64).
template <bool FP8>
__device__ __forceinline__ void split_keys(const void* __restrict__ k_cache,
                                           const void* __restrict__ v_cache, int kv, size_t row0,
                                           size_t stride, int lo, int hi, int dpl,
                                           const float (&qv)[ATTN_MAX_DPL],
                                           float (&acc)[ATTN_MAX_DPL], float& m, float& l) {
    const int warp = threadIdx.x >> 5;
    for (int base = lo + warp * ATTN_KEYS; base < hi; base += ATTN_WARPS * ATTN_KEYS) {
        float kr[ATTN_KEYS][ATTN_MAX_DPL], vr[ATTN_KEYS][ATTN_MAX_DPL], sc[ATTN_KEYS];
#pragma unroll
        for (int g = 0; g < ATTN_KEYS; ++g) {
            const int key = min(base + g, hi - 1);
            load_row<FP8>(k_cache, kv, row0 + (size_t)key * stride, dpl, kr[g]);
            load_row<FP8>(v_cache, kv, row0 + (size_t)key * stride, dpl, vr[g]);
        }
#pragma unroll
        for (int g = 0; g < ATTN_KEYS; ++g) {
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j) s += qv[j] * kr[g][j];
            sc[g] = s;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
            for (int g = 0; g < ATTN_KEYS; ++g) sc[g] += __shfl_xor_sync(0xffffffffu, sc[g], o);
        }
#pragma unroll
        for (int g = 0; g < ATTN_KEYS; ++g) {
            if (base + g < hi) {
                const float mn = fmaxf(m, sc[g]);
                const float corr = expf(m - mn), pr = expf(sc[g] - mn);
                l = l * corr + pr;
#pragma unroll
                for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[j] = acc[j] * corr + pr * vr[g][j];
                m = mn;
            }
        }
    }
}

// kv: the cache's element kind (KV_BF16, KV_F32 or KV_FP8), uniform per launch.
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_split(const float* __restrict__ q, const void* __restrict__ k_cache,
           const void* __restrict__ v_cache, int kv, const unsigned* __restrict__ pos,
           const unsigned long long* __restrict__ kv_off, float* __restrict__ part_m,
           float* __restrict__ part_l, float* __restrict__ part_acc, int hq, int hkv, int d,
           int window, int min_split, float scale) {
    pdl_enter();
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dpl = d >> 5;
    const int kvh = h / (hq / hkv);
    const int p = (int)pos[t];
    const int lo_all = window > 0 ? max(0, p + 1 - window) : 0;
    // The row's keys are spread evenly over the grid's splits, at least min_split each: a
    // short context still occupies several blocks per head, and a graph captured for the
    // longest context (nsplit fixed) covers any shorter one.
    const int per = max(min_split, (p + 1 - lo_all + nsplit - 1) / nsplit);
    const int lo = lo_all + split * per;
    const int hi = min(p + 1, lo + per);
    const float* qh = q + ((size_t)t * hq + h) * d + lane * dpl;
    float qv[ATTN_MAX_DPL], acc[ATTN_MAX_DPL];
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j) {
        qv[j] = j < dpl ? qh[j] * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const size_t row0 = kv_off[t] + (size_t)kvh * d + lane * dpl;
    const size_t stride = (size_t)hkv * d;
    if (kv == KV_FP8)
        split_keys<true>(k_cache, v_cache, kv, row0, stride, lo, hi, dpl, qv, acc, m, l);
    else
        split_keys<false>(k_cache, v_cache, kv, row0, stride, lo, hi, dpl, qv, acc, m, l);
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS], sm_acc[ATTN_WARPS][32 * ATTN_MAX_DPL];
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j)
        if (j < dpl) sm_acc[warp][lane * dpl + j] = acc[j];
    __syncthreads();
    if (warp != 0) return;
    float mm = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; ++w) mm = fmaxf(mm, sm_m[w]);
    const size_t pi = ((size_t)t * hq + h) * nsplit + split;
    float ll = 0.0f, out[ATTN_MAX_DPL];
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j) out[j] = 0.0f;
    if (mm != -INFINITY) {
        for (int w = 0; w < ATTN_WARPS; ++w) {
            const float f = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - mm);
            ll += sm_l[w] * f;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j)
                if (j < dpl) out[j] += sm_acc[w][lane * dpl + j] * f;
        }
    }
    if (lane == 0) { part_m[pi] = mm; part_l[pi] = ll; }
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j)
        if (j < dpl) part_acc[pi * d + lane * dpl + j] = out[j];
}

// grid = (Hq, T), block = d threads. sinks == nullptr turns the sink off (diagnostic only).
extern "C" __global__ void attn_combine(const float* __restrict__ part_m,
                                        const float* __restrict__ part_l,
                                        const float* __restrict__ part_acc,
                                        const bf16_t* __restrict__ sinks, float* __restrict__ out,
                                        int hq, int d, int nsplit) {
    pdl_enter();
    const int h = blockIdx.x, t = blockIdx.y, i = threadIdx.x;
    const size_t base = ((size_t)t * hq + h) * nsplit;
    float mm = sinks ? bf2f(sinks[h]) : -INFINITY;
    for (int s = 0; s < nsplit; ++s) mm = fmaxf(mm, part_m[base + s]);
    float ll = sinks ? expf(bf2f(sinks[h]) - mm) : 0.0f, acc = 0.0f;
    for (int s = 0; s < nsplit; ++s) {
        const float ms = part_m[base + s];
        if (ms == -INFINITY) continue;
        const float f = expf(ms - mm);
        ll += part_l[base + s] * f;
        acc += part_acc[(base + s) * d + i] * f;
    }
    out[((size_t)t * hq + h) * d + i] = acc / ll;
}
