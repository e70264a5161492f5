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

// The element types of a KV pool. `Kv16` holds bf16 values; `Kv8` holds e4m3 bytes, each
// the value divided by its layer's scale (k or v), rounded to nearest even and saturated at
// ±448, as vLLM's fp8 cache stores them. e4m3 is a subset of bf16, so a read widens a byte
// exactly and leaves the scale out: the kernels fold the keys' scale into the score scale
// (`AttnArgs::scale`) and multiply outputs by the values' (`AttnArgs::v_scale`), which is
// the same sum as over the dequantized values, one rounding fewer.
struct Kv16 {
    typedef bf16_t T;
    static constexpr bool FP8 = false;
    __device__ static float at(const T* p, u64 i) { return bf2f(p[i]); }
    // Eight elements from `p`, and as f32: a 16-byte vector here, 8 bytes (in x and y)
    // for e4m3. (A ring of 8-byte vectors spilled in the decode kernel; these do not.)
    __device__ static uint4 load8(const T* p) { return *reinterpret_cast<const uint4*>(p); }
    __device__ static void unpack(uint4 v, float* f) { unpack8(v, f); }
    // `x` as the pool stores it (`x` is a bf16 value already; the scale is unused).
    __device__ static T from(float x, float) { return f2bf(x); }
};
struct Kv8 {
    typedef u8 T;
    static constexpr bool FP8 = true;
    __device__ static float at(const T* p, u64 i) { return e4m3_to_f(p[i]); }
    __device__ static uint4 load8(const T* p) {
        const uint2 w = *reinterpret_cast<const uint2*>(p);
        return make_uint4(w.x, w.y, 0, 0);
    }
    __device__ static void unpack(uint4 v, float* f) { unpack8_e4m3(make_uint2(v.x, v.y), f); }
    __device__ static T from(float x, float scale) { return e4m3_from(x / scale); }
};

// k, v [t, h_kv * d] -> the pools at slots[t], keys over `k_scale` and values over
// `v_scale` where the pool is e4m3. One block per token.
template <typename KV>
__device__ void write_kv(const bf16_t* k, const bf16_t* v, typename KV::T* kc, typename KV::T* vc, const u32* slots,
                         u32 row, u64 capacity, float k_scale, float v_scale) {
    const u64 slot = slots[blockIdx.x];
    if (slot >= capacity) return;
    const u64 src = (u64)blockIdx.x * row, dst = slot * row;
    for (u32 i = threadIdx.x; i < row; i += blockDim.x) {
        kc[dst + i] = KV::from(bf2f(k[src + i]), k_scale);
        vc[dst + i] = KV::from(bf2f(v[src + i]), v_scale);
    }
}

extern "C" __global__ void write_kv_bf16(const bf16_t* k, const bf16_t* v, bf16_t* kc, bf16_t* vc, const u32* slots,
                                         u32 row, u64 capacity, float k_scale, float v_scale) {
    pdl_enter();
    write_kv<Kv16>(k, v, kc, vc, slots, row, capacity, k_scale, v_scale);
}

extern "C" __global__ void write_kv_e4m3(const bf16_t* k, const bf16_t* v, u8* kc, u8* vc, const u32* slots, u32 row,
                                         u64 capacity, float k_scale, float v_scale) {
    pdl_enter();
    write_kv<Kv8>(k, v, kc, vc, slots, row, capacity, k_scale, v_scale);
}

// The attention prologue of one layer, fused: qkv [t, (h + 2 h_kv) d] is split into heads;
// q and k heads get the per-head RMSNorm (when `q_norm` is set) and rotary, as
// `rms_norm_bf16` then `rotary_bf16` compute them (the normalised head is rounded to bf16
// before it rotates); q goes to `q_out [t, h, d]`, k and v into the pools at slots[t]
// (a slot past the pool, as padding rows of a graph carry, writes nothing). Norm weights
// are bf16 (Qwen3) or f32 (Gemma 3's `1 + w`), under `rms_norm_bf16`'s rule for each.
// grid (t, ceil((h + 2 h_kv) / QKV_WARPS)), block QKV_WARPS * 32: one warp per head. The
// block first computes its token's cos and sin, once per frequency, for all its heads.
#define QKV_WARPS 4

struct QkvArgs {
    u32 h, h_kv, d, half;
    float eps, k_scale, v_scale;  // the scales divide what an e4m3 pool stores
    u64 capacity;
};


template <typename W, typename KV>
__device__ void qkv_rotary_write(const bf16_t* qkv, const W* q_norm, const W* k_norm, const u32* positions,
                                 const float* inv_freq, bf16_t* q_out, typename KV::T* kc, typename KV::T* vc,
                                 const u32* slots, const QkvArgs& a) {
    __shared__ float head[QKV_WARPS][ATTN_MAX_DIM];
    __shared__ float cos_sin[2][ATTN_MAX_DIM / 2];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 tok = blockIdx.x, hh = blockIdx.y * QKV_WARPS + warp;
    const u32 heads = a.h + 2 * a.h_kv;
    if (blockIdx.y * QKV_WARPS < a.h + a.h_kv) {  // the block has a q or k head
        const float p = (float)positions[tok];
        for (u32 i = threadIdx.x; i < a.half; i += blockDim.x) {
            float s, c;
            sincosf(p * inv_freq[i], &s, &c);
            cos_sin[0][i] = round_bf(c);
            cos_sin[1][i] = round_bf(s);
        }
        __syncthreads();
    }
    if (hh >= heads) return;
    const bf16_t* src = qkv + ((u64)tok * heads + hh) * a.d;
    const u64 slot = slots[tok];
    const u64 kv_row = (u64)a.h_kv * a.d;
    if (hh >= a.h + a.h_kv) {  // a v head: straight into the cache
        if (slot >= a.capacity) return;
        typename KV::T* dst = vc + slot * kv_row + (u64)(hh - a.h - a.h_kv) * a.d;
        for (u32 e = lane; e < a.d; e += 32) dst[e] = KV::from(bf2f(src[e]), a.v_scale);
        return;
    }
    const bool is_q = hh < a.h;
    const W* norm = is_q ? q_norm : k_norm;
    float* sh = head[warp];
    if (norm) {
        float ss = 0.0f;
        for (u32 e = lane; e < a.d; e += 32) {
            const float v = bf2f(src[e]);
            ss += v * v;
        }
        const float inv = 1.0f / sqrtf(warp_sum(ss) / (float)a.d + a.eps);
        for (u32 e = lane; e < a.d; e += 32) sh[e] = round_bf(norm_weighted(norm, load_f(norm, e), bf2f(src[e]) * inv));
    } else {
        for (u32 e = lane; e < a.d; e += 32) sh[e] = bf2f(src[e]);
    }
    __syncwarp();
    // Rotary of element e of the head, rounded to bf16.
    auto rotated = [&](u32 e) {
        if (e >= 2 * a.half) return sh[e];
        const u32 i = e < a.half ? e : e - a.half;
        const float c = cos_sin[0][i], s = cos_sin[1][i];
        const float x0 = sh[i], x1 = sh[i + a.half];
        return round_bf(e < a.half ? round_bf(x0 * c) - round_bf(x1 * s) : round_bf(x1 * c) + round_bf(x0 * s));
    };
    if (is_q) {
        bf16_t* dst = q_out + ((u64)tok * a.h + hh) * a.d;
        for (u32 e = lane; e < a.d; e += 32) dst[e] = f2bf(rotated(e));
    } else {
        if (slot >= a.capacity) return;
        typename KV::T* dst = kc + slot * kv_row + (u64)(hh - a.h) * a.d;
        for (u32 e = lane; e < a.d; e += 32) dst[e] = KV::from(rotated(e), a.k_scale);
    }
}

#define MET_QKV_ROTARY_WRITE(NAME, W, KV)                                                                      \
    extern "C" __global__ void __launch_bounds__(QKV_WARPS * 32)                                               \
        NAME(const bf16_t* qkv, const W* q_norm, const W* k_norm, const u32* positions, const float* inv_freq, \
             bf16_t* q_out, KV::T* kc, KV::T* vc, const u32* slots, QkvArgs a) {                              \
        pdl_enter();                                                                                           \
        qkv_rotary_write<W, KV>(qkv, q_norm, k_norm, positions, inv_freq, q_out, kc, vc, slots, a);            \
    }
MET_QKV_ROTARY_WRITE(qkv_rotary_write_bf16, bf16_t, Kv16)
MET_QKV_ROTARY_WRITE(qkv_rotary_write_bf16_nf32, float, Kv16)
MET_QKV_ROTARY_WRITE(qkv_rotary_write_e4m3, bf16_t, Kv8)
MET_QKV_ROTARY_WRITE(qkv_rotary_write_e4m3_nf32, float, Kv8)

struct AttnArgs {
    u32 num_seqs, max_blocks, block_size, h, h_kv, d, window;
    float scale, softcap;  // `scale` times the keys' scale for an e4m3 pool
    u32 split_min;         // decode kernel only
    float v_scale;         // the values' scale for an e4m3 pool, else 1
};

// The pool slot of key j of a sequence with block table `table`: shifts when the block size
// is a power of two (met's default is 16), else a division, which costs a score of
// instructions per key in the tiled kernels' copy loops.
__device__ __forceinline__ u64 kv_slot(const u32* table, u32 j, u32 bs) {
    if ((bs & (bs - 1)) == 0) {
        const u32 sh = __ffs(bs) - 1;
        return ((u64)table[j >> sh] << sh) | (j & (bs - 1));
    }
    return (u64)table[j / bs] * bs + j % bs;
}

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
template <typename KV>
__device__ void paged_attention(bf16_t* out, const bf16_t* q, const typename KV::T* kc, const typename KV::T* vc,
                                const u32* cu_q, const u32* seq_lens, const u32* tables, const AttnArgs& a) {
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
        const u64 slot = kv_slot(table, j, a.block_size);
        const u64 at = (slot * a.h_kv + kv_head) * a.d;
        float dot = 0.0f;
#pragma unroll
        for (int r = 0; r < ATTN_PER_LANE; ++r) {
            const u32 e = lane + 32 * r;
            if (e < a.d) dot += qr[r] * KV::at(kc, at + e);
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
            acc[r] = acc[r] * corr + (e < a.d ? p * KV::at(vc, at + e) : 0.0f);
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
    const float inv = a.v_scale / total;
    bf16_t* orow = out + ((u64)i * a.h + hq) * a.d;
    for (u32 e = threadIdx.x; e < a.d; e += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATTN_WARPS; ++w) o += sm_acc[w][e] * factor[w];
        orow[e] = f2bf(o * inv);
    }
}

#define MET_PAGED_ATTENTION(NAME, KV)                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32)                                                 \
        NAME(bf16_t* out, const bf16_t* q, const KV::T* kc, const KV::T* vc, const u32* cu_q, const u32* seq_lens, \
             const u32* tables, AttnArgs a) {                                                                     \
        pdl_enter();                                                                                              \
        paged_attention<KV>(out, q, kc, vc, cu_q, seq_lens, tables, a);                                           \
    }
MET_PAGED_ATTENTION(paged_attention_bf16, Kv16)
MET_PAGED_ATTENTION(paged_attention_e4m3, Kv8)

// ---- decode attention ----------------------------------------------------------------------
//
// Batches whose every sequence has one query row (decode steps) take this split-KV path:
// a block per (sequence, KV head, split) attends for all G = h / h_kv query heads of the
// group at once, so each key and value is read once per group rather than once per query
// head. A sequence's visible keys are cut into at most DEC_SPLITS splits of at least
// `a.split_min` keys (a multiple of it): short splits keep a few sequences from leaving the
// GPU idle, long ones keep a large batch from spending its time merging. The host picks
// `split_min` from the batch size class (see `attention.rs`), so a row's result depends on
// its own context and that class only. Each split writes its softmax
// numerator (unnormalised), running max and sum in f32; the last split block of a (sequence,
// KV head) to finish (a ticket counter per pair, reset by that block) merges the splits into
// `out`, so a step is one launch (a sequence with a single split writes `out` itself).
// Lanes work in groups of d / 8, each lane on 8 contiguous dims (16-byte loads); a warp
// covers 32 / (d / 8) keys per step. One kernel per group size bucket (1, 2, 4, 8 query
// heads per KV head), so registers are sized by the model's group, not the largest.

#define DEC_WARPS 4  // per block, from 3 sequences on (see `decode_attention`)
#define DEC_SPLITS 16
#define DEC_MAX_GROUP 8
#define DEC_DEPTH 4

// Keys per split for a sequence that sees `visible` keys.
__device__ __forceinline__ u32 dec_split_len(u32 visible, u32 split_min) {
    const u32 per = (visible + DEC_SPLITS - 1) / DEC_SPLITS;
    return max(split_min, (per + split_min - 1) / split_min * split_min);
}

// A decode row's split plan, the same in both split-KV kernels (this file's
// `decode_attention` and flash_decode.cu's), so which kernel takes a split changes no result:
// the keys `first .. first + visible` it attends to, cut into `count` splits of `len` keys
// (`dec_split_len` of the keys in its window; the last split may be shorter).
struct DecSplits {
    u32 first, visible, len, count;
};

// The plan of a row whose sequence holds `ctx` keys, its query the last.
__device__ __forceinline__ DecSplits dec_splits(u32 ctx, const AttnArgs& a) {
    const u32 pos = ctx - 1;
    const u32 first = (a.window > 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
#ifdef MET_FAULT_DROP_LAST_KV_BLOCK
    // The precision gate's deliberate bug (see `paged_attention_bf16`).
    const u32 last_block_start = pos / a.block_size * a.block_size;
    const u32 last_key = last_block_start > first ? min(pos, last_block_start - 1) : pos;
#else
    const u32 last_key = pos;
#endif
    const u32 len = dec_split_len(pos + 1 - first, a.split_min);
    return DecSplits{first, last_key + 1 - first, len, (pos + 1 - first + len - 1) / len};
}

// Merges the `splits` partials of row `s`'s query heads `hq0 .. hq0 + group` into
// out[s, hq0 .., :], run by the whole block (at least DEC_MAX_GROUP threads). The maxima and sums come through shared memory and each thread issues all its
// numerator loads before it sums them, so the merge costs a few round trips to L2, not one
// per split. The sums run over the splits in order, so the result does not depend on which
// block merges. Reads bypass L1: other blocks wrote the partials.
__device__ void dec_merge(bf16_t* out, const float* part_acc, const float* part_ml, u32 s, u32 hq0, u32 group,
                          u32 splits, const AttnArgs& a) {
    // sm_m's maxima become the splits' weights in place (each row is one thread's), which
    // keeps the tensor-core decode kernel's static shared memory small enough for four
    // blocks of two warps an SM.
    __shared__ float sm_m[DEC_MAX_GROUP][DEC_SPLITS], sm_l[DEC_MAX_GROUP][DEC_SPLITS], sm_den[DEC_MAX_GROUP];
    const u32 t = threadIdx.x;
    const u64 head0 = (u64)s * a.h + hq0;
    for (u32 idx = t; idx < group * DEC_SPLITS; idx += blockDim.x) {
        const u32 g = idx / DEC_SPLITS, i = idx % DEC_SPLITS;
        if (i >= splits) continue;
        const float* ml = part_ml + ((head0 + g) * DEC_SPLITS + i) * 2;
        sm_m[g][i] = __ldcg(ml);
        sm_l[g][i] = __ldcg(ml + 1);
    }
    __syncthreads();
    if (t < group) {
        float big = -MET_INF;
        for (u32 i = 0; i < splits; ++i) big = fmaxf(big, sm_m[t][i]);
        float den = 0.0f;
        for (u32 i = 0; i < splits; ++i) {
            const float f = sm_m[t][i] == -MET_INF ? 0.0f : expf(sm_m[t][i] - big);
            sm_m[t][i] = f;
            den += sm_l[t][i] * f;
        }
        sm_den[t] = den;
    }
    __syncthreads();
    for (u32 idx = t; idx < group * a.d; idx += blockDim.x) {
        const u32 g = idx / a.d, e = idx % a.d;
        const float* acc = part_acc + (head0 + g) * DEC_SPLITS * a.d + e;
        float v[DEC_SPLITS];
#pragma unroll
        for (u32 i = 0; i < DEC_SPLITS; ++i) v[i] = i < splits ? __ldcg(acc + i * a.d) : 0.0f;
        float num = 0.0f;
#pragma unroll
        for (u32 i = 0; i < DEC_SPLITS; ++i)
            if (i < splits) num += v[i] * sm_m[g][i];
        out[(head0 + g) * a.d + e] = f2bf(num / sm_den[g] * a.v_scale);
    }
}

// Ends a split of the split-KV decode kernels (this file's `decode_attention` and
// flash_decode.cu's), run by the whole block once it has written the split's partials for
// row `s`'s query heads of KV head `kvh` (`group` of them): takes a ticket on the (sequence,
// KV head) counter and, in the last of the `splits` blocks to take one, merges every split
// into `out` and resets the counter for the next launch. True in the block that merged.
// The fence before the ticket makes this block's partials visible to whichever block
// merges; the one after makes the others' visible to this one. `ticket` is read by every
// thread between two barriers and written again only after the caller's next barrier.
__device__ bool dec_merge_if_last(bf16_t* out, const float* part_acc, const float* part_ml, u32* counters, u32 s,
                                  u32 kvh, u32 group, u32 splits, const AttnArgs& a) {
    __shared__ u32 ticket;
    __threadfence();
    __syncthreads();
    u32* counter = counters + (u64)s * a.h_kv + kvh;
    if (threadIdx.x == 0) ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (ticket != splits - 1) return false;
    __threadfence();
    dec_merge(out, part_acc, part_ml, s, kvh * group, group, splits, a);
    if (threadIdx.x == 0) *counter = 0;  // ready for the next launch
    return true;
}

// grid (seqs, h_kv, z <= DEC_SPLITS), block DEC_WARPS * 32. part_acc [seqs, h, DEC_SPLITS, d],
// part_ml [seqs, h, DEC_SPLITS, 2]. Needs d / 8 a power of two (d in 8..256) and
// G <= DEC_MAX_GROUP (checked on the host).
// GM is the group size rounded up to a power of two (registers are sized by it); W warps
// per block. One or two sequences leave most of the GPU idle, so each split is spread
// over 8 warps, which halves the serial work of each; larger batches fill the SMs better
// with 4-warp blocks. W only changes which warp sums which keys, and the host picks it by the
// same batch class as `split_min`, so a padded graph replay still equals the eager step.
template <int GM, int W, typename KV>
__device__ void decode_attention(float* part_acc, float* part_ml, const bf16_t* q, const typename KV::T* kc,
                                 const typename KV::T* vc, const u32* seq_lens, const u32* tables, const AttnArgs& a,
                                 bf16_t* out, u32* counters) {
    const u32 s = blockIdx.x, kvh = blockIdx.y;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 group = a.h / a.h_kv;
    const u32 L = a.d / 8;             // lanes per key
    const u32 per_step = 32 / L;       // keys per warp step
    const u32 sub = lane / L, lig = lane % L;
    const DecSplits plan = dec_splits(seq_lens[s], a);
    const u32 first = plan.first, visible = plan.visible, len = plan.len, splits_used = plan.count;
    const u32* table = tables + (u64)s * a.max_blocks;
    // A block takes splits blockIdx.z, blockIdx.z + gridDim.z, ...: the host sizes the grid
    // to the splits a step needs, so large batches do not queue thousands of empty blocks.
    for (u32 split = blockIdx.z; split < splits_used; split += gridDim.z) {
        const u32 begin = first + split * len;
        const u32 end = min(first + visible, begin + len);  // exclusive

        float qf[GM][8], acc[GM][8], m[GM], l[GM];
#pragma unroll
        for (int g = 0; g < GM; ++g) {
            m[g] = -MET_INF;
            l[g] = 0.0f;
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
            if (g < (int)group) {
                const uint4 v = *reinterpret_cast<const uint4*>(q + ((u64)s * a.h + kvh * group + g) * a.d + lig * 8);
                unpack8(v, qf[g]);
            }
        }
        // The online softmax of the hot loop uses the hardware exponential (`__expf`: 2 ulp
        // near 0, more for large negative arguments, whose terms are negligible anyway): at
        // small batches a warp's serial instruction stream is what the kernel waits for, and
        // the accurate `expf` is a large part of it.
        // The keys and values of DEC_DEPTH steps are in flight at once (a ring of registers:
        // a slot is refilled with the step DEC_DEPTH ahead as soon as it is read), so a split
        // of up to DEC_DEPTH steps per warp costs one round trip to memory, not one per step.
        const u32 stride = W * per_step;
        auto fetch = [&](u32 j0, uint4& kv, uint4& vv) {
            const u32 j = j0 + sub;
            const u32 jj = j < end ? j : begin;
            const u64 slot = kv_slot(table, jj, a.block_size);
            const u64 at = (slot * a.h_kv + kvh) * a.d + lig * 8;
            kv = KV::load8(kc + at);
            vv = KV::load8(vc + at);
        };
        const u32 j_first = begin + warp * per_step;
        uint4 k_ring[DEC_DEPTH], v_ring[DEC_DEPTH];
#pragma unroll
        for (int r = 0; r < DEC_DEPTH; ++r)
            if (j_first + r * stride < end) fetch(j_first + r * stride, k_ring[r], v_ring[r]);
        for (u32 jb = j_first; jb < end; jb += DEC_DEPTH * stride) {
#pragma unroll
            for (int r = 0; r < DEC_DEPTH; ++r) {
                const u32 j0 = jb + r * stride;
                if (j0 >= end) break;
                const bool live = j0 + sub < end;
                float kf[8], vf[8];
                KV::unpack(k_ring[r], kf);
                KV::unpack(v_ring[r], vf);
                if (j0 + DEC_DEPTH * stride < end) fetch(j0 + DEC_DEPTH * stride, k_ring[r], v_ring[r]);
#pragma unroll
                for (int g = 0; g < GM; ++g) {
                    if (g >= (int)group) break;
                    float dot = 0.0f;
#pragma unroll
                    for (int e = 0; e < 8; ++e) dot = fmaf(qf[g][e], kf[e], dot);
                    for (u32 o = L / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                    if (!live) continue;
                    float score = dot * a.scale;
                    if (a.softcap > 0.0f) score = a.softcap * tanhf(score / a.softcap);
                    const float m_new = fmaxf(m[g], score);
                    const float corr = m[g] == -MET_INF ? 0.0f : __expf(m[g] - m_new);
                    const float p = __expf(score - m_new);
                    l[g] = l[g] * corr + p;
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[g][e] = fmaf(acc[g][e], corr, p * vf[e]);
                    m[g] = m_new;
                }
            }
        }
        // Merge the lane groups of the warp (same dims, other keys), then the warps.
        for (u32 o = L; o < 32; o <<= 1) {
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                if (g >= (int)group) break;
                const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o), l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
                const float big = fmaxf(m[g], m2);
                const float f1 = m[g] == -MET_INF ? 0.0f : expf(m[g] - big), f2 = m2 == -MET_INF ? 0.0f : expf(m2 - big);
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    const float a2 = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                    acc[g][e] = acc[g][e] * f1 + a2 * f2;
                }
                l[g] = l[g] * f1 + l2 * f2;
                m[g] = big;
            }
        }
        __shared__ float sm_acc[W][GM][ATTN_MAX_DIM];
        __shared__ float sm_ml[W][GM][2];
        if (sub == 0) {
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                if (g >= (int)group) break;
#pragma unroll
                for (int e = 0; e < 8; ++e) sm_acc[warp][g][lig * 8 + e] = acc[g][e];
                if (lig == 0) {
                    sm_ml[warp][g][0] = m[g];
                    sm_ml[warp][g][1] = l[g];
                }
            }
        }
        __syncthreads();
        for (u32 idx = threadIdx.x; idx < group * a.d; idx += blockDim.x) {
            const u32 g = idx / a.d, e = idx % a.d;
            float big = -MET_INF;
            for (int w = 0; w < W; ++w) big = fmaxf(big, sm_ml[w][g][0]);
            float num = 0.0f, den = 0.0f;
            for (int w = 0; w < W; ++w) {
                const float mw = sm_ml[w][g][0];
                const float f = mw == -MET_INF ? 0.0f : expf(mw - big);
                num += sm_acc[w][g][e] * f;
                den += sm_ml[w][g][1] * f;
            }
            const u64 head = (u64)s * a.h + kvh * group + g;
            if (splits_used == 1) {  // nothing to merge: the merge would compute exactly this
                out[head * a.d + e] = f2bf(num / den * a.v_scale);
                continue;
            }
            part_acc[(head * DEC_SPLITS + split) * a.d + e] = num;
            if (e == 0) {
                part_ml[(head * DEC_SPLITS + split) * 2] = big;
                part_ml[(head * DEC_SPLITS + split) * 2 + 1] = den;
            }
        }
        if (splits_used == 1) return;
        if (dec_merge_if_last(out, part_acc, part_ml, counters, s, kvh, group, splits_used, a)) return;
        __syncthreads();  // the next split reuses the shared partials
    }
}

#define MET_DECODE_ATTENTION(NAME, GM, W, KV)                                                                  \
    extern "C" __global__ void __launch_bounds__(W * 32)                                                       \
        NAME(float* part_acc, float* part_ml, const bf16_t* q, const KV::T* kc, const KV::T* vc,               \
             const u32* seq_lens, const u32* tables, AttnArgs a, bf16_t* out, u32* counters) {                 \
        pdl_enter();                                                                                           \
        decode_attention<GM, W, KV>(part_acc, part_ml, q, kc, vc, seq_lens, tables, a, out, counters);         \
    }
MET_DECODE_ATTENTION(decode_attention_bf16_g1_w4, 1, 4, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g2_w4, 2, 4, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g4_w4, 4, 4, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g8_w4, 8, 4, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g1_w8, 1, 8, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g2_w8, 2, 8, Kv16)
MET_DECODE_ATTENTION(decode_attention_bf16_g4_w8, 4, 8, Kv16)
MET_DECODE_ATTENTION(decode_attention_e4m3_g1_w4, 1, 4, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g2_w4, 2, 4, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g4_w4, 4, 4, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g8_w4, 8, 4, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g1_w8, 1, 8, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g2_w8, 2, 8, Kv8)
MET_DECODE_ATTENTION(decode_attention_e4m3_g4_w8, 4, 8, Kv8)
