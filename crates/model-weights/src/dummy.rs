//! Seeded random weights: a model's full tensor set without a checkpoint.
//!
//! Used for tests, benchmarks and `--load-format dummy`. Values are scaled so a forward
//! pass behaves like a trained model's in magnitude: norm weights are ones, biases small,
//! and matrices uniform in `±sqrt(3 / fan_in)` so a product keeps unit variance. Under a
//! quantized config ([`DummyStore::quantized`]) the weights a real checkpoint of that
//! format stores as float8 e4m3 are stored so too, beside their scales, and read through
//! the same [`crate::Fp8View`] as a real checkpoint's (the rule is in [`quantized`]).
//!
//! Invariant: element `i` of tensor `name` is a pure function of `(seed, name, i)` through
//! a counter-based generator ([`met_kernels::rng::weight_uniform`] over the tensor's
//! stream key), so tensors are generated in parallel, on demand, in any order, and
//! identically on every run and machine. Nothing is cached: each [`WeightStore::host`] (or
//! [`WeightStore::float8`]) call regenerates the tensor, so the store holds no weights.
//! Uniform float tensors are also offered as [`UniformRun`]s, which a GPU backend
//! generates in place, with no host memory or copies; the values are the same. Float8
//! weights and their scales have no run: they go through the host and the view.

mod gguf_blocks;
mod quantized;

pub use gguf_blocks::GgufRecipe;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use half::{bf16, f16};
use met_config::{QuantConfig, ScaleLayout};
use met_kernels::fp8::E4M3_MAX;
use met_kernels::rng::{mix64, weight_uniform};
use met_kernels::{DType, HostTensor, UniformRun};
use rayon::prelude::*;

use crate::{TensorInfo, TensorSpec, WeightError, WeightStore};

/// Half-width of the uniform range of 1-D tensors other than norm weights (biases).
const BIAS_RANGE: f32 = 0.02;

/// Mixed into a weight's stream key for the factors of its scale cells.
const SCALE_STREAM: u64 = 0x5CA1_E5CA_1E5C_A1E5;

/// Elements generated per rayon task.
const CHUNK: usize = 1 << 14;

/// Random weights for a fixed set of tensor specs.
pub struct DummyStore {
    tensors: BTreeMap<String, Dummy>,
    seed: u64,
    dtype: DType,
    /// The quantization imitated, in words (`None` for float weights).
    quantization: Option<String>,
}

/// One listed tensor.
struct Dummy {
    shape: Vec<usize>,
    kind: Kind,
}

/// What a listed tensor holds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// The documented draws ([`fill_for`]) in the store's float dtype.
    Float,
    /// The same draws stored as float8 e4m3 codes under scales that differ from cell to
    /// cell of the checkpoint's scale grid: under its cell's scale the weight is the float
    /// draw rounded to e4m3.
    Float8(Cells),
    /// A float8 weight's scales, one a cell: bound / [`E4M3_MAX`] times the cell's factor.
    Scales(Cells),
    /// F32, every element this value: a static input scale.
    Constant(f32),
    /// The blocks of a GGUF file in this format ([`DummyStore::gguf_blocks`]).
    Blocks(met_kernels::quant::QuantFormat),
}

/// The scale grid of a dummy float8 weight: cells of `rows` x `cols` elements, `grid_cols`
/// cells a row of cells, each with a factor in [1, 1.75] drawn from `key` (so that per-row
/// and block scales really differ between rows and blocks, as a checkpoint's do).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cells {
    rows: usize,
    cols: usize,
    grid_cols: usize,
    key: u64,
    /// The weight's bound over [`E4M3_MAX`]: the scale of a cell of factor 1.
    base: f32,
}

impl Cells {
    /// The factor of cell `c`: 448 / t for t one of the e4m3 values from 256 to 448, so the
    /// cell's largest code, t, dequantizes to the bound exactly and no draw rounds past it.
    fn factor(&self, c: usize) -> f32 {
        const TOPS: [f32; 7] = [256.0, 288.0, 320.0, 352.0, 384.0, 416.0, 448.0];
        E4M3_MAX / TOPS[(mix64(self.key ^ c as u64) % TOPS.len() as u64) as usize]
    }

    /// The cell of element `e` of a `[_, k]` weight.
    #[cfg(test)]
    fn of(&self, e: usize, k: usize) -> usize {
        (e / k / self.rows) * self.grid_cols + (e % k) / self.cols
    }
}

/// The e4m3 codes of a `[len / k, k]` dummy float8 weight: element e is the draw
/// `weight_uniform(key, e)` times [`E4M3_MAX`] over its cell's factor, rounded to e4m3. Made
/// row by row with each cell's factor once for its run of columns (the index arithmetic of
/// [`Cells::of`] per element cost more than the draws).
fn float8_codes(cells: &Cells, key: u64, len: usize, k: usize) -> Vec<u8> {
    let mut codes = vec![0u8; len];
    codes.par_chunks_mut(k).enumerate().for_each(|(i, row)| {
        for (j, run) in row.chunks_mut(cells.cols).enumerate() {
            let factor = cells.factor((i / cells.rows) * cells.grid_cols + j);
            let first = i * k + j * cells.cols;
            for (l, code) in run.iter_mut().enumerate() {
                let value = E4M3_MAX * weight_uniform(key, (first + l) as u64) / factor;
                *code = met_kernels::fp8::e4m3_from_f32(value);
            }
        }
    });
    codes
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
        let tensors = specs.into_iter().map(|s| (s.name, Dummy { shape: s.shape, kind: Kind::Float })).collect();
        Self { tensors, seed, dtype, quantization: None }
    }

    /// The store as a checkpoint quantized by `quant` holds it: each weight such a
    /// checkpoint stores as float8 (the linear layers' weights inside the decoder layers,
    /// less the MoE routers and what `quant` leaves unquantized) becomes float8
    /// e4m3 codes ([`WeightStore::float8`]) beside its scales, named and shaped as the
    /// format stores them, and the static input scale where `quant` has one. Dequantized
    /// (through [`crate::Fp8View`]) a weight is the float store's, rounded to e4m3, so
    /// it keeps the bound ±sqrt(3 / fan_in). Every other tensor is unchanged.
    /// `text_prefix`: where the checkpoint keeps the text model, when not under `model.`
    /// (a vision-language one's `model.language_model.`, `ModelConfig::text_prefix`), which
    /// its unquantized list names modules under.
    #[must_use]
    pub fn quantized(mut self, quant: &QuantConfig, text_prefix: Option<&str>) -> Self {
        let scheme = quantized::Scheme::new(quant, text_prefix);
        let weights: Vec<(String, Vec<usize>)> = self
            .tensors
            .iter()
            .filter(|(name, t)| t.kind == Kind::Float && scheme.quantizes(name, &t.shape))
            .map(|(name, t)| (name.clone(), t.shape.clone()))
            .collect();
        for (name, shape) in weights {
            let Fill::Uniform(bound) = fill_for(&name, &shape) else { continue };
            let (n, k) = (shape[0], shape[1]);
            let (rows, cols) = match quant.scales {
                Some(ScaleLayout::Block(rows, cols)) => (rows, cols),
                Some(ScaleLayout::Channel) => (1, k),
                Some(ScaleLayout::Tensor) | None => (n, k),
            };
            let cells = Cells {
                rows: rows.max(1),
                cols: cols.max(1),
                grid_cols: k.div_ceil(cols.max(1)),
                key: mix64(stream_key(self.seed, &name) ^ SCALE_STREAM),
                base: bound / E4M3_MAX,
            };
            for (i, (companion, shape, value)) in scheme.companions(&name, &shape, cells.base).into_iter().enumerate() {
                // The first companion is the weight's scale; any other a static input scale.
                let kind = if i == 0 { Kind::Scales(cells) } else { Kind::Constant(value) };
                self.tensors.insert(companion, Dummy { shape, kind });
            }
            if let Some(weight) = self.tensors.get_mut(&name) {
                weight.kind = Kind::Float8(cells);
            }
        }
        self.quantization = Some(scheme.describe());
        self
    }

    /// The store as a GGUF file quantized by `recipe` holds it: the projections of the
    /// decoder layers, the embedding and the head in the recipe's block formats (see
    /// [`GgufRecipe`]; rows of whole blocks only), every other tensor unchanged. A block's
    /// values are random within the float weight's bound.
    #[must_use]
    pub fn gguf_blocks(mut self, recipe: GgufRecipe) -> Self {
        for (name, t) in &mut self.tensors {
            if let (Kind::Float, Some(format)) = (t.kind, recipe.format(name, &t.shape)) {
                t.kind = Kind::Blocks(format);
            }
        }
        self.quantization = Some(recipe.describe().to_string());
        self
    }

    /// The listed tensor `name`, or the error that names it.
    fn get(&self, name: &str) -> Result<&Dummy, WeightError> {
        self.tensors.get(name).ok_or_else(|| WeightError::Missing { name: name.to_string(), store: self.describe() })
    }
}

impl WeightStore for DummyStore {
    fn describe(&self) -> String {
        let made = format!("seed {}, {} tensors", self.seed, self.tensors.len());
        match &self.quantization {
            None => format!("dummy {} weights ({made})", self.dtype),
            Some(q) => {
                let float8 = self.tensors.values().filter(|t| matches!(t.kind, Kind::Float8(_))).count();
                let blocks = self.tensors.values().filter(|t| matches!(t.kind, Kind::Blocks(_))).count();
                if blocks > 0 {
                    format!("dummy {q} weights: {blocks} in GGUF blocks, the rest {} ({made})", self.dtype)
                } else {
                    format!(
                        "dummy {q} weights: {float8} float8 e4m3 beside their scales, the rest {} ({made})",
                        self.dtype
                    )
                }
            }
        }
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let t = self.tensors.get(name)?;
        let dtype = match t.kind {
            Kind::Float => self.dtype,
            // As a checkpoint's: listed, read through `float8`, not loadable as it is.
            Kind::Float8(_) => return None,
            Kind::Scales(_) | Kind::Constant(_) => DType::F32,
            Kind::Blocks(format) => DType::Quant(format),
        };
        Some(TensorInfo { name: name.to_string(), dtype, shape: t.shape.clone() })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let t = self.get(name)?;
        match t.kind {
            Kind::Float => {
                let bytes = generate(stream_key(self.seed, name), &t.shape, fill_for(name, &t.shape), self.dtype);
                Ok(HostTensor::from_bytes(self.dtype, &t.shape, Cow::Owned(bytes))?)
            }
            Kind::Float8(_) => Err(WeightError::UnsupportedDtype { name: name.to_string(), dtype: "F8_E4M3".into() }),
            Kind::Scales(cells) => {
                let values: Vec<f32> = (0..t.shape.iter().product()).map(|c| cells.base * cells.factor(c)).collect();
                Ok(HostTensor::from_f32(&values, &t.shape))
            }
            Kind::Constant(value) => Ok(HostTensor::from_f32(&vec![value; t.shape.iter().product()], &t.shape)),
            Kind::Blocks(format) => {
                let Fill::Uniform(bound) = fill_for(name, &t.shape) else { unreachable!("blocks are 2-D weights") };
                let bytes = gguf_blocks::blocks(format, t.shape[0], t.shape[1], bound, stream_key(self.seed, name));
                Ok(HostTensor::from_bytes(DType::Quant(format), &t.shape, bytes)?)
            }
        }
    }

    fn uniform_run(&self, name: &str) -> Option<UniformRun> {
        let t = self.tensors.get(name).filter(|t| t.kind == Kind::Float)?;
        match fill_for(name, &t.shape) {
            Fill::Ones => None,
            Fill::Uniform(bound) => {
                Some(UniformRun { len: t.shape.iter().product(), key: stream_key(self.seed, name), bound })
            }
        }
    }

    fn float8_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensors.get(name).filter(|t| matches!(t.kind, Kind::Float8(_))).map(|t| t.shape.clone())
    }

    fn float8(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        let t = self.tensors.get(name)?;
        let Kind::Float8(cells) = t.kind else { return None };
        let (key, k) = (stream_key(self.seed, name), t.shape[1].max(1));
        let codes = float8_codes(&cells, key, t.shape.iter().product(), k);
        Some(Cow::Owned(codes))
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

/// The little-endian bytes in `dtype` of a tensor of `shape` filled by `fill` from the
/// stream `key`.
fn generate(key: u64, shape: &[usize], fill: Fill, dtype: DType) -> Vec<u8> {
    let n: usize = shape.iter().product();
    let width = dtype.size_in_bytes();
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

    #[test]
    fn float8_codes_follow_each_elements_cell() {
        // Blocks that end mid-row and mid-column, rows of one cell, one cell for the tensor.
        for (n, k, rows, cols) in
            [(300usize, 200usize, 128usize, 128usize), (7, 96, 1, 96), (20, 50, 20, 50), (33, 130, 16, 32)]
        {
            let cells = Cells { rows, cols, grid_cols: k.div_ceil(cols), key: 99, base: 0.01 };
            let key = stream_key(5, "w");
            let want: Vec<u8> = (0..n * k)
                .map(|e| {
                    let value = E4M3_MAX * weight_uniform(key, e as u64) / cells.factor(cells.of(e, k));
                    met_kernels::fp8::e4m3_from_f32(value)
                })
                .collect();
            assert_eq!(float8_codes(&cells, key, n * k, k), want, "{n} x {k} in cells of {rows} x {cols}");
        }
    }
}
