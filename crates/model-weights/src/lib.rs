//! Named model weights, from wherever they are stored, onto a device.
//!
//! A [`WeightStore`] is a read-only map from tensor names to host bytes: memory-mapped
//! safetensors checkpoints ([`SafetensorsStore`], one file or a sharded index), GGUF files
//! served under Hugging Face names ([`GgufStore`], quantised tensors dequantised to f32,
//! see [`gguf`]), and seeded random weights for tests and benchmarks ([`DummyStore`]).
//! Model code asks for tensors by checkpoint name and moves them to a device with
//! [`load`] or [`load_concat`] (a tensor-parallel rank takes its share with
//! [`load_slices`]); before that, startup runs [`preflight`] so that every missing,
//! unexpected or mis-shaped tensor is named in one error.
//!
//! Invariants: a store never changes after it is built; [`WeightStore::names`] is sorted
//! and lists every tensor the store holds, loadable or not (a GGUF's `rope_freqs.weight`
//! excepted: it is config, folded into [`GgufStore::config_json`]); [`WeightStore::info`]
//! is `Some` exactly for the listed tensors that [`WeightStore::host`] can return. The
//! crate computes nothing beyond dequantising GGUF blocks to f32: conversion to the
//! device's float type happens in [`GpuBackend::upload`].

mod dummy;
mod error;
mod fp8;
pub mod gguf;
mod load;
mod preflight;
mod safetensors_store;

use std::borrow::Cow;

use met_kernels::{DType, HostTensor};

pub use dummy::{DummyStore, GgufRecipe};
pub use error::{PreflightReport, WeightError};
pub use fp8::{Fp8View, dequantize as dequantize_fp8};
pub use gguf::{
    GgmlType, GgufArch, GgufFile, GgufMeta, GgufStore, GgufTensorInfo, GgufValue, RawTensor, VHeadOrder, insert_opt,
};
pub use load::{Slice, load, load_concat, load_slices};
pub use preflight::{is_ignored, preflight};
pub use safetensors_store::SafetensorsStore;

#[cfg(doc)]
use met_kernels::GpuBackend;

/// Name, dtype and shape of one stored tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// The checkpoint name, e.g. `model.layers.0.self_attn.q_proj.weight`.
    pub name: String,
    /// The stored element type.
    pub dtype: DType,
    /// The stored shape, outermost dimension first.
    pub shape: Vec<usize>,
}

/// What a model expects to find: a name and a shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    /// The checkpoint name.
    pub name: String,
    /// The expected shape, outermost dimension first.
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// A spec from a name and a shape.
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self { name: name.into(), shape: shape.to_vec() }
    }
}

/// A source of named weights (safetensors files, GGUF files, random dummy weights).
pub trait WeightStore: Send + Sync {
    /// A short description for messages, e.g. "safetensors in /x/y (2 shards)".
    fn describe(&self) -> String;

    /// Every tensor name the store holds (sorted), including tensors stored in a dtype
    /// that cannot be loaded.
    fn names(&self) -> Vec<String>;

    /// The dtype and shape of `name`, if present and stored in a loadable dtype.
    fn info(&self, name: &str) -> Option<TensorInfo>;

    /// The tensor's bytes in host memory (borrowed from the mmap where possible).
    ///
    /// # Errors
    /// [`WeightError::Missing`] when the store lacks `name`;
    /// [`WeightError::UnsupportedDtype`] when it is stored in a dtype met cannot load.
    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError>;

    /// When the tensor is one run of random weights (a dummy store), the run: the loader
    /// then has the backend generate it ([`met_kernels::GpuBackend::random_uniform`]) instead
    /// of making it on the host and copying it over. Its values equal [`Self::host`]'s.
    /// `None` (the default) for stored data.
    fn uniform_run(&self, name: &str) -> Option<met_kernels::UniformRun> {
        let _ = name;
        None
    }

    /// The shape of `name` when it is stored as `float8_e4m3fn` (what [`Fp8View`]
    /// dequantizes); `None` otherwise, and for a store that holds none. Reads no data, so
    /// asking is cheap for every store.
    fn float8_shape(&self, name: &str) -> Option<Vec<usize>> {
        let _ = name;
        None
    }

    /// The bytes of the `float8_e4m3fn` tensor `name`, one a value in row-major order:
    /// borrowed from a memory map, or made on demand (a dummy store). `None` exactly when
    /// [`Self::float8_shape`] is.
    fn float8(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let _ = name;
        None
    }
}
