//! Loading a model for a command: resolve, config, device, weights (startup phases 1-5).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use met_config::{GenerationConfig, ModelConfig};
use met_kernels::{GpuBackend, open_backend};
use met_model_layers::{LoadOptions, Model, load_model, tensor_specs};
use met_model_weights::{DummyStore, SafetensorsStore, WeightStore};
use met_telemetry::{Phase, PhaseTimer};

use crate::cli::{LoadFormat, ModelArgs};

/// A model ready to run, with the facts commands need about it.
pub struct LoadedModel {
    /// The device it runs on.
    pub backend: Arc<dyn GpuBackend>,
    /// The model.
    pub model: Box<dyn Model>,
    /// End-of-sequence tokens from `config.json` and `generation_config.json`.
    pub eos_token_ids: Vec<u32>,
}

/// Runs startup phases 1 to 5 for `args`.
pub fn load(args: &ModelArgs) -> Result<LoadedModel> {
    let timer = PhaseTimer::start(Phase::Resolve);
    let dir = resolve_dir(&args.model)?;
    timer.done(dir.display());

    let timer = PhaseTimer::start(Phase::Config);
    let path = dir.join("config.json");
    let config = match &args.hf_overrides {
        Some(o) => ModelConfig::from_file_with_overrides(&path, o),
        None => ModelConfig::from_file(&path),
    }?;
    let mut eos_token_ids = config.eos_token_ids.clone();
    let generation = dir.join("generation_config.json");
    if generation.is_file() {
        eos_token_ids.extend(GenerationConfig::from_file(&generation)?.eos_token_ids);
    }
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();
    timer.done(format_args!("{} with {} layers", config.model_type, config.num_layers));

    let timer = PhaseTimer::start(Phase::Device);
    let backend = open_backend(args.device)?;
    timer.done(backend.name());

    let timer = PhaseTimer::start(Phase::Weights);
    let store: Box<dyn WeightStore> = match args.load_format {
        LoadFormat::Auto => Box::new(SafetensorsStore::open(dir)?),
        LoadFormat::Dummy => Box::new(DummyStore::new(tensor_specs(&config)?, args.dummy_seed, backend.float_dtype())),
    };
    let options = LoadOptions { attention_backend: args.attention_backend.clone() };
    let model = load_model(&config, &*store, Arc::clone(&backend), &options)
        .with_context(|| format!("loading {}", store.describe()))?;
    timer.done(store.describe());
    Ok(LoadedModel { backend, model, eos_token_ids })
}

fn resolve_dir(path: &Path) -> Result<&Path> {
    if !path.exists() {
        bail!("model directory `{}` does not exist", path.display());
    }
    if !path.is_dir() {
        bail!("`{}` is not a model directory", path.display());
    }
    if !path.join("config.json").is_file() {
        bail!("`{}` has no config.json", path.display());
    }
    Ok(path)
}
