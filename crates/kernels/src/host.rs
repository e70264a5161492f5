//! Tensors in host memory on their way to or from a device.

use std::borrow::Cow;

use half::{bf16, f16};
use rayon::prelude::*;

use crate::DType;
use crate::error::{Error, Result};

/// Little-endian elements in host memory with a dtype and shape: what weight loaders
/// produce (often borrowed straight from a memory-mapped file, so possibly unaligned) and
/// what [`crate::GpuBackend::upload`] consumes.
#[derive(Clone)]
pub struct HostTensor<'a> {
    dtype: DType,
    shape: Vec<usize>,
    bytes: Cow<'a, [u8]>,
}

impl<'a> HostTensor<'a> {
    /// Wraps raw little-endian bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the byte length does not match shape and dtype.
    pub fn from_bytes(dtype: DType, shape: &[usize], bytes: Cow<'a, [u8]>) -> Result<Self> {
        let elems = shape.iter().product::<usize>();
        let Some(want) = dtype.bytes_for(elems) else {
            return Err(Error::InvalidArgument(format!("a {dtype} tensor of shape {shape:?} is not whole blocks")));
        };
        if bytes.len() != want {
            return Err(Error::InvalidArgument(format!(
                "{} bytes cannot hold a {dtype} tensor of shape {shape:?} ({want} bytes)",
                bytes.len()
            )));
        }
        Ok(Self { dtype, shape: shape.to_vec(), bytes })
    }

    /// An owned f32 tensor.
    ///
    /// # Panics
    /// If `data.len()` does not match `shape`.
    pub fn from_f32(data: &[f32], shape: &[usize]) -> HostTensor<'static> {
        assert_eq!(data.len(), shape.iter().product::<usize>(), "data does not match shape");
        let bytes = bytemuck::cast_slice::<f32, u8>(data).to_vec();
        HostTensor { dtype: DType::F32, shape: shape.to_vec(), bytes: Cow::Owned(bytes) }
    }

    /// An owned u32 tensor.
    ///
    /// # Panics
    /// If `data.len()` does not match `shape`.
    pub fn from_u32(data: &[u32], shape: &[usize]) -> HostTensor<'static> {
        assert_eq!(data.len(), shape.iter().product::<usize>(), "data does not match shape");
        let bytes = bytemuck::cast_slice::<u32, u8>(data).to_vec();
        HostTensor { dtype: DType::U32, shape: shape.to_vec(), bytes: Cow::Owned(bytes) }
    }

    /// The element type of the bytes.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// The elements widened (or dequantised) to f32.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a `U32` tensor.
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let b = &self.bytes[..];
        if self.dtype == DType::F32
            && let Ok(floats) = bytemuck::try_cast_slice::<u8, f32>(b)
        {
            return Ok(floats.to_vec());
        }
        let mut out = vec![0f32; self.elem_count()];
        const CHUNK: usize = 1 << 16;
        match self.dtype {
            DType::F32 => decode(b, &mut out, CHUNK, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::BF16 => decode(b, &mut out, CHUNK, |c| bf16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::F16 => decode(b, &mut out, CHUNK, |c| f16::from_le_bytes([c[0], c[1]]).to_f32()),
            DType::Quant(q) => crate::quant::dequantize(q, b, &mut out),
            DType::U32 => {
                return Err(Error::InvalidArgument("a u32 tensor has no f32 view".into()));
            }
        }
        Ok(out)
    }

    /// The elements as u32 (`U32` tensors only).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a float tensor.
    pub fn to_u32_vec(&self) -> Result<Vec<u32>> {
        if self.dtype != DType::U32 {
            return Err(Error::InvalidArgument(format!("a {} tensor has no u32 view", self.dtype)));
        }
        Ok(self.bytes.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}

/// Decodes fixed-size little-endian elements in parallel chunks. Works on unaligned input.
fn decode(bytes: &[u8], out: &mut [f32], chunk: usize, f: impl Fn(&[u8]) -> f32 + Sync) {
    if out.is_empty() {
        return;
    }
    let width = bytes.len() / out.len().max(1);
    out.par_chunks_mut(chunk).zip(bytes.par_chunks(chunk * width)).for_each(|(o, b)| {
        for (x, c) in o.iter_mut().zip(b.chunks_exact(width)) {
            *x = f(c);
        }
    });
}

impl std::fmt::Debug for HostTensor<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostTensor({:?}, {})", self.shape, self.dtype)
    }
}
