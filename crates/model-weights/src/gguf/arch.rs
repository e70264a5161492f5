//! [`GgufArch`]: how llama.cpp writes one architecture, as data its model file declares.
//!
//! The GGUF reader knows llama.cpp's conventions shared by every architecture (the
//! `{arch}.*` keys of `gguf-py`'s `Keys.LLM`, `Keys.Attention`, `Keys.Rope`, and the common
//! tensor names of `TensorNameMap`). What differs per family lives with the family, in
//! `met-model-layers`' `models/<arch>.rs`, which hands the store a `GgufArch`: its
//! `general.architecture` name, the Hugging Face names it maps to, tensor names that
//! differ from the common table, the converter's transformations (Llama's Q/K row
//! permutation, Gemma's `1 + w` norms, the Gated DeltaNet tensors of the `gated_delta`
//! module) and a hook for its own metadata keys.

use serde_json::{Map, Value};

use super::{GgufFile, GgufValue, VHeadOrder};
use crate::WeightError;

/// Reads `{arch}.*` metadata into `config.json` fields the common reader does not write.
pub type ConfigHook = fn(&GgufMeta<'_>, &mut Map<String, Value>) -> Result<(), WeightError>;

/// How llama.cpp's converter writes one architecture.
#[derive(Debug, Clone, Copy)]
pub struct GgufArch {
    /// `general.architecture`, also the prefix of its metadata keys (`qwen3moe`).
    pub name: &'static str,
    /// The Hugging Face `model_type` of the rebuilt `config.json`.
    pub model_type: &'static str,
    /// Its `architectures` entry (`Qwen3MoeForCausalLM`).
    pub class: &'static str,
    /// Its `hidden_act`.
    pub hidden_act: &'static str,
    /// Whether the converter permuted the Q/K rows (Llama; see the `permute` module).
    pub permutes_qk: bool,
    /// Whether `feed_forward_length` may be absent (MoE models without dense layers).
    pub optional_feed_forward: bool,
    /// What the converter added to every `*norm.weight` (Gemma's `1 + w`: 1), taken off
    /// again so the store serves the checkpoint's values.
    pub norm_shift: f32,
    /// Per-layer tensors `blk.N.<gguf>` → `model.layers.N.<hf>` that differ from or add to
    /// the common table (looked up first). An entry maps the whole name after `blk.N.`
    /// when it matches it (`ssm_a`, `ssm_dt.bias`), else the name less its `.weight` or
    /// `.bias`, which carries over.
    pub block_names: &'static [(&'static str, &'static str)],
    /// Whether the file holds Gated DeltaNet layers as llama.cpp's `qwen3next` family
    /// writes them, and how their value heads are ordered (see the `gated_delta` module).
    pub gated_delta: Option<VHeadOrder>,
    /// The architecture's own metadata keys.
    pub config: Option<ConfigHook>,
}

/// Metadata reads under one architecture's key prefix.
pub struct GgufMeta<'a> {
    pub(crate) file: &'a GgufFile,
    pub(crate) arch: &'a GgufArch,
}

impl GgufMeta<'_> {
    /// The file.
    #[must_use]
    pub fn file(&self) -> &GgufFile {
        self.file
    }

    /// `{arch}.{k}`.
    #[must_use]
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name)
    }

    /// The integer `{arch}.{k}`.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when it is missing or not an integer.
    pub fn req_u64(&self, k: &str) -> Result<u64, WeightError> {
        self.file.get_u64(&self.key(k))
    }

    /// The integer `{arch}.{k}`, if present.
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when it is not an integer.
    pub fn opt_u64(&self, k: &str) -> Result<Option<u64>, WeightError> {
        self.file.opt_u64(&self.key(k))
    }

    /// The float `{arch}.{k}` as the decimal the converter started from (f32 metadata is
    /// written back as the shortest decimal that rounds to it: `1e-5`, not
    /// `9.999999747378752e-6`).
    ///
    /// # Errors
    /// [`WeightError::Metadata`] when it is not a finite number.
    pub fn opt_decimal(&self, k: &str) -> Result<Option<f64>, WeightError> {
        let key = self.key(k);
        let Some(v) = self.file.opt_f64(&key)? else { return Ok(None) };
        let v = match self.file.get(&key) {
            Some(&GgufValue::F32(f)) => decimal(f),
            _ => v,
        };
        if !v.is_finite() {
            return Err(self.file.metadata_error(&key, format!("{v} is not a finite number")));
        }
        Ok(Some(v))
    }
}

/// The shortest decimal that rounds to `f`, as an f64.
pub(crate) fn decimal(f: f32) -> f64 {
    f.to_string().parse().unwrap_or(f64::from(f))
}

/// Sets `key` to `value` when there is one.
pub fn insert_opt<T: Into<Value>>(c: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        c.insert(key.into(), v.into());
    }
}
