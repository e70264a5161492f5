// moe.cu: mixture-of-experts routing and the weighted combine of expert outputs.
//
// Routing follows the CPU reference step for step (f32 softmax with the max subtracted, a
// sequential f32 sum, experts best first with ties to the lower index, optional
// renormalisation over the chosen ones) so both backends pick the same experts. The expert
// MLPs themselves are GEMMs over tokens grouped by expert (see `src/cuda/moe.rs`); the
// combine sums each token's k expert rows, weighted, in a fixed order (no atomics), so the
// result is deterministic.

// A slot routed to no expert (see `moe_align`).
#define MOE_NONE 0xffffffffu

// One warp per token (block of 32). probs: dynamic shared [e]. The lanes share the
// exponentials and each pick's arg-max; the two sums run on lane 0 in the CPU's order, so
// both backends round them alike. A pick is the highest probability left, ties to the
// lower index, as the CPU's sort orders them.
template <typename T>
__device__ void topk_routing(const T* logits, float* weights, u32* experts, u32 e, u32 k, u32 renormalize) {
    extern __shared__ float probs[];
    const T* row = logits + (u64)blockIdx.x * e;
    const u32 lane = threadIdx.x;
    float max = -MET_INF;
    for (u32 j = lane; j < e; j += 32) max = fmaxf(max, load_f(row, j));
    for (int o = 16; o > 0; o >>= 1) max = fmaxf(max, __shfl_xor_sync(0xffffffffu, max, o));
    for (u32 j = lane; j < e; j += 32) probs[j] = expf(load_f(row, j) - max);
    __syncwarp();
    float total = 0.0f;
    if (lane == 0 && !renormalize)
        for (u32 j = 0; j < e; ++j) total += probs[j];
    float norm = 0.0f;
    for (u32 c = 0; c < k; ++c) {
        // This lane's best untaken expert (ascending j keeps the lower index on ties), then
        // the warp's; taken ones hold -1, below every probability.
        float best_p = -2.0f;
        u32 best = 0xffffffffu;
        for (u32 j = lane; j < e; j += 32) {
            const float p = probs[j];
            if (p > best_p) best_p = p, best = j;
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float p2 = __shfl_xor_sync(0xffffffffu, best_p, o);
            const u32 j2 = __shfl_xor_sync(0xffffffffu, best, o);
            if (p2 > best_p || (p2 == best_p && j2 < best)) best_p = p2, best = j2;
        }
        if (lane == 0) {
            norm += best_p;
            experts[(u64)blockIdx.x * k + c] = best;
            weights[(u64)blockIdx.x * k + c] = best_p;
            probs[best] = -1.0f;
        }
        __syncwarp();
    }
    if (lane == 0) {
        if (!renormalize) norm = total;
        for (u32 c = 0; c < k; ++c) weights[(u64)blockIdx.x * k + c] /= norm;
    }
}

extern "C" __global__ void topk_routing_bf16(const bf16_t* l, float* w, u32* x, u32 e, u32 k, u32 renorm) {
    pdl_enter();
    topk_routing(l, w, x, e, k, renorm);
}

extern "C" __global__ void topk_routing_f32(const float* l, float* w, u32* x, u32 e, u32 k, u32 renorm) {
    pdl_enter();
    topk_routing(l, w, x, e, k, renorm);
}

// Token row `xr [h]` dotted with a shared expert's gate weight `w [h]` as
// `gemv_bf16_m*_r1` (gemv.cu) takes a one-column product: threads 0 .. GEMV_THREADS - 1 add
// vectors t, t + GEMV_THREADS, ... in order, each warp's sums go through the fixed shuffle
// tree, the warps add in order, and the sum rounds to bf16 as the product's output does; so
// the gate has the bits of `matmul(x, w)` in a decode batch. Every thread of the block calls
// it (it has barriers); h a multiple of 8.
__device__ float moe_gate_dot(const bf16_t* __restrict__ w, const bf16_t* __restrict__ xr, u32 h) {
    __shared__ float part[GEMV_WARPS];
    __shared__ float gate;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid < GEMV_THREADS) {
        const uint4* wv = reinterpret_cast<const uint4*>(w);
        const uint4* xv = reinterpret_cast<const uint4*>(xr);
        float acc = 0.0f;
        for (u32 v = tid; v < h / 8; v += GEMV_THREADS) acc = dot8(__ldg(wv + v), __ldg(xv + v), acc);
        acc = warp_sum(acc);
        if (lane == 0) part[warp] = acc;
    }
    __syncthreads();
    if (tid == 0) {
        float sum = part[0];
#pragma unroll
        for (int q = 1; q < GEMV_WARPS; ++q) sum += part[q];
        gate = round_bf(sum + 0.0f);
    }
    __syncthreads();
    return gate;
}

// out[t, :] = sum_j weights[t, j] * y[rows[t * k + j], :], for y [t * k, h] in expert order
// (or, with `rows` null, in slot order: y[t * k + j]); a slot with no row (MOE_NONE) adds
// nothing. grid (t, ceil(h / blockDim.x)), a column per thread: the k loads of a column are
// issued eight at a time before they are summed, in choice order, so a decode step waits
// for one round trip to memory, not k.
template <typename W>
__device__ void moe_combine(const bf16_t* y, const u32* rows, const W* weights, const bf16_t* shared,
                            const bf16_t* gate, const bf16_t* gate_w, const bf16_t* x, bf16_t* out, u32 k, u32 h) {
    const u64 t = blockIdx.x;
    const u32 c = blockIdx.y * blockDim.x + threadIdx.x;
    // The shared expert's gate: given, or its product with the token's row taken here (by
    // every thread of the block, before any leaves).
    const float g = !shared ? 0.0f : gate ? bf2f(gate[t]) : moe_gate_dot(gate_w, x + t * h, h);
    if (c >= h) return;
    float acc = 0.0f;
    for (u32 j0 = 0; j0 < k; j0 += 8) {
        float v[8], wt[8];
#pragma unroll
        for (u32 j = 0; j < 8; ++j) {
            const u32 row = j0 + j >= k ? MOE_NONE : rows ? rows[t * k + j0 + j] : (u32)(t * k + j0 + j);
            v[j] = row != MOE_NONE ? bf2f(y[(u64)row * h + c]) : 0.0f;
            wt[j] = row != MOE_NONE ? load_f(weights, t * k + j0 + j) : 0.0f;
        }
#pragma unroll
        for (u32 j = 0; j < 8; ++j)
            if (j0 + j < k) acc += wt[j] * v[j];
    }
    if (shared) {
        // The shared expert's output gated by its token's sigmoid, rounded as
        // `sigmoid_mul_bf16` rounds it, added to the routed sum rounded to bf16.
        const float s = round_bf(bf2f(shared[t * h + c]) * round_bf(1.0f / (1.0f + expf(-g))));
        out[t * h + c] = f2bf(round_bf(acc) + s);
    } else {
        out[t * h + c] = f2bf(acc);
    }
}

// `shared` null (and the rest of the shared expert's operands too), or a shared expert's
// output `[t, h]` with its gates `[t, 1]`, or with `gate` null, its gate weight `gate_w [h]`
// and the tokens `x [t, h]` (then h is a multiple of 8 and the block at least GEMV_THREADS).
extern "C" __global__ void moe_combine_f32(const bf16_t* y, const u32* rows, const float* w, const bf16_t* shared,
                                           const bf16_t* gate, const bf16_t* gate_w, const bf16_t* x, bf16_t* out,
                                           u32 k, u32 h) {
    pdl_enter();
    moe_combine(y, rows, w, shared, gate, gate_w, x, out, k, h);
}

extern "C" __global__ void moe_combine_bf16(const bf16_t* y, const u32* rows, const bf16_t* w, const bf16_t* shared,
                                            const bf16_t* gate, const bf16_t* gate_w, const bf16_t* x, bf16_t* out,
                                            u32 k, u32 h) {
    pdl_enter();
    moe_combine(y, rows, w, shared, gate, gate_w, x, out, k, h);
}

// --- the experts of a few slots as GEMVs ----------------------------------------------
//
// When a step has few (token, choice) slots (t·k <= 32: decode batches), each slot's expert
// is a stream over that expert's weights, as a dense decode projection is (gemv.cu): no
// grouping, no row tiles. `moe_gemv_silu_*` writes act[slot] = silu(gate · x) · (up · x)
// from the fused gate/up rows of the slot's expert and its token's row of x, and
// `moe_gemv_*` y[slot] = down · act[slot]; `moe_combine` then reads y in slot order. The
// weights come in gemv.cu's formats (`GemvBf16`, and fp8.cu's `GemvE4m3` for e4m3 experts
// under their scales), the expert stack `[e, n, kd]` read as one matrix of e·n rows.
// grid (row blocks, t·k), a warp per output row (or MOE_GEMV_DOWN_ROWS rows of the down
// product), whose lanes take the row's 16-byte vectors lane, lane + 32, ..., S of each row
// loaded before they are multiplied. A sum adds its products in f32 in an order fixed by
// the inner size (the lane's vectors in order, then a fixed shuffle tree), so a slot's
// result does not depend on the others; its bits differ from the grouped GEMM's, which
// sums in k16 steps (`--batch-invariant` keeps the GEMM at every size). A slot whose expert
// is past `e` writes zeros, as a slot with no row adds nothing in the grouped path.
#define MOE_GEMV_WARPS 4
#define MOE_GEMV_DOWN_ROWS 4

// Every lane gets the f32 sums of rows `rows[0..R)` of the format's matrix (rows of `kd`)
// with `x [kd]`.
template <int S, int R, typename F>
__device__ __forceinline__ void moe_warp_dots(F& f, const u32 (&rows)[R], const bf16_t* __restrict__ x, u32 kd,
                                              float (&acc)[R]) {
    const u32 lane = threadIdx.x & 31, vecs = kd / F::PER;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        wv[r] = f.bind(r, rows[r], kd);
        acc[r] = 0.0f;
    }
    for (u32 base = lane; base < vecs; base += 32 * S) {
        uint4 wr[S][R];
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const u32 v = base + 32 * s;
#pragma unroll
            for (int r = 0; r < R; ++r) wr[s][r] = v < vecs ? __ldcs(wv[r] + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int s = 0; s < S; ++s) {
            const u32 v = base + 32 * s;
            if (v >= vecs) break;
            const typename F::XVec xi = F::load_x(xv, v);
#pragma unroll
            for (int r = 0; r < R; ++r) acc[r] = F::dot(f.prepare(r, wr[s][r], v), xi, acc[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = warp_sum(acc[r]);
}

// act [t·k, half] from x [t, kd], experts [t·k] and the format's stack [e, 2 half, kd]
// (gate rows, then up); grid (ceil(half / MOE_GEMV_WARPS), t·k), block 32 MOE_GEMV_WARPS.
// Rounded as `silu_mul_bf16` rounds the grouped path's bf16 gate and up.
template <int S, typename F>
__device__ __forceinline__ void moe_gemv_silu(F f, const bf16_t* x, const u32* experts, bf16_t* act, u32 k, u32 e,
                                              u32 half, u32 kd) {
    const u32 slot = blockIdx.y, j = blockIdx.x * MOE_GEMV_WARPS + (threadIdx.x >> 5);
    if (j >= half) return;
    const u32 expert = experts[slot];
    float acc[2] = {0.0f, 0.0f};
    if (expert < e) {
        const u32 rows[2] = {expert * 2 * half + j, expert * 2 * half + half + j};
        moe_warp_dots<S>(f, rows, x + (u64)(slot / k) * kd, kd, acc);
    }
    if ((threadIdx.x & 31) == 0) {
        const float g = round_bf(acc[0]), u = round_bf(acc[1]);
        act[(u64)slot * half + j] = f2bf(round_bf(g / (1.0f + expf(-g))) * u);
    }
}

// y [t·k, n] from act [t·k, kd], experts [t·k] and the format's stack [e, n, kd]; grid
// (ceil(n / (MOE_GEMV_WARPS MOE_GEMV_DOWN_ROWS)), t·k), block 32 MOE_GEMV_WARPS.
template <int S, typename F>
__device__ __forceinline__ void moe_gemv_down(F f, const bf16_t* act, const u32* experts, bf16_t* y, u32 e, u32 n,
                                              u32 kd) {
    const u32 slot = blockIdx.y, lane = threadIdx.x & 31;
    const u32 first = (blockIdx.x * MOE_GEMV_WARPS + (threadIdx.x >> 5)) * MOE_GEMV_DOWN_ROWS;
    if (first >= n) return;
    const u32 expert = experts[slot];
    float acc[MOE_GEMV_DOWN_ROWS] = {};
    if (expert < e) {
        u32 rows[MOE_GEMV_DOWN_ROWS];
#pragma unroll
        for (int r = 0; r < MOE_GEMV_DOWN_ROWS; ++r) rows[r] = expert * n + min(first + r, n - 1);
        moe_warp_dots<S>(f, rows, act + (u64)slot * kd, kd, acc);
    }
#pragma unroll
    for (int r = 0; r < MOE_GEMV_DOWN_ROWS; ++r)
        if (lane == (u32)r && first + r < n) y[(u64)slot * n + first + r] = f2bf(acc[r]);
}

extern "C" __global__ void __launch_bounds__(32 * MOE_GEMV_WARPS)
    moe_gemv_silu_bf16(const bf16_t* x, const u32* experts, const bf16_t* w, bf16_t* act, u32 k, u32 e, u32 half,
                       u32 kd) {
    pdl_enter();
    moe_gemv_silu<8>(GemvBf16{w}, x, experts, act, k, e, half, kd);
}

extern "C" __global__ void __launch_bounds__(32 * MOE_GEMV_WARPS)
    moe_gemv_bf16(const bf16_t* act, const u32* experts, const bf16_t* w, bf16_t* y, u32 e, u32 n, u32 kd) {
    pdl_enter();
    moe_gemv_down<2>(GemvBf16{w}, act, experts, y, e, n, kd);
}

// --- expert grouping and grouped GEMMs on the device (no host synchronisation) ---------
//
// `moe_align` sorts the t·k (token, choice) slots by expert into rows; `moe_gemm` then runs
// every expert's GEMM over its rows in one launch, each block one (row tile, column tile)
// of one expert. The grid is sized on the host from t, k and e alone (an upper bound on the
// row tiles), so the launch shapes never depend on the routing and a CUDA graph can hold
// the whole MLP.

// Each expert's first row and first row tile (exclusive prefix sums of its rows and of its
// row tiles) into offsets/next and tiles, the totals at [e]: a block-wide scan, blockDim.x
// experts at a time (a warp's shuffles, then the warps' totals, then a carry), where one
// thread walking all e experts cost ~10 us a layer at batch 1. Launched with a multiple of
// 32 threads, at most 1024.
__device__ void align_offsets(const u32* counts, u32* next, u32* offsets, u32* tiles, u32 e, u32 bm) {
    __shared__ u32 warp_rows[32], warp_tiles[32], carry[2];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (threadIdx.x == 0) carry[0] = carry[1] = 0;
    __syncthreads();
    for (u32 base = 0; base < e; base += blockDim.x) {
        const u32 x = base + threadIdx.x;
        const u32 c = x < e ? counts[x] : 0u, ct = (c + bm - 1) / bm;
        u32 r = c, t = ct;  // inclusive within the warp
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 rn = __shfl_up_sync(0xffffffffu, r, o), tn = __shfl_up_sync(0xffffffffu, t, o);
            if (lane >= o) {
                r += rn;
                t += tn;
            }
        }
        if (lane == 31) {
            warp_rows[warp] = r;
            warp_tiles[warp] = t;
        }
        __syncthreads();
        if (warp == 0) {
            u32 wr = lane < warps ? warp_rows[lane] : 0u, wt = lane < warps ? warp_tiles[lane] : 0u;
#pragma unroll
            for (u32 o = 1; o < 32; o <<= 1) {
                const u32 rn = __shfl_up_sync(0xffffffffu, wr, o), tn = __shfl_up_sync(0xffffffffu, wt, o);
                if (lane >= o) {
                    wr += rn;
                    wt += tn;
                }
            }
            warp_rows[lane] = wr;
            warp_tiles[lane] = wt;
        }
        __syncthreads();
        const u32 rows_before = carry[0] + (warp > 0 ? warp_rows[warp - 1] : 0u) + r - c;
        const u32 tiles_before = carry[1] + (warp > 0 ? warp_tiles[warp - 1] : 0u) + t - ct;
        if (x < e) {
            offsets[x] = rows_before;
            next[x] = rows_before;
            tiles[x] = tiles_before;
        }
        __syncthreads();  // every thread has read the carry
        if (threadIdx.x == blockDim.x - 1) {
            carry[0] = rows_before + c;
            carry[1] = tiles_before + ct;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        offsets[e] = carry[0];
        tiles[e] = carry[1];
    }
}

// One block. counts/next: dynamic shared [2 e]. Writes offsets [e + 1] (each expert's first
// row; the total last), tiles [e + 1] (each expert's first row tile of `bm` rows; the total
// last), token_of_row [t·k] and row_of_slot [t·k]. Rows of one expert come in no fixed order
// (shared atomics): each row is computed on its own and the combine reads a token's slots in
// choice order, so results do not depend on it. A slot whose expert is past `e` gets no row
// (MOE_NONE), so a bad index never reads outside the weights.
extern "C" __global__ void moe_align(const u32* experts, u32* offsets, u32* tiles, u32* token_of_row,
                                     u32* row_of_slot, u32 tk, u32 k, u32 e, u32 bm) {
    pdl_enter();
    extern __shared__ u32 moe_counts[];
    u32* next = moe_counts + e;
    for (u32 x = threadIdx.x; x < e; x += blockDim.x) moe_counts[x] = 0;
    __syncthreads();
    for (u32 s = threadIdx.x; s < tk; s += blockDim.x) {
        const u32 x = experts[s];
        if (x < e) atomicAdd(&moe_counts[x], 1u);
    }
    __syncthreads();
    align_offsets(moe_counts, next, offsets, tiles, e, bm);
    __syncthreads();
    for (u32 s = threadIdx.x; s < tk; s += blockDim.x) {
        const u32 x = experts[s];
        if (x < e) {
            const u32 row = atomicAdd(&next[x], 1u);
            token_of_row[row] = s / k;
            row_of_slot[s] = row;
        } else {
            row_of_slot[s] = MOE_NONE;
        }
    }
}

// --- adapters on the experts (eager steps) -----------------------------------------------
//
// One entry per adapter slot of one expert stack, written by the host for the step
// (`MoeLoraTable` of `src/cuda/moe.rs`): the slot's `a [e, rank, k]` and `b [e, n, rank]`
// (bf16, 0 where the slot adapts nothing here), its rank and its scale.
struct MoeLoraEntry {
    u32 a_lo, a_hi, b_lo, b_hi, rank, scale;
};

#define MOE_LORA_THREADS 128

// One grouped (token, choice) row per block: `out[r] += scale · b[x] · (a[x] · in)`, with
// `x` the row's expert (read from `offsets`), its token's adapter slot from `token_slot`,
// and `in` row `in_row[r]` of `in` (the token's row of x for gate/up) or row `r` itself
// (`in_row` null: the activated row for down). The shrink keeps its `rank` sums in f32 in
// shared memory; the expansion adds `delta · scale` to the bf16 base value and rounds once
// (PEFT's order). Rows of the base model, or of a slot with nothing here, are not written.
// Each row's sums run in an order fixed by the shapes: a row's result is its own.
extern "C" __global__ void moe_lora_delta(bf16_t* out, const bf16_t* in, const u32* in_row, const u32* token_of_row,
                                          const u32* offsets, const u32* token_slot, const MoeLoraEntry* table,
                                          u32 slots, u32 rows, u32 e, u32 k, u32 n) {
    pdl_enter();
    extern __shared__ float moe_lora_shrunk[];
    const u32 r = blockIdx.x;
    if (r >= rows) return;
    const u32 slot = token_slot[token_of_row[r]];
    if (slot >= slots) return;
    const MoeLoraEntry ent = table[slot];
    const u64 a_ptr = (u64)ent.a_lo | ((u64)ent.a_hi << 32), b_ptr = (u64)ent.b_lo | ((u64)ent.b_hi << 32);
    const u32 rank = ent.rank;
    if (a_ptr == 0 || rank == 0) return;
    // The expert whose rows hold r: the last x with offsets[x] <= r (empty experts share
    // their offset with the next one, so the last is the one with rows).
    u32 lo = 0, hi = e;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) >> 1;
        if (offsets[mid] <= r) lo = mid;
        else hi = mid;
    }
    const bf16_t* src = in + (size_t)(in_row ? in_row[r] : r) * k;
    const bf16_t* a = (const bf16_t*)a_ptr + (size_t)lo * rank * k;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (u32 j = warp; j < rank; j += warps) {
        float acc = 0.0f;
        for (u32 c = lane; c < k; c += 32) acc += bf2f(src[c]) * bf2f(a[(size_t)j * k + c]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (lane == 0) moe_lora_shrunk[j] = acc;
    }
    __syncthreads();
    const bf16_t* b = (const bf16_t*)b_ptr + (size_t)lo * n * rank;
    const float scale = __uint_as_float(ent.scale);
    for (u32 o = threadIdx.x; o < n; o += blockDim.x) {
        float acc = 0.0f;
        for (u32 j = 0; j < rank; ++j) acc += moe_lora_shrunk[j] * bf2f(b[(size_t)o * rank + j]);
        bf16_t* dst = out + (size_t)r * n + o;
        *dst = f2bf(bf2f(*dst) + acc * scale);
    }
}

#define MOE_BN 64
#define MOE_BK 64
#define MOE_THREADS 128

// Row tile `y` of a grouping: its expert `x`, first grouped row `r0` and `rows` (at most BM);
// false past the last tile.
template <int BM>
__device__ __forceinline__ bool moe_tile(u32 y, const u32* offsets, const u32* tiles, u32 e, u32& x, u32& r0,
                                         u32& rows) {
    if (y >= tiles[e]) return false;
    u32 lo = 0, hi = e;  // the expert x with tiles[x] <= y < tiles[x + 1]
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) / 2;
        if (tiles[mid] <= y) lo = mid; else hi = mid;
    }
    x = lo;
    r0 = offsets[x] + (y - tiles[x]) * BM;
    rows = min((u32)BM, offsets[x + 1] - r0);
    return true;
}

// A warp's mma accumulators (rows row0 .. row0 + 15 of the tile, NT n8 tiles from column
// col0) rounded to bf16 into `out [.., n]` at grouped row r0 + row, rows past `rows` and
// columns past `n` left out; pairs of columns in one store where rows stay 4-byte aligned.
template <int NT>
__device__ __forceinline__ void moe_store(const float (&acc)[NT][4], bf16_t* out, u32 r0, u32 rows, u32 n, u32 row0,
                                          u32 col0, u32 lane) {
    const u32 g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 r = row0 + g + 8 * i;
        if (r >= rows) continue;
        bf16_t* dst = out + (u64)(r0 + r) * n;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const u32 col = col0 + j * 8 + 2 * tq;
            if (col + 1 < n && n % 2 == 0) {
                *reinterpret_cast<u32*>(dst + col) = pack_bf16(acc[j][2 * i], acc[j][2 * i + 1]);
            } else {
                if (col < n) dst[col] = f2bf(acc[j][2 * i]);
                if (col + 1 < n) dst[col + 1] = f2bf(acc[j][2 * i + 1]);
            }
        }
    }
}

// out[r, :n] = a[src(r), :kd] · w[x]ᵀ for every row r of every expert x, where w [e, n, kd]
// and src(r) = a_rows[r] (the token of a grouped row) or r itself when a_rows is null.
// bf16 operands through mma.sync m16n8k16 with f32 accumulation, rounded once to bf16.
// With `tiles` null it is one dense product `out [e, n] = a · w[0]ᵀ` of `e` rows.
//
// A row's sums do not depend on the rows around it: every output element accumulates its
// kd products in MOE_BK-column tiles, in order, each tile in k16 steps of the same
// instruction, whatever BM, the deep pipeline or ALIGNED (which change only how tiles are
// loaded). So every kernel of the family writes a row's bits alike, which
// `--batch-invariant` takes for its dense products too.
//
// grid (ceil(n / MOE_BN), row tiles bound), block MOE_THREADS, dynamic shared memory
// STAGES (BM + MOE_BN) MOE_BK · 2 bytes. Block y is row tile y of the whole grouping
// (`tiles`); blocks past the last tile return. The four warps split the BM × MOE_BN tile
// into BM / 16 row groups and 4 / (BM / 16) column groups. With ALIGNED (kd a multiple of 8),
// tiles are copied with cp.async through STAGES buffers; otherwise element by element.
// Where a tile has only a few real rows (small batches), the kernel streams weights: there
// the host picks a deeper STAGES, so more of them are in flight per SM.
template <int BM, bool ALIGNED, int STAGES>
__device__ void moe_gemm(const bf16_t* a, const u32* a_rows, const bf16_t* w, bf16_t* out, const u32* offsets,
                         const u32* tiles, u32 e, u32 n, u32 kd) {
    constexpr int WM = BM / 16, WN = 4 / WM, NT = MOE_BN / WN / 8;  // n8 tiles per warp
    constexpr u32 CH = MOE_BK / 8;                                     // 16-byte chunks per row
    constexpr u32 STAGE = (BM + MOE_BN) * MOE_BK * 2;                  // bytes
    extern __shared__ __align__(128) unsigned char moe_smem[];
    const u32 base = smem_addr(moe_smem);
    auto as = [&](u32 st) { return base + st * STAGE; };
    auto bs = [&](u32 st) { return base + st * STAGE + BM * MOE_BK * 2; };

    const u32 y = blockIdx.y;
    u32 x = 0, r0, rows;
    if (!tiles) {
        // A dense product (`--batch-invariant`'s): one expert, `e` rows, tile y.
        r0 = y * BM;
        if (r0 >= e) return;
        rows = min((u32)BM, e - r0);
    } else if (!moe_tile<BM>(y, offsets, tiles, e, x, r0, rows)) {
        return;
    }
    const u32 n0 = blockIdx.x * MOE_BN;
    const bf16_t* wx = w + (u64)x * n * kd;
    const u32 k_tiles = (kd + MOE_BK - 1) / MOE_BK;

    auto load = [&](u32 kt, u32 st) {
        const u32 k0 = kt * MOE_BK;
        for (u32 c = threadIdx.x; c < (BM + MOE_BN) * CH; c += MOE_THREADS) {
            const u32 r = c / CH, ch = c % CH, col = k0 + ch * 8;
            const bool is_a = r < BM;
            const u32 rr = is_a ? r : r - BM;
            const bool valid = (is_a ? rr < rows : n0 + rr < n) && col < kd;
            const bf16_t* src;
            if (is_a) {
                const u32 row = r0 + (valid ? rr : 0);
                src = a + (u64)(a_rows ? a_rows[row] : row) * kd;
            } else {
                src = wx + (u64)(n0 + (valid ? rr : 0)) * kd;
            }
            const u32 dst = (is_a ? as(st) : bs(st)) + swz<MOE_BK>(rr, ch);
            if (ALIGNED) {
                cp_async16(dst, src + (valid ? col : 0), valid);
            } else {
                u32* p = reinterpret_cast<u32*>(moe_smem + (dst - base));
#pragma unroll
                for (u32 j = 0; j < 8; j += 2) {
                    const u32 v0 = valid && col + j < kd ? src[col + j] : 0u;
                    const u32 v1 = valid && col + j + 1 < kd ? src[col + j + 1] : 0u;
                    p[j / 2] = v0 | (v1 << 16);
                }
            }
        }
    };

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 wm = warp % WM, wn = warp / WM;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    cp_async_pipeline<STAGES>(k_tiles, load, [&](u32, u32 st) {
        if (wm * 16 >= rows) return;
#pragma unroll
        for (u32 kk = 0; kk < MOE_BK / 16; ++kk) {
            u32 af[4];
            ldmatrix_x4(as(st) + swz<MOE_BK>(wm * 16 + (lane & 15), kk * 2 + (lane >> 4)), af[0], af[1], af[2], af[3]);
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                const u32 r = wn * (NT * 8) + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                u32 b0, b1, b2, b3;
                ldmatrix_x4(bs(st) + swz<MOE_BK>(r, kk * 2 + ((lane >> 3) & 1)), b0, b1, b2, b3);
                mma_bf16(acc[j], af, b0, b1);
                mma_bf16(acc[j + 1], af, b2, b3);
            }
        }
    });

    moe_store<NT>(acc, out, r0, rows, n, wm * 16, n0 + wn * (NT * 8), lane);
}

#define MET_MOE_GEMM(BM, ALIGNED, STAGES, SUFFIX)                                                              \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS)                                                   \
        moe_gemm_bf16_m##BM##SUFFIX(const bf16_t* a, const u32* a_rows, const bf16_t* w, bf16_t* out,         \
                                    const u32* offsets, const u32* tiles, u32 e, u32 n, u32 kd) {             \
        pdl_enter();                                                                                            \
        moe_gemm<BM, ALIGNED, STAGES>(a, a_rows, w, out, offsets, tiles, e, n, kd);                             \
    }
MET_MOE_GEMM(16, true, 3, )
MET_MOE_GEMM(16, true, 6, _deep)
MET_MOE_GEMM(32, true, 3, )
MET_MOE_GEMM(64, true, 3, )
MET_MOE_GEMM(16, false, 3, _unaligned)
