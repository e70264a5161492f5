// recurrent.cu: the Gated DeltaNet ops of the CUDA backend (the linear-attention layers of
// hybrid models): the causal depthwise convolution, the gated delta rule, the gated RMSNorm
// and the sigmoid gate. Host side and semantics: `src/cuda/recurrent.rs`, `GpuBackend`.
//
// A step's sequences are read on the device: `cu [seqs + 1]` (prefix sums of the rows),
// `slots [seqs]` (each sequence's state slot) and `snaps [n_snap, 2]` (after flat row
// `snaps[2n]` the state of that row's sequence is copied to slot `snaps[2n + 1]`). The host
// has checked them (`check::recurrent_runs`): every slot a step writes is distinct and
// inside its pool, and no sequence reads a slot another writes, so the threads of
// different sequences never meet in a pool. A sequence whose slot is NO_SLOT (a captured
// decode step's padding row) starts from a zero state and writes no state.

#define NO_SLOT 0xffffffffu
//
// Storage: inputs and outputs bf16; the convolution's state bf16 (copies of its bf16
// inputs, so exact); the delta rule's state f32. Arithmetic is f32, as transformers and
// FLA compute these layers: the convolution accumulates in f32 and rounds its output once;
// the delta rule keeps q, k, v, the gates and the state in f32 and rounds only `o`.

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

// --- causal_conv1d -------------------------------------------------------------------------
//
// A sequence's padded inputs are its slot's `kept = width - 1` inputs (oldest first, laid
// out `[c, kept]`) followed by its rows; output row p of the sequence, channel ch, is
// silu(sum_j w[ch][j] * padded[p + j]). The outputs are computed first, reading the old
// states; `conv_states_bf16`, launched after, writes the new states and the snapshots, so
// no thread reads a state another has already replaced.

// Input `q` of a sequence's padded inputs at channel `ch`: `hist` is its slot's row of
// that channel, `rows` its first row of `x [t, c]`.
// `hist` is null for a sequence without a slot: its window is zeros.
__device__ __forceinline__ bf16_t padded_input(const bf16_t* hist, const bf16_t* rows, u32 q, u32 kept, u32 c,
                                               u32 ch) {
    if (q < kept) return hist ? hist[q] : f2bf(0.0f);
    return rows[(u64)(q - kept) * c + ch];
}

// One thread per (row, channel) of `out [t, c]`. `seq_of_row` (attention.cu) finds the
// row's sequence: the last with cu[s] <= row, past any empty one that starts there too.
extern "C" __global__ void causal_conv1d_bf16(const bf16_t* x, const bf16_t* w, const bf16_t* state, const u32* cu,
                                              const u32* slots, bf16_t* out, u32 seqs, u32 c, u32 width, u64 total) {
    pdl_enter();
    const u32 kept = width - 1;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 row = (u32)(i / c), ch = (u32)(i % c);
        const u32 s = seq_of_row(cu, seqs, row);
        const u32 start = cu[s];
        const bf16_t* hist = slots[s] == NO_SLOT ? nullptr : state + ((u64)slots[s] * c + ch) * kept;
#ifdef MET_FAULT_DROP_CONV_STATE
        // A deliberate bug (MET_TEST_FAULT=drop-conv-state), so the precision gate can show it
        // sees one: every step starts the convolution from zeros, as if the window kept
        // across a chunk boundary (or from the last decode step) were lost.
        hist = nullptr;
#endif
        const bf16_t* rows = x + (u64)start * c;
        float acc = 0.0f;
        for (u32 j = 0; j < width; ++j)
            acc += bf2f(w[(u64)ch * width + j]) * bf2f(padded_input(hist, rows, row - start + j, kept, c, ch));
        out[i] = f2bf(silu_f(acc));
    }
}

// Writes the `kept` padded inputs from index `from` on into `dst` (a slot's row of one
// channel). `dst` may be `hist` itself: entry k is written after entries from + k' for
// k' < k were read, and before from + k'' (> k, since from >= 1) is, so nothing is read
// after it was overwritten.
__device__ __forceinline__ void store_window(const bf16_t* hist, const bf16_t* rows, bf16_t* dst, u32 from, u32 kept,
                                             u32 c, u32 ch) {
    for (u32 k = 0; k < kept; ++k) dst[k] = padded_input(hist, rows, from + k, kept, c, ch);
}

// One thread per (sequence, channel): the snapshots of the sequence (which write other
// slots), then its own slot, in place, with the last `kept` inputs. Launched only when
// `width > 1`.
extern "C" __global__ void conv_states_bf16(const bf16_t* x, bf16_t* state, const u32* cu, const u32* slots,
                                            const u32* snaps, u32 n_snap, u32 seqs, u32 c, u32 width) {
    pdl_enter();
    const u32 kept = width - 1;
    const u64 total = (u64)seqs * c;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 s = (u32)(i / c), ch = (u32)(i % c);
        const u32 start = cu[s], end = cu[s + 1];
        // A sequence without a slot has no snapshots (checked) and keeps nothing.
        if (start == end || slots[s] == NO_SLOT) continue;
        bf16_t* hist = state + ((u64)slots[s] * c + ch) * kept;
        const bf16_t* rows = x + (u64)start * c;
        for (u32 n = 0; n < n_snap; ++n) {
            const u32 row = snaps[2 * n];
            if (row < start || row >= end) continue;
            store_window(hist, rows, state + ((u64)snaps[2 * n + 1] * c + ch) * kept, row + 1 - start, kept, c, ch);
        }
        store_window(hist, rows, hist, end - start, kept, c, ch);
    }
}

// --- gated_delta_rule ----------------------------------------------------------------------
//
// The fused recurrent form: one block per (column tile, value head, sequence), walking the
// sequence's rows in order. Column c of the state S [d_k, d_v] evolves on its own given
// the row's q, k, g and beta:
//   S[:, c] <- e^g S[:, c];  delta_c = beta (v_c - S[:, c] . k);  S[:, c] += k delta_c;
//   o_c = S[:, c] . q = (e^g S_old[:, c]) . q + delta_c (k . q),
// so the state is split by columns: each warp owns C columns, its lane l the rows
// l, l + 32, ... (R of them, d_k <= 32 R) in registers, and reduces its dot products with
// shuffles; warps share nothing and never synchronise. Each warp reads the row's q and k
// itself (lane l the elements of its rows) and normalises them with two warp sums.
//
// A prefill runs its rows one after another per head, which is slower than the chunked
// (WY) tensor-core form FLA uses for long prompts: that form is future work here.
#define DELTA_WARPS 4

// The sizes of a delta-rule step, passed by value (`DeltaDims` of `src/cuda/recurrent.rs`).
struct DeltaDims {
    u32 hk, hv, dk, dv, n_snap;
};

// A delta-rule step's operands as the device functions below read them.
struct DeltaStep {
    const bf16_t* qkv;     // [t, 2 hk dk + hv dv]
    const bf16_t* a;       // [t, hv]
    const bf16_t* b;       // [t, hv]
    const float* a_log;    // [hv]
    const float* dt_bias;  // [hv]
    float* state;          // [slots, hv, dk, dv]
    const u32* cu;
    const u32* slots;
    const u32* snaps;
    bf16_t* out;  // [t, hv, dv]
    u32 hk, hv, dk, dv, n_snap;
};

// The log-decay g = -exp(A_log) softplus(a + dt_bias) (softplus(x) = x above 20, as
// torch's threshold) as the decay e^g, and beta = sigmoid(b).
__device__ __forceinline__ float2 delta_gates(const DeltaStep& p, u32 row, u32 j) {
    const float x = bf2f(p.a[(u64)row * p.hv + j]) + p.dt_bias[j];
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(-expf(p.a_log[j]) * softplus);
    return make_float2(decay, 1.0f / (1.0f + expf(-bf2f(p.b[(u64)row * p.hv + j]))));
}

// This lane's rows of `st` (one head's [dk, dv] state) and the warp's columns, to or from
// the registers `S`; entries outside the state stay zero.
template <int R, int C>
__device__ __forceinline__ void load_state(float (&S)[R][C], const float* st, u32 lane, u32 col0, u32 dk,
                                           u32 dv) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const u32 row = lane + 32 * r, col = col0 + c;
            S[r][c] = row < dk && col < dv ? st[(u64)row * dv + col] : 0.0f;
        }
}

template <int R, int C>
__device__ __forceinline__ void store_state(const float (&S)[R][C], float* st, u32 lane, u32 col0, u32 dk,
                                            u32 dv) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const u32 row = lane + 32 * r, col = col0 + c;
            if (row < dk && col < dv) st[(u64)row * dv + col] = S[r][c];
        }
}

// This lane's elements of the row's L2-normalised query (times dk^-1/2) and key, and
// their dot product k . q (the same in every lane).
template <int R>
__device__ __forceinline__ float load_qk(const DeltaStep& p, const bf16_t* x, u32 i, u32 lane, float (&q)[R],
                                         float (&k)[R]) {
    float qq = 0.0f, kk = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 d = lane + 32 * r;
        q[r] = d < p.dk ? bf2f(x[(u64)i * p.dk + d]) : 0.0f;
        k[r] = d < p.dk ? bf2f(x[(u64)(p.hk + i) * p.dk + d]) : 0.0f;
        qq += q[r] * q[r];
        kk += k[r] * k[r];
    }
    const float qn = rsqrtf((float)p.dk) * rsqrtf(warp_sum(qq) + 1e-6f), kn = rsqrtf(warp_sum(kk) + 1e-6f);
    float kq = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        q[r] *= qn;
        k[r] *= kn;
        kq += k[r] * q[r];
    }
    return warp_sum(kq);
}

// One row of the recurrence for the warp's columns. The sums are butterflies, so every
// lane holds every column's result; lane 0 writes the outputs.
template <int R, int C>
__device__ __forceinline__ void delta_row(const DeltaStep& p, float (&S)[R][C], u32 row, u32 j, u32 lane,
                                          u32 col0) {
    const bf16_t* x = p.qkv + (u64)row * (2 * p.hk * p.dk + p.hv * p.dv);
    float q[R], k[R];
    const float kq = load_qk<R>(p, x, j / (p.hv / p.hk), lane, q, k);
    const float2 gates = delta_gates(p, row, j);
    float sk[C], sq[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        sk[c] = 0.0f;
        sq[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            S[r][c] *= gates.x;
            sk[c] += S[r][c] * k[r];
            sq[c] += S[r][c] * q[r];
        }
    }
    // The 2 C butterflies interleaved, so their shuffles overlap.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
#pragma unroll
        for (int c = 0; c < C; ++c) {
            sk[c] += __shfl_xor_sync(0xffffffffu, sk[c], o);
            sq[c] += __shfl_xor_sync(0xffffffffu, sq[c], o);
        }
    const bf16_t* v = x + 2 * p.hk * p.dk + (u64)j * p.dv;
    bf16_t* out = p.out + ((u64)row * p.hv + j) * p.dv;
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const u32 col = col0 + c;
        const float delta = col < p.dv ? gates.y * (bf2f(v[col]) - sk[c]) : 0.0f;
#pragma unroll
        for (int r = 0; r < R; ++r) S[r][c] += k[r] * delta;
        if (lane == 0 && col < p.dv) out[col] = f2bf(sq[c] + delta * kq);
    }
}

template <int R, int C>
__device__ void gated_delta_rule(const DeltaStep& p) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 j = blockIdx.y, s = blockIdx.z;
    const u32 col0 = (blockIdx.x * DELTA_WARPS + warp) * C;
    const u32 start = p.cu[s], end = p.cu[s + 1];
    // Warp-uniform: a warp past the last column, or of a sequence without rows, has nothing
    // to do (and its state stays as it is).
    if (col0 >= p.dv || start == end) return;
    const u64 head = (u64)p.hv * p.dk * p.dv, per_head = (u64)p.dk * p.dv;
    // Without a slot (a padding row) the state starts at zero and is dropped after.
    const bool keeps = p.slots[s] != NO_SLOT;
    float* st = keeps ? p.state + p.slots[s] * head + j * per_head : nullptr;
    float S[R][C];
    if (keeps) {
        load_state<R, C>(S, st, lane, col0, p.dk, p.dv);
    } else {
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int c = 0; c < C; ++c) S[r][c] = 0.0f;
    }
    for (u32 row = start; row < end; ++row) {
        delta_row<R, C>(p, S, row, j, lane, col0);
        for (u32 n = 0; n < p.n_snap; ++n)
            if (p.snaps[2 * n] == row)
                store_state<R, C>(S, p.state + p.snaps[2 * n + 1] * head + j * per_head, lane, col0, p.dk, p.dv);
    }
    if (keeps) store_state<R, C>(S, st, lane, col0, p.dk, p.dv);
}

// `_r{R}`: d_k up to 32 R, 8 columns a warp; `_r{R}_c2`: 2 columns a warp, four times the
// warps, for steps of few sequences (a decode step at small batch), whose blocks would
// otherwise leave most of the GPU idle while each waits on its loads. A column's
// arithmetic is the same in both. Launched with DELTA_WARPS warps a block and a grid of
// (ceil(dv / (DELTA_WARPS C)), hv, seqs).
#define GATED_DELTA_RULE(R, C, NAME)                                                                           \
    extern "C" __global__ void __launch_bounds__(DELTA_WARPS * 32)                                             \
        NAME(const bf16_t* qkv, const bf16_t* a, const bf16_t* b, const float* a_log, const float* dt_bias,    \
             float* state, const u32* cu, const u32* slots, const u32* snaps, bf16_t* out, DeltaDims d) {     \
        pdl_enter();                                                                                           \
        const DeltaStep p = {qkv, a, b, a_log, dt_bias, state, cu, slots, snaps, out,                          \
                             d.hk, d.hv, d.dk, d.dv, d.n_snap};                                                \
        gated_delta_rule<R, C>(p);                                                                             \
    }
GATED_DELTA_RULE(1, 8, gated_delta_rule_bf16_r1)
GATED_DELTA_RULE(2, 8, gated_delta_rule_bf16_r2)
GATED_DELTA_RULE(4, 8, gated_delta_rule_bf16_r4)
GATED_DELTA_RULE(8, 8, gated_delta_rule_bf16_r8)
GATED_DELTA_RULE(1, 2, gated_delta_rule_bf16_r1_c2)
GATED_DELTA_RULE(2, 2, gated_delta_rule_bf16_r2_c2)
GATED_DELTA_RULE(4, 2, gated_delta_rule_bf16_r4_c2)
GATED_DELTA_RULE(8, 2, gated_delta_rule_bf16_r8_c2)

// --- rms_norm_gated, sigmoid_mul -----------------------------------------------------------

// A bf16 weight times the normalised value rounded to bf16, the product rounded again, as
// `Qwen3NextRMSNormGated` computes `weight * x.to(bf16)` in bf16; an f32 weight multiplies
// the f32 value.
__device__ __forceinline__ float gated_weighted(const bf16_t*, float wi, float xn) {
    return round_bf(wi * round_bf(xn));
}
__device__ __forceinline__ float gated_weighted(const float*, float wi, float xn) { return wi * xn; }

// One block per row of `n`: out = w * x / sqrt(mean(x^2) + eps) * silu(z), the gate's SiLU
// in f32 and the result rounded once more.
template <typename W>
__device__ void rms_norm_gated(const bf16_t* x, const bf16_t* z, const W* w, bf16_t* out, u32 n, float eps) {
    __shared__ float scratch[32];
    const u64 off = (u64)blockIdx.x * n;
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = bf2f(x[off + i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x)
        out[off + i] = f2bf(gated_weighted(w, load_f(w, i), bf2f(x[off + i]) * inv) * silu_f(bf2f(z[off + i])));
}

extern "C" __global__ void rms_norm_gated_bf16(const bf16_t* x, const bf16_t* z, const bf16_t* w, bf16_t* out, u32 n,
                                               float eps) {
    pdl_enter();
    rms_norm_gated(x, z, w, out, n, eps);
}

extern "C" __global__ void rms_norm_gated_bf16_wf32(const bf16_t* x, const bf16_t* z, const float* w, bf16_t* out,
                                                    u32 n, float eps) {
    pdl_enter();
    rms_norm_gated(x, z, w, out, n, eps);
}

// out[i] = x[i] * sigmoid(gate[i / span]), the sigmoid rounded to bf16 first, as
// `x * torch.sigmoid(gate)` in bf16; `span` is 1 for equal shapes, n for a gate per row.
extern "C" __global__ void sigmoid_mul_bf16(const bf16_t* x, const bf16_t* gate, bf16_t* out, u64 span, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const float g = bf2f(gate[i / span]);
        out[i] = f2bf(bf2f(x[i]) * round_bf(1.0f / (1.0f + expf(-g))));
    }
}
