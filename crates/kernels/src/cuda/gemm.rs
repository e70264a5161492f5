//! GEMMs through cuBLAS: `x [m, k] · wᵀ` with `w [n, k]`, bf16 operands, f32 accumulation
//! (`CUBLAS_COMPUTE_32F`), bf16 output.
//!
//! cuBLAS is column-major. A row-major `[r, c]` matrix is a column-major `[c, r]` one, so
//! the row-major product `out [m, n] = x · wᵀ` is the column-major `outᵀ [n, m] = w' · x'`
//! with `w'` = `w` read transposed (`[k, n]` column-major, `lda = k`) and `x'` = `x` as is
//! (`[k, m]`, `ldb = k`). A bias is added by pre-filling the output with it and using
//! `beta = 1`. The handle sits behind a mutex: cuBLAS handles are not safe to use from
//! two threads at once. It gets a workspace of its own at creation, so that products
//! captured into a CUDA graph never allocate (cuBLAS's advice for graph capture).

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{CudaBlas, result as blas};
use parking_lot::Mutex;

use super::device::{Device, DeviceBuffer};
use crate::error::{Error, Result};

/// A cuBLAS handle bound to the compute stream.
pub(crate) struct Blas {
    handle: Mutex<CudaBlas>,
    /// cuBLAS's workspace, alive as long as the handle.
    _workspace: DeviceBuffer,
}

/// Workspace bytes: what cuBLAS recommends on Hopper.
const WORKSPACE: usize = 32 << 20;

/// Operand addresses and sizes of one `x · wᵀ` product.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gemm {
    /// `bf16 [m, k]`.
    pub x: u64,
    /// `bf16 [n, k]`.
    pub w: u64,
    /// `bf16 [m, n]`; with `accumulate`, it already holds what is added to.
    pub out: u64,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// `out += x · wᵀ` instead of `out = x · wᵀ`.
    pub accumulate: bool,
}

impl Blas {
    /// A handle on `device`'s stream.
    pub(crate) fn new(device: &Arc<Device>) -> Result<Self> {
        device.bind()?;
        let handle = CudaBlas::new(Arc::clone(device.stream())).map_err(|e| Error::Device(format!("cuBLAS: {e:?}")))?;
        let workspace = device.alloc(WORKSPACE)?;
        // SAFETY: the workspace is a live allocation of `WORKSPACE` bytes on the handle's
        // device, kept alive beside the handle.
        unsafe { cudarc::cublas::sys::cublasSetWorkspace_v2(*handle.handle(), workspace.ptr() as *mut _, WORKSPACE) }
            .result()
            .map_err(|e| Error::Device(format!("cuBLAS workspace: {e:?}")))?;
        Ok(Self { handle: Mutex::new(handle), _workspace: workspace })
    }

    /// Runs one product. Sizes must be non-zero and fit cuBLAS's `int`.
    pub(crate) fn gemm(&self, device: &Device, g: Gemm) -> Result<()> {
        let dim = |v: usize| i32::try_from(v).map_err(|_| Error::InvalidArgument(format!("matmul: {v} exceeds i32")));
        let (m, n, k) = (dim(g.m)?, dim(g.n)?, dim(g.k)?);
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        device.bind()?;
        let handle = self.handle.lock();
        // SAFETY: `x`, `w` and `out` are live device allocations of at least m·k, n·k and
        // m·n bf16 elements (checked by the callers' shapes); alpha and beta are host f32s
        // as `CUBLAS_COMPUTE_32F` requires; the handle is used by one thread at a time.
        unsafe {
            blas::gemm_ex(
                *handle.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&raw const alpha).cast(),
                g.w as *const _,
                cudaDataType::CUDA_R_16BF,
                k,
                g.x as *const _,
                cudaDataType::CUDA_R_16BF,
                k,
                (&raw const beta).cast(),
                g.out as *mut _,
                cudaDataType::CUDA_R_16BF,
                n,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| Error::Device(format!("cuBLAS gemm [{m}, {k}] x [{n}, {k}]^T: {e:?}")))
    }
}
