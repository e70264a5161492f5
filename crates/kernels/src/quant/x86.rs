//! AVX-512 and AVX2 (+ FMA, F16C) products of f32 activations with packed quantised rows
//! ([`super::PackedQuant`]: f16 scales in arrays of their own, quants without their block
//! headers).
//!
//! Per block: widen the quants to f32 vectors, multiply by the matching activations,
//! scale the block's partial sum by `d`; the minimum terms `m · Σx` of a row come last from
//! the precomputed block sums. Two rows run side by side so their FMA chains overlap
//! and each activation vector is loaded once for both. Weights are never rounded: results
//! differ from the scalar path only by summation order.

use std::arch::x86_64::*;

use super::QuantFormat;
use super::SimdLevel as Level;
use super::q8::WeightRow;

/// Blocks whose scales a kernel widens to f32 at a time, into an array on the stack.
pub(super) const WIDEN: usize = 64;

/// Scales `c .. c + n` of a row (`n ≤ WIDEN`) as f32 into `out`, by F16C 8 at a time; the
/// last group may read up to 7 scales past `c + n`, which are in bounds (`WeightRow`) and
/// never used. Converting once per group of blocks keeps the inner loops' one broadcast
/// load per block, as with f32 scales.
///
/// # Safety
/// `d` must hold at least `c + n + 7` values; the CPU must have AVX and F16C.
#[inline]
#[target_feature(enable = "avx,f16c")]
unsafe fn widen(d: &[u16], c: usize, n: usize, out: &mut [f32; WIDEN]) {
    for j in (0..n).step_by(8) {
        // SAFETY: as the caller guarantees; `j + 8 <= WIDEN` since both are multiples of 8.
        unsafe {
            let h = _mm_loadu_si128(d.as_ptr().add(c + j).cast());
            _mm256_storeu_ps(out.as_mut_ptr().add(j), _mm256_cvtph_ps(h));
        }
    }
}

/// Runs `step(dw, c, n)` over the rows' blocks in groups of `WIDEN` (`c` the group's first
/// block, `n` its length), with `dw[r]` holding row `r`'s scales of the group as f32. Groups
/// start at multiples of `WIDEN` (even), so two-block steps pair the blocks as they would
/// without groups.
///
/// # Safety
/// The CPU must have AVX and F16C; every row's scale array runs on past its blocks, as
/// `WeightRow` promises.
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn scale_groups<const R: usize>(
    w: &[WeightRow<'_>; R],
    dw: &mut [[f32; WIDEN]; R],
    mut step: impl FnMut(&[[f32; WIDEN]; R], usize, usize),
) {
    let nb = w[0].nb;
    for c in (0..nb).step_by(WIDEN) {
        let n = (nb - c).min(WIDEN);
        for (row, d) in w.iter().zip(dw.iter_mut()) {
            // SAFETY: as the caller guarantees.
            unsafe { widen(row.d, c, n, d) };
        }
        step(dw, c, n);
    }
}

/// The process's SIMD level (see [`super::SimdLevel::current`]).
fn level() -> Level {
    Level::current()
}

/// The sum of the eight lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// `out[j] = x · row (rows.start + j)` of a packed matrix with SIMD; false where this CPU
/// has no SIMD path.
pub(super) fn packed_dot_rows(
    p: &super::packed::PackedQuant,
    x: &[f32],
    sums: &[f32],
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> bool {
    let level = level();
    if level == Level::None {
        return false;
    }
    let q4 = p.format() != QuantFormat::Q8_0;
    let mut j = 0;
    while j < out.len() {
        let (ra, rb) = (rows.start + j, rows.start + (j + 1).min(out.len() - 1));
        let (a, b) = (WeightRow::of(p, ra), WeightRow::of(p, rb));
        // SAFETY: the kernels run only on CPUs with their features (checked by `level`);
        // each row holds `nb` scales (and minimums) and `nb` payloads, `x` holds `32 · nb`
        // values and `sums` `nb` (checked by the caller).
        let (va, vb) = unsafe {
            match (level, q4) {
                (Level::Avx512, true) => packed_q4_512(x, sums, &a, &b),
                (Level::Avx512, false) => packed_q8_512(x, &a, &b),
                (_, true) => packed_q4_256(x, sums, &a, &b),
                (_, false) => packed_q8_256(x, &a, &b),
            }
        };
        out[j] = va;
        if j + 1 < out.len() {
            out[j + 1] = vb;
        }
        j += 2;
    }
    true
}

/// `out[i · rows.len() + j] = x_i · row (rows.start + j)` for the `m` activation rows of `x`
/// (`[m, k]`, block sums `sums` `[m, k / 32]`) of a packed matrix, with AVX-512; false
/// where this CPU has no such path. Each weight block is unpacked once for all
/// rows (verifying speculative tokens runs a few rows through every matrix), and each
/// row's result is bit for bit what [`packed_dot_rows`] gives it alone: the same
/// operations in the same order.
pub(super) fn packed_dot_rows_many(
    p: &super::packed::PackedQuant,
    x: &[f32],
    sums: &[f32],
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> bool {
    if level() != Level::Avx512 {
        return false;
    }
    let q4 = p.format() != QuantFormat::Q8_0;
    let (k, nb, n) = (p.k(), p.blocks_per_row(), rows.len());
    let m = x.len() / k.max(1);
    for first in (0..m).step_by(4) {
        let take = (m - first).min(4);
        let xs: Vec<&[f32]> = (first..first + take).map(|i| &x[i * k..(i + 1) * k]).collect();
        let ss: Vec<&[f32]> = (first..first + take).map(|i| &sums[i * nb..(i + 1) * nb]).collect();
        for (j, r) in rows.clone().enumerate() {
            let row = WeightRow::of(p, r);
            let mut got = [0f32; 4];
            // SAFETY: the CPU has AVX-512 (checked by `level`); the row holds `nb` scales,
            // minimums and payloads, each activation row `32 · nb` values and each sums row
            // `nb` (checked by the caller).
            unsafe {
                match (take, q4) {
                    (4, true) => got = packed_q4_512_many::<4>(&xs, &ss, &row),
                    (3, true) => got[..3].copy_from_slice(&packed_q4_512_many::<3>(&xs, &ss, &row)),
                    (2, true) => got[..2].copy_from_slice(&packed_q4_512_many::<2>(&xs, &ss, &row)),
                    (_, true) => got[..1].copy_from_slice(&packed_q4_512_many::<1>(&xs, &ss, &row)),
                    (4, false) => got = packed_q8_512_many::<4>(&xs, &row),
                    (3, false) => got[..3].copy_from_slice(&packed_q8_512_many::<3>(&xs, &row)),
                    (2, false) => got[..2].copy_from_slice(&packed_q8_512_many::<2>(&xs, &row)),
                    (_, false) => got[..1].copy_from_slice(&packed_q8_512_many::<1>(&xs, &row)),
                }
            }
            for (i, g) in got[..take].iter().enumerate() {
                out[(first + i) * n + j] = *g;
            }
        }
    }
    true
}

/// One packed Q4 row against `M` activation rows: per row, exactly the operations of
/// `packed_q4_512` (which runs them for two weight rows instead).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn packed_q4_512_many<const M: usize>(xs: &[&[f32]], sums: &[&[f32]], a: &WeightRow<'_>) -> [f32; M] {
    let mask = _mm_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); M];
    let mut dw = [[0f32; WIDEN]; 1];
    let step = |dw: &[[f32; WIDEN]; 1], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: block `i` of the row (16 payload bytes) and activations `32i..32i+32` of
            // every row are in bounds; loads are unaligned.
            unsafe {
                let qs = _mm_loadu_si128(a.qs.as_ptr().add(i * 16).cast());
                let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(qs, mask)));
                let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), mask)));
                let d = _mm512_set1_ps(*dw[0].get_unchecked(i - c));
                for (acc, x) in acc.iter_mut().zip(xs) {
                    let xp = x.as_ptr().add(i * 32);
                    let (xlo, xhi) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                    let p = _mm512_fmadd_ps(hi, xhi, _mm512_mul_ps(lo, xlo));
                    *acc = _mm512_fmadd_ps(d, p, *acc);
                }
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a], &mut dw, step) };
    std::array::from_fn(|j| _mm512_reduce_add_ps(acc[j]) + min_term(a, sums[j]))
}

/// One packed Q8 row against `M` activation rows: per row, exactly the operations of
/// `packed_q8_512`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn packed_q8_512_many<const M: usize>(xs: &[&[f32]], a: &WeightRow<'_>) -> [f32; M] {
    let mut acc = [_mm512_setzero_ps(); M];
    let mut dw = [[0f32; WIDEN]; 1];
    let step = |dw: &[[f32; WIDEN]; 1], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: as in `packed_q4_512_many`, with 32 payload bytes per block.
            unsafe {
                let qs = a.qs.as_ptr().add(i * 32);
                let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs.cast())));
                let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(16).cast())));
                let d = _mm512_set1_ps(*dw[0].get_unchecked(i - c));
                for (acc, x) in acc.iter_mut().zip(xs) {
                    let xp = x.as_ptr().add(i * 32);
                    let (xlo, xhi) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                    let p = _mm512_fmadd_ps(hi, xhi, _mm512_mul_ps(lo, xlo));
                    *acc = _mm512_fmadd_ps(d, p, *acc);
                }
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a], &mut dw, step) };
    std::array::from_fn(|j| _mm512_reduce_add_ps(acc[j]))
}

/// `Σ m · s` over a row's blocks, in block order (the scalar path's order).
#[target_feature(enable = "avx,f16c")]
fn min_term(row: &WeightRow<'_>, sums: &[f32]) -> f32 {
    let (mut m, mut total) = ([0f32; WIDEN], 0f32);
    for c in (0..row.nb).step_by(WIDEN) {
        let n = (row.nb - c).min(WIDEN);
        // SAFETY: the row's minimums run on past its blocks (`WeightRow`).
        unsafe { widen(row.m, c, n, &mut m) };
        for (m, s) in m[..n].iter().zip(&sums[c..c + n]) {
            total += m * s;
        }
    }
    total
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn packed_q4_512(x: &[f32], sums: &[f32], a: &WeightRow<'_>, b: &WeightRow<'_>) -> (f32, f32) {
    let mask = _mm_set1_epi8(0x0F);
    let (mut acc_a, mut acc_b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut dw = [[0f32; WIDEN]; 2];
    let step = |dw: &[[f32; WIDEN]; 2], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: block `i` of both rows (16 payload bytes) and activations `32i..32i+32`
            // are in bounds; loads are unaligned.
            unsafe {
                let xp = x.as_ptr().add(i * 32);
                let (xlo, xhi) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                let one = |qs: *const u8, d: f32, acc: &mut __m512| {
                    let qs = _mm_loadu_si128(qs.cast());
                    let lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(qs, mask)));
                    let hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(qs, 4), mask)));
                    let p = _mm512_fmadd_ps(hi, xhi, _mm512_mul_ps(lo, xlo));
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), p, *acc);
                };
                one(a.qs.as_ptr().add(i * 16), *dw[0].get_unchecked(i - c), &mut acc_a);
                one(b.qs.as_ptr().add(i * 16), *dw[1].get_unchecked(i - c), &mut acc_b);
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a, *b], &mut dw, step) };
    (_mm512_reduce_add_ps(acc_a) + min_term(a, sums), _mm512_reduce_add_ps(acc_b) + min_term(b, sums))
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn packed_q8_512(x: &[f32], a: &WeightRow<'_>, b: &WeightRow<'_>) -> (f32, f32) {
    let (mut acc_a, mut acc_b) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut dw = [[0f32; WIDEN]; 2];
    let step = |dw: &[[f32; WIDEN]; 2], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: as in `packed_q4_512`, with 32 payload bytes per block.
            unsafe {
                let xp = x.as_ptr().add(i * 32);
                let (xlo, xhi) = (_mm512_loadu_ps(xp), _mm512_loadu_ps(xp.add(16)));
                let one = |qs: *const u8, d: f32, acc: &mut __m512| {
                    let lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs.cast())));
                    let hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(qs.add(16).cast())));
                    let p = _mm512_fmadd_ps(hi, xhi, _mm512_mul_ps(lo, xlo));
                    *acc = _mm512_fmadd_ps(_mm512_set1_ps(d), p, *acc);
                };
                one(a.qs.as_ptr().add(i * 32), *dw[0].get_unchecked(i - c), &mut acc_a);
                one(b.qs.as_ptr().add(i * 32), *dw[1].get_unchecked(i - c), &mut acc_b);
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a, *b], &mut dw, step) };
    (_mm512_reduce_add_ps(acc_a), _mm512_reduce_add_ps(acc_b))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q4_256(x: &[f32], sums: &[f32], a: &WeightRow<'_>, b: &WeightRow<'_>) -> (f32, f32) {
    let mask = _mm_set1_epi8(0x0F);
    let (mut acc_a, mut acc_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut dw = [[0f32; WIDEN]; 2];
    let step = |dw: &[[f32; WIDEN]; 2], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: as in `packed_q4_512`.
            unsafe {
                let xp = x.as_ptr().add(i * 32);
                let xs = [
                    _mm256_loadu_ps(xp),
                    _mm256_loadu_ps(xp.add(8)),
                    _mm256_loadu_ps(xp.add(16)),
                    _mm256_loadu_ps(xp.add(24)),
                ];
                let one = |qs: *const u8, d: f32, acc: &mut __m256| {
                    let qs = _mm_loadu_si128(qs.cast());
                    let (lo, hi) = (_mm_and_si128(qs, mask), _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
                    let w = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                    let mut p = _mm256_mul_ps(w(lo), xs[0]);
                    p = _mm256_fmadd_ps(w(_mm_srli_si128(lo, 8)), xs[1], p);
                    p = _mm256_fmadd_ps(w(hi), xs[2], p);
                    p = _mm256_fmadd_ps(w(_mm_srli_si128(hi, 8)), xs[3], p);
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), p, *acc);
                };
                one(a.qs.as_ptr().add(i * 16), *dw[0].get_unchecked(i - c), &mut acc_a);
                one(b.qs.as_ptr().add(i * 16), *dw[1].get_unchecked(i - c), &mut acc_b);
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a, *b], &mut dw, step) };
    (hsum256(acc_a) + min_term(a, sums), hsum256(acc_b) + min_term(b, sums))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn packed_q8_256(x: &[f32], a: &WeightRow<'_>, b: &WeightRow<'_>) -> (f32, f32) {
    let (mut acc_a, mut acc_b) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut dw = [[0f32; WIDEN]; 2];
    let step = |dw: &[[f32; WIDEN]; 2], c: usize, n: usize| {
        for i in c..c + n {
            // SAFETY: as in `packed_q8_512`.
            unsafe {
                let xp = x.as_ptr().add(i * 32);
                let xs = [
                    _mm256_loadu_ps(xp),
                    _mm256_loadu_ps(xp.add(8)),
                    _mm256_loadu_ps(xp.add(16)),
                    _mm256_loadu_ps(xp.add(24)),
                ];
                let one = |qs: *const u8, d: f32, acc: &mut __m256| {
                    let q = _mm256_loadu_si256(qs.cast());
                    let (lo, hi) = (_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
                    let w = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                    let mut p = _mm256_mul_ps(w(lo), xs[0]);
                    p = _mm256_fmadd_ps(w(_mm_srli_si128(lo, 8)), xs[1], p);
                    p = _mm256_fmadd_ps(w(hi), xs[2], p);
                    p = _mm256_fmadd_ps(w(_mm_srli_si128(hi, 8)), xs[3], p);
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(d), p, *acc);
                };
                one(a.qs.as_ptr().add(i * 32), *dw[0].get_unchecked(i - c), &mut acc_a);
                one(b.qs.as_ptr().add(i * 32), *dw[1].get_unchecked(i - c), &mut acc_b);
            }
        }
    };
    // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
    unsafe { scale_groups(&[*a, *b], &mut dw, step) };
    (hsum256(acc_a), hsum256(acc_b))
}

/// Dequantises the `out.len() / 32` blocks of a packed matrix from block `first` on (its
/// scales `d`, minimums `m` and quants `qs`) into `out` with AVX2, by the scalar formulas
/// term for term (a multiply, then an add, each rounded as the scalar code rounds them), so
/// the values are bit for bit the scalar ones; false at a `level` without AVX2 (capped at
/// what the CPU has).
pub(super) fn dequantize_blocks(
    level: Level,
    format: QuantFormat,
    (d, m, qs): (&[u16], &[u16], &[u8]),
    first: usize,
    out: &mut [f32],
) -> bool {
    let level = level.min(Level::detected());
    if level == Level::None || !matches!(format, QuantFormat::Q4_0 | QuantFormat::Q4_1 | QuantFormat::Q8_0) {
        return false;
    }
    let blocks = out.len() / 32;
    let payload = if format == QuantFormat::Q8_0 { 32 } else { 16 };
    assert!(d.len() >= first + blocks && qs.len() >= (first + blocks) * payload, "blocks past the matrix");
    assert!(format != QuantFormat::Q4_1 || m.len() >= first + blocks, "Q4_1 blocks without minimums");
    // SAFETY: the CPU has AVX2 and F16C (`level`, capped at the detected one); the slices
    // hold every block read and written (asserted above).
    unsafe { dequantize_blocks_256(format, d, m, qs, first, out) };
    true
}

#[target_feature(enable = "avx2,f16c")]
unsafe fn dequantize_blocks_256(format: QuantFormat, d: &[u16], m: &[u16], qs: &[u8], first: usize, out: &mut [f32]) {
    let mask = _mm_set1_epi8(0x0F);
    for (b, o) in out.chunks_exact_mut(32).enumerate() {
        let i = first + b;
        let dv = _mm256_set1_ps(super::packed::f16_value(d[i]));
        // SAFETY: block `i`'s payload and `o`'s 32 values are in bounds (see the caller).
        unsafe {
            let op = o.as_mut_ptr();
            match format {
                QuantFormat::Q8_0 => {
                    for j in 0..4 {
                        let q = _mm_loadl_epi64(qs.as_ptr().add(i * 32 + 8 * j).cast());
                        let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                        _mm256_storeu_ps(op.add(8 * j), _mm256_mul_ps(dv, v));
                    }
                }
                _ => {
                    let v = _mm_loadu_si128(qs.as_ptr().add(i * 16).cast());
                    let nibbles = [_mm_and_si128(v, mask), _mm_and_si128(_mm_srli_epi16::<4>(v), mask)];
                    // Q4_0 centres its quants on 8; Q4_1 adds its block's minimum.
                    let mv = (format == QuantFormat::Q4_1).then(|| _mm256_set1_ps(super::packed::f16_value(m[i])));
                    for (half, n) in nibbles.into_iter().enumerate() {
                        for (j, eight) in [n, _mm_srli_si128::<8>(n)].into_iter().enumerate() {
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(eight));
                            let x = match mv {
                                Some(mv) => _mm256_add_ps(_mm256_mul_ps(dv, q), mv),
                                None => _mm256_mul_ps(dv, _mm256_sub_ps(q, _mm256_set1_ps(8.0))),
                            };
                            _mm256_storeu_ps(op.add(16 * half + 8 * j), x);
                        }
                    }
                }
            }
        }
    }
}
