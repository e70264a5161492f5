//! The K-quants (Q4_K, Q5_K, Q6_K) repacked from a GGUF file's super-blocks into the
//! grouped layout of [`super::grouped`].
//!
//! Each super-block of 256 values is decoded to its quants in element order (unsigned:
//! 0..=15, 0..=31 or 0..=63), its f16 `d` (and `dmin`) and its integer scales (and
//! minimums): 8 six-bit ones per super-block for Q4_K and Q5_K, which the file packs into
//! 12 bytes, or Q6_K's 16 signed ones. Those then go to their places in the row's group.
//!
//! Invariant: every value decodes to exactly the reference decoder's f32 (`blocks.rs`),
//! with the same products in the same order (tested, against gguf-py's values too).

use rayon::prelude::*;

use super::QuantFormat;
use super::blocks::{QK_K, q6_k_quants, scale_min_k4_bits};
use super::grouped::{GROUP, STEPS, high_bits, step_bytes, sub_blocks};
use super::packed::PackedQuant;

/// Blocks of 32 in a super-block.
pub(super) const BLOCKS_PER_SUPER: usize = QK_K / 32;

/// The f16 bits at byte `at`.
fn bits(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// One super-block, decoded.
struct Super {
    d: u16,
    /// `dmin` (Q4_K, Q5_K).
    m: u16,
    /// Integer scales: 8, or Q6_K's 16 (i8 bits).
    sc: [u8; 16],
    /// Integer minimums (Q4_K, Q5_K).
    mn: [u8; 8],
    q: [u8; QK_K],
}

impl Super {
    fn decode(format: QuantFormat, b: &[u8]) -> Self {
        if format == QuantFormat::Q6_K {
            let b: &[u8; 210] = b.try_into().expect("one Q6_K block");
            let sc = b[192..208].try_into().expect("16 scales");
            return Self { d: bits(b, 208), m: 0, sc, mn: [0; 8], q: q6_k_quants(b) };
        }
        let (mut sc, mut mn) = ([0u8; 16], [0u8; 8]);
        for j in 0..BLOCKS_PER_SUPER {
            (sc[j], mn[j]) = scale_min_k4_bits(j, &b[4..16]);
        }
        // Chunk c (64 values): byte l of its 32 holds value l in its low nibble and 32 + l
        // in its high one; Q5_K's fifth bits are bits 2c and 2c + 1 of qh[l].
        let (qh, qs) = if format == QuantFormat::Q5_K { (Some(&b[16..48]), &b[48..]) } else { (None, &b[16..]) };
        let mut q = [0u8; QK_K];
        for (c, nibbles) in qs.chunks_exact(32).enumerate() {
            for (l, &byte) in nibbles.iter().enumerate() {
                let (lo, hi) = qh.map_or((0, 0), |qh| ((qh[l] >> (2 * c)) & 1, (qh[l] >> (2 * c + 1)) & 1));
                q[64 * c + l] = (byte & 0xF) | lo << 4;
                q[64 * c + 32 + l] = (byte >> 4) | hi << 4;
            }
        }
        Self { d: bits(b, 0), m: bits(b, 2), sc, mn, q }
    }
}

/// One group's scales, minimums and their integer forms, in the grouped layout.
#[derive(Default)]
struct GroupScales {
    d: Vec<u16>,
    m: Vec<u16>,
    sc: Vec<u8>,
    mn: Vec<u8>,
}

impl PackedQuant {
    /// Repacks `blocks` (whole rows of `k` elements, checked by the caller) of a K-quant
    /// into groups of [`GROUP`] rows, the groups in parallel; rows past the last are zeros.
    pub(super) fn from_k_blocks(format: QuantFormat, blocks: &[u8], k: usize) -> Self {
        let row_bytes = format.bytes_for(k).expect("whole super-blocks");
        let rows = blocks.len() / row_bytes;
        let (groups, chunks) = (rows.div_ceil(GROUP), k / 64);
        let group_bytes = chunks * STEPS * step_bytes(format);
        let mut qs = vec![0; groups * group_bytes];
        let scales: Vec<GroupScales> = qs
            .par_chunks_mut(group_bytes)
            .enumerate()
            .map(|(g, qs)| {
                let own = &blocks[g * GROUP * row_bytes..((g + 1) * GROUP).min(rows) * row_bytes];
                pack_group(format, k, own, qs)
            })
            .collect();
        let (d, m) = (join(&scales, |s| &s.d), join(&scales, |s| &s.m));
        Self { format, k, rows, d, m, sc: join(&scales, |s| &s.sc), mn: join(&scales, |s| &s.mn), qs }
    }
}

/// One array of every group's scales, the groups in order.
fn join<T: Copy>(groups: &[GroupScales], part: impl Fn(&GroupScales) -> &[T]) -> Vec<T> {
    groups.iter().map(part).collect::<Vec<_>>().concat()
}

/// Packs the super-blocks of one group's rows `blocks` (up to [`GROUP`] rows of `k`) into
/// its quants `qs`, returning its scales.
fn pack_group(format: QuantFormat, k: usize, blocks: &[u8], qs: &mut [u8]) -> GroupScales {
    let nb = k / 32;
    let (supers, subs) = (nb / BLOCKS_PER_SUPER, sub_blocks(format));
    let step = step_bytes(format);
    let has_min = format != QuantFormat::Q6_K;
    let mut out = GroupScales {
        d: vec![0; supers * GROUP],
        m: vec![0; if has_min { supers * GROUP } else { 0 }],
        sc: vec![0; nb * subs * GROUP],
        mn: vec![0; if has_min { nb * GROUP } else { 0 }],
    };
    for (i, block) in blocks.chunks_exact(format.block_bytes()).enumerate() {
        let (l, s) = (i / supers, i % supers);
        let sb = Super::decode(format, block);
        out.d[s * GROUP + l] = sb.d;
        let per_super = BLOCKS_PER_SUPER * subs;
        for (j, &sc) in sb.sc[..per_super].iter().enumerate() {
            out.sc[(s * per_super + j) * GROUP + l] = sc;
        }
        if has_min {
            out.m[s * GROUP + l] = sb.m;
            for (j, &mn) in sb.mn.iter().enumerate() {
                out.mn[(s * BLOCKS_PER_SUPER + j) * GROUP + l] = mn;
            }
        }
        for (c, q) in sb.q.chunks_exact(64).enumerate() {
            let chunk = (s * BLOCKS_PER_SUPER / 2 + c) * STEPS * step;
            for (j, dst) in qs[chunk..chunk + STEPS * step].chunks_exact_mut(step).enumerate() {
                let (even, odd) = (&q[4 * j..4 * j + 4], &q[32 + 4 * j..32 + 4 * j + 4]);
                for t in 0..4 {
                    dst[4 * l + t] = (even[t] & 0xF) | (odd[t] & 0xF) << 4;
                }
                // The high planes: bit 4 (then bit 5) of each block's quants, four lanes a
                // nibble of the mask.
                for plane in 0..high_bits(format) {
                    for (parity, v) in [even, odd].into_iter().enumerate() {
                        let bits = (0..4).fold(0u8, |b, t| b | ((v[t] >> (4 + plane)) & 1) << t);
                        dst[64 + 8 * (2 * plane + parity) + l / 2] |= bits << (4 * (l % 2));
                    }
                }
            }
        }
    }
    out
}
