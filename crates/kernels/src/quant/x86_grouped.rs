//! AVX-512 VNNI and AVX2 kernels for grouped Q4_K and Q5_K matrices ([`super::grouped`])
//! against `q8` activation rows.
//!
//! A kernel call takes one group (16 weight rows, one per i32 lane) and up to [`MAX_M`]
//! activation rows: per chunk, eight steps each load 16 rows' four quants of two blocks,
//! and every activation row adds them into two i32 sums per lane (one per block) with its
//! four quants broadcast; then each block's sums are scaled into the rows' f32
//! accumulators in the order `grouped` states. Every lane does the same operations
//! whatever the number of activation rows and the instruction set, so results are the
//! same bits at every level and in every batch.
//!
//! Why the sums are exact: quants are unsigned (0..=63), activations i8 (−127..=127);
//! `vpdpbusd` adds four products into i32, AVX2's `vpmaddubsw` pairs stay within ±16 002
//! before `vpmaddwd` widens them, a Q4_K or Q5_K block's sum is within ±126 000 and a
//! Q6_K one's, scaled (`|sc| ≤ 128`), within ±16 700 000.

use std::arch::x86_64::*;

use super::grouped::{GROUP, STEPS, step_bytes};
use super::packed_k::BLOCKS_PER_SUPER;
use super::q8::{ActRow, Q8Rows};
use super::{PackedQuant, QuantFormat, SimdLevel};

/// Most activation rows one AVX-512 call carries: 8 rows keep 16 i32 sums and 8 f32
/// accumulators in registers (Q6_K: 4 rows, with 8 more sums for its sub-blocks).
const MAX_M: usize = 8;
const MAX_M_Q6: usize = 4;

/// Most activation rows one AVX2 call carries (16 registers).
const MAX_M_AVX2: usize = 4;
const MAX_M_AVX2_Q6: usize = 2;

/// Calls over fewer activation rows than this (a decode step) prefetch the weights
/// [`PREFETCH_AHEAD`] bytes ahead: they read each weight once, from memory, and a step's
/// rows are one stream through the group and on into the next. Measured (`decode_kquant`,
/// 5 alternating rounds, medians): one row 12.6 → 11.3 ms, two rows 14.1 → 12.9 ms; with
/// AVX2 (`MET_CPU_SIMD=avx2`, each half group's 32 bytes a step) 15.5 → 14.7 and 19.3 →
/// 17.7 ms.
const PREFETCH_BELOW: usize = 4;

/// How far ahead of a step the decode prefetch reads (1 KiB and 4 KiB did about as well).
const PREFETCH_AHEAD: usize = 2048;

/// Prefetches the step at `at` (of `step` bytes) [`PREFETCH_AHEAD`] bytes on: two lines,
/// as a step may straddle them.
///
/// # Safety
/// The CPU must have SSE (a prefetch never faults, wherever it points).
#[inline(always)]
unsafe fn prefetch(at: *const u8, step: usize) {
    // SAFETY: as the caller guarantees.
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD).cast());
        _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(PREFETCH_AHEAD + step - 1).cast());
    }
}

/// A kernel over one group and `M` activation rows: each row's 16 results.
type Kernel<const M: usize> = unsafe fn(&PackedQuant, usize, &[ActRow<'_>; M]) -> [[f32; GROUP]; M];

/// `out[i · rows.len() + j] = x_i · row (rows.start + j)` for a grouped matrix with the
/// kernels of `level`; false for a level without them (`None`).
pub(super) fn dot_rows(
    level: SimdLevel,
    p: &PackedQuant,
    x: &Q8Rows,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> bool {
    let q6 = p.format() == QuantFormat::Q6_K;
    let most = match (level, q6) {
        (SimdLevel::None, _) => return false,
        (SimdLevel::Avx2, false) => MAX_M_AVX2,
        (SimdLevel::Avx2, true) => MAX_M_AVX2_Q6,
        (SimdLevel::Avx512, false) => MAX_M,
        (SimdLevel::Avx512, true) => MAX_M_Q6,
    };
    let m = x.rows();
    for first in (0..m).step_by(most) {
        match (m - first).min(most) {
            1 => groups::<1>(level, p, x, first, rows.clone(), out),
            2 => groups::<2>(level, p, x, first, rows.clone(), out),
            3 => groups::<3>(level, p, x, first, rows.clone(), out),
            4 => groups::<4>(level, p, x, first, rows.clone(), out),
            5 => groups::<5>(level, p, x, first, rows.clone(), out),
            6 => groups::<6>(level, p, x, first, rows.clone(), out),
            7 => groups::<7>(level, p, x, first, rows.clone(), out),
            _ => groups::<8>(level, p, x, first, rows.clone(), out),
        }
    }
    true
}

/// Activation rows `first..first + M` against every group that holds one of `rows`,
/// keeping the results of `rows`.
fn groups<const M: usize>(
    level: SimdLevel,
    p: &PackedQuant,
    x: &Q8Rows,
    first: usize,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) {
    let acts: [ActRow<'_>; M] = std::array::from_fn(|i| x.row(first + i));
    let kernel: Kernel<M> = match (level == SimdLevel::Avx512, p.format()) {
        (true, QuantFormat::Q6_K) => group_512_q6::<M>,
        (true, QuantFormat::Q5_K) => group_512::<true, M>,
        (true, _) => group_512::<false, M>,
        (false, QuantFormat::Q6_K) => group_256_q6::<M>,
        (false, QuantFormat::Q5_K) => group_256::<true, M>,
        (false, _) => group_256::<false, M>,
    };
    let n = rows.len();
    for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
        // SAFETY: `dot_rows` runs only at a level the CPU has (the caller caps it at the
        // detected one, and AVX-512 here implies VNNI); group `g` exists, and every
        // activation row holds the matrix's `k` quants and `k / 32` scales (checked by
        // the caller).
        let lanes = unsafe { kernel(p, g, &acts) };
        let own = (g * GROUP).max(rows.start)..((g + 1) * GROUP).min(rows.end);
        for (i, lanes) in lanes.iter().enumerate() {
            let at = (first + i) * n + own.start - rows.start;
            out[at..at + own.len()].copy_from_slice(&lanes[own.start - g * GROUP..own.end - g * GROUP]);
        }
    }
}

/// Group `g` of `p` (Q5_K if `Q5`, else Q4_K) × `M` activation rows with AVX-512 VNNI:
/// per block, the sums of its 32 quants, scaled by `d · sc · dx`, then the minimum term.
///
/// # Safety
/// The CPU must have AVX-512F, BW and VNNI, AVX2, FMA and F16C; `p` is grouped, of that
/// format, and holds group `g`; every activation row holds `p.k()` quants and their terms.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_512<const Q5: bool, const M: usize>(
    p: &PackedQuant,
    g: usize,
    a: &[ActRow<'_>; M],
) -> [[f32; GROUP]; M] {
    let nb = p.blocks_per_row();
    let (chunks, supers) = (nb / 2, nb / BLOCKS_PER_SUPER);
    let step = step_bytes(p.format());
    // SAFETY: the group's arrays are in bounds (`grouped`'s layout); every offset below
    // stays within them and within the activation rows, as the caller guarantees.
    unsafe {
        let qs = p.qs.as_ptr().add(g * chunks * STEPS * step);
        let (d, m) = (p.d.as_ptr().add(g * supers * GROUP), p.m.as_ptr().add(g * supers * GROUP));
        let (sc, mn) = (p.sc.as_ptr().add(g * nb * GROUP), p.mn.as_ptr().add(g * nb * GROUP));
        let nibble = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); M];
        for c in 0..chunks {
            let chunk = qs.add(c * STEPS * step);
            let mut sums = [[_mm512_setzero_si512(); 2]; M];
            for j in 0..STEPS {
                if M < PREFETCH_BELOW {
                    prefetch(chunk.wrapping_add(j * step), step);
                }
                let v = _mm512_loadu_si512(chunk.add(j * step).cast());
                let mut lo = _mm512_and_si512(v, nibble);
                let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                if Q5 {
                    let sixteen = _mm512_set1_epi8(16);
                    lo = _mm512_mask_add_epi8(lo, chunk.add(j * step + 64).cast::<u64>().read_unaligned(), lo, sixteen);
                    hi = _mm512_mask_add_epi8(hi, chunk.add(j * step + 72).cast::<u64>().read_unaligned(), hi, sixteen);
                }
                for (sums, a) in sums.iter_mut().zip(a) {
                    let x = a.qs.as_ptr().add(64 * c + 4 * j);
                    let even = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
                    let odd = _mm512_set1_epi32(x.add(32).cast::<i32>().read_unaligned());
                    sums[0] = _mm512_dpbusd_epi32(sums[0], lo, even);
                    sums[1] = _mm512_dpbusd_epi32(sums[1], hi, odd);
                }
            }
            let s = 2 * c / BLOCKS_PER_SUPER;
            let dd = _mm512_cvtph_ps(_mm256_loadu_si256(d.add(s * GROUP).cast()));
            let dm = _mm512_cvtph_ps(_mm256_loadu_si256(m.add(s * GROUP).cast()));
            for h in 0..2 {
                let b = 2 * c + h;
                let scale = _mm512_mul_ps(dd, widen_16(sc.add(b * GROUP)));
                let min = _mm512_mul_ps(dm, widen_16(mn.add(b * GROUP)));
                for ((acc, sums), a) in acc.iter_mut().zip(&sums).zip(a) {
                    let dx = _mm512_set1_ps(*a.d.get_unchecked(b));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[h]), _mm512_mul_ps(scale, dx), *acc);
                    *acc = _mm512_fnmadd_ps(min, _mm512_set1_ps(*a.s.get_unchecked(b)), *acc);
                }
            }
        }
        let mut out = [[0f32; GROUP]; M];
        for (out, acc) in out.iter_mut().zip(&acc) {
            _mm512_storeu_ps(out.as_mut_ptr(), *acc);
        }
        out
    }
}

/// [`group_512`] with AVX2: each half of the group (8 rows) in turn, `vpmaddubsw` then
/// `vpmaddwd` by ones for `vpdpbusd`.
///
/// # Safety
/// As [`group_512`], on a CPU with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_256<const Q5: bool, const M: usize>(
    p: &PackedQuant,
    g: usize,
    a: &[ActRow<'_>; M],
) -> [[f32; GROUP]; M] {
    let nb = p.blocks_per_row();
    let (chunks, supers) = (nb / 2, nb / BLOCKS_PER_SUPER);
    let step = step_bytes(p.format());
    let mut out = [[0f32; GROUP]; M];
    // SAFETY: as in `group_512`; each half reads its own 32 bytes of a step, 4 bytes of
    // each mask, 8 scales and 8 f16 values.
    unsafe {
        let qs = p.qs.as_ptr().add(g * chunks * STEPS * step);
        let (d, m) = (p.d.as_ptr().add(g * supers * GROUP), p.m.as_ptr().add(g * supers * GROUP));
        let (sc, mn) = (p.sc.as_ptr().add(g * nb * GROUP), p.mn.as_ptr().add(g * nb * GROUP));
        let nibble = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for half in 0..2 {
            let lanes = 8 * half;
            let mut acc = [_mm256_setzero_ps(); M];
            for c in 0..chunks {
                let chunk = qs.add(c * STEPS * step);
                let mut sums = [[_mm256_setzero_si256(); 2]; M];
                for j in 0..STEPS {
                    if M < PREFETCH_BELOW {
                        prefetch(chunk.wrapping_add(j * step + 4 * lanes), 32);
                    }
                    let v = _mm256_loadu_si256(chunk.add(j * step + 4 * lanes).cast());
                    let mut lo = _mm256_and_si256(v, nibble);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                    if Q5 {
                        let masks = chunk.add(j * step + 4 * half);
                        lo = _mm256_or_si256(lo, high_bits(masks.add(64).cast::<i32>().read_unaligned(), 16));
                        hi = _mm256_or_si256(hi, high_bits(masks.add(72).cast::<i32>().read_unaligned(), 16));
                    }
                    for (sums, a) in sums.iter_mut().zip(a) {
                        let x = a.qs.as_ptr().add(64 * c + 4 * j);
                        let even = _mm256_set1_epi32(x.cast::<i32>().read_unaligned());
                        let odd = _mm256_set1_epi32(x.add(32).cast::<i32>().read_unaligned());
                        sums[0] = _mm256_add_epi32(sums[0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, even), ones));
                        sums[1] = _mm256_add_epi32(sums[1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, odd), ones));
                    }
                }
                let s = 2 * c / BLOCKS_PER_SUPER;
                let dd = _mm256_cvtph_ps(_mm_loadu_si128(d.add(s * GROUP + lanes).cast()));
                let dm = _mm256_cvtph_ps(_mm_loadu_si128(m.add(s * GROUP + lanes).cast()));
                for h in 0..2 {
                    let b = 2 * c + h;
                    let scale = _mm256_mul_ps(dd, widen_8(sc.add(b * GROUP + lanes)));
                    let min = _mm256_mul_ps(dm, widen_8(mn.add(b * GROUP + lanes)));
                    for ((acc, sums), a) in acc.iter_mut().zip(&sums).zip(a) {
                        let dx = _mm256_set1_ps(*a.d.get_unchecked(b));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h]), _mm256_mul_ps(scale, dx), *acc);
                        *acc = _mm256_fnmadd_ps(min, _mm256_set1_ps(*a.s.get_unchecked(b)), *acc);
                    }
                }
            }
            for (out, acc) in out.iter_mut().zip(&acc) {
                _mm256_storeu_ps(out.as_mut_ptr().add(lanes), *acc);
            }
        }
    }
    out
}

/// Group `g` of a Q6_K matrix × `M` activation rows with AVX-512 VNNI: per block, the
/// sums of each 16 quants in turn, offset and scaled in i32 (`sc_h · (Σ q·qx − 32 · Σ qx)`),
/// then the block's sum scaled by `d · dx`.
///
/// # Safety
/// As [`group_512`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn group_512_q6<const M: usize>(p: &PackedQuant, g: usize, a: &[ActRow<'_>; M]) -> [[f32; GROUP]; M] {
    let nb = p.blocks_per_row();
    let (chunks, supers) = (nb / 2, nb / BLOCKS_PER_SUPER);
    let step = step_bytes(QuantFormat::Q6_K);
    // SAFETY: as in `group_512`.
    unsafe {
        let qs = p.qs.as_ptr().add(g * chunks * STEPS * step);
        let d = p.d.as_ptr().add(g * supers * GROUP);
        let sc = p.sc.as_ptr().add(g * nb * 2 * GROUP).cast::<i8>();
        let nibble = _mm512_set1_epi8(0x0F);
        let (sixteen, thirty_two) = (_mm512_set1_epi8(16), _mm512_set1_epi8(32));
        let mut acc = [_mm512_setzero_ps(); M];
        for c in 0..chunks {
            let chunk = qs.add(c * STEPS * step);
            let mut block = [[_mm512_setzero_si512(); 2]; M];
            for h in 0..2 {
                let mut sums = [[_mm512_setzero_si512(); 2]; M];
                for j in STEPS / 2 * h..STEPS / 2 * (h + 1) {
                    let at = chunk.add(j * step);
                    if M < PREFETCH_BELOW {
                        prefetch(at, step);
                    }
                    let v = _mm512_loadu_si512(at.cast());
                    let mask = |i: usize| at.add(64 + 8 * i).cast::<u64>().read_unaligned();
                    let lo = _mm512_and_si512(v, nibble);
                    let lo = _mm512_mask_add_epi8(lo, mask(0), lo, sixteen);
                    let lo = _mm512_mask_add_epi8(lo, mask(2), lo, thirty_two);
                    let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), nibble);
                    let hi = _mm512_mask_add_epi8(hi, mask(1), hi, sixteen);
                    let hi = _mm512_mask_add_epi8(hi, mask(3), hi, thirty_two);
                    for (sums, a) in sums.iter_mut().zip(a) {
                        let x = a.qs.as_ptr().add(64 * c + 4 * j);
                        let even = _mm512_set1_epi32(x.cast::<i32>().read_unaligned());
                        let odd = _mm512_set1_epi32(x.add(32).cast::<i32>().read_unaligned());
                        sums[0] = _mm512_dpbusd_epi32(sums[0], lo, even);
                        sums[1] = _mm512_dpbusd_epi32(sums[1], hi, odd);
                    }
                }
                for odd in 0..2 {
                    let b = 2 * c + odd;
                    let scale = _mm512_cvtepi8_epi32(_mm_loadu_si128(sc.add((2 * b + h) * GROUP).cast()));
                    for ((block, sums), a) in block.iter_mut().zip(&sums).zip(a) {
                        let offset = _mm512_set1_epi32(32 * *a.s16.get_unchecked(2 * b + h));
                        let sub = _mm512_mullo_epi32(_mm512_sub_epi32(sums[odd], offset), scale);
                        block[odd] = _mm512_add_epi32(block[odd], sub);
                    }
                }
            }
            let dd = _mm512_cvtph_ps(_mm256_loadu_si256(d.add(2 * c / BLOCKS_PER_SUPER * GROUP).cast()));
            for odd in 0..2 {
                let b = 2 * c + odd;
                for ((acc, block), a) in acc.iter_mut().zip(&block).zip(a) {
                    let dx = _mm512_set1_ps(*a.d.get_unchecked(b));
                    *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block[odd]), _mm512_mul_ps(dd, dx), *acc);
                }
            }
        }
        let mut out = [[0f32; GROUP]; M];
        for (out, acc) in out.iter_mut().zip(&acc) {
            _mm512_storeu_ps(out.as_mut_ptr(), *acc);
        }
        out
    }
}

/// [`group_512_q6`] with AVX2, each half of the group in turn.
///
/// # Safety
/// As [`group_256`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_256_q6<const M: usize>(p: &PackedQuant, g: usize, a: &[ActRow<'_>; M]) -> [[f32; GROUP]; M] {
    let nb = p.blocks_per_row();
    let (chunks, supers) = (nb / 2, nb / BLOCKS_PER_SUPER);
    let step = step_bytes(QuantFormat::Q6_K);
    let mut out = [[0f32; GROUP]; M];
    // SAFETY: as in `group_256`.
    unsafe {
        let qs = p.qs.as_ptr().add(g * chunks * STEPS * step);
        let d = p.d.as_ptr().add(g * supers * GROUP);
        let sc = p.sc.as_ptr().add(g * nb * 2 * GROUP);
        let nibble = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        for half in 0..2 {
            let lanes = 8 * half;
            let mut acc = [_mm256_setzero_ps(); M];
            for c in 0..chunks {
                let chunk = qs.add(c * STEPS * step);
                let mut block = [[_mm256_setzero_si256(); 2]; M];
                for h in 0..2 {
                    let mut sums = [[_mm256_setzero_si256(); 2]; M];
                    for j in STEPS / 2 * h..STEPS / 2 * (h + 1) {
                        let at = chunk.add(j * step);
                        if M < PREFETCH_BELOW {
                            prefetch(at.wrapping_add(4 * lanes), 32);
                        }
                        let v = _mm256_loadu_si256(at.add(4 * lanes).cast());
                        let mask = |i: usize| at.add(64 + 8 * i + 4 * half).cast::<i32>().read_unaligned();
                        let lo = _mm256_and_si256(v, nibble);
                        let lo = _mm256_or_si256(lo, _mm256_or_si256(high_bits(mask(0), 16), high_bits(mask(2), 32)));
                        let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), nibble);
                        let hi = _mm256_or_si256(hi, _mm256_or_si256(high_bits(mask(1), 16), high_bits(mask(3), 32)));
                        for (sums, a) in sums.iter_mut().zip(a) {
                            let x = a.qs.as_ptr().add(64 * c + 4 * j);
                            let even = _mm256_set1_epi32(x.cast::<i32>().read_unaligned());
                            let odd = _mm256_set1_epi32(x.add(32).cast::<i32>().read_unaligned());
                            sums[0] =
                                _mm256_add_epi32(sums[0], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, even), ones));
                            sums[1] = _mm256_add_epi32(sums[1], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, odd), ones));
                        }
                    }
                    for odd in 0..2 {
                        let b = 2 * c + odd;
                        let scale = _mm256_cvtepi8_epi32(_mm_loadl_epi64(sc.add((2 * b + h) * GROUP + lanes).cast()));
                        for ((block, sums), a) in block.iter_mut().zip(&sums).zip(a) {
                            let offset = _mm256_set1_epi32(32 * *a.s16.get_unchecked(2 * b + h));
                            let sub = _mm256_mullo_epi32(_mm256_sub_epi32(sums[odd], offset), scale);
                            block[odd] = _mm256_add_epi32(block[odd], sub);
                        }
                    }
                }
                let dd = _mm256_cvtph_ps(_mm_loadu_si128(d.add(2 * c / BLOCKS_PER_SUPER * GROUP + lanes).cast()));
                for odd in 0..2 {
                    let b = 2 * c + odd;
                    for ((acc, block), a) in acc.iter_mut().zip(&block).zip(a) {
                        let dx = _mm256_set1_ps(*a.d.get_unchecked(b));
                        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block[odd]), _mm256_mul_ps(dd, dx), *acc);
                    }
                }
            }
            for (out, acc) in out.iter_mut().zip(&acc) {
                _mm256_storeu_ps(out.as_mut_ptr().add(lanes), *acc);
            }
        }
    }
    out
}

/// `value` in each byte `e` of 32 where bit `e` of `bits` is set, else 0.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn high_bits(bits: i32, value: i8) -> __m256i {
    // SAFETY: as the caller guarantees.
    unsafe {
        let bytes = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let spread = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), bytes);
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64.cast_signed());
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value))
    }
}

/// The 16 bytes at `v` as f32.
///
/// # Safety
/// The CPU must have AVX-512F; the bytes must be readable.
#[inline(always)]
unsafe fn widen_16(v: *const u8) -> __m512 {
    // SAFETY: as the caller guarantees.
    unsafe { _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(v.cast()))) }
}

/// The 8 bytes at `v` as f32.
///
/// # Safety
/// The CPU must have AVX2; the bytes must be readable.
#[inline(always)]
unsafe fn widen_8(v: *const u8) -> __m256 {
    // SAFETY: as the caller guarantees.
    unsafe { _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(v.cast()))) }
}
