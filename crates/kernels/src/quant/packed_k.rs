//! The packed layout of the K-quants (Q4_K, Q5_K, Q6_K), built from a GGUF file's
//! super-blocks, and its portable dequantiser.
//!
//! A super-block of 256 values keeps its f16 scale `d` (and, for Q4_K and Q5_K, its f16
//! `dmin`) in [`PackedQuant::d`] (and `m`), one per super-block; its integer scales move to
//! a byte each in `sc` (and minimums in `mn`): 8 six-bit ones per super-block for Q4_K and
//! Q5_K, which the file packs into 12 bytes, or Q6_K's 16 signed ones. The quants are
//! regrouped by *chunk*, a pair of 32-element blocks (64 values), so that one load and two
//! nibble masks give both blocks in element order, whatever the format:
//!
//! - 32 bytes of nibbles: byte `l` holds element `l` in its low nibble and `32 + l` in its
//!   high one (Q4_K's own layout, kept as the file has it);
//! - Q5_K: then 8 bytes, a little-endian u64 whose bit `e` is bit 4 of element `e`;
//! - Q6_K: then 16 bytes of bits 4–5: byte `i` holds those of element `16·t + i` at bits
//!   `2t, 2t + 1` (`t` = 0..4), so a 128-bit lane per 16 elements shifts them into place.
//!
//! Q4_K and Q5_K matrices are built in this layout, then grouped 16 rows to a vector
//! (`grouped`); Q6_K keeps it.
//!
//! Invariant: every value decodes to exactly the reference decoder's f32 (`blocks.rs`),
//! with the same products in the same order.

use super::QuantFormat;
use super::blocks::{QK_K, q6_k_quants, scale_min_k4_bits};
use super::packed::{PackedQuant, SCALE_PAD, SUB_PAD, f16_value, payload_bytes};

/// Blocks of 32 in a super-block.
pub(super) const BLOCKS_PER_SUPER: usize = QK_K / 32;

/// The f16 bits at byte `at`.
fn bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

impl PackedQuant {
    /// Repacks `blocks` (whole rows of `k` elements, checked by the caller) of a K-quant.
    pub(super) fn from_k_blocks(format: QuantFormat, blocks: &[u8], k: usize) -> Self {
        let supers = blocks.len() / format.block_bytes();
        let subs = if format == QuantFormat::Q6_K { 16 } else { BLOCKS_PER_SUPER };
        let mut p = Self {
            format,
            k,
            rows: blocks.len() / format.bytes_for(k).expect("whole super-blocks"),
            d: Vec::with_capacity(supers + SCALE_PAD),
            m: Vec::with_capacity(supers + SCALE_PAD),
            sc: Vec::with_capacity(supers * subs + SUB_PAD),
            mn: Vec::with_capacity(supers * BLOCKS_PER_SUPER + SUB_PAD),
            qs: Vec::with_capacity(supers * BLOCKS_PER_SUPER * payload_bytes(format)),
        };
        for b in blocks.chunks_exact(format.block_bytes()) {
            match format {
                QuantFormat::Q4_K => {
                    p.push_q4_k(b, None);
                    p.qs.extend_from_slice(&b[16..]);
                }
                QuantFormat::Q5_K => p.push_q4_k(&b[..16], Some((&b[16..48], &b[48..]))),
                _ => p.push_q6_k(b.try_into().expect("one Q6_K block")),
            }
        }
        p.d.resize(supers + SCALE_PAD, 0);
        if format != QuantFormat::Q6_K {
            p.m.resize(supers + SCALE_PAD, 0);
            p.mn.resize(supers * BLOCKS_PER_SUPER + SUB_PAD, 0);
        }
        p.sc.resize(supers * subs + SUB_PAD, 0);
        if super::grouped::is_grouped(format) {
            p.group_rows();
        }
        p
    }

    /// A Q4_K or Q5_K super-block's header (`d`, `dmin`, the 12 bytes of scales and
    /// minimums); for Q5_K also its `qh` and `qs`, regrouped into chunks here (Q4_K's
    /// quants are already chunks).
    fn push_q4_k(&mut self, header: &[u8], q5: Option<(&[u8], &[u8])>) {
        self.d.push(bits(header, 0));
        self.m.push(bits(header, 2));
        for j in 0..BLOCKS_PER_SUPER {
            let (sc, m) = scale_min_k4_bits(j, &header[4..16]);
            self.sc.push(sc);
            self.mn.push(m);
        }
        let Some((qh, qs)) = q5 else { return };
        // Chunk c's low nibbles take bit 2c of qh[l], its high nibbles bit 2c + 1.
        for (c, nibbles) in qs.chunks_exact(32).enumerate() {
            self.qs.extend_from_slice(nibbles);
            let hi = qh.iter().enumerate().fold(0u64, |hi, (l, &h)| {
                hi | u64::from((h >> (2 * c)) & 1) << l | u64::from((h >> (2 * c + 1)) & 1) << (32 + l)
            });
            self.qs.extend_from_slice(&hi.to_le_bytes());
        }
    }

    /// A Q6_K super-block: its scale, its 16 integer scales and its quants as chunks.
    fn push_q6_k(&mut self, b: &[u8; 210]) {
        self.d.push(bits(b, 208));
        self.sc.extend_from_slice(&b[192..208]);
        let q = q6_k_quants(b);
        for chunk in q.chunks_exact(64) {
            self.qs.extend((0..32).map(|l| (chunk[l] & 0xF) | (chunk[32 + l] << 4)));
            self.qs.extend((0..16).map(|i| (0..4).fold(0u8, |h, t| h | ((chunk[16 * t + i] >> 4) << (2 * t)))));
        }
    }

    /// Rows `rows` of a K-quant as f32, equal to the reference decoder's values: per
    /// block, its quants, then `d · sc · (q − 32)` (Q6_K; the grouped formats in
    /// `grouped`), the decoder's products in its order, in loops the compiler vectorises
    /// (the exact dots dequantise every weight of a step).
    pub(super) fn dequantize_k_rows(&self, rows: std::ops::Range<usize>, out: &mut [f32]) {
        if super::grouped::is_grouped(self.format) {
            return super::grouped::dequantize_rows(self, rows, out);
        }
        let nb = self.blocks_per_row();
        for (b, o) in (rows.start * nb..rows.end * nb).zip(out.chunks_exact_mut(32)) {
            let q = q6_k_block(&self.qs, b);
            let d = f16_value(self.d[b / BLOCKS_PER_SUPER]);
            for (h, (o, q)) in o.chunks_exact_mut(16).zip(q.chunks_exact(16)).enumerate() {
                let scale = d * f32::from(self.sc[2 * b + h].cast_signed());
                o.iter_mut().zip(q).for_each(|(o, &q)| *o = scale * (f32::from(q) - 32.0));
            }
        }
    }
}

/// The unsigned quants (0..=63) of block `b` of packed Q6_K quants `qs` (which start at a
/// chunk).
pub(super) fn q6_k_block(qs: &[u8], b: usize) -> [u8; 32] {
    let chunk = &qs[(b / 2) * 2 * payload_bytes(QuantFormat::Q6_K)..][..2 * payload_bytes(QuantFormat::Q6_K)];
    let (half, highs) = (b % 2, &chunk[32..48]);
    std::array::from_fn(|l| ((chunk[l] >> (4 * half)) & 0xF) | ((highs[l % 16] >> (2 * (2 * half + l / 16))) & 3) << 4)
}
