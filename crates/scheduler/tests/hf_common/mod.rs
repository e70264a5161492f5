//! The Hugging Face fixtures of `model-layers` (`tests/fixtures/hf`), loaded on the CPU
//! with their prompts and transformers' greedy continuations, for the engine tests.

use std::path::Path;
use std::sync::Arc;

use met_kernels::{CpuBackend, GpuBackend};
use met_model_layers::{LoadOptions, Model, load_model};
use met_model_weights::SafetensorsStore;

/// A fixture's model, its backend, its prompts and the transformers greedy continuations.
pub struct Fixture {
    pub model: Box<dyn Model>,
    pub backend: Arc<dyn GpuBackend>,
    pub prompts: Vec<Vec<u32>>,
    pub greedy: Vec<Vec<u32>>,
}

/// Fixture `name`, loaded on a CPU backend.
pub fn load(name: &str) -> Fixture {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/hf").join(name);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
    let store = SafetensorsStore::open(&dir).unwrap();
    let model = load_model(&cfg, &store, Arc::clone(&backend), &LoadOptions::default()).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompts = serde_json::from_value(reference["prompts"].clone()).unwrap();
    let greedy = serde_json::from_value(reference["greedy"].clone()).unwrap();
    Fixture { model, backend, prompts, greedy }
}
