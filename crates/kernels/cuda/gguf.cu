// gguf.cu: matrices in GGUF's block formats (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) kept in their
// blocks on the device. Host side and layout: `src/cuda/gguf.rs`.
//
// Each block's fields are split at upload into regions, one row after another in each, so
// every load is an aligned 16-byte word: `qs` the 4- or 8-bit quants (Q6_K's low four bits),
// `qh` the high bits (Q5_K, Q6_K), `sc` the scales (Q4_K and Q5_K: per 256 weights a 16-byte
// record of the 12 packed 6-bit scales and mins, then d and dmin as f16; Q6_K: the 16 int8
// scales), `d` the f16 block scales (Q4_0, Q8_0: per 32 weights; Q6_K: per 256). The bytes
// are the file's, reordered; a weight decodes to what ggml's dequantisation gives, in f32
// (the K formats' `d·sc · q − dmin·mn` as one fused multiply-add, so within an ulp of the
// host's `dequantize_row`).
//
// A row is cut into units of 64 weights and a unit into four chunks of 16 consecutive weights
// (for Q6_K the four chunks of a unit lie 32 apart, as its blocks interleave them). A lane
// loads a unit's words at once, then decodes it chunk by chunk.
//
// `gguf_gemv_<format>_m*`: out [m, N] columns `column..column + rows` = x [m, k] · wᵀ for m <= M, one
// warp a row: lane i takes units i, i + 32, ... (the next unit's words requested before the
// current one's arithmetic), then a fixed shuffle tree; the order depends on k alone.
// `gguf_widen_bf16`: rows of the matrix (or of a row list) as bf16, one thread a unit.

#define GGUF_Q4_0 0u
#define GGUF_Q8_0 1u
#define GGUF_Q4_K 2u
#define GGUF_Q5_K 3u
#define GGUF_Q6_K 4u
#define GGUF_WARPS 4

// One matrix part's regions (device addresses) and its format and row length. Mirrors
// `GgufArgs` of `src/cuda/gguf.rs`.
struct GgufMat {
    u64 qs, qh, sc, d;
    u32 format, k;
};

// IEEE half bits (the low 16 of `h`) -> f32: finite values exactly, infinities and NaNs as
// such, in one conversion.
__device__ __forceinline__ float gguf_h2f(u32 h) {
    float v;
    asm("{\n\t.reg .b16 a;\n\tcvt.u16.u32 a, %1;\n\tcvt.f32.f16 %0, a;\n\t}" : "=f"(v) : "r"(h));
    return v;
}

// A 16-byte word of a matrix's regions: a global load (not a generic one) with the
// streaming hint, as the other GEMVs read their weights: nothing reads it again this step.
__device__ __forceinline__ uint4 gguf_ld(u64 addr) { return __ldcs(reinterpret_cast<const uint4*>(addr)); }

// Sub-block j's 6-bit scale and min of a K-quant's packed twelve bytes (`rec`'s first 12:
// words x, y, z). Sub-blocks 0-3 keep theirs in the low six bits of byte j of x (scale) and
// of y (min); 4-7 keep the low four bits in the nibbles of byte j - 4 of z (scale low, min
// high) and the top two in the top two bits of byte j - 4 of x (scale) and of y (min). Both
// cases are one expression, `lo | two << 4`, over words and shifts picked by j without a
// branch (j often varies by lane).
__device__ __forceinline__ void gguf_scale_min(const uint4& rec, u32 j, float& sc, float& mn) {
    const bool first = j < 4;
    const u32 s = 8 * (j & 3u), top = s + (first ? 4u : 6u);
    const u32 sc_lo = first ? rec.x : rec.z, mn_lo = first ? rec.y : rec.z >> 4;
    sc = (float)(((sc_lo >> s) & 0xfu) | (((rec.x >> top) & 3u) << 4));
    mn = (float)(((mn_lo >> s) & 0xfu) | (((rec.y >> top) & 3u) << 4));
}

// The words of one unit, as loaded before any is decoded.
struct GgufUnit {
    uint4 q[4];   // quants: Q8_0 64 bytes; Q4_0, Q4_K, Q5_K 32 bytes; Q6_K 32 bytes of ql
    uint4 h[2];   // Q5_K: 32 bytes of qh; Q6_K: 16
    uint4 rec;    // Q4_K, Q5_K: the scale record
    u32 s0, s1;   // Q4_0, Q8_0: the two blocks' d bits; Q6_K: four int8 scales, and d bits
};

template <u32 F>
__device__ __forceinline__ GgufUnit gguf_load(const GgufMat& m, u64 row, u32 u) {
    GgufUnit g;
    const u64 k = m.k;
    if constexpr (F == GGUF_Q8_0) {
        const u64 at = m.qs + row * k + 64ull * u;
#pragma unroll
        for (u32 i = 0; i < 4; ++i) g.q[i] = gguf_ld(at + 16 * i);
        const unsigned short* d = reinterpret_cast<const unsigned short*>(m.d) + row * (k / 32) + 2 * u;
        g.s0 = d[0];
        g.s1 = d[1];
    } else if constexpr (F == GGUF_Q4_0) {
        const u64 at = m.qs + row * (k / 2) + 32ull * u;
        g.q[0] = gguf_ld(at);
        g.q[1] = gguf_ld(at + 16);
        const unsigned short* d = reinterpret_cast<const unsigned short*>(m.d) + row * (k / 32) + 2 * u;
        g.s0 = d[0];
        g.s1 = d[1];
    } else if constexpr (F == GGUF_Q6_K) {
        // Unit u: super-block u / 4, half n = (u / 2) % 2, l from 16 (u % 2).
        const u32 s = u / 4, n = (u / 2) & 1u, h = u & 1u;
        const u64 ql = m.qs + row * (k / 2) + 128ull * s + 64 * n + 16 * h;
        g.q[0] = gguf_ld(ql);       // ql[l]
        g.q[1] = gguf_ld(ql + 32);  // ql[l + 32]
        g.h[0] = gguf_ld(m.qh + row * (k / 4) + 64ull * s + 32 * n + 16 * h);
        const signed char* sc = reinterpret_cast<const signed char*>(m.sc) + row * (k / 16) + 16ull * s + 8 * n + h;
        g.s0 = (u32)(unsigned char)sc[0] | ((u32)(unsigned char)sc[2] << 8) | ((u32)(unsigned char)sc[4] << 16) |
               ((u32)(unsigned char)sc[6] << 24);
        g.s1 = reinterpret_cast<const unsigned short*>(m.d)[row * (k / 256) + s];
    } else {  // Q4_K, Q5_K: unit u is sub-blocks 2p and 2p + 1 of super-block u / 4
        const u32 s = u / 4, p = u & 3u;
        const u64 at = m.qs + row * (k / 2) + 128ull * s + 32 * p;
        g.q[0] = gguf_ld(at);
        g.q[1] = gguf_ld(at + 16);
        g.rec = gguf_ld(m.sc + row * (k / 256) * 16 + 16ull * s);
        if constexpr (F == GGUF_Q5_K) {
            const u64 qh = m.qh + row * (k / 8) + 32ull * s;
            g.h[0] = gguf_ld(qh);
            g.h[1] = gguf_ld(qh + 16);
        }
    }
    return g;
}

// The first k of chunk c of unit u.
template <u32 F>
__device__ __forceinline__ u32 gguf_chunk_k(u32 u, u32 c) {
    if constexpr (F == GGUF_Q6_K) return 256 * (u / 4) + 128 * ((u / 2) & 1u) + 32 * c + 16 * (u & 1u);
    return 64 * u + 16 * c;
}

// The four bytes of `word` as floats minus `bias`: each byte placed under the exponent of
// 2^23 (one byte permute) and 2^23 + `bias` subtracted, exact for bytes and small biases.
__device__ __forceinline__ void gguf_bytes_f(u32 word, float bias, float* f) {
    const float off = 8388608.0f + bias;
#pragma unroll
    for (u32 i = 0; i < 4; ++i) {
        u32 v;
        asm("prmt.b32 %0, %1, %2, %3;" : "=r"(v) : "r"(word), "r"(0x4b000000u), "r"(0x7440u + i));
        f[i] = __uint_as_float(v) - off;
    }
}

__device__ __forceinline__ u32 gguf_word(const uint4& v, u32 i) { return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w)); }

// The 16 weights of chunk c of a loaded unit: the quants of a 16-byte word, four at a time,
// times their scale (less their min), one fused multiply-add each.
template <u32 F>
__device__ __forceinline__ void gguf_decode(const GgufUnit& g, u32 u, u32 c, float (&w)[16]) {
    if constexpr (F == GGUF_Q8_0) {
        const float d = gguf_h2f(c < 2 ? g.s0 : g.s1);
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            gguf_bytes_f(gguf_word(g.q[c], i) ^ 0x80808080u, 128.0f, w + 4 * i);  // int8 as q + 128
#pragma unroll
            for (u32 j = 0; j < 4; ++j) w[4 * i + j] *= d;
        }
    } else if constexpr (F == GGUF_Q4_0) {
        const float d = gguf_h2f(c < 2 ? g.s0 : g.s1);
        const u32 shift = 4 * (c & 1u);
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            gguf_bytes_f((gguf_word(g.q[c >> 1], i) >> shift) & 0x0f0f0f0fu, 8.0f, w + 4 * i);
#pragma unroll
            for (u32 j = 0; j < 4; ++j) w[4 * i + j] *= d;
        }
    } else if constexpr (F == GGUF_Q6_K) {
        const float d = gguf_h2f(g.s1);
        const float ds = d * (float)(signed char)((g.s0 >> (8 * c)) & 0xffu);
        const u32 shift = c < 2 ? 0 : 4;
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            const u32 lo = (gguf_word(g.q[c & 1u], i) >> shift) & 0x0f0f0f0fu;
            const u32 hi = ((gguf_word(g.h[0], i) >> (2 * c)) & 0x03030303u) << 4;
            gguf_bytes_f(lo | hi, 32.0f, w + 4 * i);
#pragma unroll
            for (u32 j = 0; j < 4; ++j) w[4 * i + j] *= ds;
        }
    } else {
        const u32 p = u & 3u, j = 2 * p + (c >> 1);
        float sc, mn;
        gguf_scale_min(g.rec, j, sc, mn);
        const float d = gguf_h2f(g.rec.w & 0xffffu), dmin = gguf_h2f(g.rec.w >> 16);
        const float d1 = d * sc, m1 = dmin * mn;
        const u32 shift = c < 2 ? 0 : 4;
#pragma unroll
        for (u32 i = 0; i < 4; ++i) {
            u32 q = (gguf_word(g.q[c & 1u], i) >> shift) & 0x0f0f0f0fu;
            if constexpr (F == GGUF_Q5_K) q |= ((gguf_word(g.h[c & 1u], i) >> j) & 0x01010101u) << 4;
            gguf_bytes_f(q, 0.0f, w + 4 * i);
#pragma unroll
            for (u32 k = 0; k < 4; ++k) w[4 * i + k] = fmaf(w[4 * i + k], d1, -m1);
        }
    }
}

// 16 weights dotted with 16 bf16 of x, added in order.
__device__ __forceinline__ float gguf_dot16(const float (&w)[16], const bf16_t* x, float acc) {
    const uint4 a = *reinterpret_cast<const uint4*>(x), b = *reinterpret_cast<const uint4*>(x + 8);
    const u32 xs[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (u32 i = 0; i < 8; ++i) {
        acc = fmaf(w[2 * i], __uint_as_float(xs[i] << 16), acc);
        acc = fmaf(w[2 * i + 1], __uint_as_float(xs[i] & 0xffff0000u), acc);
    }
    return acc;
}

// Lane `lane`'s share of weight row `row` dotted with x rows 0 .. m - 1 (m <= M): units
// lane, lane + 32, ..., the next unit's words requested before the current one's sums.
template <u32 F, int M>
__device__ __forceinline__ void gguf_gemv_lane(const bf16_t* __restrict__ x, const GgufMat& mat, u32 m, u32 row,
                                               u32 lane, float (&acc)[M]) {
#pragma unroll
    for (int t = 0; t < M; ++t) acc[t] = 0.0f;
    const u32 units = mat.k / 64;
    GgufUnit next;
    if (lane < units) next = gguf_load<F>(mat, row, lane);
    for (u32 u = lane; u < units; u += 32) {
        const GgufUnit g = next;
        if (u + 32 < units) next = gguf_load<F>(mat, row, u + 32);
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
            float w[16];
            gguf_decode<F>(g, u, c, w);
            const u32 k0 = gguf_chunk_k<F>(u, c);
#pragma unroll
            for (int t = 0; t < M; ++t) {
                if (t < (int)m) acc[t] = gguf_dot16(w, x + (u64)t * mat.k + k0, acc[t]);
            }
        }
    }
}

// Unit u of a row (`src`) as bf16 into `o`, the row's first column.
template <u32 F>
__device__ __forceinline__ void gguf_widen_unit(const GgufMat& mat, u64 src, u32 u, bf16_t* o) {
    const GgufUnit g = gguf_load<F>(mat, src, u);
#pragma unroll
    for (u32 c = 0; c < 4; ++c) {
        float w[16];
        gguf_decode<F>(g, u, c, w);
        uint4* d = reinterpret_cast<uint4*>(o + gguf_chunk_k<F>(u, c));
        d[0] = make_uint4(pack_bf16(w[0], w[1]), pack_bf16(w[2], w[3]), pack_bf16(w[4], w[5]), pack_bf16(w[6], w[7]));
        d[1] = make_uint4(pack_bf16(w[8], w[9]), pack_bf16(w[10], w[11]), pack_bf16(w[12], w[13]),
                          pack_bf16(w[14], w[15]));
    }
}

// --- int8 activations (`--quant-dots int8`, the default) ---------------------------------
//
// The GEMV above decodes every weight to f32 and multiplies it by an f32 of x: about five
// instructions a weight, so a Q4_K matrix (0.56 bytes a weight) streams at the rate the
// SM issues them, not at the memory's. Here x is first cut into blocks of 32 that become
// int8 under one scale each (`gguf_quantize_q8`: d = max|x| / 127, q = round(x / d), and
// d · Σq beside d), and a Q4_K sub-block (32 weights, the same 32 columns as an x block)
// is dotted as integers, four nibbles against four int8 a `dp4a`:
//   Σ (d·sc·q − dmin·mn) · x  ≈  d·sc · d_x · Σ q·q_x  −  dmin·mn · (d_x · Σ q_x).
// A Q6_K chunk (16 weights under one int8 scale, half an x block) is dotted the same way,
// its 6-bit quants against int8 x, with the offset of 32 taken out through x's sum over the
// chunk (a `dp4a` against ones):  Σ d·sc·(q − 32) · x  ≈  d·sc · d_x · (Σ q·q_x − 32 Σ q_x).
// The result moves by x's rounding to 8 bits (as the CPU's `--quant-dots int8` does).

// One unit of R Q4_K or Q6_K rows (the same columns of each) dotted with x rows 0 .. m - 1
// of `gguf_quantize_q8`'s x (`xq [m, k]`, `xds [m, k / 32]`), added into `acc`, x's words
// read once for the R rows. Q4_K: the unit's two sub-blocks of 32 weights (byte i of the 32
// holds weight 64u + 32h + i in its low or high nibble), each the columns of one x block.
// Q6_K: its four chunks of 16 weights (32 apart in x, as Q6_K's blocks interleave them),
// each under its int8 scale. A row's sums are the same whatever R.
template <u32 F, int M, int R>
__device__ __forceinline__ void gguf_q8_unit(const GgufUnit (&g)[R], u32 u, const signed char* __restrict__ xq,
                                             const float2* __restrict__ xds, u32 k, u32 m, float (&acc)[R][M]) {
    if constexpr (F == GGUF_Q4_K) {
        float d[R], dmin[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            d[r] = gguf_h2f(g[r].rec.w & 0xffffu);
            dmin[r] = gguf_h2f(g[r].rec.w >> 16);
        }
#pragma unroll
        for (u32 h = 0; h < 2; ++h) {
            float dsc[R], dmn[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float sc, mn;
                gguf_scale_min(g[r].rec, 2 * (u & 3u) + h, sc, mn);
                dsc[r] = d[r] * sc;
                dmn[r] = dmin[r] * mn;
            }
#pragma unroll
            for (int t = 0; t < M; ++t) {
                if (t >= (int)m) break;
                const int4* xv = reinterpret_cast<const int4*>(xq + (u64)t * k + 64ull * u + 32 * h);
                const int4 x0 = xv[0], x1 = xv[1];
                const int xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
                const float2 dx = xds[(u64)t * (k / 32) + 2 * u + h];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    int sumi = 0;
#pragma unroll
                    for (u32 w = 0; w < 8; ++w) {
                        const int nib = (int)((gguf_word(g[r].q[w >> 2], w & 3u) >> (4 * h)) & 0x0f0f0f0fu);
                        sumi = __dp4a(nib, xs[w], sumi);
                    }
                    acc[r][t] += dsc[r] * (dx.x * (float)sumi) - dmn[r] * dx.y;
                }
            }
        }
    } else {
        static_assert(F == GGUF_Q6_K, "int8 activations for Q4_K and Q6_K");
        float d[R];
#pragma unroll
        for (int r = 0; r < R; ++r) d[r] = gguf_h2f(g[r].s1);
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
            const u32 shift = c < 2 ? 0 : 4, at = gguf_chunk_k<GGUF_Q6_K>(u, c);
            float dsc[R];
            int q[R][4];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                dsc[r] = d[r] * (float)(signed char)((g[r].s0 >> (8 * c)) & 0xffu);
#pragma unroll
                for (u32 i = 0; i < 4; ++i) {
                    const u32 lo = (gguf_word(g[r].q[c & 1u], i) >> shift) & 0x0f0f0f0fu;
                    const u32 hi = ((gguf_word(g[r].h[0], i) >> (2 * c)) & 0x03030303u) << 4;
                    q[r][i] = (int)(lo | hi);
                }
            }
#pragma unroll
            for (int t = 0; t < M; ++t) {
                if (t >= (int)m) break;
                const int4 xv = *reinterpret_cast<const int4*>(xq + (u64)t * k + at);
                const int xs[4] = {xv.x, xv.y, xv.z, xv.w};
                int sumx = 0;
#pragma unroll
                for (u32 i = 0; i < 4; ++i) sumx = __dp4a(0x01010101, xs[i], sumx);
                const float dx = xds[(u64)t * (k / 32) + at / 32].x;
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    int sumi = 0;
#pragma unroll
                    for (u32 i = 0; i < 4; ++i) sumi = __dp4a(q[r][i], xs[i], sumi);
                    acc[r][t] += dsc[r] * (dx * (float)(sumi - 32 * sumx));
                }
            }
        }
    }
}

// Lane `lane`'s share of weight rows `rows[0..R)` dotted with x rows 0 .. m - 1 of
// `gguf_quantize_q8`'s x: units lane, lane + 32, ... (the next unit's words requested before
// the current one's sums). The lane's first unit is requested before the wait for the
// kernel that writes x (`pdl_wait_prev`, which this calls), so its round trip overlaps that
// kernel's tail.
template <u32 F, int M, int R>
__device__ __forceinline__ void gguf_q8_lane(const signed char* __restrict__ xq, const float2* __restrict__ xds,
                                             const GgufMat& mat, const u32 (&rows)[R], u32 m, u32 lane,
                                             float (&acc)[R][M]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) acc[r][t] = 0.0f;
    const u32 k = mat.k, units = k / 64;
    GgufUnit next[R];
    if (lane < units)
#pragma unroll
        for (int r = 0; r < R; ++r) next[r] = gguf_load<F>(mat, rows[r], lane);
    pdl_wait_prev();
    for (u32 u = lane; u < units; u += 32) {
        GgufUnit g[R];
#pragma unroll
        for (int r = 0; r < R; ++r) g[r] = next[r];
        if (u + 32 < units)
#pragma unroll
            for (int r = 0; r < R; ++r) next[r] = gguf_load<F>(mat, rows[r], u + 32);
        gguf_q8_unit<F, M, R>(g, u, xq, xds, k, m, acc);
    }
}

// Block of GGUF_WARPS warps, warp w owning matrix row blockIdx.x * GGUF_WARPS + w (after the
// kernel's `pdl_enter`): the lanes' shares, then a fixed shuffle tree. Needs k % 256 == 0
// for the K formats and k % 64 == 0 otherwise (checked on the host).
template <u32 F, int M>
__device__ __forceinline__ void gguf_gemv(const bf16_t* __restrict__ x, GgufMat mat, bf16_t* __restrict__ out,
                                          u32 m, u32 rows, u32 width, u32 column) {
    const u32 lane = threadIdx.x & 31, row = blockIdx.x * GGUF_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;  // the whole warp: a warp shares its row
    float acc[M];
    gguf_gemv_lane<F, M>(x, mat, m, row, lane, acc);
#pragma unroll
    for (int t = 0; t < M; ++t) {
        const float total = warp_sum(acc[t]);
        if (lane == 0 && t < (int)m) out[(u64)t * width + column + row] = f2bf(total);
    }
}

#define GGUF_GEMV(NAME, F, M)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GGUF_WARPS * 32)                                              \
        gguf_gemv_##NAME##_m##M(const bf16_t* x, GgufMat mat, bf16_t* out, u32 m, u32 rows, u32 width, u32 column) { \
        pdl_enter();                                                                                           \
        gguf_gemv<F, M>(x, mat, out, m, rows, width, column);                                                  \
    }
#define GGUF_GEMVS(NAME, F) GGUF_GEMV(NAME, F, 1) GGUF_GEMV(NAME, F, 2) GGUF_GEMV(NAME, F, 4) GGUF_GEMV(NAME, F, 8)
GGUF_GEMVS(q4_0, GGUF_Q4_0)
GGUF_GEMVS(q8_0, GGUF_Q8_0)
GGUF_GEMVS(q4_k, GGUF_Q4_K)
GGUF_GEMVS(q5_k, GGUF_Q5_K)
GGUF_GEMVS(q6_k, GGUF_Q6_K)

// --- int8 activations (`--quant-dots int8`, the default): the lanes' work is above ----------

// grid (ceil(blocks / 4)), block 128: one warp a block of 32 x values (`blocks` = m k / 32).
extern "C" __global__ void gguf_quantize_q8(const bf16_t* x, signed char* q, float2* ds, u32 blocks) {
    pdl_enter();
    const u32 blk = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
    if (blk >= blocks) return;
    const float v = bf2f(x[(u64)blk * 32 + lane]);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const int qi = amax > 0.0f ? __float2int_rn(v / d) : 0;
    q[(u64)blk * 32 + lane] = (signed char)qi;
    int sum = qi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) ds[blk] = make_float2(d, d * (float)sum);
}

// The sums of weight rows `rows[0..R)` with x rows 0 .. m - 1 over `gguf_quantize_q8`'s x,
// one warp: the lanes' shares (`gguf_q8_lane`), then a fixed shuffle tree; every lane
// returns the totals.
template <u32 F, int M, int R>
__device__ __forceinline__ void gguf_dots_q8(const signed char* __restrict__ xq, const float2* __restrict__ xds,
                                             const GgufMat& mat, const u32 (&rows)[R], u32 m, float (&acc)[R][M]) {
    gguf_q8_lane<F, M, R>(xq, xds, mat, rows, m, threadIdx.x & 31, acc);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < M; ++t) acc[r][t] = warp_sum(acc[r][t]);
}

// As `gguf_gemv` for Q4_K and Q6_K over `gguf_quantize_q8`'s x: one warp a weight row.
template <u32 F, int M>
__device__ __forceinline__ void gguf_gemv_q8(const signed char* __restrict__ xq, const float2* __restrict__ xds,
                                             GgufMat mat, bf16_t* __restrict__ out, u32 m, u32 rows, u32 width,
                                             u32 column) {
    const u32 lane = threadIdx.x & 31, row = blockIdx.x * GGUF_WARPS + (threadIdx.x >> 5);
    // A warp past the last row reads the last (its sums are dropped): every thread waits.
    const u32 r[1] = {min(row, rows - 1)};
    float acc[1][M];
    gguf_dots_q8<F, M, 1>(xq, xds, mat, r, m, acc);
    if (row >= rows) return;
#pragma unroll
    for (int t = 0; t < M; ++t)
        if (lane == 0 && t < (int)m) out[(u64)t * width + column + row] = f2bf(acc[0][t]);
}

// The SwiGLU form over a fused gate/up matrix `[2 half, k]` in one part: warp j takes gate
// row j and up row half + j (x's words read once for both) and writes
// `silu(round(g)) · round(u)` rounded as `silu_mul_bf16` does, into `out [m, half]`: the
// product and `silu_mul` in one kernel, with their bits.
template <u32 F, int M>
__device__ __forceinline__ void gguf_gemv_q8_silu(const signed char* __restrict__ xq,
                                                  const float2* __restrict__ xds, GgufMat mat,
                                                  bf16_t* __restrict__ out, u32 m, u32 half) {
    const u32 lane = threadIdx.x & 31, j = blockIdx.x * GGUF_WARPS + (threadIdx.x >> 5);
    const u32 jr = min(j, half - 1);  // as in `gguf_gemv_q8`
    const u32 rows[2] = {jr, half + jr};
    float acc[2][M];
    gguf_dots_q8<F, M, 2>(xq, xds, mat, rows, m, acc);
    if (j >= half) return;
#pragma unroll
    for (int t = 0; t < M; ++t)
        if (lane == 0 && t < (int)m) out[(u64)t * half + j] = f2bf(silu_times(acc[0][t], acc[1][t]));
}

#define GGUF_GEMV_Q8(F, FORMAT, M)                                                                             \
    extern "C" __global__ void __launch_bounds__(GGUF_WARPS * 32) gguf_gemv_##F##_q8_m##M(                     \
        const signed char* xq, const float2* xds, GgufMat mat, bf16_t* out, u32 m, u32 rows, u32 width,        \
        u32 column) {                                                                                          \
        pdl_allow_next();                                                                                      \
        gguf_gemv_q8<GGUF_##FORMAT, M>(xq, xds, mat, out, m, rows, width, column);                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__(GGUF_WARPS * 32) gguf_gemv_silu_##F##_q8_m##M(                \
        const signed char* xq, const float2* xds, GgufMat mat, bf16_t* out, u32 m, u32 half) {                 \
        pdl_allow_next();                                                                                      \
        gguf_gemv_q8_silu<GGUF_##FORMAT, M>(xq, xds, mat, out, m, half);                                       \
    }
GGUF_GEMV_Q8(q4_k, Q4_K, 1)
GGUF_GEMV_Q8(q4_k, Q4_K, 2)
GGUF_GEMV_Q8(q4_k, Q4_K, 4)
GGUF_GEMV_Q8(q4_k, Q4_K, 8)
GGUF_GEMV_Q8(q6_k, Q6_K, 1)
GGUF_GEMV_Q8(q6_k, Q6_K, 2)
GGUF_GEMV_Q8(q6_k, Q6_K, 4)
GGUF_GEMV_Q8(q6_k, Q6_K, 8)

// The tiled product for 9 to 256 activation rows: out [m, N] columns `column..column + rows`
// = x [m, k] · wᵀ, block (weight-row tile, token tile) of GGUF_BN weight rows by BM tokens,
// four warps. Per GGUF_BK = 128 columns (two units a weight row: for every format, units
// 2kt and 2kt + 1 cover columns 128kt .. 128kt + 127), each thread decodes one unit into
// the weight tile in shared memory as bf16 while the token tile arrives by cp.async (two
// buffers), then the warps run the tile through `mma.sync` m16n8k16 with f32 sums, as the
// grouped GEMM of `moe.cu` does. The next tile's unit is requested before this tile's
// products, so its loads overlap them. Shared memory: 2 BM · 256 + GGUF_BN · 256 bytes (48
// KiB at BM = 64). Needs k % 128 == 0 and 16-byte x rows (checked on the host).
#define GGUF_BN 64
#define GGUF_BK 128
#define GGUF_GEMM_THREADS 128
template <u32 F, int BM>
__device__ __forceinline__ void gguf_gemm(const bf16_t* __restrict__ x, GgufMat mat, bf16_t* __restrict__ out,
                                          u32 m, u32 rows, u32 width, u32 column) {
    constexpr int WM = BM / 16, WN = 4 / WM, NT = GGUF_BN / WN / 8;  // n8 tiles a warp
    constexpr u32 CH = GGUF_BK / 8;                                   // 16-byte chunks a row
    constexpr u32 XS = BM * GGUF_BK * 2;                              // bytes of a token tile
    __shared__ __align__(128) unsigned char gg_smem[2 * XS + GGUF_BN * GGUF_BK * 2];
    const u32 base = smem_addr(gg_smem);
    auto xs = [&](u32 b) { return base + b * XS; };
    const u32 ws = base + 2 * XS;
    const u32 n0 = blockIdx.x * GGUF_BN, t0 = blockIdx.y * BM;
    if (t0 >= m) return;
    const u32 tokens = min((u32)BM, m - t0), k = mat.k, k_tiles = k / GGUF_BK;
    // This thread's unit of each tile: weight row n0 + my_row, unit 2 kt + my_half.
    const u32 my_row = threadIdx.x >> 1, my_half = threadIdx.x & 1;
    const bool row_ok = n0 + my_row < rows;
    const u64 src_row = row_ok ? n0 + my_row : 0;
    auto load_x = [&](u32 kt, u32 b) {
        for (u32 c = threadIdx.x; c < BM * CH; c += GGUF_GEMM_THREADS) {
            const u32 r = c / CH, ch = c % CH;
            const bool valid = r < tokens;
            cp_async16(xs(b) + swz<GGUF_BK>(r, ch), x + (u64)(t0 + (valid ? r : 0)) * k + kt * GGUF_BK + ch * 8, valid);
        }
    };
    auto store_w = [&](const GgufUnit& g, u32 kt) {
        const u32 u = 2 * kt + my_half;
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
            float w[16];
            gguf_decode<F>(g, u, c, w);
            const u32 at = (gguf_chunk_k<F>(u, c) - kt * GGUF_BK) / 8;  // 16-byte chunk of the row
            uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
            if (row_ok) {
                lo = make_uint4(pack_bf16(w[0], w[1]), pack_bf16(w[2], w[3]), pack_bf16(w[4], w[5]), pack_bf16(w[6], w[7]));
                hi = make_uint4(pack_bf16(w[8], w[9]), pack_bf16(w[10], w[11]), pack_bf16(w[12], w[13]),
                                pack_bf16(w[14], w[15]));
            }
            *reinterpret_cast<uint4*>(gg_smem + (ws - base) + swz<GGUF_BK>(my_row, at)) = lo;
            *reinterpret_cast<uint4*>(gg_smem + (ws - base) + swz<GGUF_BK>(my_row, at + 1)) = hi;
        }
    };

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 wm = warp % WM, wn = warp / WM;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    load_x(0, 0);
    cp_async_commit();
    GgufUnit raw = gguf_load<F>(mat, src_row, my_half);
    for (u32 kt = 0; kt < k_tiles; ++kt) {
        const u32 b = kt & 1;
        // The weight tile's one buffer was last read before the barrier ending the step before.
        store_w(raw, kt);
        if (kt + 1 < k_tiles) {
            load_x(kt + 1, b ^ 1);
            raw = gguf_load<F>(mat, src_row, 2 * (kt + 1) + my_half);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        if (wm * 16 < tokens) {
#pragma unroll
            for (u32 kk = 0; kk < GGUF_BK / 16; ++kk) {
                u32 af[4];
                ldmatrix_x4(xs(b) + swz<GGUF_BK>(wm * 16 + (lane & 15), kk * 2 + (lane >> 4)), af[0], af[1], af[2], af[3]);
#pragma unroll
                for (int j = 0; j < NT; j += 2) {
                    const u32 r = wn * (NT * 8) + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4(ws + swz<GGUF_BK>(r, kk * 2 + ((lane >> 3) & 1)), b0, b1, b2, b3);
                    mma_bf16(acc[j], af, b0, b1);
                    mma_bf16(acc[j + 1], af, b2, b3);
                }
            }
        }
        __syncthreads();
    }
    // Warp (wm, wn): tokens t0 + wm·16 + g (+ 8), weight rows n0 + wn·NT·8 + 8j + 2tq (+ 1).
    const u32 g = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 t = wm * 16 + g + 8 * i;
        if (t >= tokens) continue;
        bf16_t* dst = out + (u64)(t0 + t) * width + column;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const u32 col = n0 + wn * (NT * 8) + j * 8 + 2 * tq;
            if (col < rows) dst[col] = f2bf(acc[j][2 * i]);
            if (col + 1 < rows) dst[col + 1] = f2bf(acc[j][2 * i + 1]);
        }
    }
}

#define GGUF_GEMM(NAME, F, BM)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GGUF_GEMM_THREADS)                                            \
        gguf_gemm_##NAME##_m##BM(const bf16_t* x, GgufMat mat, bf16_t* out, u32 m, u32 rows, u32 width, u32 column) { \
        pdl_enter();                                                                                           \
        gguf_gemm<F, BM>(x, mat, out, m, rows, width, column);                                                 \
    }
#define GGUF_GEMMS(NAME, F) GGUF_GEMM(NAME, F, 16) GGUF_GEMM(NAME, F, 64)
GGUF_GEMMS(q4_0, GGUF_Q4_0)
GGUF_GEMMS(q8_0, GGUF_Q8_0)
GGUF_GEMMS(q4_k, GGUF_Q4_K)
GGUF_GEMMS(q5_k, GGUF_Q5_K)
GGUF_GEMMS(q6_k, GGUF_Q6_K)

// Thread (r, u): unit u of row `index ? index[r] : r` of the matrix, as bf16, into
// `out [count, k]` row r. Indices past `rows` write zeros (a checked id never is).
template <u32 F>
__device__ __forceinline__ void gguf_widen(const GgufMat& mat, const u32* index, u32 rows, bf16_t* out, u32 count) {
    const u32 units = mat.k / 64;
    const u64 id = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (id >= (u64)count * units) return;
    const u32 r = (u32)(id / units), u = (u32)(id % units);
    const u32 src = index ? index[r] : r;
    bf16_t* o = out + (u64)r * mat.k;
    if (src >= rows) {
#pragma unroll
        for (u32 c = 0; c < 4; ++c) {
            uint4* d = reinterpret_cast<uint4*>(o + gguf_chunk_k<F>(u, c));
            d[0] = d[1] = make_uint4(0, 0, 0, 0);
        }
        return;
    }
    gguf_widen_unit<F>(mat, src, u, o);
}

extern "C" __global__ void gguf_widen_bf16(GgufMat mat, const u32* index, u32 rows, bf16_t* out, u32 count) {
    pdl_enter();
    switch (mat.format) {
        case GGUF_Q4_0: gguf_widen<GGUF_Q4_0>(mat, index, rows, out, count); break;
        case GGUF_Q8_0: gguf_widen<GGUF_Q8_0>(mat, index, rows, out, count); break;
        case GGUF_Q4_K: gguf_widen<GGUF_Q4_K>(mat, index, rows, out, count); break;
        case GGUF_Q5_K: gguf_widen<GGUF_Q5_K>(mat, index, rows, out, count); break;
        default: gguf_widen<GGUF_Q6_K>(mat, index, rows, out, count); break;
    }
}
