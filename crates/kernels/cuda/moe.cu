// moe.cu: mixture-of-experts routing and the weighted combine of expert outputs.
//
// Routing follows the CPU reference step for step (f32 softmax with the max subtracted, a
// sequential f32 sum, experts best first with ties to the lower index, optional
// renormalisation over the chosen ones) so both backends pick the same experts. The expert
// MLPs themselves are GEMMs over tokens grouped by expert (see `src/cuda/moe.rs`); the
// combine sums each token's k expert rows, weighted, in a fixed order (no atomics), so the
// result is deterministic.

// One block per token; thread 0 does the (small) selection. probs: dynamic shared [e].
template <typename T>
__device__ void topk_routing(const T* logits, float* weights, u32* experts, u32 e, u32 k, u32 renormalize) {
    extern __shared__ float probs[];
    const T* row = logits + (u64)blockIdx.x * e;
    if (threadIdx.x != 0) return;
    float max = -MET_INF;
    for (u32 j = 0; j < e; ++j) max = fmaxf(max, load_f(row, j));
    float total = 0.0f;
    for (u32 j = 0; j < e; ++j) {
        probs[j] = expf(load_f(row, j) - max);
        total += probs[j];
    }
    float norm = 0.0f;
    for (u32 c = 0; c < k; ++c) {
        u32 best = 0xffffffffu;
        for (u32 j = 0; j < e; ++j) {
            if (probs[j] < 0.0f) continue;  // already chosen
            if (best == 0xffffffffu || probs[j] > probs[best]) best = j;
        }
        norm += probs[best];
        experts[(u64)blockIdx.x * k + c] = best;
        weights[(u64)blockIdx.x * k + c] = probs[best];
        probs[best] = -1.0f;
    }
    if (!renormalize) norm = total;
    for (u32 c = 0; c < k; ++c) weights[(u64)blockIdx.x * k + c] /= norm;
}

extern "C" __global__ void topk_routing_bf16(const bf16_t* l, float* w, u32* x, u32 e, u32 k, u32 renorm) {
    pdl_enter();
    topk_routing(l, w, x, e, k, renorm);
}

extern "C" __global__ void topk_routing_f32(const float* l, float* w, u32* x, u32 e, u32 k, u32 renorm) {
    pdl_enter();
    topk_routing(l, w, x, e, k, renorm);
}

// out[t, :] = sum_j weights[t, j] * y[rows[t * k + j], :], for y [t * k, h] in expert order.
template <typename W>
__device__ void moe_combine(const bf16_t* y, const u32* rows, const W* weights, bf16_t* out, u32 k, u32 h) {
    const u64 t = blockIdx.x;
    for (u32 c = threadIdx.x; c < h; c += blockDim.x) {
        float acc = 0.0f;
        for (u32 j = 0; j < k; ++j) acc += load_f(weights, t * k + j) * bf2f(y[(u64)rows[t * k + j] * h + c]);
        out[t * h + c] = f2bf(acc);
    }
}

extern "C" __global__ void moe_combine_f32(const bf16_t* y, const u32* rows, const float* w, bf16_t* out, u32 k, u32 h) {
    pdl_enter();
    moe_combine(y, rows, w, out, k, h);
}

extern "C" __global__ void moe_combine_bf16(const bf16_t* y, const u32* rows, const bf16_t* w, bf16_t* out, u32 k,
                                            u32 h) {
    pdl_enter();
    moe_combine(y, rows, w, out, k, h);
}
