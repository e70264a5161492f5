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
//! - `d`, `m`: the f16 `d` and `dmin` (Q6_K: no `m`) at `(g · supers + s) · 16 + l`;
//! - `sc`, `mn`: Q4_K's and Q5_K's 6-bit scale and minimum at `(g · blocks + b) · 16 + l`;
//!   Q6_K's two i8 scales (one per 16 quants `h`) at `((g · blocks + b) · 2 + h) · 16 + l`;
//! - `qs`: per `(g, c)`, eight steps `j`, each 64 bytes, then (Q5_K) two u64 masks or
//!   (Q6_K) four: byte `4l + t` holds the low four bits of quant `4j + t` of block `2c` in
//!   its low nibble and of block `2c + 1` in its high one (a Q4_K chunk's bytes
//!   `4j .. 4j + 4`, as the file has them); mask `2p + odd` has bit `4l + t` set where that
//!   quant of block `2c + odd` has bit `4 + p` set.
//!
//! The product of a weight row and an activation row is, for every block `b` in order,
//! `acc = fma(Σ q·qx, (d · sc) · dx, acc)` then `acc = fma(−dmin · mn, s, acc)` from
//! `acc = 0` (`Σ q·qx` exact in i32, `d · sc` and `dmin · mn` exact in f32, `dx` and `s =
//! dx · Σ qx` the activation block's [`super::Q8Rows`] terms); for Q6_K, `acc = fma(Σ_h
//! sc_h · Σ (q − 32)·qx, d · dx, acc)`, the integer sum exact and formed as `sc_h · (Σ q·qx
//! − 32 · Σ qx)` per 16 quants. Each lane of every kernel and [`dot_scalar`] do exactly
//! these operations, so every level and every batch gives the same bits.

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

/// Whether `format`'s packed matrices are grouped: the K-quants'.
pub(super) fn is_grouped(format: QuantFormat) -> bool {
    matches!(format, QuantFormat::Q4_K | QuantFormat::Q5_K | QuantFormat::Q6_K)
}

/// Bytes of one step of a group's chunk: 16 rows' 4 bytes, and a u64 mask per block and
/// high bit.
pub(super) const fn step_bytes(format: QuantFormat) -> usize {
    64 + 16 * high_bits(format)
}

/// Bits of a quant above its low four.
pub(super) const fn high_bits(format: QuantFormat) -> usize {
    match format {
        QuantFormat::Q5_K => 1,
        QuantFormat::Q6_K => 2,
        _ => 0,
    }
}

/// Integer scales per block: Q6_K's one per 16 quants, the others' one.
pub(super) const fn sub_blocks(format: QuantFormat) -> usize {
    if matches!(format, QuantFormat::Q6_K) { 2 } else { 1 }
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

    /// The f16 `d` of block `b`'s super-block.
    pub(super) fn d(&self, b: usize) -> f32 {
        let supers = self.blocks() / BLOCKS_PER_SUPER;
        f16_value(self.p.d[(self.g * supers + b / BLOCKS_PER_SUPER) * GROUP + self.l])
    }

    /// Q4_K, Q5_K: block `b`'s scale `d · sc` and minimum factor `dmin · mn` (both exact).
    pub(super) fn scale_and_min(&self, b: usize) -> (f32, f32) {
        let (nb, p) = (self.blocks(), self.p);
        let s = (self.g * (nb / BLOCKS_PER_SUPER) + b / BLOCKS_PER_SUPER) * GROUP + self.l;
        let at = (self.g * nb + b) * GROUP + self.l;
        (self.d(b) * f32::from(p.sc[at]), f16_value(p.m[s]) * f32::from(p.mn[at]))
    }

    /// Q6_K: the integer scale of quants `16h .. 16h + 16` of block `b`.
    pub(super) fn sub_scale(&self, b: usize, h: usize) -> i32 {
        i32::from(self.p.sc[((self.g * self.blocks() + b) * 2 + h) * GROUP + self.l].cast_signed())
    }

    /// Block `b`'s unsigned quants in element order.
    pub(super) fn quants(&self, b: usize) -> [u8; 32] {
        let (format, qs) = (self.p.format, &self.p.qs);
        let step = step_bytes(format);
        let chunk = (self.g * (self.blocks() / 2) + b / 2) * STEPS * step;
        let odd = b % 2;
        std::array::from_fn(|e| {
            let at = chunk + (e / STEP_QUANTS) * step;
            let lane = STEP_QUANTS * self.l + e % STEP_QUANTS;
            (0..high_bits(format)).fold((qs[at + lane] >> (4 * odd)) & 0xF, |q, plane| {
                let bit = (qs[at + 64 + 8 * (2 * plane + odd) + lane / 8] >> (lane % 8)) & 1;
                q | bit << (4 + plane)
            })
        })
    }
}

/// The exact integer sum of block `b`: `Σ q · qx`, or Q6_K's `Σ_h sc_h · Σ (q − 32) · qx`.
pub(super) fn block_int_dot(w: &GroupRow<'_>, a: &ActRow<'_>, b: usize) -> i32 {
    let (q, qx) = (w.quants(b), &a.qs[32 * b..32 * b + 32]);
    let dot = |range: std::ops::Range<usize>, offset: i32| -> i32 {
        range.map(|e| (i32::from(q[e]) - offset) * i32::from(qx[e])).sum()
    };
    if w.p.format == QuantFormat::Q6_K {
        (0..2).map(|h| w.sub_scale(b, h) * dot(16 * h..16 * h + 16, 32)).sum()
    } else {
        dot(0..32, 0)
    }
}

/// `w · a` in the operations of every kernel lane (see the module's docs).
pub(super) fn dot_scalar(w: &GroupRow<'_>, a: &ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for b in 0..w.blocks() {
        let sum = block_int_dot(w, a, b) as f32;
        if w.p.format == QuantFormat::Q6_K {
            acc = sum.mul_add(w.d(b) * a.d[b], acc);
        } else {
            let (scale, min) = w.scale_and_min(b);
            acc = sum.mul_add(scale * a.d[b], acc);
            acc = (-min).mul_add(a.s[b], acc);
        }
    }
    acc
}

/// Rows `rows` of a grouped matrix as f32, equal to the block decoders' values.
pub(super) fn dequantize_rows(p: &PackedQuant, rows: std::ops::Range<usize>, out: &mut [f32]) {
    let nb = p.blocks_per_row();
    for (r, o) in rows.zip(out.chunks_exact_mut(nb * 32)) {
        let w = GroupRow::of(p, r);
        for (b, o) in o.chunks_exact_mut(32).enumerate() {
            let q = w.quants(b);
            if p.format == QuantFormat::Q6_K {
                for (h, (o, q)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                    let scale = w.d(b) * w.sub_scale(b, h) as f32;
                    o.iter_mut().zip(q).for_each(|(o, &q)| *o = scale * (f32::from(q) - 32.0));
                }
            } else {
                let (scale, min) = w.scale_and_min(b);
                o.iter_mut().zip(q).for_each(|(o, q)| *o = scale * f32::from(q) - min);
            }
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
