// attention.cu: the KV-cache write and paged attention over block tables.
//
// Layout (FlashAttention's paged varlen layout, so a FlashAttention-style kernel can replace
// this one without touching the cache or the batch metadata):
//   k_cache, v_cache [num_blocks, block_size, h_kv, d]; slot s = block * block_size + offset;
//   cu_seqlens_q [seqs + 1], seq_lens [seqs] (context after this step's write),
//   block_tables [seqs, max_blocks].
// Query row i of sequence s sits at position seq_lens[s] - q_len(s) + (i - cu_seqlens_q[s]).
//
// This kernel is the correctness baseline: one block of ATTN_WARPS warps per (query row,
// query head); each warp walks every ATTN_WARPS-th visible key with an online softmax in
// f32 (lanes split the head dim), and the warps' partial results are merged at the end.

#define ATTN_WARPS 4
#define ATTN_MAX_DIM 256
#define ATTN_PER_LANE (ATTN_MAX_DIM / 32)

// k, v [t, h_kv * d] -> the pools at slots[t]. One block per token.
extern "C" __global__ void write_kv_bf16(const bf16_t* k, const bf16_t* v, bf16_t* kc, bf16_t* vc, const u32* slots,
                                         u32 row, u64 capacity) {
    const u64 slot = slots[blockIdx.x];
    if (slot >= capacity) return;
    const u64 src = (u64)blockIdx.x * row, dst = slot * row;
    for (u32 i = threadIdx.x; i < row; i += blockDim.x) {
        kc[dst + i] = k[src + i];
        vc[dst + i] = v[src + i];
    }
}

struct AttnArgs {
    u32 num_seqs, max_blocks, block_size, h, h_kv, d, window;
    float scale, softcap;
};

// The sequence owning query row i: the last s with cu[s] <= i.
__device__ u32 seq_of_row(const u32* cu, u32 num_seqs, u32 i) {
    u32 lo = 0, hi = num_seqs;  // invariant: cu[lo] <= i < cu[hi]
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (cu[mid] <= i) lo = mid; else hi = mid;
    }
    return lo;
}

// grid (t, h), block ATTN_WARPS * 32 threads. out, q [t, h, d].
extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)
paged_attention_bf16(bf16_t* out, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const u32* cu_q,
                     const u32* seq_lens, const u32* tables, AttnArgs a) {
    const u32 i = blockIdx.x, hq = blockIdx.y;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 s = seq_of_row(cu_q, a.num_seqs, i);
    const u32 q_len = cu_q[s + 1] - cu_q[s];
    const u32 pos = seq_lens[s] - q_len + (i - cu_q[s]);
    const u32 first = (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
    const u32 kv_head = hq / (a.h / a.h_kv);
    const u32* table = tables + (u64)s * a.max_blocks;

    float qr[ATTN_PER_LANE], acc[ATTN_PER_LANE];
    const bf16_t* qrow = q + ((u64)i * a.h + hq) * a.d;
#pragma unroll
    for (int r = 0; r < ATTN_PER_LANE; ++r) {
        const u32 e = lane + 32 * r;
        qr[r] = e < a.d ? bf2f(qrow[e]) : 0.0f;
        acc[r] = 0.0f;
    }
    float m = -MET_INF, l = 0.0f;
#ifdef MET_FAULT_DROP_LAST_KV_BLOCK
    // A deliberate bug (MET_TEST_FAULT=drop-last-kv-block), so the precision gate can show
    // it fails: keys of the sequence's last block are skipped when an earlier one is in view.
    const u32 last_block_start = (seq_lens[s] - 1) / a.block_size * a.block_size;
    const u32 last_key = last_block_start > first ? min(pos, last_block_start - 1) : pos;
#else
    const u32 last_key = pos;
#endif
    for (u32 j = first + warp; j <= last_key; j += ATTN_WARPS) {
        const u64 slot = (u64)table[j / a.block_size] * a.block_size + j % a.block_size;
        const u64 at = (slot * a.h_kv + kv_head) * a.d;
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < ATTN_PER_LANE; ++r) {
            const u32 e = lane + 32 * r;
            if (e < a.d) dot += qr[r] * bf2f(kc[at + e]);
        }
        float score = warp_sum(dot) * a.scale;
        if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);
        const float m_new = fmaxf(m, score);
        const float corr = m == -MET_INF ? 0.0f : expf(m - m_new);
        const float p = expf(score - m_new);
        l = l * corr + p;
#pragma unroll
        for (int r = 0; r < ATTN_PER_LANE; ++r) {
            const u32 e = lane + 32 * r;
            acc[r] = acc[r] * corr + (e < a.d ? p * bf2f(vc[at + e]) : 0.0f);
        }
        m = m_new;
    }

    // Merge the warps: out = sum_w acc_w e^(m_w - M) / sum_w l_w e^(m_w - M).
    __shared__ float sm_m[ATTN_WARPS], sm_l[ATTN_WARPS];
    __shared__ float sm_acc[ATTN_WARPS][ATTN_MAX_DIM];
    if (lane == 0) {
        sm_m[warp] = m;
        sm_l[warp] = l;
    }
#pragma unroll
    for (int r = 0; r < ATTN_PER_LANE; ++r) {
        const u32 e = lane + 32 * r;
        if (e < a.d) sm_acc[warp][e] = acc[r];
    }
    __syncthreads();
    float big = -MET_INF;
    for (int w = 0; w < ATTN_WARPS; ++w) big = fmaxf(big, sm_m[w]);
    float total = 0.0f, factor[ATTN_WARPS];
#pragma unroll
    for (int w = 0; w < ATTN_WARPS; ++w) {
        factor[w] = sm_m[w] == -MET_INF ? 0.0f : expf(sm_m[w] - big);
        total += sm_l[w] * factor[w];
    }
    const float inv = 1.0f / total;
    bf16_t* orow = out + ((u64)i * a.h + hq) * a.d;
    for (u32 e = threadIdx.x; e < a.d; e += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) o += sm_acc[w][e] * factor[w];
        orow[e] = f2bf(o * inv);
    }
}
