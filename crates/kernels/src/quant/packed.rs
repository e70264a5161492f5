//! The CPU's working layout of Q4_0, Q4_1, Q8_0 and K-quant matrices: the same values as the
//! file's blocks, with the f16 scales (and minimums) split out of the blocks at upload.
//!
//! A GGUF block interleaves a 2-byte f16 scale with its quants, which the kernels would
//! have to pick out and convert one at a time in their inner loops. Here each row's
//! scales and minimums sit in arrays of their own, still f16, so the kernels convert them
//! with F16C a vector at a time (or one at a time where they broadcast one), and a row
//! streams as many bytes as the file holds: 20 per 32 Q4_1 weights, 18 for Q4_0, 34 for
//! Q8_0. (Widening them to f32 at upload, as this layout did before, cost 4 more bytes per
//! block, 17 % more bytes a Q4_1 decode step streams.) Values are unchanged: every f16 is
//! an f32.
//!
//! Both arrays end with [`SCALE_PAD`] zeros, so a kernel may load a whole vector of scales
//! that starts at any block of the matrix (lanes past a row's end are masked or unused).
//!
//! The K-quants (Q4_K, Q5_K, Q6_K: 256-element super-blocks) keep their f16 scales per
//! super-block and their small integer scales per 32-element block (two per block for
//! Q6_K), unpacked to a byte each, and their rows are interleaved in groups of 16, one
//! row per vector lane (`grouped`); the field docs below describe the other formats.

use super::grouped::is_grouped;
use super::{QuantFormat, SimdLevel};

/// Zero scales after the last block's, for vector loads of up to 16 f16 values that start
/// at any block.
pub(super) const SCALE_PAD: usize = 16;

/// An f16's value.
pub(super) fn f16_value(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// A matrix of `rows × k` quantised values in the packed layout.
#[derive(Debug, Clone)]
pub struct PackedQuant {
    pub(super) format: QuantFormat,
    pub(super) k: usize,
    pub(super) rows: usize,
    /// Scale of each block as f16 bits, row-major `[rows, k / 32]`, then [`SCALE_PAD`] zeros.
    pub(super) d: Vec<u16>,
    /// Q4_1: minimum of each block. Q4_0: `−8 · d`, so both share one kernel. Q8_0: empty.
    /// Laid out as `d`.
    pub(super) m: Vec<u16>,
    /// K-quants: each block's integer scale (Q4_K, Q5_K: 6 bits; Q6_K: two i8 per block,
    /// one per 16 elements), grouped. Empty otherwise.
    pub(super) sc: Vec<u8>,
    /// Q4_K, Q5_K: each block's 6-bit minimum (grouped as `sc`). Empty otherwise.
    pub(super) mn: Vec<u8>,
    /// The quants of each block without their header: [`Self::payload`] bytes a block.
    pub(super) qs: Vec<u8>,
}

impl PackedQuant {
    /// Whether `format` has a packed layout.
    pub fn supports(format: QuantFormat) -> bool {
        !matches!(format, QuantFormat::Q5_0 | QuantFormat::Q5_1 | QuantFormat::F8_E4M3)
    }

    /// Repacks `rows` rows of `k` elements of GGUF blocks, or `None` for a format without a
    /// packed layout, lengths that do not match, or a Q4_0 scale whose `−8 · d` an f16 cannot
    /// hold (`|d|` past 8,188, far beyond any real weight's scale).
    pub fn from_blocks(format: QuantFormat, blocks: &[u8], k: usize) -> Option<Self> {
        let row_bytes = format.bytes_for(k)?;
        if !Self::supports(format) || row_bytes == 0 || !blocks.len().is_multiple_of(row_bytes) {
            return None;
        }
        if is_grouped(format) {
            return Some(Self::from_k_blocks(format, blocks, k));
        }
        let (header, payload) = match format {
            QuantFormat::Q4_1 => (4, 16),
            QuantFormat::Q4_0 => (2, 16),
            _ => (2, 32),
        };
        let n = blocks.len() / format.block_bytes();
        let mut packed = Self {
            format,
            k,
            rows: blocks.len() / row_bytes,
            d: Vec::with_capacity(n + SCALE_PAD),
            m: Vec::with_capacity(if format == QuantFormat::Q8_0 { 0 } else { n + SCALE_PAD }),
            sc: Vec::new(),
            mn: Vec::new(),
            qs: Vec::with_capacity(n * payload),
        };
        let bits = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]);
        for b in blocks.chunks_exact(format.block_bytes()) {
            let d = bits(b, 0);
            packed.d.push(d);
            match format {
                QuantFormat::Q4_1 => packed.m.push(bits(b, 2)),
                QuantFormat::Q4_0 => {
                    // Exact unless it overflows: −8 only moves the exponent.
                    let m = half::f16::from_f32(-8.0 * f16_value(d));
                    if m.to_f32() != -8.0 * f16_value(d) {
                        return None;
                    }
                    packed.m.push(m.to_bits());
                }
                _ => {}
            }
            packed.qs.extend_from_slice(&b[header..header + payload]);
        }
        packed.d.resize(n + SCALE_PAD, 0);
        if format != QuantFormat::Q8_0 {
            packed.m.resize(n + SCALE_PAD, 0);
        }
        Some(packed)
    }

    /// The format the values came from.
    pub fn format(&self) -> QuantFormat {
        self.format
    }

    /// Elements per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Blocks per row.
    pub(super) fn blocks_per_row(&self) -> usize {
        self.k / 32
    }

    /// Quant bytes per 32-element block of a Q4_0, Q4_1 or Q8_0 matrix (the K-quants'
    /// are `grouped`).
    pub(super) fn payload(&self) -> usize {
        if self.format == QuantFormat::Q8_0 { 32 } else { 16 }
    }

    /// Rows `rows` as f32, equal to dequantising the original blocks (the same
    /// formulas as the block decoders, term for term).
    pub fn dequantize_rows(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
        self.dequantize_rows_at(SimdLevel::current(), rows, out);
    }

    /// [`Self::dequantize_rows`] with the kernels of `level` (capped at what the CPU has);
    /// every level gives the same values.
    pub(super) fn dequantize_rows_at(&self, level: SimdLevel, rows: std::ops::Range<usize>, out: &mut [f32]) {
        assert_eq!(out.len(), rows.len() * self.k, "output does not hold the rows");
        if is_grouped(self.format) {
            return super::grouped::dequantize_rows(self, rows, out);
        }
        let (nb, p) = (self.blocks_per_row(), self.payload());
        #[cfg(target_arch = "x86_64")]
        if super::x86::dequantize_blocks(level, self.format, (&self.d, &self.m, &self.qs), rows.start * nb, out) {
            return;
        }
        let _ = level;
        for (i, o) in (rows.start * nb..rows.end * nb).zip(out.chunks_exact_mut(32)) {
            let (d, qs) = (f16_value(self.d[i]), &self.qs[i * p..(i + 1) * p]);
            match self.format {
                QuantFormat::Q8_0 => {
                    for (o, &q) in o.iter_mut().zip(qs) {
                        *o = d * f32::from(q.cast_signed());
                    }
                }
                QuantFormat::Q4_0 => {
                    for (j, &q) in qs.iter().enumerate() {
                        o[j] = d * (f32::from(q & 0xF) - 8.0);
                        o[j + 16] = d * (f32::from(q >> 4) - 8.0);
                    }
                }
                _ => {
                    let m = f16_value(self.m[i]);
                    for (j, &q) in qs.iter().enumerate() {
                        o[j] = d * f32::from(q & 0xF) + m;
                        o[j + 16] = d * f32::from(q >> 4) + m;
                    }
                }
            }
        }
    }

    /// `out[j] = x · row (rows.start + j)`; `sums` are `block_sums(x)`.
    ///
    /// # Panics
    /// If `x` is not `k` long or the rows are out of range.
    pub fn dot_rows(&self, x: &[f32], sums: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        assert_eq!(x.len(), self.k, "x is not one row");
        assert_eq!(out.len(), rows.len(), "one output per row");
        assert!(rows.end <= self.rows(), "rows past the matrix");
        #[cfg(target_arch = "x86_64")]
        if !is_grouped(self.format) && super::x86::packed_dot_rows(self, x, sums, rows.clone(), out) {
            return;
        }
        let mut w = vec![0f32; self.k];
        for (o, r) in out.iter_mut().zip(rows) {
            self.dequantize_rows(r..r + 1, &mut w);
            *o = w.iter().zip(x).map(|(a, b)| a * b).sum();
        }
    }

    /// `out[i · rows.len() + j] = x_i · row (rows.start + j)` for every row `x_i` of `x`
    /// (`[m, k]`); `sums` are the rows' `block_sums`, back to back. Each result equals
    /// [`Self::dot_rows`] of its row alone, bit for bit; on AVX-512 each weight block is
    /// unpacked once for all the rows.
    ///
    /// # Panics
    /// If `x` is not whole rows of `k`, or `sums` or `out` do not match it.
    pub fn dot_rows_many(&self, x: &[f32], sums: &[f32], rows: std::ops::Range<usize>, out: &mut [f32]) {
        let m = x.len() / self.k.max(1);
        assert_eq!(x.len(), m * self.k, "x is not whole rows");
        assert_eq!(sums.len(), m * self.blocks_per_row(), "one block sum per block of x");
        assert_eq!(out.len(), m * rows.len(), "one output per row pair");
        assert!(rows.end <= self.rows(), "rows past the matrix");
        #[cfg(target_arch = "x86_64")]
        if m > 1 && !is_grouped(self.format) && super::x86::packed_dot_rows_many(self, x, sums, rows.clone(), out) {
            return;
        }
        let nb = self.blocks_per_row();
        for (i, o) in out.chunks_exact_mut(rows.len().max(1)).enumerate().take(m) {
            self.dot_rows(&x[i * self.k..(i + 1) * self.k], &sums[i * nb..(i + 1) * nb], rows.clone(), o);
        }
    }
}
