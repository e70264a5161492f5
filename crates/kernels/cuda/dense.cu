// dense.cu: the row-wise and elementwise ops of the CUDA backend.
//
// Storage is bf16, arithmetic f32. Where transformers rounds an intermediate to bf16 (the
// residual sum, the normalised value before the norm weight, the rotary cos/sin and the two
// products, SiLU before the multiply) these kernels round at the same point, so that a
// bf16 model follows transformers' bf16 numerics closely rather than only the f32 math.
// Elementwise kernels use grid-stride loops; row kernels take one block per row.

extern "C" __global__ void cast_bf16_f32(const bf16_t* x, float* out, u64 n) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = bf2f(x[i]);
}

extern "C" __global__ void cast_f32_bf16(const float* x, bf16_t* out, u64 n) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = f2bf(x[i]);
}

// out[i] = bound * rng::weight_uniform(key, i) for i < n, rounded to bf16 (dummy weights).
extern "C" __global__ void random_uniform_bf16(bf16_t* out, u64 n, u64 key, float bound) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const u64 bits = mix64(key + (i + 1ull) * 0x9E3779B97F4A7C15ull);
        const float u = (float)(bits >> 40) * (1.0f / 16777216.0f);
        out[i] = f2bf(bound * (2.0f * u - 1.0f));
    }
}

extern "C" __global__ void add_bf16(const bf16_t* a, const bf16_t* b, bf16_t* out, u64 n) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        out[i] = f2bf(bf2f(a[i]) + bf2f(b[i]));
}

// One block per row of `n`: out = w * round(x / sqrt(mean(x^2) + eps)), as transformers'
// `LlamaRMSNorm` (f32 statistics, normalised value cast to bf16, then times the weight).
// With an f32 weight (`GemmaRMSNorm`'s `1 + w`, folded in at load) the product is taken
// on the f32 normalised value and rounded once, as Gemma computes it.
// Each thread keeps its elements (i = tid, tid + blockDim, ...) in registers, so the row
// is read once and the weight is in flight during the reduction. Rows longer than
// NORM_PER_THREAD * blockDim elements take the loop that reads them again.
#define NORM_PER_THREAD 8

template <typename W>
__device__ void rms_norm_row(const bf16_t* x, const W* w, bf16_t* out, u32 n, float eps) {
    __shared__ float scratch[32];
    float ss = 0.0f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        float v = bf2f(x[i]);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) out[i] = f2bf(norm_weighted(w, load_f(w, i), bf2f(x[i]) * inv));
}

// `v` holds this thread's elements of a row already (rounded to bf16); writes the norm.
template <typename W>
__device__ __forceinline__ void rms_norm_regs(const float (&v)[NORM_PER_THREAD], const W* w, bf16_t* out, u32 n,
                                              float eps) {
    __shared__ float scratch[32];
    float wr[NORM_PER_THREAD];
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < NORM_PER_THREAD; ++r) {
        const u32 i = threadIdx.x + r * blockDim.x;
        wr[r] = i < n ? load_f(w, i) : 0.0f;
        ss += v[r] * v[r];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
    for (int r = 0; r < NORM_PER_THREAD; ++r) {
        const u32 i = threadIdx.x + r * blockDim.x;
        if (i < n) out[i] = f2bf(norm_weighted(w, wr[r], v[r] * inv));
    }
}

template <typename W>
__device__ void rms_norm(const bf16_t* x, const W* w, bf16_t* out, u32 n, float eps) {
    const u64 row = blockIdx.x;
    if (n > NORM_PER_THREAD * blockDim.x) {
        rms_norm_row(x + row * n, w, out + row * n, n, eps);
        return;
    }
    float v[NORM_PER_THREAD];
#pragma unroll
    for (int r = 0; r < NORM_PER_THREAD; ++r) {
        const u32 i = threadIdx.x + r * blockDim.x;
        v[r] = i < n ? bf2f(x[row * n + i]) : 0.0f;
    }
    rms_norm_regs(v, w, out + row * n, n, eps);
}

extern "C" __global__ void rms_norm_bf16(const bf16_t* x, const bf16_t* w, bf16_t* out, u32 n, float eps) {
    pdl_enter();
    rms_norm(x, w, out, n, eps);
}

extern "C" __global__ void rms_norm_bf16_wf32(const bf16_t* x, const float* w, bf16_t* out, u32 n, float eps) {
    pdl_enter();
    rms_norm(x, w, out, n, eps);
}

// `sum = round(x + residual)` (written out), then RMSNorm of the rounded sum.
template <typename W>
__device__ void add_rms_norm(const bf16_t* x, const bf16_t* res, const W* w, bf16_t* normed, bf16_t* sum, u32 n,
                             float eps) {
    const u64 off = (u64)blockIdx.x * n;
    if (n > NORM_PER_THREAD * blockDim.x) {
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) sum[off + i] = f2bf(bf2f(x[off + i]) + bf2f(res[off + i]));
        // Each thread reads back only the elements it wrote, so no barrier is needed here.
        rms_norm_row(sum + off, w, normed + off, n, eps);
        return;
    }
    float v[NORM_PER_THREAD];
#pragma unroll
    for (int r = 0; r < NORM_PER_THREAD; ++r) {
        const u32 i = threadIdx.x + r * blockDim.x;
        v[r] = 0.0f;
        if (i < n) {
            const bf16_t s = f2bf(bf2f(x[off + i]) + bf2f(res[off + i]));
            sum[off + i] = s;
            v[r] = bf2f(s);
        }
    }
    rms_norm_regs(v, w, normed + off, n, eps);
}

extern "C" __global__ void add_rms_norm_bf16(const bf16_t* x, const bf16_t* res, const bf16_t* w, bf16_t* normed,
                                             bf16_t* sum, u32 n, float eps) {
    pdl_enter();
    add_rms_norm(x, res, w, normed, sum, n, eps);
}

extern "C" __global__ void add_rms_norm_bf16_wf32(const bf16_t* x, const bf16_t* res, const float* w,
                                                  bf16_t* normed, bf16_t* sum, u32 n, float eps) {
    pdl_enter();
    add_rms_norm(x, res, w, normed, sum, n, eps);
}

// The same two norms for rows whose length is a multiple of 8, moved in 16-byte chunks of 8
// elements: one block per row, thread i holding chunks i, i + blockDim, ... (at most
// NORM_VECS of them, so rows of up to NORM_VECS * 8 * 1024 elements) in registers. The
// arithmetic and roundings are the scalar kernels'; only the order of the sum of squares
// differs.
#define NORM_VECS 4

// The 8 weights of chunk c, as f32.
__device__ __forceinline__ void load_w8(const bf16_t* w, u32 c, float* out) {
    unpack8(reinterpret_cast<const uint4*>(w)[c], out);
}
__device__ __forceinline__ void load_w8(const float* w, u32 c, float* out) {
    const float4 a = reinterpret_cast<const float4*>(w)[2 * c], b = reinterpret_cast<const float4*>(w)[2 * c + 1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// The int8 form of a normalised row, for the GGUF GEMVs over int8 activations (`q8`: the
// `q` and `ds` of `gguf_quantize_q8`, written by the norm so that kernel need not run):
// block b of 32 values is chunks 4b .. 4b + 3, held by four consecutive lanes.
struct NormQ8 {
    signed char* q;  // [rows, n]
    float2* ds;      // [rows, n / 32]: (d, d · Σq)
};

// The e4m3 form of a normalised row, for cuBLASLt's FP8 products of larger batches (`q`
// and `s` as `fp8_quantize_row` or `fp8_quantize_vec128` of `fp8.cu` write them over the
// stored row, so that kernel need not run): one scale a row (`s[row]`), or one a 128
// columns, sixteen consecutive lanes' chunks (`s[row + group * padded]`, token-major within
// a group). Rows `rows` to `padded` - 1 (cuBLASLt's padding to a multiple of 8) are zeros
// under scale 1.
struct NormE4m3 {
    u8* q;     // [padded, n]
    float* s;  // [padded] or [n / 128, padded]
    u32 rows, padded;
};

#define NORM_PLAIN 0
#define NORM_Q8 1
#define NORM_E4M3_ROW 2
#define NORM_E4M3_VEC 3

// Eight values over `scale` as e4m3 bytes, as `fp8_quantize_*` rounds them.
__device__ __forceinline__ uint2 norm_e4m3_8(const float (&o)[8], float scale) {
    return make_uint2(e4m3x2_from(o[0] / scale, o[1] / scale) | (e4m3x2_from(o[2] / scale, o[3] / scale) << 16),
                      e4m3x2_from(o[4] / scale, o[5] / scale) | (e4m3x2_from(o[6] / scale, o[7] / scale) << 16));
}

// A padding row's e4m3 form (a block of its own, `blockIdx.x` >= `rows`): zeros under scale 1.
template <int Q>
__device__ __forceinline__ void norm_e4m3_padding(u32 n, const NormE4m3& f8) {
    const u64 row = blockIdx.x;
    for (u32 c = threadIdx.x; c < n / 8; c += blockDim.x) {
        reinterpret_cast<uint2*>(f8.q + row * n)[c] = make_uint2(0, 0);
        if (Q == NORM_E4M3_VEC && (c & 15u) == 0) f8.s[row + (c / 16) * (u64)f8.padded] = 1.0f;
    }
    if (Q == NORM_E4M3_ROW && threadIdx.x == 0) f8.s[row] = 1.0f;
}

// Chunk c's 8 stored values `o` of row `row` into `f8` under the scale of its 128-column
// group, whose 16 chunks are 16 consecutive lanes. Called by every lane, `live` false past
// the row (its values zeros).
__device__ __forceinline__ void norm_e4m3_vec_chunk(const float (&o)[8], bool live, u32 c, u64 row, u32 n,
                                                    const NormE4m3& f8) {
    float a = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) a = fmaxf(a, fabsf(o[e]));
#pragma unroll
    for (int d = 1; d < 16; d <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, d));
    const float scale = a > 0.0f ? a / 448.0f : 1.0f;
    if (live) {
        reinterpret_cast<uint2*>(f8.q + row * n)[c] = norm_e4m3_8(o, scale);
        if ((c & 15u) == 0) f8.s[row + (c / 16) * (u64)f8.padded] = scale;
    }
}

// Chunk c's 8 output values `o` (bf16 values) into `q8` at row offset `off`, with the
// bits of `gguf_quantize_q8` over the stored row: d = max|x| / 127 over the block, q =
// round(x / d). Called by every lane, `live` false past the row (its values zeros).
__device__ __forceinline__ void norm_q8_chunk(const float (&o)[8], bool live, u32 c, u64 off, const NormQ8& q8) {
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(o[e]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float d = amax / 127.0f;
    int sum = 0;
    u32 packed[2] = {0u, 0u};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int qi = amax > 0.0f ? __float2int_rn(o[e] / d) : 0;
        sum += qi;
        packed[e / 4] |= ((u32)qi & 0xffu) << (8 * (e % 4));
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!live) return;
    reinterpret_cast<uint2*>(q8.q + off)[c] = make_uint2(packed[0], packed[1]);
    if ((c & 3u) == 0) q8.ds[off / 32 + c / 4] = make_float2(d, d * (float)sum);
}

// `v` holds this thread's chunks of the row (rounded to bf16, zeros past its end); writes
// the norm of the row to `out`, and by `Q` its int8 form into `q8` (the block's threads a
// multiple of 4 and the row's length of 32) or its e4m3 form into `f8` (per 128 columns:
// threads a multiple of 16, the row's length of 128).
template <typename W, int Q = NORM_PLAIN>
__device__ __forceinline__ void rms_norm_chunks(const float (&v)[NORM_VECS][8], const W* w, uint4* out, u32 n,
                                                float eps, const NormQ8& q8 = NormQ8{nullptr, nullptr},
                                                const NormE4m3& f8 = NormE4m3{nullptr, nullptr, 0, 0}) {
    __shared__ float scratch[32];
    // The weights are read before the block's reduction, so their round trip overlaps it.
    float wf[NORM_VECS][8];
#pragma unroll
    for (int r = 0; r < NORM_VECS; ++r) {
        const u32 c = threadIdx.x + r * blockDim.x;
        if (c < n / 8) load_w8(w, c, wf[r]);
    }
    float ss = 0.0f;
#pragma unroll
    for (int r = 0; r < NORM_VECS; ++r)
#pragma unroll
        for (int e = 0; e < 8; ++e) ss += v[r][e] * v[r][e];
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    // Chunk r's stored values (rounded to bf16; zeros past the row).
    auto stored = [&](int r, bool live, float (&o)[8]) {
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = live ? round_bf(norm_weighted(w, wf[r][e], v[r][e] * inv)) : 0.0f;
    };
    const u64 row = blockIdx.x;
    float amax = 0.0f;
#pragma unroll
    for (int r = 0; r < NORM_VECS; ++r) {
        const u32 c = threadIdx.x + r * blockDim.x;
        if constexpr (Q != NORM_PLAIN) {
            // Every lane takes part in the shuffles and the block's reductions, past the row too.
            const bool live = c < n / 8;
            float o[8];
            stored(r, live, o);
            if (live) out[c] = pack8(o);
            if constexpr (Q == NORM_Q8) norm_q8_chunk(o, live, c, row * n, q8);
            if constexpr (Q == NORM_E4M3_ROW) {
#pragma unroll
                for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(o[e]));
            }
            if constexpr (Q == NORM_E4M3_VEC) norm_e4m3_vec_chunk(o, live, c, row, n, f8);
        } else {
            if (c >= n / 8) break;
            float o[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) o[e] = norm_weighted(w, wf[r][e], v[r][e] * inv);
            out[c] = pack8(o);
        }
    }
    if constexpr (Q == NORM_E4M3_ROW) {
        amax = block_max(amax, scratch);
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
#pragma unroll
        for (int r = 0; r < NORM_VECS; ++r) {
            const u32 c = threadIdx.x + r * blockDim.x;
            if (c >= n / 8) break;
            float o[8];
            stored(r, true, o);
            reinterpret_cast<uint2*>(f8.q + row * n)[c] = norm_e4m3_8(o, scale);
        }
        if (threadIdx.x == 0) f8.s[row] = scale;
    }
}

template <typename W, int Q = NORM_PLAIN>
__device__ void rms_norm_v(const bf16_t* x, const W* w, bf16_t* out, u32 n, float eps,
                           const NormQ8& q8 = NormQ8{nullptr, nullptr},
                           const NormE4m3& f8 = NormE4m3{nullptr, nullptr, 0, 0}) {
    const u64 off = (u64)blockIdx.x * n;
    const uint4* xv = reinterpret_cast<const uint4*>(x + off);
    float v[NORM_VECS][8];
#pragma unroll
    for (int r = 0; r < NORM_VECS; ++r) {
        const u32 c = threadIdx.x + r * blockDim.x;
        if (c < n / 8) {
            unpack8(xv[c], v[r]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[r][e] = 0.0f;
        }
    }
    rms_norm_chunks<W, Q>(v, w, reinterpret_cast<uint4*>(out + off), n, eps, q8, f8);
}

template <typename W, int Q = NORM_PLAIN>
__device__ void add_rms_norm_v(const bf16_t* x, const bf16_t* res, const W* w, bf16_t* normed, bf16_t* sum, u32 n,
                               float eps, const NormQ8& q8 = NormQ8{nullptr, nullptr},
                               const NormE4m3& f8 = NormE4m3{nullptr, nullptr, 0, 0}) {
    const u64 off = (u64)blockIdx.x * n;
    const uint4 *xv = reinterpret_cast<const uint4*>(x + off), *rv = reinterpret_cast<const uint4*>(res + off);
    uint4* sv = reinterpret_cast<uint4*>(sum + off);
    float v[NORM_VECS][8];
#pragma unroll
    for (int r = 0; r < NORM_VECS; ++r) {
        const u32 c = threadIdx.x + r * blockDim.x;
        if (c < n / 8) {
            float a[8], b[8];
            unpack8(xv[c], a);
            unpack8(rv[c], b);
#pragma unroll
            for (int e = 0; e < 8; ++e) v[r][e] = round_bf(a[e] + b[e]);
            sv[c] = pack8(v[r]);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) v[r][e] = 0.0f;
        }
    }
    rms_norm_chunks<W, Q>(v, w, reinterpret_cast<uint4*>(normed + off), n, eps, q8, f8);
}

extern "C" __global__ void rms_norm_v_bf16(const bf16_t* x, const bf16_t* w, bf16_t* out, u32 n, float eps) {
    pdl_enter();
    rms_norm_v(x, w, out, n, eps);
}

extern "C" __global__ void rms_norm_v_bf16_wf32(const bf16_t* x, const float* w, bf16_t* out, u32 n, float eps) {
    pdl_enter();
    rms_norm_v(x, w, out, n, eps);
}

extern "C" __global__ void add_rms_norm_v_bf16(const bf16_t* x, const bf16_t* res, const bf16_t* w, bf16_t* normed,
                                               bf16_t* sum, u32 n, float eps) {
    pdl_enter();
    add_rms_norm_v(x, res, w, normed, sum, n, eps);
}

extern "C" __global__ void add_rms_norm_v_bf16_wf32(const bf16_t* x, const bf16_t* res, const float* w,
                                                    bf16_t* normed, bf16_t* sum, u32 n, float eps) {
    pdl_enter();
    add_rms_norm_v(x, res, w, normed, sum, n, eps);
}

// The vector norms writing the int8 form of their rows too (`NormQ8`), for a decode step
// whose next product is a GGUF GEMV over int8 activations.
#define MET_NORM_Q8(W, SUFFIX)                                                                                 \
    extern "C" __global__ void rms_norm_v_q8_bf16##SUFFIX(const bf16_t* x, const W* w, bf16_t* out, u32 n,    \
                                                          float eps, signed char* q, float2* ds) {             \
        pdl_enter();                                                                                           \
        rms_norm_v<W, NORM_Q8>(x, w, out, n, eps, NormQ8{q, ds});                                                 \
    }                                                                                                          \
    extern "C" __global__ void add_rms_norm_v_q8_bf16##SUFFIX(const bf16_t* x, const bf16_t* res, const W* w, \
                                                              bf16_t* normed, bf16_t* sum, u32 n, float eps,   \
                                                              signed char* q, float2* ds) {                    \
        pdl_enter();                                                                                           \
        add_rms_norm_v<W, NORM_Q8>(x, res, w, normed, sum, n, eps, NormQ8{q, ds});                                \
    }
MET_NORM_Q8(bf16_t, )
MET_NORM_Q8(float, _wf32)

// The vector norms writing the e4m3 form of their rows too (`NormE4m3`), per row (`r`) or
// per 128 columns (`v`), for a batch whose next product is cuBLASLt's FP8 GEMM: grid
// (`padded`), the blocks past `rows` writing the padding rows' e4m3 form only.
#define MET_NORM_E4M3(W, SUFFIX, FORM, Q)                                                                      \
    extern "C" __global__ void rms_norm_v_e4m3##FORM##_bf16##SUFFIX(                                           \
        const bf16_t* x, const W* w, bf16_t* out, u32 n, float eps, u8* q, float* s, u32 rows, u32 padded) {   \
        pdl_enter();                                                                                           \
        const NormE4m3 f8{q, s, rows, padded};                                                                 \
        if (blockIdx.x >= rows) return norm_e4m3_padding<Q>(n, f8);                                            \
        rms_norm_v<W, Q>(x, w, out, n, eps, NormQ8{nullptr, nullptr}, f8);                                     \
    }                                                                                                          \
    extern "C" __global__ void add_rms_norm_v_e4m3##FORM##_bf16##SUFFIX(                                       \
        const bf16_t* x, const bf16_t* res, const W* w, bf16_t* normed, bf16_t* sum, u32 n, float eps, u8* q,  \
        float* s, u32 rows, u32 padded) {                                                                      \
        pdl_enter();                                                                                           \
        const NormE4m3 f8{q, s, rows, padded};                                                                 \
        if (blockIdx.x >= rows) return norm_e4m3_padding<Q>(n, f8);                                            \
        add_rms_norm_v<W, Q>(x, res, w, normed, sum, n, eps, NormQ8{nullptr, nullptr}, f8);                    \
    }
MET_NORM_E4M3(bf16_t, , r, NORM_E4M3_ROW)
MET_NORM_E4M3(float, _wf32, r, NORM_E4M3_ROW)
MET_NORM_E4M3(bf16_t, , v, NORM_E4M3_VEC)
MET_NORM_E4M3(float, _wf32, v, NORM_E4M3_VEC)

// Rotate-half rotary on x [t, h, d]: one block per token. The angle is `float(pos) *
// inv_freq[i]` in f32 as transformers computes it; cos and sin are rounded to bf16 and each
// product rounded, as transformers' `q * cos + rotate_half(q) * sin` in bf16 does. Dims past
// `2 * half` pass through.
extern "C" __global__ void rotary_bf16(const bf16_t* x, const u32* positions, const float* inv_freq, bf16_t* out,
                                       u32 h, u32 d, u32 half) {
    pdl_enter();
    const u64 base = (u64)blockIdx.x * h * d;
    const float p = (float)positions[blockIdx.x];
    for (u32 idx = threadIdx.x; idx < h * d; idx += blockDim.x) {
        const u32 e = idx % d;
        const u64 head = base + (u64)(idx - e);
        float r;
        if (e < 2 * half) {
            const u32 i = e < half ? e : e - half;
            float s, c;
            sincosf(p * inv_freq[i], &s, &c);
            c = round_bf(c);
            s = round_bf(s);
            const float a = bf2f(x[head + i]), b = bf2f(x[head + i + half]);
            r = e < half ? round_bf(a * c) - round_bf(b * s) : round_bf(b * c) + round_bf(a * s);
        } else {
            r = bf2f(x[head + e]);
        }
        out[head + e] = f2bf(r);
    }
}

// silu(x[:, :n]) * x[:, n:] with silu rounded to bf16 first, as transformers' `act_fn(gate)
// * up` in bf16.
extern "C" __global__ void silu_mul_bf16(const bf16_t* x, bf16_t* out, u32 n, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 row = i / n, col = i % n;
        const float g = bf2f(x[row * 2 * n + col]), u = bf2f(x[row * 2 * n + n + col]);
        out[i] = f2bf(round_bf(g / (1.0f + expf(-g))) * u);
    }
}

// The gated activations' forms for n a multiple of 8: thread c of grid row y takes chunk
// c (8 columns, 16-byte loads and stores) of rows y, y + gridDim.y, ..., so no index is
// divided. `act` is the activation in f32; its result is rounded to bf16 before the
// multiply, as in the scalar kernels.
template <typename Act>
__device__ void gated_mul_v(const bf16_t* x, bf16_t* out, u32 n, u32 rows, Act act) {
    const u32 c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= n / 8) return;
    for (u32 row = blockIdx.y; row < rows; row += gridDim.y) {
        const uint4* xr = reinterpret_cast<const uint4*>(x + (u64)row * 2 * n);
        float g[8], u[8], o[8];
        unpack8(xr[c], g);
        unpack8(xr[n / 8 + c], u);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = round_bf(act(g[e])) * u[e];
        reinterpret_cast<uint4*>(out + (u64)row * n)[c] = pack8(o);
    }
}

extern "C" __global__ void silu_mul_v_bf16(const bf16_t* x, bf16_t* out, u32 n, u32 rows) {
    pdl_enter();
    gated_mul_v(x, out, n, rows, [](float g) { return g / (1.0f + expf(-g)); });
}

// `silu_mul_v`'s rows with their e4m3 form beside them (`NormE4m3`, as `fp8_quantize_*`
// would write it over the stored rows), for the down projection of larger FP8 batches,
// which then skips its own quantize kernel. One block a row, `padded` blocks (those past
// `rows` write the padding rows' zeros); a thread takes chunks c, c + blockDim.x, ... of 8
// columns. Per row (`Q` = NORM_E4M3_ROW): the row's amax over the block, then a second pass
// that recomputes the chunks from x; per 128 columns (NORM_E4M3_VEC): the 16 consecutive
// lanes of a group. n a multiple of 8 (of 128 per group), blockDim.x a multiple of 32.
template <int Q>
__device__ void silu_mul_e4m3(const bf16_t* x, bf16_t* out, const NormE4m3& f8, u32 n) {
    __shared__ float scratch[32];
    const u64 row = blockIdx.x;
    const u32 chunks = n / 8;
    const uint4* xr = reinterpret_cast<const uint4*>(x + row * 2 * n);
    // Chunk c's stored values: silu rounded to bf16, times up, rounded to bf16.
    auto chunk = [&](u32 c, float (&o)[8]) {
        float g[8], u[8];
        unpack8(xr[c], g);
        unpack8(xr[chunks + c], u);
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = round_bf(round_bf(g[e] / (1.0f + expf(-g[e]))) * u[e]);
    };
    float amax = 0.0f;
    // Every thread runs every round (the shuffles need whole groups); a group of 16 chunks is
    // live or not as a whole, since chunks is a multiple of 16 there.
    for (u32 base = 0; base < chunks; base += blockDim.x) {
        const u32 c = base + threadIdx.x;
        const bool live = c < chunks;
        float o[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
        if (live) {
            chunk(c, o);
            reinterpret_cast<uint4*>(out + row * n)[c] = pack8(o);
        }
        if constexpr (Q == NORM_E4M3_ROW) {
#pragma unroll
            for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(o[e]));
        } else {
            norm_e4m3_vec_chunk(o, live, c, row, n, f8);
        }
    }
    if constexpr (Q == NORM_E4M3_ROW) {
        amax = block_max(amax, scratch);
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        for (u32 c = threadIdx.x; c < chunks; c += blockDim.x) {
            float o[8];
            chunk(c, o);
            reinterpret_cast<uint2*>(f8.q + row * n)[c] = norm_e4m3_8(o, scale);
        }
        if (threadIdx.x == 0) f8.s[row] = scale;
    }
}

#define MET_SILU_MUL_E4M3(FORM, Q)                                                                             \
    extern "C" __global__ void silu_mul_e4m3##FORM##_bf16(const bf16_t* x, bf16_t* out, u8* q, float* s, u32 n, \
                                                           u32 rows, u32 padded) {                             \
        pdl_enter();                                                                                           \
        const NormE4m3 f8{q, s, rows, padded};                                                                 \
        if (blockIdx.x >= rows) return norm_e4m3_padding<Q>(n, f8);                                            \
        silu_mul_e4m3<Q>(x, out, f8, n);                                                                       \
    }

MET_SILU_MUL_E4M3(r, NORM_E4M3_ROW)
MET_SILU_MUL_E4M3(v, NORM_E4M3_VEC)

extern "C" __global__ void gelu_tanh_mul_v_bf16(const bf16_t* x, bf16_t* out, u32 n, u32 rows) {
    pdl_enter();
    gated_mul_v(x, out, n, rows, [](float g) {
        const float k = 0.7978845608028654f;  // sqrt(2 / pi)
        return 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
    });
}

// gelu_tanh(x[:, :n]) * x[:, n:] (PyTorch's `gelu(approximate="tanh")`), the activation
// rounded to bf16 first, as transformers' `act_fn(gate) * up` in bf16.
extern "C" __global__ void gelu_tanh_mul_bf16(const bf16_t* x, bf16_t* out, u32 n, u64 total) {
    pdl_enter();
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 row = i / n, col = i % n;
        const float g = bf2f(x[row * 2 * n + col]), u = bf2f(x[row * 2 * n + n + col]);
        const float act = 0.5f * g * (1.0f + tanhf(k * (g + 0.044715f * g * g * g)));
        out[i] = f2bf(round_bf(act) * u);
    }
}

// out = x * factor, the factor already rounded to the dtype of x on the host.
template <typename T>
__device__ void scale(const T* x, T* out, float factor, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        store_f(out, i, load_f(x, i) * factor);
}

extern "C" __global__ void scale_bf16(const bf16_t* x, bf16_t* out, float factor, u64 n) {
    pdl_enter();
    scale(x, out, factor, n);
}

extern "C" __global__ void scale_f32(const float* x, float* out, float factor, u64 n) {
    pdl_enter();
    scale(x, out, factor, n);
}

// out = cap * tanh(x / cap), in f32.
template <typename T>
__device__ void softcap(const T* x, T* out, float cap, u64 n) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        store_f(out, i, cap * tanhf(load_f(x, i) / cap));
}

extern "C" __global__ void softcap_bf16(const bf16_t* x, bf16_t* out, float cap, u64 n) {
    pdl_enter();
    softcap(x, out, cap, n);
}

extern "C" __global__ void softcap_f32(const float* x, float* out, float cap, u64 n) {
    pdl_enter();
    softcap(x, out, cap, n);
}

// out[r] = table[ids[r]] for table [v, h]; an index past the table (rejected on the host
// before launch) writes zeros rather than reading out of bounds.
template <typename T>
__device__ void gather_rows(const T* table, const u32* ids, T* out, u32 v, u32 h, u64 total) {
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / h, c = i % h;
        const u32 id = ids[r];
        out[i] = id < v ? table[(u64)id * h + c] : (T)0;
    }
}

extern "C" __global__ void gather_rows_bf16(const bf16_t* t, const u32* ids, bf16_t* out, u32 v, u32 h, u64 total) {
    pdl_enter();
    gather_rows(t, ids, out, v, h, total);
}

extern "C" __global__ void gather_rows_f32(const float* t, const u32* ids, float* out, u32 v, u32 h, u64 total) {
    pdl_enter();
    gather_rows(t, ids, out, v, h, total);
}

// out[i] = src[rows[i]] for i < n, u32 (a decode step's ids from the tokens the step before
// drew on the device); the host checked every row against src's length.
extern "C" __global__ void gather_u32(const u32* src, const u32* rows, u32* out, u32 n) {
    pdl_enter();
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) out[i] = src[rows[i]];
}

// out [m, w] = x[:, start .. start + w] for x [m, n].
extern "C" __global__ void copy_cols_bf16(const bf16_t* x, bf16_t* out, u32 n, u32 start, u32 w, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 r = i / w, c = i % w;
        out[i] = x[r * n + start + c];
    }
}

// Every row of out [m, n] = bias [n]: the C operand of a GEMM that adds the bias (beta = 1).
extern "C" __global__ void fill_rows_bf16(const bf16_t* bias, bf16_t* out, u32 n, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x)
        out[i] = bias[i % n];
}

// out[r, c] += bias[c] for out [total / n, n], rounded once to bf16: a product's bias where
// the product cannot take it in its sum (`--batch-invariant`'s dense products).
extern "C" __global__ void add_rows_bf16(const bf16_t* bias, bf16_t* out, u32 n, u64 total) {
    pdl_enter();
    for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x)
        out[i] = f2bf(bf2f(out[i]) + bf2f(bias[i % n]));
}
