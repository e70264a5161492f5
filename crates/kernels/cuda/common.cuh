// common.cuh: types, conversions and reductions shared by every met kernel.
//
// The kernel sources are compiled at run time by NVRTC as one translation unit, this file
// first (see `src/cuda/compile.rs`). They include no CUDA header, so compiling needs no
// toolkit on the machine: bf16 is handled as raw bits (`bf16_t`) with round-to-nearest-even
// conversions that equal the `half` crate's, so host and device round identically.
//
// Invariants: every reduction here is deterministic (a fixed order of shuffles and shared
// memory steps for a given block size), so a kernel's result does not change between runs.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;

#define MET_INF __int_as_float(0x7f800000)
#define MET_FLT_MAX 3.402823466e+38f

__device__ __forceinline__ float bf2f(bf16_t h) { return __uint_as_float(((u32)h) << 16); }

// f32 -> bf16, round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_t f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

// Two f32 -> one register of two bf16 (lo in the low half), round to nearest even: one
// instruction, equal to two `f2bf` but for a NaN's payload.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// Eight bf16 (a 16-byte load) to f32, and back with round to nearest even.
__device__ __forceinline__ void unpack8(uint4 u, float* f) {
    const u32 w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ uint4 pack8(const float* f) {
    return make_uint4(pack_bf16(f[0], f[1]), pack_bf16(f[2], f[3]), pack_bf16(f[4], f[5]), pack_bf16(f[6], f[7]));
}

// ---- float8_e4m3fn (FP8 weights and KV caches): conversions need sm_89 on (cvt.*e4m3x2);
// the host keeps e4m3 tensors only on sm_90 devices, and on older ones these compile to
// nothing.

typedef unsigned char u8;

// f16x2 holding two e4m3 values (each a normal f16 or zero) -> the same values as bf16x2:
// exponent and mantissa moved to bf16's places give the value times 2^-112 (still a
// normal bf16), and one exact multiply by 2^112 puts it back.
__device__ __forceinline__ u32 f16x2_e4m3_to_bf16x2(u32 h) {
    const u32 t = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
    u32 r = t;
#if __CUDA_ARCH__ >= 900
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(t), "r"(0x77807780u));
#endif
    return r;
}

// Four e4m3 bytes (byte 0 lowest) -> f16 pairs, exactly (every e4m3 value is a normal f16
// or zero): `lo` holds bytes 0 and 1 (byte 0 in the low half), `hi` 2 and 3.
__device__ __forceinline__ void e4m3x4_to_f16(u32 w, u32& lo, u32& hi) {
    lo = 0;
    hi = 0;
#if __CUDA_ARCH__ >= 900
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, a;\n\tcvt.rn.f16x2.e4m3x2 %1, b;\n\t}"
        : "=r"(lo), "=r"(hi)
        : "r"(w));
#endif
}

// Four e4m3 bytes (byte 0 lowest) -> bf16 pairs: `lo` holds bytes 0 and 1, `hi` 2 and 3.
__device__ __forceinline__ void e4m3x4_to_bf16(u32 w, u32& lo, u32& hi) {
    u32 h0, h1;
    e4m3x4_to_f16(w, h0, h1);
    lo = f16x2_e4m3_to_bf16x2(h0);
    hi = f16x2_e4m3_to_bf16x2(h1);
}

// An f16 pair -> its two values as f32 (low half first): one conversion each, where going
// through bf16 takes four instructions a pair before the two bf16 -> f32 moves.
__device__ __forceinline__ void f16x2_to_f32(u32 h, float& lo, float& hi) {
    asm("{\n\t.reg .b16 a, b;\n\tmov.b32 {a, b}, %2;\n\tcvt.f32.f16 %0, a;\n\tcvt.f32.f16 %1, b;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "r"(h));
}

// Eight e4m3 bytes (byte 0 lowest) -> their values as f32, exactly.
__device__ __forceinline__ void unpack8_e4m3(uint2 w, float* f) {
    const u32 ws[2] = {w.x, w.y};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        u32 lo, hi;
        e4m3x4_to_f16(ws[i], lo, hi);
        f16x2_to_f32(lo, f[4 * i], f[4 * i + 1]);
        f16x2_to_f32(hi, f[4 * i + 2], f[4 * i + 3]);
    }
}

// Two f32 -> two e4m3 (round to nearest even, saturating at ±448) in the low 16 bits, `a`
// in the low byte.
__device__ __forceinline__ u32 e4m3x2_from(float a, float b) {
    unsigned short r = 0;
#if __CUDA_ARCH__ >= 900
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(b), "f"(a));
#endif
    return r;
}

// Eight e4m3 bytes (an 8-byte load, byte 0 lowest) -> eight bf16 as one 16-byte vector:
// the values exactly (e4m3 is a subset of bf16).
__device__ __forceinline__ uint4 e4m3x8_to_bf16(uint2 w) {
    u32 a, b, c, d;
    e4m3x4_to_bf16(w.x, a, b);
    e4m3x4_to_bf16(w.y, c, d);
    return make_uint4(a, b, c, d);
}

// One e4m3 byte -> its value.
__device__ __forceinline__ float e4m3_to_f(u8 b) {
    float f = 0.0f;
#if __CUDA_ARCH__ >= 900
    asm("{\n\t.reg .b16 a, lo, hi;\n\t.reg .b32 h;\n\tcvt.u16.u32 a, %1;\n\tcvt.rn.f16x2.e4m3x2 h, a;\n\t"
        "mov.b32 {lo, hi}, h;\n\tcvt.f32.f16 %0, lo;\n\t}"
        : "=f"(f)
        : "r"((u32)b));
#endif
    return f;
}

// One f32 -> e4m3, rounded to nearest even and saturated at ±448.
__device__ __forceinline__ u8 e4m3_from(float f) { return (u8)(e4m3x2_from(f, 0.0f) & 0xffu); }

// Rounds an f32 to the nearest bf16 value, kept as f32 (where transformers rounds an
// intermediate to bf16, the kernels do the same so their results stay close to it).
__device__ __forceinline__ float round_bf(float f) { return bf2f(f2bf(f)); }

__device__ __forceinline__ float load_f(const bf16_t* p, u64 i) { return bf2f(p[i]); }
__device__ __forceinline__ float load_f(const float* p, u64 i) { return p[i]; }
__device__ __forceinline__ void store_f(bf16_t* p, u64 i, float v) { p[i] = f2bf(v); }
__device__ __forceinline__ void store_f(float* p, u64 i, float v) { p[i] = v; }

// An RMSNorm weight `wi` times the normalised value `xn`: a bf16 weight multiplies the
// value rounded to bf16 (`LlamaRMSNorm`), an f32 weight (Gemma's `1 + w`, folded in at
// load) the f32 value (`GemmaRMSNorm`). The pointer only selects the rule.
__device__ __forceinline__ float norm_weighted(const bf16_t*, float wi, float xn) { return wi * round_bf(xn); }
__device__ __forceinline__ float norm_weighted(const float*, float wi, float xn) { return wi * xn; }

// SplitMix64's finaliser (`rng::mix64`).
__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide reductions for blocks of at most 1024 threads (a multiple of 32). Every thread
// gets the result. `scratch` holds 32 values of the reduced type.
__device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ double block_sum_d(double v, double* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.0;
    return warp_sum_d(v);
}

__device__ u64 block_sum_u64(u64 v, u64* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0ull;
    return warp_sum_u64(v);
}

__device__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : -MET_INF;
    return warp_max(v);
}

// Programmatic dependent launch (sm_90 on; no-ops before). The host launches every kernel
// allowed to start before the kernel ahead of it in the stream has finished (`launch_raw`
// in `src/cuda/mod.rs`), so each kernel must obey two rules:
//  - before `pdl_wait_prev()` returns it touches no memory that an earlier kernel of the
//    stream writes or reads: only data constant for the whole step, such as weights;
//  - every thread calls `pdl_wait_prev()`, before any early return, so the grid does not
//    finish before its predecessors and the ordering stays transitive down the stream.
// `pdl_allow_next()` lets the next kernel launch (and begin its own pre-wait work) once
// every block of this grid has called it; the next kernel still waits for this one's end.
// `pdl_enter()` is both, for kernels with nothing to do before their inputs are ready.
__device__ __forceinline__ void pdl_allow_next() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait_prev() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_enter() {
    pdl_allow_next();
    pdl_wait_prev();
}
