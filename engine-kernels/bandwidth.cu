// Memory read bandwidth probe for the roofline: every thread streams 16-byte words
// (grid-stride) and folds them so the loads cannot be elided; one word per thread is written.
extern "C" __global__ void read_probe(const uint4* __restrict__ src, unsigned long long n16,
                                      unsigned* __restrict__ sink) {
    pdl_enter();
    unsigned acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldcs(src + i), b = __ldcs(src + i + stride);
        const uint4 c = __ldcs(src + i + 2 * stride), d = __ldcs(src + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldcs(src + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
