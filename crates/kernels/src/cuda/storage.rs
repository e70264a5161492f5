//! The memory behind a CUDA tensor: allocation, the host copy an uploaded index tensor
//! keeps so that ops validate ids without reading the device, and the flag of tensors that
//! hold tokens the sampler drew on the device (which ops index with unchecked, so a step fed
//! from earlier draws does not wait for them). Also the accessors every op uses to reach a
//! tensor's device memory and check its dtype.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::{CudaBackend, CudaStorage, fp8};
use crate::backend::GpuBackend;
use crate::error::{Error, Result};
use crate::{DType, Shape, Storage, Tensor};

const NAME: &str = "cuda";

/// Index tensors up to this many elements keep a host copy for validation.
pub(super) const HOST_COPY_MAX: usize = 1 << 20;

impl CudaStorage {
    /// `buf` as a plain tensor's memory: no host copy, scales, blocks or int8 form.
    pub(super) fn of(buf: super::device::DeviceBuffer) -> Self {
        Self {
            buf,
            host_u32: Mutex::new(None),
            drawn: AtomicBool::new(false),
            fp8: None,
            gguf: None,
            q8: None,
            e4m3: None,
        }
    }
}

impl CudaBackend {
    /// A tensor of `dims` with uninitialised contents.
    pub(super) fn alloc(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let shape = Shape::new(dims);
        let buf = self.dev.alloc(shape.elem_count() * dtype.size_in_bytes())?;
        let storage = CudaStorage::of(buf);
        Ok(Tensor::from_storage(Storage::Cuda(storage), dtype, shape))
    }

    /// A bf16 matrix of `dims` (rows of `n`) with room for its int8 form beside it
    /// ([`CudaStorage::q8`]): `n` bytes and `n / 32` `(d, d · Σq)` pairs a row.
    pub(super) fn alloc_q8(&self, dims: &[usize], n: usize) -> Result<Tensor> {
        let shape = Shape::new(dims);
        let count = shape.elem_count();
        let buf = self.dev.alloc(count * DType::BF16.size_in_bytes())?;
        let q8 = Some(Box::new((self.dev.alloc(count)?, self.dev.alloc(count / n * (n / 32) * 8)?)));
        let storage = CudaStorage { q8, ..CudaStorage::of(buf) };
        Ok(Tensor::from_storage(Storage::Cuda(storage), DType::BF16, shape))
    }

    /// The device addresses of `t`'s int8 form (`q`, `ds`), where a norm wrote one.
    pub(super) fn q8_of(&self, op: &'static str, t: &Tensor) -> Result<Option<(u64, u64)>> {
        Ok(storage(op, t)?.q8.as_ref().map(|q8| (q8.0.ptr(), q8.1.ptr())))
    }

    /// A bf16 matrix of `dims` (`rows` rows of `n`) with room for its e4m3 form beside it
    /// ([`CudaStorage::e4m3`]), `padded` rows of `n` bytes and their scales (one a row, or
    /// one a 128 columns where `block`).
    pub(super) fn alloc_e4m3(&self, dims: &[usize], n: usize, padded: usize, block: bool) -> Result<Tensor> {
        let shape = Shape::new(dims);
        let buf = self.dev.alloc(shape.elem_count() * DType::BF16.size_in_bytes())?;
        let scales = if block { padded * (n / 128) } else { padded };
        let rows = fp8::E4m3Rows { q: self.dev.alloc(padded * n)?, scales: self.dev.alloc(scales * 4)?, padded, block };
        let storage = CudaStorage { e4m3: Some(Box::new(rows)), ..CudaStorage::of(buf) };
        Ok(Tensor::from_storage(Storage::Cuda(storage), DType::BF16, shape))
    }

    /// Whether a norm wrote `t`'s rows in e4m3 beside it for cuBLASLt's FP8 products
    /// ([`Self::alloc_e4m3`]): for tests and diagnostics, since a product takes them
    /// unasked.
    pub fn has_e4m3_rows(t: &Tensor) -> bool {
        storage("has_e4m3_rows", t).is_ok_and(|s| s.e4m3.is_some())
    }

    /// As [`Self::alloc`], for a tensor the side stream writes ([`super::device::Device::alloc_side`]).
    pub(super) fn alloc_side(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        let shape = Shape::new(dims);
        let buf = self.dev.alloc_side(shape.elem_count() * dtype.size_in_bytes())?;
        let storage = CudaStorage::of(buf);
        Ok(Tensor::from_storage(Storage::Cuda(storage), dtype, shape))
    }

    /// A `U32` tensor holding `data`, with its host copy.
    pub(super) fn upload_u32(&self, data: &[u32], dims: &[usize]) -> Result<Tensor> {
        let buf = self.dev.alloc(size_of_val(data))?;
        self.dev.upload(&buf, data)?;
        let host_u32 = Mutex::new((data.len() <= HOST_COPY_MAX).then(|| Arc::from(data)));
        let storage = CudaStorage { host_u32, ..CudaStorage::of(buf) };
        Ok(Tensor::from_storage(Storage::Cuda(storage), DType::U32, Shape::new(dims)))
    }

    /// `dims` of `t`'s elements from element `offset` on, as a tensor sharing its memory
    /// (and keeping it alive), with no copy. The caller keeps the view inside `t` and at an
    /// address kernels can take (16-byte aligned).
    pub(super) fn view(&self, op: &'static str, t: &Tensor, offset: usize, dims: &[usize]) -> Result<Tensor> {
        let shape = Shape::new(dims);
        let size = t.dtype().size_in_bytes();
        let buf = &storage(op, t)?.buf;
        let buf = super::device::DeviceBuffer::view(buf, t.shared_storage(), offset * size, shape.elem_count() * size);
        let storage = CudaStorage::of(buf);
        Ok(Tensor::from_storage(Storage::Cuda(storage), t.dtype(), shape))
    }

    /// Marks `t` as holding drawn tokens ([`CudaStorage::drawn`]).
    pub(super) fn mark_drawn(&self, op: &'static str, t: &Tensor) -> Result<()> {
        storage(op, t)?.drawn.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Whether `t` holds drawn tokens and no host copy: indexing with it checks nothing.
    pub(super) fn drawn_only(&self, op: &'static str, t: &Tensor) -> Result<bool> {
        let s = storage(op, t)?;
        Ok(s.drawn.load(Ordering::Relaxed) && s.host_u32.lock().is_none())
    }

    /// The host copy of an uploaded `U32` tensor, if it has one (nothing is downloaded).
    pub(super) fn host_copy_u32(&self, op: &'static str, t: &Tensor) -> Result<Option<Arc<[u32]>>> {
        expect_dtype(op, t, &[DType::U32])?;
        Ok(storage(op, t)?.host_u32.lock().clone())
    }

    /// Elements of a `U32` tensor on the host: its host copy, or a download.
    pub(super) fn host_u32(&self, op: &'static str, t: &Tensor) -> Result<Arc<[u32]>> {
        expect_dtype(op, t, &[DType::U32])?;
        let copy = storage(op, t)?.host_u32.lock().clone();
        match copy {
            Some(h) => Ok(h),
            None => self.download_u32(t).map(Arc::from),
        }
    }
}

pub(super) fn storage<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
    match t.storage() {
        Storage::Cuda(s) => Ok(s),
        #[allow(unreachable_patterns)]
        other => Err(Error::WrongDevice { op, found: other.device_name(), backend: NAME }),
    }
}

/// The device address of a tensor's elements.
pub(super) fn ptr(op: &'static str, t: &Tensor) -> Result<u64> {
    Ok(storage(op, t)?.buf.ptr())
}

/// Rejects a tensor whose dtype is not one of `allowed`.
pub(super) fn expect_dtype(op: &'static str, t: &Tensor, allowed: &[DType]) -> Result<()> {
    if allowed.contains(&t.dtype()) { Ok(()) } else { Err(Error::DType { op, expected: allowed[0], got: t.dtype() }) }
}
