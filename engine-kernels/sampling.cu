// Sampling on the device, so only a token id (and its logprob) goes back to the host. One
// block per row implements the host's `sampling::choose`: allowed tokens are those not banned
// and not NaN; greedy rows take the largest allowed logit (ties: lower id); other rows scale
// z = logit / T, keep z >= the k-th largest (top-k, ties kept), keep values whose mass of
// strictly larger kept z is below top_p of the kept mass (top-p), and walk the kept tokens in
// id order until the running mass passes u × kept mass (u drawn on the host from the request's
// seeded stream). No sort: each threshold comes from three radix passes (11, 11, 10 bits) over
// an order-preserving 32-bit key of z. Masses are exp(z - zmax) in 2^-38 fixed point, summed
// as 64-bit integers: every sum is exact, so the result does not depend on thread order.

#define SAMPLE_THREADS 512
#define SAMPLE_BINS 2048
#define SAMPLE_MAX_BANNED 256
#define SAMPLE_FIX 274877906944.0  // 2^38: vocab < 2^26 keeps every sum below 2^64
#define SAMPLE_NONE 0x7fffffff

typedef unsigned long long u64;

// One row's request; the host writes an array of these (40 bytes each, little endian).
struct SampleRow {
    double u;           // uniform in [0, 1), ignored by greedy rows
    float temperature;  // > 0 unless greedy
    float top_p;        // (0, 1]; 1 disables
    int top_k;          // 0 disables
    int flags;          // bit 0: greedy, bit 1: logprob wanted
    int ban_off;        // banned ids: banned[ban_off .. ban_off + ban_n)
    int ban_n;          // at most SAMPLE_MAX_BANNED
    int logit_row;      // row of `logits` to read
    int out_row;        // out[2 * out_row] = token, out[2 * out_row + 1] = logprob bits
};

// -0 and +0 get one key; otherwise key order is float order (NaN never reaches here).
__device__ __forceinline__ unsigned zkey(float z) {
    unsigned b = __float_as_uint(z);
    if (b == 0x80000000u) b = 0u;
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// exp(z - zmax) in fixed point; with zmax infinite the tokens at zmax share the weight.
__device__ __forceinline__ u64 wfix(float z, float zmax) {
    float w;
    if (isinf(zmax)) w = (z == zmax) ? 1.0f : 0.0f;
    else w = expf(z - zmax);
    return (u64)((double)w * SAMPLE_FIX);
}

// Exclusive prefix sum in thread order; `total` gets the block's sum.
__device__ u64 block_excl_scan(u64 v, u64* sh, u64& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    u64 x = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u64 s = lane < nw ? sh[lane] : 0ull;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < nw) sh[lane] = s;
    }
    __syncthreads();
    total = sh[nw - 1];
    return (warp > 0 ? sh[warp - 1] : 0ull) + x - v;
}

__device__ __forceinline__ bool is_banned(int i, const unsigned* ban, int n) {
    for (int j = 0; j < n; ++j)
        if (ban[j] == (unsigned)i) return true;
    return false;
}

// Pick a bin of `hist` (nb bins) walking from the highest down. Top-k (`by_count`): the bin
// holding the `need`-th largest key. Top-p: the lowest non-empty bin whose mass above
// (`base` + higher bins) is below `limit`, or zero. Sets `*sel` and `*sel_above` (the mass or
// count in higher bins, `base` included).
__device__ void select_bin(const u64* hist, int nb, bool by_count, u64 need, u64 base,
                           double limit, int* sel, u64* sel_above, u64* scan_sh) {
    const int per = nb / (int)blockDim.x;
    const int hi = nb - (int)threadIdx.x * per, lo = hi - per;
    u64 local = 0;
    for (int b = lo; b < hi; ++b) local += hist[b];
    if (threadIdx.x == 0) *sel = SAMPLE_NONE;
    u64 total;
    u64 cum = base + block_excl_scan(local, scan_sh, total);
    int mine = SAMPLE_NONE;
    u64 mine_above = 0;
    for (int b = hi - 1; b >= lo; --b) {
        const u64 h = hist[b];
        bool ok;
        if (by_count) ok = cum < need && cum + h >= need;
        else ok = h > 0 && ((double)cum < limit || cum == 0ull);
        if (ok) { mine = b; mine_above = cum; }
        cum += h;
    }
    __syncthreads();
    if (mine != SAMPLE_NONE) atomicMin(sel, mine);
    __syncthreads();
    if (mine != SAMPLE_NONE && mine == *sel) *sel_above = mine_above;
    __syncthreads();
}

// The threshold key of a radix select over the allowed tokens whose key is >= `floor_key`,
// in three passes (11, 11, 10 bits): each pass histograms `weight(z)` of the keys matching the
// prefix so far, and `select_bin` picks the bin — by count (top-k: the `need`-th largest) or
// by mass (top-p: mass above below `limit`).
template <class Weight>
__device__ unsigned radix_threshold(const float* __restrict__ row, int vocab, float t,
                                    const unsigned* sban, int nban, unsigned floor_key,
                                    bool by_count, u64 need, double limit, Weight weight,
                                    u64* hist, int* sel, u64* sel_above, u64* scan_sh) {
    unsigned prefix = 0u, mask = 0u;
    u64 above = 0ull;
    for (int level = 0; level < 3; ++level) {
        const int shift = level == 0 ? 21 : (level == 1 ? 10 : 0);
        const int nb = level == 2 ? 1024 : 2048;
        for (int b = threadIdx.x; b < nb; b += blockDim.x) hist[b] = 0ull;
        __syncthreads();
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float l = row[i];
            if (isnan(l) || is_banned(i, sban, nban)) continue;
            const float z = l / t;
            const unsigned key = zkey(z);
            if (key >= floor_key && (key & mask) == prefix)
                atomicAdd(&hist[(key >> shift) & (unsigned)(nb - 1)], weight(z));
        }
        __syncthreads();
        select_bin(hist, nb, by_count, need, above, limit, sel, sel_above, scan_sh);
        if (by_count) need -= *sel_above;
        else above = *sel_above;
        prefix |= (unsigned)*sel << shift;
        mask |= (unsigned)(nb - 1) << shift;
    }
    return prefix;
}

// Shared scratch of the block reductions (block_argmax, block_sum, block_excl_scan): one
// slot per warp.
struct BlockScratch {
    u64 sh64[32];
    float sv[32];
    int si[32];
};

// grid = rows, block = SAMPLE_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
sample_rows(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
            const unsigned* __restrict__ banned, unsigned* __restrict__ out) {
    pdl_enter();
    __shared__ u64 hist[SAMPLE_BINS];
    __shared__ unsigned sban[SAMPLE_MAX_BANNED];
    __shared__ BlockScratch bs;
    __shared__ double shf[32];
    __shared__ int sel;
    __shared__ u64 sel_above;
    __shared__ int chosen;

    const SampleRow r = rows[blockIdx.x];
    const float* row = logits + (size_t)r.logit_row * vocab;
    const int nban = min(r.ban_n, SAMPLE_MAX_BANNED);
    for (int j = threadIdx.x; j < nban; j += blockDim.x) sban[j] = banned[r.ban_off + j];
    __syncthreads();
    const bool greedy = (r.flags & 1) != 0, want_lp = (r.flags & 2) != 0;

    // Pass 1: largest allowed logit, largest non-NaN logit, allowed count.
    float av = -INFINITY, rv = -INFINITY;
    int ai = SAMPLE_NONE, ri = SAMPLE_NONE;
    unsigned count = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        const float l = row[i];
        if (isnan(l)) continue;
        take_better(rv, ri, l, i);
        if (!is_banned(i, sban, nban)) { take_better(av, ai, l, i); ++count; }
    }
    block_argmax(av, ai, bs.sv, bs.si, SAMPLE_NONE);
    block_argmax(rv, ri, bs.sv, bs.si, SAMPLE_NONE);
    const u64 allowed = block_sum((u64)count, bs.sh64);
    const int fallback = ri == SAMPLE_NONE ? 0 : ri;
    const int best = ai == SAMPLE_NONE ? fallback : ai;

    int token = best;
    double lse_sum = 0.0;
    const bool lse_finite = want_lp && isfinite(rv);
    if (!greedy && allowed > 0) {
        const float t = r.temperature;
        const float zmax = av / t;
        // Top-k threshold key (0 keeps every allowed token).
        unsigned kk = 0u;
        if (r.top_k > 0 && (u64)r.top_k < allowed)
            kk = radix_threshold(row, vocab, t, sban, nban, 0u, true, (u64)r.top_k, 0.0,
                                 [](float) { return 1ull; }, hist, &sel, &sel_above, bs.sh64);
        // Kept mass after top-k (for top-p) and the logprob normaliser, in one pass.
        unsigned kp = kk;
        const bool nucleus = r.top_p < 1.0f;
        if (nucleus || lse_finite) {
            u64 m = 0ull;
            double s = 0.0;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                const float l = row[i];
                if (isnan(l)) continue;
                if (lse_finite) s += (double)expf(l - rv);
                if (!nucleus || is_banned(i, sban, nban)) continue;
                const float z = l / t;
                if (zkey(z) >= kk) m += wfix(z, zmax);
            }
            if (lse_finite) lse_sum = block_sum(s, shf);
            if (nucleus) {
                const u64 mass = block_sum(m, bs.sh64);
                const double limit = (double)r.top_p * (double)mass;
                kp = radix_threshold(row, vocab, t, sban, nban, kk, false, 0ull, limit,
                                     [&](float z) { return wfix(z, zmax); }, hist, &sel,
                                     &sel_above, bs.sh64);
            }
        }
        // The draw: contiguous id ranges per thread, an exact prefix sum, one thread walks.
        const int chunk = (vocab + (int)blockDim.x - 1) / (int)blockDim.x;
        const int lo = min(vocab, (int)threadIdx.x * chunk), hi = min(vocab, lo + chunk);
        u64 local = 0ull;
        for (int i = lo; i < hi; ++i) {
            const float l = row[i];
            if (isnan(l) || is_banned(i, sban, nban)) continue;
            const float z = l / t;
            if (zkey(z) >= kp) local += wfix(z, zmax);
        }
        u64 total;
        const u64 before = block_excl_scan(local, bs.sh64, total);
        if (threadIdx.x == 0) chosen = best;
        __syncthreads();
        if (total > 0ull) {
            u64 target = (u64)(r.u * (double)total);
            if (target >= total) target = total - 1ull;
            if (target >= before && target < before + local) {
                u64 acc = before;
                for (int i = lo; i < hi; ++i) {
                    const float l = row[i];
                    if (isnan(l) || is_banned(i, sban, nban)) continue;
                    const float z = l / t;
                    if (zkey(z) < kp) continue;
                    acc += wfix(z, zmax);
                    if (acc > target) { chosen = i; break; }
                }
            }
        }
        __syncthreads();
        token = chosen;
    } else if (!greedy) {
        token = fallback;
    }
    if (want_lp && lse_finite && lse_sum == 0.0) {
        // Greedy rows (or rows with nothing allowed) still need the normaliser.
        double s = 0.0;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            const float l = row[i];
            if (!isnan(l)) s += (double)expf(l - rv);
        }
        lse_sum = block_sum(s, shf);
    }
    if (threadIdx.x == 0) {
        float lp = __int_as_float(0x7fc00000);
        if (want_lp) {
            const float lse = lse_finite ? rv + (float)log(lse_sum) : rv;
            lp = row[token] - lse;
        }
        out[2 * r.out_row] = (unsigned)token;
        out[2 * r.out_row + 1] = __float_as_uint(lp);
    }
}

// ---- Plain rows on many blocks. A row that asks for no top-k, no top-p, no logprob and bans
// nothing (the default request) needs only the largest logit and, unless greedy, each token's
// weight wfix(z, zmax): sample_rows does that on one block (one SM) per row, which at batch 1
// leaves the rest of the GPU idle for two passes over the vocabulary. These three kernels cut
// each row into chunks of SAMPLE_CHUNK ids: the chunks' (max, argmax, count), then each
// chunk's exact mass (u64, the same weights), then per row the chunk the draw falls in and the
// walk through it in id order. Same weights, same exact sums, same walk: the same token as
// sample_rows and the host's `sampling::choose`. Scratch: a SamplePart per (row, chunk).
#define SAMPLE_CHUNK 4096
#define SAMPLE_PART_THREADS 256

struct SamplePart {
    float av;        // largest non-NaN logit of the chunk (-inf if none)
    int ai;          // its id (ties: lower; SAMPLE_NONE if none)
    unsigned count;  // non-NaN logits in the chunk
    unsigned pad;
    u64 mass;        // sum of wfix(l / T, zmax) over the chunk (non-greedy rows)
};

// The vocabulary range [lo, hi) of this block's chunk (blockIdx.x) in the part kernels.
__device__ __forceinline__ void sample_chunk(int vocab, int& lo, int& hi) {
    lo = blockIdx.x * SAMPLE_CHUNK;
    hi = min(vocab, lo + SAMPLE_CHUNK);
}

// The row's (max, argmax, count) over its nc chunks, by every thread of the block.
__device__ __forceinline__ void sample_row_best(const SamplePart* p, int nc, float& av, int& ai,
                                                u64& count, BlockScratch& bs) {
    av = -INFINITY;
    ai = SAMPLE_NONE;
    u64 c = 0ull;
    for (int j = threadIdx.x; j < nc; j += blockDim.x) {
        take_better(av, ai, p[j].av, p[j].ai);
        c += p[j].count;
    }
    block_argmax(av, ai, bs.sv, bs.si, SAMPLE_NONE);
    count = block_sum(c, bs.sh64);
}

// grid = (chunks, rows), block = SAMPLE_PART_THREADS.
extern "C" __global__ void __launch_bounds__(SAMPLE_PART_THREADS)
sample_max_part(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
                SamplePart* __restrict__ parts) {
    pdl_enter();
    __shared__ BlockScratch bs;
    const SampleRow r = rows[blockIdx.y];
    const float* row = logits + (size_t)r.logit_row * vocab;
    int lo, hi;
    sample_chunk(vocab, lo, hi);
    float av = -INFINITY;
    int ai = SAMPLE_NONE;
    unsigned count = 0;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float l = row[i];
        if (isnan(l)) continue;
        take_better(av, ai, l, i);
        ++count;
    }
    block_argmax(av, ai, bs.sv, bs.si, SAMPLE_NONE);
    const u64 total = block_sum((u64)count, bs.sh64);
    if (threadIdx.x == 0) {
        SamplePart& p = parts[(size_t)blockIdx.y * gridDim.x + blockIdx.x];
        p.av = av;
        p.ai = ai;
        p.count = (unsigned)total;
        p.mass = 0ull;
    }
}

// grid = (chunks, rows), block = SAMPLE_PART_THREADS: each non-greedy row's chunk masses.
extern "C" __global__ void __launch_bounds__(SAMPLE_PART_THREADS)
sample_mass_part(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
                 SamplePart* __restrict__ parts) {
    pdl_enter();
    __shared__ BlockScratch bs;
    const SampleRow r = rows[blockIdx.y];
    if (r.flags & 1) return;  // greedy: the argmax is all it needs
    SamplePart* p = parts + (size_t)blockIdx.y * gridDim.x;
    float av;
    int ai;
    u64 allowed;
    sample_row_best(p, gridDim.x, av, ai, allowed, bs);
    if (allowed == 0ull) return;
    const float t = r.temperature, zmax = av / t;
    const float* row = logits + (size_t)r.logit_row * vocab;
    int lo, hi;
    sample_chunk(vocab, lo, hi);
    u64 m = 0ull;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float l = row[i];
        if (!isnan(l)) m += wfix(l / t, zmax);
    }
    m = block_sum(m, bs.sh64);
    if (threadIdx.x == 0) p[blockIdx.x].mass = m;
}

// grid = rows, block = SAMPLE_PART_THREADS: the token of each row from its chunks.
extern "C" __global__ void __launch_bounds__(SAMPLE_PART_THREADS)
sample_pick(const float* __restrict__ logits, int vocab, const SampleRow* __restrict__ rows,
            const SamplePart* __restrict__ parts, int nc, unsigned* __restrict__ out) {
    pdl_enter();
    __shared__ BlockScratch bs;
    __shared__ int cs;
    __shared__ u64 cbefore;
    __shared__ int chosen;
    const SampleRow r = rows[blockIdx.x];
    const SamplePart* p = parts + (size_t)blockIdx.x * nc;
    float av;
    int ai;
    u64 allowed;
    sample_row_best(p, nc, av, ai, allowed, bs);
    // No bans here, so the largest allowed logit is the largest non-NaN one (sample_rows'
    // fallback), or id 0 when every logit is NaN.
    const int best = ai == SAMPLE_NONE ? 0 : ai;
    if (threadIdx.x == 0) chosen = best;
    if (!(r.flags & 1) && allowed > 0ull) {
        // The draw's target in the row's exact total mass; the chunk it falls in.
        if (threadIdx.x == 0) {
            u64 total = 0ull;
            for (int j = 0; j < nc; ++j) total += p[j].mass;
            cs = -1;
            if (total > 0ull) {
                u64 target = (u64)(r.u * (double)total);
                if (target >= total) target = total - 1ull;
                u64 acc = 0ull;
                for (int j = 0; j < nc; ++j) {
                    if (target < acc + p[j].mass) {
                        cs = j;
                        cbefore = target - acc;  // the target within chunk j
                        break;
                    }
                    acc += p[j].mass;
                }
            }
        }
        __syncthreads();
        if (cs >= 0) {
            // The walk through chunk cs in id order: contiguous id ranges per thread, an exact
            // prefix sum, then the thread holding the target walks its range.
            const float t = r.temperature, zmax = av / t;
            const float* row = logits + (size_t)r.logit_row * vocab;
            const int c0 = cs * SAMPLE_CHUNK, c1 = min(vocab, c0 + SAMPLE_CHUNK);
            const int per = (SAMPLE_CHUNK + (int)blockDim.x - 1) / (int)blockDim.x;
            const int lo = min(c1, c0 + (int)threadIdx.x * per), hi = min(c1, lo + per);
            u64 local = 0ull;
            for (int i = lo; i < hi; ++i) {
                const float l = row[i];
                if (!isnan(l)) local += wfix(l / t, zmax);
            }
            u64 total;
            const u64 before = block_excl_scan(local, bs.sh64, total);
            const u64 target = cbefore;
            if (target >= before && target < before + local) {
                u64 acc = before;
                for (int i = lo; i < hi; ++i) {
                    const float l = row[i];
                    if (isnan(l)) continue;
                    acc += wfix(l / t, zmax);
                    if (acc > target) {
                        chosen = i;
                        break;
                    }
                }
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        out[2 * r.out_row] = (unsigned)chosen;
        out[2 * r.out_row + 1] = 0x7fc00000u;  // no logprob asked
    }
}
