// The few CUDA names `cuda/gguf.cu`'s decoders use, for compiling them on the host
// (`tests/gguf_host_decode.rs`).
#include <cstdint>
#include <cstring>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>
typedef unsigned int u32;
typedef unsigned long long u64;
typedef unsigned short bf16_t;
struct uint4 {
    u32 x, y, z, w;
};
#define __device__
#define __forceinline__ inline
static inline float __uint_as_float(u32 u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// PTX `prmt.b32 d, a, b, s` (default mode): byte i of d is byte s[4i..4i+3] of {b, a}.
static inline u32 prmt(u32 a, u32 b, u32 s) {
    unsigned char pool[8];
    memcpy(pool, &a, 4);
    memcpy(pool + 4, &b, 4);
    u32 r = 0;
    for (int i = 0; i < 4; ++i) r |= (u32)pool[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
// PTX `cvt.f32.f16` of the low 16 bits of h: IEEE half to f32, exactly (normal and
// subnormal values, infinities, NaNs as NaNs).
static inline float cvt_f32_f16(u32 h) {
    const u32 sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    float v;
    if (exp == 0x1fu) {
        v = __uint_as_float(0x7f800000u | (man << 13));
    } else {
        v = std::ldexp((float)(exp ? (man | 0x400u) : man), (exp ? (int)exp : 1) - 25);
    }
    u32 bits;
    memcpy(&bits, &v, 4);
    return __uint_as_float(bits | sign);
}
static inline u32 __float_as_uint(float f) {
    u32 u;
    memcpy(&u, &f, 4);
    return u;
}
static inline uint4 make_uint4(u32 x, u32 y, u32 z, u32 w) { return uint4{x, y, z, w}; }
// A streaming load (`ld.global.cs`): a plain read on the host.
static inline uint4 __ldcs(const uint4* p) { return *p; }
// f32 -> bf16 bits, round to nearest even (NaN kept quiet), as `common.cuh` rounds.
static inline bf16_t f2bf(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}
static inline u32 pack_bf16(float lo, float hi) { return (u32)f2bf(lo) | ((u32)f2bf(hi) << 16); }
struct int4 {
    int x, y, z, w;
};
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
// `dp4a`: the four signed bytes of a times those of b, summed into c.
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// No kernel runs before a host call: the wait for one returns at once.
static inline void pdl_wait_prev() {}
