//! The K-quants' packed layout: it keeps every value (against the block decoders and
//! against values gguf-py decoded), and its integer sums are exact at every SIMD level.

use half::f16;

use super::blocks::QK_K;
use super::tests::random_row;
use super::tests_int::scalar_dot;
use super::*;

const K_FORMATS: [QuantFormat; 3] = [QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K];

/// Repacking then unpacking gives the block decoders' values bit for bit, over several rows
/// (so chunks and scales are found at every row's offset) and past a 64-block group.
#[test]
fn packed_k_quants_keep_every_value() {
    for format in K_FORMATS {
        for k in [QK_K, 9 * QK_K] {
            let rows: Vec<u8> = (0..5).flat_map(|seed| random_row(format, k, 30 + seed)).collect();
            let packed = PackedQuant::from_blocks(format, &rows, k).expect("a K-quant packs");
            assert_eq!((packed.rows(), packed.k()), (5, k));
            let mut want = vec![0f32; 5 * k];
            dequantize(format, &rows, &mut want);
            let mut got = vec![0f32; 3 * k];
            packed.dequantize_rows(2..5, &mut got);
            let same = got.iter().zip(&want[2 * k..]).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{format} k={k}: values survive packing");
        }
    }
}

/// Rows written by `scripts/kquant_fixture.py`: random super-blocks of each K-quant with
/// the values gguf-py's dequantiser gives them, so the layouts are checked against an
/// implementation other than ours. Per entry: the format's name (4 bytes), `k` and the
/// row count (u32 LE), the blocks, then the f32 values.
const GGUF_PY_ROWS: &[u8] = include_bytes!("testdata/kquant_rows.bin");

#[test]
fn packed_k_quants_give_gguf_py_values() {
    let mut at = 0;
    let mut seen = Vec::new();
    while at < GGUF_PY_ROWS.len() {
        let word = |i: usize| u32::from_le_bytes(GGUF_PY_ROWS[i..i + 4].try_into().unwrap()) as usize;
        let name = std::str::from_utf8(&GGUF_PY_ROWS[at..at + 4]).unwrap();
        let format = QuantFormat::ALL.into_iter().find(|f| f.name() == name).expect("a known format");
        let (k, n) = (word(at + 4), word(at + 8));
        let bytes = &GGUF_PY_ROWS[at + 12..at + 12 + n * format.bytes_for(k).unwrap()];
        at += 12 + bytes.len();
        let want: Vec<f32> = GGUF_PY_ROWS[at..at + 4 * n * k]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        at += 4 * n * k;
        let packed = PackedQuant::from_blocks(format, bytes, k).expect("a K-quant packs");
        let mut got = vec![0f32; n * k];
        packed.dequantize_rows(0..n, &mut got);
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{format}: packed values differ from gguf-py's");
        seen.push(format);
    }
    assert_eq!(seen, K_FORMATS, "the fixture holds every K-quant");
}

/// The 12 bytes of Q4_K/Q5_K scales and minimums holding `sc` and `m` (6 bits each).
fn pack_scales(sc: [u8; 8], m: [u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = m[j] | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    s
}

/// A K-quant super-block whose every f32 step in the kernels is exact: power-of-two
/// scales, small integer scales but the largest in block 0, whose quants are all the
/// largest (with activations of ±127, the extreme that could saturate a pair sum).
fn exact_block(format: QuantFormat, d: f32, seed: u32) -> Vec<u8> {
    let mut b = random_row(format, QK_K, seed);
    let small = |i: u32| ((seed + i) * 7 % 8) as u8;
    if format == QuantFormat::Q6_K {
        b[208..210].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (i, s) in b[192..208].iter_mut().enumerate() {
            *s = (small(i as u32) as i8 - 4).cast_unsigned();
        }
        b[192] = (-128i8).cast_unsigned();
        // Block 0: q = 63 (low nibbles of ql[0..32], bits 0–1 of qh[0..32]).
        b[..32].iter_mut().for_each(|q| *q |= 0x0F);
        b[128..160].iter_mut().for_each(|q| *q |= 0x03);
    } else {
        b[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let mut sc: [u8; 8] = std::array::from_fn(|j| small(j as u32));
        sc[0] = 63;
        b[4..16].copy_from_slice(&pack_scales(sc, std::array::from_fn(|j| small(10 + j as u32))));
        let qs = if format == QuantFormat::Q5_K { 48 } else { 16 };
        b[qs..qs + 32].iter_mut().for_each(|q| *q |= 0x0F);
        if format == QuantFormat::Q5_K {
            b[16..48].iter_mut().for_each(|h| *h |= 1);
        }
    }
    b
}

/// With every f32 step exact (see [`exact_block`]; all partial sums stay below 2²⁴ units
/// of `2⁻⁸ · d / 2⁻⁴`), each level equals the scalar reference bit for bit, so any error in
/// an integer sum, a sub-block scale or a quant's high bits would show.
#[test]
fn k_quant_integer_sums_are_exact_at_every_level() {
    for format in K_FORMATS {
        let n = 9;
        let bytes: Vec<u8> =
            (0..n).flat_map(|r| exact_block(format, 0.0625 / (1 << (r % 3)) as f32, 50 + r as u32)).collect();
        let p = PackedQuant::from_blocks(format, &bytes, QK_K).expect("a K-quant packs");
        // Activations `q · 2⁻⁴` with one |q| = 127 per block, ±127 throughout block 0.
        let mut xf: Vec<f32> = (0..5 * QK_K).map(|i| ((i * 37 % 255) as f32 - 127.0) / 16.0).collect();
        for (b, block) in xf.chunks_exact_mut(32).enumerate() {
            block[b % 32] = if b % 2 == 0 { 127.0 / 16.0 } else { -127.0 / 16.0 };
            if b % 8 == 0 {
                block.iter_mut().enumerate().for_each(|(j, v)| *v = if j % 2 == 0 { 127.0 } else { -127.0 } / 16.0);
            }
        }
        let x = Q8Rows::quantize(&xf, QK_K);
        assert!(x.d.iter().all(|&d| d == 0.0625), "activations quantise exactly");
        for level in SimdLevel::available() {
            let mut got = vec![0f32; 5 * n];
            p.dot_rows_q8_at(level, &x, 0..n, &mut got);
            for i in 0..5 {
                for j in 0..n {
                    let want = scalar_dot(&p, j, &x.row(i));
                    assert_eq!(got[i * n + j], want, "{format} {level:?} ({i},{j})");
                }
            }
        }
    }
}
