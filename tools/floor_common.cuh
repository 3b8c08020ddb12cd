// What the floor tools (chain_floor.cu, persist_floor.cu) share: the error check, the weak
// streaming load and the streaming loop past a thread's early loads.
#pragma once
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                  \
    do {                                                                       \
        cudaError_t e_ = (x);                                                  \
        if (e_ != cudaSuccess) {                                               \
            fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

// A weak 16-byte load: volatile asm keeps it on its side of griddepcontrol.wait.
__device__ __forceinline__ uint4 ld16(const uint4* p) {
    uint4 v;
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// The rest of a thread's grid-stride share of w[0, n16) from element i, four loads in
// flight, folded into acc (the values only keep the loads).
__device__ __forceinline__ unsigned stream_rest(const uint4* __restrict__ w, unsigned long long i,
                                                unsigned long long stride, unsigned long long n16,
                                                unsigned acc) {
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = ld16(w + i), b = ld16(w + i + stride);
        const uint4 c = ld16(w + i + 2 * stride), d = ld16(w + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^
               d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = ld16(w + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    return acc;
}

// Launches kernel k, `blocks` blocks of `threads`, on stream s, chained to the stream's
// previous kernel by programmatic dependent launch.
template <typename... P, typename... A>
void pdl_launch(void (*k)(P...), unsigned blocks, unsigned threads, cudaStream_t s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, k, args...));
}
