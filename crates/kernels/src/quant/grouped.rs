//! Q4_K and Q5_K matrices as groups of [`GROUP`] rows, interleaved four quants at a time,
//! and the order of the f32 operations every integer product of them follows.
//!
//! A prompt multiplies each weight by many activation rows, and with one row per vector
//! (the other formats' layout) each block's integer sum is spread over lanes that must be
//! scaled one at a time. Here lane `l` of a vector is row `l` of a group: one 64-byte load
//! holds four consecutive quants of each of 16 rows, `vpdpbusd` against four activation
//! quants broadcast to every lane adds them into each row's own i32 lane, and after a
//! block's eight such steps every lane holds its row's exact block sum. Scaling then costs
//! two f32 operations per block for 16 rows at once, where the row layout paid two per
//! 32 quants of each row.
//!
//! Layout (`g` a group, `s` a super-block, `b` a block, `c` a chunk of two blocks, `l` a
//! row of the group; rows past the matrix's last are zeros):
//! - `d`, `m`: the f16 `d` and `dmin` at `(g · supers + s) · 16 + l`;
//! - `sc`, `mn`: the 6-bit scale and minimum at `(g · blocks + b) · 16 + l`;
//! - `qs`: per `(g, c)`, eight steps `j`, each 64 bytes (Q5_K: then two u64 masks, 80): byte
//!   `4l + t` holds quant `4j + t` of block `2c` in its low nibble and of block `2c + 1`
//!   in its high one (a chunk's bytes `4j .. 4j + 4`, as Q4_K keeps them); Q5_K's masks
//!   have bit `4l + t` set where that quant of block `2c` (first mask) or `2c + 1`
//!   (second) has its fifth bit.
//!
//! The product of a weight row and an activation row is, for every block `b` in order,
//! `acc = fma(Σ q·qx, (d · sc) · dx, acc)` then `acc = fma(−dmin · mn, s, acc)` from
//! `acc = 0` (`Σ q·qx` exact in i32, `d · sc` and `dmin · mn` exact in f32, `dx` and `s =
//! dx · Σ qx` the activation block's [`super::Q8Rows`] terms): each lane of every kernel
//! and [`dot_scalar`] do exactly these operations, so every level and every batch gives the
//! same bits.

use super::QuantFormat;
use super::packed::{PackedQuant, f16_value};
use super::packed_k::BLOCKS_PER_SUPER;
use super::q8::ActRow;

/// Rows of a group: the lanes of an AVX-512 vector of i32.
pub(super) const GROUP: usize = 16;

/// Quants of a row per step of a chunk.
const STEP_QUANTS: usize = 4;

/// Steps per chunk: a block's 32 quants, four at a time.
pub(super) const STEPS: usize = 32 / STEP_QUANTS;

/// Whether `format`'s packed matrices are grouped.
pub(super) fn is_grouped(format: QuantFormat) -> bool {
    matches!(format, QuantFormat::Q4_K | QuantFormat::Q5_K)
}

/// Bytes of one step of a group's chunk: 16 rows' 4 bytes, and Q5_K's two masks.
pub(super) const fn step_bytes(format: QuantFormat) -> usize {
    if matches!(format, QuantFormat::Q5_K) { 80 } else { 64 }
}

impl PackedQuant {
    /// Groups of the matrix's rows.
    pub(super) fn groups(&self) -> usize {
        self.rows.div_ceil(GROUP)
    }

    /// Regroups a Q4_K or Q5_K matrix from rows of chunks (`packed_k`'s layout: per row,
    /// its super-blocks' `d` and `dmin`, its blocks' `sc` and `mn`, its chunks of 32 nibble
    /// bytes and, for Q5_K, a u64 of fifth bits) into groups of [`GROUP`] rows.
    pub(super) fn group_rows(&mut self) {
        let (nb, groups) = (self.blocks_per_row(), self.groups());
        let (supers, chunks) = (nb / BLOCKS_PER_SUPER, nb / 2);
        let q5 = self.format == QuantFormat::Q5_K;
        let chunk_bytes = if q5 { 40 } else { 32 };
        let step = step_bytes(self.format);
        let lanes = |per_row: usize| groups * per_row * GROUP;
        let (mut d, mut m) = (vec![0u16; lanes(supers)], vec![0u16; lanes(supers)]);
        let (mut sc, mut mn) = (vec![0u8; lanes(nb)], vec![0u8; lanes(nb)]);
        let mut qs = vec![0u8; groups * chunks * STEPS * step];
        for r in 0..self.rows {
            let (g, l) = (r / GROUP, r % GROUP);
            for s in 0..supers {
                d[(g * supers + s) * GROUP + l] = self.d[r * supers + s];
                m[(g * supers + s) * GROUP + l] = self.m[r * supers + s];
            }
            for b in 0..nb {
                sc[(g * nb + b) * GROUP + l] = self.sc[r * nb + b];
                mn[(g * nb + b) * GROUP + l] = self.mn[r * nb + b];
            }
            for c in 0..chunks {
                let chunk = &self.qs[(r * chunks + c) * chunk_bytes..][..chunk_bytes];
                let fifth = if q5 { u64::from_le_bytes(chunk[32..].try_into().expect("8 bytes")) } else { 0 };
                for j in 0..STEPS {
                    let at = ((g * chunks + c) * STEPS + j) * step;
                    qs[at + 4 * l..at + 4 * l + 4].copy_from_slice(&chunk[4 * j..4 * j + 4]);
                    if q5 {
                        for (mask, first) in [(64, 4 * j), (72, 32 + 4 * j)] {
                            let bits = (fifth >> first) & 0xF;
                            let word = u64::from_le_bytes(qs[at + mask..at + mask + 8].try_into().expect("8 bytes"));
                            qs[at + mask..at + mask + 8].copy_from_slice(&(word | bits << (4 * l)).to_le_bytes());
                        }
                    }
                }
            }
        }
        (self.d, self.m, self.sc, self.mn, self.qs) = (d, m, sc, mn, qs);
    }
}

/// Row `l` of group `g` of a grouped matrix, as the scalar paths read it.
#[derive(Clone, Copy)]
pub(super) struct GroupRow<'a> {
    p: &'a PackedQuant,
    g: usize,
    l: usize,
}

impl<'a> GroupRow<'a> {
    /// Row `r` of `p`.
    pub(super) fn of(p: &'a PackedQuant, r: usize) -> Self {
        debug_assert!(is_grouped(p.format) && r < p.rows);
        Self { p, g: r / GROUP, l: r % GROUP }
    }

    /// Blocks of the row.
    pub(super) fn blocks(&self) -> usize {
        self.p.blocks_per_row()
    }

    /// Block `b`'s scale `d · sc` and minimum factor `dmin · mn` (both exact).
    pub(super) fn scale_and_min(&self, b: usize) -> (f32, f32) {
        let (nb, p) = (self.blocks(), self.p);
        let s = (self.g * (nb / BLOCKS_PER_SUPER) + b / BLOCKS_PER_SUPER) * GROUP + self.l;
        let at = (self.g * nb + b) * GROUP + self.l;
        (f16_value(p.d[s]) * f32::from(p.sc[at]), f16_value(p.m[s]) * f32::from(p.mn[at]))
    }

    /// Block `b`'s unsigned quants in element order.
    pub(super) fn quants(&self, b: usize) -> [u8; 32] {
        let step = step_bytes(self.p.format);
        let chunk = (self.g * (self.blocks() / 2) + b / 2) * STEPS * step;
        let shift = 4 * (b % 2);
        std::array::from_fn(|e| {
            let at = chunk + (e / STEP_QUANTS) * step;
            let lane = STEP_QUANTS * self.l + e % STEP_QUANTS;
            let nibble = (self.p.qs[at + lane] >> shift) & 0xF;
            if self.p.format == QuantFormat::Q5_K {
                let mask = &self.p.qs[at + 64 + 8 * (b % 2)..][..8];
                let bit = (u64::from_le_bytes(mask.try_into().expect("8 bytes")) >> lane) & 1;
                nibble | (bit as u8) << 4
            } else {
                nibble
            }
        })
    }
}

/// The exact `Σ q · qx` of block `b`.
pub(super) fn block_int_dot(w: &GroupRow<'_>, a: &ActRow<'_>, b: usize) -> i32 {
    w.quants(b).iter().zip(&a.qs[32 * b..32 * b + 32]).map(|(&q, &x)| i32::from(q) * i32::from(x)).sum()
}

/// `w · a` in the operations of every kernel lane (see the module's docs).
pub(super) fn dot_scalar(w: &GroupRow<'_>, a: &ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for b in 0..w.blocks() {
        let (scale, min) = w.scale_and_min(b);
        acc = (block_int_dot(w, a, b) as f32).mul_add(scale * a.d[b], acc);
        acc = (-min).mul_add(a.s[b], acc);
    }
    acc
}

/// Rows `rows` of a grouped matrix as f32, equal to the block decoders' values.
pub(super) fn dequantize_rows(p: &PackedQuant, rows: std::ops::Range<usize>, out: &mut [f32]) {
    let nb = p.blocks_per_row();
    for (r, o) in rows.zip(out.chunks_exact_mut(nb * 32)) {
        let w = GroupRow::of(p, r);
        for (b, o) in o.chunks_exact_mut(32).enumerate() {
            let (scale, min) = w.scale_and_min(b);
            o.iter_mut().zip(w.quants(b)).for_each(|(o, q)| *o = scale * f32::from(q) - min);
        }
    }
}

/// `out[i · rows.len() + j] = x_i · row (rows.start + j)` without SIMD.
pub(super) fn dot_rows(p: &PackedQuant, x: &super::Q8Rows, rows: std::ops::Range<usize>, out: &mut [f32]) {
    let n = rows.len();
    for i in 0..x.rows() {
        let a = x.row(i);
        for (j, r) in rows.clone().enumerate() {
            out[i * n + j] = dot_scalar(&GroupRow::of(p, r), &a);
        }
    }
}
