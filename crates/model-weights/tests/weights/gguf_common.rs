//! Writing small GGUF files byte by byte, and reading the committed GGUF fixtures.
//!
//! The writer is deliberately independent of the reader under test: it lays out the
//! format from the spec (header, metadata, tensor infos, padding, data) and lets tests
//! override any field (version, offsets, type ids) to build malformed files.

use std::path::{Path, PathBuf};

use half::f16;
use met_model_weights::GgmlType;

/// GGUF metadata value type ids.
pub const T_U32: u32 = 4;
pub const T_F32: u32 = 6;
pub const T_BOOL: u32 = 7;
pub const T_STRING: u32 = 8;
pub const T_ARRAY: u32 = 9;
pub const T_U64: u32 = 10;

/// A GGUF file under construction.
#[derive(Clone)]
pub struct Gguf {
    pub version: u32,
    pub alignment: u64,
    kvs: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<TensorEntry>,
}

#[derive(Clone)]
struct TensorEntry {
    name: String,
    dims: Vec<u64>,
    type_id: u32,
    /// `None`: placed after the previous tensor, aligned.
    offset: Option<u64>,
    data: Vec<u8>,
}

pub fn string_bytes(s: &str) -> Vec<u8> {
    let mut out = (s.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(s.as_bytes());
    out
}

impl Gguf {
    pub fn new() -> Self {
        Self { version: 3, alignment: 32, kvs: Vec::new(), tensors: Vec::new() }
    }

    /// A metadata entry with a raw value encoding.
    pub fn kv_raw(mut self, key: &str, type_id: u32, value: Vec<u8>) -> Self {
        self.kvs.push((key.into(), type_id, value));
        self
    }

    /// Drops the metadata entry `key` (to replace it with another value).
    pub fn without(mut self, key: &str) -> Self {
        self.kvs.retain(|(k, _, _)| k != key);
        self
    }

    pub fn u32(self, key: &str, v: u32) -> Self {
        self.kv_raw(key, T_U32, v.to_le_bytes().to_vec())
    }

    pub fn u64(self, key: &str, v: u64) -> Self {
        self.kv_raw(key, T_U64, v.to_le_bytes().to_vec())
    }

    pub fn f32(self, key: &str, v: f32) -> Self {
        self.kv_raw(key, T_F32, v.to_le_bytes().to_vec())
    }

    pub fn bool(self, key: &str, v: bool) -> Self {
        self.kv_raw(key, T_BOOL, vec![u8::from(v)])
    }

    pub fn str(self, key: &str, v: &str) -> Self {
        self.kv_raw(key, T_STRING, string_bytes(v))
    }

    pub fn strs(self, key: &str, items: &[&str]) -> Self {
        let mut v = T_STRING.to_le_bytes().to_vec();
        v.extend((items.len() as u64).to_le_bytes());
        for s in items {
            v.extend(string_bytes(s));
        }
        self.kv_raw(key, T_ARRAY, v)
    }

    /// Sets `general.alignment` and lays the data out with it.
    pub fn aligned(mut self, alignment: u32) -> Self {
        self.alignment = alignment.into();
        self.u32("general.alignment", alignment)
    }

    /// A tensor with GGUF dims (innermost first) and raw data.
    pub fn tensor_raw(mut self, name: &str, dims: &[u64], type_id: u32, offset: Option<u64>, data: Vec<u8>) -> Self {
        self.tensors.push(TensorEntry { name: name.into(), dims: dims.to_vec(), type_id, offset, data });
        self
    }

    /// A tensor of `ggml_type` with an HF (outermost-first) shape.
    pub fn tensor(self, name: &str, hf_shape: &[usize], ggml_type: GgmlType, data: Vec<u8>) -> Self {
        let dims: Vec<u64> = hf_shape.iter().rev().map(|&d| d as u64).collect();
        self.tensor_raw(name, &dims, ggml_type.id(), None, data)
    }

    pub fn f32_tensor(self, name: &str, hf_shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(values.len(), hf_shape.iter().product::<usize>());
        self.tensor(name, hf_shape, GgmlType::F32, values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    pub fn f16_tensor(self, name: &str, hf_shape: &[usize], values: &[f32]) -> Self {
        assert_eq!(values.len(), hf_shape.iter().product::<usize>());
        let bytes = values.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect();
        self.tensor(name, hf_shape, GgmlType::F16, bytes)
    }

    /// The file's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (key, type_id, value) in &self.kvs {
            out.extend(string_bytes(key));
            out.extend(type_id.to_le_bytes());
            out.extend(value);
        }
        let mut next = 0u64;
        let mut placed = Vec::new();
        for t in &self.tensors {
            let offset = t.offset.unwrap_or(next);
            next = (offset + t.data.len() as u64).next_multiple_of(self.alignment);
            placed.push(offset);
            out.extend(string_bytes(&t.name));
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.type_id.to_le_bytes());
            out.extend(offset.to_le_bytes());
        }
        let data_start = (out.len() as u64).next_multiple_of(self.alignment) as usize;
        out.resize(data_start, 0);
        for (t, offset) in self.tensors.iter().zip(placed) {
            let at = data_start + offset as usize;
            if out.len() < at + t.data.len() {
                out.resize(at + t.data.len(), 0);
            }
            out[at..at + t.data.len()].copy_from_slice(&t.data);
        }
        out
    }
}

/// Q8_0 blocks with scale `d` and the given quants (a multiple of 32 of them).
pub fn q8_0(d: f32, quants: &[i8]) -> Vec<u8> {
    assert_eq!(quants.len() % 32, 0);
    quants
        .chunks(32)
        .flat_map(|qs| {
            let mut block = f16::from_f32(d).to_le_bytes().to_vec();
            block.extend(qs.iter().map(|q| q.cast_unsigned()));
            block
        })
        .collect()
}

/// The committed fixtures of this crate's GGUF tests.
pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf").join(rel)
}

/// Little-endian f32 values of a raw `.f32` fixture.
pub fn read_f32s(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// `GgufStore::open` of bytes written to a fresh temp dir.
pub fn temp_file(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}
