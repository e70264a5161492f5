//! Integer dot products of packed rows (Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K,
//! Q6_K) with activations quantised to 8 bits per 32-element block, as llama.cpp's `q8`
//! activation blocks do.
//!
//! The f32 kernels ([`super::PackedQuant::dot_rows`]) widen every weight to f32 and are
//! exact; a decode step of a model that fits in cache is bound by that arithmetic. Here
//! each activation block becomes `dx · qx` (`dx = max|x| / 127`, `qx` an i8), so a weight
//! block contributes `dw · dx · Σ q·qx (+ m · dx · Σ qx)` with the inner sum in exact
//! integer arithmetic: 32 multiply-adds per instruction pair instead of 16 or 8. The
//! K-quants fit the same form block by block (a Q4_K/Q5_K block's `dw` is `d · sc` and its
//! `m` is `−dmin · mn`; a Q6_K block's two sub-block scales multiply their integer sums),
//! in matrices grouped 16 rows to a vector (`grouped`, which defines their products).
//! Every format shares one activation quantisation.
//!
//! Invariants: the integer sums are exact at every SIMD level (no saturation: see the
//! kernels in `x86_int` and `x86_grouped`), so levels differ only in the order of the f32
//! scaling of the per-block sums (the grouped formats' not at all). The one error against
//! the exact product is the rounding of `x` to `qx`: at most `dx / 2` per element, i.e.
//! `|Δ| ≤ Σ_blocks (dx / 2) · Σ |w|`
//! (tested). Each activation row's result is bit for bit the same however many activation
//! rows and weight rows run together, so speculative verification sees decode's logits.

use super::grouped::is_grouped;
use super::packed::{PackedQuant, f16_value};
use super::{QuantFormat, SimdLevel};

/// Activation rows `[m, k]` quantised per 32-element block to `d · q` with i8 `q`.
#[derive(Debug, Clone)]
pub struct Q8Rows {
    k: usize,
    /// Scale of each block, `[m, k / 32]`.
    pub(super) d: Vec<f32>,
    /// `d · Σ q` of each block, `[m, k / 32]`: the factor of a weight block's minimum.
    pub(super) s: Vec<f32>,
    /// The quants, `[m, k]`.
    pub(super) qs: Vec<i8>,
    /// `Σ q` of each 16 quants, `[m, k / 16]`: Q6_K's offset of 32 times them.
    pub(super) s16: Vec<i32>,
}

impl Q8Rows {
    /// Quantises the rows of `x` (whole rows of `k`, `k` a multiple of 32).
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x` not whole rows of `k`.
    pub fn quantize(x: &[f32], k: usize) -> Self {
        assert!(k.is_multiple_of(32), "k = {k} is not whole blocks of 32");
        assert!(k == 0 || x.len().is_multiple_of(k), "x is not whole rows of {k}");
        let blocks = x.len() / 32;
        let mut rows = Self { k, d: vec![0.0; blocks], s: vec![0.0; blocks], qs: vec![0; x.len()], s16: Vec::new() };
        #[cfg(target_arch = "x86_64")]
        let done = super::x86_int::quantize(SimdLevel::current(), x, &mut rows);
        #[cfg(not(target_arch = "x86_64"))]
        let done = false;
        if !done {
            for (b, (xb, qb)) in x.chunks_exact(32).zip(rows.qs.chunks_exact_mut(32)).enumerate() {
                (rows.d[b], rows.s[b]) = quantize_block(xb, qb);
            }
        }
        rows.s16 = rows.qs.chunks_exact(16).map(|q| q.iter().map(|&q| i32::from(q)).sum()).collect();
        rows
    }

    /// Elements per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.d.len() / (self.k / 32).max(1)
    }

    /// Row `i`'s scales, block terms and quants.
    pub(super) fn row(&self, i: usize) -> ActRow<'_> {
        let nb = self.k / 32;
        ActRow {
            d: &self.d[i * nb..(i + 1) * nb],
            s: &self.s[i * nb..(i + 1) * nb],
            qs: &self.qs[i * self.k..(i + 1) * self.k],
            s16: &self.s16[i * 2 * nb..(i + 1) * 2 * nb],
        }
    }
}

/// Quantises one block of 32 values into `q`; returns its `d` and `d · Σ q`. Rounding is
/// to nearest, ties to even, as the SIMD quantiser rounds, so both give the same blocks.
pub(super) fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut sum = 0i32;
    for (q, v) in q.iter_mut().zip(x) {
        // |v · inv| ≤ 127 up to rounding, so the clamp only guards that rounding.
        *q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
        sum += i32::from(*q);
    }
    (d, d * sum as f32)
}

/// One quantised activation row.
#[derive(Clone, Copy)]
pub(super) struct ActRow<'a> {
    pub(super) d: &'a [f32],
    pub(super) s: &'a [f32],
    pub(super) qs: &'a [i8],
    pub(super) s16: &'a [i32],
}

/// One row of a Q4_0, Q4_1 or Q8_0 matrix: its `nb` blocks' scales and minimums (Q4) as
/// f16 bits, and payloads. `d` and `m` start at the row's first block and run on to the
/// end of the matrix's arrays (the next rows', then [`super::packed::SCALE_PAD`] zeros), so
/// a vector load of 16 of them that starts at any block of the row stays in bounds; the
/// row's own are the first `nb`. (The K-quants' rows are `grouped`.)
#[derive(Clone, Copy)]
pub(super) struct WeightRow<'a> {
    pub(super) format: QuantFormat,
    pub(super) nb: usize,
    pub(super) d: &'a [u16],
    pub(super) m: &'a [u16],
    pub(super) qs: &'a [u8],
}

impl<'a> WeightRow<'a> {
    /// Row `r` of `p`, of any format but the grouped ones (no minimums for Q8_0): the
    /// scalar path's and the tests' view. The SIMD kernels take their rows from
    /// [`Self::lean`], fixed by the kernel's format, once per row and tile: strides by
    /// format, no division, and inlined (a call returned the struct through memory, which
    /// the caller's wider loads then waited on: measured, a third of a Q4_1 decode
    /// matmul's time).
    #[inline(always)]
    pub(super) fn of(p: &'a PackedQuant, r: usize) -> Self {
        assert!(!is_grouped(p.format()), "{} rows are grouped (`GroupRow`)", p.format());
        if p.format() == QuantFormat::Q8_0 { Self::lean::<false>(p, r) } else { Self::lean::<true>(p, r) }
    }

    /// Row `r` of a Q4_0 / Q4_1 (`Q4`) or Q8_0 matrix, with constant strides.
    #[inline(always)]
    pub(super) fn lean<const Q4: bool>(p: &'a PackedQuant, r: usize) -> Self {
        let nb = p.blocks_per_row();
        let payload = if Q4 { 16 } else { 32 };
        Self {
            format: p.format(),
            nb,
            d: &p.d[r * nb..],
            m: if Q4 { &p.m[r * nb..] } else { &[] },
            qs: &p.qs[r * nb * payload..(r + 1) * nb * payload],
        }
    }

    /// Whether the format has minimum terms (`m · dx · Σ qx`).
    pub(super) fn has_minimums(&self) -> bool {
        self.format != QuantFormat::Q8_0
    }
}

/// Block `b`'s f32 scale: its f16 `d`.
pub(super) fn block_scale(w: &WeightRow<'_>, b: usize) -> f32 {
    f16_value(w.d[b])
}

/// Block `b`'s minimum term factor: the f16 `m` of Q4_0/Q4_1, zero without minimums.
pub(super) fn block_min(w: &WeightRow<'_>, b: usize) -> f32 {
    if w.has_minimums() { f16_value(w.m[b]) } else { 0.0 }
}

/// `Σ m · s` over a row's blocks: the minimum (or Q4_0 offset, `m = −8 · d`) terms, added
/// after the integer blocks in the same order at every level.
pub(super) fn min_term(w: &WeightRow<'_>, a: &ActRow<'_>) -> f32 {
    if !w.has_minimums() {
        return 0.0;
    }
    (0..w.nb).zip(a.s).map(|(b, s)| block_min(w, b) * s).sum()
}

/// The exact integer sum `Σ q · qx` of block `b`: the reference the SIMD kernels match.
pub(super) fn block_int_dot(w: &WeightRow<'_>, a: &ActRow<'_>, b: usize) -> i32 {
    let qx = &a.qs[b * 32..(b + 1) * 32];
    if w.format == QuantFormat::Q8_0 {
        return w.qs[b * 32..(b + 1) * 32]
            .iter()
            .zip(qx)
            .map(|(&q, &x)| i32::from(q.cast_signed()) * i32::from(x))
            .sum();
    }
    let qs = &w.qs[b * 16..(b + 1) * 16];
    (0..16).map(|j| i32::from(qs[j] & 0xF) * i32::from(qx[j]) + i32::from(qs[j] >> 4) * i32::from(qx[j + 16])).sum()
}

/// `w · a` without SIMD: each block's exact integer sum scaled by `dw · dx`, then the
/// minimum terms.
pub(super) fn dot_scalar(w: &WeightRow<'_>, a: &ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for b in 0..w.nb {
        acc += block_scale(w, b) * a.d[b] * block_int_dot(w, a, b) as f32;
    }
    acc + min_term(w, a)
}

impl PackedQuant {
    /// `out[i · rows.len() + j] = x_i · row (rows.start + j)` for every quantised
    /// activation row `x_i` of `x`, with integer dot products at the process's SIMD level.
    /// Each weight block is loaded once for up to eight activation rows.
    ///
    /// # Panics
    /// If `x` does not have this matrix's `k`, `out` does not hold `x.rows() · rows.len()`
    /// values, or the rows are out of range.
    pub fn dot_rows_q8(&self, x: &Q8Rows, rows: std::ops::Range<usize>, out: &mut [f32]) {
        self.dot_rows_q8_at(SimdLevel::current(), x, rows, out);
    }

    /// [`Self::dot_rows_q8`] with the kernels of `level` (capped at what the CPU has).
    pub(super) fn dot_rows_q8_at(&self, level: SimdLevel, x: &Q8Rows, rows: std::ops::Range<usize>, out: &mut [f32]) {
        assert_eq!(x.k(), self.k(), "activations and weights differ in k");
        assert_eq!(out.len(), x.rows() * rows.len(), "one output per row pair");
        assert!(rows.end <= self.rows(), "rows past the matrix");
        if is_grouped(self.format) {
            #[cfg(target_arch = "x86_64")]
            if super::x86_grouped::dot_rows(level.min(SimdLevel::detected()).for_int8(), self, x, rows.clone(), out) {
                return;
            }
            return super::grouped::dot_rows(self, x, rows, out);
        }
        #[cfg(target_arch = "x86_64")]
        if super::x86_int::dot_rows(level.min(SimdLevel::detected()).for_int8(), self, x, rows.clone(), out) {
            return;
        }
        let _ = level;
        let n = rows.len();
        for i in 0..x.rows() {
            let a = x.row(i);
            for (j, r) in rows.clone().enumerate() {
                out[i * n + j] = dot_scalar(&WeightRow::of(self, r), &a);
            }
        }
    }
}
