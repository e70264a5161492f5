//! Hybrid linear-attention fixtures (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) through the engine:
//! the transformers greedy tokens with every prompt batched, in prefill chunks of 5, under
//! preemption (a pool so small that sequences give back their blocks and state slots and
//! recompute), and after prefix hits that resume from the cache's state snapshots (counted
//! by `prefix_cache_hit_tokens`), and with speculative decoding, whose rejected tokens the
//! state forgets by returning to a rollback copy.

use std::sync::Arc;

use met_cache::{PagedKvCache, StateSizing};
use met_config::{EngineConfig, SamplingParams};
use met_scheduler::{Engine, EngineRequest, FinishReason, StopCriteria};
use met_speculative::SpeculativeConfig;
use met_telemetry::Metrics;

mod hf_common;
use hf_common::{Fixture, load};

const HYBRIDS: [&str; 3] = ["qwen3_next", "qwen3_5", "qwen3_5_moe"];

/// An engine over a cache of `blocks` blocks with a state slot per sequence the engine can
/// run and, with prefix caching, as many snapshot slots, one every `interval` blocks.
fn engine(f: Fixture, config: EngineConfig, blocks: usize, interval: usize) -> (Engine, Arc<Metrics>) {
    speculating_engine(f, config, blocks, interval, 0)
}

/// [`engine`] with `rollback` rollback slots per sequence, for speculative steps.
fn speculating_engine(
    f: Fixture,
    config: EngineConfig,
    blocks: usize,
    interval: usize,
    rollback: usize,
) -> (Engine, Arc<Metrics>) {
    let snapshots = if config.prefix_caching { config.max_num_seqs } else { 0 };
    let sizing = StateSizing { sequences: config.max_num_seqs, snapshots, interval, rollback };
    let layout = f.model.kv_layout();
    let kv = PagedKvCache::with_states(
        &[&*f.backend],
        layout,
        config.block_size,
        blocks,
        config.prefix_caching,
        Some(sizing),
    )
    .unwrap();
    let metrics = Arc::new(Metrics::new());
    (Engine::new(f.model, f.backend, Box::new(kv), config, Arc::clone(&metrics)).unwrap(), metrics)
}

/// Submits every prompt for 16 greedy tokens and steps until all are done.
fn drive(engine: &mut Engine, prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    drive_counting(engine, prompts).0
}

/// [`drive`], with the prompt tokens each request took from the prefix cache.
fn drive_counting(engine: &mut Engine, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, Vec<usize>) {
    let mut streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            let stop = StopCriteria { max_new_tokens: 16, ..StopCriteria::default() };
            let req = EngineRequest::new(p.clone(), SamplingParams::greedy(), stop, 1, &engine.limits()).unwrap();
            engine.submit(req).unwrap()
        })
        .collect();
    let mut out = vec![Vec::new(); prompts.len()];
    let mut cached = vec![0; prompts.len()];
    while engine.has_work() {
        engine.step();
        for ((s, o), c) in streams.iter_mut().zip(&mut out).zip(&mut cached) {
            while let Some(e) = s.try_next() {
                assert!(!matches!(e.finish, Some(FinishReason::Error(_))), "{:?}", e.finish);
                o.extend(e.token.map(|t| t.id));
                *c = e.cached_prompt_tokens;
            }
        }
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks());
    (out, cached)
}

#[test]
fn batched_and_chunked_hybrids_equal_transformers() {
    for name in HYBRIDS {
        for chunk in [None, Some(5)] {
            let f = load(name);
            let (prompts, want) = (f.prompts.clone(), f.greedy.clone());
            let config = EngineConfig { max_prefill_chunk: chunk, block_size: 4, ..EngineConfig::default() };
            let (mut e, _) = engine(f, config, 256, 2);
            assert_eq!(drive(&mut e, &prompts), want, "{name}, prefill chunks {chunk:?}");
        }
    }
}

#[test]
fn preempted_hybrids_recompute_from_a_fresh_state() {
    for name in HYBRIDS {
        let f = load(name);
        let (prompts, want) = (f.prompts.clone(), f.greedy.clone());
        let config = EngineConfig { block_size: 4, prefix_caching: false, ..EngineConfig::default() };
        let (mut e, metrics) = engine(f, config, 48, 0);
        assert_eq!(drive(&mut e, &prompts), want, "{name} under preemption");
        assert!(metrics.preemptions.get() > 0, "{name}: the small pool did not force preemption");
    }
}

/// The same prompts twice: the second time every prompt of at least two blocks resumes
/// from a snapshot, computes only its tail, and gives the same tokens. Prompts that share
/// a prefix with an earlier one (here: each prompt extended) hit too.
#[test]
fn prefix_hits_resume_from_state_snapshots() {
    for name in HYBRIDS {
        let f = load(name);
        let (prompts, want) = (f.prompts.clone(), f.greedy.clone());
        let config = EngineConfig { block_size: 4, ..EngineConfig::default() };
        let (mut e, metrics) = engine(f, config, 512, 2);
        assert_eq!(drive(&mut e, &prompts), want, "{name}: cold");
        let cold_hits = metrics.prefix_cache_hit_tokens.get();
        let (warm, cached) = drive_counting(&mut e, &prompts);
        assert_eq!(warm, want, "{name}: warm");
        let hits = metrics.prefix_cache_hit_tokens.get() - cold_hits;
        // Each prompt resumes at its last snapshot (every 8 tokens) short of its last token.
        let expected: Vec<usize> = prompts.iter().map(|p| (p.len() - 1) / 8 * 8).collect();
        assert_eq!(cached, expected, "{name}: prompt tokens resumed from snapshots");
        assert_eq!(hits, expected.iter().sum::<usize>() as u64, "{name}: hit tokens");
        let extended: Vec<Vec<u32>> = prompts.iter().zip(&want).map(|(p, g)| [&p[..], &g[..8]].concat()).collect();
        let again = drive(&mut e, &extended);
        for (i, (got, full)) in again.iter().zip(&want).enumerate() {
            // The continuation of prompt + its first 8 greedy tokens is the rest of them.
            assert_eq!(got[..8], full[8..], "{name} prompt {i}: extended after a hit");
        }
        assert!(metrics.prefix_cache_hit_tokens.get() > cold_hits + hits, "{name}: extended prompts hit");
    }
}

/// Prompt-lookup speculation proposes tokens the target often rejects; each rejection
/// returns the state to its copy after the last accepted token, so the output is the
/// transformers greedy one. With prefix caching and chunked prefill on, as users run it.
#[test]
fn speculation_rolls_the_state_back_to_the_last_accepted_token() {
    let ngram = SpeculativeConfig { ngram_min: 1, ..SpeculativeConfig::ngram(4) };
    for name in HYBRIDS {
        let f = load(name);
        let (prompts, want) = (f.prompts.clone(), f.greedy.clone());
        let config = EngineConfig { max_prefill_chunk: Some(5), block_size: 4, ..EngineConfig::default() };
        let (e, metrics) = speculating_engine(f, config, 512, 2, ngram.num_tokens);
        let mut e = e.with_speculative(&ngram).unwrap();
        assert_eq!(drive(&mut e, &prompts), want, "{name} with prompt lookup");
        let (drafted, accepted) = (metrics.spec_draft_tokens.get(), metrics.spec_accepted_tokens.get());
        assert!(drafted > accepted, "{name}: {drafted} drafted, {accepted} accepted: no rollback happened");
    }
}

#[test]
fn speculation_without_rollback_slots_or_by_early_exit_is_refused() {
    let (e, _) = engine(load("qwen3_next"), EngineConfig::default(), 64, 0);
    let err = e.with_speculative(&SpeculativeConfig::ngram(4)).err().expect("refused");
    assert!(err.to_string().contains("rollback"), "{err}");
    let f = load("qwen3_5");
    assert!(f.model.early_exit().is_none(), "a hybrid's first layers would advance its state");
}

/// `n` choices of one prompt: the later ones fork the first's blocks up to its last
/// snapshot and resume its state there, and (greedy) continue as it does.
#[test]
fn choices_of_one_prompt_fork_from_a_snapshot() {
    for name in HYBRIDS {
        let f = load(name);
        let (prompt, want) = (f.prompts[5].clone(), f.greedy[5].clone());
        let config = EngineConfig { block_size: 4, ..EngineConfig::default() };
        let (mut e, _) = engine(f, config, 512, 2);
        let stop = StopCriteria { max_new_tokens: 16, ..StopCriteria::default() };
        let req = EngineRequest::new(prompt.clone(), SamplingParams::greedy(), stop, 3, &e.limits()).unwrap();
        let mut stream = e.submit(req).unwrap();
        let (mut out, mut cached) = (vec![Vec::new(); 3], [0; 3]);
        while e.has_work() {
            e.step();
            while let Some(ev) = stream.try_next() {
                assert!(!matches!(ev.finish, Some(FinishReason::Error(_))), "{:?}", ev.finish);
                out[ev.index].extend(ev.token.map(|t| t.id));
                cached[ev.index] = ev.cached_prompt_tokens;
            }
        }
        for (i, o) in out.iter().enumerate() {
            assert_eq!(o, &want, "{name}: choice {i}");
        }
        let snapshot = (prompt.len() - 1) / 8 * 8;
        assert_eq!(cached, [0, snapshot, snapshot], "{name}: the later choices resume at the last snapshot");
        assert_eq!(e.free_blocks(), e.total_blocks());
    }
}
