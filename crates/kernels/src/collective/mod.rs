//! The collective seam of tensor parallelism: one model split across the devices of a host,
//! each device a *rank* with its own backend, the ranks combining partial results through
//! a [`Collective`].
//!
//! Two implementations: [`LocalCollective`], where the ranks are threads of this process
//! that meet at a shared rendezvous and combine their tensors in host memory (the CPU's
//! tensor parallelism, and what the sharding tests run on), and, behind the `cuda` feature,
//! NCCL communicators over the GPUs of the host (loaded at run time like the rest of CUDA).
//! [`Devices`] opens the backends of a group (startup phase 3) and joins them (phase 4).
//!
//! Invariants: every rank of a group issues the same collectives in the same order with
//! tensors of the same shape and dtype; every rank receives the same result, bit for bit.
//! A rank that fails outside a collective calls [`Collective::abort`], so the others never
//! wait for it forever; an aborted group refuses every later collective.

mod local;

use std::sync::Arc;

pub use local::LocalCollective;

use crate::{CpuBackend, DeviceKind, Error, GpuBackend, QuantDots, Result, Tensor};

/// One rank's end of a tensor-parallel group: collectives over tensors of its backend.
pub trait Collective: Send + Sync {
    /// This rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn world_size(&self) -> usize;

    /// The elementwise sum of every rank's `x` (a float tensor of one shape on every rank),
    /// as a new tensor of `x`'s shape and dtype on this rank's backend: what follows a
    /// row-parallel product. Every rank gets the same values.
    ///
    /// # Errors
    /// When the ranks' tensors differ in shape or dtype, a tensor is not float, the group
    /// was aborted, or the transport fails.
    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor>;

    /// Every rank's `x [m, ...]` (one shape on every rank) stacked along dim 0 in rank
    /// order: `[world · m, ...]` on this rank's backend.
    ///
    /// # Errors
    /// As [`Self::all_reduce_sum`].
    fn all_gather(&self, x: &Tensor) -> Result<Tensor>;

    /// Ends the group after this rank failed outside a collective: ranks waiting in one (or
    /// entering one later) get an error instead of waiting for this rank.
    fn abort(&self);
}

/// GPUs the CUDA driver reports (0 without the `cuda` feature, a driver, or a GPU).
fn visible_gpus() -> usize {
    #[cfg(feature = "cuda")]
    return crate::cuda::nccl::visible_gpus();
    #[cfg(not(feature = "cuda"))]
    0
}

/// The devices of one tensor-parallel group, rank by rank, opened but not yet joined.
pub struct Devices {
    backends: Vec<Arc<dyn GpuBackend>>,
    transport: Transport,
}

enum Transport {
    /// Threads of this process, meeting in host memory.
    Local,
    /// NCCL over the GPUs.
    #[cfg(feature = "cuda")]
    Nccl(Vec<Arc<crate::CudaBackend>>),
}

impl Devices {
    /// Opens `world` devices of `kind` (startup phase 3): GPUs `0..world` for CUDA, `world`
    /// CPU backends (sharing the host's cores) for the CPU. `Auto` takes CUDA when it was
    /// compiled in and `world` GPUs open, else the CPU; for several ranks, only when no GPU
    /// is visible at all.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for `world` 0; [`Error::CudaNotCompiled`] for CUDA in a
    /// build without it; [`Error::Device`] when fewer than `world` GPUs are visible or one
    /// fails to open.
    pub fn open(kind: DeviceKind, quant_dots: QuantDots, world: usize) -> Result<Self> {
        if world == 0 {
            return Err(Error::InvalidArgument("a tensor-parallel group needs at least one rank".into()));
        }
        match kind {
            DeviceKind::Cpu => Ok(Self::cpu(quant_dots, world)),
            DeviceKind::Cuda => Self::cuda(quant_dots, world),
            DeviceKind::Auto => match Self::cuda(quant_dots, world) {
                Ok(devices) => Ok(devices),
                // With GPUs present, a group that cannot open on them is an error rather
                // than a quiet move to the CPU.
                Err(e) if world > 1 && visible_gpus() > 0 => Err(e),
                Err(_) => Ok(Self::cpu(quant_dots, world)),
            },
        }
    }

    fn cpu(quant_dots: QuantDots, world: usize) -> Self {
        let backends = (0..world).map(|_| Arc::new(CpuBackend::with_dots(quant_dots)) as Arc<dyn GpuBackend>).collect();
        Self { backends, transport: Transport::Local }
    }

    #[cfg(feature = "cuda")]
    fn cuda(quant_dots: QuantDots, world: usize) -> Result<Self> {
        let gpus = crate::cuda::nccl::open_gpus(quant_dots, world)?;
        let backends = gpus.iter().map(|g| Arc::clone(g) as Arc<dyn GpuBackend>).collect();
        let transport = if world == 1 { Transport::Local } else { Transport::Nccl(gpus) };
        Ok(Self { backends, transport })
    }

    #[cfg(not(feature = "cuda"))]
    fn cuda(_quant_dots: QuantDots, _world: usize) -> Result<Self> {
        Err(Error::CudaNotCompiled)
    }

    /// The backend of each rank, in rank order; rank 0's holds the logits the engine samples.
    pub fn backends(&self) -> &[Arc<dyn GpuBackend>] {
        &self.backends
    }

    /// How the ranks exchange tensors, for the startup log.
    pub fn transport(&self) -> &'static str {
        match self.transport {
            Transport::Local if self.backends.len() == 1 => "none (one rank)",
            Transport::Local => "in-process rendezvous in host memory",
            #[cfg(feature = "cuda")]
            Transport::Nccl(_) => "NCCL",
        }
    }

    /// Joins the ranks (startup phase 4): one collective per rank, in rank order.
    ///
    /// # Errors
    /// [`Error::Device`] when NCCL cannot be loaded or its communicators fail to start.
    pub fn connect(&self) -> Result<Vec<Arc<dyn Collective>>> {
        match &self.transport {
            Transport::Local => Ok(LocalCollective::group(&self.backends)
                .into_iter()
                .map(|c| Arc::new(c) as Arc<dyn Collective>)
                .collect()),
            #[cfg(feature = "cuda")]
            Transport::Nccl(gpus) => crate::cuda::nccl::connect(gpus),
        }
    }
}
