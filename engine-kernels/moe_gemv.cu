// MoE for decode: only the k routed experts' MXFP4 weights are read.
// MXFP4 layout (checkpoint order): blocks [E, rows, cols/32, 16] u8, byte j of a block holds
// element 2j in the low nibble and 2j+1 in the high nibble; scales [E, rows, cols/32] UE8M0.
// gate_up rows interleave gate (even) and linear (odd) units; bias bf16 [E, rows].

// Dot product of one 32-element MXFP4 block with 32 fp32 activations held in registers
// (scale applied by the caller).
__device__ __forceinline__ float fp4_block_dot(uint4 q, const float (&x)[32]) {
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    float s = 0.0f;
#pragma unroll
    for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
        for (int j = 0; j < 8; ++j) s += fp4_value(wq[wi] >> (4 * j)) * x[wi * 8 + j];
    }
    return s;
}

// Load 32 consecutive fp32 activations (16-byte aligned) into registers.
__device__ __forceinline__ void load_x32(const float* __restrict__ p, float (&x)[32]) {
    const float4* p4 = reinterpret_cast<const float4*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float4 v = p4[i];
        x[4 * i] = v.x; x[4 * i + 1] = v.y; x[4 * i + 2] = v.z; x[4 * i + 3] = v.w;
    }
}

// act[t, s, j] = swiglu(gate_j, lin_j) for expert idx[t, s]; grid = (ceil(I / 8), k, T),
// block = 256 (one warp per unit j, reading rows 2j and 2j + 1).
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
    for (int b = lane; b < nb; b += 32) {
        const uint4 qg = __ldg(bg + b), ql = __ldg(bl + b);
        float xr[32];
        load_x32(xt + 32 * b, xr);
        g += fp4_block_dot(qg, xr) * e8m0_value(sg[b]);
        l += fp4_block_dot(ql, xr) * e8m0_value(sl[b]);
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
// the weighted sum. grid = (ceil(H / 8), T), block = 256 (one warp per output row, all k
// experts summed in registers, so no atomics and a deterministic result).
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
    float total = 0.0f;
    for (int s = 0; s < k; ++s) {
        const int e = idx[t * k + s];
        const size_t row = (size_t)e * hidden + r;
        const uint4* bq = reinterpret_cast<const uint4*>(blocks) + row * nb;
        const u8* sc = scales + row * nb;
        const float* a = act + ((size_t)t * k + s) * inter;
        float d = 0.0f;
        for (int b = lane; b < nb; b += 32) {
            float xr[32];
            load_x32(a + 32 * b, xr);
            d += fp4_block_dot(__ldg(bq + b), xr) * e8m0_value(sc[b]);
        }
        d = warp_sum(d);
        total += wts[t * k + s] * (d + bf2f(bias[row]));
    }
    if (lane == 0) {
        float* yp = y + (size_t)t * hidden + r;
        *yp = accumulate ? *yp + total : total;
    }
}
