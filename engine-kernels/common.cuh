// Shared device helpers for every engine kernel. NVRTC compiles each kernel file with this
// text prepended (the host concatenates them), so no include path is needed at run time.
// bf16 is handled as raw 16-bit words: the kernels need only conversion, and this keeps
// them free of cuda_bf16.h, which NVRTC does not always ship.
typedef unsigned short bf16_t;
typedef unsigned char u8;

// Occupancy targets: the minimum resident blocks per SM each kernel family is compiled for
// (the second __launch_bounds__ argument, which caps registers). Defaults as measured best;
// tuning runs override them with MXTUNE_KERNEL_DEFINES (e.g. "MOE_DECODE_MINB=3").
#ifndef MOE_DECODE_MINB
#define MOE_DECODE_MINB 3
#endif
#ifndef GEMV_MINB
#define GEMV_MINB 1
#endif
#ifndef TC_MINB
#define TC_MINB 1
#endif

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

// Sum over the warp (float, double or 64-bit integer); every lane gets the result.
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block; every thread gets the result. `scratch` holds >= 32 entries.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_sum(lane < nwarps ? scratch[lane] : T(0));
}

// (value, index) argmax: keep the larger value, ties to the lower index; NaN never wins.
__device__ __forceinline__ void take_better(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

// Argmax over the block, ties to the lower index; every thread gets the result. `sv`/`si`
// hold >= 32 entries; `none` is the index of an empty result.
__device__ __forceinline__ void block_argmax(float& bv, int& bi, float* sv, int* si, int none) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nw = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    __syncthreads();
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    bv = lane < nw ? sv[lane] : -INFINITY;
    bi = lane < nw ? si[lane] : none;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        take_better(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
}

// Unpack 8 bf16 held in a 16-byte word.
__device__ __forceinline__ void bf16x8_to_f32(uint4 w, float* o) {
    o[0] = __uint_as_float(w.x << 16); o[1] = __uint_as_float(w.x & 0xffff0000u);
    o[2] = __uint_as_float(w.y << 16); o[3] = __uint_as_float(w.y & 0xffff0000u);
    o[4] = __uint_as_float(w.z << 16); o[5] = __uint_as_float(w.z & 0xffff0000u);
    o[6] = __uint_as_float(w.w << 16); o[7] = __uint_as_float(w.w & 0xffff0000u);
}

// Eight MXFP4 elements (one 32-bit word: element i in bits 4i..4i+3) to four bf16 pairs
// (element 2j in the low half of p[j]), with byte permutes instead of a table in memory: the
// magnitude's two bf16 bytes are looked up for four elements per PRMT and the sign bits moved
// into place by two more. About 1.5 integer operations per element.
__device__ __forceinline__ void fp4x8_to_bf16x2(unsigned w, unsigned (&p)[4]) {
    // bf16 bytes of 0, .5, 1, 1.5, 2, 3, 4, 6: high bytes 00 3F 3F 3F 40 40 40 40,
    // low bytes 00 00 80 C0 00 40 80 C0.
    const unsigned hi_a = 0x3F3F3F00u, hi_b = 0x40404040u;
    const unsigned lo_a = 0xC0800000u, lo_b = 0xC0804000u;
    const unsigned m = w & 0x77777777u, mh = m >> 16;
    const unsigned w4 = w << 4;
    const unsigned hi03 = __byte_perm(hi_a, hi_b, m) | (__byte_perm(w4, w, 0x5140) & 0x80808080u);
    const unsigned hi47 = __byte_perm(hi_a, hi_b, mh) | (__byte_perm(w4, w, 0x7362) & 0x80808080u);
    const unsigned lo03 = __byte_perm(lo_a, lo_b, m), lo47 = __byte_perm(lo_a, lo_b, mh);
    p[0] = __byte_perm(lo03, hi03, 0x5140);
    p[1] = __byte_perm(lo03, hi03, 0x7362);
    p[2] = __byte_perm(lo47, hi47, 0x5140);
    p[3] = __byte_perm(lo47, hi47, 0x7362);
}

// The same eight elements as fp32 (the bf16 pairs widened by a shift or a mask).
__device__ __forceinline__ void fp4x8_to_f32(unsigned w, float (&f)[8]) {
    unsigned p[4];
    fp4x8_to_bf16x2(w, p);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        f[2 * j] = __uint_as_float(p[j] << 16);
        f[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
    }
}

// UE8M0 scale byte s -> 2^(s-127); s = 0 is the subnormal 2^-127, s = 255 is NaN.
__device__ __forceinline__ float e8m0_value(unsigned s) {
    if (s == 0u) return __uint_as_float(0x00400000u);
    if (s == 255u) return __uint_as_float(0x7fc00000u);
    return __uint_as_float(s << 23);
}

// The same scale as a bf16 pair (both halves), exact: 2^-127 is the bf16 subnormal 0x0040.
__device__ __forceinline__ unsigned e8m0_bf16x2(unsigned s) {
    const unsigned b = s == 0u ? 0x0040u : (s == 255u ? 0x7fc0u : s << 7);
    return b | (b << 16);
}

// a * b on bf16 pairs (fma with -0 so that signed zeros survive); sm_80 and later.
__device__ __forceinline__ unsigned bf16x2_mul(unsigned a, unsigned b) {
    unsigned d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
    return d;
}

// ---- Tensor-core tiles for the prefill GEMMs (mma.sync m16n8k16, bf16 in, fp32 accumulate;
// sm_80 and later, so both sm_90 and sm_121). Tiles: TC_BM token rows × TC_BN output columns
// per block, TC_BK along K per stage; 8 warps as 2 (rows) × 4 (columns), 32 × 32 per warp.
// Shared rows are padded to TC_LD bf16 (20 words) so the fragment loads of a warp hit 32
// distinct banks.
#define TC_BM 64
#define TC_BN 128
#define TC_BK 32
#define TC_LD (TC_BK + 8)

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two fp32 to a bf16 pair (lower address first).
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
}

// One TC_BK stage of a warp's 32 × 32 tile: As holds [TC_BM][TC_LD] activations (row-major
// by token), Bs holds [TC_BN][TC_LD] weights (row-major by output column), wm/wn the warp's
// offsets inside the block tile.
// Four 8x8 bf16 matrices from shared memory; lane i gives the address of row i % 8 of
// matrix i / 8 and receives its fragment of each in r[0..3].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void tc_stage(const bf16_t* As, const bf16_t* Bs, int wm, int wn,
                                         float (&acc)[2][4][4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < TC_BK; kk += 16) {
        unsigned a[2][4], b[4][2];
        // A 16x16 per mi: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) = a0..a3.
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
            ldmatrix_x4(a[mi], As + (wm + mi * 16 + (lane & 15)) * TC_LD + kk + (lane >> 4) * 8);
        // B for two n8 tiles per load: (tile 2np | 2np+1) x (k 0-7 | 8-15).
#pragma unroll
        for (int np = 0; np < 2; ++np) {
            unsigned r[4];
            ldmatrix_x4(r, Bs + (wn + np * 16 + (lane & 7) + ((lane >> 4) << 3)) * TC_LD + kk +
                               ((lane >> 3) & 1) * 8);
            b[2 * np][0] = r[0];
            b[2 * np][1] = r[1];
            b[2 * np + 1][0] = r[2];
            b[2 * np + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) mma_bf16_16816(acc[mi][ni], a[mi], b[ni][0], b[ni][1]);
    }
}

// Load 8 fp32 activations of one TC_BK stage row (thread part `q` of 4) into registers; rows
// beyond the tile's end (src null) load zeros.
__device__ __forceinline__ void tc_load_act(const float* __restrict__ src, int q, float4 (&r)[2]) {
    if (src) {
        const float4* p = reinterpret_cast<const float4*>(src) + 2 * q;
        r[0] = p[0];
        r[1] = p[1];
    } else {
        r[0] = make_float4(0.f, 0.f, 0.f, 0.f);
        r[1] = r[0];
    }
}

__device__ __forceinline__ void tc_store_act(bf16_t* As, int row, int q, const float4 (&r)[2]) {
    uint4 v;
    v.x = pack_bf16x2(r[0].x, r[0].y);
    v.y = pack_bf16x2(r[0].z, r[0].w);
    v.z = pack_bf16x2(r[1].x, r[1].y);
    v.w = pack_bf16x2(r[1].z, r[1].w);
    *reinterpret_cast<uint4*>(As + row * TC_LD + 8 * q) = v;
}

// The double-buffered main loop of every tensor-core tile: `load(ks)` fetches stage ks's global
// data into the caller's registers, `store(buf)` writes them to shared buffer buf (0/1); the
// next stage's loads are in flight while the current stage's MMAs run. acc is this warp's
// 32 x 32 share of the block tile.
template <class Load, class Store>
__device__ __forceinline__ void tc_mainloop(int stages, Load load, Store store,
                                            const bf16_t (*As)[TC_BM * TC_LD],
                                            const bf16_t (*Bs)[TC_BN * TC_LD],
                                            float (&acc)[2][4][4]) {
    const int warp = threadIdx.x >> 5;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
    load(0);
    store(0);
    __syncthreads();
    for (int ks = 0; ks < stages; ++ks) {
        const int s = ks & 1;
        if (ks + 1 < stages) load(ks + 1);
        tc_stage(As[s], Bs[s], wm, wn, acc);
        if (ks + 1 < stages) store(s ^ 1);
        __syncthreads();
    }
}

// Visit this thread's accumulators: f(row, col, v0, v1) with the tile-local row and the even
// tile-local column col of the pair (v0 at col, v1 at col + 1).
template <class F>
__device__ __forceinline__ void tc_epilogue(const float (&acc)[2][4][4], F f) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp >> 2) * 32, wn = (warp & 3) * 32;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                f(wm + mi * 16 + g + 8 * h, wn + ni * 8 + 2 * t, acc[mi][ni][2 * h],
                  acc[mi][ni][2 * h + 1]);
}
