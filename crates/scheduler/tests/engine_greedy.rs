//! Greedy outputs through the engine equal the mock model's cache-free reference,
//! whatever the batching: alone, in a batch of 32 mixed-length requests, with prefix
//! caching on and off, prefill chunks of 1 and 7, and under forced preemption. Block
//! conservation is checked after every step (see `common::run_all`).

mod common;

use common::{Setup, greedy, run_all};
use met_scheduler::FinishReason;
use met_scheduler::mock::MockModel;
use proptest::prelude::*;

/// 32 prompts of mixed length; half share a long common prefix so the prefix cache has
/// something to reuse.
fn mixed_prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..21).map(|i| (i * 7 % 61) as u32).collect();
    (0..32)
        .map(|i| {
            let len = 1 + (i * 13) % 37;
            let own = (0..len).map(|j| ((i * 31 + j * 17) % 64) as u32);
            if i % 2 == 0 { shared.iter().copied().chain(own).collect() } else { own.collect() }
        })
        .collect()
}

fn max_new(i: usize) -> usize {
    1 + (i * 5) % 12
}

fn reference(prompts: &[Vec<u32>]) -> Vec<Vec<u32>> {
    let mock = MockModel::new(common::VOCAB, common::MAX_CONTEXT);
    prompts.iter().enumerate().map(|(i, p)| mock.reference_greedy(p, max_new(i))).collect()
}

/// Runs prompts `first..` of `prompts` (request `i` generates `max_new(i)` tokens).
fn run_batch(setup: &Setup, prompts: &[Vec<u32>], first: usize) -> (Vec<Vec<u32>>, u64) {
    let (mut engine, metrics) = setup.engine();
    let requests = prompts.iter().enumerate().map(|(i, p)| greedy(p.clone(), max_new(first + i))).collect();
    let outcomes = run_all(&mut engine, requests);
    for o in &outcomes {
        assert_eq!(o.finish, [Some(FinishReason::Length)]);
    }
    (outcomes.into_iter().map(|o| o.tokens[0].clone()).collect(), metrics.preemptions.get())
}

#[test]
fn each_request_alone_matches_the_reference() {
    let prompts = mixed_prompts();
    let want = reference(&prompts);
    for (i, p) in prompts.iter().enumerate() {
        let (got, _) = run_batch(&Setup::new(64), std::slice::from_ref(p), i);
        assert_eq!(got[0], want[i], "prompt {i}");
    }
}

#[test]
fn a_batch_of_32_matches_in_every_mode() {
    let prompts = mixed_prompts();
    let want = reference(&prompts);
    for prefix in [true, false] {
        for chunk in [None, Some(1), Some(7)] {
            let mut setup = Setup::new(512).prefix_caching(prefix);
            setup.config.max_prefill_chunk = chunk;
            let (got, preempted) = run_batch(&setup, &prompts, 0);
            assert_eq!(got, want, "prefix caching {prefix}, chunk {chunk:?}");
            assert_eq!(preempted, 0, "a roomy cache should not preempt");
        }
    }
}

#[test]
fn forced_preemption_gives_identical_output() {
    let prompts = mixed_prompts();
    let want = reference(&prompts);
    for prefix in [true, false] {
        for chunk in [None, Some(7)] {
            // 18 blocks of 4 tokens: the longest request (67 tokens) needs 17 on its own.
            let mut setup = Setup::new(18).prefix_caching(prefix);
            setup.config.max_prefill_chunk = chunk;
            let (got, preempted) = run_batch(&setup, &prompts, 0);
            assert_eq!(got, want, "prefix caching {prefix}, chunk {chunk:?}");
            assert!(preempted > 0, "the pool is too small for the batch, yet nothing was preempted");
        }
    }
}

#[test]
fn prefix_caching_reports_cached_prompt_tokens() {
    let shared: Vec<u32> = (0..16).collect();
    let (mut engine, metrics) = Setup::new(64).engine();
    let first = run_all(&mut engine, vec![greedy([&shared[..], &[40]].concat(), 2)]);
    assert_eq!(first[0].cached, [0]);
    let second = run_all(&mut engine, vec![greedy([&shared[..], &[41, 42]].concat(), 2)]);
    assert_eq!(second[0].cached, [16], "four full blocks of the shared prefix are reused");
    assert_eq!(metrics.prefix_cache_hit_tokens.get(), 16);
    let (mut off, _) = Setup::new(64).prefix_caching(false).engine();
    run_all(&mut off, vec![greedy([&shared[..], &[40]].concat(), 2)]);
    let again = run_all(&mut off, vec![greedy([&shared[..], &[41, 42]].concat(), 2)]);
    assert_eq!(again[0].cached, [0]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random request sets under random budgets, chunk sizes, cache sizes and prefix
    /// caching: every output equals the reference and no block leaks.
    #[test]
    fn random_workloads_match_the_reference(
        prompts in prop::collection::vec(prop::collection::vec(0u32..4, 1..30), 1..12),
        news in prop::collection::vec(1usize..10, 12),
        kv_blocks in 12usize..40,
        chunk in prop::option::of(1usize..9),
        budget in 1usize..64,
        seqs in 1usize..8,
        prefix in any::<bool>(),
    ) {
        let mock = MockModel::new(common::VOCAB, common::MAX_CONTEXT);
        let mut setup = Setup::new(kv_blocks).prefix_caching(prefix);
        setup.config.max_prefill_chunk = chunk;
        setup.config.max_batch_tokens = budget;
        setup.config.max_num_seqs = seqs;
        let (mut engine, _) = setup.engine();
        // Some requests ask for 2 or 3 continuations, which share the prompt's blocks.
        let requests = prompts
            .iter()
            .zip(&news)
            .map(|(p, &n)| common::Parts { n: 1 + p.len() % 3, ..common::Parts::greedy(p.clone(), n) }.make())
            .collect();
        let outcomes = run_all(&mut engine, requests);
        for ((o, p), &n) in outcomes.iter().zip(&prompts).zip(&news) {
            let want = mock.reference_greedy(p, n);
            prop_assert_eq!(o.tokens.len(), 1 + p.len() % 3);
            for (tokens, finish) in o.tokens.iter().zip(&o.finish) {
                // A sequence longer than the whole cache stops early with Length.
                prop_assert!(want.starts_with(tokens), "{:?} vs {:?}", tokens, want);
                if (p.len() + n).div_ceil(4) <= kv_blocks {
                    prop_assert_eq!(tokens, &want);
                }
                prop_assert_eq!(finish, &Some(FinishReason::Length));
            }
        }
    }
}
