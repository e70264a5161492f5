// The decoders of `cuda/gguf.cu` (`gguf_load`, `gguf_decode`, `gguf_chunk_k`) on the host,
// against a byte-by-byte reading of the regions (the reading `src/cuda/gguf.rs`'s unit test
// checks against the host's dequantisation): every weight of three rows of 2,304 in each
// format, random quants and finite f16 scales; then what the kernels build on them: the 32
// lanes' shares of a GEMV row (`gguf_gemv_lane`, summed here as the shuffle tree would)
// against an f64 dot on those weights, for one to eight activation rows, and the widened
// rows (`gguf_widen_unit`) against the weights rounded to bf16; for Q4_K and Q6_K, the int8
// lanes (`check_q8_rows`). Prints "bad N"; exits non-zero when N > 0.
// Built and run by `tests/gguf_host_decode.rs`, which writes `k.h` (the shims, then the
// decoders' part of gguf.cu).
#include "k.h"
// Byte-level decode of the regions (the Rust test's `decode`, which equals the host's dequantisation).
static float h2f(const unsigned char* p) { u32 h = p[0] | (p[1] << 8); return gguf_h2f(h); }
static float ref(u32 f, const unsigned char* base, const u64 st[4], u64 rb[4], u64 k, u64 r, u64 j, bool zero_q = false) {
  auto reg = [&](int i, u64 at) { return base[st[i] + r * rb[i] + at]; };
  auto hh = [&](int i, u64 at) { unsigned char b[2] = {reg(i, at), reg(i, at + 1)}; return h2f(b); };
  if (f == GGUF_Q8_0) return hh(3, j / 32 * 2) * (float)(signed char)reg(0, j);
  if (f == GGUF_Q4_0) { u64 blk = j / 32, e = j % 32; unsigned b = reg(0, blk * 16 + e % 16); unsigned q = e < 16 ? b & 15 : b >> 4; return ((float)q - 8.0f) * hh(3, blk * 2); }
  if (f == GGUF_Q4_K || f == GGUF_Q5_K) {
    u64 s = j / 256, w = j % 256, sub = w / 32, l = w % 32;
    auto rec = [&](u64 i) { return (unsigned)reg(2, s * 16 + i); };
    unsigned sc, mn;
    if (sub < 4) { sc = rec(sub) & 63; mn = rec(sub + 4) & 63; } else { sc = (rec(sub + 4) & 15) | ((rec(sub - 4) >> 6) << 4); mn = (rec(sub + 4) >> 4) | ((rec(sub) >> 6) << 4); }
    float d = hh(2, s * 16 + 12), dmin = hh(2, s * 16 + 14);
    unsigned b = reg(0, s * 128 + sub / 2 * 32 + l); unsigned q = zero_q ? 0 : sub % 2 == 0 ? b & 15 : b >> 4;
    if (f == GGUF_Q5_K) q += ((reg(1, s * 32 + l) >> sub) & 1) << 4;
    return (d * (float)sc) * (float)q - dmin * (float)mn;
  }
  u64 s = j / 256, w = j % 256, n = w / 128; w %= 128; u64 c = w / 32, l = w % 32;
  unsigned ql = reg(0, s * 128 + n * 64 + (c % 2) * 32 + l); unsigned nib = c < 2 ? ql & 15 : ql >> 4;
  unsigned hi = (reg(1, s * 64 + n * 32 + l) >> (2 * c)) & 3; int q = zero_q ? -32 : (int)(nib | hi << 4) - 32;
  signed char sc = (signed char)reg(2, s * 16 + n * 8 + l / 16 + 2 * c);
  return (hh(3, s * 2) * (float)sc) * (float)q;
}
// A matrix of `rows` rows of k weights in format f: random quants, finite f16 scales.
struct Mat {
  u64 rb[4], st[4]; std::vector<unsigned char> buf; unsigned char* base; GgufMat m;
  Mat(u32 f, u64 k, u64 rows, unsigned seed) {
    switch (f) { case GGUF_Q4_0: rb[0]=k/2; rb[1]=0; rb[2]=0; rb[3]=k/32*2; break; case GGUF_Q8_0: rb[0]=k; rb[1]=0; rb[2]=0; rb[3]=k/32*2; break;
      case GGUF_Q4_K: rb[0]=k/2; rb[1]=0; rb[2]=k/256*16; rb[3]=0; break; case GGUF_Q5_K: rb[0]=k/2; rb[1]=k/8; rb[2]=k/256*16; rb[3]=0; break;
      default: rb[0]=k/2; rb[1]=k/4; rb[2]=k/16; rb[3]=k/256*2; }
    u64 end = 0; for (int i = 0; i < 4; ++i) { st[i] = end; end += (rb[i] * rows + 255) / 256 * 256; }
    buf.resize(end + 64);
    // 16-byte aligned base
    base = buf.data(); while ((uintptr_t)base % 16) ++base;
    srand(seed); for (u64 i = 0; i < end; ++i) base[i] = rand() & 255;
    // sane f16 scales: exponent field small, finite
    auto fix_half = [&](u64 at) { base[at + 1] = 0x2c | (base[at + 1] & 3); };
    for (u64 r = 0; r < rows; ++r) {
      if (f == GGUF_Q4_0 || f == GGUF_Q8_0) for (u64 b = 0; b < k / 32; ++b) fix_half(st[3] + r * rb[3] + 2 * b);
      if (f == GGUF_Q6_K) for (u64 b = 0; b < k / 256; ++b) fix_half(st[3] + r * rb[3] + 2 * b);
      if (f == GGUF_Q4_K || f == GGUF_Q5_K) for (u64 b = 0; b < k / 256; ++b) { fix_half(st[2] + r * rb[2] + 16 * b + 12); fix_half(st[2] + r * rb[2] + 16 * b + 14); }
    }
    m.qs = (u64)(uintptr_t)(base + st[0]); m.qh = (u64)(uintptr_t)(base + st[1]); m.sc = (u64)(uintptr_t)(base + st[2]); m.d = (u64)(uintptr_t)(base + st[3]); m.format = f; m.k = k;
  }
};
// The int8 GEMV lanes (`gguf_q8_lane`) on a longer row, k = 5,376 (84 units: lanes 0 .. 19
// take three, so their prefetch runs twice): x rounded to int8 blocks of 32 as
// `gguf_quantize_q8` rounds it; the 32 lanes' shares, summed as the shuffle tree would,
// against an f64 dot of the weights with that x, for one to eight x rows; and a row's sums
// taken two rows at once (the SwiGLU form) equal its sums alone, bit for bit. Returns the
// count of bad results.
template <u32 F>
static int check_q8_rows(Mat& mat, u64 k, u64 rows) {
  int bad = 0;
  const u32 blocks = (u32)(8 * k / 32);
  std::vector<signed char> xq(8 * k); std::vector<float2> xds(blocks); std::vector<double> xv(8 * k);
  for (u32 b = 0; b < blocks; ++b) {
    float v[32], amax = 0.0f;
    for (int i = 0; i < 32; ++i) { v[i] = __uint_as_float((u32)f2bf(((rand() % 2001) - 1000) / 997.0f) << 16); amax = std::fmax(amax, std::fabs(v[i])); }
    const float d = amax / 127.0f; int sum = 0;
    for (int i = 0; i < 32; ++i) { const int q = amax > 0.0f ? (int)std::nearbyint(v[i] / d) : 0; xq[b * 32 + i] = (signed char)q; sum += q; xv[b * 32 + i] = (double)q * d; }
    xds[b] = make_float2(d, d * (float)sum);
  }
  for (u32 m_rows = 1; m_rows <= 8; ++m_rows) {
    for (u64 r = 0; r + 1 < rows; ++r) {
      double got[2][8] = {{0}};
      for (u32 lane = 0; lane < 32; ++lane) {
        float acc1[1][8], acc2[2][8];
        const u32 one[1] = {(u32)r}, two[2] = {(u32)r, (u32)r + 1};
        gguf_q8_lane<F, 8, 1>(xq.data(), xds.data(), mat.m, one, m_rows, lane, acc1);
        gguf_q8_lane<F, 8, 2>(xq.data(), xds.data(), mat.m, two, m_rows, lane, acc2);
        for (u32 t = 0; t < m_rows; ++t) {
          if (acc1[0][t] != acc2[0][t]) { if (bad++ < 10) printf("format %u int8 row %llu lane %u: alone %g, in a pair %g\n", F, r, lane, acc1[0][t], acc2[0][t]); }
          got[0][t] += acc2[0][t]; got[1][t] += acc2[1][t];
        }
      }
      for (u64 h = 0; h < 2; ++h) for (u32 t = 0; t < m_rows; ++t) {
        double want = 0, mag = 0;
        for (u64 j = 0; j < k; ++j) {
          const double w = ref(F, mat.base, mat.st, mat.rb, k, r + h, j), off = ref(F, mat.base, mat.st, mat.rb, k, r + h, j, true);
          want += w * xv[t * k + j]; mag += (std::fabs(w) + std::fabs(off)) * std::fabs(xv[t * k + j]);
        }
        if (std::fabs(got[h][t] - want) > 1e-5 * mag + 1e-9) { if (bad++ < 10) printf("format %u int8 m=%u row %llu token %u: %g vs %g\n", F, m_rows, r + h, t, got[h][t], want); }
      }
    }
  }
  return bad;
}
static int check_q8_lanes(u32 f) {
  const u64 k = 5376, rows = 3;
  Mat mat(f, k, rows, 70 + f);
  const int bad = f == GGUF_Q4_K ? check_q8_rows<GGUF_Q4_K>(mat, k, rows) : check_q8_rows<GGUF_Q6_K>(mat, k, rows);
  printf("int8 format %u checked\n", f);
  return bad;
}
int main() {
  // 36 units a row: lanes 0 .. 3 take two (the prefetch), the rest one.
  const u64 k = 2304, rows = 3; int bad = 0;
  for (u32 f = 0; f < 5; ++f) {
    Mat mat(f, k, rows, 7 + f); const u64* st = mat.st; u64* rb = mat.rb; unsigned char* base = mat.base; GgufMat m = mat.m;
    for (u64 r = 0; r < rows; ++r) for (u32 u = 0; u < k / 64; ++u) {
      GgufUnit g;
      switch (f) { case 0: g = gguf_load<0>(m, r, u); break; case 1: g = gguf_load<1>(m, r, u); break; case 2: g = gguf_load<2>(m, r, u); break; case 3: g = gguf_load<3>(m, r, u); break; default: g = gguf_load<4>(m, r, u); }
      for (u32 c = 0; c < 4; ++c) {
        float w[16]; u32 k0;
        switch (f) { case 0: gguf_decode<0>(g, u, c, w); k0 = gguf_chunk_k<0>(u, c); break; case 1: gguf_decode<1>(g, u, c, w); k0 = gguf_chunk_k<1>(u, c); break;
          case 2: gguf_decode<2>(g, u, c, w); k0 = gguf_chunk_k<2>(u, c); break; case 3: gguf_decode<3>(g, u, c, w); k0 = gguf_chunk_k<3>(u, c); break;
          default: gguf_decode<4>(g, u, c, w); k0 = gguf_chunk_k<4>(u, c); }
        for (u32 i = 0; i < 16; ++i) {
          float want = ref(f, base, st, rb, k, r, k0 + i);
          if (std::fabs(w[i] - want) > 1e-6f * (std::fabs(want) + 1e-3f)) { if (bad++ < 10) printf("format %u row %llu k %u: %g vs %g\n", f, r, k0 + i, w[i], want); }
        }
      }
    }
    // The GEMV lanes' shares, for m = 1 .. 8 activation rows (bf16 bits of small values).
    std::vector<bf16_t> x(8 * k);
    for (auto& v : x) v = f2bf(((rand() % 2001) - 1000) / 1000.0f);
    auto xf = [&](u64 i) { return (double)__uint_as_float((u32)x[i] << 16); };
    for (u32 m_rows = 1; m_rows <= 8; ++m_rows) {
      for (u64 r = 0; r < rows; ++r) {
        double got[8] = {0}, want[8] = {0}, mag[8] = {0};
        for (u32 lane = 0; lane < 32; ++lane) {
          float acc[8];
          switch (f) { case 0: gguf_gemv_lane<0, 8>(x.data(), m, m_rows, r, lane, acc); break; case 1: gguf_gemv_lane<1, 8>(x.data(), m, m_rows, r, lane, acc); break;
            case 2: gguf_gemv_lane<2, 8>(x.data(), m, m_rows, r, lane, acc); break; case 3: gguf_gemv_lane<3, 8>(x.data(), m, m_rows, r, lane, acc); break;
            default: gguf_gemv_lane<4, 8>(x.data(), m, m_rows, r, lane, acc); }
          for (u32 t = 0; t < m_rows; ++t) got[t] += acc[t];
        }
        for (u32 t = 0; t < m_rows; ++t) {
          for (u64 j = 0; j < k; ++j) { double p = xf(t * k + j) * ref(f, base, st, rb, k, r, j); want[t] += p; mag[t] += std::fabs(p); }
          if (std::fabs(got[t] - want[t]) > 1e-5 * mag[t] + 1e-9) { if (bad++ < 10) printf("format %u gemv m=%u row %llu token %u: %g vs %g\n", f, m_rows, r, t, got[t], want[t]); }
        }
      }
    }
    // The widened rows.
    for (u64 r = 0; r < rows; ++r) {
      std::vector<bf16_t> o(k);
      for (u32 u = 0; u < k / 64; ++u) {
        switch (f) { case 0: gguf_widen_unit<0>(m, r, u, o.data()); break; case 1: gguf_widen_unit<1>(m, r, u, o.data()); break;
          case 2: gguf_widen_unit<2>(m, r, u, o.data()); break; case 3: gguf_widen_unit<3>(m, r, u, o.data()); break;
          default: gguf_widen_unit<4>(m, r, u, o.data()); }
      }
      for (u64 j = 0; j < k; ++j) {
        const int diff = (int)o[j] - (int)f2bf(ref(f, base, st, rb, k, r, j));
        if (diff > 1 || diff < -1) { if (bad++ < 10) printf("format %u widen row %llu k %llu: bits %x vs %x\n", f, r, j, o[j], f2bf(ref(f, base, st, rb, k, r, j))); }
      }
    }
    if (f == GGUF_Q4_K || f == GGUF_Q6_K) bad += check_q8_lanes(f);
    printf("format %u checked\n", f);
  }
  printf("bad %d\n", bad); return bad != 0;
}
