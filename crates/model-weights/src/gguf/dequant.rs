//! Dequantising ggml tensors to f32.
//!
//! Plain types widen here; block-quantised types decode through `met_kernels::quant`,
//! which owns the block layouts so that the CPU kernels that compute straight from the
//! blocks and this dequantiser cannot disagree. Runs of whole blocks decode in parallel.

use half::{bf16, f16};
use rayon::prelude::*;

use super::GgmlType;

/// Elements each rayon task widens.
const TASK_ELEMENTS: usize = 1 << 16;

/// Dequantises whole blocks of `ggml_type` from `bytes` into `out`, in parallel.
///
/// # Panics
/// If `ggml_type` is not dequantisable ([`GgmlType::is_dequantizable`]), or if `out` is
/// not a whole number of blocks or `bytes` not exactly the bytes of `out.len()` elements.
pub fn dequantize(ggml_type: GgmlType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        ggml_type.bytes_for(out.len()),
        Some(bytes.len()),
        "{} bytes do not hold {} {ggml_type} elements",
        bytes.len(),
        out.len()
    );
    match ggml_type {
        GgmlType::F32 => widen::<4>(bytes, out, |b| f32::from_le_bytes(*b)),
        GgmlType::F16 => widen::<2>(bytes, out, |b| f16::from_le_bytes(*b).to_f32()),
        GgmlType::BF16 => widen::<2>(bytes, out, |b| bf16::from_le_bytes(*b).to_f32()),
        other => match other.quant_format() {
            Some(q) => met_kernels::quant::dequantize(q, bytes, out),
            None => panic!("met cannot dequantise {other}"),
        },
    }
}

/// Widens `S`-byte elements in parallel runs.
fn widen<const S: usize>(bytes: &[u8], out: &mut [f32], f: impl Fn(&[u8; S]) -> f32 + Sync) {
    out.par_chunks_mut(TASK_ELEMENTS).zip(bytes.par_chunks(TASK_ELEMENTS * S)).for_each(|(o, b)| {
        let (ins, _) = b.as_chunks::<S>();
        for (o, b) in o.iter_mut().zip(ins) {
            *o = f(b);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_block_types_decode() {
        let mut out = [0f32; 2];
        dequantize(GgmlType::F16, &[0x00, 0x3C, 0x00, 0xC0], &mut out);
        assert_eq!(out, [1.0, -2.0]);
        let mut block = [0u8; 34];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2] = 4;
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q8_0, &block, &mut out);
        assert_eq!(&out[..2], &[2.0, 0.0]);
    }

    #[test]
    #[should_panic(expected = "do not hold")]
    fn a_partial_block_is_refused() {
        dequantize(GgmlType::Q8_0, &[0; 33], &mut [0.0; 32]);
    }
}
