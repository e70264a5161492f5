//! Tensors in host memory on their way to or from a device.

use std::borrow::Cow;
use std::ops::Range;

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

    /// The raw little-endian bytes, as held (borrowed stays borrowed).
    pub fn into_bytes(self) -> Cow<'a, [u8]> {
        self.bytes
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Rows `range` of dim 0 (every row keeping its trailing dims): one rank's share of a
    /// column-parallel weight. Borrowed bytes stay borrowed, so a shard of a memory-mapped
    /// checkpoint is read straight from the map.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a 0-D tensor, a range past dim 0, or rows that are not
    /// whole blocks of a quantised dtype.
    pub fn rows(self, range: Range<usize>) -> Result<HostTensor<'a>> {
        let Some((&rows, trailing)) = self.shape.split_first() else {
            return Err(Error::InvalidArgument("a 0-D tensor has no rows".into()));
        };
        if range.start > range.end || range.end > rows {
            return Err(Error::InvalidArgument(format!("rows {range:?} of a tensor of shape {:?}", self.shape)));
        }
        let row_bytes = self.row_bytes(trailing.iter().product())?;
        let bytes = match self.bytes {
            Cow::Borrowed(b) => Cow::Borrowed(&b[range.start * row_bytes..range.end * row_bytes]),
            Cow::Owned(b) => Cow::Owned(b[range.start * row_bytes..range.end * row_bytes].to_vec()),
        };
        Ok(HostTensor { dtype: self.dtype, shape: [&[range.len()], trailing].concat(), bytes })
    }

    /// `parts` joined along dim 0, their trailing dims equal: their bytes back to back
    /// when they share a dtype, else their values widened to f32. One part passes through.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for no parts, a 0-D part, trailing dims that differ, or
    /// u32 parts beside others.
    pub fn concat_rows(mut parts: Vec<HostTensor<'a>>) -> Result<HostTensor<'a>> {
        let Some(first) = parts.first() else { return Err(Error::InvalidArgument("no tensors to join".into())) };
        let Some((_, trailing)) = first.shape.split_first() else {
            return Err(Error::InvalidArgument("a 0-D tensor has no rows".into()));
        };
        let trailing = trailing.to_vec();
        let mut rows = 0;
        for p in &parts {
            if p.shape.get(1..) != Some(&trailing[..]) {
                return Err(Error::InvalidArgument(format!(
                    "shapes {:?} and {:?} do not join by rows",
                    first.shape, p.shape
                )));
            }
            rows += p.shape[0];
        }
        let shape = [&[rows][..], &trailing].concat();
        if parts.len() == 1 {
            return Ok(parts.remove(0));
        }
        let dtype = parts[0].dtype;
        if parts.iter().all(|p| p.dtype == dtype) {
            let bytes = parts.iter().flat_map(|p| p.bytes.iter().copied()).collect();
            return HostTensor::from_bytes(dtype, &shape, Cow::Owned(bytes));
        }
        if parts.iter().any(|p| p.dtype == DType::U32) {
            return Err(Error::InvalidArgument("u32 rows cannot join rows of another dtype".into()));
        }
        let mut data = Vec::with_capacity(shape.iter().product());
        for p in &parts {
            data.extend(p.to_f32_vec()?);
        }
        Ok(HostTensor::from_f32(&data, &shape))
    }

    /// The same rows followed by zero rows, `rows` rows in all: a share of a
    /// vocabulary-parallel table padded to the size every rank holds. Zero bytes are zero
    /// values in every dtype (a ggml block of zeros has a zero scale).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a 0-D tensor or fewer than its rows.
    pub fn pad_rows(self, rows: usize) -> Result<HostTensor<'a>> {
        let Some((&have, trailing)) = self.shape.split_first() else {
            return Err(Error::InvalidArgument("a 0-D tensor has no rows".into()));
        };
        if rows < have {
            return Err(Error::InvalidArgument(format!("padding {have} rows to {rows}")));
        }
        if rows == have {
            return Ok(self);
        }
        let row_bytes = self.row_bytes(trailing.iter().product())?;
        let mut bytes = self.bytes.into_owned();
        bytes.resize(rows * row_bytes, 0);
        Ok(HostTensor { dtype: self.dtype, shape: [&[rows], trailing].concat(), bytes: Cow::Owned(bytes) })
    }

    /// Elements `range` of the last dim of every row, copied: one rank's share of a
    /// row-parallel weight (its input columns).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a 0-D tensor, a range past the last dim, or, for a
    /// quantised dtype, a range that does not start and end on block boundaries.
    pub fn columns(&self, range: Range<usize>) -> Result<HostTensor<'static>> {
        let Some(&cols) = self.shape.last() else {
            return Err(Error::InvalidArgument("a 0-D tensor has no columns".into()));
        };
        let bounds = (self.dtype.bytes_for(range.start), self.dtype.bytes_for(range.end));
        let (Some(start), Some(end)) = bounds else {
            return Err(Error::InvalidArgument(format!(
                "columns {range:?} of a {} tensor do not fall on whole blocks",
                self.dtype
            )));
        };
        if range.start > range.end || range.end > cols {
            return Err(Error::InvalidArgument(format!("columns {range:?} of a tensor of shape {:?}", self.shape)));
        }
        let row_bytes = self.row_bytes(cols)?;
        let bytes: Vec<u8> =
            self.bytes.chunks_exact(row_bytes.max(1)).flat_map(|row| &row[start..end]).copied().collect();
        let mut shape = self.shape.clone();
        *shape.last_mut().expect("checked above") = range.len();
        HostTensor::from_bytes(self.dtype, &shape, Cow::Owned(bytes))
    }

    /// Bytes of one run of `elems` elements.
    fn row_bytes(&self, elems: usize) -> Result<usize> {
        self.dtype.bytes_for(elems).ok_or_else(|| {
            Error::InvalidArgument(format!("rows of {elems} {} elements are not whole blocks", self.dtype))
        })
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
            DType::F8E4M3 => decode(b, &mut out, CHUNK, |c| crate::fp8::e4m3_to_f32_fast(c[0])),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::QuantFormat;

    fn matrix() -> Vec<f32> {
        (0..12).map(|i| i as f32).collect()
    }

    #[test]
    fn row_shares_borrow_the_source_bytes() {
        let bytes = bytemuck::cast_slice::<f32, u8>(&matrix()).to_vec();
        let t = HostTensor::from_bytes(DType::F32, &[3, 4], Cow::Borrowed(&bytes)).unwrap();
        let rows = t.rows(1..3).unwrap();
        assert!(matches!(rows.bytes, Cow::Borrowed(_)), "a row share of a map is not copied");
        assert_eq!(rows.shape(), [2, 4]);
        assert_eq!(rows.to_f32_vec().unwrap(), (4..12).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn column_shares_take_every_rows_slice() {
        let t = HostTensor::from_f32(&matrix(), &[3, 4]);
        let cols = t.columns(1..3).unwrap();
        assert_eq!(cols.shape(), [3, 2]);
        assert_eq!(cols.to_f32_vec().unwrap(), [1.0, 2.0, 5.0, 6.0, 9.0, 10.0]);
        assert!(t.columns(3..5).is_err(), "past the last dim");
    }

    #[test]
    fn padded_rows_are_zero() {
        let t = HostTensor::from_f32(&matrix(), &[3, 4]).rows(2..3).unwrap().pad_rows(3).unwrap();
        assert_eq!(t.shape(), [3, 4]);
        let v = t.to_f32_vec().unwrap();
        assert_eq!(&v[..4], [8.0, 9.0, 10.0, 11.0]);
        assert!(v[4..].iter().all(|&x| x == 0.0));
        assert!(HostTensor::from_f32(&matrix(), &[3, 4]).pad_rows(2).is_err());
    }

    #[test]
    fn quantised_columns_must_fall_on_blocks() {
        let q = DType::Quant(QuantFormat::Q8_0);
        let row = q.bytes_for(64).unwrap();
        let t = HostTensor::from_bytes(q, &[2, 64], Cow::Owned(vec![0; 2 * row])).unwrap();
        assert_eq!(t.columns(32..64).unwrap().shape(), [2, 32]);
        let err = t.columns(16..48).unwrap_err().to_string();
        assert!(err.contains("whole blocks"), "{err}");
        assert!(t.clone().rows(0..1).is_ok());
    }
}
