// The floor of a decode step built as ONE persistent kernel, against the same step built as a
// kernel per op (programmatic dependent launch, as the engine chains its kernels). Where
// `chain_floor.cu` times pure streams, this step also has the latency-bound ops a real layer
// has (RoPE, attention, the router's routing: chains of dependent L2 loads on a few blocks)
// and ops whose addresses are known only past their wait (gate_up: its experts come from the
// router), so it prices what a persistent layer kernel could win over the kernel chain:
//
// * the grid barrier (one counter in global memory) against a grid's end and the next grid's
//   wait release;
// * loading the next streaming op's first bytes before the barrier, into registers (4 a
//   thread, as the engine's early loads) or into shared memory by `cp.async` (D a thread:
//   with D large enough a whole projection is in flight while a latency-bound op runs, which
//   a kernel per op cannot do, its next kernel's blocks holding only registers).
//
// Op specs (one layer, repeated LAYERS times, then a streamed tail):
//   29.49   stream 29.49 MB; its first loads may be issued before its wait / barrier
//   35.24L  stream 35.24 MB, nothing before its wait (gate_up)
//   c12     a latency-bound op: 12 dependent L2 loads by one thread in each of 8 blocks
//           (c0: nothing but the op boundary; a step of c0 ops prices a boundary alone)
// No arithmetic, no activations: each figure is the least such a step can cost.
//
// Build and run on the device (CUDA 12.3 or later, sm_90):
//   nvcc -O3 -arch=sm_90a -o /tmp/persist_floor tools/persist_floor.cu && /tmp/persist_floor
//   /tmp/persist_floor LAYERS TAIL_MB SPEC...   (default: gpt-oss-120b at batch 1, bf16 dense:
//   36 layers of qkv 29.49, RoPE c4, attention c16, o 23.59, router 0.74 then c4, gate_up
//   35.24L, down 17.62; then the lm_head's 1158.4 MB)
// Prints the read bandwidth, the cost of one dependent L2 load, then each mode's median step,
// its share of the step's bytes at that bandwidth, and the time per layer.
#include <cooperative_groups.h>
#include <cuda_runtime.h>
#include "floor_common.cuh"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

constexpr int THREADS = 256;
constexpr int CHAIN_BLOCKS = 8;  // the decode attention's blocks at batch 1 (one a KV head)
constexpr int EARLY = 4;         // the engine's early loads a thread (registers)
constexpr unsigned CHASE_WORDS = 1u << 18;  // 1 MB of links: stays in L2

enum Kind : int { STREAM = 0, LATE = 1, CHAIN = 2 };

struct Op {
    const uint4* p;
    unsigned long long n16;
    int kind;
    int rounds;
};

// A dependent load past L1 (each link's address is the previous link's value).
__device__ __forceinline__ unsigned ld_link(const unsigned* p) {
    unsigned v;
    asm volatile("ld.global.cg.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned chase(const unsigned* links, unsigned start, int rounds) {
    unsigned j = start;
    for (int r = 0; r < rounds; ++r) j = ld_link(links + j);
    return j;
}

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// ---- kernel per op (the engine's shape) ----

// Streams op's bytes; early: EARLY loads a thread before the wait.
__global__ void __launch_bounds__(THREADS) stream_k(const uint4* __restrict__ w, unsigned long long n16,
                                                    unsigned* __restrict__ sink, int early) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    uint4 e[EARLY];
    int ne = 0;
    if (early) {
#pragma unroll
        for (int j = 0; j < EARLY; ++j)
            if (i + j * stride < n16) {
                e[j] = ld16(w + i + j * stride);
                ne = j + 1;
            }
    }
    pdl_wait();
    pdl_trigger();
#pragma unroll
    for (int j = 0; j < EARLY; ++j)
        if (j < ne) acc ^= e[j].x ^ e[j].y ^ e[j].z ^ e[j].w;
    i += ne * stride;
    acc = stream_rest(w, i, stride, n16, acc);
    if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the loads; practically never written
}

// A latency-bound op: thread 0 of each block walks `rounds` links.
__global__ void __launch_bounds__(THREADS) chain_k(const unsigned* __restrict__ links, unsigned start,
                                                   int rounds, unsigned* __restrict__ sink) {
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x == 0) {
        const unsigned j = chase(links, (start + blockIdx.x * 977u) % CHASE_WORDS, rounds);
        if (j == 0xffffffffu) sink[0] = j;
    }
}

// ---- one persistent kernel ----

// All blocks resident (cooperative launch). `bar` counts arrivals; barrier b waits for
// b * gridDim.x of them.
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

__device__ __forceinline__ void cp_async16(uint4* s, const uint4* g) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(g) : "memory");
}

// early: 0 nothing before a barrier, 1 EARLY loads a thread into registers, 2 `depth` loads a
// thread into shared memory (cp.async). A LATE op gets nothing before its barrier in any mode.
__global__ void __launch_bounds__(THREADS) persist_k(const Op* __restrict__ ops, int nops,
                                                     const unsigned* __restrict__ links,
                                                     unsigned* bar, unsigned* __restrict__ sink,
                                                     int early, int depth, int cg_sync) {
    extern __shared__ uint4 smem[];  // depth entries a thread, thread-major by entry
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long i0 = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    uint4 e[EARLY];
    int ne = 0;  // entries loaded ahead for the current op (registers or shared memory)
    for (int o = 0; o < nops; ++o) {
        const Op op = ops[o];
        if (op.kind == CHAIN) {
            if (blockIdx.x < CHAIN_BLOCKS && threadIdx.x == 0)
                acc ^= chase(links, (o * 7919u + blockIdx.x * 977u) % CHASE_WORDS, op.rounds);
        } else {
            unsigned long long i = i0;
            if (early == 1) {
#pragma unroll
                for (int j = 0; j < EARLY; ++j)
                    if (j < ne) acc ^= e[j].x ^ e[j].y ^ e[j].z ^ e[j].w;
            } else if (early == 2 && ne > 0) {
                asm volatile("cp.async.wait_all;" ::: "memory");
                for (int j = 0; j < ne; ++j) {
                    const uint4 a = smem[j * THREADS + threadIdx.x];
                    acc ^= a.x ^ a.y ^ a.z ^ a.w;
                }
            }
            i += ne * stride;
            const uint4* w = op.p;
            const unsigned long long n16 = op.n16;
            acc = stream_rest(w, i, stride, n16, acc);
        }
        ne = 0;
        if (o + 1 == nops) break;
        const Op nx = ops[o + 1];
        if (nx.kind == STREAM && early == 1) {
#pragma unroll
            for (int j = 0; j < EARLY; ++j)
                if (i0 + j * stride < nx.n16) {
                    e[j] = ld16(nx.p + i0 + j * stride);
                    ne = j + 1;
                }
        } else if (nx.kind == STREAM && early == 2) {
            for (int j = 0; j < depth && i0 + j * stride < nx.n16; ++j) {
                cp_async16(&smem[j * THREADS + threadIdx.x], nx.p + i0 + j * stride);
                ne = j + 1;
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
        }
        if (cg_sync)
            cooperative_groups::this_grid().sync();
        else
            grid_barrier(bar, (unsigned)(o + 1) * gridDim.x);
    }
    if (acc == 0x9e3779b9u) sink[0] = acc;
}

static double median(std::vector<float> t) {
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
}

int main(int argc, char** argv) {
    int layers = 36;
    double tail_mb = 1158.4;
    std::vector<std::string> spec = {"29.49", "c4", "c16", "23.59", "0.74", "c4", "35.24L", "17.62"};
    if (argc >= 4) {
        layers = atoi(argv[1]);
        tail_mb = atof(argv[2]);
        spec.clear();
        for (int a = 3; a < argc; ++a) spec.push_back(argv[a]);
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, dev));

    // Links: one random cycle through CHASE_WORDS words.
    unsigned* links;
    {
        std::vector<unsigned> perm(CHASE_WORDS), next(CHASE_WORDS);
        for (unsigned k = 0; k < CHASE_WORDS; ++k) perm[k] = k;
        unsigned long long r = 88172645463325252ull;
        for (unsigned k = CHASE_WORDS - 1; k > 0; --k) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            std::swap(perm[k], perm[r % (k + 1)]);
        }
        for (unsigned k = 0; k < CHASE_WORDS; ++k) next[perm[k]] = perm[(k + 1) % CHASE_WORDS];
        CK(cudaMalloc(&links, CHASE_WORDS * 4));
        CK(cudaMemcpy(links, next.data(), CHASE_WORDS * 4, cudaMemcpyHostToDevice));
    }

    std::vector<Op> ops;
    size_t total = 0;
    auto add_stream = [&](double mb, int kind) {
        size_t bytes = ((size_t)(mb * 1e6) + 15) / 16 * 16;
        if (bytes < 16) bytes = 16;
        uint4* p;
        CK(cudaMalloc(&p, bytes));
        CK(cudaMemset(p, 1, bytes));
        ops.push_back({p, bytes / 16, kind, 0});
        total += bytes;
    };
    for (int l = 0; l < layers; ++l)
        for (const std::string& s : spec) {
            if (s.empty()) continue;
            if (s[0] == 'c') {
                ops.push_back({nullptr, 0, CHAIN, atoi(s.c_str() + 1)});
            } else {
                add_stream(atof(s.c_str()), s.back() == 'L' ? LATE : STREAM);
            }
        }
    add_stream(tail_mb, STREAM);
    Op* d_ops;
    CK(cudaMalloc(&d_ops, ops.size() * sizeof(Op)));
    CK(cudaMemcpy(d_ops, ops.data(), ops.size() * sizeof(Op), cudaMemcpyHostToDevice));
    unsigned *sink, *bar;
    CK(cudaMalloc(&sink, 4));
    CK(cudaMalloc(&bar, 4));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));

    // The median of `runs` timings of what `work` enqueues, the first `skip` left out; `prep`
    // is enqueued before each, outside the timing.
    auto timed = [&](int runs, int skip, auto&& prep, auto&& work) {
        std::vector<float> t;
        for (int r = 0; r < runs; ++r) {
            prep();
            CK(cudaEventRecord(a, s));
            work();
            CK(cudaEventRecord(b, s));
            CK(cudaEventSynchronize(b));
            float ms;
            CK(cudaEventElapsedTime(&ms, a, b));
            if (r >= skip) t.push_back(ms);
        }
        return median(t);
    };
    auto nothing = [] {};

    auto launch_stream = [&](const Op& op, int early, int blocks) {
        const unsigned long long want = (op.n16 + THREADS - 1) / THREADS;
        const unsigned grid = (unsigned)std::max<unsigned long long>(1, std::min<unsigned long long>(want, blocks));
        pdl_launch(stream_k, grid, THREADS, s, op.p, op.n16, sink, early);
    };

    // Read bandwidth: one 4 GiB read, median of 10 (one kernel, no PDL wait to speak of).
    double bw;
    {
        const size_t bytes = (size_t)4 << 30;
        uint4* p;
        CK(cudaMalloc(&p, bytes));
        CK(cudaMemset(p, 1, bytes));
        const double ms = timed(11, 1, nothing, [&] { launch_stream({p, bytes / 16, STREAM, 0}, 0, sms * 8); });
        CK(cudaFree(p));
        bw = bytes / (ms * 1e-3) / 1e9;
    }
    // One dependent L2 load: a chain of 4096 links, minus one of 64, on one thread.
    {
        auto one = [&](int rounds) {
            return timed(11, 1, nothing, [&] { chain_k<<<1, THREADS, 0, s>>>(links, 1, rounds, sink); });
        };
        one(64);
        const double per = (one(4096) - one(64)) / 4032 * 1e6;
        printf("%s, %d SMs: read bandwidth %.0f GB/s; a dependent L2 load %.0f ns\n", prop.name, sms,
               bw, per);
    }
    printf("step: %zu ops, %.3f GB (%d layers of:", ops.size(), total / 1e9, layers);
    for (const std::string& sp : spec) printf(" %s", sp.c_str());
    printf("; tail %.1f MB)\n", tail_mb);
    const double ideal_ms = total / (bw * 1e9) * 1e3;
    auto report = [&](const char* what, double med) {
        printf("  %-58s step %.3f ms (%.1f %% of the bytes' %.3f ms), %.2f us a layer\n", what, med,
               100.0 * ideal_ms / med, ideal_ms, 1e3 * med / layers);
    };

    // Kernel per op, a CUDA graph, PDL; stream ops with EARLY loads before their wait (LATE:
    // none), chain ops on CHAIN_BLOCKS blocks.
    for (int blocks_per_sm : {4, 8}) {
        for (int early : {0, 1}) {
            cudaGraph_t gr;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            unsigned start = 1;
            for (const Op& op : ops) {
                if (op.kind == CHAIN) {
                    start = (start * 7919u) % CHASE_WORDS;
                    pdl_launch(chain_k, CHAIN_BLOCKS, THREADS, s, (const unsigned*)links, start, op.rounds, sink);
                } else {
                    launch_stream(op, early && op.kind == STREAM, sms * blocks_per_sm);
                }
            }
            CK(cudaStreamEndCapture(s, &gr));
            CK(cudaGraphInstantiate(&ge, gr, 0));
            const double ms = timed(23, 3, nothing, [&] { CK(cudaGraphLaunch(ge, s)); });
            char what[96];
            snprintf(what, sizeof what, "kernel per op, PDL, %d blocks/SM, %s", blocks_per_sm,
                     early ? "4 loads a thread early" : "nothing early");
            report(what, ms);
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(gr));
        }
    }

    // One persistent kernel, every block resident, a grid barrier between ops.
    // cg: the grid barrier of cooperative_groups (this_grid().sync()) instead of the counter.
    struct Mode {
        int blocks_per_sm, early, depth, cg;
    };
    const Mode modes[] = {{1, 0, 0, 0}, {2, 0, 0, 0},  {4, 0, 0, 0},  {1, 1, 0, 0},
                          {2, 1, 0, 0}, {4, 1, 0, 0},  {2, 1, 0, 1},  {1, 1, 0, 1},
                          {2, 2, 8, 0}, {2, 2, 24, 0}, {1, 2, 48, 0}};
    for (const Mode& m : modes) {
        const size_t smem = m.early == 2 ? (size_t)m.depth * THREADS * 16 : 0;
        if (smem > 48 * 1024)
            CK(cudaFuncSetAttribute(persist_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int fit = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, persist_k, THREADS, smem));
        char what[96];
        if (fit < m.blocks_per_sm) {
            printf("  persistent, %d blocks/SM: only %d fit, skipped\n", m.blocks_per_sm, fit);
            continue;
        }
        const int blocks = sms * m.blocks_per_sm;
        const int nops = (int)ops.size();
        int early = m.early, depth = m.depth, cg = m.cg;
        void* args[] = {(void*)&d_ops, (void*)&nops, (void*)&links, (void*)&bar, (void*)&sink,
                        (void*)&early, (void*)&depth, (void*)&cg};
        const double ms = timed(
            23, 3, [&] { CK(cudaMemsetAsync(bar, 0, 4, s)); },
            [&] { CK(cudaLaunchCooperativeKernel((void*)persist_k, dim3(blocks), dim3(THREADS), args, smem, s)); });
        const char* sync = m.cg ? "cg sync" : "counter";
        if (m.early == 0)
            snprintf(what, sizeof what, "persistent, %s, %d blocks/SM, nothing early", sync,
                     m.blocks_per_sm);
        else if (m.early == 1)
            snprintf(what, sizeof what, "persistent, %s, %d blocks/SM, 4 loads a thread early", sync,
                     m.blocks_per_sm);
        else
            snprintf(what, sizeof what, "persistent, %s, %d blocks/SM, %d KB a block early (smem)",
                     sync, m.blocks_per_sm, m.depth * THREADS * 16 / 1024);
        report(what, ms);
    }
    return 0;
}
