// Decode attention (one query token per row t) over the KV cache (bf16, fp32 or fp8), split-K
// (flash-decoding): attn_split computes, for each (head, split), the running max m, the sum
// l and the unnormalised output of its key range; attn_combine merges the splits and adds
// the sink logit exactly once in the denominator.
// Keys seen by a query at position p: [lo, p] with lo = max(0, p + 1 - window) when window > 0.
// Head dims up to 128 in multiples of 32: lane holds the dpl = d / 32 consecutive dims lane * dpl...
#define ATTN_WARPS 4
#define ATTN_MAX_DPL 4
// attn_split keeps scores in log2 units (q pre-scaled by log2 e) and hands back natural ones.
#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f

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
        // One rescale per group of keys (scores in log2 units: exp2 is a few instructions,
        // expf a few dozen, and every lane evaluates them).
        float mn = m;
#pragma unroll
        for (int g = 0; g < ATTN_KEYS; ++g)
            if (base + g < hi) mn = fmaxf(mn, sc[g]);
        const float corr = exp2f(m - mn);
        l *= corr;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[j] *= corr;
#pragma unroll
        for (int g = 0; g < ATTN_KEYS; ++g) {
            if (base + g < hi) {
                const float pr = exp2f(sc[g] - mn);
                l += pr;
#pragma unroll
                for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[j] += pr * vr[g][j];
            }
        }
        m = mn;
    }
}

// Keys [lo, hi) of split `split` of `nsplit` for a query at position p: the row's keys are
// shared evenly among the grid's splits, at least min_split each, so a short context still
// occupies several blocks and a graph captured for a longer context (nsplit fixed) covers any
// shorter one; trailing splits may be empty.
__device__ __forceinline__ void split_keys_range(int p, int window, int min_split, int split,
                                                 int nsplit, int& lo, int& hi) {
    const int lo_all = window > 0 ? max(0, p + 1 - window) : 0;
    const int per = max(min_split, (p + 1 - lo_all + nsplit - 1) / nsplit);
    lo = lo_all + split * per;
    hi = min(p + 1, lo + per);
}

// A head whose one split holds all of its row's keys (nsplit == 1) is finished by the split
// kernel itself when the host passes `out` (then no attn_combine runs): its max m (natural
// units, as the partial attn_combine would read), sum l and unnormalised outputs become
// out = acc * f / den with the sink counted once, by the operations attn_combine applies to a
// single split, so the outputs are the same bits. sink is -inf when the sink is off.
__device__ __forceinline__ void attn_finish(float m, float l, float sink, float& f, float& den) {
    const float mm = fmaxf(sink, m);
    f = m == -INFINITY ? 0.0f : expf(m - mm);
    den = l * f;
    if (sink != -INFINITY) den += expf(sink - mm);
}

// The sink logits of heads h0 .. h0 + n - 1 into sink_s (-inf when the sink is off), read
// before the wait — a weight, immutable — by loads that stay on that side of it (volatile
// asm; an ld.global.nc may be moved below it, common.cuh), so no finish waits on a load from
// DRAM. It did not measure faster by itself (docs/perf.md run 182: the finish's loss came
// from where the next kernel launched). Only where the kernel finishes (out_final).
__device__ __forceinline__ void attn_sinks_early(const bf16_t* sinks, const float* out_final,
                                                 int h0, int n, float* sink_s) {
    if (!out_final) return;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        sink_s[i] = sinks ? ld_early_bf16(sinks + h0 + i) : -INFINITY;
    }
}

// When the split kernel lets the next kernel launch (griddepcontrol.launch_dependents): 0 at
// the start, 1 once the block's keys are done, 2 never (at the grid's end). ATTN_TRIGGER_FIN
// where it finishes its heads (the next kernel: the o projection), ATTN_TRIGGER_PART where
// it writes partials (the next: attn_combine). Both 2 (docs/perf.md runs 184, 189-190: at the
// start, the next kernel's blocks were placed around this grid's few; 120b batch 4 at depth 0
// −5.9 % finishing, at depth 4096 −4.0 % with the combine, neutral elsewhere).
#ifndef ATTN_TRIGGER_FIN
#define ATTN_TRIGGER_FIN 2
#endif
#ifndef ATTN_TRIGGER_PART
#define ATTN_TRIGGER_PART 2
#endif
__device__ __forceinline__ int attn_trigger_mode(const float* out_final) {
    return out_final ? ATTN_TRIGGER_FIN : ATTN_TRIGGER_PART;
}
__device__ __forceinline__ void attn_trigger_late(const float* out_final) {
    if (attn_trigger_mode(out_final) == 1 && !PDL_NO_TRIGGER) pdl_trigger();
}

// kv: the cache's element kind (KV_BF16, KV_F32 or KV_FP8), uniform per launch.
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
attn_split(const float* __restrict__ q, const void* __restrict__ k_cache,
           const void* __restrict__ v_cache, int kv, const unsigned* __restrict__ pos,
           const unsigned long long* __restrict__ kv_off, float* __restrict__ part_m,
           float* __restrict__ part_l, float* __restrict__ part_acc, int hq, int hkv, int d,
           int window, int min_split, float scale, const bf16_t* __restrict__ sinks,
           float* __restrict__ out_final) {
    __shared__ float sink_s[1];
    attn_sinks_early(sinks, out_final, blockIdx.x, 1, sink_s);
    pdl_enter_as(attn_trigger_mode(out_final));
    const int h = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int dpl = d >> 5;
    const int kvh = h / (hq / hkv);
    int lo, hi;
    split_keys_range((int)pos[t], window, min_split, split, nsplit, lo, hi);
    if (lo >= hi) {
        // An empty split (a graph's grid covers the longest context): its max and sum say
        // so, and the combine never reads its outputs.
        if (threadIdx.x == 0) {
            const size_t pi = ((size_t)t * hq + h) * nsplit + split;
            part_m[pi] = -INFINITY;
            part_l[pi] = 0.0f;
        }
        return;
    }
    const float* qh = q + ((size_t)t * hq + h) * d + lane * dpl;
    float qv[ATTN_MAX_DPL], acc[ATTN_MAX_DPL];
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j) {
        qv[j] = j < dpl ? qh[j] * scale * ATTN_LOG2E : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const size_t row0 = kv_off[t] + (size_t)kvh * d + lane * dpl;
    const size_t stride = (size_t)hkv * d;
    if (kv == KV_FP8)
        split_keys<true>(k_cache, v_cache, kv, row0, stride, lo, hi, dpl, qv, acc, m, l);
    else
        split_keys<false>(k_cache, v_cache, kv, row0, stride, lo, hi, dpl, qv, acc, m, l);
    attn_trigger_late(out_final);
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
            const float f = sm_m[w] == -INFINITY ? 0.0f : exp2f(sm_m[w] - mm);
            ll += sm_l[w] * f;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j)
                if (j < dpl) out[j] += sm_acc[w][lane * dpl + j] * f;
        }
    }
    if (out_final) {
        float f, den;
        attn_finish(mm * ATTN_LN2, ll, sink_s[0], f, den);
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j)
            if (j < dpl) out_final[((size_t)t * hq + h) * d + lane * dpl + j] = out[j] * f / den;
        return;
    }
    // The partial max back in natural-log units for the combine (and its sink).
    if (lane == 0) { part_m[pi] = mm * ATTN_LN2; part_l[pi] = ll; }
#pragma unroll
    for (int j = 0; j < ATTN_MAX_DPL; ++j)
        if (j < dpl) part_acc[pi * d + lane * dpl + j] = out[j];
}

// ---- attn_split_gqa: the same partials, one block per (KV head, split, row) for all G <=
// ATTN_GQA_MAX query heads that share the KV head, so each key and value row is read once per
// block instead of once per query head. Scores: lanes own keys (a lane dots its key's row with
// the G queries staged in shared memory: no shuffle per key, one exp2 per key and head);
// P·V: lanes own dims (the tile's probabilities go through shared memory). Each warp takes 32
// keys at a time; the block's warps merge at the end.
#define ATTN_GQA_MAX 8
#define ATTN_GQA_WARPS 4
#define ATTN_GQA_VROWS 8

// Eight consecutive cache elements from element offset i (a multiple of 8) as fp32.
template <int KIND>
__device__ __forceinline__ void load8(const void* __restrict__ cache, size_t i, float (&o)[8]) {
    if (KIND == KV_FP8) {
        const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const u8*>(cache) + i);
        e4m3x2_to_f32((unsigned short)(w.x & 0xffffu), o[0], o[1]);
        e4m3x2_to_f32((unsigned short)(w.x >> 16), o[2], o[3]);
        e4m3x2_to_f32((unsigned short)(w.y & 0xffffu), o[4], o[5]);
        e4m3x2_to_f32((unsigned short)(w.y >> 16), o[6], o[7]);
    } else if (KIND == KV_F32) {
        const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + i);
        const float4 a = p[0], b = p[1];
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    } else {
        bf16x8_to_f32(*reinterpret_cast<const uint4*>(static_cast<const bf16_t*>(cache) + i), o);
    }
}

// Shared memory of one attn_split_gqa block.
struct GqaSmem {
    float q[ATTN_GQA_MAX * 32 * ATTN_MAX_DPL];                    // [G][d], log2-scaled
    float p[ATTN_GQA_WARPS][ATTN_GQA_MAX][32];                    // a warp's tile probabilities
    float m[ATTN_GQA_WARPS][ATTN_GQA_MAX], l[ATTN_GQA_WARPS][ATTN_GQA_MAX];
    float acc[ATTN_GQA_WARPS][ATTN_GQA_MAX][32 * ATTN_MAX_DPL];
};

// One warp's tile of up to 32 keys [base, base + nk): the scores of the G query heads (lane =
// key), the running max/sum update, then P·V (lane = dims). Row r's K and V are read at
// element offsets kidx(r) of kp and vidx(r) of vp (the cache). Rows past nk repeat the
// tile's last row with probability 0.
template <int KIND, class KIdx, class VIdx>
__device__ __forceinline__ void gqa_tile(const void* __restrict__ kp, KIdx kidx,
                                         const void* __restrict__ vp, VIdx vidx, int nk, int G,
                                         int d, int dpl, const float* __restrict__ qs,
                                         float (&ps)[ATTN_GQA_MAX][32], float (&m)[ATTN_GQA_MAX],
                                         float (&l)[ATTN_GQA_MAX],
                                         float (&acc)[ATTN_GQA_MAX][ATTN_MAX_DPL]) {
    const int lane = threadIdx.x & 31;
    const bool live = lane < nk;
    float s[ATTN_GQA_MAX];
#pragma unroll
    for (int g = 0; g < ATTN_GQA_MAX; ++g) s[g] = 0.0f;
    if (live) {
        const size_t kr = kidx(lane);
#pragma unroll 4
        for (int c = 0; c < d; c += 8) {
            float kf[8];
            load8<KIND>(kp, kr + c, kf);
#pragma unroll
            for (int g = 0; g < ATTN_GQA_MAX; ++g) {
                if (g < G) {
                    const float4* qq = reinterpret_cast<const float4*>(qs + g * d + c);
                    const float4 a = qq[0], b = qq[1];
                    s[g] += a.x * kf[0] + a.y * kf[1] + a.z * kf[2] + a.w * kf[3] +
                            b.x * kf[4] + b.y * kf[5] + b.z * kf[6] + b.w * kf[7];
                }
            }
        }
    }
#pragma unroll
    for (int g = 0; g < ATTN_GQA_MAX; ++g) {
        if (g < G) {
            const float mn = fmaxf(m[g], warp_max(live ? s[g] : -INFINITY));
            const float corr = exp2f(m[g] - mn);
            const float pr = live ? exp2f(s[g] - mn) : 0.0f;
            l[g] = l[g] * corr + pr;
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[g][j] *= corr;
            m[g] = mn;
            ps[g][lane] = pr;
        }
    }
    __syncwarp();
    // ATTN_GQA_VROWS value rows in flight at a time.
    for (int k0 = 0; k0 < nk; k0 += ATTN_GQA_VROWS) {
        float vr[ATTN_GQA_VROWS][ATTN_MAX_DPL];
#pragma unroll
        for (int r = 0; r < ATTN_GQA_VROWS; ++r) {
            const int k = min(k0 + r, nk - 1);
            load_row<KIND == KV_FP8>(vp, KIND, vidx(k) + lane * dpl, dpl, vr[r]);
        }
#pragma unroll
        for (int r = 0; r < ATTN_GQA_VROWS; ++r) {
            if (k0 + r < nk) {
#pragma unroll
                for (int g = 0; g < ATTN_GQA_MAX; ++g) {
                    if (g < G) {
                        const float pr = ps[g][k0 + r];
#pragma unroll
                        for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[g][j] += pr * vr[r][j];
                    }
                }
            }
        }
    }
    __syncwarp();
}

// The block's warps merge their (m, l, acc) per query head into the split's partials.
__device__ __forceinline__ void gqa_merge(GqaSmem& sm, const float (&m)[ATTN_GQA_MAX],
                                          const float (&l)[ATTN_GQA_MAX],
                                          const float (&acc)[ATTN_GQA_MAX][ATTN_MAX_DPL],
                                          float* __restrict__ part_m, float* __restrict__ part_l,
                                          float* __restrict__ part_acc, int hq, int G, int d,
                                          int dpl, int kvh, int split, int nsplit, int t,
                                          const float* sink_s, float* __restrict__ out_final) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < ATTN_GQA_MAX; ++g) {
        if (g < G) {
            const float ls = warp_sum(l[g]);
            if (lane == 0) { sm.m[warp][g] = m[g]; sm.l[warp][g] = ls; }
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j)
                if (j < dpl) sm.acc[warp][g][lane * dpl + j] = acc[g][j];
        }
    }
    __syncthreads();
    for (int g = warp; g < G; g += ATTN_GQA_WARPS) {
        float mm = -INFINITY;
        for (int w = 0; w < ATTN_GQA_WARPS; ++w) mm = fmaxf(mm, sm.m[w][g]);
        float ll = 0.0f, out[ATTN_MAX_DPL];
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j) out[j] = 0.0f;
        if (mm != -INFINITY) {
            for (int w = 0; w < ATTN_GQA_WARPS; ++w) {
                const float f = sm.m[w][g] == -INFINITY ? 0.0f : exp2f(sm.m[w][g] - mm);
                ll += sm.l[w][g] * f;
#pragma unroll
                for (int j = 0; j < ATTN_MAX_DPL; ++j)
                    if (j < dpl) out[j] += sm.acc[w][g][lane * dpl + j] * f;
            }
        }
        const size_t pi = ((size_t)t * hq + (size_t)kvh * G + g) * nsplit + split;
        if (out_final) {
            float f, den;
            attn_finish(mm * ATTN_LN2, ll, sink_s[g], f, den);
#pragma unroll
            for (int j = 0; j < ATTN_MAX_DPL; ++j)
                if (j < dpl)
                    out_final[((size_t)t * hq + (size_t)kvh * G + g) * d + lane * dpl + j] = out[j] * f / den;
            continue;
        }
        if (lane == 0) { part_m[pi] = mm * ATTN_LN2; part_l[pi] = ll; }
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j)
            if (j < dpl) part_acc[pi * d + lane * dpl + j] = out[j];
    }
}

// The keys [lo, hi) of a GQA block's split (split_keys_range) for a row at position p; false
// for an empty split, whose max and sum it writes for the group's G heads, as attn_split does
// (uniform over the block, so the caller returns before any barrier).
__device__ __forceinline__ bool gqa_split_range(int p, int window, int min_split, int hq, int G,
                                                int kvh, int split, int nsplit, int t,
                                                float* __restrict__ part_m,
                                                float* __restrict__ part_l, int& lo, int& hi) {
    split_keys_range(p, window, min_split, split, nsplit, lo, hi);
    if (lo < hi) return true;
    for (int h = threadIdx.x; h < G; h += blockDim.x) {
        const size_t pi = ((size_t)t * hq + (size_t)kvh * G + h) * nsplit + split;
        part_m[pi] = -INFINITY;
        part_l[pi] = 0.0f;
    }
    return false;
}

// attn_split_gqa's body for a cache of KIND.
template <int KIND>
__device__ __forceinline__ void gqa_split(const float* __restrict__ q, const void* __restrict__ k_cache,
                                          const void* __restrict__ v_cache,
                                          const unsigned* __restrict__ pos,
                                          const unsigned long long* __restrict__ kv_off,
                                          float* __restrict__ part_m, float* __restrict__ part_l,
                                          float* __restrict__ part_acc, int hq, int hkv, int d,
                                          int window, int min_split, float scale,
                                          const float* sink_s, float* __restrict__ out_final,
                                          GqaSmem& sm) {
    const int kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, t = blockIdx.z;
    const int warp = threadIdx.x >> 5;
    const int G = hq / hkv, dpl = d >> 5;
    int lo, hi;
    if (!gqa_split_range((int)pos[t], window, min_split, hq, G, kvh, split, nsplit, t, part_m,
                         part_l, lo, hi))
        return;
    const size_t row0 = kv_off[t] + (size_t)kvh * d;
    const size_t stride = (size_t)hkv * d;
    const float* qt = q + ((size_t)t * hq + (size_t)kvh * G) * d;
    for (int i = threadIdx.x; i < G * d; i += blockDim.x) sm.q[i] = qt[i] * scale * ATTN_LOG2E;
    __syncthreads();
    float m[ATTN_GQA_MAX], l[ATTN_GQA_MAX], acc[ATTN_GQA_MAX][ATTN_MAX_DPL];
#pragma unroll
    for (int g = 0; g < ATTN_GQA_MAX; ++g) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_MAX_DPL; ++j) acc[g][j] = 0.0f;
    }
    for (int base = lo + warp * 32; base < hi; base += ATTN_GQA_WARPS * 32) {
        const int nk = min(32, hi - base);
        auto idx = [&](int r) { return row0 + (size_t)(base + r) * stride; };
        gqa_tile<KIND>(k_cache, idx, v_cache, idx, nk, G, d, dpl, sm.q, sm.p[warp], m, l, acc);
    }
    attn_trigger_late(out_final);
    gqa_merge(sm, m, l, acc, part_m, part_l, part_acc, hq, G, d, dpl, kvh, split, nsplit, t, sink_s,
              out_final);
}

// grid = (Hkv, nsplit, T), block = ATTN_GQA_WARPS warps; hq / hkv <= ATTN_GQA_MAX. Same
// arguments and partials as attn_split.
extern "C" __global__ void __launch_bounds__(ATTN_GQA_WARPS * 32)
attn_split_gqa(const float* __restrict__ q, const void* __restrict__ k_cache,
               const void* __restrict__ v_cache, int kv, const unsigned* __restrict__ pos,
               const unsigned long long* __restrict__ kv_off, float* __restrict__ part_m,
               float* __restrict__ part_l, float* __restrict__ part_acc, int hq, int hkv, int d,
               int window, int min_split, float scale, const bf16_t* __restrict__ sinks,
               float* __restrict__ out_final) {
    __shared__ float sink_s[ATTN_GQA_MAX];
    attn_sinks_early(sinks, out_final, blockIdx.x * (hq / hkv), hq / hkv, sink_s);
    pdl_enter_as(attn_trigger_mode(out_final));
    __shared__ GqaSmem sm;
    if (kv == KV_FP8)
        gqa_split<KV_FP8>(q, k_cache, v_cache, pos, kv_off, part_m, part_l, part_acc, hq, hkv, d,
                          window, min_split, scale, sink_s, out_final, sm);
    else if (kv == KV_F32)
        gqa_split<KV_F32>(q, k_cache, v_cache, pos, kv_off, part_m, part_l, part_acc, hq, hkv, d,
                          window, min_split, scale, sink_s, out_final, sm);
    else
        gqa_split<KV_BF16>(q, k_cache, v_cache, pos, kv_off, part_m, part_l, part_acc, hq, hkv, d,
                           window, min_split, scale, sink_s, out_final, sm);
}

// ---- attn_split_gqa_tc: the GQA split on tensor cores (bf16 or fp8 cache, head dims 32 or
// 64, up to 16 query heads per KV head). The group's query heads are the M rows of mma.sync
// m16n8k16 (rows past G zero), keys the N (scores) and then the K dimension (P·V). Each warp
// walks 32-key tiles (lo + 32 warp, + 128, …) with online softmax per head, its next tile's K
// and V rows copied by cp.async into its half of a double buffer in shared memory
// ([warp][buffer][K, V][32 rows][d · element bytes + 16]; fp8: V rows only, the keys loaded
// into registers a tile ahead) while it works on the current one;
// the warps merge at the end as in attn_split_gqa. Scores: the order in which a dot product
// walks the head dims is free, so lane (g, q) feeds the MMA dims q d/4 + 4 s + {0, 1} (and
// + {2, 3}) at slice s, for the queries and the keys alike: each lane reads its key row's d/4
// consecutive dims in one or two 16-byte words. P·V: the scores' accumulators are the A
// fragments of P, V's B fragments come transposed from its staged rows (ldmatrix .trans).
// bf16 cache: bf16 queries (× scale × log2 e), keys, probabilities and values (as
// attn_prefill_tc). fp8 cache: the same on fp16 MMAs, E4M3 widened to fp16 exactly as the
// keys and values are read (V's fragments by ldmatrix .trans of the E4M3 rows as 16-bit pairs
// and a byte permutation), fp16 queries and probabilities. fp32 sums.
#define ATC_WARPS 4
// Warps of a block of the `_w8` entries (ops.rs ATC_WIDE_WARPS).
#define ATC_WIDE_WARPS 8
#define ATC_KT 32
#define ATC_MAX_D 64
// ATC_FINISH_HEADS 1: the merge's per-head scalars (the warps' weights, the sum, the sink's
// finish) computed once a head before the output elements take them; 0: by every element's
// thread, d times a head (docs/perf.md session 60). The same bits either way.
#ifndef ATC_FINISH_HEADS
#define ATC_FINISH_HEADS 1
#endif
// How the block merges its warps (docs/perf.md session 62; the same operations on the same
// values, so the same bits, either way). 2 (the default): each warp writes its outputs over
// its own stage (no barrier before), one barrier, then each thread makes four consecutive dims
// of one head (d is a multiple of 4), taking that head's scalars itself: a block of 128
// threads makes a group of 8 heads of 64 dims in one pass whose four chains of loads, sums and
// divisions overlap; the `_g8` entries' padding rows g + 8 are not written. 0: the merge
// before (three barriers, ATC_FINISH_HEADS's head threads, one element a thread a pass), for
// A/B. (Run 465's mode 1, four dims a thread behind the head threads, lost to 2 and is gone.)
#ifndef ATC_MERGE_VEC
#define ATC_MERGE_VEC 2
#endif
#if ATC_MERGE_VEC != 0 && ATC_MERGE_VEC != 2
#error "ATC_MERGE_VEC is 2 (the default) or 0"
#endif

// Word w (two dims) of the lane's d/4 dims of a key row, as a bf16 or fp16 pair.
template <bool FP8>
__device__ __forceinline__ unsigned atc_word(const uint4 (&c)[ATC_MAX_D / 32], int w) {
    if (FP8) {  // c[0] holds the d/4 bytes: word w is bytes 2w, 2w + 1
        const uint4 v = c[0];
        const int k = w >> 1;
        const unsigned x = k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
        unsigned lo, hi;
        e4m3x4_to_f16x2(x, lo, hi);
        return (w & 1) ? hi : lo;
    }
    const uint4 v = c[w >> 2];
    const int k = w & 3;
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

template <bool FP8>
__device__ __forceinline__ unsigned atc_pack(float a, float b) {
    return FP8 ? f16x2_rn(a, b) : pack_bf16x2(a, b);
}

template <bool FP8>
__device__ __forceinline__ void atc_mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    if (FP8)
        mma_f16_16816(c, a, b0, b1);
    else
        mma_bf16_16816(c, a, b0, b1);
}

// DC: the head dim when the entry is compiled for one (`_d64`), 0 for the entry that takes it
// at run time (32 or 64). With it fixed, the tile loop's trip counts, strides and divisions
// are constants: the copy loop unrolled without a division per 16 bytes, and no MMA under a
// run-time predicate (each such MMA compiled with a WARPSYNC of its own). W: warps a block.
// R = 1 (the `_g8` entries, at most 8 query heads a KV head): the MMA tile's rows g + 8 are
// padding, left out of the softmax (mma_softmax_step), the same sums for rows g.
template <bool FP8, int DC, int W, int R>
__device__ __forceinline__ void gqa_tc_split(const float* __restrict__ q, const u8* __restrict__ k_cache,
                                             const u8* __restrict__ v_cache, int p,
                                             unsigned long long off,
                                             float* __restrict__ part_m, float* __restrict__ part_l,
                                             float* __restrict__ part_acc, int hq, int hkv, int d_arg,
                                             int window, int min_split, float scale,
                                             const float* sink_s, float* __restrict__ out_final) {
    static_assert(DC == 0 || DC == 32 || DC == 64, "head dims 32 or 64");
    static_assert(R == 2 || DC != 0, "the run-time entries take up to 16 heads");
    const int d = DC ? DC : d_arg;
    extern __shared__ __align__(16) unsigned char atc_smem[];
    __shared__ float sm_m[W][16], sm_l[W][16];
    constexpr int ES = FP8 ? 1 : 2;
    const int kvh = blockIdx.x, split = blockIdx.y, nsplit = gridDim.y, t = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qd = lane & 3;
    const int G = hq / hkv;
    int lo, hi;
    if (!gqa_split_range(p, window, min_split, hq, G, kvh, split, nsplit, t, part_m, part_l, lo, hi))
        return;
    const size_t row0 = off + (size_t)kvh * d, stride = (size_t)hkv * d;
    const int rb = d * ES + 16, chunks = d * ES / 16, ns = d >> 4, cq = qd * (d >> 2);
    // The warp's region: two buffers of K and V rows (fp8: of V rows only, the keys going to
    // registers).
    constexpr int NR = FP8 ? 1 : 2;  // row sets a buffer holds
    u8* mine = atc_smem + (size_t)warp * (2 * NR * ATC_KT * rb);
    // Copy the 32-key tile at `base` (its K and V rows; fp8: V rows) into buffer `buf` (rows
    // past hi zero-filled), one commit group per call (empty where the warp has no tile there).
    // With the head dim fixed (DC), a whole tile's copies are lane-invariant offsets from one
    // address: the lane's row (lane / CH) and 16 bytes (lane % CH) of it, then rows RS apart.
    constexpr int CH = DC * ES / 16, RS = CH ? 32 / CH : 1;
    static_assert(DC == 0 || (CH <= 32 && 32 % CH == 0 && ATC_KT % RS == 0), "copy shape");
    auto issue = [&](int base, int buf) {
        if (DC && base + ATC_KT <= hi) {
            const size_t sb = stride * ES;
            const u8* kp = k_cache + (row0 + (size_t)(base + lane / CH) * stride) * ES + (lane % CH) * 16;
            const u8* vp = v_cache + (kp - k_cache);
            u8* dk = mine + (size_t)buf * NR * ATC_KT * rb + (lane / CH) * rb + (lane % CH) * 16;
#pragma unroll
            for (int j = 0; j < ATC_KT / RS; ++j) {
                if (!FP8) cp_async16(dk + j * RS * rb, kp + j * RS * sb, true);
                cp_async16(dk + ((NR - 1) * ATC_KT + j * RS) * rb, vp + j * RS * sb, true);
            }
        } else if (base < hi) {
            u8* dk = mine + (size_t)buf * NR * ATC_KT * rb;
#pragma unroll
            for (int i = lane; i < ATC_KT * chunks; i += 32) {
                const int r = i / chunks, c = (i - r * chunks) * 16;
                const size_t e = (row0 + (size_t)min(base + r, hi - 1) * stride) * ES + c;
                if (!FP8) cp_async16(dk + r * rb + c, k_cache + e, base + r < hi);
                cp_async16(dk + ((NR - 1) * ATC_KT + r) * rb + c, v_cache + e, base + r < hi);
            }
        }
        cp_async_commit();
    };
    // fp8: the lane's d/4 bytes of key rows nb * 8 + g of the tile at `base` (rows past hi
    // clamped to its last: their scores are masked), straight from the cache into registers a
    // tile ahead, as the V rows' copies are: no shared-memory round trip before the scores.
    uint4 kcur[ATC_KT / 8], knxt[ATC_KT / 8];
    auto kload = [&](int base, uint4 (&kr)[ATC_KT / 8]) {
        if constexpr (FP8) {
            if (base >= hi) return;
#pragma unroll
            for (int nb = 0; nb < ATC_KT / 8; ++nb) {
                const int r = min(base + nb * 8 + g, hi - 1);
                const u8* kp = k_cache + (row0 + (size_t)r * stride) * ES + cq * ES;
                if (d < 64) {
                    const uint2 h = __ldg(reinterpret_cast<const uint2*>(kp));
                    kr[nb] = make_uint4(h.x, h.y, 0u, 0u);
                } else {
                    kr[nb] = __ldg(reinterpret_cast<const uint4*>(kp));
                }
            }
        }
    };
    if constexpr (FP8) {
#pragma unroll
        for (int nb = 0; nb < ATC_KT / 8; ++nb) kcur[nb] = knxt[nb] = make_uint4(0u, 0u, 0u, 0u);
    }
    issue(lo + warp * ATC_KT, 0);
    kload(lo + warp * ATC_KT, kcur);
    // The queries of heads g and g + 8 as A fragments in the permuted dim order.
    const float qs = scale * ATTN_LOG2E;
    const float* qt = q + ((size_t)t * hq + (size_t)kvh * G) * d;
    unsigned qa[ATC_MAX_D / 16][4];
#pragma unroll
    for (int s = 0; s < ATC_MAX_D / 16; ++s) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int row = g + 8 * (j & 1), col = cq + 4 * s + 2 * (j >> 1);
            float2 v = make_float2(0.0f, 0.0f);
            if (row < G && s < ns) v = *reinterpret_cast<const float2*>(qt + (size_t)row * d + col);
            qa[s][j] = atc_pack<FP8>(v.x * qs, v.y * qs);
        }
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[ATC_MAX_D / 8][4];
#pragma unroll
    for (int n = 0; n < ATC_MAX_D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    int buf = 0;
    for (int base = lo + warp * ATC_KT; base < hi; base += W * ATC_KT) {
        issue(base + W * ATC_KT, buf ^ 1);
        kload(base + W * ATC_KT, knxt);
        cp_async_wait<1>();
        __syncwarp();
        const u8* ks = mine + (size_t)buf * NR * ATC_KT * rb;
        const u8* vs = ks + (NR - 1) * ATC_KT * rb;
        float sc[ATC_KT / 8][4];
#pragma unroll
        for (int nb = 0; nb < ATC_KT / 8; ++nb) {
            sc[nb][0] = sc[nb][1] = sc[nb][2] = sc[nb][3] = 0.0f;
            // The lane's d/4 dims of key row nb * 8 + g: d/4 * ES bytes at byte cq * ES.
            uint4 kc[ATC_MAX_D / 32];
            if (FP8) {
                kc[0] = kcur[nb];
            } else {
                const u8* kr = ks + (nb * 8 + g) * rb + cq * ES;
#pragma unroll
                for (int c = 0; c < ATC_MAX_D / 32; ++c)
                    if (16 * c < (d >> 2) * ES) kc[c] = *reinterpret_cast<const uint4*>(kr + 16 * c);
            }
#pragma unroll
            for (int s = 0; s < ATC_MAX_D / 16; ++s)
                if (s < ns)
                    atc_mma<FP8>(sc[nb], qa[s], atc_word<FP8>(kc, 2 * s), atc_word<FP8>(kc, 2 * s + 1));
        }
        // Keys past hi out (a partial tile only: the row's last), then the online softmax of
        // heads g and g + 8.
        if (base + ATC_KT > hi) {
#pragma unroll
            for (int nb = 0; nb < ATC_KT / 8; ++nb) {
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    if (base + nb * 8 + 2 * qd + (j & 1) >= hi) sc[nb][j] = -INFINITY;
            }
        }
        mma_softmax_step<ATC_KT / 8, ATC_MAX_D / 8, R>(sc, m, l, o);
        // O += P V, 16 keys at a time: P's accumulators of key blocks 2j, 2j + 1 are its A
        // fragment; V's B fragments come from its staged rows by ldmatrix .trans, the lane's
        // row address being key 16 j + (lane & 7) + 8 ((lane >> 3) & 1).
#pragma unroll
        for (int j = 0; j < ATC_KT / 16; ++j) {
            const unsigned pa[4] = {atc_pack<FP8>(sc[2 * j][0], sc[2 * j][1]),
                                    atc_pack<FP8>(sc[2 * j][2], sc[2 * j][3]),
                                    atc_pack<FP8>(sc[2 * j + 1][0], sc[2 * j + 1][1]),
                                    atc_pack<FP8>(sc[2 * j + 1][2], sc[2 * j + 1][3])};
            const int vk = 16 * j + (lane & 7) + 8 * ((lane >> 3) & 1);
            if (FP8) {
                // The staged E4M3 rows read as 16-bit elements (two dims each): one ldmatrix
                // .trans gives lane (g, q) dims 2p, 2p + 1 of keys 2q, 2q + 1 (p = 16 t4 + g, +8
                // in registers 2, 3), keys 8 on in registers 1, 3. One byte permutation splits a
                // register into its even dim's key pair and its odd dim's, each widened to fp16
                // exactly: the B fragments of n8 blocks whose columns are every other dim. So
                // o[2 pg + s] (pg = 2 t4 + u) holds dims 16 pg + 2 c + s for its columns c, in
                // place of 8 n … 8 n + 7 (the outputs are stored by that map below). No fp16
                // copy of V in shared memory.
#pragma unroll
                for (int t4 = 0; t4 < ATC_MAX_D / 32; ++t4) {
                    if (32 * t4 >= d) break;
                    unsigned bv[4];
                    ldmatrix_x4_trans(bv, reinterpret_cast<const bf16_t*>(vs + vk * rb + 32 * t4 + 16 * (lane >> 4)));
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        unsigned e0, o0, e1, o1;
                        e4m3x4_to_f16x2(__byte_perm(bv[2 * u], 0u, 0x3120), e0, o0);
                        e4m3x4_to_f16x2(__byte_perm(bv[2 * u + 1], 0u, 0x3120), e1, o1);
                        atc_mma<FP8>(o[4 * t4 + 2 * u], pa, e0, e1);
                        atc_mma<FP8>(o[4 * t4 + 2 * u + 1], pa, o0, o1);
                    }
                }
            } else {
                // bf16 rows: 16 dims (two n8 blocks) per ldmatrix.
#pragma unroll
                for (int n2 = 0; n2 < ATC_MAX_D / 16; ++n2) {
                    if (n2 >= ns) break;
                    unsigned bv[4];
                    ldmatrix_x4_trans(bv, reinterpret_cast<const bf16_t*>(vs) + vk * (rb / 2) + 16 * n2 + 8 * (lane >> 4));
                    atc_mma<FP8>(o[2 * n2], pa, bv[0], bv[1]);
                    atc_mma<FP8>(o[2 * n2 + 1], pa, bv[2], bv[3]);
                }
            }
        }
        __syncwarp();  // the buffers are refilled by the next iteration
        buf ^= 1;
        if constexpr (FP8) {
#pragma unroll
            for (int nb = 0; nb < ATC_KT / 8; ++nb) kcur[nb] = knxt[nb];
        }
    }
    cp_async_wait<0>();
    attn_trigger_late(out_final);
    // Merge the warps per head: (m, l) and the outputs through shared memory (the outputs
    // over the stage, free now), then the split's partials.
    // Rows g + 8 are padding in the `_g8` entries (R = 1): no head reads them.
    constexpr int RW = ATC_MERGE_VEC ? R : 2;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    // Warp w's outputs, [16 heads][d] floats, at so + w sow. ATC_MERGE_VEC 2: over the warp's
    // own stage, free once its lanes are past their last tile (its copies done, cp_async_wait
    // above), so no barrier before the writes; else over the block's stage from its start,
    // which the other warps may still be reading until the barrier.
#if ATC_MERGE_VEC
    static_assert(16 * 64 * 4 <= 2 * NR * ATC_KT * (64 * ES + 16) &&
                      16 * 32 * 4 <= 2 * NR * ATC_KT * (32 * ES + 16),
                  "a warp's outputs fit its stage");
    __syncwarp();
    const size_t sow = (size_t)(2 * NR * ATC_KT * rb) / 4;
#else
    __syncthreads();
    const size_t sow = (size_t)16 * d;
#endif
    float* so = reinterpret_cast<float*>(atc_smem);
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int h = g + 8 * r;
        float* sw = so + warp * sow + (size_t)h * d;
        if (qd == 0) {
            sm_m[warp][h] = m[r];
            sm_l[warp][h] = l[r];
        }
        if (FP8) {  // o[2 pg + s] column c: dim 16 pg + 2 c + s (the P V loop's map)
#pragma unroll
            for (int pg = 0; pg < ATC_MAX_D / 16; ++pg) {
                if (pg >= ns) break;
                *reinterpret_cast<float4*>(sw + 16 * pg + 4 * qd) =
                    make_float4(o[2 * pg][2 * r], o[2 * pg + 1][2 * r], o[2 * pg][2 * r + 1],
                                o[2 * pg + 1][2 * r + 1]);
            }
        } else {
#pragma unroll
            for (int n = 0; n < ATC_MAX_D / 8; ++n) {
                if (n >= 2 * ns) break;
                *reinterpret_cast<float2*>(sw + 8 * n + 2 * qd) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
            }
        }
    }
    __syncthreads();
    // Head h's scalars: the max over the warps, each warp's weight exp2(m_w - max) and the sum
    // (every way of merging below takes them by these operations, in this order).
    auto head = [&](int h, float& mm, float (&f)[W], float& ll) {
        mm = -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) mm = fmaxf(mm, sm_m[w][h]);
        ll = 0.0f;
#pragma unroll
        for (int w = 0; w < W; ++w) f[w] = 0.0f;
        if (mm != -INFINITY) {
#pragma unroll
            for (int w = 0; w < W; ++w) {
                f[w] = sm_m[w][h] == -INFINITY ? 0.0f : exp2f(sm_m[w][h] - mm);
                ll += sm_l[w][h] * f[w];
            }
        }
    };
#if ATC_MERGE_VEC
    // Each thread four consecutive dims of one head (d is a multiple of 4; 16-byte stores where
    // the outputs' bases allow them: aligned allocations, checked, uniform over the launch),
    // taking its head's scalars itself: one barrier in all, no round trip of the scalars
    // through shared memory.
    if (((reinterpret_cast<size_t>(out_final) | reinterpret_cast<size_t>(part_acc)) & 15) == 0) {
        for (int i = 4 * threadIdx.x; i < G * d; i += 4 * blockDim.x) {
            const int h = i / d, c = i - h * d;
            float mm, f[W], ll;
            head(h, mm, f, ll);
            float4 out = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (mm != -INFINITY) {
#pragma unroll
                for (int w = 0; w < W; ++w) {
                    const float4 v = *reinterpret_cast<const float4*>(so + w * sow + (size_t)h * d + c);
                    out.x += v.x * f[w];
                    out.y += v.y * f[w];
                    out.z += v.z * f[w];
                    out.w += v.w * f[w];
                }
            }
            if (out_final) {
                float fin, den;
                attn_finish(mm * ATTN_LN2, ll, sink_s[h], fin, den);
                *reinterpret_cast<float4*>(out_final + ((size_t)t * hq + (size_t)kvh * G + h) * d + c) =
                    make_float4(out.x * fin / den, out.y * fin / den, out.z * fin / den, out.w * fin / den);
                continue;
            }
            const size_t pi = ((size_t)t * hq + (size_t)kvh * G + h) * nsplit + split;
            if (c == 0) {
                part_m[pi] = mm * ATTN_LN2;
                part_l[pi] = ll;
            }
            *reinterpret_cast<float4*>(part_acc + pi * d + c) = out;
        }
        return;
    }
#endif
#if ATC_FINISH_HEADS && !ATC_MERGE_VEC
    // Each head's scalars once, by one thread a head; then every output element takes them
    // from shared memory. The same operations on the same values as computing them for
    // each element (ATC_FINISH_HEADS 0).
    __shared__ float sm_f[W][16], sm_fin[16], sm_den[16];
    __shared__ int sm_live[16];
    if (threadIdx.x < G) {
        const int h = threadIdx.x;
        float mm, f[W], ll;
        head(h, mm, f, ll);
        sm_live[h] = mm != -INFINITY;
#pragma unroll
        for (int w = 0; w < W; ++w) sm_f[w][h] = f[w];
        if (out_final) {
            float fin, den;
            attn_finish(mm * ATTN_LN2, ll, sink_s[h], fin, den);
            sm_fin[h] = fin;
            sm_den[h] = den;
        } else {
            const size_t pi = ((size_t)t * hq + (size_t)kvh * G + h) * nsplit + split;
            part_m[pi] = mm * ATTN_LN2;
            part_l[pi] = ll;
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
        const int h = i / d, c = i - h * d;
        float out = 0.0f;
        if (sm_live[h]) {
#pragma unroll
            for (int w = 0; w < W; ++w) out += so[w * sow + (size_t)h * d + c] * sm_f[w][h];
        }
        if (out_final) {
            out_final[((size_t)t * hq + (size_t)kvh * G + h) * d + c] = out * sm_fin[h] / sm_den[h];
            continue;
        }
        const size_t pi = ((size_t)t * hq + (size_t)kvh * G + h) * nsplit + split;
        part_acc[pi * d + c] = out;
    }
    return;
#endif
    // One element a thread, its head's scalars computed by the thread (ATC_FINISH_HEADS 0 under
    // ATC_MERGE_VEC 0, and ATC_MERGE_VEC 2 where the outputs' bases are not 16-byte aligned).
    for (int i = threadIdx.x; i < G * d; i += blockDim.x) {
        const int h = i / d, c = i - h * d;
        float mm, f[W], ll;
        head(h, mm, f, ll);
        float out = 0.0f;
        if (mm != -INFINITY) {
#pragma unroll
            for (int w = 0; w < W; ++w) out += so[w * sow + (size_t)h * d + c] * f[w];
        }
        if (out_final) {
            float fin, den;
            attn_finish(mm * ATTN_LN2, ll, sink_s[h], fin, den);
            out_final[((size_t)t * hq + (size_t)kvh * G + h) * d + c] = out * fin / den;
            continue;
        }
        const size_t pi = ((size_t)t * hq + (size_t)kvh * G + h) * nsplit + split;
        if (c == 0) {
            part_m[pi] = mm * ATTN_LN2;
            part_l[pi] = ll;
        }
        part_acc[pi * d + c] = out;
    }
}

// grid = (Hkv, nsplit, T), block = W warps (ATC_WARPS, or ATC_WIDE_WARPS for the `_w8`
// entries). One entry per cache kind, each holding only its own path (kv, KV_BF16 or KV_FP8,
// is the entry's own: the host checks): the kernel of both kinds was 4096 instructions and
// 1088 bytes of static shared memory, the bf16 one alone is 2736 and 576, and steps ran
// 0.2-0.6 % faster with it (docs/perf.md runs 227-228).
// Before the wait: the (immutable) sinks, and the row's position and cache offset (step
// inputs), so that after it the key range and the first K/V copies wait on no load.
// Dynamic shared memory: W * 4 * ATC_KT * (d * 2 + 16) bytes for a bf16 cache,
// W * 2 * ATC_KT * (d + 16) for fp8 (V rows only) (ops.rs gqa_tc_smem).
// The `_w8` entries (fp8 only): eight warps walk a split's tiles, so a block of the same keys
// has twice the warps in flight; bounded to 128 registers so that two blocks fit an SM.
#define ATTN_SPLIT_GQA_TC(name, FP8, DC, W, R, BOUNDS)                                         \
    extern "C" __global__ void __launch_bounds__ BOUNDS                                        \
    name(const float* __restrict__ q, const void* __restrict__ k_cache,                        \
         const void* __restrict__ v_cache, int kv, const unsigned* __restrict__ pos,           \
         const unsigned long long* __restrict__ kv_off, float* __restrict__ part_m,            \
         float* __restrict__ part_l, float* __restrict__ part_acc, int hq, int hkv, int d,     \
         int window, int min_split, float scale, const bf16_t* __restrict__ sinks,             \
         float* __restrict__ out_final) {                                                      \
        __shared__ float sink_s[16];                                                           \
        attn_sinks_early(sinks, out_final, blockIdx.x * (hq / hkv), hq / hkv, sink_s);         \
        const int p_early = (int)ld_early_u32(pos + blockIdx.z);                               \
        const unsigned long long off_early = ld_early_u64(kv_off + blockIdx.z);                \
        pdl_enter_as(attn_trigger_mode(out_final));                                            \
        gqa_tc_split<FP8, DC, W, R>(q, static_cast<const u8*>(k_cache),                        \
                                 static_cast<const u8*>(v_cache), p_early, off_early, part_m,  \
                                 part_l, part_acc, hq, hkv, d, window, min_split, scale,       \
                                 sink_s, out_final);                                           \
    }
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc, false, 0, ATC_WARPS, 2, (ATC_WARPS * 32))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8, true, 0, ATC_WARPS, 2, (ATC_WARPS * 32))
// Head dim 64, the host's pick wherever d is 64: the same sums as the entries above; `_g8`
// (gpt-oss) where also at most 8 query heads share a KV head.
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_d64, false, 64, ATC_WARPS, 2, (ATC_WARPS * 32))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8_d64, true, 64, ATC_WARPS, 2, (ATC_WARPS * 32))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_d64_g8, false, 64, ATC_WARPS, 1, (ATC_WARPS * 32))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8_d64_g8, true, 64, ATC_WARPS, 1, (ATC_WARPS * 32))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8_w8, true, 0, ATC_WIDE_WARPS, 2, (ATC_WIDE_WARPS * 32, 2))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8_d64_w8, true, 64, ATC_WIDE_WARPS, 2, (ATC_WIDE_WARPS * 32, 2))
ATTN_SPLIT_GQA_TC(attn_split_gqa_tc_fp8_d64_w8_g8, true, 64, ATC_WIDE_WARPS, 1, (ATC_WIDE_WARPS * 32, 2))

// grid = (Hq, T), block = ATTN_COMBINE_THREADS; nsplit <= ATTN_MAX_SPLITS. Each split's
// weight exp(m_s - max) is computed once, by one thread, into shared memory; then thread
// (dim i, slice p) sums the outputs of splits p, p + slices, … and the slices are added in a
// fixed order. sinks == nullptr turns the sink off (diagnostic only).
// Every load is issued right after the wait, before any reduction: the thread's split's max
// and sum, and the first ATTN_COMBINE_AHEAD of its slice's outputs (those of empty splits
// too, never used: such a split wrote none). The chain is then one L2 round trip where it
// was three (max, then sums, then outputs; docs/perf.md session 36); the same sums.
#define ATTN_COMBINE_THREADS 256
#define ATTN_MAX_SPLITS 64
#define ATTN_COMBINE_AHEAD 16
static_assert(ATTN_MAX_SPLITS <= ATTN_COMBINE_THREADS, "one split a thread");
// ATTN_COMBINE_VEC 1 (the default; docs/perf.md run 470): where d is a multiple of 4 (and the
// partials and outputs are 16-byte aligned), every warp takes the maximum, the splits' weights
// and the sum itself by shuffles (lane j holds splits j and j + 32); thread (four dims, slice
// p) sums its slice's splits' outputs as float4, the weights shuffled from the lanes holding
// them; one barrier precedes the slices' fixed-order sum, where the block-wide max and sum of
// the path below take four more. The sink logit and the index arithmetic come before the wait.
// Another order of sums than the path below where more than one split has weight; one split
// gives the same bits (the split kernel's own finish). 0: the path below for every d, for A/B.
#ifndef ATTN_COMBINE_VEC
#define ATTN_COMBINE_VEC 1
#endif
#define ATTN_COMBINE_AHEAD4 8
static_assert(ATTN_MAX_SPLITS <= 64, "two splits a lane");
// attn_combine's path of ATTN_COMBINE_VEC (attn_combine_vec_takes: d a multiple of 4 up to
// 4 × ATTN_COMBINE_THREADS, the partials and outputs 16-byte aligned). It waits itself, after
// reading the sink logit (a weight) and doing the index arithmetic; attn_combine returns
// after it (compile.rs checks what comes before its wait).
__device__ __forceinline__ bool attn_combine_vec_takes(const float* part_acc, const float* out, int d) {
    return (d & 3) == 0 && d <= 4 * ATTN_COMBINE_THREADS &&
           ((reinterpret_cast<size_t>(part_acc) | reinterpret_cast<size_t>(out)) & 15) == 0;
}
__device__ __forceinline__ void attn_combine_vec(const float* __restrict__ part_m,
                                                 const float* __restrict__ part_l,
                                                 const float* __restrict__ part_acc,
                                                 const bf16_t* __restrict__ sinks,
                                                 float* __restrict__ out, int hq, int d,
                                                 int nsplit) {
    __shared__ float4 sl[ATTN_COMBINE_THREADS];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x, lane = tid & 31;
    // Before the wait: the sink (a weight; a weak load, which ptxas keeps above it) and
    // the index arithmetic (its divisions), pinned there by the empty volatile asm.
    const float sink = sinks ? ld_early_bf16(sinks + h) : -INFINITY;
    int tps = d >> 2, slices = blockDim.x / tps, i4 = tid % tps, p = tid / tps;
    int np = p < slices ? (nsplit - p + slices - 1) / slices : 0;
    size_t base = ((size_t)t * hq + h) * nsplit;
    // The thread's first split's outputs (in float4s), and the step to its slice's next.
    size_t first = (base + p) * tps + i4, step = (size_t)slices * tps;
    asm volatile("" : "+r"(slices), "+r"(np), "+l"(base), "+l"(first), "+l"(step));
    pdl_enter();
    const float4* pa = reinterpret_cast<const float4*>(part_acc) + first;
    const float m0 = lane < nsplit ? part_m[base + lane] : -INFINITY;
    const float l0 = lane < nsplit ? part_l[base + lane] : 0.0f;
    const float m1 = lane + 32 < nsplit ? part_m[base + lane + 32] : -INFINITY;
    const float l1 = lane + 32 < nsplit ? part_l[base + lane + 32] : 0.0f;
    float4 a[ATTN_COMBINE_AHEAD4];
#pragma unroll
    for (int j = 0; j < ATTN_COMBINE_AHEAD4; ++j)
        a[j] = j < np ? pa[j * step] : make_float4(0.f, 0.f, 0.f, 0.f);
    const float mm = warp_max(fmaxf(sink, fmaxf(m0, m1)));
    const float f0 = m0 == -INFINITY ? 0.0f : expf(m0 - mm);
    const float f1 = m1 == -INFINITY ? 0.0f : expf(m1 - mm);
    float ll = warp_sum(l0 * f0 + l1 * f1);
    if (sinks) ll += expf(sink - mm);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    // A split of weight 0 adds nothing; an empty one wrote no outputs (its loaded value
    // unused). The first ATTN_COMBINE_AHEAD4 splits' weights come by shuffle from the lane
    // holding them (every lane shuffles: the slices' counts differ within a warp); any
    // further split's (d > 128 only) is recomputed from its max, the same operation.
    auto add = [&](const float4 v, float ws) {
        if (ws != 0.0f) {
            acc.x += v.x * ws;
            acc.y += v.y * ws;
            acc.z += v.z * ws;
            acc.w += v.w * ws;
        }
    };
#pragma unroll
    for (int j = 0; j < ATTN_COMBINE_AHEAD4; ++j) {
        const int s = p + j * slices;
        const float wa = __shfl_sync(0xffffffffu, f0, s & 31);
        const float wb = __shfl_sync(0xffffffffu, f1, s & 31);
        if (j < np) add(a[j], s < 32 ? wa : wb);
    }
    for (int j = ATTN_COMBINE_AHEAD4; j < np; ++j) {
        const int s = p + j * slices;
        const float ms = part_m[base + s];
        add(pa[j * step], ms == -INFINITY ? 0.0f : expf(ms - mm));
    }
    sl[tid] = acc;
    __syncthreads();
    if (tid < tps) {
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int q = 0; q < slices; ++q) {
            const float4 v = sl[q * tps + tid];
            r.x += v.x;
            r.y += v.y;
            r.z += v.z;
            r.w += v.w;
        }
        reinterpret_cast<float4*>(out)[((size_t)t * hq + h) * tps + tid] =
            make_float4(r.x / ll, r.y / ll, r.z / ll, r.w / ll);
    }
}
extern "C" __global__ void __launch_bounds__(ATTN_COMBINE_THREADS)
attn_combine(const float* __restrict__ part_m, const float* __restrict__ part_l,
             const float* __restrict__ part_acc, const bf16_t* __restrict__ sinks,
             float* __restrict__ out, int hq, int d, int nsplit) {
#if ATTN_COMBINE_VEC
    if (attn_combine_vec_takes(part_acc, out, d)) {
        attn_combine_vec(part_m, part_l, part_acc, sinks, out, hq, d, nsplit);
        return;
    }
#endif
    pdl_enter();
    __shared__ float w[ATTN_MAX_SPLITS];
    __shared__ float red[32];
    __shared__ float slice[ATTN_COMBINE_THREADS];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const size_t base = ((size_t)t * hq + h) * nsplit;
    const bool has = tid < nsplit;
    const float ms = has ? part_m[base + tid] : -INFINITY;
    const float ls = has ? part_l[base + tid] : 0.0f;
    const float sink = sinks ? bf2f(sinks[h]) : -INFINITY;
    const int slices = blockDim.x / d, i = tid % d, p = tid / d;
    const int np = p < slices ? (nsplit - p + slices - 1) / slices : 0;  // this slice's splits
    float a[ATTN_COMBINE_AHEAD];
#pragma unroll
    for (int j = 0; j < ATTN_COMBINE_AHEAD; ++j)
        a[j] = j < np ? part_acc[(base + p + (size_t)j * slices) * d + i] : 0.0f;
    const float mm = block_max(fmaxf(sink, ms), red);
    float ll = 0.0f;
    if (has) {
        const float f = ms == -INFINITY ? 0.0f : expf(ms - mm);
        w[tid] = f;
        ll += ls * f;
    }
    ll = block_sum(ll, red);  // its barriers also publish w
    if (sinks) ll += expf(sink - mm);
    float acc = 0.0f;
    // A split of weight 0 adds nothing; an empty one wrote no outputs (its loaded value unused).
#pragma unroll
    for (int j = 0; j < ATTN_COMBINE_AHEAD; ++j)
        if (j < np && w[p + j * slices] != 0.0f) acc += a[j] * w[p + j * slices];
    for (int j = ATTN_COMBINE_AHEAD; j < np; ++j) {
        const int s = p + j * slices;
        if (w[s] != 0.0f) acc += part_acc[(base + s) * d + i] * w[s];
    }
    slice[tid] = acc;
    __syncthreads();
    if (tid < d) {
        float a2 = 0.0f;
        for (int q = 0; q < slices; ++q) a2 += slice[q * d + tid];
        out[((size_t)t * hq + h) * d + tid] = a2 / ll;
    }
}
