//! The architectures, registered by Hugging Face `model_type`.
//!
//! An architecture is one file: `<arch>.rs` reads its `config.json` into the
//! [`ModelConfig`] recipe the shared [`DecoderModel`] is built from (defaults of its
//! transformers configuration class, biases, norms, activation, soft-caps, the rotary
//! settings and the window of every layer), documents the transformers modeling code it
//! follows, and declares the GGUF names llama.cpp gives it. The registry below is data,
//! one line per architecture; nothing else in met lists them.
//!
//! Adding an architecture (a new file and a line here):
//! 1. Write `models/<arch>.rs` with `pub(super) const ARCH: Architecture` whose
//!    `read_config` starts from [`ModelConfig::read_common`] and sets what differs. Tensor
//!    names are the decoder's (`model.layers.N.self_attn.q_proj.weight`, ...), so a family
//!    that keeps Hugging Face's usual names declares none.
//! 2. Add `<arch>::ARCH` to [`ARCHITECTURES`] (and `mod <arch>;`).
//! 3. Add a tiny checkpoint to `scripts/hf_fixture_specs.py` and its name to
//!    `tests/hf_equivalence.rs`.
//!
//! An op the recipe cannot yet express goes into `met-kernels` (CPU and CUDA) and a field
//! of [`ModelConfig`] that the decoder reads.

pub(crate) mod checkpoint_view;
mod gemma2;
mod gemma3;
mod llama;
mod mistral;
mod qwen2;
mod qwen3;
mod qwen3_5;
mod qwen3_moe;
mod qwen3_next;

use std::path::Path;
use std::sync::Arc;

use met_config::{ConfigError, ConfigJson, KvCacheDtype, ModelConfig, RawConfig};
use met_kernels::GpuBackend;
use met_model_weights::{Fp8View, GgufArch, GgufStore, TensorSpec, WeightError, WeightStore, preflight};

use crate::attention::{AttentionBackendKind, attention_backend};
use crate::layers::decoder::{self, DecoderModel, LM_HEAD};
use crate::{Model, ModelError, Result};

/// An architecture: its `model_type`, how it reads its config, and its GGUF names.
pub struct Architecture {
    /// The Hugging Face `model_type` it implements.
    pub model_type: &'static str,
    /// Reads a `config.json` of this `model_type` into the decoder's recipe.
    pub read_config: fn(&RawConfig<'_>) -> std::result::Result<ModelConfig, ConfigError>,
    /// How llama.cpp writes it, when met reads its GGUF files.
    pub gguf: Option<GgufArch>,
}

/// Every architecture met implements.
pub const ARCHITECTURES: &[Architecture] = &[
    llama::ARCH,       // Llama 2 and 3, SmolLM, TinyLlama, ...
    mistral::ARCH,     // Mistral: a window on every layer
    qwen2::ARCH,       // Qwen2 and 2.5: q/k/v biases
    qwen3::ARCH,       // Qwen3: q/k norm
    qwen3_moe::ARCH,   // Qwen3-MoE: routed experts
    gemma2::ARCH,      // Gemma 2: sandwich (1 + w) norms, GeGLU, soft-caps
    gemma3::ARCH,      // Gemma 3 (text): Gemma 2 plus q/k norm, local and global rotary
    qwen3_next::ARCH,  // Qwen3-Next: Gated DeltaNet + gated attention, shared expert
    qwen3_5::ARCH,     // Qwen3.5 / 3.6 (vision-language checkpoint, text model): dense
    qwen3_5::TEXT,     // Qwen3.5 text-only checkpoint
    qwen3_5::MOE,      // Qwen3.5 / 3.6 MoE (vision-language checkpoint, text model)
    qwen3_5::MOE_TEXT, // Qwen3.5 / 3.6 MoE text-only checkpoint
];

/// Checkpoint tensors that may be present and are never read: rotary tables some
/// exporters save, and multi-token-prediction heads (Qwen3-Next, Qwen3.5).
/// (`k_scale`/`v_scale`: an FP8 checkpoint's KV-cache scales, read by the layers where
/// present.)
const ALWAYS_IGNORED: &[&str] = &["*.rotary_emb.inv_freq", "mtp.*", "*.self_attn.k_scale", "*.self_attn.v_scale"];

/// The architecture registered for `model_type`, if any.
pub fn architecture(model_type: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().find(|a| a.model_type == model_type)
}

/// The GGUF naming of every architecture that has one.
pub fn gguf_architectures() -> Vec<GgufArch> {
    ARCHITECTURES.iter().filter_map(|a| a.gguf).collect()
}

/// Opens a GGUF file of any architecture met reads.
///
/// # Errors
/// As [`GgufStore::open`].
pub fn open_gguf(path: &Path) -> std::result::Result<GgufStore, WeightError> {
    GgufStore::open(path, &gguf_architectures())
}

/// The validated config of a GGUF file, from its metadata.
///
/// # Errors
/// As [`GgufStore::config_json`], and [`WeightError::Config`] when the config does not
/// validate (messages name the GGUF file).
pub fn gguf_config(store: &GgufStore) -> std::result::Result<ModelConfig, WeightError> {
    Ok(config_from(&store.config()?)?)
}

/// Reads and validates a `config.json` with the rules of the architecture it names.
///
/// # Errors
/// A [`ConfigError`] naming the file and the first bad field, or
/// [`ConfigError::UnsupportedModelType`].
pub fn read_config(path: &Path) -> std::result::Result<ModelConfig, ConfigError> {
    config_from(&ConfigJson::read(path)?)
}

/// Validates the text of a `config.json`; `path` names it in messages.
///
/// # Errors
/// As [`read_config`].
pub fn config_from_json(path: &Path, text: &str) -> std::result::Result<ModelConfig, ConfigError> {
    config_from(&ConfigJson::parse(path, text)?)
}

/// Reads a `config.json` with top-level fields replaced by those of the JSON object
/// `overrides` (as vLLM's `--hf-overrides`), e.g. `{"num_hidden_layers": 2}`.
///
/// # Errors
/// As [`read_config`], naming `--hf-overrides` when the overrides are not a JSON object.
pub fn read_config_with_overrides(path: &Path, overrides: &str) -> std::result::Result<ModelConfig, ConfigError> {
    config_from(&ConfigJson::read(path)?.with_overrides(overrides)?)
}

/// The config of `json`, read by the architecture its `model_type` names.
///
/// # Errors
/// As [`read_config`].
pub fn config_from(json: &ConfigJson) -> std::result::Result<ModelConfig, ConfigError> {
    let raw = json.raw();
    let found = raw.str("model_type")?;
    let arch = architecture(found).ok_or_else(|| ConfigError::UnsupportedModelType {
        path: raw.path(),
        found: found.into(),
        supported: ARCHITECTURES.iter().map(|a| a.model_type).collect::<Vec<_>>().join(", "),
    })?;
    (arch.read_config)(&raw)
}

/// Every tensor a checkpoint of `cfg` must hold, with its shape.
///
/// # Errors
/// [`ModelError::Unsupported`] when no architecture is registered for `cfg.model_type`.
pub fn tensor_specs(cfg: &ModelConfig) -> Result<Vec<TensorSpec>> {
    if architecture(&cfg.model_type).is_none() {
        let msg = format!("no architecture is registered for `{}`", cfg.model_type);
        return Err(ModelError::Unsupported(msg));
    }
    Ok(decoder::tensors(cfg))
}

/// How to build a model.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// The attention backend.
    pub attention_backend: AttentionBackendKind,
    /// The KV cache's element type.
    pub kv_cache_dtype: KvCacheDtype,
}

/// Checks `store` against the recipe `cfg` (reporting every missing, unexpected and
/// mis-shaped tensor at once), then loads the model onto `backend`.
///
/// # Errors
/// [`ModelError::Weights`] with the preflight report, or any load failure.
pub fn load_model(
    cfg: &ModelConfig,
    store: &dyn WeightStore,
    backend: Arc<dyn GpuBackend>,
    options: &LoadOptions,
) -> Result<Box<dyn Model>> {
    let dequantized = fp8_view(cfg, store);
    let store: &dyn WeightStore = dequantized.as_ref().map_or(store, |v| v);
    let view = checkpoint_view::canonical(cfg, store);
    let store: &dyn WeightStore = match &view {
        Some(v) => v,
        None => store,
    };
    check_canonical(cfg, store)?;
    let attention = attention_backend(options.attention_backend, Arc::clone(&backend));
    let model = DecoderModel::load(cfg, store, backend, attention)?.with_kv_cache_dtype(options.kv_cache_dtype)?;
    Ok(Box::new(model))
}

/// Preflight of `store` against the recipe `cfg`: every missing, unexpected and mis-shaped
/// tensor at once.
///
/// # Errors
/// [`ModelError::Weights`] with the preflight report.
pub(crate) fn check_store(cfg: &ModelConfig, store: &dyn WeightStore) -> Result<()> {
    let dequantized = fp8_view(cfg, store);
    let store: &dyn WeightStore = dequantized.as_ref().map_or(store, |v| v);
    match checkpoint_view::canonical(cfg, store) {
        Some(view) => check_canonical(cfg, &view),
        None => check_canonical(cfg, store),
    }
}

/// A quantized checkpoint's weights dequantized to f32 as they are read (every scheme
/// `QuantConfig` admits stores float8 weights with scales); `None` for a float checkpoint.
pub(crate) fn fp8_view<'a>(cfg: &ModelConfig, store: &'a dyn WeightStore) -> Option<Fp8View<'a>> {
    cfg.quantization.as_ref().map(|q| Fp8View::new(store, q.scales))
}

/// [`check_store`] of a store already under the canonical names.
fn check_canonical(cfg: &ModelConfig, store: &dyn WeightStore) -> Result<()> {
    let mut ignored = ALWAYS_IGNORED.to_vec();
    if cfg.tie_word_embeddings {
        // Some tied checkpoints still store the head; it equals the embedding.
        ignored.push(LM_HEAD.name);
    }
    Ok(preflight(store, &tensor_specs(cfg)?, &ignored)?)
}
