// MoE for decode: only the k routed experts' MXFP4 weights are read.
// MXFP4 layout (checkpoint order): blocks [E, rows, cols/32, 16] u8, byte j of a block holds
// element 2j in the low nibble and 2j+1 in the high nibble; scales [E, rows, cols/32] UE8M0.
// gate_up rows interleave gate (even) and linear (odd) units; bias bf16 [E, rows].
//
// Each lane multiplies whole 32-element blocks, so it needs 32 consecutive activations; read
// from global memory, a warp's 32 lanes would touch 32 different cache lines per load. The
// activations are therefore staged once per thread block in shared memory, each group of 32
// padded to 36 floats so the lanes' 16-byte reads fall in distinct banks.
#define MOE_PAD 36

// Copy n fp32 (n a multiple of 32) into padded shared memory. Whole block must call it.
__device__ __forceinline__ void stage_padded(const float* __restrict__ src, float* dst, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[(i >> 5) * MOE_PAD + (i & 31)] = src[i];
}

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

// act[t, s, j] = swiglu(gate_j, lin_j) for expert idx[t, s]; grid = (ceil(I / 8), k, T),
// block = 256 (one warp per unit j, reading rows 2j and 2j + 1 against one staged x). The
// first weight loads are issued before the staging, and each iteration prefetches the next.
// Dynamic shared memory: hidden / 32 * MOE_PAD floats.
extern "C" __global__ void __launch_bounds__(256, MOE_DECODE_MINB)
moe_gate_up_swiglu(const u8* __restrict__ blocks, const u8* __restrict__ scales,
                   const bf16_t* __restrict__ bias, const float* __restrict__ x,
                   const int* __restrict__ idx, float* __restrict__ act, int inter, int hidden,
                   int k, float limit, float alpha) {
    extern __shared__ float xs[];
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int s = blockIdx.y, t = blockIdx.z;
    const bool live = j < inter;
    const int e = idx[t * k + s];
    const int nb = hidden >> 5;
    const size_t rows = 2 * (size_t)inter;
    const size_t rg = (size_t)e * rows + 2 * (size_t)(live ? j : 0), rl = rg + 1;
    const uint4* bg = reinterpret_cast<const uint4*>(blocks) + rg * nb;
    const uint4* bl = reinterpret_cast<const uint4*>(blocks) + rl * nb;
    const u8* sg = scales + rg * nb;
    const u8* sl = scales + rl * nb;
    // Two blocks (b and b + 32) in flight per row and lane, refilled one iteration ahead.
    uint4 ng[2], nl[2];
    unsigned nsg[2], nsl[2];
    auto fetch = [&](int slot, int b) {
        if (live && b < nb) {
            ng[slot] = __ldg(bg + b); nl[slot] = __ldg(bl + b);
            nsg[slot] = sg[b]; nsl[slot] = sl[b];
        }
    };
    fetch(0, lane);
    fetch(1, lane + 32);
    stage_padded(x + (size_t)t * hidden, xs, hidden);
    __syncthreads();
    if (!live) return;
    float g = 0.0f, l = 0.0f;
    for (int b0 = lane; b0 < nb; b0 += 64) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            const int b = b0 + 32 * slot;
            if (b < nb) {
                const uint4 cg = ng[slot], cl = nl[slot];
                const unsigned csg = nsg[slot], csl = nsl[slot];
                fetch(slot, b + 64);
                const float* xb = xs + b * MOE_PAD;
                g += fp4_block_dot(cg, xb) * e8m0_value(csg);
                l += fp4_block_dot(cl, xb) * e8m0_value(csl);
            }
        }
    }
    g = warp_sum(g);
    l = warp_sum(l);
    if (lane != 0) return;
    g += bf2f(bias[rg]);
    l += bf2f(bias[rl]);
    g = fminf(g, limit);
    l = fminf(fmaxf(l, -limit), limit);
    const float a = g / (1.0f + expf(-alpha * g)) * (l + 1.0f);
    act[((size_t)t * k + s) * inter + j] = a;
}

// part[t, s, r] = w[t, s] * (W2_e[r, :] . act[t, s, :] + b2_e[r]) for e = idx[t, s] (the down
// bias inside the weighted sum); moe_combine then adds the k slots into the residual, in slot
// order (deterministic). grid = (ceil(H / 16), k, T), block = 256: each warp owns two adjacent
// output rows (one staged activation read serves both), its lanes stride over the expert's
// blocks. One block per (rows, slot) keeps the staged activations small (I floats) and the
// grid wide enough to fill the chip at batch 1. The first weights are loaded before the
// staging, and each iteration prefetches the next. Dynamic shared memory: inter / 32 *
// MOE_PAD floats.
extern "C" __global__ void __launch_bounds__(256, MOE_DECODE_MINB)
moe_down(const u8* __restrict__ blocks, const u8* __restrict__ scales,
         const bf16_t* __restrict__ bias, const float* __restrict__ act,
         const int* __restrict__ idx, const float* __restrict__ wts, float* __restrict__ part,
         int hidden, int inter, int k) {
    extern __shared__ float as[];
    const int lane = threadIdx.x & 31;
    const int r0 = (blockIdx.x * 8 + (threadIdx.x >> 5)) * 2;
    const int s = blockIdx.y, t = blockIdx.z;
    const bool live = r0 < hidden;
    const bool two = r0 + 1 < hidden;
    const int nb = inter >> 5;
    const size_t row = (size_t)idx[t * k + s] * hidden + (live ? r0 : 0);
    const uint4* b0 = reinterpret_cast<const uint4*>(blocks) + row * nb;
    const uint4* b1 = b0 + nb;
    const u8* s0 = scales + row * nb;
    const u8* s1 = s0 + nb;
    // Two blocks (b and b + 32) in flight per row and lane, refilled one iteration ahead.
    uint4 n0[2], n1[2];
    unsigned ns0[2], ns1[2];
    auto fetch = [&](int slot, int b) {
        if (!live || b >= nb) return;
        n0[slot] = __ldg(b0 + b);
        ns0[slot] = s0[b];
        if (two) {
            n1[slot] = __ldg(b1 + b);
            ns1[slot] = s1[b];
        }
    };
    fetch(0, lane);
    fetch(1, lane + 32);
    stage_padded(act + ((size_t)t * k + s) * inter, as, inter);
    __syncthreads();
    if (!live) return;
    float t0 = 0.0f, t1 = 0.0f;
    for (int bb = lane; bb < nb; bb += 64) {
#pragma unroll
        for (int slot = 0; slot < 2; ++slot) {
            const int b = bb + 32 * slot;
            if (b < nb) {
                const uint4 c0 = n0[slot], c1 = n1[slot];
                const unsigned cs0 = ns0[slot], cs1 = ns1[slot];
                fetch(slot, b + 64);
                const float* a = as + b * MOE_PAD;
                t0 += fp4_block_dot(c0, a) * e8m0_value(cs0);
                if (two) t1 += fp4_block_dot(c1, a) * e8m0_value(cs1);
            }
        }
    }
    t0 = warp_sum(t0);
    t1 = warp_sum(t1);
    if (lane == 0) {
        const float w = wts[t * k + s];
        float* pp = part + ((size_t)t * k + s) * hidden + r0;
        pp[0] = w * (t0 + bf2f(bias[row]));
        if (two) pp[1] = w * (t1 + bf2f(bias[row + 1]));
    }
}
