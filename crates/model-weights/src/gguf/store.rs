//! [`GgufStore`]: a GGUF file seen as the Hugging Face checkpoint it was converted from.
//!
//! Model code asks for `model.layers.3.self_attn.q_proj.weight` with shape
//! `[out, in]`, whatever the file format. At open the store builds one table from HF name
//! to where the bytes are: which GGUF tensor, which expert of a stacked MoE tensor,
//! whether the rows must be un-permuted (Llama Q/K, see the `permute` module), and whether
//! the converter shifted the values (Gemma's norms hold `1 + w`; they are served as f32
//! with the shift taken off). Names and transformations come from the file's
//! [`GgufArch`], one of those the caller passes. Shapes are the GGUF dims reversed.
//!
//! Invariants, checked at open: every mapped name is unique, stacked expert tensors are
//! 3-D, and every permuted tensor splits into whole heads, so [`GgufStore::raw`] cannot
//! fail on a store that opened. GGUF tensors outside the name mapping stay listed under
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
use super::names::{CONFIG_ONLY, HfTarget, hf_target};
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
/// `ggml_type`, and already in HF order (Llama Q/K un-permuted).
#[derive(Debug, Clone)]
pub struct RawTensor<'a> {
    /// The element type of `bytes`.
    pub ggml_type: GgmlType,
    /// The shape, outermost first (HF order).
    pub shape: Vec<usize>,
    /// Little-endian blocks, borrowed from the map unless rows had to be reordered.
    pub bytes: Cow<'a, [u8]>,
}

/// Where the bytes of one HF tensor live in the file.
#[derive(Debug, Clone)]
struct Source {
    /// The GGUF tensor, by index in file order.
    index: usize,
    /// For a stacked expert tensor, the expert: its slice along the outermost dimension.
    expert: Option<usize>,
    /// For a Llama Q/K projection, the heads whose rows the converter permuted.
    unpermute_heads: Option<usize>,
    /// For a norm weight the converter shifted (Gemma's `1 + w`), the shift to take off.
    unshift: Option<f32>,
    /// The HF shape.
    shape: Vec<usize>,
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
        let heads = qk_heads(&file, &arch)?;
        let mut tensors = BTreeMap::new();
        for (index, info) in file.tensors().iter().enumerate() {
            if CONFIG_ONLY.contains(&info.name.as_str()) {
                continue;
            }
            for (name, source) in sources(&file, &arch, index, heads)? {
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
    ///
    /// # Errors
    /// [`WeightError::Format`] if a Q/K projection's rows cannot be un-permuted; the store
    /// checks this at open, so a store that opened does not produce it.
    #[must_use]
    pub fn raw(&self, hf_name: &str) -> Option<Result<RawTensor<'_>, WeightError>> {
        let source = self.tensors.get(hf_name)?;
        let info = &self.file.tensors()[source.index];
        let mut bytes = self.file.data_at(source.index);
        if let Some(e) = source.expert {
            let per_expert = bytes.len() / info.dims[2];
            bytes = &bytes[e * per_expert..(e + 1) * per_expert];
        }
        if let Some(shift) = source.unshift {
            // Served as f32, the converter's shift taken off (the checkpoint's values).
            let mut values = vec![0f32; source.shape.iter().product()];
            dequantize(info.ggml_type, bytes, &mut values);
            let bytes = values.iter().flat_map(|v| (v - shift).to_le_bytes()).collect();
            return Some(Ok(RawTensor {
                ggml_type: GgmlType::F32,
                shape: source.shape.clone(),
                bytes: Cow::Owned(bytes),
            }));
        }
        let bytes = match source.unpermute_heads {
            None => Cow::Borrowed(bytes),
            Some(heads) => match permute::unpermute_rows(bytes, source.shape[0], heads) {
                Ok(rows) => Cow::Owned(rows),
                Err(msg) => return Some(Err(format_error(&self.file, format!("`{hf_name}`: {msg}")))),
            },
        };
        Some(Ok(RawTensor { ggml_type: info.ggml_type, shape: source.shape.clone(), bytes }))
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
        let dtype = host_dtype(self.file.tensors()[source.index].ggml_type)?;
        Some(TensorInfo { name: name.into(), dtype, shape: source.shape.clone() })
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let missing = || WeightError::Missing { name: name.into(), store: self.describe() };
        let source = self.tensors.get(name).ok_or_else(missing)?;
        let ggml_type = self.file.tensors()[source.index].ggml_type;
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
    qk_heads: Option<(usize, usize)>,
) -> Result<Vec<(String, Source)>, WeightError> {
    let info = &file.tensors()[index];
    let shape = info.shape();
    let plain = |shape: Vec<usize>| Source { index, expert: None, unpermute_heads: None, unshift: None, shape };
    match hf_target(&info.name, arch.block_names) {
        None => Ok(vec![(info.name.clone(), plain(shape))]),
        Some(HfTarget::Tensor(name)) => {
            let heads = match qk_heads {
                Some((q, _)) if name.contains(".self_attn.q_proj.") => Some(q),
                Some((_, kv)) if name.contains(".self_attn.k_proj.") => Some(kv),
                _ => None,
            };
            if let Some(h) = heads {
                let checked = match shape.first() {
                    Some(&rows) => permute::check(rows, h),
                    None => Err("it has no rows to un-permute".into()),
                };
                checked.map_err(|msg| format_error(file, format!("`{}`: {msg}", info.name)))?;
            }
            let unshift = (arch.norm_shift != 0.0 && name.ends_with("norm.weight")).then_some(arch.norm_shift);
            if unshift.is_some() && !info.ggml_type.is_dequantizable() {
                let msg = format!("`{}`: a shifted norm weight stored as {}", info.name, info.ggml_type);
                return Err(format_error(file, msg));
            }
            Ok(vec![(name, Source { unpermute_heads: heads, unshift, ..plain(shape) })])
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

fn format_error(file: &GgufFile, msg: String) -> WeightError {
    WeightError::Format { path: file.path().into(), msg }
}
