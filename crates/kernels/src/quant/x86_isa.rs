//! The vector operations the x86 kernels are written in, once per instruction set: the
//! only place where the AVX-512 and AVX2 kernels differ.
//!
//! The kernels ([`super::x86`]'s f32 products, [`super::x86_int`]'s integer ones) each
//! have one body, generic over an [`Isa`] ([`Avx512`] or [`Avx2`]), instantiated inside
//! a `#[target_feature]` function per set. Every method here is `#[inline(always)]`, so
//! once a body is inlined into that function the intrinsics inline too and it compiles
//! to what a hand-written twin would: the same instructions, the same order of every
//! floating-point operation, hence the same bits.
//!
//! The sets differ in more than width. AVX-512 takes two integer blocks (64 quants) per
//! step and forms each pair's scale in the loop; AVX2 takes one block per step and, from
//! a few activation rows on, reads the scales from products formed a group at a time
//! ([`IntIsa::PRODUCTS`]). Those choices are constants of the set, so the generic bodies
//! keep each set's measured form.
//!
//! # Safety
//! Every method requires the CPU to have its set's features: the kernels call them only
//! inside functions that enable those features. Methods that read through a pointer also
//! need what their docs say to be readable.

use std::arch::x86_64::*;

/// The AVX-512 kernels (F and BW; the integer ones also VNNI).
#[derive(Clone, Copy)]
pub(super) struct Avx512;

/// The AVX2 kernels (with FMA and F16C).
#[derive(Clone, Copy)]
pub(super) struct Avx2;

/// The f32 vector operations of one instruction set.
pub(super) trait Isa {
    /// f32 lanes.
    type F: Copy;
    /// One block's 32 values as vectors, in element order.
    type Block: Copy + AsRef<[Self::F]>;
    /// All lanes zero.
    unsafe fn zero() -> Self::F;
    /// A block of zeros.
    unsafe fn zero_block() -> Self::Block;
    /// `v` in every lane.
    unsafe fn splat(v: f32) -> Self::F;
    /// `a · b`, lane by lane.
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a · b + c` with one rounding, lane by lane.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// The sum of the lanes, in the set's fixed tree.
    unsafe fn reduce(v: Self::F) -> f32;
    /// The 32 values at `x`.
    unsafe fn load_block(x: *const f32) -> Self::Block;
    /// A Q4 block's 16 bytes at `qs` as 32 values: low nibbles first, then high ones.
    unsafe fn widen_q4(qs: *const u8) -> Self::Block;
    /// A Q8_0 block's 32 signed bytes at `qs` as values.
    unsafe fn widen_q8(qs: *const u8) -> Self::Block;
}

impl Isa for Avx512 {
    type F = __m512;
    type Block = [__m512; 2];

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: the CPU has AVX-512F (the trait's contract).
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn zero_block() -> [__m512; 2] {
        // SAFETY: as in `zero`.
        unsafe { [_mm512_setzero_ps(); 2] }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: as in `zero`.
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as in `zero`.
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: as in `zero`.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn reduce(v: __m512) -> f32 {
        // SAFETY: as in `zero`.
        unsafe { _mm512_reduce_add_ps(v) }
    }

    #[inline(always)]
    unsafe fn load_block(x: *const f32) -> [__m512; 2] {
        // SAFETY: the caller guarantees the features and 32 readable values.
        unsafe { [_mm512_loadu_ps(x), _mm512_loadu_ps(x.add(16))] }
    }

    #[inline(always)]
    unsafe fn widen_q4(qs: *const u8) -> [__m512; 2] {
        // SAFETY: the caller guarantees the features and 16 readable bytes.
        unsafe {
            let (mask, qs) = (_mm_set1_epi8(0x0F), _mm_loadu_si128(qs.cast()));
            let (lo, hi) = (_mm_and_si128(qs, mask), _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
            [_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi))]
        }
    }

    #[inline(always)]
    unsafe fn widen_q8(qs: *const u8) -> [__m512; 2] {
        // SAFETY: the caller guarantees the features and 32 readable bytes.
        unsafe {
            let (lo, hi) = (_mm_loadu_si128(qs.cast()), _mm_loadu_si128(qs.add(16).cast()));
            [_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi))]
        }
    }
}

impl Isa for Avx2 {
    type F = __m256;
    type Block = [__m256; 4];

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the CPU has AVX (the trait's contract).
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn zero_block() -> [__m256; 4] {
        // SAFETY: as in `zero`.
        unsafe { [_mm256_setzero_ps(); 4] }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        // SAFETY: as in `zero`.
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: as in `zero`.
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the CPU has FMA (the trait's contract).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn reduce(v: __m256) -> f32 {
        // SAFETY: the CPU has AVX (the trait's contract).
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
        }
    }

    #[inline(always)]
    unsafe fn load_block(x: *const f32) -> [__m256; 4] {
        // SAFETY: the caller guarantees the features and 32 readable values.
        unsafe {
            [_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)), _mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24))]
        }
    }

    #[inline(always)]
    unsafe fn widen_q4(qs: *const u8) -> [__m256; 4] {
        // SAFETY: the caller guarantees the features and 16 readable bytes.
        unsafe {
            let (mask, qs) = (_mm_set1_epi8(0x0F), _mm_loadu_si128(qs.cast()));
            let (lo, hi) = (_mm_and_si128(qs, mask), _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
            [widen_u8(lo), widen_u8(_mm_srli_si128(lo, 8)), widen_u8(hi), widen_u8(_mm_srli_si128(hi, 8))]
        }
    }

    #[inline(always)]
    unsafe fn widen_q8(qs: *const u8) -> [__m256; 4] {
        // SAFETY: the caller guarantees the features and 32 readable bytes.
        unsafe {
            let q = _mm256_loadu_si256(qs.cast());
            let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
            [widen_i8(lo), widen_i8(_mm_srli_si128(lo, 8)), widen_i8(hi), widen_i8(_mm_srli_si128(hi, 8))]
        }
    }
}

/// The low 8 bytes of `v`, unsigned, as f32.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn widen_u8(v: __m128i) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)) }
}

/// The low 8 bytes of `v`, signed, as f32.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn widen_i8(v: __m128i) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)) }
}
