// fp8.cu: products with float8_e4m3fn weights (FP8 checkpoints) under f32 scales.
//
// A weight `w [rows, k]` is e4m3 bytes, k a multiple of 128, with its scales beside it
// (`src/cuda/fp8.rs` lays them out): the scale of row r in the 128-column chunk c is
// `scales[(r / scale_rows) * scale_stride + c * chunk_step]`, which covers one scale a row
// (scale_rows 1, chunk_step 0) and 128 x 128 blocks (scale_rows 128, scale_stride the
// padded chunk count, chunk_step 1). The value of a weight is `e4m3(q) · scale`.
//
// `fp8_gemv_*`: decode batches. `out [m, n] = x · wᵀ` with bf16 activations (the weights
// widened in registers, never the activations narrowed). Every weight is read once a step,
// so the kernel is a stream over the matrix. A block owns 32 rows (16 gate and 16 up rows
// for the SwiGLU form) and up to 8 tokens a column of mma tiles (NT tiles: 8 or 16
// tokens); its 4 warps take turns over the 128-column chunks, each chunk an mma.sync
// m16n8k16 pass with bf16 operands: a thread loads 2 x 16 bytes of each of its rows (g and
// g + 8 of the tile), so a row's 128 bytes are read by 4 lanes in 64-byte runs. Inside the
// mma the chunk's columns are taken in a permuted order (lane q's 32 bytes are its k
// slice), the same for the weights and the activations, so the dot product is unchanged
// while every load stays a whole 16-byte (weights) or 8-byte (activations) vector.
// e4m3 is exact in bf16. A chunk's products are summed in f32, then multiplied by the
// chunk's scale into the row's sum. When the matrix has too few rows to fill the GPU, the
// chunks are split between `splits` blocks (grid z) that write f32 partial sums, added in
// split order by the last of them to finish; the split count
// depends on the shape only, so a row's sum never depends on m, and a token's result is
// the same alone or in any batch.
//
// `fp8_quantize_*`: activations to e4m3 for the tensor-core GEMM of larger batches
// (cuBLASLt, `src/cuda/fp8.rs`): per token and 128-column group (block-scaled weights) or
// per token (per-row weights), scale = amax / 448 (1 for an all-zero group), q = e4m3(x /
// scale) rounded to nearest even and saturated, as transformers' FP8 linear computes them.
//
// Everything here needs sm_90 (e4m3 conversions, bf16x2 multiply); the host keeps e4m3
// weights only on such devices.

#define FP8_THREADS 128
#define FP8_WARPS (FP8_THREADS / 32)
#define FP8_CHUNK 128

__device__ __forceinline__ float fp8_scale(const float* scales, u32 row, u32 chunk, u32 scale_rows, u32 scale_stride,
                                           u32 chunk_step) {
    return scales[(u64)(row / scale_rows) * scale_stride + (u64)chunk * chunk_step];
}

__device__ __forceinline__ float silu_times(float g, float u) {
    g = round_bf(g);
    return round_bf(g / (1.0f + expf(-g))) * round_bf(u);
}

// The block's sums over its chunk range: `acc[t][nt]` is the mma C fragment of row tile t
// (rows `rows[t][0]` = g and `rows[t][1]` = g + 8 of the tile) and token tile nt.
template <int NT>
__device__ __forceinline__ void fp8_gemv_dots(const bf16_t* __restrict__ x, const u8* __restrict__ w,
                                              const float* __restrict__ scales, u32 scale_rows, u32 scale_stride,
                                              u32 chunk_step, const u32 (&rows)[2][2], u32 tok0, u32 m, u32 k,
                                              u32 c_begin, u32 c_end, float (&acc)[2][NT][4]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[t][nt][i] = 0.0f;
    const bf16_t* xt[NT];
    bool live[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const u32 tok = tok0 + nt * 8 + g;
        live[nt] = tok < m;
        xt[nt] = x + (u64)(live[nt] ? tok : 0) * k;
    }
    // A chunk's operands: w[t][h][kh], row h of tile t, bytes kh * 64 + q * 16 .. + 15 of the
    // chunk, and s[t][h], that row's scale in the chunk. Two sets, taken in turns: a warp
    // requests its first two chunks at once (before waiting for the kernel that writes x:
    // weights and scales are constant for the step), and each set is refilled with the
    // chunk after next as soon as its products are done, so two chunks are in flight while
    // one is multiplied and no register copy waits on a load.
    struct Operands {
        uint4 w[2][2][2];
        float s[2][2];
    };
    auto fetch = [&](u32 c, Operands& o) {
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
#pragma unroll
                for (int kh = 0; kh < 2; ++kh)
                    o.w[t][h][kh] = __ldcs(reinterpret_cast<const uint4*>(w + (u64)rows[t][h] * k +
                                                                          (u64)c * FP8_CHUNK + kh * 64 + q * 16));
                o.s[t][h] = fp8_scale(scales, rows[t][h], c, scale_rows, scale_stride, chunk_step);
            }
    };
    auto dots = [&](u32 c, const Operands& o) {
        float part[2][NT][4];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) part[t][nt][i] = 0.0f;
#pragma unroll
        for (int kh = 0; kh < 2; ++kh)
#pragma unroll
            for (int sub = 0; sub < 4; ++sub) {
                const u32 p = c * FP8_CHUNK + kh * 64 + q * 16 + sub * 4;
                uint2 xb[NT];
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    xb[nt] = live[nt] ? __ldg(reinterpret_cast<const uint2*>(xt[nt] + p)) : make_uint2(0, 0);
#pragma unroll
                for (int t = 0; t < 2; ++t) {
                    const uint4 r0 = o.w[t][0][kh], r1 = o.w[t][1][kh];
                    const u32 w0 = sub == 0 ? r0.x : sub == 1 ? r0.y : sub == 2 ? r0.z : r0.w;
                    const u32 w1 = sub == 0 ? r1.x : sub == 1 ? r1.y : sub == 2 ? r1.z : r1.w;
                    u32 a[4];
                    e4m3x4_to_bf16(w0, a[0], a[2]);
                    e4m3x4_to_bf16(w1, a[1], a[3]);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) mma_bf16(part[t][nt], a, xb[nt].x, xb[nt].y);
                }
            }
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                acc[t][nt][0] = fmaf(part[t][nt][0], o.s[t][0], acc[t][nt][0]);
                acc[t][nt][1] = fmaf(part[t][nt][1], o.s[t][0], acc[t][nt][1]);
                acc[t][nt][2] = fmaf(part[t][nt][2], o.s[t][1], acc[t][nt][2]);
                acc[t][nt][3] = fmaf(part[t][nt][3], o.s[t][1], acc[t][nt][3]);
            }
    };
    Operands a_set, b_set;
    u32 c = c_begin + warp;
    if (c < c_end) fetch(c, a_set);
    if (c + FP8_WARPS < c_end) fetch(c + FP8_WARPS, b_set);
    pdl_wait_prev();
    for (; c < c_end; c += 2 * FP8_WARPS) {
        dots(c, a_set);
        if (c + 2 * FP8_WARPS < c_end) fetch(c + 2 * FP8_WARPS, a_set);
        if (c + FP8_WARPS >= c_end) break;
        dots(c + FP8_WARPS, b_set);
        if (c + 3 * FP8_WARPS < c_end) fetch(c + 3 * FP8_WARPS, b_set);
    }
}

// The warps' sums added in warp order: red[r][tok] for the block's 32 rows and NT * 8 tokens.
template <int NT>
__device__ __forceinline__ void fp8_gemv_gather(const float (&acc)[2][NT][4], float (*red)[32][NT * 8]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            red[warp][t * 16 + g][nt * 8 + 2 * q] = acc[t][nt][0];
            red[warp][t * 16 + g][nt * 8 + 2 * q + 1] = acc[t][nt][1];
            red[warp][t * 16 + g + 8][nt * 8 + 2 * q] = acc[t][nt][2];
            red[warp][t * 16 + g + 8][nt * 8 + 2 * q + 1] = acc[t][nt][3];
        }
    __syncthreads();
}

template <int NT>
__device__ __forceinline__ float fp8_gemv_sum(float (*red)[32][NT * 8], u32 r, u32 tok) {
    float v = red[0][r][tok];
#pragma unroll
    for (int i = 1; i < FP8_WARPS; ++i) v += red[i][r][tok];
    return v;
}

__device__ __forceinline__ void fp8_split_range(u32 k, u32 splits, u32& c_begin, u32& c_end) {
    const u32 chunks = k / FP8_CHUNK;
    c_begin = (u32)((u64)blockIdx.z * chunks / splits);
    c_end = (u32)((u64)(blockIdx.z + 1) * chunks / splits);
}

// After a split's partial sums are written: whether this block is the last split of its
// block of columns and tokens to finish (then it adds all of them, in split order, and
// writes the outputs). A counter a block, which the last one sets back to zero for the
// next product;
// kernels of the stream never overlap here (the next waits for this one's end before it
// touches the counters).
__device__ __forceinline__ bool fp8_last_split(u32* counters, u32 splits) {
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* c = counters + blockIdx.y * gridDim.x + blockIdx.x;
        last = atomicAdd(c, 1u) == splits - 1;
        if (last) *c = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// The splits' partial sums of one output, in split order.
__device__ __forceinline__ float fp8_split_sum(const float* p, u64 stride, u32 splits) {
    float v = __ldcg(p);
    for (u32 s = 1; s < splits; ++s) v += __ldcg(p + s * stride);
    return v;
}

// grid (ceil(n / 32), ceil(m / (8 NT)), splits), block FP8_THREADS. With one split it
// writes `out` (bf16, + bias if not null); otherwise f32 partial sums `partial [splits, m, n]`,
// which the last split of each block adds (`counters`: zeroed, one a block of the x-y grid).
template <int NT>
__device__ void fp8_gemv(const bf16_t* __restrict__ x, const u8* __restrict__ w, const float* __restrict__ scales,
                         u32 scale_rows, u32 scale_stride, u32 chunk_step, const bf16_t* __restrict__ bias,
                         bf16_t* __restrict__ out, float* __restrict__ partial, u32* counters, u32 m, u32 n, u32 k,
                         u32 splits) {
    __shared__ float red[FP8_WARPS][32][NT * 8];
    const u32 g = (threadIdx.x & 31) >> 2, col0 = blockIdx.x * 32, tok0 = blockIdx.y * 8 * NT;
    u32 rows[2][2];
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) rows[t][h] = min(col0 + t * 16 + h * 8 + g, n - 1);
    u32 c_begin, c_end;
    fp8_split_range(k, splits, c_begin, c_end);
    float acc[2][NT][4];
    fp8_gemv_dots<NT>(x, w, scales, scale_rows, scale_stride, chunk_step, rows, tok0, m, k, c_begin, c_end, acc);
    fp8_gemv_gather<NT>(acc, red);
    for (u32 i = threadIdx.x; i < 32 * NT * 8; i += FP8_THREADS) {
        const u32 r = i % 32, tok = tok0 + i / 32, col = col0 + r;
        if (tok >= m || col >= n) continue;
        const float v = fp8_gemv_sum<NT>(red, r, i / 32);
        if (splits == 1) {
            out[(u64)tok * n + col] = f2bf(v + (bias ? bf2f(bias[col]) : 0.0f));
        } else {
            partial[((u64)blockIdx.z * m + tok) * n + col] = v;
        }
    }
    if (splits == 1 || !fp8_last_split(counters, splits)) return;
    for (u32 i = threadIdx.x; i < 32 * NT * 8; i += FP8_THREADS) {
        const u32 tok = tok0 + i / 32, col = col0 + i % 32;
        if (tok >= m || col >= n) continue;
        const float v = fp8_split_sum(partial + (u64)tok * n + col, (u64)m * n, splits);
        out[(u64)tok * n + col] = f2bf(v + (bias ? bf2f(bias[col]) : 0.0f));
    }
}

// grid (ceil(half / 16), ceil(m / (8 NT)), splits); w is [2 half, k] (gate rows, then up).
// With one split it writes `out [m, half]`; otherwise `partial [splits, m, 2 half]` (gate
// sums, then up sums), which the last split of each block adds.
template <int NT>
__device__ void fp8_gemv_silu(const bf16_t* __restrict__ x, const u8* __restrict__ w,
                              const float* __restrict__ scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,
                              bf16_t* __restrict__ out, float* __restrict__ partial, u32* counters, u32 m, u32 half,
                              u32 k, u32 splits) {
    __shared__ float red[FP8_WARPS][32][NT * 8];
    const u32 g = (threadIdx.x & 31) >> 2, col0 = blockIdx.x * 16, tok0 = blockIdx.y * 8 * NT;
    u32 rows[2][2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 j = min(col0 + h * 8 + g, half - 1);
        rows[0][h] = j;
        rows[1][h] = half + j;
    }
    u32 c_begin, c_end;
    fp8_split_range(k, splits, c_begin, c_end);
    float acc[2][NT][4];
    fp8_gemv_dots<NT>(x, w, scales, scale_rows, scale_stride, chunk_step, rows, tok0, m, k, c_begin, c_end, acc);
    fp8_gemv_gather<NT>(acc, red);
    for (u32 i = threadIdx.x; i < 16 * NT * 8; i += FP8_THREADS) {
        const u32 r = i % 16, tok = tok0 + i / 16, col = col0 + r;
        if (tok >= m || col >= half) continue;
        const float gate = fp8_gemv_sum<NT>(red, r, i / 16), up = fp8_gemv_sum<NT>(red, 16 + r, i / 16);
        if (splits == 1) {
            out[(u64)tok * half + col] = f2bf(silu_times(gate, up));
        } else {
            float* p = partial + ((u64)blockIdx.z * m + tok) * 2 * half;
            p[col] = gate;
            p[half + col] = up;
        }
    }
    if (splits == 1 || !fp8_last_split(counters, splits)) return;
    for (u32 i = threadIdx.x; i < 16 * NT * 8; i += FP8_THREADS) {
        const u32 tok = tok0 + i / 16, col = col0 + i % 16;
        if (tok >= m || col >= half) continue;
        const float* p = partial + (u64)tok * 2 * half + col;
        const u64 stride = (u64)m * 2 * half;
        out[(u64)tok * half + col] = f2bf(silu_times(fp8_split_sum(p, stride, splits), fp8_split_sum(p + half, stride, splits)));
    }
}

#define MET_FP8_GEMV(NT)                                                                                       \
    extern "C" __global__ void __launch_bounds__(FP8_THREADS) fp8_gemv_n##NT(                                  \
        const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,   \
        const bf16_t* bias, bf16_t* out, float* partial, u32* counters, u32 m, u32 n, u32 k, u32 splits) {      \
        pdl_allow_next();                                                                                      \
        fp8_gemv<NT>(x, w, scales, scale_rows, scale_stride, chunk_step, bias, out, partial, counters, m, n, k, \
                     splits);                                                                                  \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FP8_THREADS) fp8_gemv_silu_n##NT(                             \
        const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,   \
        bf16_t* out, float* partial, u32* counters, u32 m, u32 half, u32 k, u32 splits) {                      \
        pdl_allow_next();                                                                                      \
        fp8_gemv_silu<NT>(x, w, scales, scale_rows, scale_stride, chunk_step, out, partial, counters, m, half, \
                          k, splits);                                                                          \
    }

MET_FP8_GEMV(1)
MET_FP8_GEMV(2)

// `fp8_gemv_small_*`: one-row decode steps outside `--batch-invariant`, on gemv.cu's
// stream (`gemv_dots`) with e4m3 weights (`GemvE4m3`): a block owns 2 rows (8 KiB of
// weights at k = 4,096), its 128 threads split each row's k in 16-byte vectors of 16
// weights, every thread keeps up to 8 loads in flight, and the many short blocks keep every
// SM streaming to the end, where the tensor-core GEMV above (32-row blocks over split
// chunks) waits on its loads: 48 to 66 % of the copy bandwidth at one row, against 42 to 73 %.
// From two rows on the tensor-core GEMV is faster (at four rows 1.5 to 2.2x this stream,
// `bench/results/device-2026-12-05b/`), so it takes them. A vector lies in one 128-column
// scale chunk: its 16 weights widen exactly (to f16, then f32), their products with x add in f32, and
// the sum times the chunk's scale adds into the thread's sum; the threads' sums then add in
// a fixed tree (other bits than the tensor-core GEMV's). The SwiGLU form's block owns gate
// row j and up row half + j.

// 8 f16 weights (pairs, low half first) dotted with 8 bf16 of `x`, added to `acc` in
// gemv.cu's `dot8` order.
__device__ __forceinline__ float dot8_f16(uint4 w, uint4 x, float acc) {
    const u32 ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        float lo, hi;
        f16x2_to_f32(ws[i], lo, hi);
        acc = fmaf(lo, __uint_as_float(xs[i] << 16), acc);
        acc = fmaf(hi, __uint_as_float(xs[i] & 0xffff0000u), acc);
    }
    return acc;
}

// e4m3 weights for gemv.cu's `gemv_dots`: 16 a vector, widened exactly to f16 pairs (one
// conversion a pair) and from those to f32 as they multiply, the vector's f32 sum times
// its 128-column chunk's scale. The products and their order are those of widening to
// bf16 first, in fewer instructions a weight: at one byte a weight, this stream is bound
// by the instructions it issues, not by its loads.
template <int R>
struct GemvE4m3 {
    static constexpr u32 PER = 16;
    struct Operands {
        uint4 lo, hi;  // f16 pairs, weight 0 in the low half of lo.x
        float scale;
    };
    struct XVec {
        uint4 lo, hi;
    };
    const u8* w;
    const float* scales;
    u32 scale_rows, scale_stride, chunk_step;
    const float* row_scales[R];  // row i's scales, chunk 0
    __device__ const uint4* bind(int i, u32 row, u32 k) {
        row_scales[i] = scales + (u64)(row / scale_rows) * scale_stride;
        return reinterpret_cast<const uint4*>(w + (u64)row * k);
    }
    __device__ Operands prepare(int i, uint4 v, u32 vec) const {
        const float scale = __ldg(row_scales[i] + vec / (FP8_CHUNK / PER) * chunk_step);
        Operands o;
        e4m3x4_to_f16(v.x, o.lo.x, o.lo.y);
        e4m3x4_to_f16(v.y, o.lo.z, o.lo.w);
        e4m3x4_to_f16(v.z, o.hi.x, o.hi.y);
        e4m3x4_to_f16(v.w, o.hi.z, o.hi.w);
        o.scale = scale;
        return o;
    }
    __device__ static XVec load_x(const uint4* x_row, u32 v) {
        return XVec{__ldg(x_row + 2 * v), __ldg(x_row + 2 * v + 1)};
    }
    __device__ static float dot(const Operands& w, const XVec& x, float acc) {
        return fmaf(w.scale, dot8_f16(w.hi, x.hi, dot8_f16(w.lo, x.lo, 0.0f)), acc);
    }
};

// grid (ceil(n / R)), block FP8_THREADS. `bias` may be null.
template <int M, int R>
__device__ void fp8_gemv_small(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride,
                               u32 chunk_step, const bf16_t* bias, bf16_t* out, u32 m, u32 n, u32 k) {
    const u32 first = blockIdx.x * R;
    u32 rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) rows[r] = min(first + r, n - 1);
    float acc[R][M];
    GemvE4m3<R> f{w, scales, scale_rows, scale_stride, chunk_step, {}};
    gemv_dots<M, R>(x, f, rows, m, k, acc);
    // Thread r * M + i stores row r of x row i.
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (first + r < n && i < (int)m && threadIdx.x == (u32)(r * M + i)) {
                out[(u64)i * n + first + r] = f2bf(acc[r][i] + (bias ? bf2f(bias[first + r]) : 0.0f));
            }
        }
}

// grid (ceil(half / G)), block FP8_THREADS; w is [2 half, k] (gate rows, then up). The block
// owns gate rows G j .. G j + G - 1 and the up rows of the same outputs.
template <int M, int G>
__device__ void fp8_gemv_small_silu(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows,
                                    u32 scale_stride, u32 chunk_step, bf16_t* out, u32 m, u32 half, u32 k) {
    const u32 first = blockIdx.x * G;
    u32 rows[2 * G];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        rows[g] = min(first + g, half - 1);
        rows[G + g] = half + rows[g];
    }
    float acc[2 * G][M];
    GemvE4m3<2 * G> f{w, scales, scale_rows, scale_stride, chunk_step, {}};
    gemv_dots<M, 2 * G>(x, f, rows, m, k, acc);
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < M; ++i) {
            if (first + g < half && i < (int)m && threadIdx.x == (u32)(g * M + i)) {
                out[(u64)i * half + first + g] = f2bf(silu_times(acc[g][i], acc[G + g][i]));
            }
        }
}

// `fp8_gemv_small_m1`: 2 rows a block, 8 KiB of weights at k = 4,096.
#define MET_FP8_GEMV_SMALL(M, R, MIN_BLOCKS, NAME, SILU)                                                       \
    extern "C" __global__ void __launch_bounds__(FP8_THREADS, MIN_BLOCKS) NAME(                         \
        const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,   \
        const bf16_t* bias, bf16_t* out, u32 m, u32 n, u32 k) {                                                \
        pdl_allow_next();                                                                                      \
        fp8_gemv_small<M, R>(x, w, scales, scale_rows, scale_stride, chunk_step, bias, out, m, n, k);          \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(FP8_THREADS, MIN_BLOCKS) SILU(                         \
        const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,   \
        bf16_t* out, u32 m, u32 half, u32 k) {                                                                 \
        pdl_allow_next();                                                                                      \
        fp8_gemv_small_silu<M, R / 2>(x, w, scales, scale_rows, scale_stride, chunk_step, out, m, half, k);    \
    }

MET_FP8_GEMV_SMALL(1, 2, 8, fp8_gemv_small_m1, fp8_gemv_small_silu_m1)

// The MoE decode GEMVs of moe.cu over e4m3 expert stacks (`GemvE4m3`: the stack's rows
// under their scales, a row's scales at its row of the whole stack).
extern "C" __global__ void __launch_bounds__(32 * MOE_GEMV_WARPS)
    moe_gemv_silu_e4m3(const bf16_t* x, const u32* experts, const u8* w, const float* scales, u32 scale_rows,
                       u32 scale_stride, u32 chunk_step, bf16_t* act, u32 k, u32 e, u32 half, u32 kd) {
    pdl_enter();
    moe_gemv_silu<4>(GemvE4m3<2>{w, scales, scale_rows, scale_stride, chunk_step, {}}, x, experts, act, k, e, half,
                     kd);
}

extern "C" __global__ void __launch_bounds__(32 * MOE_GEMV_WARPS)
    moe_gemv_e4m3(const bf16_t* act, const u32* experts, const u8* w, const float* scales, u32 scale_rows,
                  u32 scale_stride, u32 chunk_step, bf16_t* y, u32 e, u32 n, u32 kd) {
    pdl_enter();
    moe_gemv_down<2>(GemvE4m3<MOE_GEMV_DOWN_ROWS>{w, scales, scale_rows, scale_stride, chunk_step, {}}, act, experts,
                     y, e, n, kd);
}

// `fp8_gemv_tc1_*`: one-row decode steps on the tensor cores, under `MET_FP8_ONE=tc`
// (for measuring against the streaming kernel above). The weights are the mma's B operand,
// so a block owns 8 rows (the SwiGLU form 4 gate and 4 up rows) and a matrix is hundreds of
// blocks with no split sums; its 8 warps take turns over the 128-column chunks, 4 chunks in
// flight each, so a k = 4,096 row is requested whole as the block starts. Lane (g, q)
// streams 16 bytes of row g of each 64-column half of a chunk, which go through the mma in
// the permuted order the GEMV above uses (the same for the activations); the two halves'
// 4 mma each add into separate sums (two short dependency chains), joined per chunk and
// times the chunk's scales. The warps' sums add in warp order. (A first form with 4 warps
// and one chain a chunk ran at 36-62 % of the copy at one row: its warps waited on the
// tensor cores, `bench/results/device-2026-12-05b/`.)
#define FP8_TC1_WARPS 8
#define FP8_TC1_DEPTH 4

__device__ __forceinline__ void fp8_tc1_dots(const bf16_t* __restrict__ x, const u8* __restrict__ w,
                                             const float* __restrict__ scales, u32 scale_rows, u32 scale_stride,
                                             u32 chunk_step, u32 wrow, u32 srow0, u32 srow1, u32 m, u32 k,
                                             float (&acc)[2]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const u32 chunks = k / FP8_CHUNK;
    acc[0] = acc[1] = 0.0f;
    const bool live = g < m;
    const bf16_t* xr = x + (u64)(live ? g : 0) * k + q * 16;
    const u8* wr = w + (u64)wrow * k + q * 16;
    const float* s0 = scales + (u64)(srow0 / scale_rows) * scale_stride;
    const float* s1 = scales + (u64)(srow1 / scale_rows) * scale_stride;
    struct Set {
        uint4 w[2];
        float s[2];
    };
    auto fetch = [&](u32 c, Set& o) {
        const uint4* v = reinterpret_cast<const uint4*>(wr + (u64)c * FP8_CHUNK);
        o.w[0] = __ldcs(v);
        o.w[1] = __ldcs(v + 4);
        o.s[0] = __ldg(s0 + (u64)c * chunk_step);
        o.s[1] = __ldg(s1 + (u64)c * chunk_step);
    };
    auto dots = [&](u32 c, const Set& o) {
        uint2 xs[2][4];
#pragma unroll
        for (int kh = 0; kh < 2; ++kh)
#pragma unroll
            for (int sub = 0; sub < 4; ++sub)
                xs[kh][sub] = live ? __ldg(reinterpret_cast<const uint2*>(xr + c * FP8_CHUNK + kh * 64 + sub * 4))
                                   : make_uint2(0, 0);
        float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int sub = 0; sub < 4; ++sub)
#pragma unroll
            for (int kh = 0; kh < 2; ++kh) {
                const uint4 r = o.w[kh];
                const u32 word = sub == 0 ? r.x : sub == 1 ? r.y : sub == 2 ? r.z : r.w;
                u32 lo, hi;
                e4m3x4_to_bf16(word, lo, hi);
                const u32 a[4] = {xs[kh][sub].x, 0u, xs[kh][sub].y, 0u};
                mma_bf16(part[kh], a, lo, hi);
            }
        acc[0] = fmaf(part[0][0] + part[1][0], o.s[0], acc[0]);
        acc[1] = fmaf(part[0][1] + part[1][1], o.s[1], acc[1]);
    };
    Set sets[FP8_TC1_DEPTH];
#pragma unroll
    for (int i = 0; i < FP8_TC1_DEPTH; ++i) {
        const u32 c = warp + i * FP8_TC1_WARPS;
        if (c < chunks) fetch(c, sets[i]);
    }
    pdl_wait_prev();
    for (u32 base = warp; base < chunks; base += FP8_TC1_DEPTH * FP8_TC1_WARPS) {
#pragma unroll
        for (int i = 0; i < FP8_TC1_DEPTH; ++i) {
            const u32 c = base + i * FP8_TC1_WARPS;
            if (c < chunks) {
                dots(c, sets[i]);
                if (c + FP8_TC1_DEPTH * FP8_TC1_WARPS < chunks) fetch(c + FP8_TC1_DEPTH * FP8_TC1_WARPS, sets[i]);
            }
        }
    }
}

// The warps' sums of token 0's 8 columns (lanes 0-3 hold them), in warp order: red[warp][col].
__device__ __forceinline__ void fp8_tc1_gather(const float (&acc)[2], float (*red)[8]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane < 4) {
        red[warp][2 * lane] = acc[0];
        red[warp][2 * lane + 1] = acc[1];
    }
    __syncthreads();
}

__device__ __forceinline__ float fp8_tc1_sum(float (*red)[8], u32 col) {
    float v = red[0][col];
#pragma unroll
    for (int i = 1; i < FP8_TC1_WARPS; ++i) v += red[i][col];
    return v;
}

// grid (ceil(n / 8)), block 32 FP8_TC1_WARPS; one token. `bias` may be null.
extern "C" __global__ void __launch_bounds__(32 * FP8_TC1_WARPS, 3)
    fp8_gemv_tc1(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,
                 const bf16_t* bias, bf16_t* out, u32 m, u32 n, u32 k) {
    pdl_allow_next();
    __shared__ float red[FP8_TC1_WARPS][8];
    const u32 lane = threadIdx.x & 31, first = blockIdx.x * 8;
    const u32 wrow = min(first + (lane >> 2), n - 1);
    const u32 s0 = min(first + 2 * (lane & 3), n - 1), s1 = min(first + 2 * (lane & 3) + 1, n - 1);
    float acc[2];
    fp8_tc1_dots(x, w, scales, scale_rows, scale_stride, chunk_step, wrow, s0, s1, 1, k, acc);
    fp8_tc1_gather(acc, red);
    if (threadIdx.x < 8 && first + threadIdx.x < n) {
        const u32 col = first + threadIdx.x;
        out[col] = f2bf(fp8_tc1_sum(red, threadIdx.x) + (bias ? bf2f(bias[col]) : 0.0f));
    }
}

// grid (ceil(half / 4)); w is [2 half, k] (gate rows, then up). Columns 0-3 of the block are
// gate rows 4 j .. 4 j + 3, columns 4-7 the up rows of the same outputs.
extern "C" __global__ void __launch_bounds__(32 * FP8_TC1_WARPS, 3)
    fp8_gemv_tc1_silu(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride,
                      u32 chunk_step, bf16_t* out, u32 m, u32 half, u32 k) {
    pdl_allow_next();
    __shared__ float red[FP8_TC1_WARPS][8];
    const u32 lane = threadIdx.x & 31, first = blockIdx.x * 4;
    auto row_of = [&](u32 col) { return min(first + col % 4, half - 1) + (col < 4 ? 0 : half); };
    float acc[2];
    fp8_tc1_dots(x, w, scales, scale_rows, scale_stride, chunk_step, row_of(lane >> 2), row_of(2 * (lane & 3)),
                 row_of(2 * (lane & 3) + 1), 1, k, acc);
    fp8_tc1_gather(acc, red);
    if (threadIdx.x < 4 && first + threadIdx.x < half) {
        out[first + threadIdx.x] = f2bf(silu_times(fp8_tc1_sum(red, threadIdx.x), fp8_tc1_sum(red, 4 + threadIdx.x)));
    }
}

// `fp8_gemv_h1_*`: one-row decode steps on f16 tensor cores, under `MET_FP8_ONE=f16`. The
// streaming GEMV above spends about two instructions a weight byte widening e4m3 to f32 and
// multiplying in f32; this one hands the mma e4m3 widened to f16 (one conversion a pair,
// exact) and the activations as f16, so a byte costs under one instruction. The weights are
// the mma's A operand: a block owns one tile of 16 rows (the SwiGLU form 8 gate rows and the
// 8 up rows of the same outputs), its 8 warps take turns over the 128-column chunks with 4
// chunks in flight each, so a k = 4,096 tile is requested whole before the block waits for
// the kernel that writes x. Lane (g, q) streams 16 bytes of rows g and g + 8 of each
// 64-column half of a chunk, taken by the mma in the permuted order the GEMV above uses,
// the same for the activations, which every lane reads from shared memory: token 0 in
// every column of B, so each column of C holds the same sums.
//
// Activations to f16: bf16 has 8 significant bits, f16 11, so a bf16 value is exact in f16
// within f16's range. The block stages x in shared memory times 2^-e, e >= 0 the least
// that puts its largest magnitude under 2^15 (every block finds the same e), and the sums
// are multiplied back by 2^e; only values under 2^-14 of the scaled range lose bits (f16
// subnormals). A chunk's products add in f32 and, times the chunk's scales, into the
// row's sum; the warps' sums add in warp order. The product depends on the matrix and x
// only. k * 2 bytes of shared memory: the host takes this form for k <= 16,384 only.
// Measured on the H200 (`bench/results/device-2026-12-05d/`): alone, 17 % faster than the
// stream on gate_up and 8 % on o, 5 % slower on qkv and down; in the 8B decode step 0.32 ms
// slower. Not the default. Why is not profiled: a form that staged x per warp, with no
// block barrier, was slower still in the step (`bench/results/device-2026-12-05e/`), so the
// barrier is not the cost.
#define FP8_H1_WARPS 8
#define FP8_H1_DEPTH 4
#define FP8_H1_MAX_K 16384

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// x [k] (bf16) into `xs` as f16 times 2^-e (above); returns 2^e. Ends with a barrier.
__device__ __forceinline__ float fp8_h1_stage(const bf16_t* __restrict__ x, u32 k, uint4* xs) {
    __shared__ float red[FP8_H1_WARPS];
    const u32 vecs = k / 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    float amax = 0.0f;
    for (u32 v = threadIdx.x; v < vecs; v += 32 * FP8_H1_WARPS) {
        const uint4 u = __ldg(xv + v);
        xs[v] = u;
        float f[8];
        unpack8(u, f);
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
    amax = warp_max(amax);
    if (lane == 0) red[warp] = amax;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < FP8_H1_WARPS; ++i) amax = fmaxf(amax, red[i]);
    // amax's exponent (255 for inf: the sums are not finite then either way).
    const int e = max(0, (int)((__float_as_uint(amax) >> 23) & 0xffu) - 127 - 14);
    const float down = __uint_as_float((u32)(127 - e) << 23), up = __uint_as_float((u32)(127 + e) << 23);
    for (u32 v = threadIdx.x; v < vecs; v += 32 * FP8_H1_WARPS) {
        float f[8];
        unpack8(xs[v], f);
        u32 h[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(h[i]) : "f"(f[2 * i + 1] * down), "f"(f[2 * i] * down));
        xs[v] = make_uint4(h[0], h[1], h[2], h[3]);
    }
    __syncthreads();
    return up;
}

// The block's sums of rows `row0` (g) and `row1` (g + 8) of this lane's tile, times 2^e,
// gathered in `red[16]` (tile row order, warps added in order); ends with a barrier.
__device__ __forceinline__ void fp8_h1_dots(const bf16_t* __restrict__ x, const u8* __restrict__ w,
                                             const float* __restrict__ scales, u32 scale_rows, u32 scale_stride,
                                             u32 chunk_step, u32 row0, u32 row1, u32 k, float* red) {
    extern __shared__ uint4 fp8_h1_x[];
    __shared__ float sums[FP8_H1_WARPS][16];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const u32 chunks = k / FP8_CHUNK;
    const u8* wr[2] = {w + (u64)row0 * k + q * 16, w + (u64)row1 * k + q * 16};
    const float* sr[2] = {scales + (u64)(row0 / scale_rows) * scale_stride,
                          scales + (u64)(row1 / scale_rows) * scale_stride};
    struct Set {
        uint4 w[2][2];  // [row g, g + 8][64-column half]
        float s[2];
    };
    auto fetch = [&](u32 c, Set& o) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const uint4* v = reinterpret_cast<const uint4*>(wr[h] + (u64)c * FP8_CHUNK);
            o.w[h][0] = __ldcs(v);
            o.w[h][1] = __ldcs(v + 4);
            o.s[h] = __ldg(sr[h] + (u64)c * chunk_step);
        }
    };
    float acc[2] = {0.0f, 0.0f};
    auto dots = [&](u32 c, const Set& o) {
        float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int kh = 0; kh < 2; ++kh) {
            const uint4* xq = fp8_h1_x + (c * FP8_CHUNK + kh * 64 + q * 16) / 8;
            const uint4 x0 = xq[0], x1 = xq[1];
            const u32 xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
            for (int sub = 0; sub < 4; ++sub) {
                const uint4 r0 = o.w[0][kh], r1 = o.w[1][kh];
                const u32 w0 = sub == 0 ? r0.x : sub == 1 ? r0.y : sub == 2 ? r0.z : r0.w;
                const u32 w1 = sub == 0 ? r1.x : sub == 1 ? r1.y : sub == 2 ? r1.z : r1.w;
                u32 a[4];
                e4m3x4_to_f16(w0, a[0], a[2]);
                e4m3x4_to_f16(w1, a[1], a[3]);
                mma_f16(part, a, xs[2 * sub], xs[2 * sub + 1]);
            }
        }
        acc[0] = fmaf(part[0], o.s[0], acc[0]);
        acc[1] = fmaf(part[2], o.s[1], acc[1]);
    };
    Set sets[FP8_H1_DEPTH];
#pragma unroll
    for (int i = 0; i < FP8_H1_DEPTH; ++i) {
        const u32 c = warp + i * FP8_H1_WARPS;
        if (c < chunks) fetch(c, sets[i]);
    }
    pdl_wait_prev();
    const float up = fp8_h1_stage(x, k, fp8_h1_x);
    for (u32 base = warp; base < chunks; base += FP8_H1_DEPTH * FP8_H1_WARPS) {
#pragma unroll
        for (int i = 0; i < FP8_H1_DEPTH; ++i) {
            const u32 c = base + i * FP8_H1_WARPS;
            if (c < chunks) {
                dots(c, sets[i]);
                if (c + FP8_H1_DEPTH * FP8_H1_WARPS < chunks) fetch(c + FP8_H1_DEPTH * FP8_H1_WARPS, sets[i]);
            }
        }
    }
    // Column 0 of C: lane (g, 0) holds rows g (c0) and g + 8 (c2).
    if (q == 0) {
        sums[warp][g] = acc[0];
        sums[warp][g + 8] = acc[1];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = sums[0][threadIdx.x];
#pragma unroll
        for (int i = 1; i < FP8_H1_WARPS; ++i) v += sums[i][threadIdx.x];
        red[threadIdx.x] = v * up;
    }
    __syncthreads();
}

// grid (n / 16), block 32 FP8_H1_WARPS, k * 2 bytes of dynamic shared memory; one token.
// `bias` may be null.
extern "C" __global__ void __launch_bounds__(32 * FP8_H1_WARPS, 2)
    fp8_gemv_h1(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride, u32 chunk_step,
                const bf16_t* bias, bf16_t* out, u32 n, u32 k) {
    pdl_allow_next();
    __shared__ float red[16];
    const u32 first = blockIdx.x * 16, g = (threadIdx.x & 31) >> 2;
    fp8_h1_dots(x, w, scales, scale_rows, scale_stride, chunk_step, first + g, first + g + 8, k, red);
    if (threadIdx.x < 16 && first + threadIdx.x < n) {
        const u32 col = first + threadIdx.x;
        out[col] = f2bf(red[threadIdx.x] + (bias ? bf2f(bias[col]) : 0.0f));
    }
}

// grid (half / 8); w is [2 half, k] (gate rows, then up). Tile rows 0-7 are gate rows
// 8 j .. 8 j + 7, rows 8-15 the up rows of the same outputs.
extern "C" __global__ void __launch_bounds__(32 * FP8_H1_WARPS, 2)
    fp8_gemv_h1_silu(const bf16_t* x, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride,
                     u32 chunk_step, bf16_t* out, u32 half, u32 k) {
    pdl_allow_next();
    __shared__ float red[16];
    const u32 first = blockIdx.x * 8, g = (threadIdx.x & 31) >> 2;
    fp8_h1_dots(x, w, scales, scale_rows, scale_stride, chunk_step, first + g, half + first + g, k, red);
    if (threadIdx.x < 8 && first + threadIdx.x < half) {
        out[first + threadIdx.x] = f2bf(silu_times(red[threadIdx.x], red[8 + threadIdx.x]));
    }
}

// Activations per token and 128-column group: grid (ceil(m * k / 128 / 4)), block 128, a
// warp a group. Scales land token-major within a group (`scales[tok + group * m]`), the
// layout cuBLASLt reads for its 128-element vector scales. Tokens `rows` to m - 1 (the
// padding that makes m a multiple of 8 for cuBLASLt) are zeros under scale 1.
extern "C" __global__ void fp8_quantize_vec128(const bf16_t* x, u8* q, float* scales, u32 rows, u32 m, u32 k) {
    pdl_enter();
    const u32 groups = k / FP8_CHUNK, lane = threadIdx.x & 31;
    const u64 item = (u64)blockIdx.x * 4 + (threadIdx.x >> 5);
    if (item >= (u64)m * groups) return;
    const u64 tok = item / groups, group = item % groups, at = tok * k + group * FP8_CHUNK + lane * 4;
    const uint2 v = tok < rows ? *reinterpret_cast<const uint2*>(x + at) : make_uint2(0, 0);
    const float f[4] = {__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u), __uint_as_float(v.y << 16),
                        __uint_as_float(v.y & 0xffff0000u)};
    float amax = fmaxf(fmaxf(fabsf(f[0]), fabsf(f[1])), fmaxf(fabsf(f[2]), fabsf(f[3])));
    amax = warp_max(amax);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    const u32 packed = e4m3x2_from(f[0] / scale, f[1] / scale) | (e4m3x2_from(f[2] / scale, f[3] / scale) << 16);
    *reinterpret_cast<u32*>(q + at) = packed;
    if (lane == 0) scales[tok + group * m] = scale;
}

// Activations per token: grid (m), block 256; rows past `rows` (padding) are zeros under
// scale 1.
extern "C" __global__ void fp8_quantize_row(const bf16_t* x, u8* q, float* scales, u32 rows, u32 k) {
    __shared__ float scratch[32];
    pdl_enter();
    const u64 row = blockIdx.x;
    const u32 vecs = k / 8;
    if (row >= rows) {
        for (u32 v = threadIdx.x; v < vecs; v += blockDim.x) *reinterpret_cast<uint2*>(q + row * k + (u64)v * 8) = make_uint2(0, 0);
        if (threadIdx.x == 0) scales[row] = 1.0f;
        return;
    }
    const uint4* src = reinterpret_cast<const uint4*>(x + row * k);
    float amax = 0.0f;
    for (u32 v = threadIdx.x; v < vecs; v += blockDim.x) {
        float f[8];
        unpack8(src[v], f);
#pragma unroll
        for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(f[i]));
    }
    amax = block_max(amax, scratch);
    const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
    for (u32 v = threadIdx.x; v < vecs; v += blockDim.x) {
        float f[8];
        unpack8(src[v], f);
        uint2 packed;
        packed.x = e4m3x2_from(f[0] / scale, f[1] / scale) | (e4m3x2_from(f[2] / scale, f[3] / scale) << 16);
        packed.y = e4m3x2_from(f[4] / scale, f[5] / scale) | (e4m3x2_from(f[6] / scale, f[7] / scale) << 16);
        *reinterpret_cast<uint2*>(q + row * k + (u64)v * 8) = packed;
    }
    if (threadIdx.x == 0) scales[row] = scale;
}

// Weight rows widened to bf16 (`e4m3(q) · scale` in f32, rounded once): rows `ids[i]` (or
// row i when `ids` is null) into `out [count, k]`; an id past the `rows` of `w` (a failed
// draw's `NO_TOKEN`) gives zeros. grid (count, ceil(k / 4 / 128)), block 128.
extern "C" __global__ void fp8_rows_bf16(const u32* ids, const u8* w, const float* scales, u32 scale_rows,
                                         u32 scale_stride, u32 chunk_step, bf16_t* out, u32 rows, u32 k) {
    pdl_enter();
    const u32 col = (blockIdx.y * blockDim.x + threadIdx.x) * 4;
    if (col >= k) return;
    const u64 i = blockIdx.x, row = ids ? ids[i] : i;
    if (row >= rows) {
        *reinterpret_cast<uint2*>(out + i * k + col) = make_uint2(0, 0);
        return;
    }
    const float s = fp8_scale(scales, (u32)row, col / FP8_CHUNK, scale_rows, scale_stride, chunk_step);
    u32 lo, hi;
    e4m3x4_to_bf16(*reinterpret_cast<const u32*>(w + row * k + col), lo, hi);
    const u32 pairs[2] = {lo, hi};
    u32 res[2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
        res[j] = pack_bf16(__uint_as_float(pairs[j] << 16) * s, __uint_as_float(pairs[j] & 0xffff0000u) * s);
    *reinterpret_cast<uint2*>(out + i * k + col) = make_uint2(res[0], res[1]);
}

// --- the grouped GEMM of MoE layers with e4m3 experts --------------------------------------
//
// `moe_gemm` of `moe.cu` with expert weights `w [e, n, kd]` in e4m3 (kd a multiple of 128),
// their scales laid out over the stacked rows (row x·n + r of expert x) as above. A tile is
// one 128-column chunk deep (`MOE_BK8`), so it moves the bytes of bf16's 64-column tile in
// half the steps and carries one scale a weight row: the weights go into the mma unscaled
// (e4m3 is exact in bf16), each chunk's sums are taken in f32 and multiplied by their row's
// scale into the accumulators, as the GEMV does. A row's sums depend on kd alone (chunks in
// order, each in the same k16 steps), never on the rows tiled with it.
//
// The weight tile is read with ldmatrix as if its bytes were bf16 pairs: lane (g, q) gets
// bytes 4q .. 4q + 3 of row g in a 16-column step, which become its two B registers. The
// step's columns are thereby taken in a permuted order inside the mma, so the activations
// are read in the same order: the 4 bf16 at columns 4q .. 4q + 3 of rows g and g + 8, as
// two 8-byte loads (`ld_shared_u64`), rather than ldmatrix's pairs.

#define MOE_BK8 128

// Byte offset of 16-byte chunk `c` of row `r` in the activation tile (rows of MOE_BK8 bf16,
// 16 chunks): the chunks XORed with twice the row, so the 8-byte reads of 4 rows x 2 chunks
// by a half warp hit distinct banks, and a row's 16-byte writes stay a permutation.
__device__ __forceinline__ u32 moe8_a_off(u32 r, u32 c) { return r * (MOE_BK8 * 2) + ((c ^ ((r & 7) << 1)) << 4); }

__device__ __forceinline__ void cp_async4(u32 dst, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ uint2 ld_shared_u64(u32 addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}

template <int BM, int STAGES>
__device__ void moe_gemm_e4m3(const bf16_t* a, const u32* a_rows, const u8* w, const float* scales, u32 scale_rows,
                              u32 scale_stride, u32 chunk_step, bf16_t* out, const u32* offsets, const u32* tiles,
                              u32 e, u32 n, u32 kd) {
    constexpr int WM = BM / 16, WN = 4 / WM, NT = MOE_BN / WN / 8;  // n8 tiles per warp
    static_assert(NT % 2 == 0, "a warp takes its n8 tiles in pairs");
    constexpr u32 CH = MOE_BK8 / 8;  // 16-byte chunks of an activation row
    constexpr u32 A_BYTES = BM * MOE_BK8 * 2, W_BYTES = MOE_BN * MOE_BK8, STAGE = A_BYTES + W_BYTES + MOE_BN * 4;
    extern __shared__ __align__(128) unsigned char moe_smem[];
    const u32 base = smem_addr(moe_smem);
    auto as = [&](u32 st) { return base + st * STAGE; };
    auto bs = [&](u32 st) { return base + st * STAGE + A_BYTES; };
    auto ss = [&](u32 st) { return st * STAGE + A_BYTES + W_BYTES; };  // byte offset of the row scales

    u32 x, r0, rows;
    if (!moe_tile<BM>(blockIdx.y, offsets, tiles, e, x, r0, rows)) return;
    const u32 n0 = blockIdx.x * MOE_BN;
    const u8* wx = w + (u64)x * n * kd;
    const u32 k_tiles = kd / MOE_BK8;

    auto load = [&](u32 kt, u32 st) {
        const u32 k0 = kt * MOE_BK8;
        for (u32 c = threadIdx.x; c < BM * CH; c += MOE_THREADS) {
            const u32 r = c / CH, ch = c % CH;
            const bool valid = r < rows;
            const u32 row = r0 + (valid ? r : 0);
            const bf16_t* src = a + (u64)(a_rows ? a_rows[row] : row) * kd + k0 + ch * 8;
            cp_async16(as(st) + moe8_a_off(r, ch), src, valid);
        }
        for (u32 c = threadIdx.x; c < MOE_BN * (MOE_BK8 / 16); c += MOE_THREADS) {
            const u32 r = c / (MOE_BK8 / 16), ch = c % (MOE_BK8 / 16);
            const bool valid = n0 + r < n;
            const u8* src = wx + (u64)(n0 + (valid ? r : 0)) * kd + k0 + ch * 16;
            cp_async16(bs(st) + swz<MOE_BK8 / 2>(r, ch), src, valid);
        }
        if (threadIdx.x < MOE_BN) {
            const u32 r = min(n0 + threadIdx.x, n - 1);
            const float* src = scales + (u64)((x * n + r) / scale_rows) * scale_stride + (u64)kt * chunk_step;
            cp_async4(base + ss(st) + threadIdx.x * 4, src);
        }
    };

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tq = lane & 3;
    const u32 wm = warp % WM, wn = warp / WM;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    cp_async_pipeline<STAGES>(k_tiles, load, [&](u32, u32 st) {
        if (wm * 16 >= rows) return;
        float part[NT][4];
#pragma unroll
        for (int j = 0; j < NT; ++j) part[j][0] = part[j][1] = part[j][2] = part[j][3] = 0.0f;
#pragma unroll
        for (u32 kp = 0; kp < MOE_BK8 / 32; ++kp) {
            // The activations of 16-column steps 2 kp and 2 kp + 1.
            u32 af[2][4];
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const u32 ch = (2 * kp + s) * 2 + (tq >> 1), half = (tq & 1) * 8;
                const uint2 lo = ld_shared_u64(as(st) + moe8_a_off(wm * 16 + g, ch) + half);
                const uint2 hi = ld_shared_u64(as(st) + moe8_a_off(wm * 16 + g + 8, ch) + half);
                af[s][0] = lo.x;
                af[s][1] = hi.x;
                af[s][2] = lo.y;
                af[s][3] = hi.y;
            }
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                // Matrices: (tile j, step 2 kp), (j, 2 kp + 1), (j + 1, 2 kp), (j + 1, 2 kp + 1).
                const u32 mat = lane >> 3;
                const u32 r = wn * (NT * 8) + (j + (mat >> 1)) * 8 + (lane & 7);
                u32 wq[4];
                ldmatrix_x4(bs(st) + swz<MOE_BK8 / 2>(r, 2 * kp + (mat & 1)), wq[0], wq[1], wq[2], wq[3]);
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    u32 b0, b1;
                    e4m3x4_to_bf16(wq[i], b0, b1);
                    mma_bf16(part[j + (i >> 1)], af[i & 1], b0, b1);
                }
            }
        }
        const float* sc = reinterpret_cast<const float*>(moe_smem + ss(st));
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const u32 col = wn * (NT * 8) + j * 8 + 2 * tq;
            const float s0 = sc[col], s1 = sc[col + 1];
            acc[j][0] = fmaf(part[j][0], s0, acc[j][0]);
            acc[j][1] = fmaf(part[j][1], s1, acc[j][1]);
            acc[j][2] = fmaf(part[j][2], s0, acc[j][2]);
            acc[j][3] = fmaf(part[j][3], s1, acc[j][3]);
        }
    });
    moe_store<NT>(acc, out, r0, rows, n, wm * 16, n0 + wn * (NT * 8), lane);
}

#define MET_MOE_GEMM_E4M3(BM, STAGES, SUFFIX)                                                                      \
    extern "C" __global__ void __launch_bounds__(MOE_THREADS) moe_gemm_e4m3_m##BM##SUFFIX(                          \
        const bf16_t* a, const u32* a_rows, const u8* w, const float* scales, u32 scale_rows, u32 scale_stride,     \
        u32 chunk_step, bf16_t* out, const u32* offsets, const u32* tiles, u32 e, u32 n, u32 kd) {                 \
        pdl_enter();                                                                                               \
        moe_gemm_e4m3<BM, STAGES>(a, a_rows, w, scales, scale_rows, scale_stride, chunk_step, out, offsets, tiles, \
                                  e, n, kd);                                                                       \
    }
MET_MOE_GEMM_E4M3(16, 6, _deep)
MET_MOE_GEMM_E4M3(16, 3, )
MET_MOE_GEMM_E4M3(32, 3, )
MET_MOE_GEMM_E4M3(64, 3, )
