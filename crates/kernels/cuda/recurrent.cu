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

// A step of short sequences (decode steps, speculative verifies) at width 4, the width of
// the Qwen3.5/3.6 and Qwen3-Next convolutions: one thread per (sequence, channel) walks the
// sequence's rows with its window in registers, writing each output, the snapshots after
// their rows and, last, the new window over its slot's, so one launch does what
// `causal_conv1d_bf16` and `conv_states_bf16` do in two. The sums are those of
// `causal_conv1d_bf16` term for term. Any run length is computed right; the host takes
// this form for runs of a few rows, where a thread's walk is short.
#define CONV_STEP_KEPT 3

extern "C" __global__ void causal_conv1d_step_w4_bf16(const bf16_t* x, const bf16_t* w, bf16_t* state, const u32* cu,
                                                      const u32* slots, const u32* snaps, u32 n_snap, bf16_t* out,
                                                      u32 seqs, u32 c) {
    pdl_enter();
    const u64 total = (u64)seqs * c;
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u32 s = (u32)(i / c), ch = (u32)(i % c);
        const u32 start = cu[s], end = cu[s + 1];
        if (start == end) continue;
        bf16_t* hist = slots[s] == NO_SLOT ? nullptr : state + ((u64)slots[s] * c + ch) * CONV_STEP_KEPT;
        const bf16_t* from = hist;
#ifdef MET_FAULT_DROP_CONV_STATE
        from = nullptr;  // as in causal_conv1d_bf16: every step starts from a zero window
#endif
        bf16_t win[CONV_STEP_KEPT];
#pragma unroll
        for (int q = 0; q < CONV_STEP_KEPT; ++q) win[q] = from ? from[q] : f2bf(0.0f);
        float taps[CONV_STEP_KEPT + 1];
#pragma unroll
        for (int j = 0; j <= CONV_STEP_KEPT; ++j) taps[j] = bf2f(w[(u64)ch * (CONV_STEP_KEPT + 1) + j]);
        for (u32 row = start; row < end; ++row) {
            const bf16_t in = x[(u64)row * c + ch];
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < CONV_STEP_KEPT; ++j) acc += taps[j] * bf2f(win[j]);
            acc += taps[CONV_STEP_KEPT] * bf2f(in);
            out[(u64)row * c + ch] = f2bf(silu_f(acc));
#pragma unroll
            for (int q = 0; q + 1 < CONV_STEP_KEPT; ++q) win[q] = win[q + 1];
            win[CONV_STEP_KEPT - 1] = in;
            for (u32 n = 0; n < n_snap; ++n) {
                if (snaps[2 * n] != row) continue;
                bf16_t* dst = state + ((u64)snaps[2 * n + 1] * c + ch) * CONV_STEP_KEPT;
#pragma unroll
                for (int q = 0; q < CONV_STEP_KEPT; ++q) dst[q] = win[q];
            }
        }
        if (hist) {
#pragma unroll
            for (int q = 0; q < CONV_STEP_KEPT; ++q) hist[q] = win[q];
        }
    }
}

// --- gated_delta_rule ----------------------------------------------------------------------
//
// The fused recurrent form: one block per (column tile, value head, sequence), walking the
// sequence's rows in order. Column c of the state S [d_k, d_v] evolves on its own given
// the row's q, k, g and beta:
//   S[:, c] <- e^g S[:, c];  delta_c = beta (v_c - S[:, c] . k);  S[:, c] += k delta_c;
//   o_c = S[:, c] . q = (e^g S_old[:, c]) . q + delta_c (k . q).
// This form serves decode steps (and any step a graph records); a step with a long
// sequence takes the chunked form further down.
#define DELTA_WARPS 4
static_assert(DELTA_WARPS * 32 * 2 == 256, "a row of the fused kernel loads q and k at two entries a thread");

// The sizes of a delta-rule step, passed by value (`DeltaDims` of `src/cuda/recurrent.rs`).
// `below`: the fused kernel leaves sequences of that many rows or more to the chunked form.
struct DeltaDims {
    u32 hk, hv, dk, dv, n_snap, below;
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
__device__ __forceinline__ float2 delta_gates(float a, float b, float dt_bias, float a_log) {
    const float x = a + dt_bias;
    const float softplus = x > 20.0f ? x : log1pf(expf(x));
    const float decay = expf(-expf(a_log) * softplus);
    return make_float2(decay, 1.0f / (1.0f + expf(-b)));
}

// What a row of the fused kernel reads from global memory, thread by thread: q and k at
// entries tid and tid + 128 (zero past d_k) and v at the lane's column (zero past d_v).
struct DeltaRowIn {
    float q[2], k[2], v;
};

// Loads a row's inputs for thread `tid` of the fused kernel (`DeltaRowIn`).
__device__ __forceinline__ DeltaRowIn delta_row_in(const DeltaStep& p, u32 row, u32 qh, u32 j, u32 col, u32 dk, u32 dv,
                                                   bool live) {
    const bf16_t* x = p.qkv + (u64)row * (2 * p.hk * dk + p.hv * dv);
    const u32 tid = threadIdx.x;
    DeltaRowIn in;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 e = tid + i * DELTA_WARPS * 32;
        in.q[i] = e < dk ? bf2f(x[(u64)qh * dk + e]) : 0.0f;
        in.k[i] = e < dk ? bf2f(x[(u64)(p.hk + qh) * dk + e]) : 0.0f;
    }
    in.v = live ? bf2f(x[2 * p.hk * dk + (u64)j * dv + col]) : 0.0f;
    return in;
}

// The gates of a sequence's rows, 32 rows at a time: lane i of every warp loads the a and b
// of row `first + i` (zero past `end`), and computes its decay and beta once for the 32 rows
// (`delta_gates`, the same bits as computing them row by row), a row then taking its own
// from its lane with two shuffles. Inputs of the next 32 rows are loaded a batch ahead.
__device__ __forceinline__ float2 delta_ab(const DeltaStep& p, u32 first, u32 end, u32 j) {
    const u32 row = first + (threadIdx.x & 31);
    return row < end ? make_float2(bf2f(p.a[(u64)row * p.hv + j]), bf2f(p.b[(u64)row * p.hv + j]))
                     : make_float2(0.0f, 0.0f);
}

__device__ __forceinline__ float2 delta_gates_of(const float2& gates, u32 i) {
    return make_float2(__shfl_sync(0xffffffffu, gates.x, i), __shfl_sync(0xffffffffu, gates.y, i));
}

// The shared memory of the fused kernels' row step, two sets of it: consecutive rows take
// turns (`buf`), so a row needs no barrier at its end to keep the next from overwriting
// what its slowest warp still reads.
struct DeltaShared {
    float qk[2][2][256];                // the row's q and k
    float part[2][2][DELTA_WARPS][32];  // each warp's share of S . k and S . q
    float sums[2][3][DELTA_WARPS];      // each warp's share of q . q, k . k and k . q
};

// One row of a sequence in the fused kernels below. The state's two products are taken with
// the raw q and k, and the row's scalars (the decay, the norms of q and k) applied to the
// sums; the update is S <- e^g S + k (kn delta):
//   S . k^ = e^g kn (S_old . k),  S . q^ = e^g qn (S_old . q),  k^ . q^ = kn qn (k . q),
// with the sums of q . q, k . k and k . q reduced together, so a row is two barriers and
// four FMA a state entry. Each column's products over d_k are the warps' partial sums added
// in warp order. Called by every thread of the block.
template <int R>
__device__ __forceinline__ void delta_row_step(const DeltaStep& p, const DeltaRowIn& in, float2 gates, u32 row, u32 j,
                                               u32 col, u32 r0, u32 dk, u32 dv, bool live, float (&S)[R],
                                               DeltaShared& sh, u32 buf) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, tid = threadIdx.x;
    const u64 head = (u64)p.hv * dk * dv, per_head = (u64)dk * dv;
    float(&qk)[2][256] = sh.qk[buf];
    float qq = 0.0f, kk = 0.0f, kq = 0.0f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 e = tid + i * DELTA_WARPS * 32;
        qk[0][e] = in.q[i];
        qk[1][e] = in.k[i];
        qq += in.q[i] * in.q[i];
        kk += in.k[i] * in.k[i];
        kq += in.k[i] * in.q[i];
    }
    qq = warp_sum(qq);
    kk = warp_sum(kk);
    kq = warp_sum(kq);
    if (lane == 0) {
        sh.sums[buf][0][warp] = qq;
        sh.sums[buf][1][warp] = kk;
        sh.sums[buf][2][warp] = kq;
    }
    __syncthreads();
    float sk = 0.0f, sq = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        sk += S[r] * qk[1][r0 + r];
        sq += S[r] * qk[0][r0 + r];
    }
    sh.part[buf][0][warp][lane] = sk;
    sh.part[buf][1][warp][lane] = sq;
    float qsum = 0.0f, ksum = 0.0f, kqsum = 0.0f;
#pragma unroll
    for (int w = 0; w < DELTA_WARPS; ++w) {
        qsum += sh.sums[buf][0][w];
        ksum += sh.sums[buf][1][w];
        kqsum += sh.sums[buf][2][w];
    }
    const float qn = rsqrtf((float)dk) * rsqrtf(qsum + 1e-6f), kn = rsqrtf(ksum + 1e-6f);
    __syncthreads();
    float skt = 0.0f, sqt = 0.0f;
#pragma unroll
    for (int w = 0; w < DELTA_WARPS; ++w) {
        skt += sh.part[buf][0][w][lane];
        sqt += sh.part[buf][1][w][lane];
    }
    const float decay = gates.x;
    const float delta = live ? gates.y * (in.v - decay * kn * skt) : 0.0f, kd = kn * delta;
#pragma unroll
    for (int r = 0; r < R; ++r) S[r] = fmaf(qk[1][r0 + r], kd, S[r] * decay);
    if (warp == 0 && live) p.out[((u64)row * p.hv + j) * dv + col] = f2bf(decay * qn * sqt + delta * (kn * qn * kqsum));
    for (u32 n = 0; n < p.n_snap; ++n)
        if (p.snaps[2 * n] == row && live) {
            float* snap = p.state + p.snaps[2 * n + 1] * head + j * per_head;
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r0 + r < dk) snap[(u64)(r0 + r) * dv + col] = S[r];
        }
}

// The value columns lie across the lanes: one block per (32-column tile, value head,
// sequence), DELTA_WARPS warps splitting the key rows, lane c of each warp holding column
// col0 + c of the warp's R rows in registers. A warp so reads and writes whole 128-byte rows
// of the state (the layout is [d_k, d_v], columns contiguous), and a decode step of many
// sequences is the state's traffic and little else. (Lanes over key rows, as this file had
// first, touch one float of 32 rows per instruction: a 256-sequence step of Qwen3.6-35B-A3B
// ran at half the speed, `bench/results/hybrid-vllm-2026-12-03/`.) The row's q and k go
// through shared memory (`delta_row_step`).
template <int R, u32 DK, u32 DV>
__device__ void gated_delta_rule_cols(const DeltaStep& p) {
    // The key and value dims: compile-time where the kernel is built for them, so the state's
    // row addresses are one base and constant offsets (with them at run time, keeping R of
    // them live took the kernel to 254 registers, two blocks an SM).
    const u32 dk = DK ? DK : p.dk, dv = DV ? DV : p.dv;
    __shared__ DeltaShared sh;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 j = blockIdx.y, s = blockIdx.z, col = blockIdx.x * 32 + lane, r0 = warp * R;
    __builtin_assume(warp < DELTA_WARPS);  // (the launch's block): a row past d_k is then known at compile time
    const u32 start = p.cu[s], end = p.cu[s + 1];
    if (start == end) return;
    const u64 head = (u64)p.hv * dk * dv, per_head = (u64)dk * dv;
    const bool keeps = p.slots[s] != NO_SLOT, live = col < dv;
    float* st = keeps ? p.state + p.slots[s] * head + j * per_head : nullptr;
    const u32 qh = j / (p.hv / p.hk);
    // A row's inputs are loaded while the row before it is computed, so the chain of
    // dependent steps a row is (norms, the two dot products, the update) waits on no
    // global load: a short sequence's rows are latency, not bytes.
    const float dt_bias = p.dt_bias[j], a_log = p.a_log[j];
    float S[R];
#pragma unroll
    for (int r = 0; r < R; ++r) S[r] = keeps && live && r0 + r < dk ? st[(u64)(r0 + r) * dv + col] : 0.0f;
    DeltaRowIn next = delta_row_in(p, start, qh, j, col, dk, dv, live);
    float2 ab = delta_ab(p, start, end, j), gates = make_float2(0.0f, 0.0f);
    for (u32 row = start; row < end; ++row) {
        const DeltaRowIn in = next;
        if (row + 1 < end) next = delta_row_in(p, row + 1, qh, j, col, dk, dv, live);
        const u32 i = (row - start) & 31u;
        if (i == 0) {
            gates = delta_gates(ab.x, ab.y, dt_bias, a_log);
            if (row + 32 < end) ab = delta_ab(p, row + 32, end, j);
        }
        delta_row_step<R>(p, in, delta_gates_of(gates, i), row, j, col, r0, dk, dv, live, S, sh, (row - start) & 1u);
    }
    if (keeps && live)
#pragma unroll
        for (int r = 0; r < R; ++r)
            if (r0 + r < dk) st[(u64)(r0 + r) * dv + col] = S[r];
}

// `_cols_r{R}`: d_k up to DELTA_WARPS R, any d_v; `_k{DK}_v{DV}`: exactly those dims (the
// shapes of Qwen3.5, Qwen3.6 and Qwen3-Next). Launched with DELTA_WARPS warps a block and a
// grid of (ceil(dv / 32), hv, seqs).
#define GATED_DELTA_RULE_COLS(R, DK, DV, NAME)                                                                 \
    extern "C" __global__ void __launch_bounds__(DELTA_WARPS * 32)                                             \
        NAME(const bf16_t* qkv, const bf16_t* a, const bf16_t* b, const float* a_log, const float* dt_bias,    \
             float* state, const u32* cu, const u32* slots, const u32* snaps, bf16_t* out, DeltaDims d) {     \
        pdl_enter();                                                                                           \
        if (cu[blockIdx.z + 1] - cu[blockIdx.z] >= d.below) return;                                            \
        const DeltaStep p = {qkv, a, b, a_log, dt_bias, state, cu, slots, snaps, out,                          \
                             d.hk, d.hv, d.dk, d.dv, d.n_snap};                                                \
        gated_delta_rule_cols<R, DK, DV>(p);                                                                   \
    }
GATED_DELTA_RULE_COLS(8, 0, 0, gated_delta_rule_bf16_cols_r8)
GATED_DELTA_RULE_COLS(16, 0, 0, gated_delta_rule_bf16_cols_r16)
GATED_DELTA_RULE_COLS(32, 0, 0, gated_delta_rule_bf16_cols_r32)
GATED_DELTA_RULE_COLS(64, 0, 0, gated_delta_rule_bf16_cols_r64)
GATED_DELTA_RULE_COLS(32, 128, 128, gated_delta_rule_bf16_cols_k128_v128)

// `gated_delta_rule_bf16_seqs_k128_v128` (under `MET_GDR_SEQS=N`, for measuring): the
// kernel above for 128 x 128 heads, a block walking N consecutive sequences of its (column
// tile, value head) in turn, with the next sequence's state tile and first row requested
// before the current one's rows are computed, so a decode step of many sequences (one row
// each: the state tile's bytes and little arithmetic) keeps each block's loads in flight
// through its arithmetic and stores. Every column's sums are taken in the same order as
// above, so the bits are the same.
template <int R, u32 DK, u32 DV>
__device__ void gated_delta_rule_seqs(const DeltaStep& p, u32 seqs, u32 per_block, u32 below) {
    constexpr u32 dk = DK, dv = DV;
    static_assert(DK <= DELTA_WARPS * R && DV % 32 == 0, "every column live, every key row a warp's");
    __shared__ DeltaShared sh;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 j = blockIdx.y, col = blockIdx.x * 32 + lane, r0 = warp * R;
    const u64 head = (u64)p.hv * dk * dv, per_head = (u64)dk * dv;
    const u32 qh = j / (p.hv / p.hk);
    const float dt_bias = p.dt_bias[j], a_log = p.a_log[j];
    const u32 first = blockIdx.z * per_block, last = min(first + per_block, seqs);
    // Whether the kernel walks sequence s (the chunked form takes it from `below` rows).
    auto walks = [&](u32 s) { return p.cu[s + 1] > p.cu[s] && p.cu[s + 1] - p.cu[s] < below; };
    auto tile = [&](u32 s) { return p.slots[s] != NO_SLOT ? p.state + p.slots[s] * head + j * per_head : nullptr; };
    auto load = [&](u32 s, float (&S)[R]) {
        const float* st = tile(s);
#pragma unroll
        for (int r = 0; r < R; ++r) S[r] = st ? st[(u64)(r0 + r) * dv + col] : 0.0f;
    };
    u32 s = first;
    while (s < last && !walks(s)) ++s;
    if (s >= last) return;
    float S[R];
    load(s, S);
    DeltaRowIn next = delta_row_in(p, p.cu[s], qh, j, col, dk, dv, true);
    float2 ab = delta_ab(p, p.cu[s], p.cu[s + 1], j), gates = make_float2(0.0f, 0.0f);
    u32 buf = 0;
    while (s < last) {
        u32 after = s + 1;
        while (after < last && !walks(after)) ++after;
        float Sn[R];
        if (after < last) load(after, Sn);
        const u32 start = p.cu[s], end = p.cu[s + 1];
        for (u32 row = start; row < end; ++row) {
            const DeltaRowIn in = next;
            if (row + 1 < end) {
                next = delta_row_in(p, row + 1, qh, j, col, dk, dv, true);
            } else if (after < last) {
                next = delta_row_in(p, p.cu[after], qh, j, col, dk, dv, true);
            }
            const u32 i = (row - start) & 31u;
            if (i == 0) {
                gates = delta_gates(ab.x, ab.y, dt_bias, a_log);
                if (row + 32 < end) {
                    ab = delta_ab(p, row + 32, end, j);
                } else if (after < last) {
                    ab = delta_ab(p, p.cu[after], p.cu[after + 1], j);
                }
            }
            delta_row_step<R>(p, in, delta_gates_of(gates, i), row, j, col, r0, dk, dv, true, S, sh, buf);
            buf ^= 1u;
        }
        if (float* st = tile(s))
#pragma unroll
            for (int r = 0; r < R; ++r) st[(u64)(r0 + r) * dv + col] = S[r];
        if (after < last)
#pragma unroll
            for (int r = 0; r < R; ++r) S[r] = Sn[r];
        s = after;
    }
}

// grid (dv / 32, hv, ceil(seqs / per_block)), DELTA_WARPS warps a block.
extern "C" __global__ void __launch_bounds__(DELTA_WARPS * 32)
    gated_delta_rule_bf16_seqs_k128_v128(const bf16_t* qkv, const bf16_t* a, const bf16_t* b, const float* a_log,
                                         const float* dt_bias, float* state, const u32* cu, const u32* slots,
                                         const u32* snaps, bf16_t* out, DeltaDims d, u32 seqs, u32 per_block) {
    pdl_enter();
    const DeltaStep p = {qkv, a, b, a_log, dt_bias, state, cu, slots, snaps, out, d.hk, d.hv, d.dk, d.dv, d.n_snap};
    gated_delta_rule_seqs<32, 128, 128>(p, seqs, per_block, d.below);
}

// --- gated_delta_rule, chunked ----------------------------------------------------------
//
// The chunked (WY) form for prefill (transformers' `torch_chunk_gated_delta_rule`): a sequence's
// rows are cut into chunks of at most GDR_CHUNK (and after every snapshot row). With
// gamma_i the running sum of a chunk's log-decays (f64), D_ij = e^(gamma_i - gamma_j),
// G_i = e^(gamma_i) and S the state before the chunk, the corrections
// delta_i = beta_i (v_i - S_(i-1)^T k_i) are delta = U - W S, where [U | W] solve the unit
// lower triangular system (I + KK) [U | W] = [beta v | beta G k] with
// KK_ij = beta_i D_ij (k_i . k_j) below the diagonal. Then
// o_i = G_i S^T q_i + sum_(j<=i) D_ij (q_i . k_j) delta_j and the state after the chunk is
// G_L S + sum_j D_Lj k_j delta_j^T.
//
// Two kernels: `gated_delta_chunk_prep_bf16` does what depends on one chunk alone (the
// normalised rows, the pairwise products, the solve) for every (chunk, value head) at
// once and leaves it in a scratch; `gated_delta_chunk_scan_bf16` walks each sequence's
// chunks in order per (value-column tile, head), carrying the state tile in shared memory
// through the three products with S. Everything is f32 (the decays' sums f64), as in the
// fused form; only `o` is rounded to bf16.
#define GDR_CHUNK 64
#define GDR_THREADS 256
#define GDR_SOLVE 16  // rows of a block of the prep's solve
#define GDR_COLS 32

// The chunked form's products run on tensor cores as `mma.m16n8k8` in tf32, each f32 operand split
// into a tf32 head and the tf32 of what the head leaves, and a · b summed as
// a_lo b_hi + a_hi b_lo + a_hi b_hi (the a_lo b_lo term is below f32's rounding): f32's
// accuracy at the tensor cores' rate. Fragment layouts of m16n8k8 (g = lane / 4, t = lane % 4):
// A [16, 8] holds (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4); B [8, 8] holds (t, g) and
// (t + 4, g); C [16, 8] holds (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
#define GDR_SCAN_WARPS 4
#define GDR_S_LD (GDR_COLS + 8)    // the state tile's and delta's rows (B operands)
#define GDR_QK_LD (GDR_CHUNK + 4)  // QK's rows (an A operand)

__device__ __forceinline__ u32 tf32_of(float x) {
    u32 y;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void mma_tf32(float* c, const u32* a, const u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// c += a · b for one m16n8k8 tile of f32 operands, in three tf32 products.
__device__ __forceinline__ void mma_f32x3(float* c, const float (&a)[4], const float (&b)[2]) {
    u32 ah[4], al[4], bh[2], bl[2];
#pragma unroll
    for (int i = 0; i < 4; ++i) ah[i] = tf32_of(a[i]), al[i] = tf32_of(a[i] - __uint_as_float(ah[i]));
#pragma unroll
    for (int i = 0; i < 2; ++i) bh[i] = tf32_of(b[i]), bl[i] = tf32_of(b[i] - __uint_as_float(bh[i]));
    mma_tf32(c, al, bh);
    mma_tf32(c, ah, bl);
    mma_tf32(c, ah, bh);
}

// The A fragment at rows m0.., columns k0.. of a row-major [.., ld] matrix, times `sign`.
__device__ __forceinline__ void frag_a(float (&a)[4], const float* m, u32 ld, u32 m0, u32 k0, u32 g, u32 t,
                                       float sign) {
    a[0] = sign * m[(m0 + g) * ld + k0 + t];
    a[1] = sign * m[(m0 + g + 8) * ld + k0 + t];
    a[2] = sign * m[(m0 + g) * ld + k0 + t + 4];
    a[3] = sign * m[(m0 + g + 8) * ld + k0 + t + 4];
}
// The A fragment of the transpose of a row-major [.., ld] matrix `m` (A[r][c] = m[c][r]).
__device__ __forceinline__ void frag_at(float (&a)[4], const float* m, u32 ld, u32 m0, u32 k0, u32 g, u32 t) {
    a[0] = m[(k0 + t) * ld + m0 + g];
    a[1] = m[(k0 + t) * ld + m0 + g + 8];
    a[2] = m[(k0 + t + 4) * ld + m0 + g];
    a[3] = m[(k0 + t + 4) * ld + m0 + g + 8];
}
// The B fragment of the transpose of a row-major [.., ld] matrix `m` (B[k][n] = m[n][k]).
__device__ __forceinline__ void frag_bt(float (&b)[2], const float* m, u32 ld, u32 k0, u32 n0, u32 g, u32 t) {
    b[0] = m[(n0 + g) * ld + k0 + t];
    b[1] = m[(n0 + g) * ld + k0 + t + 4];
}
// The B fragment at rows k0.., columns n0.. of a row-major [.., ld] matrix.
__device__ __forceinline__ void frag_b(float (&b)[2], const float* m, u32 ld, u32 k0, u32 n0, u32 g, u32 t) {
    b[0] = m[(k0 + t) * ld + n0 + g];
    b[1] = m[(k0 + t + 4) * ld + n0 + g];
}

// acc += sign · A B for this warp's 16 rows of A from row m0 and NT column tiles of 8 of B,
// over k in steps of 8 (all KC of them unrolled when KC > 0): A row-major [.., lda] or, AT,
// the transpose of one (sign 1 then); B row-major [k, ldb] or, BT, the transpose of a
// row-major [.., ldb]. Each step is three tf32 products (mma_f32x3), in order of k.
template <int NT, bool AT, bool BT, u32 KC>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const float* a, u32 lda, u32 m0, const float* b, u32 ldb,
                                         u32 k, u32 g, u32 t, float sign) {
    auto step = [&](u32 k0) {
        float fa[4];
        if constexpr (AT) {
            frag_at(fa, a, lda, m0, k0, g, t);
        } else {
            frag_a(fa, a, lda, m0, k0, g, t, sign);
        }
#pragma unroll
        for (u32 nt = 0; nt < NT; ++nt) {
            float fb[2];
            if constexpr (BT) {
                frag_bt(fb, b, ldb, k0, nt * 8, g, t);
            } else {
                frag_b(fb, b, ldb, k0, nt * 8, g, t);
            }
            mma_f32x3(acc[nt], fa, fb);
        }
    };
    if constexpr (KC > 0) {
#pragma unroll
        for (u32 k0 = 0; k0 < KC; k0 += 8) step(k0);
    } else {
        for (u32 k0 = 0; k0 < k; k0 += 8) step(k0);
    }
}

// Floats of one (chunk, head) scratch: [U | W] [GDR_CHUNK, dv + dk], QK [GDR_CHUNK,
// GDR_CHUNK], then G_i, D_(L-1)i and the query and key norms, GDR_CHUNK each.
__device__ __forceinline__ u64 gdr_scratch_floats(u32 dk, u32 dv) {
    return (u64)GDR_CHUNK * (dv + dk) + GDR_CHUNK * GDR_CHUNK + 4 * GDR_CHUNK;
}

// Loads a chunk's rows of `dk` bf16 values, row `i` at `src + (row0 + i) * width`, as f32
// times `scale(i)` into `dst [GDR_CHUNK, ld]` (rows past `len` zeros), for `dk` and `width`
// multiples of 8 (16-byte rows): each thread issues up to eight 16-byte loads before it uses
// any, so a chunk's rows cost a few round trips to memory, not one a row.
template <typename Scale>
__device__ __forceinline__ void gdr_load_rows(float* dst, u32 ld, const bf16_t* src, u64 width, u32 row0, u32 len,
                                              u32 dk, Scale scale) {
    const u32 per_row = dk / 8, total = GDR_CHUNK * per_row;
    for (u32 c0 = threadIdx.x; c0 < total; c0 += 8 * blockDim.x) {
        uint4 v[8];
#pragma unroll
        for (u32 u = 0; u < 8; ++u) {
            const u32 c = c0 + u * blockDim.x, i = c / per_row;
            const bool real = c < total && i < len;
            v[u] = real ? *reinterpret_cast<const uint4*>(src + (u64)(row0 + i) * width + c % per_row * 8)
                        : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (u32 u = 0; u < 8; ++u) {
            const u32 c = c0 + u * blockDim.x, i = c / per_row;
            if (c >= total) continue;
            float f[8];
            unpack8(v[u], f);
            const float k = i < len ? scale(i) : 0.0f;
            float4* d = reinterpret_cast<float4*>(dst + i * ld + c % per_row * 8);
            d[0] = make_float4(f[0] * k, f[1] * k, f[2] * k, f[3] * k);
            d[1] = make_float4(f[4] * k, f[5] * k, f[6] * k, f[7] * k);
        }
    }
}

// Whether a step's rows can take `gdr_load_rows`: 16-byte rows and heads.
__device__ __forceinline__ bool gdr_rows_align(u32 dk, u64 width) { return dk % 8 == 0 && width % 8 == 0; }

// A chunk as the host plans it: its first flat row, its length (0 for a second snapshot
// of the same row) and the slot its end state is copied to (NO_SLOT for none).
struct GdrChunk {
    u32 row, len, snap;
};

// One block per (chunk, value head), GDR_THREADS threads. Shared memory: gamma (f64) and
// beta [GDR_CHUNK], the normalised keys and queries [GDR_CHUNK, dk + 4] each (the stride
// keeps a fragment's 32 reads in 32 banks), KK [GDR_CHUNK, GDR_CHUNK].
extern "C" __global__ void __launch_bounds__(GDR_THREADS)
    gated_delta_chunk_prep_bf16(const bf16_t* qkv, const bf16_t* a, const bf16_t* b, const float* a_log,
                                const float* dt_bias, const GdrChunk* chunks, float* scratch, DeltaDims d) {
    pdl_enter();
    const GdrChunk ch = chunks[blockIdx.x];
    const u32 j = blockIdx.y, len = ch.len;
    if (len == 0) return;
    const u32 dk = d.dk, dv = d.dv, ld = dk + 4, kh = j / (d.hv / d.hk), tid = threadIdx.x;
    const u32 lane = tid & 31, warp = tid >> 5;
    const u64 width = 2ull * d.hk * dk + (u64)d.hv * dv;
    extern __shared__ __align__(16) unsigned char gdr_smem[];
    double* gam = reinterpret_cast<double*>(gdr_smem);
    float* beta = reinterpret_cast<float*>(gam + GDR_CHUNK);
    float* ks = beta + GDR_CHUNK;
    float* qs = ks + GDR_CHUNK * ld;
    float* kk = qs + GDR_CHUNK * ld;
    float* uw = scratch + ((u64)blockIdx.x * d.hv + j) * gdr_scratch_floats(dk, dv);
    float* qk = uw + (u64)GDR_CHUNK * (dv + dk);
    float *gexp = qk + GDR_CHUNK * GDR_CHUNK, *tail = gexp + GDR_CHUNK, *qn = tail + GDR_CHUNK,
          *kn = qn + GDR_CHUNK;

    // Rows, normalised as the fused form does (rows past `len` are zeros): loaded all at once
    // where they are 16-byte aligned, then a warp a row.
    const bool batched = gdr_rows_align(dk, width);
    if (batched) {
        const auto one = [](u32) { return 1.0f; };
        gdr_load_rows(qs, ld, qkv + (u64)kh * dk, width, ch.row, len, dk, one);
        gdr_load_rows(ks, ld, qkv + (u64)(d.hk + kh) * dk, width, ch.row, len, dk, one);
        __syncthreads();
    }
    for (u32 i = warp; i < GDR_CHUNK; i += GDR_THREADS / 32) {
        const bf16_t* x = qkv + (u64)(ch.row + i) * width;
        float qq = 0.0f, kq = 0.0f;
        for (u32 e = lane; e < dk; e += 32) {
            float qv, kv;
            if (batched) {
                qv = qs[i * ld + e];
                kv = ks[i * ld + e];
            } else {
                qv = i < len ? bf2f(x[(u64)kh * dk + e]) : 0.0f;
                kv = i < len ? bf2f(x[(u64)(d.hk + kh) * dk + e]) : 0.0f;
                qs[i * ld + e] = qv;
                ks[i * ld + e] = kv;
            }
            qq += qv * qv;
            kq += kv * kv;
        }
        const float qscale = rsqrtf((float)dk) * rsqrtf(warp_sum(qq) + 1e-6f), kscale = rsqrtf(warp_sum(kq) + 1e-6f);
        for (u32 e = lane; e < dk; e += 32) {
            qs[i * ld + e] *= qscale;
            ks[i * ld + e] *= kscale;
        }
        if (lane == 0) {
            qn[i] = i < len ? qscale : 0.0f;
            kn[i] = i < len ? kscale : 0.0f;
        }
    }
    // Gates: the log-decay g and beta per row, then gamma as a running f64 sum.
    if (tid < GDR_CHUNK) {
        float g = 0.0f, bt = 0.0f;
        if (tid < len) {
            const u64 at = (u64)(ch.row + tid) * d.hv + j;
            const float x = bf2f(a[at]) + dt_bias[j];
            g = -expf(a_log[j]) * (x > 20.0f ? x : log1pf(expf(x)));
            bt = 1.0f / (1.0f + expf(-bf2f(b[at])));
        }
        gam[tid] = (double)g;
        beta[tid] = bt;
    }
    __syncthreads();
    if (tid == 0)
        for (u32 i = 1; i < len; ++i) gam[i] += gam[i - 1];
    __syncthreads();
    if (tid < GDR_CHUNK) {
        gexp[tid] = tid < len ? (float)exp(gam[tid]) : 0.0f;
        tail[tid] = tid < len ? expf((float)(gam[len - 1] - gam[tid])) : 0.0f;
    }
    __syncthreads();
    // Pairwise products on tensor cores: warp w takes row tile w % 4 of K Kᵀ (w < 4) or
    // of Q Kᵀ, every column; then the decays, β and the masks: KK below the diagonal
    // (shared), QK on and below it (scratch).
    {
        const u32 g = lane >> 2, t = lane & 3, m0 = (warp & 3) * 16;
        const float* lhs = warp < 4 ? ks : qs;
        float acc[GDR_CHUNK / 8][4];
#pragma unroll
        for (u32 nt = 0; nt < GDR_CHUNK / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
        mma_rows<GDR_CHUNK / 8, false, true, 0>(acc, lhs, ld, m0, ks, ld, dk, g, t, 1.0f);
#pragma unroll
        for (u32 nt = 0; nt < GDR_CHUNK / 8; ++nt) {
#pragma unroll
            for (u32 e = 0; e < 4; ++e) {
                const u32 i = m0 + g + 8 * (e >> 1), jj = nt * 8 + 2 * t + (e & 1);
                const float decay = i < len && jj <= i ? expf((float)(gam[i] - gam[jj])) : 0.0f;
                if (warp < 4)
                    kk[i * GDR_CHUNK + jj] = jj < i ? beta[i] * decay * acc[nt][e] : 0.0f;
                else
                    qk[i * GDR_CHUNK + jj] = jj <= i ? decay * acc[nt][e] : 0.0f;
            }
        }
    }
    __syncthreads();
    // The solve, a column per thread by forward substitution (no thread reads another's
    // column; every thread reads the same KK entry at once), in blocks of GDR_SOLVE rows: a
    // block's rows in registers take the earlier rows' terms from what this thread wrote to
    // the scratch, then their own. Row i subtracts its terms in column order either way, as
    // one unrolled sweep did (compiling that took NVRTC ~9 s). Rows past `len` are zeros,
    // written nowhere and read as zeros.
    const u32 cols = dv + dk;
    const bf16_t* v = qkv + 2ull * d.hk * dk + (u64)j * dv;
    for (u32 c = tid; c < cols; c += GDR_THREADS) {
        for (u32 i0 = 0; i0 < GDR_CHUNK; i0 += GDR_SOLVE) {
            float x[GDR_SOLVE];
#pragma unroll
            for (u32 r = 0; r < GDR_SOLVE; ++r) {
                const u32 i = i0 + r;
                x[r] = i >= len ? 0.0f
                       : c < dv ? beta[i] * bf2f(v[(u64)(ch.row + i) * width + c])
                                : beta[i] * gexp[i] * ks[i * ld + c - dv];
            }
#pragma unroll 4
            for (u32 jj = 0; jj < i0; ++jj) {
                const float xj = jj < len ? uw[(u64)jj * cols + c] : 0.0f;
#pragma unroll
                for (u32 r = 0; r < GDR_SOLVE; ++r) x[r] -= kk[(i0 + r) * GDR_CHUNK + jj] * xj;
            }
#pragma unroll
            for (u32 r = 1; r < GDR_SOLVE; ++r) {
#pragma unroll
                for (u32 q = 0; q < r; ++q) x[r] -= kk[(i0 + r) * GDR_CHUNK + i0 + q] * x[q];
            }
#pragma unroll
            for (u32 r = 0; r < GDR_SOLVE; ++r)
                if (i0 + r < len) uw[(u64)(i0 + r) * cols + c] = x[r];
        }
    }
}

// One block per (value-column tile of GDR_COLS, value head, sequence group), GDR_SCAN_WARPS
// warps. Per chunk, warp w takes rows 16w .. 16w + 15 of delta [GDR_CHUNK, GDR_COLS] and of
// the outputs, and the state tile's row tiles w, w + 4, ... of 16 rows, which it keeps in
// registers from chunk to chunk (d_k a multiple of 16, at most 256). Shared memory: the state
// tile [dk, GDR_S_LD] (the B operand of the products with S), a chunk's rows of W, then of
// G q (both [GDR_CHUNK, dk + 4]), then of D_L k ([GDR_CHUNK, dk + 8], read transposed), QK
// [GDR_CHUNK, GDR_QK_LD] and delta [GDR_CHUNK, GDR_S_LD]; the strides keep each fragment's
// 32 reads in 32 banks. `groups [g]` are (first chunk, end chunk, state slot) of the
// sequences, their chunks in order. DK and DV are the key and value dims when the kernel is
// built for them (0: read from `d`); at 128 by 128 that takes it from 255 registers and
// spills to 142 and none.
template <u32 DK, u32 DV>
__device__ void gated_delta_chunk_scan(const bf16_t* qkv, const float* scratch, const GdrChunk* chunks,
                                       const u32* groups, float* state, bf16_t* out, DeltaDims d) {
    const u32 j = blockIdx.y, col0 = blockIdx.x * GDR_COLS, tid = threadIdx.x;
    const u32 lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const u32 dk = DK ? DK : d.dk, dv = DV ? DV : d.dv, kh = j / (d.hv / d.hk), first = groups[3 * blockIdx.z],
              end = groups[3 * blockIdx.z + 1], slot = groups[3 * blockIdx.z + 2];
    const u32 lr = dk + 4, lk = dk + 8, cols = dv + dk, m_tiles = dk / 16;
    const u64 width = 2ull * d.hk * dk + (u64)d.hv * dv, head = (u64)d.hv * dk * dv, per_head = (u64)dk * dv;
    extern __shared__ __align__(16) unsigned char gdr_smem[];
    float* S = reinterpret_cast<float*>(gdr_smem);
    float* rows = S + dk * GDR_S_LD;
    float* qks = rows + GDR_CHUNK * lk;
    float* dl = qks + GDR_CHUNK * GDR_QK_LD;
    float* st = slot == NO_SLOT ? nullptr : state + slot * head + j * per_head;
    // Copies the state tile from shared memory to `dst` (its columns past dv are zeros and
    // are not written).
    auto tile_to = [&](float* dst) {
        for (u32 e = tid; e < dk * GDR_COLS; e += blockDim.x) {
            const u32 r = e / GDR_COLS, c = e % GDR_COLS;
            if (col0 + c < dv) dst[(u64)r * dv + col0 + c] = S[r * GDR_S_LD + c];
        }
    };
    for (u32 e = tid; e < dk * GDR_COLS; e += blockDim.x) {
        const u32 r = e / GDR_COLS, c = e % GDR_COLS;
        S[r * GDR_S_LD + c] = st && col0 + c < dv ? st[(u64)r * dv + col0 + c] : 0.0f;
    }
    __syncthreads();
    // This warp's row tiles of the state, in the C layout.
    float sr[4][GDR_COLS / 8][4];
#pragma unroll
    for (u32 m = 0; m < 4; ++m) {
        const u32 m0 = (warp + 4 * m) * 16;
#pragma unroll
        for (u32 n = 0; n < GDR_COLS / 8; ++n) {
            const bool mine = warp + 4 * m < m_tiles;
            const u32 c0 = n * 8 + 2 * t;
            sr[m][n][0] = mine ? S[(m0 + g) * GDR_S_LD + c0] : 0.0f;
            sr[m][n][1] = mine ? S[(m0 + g) * GDR_S_LD + c0 + 1] : 0.0f;
            sr[m][n][2] = mine ? S[(m0 + g + 8) * GDR_S_LD + c0] : 0.0f;
            sr[m][n][3] = mine ? S[(m0 + g + 8) * GDR_S_LD + c0 + 1] : 0.0f;
        }
    }
    const u32 r0 = warp * 16;  // this warp's rows of delta and of the outputs
    for (u32 n = first; n < end; ++n) {
        const GdrChunk ch = chunks[n];
        const float* uw = scratch + ((u64)n * d.hv + j) * gdr_scratch_floats(dk, dv);
        const float *qk = uw + (u64)GDR_CHUNK * (dv + dk), *gexp = qk + GDR_CHUNK * GDR_CHUNK;
        const float *tail = gexp + GDR_CHUNK, *qn = tail + GDR_CHUNK, *kn = qn + GDR_CHUNK;
        const u32 len = ch.len;
        if (len > 0) {
            __syncthreads();  // the last chunk is done with `rows`, `dl` and the snapshot's tile
            if (cols % 4 == 0 && dv % 4 == 0) {
                // W's rows and QK straight to shared memory, 16 bytes a copy, all in flight at once.
                const u32 per_row = dk / 4;
                for (u32 c = tid; c < GDR_CHUNK * per_row; c += blockDim.x) {
                    const u32 i = c / per_row, x = c % per_row * 4;
                    cp_async16(smem_addr(rows + i * lr + x), uw + (u64)(i < len ? i : 0) * cols + dv + x, i < len);
                }
                for (u32 c = tid; c < GDR_CHUNK * GDR_CHUNK / 4; c += blockDim.x) {
                    const u32 i = c / (GDR_CHUNK / 4), x = c % (GDR_CHUNK / 4) * 4;
                    cp_async16(smem_addr(qks + i * GDR_QK_LD + x), qk + i * GDR_CHUNK + x, true);
                }
                cp_async_commit();
                cp_async_wait<0>();
            } else {
                // A warp a row at a time, lanes along it.
                for (u32 i = warp; i < GDR_CHUNK; i += GDR_SCAN_WARPS) {
                    for (u32 x = lane; x < dk; x += 32) rows[i * lr + x] = i < len ? uw[(u64)i * cols + dv + x] : 0.0f;
                    for (u32 x = lane; x < GDR_CHUNK; x += 32) qks[i * GDR_QK_LD + x] = qk[i * GDR_CHUNK + x];
                }
            }
            __syncthreads();
            // delta = U - W S: this warp's 16 rows, every column of the tile.
            float acc[GDR_COLS / 8][4];
#pragma unroll
            for (u32 nt = 0; nt < GDR_COLS / 8; ++nt) {
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    const u32 i = r0 + g + 8 * (e >> 1), col = col0 + nt * 8 + 2 * t + (e & 1);
                    acc[nt][e] = i < len && col < dv ? uw[(u64)i * cols + col] : 0.0f;
                }
            }
            mma_rows<GDR_COLS / 8, false, false, 0>(acc, rows, lr, r0, S, GDR_S_LD, dk, g, t, -1.0f);
#pragma unroll
            for (u32 nt = 0; nt < GDR_COLS / 8; ++nt) {
#pragma unroll
                for (u32 e = 0; e < 4; ++e) dl[(r0 + g + 8 * (e >> 1)) * GDR_S_LD + nt * 8 + 2 * t + (e & 1)] = acc[nt][e];
            }
            __syncthreads();
            // o = (G q) S + QK delta.
            const bf16_t* xq = qkv + (u64)kh * dk;
            if (gdr_rows_align(dk, width)) {
                gdr_load_rows(rows, lr, xq, width, ch.row, len, dk, [&](u32 i) { return qn[i] * gexp[i]; });
            } else {
                for (u32 i = warp; i < GDR_CHUNK; i += GDR_SCAN_WARPS) {
                    const float scale = i < len ? qn[i] * gexp[i] : 0.0f;
                    for (u32 x = lane; x < dk; x += 32)
                        rows[i * lr + x] = i < len ? bf2f(xq[(u64)(ch.row + i) * width + x]) * scale : 0.0f;
                }
            }
            __syncthreads();
#pragma unroll
            for (u32 nt = 0; nt < GDR_COLS / 8; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
            mma_rows<GDR_COLS / 8, false, false, 0>(acc, rows, lr, r0, S, GDR_S_LD, dk, g, t, 1.0f);
            mma_rows<GDR_COLS / 8, false, false, GDR_CHUNK>(acc, qks, GDR_QK_LD, r0, dl, GDR_S_LD, GDR_CHUNK, g, t, 1.0f);
#pragma unroll
            for (u32 nt = 0; nt < GDR_COLS / 8; ++nt) {
#pragma unroll
                for (u32 e = 0; e < 4; ++e) {
                    const u32 i = r0 + g + 8 * (e >> 1), col = col0 + nt * 8 + 2 * t + (e & 1);
                    if (i < len && col < dv) out[((u64)(ch.row + i) * d.hv + j) * dv + col] = f2bf(acc[nt][e]);
                }
            }
            __syncthreads();  // every warp is done with S (shared) and with the queries
            // S <- G_L S + (D_L k)^T delta, in this warp's registers, then shared.
            const bf16_t* xk = qkv + (u64)(d.hk + kh) * dk;
            if (gdr_rows_align(dk, width)) {
                gdr_load_rows(rows, lk, xk, width, ch.row, len, dk, [&](u32 i) { return kn[i] * tail[i]; });
            } else {
                for (u32 i = warp; i < GDR_CHUNK; i += GDR_SCAN_WARPS) {
                    const float scale = i < len ? kn[i] * tail[i] : 0.0f;
                    for (u32 x = lane; x < dk; x += 32)
                        rows[i * lk + x] = i < len ? bf2f(xk[(u64)(ch.row + i) * width + x]) * scale : 0.0f;
                }
            }
            __syncthreads();
            const float last = gexp[len - 1];
#pragma unroll
            for (u32 m = 0; m < 4; ++m) {
                if (warp + 4 * m >= m_tiles) continue;
                const u32 m0 = (warp + 4 * m) * 16;
#pragma unroll
                for (u32 nt = 0; nt < GDR_COLS / 8; ++nt)
                    sr[m][nt][0] *= last, sr[m][nt][1] *= last, sr[m][nt][2] *= last, sr[m][nt][3] *= last;
                mma_rows<GDR_COLS / 8, true, false, GDR_CHUNK>(sr[m], rows, lk, m0, dl, GDR_S_LD, GDR_CHUNK, g, t, 1.0f);
#pragma unroll
                for (u32 nt = 0; nt < GDR_COLS / 8; ++nt) {
                    const u32 c0 = nt * 8 + 2 * t;
                    S[(m0 + g) * GDR_S_LD + c0] = sr[m][nt][0];
                    S[(m0 + g) * GDR_S_LD + c0 + 1] = sr[m][nt][1];
                    S[(m0 + g + 8) * GDR_S_LD + c0] = sr[m][nt][2];
                    S[(m0 + g + 8) * GDR_S_LD + c0 + 1] = sr[m][nt][3];
                }
            }
        }
        // A snapshot takes the state after the chunk.
        if (ch.snap != NO_SLOT) {
            __syncthreads();
            tile_to(state + ch.snap * head + j * per_head);
        }
    }
    __syncthreads();
    if (st) tile_to(st);
}
extern "C" __global__ void __launch_bounds__(GDR_SCAN_WARPS * 32)
    gated_delta_chunk_scan_bf16(const bf16_t* qkv, const float* scratch, const GdrChunk* chunks,
                                const u32* groups, float* state, bf16_t* out, DeltaDims d) {
    pdl_enter();
    gated_delta_chunk_scan<0, 0>(qkv, scratch, chunks, groups, state, out, d);
}
extern "C" __global__ void __launch_bounds__(GDR_SCAN_WARPS * 32)
    gated_delta_chunk_scan_bf16_k128_v128(const bf16_t* qkv, const float* scratch, const GdrChunk* chunks,
                                          const u32* groups, float* state, bf16_t* out, DeltaDims d) {
    pdl_enter();
    gated_delta_chunk_scan<128, 128>(qkv, scratch, chunks, groups, state, out, d);
}

// --- state slots ---------------------------------------------------------------------------
//
// Copies and zeroings of state slots in one launch: job `blockIdx.y` of `jobs [n, 6]` (u32
// pairs: source address, destination address, bytes; source 0 zeroes the destination), block
// `blockIdx.x` its bytes `x · span ..` (span a multiple of 16). The host puts jobs in one
// launch only when none reads or writes what another writes.
extern "C" __global__ void state_slot_jobs(const u32* jobs, u64 span) {
    pdl_enter();
    const u32* job = jobs + 6 * (u64)blockIdx.y;
    const u64 src = job[0] | ((u64)job[1] << 32), dst = job[2] | ((u64)job[3] << 32), bytes = job[4] | ((u64)job[5] << 32);
    const u64 lo = blockIdx.x * span;
    if (lo >= bytes) return;
    const u64 hi = min(lo + span, bytes);
    unsigned char* d = reinterpret_cast<unsigned char*>(dst);
    const unsigned char* s = reinterpret_cast<const unsigned char*>(src);
    if (((src | dst | bytes) & 15u) == 0) {
        for (u64 i = lo + 16 * (u64)threadIdx.x; i < hi; i += 16 * (u64)blockDim.x)
            *reinterpret_cast<uint4*>(d + i) = src ? *reinterpret_cast<const uint4*>(s + i) : make_uint4(0, 0, 0, 0);
    } else {
        for (u64 i = lo + threadIdx.x; i < hi; i += blockDim.x) d[i] = src ? s[i] : 0;
    }
}

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
extern "C" __global__ void sigmoid_mul_bf16(const bf16_t* x, const bf16_t* gate, const bf16_t* y, bf16_t* out,
                                             u64 span, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const float g = bf2f(gate[i / span]);
        const float v = round_bf(bf2f(x[i]) * round_bf(1.0f / (1.0f + expf(-g))));
        out[i] = f2bf(y ? bf2f(y[i]) + v : v);
    }
}
