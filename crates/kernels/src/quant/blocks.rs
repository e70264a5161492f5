//! Portable block decoders, one per format, written from ggml's block layouts
//! (`ggml-common.h`) and reference dequantisers (`dequantize_row_*` in `ggml-quants.c`).
//! They are the reference every SIMD path is tested against, and they round exactly as
//! gguf-py's dequantiser does (one product per value, in its order).
//!
//! All scales are little-endian f16. Per block of `d` (scale), `m` (min) and quants `q`:
//! - Q8_0: `d · q` with `q` an i8; Q4_0: `d · (q − 8)`; Q5_0: `d · (q − 16)`;
//!   Q4_1 and Q5_1: `d · q + m`. In the 32-element blocks, element `j < 16` takes the low
//!   nibble of byte `j` and element `j + 16` its high nibble; Q5 adds bit `j` (resp.
//!   `j + 16`) of the u32 `qh` as bit 4.
//! - Q4_K / Q5_K: 256 elements in 8 sub-blocks of 32, each with a 6-bit scale and min
//!   packed in 12 bytes (ggml's `get_scale_min_k4`), `y = d·sc · q − dmin·mn`.
//! - Q6_K: 16 sub-blocks of 16 with i8 scales, 6-bit quants split into 4 low bits (`ql`)
//!   and 2 high bits (`qh`), `y = d · sc · (q − 32)`.
//! - F8_E4M3 (met's, not ggml's): a little-endian f32 scale `s`, then 32 `float8_e4m3fn`
//!   bytes, `y = s · e4m3(q)` rounded once in f32, as transformers dequantizes FP8 weights.

use half::f16;

use super::QuantFormat;

/// Elements of a K-quant super-block.
pub(super) const QK_K: usize = 256;

/// Decodes one block of `format` into `out` (`format.block_elems()` values).
pub(super) fn decode_block(format: QuantFormat, b: &[u8], out: &mut [f32]) {
    fn typed<const S: usize, const B: usize>(b: &[u8], out: &mut [f32], f: fn(&[u8; S], &mut [f32; B])) {
        f(b.try_into().expect("one whole block"), out.try_into().expect("one block of values"));
    }
    match format {
        QuantFormat::Q8_0 => typed(b, out, q8_0),
        QuantFormat::Q4_0 => typed(b, out, q4_0),
        QuantFormat::Q4_1 => typed(b, out, q4_1),
        QuantFormat::Q5_0 => typed(b, out, q5_0),
        QuantFormat::Q5_1 => typed(b, out, q5_1),
        QuantFormat::Q4_K => typed(b, out, q4_k),
        QuantFormat::Q5_K => typed(b, out, q5_k),
        QuantFormat::Q6_K => typed(b, out, q6_k),
        QuantFormat::F8_E4M3 => typed(b, out, f8_e4m3),
    }
}

fn f8_e4m3(b: &[u8; 36], out: &mut [f32; 32]) {
    crate::fp8::widen_e4m3(out, &b[4..], f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
}

/// The little-endian f16 at byte `at`, widened.
fn half(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn q8_0(b: &[u8; 34], out: &mut [f32; 32]) {
    let d = half(b, 0);
    for (o, &q) in out.iter_mut().zip(&b[2..]) {
        *o = d * f32::from(q.cast_signed());
    }
}

fn q4_0(b: &[u8; 18], out: &mut [f32; 32]) {
    let d = half(b, 0);
    for (j, &q) in b[2..].iter().enumerate() {
        out[j] = d * (f32::from(q & 0xF) - 8.0);
        out[j + 16] = d * (f32::from(q >> 4) - 8.0);
    }
}

fn q4_1(b: &[u8; 20], out: &mut [f32; 32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    for (j, &q) in b[4..].iter().enumerate() {
        out[j] = d * f32::from(q & 0xF) + m;
        out[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit quants of a Q5_0/Q5_1 block: nibbles of `qs` plus bit 4 from `qh`.
fn five_bit(qh: u32, qs: &[u8], j: usize) -> (u8, u8) {
    let hi0 = ((qh >> j) & 1) as u8;
    let hi1 = ((qh >> (j + 16)) & 1) as u8;
    ((qs[j] & 0xF) | (hi0 << 4), (qs[j] >> 4) | (hi1 << 4))
}

fn q5_0(b: &[u8; 22], out: &mut [f32; 32]) {
    let d = half(b, 0);
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    for j in 0..16 {
        let (x0, x1) = five_bit(qh, &b[6..], j);
        out[j] = d * (f32::from(x0) - 16.0);
        out[j + 16] = d * (f32::from(x1) - 16.0);
    }
}

fn q5_1(b: &[u8; 24], out: &mut [f32; 32]) {
    let (d, m) = (half(b, 0), half(b, 2));
    let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
    for j in 0..16 {
        let (x0, x1) = five_bit(qh, &b[8..], j);
        out[j] = d * f32::from(x0) + m;
        out[j + 16] = d * f32::from(x1) + m;
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block:
/// sub-blocks 0-3 keep 6 bits in bytes `j` and `j + 4`; sub-blocks 4-7 keep their low 4
/// bits in byte `j + 4` and their top 2 bits in the top bits of bytes `j − 4` and `j`.
fn scale_min_k4(j: usize, s: &[u8]) -> (f32, f32) {
    let (sc, m) = scale_min_k4_bits(j, s);
    (f32::from(sc), f32::from(m))
}

/// [`scale_min_k4`] as the 6-bit integers.
pub(super) fn scale_min_k4_bits(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        ((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4))
    }
}

/// The 6-bit quants (0..=63) of a Q6_K block in element order, `ql` and `qh` combined.
pub(super) fn q6_k_quants(b: &[u8; 210]) -> [u8; QK_K] {
    let (ql, qh) = (&b[..128], &b[128..192]);
    let mut q = [0u8; QK_K];
    for half_i in 0..2 {
        let (ql, qh, q) = (&ql[64 * half_i..], &qh[32 * half_i..], &mut q[128 * half_i..]);
        for l in 0..32 {
            q[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            q[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            q[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

fn q4_k(b: &[u8; 144], out: &mut [f32; QK_K]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    // Each 64-element chunk: low nibbles of 32 bytes, then their high nibbles.
    for (chunk, (o, qs)) in out.chunks_exact_mut(64).zip(b[16..].chunks_exact(32)).enumerate() {
        let (sc0, m0) = scale_min_k4(2 * chunk, scales);
        let (sc1, m1) = scale_min_k4(2 * chunk + 1, scales);
        for (l, &q) in qs.iter().enumerate() {
            o[l] = d * sc0 * f32::from(q & 0xF) - dmin * m0;
            o[l + 32] = d * sc1 * f32::from(q >> 4) - dmin * m1;
        }
    }
}

fn q5_k(b: &[u8; 176], out: &mut [f32; QK_K]) {
    let (d, dmin) = (half(b, 0), half(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    // As Q4_K, with bit 2·chunk (low nibbles) or 2·chunk + 1 (high nibbles) of qh[l] as bit 4.
    for (chunk, (o, qs)) in out.chunks_exact_mut(64).zip(b[48..].chunks_exact(32)).enumerate() {
        let (sc0, m0) = scale_min_k4(2 * chunk, scales);
        let (sc1, m1) = scale_min_k4(2 * chunk + 1, scales);
        for (l, &q) in qs.iter().enumerate() {
            let hi0 = (qh[l] >> (2 * chunk)) & 1;
            let hi1 = (qh[l] >> (2 * chunk + 1)) & 1;
            o[l] = d * sc0 * f32::from((q & 0xF) | (hi0 << 4)) - dmin * m0;
            o[l + 32] = d * sc1 * f32::from((q >> 4) | (hi1 << 4)) - dmin * m1;
        }
    }
}

fn q6_k(b: &[u8; 210], out: &mut [f32; QK_K]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = half(b, 208);
    // Two halves of 128 elements, each from 64 bytes of ql, 32 of qh and 8 scales.
    for half_i in 0..2 {
        let (ql, qh) = (&ql[64 * half_i..], &qh[32 * half_i..]);
        let sc = |k: usize| f32::from(scales[8 * half_i + k].cast_signed());
        let o = &mut out[128 * half_i..];
        for l in 0..32 {
            let is = l / 16;
            let q = |low: u8, shift: u32| f32::from(low | (((qh[l] >> shift) & 3) << 4)) - 32.0;
            o[l] = d * sc(is) * q(ql[l] & 0xF, 0);
            o[l + 32] = d * sc(is + 2) * q(ql[l + 32] & 0xF, 2);
            o[l + 64] = d * sc(is + 4) * q(ql[l] >> 4, 4);
            o[l + 96] = d * sc(is + 6) * q(ql[l + 32] >> 4, 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_is_scale_times_signed_byte() {
        let mut block = [0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2] = 4;
        block[3] = (-6i8).cast_unsigned();
        let mut out = [0f32; 32];
        decode_block(QuantFormat::Q8_0, &block, &mut out);
        assert_eq!(&out[..3], &[2.0, -3.0, 0.0]);
    }

    #[test]
    fn q4_0_puts_low_nibbles_first() {
        let mut block = [0u8; 18];
        block[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        block[2] = 0x9A; // low nibble 10 → +2, high nibble 9 → +1
        let mut out = [0f32; 32];
        decode_block(QuantFormat::Q4_0, &block, &mut out);
        assert_eq!((out[0], out[16], out[1]), (4.0, 2.0, -16.0));
    }

    #[test]
    fn scale_min_k4_unpacks_the_high_sub_blocks() {
        let mut s = [0u8; 12];
        s[0] = 0b11_000001; // sub-block 0 scale 1; top bits → sub-block 4 scale bits 4-5
        s[4] = 0b10_000010; // sub-block 0 min 2; top bits → sub-block 4 min bits 4-5
        s[8] = 0x5A; // sub-block 4: scale low 0xA, min low 0x5
        assert_eq!(scale_min_k4(0, &s), (1.0, 2.0));
        assert_eq!(scale_min_k4(4, &s), (f32::from(0xAu8 | (3 << 4)), f32::from(0x5u8 | (2 << 4))));
    }

    /// With `d = 1` and unit scales, a Q6_K block decodes to its quants less 32.
    #[test]
    fn q6_k_quants_are_the_decoded_values_plus_32() {
        let mut block = [0u8; 210];
        block.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 89 % 251) as u8);
        block[192..208].fill(1);
        block[208..].copy_from_slice(&f16::from_f32(1.0).to_le_bytes());
        let mut out = [0f32; QK_K];
        decode_block(QuantFormat::Q6_K, &block, &mut out);
        let q = q6_k_quants(&block);
        assert!(q.iter().zip(&out).all(|(&q, &v)| f32::from(q) - 32.0 == v));
    }

    #[test]
    #[should_panic(expected = "one whole block")]
    fn a_partial_block_is_refused() {
        decode_block(QuantFormat::Q8_0, &[0; 33], &mut [0.0; 32]);
    }
}
