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

use super::PackedQuant;
use super::q8::WeightRow;
use super::x86::{WIDEN, widen};

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
    /// `a + b`, lane by lane.
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
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
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as in `zero`.
        unsafe { _mm512_add_ps(a, b) }
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
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        // SAFETY: as in `zero`.
        unsafe { _mm256_add_ps(a, b) }
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

/// The integer operations of one instruction set, for products of packed weight blocks
/// with `q8` activation blocks ([`super::x86_int`]).
pub(super) trait IntIsa: Isa {
    /// Integer lanes: quants in, i32 sums out.
    type I: Copy;
    /// Which lanes of an `F` a masked load keeps.
    type Mask: Copy;
    /// Lanes of `F`, and so blocks per minimum-term step.
    const LANES: usize;
    /// Blocks per step of the dot loop.
    const STEP: usize;
    /// Whether, from [`super::x86_int::PRODUCTS_FROM`] activation rows on, the pairs'
    /// scales come from products formed a group at a time rather than in the loop.
    const PRODUCTS: bool;
    /// All integer lanes zero.
    unsafe fn zero_int() -> Self::I;
    /// The quants of the activation blocks of a step at `qs` (32 bytes each; with `!FULL`
    /// the step's first block alone, the rest zero).
    unsafe fn load_acts<const FULL: bool>(qs: *const i8) -> Self::I;
    /// The scales of a step's blocks at `d`, each over its block's lanes (with `!FULL`
    /// the first block's alone).
    unsafe fn scales<const FULL: bool>(d: *const f32) -> Self::F;
    /// The value at `p` in every lane.
    unsafe fn broadcast(p: *const f32) -> Self::F;
    /// The i32 lanes as f32.
    unsafe fn to_f32(v: Self::I) -> Self::F;
    /// The first `left` lanes (all of them from `LANES` on).
    unsafe fn lane_mask(left: usize) -> Self::Mask;
    /// `LANES` f32 values at `p`, those outside `mask` zero and not read.
    unsafe fn load_masked(p: *const f32, mask: Self::Mask) -> Self::F;
    /// `LANES` f16 values at `p` (all readable) as f32, those outside `mask` zero.
    unsafe fn load_f16_masked(p: *const u16, mask: Self::Mask) -> Self::F;
}

/// Where a packed format's kernels find a row's arrays, whatever the instruction set.
pub(super) trait Rows {
    /// Row `r` of `p`, a matrix of this format.
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_>;
}

/// A packed weight format's blocks as an [`IntIsa`] multiplies them.
pub(super) trait Weights<S: IntIsa>: Rows {
    /// Whether the format has minimum terms (`m · dx · Σ qx`).
    const MINIMUMS: bool;
    /// Quant bytes per block, for `x86_int`'s prefetch.
    const BLOCK_BYTES: usize;
    /// A step's weight blocks, unpacked for [`Self::dot`].
    type Unpacked: Copy;
    /// A step's activation quants as [`Self::dot`] takes them, prepared once for every
    /// weight row.
    type Acts: Copy;
    /// The weight blocks of the step from block `b` of a row whose quants start at `qs`
    /// (with `!FULL` block `b` alone).
    unsafe fn unpack<const FULL: bool>(qs: *const u8, b: usize) -> Self::Unpacked;
    /// The activation quants of a step, prepared.
    unsafe fn prepare(qx: S::I) -> Self::Acts;
    /// The exact integer sum of each block of the step, in i32 lanes.
    unsafe fn dot(w: Self::Unpacked, qx: Self::Acts) -> S::I;

    /// The f32 scales of blocks `c .. c + n` of `row` into `out`: its f16 `d`s, widened.
    ///
    /// # Safety
    /// The CPU must have AVX and F16C; `row`'s arrays run on past its blocks (`WeightRow`).
    #[inline(always)]
    unsafe fn widen(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
        // SAFETY: as the caller guarantees.
        unsafe { widen(row.d, c, n, out) }
    }

    /// The minimums of `S::LANES` blocks of `row` from block `b`, those outside `mask`
    /// zero: its f16 `m`s, widened.
    ///
    /// # Safety
    /// The CPU must have `S`'s features; `row`'s arrays run on past its blocks.
    #[inline(always)]
    unsafe fn minimums(row: &WeightRow<'_>, b: usize, mask: S::Mask) -> S::F {
        // SAFETY: as the caller guarantees.
        unsafe { S::load_f16_masked(row.m.as_ptr().add(b), mask) }
    }
}

/// Q4_0 and Q4_1 blocks: 16 bytes of nibbles, low ones elements 0..16, high ones 16..32.
pub(super) struct Q4Blocks;

/// Q8_0 blocks: 32 signed bytes.
pub(super) struct Q8Blocks;

impl Rows for Q4Blocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::lean::<true>(p, r)
    }
}

impl Rows for Q8Blocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::lean::<false>(p, r)
    }
}

impl IntIsa for Avx512 {
    type I = __m512i;
    type Mask = __mmask16;
    const LANES: usize = 16;
    const STEP: usize = 2;
    const PRODUCTS: bool = false;

    #[inline(always)]
    unsafe fn zero_int() -> __m512i {
        // SAFETY: the CPU has AVX-512F (the trait's contract).
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn load_acts<const FULL: bool>(qs: *const i8) -> __m512i {
        // SAFETY: the caller guarantees the features and the step's blocks.
        unsafe { load_pair::<FULL>(qs.cast()) }
    }

    /// `[d[0] × 8, d[1] × 8]`, or `d[0]` in the low half for a step of one block (whose
    /// upper lanes multiply zero sums).
    #[inline(always)]
    unsafe fn scales<const FULL: bool>(d: *const f32) -> __m512 {
        // SAFETY: the caller guarantees the features and the step's scales.
        unsafe {
            if FULL {
                let two = _mm_castpd_ps(_mm_load_sd(d.cast()));
                _mm512_permutexvar_ps(
                    _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                    _mm512_castps128_ps512(two),
                )
            } else {
                _mm512_set1_ps(*d)
            }
        }
    }

    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> __m512 {
        // SAFETY: the caller guarantees the features and the value.
        unsafe { _mm512_set1_ps(*p) }
    }

    #[inline(always)]
    unsafe fn to_f32(v: __m512i) -> __m512 {
        // SAFETY: the CPU has AVX-512F (the trait's contract).
        unsafe { _mm512_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn lane_mask(left: usize) -> __mmask16 {
        if left >= 16 { 0xFFFF } else { (1u16 << left) - 1 }
    }

    #[inline(always)]
    unsafe fn load_masked(p: *const f32, mask: __mmask16) -> __m512 {
        // SAFETY: the caller guarantees the features and the lanes in `mask`.
        unsafe { _mm512_maskz_loadu_ps(mask, p) }
    }

    #[inline(always)]
    unsafe fn load_f16_masked(p: *const u16, mask: __mmask16) -> __m512 {
        // SAFETY: the caller guarantees the features and 16 readable values.
        unsafe { _mm512_maskz_mov_ps(mask, _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))) }
    }
}

/// The 64 bytes at `p` (two blocks), or the 32 of one block zero-extended.
///
/// # Safety
/// The CPU must have AVX-512F; those bytes must be readable.
#[inline(always)]
unsafe fn load_pair<const FULL: bool>(p: *const u8) -> __m512i {
    // SAFETY: as the caller guarantees.
    unsafe { if FULL { _mm512_loadu_si512(p.cast()) } else { _mm512_zextsi256_si512(_mm256_loadu_si256(p.cast())) } }
}

impl Weights<Avx512> for Q4Blocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = 16;
    type Unpacked = __m512i;
    type Acts = __m512i;

    /// Lanes of 128 bits: [low nibbles of the first block, its high nibbles, the same of
    /// the second], the element order of the activation blocks.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees AVX-512F/BW and the step's blocks.
        unsafe {
            let qs = qs.add(b * 16);
            if FULL {
                let (v, mask) = (_mm256_loadu_si256(qs.cast()), _mm256_set1_epi8(0x0F));
                let (lo, hi) = (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask));
                let t = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                _mm512_shuffle_i64x2::<0xD8>(t, t)
            } else {
                let (v, mask) = (_mm_loadu_si128(qs.cast()), _mm_set1_epi8(0x0F));
                let (lo, hi) = (_mm_and_si128(v, mask), _mm_and_si128(_mm_srli_epi16::<4>(v), mask));
                _mm512_zextsi256_si512(_mm256_set_m128i(hi, lo))
            }
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m512i) -> __m512i {
        qx
    }

    /// `vpdpbusd`: the nibbles are the unsigned operand.
    #[inline(always)]
    unsafe fn dot(u: __m512i, qx: __m512i) -> __m512i {
        // SAFETY: the caller guarantees AVX-512 VNNI.
        unsafe { _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, qx) }
    }
}

impl Weights<Avx512> for Q8Blocks {
    const MINIMUMS: bool = false;
    const BLOCK_BYTES: usize = 32;
    /// `|w|` and the lanes where `w` is negative.
    type Unpacked = (__m512i, __mmask64);
    type Acts = __m512i;

    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, b: usize) -> (__m512i, __mmask64) {
        // SAFETY: the caller guarantees AVX-512F/BW and the step's blocks.
        unsafe {
            let w = load_pair::<FULL>(qs.add(b * 32));
            (_mm512_abs_epi8(w), _mm512_movepi8_mask(w))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m512i) -> __m512i {
        qx
    }

    /// `vpdpbusd` of `|w|` with `qx` carrying `w`'s sign (the sign trick).
    #[inline(always)]
    unsafe fn dot((u, neg): (__m512i, __mmask64), qx: __m512i) -> __m512i {
        // SAFETY: the caller guarantees AVX-512BW and VNNI.
        unsafe {
            let zero = _mm512_setzero_si512();
            _mm512_dpbusd_epi32(zero, u, _mm512_mask_sub_epi8(qx, neg, zero, qx))
        }
    }
}

impl IntIsa for Avx2 {
    type I = __m256i;
    type Mask = __m256i;
    const LANES: usize = 8;
    const STEP: usize = 1;
    const PRODUCTS: bool = true;

    #[inline(always)]
    unsafe fn zero_int() -> __m256i {
        // SAFETY: the CPU has AVX (the trait's contract).
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn load_acts<const FULL: bool>(qs: *const i8) -> __m256i {
        // SAFETY: the caller guarantees the features and the block.
        unsafe { _mm256_loadu_si256(qs.cast()) }
    }

    #[inline(always)]
    unsafe fn scales<const FULL: bool>(d: *const f32) -> __m256 {
        // SAFETY: the caller guarantees the features and the scale.
        unsafe { _mm256_set1_ps(*d) }
    }

    #[inline(always)]
    unsafe fn broadcast(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees the features and the value.
        unsafe { _mm256_broadcast_ss(&*p) }
    }

    #[inline(always)]
    unsafe fn to_f32(v: __m256i) -> __m256 {
        // SAFETY: the CPU has AVX (the trait's contract).
        unsafe { _mm256_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn lane_mask(left: usize) -> __m256i {
        let left = left.min(8) as i32;
        // SAFETY: the CPU has AVX2 (the trait's contract).
        unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
    }

    #[inline(always)]
    unsafe fn load_masked(p: *const f32, mask: __m256i) -> __m256 {
        // SAFETY: the caller guarantees the features and the lanes in `mask`.
        unsafe { _mm256_maskload_ps(p, mask) }
    }

    #[inline(always)]
    unsafe fn load_f16_masked(p: *const u16, mask: __m256i) -> __m256 {
        // SAFETY: the caller guarantees the features and 8 readable values.
        unsafe { _mm256_and_ps(_mm256_cvtph_ps(_mm_loadu_si128(p.cast())), _mm256_castsi256_ps(mask)) }
    }
}

impl Weights<Avx2> for Q4Blocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = 16;
    type Unpacked = __m256i;
    type Acts = __m256i;

    /// The block's 16 bytes go to both halves, the upper one shifted by a nibble, so after
    /// the mask the lower half holds the low nibbles (elements 0..16) and the upper one the
    /// high ones (16..32): three instructions instead of five.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, b: usize) -> __m256i {
        // SAFETY: the caller guarantees AVX2 and the block.
        unsafe {
            let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.add(b * 16).cast()));
            let nibble = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
            _mm256_and_si256(_mm256_srlv_epi32(v, nibble), _mm256_set1_epi8(0x0F))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m256i) -> __m256i {
        qx
    }

    /// `vpmaddubsw` (the nibbles unsigned), then `vpmaddwd` by ones into i32.
    #[inline(always)]
    unsafe fn dot(u: __m256i, qx: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, qx), _mm256_set1_epi16(1)) }
    }
}

impl Weights<Avx2> for Q8Blocks {
    const MINIMUMS: bool = false;
    const BLOCK_BYTES: usize = 32;
    /// `|w|` and `w` (whose signs `qx` takes).
    type Unpacked = (__m256i, __m256i);
    type Acts = __m256i;

    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, b: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2 and the block.
        unsafe {
            let w = _mm256_loadu_si256(qs.add(b * 32).cast());
            (_mm256_sign_epi8(w, w), w)
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m256i) -> __m256i {
        qx
    }

    /// `vpmaddubsw` of `|w|` with `qx` carrying `w`'s sign (the sign trick).
    #[inline(always)]
    unsafe fn dot((u, w): (__m256i, __m256i), qx: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(qx, w)), _mm256_set1_epi16(1)) }
    }
}
