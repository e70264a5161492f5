//! Q6_K's blocks (in the packed layout of `packed_k`) as the integer kernels of
//! [`super::x86_int`] multiply them, for AVX-512 VNNI and AVX2. (Q4_K and Q5_K are
//! grouped: [`super::x86_grouped`].)
//!
//! The kernels see 32-element blocks with one f32 scale each: Q6_K widens the
//! super-block's `d` for each of its blocks and multiplies the two sub-block scales into
//! the integer sums instead.
//!
//! Why the sums are exact (no saturation anywhere): Q6_K forms `Σ q · qx − 32 · Σ qx` per
//! pair of elements in i16 (`vpmaddubsw` of the unsigned quant (0..=63), minus that of 32;
//! each within ±16 002, the difference within ±8128), then `vpmaddwd` by the sub-block's i8
//! scale sums two pairs into i32 (within ±2 080 768).
//!
//! A step's unpacking depends only on its block index, never on the rows beside it, so
//! each (weight row, activation row) pair sees the same operations whatever the tile.

use std::arch::x86_64::*;

use super::PackedQuant;
use super::packed_k::BLOCKS_PER_SUPER;
use super::q8::WeightRow;
use super::x86::WIDEN;
use super::x86_isa::{Avx2, Avx512, Rows, Weights};

/// Q6_K blocks: chunks of 32 bytes of nibbles and 16 bytes of bits 4–5.
pub(super) struct Q6KBlocks;

impl Rows for Q6KBlocks {
    #[inline(always)]
    fn row(p: &PackedQuant, r: usize) -> WeightRow<'_> {
        WeightRow::of_k(p, r)
    }
}

/// Bytes of a chunk (two blocks).
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

/// The nibbles of block `b` from its chunk's 32 bytes `v` (low ones for an even block).
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn nibbles_256(v: __m256i, b: usize) -> __m256i {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (b % 2) as i32)), _mm256_set1_epi8(0x0F)) }
}

/// The nibbles of a chunk's 32 bytes `v` as both its blocks in element order.
///
/// # Safety
/// The CPU must have AVX-512F and AVX2.
#[inline(always)]
unsafe fn nibbles_512(v: __m256i) -> __m512i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let mask = _mm256_set1_epi8(0x0F);
        let (lo, hi) = (_mm256_and_si256(v, mask), _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask));
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi)
    }
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
            let nib = nibbles_512(_mm256_loadu_si256(chunk.cast()));
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
/// The CPU must have AVX and F16C; `n ≤ WIDEN` is a multiple of 8 and the row's arrays
/// run on past its blocks.
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
