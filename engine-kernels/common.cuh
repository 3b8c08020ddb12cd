// Shared device helpers for every engine kernel. NVRTC compiles each kernel file with this
// text prepended (the host concatenates them), so no include path is needed at run time.
// bf16 is handled as raw 16-bit words: the kernels need only conversion, and this keeps
// them free of cuda_bf16.h, which NVRTC does not always ship.
typedef unsigned short bf16_t;
typedef unsigned char u8;

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }

// Round to nearest even, NaN stays NaN (quiet bit set).
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds >= 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float t = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(t);
}

// Unpack 8 bf16 held in a 16-byte word.
__device__ __forceinline__ void bf16x8_to_f32(uint4 w, float* o) {
    o[0] = __uint_as_float(w.x << 16); o[1] = __uint_as_float(w.x & 0xffff0000u);
    o[2] = __uint_as_float(w.y << 16); o[3] = __uint_as_float(w.y & 0xffff0000u);
    o[4] = __uint_as_float(w.z << 16); o[5] = __uint_as_float(w.z & 0xffff0000u);
    o[6] = __uint_as_float(w.w << 16); o[7] = __uint_as_float(w.w & 0xffff0000u);
}

// Eight MXFP4 elements (one 32-bit word: element i in bits 4i..4i+3) to fp32, with byte
// permutes instead of a table in memory: the magnitude's two bf16 bytes are looked up for four
// elements per PRMT, the sign bits moved into place by two more, and the bf16 pairs widened to
// fp32 by a shift or a mask. About 3 integer operations per element.
__device__ __forceinline__ void fp4x8_to_f32(unsigned w, float (&f)[8]) {
    // bf16 bytes of 0, .5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40,
    // low bytes 00 00 80 C0 00 40 80 C0.
    const unsigned hi_a = 0x3F3F3F00u, hi_b = 0x40404040u;
    const unsigned lo_a = 0xC0800000u, lo_b = 0xC0804000u;
    const unsigned m = w & 0x77777777u, mh = m >> 16;
    const unsigned w4 = w << 4;
    const unsigned hi03 = __byte_perm(hi_a, hi_b, m) | (__byte_perm(w4, w, 0x5140) & 0x80808080u);
    const unsigned hi47 = __byte_perm(hi_a, hi_b, mh) | (__byte_perm(w4, w, 0x7362) & 0x80808080u);
    const unsigned lo03 = __byte_perm(lo_a, lo_b, m), lo47 = __byte_perm(lo_a, lo_b, mh);
    const unsigned p0 = __byte_perm(lo03, hi03, 0x5140), p1 = __byte_perm(lo03, hi03, 0x7362);
    const unsigned p2 = __byte_perm(lo47, hi47, 0x5140), p3 = __byte_perm(lo47, hi47, 0x7362);
    f[0] = __uint_as_float(p0 << 16); f[1] = __uint_as_float(p0 & 0xffff0000u);
    f[2] = __uint_as_float(p1 << 16); f[3] = __uint_as_float(p1 & 0xffff0000u);
    f[4] = __uint_as_float(p2 << 16); f[5] = __uint_as_float(p2 & 0xffff0000u);
    f[6] = __uint_as_float(p3 << 16); f[7] = __uint_as_float(p3 & 0xffff0000u);
}

// UE8M0 scale byte s -> 2^(s-127); s = 0 is the subnormal 2^-127, s = 255 is NaN.
__device__ __forceinline__ float e8m0_value(unsigned s) {
    if (s == 0u) return __uint_as_float(0x00400000u);
    if (s == 255u) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(s << 23);
}
