//! Decode steps replayed from CUDA graphs give the eager steps' results, bit for bit.
//!
//! Compiled with the `cuda` feature and run on the GPU machine (`cargo xtask gpu-bundle`).
//! Each case loads a Hugging Face fixture twice on the GPU, captures decode graphs on one
//! copy only, and runs the same greedy continuations through both with the same cache
//! settings: the tokens and every reported logprob must be equal, not close. They can be:
//! a replay issues the eager step's kernels on the same rows, padding rows never touch the
//! real ones, and the kernels a padded step runs reduce in the order the eager step's do
//! (the decode products up to 4 rows do not depend on the batch; the decode attention's
//! splits change only at graph sizes). The cases cover graphs of exactly the batch's size
//! (4 rows, and 8 rows, which cuBLAS computes) and padded ones (3 rows in the 4-row graph,
//! 1 in the 2-row one), contexts crossing many KV blocks (blocks of 4 tokens, prompts up to
//! 90 tokens), contexts past the graphs' block tables, which must fall back to eager
//! steps mid-generation, hybrid models, whose state pools must end equal as well, and an
//! fp8 KV cache.

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{KvCache, PagedKvCache, StateSizing};
use met_config::{KvCacheDtype, ModelConfig};
use met_kernels::{CudaBackend, GpuBackend};
use met_model_layers::runner::{GreedyOptions, generate_greedy};
use met_model_layers::{GraphCapture, GraphSettings, LoadOptions, Model, load_model};
use met_model_weights::SafetensorsStore;

const BLOCK_SIZE: usize = 4;
const BLOCKS: usize = 512;
const NEW_TOKENS: usize = 24;

fn fixtures_dir() -> PathBuf {
    std::env::var_os("MET_HF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf"))
}

fn load(name: &str, backend: &Arc<dyn GpuBackend>, options: &LoadOptions) -> (Box<dyn Model>, ModelConfig) {
    let dir = fixtures_dir().join(name);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let store = SafetensorsStore::open(&dir).unwrap();
    (load_model(&cfg, &store, Arc::clone(backend), options).unwrap(), cfg)
}

/// Prompts of the given lengths, token ids spread over the vocabulary.
fn prompts(lengths: &[usize], vocab: usize) -> Vec<Vec<u32>> {
    lengths
        .iter()
        .enumerate()
        .map(|(p, &n)| (0..n).map(|i| ((i * 7919 + p * 104_729 + 13) % vocab) as u32).collect())
        .collect()
}

/// A hybrid model's cache plans a snapshot at every block (prefix caching on), so decode
/// steps cross snapshots every `BLOCK_SIZE` tokens.
fn cache(model: &dyn Model, backend: &dyn GpuBackend) -> PagedKvCache {
    let layout = model.kv_layout();
    let states = layout.state.map(|_| StateSizing { sequences: 8, snapshots: 48, interval: 1, rollback: 0 });
    PagedKvCache::with_states(&[backend], layout, BLOCK_SIZE, BLOCKS, states.is_some(), states).unwrap()
}

/// Every state pool of a cache, downloaded.
fn states(kv: &PagedKvCache, backend: &dyn GpuBackend) -> Vec<Vec<f32>> {
    kv.pools(0).state_pools().iter().map(|p| backend.download_f32(p).unwrap()).collect()
}

/// Greedy continuations of `lengths`-token prompts, eager and graphed, must be identical.
fn check(name: &str, lengths: &[usize], sizes: &[usize], max_context: usize) -> u64 {
    check_with(name, lengths, sizes, max_context, &LoadOptions::default())
}

/// [`check`] with the model loaded under `options`.
fn check_with(name: &str, lengths: &[usize], sizes: &[usize], max_context: usize, options: &LoadOptions) -> u64 {
    let backend: Arc<dyn GpuBackend> = Arc::new(CudaBackend::new().expect("these tests need a CUDA GPU"));
    let (eager, cfg) = load(name, &backend, options);
    let (graphed, _) = load(name, &backend, options);
    let mut eager_kv = cache(&*eager, &*backend);
    let mut graphed_kv = cache(&*graphed, &*backend);
    let settings = GraphSettings { batch_sizes: sizes.to_vec(), max_context };
    let capture = graphed.capture_graphs(&graphed_kv, &settings).unwrap();
    assert!(matches!(capture, GraphCapture::Captured { .. }), "{name}: {capture}");
    eprintln!("{name}: {capture}");

    let prompts = prompts(lengths, cfg.vocab_size);
    let options =
        GreedyOptions { max_new_tokens: NEW_TOKENS, prefill_chunk: Some(32), top_logprobs: 5, ..Default::default() };
    let want = generate_greedy(&*eager, &*backend, &mut eager_kv, &prompts, &options).unwrap();
    let before = graphed.graph_replays();
    let got = generate_greedy(&*graphed, &*backend, &mut graphed_kv, &prompts, &options).unwrap();
    let replays = graphed.graph_replays() - before;
    assert!(replays > 0, "{name}: no decode step replayed a graph");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "{name}: prompt {i} ({} tokens): graphed tokens differ", lengths[i]);
        assert_eq!(g.top_logprobs, w.top_logprobs, "{name}: prompt {i}: graphed logprobs differ");
    }
    // Bit for bit, snapshots included: padding rows wrote no slot, and every snapshot a
    // replayed step planned was copied out after it.
    let (got_states, want_states) = (states(&graphed_kv, &*backend), states(&eager_kv, &*backend));
    for (p, (g, w)) in got_states.iter().zip(&want_states).enumerate() {
        assert!(g == w, "{name}: state pool {p} differs after the graphed run");
    }
    eprintln!("GPU-GRAPHS {name} lengths {lengths:?}: {replays} of {NEW_TOKENS} steps replayed; equal to eager");
    replays
}

#[test]
fn graph_of_the_batch_size_equals_eager() {
    assert_eq!(check("llama", &[10, 37, 90, 5], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64 - 1);
    // A one-token prompt's prefill is a decode-shaped step too: it replays as well.
    assert_eq!(check("qwen3", &[1], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64);
}

#[test]
fn padded_graphs_equal_eager() {
    assert_eq!(check("qwen2", &[12, 61, 3], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64 - 1);
    assert_eq!(check("mistral", &[20, 33, 48, 70, 9, 11, 25, 40], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64 - 1);
    assert_eq!(check("qwen3", &[17], &[2, 4], 4096), NEW_TOKENS as u64 - 1);
}

/// Block tables of 48 tokens: the steps replay until the 30-token prompt's context passes
/// 48 tokens, and run eagerly after.
#[test]
fn contexts_past_the_graphs_run_eagerly() {
    let replays = check("llama_tied", &[20, 30], &[2], 48);
    assert!(replays < NEW_TOKENS as u64 - 1, "every step replayed, though contexts passed the tables");
}

/// MoE layers group their rows on the device, so their decode steps replay too, padded
/// batches included.
#[test]
fn moe_graphs_equal_eager() {
    assert_eq!(check("qwen3_moe", &[14, 50, 3], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64 - 1);
}

/// Hybrid models replay too: each replay writes its sequences' state slots into the graph
/// and padding rows keep no state; a one-token prompt's slot is zeroed before its first
/// (replayed) step, and the snapshots planned at every block are copied out after the
/// replays that reach them. Tokens, logprobs and every state pool equal the eager run.
#[test]
fn hybrid_graphs_equal_eager() {
    assert_eq!(check("qwen3_next", &[1], &[1, 2, 4, 8], 4096), NEW_TOKENS as u64);
    assert!(check("qwen3_next", &[12, 61, 3], &[1, 2, 4, 8], 4096) >= NEW_TOKENS as u64 - 3);
    assert!(check("qwen3_5", &[30, 7, 90, 45], &[1, 2, 4, 8], 4096) >= NEW_TOKENS as u64 - 3);
    assert!(check("qwen3_5_moe", &[14, 50, 3], &[2, 4], 4096) >= NEW_TOKENS as u64 - 3);
}

/// An fp8 KV cache replays too: its graphs hold the e4m3 forms of the KV write and the
/// decode attention.
#[test]
fn fp8_kv_graphs_equal_eager() {
    let fp8 = LoadOptions { kv_cache_dtype: KvCacheDtype::Fp8, ..LoadOptions::default() };
    assert_eq!(check_with("llama", &[10, 37, 90, 5], &[1, 2, 4, 8], 4096, &fp8), NEW_TOKENS as u64 - 1);
    assert!(check_with("qwen3_next", &[12, 61, 3], &[1, 2, 4, 8], 4096, &fp8) >= NEW_TOKENS as u64 - 3);
}
