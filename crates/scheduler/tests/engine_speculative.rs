//! Speculative decoding never changes the output: with proposers of every quality (always
//! right, always wrong, right at random, prompt lookup and a draft model) the engine's
//! greedy tokens, logprobs, finish reasons and events equal those of the same engine
//! without speculation, under every batching mode, prefix caching on and off, forced
//! preemption and every stop rule; blocks are conserved after every step
//! (`common::run_all`) and none is held at the end. Seeded sampled requests get the same
//! tokens too when the proposals are point masses (no distributions). Adaptive `k`, the
//! batch limit and the metrics are checked here too; drafts with distributions and the
//! draft model's own cache are `engine_drafts.rs`'s.

mod common;

use common::speculative::{PROPOSERS, Quality, assert_same, oracle, prompts, proposer, requests, run, streams};
use common::{Parts, Setup, run_all};
use met_config::SamplingParams;
use met_scheduler::FinishReason;
use met_scheduler::mock::MockModel;
use met_speculative::{Proposer, SpeculativeConfig};
use proptest::prelude::*;

#[test]
fn every_proposer_leaves_the_outputs_unchanged_in_every_mode() {
    let prompts = prompts();
    let mock = MockModel::new(common::VOCAB, common::MAX_CONTEXT);
    for prefix in [true, false] {
        for chunk in [None, Some(1), Some(7)] {
            let mut setup = Setup::new(512).prefix_caching(prefix);
            setup.config.max_prefill_chunk = chunk;
            let (plain, _) = run(&setup, None, requests(&prompts));
            for (i, (o, p)) in plain.iter().zip(&prompts).enumerate() {
                assert_eq!(o.tokens[0], mock.reference_greedy(p, 1 + (i * 5) % 17), "plain run, request {i}");
            }
            for name in PROPOSERS {
                for k in [1, 3, 8] {
                    let what = format!("{name}, k {k}, prefix caching {prefix}, chunk {chunk:?}");
                    let (got, metrics) = run(&setup, Some((proposer(name), k)), requests(&prompts));
                    assert_same(&got, &plain, &what);
                    let (drafted, accepted) = (metrics.spec_draft_tokens.get(), metrics.spec_accepted_tokens.get());
                    assert!(drafted > 0, "{what}: nothing was proposed");
                    match name {
                        "right" | "draft" => assert_eq!(accepted, drafted, "{what}: a right proposal was rejected"),
                        "wrong" => assert_eq!(accepted, 0, "{what}: a wrong proposal was accepted"),
                        _ => assert!(accepted <= drafted),
                    }
                }
            }
        }
    }
}

#[test]
fn right_proposals_take_fewer_steps() {
    let prompt: Vec<u32> = (0..10).collect();
    let steps = |proposer: Option<Box<dyn Proposer>>| {
        let (engine, metrics) = Setup::new(64).engine();
        let mut engine = match proposer {
            Some(p) => engine.with_proposer(p, 4),
            None => engine,
        };
        run_all(&mut engine, vec![common::greedy(prompt.clone(), 20)]);
        metrics.step_duration.count()
    };
    // Plain: a prefill step and 19 decode steps. Right guesses of 4: 1 + ceil(19 / 5).
    assert_eq!(steps(None), 20);
    assert_eq!(steps(Some(oracle(Quality::Right))), 5);
    assert_eq!(steps(Some(oracle(Quality::Wrong))), 20);
}

#[test]
fn forced_preemption_keeps_the_outputs() {
    let prompts = prompts();
    for prefix in [true, false] {
        // 22 blocks of 4 tokens: the longest request needs 20 on its own.
        let setup = Setup::new(22).prefix_caching(prefix);
        let (plain, plain_metrics) = run(&setup, None, requests(&prompts));
        assert!(plain_metrics.preemptions.get() > 0, "the pool is too small, yet nothing was preempted");
        for name in PROPOSERS {
            let (got, metrics) = run(&setup, Some((proposer(name), 6)), requests(&prompts));
            assert_same(&got, &plain, &format!("{name}, prefix caching {prefix}"));
            assert!(metrics.preemptions.get() > 0, "{name}: nothing was preempted");
        }
    }
}

#[test]
fn stop_rules_hold_per_token_inside_a_draft() {
    let prompt: Vec<u32> = (0..12).collect();
    let mock = MockModel::new(common::VOCAB, common::MAX_CONTEXT);
    let free = mock.reference_greedy(&prompt, 30);
    // The greedy continuation's 6th token stops it; banned before 8 tokens, it cannot end
    // the sequence before, and the continuation changes.
    let stop_token = free[5];
    let cases = [
        Parts {
            stop: met_scheduler::StopCriteria {
                stop_token_ids: vec![stop_token],
                max_new_tokens: 30,
                ..Default::default()
            },
            ..Parts::greedy(prompt.clone(), 30)
        },
        Parts {
            stop: met_scheduler::StopCriteria {
                eos_token_ids: vec![stop_token],
                max_new_tokens: 30,
                ..Default::default()
            },
            ..Parts::greedy(prompt.clone(), 30)
        },
        Parts {
            stop: met_scheduler::StopCriteria {
                eos_token_ids: vec![stop_token],
                min_new_tokens: 8,
                max_new_tokens: 30,
                ..Default::default()
            },
            ..Parts::greedy(prompt.clone(), 30)
        },
        Parts {
            stop: met_scheduler::StopCriteria {
                eos_token_ids: vec![stop_token],
                ignore_eos: true,
                max_new_tokens: 30,
                ..Default::default()
            },
            ..Parts::greedy(prompt.clone(), 30)
        },
        Parts::greedy(prompt.clone(), 7),
        Parts::with(prompt.clone(), 20, SamplingParams { logprobs: Some(3), ..SamplingParams::greedy() }),
        Parts::with(
            prompt.clone(),
            20,
            SamplingParams { repetition_penalty: 1.5, frequency_penalty: 0.7, ..SamplingParams::greedy() },
        ),
    ];
    let requests = || cases.iter().cloned().map(Parts::make).collect::<Vec<_>>();
    let (plain, _) = run(&Setup::new(64), None, requests());
    assert_eq!(plain[0].tokens[0], free[..6], "stops at the stop token");
    assert_eq!(plain[0].finish[0], Some(FinishReason::Stop));
    assert!(plain[2].tokens[0].len() >= 8, "min_tokens holds the end token back");
    assert_eq!(plain[4].tokens[0].len(), 7);
    for name in PROPOSERS {
        for k in [2, 8, 16] {
            let (got, _) = run(&Setup::new(64), Some((proposer(name), k)), requests());
            assert_same(&got, &plain, &format!("{name}, k {k}"));
        }
    }
}

/// Sampled requests of every setting the sampler has, seeded: with point-mass proposals
/// (every test proposer and prompt lookup) each gets exactly the tokens, logprobs and
/// finish it gets without speculation, because verifying a point mass is a plain draw
/// compared with the proposed token.
#[test]
fn sampled_requests_get_the_same_tokens_with_point_mass_drafts() {
    let prompt: Vec<u32> = (0..12).chain(0..12).collect();
    let sampled = |seed, sampling: SamplingParams| Parts::with(prompt.clone(), 24, SamplingParams { seed, ..sampling });
    let cases = [
        sampled(7, SamplingParams { temperature: 0.9, top_p: 0.95, ..SamplingParams::default() }),
        sampled(8, SamplingParams { temperature: 1.5, top_k: 10, min_p: 0.05, ..SamplingParams::default() }),
        sampled(
            9,
            SamplingParams {
                temperature: 0.7,
                repetition_penalty: 1.3,
                frequency_penalty: 0.5,
                presence_penalty: 0.3,
                logit_bias: vec![(3, 2.0)],
                logprobs: Some(2),
                ..SamplingParams::default()
            },
        ),
        Parts { n: 3, ..sampled(10, SamplingParams { temperature: 0.5, ..SamplingParams::default() }) },
        Parts {
            stop: met_scheduler::StopCriteria {
                eos_token_ids: vec![5],
                min_new_tokens: 6,
                max_new_tokens: 24,
                ..Default::default()
            },
            ..sampled(11, SamplingParams::default())
        },
    ];
    let requests = || cases.iter().cloned().map(Parts::make).collect::<Vec<_>>();
    let (plain, _) = run(&Setup::new(256), None, requests());
    for name in PROPOSERS {
        for k in [1, 4, 8] {
            let what = format!("{name}, k {k}");
            let (got, metrics) = run(&Setup::new(256), Some((proposer(name), k)), requests());
            assert_same(&got, &plain, &what);
            assert!(metrics.spec_draft_tokens.get() > 0, "{what}: sampled requests were not speculated on");
            if name == "right" {
                assert!(metrics.spec_accepted_tokens.get() > 0, "{what}: no likely token was accepted");
            }
        }
    }
}

/// Runs one greedy request of 20 tokens with `proposer` at `k` 8 under `speculative`'s
/// policy; returns the draft tokens verified and the steps taken.
fn drafted_with(proposer: Box<dyn Proposer>, speculative: &SpeculativeConfig) -> (u64, u64) {
    let (engine, metrics) = Setup::new(64).engine();
    let mut engine = engine.with_proposer_config(proposer, speculative);
    let prompt: Vec<u32> = (0..10).collect();
    let out = run_all(&mut engine, vec![common::greedy(prompt.clone(), 20)]);
    assert_eq!(out[0].tokens[0], MockModel::new(common::VOCAB, common::MAX_CONTEXT).reference_greedy(&prompt, 20));
    (metrics.spec_draft_tokens.get(), metrics.step_duration.count())
}

/// Adaptive `k` shrinks a sequence's drafts after rejections (one fewer each, down to 1)
/// and keeps them whole while they are accepted: always-wrong proposals of up to 8 tokens
/// cost 46 verified tokens over the 18 drafting steps instead of 116, right ones take as
/// few steps as a fixed `k`.
#[test]
fn adaptive_k_follows_each_sequences_acceptance() {
    let adaptive = SpeculativeConfig::ngram(8);
    let fixed = SpeculativeConfig { adaptive: false, ..adaptive.clone() };
    // Fixed: min(8, room) at each of generated = 1..=18, room = 19 - generated.
    assert_eq!(drafted_with(oracle(Quality::Wrong), &fixed).0, 8 * 11 + (1..=7).sum::<u64>());
    // Adaptive: 8, 7, ..., 1 over the first 8 steps, then 1 for the other 10.
    assert_eq!(drafted_with(oracle(Quality::Wrong), &adaptive).0, (1..=8).sum::<u64>() + 10);
    assert_eq!(drafted_with(oracle(Quality::Right), &adaptive), drafted_with(oracle(Quality::Right), &fixed));
}

/// Above the batch limit nothing is proposed: three requests at once under a limit of 1
/// draft only once two have finished; outputs are unchanged either way.
#[test]
fn speculation_pauses_above_the_batch_limit() {
    let prompts = prompts();
    let limited = |max_batch| SpeculativeConfig { max_batch, ..SpeculativeConfig::ngram(4) };
    let requests = || (0..3).map(|i| common::greedy(prompts[i].clone(), 4 + 8 * i)).collect::<Vec<_>>();
    let (plain, _) = run(&Setup::new(512), None, requests());
    let mut drafted = Vec::new();
    for max_batch in [Some(1), Some(3), None] {
        let (engine, metrics) = Setup::new(512).engine();
        let mut engine = engine.with_proposer_config(oracle(Quality::Right), &limited(max_batch));
        assert_same(&run_all(&mut engine, requests()), &plain, &format!("limit {max_batch:?}"));
        drafted.push(metrics.spec_draft_tokens.get());
    }
    // Under a limit of 1 only the longest request drafts, once it runs alone.
    assert!(drafted[0] > 0 && drafted[0] < drafted[1], "{drafted:?}");
    assert_eq!(drafted[1], drafted[2], "a limit of 3 never binds for 3 requests");
}

#[test]
fn acceptance_is_reported_in_the_metrics() {
    let prompt: Vec<u32> = (0..10).collect();
    let (_, metrics) = run(&Setup::new(64), Some((oracle(Quality::Right), 4)), vec![common::greedy(prompt, 11)]);
    // 10 decode tokens after the prefill's: two steps of 4 accepted + 1, then none left.
    assert_eq!(metrics.spec_drafts.get(), 2);
    assert_eq!(metrics.spec_draft_tokens.get(), 8);
    assert_eq!(metrics.spec_accepted_tokens.get(), 8);
    assert_eq!(metrics.generated_tokens.get(), 11);
    let text = metrics.render();
    assert!(text.contains("met_spec_decode_acceptance_rate 1.0\n"), "{text}");
    assert!(text.contains("met_spec_decode_tokens_per_step 5.0\n"), "{text}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Random request sets (greedy and seeded sampled), budgets, chunk sizes, cache sizes,
    /// prefix caching, stop rules, `n`, `k` and proposal quality: speculation changes no
    /// event, and no block leaks.
    #[test]
    fn random_workloads_are_unchanged_by_speculation(
        prompts in prop::collection::vec(prop::collection::vec(0u32..4, 1..30), 1..10),
        news in prop::collection::vec(1usize..14, 10),
        stops in prop::collection::vec(prop::option::of(0u32..common::VOCAB as u32), 10),
        min_new in 0usize..4,
        kv_blocks in 12usize..40,
        chunk in prop::option::of(1usize..9),
        budget in 1usize..64,
        seqs in 1usize..8,
        prefix in any::<bool>(),
        k in 1usize..8,
        quality in 0.0f64..1.0,
    ) {
        let mut setup = Setup::new(kv_blocks).prefix_caching(prefix);
        setup.config.max_prefill_chunk = chunk;
        setup.config.max_batch_tokens = budget;
        setup.config.max_num_seqs = seqs;
        let requests = || {
            prompts.iter().zip(&news).zip(&stops).enumerate().map(|(i, ((p, &n), &stop))| {
                // Every other request samples (seeded): point-mass drafts keep its tokens too.
                let mut parts = if i % 2 == 0 {
                    Parts { n: 1 + p.len() % 3, ..Parts::greedy(p.clone(), n) }
                } else {
                    Parts { n: 1 + p.len() % 3, ..Parts::sampled(p.clone(), n, i as u64) }
                };
                parts.stop.eos_token_ids = stop.into_iter().collect();
                parts.stop.min_new_tokens = min_new.min(n);
                parts.make()
            }).collect::<Vec<_>>()
        };
        let (plain, _) = run(&setup, None, requests());
        let (got, _) = run(&setup, Some((oracle(Quality::Random(quality)), k)), requests());
        for (x, y) in got.iter().zip(&plain) {
            prop_assert_eq!(streams(x), streams(y));
        }
    }
}
