//! Writing small safetensors fixtures.

use std::path::Path;

use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};

/// One tensor to write: name, stored dtype, shape, little-endian bytes.
pub struct Fixture {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl Fixture {
    pub fn f32(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Self::raw(name, Dtype::F32, shape, bytes)
    }

    pub fn f16(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
        Self::raw(name, Dtype::F16, shape, bytes)
    }

    pub fn bf16(name: &str, shape: &[usize], values: &[f32]) -> Self {
        let bytes = values.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect();
        Self::raw(name, Dtype::BF16, shape, bytes)
    }

    pub fn raw(name: &str, dtype: Dtype, shape: &[usize], bytes: Vec<u8>) -> Self {
        Self { name: name.into(), dtype, shape: shape.to_vec(), bytes }
    }
}

/// Writes `tensors` as one safetensors file at `path`.
pub fn write(path: &Path, tensors: &[Fixture]) {
    let views = tensors.iter().map(|t| {
        let view = TensorView::new(t.dtype, t.shape.clone(), &t.bytes).expect("fixture view");
        (t.name.clone(), view)
    });
    safetensors::serialize_to_file(views, None, path).expect("write fixture");
}

/// The bytes of a safetensors file with this header text (padded to 8 bytes) and data.
pub fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.as_bytes().to_vec();
    header.resize(header.len().next_multiple_of(8), b' ');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend(data);
    out
}

/// Values that f16 and bf16 both represent exactly.
pub fn exact_values(n: usize) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - 3.0) * 0.25).collect()
}
