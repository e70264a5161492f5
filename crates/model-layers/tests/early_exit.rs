//! The decoder as its own early-exit draft (`EarlyExit`), on the Hugging Face fixtures:
//! exiting after every layer is the full forward pass, bit for bit; exiting after `L`
//! layers writes exactly the K/V the full pass writes in those layers and nothing in the
//! others (what lets a self-speculative draft share the target's KV cache), and gives
//! other logits; layer counts outside `1..=N` are errors.

use std::path::Path;
use std::sync::Arc;

use met_cache::{KvCache, PagedKvCache};
use met_kernels::{CpuBackend, GpuBackend};
use met_model_layers::{ForwardBatch, LoadOptions, LogitRows, Model, ModelError, load_model};
use met_model_weights::SafetensorsStore;

const FIXTURES: [&str; 4] = ["llama", "qwen3", "gemma2", "gemma3"];

fn load(name: &str) -> (Box<dyn Model>, Arc<dyn GpuBackend>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let store = SafetensorsStore::open(&dir).unwrap();
    let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
    (load_model(&cfg, &store, Arc::clone(&backend), &LoadOptions::default()).unwrap(), backend)
}

/// A fresh cache for `model` and a batch of one prompt with logits at every row.
fn setup(model: &dyn Model, backend: &dyn GpuBackend) -> (PagedKvCache, ForwardBatch) {
    let kv = PagedKvCache::new(backend, model.kv_layout(), 4, 8, false).unwrap();
    let mut blocks = kv.new_sequence();
    let prompt: Vec<u32> = (0..11).map(|i| (i * 7 + 3) % model.vocab_size() as u32).collect();
    kv.reserve(&mut blocks, prompt.len()).unwrap();
    let mut batch = ForwardBatch::default();
    batch.push(&prompt, 0, &blocks, LogitRows::All);
    // The pool outlives the guard: its blocks go back, their contents stay for the test.
    (kv, batch)
}

/// Layer `i`'s K and V pools, on the host.
fn pools(kv: &PagedKvCache, backend: &dyn GpuBackend, i: usize) -> (Vec<f32>, Vec<f32>) {
    let (k, v) = kv.layer(i);
    (backend.download_f32(k).unwrap(), backend.download_f32(v).unwrap())
}

#[test]
fn exiting_after_every_layer_is_the_full_forward_pass() {
    for name in FIXTURES {
        let (model, backend) = load(name);
        let exit = model.early_exit().expect("the decoder exits early");
        let (mut kv, batch) = setup(&*model, &*backend);
        let full = backend.download_f32(&model.forward(&batch, &mut kv).unwrap()).unwrap();
        let (kv2, batch) = setup(&*model, &*backend);
        let all = exit.forward_early_exit(&batch, &kv2, exit.num_layers()).unwrap();
        assert_eq!(backend.download_f32(&all).unwrap(), full, "{name}");
    }
}

#[test]
fn an_early_exit_writes_the_full_passes_kv_in_its_layers_only() {
    for name in FIXTURES {
        let (model, backend) = load(name);
        let exit = model.early_exit().expect("the decoder exits early");
        let n = exit.num_layers();
        assert!(n >= 2, "{name} has {n} layers");
        let (mut full_kv, batch) = setup(&*model, &*backend);
        let full = backend.download_f32(&model.forward(&batch, &mut full_kv).unwrap()).unwrap();
        for layers in 1..n {
            let (kv, batch) = setup(&*model, &*backend);
            let logits = backend.download_f32(&exit.forward_early_exit(&batch, &kv, layers).unwrap()).unwrap();
            assert_ne!(logits, full, "{name}: exiting after {layers} of {n} layers changed nothing");
            for i in 0..n {
                let (k, v) = pools(&kv, &*backend, i);
                if i < layers {
                    assert_eq!((k, v), pools(&full_kv, &*backend, i), "{name}: layer {i} of an exit after {layers}");
                } else {
                    assert!(
                        k.iter().chain(&v).all(|&x| x == 0.0),
                        "{name}: layer {i} written by an exit after {layers}"
                    );
                }
            }
        }
        let (kv, batch) = setup(&*model, &*backend);
        for layers in [0, n + 1] {
            let err = exit.forward_early_exit(&batch, &kv, layers).unwrap_err();
            assert!(matches!(err, ModelError::Batch(_)), "{name}: {layers} layers gave {err:?}");
        }
    }
}
