//! A request's output never depends on its batch-mates (issue 36): on the CPU backend with
//! the settings users get (`QuantDots::CLI_DEFAULT`, the integer dots), every request's tokens
//! and logprobs are bit for bit the same run alone, in one batch with the others, with its
//! prompt prefilled in chunks, recomputed after a preemption, and after a prefix-cache hit.
//!
//! The models are the tiny Hugging Face fixtures of `model-layers` (f32 weights) and the
//! default model (SmolLM2-135M, Q4_1 GGUF: packed weights, integer dots), skipped with a
//! note when it is not installed, and the K-quant GGUF fixture (grouped Q4_K, Q5_K, Q6_K). Requests sample (three seeds) with top-3 logprobs, so a
//! difference anywhere in the logits shows, not only one that flips a greedy pick. Prompts
//! run from a few tokens to past 32, on both sides of the row counts where the kernels
//! change how they schedule their work.
//!
//! The hybrid fixtures (Qwen3-Next, Qwen3.5, Qwen3.5-MoE: Gated DeltaNet layers beside
//! attention) run the same modes with state slots, prefix hits resuming from state
//! snapshots every block, and a mode more: prompt-lookup speculation, whose verify steps
//! run a few rows per sequence and whose rejections return the state to a rollback copy.
//!
//! On the llama fixture each prompt also runs through two LoRA adapters
//! (`model-layers/tests/fixtures/lora`), on qwen3_moe through two on its routed experts
//! (`fixtures/lora_moe`), and on the hybrids through theirs (`fixtures/lora_qwen3_*`: gated
//! attention, shared and routed experts), in the same batches as the base model's requests
//! (and, on the hybrids, speculating):
//! adapter rows must neither disturb their batch-mates nor be disturbed, and the prefix
//! cache must never hand one adapter's blocks to another or to the base model.

use std::path::Path;
use std::sync::Arc;

use met_cache::{PagedKvCache, StateSizing};
use met_config::{EngineConfig, QuantDots, SamplingParams};
use met_kernels::{CpuBackend, GpuBackend};
use met_model_layers::lora::{Adapter, LoraAdapter, LoraLimits, LoraPool};
use met_model_layers::models::{gguf_config, load_model, open_gguf, read_config};
use met_model_layers::{LoadOptions, Model};
use met_model_weights::SafetensorsStore;
use met_scheduler::{Engine, EngineRequest, GeneratedToken, StopCriteria};
use met_speculative::SpeculativeConfig;
use met_telemetry::Metrics;

/// The attention fixtures; the FP8 checkpoints' weights stay e4m3 blocks on the CPU
/// (per-channel scales) or are widened (24 x 40 blocks, not whole blocks of 32).
const FIXTURES: [&str; 10] = [
    "llama",
    "llama_tied",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma2",
    "gemma3",
    "qwen3_fp8_channel",
    "qwen3_fp8_block",
];

const HYBRIDS: [&str; 3] = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];

const SEEDS: [u64; 3] = [1, 2, 3];

const NEW_TOKENS: usize = 10;

/// A model to load afresh for each engine, and its prompts.
struct Case {
    name: String,
    load: Box<dyn Fn() -> Box<dyn Model>>,
    backend: Arc<dyn GpuBackend>,
    prompts: Vec<Vec<u32>>,
    /// Adapters every prompt also runs through (on the llama, qwen3_moe and hybrid fixtures).
    adapters: Vec<Adapter>,
    /// Whether the requests also run with speculation (the hybrids).
    speculate: bool,
}

/// A request of a test: its prompt, its seed, and the index of its adapter.
type Spec = (Vec<u32>, u64, Option<usize>);

/// The CPU at the settings users get, or, in a build with CUDA, the backend
/// `MET_TEST_BACKEND` names: `cuda-invariant` (`--batch-invariant`'s kernels, which must keep
/// every promise here) or `cuda` (the default kernels, which make none: run with
/// `MET_TEST_CENSUS=1`, the checks count and print the requests that differ instead of
/// failing). The GPU bundle runs both on the attention fixtures.
fn backend() -> Arc<dyn GpuBackend> {
    match std::env::var("MET_TEST_BACKEND").as_deref() {
        #[cfg(feature = "cuda")]
        Ok("cuda-invariant") => {
            Arc::new(met_kernels::CudaBackend::new().expect("MET_TEST_BACKEND needs a GPU").with_batch_invariance())
        }
        #[cfg(feature = "cuda")]
        Ok("cuda") => Arc::new(
            met_kernels::CudaBackend::new()
                .expect("MET_TEST_BACKEND needs a GPU")
                .with_quant_dots(QuantDots::CLI_DEFAULT),
        ),
        Ok(other) if !other.is_empty() => panic!("MET_TEST_BACKEND={other}: not a backend this build has"),
        _ => Arc::new(CpuBackend::with_dots(QuantDots::CLI_DEFAULT)),
    }
}

/// Requests that differed from themselves alone, counted under `MET_TEST_CENSUS=1`.
static DIFFERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Requests compared, under `MET_TEST_CENSUS=1`.
static COMPARED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Asserts that a request's output equals its output alone, or under `MET_TEST_CENSUS=1`
/// counts it (printing the first few that differ).
fn same(got: &Output, want: &Output, what: impl FnOnce() -> String) {
    use std::sync::atomic::Ordering::Relaxed;
    if std::env::var_os("MET_TEST_CENSUS").is_none() {
        assert_eq!(got, want, "{}", what());
        return;
    }
    COMPARED.fetch_add(1, Relaxed);
    if got != want && DIFFERED.fetch_add(1, Relaxed) < 10 {
        println!("CENSUS differs: {}", what());
    }
}

/// Under `MET_TEST_CENSUS=1`, prints how many requests differed so far.
fn census_line(what: &str) {
    use std::sync::atomic::Ordering::Relaxed;
    if std::env::var_os("MET_TEST_CENSUS").is_some() {
        println!(
            "BATCH-INVARIANCE census after {what}: {} of {} requests differ from themselves alone",
            DIFFERED.load(Relaxed),
            COMPARED.load(Relaxed)
        );
    }
}

fn fixture(name: &str) -> Case {
    fixture_with(name, LoadOptions::default())
}

/// [`fixture`] loaded with `options`.
fn fixture_with(name: &str, options: LoadOptions) -> Case {
    // `MET_HF_FIXTURES`: the working tree's fixtures where a device run carries them (the
    // gpu-bundle runner sets it), the binary being built elsewhere.
    let fixtures = std::env::var_os("MET_HF_FIXTURES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/hf"));
    let dir = fixtures.join(name);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let mut prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone()).unwrap();
    // One prompt past 32 tokens, made of the others, so a whole prefill runs many rows.
    prompts.push(prompts.iter().flatten().copied().cycle().take(45).collect());
    let backend = backend();
    let cfg = read_config(&dir.join("config.json")).unwrap();
    let adapters = match name {
        "llama" => ("lora", ["r8", "r16_rslora"]),
        // Adapters on routed experts, where the backend runs them.
        "qwen3_moe" if backend.supports_expert_lora() => ("lora_moe", ["params", "modules"]),
        "qwen3_5" => ("lora_qwen3_5", ["all", "linear"]),
        "qwen3_5_moe" => ("lora_qwen3_5_moe", ["all", "linear"]),
        // Its adapters change routed experts.
        "qwen3_next" if backend.supports_expert_lora() => ("lora_qwen3_next", ["all", "linear"]),
        _ => ("", [""; 2]),
    };
    let adapters = if adapters.0.is_empty() {
        Vec::new()
    } else {
        let pool = LoraPool::new(&cfg, Arc::clone(&backend), LoraLimits { max_rank: 16 }, 2).unwrap();
        let root = dir.join("../..").join(adapters.0);
        adapters.1.iter().map(|a| Arc::new(LoraAdapter::load(a, &root.join(a), &cfg, &pool).unwrap())).collect()
    };
    let b = Arc::clone(&backend);
    let load = move || load_model(&cfg, &SafetensorsStore::open(&dir).unwrap(), Arc::clone(&b), &options).unwrap();
    Case { name: name.into(), load: Box::new(load), backend, prompts, adapters, speculate: HYBRIDS.contains(&name) }
}

/// A GGUF model, loaded afresh for each engine, with three prompts of 9 to 70 tokens drawn
/// from ids `first .. first + span`.
fn gguf_case(name: &str, path: std::path::PathBuf, (first, span): (usize, usize), options: LoadOptions) -> Case {
    let backend = backend();
    let b = Arc::clone(&backend);
    let load = move || {
        let store = open_gguf(&path).unwrap();
        let cfg = gguf_config(&store).unwrap();
        load_model(&cfg, &store, Arc::clone(&b), &options).unwrap()
    };
    let prompts = [9usize, 33, 70]
        .iter()
        .enumerate()
        .map(|(p, &len)| (0..len).map(|i| (first + (p * 7919 + i * 104_729) % span) as u32).collect())
        .collect();
    Case { name: name.into(), load: Box::new(load), backend, prompts, adapters: Vec::new(), speculate: false }
}

/// The default model, with token ids of ordinary text in SmolLM2's vocabulary.
fn default_model() -> Option<Case> {
    default_model_with(LoadOptions::default())
}

/// [`default_model`] loaded with `options`.
fn default_model_with(options: LoadOptions) -> Option<Case> {
    Some(gguf_case("default model", met_config::default_model_for_test()?, (1000, 40_000), options))
}

/// The K-quant fixture of `model-layers` (a tiny Qwen3 in llama.cpp's Q4_K_M mix, with
/// Q5_K too: every K-quant's grouped integer kernels), over its 512-token vocabulary.
fn k_quant_fixture() -> Case {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/kquant/qwen3_q4_k_m.gguf");
    gguf_case("k-quant fixture", path, (10, 500), LoadOptions::default())
}

fn request(engine: &Engine, prompt: &[u32], seed: u64, adapter: Option<&Adapter>) -> EngineRequest {
    let sampling =
        SamplingParams { temperature: 0.8, top_p: 0.95, seed, logprobs: Some(3), ..SamplingParams::default() };
    let stop = StopCriteria { max_new_tokens: NEW_TOKENS, ignore_eos: true, ..StopCriteria::default() };
    let request = EngineRequest::new(prompt.to_vec(), sampling, stop, 1, &engine.limits()).unwrap();
    match adapter {
        Some(a) => request.with_adapter(Arc::clone(a)),
        None => request,
    }
}

/// What a request produced, as bits: each token's id, logprob and top-3 alternatives.
type Output = Vec<(u32, Option<u32>, Vec<(u32, u32)>)>;

fn bits(t: &GeneratedToken) -> (u32, Option<u32>, Vec<(u32, u32)>) {
    (t.id, t.logprob.map(f32::to_bits), t.top_logprobs.iter().map(|(id, lp)| (*id, lp.to_bits())).collect())
}

/// Runs `batches` one after another through `engine` (the requests of a batch together),
/// returning each request's output and the prompt tokens it took from the prefix cache.
fn run(engine: &mut Engine, adapters: &[Adapter], batches: &[Vec<Spec>]) -> Vec<(Output, usize)> {
    let mut all = Vec::new();
    for batch in batches {
        let mut streams: Vec<_> = batch
            .iter()
            .map(|(p, seed, a)| engine.submit(request(engine, p, *seed, a.map(|a| &adapters[a]))).unwrap())
            .collect();
        let mut out = vec![(Output::new(), 0); batch.len()];
        while engine.has_work() {
            engine.step();
            for (s, (o, cached)) in streams.iter_mut().zip(&mut out) {
                while let Some(e) = s.try_next() {
                    *cached = (*cached).max(e.cached_prompt_tokens);
                    o.extend(e.token.as_ref().map(bits));
                }
            }
        }
        all.extend(out);
    }
    all
}

fn engine(case: &Case, config: EngineConfig, blocks: usize) -> (Engine, Arc<Metrics>) {
    engine_rolling_back(case, config, blocks, 0)
}

/// [`engine`] with `rollback` rollback state slots per sequence (for speculation). A hybrid
/// model gets a state slot per sequence and, with prefix caching, a snapshot every block.
fn engine_rolling_back(case: &Case, config: EngineConfig, blocks: usize, rollback: usize) -> (Engine, Arc<Metrics>) {
    let model = (case.load)();
    let layout = model.kv_layout();
    let snapshots = if config.prefix_caching { config.max_num_seqs } else { 0 };
    let states = layout.state.map(|_| StateSizing { sequences: config.max_num_seqs, snapshots, interval: 1, rollback });
    let (prefix, size) = (config.prefix_caching, config.block_size);
    let kv = PagedKvCache::with_states(&[&*case.backend], layout, size, blocks, prefix, states).unwrap();
    if case.backend.device() == met_config::DeviceKind::Cuda {
        // Decode steps replayed from graphs, padded to the captured sizes, as `met serve` runs them.
        let settings = met_model_layers::graphs::GraphSettings::up_to(config.max_num_seqs);
        model.capture_graphs(&kv, &settings).unwrap();
    }
    let metrics = Arc::new(Metrics::new());
    let engine = Engine::new(model, Arc::clone(&case.backend), Box::new(kv), config, Arc::clone(&metrics)).unwrap();
    (engine, metrics)
}

/// Every mode gives every request the bits it gets alone.
fn check(case: &Case) {
    let adapters: Vec<Option<usize>> = std::iter::once(None).chain((0..case.adapters.len()).map(Some)).collect();
    let mut requests: Vec<Spec> = Vec::new();
    for &seed in &SEEDS {
        for p in &case.prompts {
            requests.extend(adapters.iter().map(|&a| (p.clone(), seed, a)));
        }
    }
    let singles: Vec<Vec<Spec>> = requests.iter().map(|r| vec![r.clone()]).collect();
    let quiet = EngineConfig { prefix_caching: false, block_size: 4, ..EngineConfig::default() };
    let ads = &case.adapters;
    let alone: Vec<Output> =
        run(&mut engine(case, quiet.clone(), 256).0, ads, &singles).into_iter().map(|o| o.0).collect();
    assert!(alone.iter().all(|o| o.len() == NEW_TOKENS), "{}: every request runs to its length", case.name);
    for (r, out) in requests.iter().zip(&alone).filter(|(r, _)| r.2.is_some()) {
        let base = requests.iter().position(|b| b.0 == r.0 && b.1 == r.1 && b.2.is_none()).unwrap();
        assert_ne!(out, &alone[base], "{}: adapter {:?} did not change a request's output", case.name, r.2);
    }

    let chunked = EngineConfig { max_prefill_chunk: Some(7), ..quiet.clone() };
    let cached = EngineConfig { prefix_caching: true, ..quiet.clone() };
    // A pool two blocks past what the longest request needs cannot hold the batch.
    let tight = case.prompts.iter().map(|p| (p.len() + NEW_TOKENS).div_ceil(4)).max().unwrap_or(0) + 2;
    let modes = [("one batch", quiet.clone(), 256), ("chunks of 7", chunked, 256), ("preemption", quiet, tight)];
    for (mode, config, blocks) in modes {
        let (mut engine, metrics) = engine(case, config, blocks);
        let got = run(&mut engine, ads, std::slice::from_ref(&requests));
        for (i, (g, want)) in got.iter().zip(&alone).enumerate() {
            same(&g.0, want, || format!("{}, {mode}: request {i} differs from itself alone", case.name));
        }
        if mode == "preemption" {
            assert!(metrics.preemptions.get() > 0, "{}: the small pool did not force preemption", case.name);
        }
    }
    // The batch twice through one engine: the second time every prompt's full blocks come
    // from the prefix cache, and the rest of the prompt is computed on top of them.
    let (mut engine, _) = engine(case, cached, 256);
    let got = run(&mut engine, ads, &[requests.clone(), requests.clone()]);
    let (first, second) = got.split_at(requests.len());
    assert!(second.iter().any(|o| o.1 > 0), "{}: nothing came from the prefix cache", case.name);
    for (i, (g, want)) in first.iter().chain(second).zip(alone.iter().cycle()).enumerate() {
        same(&g.0, want, || format!("{}, prefix hit: request {i} differs from itself alone", case.name));
    }
    if case.speculate {
        check_speculation(case, &alone, &requests);
    }
}

/// Prompt-lookup speculation (point-mass proposals, so sampling keeps its draws) gives
/// every request the bits it gets alone, with rejections along the way.
fn check_speculation(case: &Case, alone: &[Output], requests: &[Spec]) {
    let ngram = SpeculativeConfig { ngram_min: 1, ..SpeculativeConfig::ngram(4) };
    let config = EngineConfig { block_size: 4, max_prefill_chunk: Some(5), ..EngineConfig::default() };
    let (engine, metrics) = engine_rolling_back(case, config, 256, ngram.num_tokens);
    let mut engine = engine.with_speculative(&ngram).unwrap();
    let got = run(&mut engine, &case.adapters, &[requests.to_vec()]);
    for (i, (g, want)) in got.iter().zip(alone).enumerate() {
        same(&g.0, want, || format!("{}, speculation: request {i} differs from itself alone", case.name));
    }
    let (drafted, accepted) = (metrics.spec_draft_tokens.get(), metrics.spec_accepted_tokens.get());
    assert!(drafted > accepted, "{}: {drafted} drafted, {accepted} accepted: nothing was rejected", case.name);
}

#[test]
fn every_fixture_gives_each_request_its_bits_alone_in_any_batch() {
    for name in FIXTURES {
        check(&fixture(name));
        census_line(name);
    }
}

/// The hybrids with the delta rule at the settings users get: its rows go one at a time
/// whatever the step, so a 45-token prompt alone, chunks of 7, a recompute, a prefix hit's
/// tail and a speculative verify all give the same bits.
#[test]
fn every_hybrid_fixture_gives_each_request_its_bits_alone_in_any_batch() {
    for name in HYBRIDS {
        check(&fixture(name));
    }
}

#[test]
fn the_k_quant_fixture_gives_each_request_its_bits_alone_in_any_batch() {
    check(&k_quant_fixture());
}

#[test]
fn the_default_model_gives_each_request_its_bits_alone_in_any_batch() {
    if let Some(case) = default_model() {
        check(&case);
    }
}

/// The same with an FP8 KV cache (`--kv-cache-dtype fp8`): a row's cache bytes come from
/// its own keys and values, and a prompt's rows widen them together or run by run to the
/// same values, so alone, batched, chunked, recomputed, after a prefix hit (blocks cached
/// as bytes), through adapters and speculating, each request keeps its bits.
#[test]
fn an_fp8_kv_cache_gives_each_request_its_bits_alone_in_any_batch() {
    let fp8 = LoadOptions { kv_cache_dtype: met_config::KvCacheDtype::Fp8, ..LoadOptions::default() };
    for name in ["llama", "qwen3", "gemma2", "qwen3_next"] {
        check(&fixture_with(name, fp8));
    }
    if let Some(case) = default_model_with(fp8) {
        check(&case);
    }
}
