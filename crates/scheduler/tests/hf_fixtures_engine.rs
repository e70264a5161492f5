//! The Hugging Face fixtures of `model-layers` through the engine: greedy outputs equal
//! the bare forward pass (`runner::generate_greedy`) and the transformers reference, with
//! all prompts batched, prefill chunks of 5, and a pool small enough to force preemption;
//! and the same with speculative decoding on, by prompt lookup and by self-speculation
//! (the fixture's first layer as its draft, writing into the target's own cache), for
//! greedy requests and for seeded sampled ones, whose tokens it does not change either;
//! and split over tensor-parallel ranks, which the engine sees as one model.

use std::path::Path;
use std::sync::Arc;

use met_cache::{KvCache, PagedKvCache};
use met_config::{EngineConfig, SamplingParams};
use met_kernels::{Collective, CpuBackend, GpuBackend, LocalCollective};
use met_model_layers::LoadOptions;
use met_model_layers::parallel::load_tensor_parallel;
use met_model_layers::runner::{GreedyOptions, generate_greedy};
use met_model_weights::SafetensorsStore;
use met_scheduler::{Engine, EngineRequest, StopCriteria};
use met_speculative::SpeculativeConfig;
use met_telemetry::Metrics;

mod hf_common;
use hf_common::{Fixture, load};

const FIXTURES: [&str; 8] = ["llama", "llama_tied", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3"];

fn through_engine(name: &str, config: EngineConfig, blocks: usize) -> (Vec<Vec<u32>>, u64) {
    let (out, metrics) = run_engine(name, config, blocks, None, &SamplingParams::greedy());
    (out, metrics.preemptions.get())
}

/// The fixture's outputs through an engine sampling with `sampling`, speculating with
/// `speculative` when given.
fn run_engine(
    name: &str,
    config: EngineConfig,
    blocks: usize,
    speculative: Option<&SpeculativeConfig>,
    sampling: &SamplingParams,
) -> (Vec<Vec<u32>>, Arc<Metrics>) {
    let Fixture { model, backend, prompts, .. } = load(name);
    let kv = PagedKvCache::new(&*backend, model.kv_layout(), config.block_size, blocks, config.prefix_caching).unwrap();
    let metrics = Arc::new(Metrics::new());
    let mut engine = Engine::new(model, backend, Box::new(kv), config, Arc::clone(&metrics)).unwrap();
    if let Some(speculative) = speculative {
        engine = engine.with_speculative(speculative).unwrap();
    }
    (drive(&mut engine, &prompts, sampling), metrics)
}

/// Submits every prompt for 16 tokens and steps `engine` until all are done.
fn drive(engine: &mut Engine, prompts: &[Vec<u32>], sampling: &SamplingParams) -> Vec<Vec<u32>> {
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p: &Vec<u32>| {
            let stop = StopCriteria { max_new_tokens: 16, ..StopCriteria::default() };
            let req = EngineRequest::new(p.clone(), sampling.clone(), stop, 1, &engine.limits()).unwrap();
            engine.submit(req)
        })
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = vec![Vec::new(); prompts.len()];
    while engine.has_work() {
        engine.step();
        for (s, o) in streams.iter_mut().zip(&mut out) {
            while let Some(e) = s.try_next() {
                o.extend(e.token.map(|t| t.id));
            }
        }
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks());
    out
}

/// The fixture split over `world` CPU ranks (the in-process collective) through the
/// engine, which sees one model and one cache: its outputs, with prompt-lookup speculation
/// when `speculative` is given (verification rows gather every row's logits).
fn run_split(
    name: &str,
    world: usize,
    config: EngineConfig,
    blocks: usize,
    speculative: Option<&SpeculativeConfig>,
) -> (Vec<Vec<u32>>, Arc<Metrics>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/hf").join(name);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let store = SafetensorsStore::open(&dir).unwrap();
    let backends: Vec<Arc<dyn GpuBackend>> = (0..world).map(|_| Arc::new(CpuBackend::new()) as _).collect();
    let collectives: Vec<Arc<dyn Collective>> =
        LocalCollective::group(&backends).into_iter().map(|c| Arc::new(c) as _).collect();
    let model = load_tensor_parallel(&cfg, &store, &backends, &collectives, &LoadOptions::default()).unwrap();
    let ranks: Vec<&dyn GpuBackend> = backends.iter().map(|b| &**b).collect();
    let kv =
        PagedKvCache::sharded(&ranks, model.kv_layout(), config.block_size, blocks, config.prefix_caching).unwrap();
    let metrics = Arc::new(Metrics::new());
    let lead = Arc::clone(&backends[0]);
    let mut engine = Engine::new(model, lead, Box::new(kv), config, Arc::clone(&metrics)).unwrap();
    if let Some(speculative) = speculative {
        engine = engine.with_speculative(speculative).unwrap();
    }
    (drive(&mut engine, &load(name).prompts, &SamplingParams::greedy()), metrics)
}

/// Tensor parallelism needs nothing of the engine but a model and a cache built for it:
/// split over 2 and 4 ranks, every fixture whose heads divide gives the transformers
/// greedy tokens through the engine with prefix caching, chunked prefill, preemption and
/// prompt-lookup speculation.
#[test]
fn engine_over_tensor_parallel_ranks_equals_transformers() {
    let ngram = SpeculativeConfig { ngram_min: 1, ..SpeculativeConfig::ngram(4) };
    for (name, worlds) in [("llama", &[2, 4][..]), ("qwen2", &[2]), ("qwen3_moe", &[2, 4]), ("gemma2", &[4])] {
        let reference = load(name).greedy;
        for &world in worlds {
            let what = format!("{name} TP={world}");
            let cached = EngineConfig { max_prefill_chunk: Some(5), block_size: 4, ..EngineConfig::default() };
            assert_eq!(run_split(name, world, cached, 64, None).0, reference, "{what}: chunks of 5, prefix caching");
            let tight = EngineConfig { block_size: 4, prefix_caching: false, ..EngineConfig::default() };
            let (out, metrics) = run_split(name, world, tight, 24, None);
            assert_eq!(out, reference, "{what}: preemption");
            assert!(metrics.preemptions.get() > 0, "{what}: the small pool did not force preemption");
            let (out, metrics) = run_split(name, world, EngineConfig::default(), 64, Some(&ngram));
            assert_eq!(out, reference, "{what}: prompt lookup");
            assert!(metrics.spec_draft_tokens.get() > 0, "{what}: nothing was proposed");
        }
    }
}

#[test]
fn engine_equals_bare_forward_and_transformers() {
    for name in FIXTURES {
        let Fixture { model, backend, prompts, greedy: reference } = load(name);
        let mut kv = PagedKvCache::new(&*backend, model.kv_layout(), 16, 64, false).unwrap();
        let options = GreedyOptions { max_new_tokens: 16, ..GreedyOptions::default() };
        let bare: Vec<Vec<u32>> = generate_greedy(&*model, &*backend, &mut kv, &prompts, &options)
            .unwrap()
            .into_iter()
            .map(|g| g.tokens)
            .collect();
        assert_eq!(kv.num_free_blocks(), 64);
        assert_eq!(bare, reference, "{name}: bare forward");

        let batched = through_engine(name, EngineConfig::default(), 64).0;
        assert_eq!(batched, bare, "{name}: engine, one batch");
        let chunked = EngineConfig { max_prefill_chunk: Some(5), block_size: 4, ..EngineConfig::default() };
        assert_eq!(through_engine(name, chunked, 64).0, bare, "{name}: engine, chunks of 5");
        // 24 blocks of 4 tokens cannot hold the four requests (76 tokens at most each).
        let tight = EngineConfig { block_size: 4, ..EngineConfig::default() };
        let (out, preempted) = through_engine(name, tight, 24);
        assert_eq!(out, bare, "{name}: engine under preemption");
        assert!(preempted > 0, "{name}: the small pool did not force preemption");
    }
}

#[test]
fn speculation_leaves_every_fixture_unchanged() {
    // Single-token matches too, so the random models' short outputs get proposals.
    let ngram = SpeculativeConfig { ngram_min: 1, ..SpeculativeConfig::ngram(4) };
    let early_exit = SpeculativeConfig::self_spec(3, Some(1));
    let sampled = SamplingParams { temperature: 0.8, top_p: 0.9, seed: 11, ..SamplingParams::default() };
    for name in FIXTURES {
        let Fixture { greedy: reference, .. } = load(name);
        let chunked = EngineConfig { max_prefill_chunk: Some(5), block_size: 4, ..EngineConfig::default() };
        let tight = EngineConfig { block_size: 4, ..EngineConfig::default() };
        let (plain_sampled, _) = run_engine(name, EngineConfig::default(), 64, None, &sampled);
        for (method, speculative) in [("ngram", &ngram), ("self", &early_exit)] {
            for (mode, config, blocks) in [
                ("one batch", EngineConfig::default(), 64),
                ("chunks of 5", chunked.clone(), 64),
                ("preemption", tight.clone(), 24),
            ] {
                let what = format!("{name}, {method}, {mode}");
                let greedy = SamplingParams::greedy();
                let (out, metrics) = run_engine(name, config.clone(), blocks, Some(speculative), &greedy);
                assert_eq!(out, reference, "{what}: speculative engine");
                assert!(metrics.spec_draft_tokens.get() > 0, "{what}: nothing was proposed");
                if mode == "preemption" {
                    assert!(metrics.preemptions.get() > 0, "{what}: the small pool did not force preemption");
                }
                let (out, _) = run_engine(name, config, blocks, Some(speculative), &sampled);
                assert_eq!(out, plain_sampled, "{what}: seeded sampling");
            }
        }
    }
}
