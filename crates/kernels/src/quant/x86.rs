//! AVX-512 and AVX2 (+ FMA, F16C) products of f32 activations with packed quantised rows
//! ([`super::PackedQuant`]: f16 scales in arrays of their own, quants without their block
//! headers), and the AVX2 dequantiser of those rows.
//!
//! Per block: widen the quants to f32 vectors, multiply by the matching activations,
//! scale the block's partial sum by `d`; the minimum terms `m · Σx` of a row come last from
//! the precomputed block sums. Two rows run side by side so their FMA chains overlap
//! and each activation vector is loaded once for both; several activation rows share one
//! unpacked weight row the same way. Weights are never rounded: results differ from the
//! scalar path only by summation order. One body ([`dots`]) serves both instruction sets
//! and every shape, written in the operations of [`super::x86_isa`].

use std::arch::x86_64::*;

use super::QuantFormat;
use super::SimdLevel as Level;
use super::q8::WeightRow;
use super::x86_isa::{Avx2, Avx512, Isa};

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
pub(super) unsafe fn widen(d: &[u16], c: usize, n: usize, out: &mut [f32; WIDEN]) {
    for j in (0..n).step_by(8) {
        // SAFETY: as the caller guarantees; `j + 8 <= WIDEN` since both are multiples of 8.
        unsafe {
            let h = _mm_loadu_si128(d.as_ptr().add(c + j).cast());
            _mm256_storeu_ps(out.as_mut_ptr().add(j), _mm256_cvtph_ps(h));
        }
    }
}

/// Widens the scales of the group of blocks from `c` (`WIDEN` of them, or the rest of the
/// row) of every row into `dw[r]`; returns the group's length. Groups start at multiples
/// of `WIDEN` (even), so two-block steps pair the blocks as they would without groups.
///
/// # Safety
/// The CPU must have AVX and F16C; every row's scale array runs on past its blocks, as
/// `WeightRow` promises.
#[inline]
#[target_feature(enable = "avx,f16c")]
pub(super) unsafe fn widen_group<const R: usize>(
    w: &[WeightRow<'_>; R],
    c: usize,
    dw: &mut [[f32; WIDEN]; R],
) -> usize {
    let n = (w[0].nb - c).min(WIDEN);
    for (row, d) in w.iter().zip(dw.iter_mut()) {
        // SAFETY: as the caller guarantees.
        unsafe { widen(row.d, c, n, d) };
    }
    n
}

/// Row `r` of a Q4_0 / Q4_1 (`q4`) or Q8_0 matrix, the only formats these kernels take.
#[inline(always)]
fn lean_row(p: &super::packed::PackedQuant, r: usize, q4: bool) -> WeightRow<'_> {
    if q4 { WeightRow::lean::<true>(p, r) } else { WeightRow::lean::<false>(p, r) }
}

/// The process's SIMD level (see [`super::SimdLevel::current`]).
fn level() -> Level {
    Level::current()
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
        let w = [lean_row(p, ra, q4), lean_row(p, rb, q4)];
        // SAFETY: the kernels run only on CPUs with their features (checked by `level`);
        // each row holds `nb` scales (and minimums) and `nb` payloads, `x` holds `32 · nb`
        // values and `sums` `nb` (checked by the caller).
        let (va, vb) = unsafe {
            match (level, q4) {
                (Level::Avx512, true) => pair_512::<true>(x, sums, &w),
                (Level::Avx512, false) => pair_512::<false>(x, sums, &w),
                (_, true) => pair_q4_256(x, sums, &w),
                (_, false) => pair_256::<false>(x, sums, &w),
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
    let m = x.len() / p.k().max(1);
    let mut job = ManyRows { p, x, sums, rows, out };
    for first in (0..m).step_by(4) {
        match (m - first).min(4) {
            4 => job.group::<4>(first),
            3 => job.group::<3>(first),
            2 => job.group::<2>(first),
            _ => job.group::<1>(first),
        }
    }
    true
}

/// The operands and output of one [`packed_dot_rows_many`] call.
struct ManyRows<'a, 'p> {
    p: &'p super::packed::PackedQuant,
    x: &'a [f32],
    sums: &'a [f32],
    rows: std::ops::Range<usize>,
    out: &'a mut [f32],
}

impl ManyRows<'_, '_> {
    /// Activation rows `first..first + M` against every weight row, one weight row per
    /// kernel call.
    fn group<const M: usize>(&mut self, first: usize) {
        let (k, nb, n) = (self.p.k(), self.p.blocks_per_row(), self.rows.len());
        let xs: [&[f32]; M] = std::array::from_fn(|i| &self.x[(first + i) * k..(first + i + 1) * k]);
        let ss: [&[f32]; M] = std::array::from_fn(|i| &self.sums[(first + i) * nb..(first + i + 1) * nb]);
        let q4 = self.p.format() != QuantFormat::Q8_0;
        for (j, r) in self.rows.clone().enumerate() {
            let w = lean_row(self.p, r, q4);
            // SAFETY: the CPU has AVX-512 (checked by `level`); the row holds `nb` scales,
            // minimums and payloads, each activation row `32 · nb` values and each sums row
            // `nb` (checked by the caller).
            let got =
                unsafe { if q4 { many_512::<true, M>(&xs, &ss, &w) } else { many_512::<false, M>(&xs, &ss, &w) } };
            for (i, g) in got.iter().enumerate() {
                self.out[(first + i) * n + j] = *g;
            }
        }
    }
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

/// Two packed rows against one activation row with AVX-512 ([`dots`]). The pair comes
/// back as two floats, in two registers: returned as `[[f32; 1]; 2]`, packed into one
/// integer register, it made the one-row products at k = 576 2 to 4 % slower.
///
/// # Safety
/// As [`dots`], on a CPU with AVX-512F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn pair_512<const Q4: bool>(x: &[f32], sums: &[f32], w: &[WeightRow<'_>; 2]) -> (f32, f32) {
    // SAFETY: this function enables `Avx512`'s features; the rest as the caller guarantees.
    let [[a], [b]] = unsafe { dots::<Avx512, Q4, 2, 1>(&[x], &[sums], w) };
    (a, b)
}

/// [`pair_512`] with AVX2.
///
/// # Safety
/// As [`dots`], on a CPU with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_256<const Q4: bool>(x: &[f32], sums: &[f32], w: &[WeightRow<'_>; 2]) -> (f32, f32) {
    // SAFETY: this function enables `Avx2`'s features; the rest as the caller guarantees.
    let [[a], [b]] = unsafe { dots::<Avx2, Q4, 2, 1>(&[x], &[sums], w) };
    (a, b)
}

/// [`pair_256`] for Q4 rows, written out: the one product the generic body did not keep at
/// its speed. Through [`dots`] the AVX2 exact Q4 pair measured 3.6 to 3.9 % slower at
/// k = 576 (one to eight activation rows), and a whole decode step held to AVX2 with
/// `--quant-dots exact` 4 % slower (`bench/results/house-2026-12-03/`), its hot loop the same
/// instructions in another order. Here each widened quarter feeds its product at once. The
/// operations and their order are [`dots`]', so the bits are too (`quant/tests.rs` checks
/// every level against the block decoder).
///
/// # Safety
/// As [`dots`], on a CPU with AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pair_q4_256(x: &[f32], sums: &[f32], w: &[WeightRow<'_>; 2]) -> (f32, f32) {
    let mask = _mm_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut dw = [[0f32; WIDEN]; 2];
    for c in (0..w[0].nb).step_by(WIDEN) {
        // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
        let n = unsafe { widen_group(w, c, &mut dw) };
        for i in c..c + n {
            // SAFETY: block `i < nb` of both rows (16 bytes each) and activations
            // `32i..32i+32` are in bounds; loads are unaligned.
            unsafe {
                let xp = x.as_ptr().add(i * 32);
                let xs = [
                    _mm256_loadu_ps(xp),
                    _mm256_loadu_ps(xp.add(8)),
                    _mm256_loadu_ps(xp.add(16)),
                    _mm256_loadu_ps(xp.add(24)),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qs = _mm_loadu_si128(w[r].qs.as_ptr().add(i * 16).cast());
                    let (lo, hi) = (_mm_and_si128(qs, mask), _mm_and_si128(_mm_srli_epi16(qs, 4), mask));
                    let wf = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                    let mut p = _mm256_mul_ps(wf(lo), xs[0]);
                    p = _mm256_fmadd_ps(wf(_mm_srli_si128(lo, 8)), xs[1], p);
                    p = _mm256_fmadd_ps(wf(hi), xs[2], p);
                    p = _mm256_fmadd_ps(wf(_mm_srli_si128(hi, 8)), xs[3], p);
                    *acc = _mm256_fmadd_ps(_mm256_set1_ps(*dw[r].get_unchecked(i - c)), p, *acc);
                }
            }
        }
    }
    // SAFETY: the CPU has AVX2, FMA and F16C (this function's features).
    unsafe {
        let reduce = |v| <Avx2 as Isa>::reduce(v);
        (reduce(acc[0]) + min_term(&w[0], sums), reduce(acc[1]) + min_term(&w[1], sums))
    }
}

/// One packed row against `M` activation rows with AVX-512 ([`dots`]).
///
/// # Safety
/// As [`dots`], on a CPU with AVX-512F, AVX2, FMA and F16C.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn many_512<const Q4: bool, const M: usize>(
    xs: &[&[f32]; M],
    sums: &[&[f32]; M],
    w: &WeightRow<'_>,
) -> [f32; M] {
    // SAFETY: this function enables `Avx512`'s features; the rest as the caller guarantees.
    let [got] = unsafe { dots::<Avx512, Q4, 1, M>(xs, sums, &[*w]) };
    got
}

/// `out[r][i] = xs[i] · w[r]` for `R` packed Q4 (`Q4`) or Q8_0 rows and `M` activation
/// rows (`sums` their block sums): per block, the weights widened to f32 once for all
/// activation rows, each block's products summed in element order into one vector and
/// scaled into its pair's accumulator, whose lanes are summed at the end; then the
/// minimum terms. Each pair sees the same operations in the same order whatever `R` and
/// `M` are.
///
/// # Safety
/// The CPU must have `S`'s features (and AVX and F16C); every weight row holds `nb`
/// scales (and minimums) running on past its blocks (`WeightRow`) and `nb` payloads, every
/// activation row `32 · nb` values and every sums row `nb`.
#[inline(always)]
unsafe fn dots<S: Isa, const Q4: bool, const R: usize, const M: usize>(
    xs: &[&[f32]; M],
    sums: &[&[f32]; M],
    w: &[WeightRow<'_>; R],
) -> [[f32; M]; R] {
    let payload = if Q4 { 16 } else { 32 };
    // SAFETY: the CPU has `S`'s features (the caller guarantees).
    let mut acc = [[unsafe { S::zero() }; M]; R];
    let mut dw = [[0f32; WIDEN]; R];
    for c in (0..w[0].nb).step_by(WIDEN) {
        // SAFETY: every row's scale array runs on past its blocks (`WeightRow`).
        let n = unsafe { widen_group(w, c, &mut dw) };
        for i in c..c + n {
            // SAFETY: the CPU has `S`'s features; block `i < nb` of every weight row
            // (`payload` bytes) and activations `32i..32i+32` of every activation row are
            // in bounds; loads are unaligned.
            unsafe {
                let mut x = [S::zero_block(); M];
                for (x, row) in x.iter_mut().zip(xs) {
                    *x = S::load_block(row.as_ptr().add(i * 32));
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let qs = w[r].qs.as_ptr().add(i * payload);
                    let q = if Q4 { S::widen_q4(qs) } else { S::widen_q8(qs) };
                    let d = S::splat(*dw[r].get_unchecked(i - c));
                    for (acc, x) in acc.iter_mut().zip(&x) {
                        *acc = S::fmadd(d, block_dot::<S>(&q, x), *acc);
                    }
                }
            }
        }
    }
    let mut out = [[0f32; M]; R];
    for r in 0..R {
        for i in 0..M {
            // SAFETY: the CPU has `S`'s features, and AVX and F16C for `min_term`.
            out[r][i] = unsafe {
                let sum = S::reduce(acc[r][i]);
                if Q4 { sum + min_term(&w[r], sums[i]) } else { sum }
            };
        }
    }
    out
}

/// One block's `Σ w · x` as a vector: the product of its first vectors, then each next
/// one fused in, in element order.
///
/// # Safety
/// The CPU must have `S`'s features.
#[inline(always)]
unsafe fn block_dot<S: Isa>(w: &S::Block, x: &S::Block) -> S::F {
    let (w, x) = (w.as_ref(), x.as_ref());
    // SAFETY: as the caller guarantees.
    unsafe {
        let mut p = S::mul(w[0], x[0]);
        // An index loop over the block's fixed length unrolls fully; an iterator chain
        // with `skip` was left a loop over vectors spilled to the stack.
        for j in 1..w.len() {
            p = S::fmadd(w[j], x[j], p);
        }
        p
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::tests::random_row;
    use crate::quant::{PackedQuant, block_sums};

    /// The written-out AVX2 Q4 pair gives the generic body's bits, at a row length past the
    /// 64-block groups of widened scales.
    #[test]
    fn the_written_out_avx2_q4_pair_is_the_generic_one_bit_for_bit() {
        if !std::is_x86_feature_detected!("avx2") || !std::is_x86_feature_detected!("fma") {
            return;
        }
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1] {
            for k in [64, 32 * 70] {
                let x: Vec<f32> = (0..k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
                let sums = block_sums(&x);
                let rows: Vec<u8> = (0..2).flat_map(|seed| random_row(format, k, seed + 3)).collect();
                let packed = PackedQuant::from_blocks(format, &rows, k).expect("packable");
                let w = [WeightRow::of(&packed, 0), WeightRow::of(&packed, 1)];
                // SAFETY: the CPU has AVX2 and FMA (checked above; F16C comes with them on
                // every CPU that has both); the rows and activations are `k` long.
                let (written, generic) = unsafe { (pair_q4_256(&x, &sums, &w), pair_256::<true>(&x, &sums, &w)) };
                assert_eq!(written.0.to_bits(), generic.0.to_bits(), "{format} k={k}");
                assert_eq!(written.1.to_bits(), generic.1.to_bits(), "{format} k={k}");
            }
        }
    }
}
