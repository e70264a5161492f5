//! The device seam of met.
//!
//! Everything that touches tensor contents goes through [`GpuBackend`]: memory (upload,
//! download, zeros), synchronisation, and the op set a decoder-only transformer needs
//! (matmul, RMSNorm with a `w` or an f32 `1 + w` weight, rotary, SiLU·mul and GELU-tanh·mul,
//! scale, soft-cap, embedding, routing, KV writes, paged attention).
//! The rest of the workspace holds [`Tensor`] handles and never reads their storage.
//!
//! Two backends implement the trait: [`CpuBackend`] (f32 compute, multithreaded, the
//! numerical reference) and, behind the `cuda` feature, a CUDA backend. Callers pick one
//! with [`open_backend`], which returns a clear error rather than a missing symbol when a
//! backend was not compiled in, so no caller needs `#[cfg]`.
//!
//! Tensor parallelism splits one model over several backends (ranks) that combine partial
//! results through a [`Collective`] ([`collective`]): an in-process rendezvous for the CPU,
//! NCCL for CUDA; [`Devices`] opens and joins them.
//!
//! Invariants: tensors are contiguous and row-major; a tensor's storage belongs to the
//! backend that made it, and ops reject tensors of another device; float data on a backend
//! is stored in that backend's [`GpuBackend::float_dtype`], index data as `u32`.

pub mod attention;
mod backend;
mod check;
pub mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
mod dtype;
mod error;
pub mod fp8;
mod host;
pub mod quant;
pub mod rng;
mod tensor;

use std::sync::Arc;

pub use backend::{
    AttentionMeta, AttentionParams, DeltaRule, DraftToken, ExpertAdapter, ExpertDelta, ExpertTables, GpuBackend, Graph,
    KvScales, LORA_MAX_PARTS, LaterSample, LoraSlots, LoraStack, MemoryInfo, MoeLora, NO_LORA_SLOT, NO_STATE_SLOT,
    QkvPrologue, RecurrentBatch, Routing, SampleRow, Sampled, StateSnapshot, UniformRun, lora_row_groups,
};
pub use collective::{Collective, Devices, LocalCollective};
pub use cpu::{CpuBackend, QuantDots};
#[cfg(feature = "cuda")]
pub use cuda::{CudaBackend, CudaStorage};
pub use dtype::DType;
pub use error::{Error, Result};
pub use host::HostTensor;
pub use tensor::{Shape, Storage, Tensor};

/// Which device to run on (one of the closed sets of settings in `met-config`).
pub use met_config::DeviceKind;

/// Opens the backend for `kind`: `Auto` is CUDA when it was compiled in and a GPU opens
/// (its error is dropped), else the CPU; quantised products take `quant_dots` on both.
/// `batch_invariant` asks CUDA for its batch-invariant kernels
/// ([`CudaBackend::with_batch_invariance`]); the CPU's always are.
///
/// # Errors
/// [`Error::CudaNotCompiled`] when CUDA is asked for in a build without the `cuda` feature;
/// [`Error::Device`] when CUDA is asked for and no GPU, driver or kernel build works.
pub fn open_backend(kind: DeviceKind, quant_dots: QuantDots, batch_invariant: bool) -> Result<Arc<dyn GpuBackend>> {
    match kind {
        DeviceKind::Cpu => Ok(Arc::new(CpuBackend::with_dots(quant_dots))),
        DeviceKind::Cuda => open_cuda(quant_dots, batch_invariant),
        DeviceKind::Auto => {
            Ok(open_cuda(quant_dots, batch_invariant).unwrap_or_else(|_| Arc::new(CpuBackend::with_dots(quant_dots))))
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(quant_dots: QuantDots, batch_invariant: bool) -> Result<Arc<dyn GpuBackend>> {
    let backend = CudaBackend::new()?.with_quant_dots(quant_dots);
    Ok(Arc::new(if batch_invariant { backend.with_batch_invariance() } else { backend }))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_quant_dots: QuantDots, _batch_invariant: bool) -> Result<Arc<dyn GpuBackend>> {
    Err(Error::CudaNotCompiled)
}
