//! FP8 checkpoints read as weights a backend takes: each `float8_e4m3fn` weight under its
//! scales.
//!
//! [`Fp8View`] serves a store whose quantized weights sit next to their scales
//! (`<weight>_scale_inv` in transformers' block-wise `fp8`, `<weight>_scale` in the
//! per-tensor and compressed-tensors layouts): the scales disappear from its names, every
//! other tensor passes through, and a weight comes as blocks of
//! [`QuantFormat::F8_E4M3`] (32 of its bytes under their f32 scale, 1.125 bytes a weight)
//! wherever each 32 columns of a row share one scale (per tensor, per row, and blocks whose
//! width is a multiple of 32, as the 128-wide ones of real checkpoints), as f32 otherwise.
//! Either way its values are what transformers computes when it dequantizes: `w = fp8(q) · s`
//! with `s` the scale of the weight's tensor, row or block. The CPU keeps the blocks and
//! computes with those values; CUDA keeps them e4m3 where its FP8 kernels take their grid of
//! scales and widens them to bf16 otherwise.
//!
//! A quantized weight without a scale, a scale whose shape does not cover its weight, or
//! an FP8 tensor that is not a 2-D weight is an error naming the tensor.

use std::borrow::Cow;

use met_config::ScaleLayout;
use met_kernels::quant::QuantFormat;
use met_kernels::{DType, HostTensor};
use rayon::prelude::*;

use crate::{TensorInfo, WeightError, WeightStore};

/// `store` with its FP8 weights dequantized; `layout` from the checkpoint's
/// `quantization_config` (`None`: tell per-tensor from per-channel by the scale's shape).
pub struct Fp8View<'a> {
    inner: &'a dyn WeightStore,
    layout: Option<ScaleLayout>,
}

impl<'a> Fp8View<'a> {
    /// The view of `inner`.
    pub fn new(inner: &'a dyn WeightStore, layout: Option<ScaleLayout>) -> Self {
        Self { inner, layout }
    }

    /// The scale tensor of the quantized weight `name`.
    fn scale_name(&self, name: &str) -> Option<String> {
        ["_scale_inv", "_scale"].iter().map(|s| format!("{name}{s}")).find(|s| self.inner.info(s).is_some())
    }

    /// Whether `name` is a companion of a quantized weight in the store, which the view
    /// hides: the weight's scales, or the static activation scale the dequantized weights
    /// do not use.
    fn is_companion(&self, name: &str) -> bool {
        let weight_of = |suffix: &str| name.strip_suffix(suffix).map(str::to_owned);
        // `.input_scale` first: it ends in `_scale` too.
        let owner = weight_of(".input_scale")
            .map(|m| format!("{m}.weight"))
            .or_else(|| weight_of("_scale_inv"))
            .or_else(|| weight_of("_scale"));
        owner.is_some_and(|w| self.inner.float8_shape(&w).is_some())
    }
}

impl WeightStore for Fp8View<'_> {
    fn describe(&self) -> String {
        format!("{} (fp8 weights dequantized)", self.inner.describe())
    }

    fn names(&self) -> Vec<String> {
        self.inner.names().into_iter().filter(|n| !self.is_companion(n)).collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        if self.is_companion(name) {
            return None;
        }
        match self.inner.float8_shape(name) {
            Some(shape) => {
                let dtype = if packs(&shape, self.layout) { DType::Quant(QuantFormat::F8_E4M3) } else { DType::F32 };
                Some(TensorInfo { name: name.into(), dtype, shape })
            }
            None => self.inner.info(name),
        }
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let Some(shape) = self.inner.float8_shape(name) else { return self.inner.host(name) };
        let bad = |msg: String| WeightError::Quantized { name: name.into(), msg };
        let bytes = self.inner.float8(name).ok_or_else(|| bad("is listed as float8 but has no float8 bytes".into()))?;
        let scale_name = self.scale_name(name).ok_or_else(|| bad("has no `_scale_inv` or `_scale` tensor".into()))?;
        let scale = self.inner.host(&scale_name)?;
        let scales = (&scale.to_f32_vec()?[..], scale.shape());
        if packs(&shape, self.layout) {
            let blocks = pack(&shape, &bytes, scales, self.layout).map_err(bad)?;
            return Ok(HostTensor::from_bytes(DType::Quant(QuantFormat::F8_E4M3), &shape, Cow::Owned(blocks))?);
        }
        let values = dequantize(&shape, &bytes, scales, self.layout).map_err(bad)?;
        Ok(HostTensor::from_f32(&values, &shape))
    }

    fn uniform_run(&self, name: &str) -> Option<met_kernels::UniformRun> {
        self.inner.uniform_run(name)
    }
}

/// Whether a weight of `shape` under `layout` packs into [`QuantFormat::F8_E4M3`] blocks:
/// a 2-D weight whose rows are whole blocks of 32, each within one column of scales.
pub fn packs(shape: &[usize], layout: Option<ScaleLayout>) -> bool {
    let &[_, k] = shape else { return false };
    let block = QuantFormat::F8_E4M3.block_elems();
    let scale_cols = match layout {
        Some(ScaleLayout::Block(_, cols)) => cols,
        _ => k,
    };
    k > 0 && k.is_multiple_of(block) && (scale_cols >= k || scale_cols.is_multiple_of(block))
}

/// The scales of an e4m3 weight `[n, k]`, resolved: rows and columns a scale covers, and
/// the grid of scales (rows, columns).
struct Scales<'a> {
    values: &'a [f32],
    rows: usize,
    cols: usize,
    grid_cols: usize,
}

impl<'a> Scales<'a> {
    /// Checks `scale` against the weight's shape and `layout` (`None`: per tensor or per
    /// row, told by the scale's size).
    fn resolve(
        shape: &[usize],
        (scale, scale_shape): (&'a [f32], &[usize]),
        layout: Option<ScaleLayout>,
    ) -> Result<(usize, usize, Self), String> {
        let &[n, k] = shape else { return Err(format!("is an fp8 tensor of shape {shape:?}; met reads 2-D weights")) };
        let layout = match layout {
            Some(l) => l,
            None if scale.len() == 1 => ScaleLayout::Tensor,
            None if scale.len() == n => ScaleLayout::Channel,
            None => return Err(format!("has a scale of shape {scale_shape:?}, neither one per tensor nor per row")),
        };
        let (rows, cols) = match layout {
            ScaleLayout::Tensor => (n.max(1), k.max(1)),
            ScaleLayout::Channel => (1, k.max(1)),
            ScaleLayout::Block(r, c) => (r, c),
        };
        let grid = (n.div_ceil(rows), k.div_ceil(cols));
        if scale.len() != grid.0 * grid.1 {
            return Err(format!(
                "has a scale of shape {scale_shape:?} where its {layout:?} layout over [{n}, {k}] needs {} x {}",
                grid.0, grid.1
            ));
        }
        Ok((n, k, Self { values: scale, rows, cols, grid_cols: grid.1 }))
    }

    /// The scale of element `(i, j)`.
    fn at(&self, i: usize, j: usize) -> f32 {
        self.values[(i / self.rows) * self.grid_cols + j / self.cols]
    }
}

/// The f32 values of an e4m3 weight `[n, k]` under its scales.
///
/// # Errors
/// A message when the weight is not 2-D or the scale's shape does not fit `layout`.
pub fn dequantize(
    shape: &[usize],
    bytes: &[u8],
    scale: (&[f32], &[usize]),
    layout: Option<ScaleLayout>,
) -> Result<Vec<f32>, String> {
    let (n, k, scales) = Scales::resolve(shape, scale, layout)?;
    let mut out = Vec::with_capacity(n * k);
    for (i, row) in bytes.chunks_exact(k.max(1)).take(n).enumerate() {
        out.extend(row.iter().enumerate().map(|(j, &q)| met_kernels::fp8::e4m3_to_f32_fast(q) * scales.at(i, j)));
    }
    Ok(out)
}

/// The [`QuantFormat::F8_E4M3`] blocks of an e4m3 weight `[n, k]` that [`packs`]: each 32
/// bytes of a row after the f32 scale they share. They decode to [`dequantize`]'s values.
///
/// # Errors
/// As [`dequantize`].
pub fn pack(
    shape: &[usize],
    bytes: &[u8],
    scale: (&[f32], &[usize]),
    layout: Option<ScaleLayout>,
) -> Result<Vec<u8>, String> {
    let (n, k, scales) = Scales::resolve(shape, scale, layout)?;
    let format = QuantFormat::F8_E4M3;
    let (block, block_bytes) = (format.block_elems(), format.block_bytes());
    // Rows are packed in parallel (a model's weights are billions of bytes), each into its
    // own run of whole blocks.
    let rows = n.min(bytes.len() / k.max(1));
    let row_bytes = k / block * block_bytes;
    let mut out = vec![0u8; rows * row_bytes];
    out.par_chunks_mut(row_bytes.max(1)).zip(bytes.par_chunks_exact(k.max(1))).enumerate().for_each(
        |(i, (dst, row))| {
            for (g, (dst, values)) in dst.chunks_exact_mut(block_bytes).zip(row.chunks_exact(block)).enumerate() {
                let (scale, codes) = dst.split_at_mut(block_bytes - block);
                scale.copy_from_slice(&scales.at(i, g * block).to_le_bytes());
                codes.copy_from_slice(values);
            }
        },
    );
    Ok(out)
}

#[cfg(test)]
mod tests;
