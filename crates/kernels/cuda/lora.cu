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
// `base + delta · scale` (PEFT's order), rounded once to bf16. Each row is computed by its
// own blocks in a fixed order, so a row's result does not depend on the batch around it.

#define LORA_NO_SLOT 0xffffffffu
#define LORA_MAX_PARTS 3
#define LORA_SHRINK_WARPS 4
#define LORA_EXPAND_THREADS 256

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

// Thread (row, part, column j): `out[row, column + j] += scale · Σ_q shrunk[q] · b[j, q]`.
// The parts' columns are disjoint (checked on the host), so no two threads meet.
extern "C" __global__ void __launch_bounds__(LORA_EXPAND_THREADS)
    lora_expand_bf16(const float* shrunk, const u32* rows, LoraParts parts, const float* scales, bf16_t* out, u32 slots,
                     u32 rank, u32 width) {
    pdl_enter();
    const u32 row = blockIdx.x, part = blockIdx.z;
    const u32 j = blockIdx.y * blockDim.x + threadIdx.x;
    const u32 slot = rows[row];
    const u32 n = lora_pick(parts.n, part);
    if (slot >= slots || j >= n) return;
    const float* s = shrunk + ((u64)row * gridDim.z + part) * rank;
    const bf16_t* bj = (const bf16_t*)lora_pick(parts.b, part) + ((u64)slot * n + j) * rank;
    float acc = 0.0f;
    for (u32 q = 0; q < rank; ++q) acc += s[q] * bf2f(bj[q]);
    bf16_t* o = out + (u64)row * width + lora_pick(parts.column, part) + j;
    *o = f2bf(bf2f(*o) + acc * scales[slot]);
}

// `n` 16-bit words from `src` to `dst`: one slot of a stack (or a scale) written in stream
// order with the steps around it.
extern "C" __global__ void lora_copy_b16(const unsigned short* src, unsigned short* dst, u64 n) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) dst[i] = src[i];
}
