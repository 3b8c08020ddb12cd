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
// The decode MoE's `_slots` kernels (moe_gemv.cu: a unit's items in MOE_SLOTS_NI fixed slots,
// for rows of up to 32 * MOE_SLOTS_NI blocks of 32) and the blocks per SM they are compiled for
// (their slots take ~115 registers a thread).
#ifndef MOE_SLOTS_NI
#define MOE_SLOTS_NI 3
#endif
#ifndef MOE_SLOTS_MINB
#define MOE_SLOTS_MINB 2
#endif
// 1: the decode MoE's down kernels read their expert (the router's output, two kernels back)
// and issue their first weight loads before the wait on the previous kernel (gate_up);
// 0 waits first, for A/B timing.
#ifndef MOE_DOWN_EARLY
#define MOE_DOWN_EARLY 1
#endif
#ifndef GEMV_MINB
#define GEMV_MINB 1
#endif
#ifndef GEMV_NORM_MINB
#define GEMV_NORM_MINB 3
#endif
// 1: the decode GEMVs prefetch their weight rows into L2 before waiting on the previous
// kernel (see prefetch_l2); 0 turns it off for A/B timing.
#ifndef GEMV_PREFETCH
#define GEMV_PREFETCH 1
#endif
#ifndef TC_MINB
#define TC_MINB 1
#endif
// The grouped MoE's 128-row tile (--tile 128x128): 2 blocks per SM fit its registers (~126
// per thread on sm_90, no spills) and shared memory (40 KiB); at 1 it takes ~161 and one block.
#ifndef TC128_MINB
#define TC128_MINB 2
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

// Programmatic dependent launch (sm_90 and later). The host may launch a kernel while the
// previous one on the stream is still finishing (device.rs `launch_pdl`), so every kernel
// starts with pdl_enter(): griddepcontrol.wait blocks until the previous grid has completed
// and its writes are visible — nothing an earlier kernel writes or reads may be touched
// before it (only immutable weights) — then launch_dependents lets the next kernel's blocks
// be scheduled into the slots this grid frees. Both are no-ops for a normal launch.
// Loads meant to run before the wait must be checked in the SASS (their LDGs above ACQBULK):
// ptxas may schedule ld.global.nc (__ldg) below griddepcontrol.wait whatever the source order
// (it did in session 16's streaming GEMV; docs/perf.md run 110); a weak ld.global stays put.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// PARAM_TOUCH (default 1; 0 for A/B timing, docs/perf.md session 61): an entry whose first
// instructions after its wait read a parameter from a constant-cache line it has not read yet
// (the MXFP4 dense GEMV, the router, RoPE) reads one parameter of each such line before the
// wait (param_touch(...) at the entry), so the SM fetches the launch's parameter lines while
// the previous grid still runs instead of on the chain after the wait.
// One never-taken predicated instruction consumes the values: an asm with inputs and no
// instructions is dropped by ptxas, and the load with it. Which lines an entry reads first
// after its wait is checked in its SASS (the LDC / ULDC offsets below and above ACQBULK).
#ifndef PARAM_TOUCH
#define PARAM_TOUCH 1
#endif
__device__ __forceinline__ unsigned param_bits(const void* p) {
    return (unsigned)reinterpret_cast<unsigned long long>(p);
}
__device__ __forceinline__ unsigned param_bits(int v) { return (unsigned)v; }
__device__ __forceinline__ unsigned param_bits(unsigned v) { return v; }
__device__ __forceinline__ unsigned param_bits(float v) { return __float_as_uint(v); }
template <typename... T>
__device__ __forceinline__ void param_touch(const T&... v) {
#if PARAM_TOUCH
    // One instruction uses them all: a sleep of 1 ns under a predicate that holds only if
    // the values' xor happens to equal an arbitrary constant (harmless when it does).
    const unsigned u = (param_bits(v) ^ ...);
    asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, 0x2d5a0f1e;\n\t@p nanosleep.u32 1;\n\t}" ::"r"(u));
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// PDL_NO_TRIGGER=1 (an experiment): no kernel lets the next launch before its grid ends.
#ifndef PDL_NO_TRIGGER
#define PDL_NO_TRIGGER 0
#endif
// The wait, with the trigger at the start for mode 0 only: any other mode leaves it to the
// kernel (2: never, the next kernel launches when this grid ends, its blocks placed on an
// idle chip, not around this grid's; docs/perf.md session 25). Knobs per kernel: *_TRIGGER
// below; a literal mode folds away.
// `engine profile --timeline` compiles every kernel with STEP_TIMELINE=1 (device.rs): thread 0
// of each block records the global timer at its entry and once past the wait, its SM and its
// grid's shape, into the buffer mx_timeline points to (set by the host in every module; word 0
// counts the records, mx_timeline_cap bounds them), so the host can put each kernel of a
// captured step on a time line. Off (the default) none of it is compiled.
#ifndef STEP_TIMELINE
#define STEP_TIMELINE 0
#endif
#if STEP_TIMELINE
__device__ unsigned long long* mx_timeline;
__device__ unsigned long long mx_timeline_cap;
__device__ unsigned mx_timeline_module;
__device__ __forceinline__ unsigned long long timeline_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif
__device__ __forceinline__ void pdl_enter_as(int mode) {
#if STEP_TIMELINE
    const unsigned long long entered = timeline_now();
#endif
    pdl_wait();
#if STEP_TIMELINE
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && mx_timeline) {
        const unsigned long long released = timeline_now();
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const unsigned long long n = atomicAdd(mx_timeline, 1ull);
        if (n < mx_timeline_cap) {
            unsigned long long* r = mx_timeline + 1 + 4 * n;
            r[0] = entered;
            r[1] = released;
            r[2] = ((unsigned long long)mx_timeline_module << 56) |
                   ((unsigned long long)(gridDim.x * gridDim.y * gridDim.z) << 24) |
                   (blockDim.x * blockDim.y * blockDim.z);
            r[3] = sm;
        }
    }
#endif
    if (mode == 0 && !PDL_NO_TRIGGER) pdl_trigger();
}
__device__ __forceinline__ void pdl_enter() { pdl_enter_as(0); }
#ifndef ROPE_TRIGGER
#define ROPE_TRIGGER 0
#endif
#ifndef ROUTER_TRIGGER
#define ROUTER_TRIGGER 0
#endif
#ifndef GATE_UP_TRIGGER
#define GATE_UP_TRIGGER 0
#endif
#ifndef DOWN_TRIGGER
#define DOWN_TRIGGER 0
#endif
#ifndef TCG_TRIGGER
#define TCG_TRIGGER 0
#endif

// Ask L2 for the 128-byte lines covering [p, p + bytes), lines lane, lane + nlanes, …
// Fire-and-forget: a kernel issues it for its weights before pdl_enter(), so the weight
// reads start while the previous kernel finishes and the loads after the wait hit L2.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes, int lane, int nlanes) {
    const size_t a0 = reinterpret_cast<size_t>(p) & ~(size_t)127;
    const size_t a1 = reinterpret_cast<size_t>(p) + bytes;
    for (size_t a = a0 + (size_t)lane * 128; a < a1; a += (size_t)nlanes * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

// Asynchronous 16-byte copy global -> shared (sm_80+), bypassing L1; valid = false writes 16
// zero bytes and reads nothing. Copies land in commit groups: cp_async_wait<N>() returns when
// at most N of this thread's groups are still in flight (other threads' copies need a barrier).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A last-block combine's count: each block writes its partials, passes a __syncthreads(), and
// one thread counts the block in *c with this; the block that brings the count to `total`
// gets true (and resets *c to 0 for the next launch or replay), passes another
// __syncthreads() and reads every block's partials past L1 (__ldcg). The atomic is release
// (the block's writes, ordered before it by the barrier, are visible before the count) and
// acquire (the others' are visible to the last block): one MEMBAR.ALL.GPU in one thread.
// A __threadfence() (fence.sc, MEMBAR.SC.GPU) in every warp before and after the count was
// stronger than needed and measured slower (docs/perf.md run 209).
__device__ __forceinline__ bool count_block_last(unsigned* c, unsigned total) {
    unsigned v;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(v) : "l"(c) : "memory");
    const bool last = v == total - 1u;
    if (last) *c = 0u;
    return last;
}

// The decode MoE's expert announcements (`ready`, one u32 a (token, slot) pair, 0 = none):
// the router's routing warp stores expert + 1 for each slot as soon as its top-k round picks
// it, and each gate_up block of the pair polls its word before its wait, so it can issue its
// first weight loads while the router's grid is still ending (the wait then only guards the
// staged activations). The down kernel clears the words past its own wait, when no gate_up
// block reads them any more. The word carries its own value: relaxed, gpu scope, no fence.
// No deadlock: gate_up launches only once every router block has passed its wait (their
// trigger), so the routing block is resident and runs to its end.
__device__ __forceinline__ void moe_ready_set(unsigned* r, int e) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(r), "r"((unsigned)e + 1u) : "memory");
}
// gate_up's completion count per pair (`done`, one u32 a pair, apart from the announcements:
// a count stays non-zero after its layer, and where the batch changes between steps an
// announcement word of one batch must not be another's count): the router's
// routing warp zeroes a pair's count with its announcement, each gate_up block of the pair adds
// one once its outputs are written (moe_count_done: release), and the down kernel's blocks of
// the pair stage its outputs once the count is full (moe_await_done: acquire) instead of after
// the wait on gate_up's whole grid, which they pass later, before their own writes.
__device__ __forceinline__ void moe_count_done(unsigned* c) {
    __syncthreads();
    if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
}
// Polls give up after MOE_POLL_LIMIT reads (seconds): a count that never fills is a bug, and
// a trapped kernel is an error the host reports where an endless one would hang the engine.
#define MOE_POLL_LIMIT (1u << 24)
__device__ __forceinline__ void moe_await_done(const unsigned* c, unsigned n) {
    if (threadIdx.x == 0) {
        unsigned v, polls = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
            if (++polls == MOE_POLL_LIMIT) __trap();
        } while (v < n);
    }
    __syncthreads();
}
// Mailbox words (the router's logits, the decode down's slot rows): 64-bit {value bits, 1},
// posted by relaxed stores that carry their own flag (no fence, no count), polled by relaxed
// loads and zeroed by their one reader for the next launch, so zero at rest. The two readers
// (logits_take_lane, moe_combine_mail) poll all of a thread's still-empty words in one round
// each; one template for both loops changed the down kernels' register allocation (sm_90a),
// so each keeps its loop and the SASS stays as measured.
__device__ __forceinline__ void mail_post(unsigned* w, float v) {
    asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %2};" ::"l"(w), "r"(__float_as_uint(v)), "r"(1u)
                 : "memory");
}
// Two adjacent words (w 16-byte aligned) in one store.
__device__ __forceinline__ void mail_post2(unsigned* w, float a, float b) {
    asm volatile("st.relaxed.gpu.global.v4.u32 [%0], {%1, %2, %3, %2};" ::"l"(w),
                 "r"(__float_as_uint(a)), "r"(1u), "r"(__float_as_uint(b))
                 : "memory");
}
// One read of a word (hi: its flag).
__device__ __forceinline__ void mail_peek(const unsigned* w, unsigned& lo, unsigned& hi) {
    asm volatile("ld.relaxed.gpu.global.v2.u32 {%0, %1}, [%2];" : "=r"(lo), "=r"(hi) : "l"(w) : "memory");
}
__device__ __forceinline__ void mail_clear(unsigned* w) {
    asm volatile("st.relaxed.gpu.global.v2.u32 [%0], {%1, %1};" ::"l"(w), "r"(0u) : "memory");
}
__device__ __forceinline__ int moe_ready_wait(const unsigned* r) {
    __shared__ int ready_e;
    if (threadIdx.x == 0) {
        unsigned v, polls = 0;
        do {
            asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(r) : "memory");
            if (++polls == MOE_POLL_LIMIT) __trap();
        } while (v == 0u);
        ready_e = (int)v - 1;
    }
    __syncthreads();
    return ready_e;
}

__device__ __forceinline__ float bf2f(bf16_t v) { return __uint_as_float(((unsigned)v) << 16); }

// Round to nearest even, NaN stays NaN (quiet bit set).
__device__ __forceinline__ bf16_t f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// ---- KV cache elements. The element kind is an argument of every kernel that reads or writes
// the cache, uniform per launch: KV_BF16, KV_F32 (exact comparisons with the fp32 reference)
// or KV_FP8 (E4M3, one byte, no scale).
#define KV_BF16 0
#define KV_F32 1
#define KV_FP8 2

// fp32 -> FP8 E4M3 by inline PTX (sm_89 and later): round to nearest even, finite overflow and
// +-inf saturate to +-448, NaN stays NaN. (Input a of the cvt lands in the upper byte, b in
// the lower one.) Below sm_89 it yields NaN; the host refuses an fp8 cache there.
__device__ __forceinline__ u8 f2e4m3(float f) {
#if __CUDA_ARCH__ >= 890
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(0.0f), "f"(f));
    return (u8)(r & 0xffu);
#else
    return (u8)0x7fu;
#endif
}

// An fp16 pair (lo in bits 0-15) widened to two fp32, exactly.
__device__ __forceinline__ void f16x2_to_f32(unsigned v, float& lo, float& hi) {
    asm("{.reg .f16 l, h;\n\tmov.b32 {l, h}, %2;\n\tcvt.f32.f16 %0, l;\n\tcvt.f32.f16 %1, h;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(v));
}

// Two E4M3 (lo in bits 0-7, hi in bits 8-15) -> fp32, exact: through f16, which holds every
// E4M3 value (NaN stays NaN).
__device__ __forceinline__ void e4m3x2_to_f32(unsigned short v, float& lo, float& hi) {
#if __CUDA_ARCH__ >= 890
    unsigned h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
    f16x2_to_f32(h2, lo, hi);
#else
    lo = hi = __int_as_float(0x7fc00000);
#endif
}

__device__ __forceinline__ float e4m32f(u8 v) {
    float lo, hi;
    e4m3x2_to_f32((unsigned short)v, lo, hi);
    return lo;
}

// Element i of a KV cache of kind kv, as fp32.
__device__ __forceinline__ float kv_load(const void* __restrict__ cache, int kv, size_t i) {
    if (kv == KV_F32) return static_cast<const float*>(cache)[i];
    if (kv == KV_FP8) return e4m32f(static_cast<const u8*>(cache)[i]);
    return bf2f(static_cast<const bf16_t*>(cache)[i]);
}

// Store v as element i of a KV cache of kind kv (bf16 and fp8 round to nearest even).
__device__ __forceinline__ void kv_store(void* __restrict__ cache, int kv, size_t i, float v) {
    if (kv == KV_F32) static_cast<float*>(cache)[i] = v;
    else if (kv == KV_FP8) static_cast<u8*>(cache)[i] = f2e4m3(v);
    else static_cast<bf16_t*>(cache)[i] = f2bf(v);
}

// Loads that stay before griddepcontrol.wait (volatile asm: an ld.global.nc may be scheduled
// below it, see pdl_wait). Only for what no kernel of the step writes: the step's inputs
// (positions, cache offsets: copied in before its first kernel) and constants (rope_kv.cu,
// attention_decode.cu).
__device__ __forceinline__ unsigned ld_early_u32(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ unsigned long long ld_early_u64(const unsigned long long* p) {
    unsigned long long v;
    asm volatile("ld.global.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ float ld_early_f32(const float* p) {
    float v;
    asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}
// A bf16 weight (the sink logits), widened to float.
__device__ __forceinline__ float ld_early_bf16(const bf16_t* p) {
    unsigned short v;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return bf2f(v);
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

// Max over the whole block; every thread gets the result. `scratch` holds >= 32 entries.
__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    return warp_max(lane < nwarps ? scratch[lane] : -INFINITY);
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

// The same eight elements as four fp16 pairs (p[j]: elements 2j in the low half and 2j + 1):
// every E2M1 value's fp16 code has a zero low byte, so one PRMT per four elements looks up
// the high bytes and the sign bits are put in as above. Used by the tensor-core fp16 MoE
// (gemv_tc.cu) and the decode MoE's fp16 dot (moe_gemv.cu).
__device__ __forceinline__ void fp4x8_to_f16x2(unsigned w, unsigned (&p)[4]) {
    const unsigned t0 = 0x3E3C3800u, t1 = 0x46444240u;  // high bytes of 0 .5 1 1.5 | 2 3 4 6
    const unsigned m = w & 0x77777777u, w4 = w << 4;
    const unsigned lo = __byte_perm(t0, t1, m) | (__byte_perm(w4, w, 0x5140) & 0x80808080u);
    const unsigned hi = __byte_perm(t0, t1, m >> 16) | (__byte_perm(w4, w, 0x7362) & 0x80808080u);
    p[0] = __byte_perm(lo, 0u, 0x1404);
    p[1] = __byte_perm(lo, 0u, 0x3424);
    p[2] = __byte_perm(hi, 0u, 0x1404);
    p[3] = __byte_perm(hi, 0u, 0x3424);
}

// The four 16-bit pairs of a word in a word layout (ops.rs `WordLayout`): pair 0 the word
// under MASK, pair j the XOR of its rotations by A and Bj under MASK; 8 integer operations.
// FP4_ROT_SHL 1: a rotation by R no larger than MASK's lowest bit is taken as the left shift by
// R, the same bits under MASK (the rotation's wrapped bits land below R), which ptxas can issue
// as IMAD.SHL on the FMA pipe rather than a funnel shift on the integer pipe (0: every
// rotation a funnel shift).
#ifndef FP4_ROT_SHL
#define FP4_ROT_SHL 1
#endif
template <unsigned MASK, int R>
__device__ __forceinline__ unsigned fp4_rot(unsigned w) {
    if constexpr (FP4_ROT_SHL && (MASK & ((1u << R) - 1u)) == 0u) return w << R;
    return __funnelshift_l(w, w, R);
}
template <unsigned MASK, int A, int B1, int B2, int B3>
__device__ __forceinline__ void fp4_rot_pairs(unsigned w, unsigned (&p)[4]) {
    const unsigned ra = fp4_rot<MASK, A>(w), r1 = fp4_rot<MASK, B1>(w);
    const unsigned r2 = fp4_rot<MASK, B2>(w), r3 = fp4_rot<MASK, B3>(w);
    p[0] = w & MASK;
    p[1] = (ra ^ r1) & MASK;
    p[2] = (ra ^ r2) & MASK;
    p[3] = (ra ^ r3) & MASK;
}

// ---- The experts' fp16 layout (`ExpertLayout::F16` in ops.rs). Where the decode MoE runs its
// fp16 dot, the experts' 32-bit words are rearranged once at load (`mxfp4_word_layout`) so that
// a word decodes to its four fp16 pairs in 8 operations instead of fp4x8_to_f16x2's 13. The
// pairs are the same as fp4x8_to_f16x2's (p[j]: elements 2j low, 2j + 1 high) but scaled by
// 2^-14: E2M1's bits s e1 e0 m placed at fp16 bits 15, 11, 10, 9 are exactly the value times
// 2^-14 (e = 0 lands on fp16's subnormals, as it is E2M1's own subnormal), so each pair is its
// word's bits under the mask 0x8E008E00. Pair 0 is the stored word itself, pairs 1-3 the XOR of
// two of its rotations (by 4 and 7, 11, 14); the load-time transform is the inverse of that
// map over GF(2) (ops.rs builds it from the same definition and checks it is one).
#define F16L_MASK 0x8E008E00u
__device__ __forceinline__ void fp4l_to_f16x2(unsigned w, unsigned (&p)[4]) {
    fp4_rot_pairs<F16L_MASK, 4, 7, 11, 14>(w, p);
}

// ---- The dense MXFP4 matrices' bf16 layout (`ops::BF16_WORDS`). Each 32-bit word of blocks
// is rearranged once at load so that it decodes to its four bf16 pairs in 8 integer
// operations: E2M1's bits s e1 e0 m placed at bf16 bits 15, 8, 7, 6 are exactly the value times
// 2^-126 (e = 0 lands on bf16's subnormals, as it is E2M1's own), so each pair is a function of
// the stored word under the mask 0x81C081C0: pair 0 the word itself, pairs 1-3 the XOR of two of
// its rotations (by 2 and 6, 8, 12). The block's scale 2^(s - 127) then comes in as 2^(s - 1)
// (bf16_scale_b), which bf16 holds for s <= 128 only: the loader refuses a dense matrix with a
// larger scale (`ops::DENSE_MAX_SCALE`).
#define BF16L_MASK 0x81C081C0u
__device__ __forceinline__ void fp4b_to_bf16x2(unsigned w, unsigned (&p)[4]) {
    fp4_rot_pairs<BF16L_MASK, 2, 6, 8, 12>(w, p);
}

// The bf16 pair (both halves) 2^(s - 1): the multiplier of a block's pairs from
// fp4b_to_bf16x2 for its scale byte s <= 128 (an integer multiply-add: (s + 126) is the
// exponent field, in both halves).
__device__ __forceinline__ unsigned bf16_scale_b(unsigned s) {
    return (s + 126u) * 0x00800080u;
}

// An fp16 pair of exact small values (E2M1 times a power of two) as the bf16 pair of the same
// values: widened to fp32 exactly and narrowed to bf16 exactly.
__device__ __forceinline__ unsigned f16x2_to_bf16x2_exact(unsigned v) {
    float lo, hi;
    f16x2_to_f32(v, lo, hi);
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// fp4x8_to_bf16x2 for a word in the fp16 layout (the prefill's tensor-core tiles read the
// experts in whichever layout the model holds): the fp16 pairs times 2^14 (exact), then bf16.
// About 24 operations a word where fp4x8_to_bf16x2 takes 13; the prefill decodes each weight
// once for a whole tile of rows.
__device__ __forceinline__ void fp4l_to_bf16x2(unsigned w, unsigned (&p)[4]) {
    unsigned h[4];
    fp4l_to_f16x2(w, h);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        unsigned e;
        // times 2^14 (0x7400), plus -0 so that a -0 stays -0 as fp4x8_to_bf16x2 gives it
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(e) : "r"(h[j]), "r"(0x74007400u), "r"(0x80008000u));
        p[j] = f16x2_to_bf16x2_exact(e);
    }
}

// UE8M0 byte -> 2^(s - 127) (s = 0: 2^-127) in two integer instructions.
__device__ __forceinline__ float e8m0_fast(unsigned s) {
    return __uint_as_float(max(s << 23, 0x00400000u));
}

// Two fp32 to an fp16 pair (a in the low half), round to nearest even.
__device__ __forceinline__ unsigned f16x2_rn(float a, float b) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}

// ---- fp16 pairs in 32-bit words (inline PTX, so no cuda_fp16.h is needed under NVRTC).
// a * b + c on fp16 pairs, rounded once (round to nearest even).
__device__ __forceinline__ unsigned f16x2_fma(unsigned a, unsigned b, unsigned c) {
    unsigned d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

// a + b on fp16 pairs.
__device__ __forceinline__ unsigned f16x2_add(unsigned a, unsigned b) {
    unsigned d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// The sum of an fp16 pair's halves in fp32 (both widened exactly first).
__device__ __forceinline__ float f16x2_hsum(unsigned v) {
    float lo, hi;
    f16x2_to_f32(v, lo, hi);
    return lo + hi;
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

// gpt-oss's clamped SwiGLU of one unit: the gate and linear sums (bias included) clamped,
// gate * sigmoid(alpha * gate) * (linear + 1). Every MoE kernel's epilogue.
__device__ __forceinline__ float swiglu_clamped(float gate, float lin, float limit, float alpha) {
    gate = fminf(gate, limit);
    lin = fminf(fmaxf(lin, -limit), limit);
    return gate / (1.0f + expf(-alpha * gate)) * (lin + 1.0f);
}

// UE8M0 scale byte s -> 2^(s-127); s = 0 is the subnormal 2^-127, s = 255 is NaN. Without
// branches (a max and a select: the two early returns compiled to branches around each of the
// decode MoE's scales, docs/perf.md session 32).
__device__ __forceinline__ float e8m0_value(unsigned s) {
    const unsigned v = max(s << 23, 0x00400000u);
    return __uint_as_float(s == 255u ? 0x7fc00000u : v);
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

// The layouts of MXFP4 words on the device (ops.rs `WordLayout`): as in the checkpoint
// (FP4_STD), the experts' fp16 layout (FP4_F16L) and the dense matrices' bf16 layout
// (FP4_BF16L).
#define FP4_STD 0
#define FP4_F16L 1
#define FP4_BF16L 2

// Eight MXFP4 elements of a word in layout L as bf16 pairs (element 2j in the low half of
// p[j]) that fp4_scale_bf16x2<L> of the block's scale byte turns into the weights with one
// bf16x2_mul: the values themselves (FP4_STD, FP4_F16L) or the values times 2^-126
// (FP4_BF16L).
template <int L>
__device__ __forceinline__ void fp4_bf16x2(unsigned w, unsigned (&p)[4]) {
    if constexpr (L == FP4_F16L) {
        fp4l_to_bf16x2(w, p);
    } else if constexpr (L == FP4_BF16L) {
        fp4b_to_bf16x2(w, p);
    } else {
        fp4x8_to_bf16x2(w, p);
    }
}

template <int L>
__device__ __forceinline__ unsigned fp4_scale_bf16x2(unsigned s) {
    if constexpr (L == FP4_BF16L) {
        return bf16_scale_b(s);
    } else {
        return e8m0_bf16x2(s);
    }
}

// ---- Tensor-core tiles for the prefill GEMMs (mma.sync m16n8k16, bf16 in, fp32 accumulate;
// sm_80 and later, so both sm_90 and sm_121). Tiles: BM token rows × TC_BN output columns per
// block, TC_BK along K per stage; 8 warps as 2 (rows) × 4 (columns), (BM / 2) × 32 per warp,
// i.e. MI = BM / 32 m16 fragments per warp. The dense GEMM uses BM = TC_BM; the grouped MoE
// has a TC_BM and a 128-row variant. Shared rows are padded to TC_LD bf16 (20 words) so the
// fragment loads of a warp hit 32 distinct banks.
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

// The same MMA on fp16 operands (fp32 accumulate).
__device__ __forceinline__ void mma_f16_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                              unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 (lo in bits 0-7) -> an fp16 pair (lo in the low half), exact.
__device__ __forceinline__ unsigned e4m3x2_to_f16x2(unsigned short v) {
#if __CUDA_ARCH__ >= 890
    unsigned h2;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h2) : "h"(v));
    return h2;
#else
    return 0x7e007e00u;  // NaN pair: the host refuses an fp8 cache below sm_89
#endif
}

// The four E4M3 bytes of x as two fp16 pairs: bytes 0, 1 to lo and 2, 3 to hi (the same values
// as e4m3x2_to_f16x2 on each half). The halves are split in PTX, so the conversion reads the
// high one in place (F2FP ... .H1) where a shift of x by 16 took an instruction first.
__device__ __forceinline__ void e4m3x4_to_f16x2(unsigned x, unsigned& lo, unsigned& hi) {
#if __CUDA_ARCH__ >= 890
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n"
        " cvt.rn.f16x2.e4m3x2 %1, h;\n}"
        : "=r"(lo), "=r"(hi)
        : "r"(x));
#else
    lo = hi = 0x7e007e00u;  // NaN pairs: the host refuses an fp8 cache below sm_89
#endif
}

// 2^x by the hardware's approximation with subnormal results flushed to 0 (ex2.approx.ftz):
// exp2f is the same instruction wrapped in a test and two multiplies that keep results below
// 2^-126 — for a softmax, probabilities of that size next to the row's maximum's 1.
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One online-softmax step of a flash-attention tile held in mma.sync m16n8 accumulators: the
// scores sc (log2 units; masked entries -inf) of rows g (entries 0, 1) and g + 8 (2, 3) of the
// lane's quad, their running maxima m and this lane's part of their sums l (the caller adds a
// quad's four at the end). The tile's row maxima over the quad, the rescale of l and of the
// output fragments o, then sc replaced by the probabilities, added to l. R = 1: rows g + 8
// are padding (at most 8 live rows): left out, their probabilities 0, so the P V products add
// nothing to their outputs and rows g see the same operations as with R = 2.
template <int NB, int NO, int R = 2>
__device__ __forceinline__ void mma_softmax_step(float (&sc)[NB][4], float (&m)[2], float (&l)[2],
                                                 float (&o)[NO][4]) {
    static_assert(R == 1 || R == 2, "one or two row halves");
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int j = 0; j < 2 * R; ++j) mx[j >> 1] = fmaxf(mx[j >> 1], sc[nb][j]);
    }
    float mn[2], corr[2];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        mn[r] = fmaxf(m[r], mx[r]);
        corr[r] = mn[r] == -INFINITY ? 1.0f : exp2_ftz(m[r] - mn[r]);
        l[r] *= corr[r];
        m[r] = mn[r];
    }
#pragma unroll
    for (int n = 0; n < NO; ++n) {
#pragma unroll
        for (int j = 0; j < 2 * R; ++j) o[n][j] *= corr[j >> 1];
    }
    // A score of -inf gives exp2(-inf) = 0 against a finite max; against a max of -inf (every
    // score so far -inf) the max taken as 0 gives the same 0, where -inf - -inf would be NaN:
    // no select per score.
    float mz[2];
#pragma unroll
    for (int r = 0; r < R; ++r) mz[r] = mn[r] == -INFINITY ? 0.0f : mn[r];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (j >= 2 * R) {
                sc[nb][j] = 0.0f;
                continue;
            }
            const float p = exp2_ftz(sc[nb][j] - mz[j >> 1]);
            sc[nb][j] = p;
            l[j >> 1] += p;
        }
    }
}

// Two floats to a bf16 pair (lo in the low half), rounded to nearest even. BF16_PACK_CVT 1
// (the default): one cvt.rn.bf16x2.f32, the same bits as f2bf for every number (overflow to
// infinity included), a NaN of the canonical payload where f2bf keeps the input's; 0: two
// f2bf, about 10 integer operations (MXTUNE_KERNEL_DEFINES, for A/B timing).
#ifndef BF16_PACK_CVT
#define BF16_PACK_CVT 1
#endif
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
#if BF16_PACK_CVT
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)f2bf(lo) | ((unsigned)f2bf(hi) << 16);
#endif
}

// Four 8x8 bf16 matrices from shared memory; lane i gives the address of row i % 8 of
// matrix i / 8 and receives its fragment of each in r[0..3].
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// The same, transposed: lane i receives, of each matrix, the elements (2 (i % 4), i / 4) and
// (2 (i % 4) + 1, i / 4) — from a row-major [k][n] tile, the B fragment of mma m16n8k16.
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const bf16_t* p) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// One TC_BK stage of a warp's (16 MI) × 32 tile: As holds [32 MI][TC_LD] activations
// (row-major by token), Bs holds [TC_BN][TC_LD] weights (row-major by output column), wm/wn
// the warp's offsets inside the block tile.
template <int MI>
__device__ __forceinline__ void tc_stage(const bf16_t* As, const bf16_t* Bs, int wm, int wn,
                                         float (&acc)[MI][4][4]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < TC_BK; kk += 16) {
        unsigned a[MI][4], b[4][2];
        // A 16x16 per mi: matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15) = a0..a3.
#pragma unroll
        for (int mi = 0; mi < MI; ++mi)
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
        for (int mi = 0; mi < MI; ++mi)
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

// The main loop of every tensor-core tile, over two shared buffers: `load(ks, set)` fetches
// stage ks's global data into the caller's register set `set` (0/1), `store(buf, set)` writes
// a set to shared buffer buf (0/1). With TC_AHEAD 2 (the default) stage ks + 2's loads are
// issued before stage ks's MMAs, so a load has two stages of MMAs and barriers to arrive in
// (the caller holds two register sets); TC_AHEAD 1 is the loop before (one stage ahead, set 0
// only), kept for A/B. Stage j lives in buffer j & 1 and, between load and store, in set
// j & 1. acc is this warp's (16 MI) x 32 share of the block tile of 32 MI rows.
#ifndef TC_AHEAD
#define TC_AHEAD 2
#endif
template <int MI, class Load, class Store>
__device__ __forceinline__ void tc_mainloop(int stages, Load load, Store store,
                                            const bf16_t (*As)[MI * 32 * TC_LD],
                                            const bf16_t (*Bs)[TC_BN * TC_LD],
                                            float (&acc)[MI][4][4]) {
    const int warp = threadIdx.x >> 5;
    const int wm = (warp >> 2) * 16 * MI, wn = (warp & 3) * 32;
#if TC_AHEAD == 1
    load(0, 0);
    store(0, 0);
    __syncthreads();
    for (int ks = 0; ks < stages; ++ks) {
        const int s = ks & 1;
        if (ks + 1 < stages) load(ks + 1, 0);
        tc_stage(As[s], Bs[s], wm, wn, acc);
        if (ks + 1 < stages) store(s ^ 1, 0);
        __syncthreads();
    }
#else
    load(0, 0);
    if (1 < stages) load(1, 1);
    store(0, 0);
    __syncthreads();
    // Two stages per trip so that the register sets are compile-time indices.
    for (int ks = 0; ks < stages; ks += 2) {
        if (ks + 2 < stages) load(ks + 2, 0);
        tc_stage(As[0], Bs[0], wm, wn, acc);
        if (ks + 1 < stages) store(1, 1);
        __syncthreads();
        if (ks + 1 >= stages) break;
        if (ks + 3 < stages) load(ks + 3, 1);
        tc_stage(As[1], Bs[1], wm, wn, acc);
        if (ks + 2 < stages) store(0, 0);
        __syncthreads();
    }
#endif
}

// Visit this thread's accumulators: f(row, col, v0, v1) with the tile-local row and the even
// tile-local column col of the pair (v0 at col, v1 at col + 1).
// tc_epilogue_w: the same for WC warps across the columns (8 / WC down the rows), each warp
// (16 MI) x (8 NI).
template <int WC, int MI, int NI, class F>
__device__ __forceinline__ void tc_epilogue_w(const float (&acc)[MI][NI][4], F f) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wm = (warp / WC) * 16 * MI, wn = (warp % WC) * 8 * NI;
#pragma unroll
    for (int mi = 0; mi < MI; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                f(wm + mi * 16 + g + 8 * h, wn + ni * 8 + 2 * t, acc[mi][ni][2 * h],
                  acc[mi][ni][2 * h + 1]);
}
template <int MI, class F>
__device__ __forceinline__ void tc_epilogue(const float (&acc)[MI][4][4], F f) {
    tc_epilogue_w<4>(acc, f);
}

// One output pair of a dense tensor-core GEMM's epilogue (tc_epilogue's v0, v1 at row m,
// columns n and n + 1 of y [M, N]): plus the bias, stored or added (accumulate), columns past N
// skipped. The caller skips rows past M.
__device__ __forceinline__ void tc_store_pair(float* __restrict__ y, const bf16_t* __restrict__ bias,
                                              int N, int m, int n, float v0, float v1,
                                              int accumulate) {
    const float v[2] = {v0, v1};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (n + j >= N) continue;
        float o = v[j];
        if (bias) o += bf2f(bias[n + j]);
        float* dst = y + (size_t)m * N + n + j;
        *dst = accumulate ? *dst + o : o;
    }
}

// This thread's share of MXFP4 stage ks for the B tile: 8 bytes of the row's block (part
// `half`) and its scale from row pointers wq (blocks as uint2 pairs) and wsc; a row past the
// matrix (wq null) loads zeros with the neutral scale.
__device__ __forceinline__ void fp4_stage_load(const uint2* __restrict__ wq, const u8* __restrict__ wsc,
                                               int ks, int half, uint2& q, unsigned& sc) {
    if (wq) {
        q = __ldg(wq + (size_t)ks * 2 + half);
        sc = wsc[ks];
    } else {
        q = make_uint2(0u, 0u);
        sc = 127u;
    }
}

// One TC_BK stage of MXFP4 weight rows into shared bf16, the B tile of every MXFP4 tensor-core
// GEMM (grouped MoE, dense prefill projections): thread part `half` (0/1) of row `row`
// converts 16 elements (8 bytes of the block, in word layout L) times the block's scale, as
// bf16 pairs throughout. Exact: every MXFP4 value times a power of two is a bf16 number
// (outside the extreme exponents).
template <int L>
__device__ __forceinline__ void fp4_stage_store(bf16_t* Bs, int row, int half, uint2 q, unsigned sc) {
    const unsigned s2 = fp4_scale_bf16x2<L>(sc);
    unsigned o[8], p[4];
    fp4_bf16x2<L>(q.x, p);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[j] = bf16x2_mul(p[j], s2);
    fp4_bf16x2<L>(q.y, p);
#pragma unroll
    for (int j = 0; j < 4; ++j) o[4 + j] = bf16x2_mul(p[j], s2);
    uint4* d = reinterpret_cast<uint4*>(Bs + row * TC_LD + 16 * half);
    d[0] = make_uint4(o[0], o[1], o[2], o[3]);
    d[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// Activations a warp multiplies block by block (each lane a whole 32-element MXFP4 block) are
// staged in shared memory, each group of 32 padded to STAGE_PAD floats so the 16-byte reads of
// 8 consecutive lanes (one per lane's block) fall in distinct banks. Used by the decode MoE
// (moe_gemv.cu) and the MXFP4 dense GEMV (mxfp4_dense.cu).
#define STAGE_PAD 36


// RMSNorm folded into a staging: elements e … e + 3 of x times rs (1 / rms) times the norm
// weights nw (bf16), in the order the router writes its normalised copy (x · rs · w); nw null:
// x as it is (the stagings below then compile without it).
// norm4w: the same with the four weights w already loaded.
__device__ __forceinline__ float4 norm4w(float4 v, uint2 w, float rs) {
    v.x = v.x * rs * __uint_as_float(w.x << 16);
    v.y = v.y * rs * __uint_as_float(w.x & 0xffff0000u);
    v.z = v.z * rs * __uint_as_float(w.y << 16);
    v.w = v.w * rs * __uint_as_float(w.y & 0xffff0000u);
    return v;
}
__device__ __forceinline__ float4 norm4(float4 v, const bf16_t* __restrict__ nw, float rs, int e) {
    return nw ? norm4w(v, *reinterpret_cast<const uint2*>(nw + e), rs) : v;
}

// 1 / rms of the n fp32 at x (n a multiple of 4, x 16-byte aligned): rsqrt(Σ x² / n + eps),
// the same value in every thread of the block. Whole block must call it, once (its partials'
// shared memory is not reused); loads past L1, four in flight a thread.
__device__ __forceinline__ float block_rms_inv(const float* __restrict__ x, int n, float eps) {
    __shared__ float rms_part[32];
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int n4 = n >> 2;
    float ss = 0.0f;
    for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * blockDim.x) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int i = i0 + u * (int)blockDim.x;
            v[u] = i < n4 ? __ldcg(x4 + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) ss += v[u].x * v[u].x + v[u].y * v[u].y + v[u].z * v[u].z + v[u].w * v[u].w;
    }
    return rsqrtf(block_sum(ss, rms_part) / (float)n + eps);
}

// Copy n fp32 (n a multiple of 32, src 16-byte aligned) into padded shared memory, with nw
// (norm4) normalised on the way. Whole block must call it. 16-byte loads, four issued before
// the first store, so the copy costs about one L2 round trip rather than one per element a
// thread moves.
__device__ __forceinline__ void stage_padded(const float* __restrict__ src, float* dst, int n,
                                             const bf16_t* __restrict__ nw = nullptr, float rs = 1.0f) {
    const float4* s4 = reinterpret_cast<const float4*>(src);
    const int n4 = n >> 2;
    for (int i0 = threadIdx.x; i0 < n4; i0 += 4 * blockDim.x) {
        float4 v[4];
#pragma unroll
        for (int u = 0; u < 4; ++u)
            if (i0 + u * (int)blockDim.x < n4) v[u] = __ldcg(s4 + i0 + u * blockDim.x);
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int e = 4 * (i0 + u * (int)blockDim.x);
            if (e < n) *reinterpret_cast<float4*>(dst + (e >> 5) * STAGE_PAD + (e & 31)) = norm4(v[u], nw, rs, e);
        }
    }
}

// ---- Decode MoE grouping by expert (the tensor-core MoE of gemv_tc.cu and the grouped SIMT
// MoE of moe_gemv.cu): each distinct expert of a group of up to TCG_TOKENS tokens is read once.
//
// Grouping, in every block (the same result everywhere, no extra launch): the pairs p = t * k
// + s of tokens t0 … t0 + nt - 1 (idx[p] their experts); a pair leads when no earlier pair of
// the group has its expert; block y takes the y-th leader's expert e (blocks past the number
// of distinct experts return) and its members, the pairs routed to e in pair order (a token
// picks k distinct experts, so at most nt). Token group: blockIdx.z.
#define TCG_TOKENS 16
struct TcgGroup {
    int e;       // expert
    int n;       // members
    int lead;    // the token group's distinct experts (every block of the group agrees)
    int p[TCG_TOKENS];  // their pair indices (global: t * k + s)
};

// Most experts per token the grouping takes (its shared copy of the routing).
#define TCG_MAX_K 32

// Warp 0 computes the block's group into grp (shared); false: no expert for this block.
__device__ __forceinline__ bool tcg_group(const int* __restrict__ idx, int tokens, int k, TcgGroup& grp) {
    __shared__ int live;
    __shared__ int sidx[TCG_TOKENS * TCG_MAX_K];
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const int t0 = blockIdx.z * TCG_TOKENS, nt = min(TCG_TOKENS, tokens - t0);
        const int np = nt * k, base = t0 * k;
        for (int p = lane; p < np; p += 32) sidx[p] = __ldcg(idx + base + p);
        __syncwarp();
        int leaders_before = 0, e = -1;
        for (int p0 = 0; p0 < np; p0 += 32) {
            const int p = p0 + lane;
            const int ep = p < np ? sidx[p] : -1 - lane;  // past the end: unique, never leads
            // A pair leads when it is the first of its expert in its 32 and no earlier 32 has it.
            const unsigned same = __match_any_sync(0xffffffffu, ep);
            bool lead = p < np && (__ffs(same) - 1) == lane;
            for (int qq = 0; qq < p0 && lead; ++qq) lead = sidx[qq] != ep;
            const unsigned m = __ballot_sync(0xffffffffu, lead);
            const int want = (int)blockIdx.y - leaders_before;
            if (e < 0 && want >= 0 && want < __popc(m)) {
                unsigned mm = m;  // its want-th set bit is the leader
                for (int i = 0; i < want; ++i) mm &= mm - 1;
                e = __shfl_sync(0xffffffffu, ep, __ffs(mm) - 1);
            }
            leaders_before += __popc(m);
        }
        int n = 0;
        if (e >= 0) {
            for (int p0 = 0; p0 < np; p0 += 32) {
                const int p = p0 + lane;
                const bool mine = p < np && sidx[p] == e;
                const unsigned m = __ballot_sync(0xffffffffu, mine);
                // At most nt members (top-k picks distinct experts); the bound only keeps a
                // corrupt routing (NaN logits) inside the array.
                const int slot = n + __popc(m & ((1u << lane) - 1u));
                if (mine && slot < TCG_TOKENS) grp.p[slot] = base + p;
                n = min(TCG_TOKENS, n + __popc(m));
            }
        }
        if (lane == 0) {
            live = e >= 0;
            grp.e = e;
            grp.n = n;
            grp.lead = leaders_before;
        }
    }
    __syncthreads();
    return live;
}
