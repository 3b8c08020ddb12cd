// MoE for decode: only the k routed experts' MXFP4 weights are read.
// MXFP4 layout (checkpoint order): blocks [E, rows, cols/32, 16] u8, byte j of a block holds
// element 2j in the low nibble and 2j+1 in the high nibble; scales [E, rows, cols/32] UE8M0.
// gate_up rows interleave gate (even) and linear (odd) units; bias bf16 [E, rows].

// Dot product of one 32-element MXFP4 block with 32 fp32 activations (scale applied by the
// caller). Activations come straight from global memory (L1-resident: one token's vector).
__device__ __forceinline__ float fp4_block_dot(uint4 q, const float* __restrict__ x) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
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
// block = 256 (one warp per unit j, reading rows 2j and 2j + 1; two blocks per lane per
// iteration so four 16-byte loads are in flight).
extern "C" __global__ void __launch_bounds__(256)
moe_gate_up_swiglu(const u8* __restrict__ blocks, const u8* __restrict__ scales,
                   const bf16_t* __restrict__ bias, const float* __restrict__ x,
                   const int* __restrict__ idx, float* __restrict__ act, int inter, int hidden,
                   int k, float limit, float alpha) {
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int s = blockIdx.y, t = blockIdx.z;
    if (j >= inter) return;
    const int e = idx[t * k + s];
    const int nb = hidden >> 5;
    const size_t rows = 2 * (size_t)inter;
    const size_t rg = (size_t)e * rows + 2 * j, rl = rg + 1;
    const uint4* bg = reinterpret_cast<const uint4*>(blocks) + rg * nb;
    const uint4* bl = reinterpret_cast<const uint4*>(blocks) + rl * nb;
    const u8* sg = scales + rg * nb;
    const u8* sl = scales + rl * nb;
    const float* xt = x + (size_t)t * hidden;
    float g = 0.0f, l = 0.0f;
    int b = lane;
    for (; b + 32 < nb; b += 64) {
        const uint4 qg0 = __ldg(bg + b), ql0 = __ldg(bl + b);
        const uint4 qg1 = __ldg(bg + b + 32), ql1 = __ldg(bl + b + 32);
        const float sg0 = e8m0_value(sg[b]), sl0 = e8m0_value(sl[b]);
        const float sg1 = e8m0_value(sg[b + 32]), sl1 = e8m0_value(sl[b + 32]);
        g += fp4_block_dot(qg0, xt + 32 * b) * sg0 + fp4_block_dot(qg1, xt + 32 * (b + 32)) * sg1;
        l += fp4_block_dot(ql0, xt + 32 * b) * sl0 + fp4_block_dot(ql1, xt + 32 * (b + 32)) * sl1;
    }
    if (b < nb) {
        g += fp4_block_dot(__ldg(bg + b), xt + 32 * b) * e8m0_value(sg[b]);
        l += fp4_block_dot(__ldg(bl + b), xt + 32 * b) * e8m0_value(sl[b]);
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

// y[t, r] (+)= sum_s w[t, s] * (W2_e[r, :] . act[t, s, :] + b2_e[r]); the down bias sits inside
// the weighted sum. grid = (ceil(H / 8), T), block = 256: one warp per output row; the warp's
// lanes stride over all (expert, block) pairs of the row, four loads in flight, so every
// expert is summed in registers (no atomics, deterministic).
extern "C" __global__ void __launch_bounds__(256)
moe_down(const u8* __restrict__ blocks, const u8* __restrict__ scales,
         const bf16_t* __restrict__ bias, const float* __restrict__ act,
         const int* __restrict__ idx, const float* __restrict__ wts, float* __restrict__ y,
         int hidden, int inter, int k, int accumulate) {
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * 8 + (threadIdx.x >> 5);
    const int t = blockIdx.y;
    if (r >= hidden) return;
    const int nb = inter >> 5;
    const int items = k * nb;
    const uint4* b4 = reinterpret_cast<const uint4*>(blocks);
    const float* at = act + (size_t)t * k * inter;
    float total = 0.0f;
    for (int it0 = lane; it0 < items; it0 += 128) {
        uint4 q[4];
        float sc[4];
        int off[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int it = it0 + 32 * u;
            if (it < items) {
                const int s = it / nb, b = it - s * nb;
                const size_t row = (size_t)idx[t * k + s] * hidden + r;
                q[u] = __ldg(b4 + row * nb + b);
                sc[u] = e8m0_value(scales[row * nb + b]) * wts[t * k + s];
                off[u] = s * inter + 32 * b;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (it0 + 32 * u < items) total += fp4_block_dot(q[u], at + off[u]) * sc[u];
    }
    total = warp_sum(total);
    if (lane == 0) {
        for (int s = 0; s < k; ++s) total += wts[t * k + s] * bf2f(bias[(size_t)idx[t * k + s] * hidden + r]);
        float* yp = y + (size_t)t * hidden + r;
        *yp = accumulate ? *yp + total : total;
    }
}
