//! Tensor parallelism across the GPUs of one host through NCCL, with cudarc's `nccl`
//! bindings loading `libnccl` at run time like the rest of CUDA (building needs no toolkit).
//!
//! One communicator per GPU, made together by `ncclCommInitAll` in this process; each rank's
//! worker thread drives its own communicator on its backend's compute stream, so a
//! collective is ordered with the kernels around it without events, and a CUDA graph that
//! records a step records its collectives too. NVLink multicast (NVLS) is switched off
//! (`NCCL_NVLS_ENABLE=0`) before the communicators start, as the device documentation of
//! the machines met runs on requires.
//!
//! This file is compile-checked only: the repository's CI has no GPU, and no machine with
//! several GPUs has run it yet. The in-process collective (`collective::local`) carries the
//! sharding tests; this one must be checked on a multi-GPU host (TP = 2 greedy outputs
//! against TP = 1) before it is trusted.
//!
//! Invariant: a communicator is used under its mutex by one thread at a time, and never
//! after `abort` (which frees it).

use std::sync::Arc;

use cudarc::nccl::{result as nccl, sys as nccl_sys};
use parking_lot::Mutex;

use super::{CudaBackend, drv, ptr};
use crate::collective::Collective;
use crate::error::{Error, Result};
use crate::{DType, QuantDots, Tensor};

/// GPUs the driver reports; 0 without a driver.
pub(crate) fn visible_gpus() -> usize {
    if !super::driver_present() {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

/// Opens GPUs `0..world`, checking first that the host has that many.
///
/// # Errors
/// [`Error::Device`] when CUDA cannot start, fewer than `world` GPUs are visible, or one
/// fails to open.
pub(crate) fn open_gpus(quant_dots: QuantDots, world: usize) -> Result<Vec<Arc<CudaBackend>>> {
    if !super::driver_present() {
        return Err(Error::Device("the CUDA driver (libcuda) is not installed".into()));
    }
    let visible = cudarc::driver::CudaContext::device_count().map_err(drv)?;
    if usize::try_from(visible).unwrap_or(0) < world {
        return Err(Error::Device(format!(
            "tensor parallelism over {world} GPUs, but {visible} CUDA device(s) are visible"
        )));
    }
    (0..world).map(|ordinal| CudaBackend::on_device(ordinal).map(|b| Arc::new(b.with_quant_dots(quant_dots)))).collect()
}

/// One NCCL communicator per GPU of `gpus`, rank `i` on `gpus[i]`.
///
/// # Errors
/// [`Error::Device`] when `libnccl` cannot be loaded or `ncclCommInitAll` fails.
pub(crate) fn connect(gpus: &[Arc<CudaBackend>]) -> Result<Vec<Arc<dyn Collective>>> {
    // SAFETY: this only tries to open the shared library.
    if !unsafe { nccl_sys::is_culib_present() } {
        return Err(Error::Device("NCCL (libnccl.so.2) is not installed; tensor parallelism on CUDA needs it".into()));
    }
    disable_nvls();
    let ordinals: Vec<i32> = gpus.iter().map(|g| g.dev.ordinal as i32).collect();
    let mut comms = vec![std::ptr::null_mut(); gpus.len()];
    // SAFETY: `comms` has room for one communicator per device in `ordinals`.
    unsafe { nccl::comm_init_all(comms.as_mut_ptr(), gpus.len() as i32, ordinals.as_ptr()) }.map_err(nccl_error)?;
    let world = gpus.len();
    Ok(comms
        .into_iter()
        .zip(gpus)
        .enumerate()
        .map(|(rank, (comm, gpu))| {
            let comm = Mutex::new(Some(Comm(comm)));
            Arc::new(NcclCollective { rank, world, gpu: Arc::clone(gpu), comm }) as Arc<dyn Collective>
        })
        .collect())
}

/// Switches NVLink multicast off for the communicators about to start.
fn disable_nvls() {
    // SAFETY: NCCL reads its settings when a communicator starts, which is after this
    // call on this thread. Startup calls this once, in phase 4, before any rank's worker
    // thread exists; no other thread of met reads the environment at that point.
    unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
}

/// A raw communicator.
struct Comm(nccl_sys::ncclComm_t);

// SAFETY: an NCCL communicator may be used from any thread as long as calls on it do not
// overlap; `NcclCollective` keeps it under a mutex.
unsafe impl Send for Comm {}

/// One rank's NCCL communicator, on its GPU's compute stream.
struct NcclCollective {
    rank: usize,
    world: usize,
    gpu: Arc<CudaBackend>,
    /// `None` once aborted.
    comm: Mutex<Option<Comm>>,
}

impl NcclCollective {
    /// The NCCL type of a float tensor as this backend stores it.
    fn nccl_type(x: &Tensor) -> Result<nccl_sys::ncclDataType_t> {
        match x.dtype() {
            DType::BF16 => Ok(nccl_sys::ncclDataType_t::ncclBfloat16),
            DType::F32 => Ok(nccl_sys::ncclDataType_t::ncclFloat32),
            other => Err(Error::DType { op: "nccl", expected: DType::BF16, got: other }),
        }
    }

    /// Runs `call` with the live communicator and the compute stream, the context bound.
    fn with_comm(
        &self,
        call: impl FnOnce(nccl_sys::ncclComm_t, nccl_sys::cudaStream_t) -> std::result::Result<(), nccl::NcclError>,
    ) -> Result<()> {
        let comm = self.comm.lock();
        let Some(Comm(comm)) = comm.as_ref() else {
            return Err(Error::Device("the tensor-parallel group was aborted: another rank failed".into()));
        };
        self.gpu.dev.bind()?;
        let stream = self.gpu.dev.stream().cu_stream() as nccl_sys::cudaStream_t;
        call(*comm, stream).map_err(nccl_error)
    }
}

fn nccl_error(e: nccl::NcclError) -> Error {
    Error::Device(format!("NCCL: {e:?}"))
}

impl Collective for NcclCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = Self::nccl_type(x)?;
        let out = self.gpu.alloc(x.dims(), x.dtype())?;
        let (src, dst) = (ptr("all_reduce_sum", x)?, ptr("all_reduce_sum", &out)?);
        self.with_comm(|comm, stream| {
            // SAFETY: `src` and `dst` hold `x.elem_count()` elements of `dtype` on this rank's
            // GPU and stay alive until the stream has run the call (met frees in stream order).
            unsafe {
                nccl::all_reduce(
                    src as _,
                    dst as _,
                    x.elem_count(),
                    dtype,
                    nccl_sys::ncclRedOp_t::ncclSum,
                    comm,
                    stream,
                )
            }
            .map(drop)
        })?;
        Ok(out)
    }

    fn all_gather(&self, x: &Tensor) -> Result<Tensor> {
        let dtype = Self::nccl_type(x)?;
        let mut dims = x.dims().to_vec();
        match dims.first_mut() {
            Some(rows) => *rows *= self.world,
            None => dims = vec![self.world],
        }
        let out = self.gpu.alloc(&dims, x.dtype())?;
        let (src, dst) = (ptr("all_gather", x)?, ptr("all_gather", &out)?);
        self.with_comm(|comm, stream| {
            // SAFETY: `src` holds `x.elem_count()` elements and `dst` `world` times as many,
            // both on this rank's GPU, alive until the stream has run the call.
            unsafe { nccl::all_gather(src as _, dst as _, x.elem_count(), dtype, comm, stream) }.map(drop)
        })?;
        Ok(out)
    }

    fn abort(&self) {
        if let Some(Comm(comm)) = self.comm.lock().take() {
            // SAFETY: the communicator is live (taken out of the mutex exactly once) and no
            // call on it is in flight on this rank (they all hold the mutex).
            if let Err(e) = unsafe { nccl::comm_abort(comm) } {
                warn_teardown(&format!("aborting the NCCL communicator of rank {}: {e:?}", self.rank));
            }
        }
    }
}

impl Drop for NcclCollective {
    fn drop(&mut self) {
        if let Some(Comm(comm)) = self.comm.get_mut().take() {
            // SAFETY: the communicator is live and this is its last use; destroying waits
            // for its queued operations.
            if let Err(e) = unsafe { nccl::comm_destroy(comm) } {
                warn_teardown(&format!("destroying the NCCL communicator of rank {}: {e:?}", self.rank));
            }
        }
    }
}

/// The kernels crate has no logger; a failure while tearing a group down goes to stderr.
fn warn_teardown(msg: &str) {
    eprintln!("met-kernels: {msg}");
}
