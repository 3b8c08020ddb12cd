// Embedding gather: out[t, :] = table[tokens[t], :] as fp32. Token ids are read on the device
// so the same launch can sit inside a captured graph.
extern "C" __global__ void embed_gather(const bf16_t* __restrict__ table,
                                        const unsigned* __restrict__ tokens,
                                        float* __restrict__ out, int hidden) {
    pdl_enter();
    const int t = blockIdx.y;
    const bf16_t* row = table + (size_t)tokens[t] * hidden;
    float* o = out + (size_t)t * hidden;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += gridDim.x * blockDim.x)
        o[i] = bf2f(row[i]);
}

// dst[i, :] = src[rows[i], :] (fp32): the last prompt row of each sequence after a prefill,
// gathered for the lm_head. grid = (ceil(cols / 256), n).
extern "C" __global__ void rows_gather(const float* __restrict__ src,
                                       const unsigned* __restrict__ rows,
                                       float* __restrict__ dst, int cols) {
    pdl_enter();
    const int i = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c < cols) dst[(size_t)i * cols + c] = src[(size_t)rows[i] * cols + c];
}
