// Synthetic weights generated on the device from a counter-based hash (SplitMix64 of
// seed + index), so a 120b-shaped model starts in seconds and the host can recompute any
// element bit for bit (src/engine/cuda/synthetic.rs holds the same function).
__device__ __forceinline__ unsigned long long splitmix64(unsigned long long z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Uniform in [0, 1) from the top 24 bits: exact in fp32 on both sides.
__device__ __forceinline__ float unit_uniform(unsigned long long seed, unsigned long long i) {
    return (float)(splitmix64(seed ^ (i * 0xd1342543de82ef95ull)) >> 40) * (1.0f / 16777216.0f);
}

// out[i] = bf16(offset + scale * (2u - 1)), rounded after the product and after the sum as the
// host does: with --fmad=true NVRTC would otherwise fuse them into one FMA (one rounding),
// which differs from the host in about one element in a million.
extern "C" __global__ void fill_bf16(bf16_t* __restrict__ out, unsigned long long n,
                                     unsigned long long seed, float scale, float offset) {
    pdl_enter();
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = f2bf(__fadd_rn(offset, __fmul_rn(scale, 2.0f * unit_uniform(seed, i) - 1.0f)));
}

// out[i] = lo + (hash mod (hi - lo + 1)); for MXFP4 nibble pairs (0..255) and scale bytes.
extern "C" __global__ void fill_u8(u8* __restrict__ out, unsigned long long n,
                                   unsigned long long seed, int lo, int hi) {
    pdl_enter();
    const unsigned long long span = (unsigned long long)(hi - lo + 1);
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x)
        out[i] = (u8)(lo + (int)(splitmix64(seed ^ (i * 0xd1342543de82ef95ull)) % span));
}
