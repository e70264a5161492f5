//! GGUF model files: the reader, ggml dequantisation, and a [`WeightStore`] that serves
//! a GGUF under Hugging Face tensor names, shapes and config.
//!
//! Layers, from the bytes up: [`GgufFile`] parses and validates a memory-mapped file
//! (metadata as [`GgufValue`]s, tensors as [`GgufTensorInfo`]s); [`dequantize`] turns
//! blocks of a [`GgmlType`] into f32; [`GgufStore`] maps llama.cpp's tensor names and
//! layouts back to the Hugging Face checkpoint the file was converted from (renaming,
//! reversing dims, splitting stacked experts, undoing the Llama Q/K row permutation and the
//! Gated DeltaNet transformations) and
//! rebuilds its `config.json`. Model code therefore loads a GGUF exactly as it loads the
//! original checkpoint; quantised kernels can take [`RawTensor`]s instead of f32.
//!
//! [`WeightStore`]: crate::WeightStore

mod arch;
mod config;
mod dequant;
mod gated_delta;
mod names;
mod permute;
mod reader;
mod store;
mod types;
mod value;

pub use arch::{ConfigHook, GgufArch, GgufMeta, insert_opt};
pub use dequant::dequantize;
pub use gated_delta::VHeadOrder;
pub use reader::{DEFAULT_ALIGNMENT, GgufFile, GgufTensorInfo};
pub use store::{GgufStore, RawTensor};
pub use types::GgmlType;
pub(crate) use types::dequantizable_list;
pub use value::GgufValue;
