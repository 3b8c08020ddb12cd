// Greedy sampling on the device: the index of the largest logit of each row (ties: lower
// index; NaN never wins), so only the token id goes back to the host. Two stages: per-chunk
// partials, then one block per row.
// grid = (nchunks, T), block = 256 (a multiple of 32).
extern "C" __global__ void argmax_partial(const float* __restrict__ logits, int vocab, int chunk,
                                          float* __restrict__ part_v, int* __restrict__ part_i) {
    pdl_enter();
    const int c = blockIdx.x, t = blockIdx.y;
    const int lo = c * chunk, hi = min(vocab, lo + chunk);
    const float* row = logits + (size_t)t * vocab;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) take_better(bv, bi, row[i], i);
    __shared__ float sv[32];
    __shared__ int si[32];
    block_argmax(bv, bi, sv, si, 0x7fffffff);
    if (threadIdx.x == 0) {
        part_v[(size_t)t * gridDim.x + c] = bv;
        part_i[(size_t)t * gridDim.x + c] = bi;
    }
}

// grid = T, block = 256. A row of only NaN/-inf yields token 0.
extern "C" __global__ void argmax_final(const float* __restrict__ part_v,
                                        const int* __restrict__ part_i, int nchunks,
                                        unsigned* __restrict__ out) {
    pdl_enter();
    const int t = blockIdx.x;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int c = threadIdx.x; c < nchunks; c += blockDim.x)
        take_better(bv, bi, part_v[(size_t)t * nchunks + c], part_i[(size_t)t * nchunks + c]);
    __shared__ float sv[32];
    __shared__ int si[32];
    block_argmax(bv, bi, sv, si, 0x7fffffff);
    if (threadIdx.x == 0) out[t] = bi == 0x7fffffff ? 0u : (unsigned)bi;
}
