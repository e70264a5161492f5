//! [`GgufStore`]: a GGUF file seen as the Hugging Face checkpoint it was converted from.
//!
//! Model code asks for `model.layers.3.self_attn.q_proj.weight` with shape
//! `[out, in]`, whatever the file format. At open the store builds one table from HF name
//! to where the bytes are: which GGUF tensor, which expert of a stacked MoE tensor,
//! whether rows or columns must be put back in order (Llama Q/K, see the `permute`
//! module; Qwen3.5's tiled value heads, see `gated_delta`), and whether the converter
//! changed the values (Gemma's and Qwen3-Next's norms hold `1 + w`, a Gated DeltaNet's
//! `A_log` is stored as `-exp(A_log)`; such tensors are served as f32 with the change
//! undone). Names and transformations come from the file's [`GgufArch`], one of those the
//! caller passes. Shapes are the GGUF dims reversed, but where the converter squeezed one.
//!
//! Invariants, checked at open: every mapped name is unique, stacked expert tensors are
//! 3-D, every permuted tensor splits into whole heads and every reordered one has the
//! length its head layout implies, so [`GgufStore::raw`] fails on a store that opened
//! only for a value the converter cannot have written (a non-negative `-exp`). GGUF tensors outside the name mapping stay listed under
//! their GGUF names (so preflight reports them as unexpected), except `rope_freqs.weight`,
//! which the config absorbs. [`WeightStore::host`] borrows the bytes from the map when no
//! permutation is needed, plain types as themselves and block-quantised types as
//! `DType::Quant` blocks (each backend keeps or dequantises them);
//! [`WeightStore::info`] reports the dtype `host` returns.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::collections::btree_map::Entry;
use std::fmt;
use std::path::Path;

use met_config::ConfigJson;
use met_kernels::{DType, HostTensor};

use super::config::{arch_of, config_json};
use super::gated_delta::{self, GdnHeads, Tiling, VHeadOrder};
use super::names::{CONFIG_ONLY, HfTarget, block_of, hf_target};
use super::{GgmlType, GgufArch, GgufFile, dequantize, permute};
use crate::{TensorInfo, WeightError, WeightStore};

/// A GGUF model file, served under Hugging Face tensor names and shapes.
pub struct GgufStore {
    file: GgufFile,
    arch: GgufArch,
    tensors: BTreeMap<String, Source>,
}

/// The still-quantised bytes of one tensor, in Hugging Face layout.
///
/// Rows (the first dimension of `shape`) are contiguous, each a run of whole blocks of
/// `ggml_type`, and already in HF order (Llama Q/K un-permuted, value heads untiled).
#[derive(Debug, Clone)]
pub struct RawTensor<'a> {
    /// The element type of `bytes`.
    pub ggml_type: GgmlType,
    /// The shape, outermost first (HF order).
    pub shape: Vec<usize>,
    /// Little-endian blocks, borrowed from the map unless rows had to be reordered.
    pub bytes: Cow<'a, [u8]>,
}

/// Where the bytes of one HF tensor live in the file, and what the converter did to them.
#[derive(Debug, Clone)]
struct Source {
    /// The GGUF tensor, by index in file order.
    index: usize,
    /// For a stacked expert tensor, the expert: its slice along the outermost dimension.
    expert: Option<usize>,
    /// Rows the converter reordered.
    rows: Option<RowOrder>,
    /// Columns the converter reordered (tiled value heads).
    cols: Option<Tiling>,
    /// Values the converter changed; served as f32 with the change undone.
    values: Option<ValueMap>,
    /// The HF shape.
    shape: Vec<usize>,
}

/// How the converter reordered a tensor's rows.
#[derive(Debug, Clone, Copy)]
enum RowOrder {
    /// Llama's Q/K rotary permutation within each of `heads` heads.
    LlamaQk { heads: usize },
    /// Value heads tiled over the key heads.
    Tiled(Tiling),
}

/// How the converter changed a tensor's values.
#[derive(Debug, Clone, Copy)]
enum ValueMap {
    /// It added this (Gemma's and Qwen3-Next's `1 + w` norms).
    Unshift(f32),
    /// It wrote `-exp(x)` (a Gated DeltaNet's `A_log`).
    NegExp,
}

impl Source {
    /// The type [`GgufStore::raw`] serves for a tensor stored as `stored`: f32 when values
    /// are rebuilt or when columns of a block-quantised type are reordered.
    fn served(&self, stored: GgmlType) -> GgmlType {
        match (self.values, self.cols) {
            (Some(_), _) => GgmlType::F32,
            (None, Some(_)) if stored.block_size() > 1 => GgmlType::F32,
            _ => stored,
        }
    }
}

/// What the file's metadata says about its layout, read once at open.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Query and key/value heads, when Q/K rows are permuted.
    qk_heads: Option<(usize, usize)>,
    /// The Gated DeltaNet head layout, when its value heads are tiled.
    tiled: Option<GdnHeads>,
}

impl GgufStore {
    /// Opens a GGUF file of one of `archs` (met's are `met_model_layers::models::
    /// gguf_architectures()`, which `met_model_layers::models::open_gguf` passes).
    ///
    /// # Errors
    /// As [`GgufFile::open`]; [`WeightError::Metadata`] for an unsupported
    /// `general.architecture` or missing head counts; [`WeightError::Format`] when two
    /// tensors map to one HF name, an expert tensor is not 3-D, or a Q/K projection does
    /// not split into whole heads.
    pub fn open(path: &Path, archs: &[GgufArch]) -> Result<Self, WeightError> {
        Self::from_file(GgufFile::open(path)?, archs)
    }

    /// Wraps an already opened file; see [`GgufStore::open`].
    ///
    /// # Errors
    /// As [`GgufStore::open`], less the parsing errors.
    pub fn from_file(file: GgufFile, archs: &[GgufArch]) -> Result<Self, WeightError> {
        let arch = *arch_of(&file, archs)?;
        let tiled = match arch.gated_delta {
            Some(VHeadOrder::Tiled) => Some(GdnHeads::read(&file, &arch)?),
            _ => None,
        };
        let layout = Layout { qk_heads: qk_heads(&file, &arch)?, tiled };
        let prediction = super::config::first_prediction_block(&file, &arch)?;
        let mut tensors = BTreeMap::new();
        for (index, info) in file.tensors().iter().enumerate() {
            if CONFIG_ONLY.contains(&info.name.as_str()) {
                continue;
            }
            // Multi-token-prediction blocks after the decoder layers are not read.
            if prediction.is_some_and(|first| block_of(&info.name).is_some_and(|b| b >= first)) {
                continue;
            }
            for (name, source) in sources(&file, &arch, index, layout)? {
                match tensors.entry(name) {
                    Entry::Vacant(slot) => {
                        slot.insert(source);
                    }
                    Entry::Occupied(slot) => {
                        let other = &file.tensors()[slot.get().index].name;
                        return Err(format_error(
                            &file,
                            format!("tensors `{other}` and `{}` both map to `{}`", info.name, slot.key()),
                        ));
                    }
                }
            }
        }
        Ok(Self { file, arch, tensors })
    }

    /// The parsed file, for its metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`).
    #[must_use]
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The still-quantised tensor `hf_name` in HF layout, or `None` when the store lacks it.
    /// A tensor whose values the converter changed comes as f32 with the change undone.
    ///
    /// # Errors
    /// [`WeightError::Format`] when a stored `-exp(A_log)` is not negative; the layout is
    /// checked at open, so nothing else fails on a store that opened.
    #[must_use]
    pub fn raw(&self, hf_name: &str) -> Option<Result<RawTensor<'_>, WeightError>> {
        let source = self.tensors.get(hf_name)?;
        Some(self.rebuild(hf_name, source))
    }

    fn rebuild(&self, hf_name: &str, source: &Source) -> Result<RawTensor<'_>, WeightError> {
        let info = &self.file.tensors()[source.index];
        let mut bytes = self.file.data_at(source.index);
        if let Some(e) = source.expert {
            let per_expert = bytes.len() / info.dims[2];
            bytes = &bytes[e * per_expert..(e + 1) * per_expert];
        }
        let served = source.served(info.ggml_type);
        let mut bytes = match source.values.is_some() || served != info.ggml_type {
            true => Cow::Owned(self.to_f32(hf_name, source, info.ggml_type, bytes)?),
            false => Cow::Borrowed(bytes),
        };
        let rows = source.shape.first().copied().unwrap_or(1);
        match source.rows {
            None => {}
            Some(RowOrder::LlamaQk { heads }) => {
                let permuted = permute::unpermute_rows(&bytes, rows, heads);
                bytes = Cow::Owned(permuted.map_err(|msg| format_error(&self.file, format!("`{hf_name}`: {msg}")))?);
            }
            Some(RowOrder::Tiled(t)) => bytes = Cow::Owned(gated_delta::untile_rows(&bytes, rows, t)),
        }
        if let Some(t) = source.cols {
            let cols = source.shape.last().copied().unwrap_or(1);
            bytes = Cow::Owned(gated_delta::untile_cols(&bytes, cols, served.type_size(), t));
        }
        Ok(RawTensor { ggml_type: served, shape: source.shape.clone(), bytes })
    }

    /// The values of `bytes` as f32 little-endian bytes, the converter's change undone.
    fn to_f32(&self, hf_name: &str, source: &Source, stored: GgmlType, bytes: &[u8]) -> Result<Vec<u8>, WeightError> {
        let mut values = vec![0f32; source.shape.iter().product()];
        dequantize(stored, bytes, &mut values);
        match source.values {
            None => {}
            Some(ValueMap::Unshift(shift)) => values.iter_mut().for_each(|v| *v -= shift),
            Some(ValueMap::NegExp) => {
                if let Some(v) = values.iter().find(|v| v.is_nan() || **v >= 0.0) {
                    let msg = format!("`{hf_name}` holds {v}, but llama.cpp stores -exp(A_log), which is negative");
                    return Err(format_error(&self.file, msg));
                }
                values.iter_mut().for_each(|v| *v = (-f64::from(*v)).ln() as f32);
            }
        }
        Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    /// A Hugging Face style `config.json` object built from the file's metadata.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] naming the file and key for a missing or mistyped key;
    /// [`WeightError::Format`] when a `rope_freqs.weight` tensor encodes rotary scaling
    /// met cannot express.
    pub fn config_json(&self) -> Result<serde_json::Value, WeightError> {
        config_json(&self.file, &self.arch)
    }

    /// [`GgufStore::config_json`] parsed as a `config.json` of this file (messages name
    /// the GGUF file), for the architecture's config reader.
    ///
    /// # Errors
    /// As [`GgufStore::config_json`].
    pub fn config(&self) -> Result<ConfigJson, WeightError> {
        Ok(ConfigJson::parse(self.file.path(), &self.config_json()?.to_string())?)
    }

    fn unsupported(&self, name: &str, ggml_type: GgmlType) -> WeightError {
        WeightError::UnsupportedGgmlType {
            path: self.file.path().into(),
            name: name.into(),
            ggml_type: ggml_type.name().into(),
        }
    }
}

impl WeightStore for GgufStore {
    fn describe(&self) -> String {
        format!("GGUF file {}", self.file.path().display())
    }

    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        let source = self.tensors.get(name)?;
        let dtype = host_dtype(source.served(self.file.tensors()[source.index].ggml_type))?;
        Some(TensorInfo { name: name.into(), dtype, shape: source.shape.clone() })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let missing = || WeightError::Missing { name: name.into(), store: self.describe() };
        let source = self.tensors.get(name).ok_or_else(missing)?;
        let ggml_type = source.served(self.file.tensors()[source.index].ggml_type);
        let dtype = host_dtype(ggml_type).ok_or_else(|| self.unsupported(name, ggml_type))?;
        let raw = self.raw(name).ok_or_else(missing)??;
        Ok(HostTensor::from_bytes(dtype, &raw.shape, raw.bytes)?)
    }
}

impl fmt::Debug for GgufStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GgufStore({}, {}, {} tensors)", self.describe(), self.arch.name, self.tensors.len())
    }
}

/// The dtype [`WeightStore::host`] returns for a ggml type, or `None` when it cannot.
fn host_dtype(t: GgmlType) -> Option<DType> {
    match t {
        GgmlType::F32 => Some(DType::F32),
        GgmlType::F16 => Some(DType::F16),
        GgmlType::BF16 => Some(DType::BF16),
        t => t.quant_format().map(DType::Quant),
    }
}

/// Query and key/value head counts, when the architecture's Q/K rows are permuted.
fn qk_heads(file: &GgufFile, arch: &GgufArch) -> Result<Option<(usize, usize)>, WeightError> {
    if !arch.permutes_qk {
        return Ok(None);
    }
    let key = |k: &str| format!("{}.{k}", arch.name);
    let heads = to_usize(file, &key("attention.head_count"), file.get_u64(&key("attention.head_count"))?)?;
    let kv_heads = match file.opt_u64(&key("attention.head_count_kv"))? {
        Some(n) => to_usize(file, &key("attention.head_count_kv"), n)?,
        None => heads,
    };
    Ok(Some((heads, kv_heads)))
}

fn to_usize(file: &GgufFile, key: &str, v: u64) -> Result<usize, WeightError> {
    usize::try_from(v).map_err(|_| file.metadata_error(key, format!("{v} is too large")))
}

/// The HF tensors GGUF tensor number `index` provides, with where their bytes are.
fn sources(
    file: &GgufFile,
    arch: &GgufArch,
    index: usize,
    layout: Layout,
) -> Result<Vec<(String, Source)>, WeightError> {
    let info = &file.tensors()[index];
    let shape = info.shape();
    let plain = |shape: Vec<usize>| Source { index, expert: None, rows: None, cols: None, values: None, shape };
    match hf_target(&info.name, arch.block_names) {
        None => Ok(vec![(info.name.clone(), plain(shape))]),
        Some(HfTarget::Tensor(name)) => {
            let source = tensor_source(file, arch, layout, &name, plain(shape))?;
            Ok(vec![(name, source)])
        }
        Some(HfTarget::Experts { layer, part, suffix }) => {
            // Each expert must hold data, so the expert count is bounded by the file size.
            let &[experts, rows, cols] = shape.as_slice() else {
                let msg = format!("`{}` has dims {:?}; stacked experts are 3-D", info.name, info.dims);
                return Err(format_error(file, msg));
            };
            if rows * cols == 0 {
                let msg = format!("`{}` has dims {:?}; its experts hold no data", info.name, info.dims);
                return Err(format_error(file, msg));
            }
            Ok((0..experts)
                .map(|e| {
                    let name = HfTarget::expert_name(layer, e, part, &suffix);
                    (name, Source { expert: Some(e), ..plain(vec![rows, cols]) })
                })
                .collect())
        }
    }
}

/// `s`, the whole GGUF tensor behind HF tensor `name`, with what the converter did to it.
fn tensor_source(
    file: &GgufFile,
    arch: &GgufArch,
    layout: Layout,
    name: &str,
    mut s: Source,
) -> Result<Source, WeightError> {
    let info = &file.tensors()[s.index];
    let fail = |msg: String| format_error(file, format!("`{}`: {msg}", info.name));
    let heads = match layout.qk_heads {
        Some((q, _)) if name.contains(".self_attn.q_proj.") => Some(q),
        Some((_, kv)) if name.contains(".self_attn.k_proj.") => Some(kv),
        _ => None,
    };
    if let Some(h) = heads {
        match s.shape.first() {
            Some(&rows) => permute::check(rows, h).map_err(fail)?,
            None => return Err(fail("it has no rows to un-permute".into())),
        }
        s.rows = Some(RowOrder::LlamaQk { heads: h });
    }
    let gdn = arch.gated_delta.map(|_| gated_delta::undo(name, layout.tiled)).unwrap_or_default();
    let kept = arch.gated_delta.is_some() && gated_delta::keeps_norm(name);
    if arch.norm_shift != 0.0 && name.ends_with("norm.weight") && !kept {
        s.values = Some(ValueMap::Unshift(arch.norm_shift));
    }
    if gdn.neg_exp {
        s.values = Some(ValueMap::NegExp);
    }
    if gdn.unsqueeze {
        let &[c, k] = s.shape.as_slice() else { return Err(fail(format!("dims {:?}; expected 2-D", info.dims))) };
        s.shape = vec![c, 1, k];
    }
    if let Some(t) = gdn.rows {
        if s.shape.first() != Some(&t.len()) {
            return Err(fail(format!("dims {:?}; its value heads need {} rows", info.dims, t.len())));
        }
        s.rows = Some(RowOrder::Tiled(t));
    }
    if let Some(t) = gdn.cols {
        if s.shape.last() != Some(&t.len()) {
            return Err(fail(format!("dims {:?}; its value heads need {} columns", info.dims, t.len())));
        }
        s.cols = Some(t);
    }
    if s.served(info.ggml_type) != info.ggml_type && !info.ggml_type.is_dequantizable() {
        return Err(fail(format!("stored as {}, which met cannot convert to f32", info.ggml_type)));
    }
    Ok(s)
}

fn format_error(file: &GgufFile, msg: String) -> WeightError {
    WeightError::Format { path: file.path().into(), msg }
}
