// Router top-k: pick the k largest logits of each token (ties: lower expert index first) and
// softmax over those k only. One warp per token; logits staged in shared memory.
// Dynamic shared memory: n_experts floats.
extern "C" __global__ void router_topk(const float* __restrict__ logits, int* __restrict__ idx,
                                       float* __restrict__ weights, int n_experts, int k) {
    extern __shared__ float vals[];
    const int t = blockIdx.x, lane = threadIdx.x;
    for (int e = lane; e < n_experts; e += 32) vals[e] = logits[(size_t)t * n_experts + e];
    __syncwarp();
    float top_v[32];
    int top_i[32];
    for (int s = 0; s < k; ++s) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
        for (int e = lane; e < n_experts; e += 32) {
            const float v = vals[e];
            if (v > bv || (v == bv && e < bi)) { bv = v; bi = e; }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (bi >= n_experts) bi = 0;  // only NaN/-inf left: stay in bounds, NaN shows downstream
        top_v[s] = bv;
        top_i[s] = bi;
        if (lane == 0) vals[bi] = -INFINITY;
        __syncwarp();
    }
    if (lane != 0) return;
    float sum = 0.0f;
    for (int s = 0; s < k; ++s) sum += expf(top_v[s] - top_v[0]);
    for (int s = 0; s < k; ++s) {
        idx[(size_t)t * k + s] = top_i[s];
        weights[(size_t)t * k + s] = expf(top_v[s] - top_v[0]) / sum;
    }
}
