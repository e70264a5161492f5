//! The K-quants' blocks (Q4_K, Q5_K, Q6_K in the packed layout of `packed_k`) as the
//! integer kernels of [`super::x86_int`] multiply them, for AVX-512 VNNI and AVX2.
//!
//! The kernels see 32-element blocks with one f32 scale each, so each format says how to
//! get there: Q4_K and Q5_K widen `d · sc` per block (exact, 11 by 6 bits) and give
//! `−dmin · mn` as the block's minimum; Q6_K widens the super-block's `d` for each of its
//! blocks and multiplies the two sub-block scales into the integer sums instead.
//!
//! Why the sums are exact (no saturation anywhere):
//! - Q4_K/Q5_K put the unsigned quant (0..=31) in the u8 operand and `qx` in the i8 one, as
//!   Q4_0 does; `vpmaddubsw` pairs stay within ±7874.
//! - Q6_K forms `Σ q · qx − 32 · Σ qx` per pair of elements in i16 (`vpmaddubsw` of the
//!   unsigned quant (0..=63), minus that of 32; each within ±16 002, the difference within
//!   ±8128), then `vpmaddwd` by the sub-block's i8 scale sums two pairs into i32 (within
//!   ±2 080 768).
//!
//! A step's unpacking depends only on its block index, never on the rows beside it, so
//! each (weight row, activation row) pair sees the same operations whatever the tile.

use std::arch::x86_64::*;

use super::PackedQuant;
use super::packed_k::BLOCKS_PER_SUPER;
use super::q8::WeightRow;
use super::x86::WIDEN;
use super::x86_isa::{Avx2, Avx512, IntIsa, Isa, Q4Blocks, Rows, Weights};

/// Q4_K blocks: chunks of 32 bytes of nibbles.
pub(super) struct Q4KBlocks;

/// Q5_K blocks: chunks of 32 bytes of nibbles and a u64 of fifth bits.
pub(super) struct Q5KBlocks;

/// Q6_K blocks: chunks of 32 bytes of nibbles and 16 bytes of bits 4–5.
pub(super) struct Q6KBlocks;

impl Rows for Q4KBlocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::of_k(p, r)
    }
}

impl Rows for Q5KBlocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::of_k(p, r)
    }
}

impl Rows for Q6KBlocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::of_k(p, r)
    }
}

/// Bytes of a chunk (two blocks) of each format.
const Q4K_CHUNK: usize = 32;
const Q5K_CHUNK: usize = 40;
const Q6K_CHUNK: usize = 48;

/// The super-block scales of the group of blocks from `c` (a multiple of [`WIDEN`], so 8
/// super-blocks), widened.
///
/// # Safety
/// The CPU must have AVX and F16C; `d` runs on 8 values past `c / 8` (`WeightRow`).
#[inline(always)]
unsafe fn super_scales(d: &[u16], c: usize) -> [f32; WIDEN / BLOCKS_PER_SUPER] {
    let mut out = [0f32; WIDEN / BLOCKS_PER_SUPER];
    // SAFETY: as the caller guarantees; `out` holds 8 values.
    unsafe { _mm256_storeu_ps(out.as_mut_ptr(), _mm256_cvtph_ps(_mm_loadu_si128(d.as_ptr().add(c / 8).cast()))) };
    out
}

/// Q4_K/Q5_K: `out[j] = d · sc` of block `c + j`.
///
/// # Safety
/// The CPU must have AVX2 and F16C; `n ≤ WIDEN` is a multiple of 8 and the row's arrays
/// run on past its blocks.
#[inline(always)]
unsafe fn widen_scaled(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
    // SAFETY: as the caller guarantees; every store is within the first `n` of `out`.
    unsafe {
        let d = super_scales(row.d, c);
        for (s, &d) in d.iter().enumerate().take(n / BLOCKS_PER_SUPER) {
            let sc = _mm_loadl_epi64(row.sc.as_ptr().add(c + 8 * s).cast());
            let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc));
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * s), _mm256_mul_ps(sc, _mm256_set1_ps(d)));
        }
    }
}

/// The nibbles of block `b` from its chunk's 32 bytes `v` (low ones for an even block).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn nibbles_256(v: __m256i, b: usize) -> __m256i {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (b % 2) as i32)), _mm256_set1_epi8(0x0F)) }
}

/// The nibbles of a chunk's 32 bytes `v` as both its blocks in element order, or (with
/// `!FULL`) block `b` alone, zero-extended.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2.
#[inline(always)]
unsafe fn nibbles_512<const FULL: bool>(v: __m256i, b: usize) -> __m512i {
    // SAFETY: as the caller guarantees.
    unsafe {
        if FULL {
            let mask = _mm256_set1_epi8(0x0F);
            let (lo, hi) = (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
        } else {
            _mm512_zextsi256_si512(nibbles_256(v, b))
        }
    }
}

/// Q4_K/Q5_K at AVX-512: the minimums `−dmin · mn` of 16 blocks from `b` (two
/// super-blocks), those outside `mask` zero.
///
/// # Safety
/// The CPU must have AVX-512F and F16C; the row's arrays run on past its blocks.
#[inline(always)]
unsafe fn minimums_512(row: &WeightRow<'_>, b: usize, mask: __mmask16) -> __m512 {
    // SAFETY: as the caller guarantees: 16 minimums and 2 f16 `dmin`s from `b` are readable.
    unsafe {
        let mn = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(row.mn.as_ptr().add(b).cast())));
        // Flipping the f16 sign bits negates exactly.
        let bits = row.m.as_ptr().add(b / BLOCKS_PER_SUPER).cast::<u32>().read_unaligned() ^ 0x8000_8000;
        let two = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(bits.cast_signed())));
        let dmin = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), two);
        _mm512_maskz_mul_ps(mask, mn, dmin)
    }
}

/// Q4_K/Q5_K at AVX2: the minimums `−dmin · mn` of the 8 blocks from `b` (one
/// super-block), those outside `mask` zero.
///
/// # Safety
/// The CPU must have AVX2 and F16C; the row's arrays run on past its blocks.
#[inline(always)]
unsafe fn minimums_256(row: &WeightRow<'_>, b: usize, mask: __m256i) -> __m256 {
    // SAFETY: as the caller guarantees: 8 minimums and a `dmin` from `b` are readable.
    unsafe {
        let mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(row.mn.as_ptr().add(b).cast())));
        let bits = i32::from(row.m[b / BLOCKS_PER_SUPER] ^ 0x8000);
        let dmin = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
        _mm256_and_ps(_mm256_mul_ps(mn, dmin), _mm256_castsi256_ps(mask))
    }
}

/// Implements `widen` and `minimums` of the Q4_K-like formats at one instruction set.
macro_rules! scaled_with_minimums {
    ($isa:ty, $minimums:ident) => {
        #[inline(always)]
        unsafe fn widen(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
            // SAFETY: the caller guarantees the features and the row's arrays.
            unsafe { widen_scaled(row, c, n, out) }
        }

        #[inline(always)]
        unsafe fn minimums(row: &WeightRow<'_>, b: usize, mask: <$isa as IntIsa>::Mask) -> <$isa as Isa>::F {
            // SAFETY: the caller guarantees the features and the row's arrays.
            unsafe { $minimums(row, b, mask) }
        }
    };
}

impl Weights<Avx512> for Q4KBlocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = Q4K_CHUNK / 2;
    type Unpacked = __m512i;
    type Acts = __m512i;

    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, _: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees the features and the step's chunk.
        unsafe { nibbles_512::<FULL>(_mm256_loadu_si256(qs.add(Q4K_CHUNK * (b / 2)).cast()), b) }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m512i) -> __m512i {
        qx
    }

    #[inline(always)]
    unsafe fn dot(u: __m512i, qx: __m512i) -> __m512i {
        // SAFETY: the caller guarantees AVX-512 VNNI.
        unsafe { <Q4Blocks as Weights<Avx512>>::dot(u, qx) }
    }

    scaled_with_minimums!(Avx512, minimums_512);
}

impl Weights<Avx512> for Q5KBlocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = Q5K_CHUNK / 2;
    type Unpacked = __m512i;
    type Acts = __m512i;

    /// Q4_K's nibbles, plus 16 where the chunk's u64 has the element's bit.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, _: *const u8, b: usize) -> __m512i {
        // SAFETY: the caller guarantees the features and the step's chunk.
        unsafe {
            let chunk = qs.add(Q5K_CHUNK * (b / 2));
            let u = nibbles_512::<FULL>(_mm256_loadu_si256(chunk.cast()), b);
            let hi = chunk.add(32).cast::<u64>().read_unaligned();
            let hi = if FULL { hi } else { (hi >> (32 * (b % 2))) & 0xFFFF_FFFF };
            _mm512_mask_add_epi8(u, hi, u, _mm512_set1_epi8(16))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m512i) -> __m512i {
        qx
    }

    #[inline(always)]
    unsafe fn dot(u: __m512i, qx: __m512i) -> __m512i {
        // SAFETY: the caller guarantees AVX-512 VNNI.
        unsafe { <Q4Blocks as Weights<Avx512>>::dot(u, qx) }
    }

    scaled_with_minimums!(Avx512, minimums_512);
}

impl Weights<Avx512> for Q6KBlocks {
    const MINIMUMS: bool = false;
    const BLOCK_BYTES: usize = Q6K_CHUNK / 2;
    /// The unsigned quants and each i16 lane's sub-block scale.
    type Unpacked = (__m512i, __m512i);
    /// The quants and `32 · (qx_2i + qx_2i+1)` per i16 lane.
    type Acts = (__m512i, __m512i);

    /// The nibbles and bits 4–5 (each 128-bit lane, 16 elements, rotating its bit pair
    /// into place); with `!FULL` and an odd block, the upper half moved down.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, sc: *const u8, b: usize) -> (__m512i, __m512i) {
        // SAFETY: the caller guarantees the features, the step's chunk, and four scales
        // from `2 · b` (the row's scales run on past its blocks).
        unsafe {
            let chunk = qs.add(Q6K_CHUNK * (b / 2));
            let nib = nibbles_512::<true>(_mm256_loadu_si256(chunk.cast()), b);
            let hi = _mm512_broadcast_i32x4(_mm_loadu_si128(chunk.add(32).cast()));
            let hi = _mm512_rolv_epi64(hi, _mm512_setr_epi64(4, 4, 2, 2, 0, 0, 62, 62));
            let mut q = _mm512_or_si512(nib, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
            if !FULL && b % 2 == 1 {
                q = _mm512_shuffle_i64x2::<0x4E>(q, q);
            }
            let s = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(sc.add(2 * b).cast::<i32>().read_unaligned()));
            let spread = _mm512_setr_epi32(
                0, 0, 0, 0, 0x10001, 0x10001, 0x10001, 0x10001, 0x20002, 0x20002, 0x20002, 0x20002, 0x30003, 0x30003,
                0x30003, 0x30003,
            );
            (q, _mm512_permutexvar_epi16(spread, _mm512_castsi128_si512(s)))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m512i) -> (__m512i, __m512i) {
        // SAFETY: the caller guarantees AVX-512BW.
        unsafe { (qx, _mm512_maddubs_epi16(_mm512_set1_epi8(32), qx)) }
    }

    #[inline(always)]
    unsafe fn dot((q, s): (__m512i, __m512i), (qx, offset): (__m512i, __m512i)) -> __m512i {
        // SAFETY: the caller guarantees AVX-512BW.
        unsafe { _mm512_madd_epi16(_mm512_sub_epi16(_mm512_maddubs_epi16(q, qx), offset), s) }
    }

    #[inline(always)]
    unsafe fn widen(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
        // SAFETY: the caller guarantees the features and the row's arrays.
        unsafe { widen_q6(row, c, n, out) }
    }
}

/// Q6_K: `out[j] = d` of block `c + j`'s super-block.
///
/// # Safety
/// As [`widen_scaled`].
#[inline(always)]
unsafe fn widen_q6(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
    // SAFETY: as the caller guarantees; every store is within the first `n` of `out`.
    unsafe {
        let d = super_scales(row.d, c);
        for (s, &d) in d.iter().enumerate().take(n / BLOCKS_PER_SUPER) {
            _mm256_storeu_ps(out.as_mut_ptr().add(8 * s), _mm256_set1_ps(d));
        }
    }
}

impl Weights<Avx2> for Q4KBlocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = Q4K_CHUNK / 2;
    type Unpacked = __m256i;
    type Acts = __m256i;

    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, _: *const u8, b: usize) -> __m256i {
        // SAFETY: the caller guarantees AVX2 and the block's chunk.
        unsafe { nibbles_256(_mm256_loadu_si256(qs.add(Q4K_CHUNK * (b / 2)).cast()), b) }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m256i) -> __m256i {
        qx
    }

    #[inline(always)]
    unsafe fn dot(u: __m256i, qx: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe { <Q4Blocks as Weights<Avx2>>::dot(u, qx) }
    }

    scaled_with_minimums!(Avx2, minimums_256);
}

impl Weights<Avx2> for Q5KBlocks {
    const MINIMUMS: bool = true;
    const BLOCK_BYTES: usize = Q5K_CHUNK / 2;
    type Unpacked = __m256i;
    type Acts = __m256i;

    /// Q4_K's nibbles, plus 16 where the block's 32 fifth bits have the element's: each
    /// byte takes the bit-byte holding its bit, keeps that bit and compares.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, _: *const u8, b: usize) -> __m256i {
        // SAFETY: the caller guarantees AVX2 and the block's chunk.
        unsafe {
            let chunk = qs.add(Q5K_CHUNK * (b / 2));
            let u = nibbles_256(_mm256_loadu_si256(chunk.cast()), b);
            let bits = chunk.add(32 + 4 * (b % 2)).cast::<i32>().read_unaligned();
            let bytes = _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
            );
            let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), bytes);
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64.cast_signed());
            let on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
            _mm256_or_si256(u, _mm256_and_si256(on, _mm256_set1_epi8(16)))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m256i) -> __m256i {
        qx
    }

    #[inline(always)]
    unsafe fn dot(u: __m256i, qx: __m256i) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe { <Q4Blocks as Weights<Avx2>>::dot(u, qx) }
    }

    scaled_with_minimums!(Avx2, minimums_256);
}

impl Weights<Avx2> for Q6KBlocks {
    const MINIMUMS: bool = false;
    const BLOCK_BYTES: usize = Q6K_CHUNK / 2;
    /// The unsigned quants and each i16 lane's sub-block scale.
    type Unpacked = (__m256i, __m256i);
    /// The quants and `32 · (qx_2i + qx_2i+1)` per i16 lane.
    type Acts = (__m256i, __m256i);

    /// The nibbles and bits 4–5: the 16 high-bit bytes in both 128-bit lanes (16
    /// elements each), shifted right by the block's 4 bits, then left so the lower lane's
    /// pair (bits 0–1) and the upper lane's (bits 2–3) land at bits 4–5.
    #[inline(always)]
    unsafe fn unpack<const FULL: bool>(qs: *const u8, sc: *const u8, b: usize) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2, the block's chunk and its two scales.
        unsafe {
            let chunk = qs.add(Q6K_CHUNK * (b / 2));
            let nib = nibbles_256(_mm256_loadu_si256(chunk.cast()), b);
            let hi = _mm256_broadcastsi128_si256(_mm_loadu_si128(chunk.add(32).cast()));
            let hi = _mm256_srl_epi32(hi, _mm_cvtsi32_si128(4 * (b % 2) as i32));
            let hi = _mm256_sllv_epi32(hi, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2));
            let q = _mm256_or_si256(nib, _mm256_and_si256(hi, _mm256_set1_epi8(0x30)));
            let (s0, s1) = (i16::from((*sc.add(2 * b)).cast_signed()), i16::from((*sc.add(2 * b + 1)).cast_signed()));
            (q, _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0)))
        }
    }

    #[inline(always)]
    unsafe fn prepare(qx: __m256i) -> (__m256i, __m256i) {
        // SAFETY: the caller guarantees AVX2.
        unsafe { (qx, _mm256_maddubs_epi16(_mm256_set1_epi8(32), qx)) }
    }

    #[inline(always)]
    unsafe fn dot((q, s): (__m256i, __m256i), (qx, offset): (__m256i, __m256i)) -> __m256i {
        // SAFETY: the caller guarantees AVX2.
        unsafe { _mm256_madd_epi16(_mm256_sub_epi16(_mm256_maddubs_epi16(q, qx), offset), s) }
    }

    #[inline(always)]
    unsafe fn widen(row: &WeightRow<'_>, c: usize, n: usize, out: &mut [f32; WIDEN]) {
        // SAFETY: the caller guarantees the features and the row's arrays.
        unsafe { widen_q6(row, c, n, out) }
    }
}
