use std::borrow::Cow;

use met_kernels::DType;
use met_kernels::quant::QuantFormat;

use super::*;

/// A `[3, 5]` weight of ones in blocks of `[2, 2]`: the scale of block (i / 2, j / 2).
#[test]
fn block_scales_cover_their_blocks_with_short_edges() {
    let scale: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    let got = dequantize(&[3, 5], &[0x38; 15], (&scale, &[2, 3]), Some(ScaleLayout::Block(2, 2))).unwrap();
    let want = [1., 1., 2., 2., 3., 1., 1., 2., 2., 3., 4., 4., 5., 5., 6.];
    assert_eq!(got, want);
}

#[test]
fn tensor_and_channel_scales_also_from_the_scale_shape_alone() {
    let q = [0x38, 0xc0, 0x30, 0x38];
    let tensor = dequantize(&[2, 2], &q, (&[3.0], &[]), None).unwrap();
    assert_eq!(tensor, [3.0, -6.0, 1.5, 3.0]);
    let channel = dequantize(&[2, 2], &q, (&[1.0, 10.0], &[2, 1]), None).unwrap();
    assert_eq!(channel, [1.0, -2.0, 5.0, 10.0]);
    assert_eq!(dequantize(&[2, 2], &q, (&[1.0, 10.0], &[2, 1]), Some(ScaleLayout::Channel)).unwrap(), channel);
}

#[test]
fn scales_that_do_not_cover_the_weight_are_refused() {
    let err = dequantize(&[4, 4], &[0x38; 16], (&[1.0; 3], &[3]), None).unwrap_err();
    assert!(err.contains("[3]"), "{err}");
    let err = dequantize(&[4, 4], &[0x38; 16], (&[1.0; 2], &[1, 2]), Some(ScaleLayout::Block(2, 2))).unwrap_err();
    assert!(err.contains("needs 2 x 2"), "{err}");
    assert!(dequantize(&[2, 2, 2], &[0x38; 8], (&[1.0], &[]), None).unwrap_err().contains("2-D"));
}

/// Packed blocks decode to exactly the dequantized values, for 128-wide blocks cut short at
/// the bottom edge, one scale per row and one per tensor; every byte (NaN codes aside) and
/// scales of either sign appear.
#[test]
fn packed_blocks_decode_to_the_dequantized_values() {
    let (n, k) = (130, 256);
    let bytes: Vec<u8> =
        (0..n * k).map(|i| (i * 37 % 256) as u8).map(|q| if q & 0x7F == 0x7F { 0 } else { q }).collect();
    let cases: [(Option<ScaleLayout>, Vec<f32>, Vec<usize>); 3] = [
        (Some(ScaleLayout::Block(128, 128)), vec![0.5, -0.25, 3.0e-3, 7.0], vec![2, 2]),
        (None, (0..n).map(|i| 1.0 / (i as f32 + 1.0)).collect(), vec![n, 1]),
        (Some(ScaleLayout::Tensor), vec![-1.5], vec![]),
    ];
    for (layout, scale, scale_shape) in cases {
        assert!(packs(&[n, k], layout), "{layout:?}");
        let want = dequantize(&[n, k], &bytes, (&scale, &scale_shape), layout).unwrap();
        let blocks = pack(&[n, k], &bytes, (&scale, &scale_shape), layout).unwrap();
        assert_eq!(Some(blocks.len()), QuantFormat::F8_E4M3.bytes_for(n * k), "{layout:?}");
        let got = HostTensor::from_bytes(DType::Quant(QuantFormat::F8_E4M3), &[n, k], Cow::Owned(blocks))
            .unwrap()
            .to_f32_vec()
            .unwrap();
        assert!(got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()), "{layout:?}");
    }
}

/// Only scales constant over each 32 columns of a row pack: not blocks 40 wide, nor rows
/// that are not whole blocks, nor anything but a matrix.
#[test]
fn weights_whose_scales_split_a_block_stay_f32() {
    assert!(packs(&[48, 96], Some(ScaleLayout::Block(24, 32))));
    assert!(packs(&[48, 96], Some(ScaleLayout::Block(24, 200))));
    assert!(!packs(&[48, 96], Some(ScaleLayout::Block(24, 40))));
    assert!(!packs(&[48, 100], None));
    assert!(!packs(&[48, 100], Some(ScaleLayout::Channel)));
    assert!(!packs(&[2, 48, 96], None));
}
