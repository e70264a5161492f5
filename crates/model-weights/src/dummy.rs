//! Seeded random weights: a model's full tensor set without a checkpoint.
//!
//! Used for tests, benchmarks and `--load-format dummy`. Values are scaled so a forward
//! pass behaves like a trained model's in magnitude: norm weights are ones, biases small,
//! and matrices uniform in `±sqrt(3 / fan_in)` so a product keeps unit variance.
//!
//! Invariant: element `i` of tensor `name` is a pure function of `(seed, name, i)` through
//! a counter-based generator ([`met_kernels::rng::weight_uniform`] over the tensor's
//! stream key), so tensors are generated in parallel, on demand, in any order, and
//! identically on every run and machine. Nothing is cached: each [`WeightStore::host`] call
//! regenerates the tensor. Uniform tensors are also offered as [`UniformRun`]s, which a GPU
//! backend generates in place, with no host memory or copies; the values are the same.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use half::{bf16, f16};
use met_kernels::rng::{mix64, weight_uniform};
use met_kernels::{DType, HostTensor, UniformRun};
use rayon::prelude::*;

use crate::{TensorInfo, TensorSpec, WeightError, WeightStore};

/// Half-width of the uniform range of 1-D tensors other than norm weights (biases).
const BIAS_RANGE: f32 = 0.02;

/// Elements generated per rayon task.
const CHUNK: usize = 1 << 14;

/// Random weights for a fixed set of tensor specs.
pub struct DummyStore {
    specs: BTreeMap<String, Vec<usize>>,
    seed: u64,
    dtype: DType,
}

impl DummyStore {
    /// Seeded random weights for exactly the given specs, produced in `dtype`
    /// (F32, F16 or BF16). Values: tensors whose name ends with `norm.weight` (1-D) are
    /// all 1.0; other 1-D tensors (biases, and 0-D ones) uniform in ±0.02; 2-D and higher
    /// weights uniform in ±sqrt(3 / fan_in) where fan_in is the last dim (so activations
    /// keep unit scale). Bounds hold up to rounding to `dtype`.
    /// Element i of tensor `name` is a pure function of (seed, name, i): generation is
    /// parallel (rayon) and reproducible.
    ///
    /// # Panics
    /// If `dtype` is not a float type. A spec listed twice keeps its last shape.
    #[must_use]
    pub fn new(specs: Vec<TensorSpec>, seed: u64, dtype: DType) -> Self {
        assert!(dtype.is_float(), "dummy weights are floats, not {dtype}");
        let specs = specs.into_iter().map(|s| (s.name, s.shape)).collect();
        Self { specs, seed, dtype }
    }
}

impl WeightStore for DummyStore {
    fn describe(&self) -> String {
        format!("dummy {} weights (seed {}, {} tensors)", self.dtype, self.seed, self.specs.len())
    }

    fn names(&self) -> Vec<String> {
        self.specs.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let shape = self.specs.get(name)?;
        Some(TensorInfo { name: name.to_string(), dtype: self.dtype, shape: shape.clone() })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let shape = self
            .specs
            .get(name)
            .ok_or_else(|| WeightError::Missing { name: name.to_string(), store: self.describe() })?;
        let bytes = generate(name, shape, self.seed, self.dtype);
        Ok(HostTensor::from_bytes(self.dtype, shape, Cow::Owned(bytes))?)
    }

    fn uniform_run(&self, name: &str) -> Option<UniformRun> {
        let shape = self.specs.get(name)?;
        match fill_for(name, shape) {
            Fill::Ones => None,
            Fill::Uniform(bound) => {
                Some(UniformRun { len: shape.iter().product(), key: stream_key(self.seed, name), bound })
            }
        }
    }
}

impl fmt::Debug for DummyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// How the values of one tensor are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fill {
    Ones,
    Uniform(f32),
}

/// The documented value rule for a tensor of this name and shape.
fn fill_for(name: &str, shape: &[usize]) -> Fill {
    match shape {
        [_] if name.ends_with("norm.weight") => Fill::Ones,
        [] | [_] => Fill::Uniform(BIAS_RANGE),
        [.., fan_in] => Fill::Uniform((3.0 / (*fan_in).max(1) as f32).sqrt()),
    }
}

/// The little-endian bytes of tensor `name` in `dtype`.
fn generate(name: &str, shape: &[usize], seed: u64, dtype: DType) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let width = dtype.size_in_bytes();
    let fill = fill_for(name, shape);
    let key = stream_key(seed, name);
    let mut bytes = vec![0u8; n * width];
    bytes.par_chunks_mut(CHUNK * width).enumerate().for_each(|(c, out)| {
        for (j, slot) in out.chunks_exact_mut(width).enumerate() {
            let value = match fill {
                Fill::Ones => 1.0,
                Fill::Uniform(bound) => bound * weight_uniform(key, (c * CHUNK + j) as u64),
            };
            encode(value, dtype, slot);
        }
    });
    bytes
}

/// Writes one value into `slot` as little-endian `dtype`.
fn encode(value: f32, dtype: DType, slot: &mut [u8]) {
    match dtype {
        DType::F16 => slot.copy_from_slice(&f16::from_f32(value).to_le_bytes()),
        DType::BF16 => slot.copy_from_slice(&bf16::from_f32(value).to_le_bytes()),
        DType::F32 | DType::U32 => slot.copy_from_slice(&value.to_le_bytes()),
        DType::F8E4M3 => slot[0] = met_kernels::fp8::e4m3_from_f32(value),
        DType::Quant(q) => unreachable!("DummyStore::new refuses {q}"),
    }
}

/// The key of tensor `name`'s stream of [`met_kernels::rng::weight_uniform`] draws: the
/// seed mixed with the FNV-1a hash of the name. Draw `i` is a hash of (key, i), so draws
/// need no state and can be made in any order, on the host or on a device.
fn stream_key(seed: u64, name: &str) -> u64 {
    mix64(seed ^ mix64(fnv1a(name.as_bytes())))
}

/// 64-bit FNV-1a of `bytes`.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xCBF2_9CE4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01B3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_lie_in_range_with_the_right_moments() {
        let key = stream_key(7, "model.layers.0.mlp.up_proj.weight");
        let n = 200_000;
        let draws: Vec<f32> = (0..n).map(|i| (weight_uniform(key, i) + 1.0) / 2.0).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().map(|&u| f64::from(u)).sum::<f64>() / n as f64;
        let var = draws.iter().map(|&u| (f64::from(u) - mean).powi(2)).sum::<f64>() / n as f64;
        // Standard error of the mean is sqrt(1/12 / n) ≈ 0.00065; allow ~8 of them.
        assert!((mean - 0.5).abs() < 0.005, "mean {mean}");
        assert!((var - 1.0 / 12.0).abs() < 0.003, "variance {var}");
        // Each tenth of the interval gets about a tenth of the draws.
        let mut bins = [0usize; 10];
        for &u in &draws {
            bins[(u * 10.0) as usize] += 1;
        }
        assert!(bins.iter().all(|&b| b.abs_diff(n as usize / 10) < 1_000), "{bins:?}");
    }

    #[test]
    fn streams_differ_by_seed_and_name() {
        let (a, b, c) = (stream_key(1, "w"), stream_key(2, "w"), stream_key(1, "v"));
        let first = |key: u64| (0..8).map(|i| weight_uniform(key, i)).collect::<Vec<_>>();
        assert_ne!(first(a), first(b));
        assert_ne!(first(a), first(c));
        assert_eq!(first(a), first(stream_key(1, "w")));
    }

    #[test]
    fn fill_follows_the_documented_rule() {
        assert_eq!(fill_for("model.norm.weight", &[8]), Fill::Ones);
        assert_eq!(fill_for("model.layers.0.input_layernorm.weight", &[8]), Fill::Ones);
        assert_eq!(fill_for("q_proj.bias", &[8]), Fill::Uniform(BIAS_RANGE));
        assert_eq!(fill_for("x.norm.weight", &[2, 3]), Fill::Uniform(1.0));
        assert_eq!(fill_for("experts", &[4, 5, 12]), Fill::Uniform(0.5));
    }
}
