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
