//! Moving stored tensors onto a device, alone or fused along dim 0.
//!
//! Fusion happens on the host, before the single upload: q/k/v projections become one
//! matmul weight, gate/up one MLP weight, and per-expert MoE weights one stacked tensor
//! (concatenate along dim 0, then reshape the device tensor). Equal dtypes are joined as raw
//! bytes, so no precision is lost; mixed dtypes are widened to f32 first, which is exact
//! for f16 and bf16, unless the backend keeps each part's format
//! ([`GpuBackend::upload_rows`]: the CPU does for packed quantised matrices).
//!
//! A tensor-parallel rank loads only its share of a tensor ([`load_slices`]): rows of dim 0
//! (borrowed straight from a memory-mapped file), optionally followed by zero rows, or a
//! range of the last dim of every row (copied), before the same fusion and upload.
//!
//! Random weights skip the host: when the store describes every part as a run of its
//! random stream ([`WeightStore::uniform_run`]), the backend generates the fused tensor in
//! place ([`GpuBackend::random_uniform`]), with the same values.

use std::ops::Range;

use met_kernels::{DType, GpuBackend, HostTensor, Tensor};

use crate::{WeightError, WeightStore};

/// Loads one tensor onto the backend.
///
/// # Errors
/// When the store cannot provide the tensor ([`WeightError::Missing`],
/// [`WeightError::UnsupportedDtype`]) or the backend rejects it.
pub fn load(store: &dyn WeightStore, name: &str, backend: &dyn GpuBackend) -> Result<Tensor, WeightError> {
    if let Some(run) = store.uniform_run(name) {
        return Ok(backend.random_uniform(&shape_of(store, name)?, &[run])?);
    }
    Ok(backend.upload(&store.host(name)?, backend.float_dtype())?)
}

/// Loads several tensors concatenated along dim 0 (trailing dims must agree) as one
/// device tensor: used to fuse q/k/v, gate/up, and to stack MoE experts. Mixed dtypes are
/// widened to f32 on the host before upload (or kept apart, [`GpuBackend::upload_rows`]);
/// equal dtypes are concatenated as raw bytes.
///
/// # Errors
/// [`WeightError::Concat`] for an empty list, a 0-D tensor or disagreeing trailing dims;
/// otherwise as [`load`].
pub fn load_concat(store: &dyn WeightStore, names: &[&str], backend: &dyn GpuBackend) -> Result<Tensor, WeightError> {
    if let Some(runs) = names.iter().map(|n| store.uniform_run(n)).collect::<Option<Vec<_>>>() {
        let shapes = names.iter().map(|n| shape_of(store, n)).collect::<Result<Vec<_>, _>>()?;
        let shape = concat_shape(names, &shapes.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        return Ok(backend.random_uniform(&shape, &runs)?);
    }
    let parts = names.iter().map(|n| store.host(n)).collect::<Result<Vec<_>, _>>()?;
    upload_rows(names, parts, backend)
}

/// The part of a stored tensor one tensor-parallel rank loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Slice {
    /// All of it (replicated tensors, and every tensor of a single device).
    Whole,
    /// Rows `range` of dim 0, then zero rows up to `len` rows in all (`len == range.len()`
    /// for no padding): a column-parallel share, or a padded vocabulary share.
    Rows {
        /// The rows taken from the store.
        range: Range<usize>,
        /// Rows of the result, the padding included.
        len: usize,
    },
    /// Elements `range` of the last dim of every row: a row-parallel share.
    Columns(Range<usize>),
}

impl Slice {
    /// Rows `range`, unpadded.
    pub fn rows(range: Range<usize>) -> Self {
        let len = range.len();
        Self::Rows { range, len }
    }
}

/// Loads the given slices of several tensors concatenated along dim 0 as one device
/// tensor: a rank's share of a fused projection (its q, k and v heads, its gate and up
/// rows) or of stacked experts. With every slice [`Slice::Whole`] this is [`load_concat`].
///
/// # Errors
/// [`WeightError::Concat`] when a slice falls outside its tensor or, for quantised data,
/// off block boundaries (naming the tensor), or when the slices cannot be concatenated;
/// otherwise as [`load`].
pub fn load_slices(
    store: &dyn WeightStore,
    parts: &[(&str, Slice)],
    backend: &dyn GpuBackend,
) -> Result<Tensor, WeightError> {
    let names: Vec<&str> = parts.iter().map(|(name, _)| *name).collect();
    if parts.iter().all(|(_, slice)| *slice == Slice::Whole) {
        return load_concat(store, &names, backend);
    }
    let sliced = parts
        .iter()
        .map(|(name, slice)| {
            let host = store.host(name)?;
            let part = match slice {
                Slice::Whole => Ok(host),
                Slice::Rows { range, len } => host.rows(range.clone()).and_then(|h| h.pad_rows(*len)),
                Slice::Columns(range) => host.columns(range.clone()),
            };
            part.map_err(|e| concat_error(&[name], format!("{slice:?} of `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    upload_rows(&names, sliced, backend)
}

/// Uploads host tensors joined along dim 0 ([`GpuBackend::upload_rows`]: parts of
/// different dtypes are widened, or kept apart where the backend packs them), after
/// checking, with the tensors' names, that they join.
fn upload_rows(names: &[&str], parts: Vec<HostTensor<'_>>, backend: &dyn GpuBackend) -> Result<Tensor, WeightError> {
    concat_shape(names, &parts.iter().map(HostTensor::shape).collect::<Vec<_>>())?;
    if parts.iter().any(|p| p.dtype() != parts[0].dtype())
        && let Some((_, name)) = parts.iter().zip(names).find(|(p, _)| p.dtype() == DType::U32)
    {
        return Err(concat_error(names, format!("`{name}` is u32 and the others are not")));
    }
    Ok(backend.upload_rows(parts, backend.float_dtype())?)
}

/// The shape of the concatenation: dim 0 summed, trailing dims shared by every part.
fn concat_shape(names: &[&str], shapes: &[&[usize]]) -> Result<Vec<usize>, WeightError> {
    let Some(first) = shapes.first() else {
        return Err(concat_error(names, "no tensors given".into()));
    };
    let Some((_, trailing)) = first.split_first() else {
        return Err(concat_error(names, format!("`{}` is 0-D", names[0])));
    };
    let mut rows = 0;
    for (shape, name) in shapes.iter().zip(names) {
        if shape.get(1..) != Some(trailing) {
            return Err(concat_error(
                names,
                format!("`{name}` has shape {shape:?}, but `{}` has trailing dims {trailing:?}", names[0]),
            ));
        }
        rows += shape[0];
    }
    Ok([&[rows], trailing].concat())
}

/// The shape `store` lists for `name`.
fn shape_of(store: &dyn WeightStore, name: &str) -> Result<Vec<usize>, WeightError> {
    store
        .info(name)
        .map(|i| i.shape)
        .ok_or_else(|| WeightError::Missing { name: name.to_string(), store: store.describe() })
}

fn concat_error(names: &[&str], msg: String) -> WeightError {
    WeightError::Concat { names: names.iter().map(ToString::to_string).collect(), msg }
}
