//! The architectures, registered by Hugging Face `model_type`.
//!
//! Each file documents the transformers modeling code it follows and decides what each
//! of its layers contains; the shared [`DecoderModel`] does the rest. Adding an
//! architecture is a new file and a line in [`ARCHITECTURES`].

mod llama;
mod mistral;
mod qwen2;
mod qwen3;
mod qwen3_moe;

use std::sync::Arc;

use met_config::{ModelConfig, ModelType};
use met_kernels::GpuBackend;
use met_model_weights::{TensorSpec, WeightStore, preflight};

use crate::attention::attention_backend;
use crate::layers::decoder::{self, DecoderModel, LM_HEAD, LayerKind};
use crate::{Model, ModelError, Result};

/// An architecture: its `model_type` and what each of its layers contains.
pub struct Architecture {
    /// The Hugging Face `model_type` it implements.
    pub model_type: ModelType,
    /// The contents of layer `i`.
    pub layer_kind: fn(&ModelConfig, usize) -> LayerKind,
}

/// Every architecture met implements.
pub const ARCHITECTURES: &[Architecture] = &[llama::ARCH, mistral::ARCH, qwen2::ARCH, qwen3::ARCH, qwen3_moe::ARCH];

/// Checkpoint tensors that may be present and are never read: rotary tables some
/// exporters save.
const ALWAYS_IGNORED: &[&str] = &["*.rotary_emb.inv_freq"];

/// The architecture registered for `model_type`.
///
/// # Errors
/// [`ModelError::Unsupported`] when none is.
pub fn architecture(model_type: ModelType) -> Result<&'static Architecture> {
    ARCHITECTURES
        .iter()
        .find(|a| a.model_type == model_type)
        .ok_or_else(|| ModelError::Unsupported(format!("no architecture is registered for `{model_type}`")))
}

/// Every tensor a checkpoint of `cfg` must hold, with its shape.
///
/// # Errors
/// [`ModelError::Unsupported`] for an unregistered architecture.
pub fn tensor_specs(cfg: &ModelConfig) -> Result<Vec<TensorSpec>> {
    let arch = architecture(cfg.model_type)?;
    Ok(decoder::tensors(cfg, |i| (arch.layer_kind)(cfg, i)))
}

/// How to build a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The attention backend, by name (see [`crate::attention::ATTENTION_BACKENDS`]).
    pub attention_backend: String,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { attention_backend: "paged".into() }
    }
}

/// Checks `store` against the architecture of `cfg` (reporting every missing, unexpected
/// and mis-shaped tensor at once), then loads the model onto `backend`.
///
/// # Errors
/// [`ModelError::Weights`] with the preflight report, or any load failure.
pub fn load_model(
    cfg: &ModelConfig,
    store: &dyn WeightStore,
    backend: Arc<dyn GpuBackend>,
    options: &LoadOptions,
) -> Result<Box<dyn Model>> {
    let arch = architecture(cfg.model_type)?;
    let mut ignored = ALWAYS_IGNORED.to_vec();
    if cfg.tie_word_embeddings {
        // Some tied checkpoints still store the head; it equals the embedding.
        ignored.push(LM_HEAD);
    }
    preflight(store, &tensor_specs(cfg)?, &ignored)?;
    let attention = attention_backend(&options.attention_backend, Arc::clone(&backend))?;
    let model = DecoderModel::load(cfg, |i| (arch.layer_kind)(cfg, i), store, backend, attention)?;
    Ok(Box::new(model))
}
