//! Block-quantised weight formats (ggml's, and one for FP8 checkpoints), shared by every
//! backend.
//!
//! A quantised matrix `[n, k]` is stored row by row, each row `k / block_elems` blocks of
//! `block_bytes` bytes, exactly as GGUF files lay them out, so weights go from the memory
//! map to the CPU backend untouched and compute with exactly the file's values. An FP8
//! checkpoint's e4m3 weights take [`QuantFormat::F8_E4M3`], blocks of 32 bytes under one
//! f32 scale, which hold every per-tensor, per-row and 128-wide block layout exactly. This
//! module knows the block layouts: it dequantises ([`dequantize`], [`dequantize_row`]) and
//! computes `x · row` from the blocks ([`dot_rows`]), or, for the formats the CPU repacks
//! ([`PackedQuant`]), with AVX-512 or AVX2 kernels: exact f32 ones, or integer ones against
//! activations quantised to 8 bits ([`Q8Rows`], [`PackedQuant::dot_rows_q8`]). f32 rows
//! multiply through [`dot_f32_rows`], whose every result is independent of its batch.

mod blocks;
mod f32_rows;
mod grouped;
mod packed;
mod packed_k;
mod q8;
mod simd;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_grouped;
#[cfg(target_arch = "x86_64")]
mod x86_int;
#[cfg(target_arch = "x86_64")]
mod x86_isa;

use std::fmt;

use rayon::prelude::*;

pub use f32_rows::dot_f32_rows;
pub use packed::PackedQuant;
pub use q8::Q8Rows;
pub use simd::SimdLevel;

/// A block-quantised format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum QuantFormat {
    /// 32 × 4-bit, one f16 scale: `d · (q − 8)`.
    Q4_0,
    /// 32 × 4-bit, f16 scale and minimum: `d · q + m`.
    Q4_1,
    /// 32 × 5-bit, one f16 scale: `d · (q − 16)`.
    Q5_0,
    /// 32 × 5-bit, f16 scale and minimum: `d · q + m`.
    Q5_1,
    /// 32 × 8-bit, one f16 scale: `d · q`.
    Q8_0,
    /// 256 × 4-bit in 8 sub-blocks with 6-bit scales and minimums.
    Q4_K,
    /// 256 × 5-bit in 8 sub-blocks with 6-bit scales and minimums.
    Q5_K,
    /// 256 × 6-bit in 16 sub-blocks with 8-bit scales.
    Q6_K,
    /// 32 × `float8_e4m3fn` after one f32 scale: `s · e4m3(q)` (not a ggml type: FP8
    /// checkpoints' weights, read through `met-model-weights`' `Fp8View`).
    F8_E4M3,
}

impl QuantFormat {
    /// Every format.
    pub const ALL: [Self; 9] =
        [Self::Q4_0, Self::Q4_1, Self::Q5_0, Self::Q5_1, Self::Q8_0, Self::Q4_K, Self::Q5_K, Self::Q6_K, Self::F8_E4M3];

    /// Elements per block.
    pub const fn block_elems(self) -> usize {
        match self {
            Self::Q4_K | Self::Q5_K | Self::Q6_K => blocks::QK_K,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q5_0 => 22,
            Self::Q5_1 => 24,
            Self::Q8_0 => 34,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::F8_E4M3 => 36,
        }
    }

    /// Bytes of `elems` elements, if they are a whole number of blocks.
    pub const fn bytes_for(self, elems: usize) -> Option<usize> {
        if elems.is_multiple_of(self.block_elems()) {
            Some(elems / self.block_elems() * self.block_bytes())
        } else {
            None
        }
    }

    /// ggml's name (`q4_1`), or `f8_e4m3`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "q4_0",
            Self::Q4_1 => "q4_1",
            Self::Q5_0 => "q5_0",
            Self::Q5_1 => "q5_1",
            Self::Q8_0 => "q8_0",
            Self::Q4_K => "q4_k",
            Self::Q5_K => "q5_k",
            Self::Q6_K => "q6_k",
            Self::F8_E4M3 => "f8_e4m3",
        }
    }
}

impl fmt::Display for QuantFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantises `out.len()` elements of `format` from `bytes` on the calling thread.
///
/// # Panics
/// If `bytes` does not hold exactly that many elements (whole blocks).
pub fn dequantize_row(format: QuantFormat, bytes: &[u8], out: &mut [f32]) {
    assert_holds(format, bytes, out);
    if format == QuantFormat::F8_E4M3 {
        return dequantize_f8_row(bytes, out);
    }
    for (b, o) in bytes.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(format.block_elems())) {
        blocks::decode_block(format, b, o);
    }
}

/// [`QuantFormat::F8_E4M3`] blocks widened a block at a time, the loop compiled for the
/// CPU's widest vectors (the portable build has SSE2 only: 2.5 times slower, measured): every
/// path computes each value as `e4m3(q) · s`, one rounding, so all give the same bits.
fn dequantize_f8_row(bytes: &[u8], out: &mut [f32]) {
    dequantize_f8_row_at(SimdLevel::current(), bytes, out);
}

/// [`dequantize_f8_row`] on the vectors of `level`, which the CPU must have.
fn dequantize_f8_row_at(level: SimdLevel, bytes: &[u8], out: &mut [f32]) {
    #[inline(always)]
    fn widen_blocks(bytes: &[u8], out: &mut [f32]) {
        let (bb, be) = (QuantFormat::F8_E4M3.block_bytes(), QuantFormat::F8_E4M3.block_elems());
        for (b, o) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(be)) {
            crate::fp8::widen_e4m3(o, &b[4..], f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw")]
        fn avx512(bytes: &[u8], out: &mut [f32]) {
            widen_blocks(bytes, out);
        }
        #[target_feature(enable = "avx2,fma")]
        fn avx2(bytes: &[u8], out: &mut [f32]) {
            widen_blocks(bytes, out);
        }
        assert!(level <= SimdLevel::detected(), "{level:?} is past this CPU");
        match level {
            // SAFETY: the CPU has the level (asserted above).
            SimdLevel::Avx512 => return unsafe { avx512(bytes, out) },
            // SAFETY: as above.
            SimdLevel::Avx2 => return unsafe { avx2(bytes, out) },
            SimdLevel::None => {}
        }
    }
    widen_blocks(bytes, out);
}

/// [`dequantize_row`] over a whole tensor, in parallel runs of whole blocks.
///
/// # Panics
/// As [`dequantize_row`].
pub fn dequantize(format: QuantFormat, bytes: &[u8], out: &mut [f32]) {
    assert_holds(format, bytes, out);
    let blocks_per_task = ((1 << 16) / format.block_elems()).max(1);
    out.par_chunks_mut(blocks_per_task * format.block_elems())
        .zip(bytes.par_chunks(blocks_per_task * format.block_bytes()))
        .for_each(|(o, b)| dequantize_row(format, b, o));
}

/// Panics unless `bytes` are exactly `out.len()` elements of `format` (whole blocks).
#[track_caller]
fn assert_holds(format: QuantFormat, bytes: &[u8], out: &[f32]) {
    assert_eq!(
        format.bytes_for(out.len()),
        Some(bytes.len()),
        "{} bytes do not hold {} {format} elements",
        bytes.len(),
        out.len()
    );
}

/// Per-32-element block sums of `x` (the minimum terms of packed Q4_0/Q4_1 multiply them).
pub fn block_sums(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(32).map(|b| b.iter().sum()).collect()
}

/// `out[r] = x · row r` for the quantised rows `rows` (each `x.len()` elements), decoding
/// each block. The formats with a packed layout go through [`PackedQuant`] and its SIMD
/// kernels instead.
///
/// # Panics
/// If the lengths do not match the format.
pub fn dot_rows(format: QuantFormat, x: &[f32], rows: &[u8], out: &mut [f32]) {
    let row_bytes = format.bytes_for(x.len()).unwrap_or_else(|| panic!("{} is not whole {format} blocks", x.len()));
    assert_eq!(
        rows.len(),
        row_bytes * out.len(),
        "rows do not hold {} rows of {} {format} elements",
        out.len(),
        x.len()
    );
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(row_bytes.max(1))) {
        *o = dot_scalar(format, x, row);
    }
}

/// `x · row` from the decoded values, without SIMD.
fn dot_scalar(format: QuantFormat, x: &[f32], row: &[u8]) -> f32 {
    let n = format.block_elems();
    let mut vals = [0f32; blocks::QK_K];
    let mut acc = 0f32;
    for (b, xb) in row.chunks_exact(format.block_bytes()).zip(x.chunks_exact(n)) {
        blocks::decode_block(format, b, &mut vals[..n]);
        acc += vals[..n].iter().zip(xb).map(|(w, x)| w * x).sum::<f32>();
    }
    acc
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use tests::f8_block as f8_test_block;
#[cfg(test)]
mod tests_int;
#[cfg(test)]
mod tests_kquant;
