//! The tensor handle: shared storage, an element type and a contiguous row-major shape.
//!
//! A `Tensor` is cheap to clone (the storage is reference counted) and carries no device
//! logic of its own: every computation is a [`crate::GpuBackend`] call. Reshaping shares
//! the storage, since every tensor is contiguous.

use std::fmt;
use std::sync::Arc;

use crate::DType;
use crate::cpu::CpuStorage;
use crate::error::{Result, ensure};

/// Most dimensions any tensor in met needs (a KV pool is `[blocks, block, heads, dim]`).
pub const MAX_RANK: usize = 4;

/// A contiguous row-major shape of rank 0 to [`MAX_RANK`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; MAX_RANK],
    rank: u8,
}

impl Shape {
    /// A shape from its dimensions.
    ///
    /// # Panics
    /// If `dims` has more than [`MAX_RANK`] entries: shapes are written by op code, never
    /// read from input, so this is a programming error.
    pub fn new(dims: &[usize]) -> Self {
        assert!(dims.len() <= MAX_RANK, "rank {} exceeds {MAX_RANK}", dims.len());
        let mut d = [0; MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Self { dims: d, rank: dims.len() as u8 }
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Number of elements (1 for rank 0).
    pub fn elem_count(&self) -> usize {
        self.dims().iter().product()
    }

    /// The innermost dimension (1 for rank 0).
    pub fn last(&self) -> usize {
        self.dims().last().copied().unwrap_or(1)
    }

    /// Elements per innermost row and number of rows: `[.., n]` as `(rows, n)`.
    pub fn rows_cols(&self) -> (usize, usize) {
        let n = self.last();
        (self.elem_count().checked_div(n).unwrap_or(0), n)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.dims())
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Self::new(d)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Self::new(&d)
    }
}

/// Where a tensor's elements live. Each backend owns one variant.
pub enum Storage {
    /// Host memory of the [`crate::CpuBackend`].
    Cpu(CpuStorage),
    /// Device memory of the `CudaBackend`.
    #[cfg(feature = "cuda")]
    Cuda(crate::cuda::CudaStorage),
}

impl Storage {
    /// The name of the device that holds this storage (`cpu`, `cuda`).
    pub fn device_name(&self) -> &'static str {
        match self {
            Self::Cpu(_) => "cpu",
            #[cfg(feature = "cuda")]
            Self::Cuda(_) => "cuda",
        }
    }
}

/// A handle to a contiguous row-major block of elements on one device.
#[derive(Clone)]
pub struct Tensor {
    storage: Arc<Storage>,
    dtype: DType,
    shape: Shape,
}

impl Tensor {
    /// Wraps backend storage. Backends call this; the storage must hold exactly
    /// `shape.elem_count()` elements of `dtype`.
    pub fn from_storage(storage: Storage, dtype: DType, shape: Shape) -> Self {
        Self { storage: Arc::new(storage), dtype, shape }
    }

    /// The storage, for backends.
    pub fn storage(&self) -> &Storage {
        &self.storage
    }

    /// The storage as shared, for a backend's view that keeps it alive.
    #[cfg(feature = "cuda")]
    pub(crate) fn shared_storage(&self) -> Arc<Storage> {
        Arc::clone(&self.storage)
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.elem_count()
    }

    /// The same storage under another shape with the same element count.
    ///
    /// # Errors
    /// A shape error when the element counts differ.
    pub fn reshape(&self, dims: &[usize]) -> Result<Self> {
        let shape = Shape::new(dims);
        ensure(shape.elem_count() == self.elem_count(), "reshape", || {
            format!("cannot view {:?} as {:?}", self.shape, shape)
        })?;
        Ok(Self { storage: Arc::clone(&self.storage), dtype: self.dtype, shape })
    }

    /// Whether two handles share one storage.
    pub fn same_storage(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tensor({}, {:?}, {})", self.storage.device_name(), self.shape, self.dtype)
    }
}
