// lora.cu: the LoRA ops of the CUDA backend, adapters' low-rank deltas added into a
// projection's output row by row. Host side and semantics: `src/cuda/lora.rs`, `GpuBackend`.
//
// Adapters are resident in slots: per module `a [slots, rank, k]` and `b [slots, n, rank]`
// (bf16, zero past each adapter's own rank) and one f32 scale per slot. `rows [t]` names
// each row's slot; a row at LORA_NO_SLOT, or at any slot past the stacks, is a base row:
// no thread writes its output, so it keeps the base product bit for bit. The grids depend
// only on shapes, never on the slots, so a captured decode step replays with any adapters.
//
// Arithmetic: the shrink `x · aᵀ` accumulates in f32 and stays f32 (no rounding between
// shrink and expand); the expansion accumulates in f32 and is added to the base output as
// `base + delta · scale` (PEFT's order), rounded once to bf16. For a few rows the shrink is a
// block per row, module and rank index (a decode step of one row still spreads over many
// blocks) and the expansion works in tiles of LORA_TILE_ROWS rows, so rows of one adapter in
// a tile find its `b` in cache; for many rows, grouped by slot on the host, both take tiles
// of one adapter's rows (the shrink on tensor cores). Each row's sums run in an order fixed
// by the shapes and the path alone: a row's result does not depend on the rows around it.

#define LORA_NO_SLOT 0xffffffffu
#define LORA_MAX_PARTS 3
#define LORA_TILE_ROWS 64
#define LORA_SHRINK_WARPS 4
#define LORA_EXPAND_THREADS 256
#define LORA_EXPAND_COLUMNS 64

// The modules of one fused projection (q/k/v, gate/up, or one alone): their stacks, the
// output columns each has and where they start. Mirrors `LoraParts` of `src/cuda/lora.rs`.
struct LoraParts {
    u64 a[LORA_MAX_PARTS];
    u64 b[LORA_MAX_PARTS];
    u32 n[LORA_MAX_PARTS];
    u32 column[LORA_MAX_PARTS];
};

// Element `i` of a parameter array, chosen without indexing it: a dynamic index would copy
// the whole parameter struct to local memory first.
template <typename T>
__device__ __forceinline__ T lora_pick(const T (&v)[LORA_MAX_PARTS], u32 i) {
    return i == 0 ? v[0] : (i == 1 ? v[1] : v[2]);
}

// Sum of the products of eight bf16 pairs packed in two 16-byte words.
__device__ __forceinline__ float lora_dot8(uint4 x, uint4 a) {
    const u32 xs[4] = {x.x, x.y, x.z, x.w};
    const u32 as[4] = {a.x, a.y, a.z, a.w};
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        acc += __uint_as_float(xs[i] << 16) * __uint_as_float(as[i] << 16);
        acc += __uint_as_float(xs[i] & 0xffff0000u) * __uint_as_float(as[i] & 0xffff0000u);
    }
    return acc;
}

// `acc` plus the products of eight f32s with eight bf16s (one 16-byte word), added in order.
__device__ __forceinline__ float lora_fma8(float acc, float4 s0, float4 s1, uint4 w) {
    acc += s0.x * __uint_as_float(w.x << 16);
    acc += s0.y * __uint_as_float(w.x & 0xffff0000u);
    acc += s0.z * __uint_as_float(w.y << 16);
    acc += s0.w * __uint_as_float(w.y & 0xffff0000u);
    acc += s1.x * __uint_as_float(w.z << 16);
    acc += s1.y * __uint_as_float(w.z & 0xffff0000u);
    acc += s1.z * __uint_as_float(w.w << 16);
    acc += s1.w * __uint_as_float(w.w & 0xffff0000u);
    return acc;
}

// Lane `lane` of warp `warp`'s share of the dot of `x [k]` and `a [k]`: the 16-byte words
// (or, when `k % 8 != 0`, the elements) `first = warp * 32 + lane`, then every
// LORA_SHRINK_WARPS * 32-th after it. The 16-byte path needs `k % 8 == 0`, which also keeps
// every row of `x` and `a` 16-byte aligned.
__device__ __forceinline__ float lora_partial_dot(const bf16_t* x, const bf16_t* a, u32 k, u32 first) {
    const u32 stride = LORA_SHRINK_WARPS * 32;
    float acc = 0.0f;
    if ((k & 7u) == 0) {
        const uint4* xv = (const uint4*)x;
        const uint4* av = (const uint4*)a;
        for (u32 i = first; i < k / 8; i += stride) acc += lora_dot8(xv[i], av[i]);
    } else {
        for (u32 i = first; i < k; i += stride) acc += bf2f(x[i]) * bf2f(a[i]);
    }
    return acc;
}

// Block (row, part, q): `shrunk [t, parts, rank]` at (row, part, q), the dot of the row's
// input with rank `q` of its slot's `a`. The block's warps split `k` and their sums are
// added in warp order, so the result depends on the row alone. A base row's blocks write
// nothing (the expansion reads nothing of theirs); every thread of a block shares its row,
// so they leave together, before the barrier.
extern "C" __global__ void __launch_bounds__(LORA_SHRINK_WARPS * 32)
    lora_shrink_bf16(const bf16_t* x, const u32* rows, LoraParts parts, float* shrunk, u32 slots, u32 rank, u32 k) {
    pdl_enter();
    __shared__ float partial[LORA_SHRINK_WARPS];
    const u32 row = blockIdx.x, part = blockIdx.y, q = blockIdx.z;
    const u32 slot = rows[row];
    if (slot >= slots) return;
    const bf16_t* a = (const bf16_t*)lora_pick(parts.a, part) + ((u64)slot * rank + q) * k;
    const u32 warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const float sum = warp_sum(lora_partial_dot(x + (u64)row * k, a, k, warp * 32 + lane));
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (u32 w = 0; w < LORA_SHRINK_WARPS; ++w) total += partial[w];
        shrunk[((u64)row * gridDim.y + part) * rank + q] = total;
    }
}

// Block (column tile, row tile, part): LORA_EXPAND_COLUMNS columns of the part by
// LORA_TILE_ROWS rows. Lane i of warp w owns columns 2i and 2i + 1 of the tile in rows
// w, w + 8, ... of the row tile, adding `scale · Σ_q shrunk[q] · b[j, q]` into
// `out[row, column + j]`. A lane's two `b` rows are 64 contiguous bytes at rank 16, so a warp
// reads whole lines, and the tile's rows of one adapter find them in cache. The parts'
// columns are disjoint (checked on the host), so no two threads meet; each sum runs over q
// in order, whatever the batch.
extern "C" __global__ void __launch_bounds__(LORA_EXPAND_THREADS)
    lora_expand_bf16(const float* __restrict__ shrunk, const u32* __restrict__ rows, LoraParts parts,
                     const float* __restrict__ scales, bf16_t* __restrict__ out, u32 t, u32 slots, u32 rank,
                     u32 width) {
    pdl_enter();
    const u32 part = blockIdx.z, n = lora_pick(parts.n, part), column = lora_pick(parts.column, part);
    const u32 j = blockIdx.x * LORA_EXPAND_COLUMNS + 2 * (threadIdx.x % 32);
    if (j >= n) return;
    const bool pair = j + 1 < n, words = (rank & 7u) == 0, packed = pair && ((width | column) & 1u) == 0;
    const bf16_t* b = (const bf16_t*)lora_pick(parts.b, part);
    const u32 end = min(t, (blockIdx.y + 1) * LORA_TILE_ROWS);
    for (u32 row = blockIdx.y * LORA_TILE_ROWS + threadIdx.x / 32; row < end; row += LORA_EXPAND_THREADS / 32) {
        const u32 slot = rows[row];
        if (slot >= slots) continue;
        const float* s = shrunk + ((u64)row * gridDim.z + part) * rank;
        const bf16_t* b0 = b + ((u64)slot * n + j) * rank;  // column j, then column j + 1
        float acc0 = 0.0f, acc1 = 0.0f;
        if (words) {
            for (u32 q = 0; q < rank; q += 8) {
                const float4 s0 = *reinterpret_cast<const float4*>(s + q);
                const float4 s1 = *reinterpret_cast<const float4*>(s + q + 4);
                // Both columns' words are loaded before either is used, so their reads overlap.
                const uint4 w0 = *reinterpret_cast<const uint4*>(b0 + q);
                const uint4 w1 = pair ? *reinterpret_cast<const uint4*>(b0 + rank + q) : w0;
                acc0 = lora_fma8(acc0, s0, s1, w0);
                acc1 = lora_fma8(acc1, s0, s1, w1);
            }
        } else {
            for (u32 q = 0; q < rank; ++q) {
                acc0 += s[q] * bf2f(b0[q]);
                if (pair) acc1 += s[q] * bf2f(b0[rank + q]);
            }
        }
        const float scale = scales[slot];
        bf16_t* o = out + (u64)row * width + column + j;
        if (packed) {
            u32* o2 = reinterpret_cast<u32*>(o);
            const u32 v = *o2;
            *o2 = pack_bf16(__uint_as_float(v << 16) + acc0 * scale, __uint_as_float(v & 0xffff0000u) + acc1 * scale);
        } else {
            o[0] = f2bf(bf2f(o[0]) + acc0 * scale);
            if (pair) o[1] = f2bf(bf2f(o[1]) + acc1 * scale);
        }
    }
}

// The grouped shrink, for steps of many rows: rows sorted by slot (on the host, which knows
// them), so that a tile of LORA_GROUP_ROWS rows of one adapter is one tensor-core product
// with its `a`, reading each row's input once per module rather than once per rank.
//
// `groups` is u32 [slots + 1 + t]: `starts[s]`, where slot s's rows begin in `order` (the
// last entry the rows grouped in all), then `order [t]`, the rows by slot. Entries out of
// range are clamped or skipped, so a bad table reads and writes nothing outside the tensors.
//
// Block (tile, part, z): tile `blockIdx.x` of the slots' row tiles, in slot order (blocks
// past the last return), module `part`, and the z-th of LORA_GROUP_SPLIT equal spans of the
// inputs. The LORA_GROUP_SPLIT blocks of a tile form a cluster: each multiplies its span,
// its four warps taking the four k16 steps of each LORA_GROUP_BK columns (their sums added
// in warp order), then block 0 adds the blocks' sums in z order from their shared memory
// and writes `shrunk`. The spans depend on `k` alone and a tensor-core row does not see the
// other rows of its tile, so a row's result depends on the row alone, not on its batch or
// the rows that share its tile. Needs rank a multiple of 16 up to LORA_GROUP_MAX_RANK and
// `k % 8 == 0`. Dynamic shared memory: LORA_GROUP_STAGES (LORA_GROUP_ROWS + rank)
// LORA_GROUP_BK · 2 bytes.
#define LORA_GROUP_ROWS 16
#define LORA_GROUP_SPLIT 8
#define LORA_GROUP_BK 64
#define LORA_GROUP_STAGES 4
#define LORA_GROUP_MAX_RANK 64
#define LORA_GROUP_THREADS 128

// This block's rank in its cluster.
__device__ __forceinline__ u32 cluster_rank() {
    u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Every thread of the cluster arrives; shared writes before are visible to reads after.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The f32 at shared address `addr` (this block's window) of block `rank` of the cluster.
__device__ __forceinline__ float cluster_load(u32 addr, u32 rank) {
    u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

// Tile `tile` of the rows grouped by slot (`starts` as `groups` holds them): slot s holds
// tiles [before, before + its tiles), each LORA_GROUP_ROWS of its rows but the last. Sets the
// tile's slot, its first entry of `order` and its row count; false past the last tile. Run by
// a whole warp, every lane taking a slot of each 32 at once (an inclusive scan of the slots'
// tile counts) rather than walking the slots one load after another; every lane gets the
// answer.
__device__ __forceinline__ bool lora_group_tile_warp(const u32* starts, u32 t, u32 slots, u32 tile, u32& slot,
                                                     u32& first, u32& count) {
    constexpr u32 TR = LORA_GROUP_ROWS;
    const u32 lane = threadIdx.x & 31;
    u32 before = 0;
    for (u32 s0 = 0; s0 < slots; s0 += 32) {
        const u32 s = s0 + lane;
        u32 lo = 0, hi = 0, tiles = 0;
        if (s < slots) {
            lo = min(starts[s], t);
            hi = min(max(starts[s + 1], lo), t);
            tiles = (hi - lo + TR - 1) / TR;
        }
        u32 upto = tiles;  // tiles of this chunk's slots up to this lane's, inclusive
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            const u32 v = __shfl_up_sync(0xffffffffu, upto, o);
            if (lane >= o) upto += v;
        }
        const u32 mine = __ballot_sync(0xffffffffu, tiles > 0 && tile >= before + upto - tiles && tile < before + upto);
        if (mine) {
            const u32 at = __ffs(mine) - 1;
            slot = s0 + at;
            const u32 start = __shfl_sync(0xffffffffu, lo, at), end = __shfl_sync(0xffffffffu, hi, at);
            const u32 skipped = __shfl_sync(0xffffffffu, upto - tiles, at);
            first = start + (tile - before - skipped) * TR;
            count = min(TR, end - first);
            return true;
        }
        before += __shfl_sync(0xffffffffu, upto, 31);
    }
    return false;
}

// The expansion of rows grouped by slot, for steps of many rows: block (tile, column chunk,
// part) takes one slot-tile of the grouped shrink's tiling (LORA_GROUP_ROWS rows of one
// adapter) by LORA_GROUP_EXPAND_WARPS · 64 columns of the part. The first warp finds the
// tile; the block stages its rows' shrunk values in shared memory; then a lane owns two
// columns: it requests the tile's base values and its `b` words at once and runs every row
// of the tile through them, so `b` is read once per tile rather than once per row, and the
// block waits on few memory round trips one after another. Per (row, column) the terms and
// their order are `lora_expand_bf16`'s, so the two kernels write the same bits. Needs
// `rank % 8 == 0` and rank up to LORA_GROUP_MAX_RANK.
extern "C" __global__ void __cluster_dims__(1, 1, LORA_GROUP_SPLIT) __launch_bounds__(LORA_GROUP_THREADS)
    lora_shrink_grouped_bf16(const bf16_t* x, const u32* groups, LoraParts parts, float* shrunk, u32 t, u32 slots,
                             u32 rank, u32 k) {
    pdl_enter();
    extern __shared__ __align__(128) unsigned char lg_smem[];
    constexpr u32 BK = LORA_GROUP_BK, CH = BK / 8, TR = LORA_GROUP_ROWS, NT = LORA_GROUP_MAX_RANK / 8;
    const u32* starts = groups;
    const u32* order = groups + slots + 1;

    u32 slot, first, count;
    if (!lora_group_tile_warp(starts, t, slots, blockIdx.x, slot, first, count)) return;  // the cluster's tile

    const u32 part = blockIdx.y, z = cluster_rank(), lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bf16_t* a = (const bf16_t*)lora_pick(parts.a, part) + (u64)slot * rank * k;
    const u32 span = (k + LORA_GROUP_SPLIT * BK - 1) / (LORA_GROUP_SPLIT * BK) * BK;
    const u32 k0 = min(k, z * span), k1 = min(k, k0 + span), k_tiles = (k1 - k0 + BK - 1) / BK;
    const u32 stage = (TR + rank) * BK * 2, base = smem_addr(lg_smem);

    // Thread i copies chunk i % CH of input row i / CH (TR · CH = the block's threads).
    const u32 my_row = threadIdx.x / CH, my_chunk = threadIdx.x % CH;
    const u32 src_row = my_row < count ? order[first + my_row] : t;
    const bool row_ok = src_row < t;
    const bf16_t* x_row = x + (u64)(row_ok ? src_row : 0) * k;
    auto load = [&](u32 kt, u32 st) {
        const u32 kb = k0 + kt * BK;
        const u32 col = kb + my_chunk * 8;
        const bool ok = row_ok && col < k1;
        cp_async16(base + st * stage + swz<BK>(my_row, my_chunk), x_row + (ok ? col : 0), ok);
        for (u32 c = threadIdx.x; c < rank * CH; c += LORA_GROUP_THREADS) {
            const u32 q = c / CH, ch = c % CH, cc = kb + ch * 8;
            cp_async16(base + st * stage + swz<BK>(TR + q, ch), a + (u64)q * k + (cc < k1 ? cc : 0), cc < k1);
        }
    };

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    cp_async_pipeline<LORA_GROUP_STAGES>(k_tiles, load, [&](u32, u32 st) {
        const u32 s0 = base + st * stage;
        u32 af[4];
        ldmatrix_x4(s0 + swz<BK>(lane & 15, warp * 2 + (lane >> 4)), af[0], af[1], af[2], af[3]);
#pragma unroll
        for (u32 j = 0; j < NT; j += 2) {
            if (j * 8 < rank) {
                const u32 r = TR + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                u32 b0, b1, b2, b3;
                ldmatrix_x4(s0 + swz<BK>(r, warp * 2 + ((lane >> 3) & 1)), b0, b1, b2, b3);
                mma_bf16(acc[j], af, b0, b1);
                mma_bf16(acc[j + 1], af, b2, b3);
            }
        }
    });
    __syncthreads();

    // The warps' sums, then the block's (in warp order), in shared memory.
    float* sums = reinterpret_cast<float*>(lg_smem);  // [warps][TR][rank]
    const u32 g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (u32 j = 0; j < NT; ++j) {
        if (j * 8 < rank) {
            float* w = sums + (warp * TR + g) * rank + j * 8 + 2 * tq;
            w[0] = acc[j][0];
            w[1] = acc[j][1];
            w[8 * rank] = acc[j][2];
            w[8 * rank + 1] = acc[j][3];
        }
    }
    __syncthreads();
    float* mine = sums + 4 * TR * rank;
    for (u32 i = threadIdx.x; i < TR * rank; i += LORA_GROUP_THREADS) {
        mine[i] = ((sums[i] + sums[TR * rank + i]) + sums[2 * TR * rank + i]) + sums[3 * TR * rank + i];
    }
    cluster_sync();
    if (z == 0) {
        const u32 at = smem_addr(mine);
        for (u32 i = threadIdx.x; i < count * rank; i += LORA_GROUP_THREADS) {
            float total = 0.0f;
            for (u32 c = 0; c < LORA_GROUP_SPLIT; ++c) total += cluster_load(at + i * 4, c);
            const u32 row = order[first + i / rank];
            if (row < t) shrunk[((u64)row * gridDim.y + part) * rank + i % rank] = total;
        }
    }
    cluster_sync();  // no block leaves while block 0 reads its shared memory
}

#define LORA_GROUP_EXPAND_WARPS 4
extern "C" __global__ void __launch_bounds__(LORA_GROUP_EXPAND_WARPS * 32)
    lora_expand_grouped_bf16(const float* __restrict__ shrunk, const u32* __restrict__ groups, LoraParts parts,
                             const float* __restrict__ scales, bf16_t* __restrict__ out, u32 t, u32 slots, u32 rank,
                             u32 width) {
    pdl_enter();
    constexpr u32 TR = LORA_GROUP_ROWS;
    __shared__ u32 tile_rows[TR];
    __shared__ u32 tile_slot;
    __shared__ __align__(16) float tile_shrunk[TR * LORA_GROUP_MAX_RANK];
    const u32 part = blockIdx.z;
    if (threadIdx.x < 32) {
        u32 slot, first, count;
        const bool found = lora_group_tile_warp(groups, t, slots, blockIdx.x, slot, first, count);
        const u32* order = groups + slots + 1;
        if (threadIdx.x == 0) tile_slot = found ? slot : LORA_NO_SLOT;
        if (threadIdx.x < TR) tile_rows[threadIdx.x] = found && threadIdx.x < count ? min(order[first + threadIdx.x], t) : t;
    }
    __syncthreads();
    const u32 slot = tile_slot;
    if (slot == LORA_NO_SLOT) return;  // past the last tile: the whole block leaves
    for (u32 i = threadIdx.x; i < TR * rank; i += LORA_GROUP_EXPAND_WARPS * 32) {
        const u32 row = tile_rows[i / rank];
        tile_shrunk[i] = row < t ? shrunk[((u64)row * gridDim.z + part) * rank + i % rank] : 0.0f;
    }
    __syncthreads();
    const u32 n = lora_pick(parts.n, part), column = lora_pick(parts.column, part);
    const u32 j = (blockIdx.y * LORA_GROUP_EXPAND_WARPS + threadIdx.x / 32) * 64 + 2 * (threadIdx.x % 32);
    if (j >= n) return;
    const bool pair = j + 1 < n, packed = pair && ((width | column) & 1u) == 0;
    const bf16_t* b0 = (const bf16_t*)lora_pick(parts.b, part) + ((u64)slot * n + j) * rank;
    float acc0[TR], acc1[TR];
    // The base values are read before any is written, so their reads all overlap (and the
    // sums below): read and written row by row, each write would wait for its read, the
    // compiler not knowing the rows apart.
    u32 base[TR];
#pragma unroll
    for (u32 i = 0; i < TR; ++i) {
        acc0[i] = acc1[i] = 0.0f;
        base[i] = 0;
        if (tile_rows[i] < t) {
            const bf16_t* o = out + (u64)tile_rows[i] * width + column + j;
            base[i] = packed ? *reinterpret_cast<const u32*>(o) : (u32)o[0] | (pair ? (u32)o[1] << 16 : 0u);
        }
    }
    for (u32 q = 0; q < rank; q += 8) {
        const uint4 w0 = *reinterpret_cast<const uint4*>(b0 + q);
        const uint4 w1 = pair ? *reinterpret_cast<const uint4*>(b0 + rank + q) : w0;
#pragma unroll
        for (u32 i = 0; i < TR; ++i) {
            if (tile_rows[i] < t) {
                const float* s = tile_shrunk + i * rank + q;
                const float4 s0 = *reinterpret_cast<const float4*>(s);
                const float4 s1 = *reinterpret_cast<const float4*>(s + 4);
                acc0[i] = lora_fma8(acc0[i], s0, s1, w0);
                acc1[i] = lora_fma8(acc1[i], s0, s1, w1);
            }
        }
    }
    const float scale = scales[slot];
#pragma unroll
    for (u32 i = 0; i < TR; ++i) {
        if (tile_rows[i] >= t) continue;
        bf16_t* o = out + (u64)tile_rows[i] * width + column + j;
        const u32 v = base[i];
        const float lo = __uint_as_float(v << 16) + acc0[i] * scale, hi = __uint_as_float(v & 0xffff0000u) + acc1[i] * scale;
        if (packed) {
            *reinterpret_cast<u32*>(o) = pack_bf16(lo, hi);
        } else {
            o[0] = f2bf(lo);
            if (pair) o[1] = f2bf(hi);
        }
    }
}

// `n` 16-bit words from `src` to `dst`: one slot of a stack (or a scale) written in stream
// order with the steps around it.
extern "C" __global__ void lora_copy_b16(const unsigned short* src, unsigned short* dst, u64 n) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = src[i];
}
