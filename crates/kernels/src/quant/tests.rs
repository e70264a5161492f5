//! Block decoding against hand-built blocks, and the SIMD dot products against the
//! decoded values.

use half::f16;

use super::*;

/// A deterministic byte stream with valid (finite) f16 scales.
pub(super) fn random_row(format: QuantFormat, k: usize, seed: u32) -> Vec<u8> {
    let scale_at = if format == QuantFormat::Q6_K { format.block_bytes() - 2 } else { 0 };
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    let mut row = Vec::new();
    for _ in 0..k / format.block_elems() {
        let mut block: Vec<u8> = (0..format.block_bytes()).map(|_| next() as u8).collect();
        let scale = f16::from_f32((next() % 1000) as f32 / 20_000.0 + 0.001);
        block[scale_at..scale_at + 2].copy_from_slice(&scale.to_le_bytes());
        if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q5_1 | QuantFormat::Q4_K | QuantFormat::Q5_K) {
            let min = f16::from_f32((next() % 1000) as f32 / 10_000.0 - 0.05);
            block[2..4].copy_from_slice(&min.to_le_bytes());
        }
        if format == QuantFormat::F8_E4M3 {
            f8_block(&mut block, (next() % 1000) as f32 / 20_000.0 + 0.001);
        }
        row.extend(block);
    }
    row
}

/// Makes `block` a valid F8_E4M3 block of scale `scale`: its leading bytes the f32 scale,
/// and no e4m3 NaN (`0x7F`, `0xFF`) among its values.
pub(crate) fn f8_block(block: &mut [u8], scale: f32) {
    block[..4].copy_from_slice(&scale.to_le_bytes());
    for q in &mut block[4..] {
        if *q & 0x7F == 0x7F {
            *q ^= 0x01;
        }
    }
}

#[test]
fn blocks_decode_as_ggml_lays_them_out() {
    // Q4_1: d = 0.5, m = -1, element j from the low nibble of byte j, j + 16 from the high.
    let mut b = Vec::new();
    b.extend(f16::from_f32(0.5).to_le_bytes());
    b.extend(f16::from_f32(-1.0).to_le_bytes());
    b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut out = [0f32; 32];
    dequantize_row(QuantFormat::Q4_1, &b, &mut out);
    assert_eq!(out[3], 0.5 * 3.0 - 1.0);
    assert_eq!(out[16 + 3], 0.5 * 12.0 - 1.0);

    // Q8_0: signed bytes.
    let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
    b.extend((0..32).map(|j| (j as i8 - 16) as u8));
    dequantize_row(QuantFormat::Q8_0, &b, &mut out);
    assert_eq!(out[0], -32.0);
    assert_eq!(out[31], 30.0);

    // F8_E4M3: an f32 scale, then e4m3 bytes (0x38 = 1.0, 0xC0 = -2.0, 0x01 = 2^-9).
    let mut b = 0.25f32.to_le_bytes().to_vec();
    b.extend([0x38u8, 0xC0, 0x01].iter().cycle().take(32));
    dequantize_row(QuantFormat::F8_E4M3, &b, &mut out);
    assert_eq!(&out[..3], &[0.25, -0.5, 0.25 / 512.0]);

    // Q5_0: the fifth bit of element j is bit j of qh.
    let mut b = f16::from_f32(1.0).to_le_bytes().to_vec();
    b.extend(0x0000_0002u32.to_le_bytes());
    b.extend([0x21u8; 16]);
    dequantize_row(QuantFormat::Q5_0, &b, &mut out);
    assert_eq!(out[0], 1.0 - 16.0);
    assert_eq!(out[1], 1.0 + 16.0 - 16.0);
    assert_eq!(out[16], 2.0 - 16.0);
}

#[test]
fn dot_matches_the_decoded_values_for_every_format() {
    let k = 256;
    let x: Vec<f32> = (0..k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
    for format in QuantFormat::ALL {
        let rows: Vec<Vec<u8>> = (0..7).map(|seed| random_row(format, k, seed)).collect();
        let mut got = vec![0f32; rows.len()];
        dot_rows(format, &x, &rows.concat(), &mut got);
        for (seed, (row, got)) in rows.iter().zip(got).enumerate() {
            let mut w = vec![0f32; k];
            dequantize_row(format, row, &mut w);
            let want: f64 = w.iter().zip(&x).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
            let scale: f64 = w.iter().zip(&x).map(|(a, b)| f64::from((a * b).abs())).sum::<f64>() + 1e-6;
            assert!((f64::from(got) - want).abs() <= 1e-5 * scale, "{format} row {seed}: {got} vs {want}");
        }
    }
}

/// Packing keeps every value, and the f32 kernels' products match the decoded values: at
/// 4 blocks a row and at 70 (past the kernels' 64-block groups of widened scales, and no
/// multiple of 8), over the last rows of the matrix, whose scale loads run into the padding.
#[test]
fn packed_matrices_keep_the_values_and_products() {
    for k in [128, 32 * 70] {
        let x: Vec<f32> = (0..k).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
        let sums = block_sums(&x);
        for format in [QuantFormat::Q4_0, QuantFormat::Q4_1, QuantFormat::Q8_0] {
            let rows: Vec<u8> = (0..5).flat_map(|seed| random_row(format, k, seed)).collect();
            let packed = PackedQuant::from_blocks(format, &rows, k).expect("packable");
            assert_eq!(packed.rows(), 5);
            let mut want = vec![0f32; 5 * k];
            dequantize(format, &rows, &mut want);
            for level in SimdLevel::available() {
                let mut got = vec![0f32; 3 * k];
                packed.dequantize_rows_at(level, 2..5, &mut got);
                assert_eq!(got, want[2 * k..], "{format} k={k} {level:?}: values survive packing");
            }
            // Three rows: the kernels run rows in pairs, so the last one is unpaired.
            let mut dots = vec![0f32; 3];
            packed.dot_rows(&x, &sums, 2..5, &mut dots);
            for (j, d) in dots.iter().enumerate() {
                let w = &want[(j + 2) * k..(j + 3) * k];
                let exact: f64 = w.iter().zip(&x).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum();
                let scale: f64 = w.iter().zip(&x).map(|(a, b)| f64::from((a * b).abs())).sum::<f64>() + 1e-6;
                assert!((f64::from(*d) - exact).abs() <= 1e-5 * scale, "{format} k={k} row {}: {d} vs {exact}", j + 2);
            }
        }
    }
    assert!(PackedQuant::from_blocks(QuantFormat::Q5_0, &[0; 22 * 8], 256).is_none());
}

/// A Q4_0 scale whose `−8 · d` no f16 holds leaves the matrix unpacked (its blocks are
/// then read as stored) rather than packed with a wrong offset.
#[test]
fn a_q4_0_offset_past_f16_is_not_packed() {
    let mut row = random_row(QuantFormat::Q4_0, 64, 9);
    assert!(PackedQuant::from_blocks(QuantFormat::Q4_0, &row, 64).is_some());
    row[18..20].copy_from_slice(&f16::from_f32(9000.0).to_le_bytes());
    assert!(PackedQuant::from_blocks(QuantFormat::Q4_0, &row, 64).is_none());
}

/// Every vector width widens F8_E4M3 blocks to the same bits as the exact decoder: every
/// byte but the NaN codes, under scales of either sign.
#[test]
fn f8_blocks_widen_alike_at_every_simd_level() {
    let values: Vec<u8> = (0..=255u8).filter(|q| q & 0x7F != 0x7F).collect();
    let mut bytes = Vec::new();
    let mut want = Vec::new();
    for (i, chunk) in values.chunks(32).enumerate() {
        let scale = if i % 2 == 0 { 0.75 / (i as f32 + 1.0) } else { -3.0e-4 * i as f32 };
        let block: Vec<u8> = chunk.iter().copied().cycle().take(32).collect();
        bytes.extend(scale.to_le_bytes());
        bytes.extend(&block);
        want.extend(block.iter().map(|&q| crate::fp8::e4m3_to_f32(q) * scale));
    }
    for level in SimdLevel::available() {
        let mut got = vec![0f32; want.len()];
        dequantize_f8_row_at(level, &bytes, &mut got);
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{level:?}");
    }
}
