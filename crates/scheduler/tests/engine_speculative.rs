//! Speculative decoding never changes the output: with proposers of every quality (always
//! right, always wrong, right at random, and prompt lookup) the engine's greedy tokens,
//! logprobs, finish reasons and events equal those of the same engine without speculation,
//! under every batching mode, prefix caching on and off, forced preemption and every stop
//! rule; blocks are conserved after every step (`common::run_all`) and none is held at the
//! end. Seeded sampled requests get the same tokens too when the proposals are point masses
//! (no distributions), and drafts with distributions keep the sampling distribution (a
//! two-sample χ² test that a dishonest draft fails).

mod common;

use common::{Outcome, Parts, Setup, run_all};
use met_config::SamplingParams;
use met_kernels::CpuBackend;
use met_scheduler::mock::MockModel;
use met_scheduler::{Engine, EngineRequest, FinishReason, GeneratedToken};
use met_speculative::{DraftModelProposer, NgramProposer, Proposal, ProposalContext, Proposer, SpeculativeConfig};
use met_telemetry::Metrics;
use proptest::prelude::*;

/// How good a test proposer's guesses are.
#[derive(Debug, Clone, Copy)]
enum Quality {
    /// The mock's own greedy continuation: every token accepted.
    Right,
    /// One off the mock's greedy token at every position: nothing accepted.
    Wrong,
    /// Each token right with this probability, else a random one (seeded by the context).
    Random(f64),
}

/// A proposer that knows the mock model's greedy continuation and errs as told.
struct Oracle {
    mock: MockModel,
    quality: Quality,
}

impl Proposer for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        out.clear();
        let right = self.mock.reference_greedy(ctx.tokens, ctx.max_tokens);
        let mut state = ctx.tokens.iter().fold(0x9E37_79B9_7F4A_7C15u64, |h, &t| mix(h ^ u64::from(t)));
        for t in right {
            state = mix(state);
            let token = match self.quality {
                Quality::Right => t,
                Quality::Wrong => (t + 1) % common::VOCAB as u32,
                Quality::Random(p) if (state >> 11) as f64 / (1u64 << 53) as f64 <= p => t,
                Quality::Random(_) => (mix(state) % common::VOCAB as u64) as u32,
            };
            out.tokens.push(token);
        }
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB)
}

fn oracle(quality: Quality) -> Box<dyn Proposer> {
    Box::new(Oracle { mock: MockModel::new(common::VOCAB, common::MAX_CONTEXT), quality })
}

/// The proposers every equivalence test runs with.
const PROPOSERS: [&str; 5] = ["right", "wrong", "random", "ngram", "draft"];

/// A draft model equal to the target: a second mock with its own cache, whose greedy
/// tokens are the target's, so every draft of a greedy request is right unless the draft's
/// own cache (catch-up after acceptance, rollback after rejection) is wrong.
fn draft_model() -> DraftModelProposer {
    let mock = Box::new(MockModel::new(common::VOCAB, common::MAX_CONTEXT));
    DraftModelProposer::new(mock, std::sync::Arc::new(CpuBackend::new()), common::VOCAB, 1024, 4).unwrap()
}

fn proposer(name: &str) -> Box<dyn Proposer> {
    match name {
        "right" => oracle(Quality::Right),
        "wrong" => oracle(Quality::Wrong),
        "random" => oracle(Quality::Random(0.6)),
        "ngram" => Box::new(NgramProposer::new(1..=4)),
        "draft" => Box::new(draft_model()),
        _ => unreachable!("unknown test proposer {name}"),
    }
}

/// Runs `requests` on `setup`'s engine, speculating with `proposer` when given; returns
/// the outcomes, the engine's metrics and the steps it took.
fn run(
    setup: &Setup,
    proposer: Option<(Box<dyn Proposer>, usize)>,
    requests: Vec<EngineRequest>,
) -> (Vec<Outcome>, std::sync::Arc<Metrics>) {
    let (engine, metrics) = setup.engine();
    let mut engine: Engine = match proposer {
        Some((p, k)) => engine.with_proposer(p, k),
        None => engine,
    };
    (run_all(&mut engine, requests), metrics)
}

/// Each continuation's events in order: its tokens (with logprobs) and finish. How the
/// continuations of one request interleave, and how much of a prompt the prefix cache
/// held, depend on timing with or without speculation.
fn streams(o: &Outcome) -> Vec<Vec<(Option<GeneratedToken>, Option<FinishReason>)>> {
    let mut out = vec![Vec::new(); o.tokens.len()];
    for e in &o.events {
        out[e.index].push((e.token.clone(), e.finish.clone()));
    }
    out
}

/// The tokens, finishes and events of `a` and `b` are the same.
fn assert_same(a: &[Outcome], b: &[Outcome], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: request {i} tokens");
        assert_eq!(x.finish, y.finish, "{what}: request {i} finish");
        assert_eq!(streams(x), streams(y), "{what}: request {i} events");
    }
}

/// 24 prompts of mixed length, half sharing a prefix; some repeat themselves so prompt
/// lookup finds matches.
fn prompts() -> Vec<Vec<u32>> {
    let shared: Vec<u32> = (0..21).map(|i| (i * 7 % 61) as u32).collect();
    (0..24)
        .map(|i| {
            let len = 1 + (i * 13) % 29;
            let own: Vec<u32> = (0..len).map(|j| ((i * 31 + j * 17) % 64) as u32).collect();
            let own = if i % 3 == 0 { [&own[..], &own[..]].concat() } else { own };
            if i % 2 == 0 { [&shared[..], &own[..]].concat() } else { own }
        })
        .collect()
}

fn requests(prompts: &[Vec<u32>]) -> Vec<EngineRequest> {
    prompts.iter().enumerate().map(|(i, p)| common::greedy(p.clone(), 1 + (i * 5) % 17)).collect()
}

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

/// A proposer that samples its draft from the mock's logits at its own temperature and
/// reports that distribution; a dishonest one proposes the distribution's mode instead of a
/// draw from it, which rejection sampling cannot correct for.
struct Tempered {
    mock: MockModel,
    temperature: f64,
    honest: bool,
    /// Whether to report the distributions at all (without them, drafts are point masses).
    report: bool,
}

impl Proposer for Tempered {
    fn name(&self) -> &'static str {
        "tempered"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        out.clear();
        let mut history = ctx.tokens.to_vec();
        let mut probs = Vec::new();
        // The draft's own random stream: a function of the context, so runs repeat.
        let mut state = ctx.tokens.iter().fold(ctx.sequence, |h, &t| mix(h ^ u64::from(t)));
        for _ in 0..ctx.max_tokens {
            let logits = self.mock.logits(&history);
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f64> = logits.iter().map(|&l| (f64::from(l - max) / self.temperature).exp()).collect();
            let q: Vec<f64> = w.iter().map(|x| x / w.iter().sum::<f64>()).collect();
            state = mix(state);
            let u = (state >> 11) as f64 / (1u64 << 53) as f64;
            let mut cum = 0.0;
            let drawn = q.iter().position(|&x| {
                cum += x;
                cum > u
            });
            let mode = (0..q.len()).max_by(|&a, &b| q[a].total_cmp(&q[b])).expect("a vocabulary");
            let token = if self.honest { drawn.unwrap_or(q.len() - 1) } else { mode } as u32;
            out.tokens.push(token);
            probs.extend(q.iter().map(|&x| x as f32));
            history.push(token);
        }
        out.probs = self.report.then_some(probs);
    }
}

fn tempered(honest: bool, report: bool) -> Box<dyn Proposer> {
    Box::new(Tempered { mock: MockModel::new(common::VOCAB, common::MAX_CONTEXT), temperature: 2.5, honest, report })
}

/// Two-sample χ² homogeneity statistic of equally sized samples `a` and `b` over their 7
/// most frequent values and the rest pooled, with its degrees of freedom.
fn homogeneity(a: &[u32], b: &[u32]) -> (f64, usize) {
    assert_eq!(a.len(), b.len());
    let count = |xs: &[u32]| {
        let mut c = vec![0u64; common::VOCAB];
        xs.iter().for_each(|&x| c[x as usize] += 1);
        c
    };
    let (ca, cb) = (count(a), count(b));
    let mut order: Vec<usize> = (0..common::VOCAB).collect();
    order.sort_by_key(|&t| std::cmp::Reverse(ca[t] + cb[t]));
    let mut cells: Vec<(u64, u64)> = order[..7].iter().map(|&t| (ca[t], cb[t])).collect();
    cells.push(order[7..].iter().fold((0, 0), |(x, y), &t| (x + ca[t], y + cb[t])));
    cells.retain(|&(x, y)| x + y > 0);
    let stat = cells.iter().map(|&(x, y)| (x as f64 - y as f64).powi(2) / (x + y) as f64).sum();
    (stat, cells.len() - 1)
}

/// χ² with 7 degrees of freedom exceeds this with probability 1e-6.
const CRITICAL_DF7: f64 = 40.522;

/// 3000 seeded requests of one prompt through a sampling engine with drafts drawn from a
/// tempered distribution `q` that the engine verifies by rejection sampling, against 3000
/// more (other seeds) without speculation: the generated tokens at positions 2 and 3 (the
/// first ones verified as draft rows) have the same distribution, by a two-sample χ² test
/// at significance 1e-6 (df 7; the seeds are fixed, so the test passes or fails
/// deterministically). The same test rejects a dishonest draft that proposes `q`'s mode
/// while reporting `q`, so it can fail. Drafts with their distributions are accepted more
/// often than the same drafts as point masses, and a second run repeats the first exactly.
#[test]
fn drafts_with_distributions_keep_the_sampling_distribution() {
    let n = 3000u64;
    let params = SamplingParams { temperature: 3.0, top_p: 0.98, presence_penalty: 0.3, ..SamplingParams::default() };
    let requests = |seeds: std::ops::Range<u64>| {
        let prompt: Vec<u32> = vec![5, 17, 42, 8, 8];
        seeds.map(|seed| Parts::with(prompt.clone(), 4, SamplingParams { seed, ..params.clone() }).make()).collect()
    };
    let mut setup = Setup::new(4 * n as usize);
    setup.config.max_num_seqs = 512;
    setup.config.max_batch_tokens = 4096;
    let at = |outcomes: &[Outcome], i: usize| outcomes.iter().map(|o| o.tokens[0][i]).collect::<Vec<u32>>();
    let (plain, _) = run(&setup, None, requests(n..2 * n));
    let (honest, metrics) = run(&setup, Some((tempered(true, true), 3)), requests(0..n));
    let (dishonest, _) = run(&setup, Some((tempered(false, true), 3)), requests(0..n));
    for i in [1, 2] {
        let (stat, df) = homogeneity(&at(&honest, i), &at(&plain, i));
        assert_eq!(df, 7);
        assert!(stat < CRITICAL_DF7, "token {i}: χ² = {stat:.2} ≥ {CRITICAL_DF7} (df 7)");
        let (stat, _) = homogeneity(&at(&dishonest, i), &at(&plain, i));
        assert!(stat > CRITICAL_DF7, "token {i}: the dishonest draft passes, χ² = {stat:.2}");
    }
    let (drafted, accepted) = (metrics.spec_draft_tokens.get(), metrics.spec_accepted_tokens.get());
    assert!(drafted >= 2 * n, "{drafted} draft tokens for {n} requests");
    let (_, point_mass) = run(&setup, Some((tempered(true, false), 3)), requests(0..n));
    assert!(
        accepted > point_mass.spec_accepted_tokens.get() * 3 / 2,
        "with q: {accepted} accepted, as point masses: {}",
        point_mass.spec_accepted_tokens.get()
    );
    let (again, _) = run(&setup, Some((tempered(true, true), 3)), requests(0..n));
    for (x, y) in again.iter().zip(&honest) {
        assert_eq!(streams(x), streams(y), "a seeded request changed between runs");
    }
}

/// A draft model of another vocabulary is refused, naming the flag; its pool's blocks are
/// all free again once every request ended (the draft's sequences are forgotten).
#[test]
fn a_draft_model_must_share_the_vocabulary() {
    let (engine, _) = Setup::new(64).engine();
    let small = Box::new(MockModel::new(common::VOCAB / 2, common::MAX_CONTEXT));
    let err = engine
        .with_draft_model(&SpeculativeConfig::ngram(4), small, std::sync::Arc::new(CpuBackend::new()))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("--draft-model: the draft model has a vocabulary of 32 tokens, the target 64"), "{err}");
    let (engine, metrics) = Setup::new(64).engine();
    let same = Box::new(MockModel::new(common::VOCAB, common::MAX_CONTEXT));
    let mut engine =
        engine.with_draft_model(&SpeculativeConfig::ngram(4), same, std::sync::Arc::new(CpuBackend::new())).unwrap();
    let prompt: Vec<u32> = (0..10).collect();
    let out = run_all(&mut engine, vec![common::greedy(prompt.clone(), 20)]);
    assert_eq!(out[0].tokens[0], MockModel::new(common::VOCAB, common::MAX_CONTEXT).reference_greedy(&prompt, 20));
    assert_eq!(metrics.spec_accepted_tokens.get(), metrics.spec_draft_tokens.get());
    assert!(metrics.spec_draft_tokens.get() >= 15);
}

/// The draft model's proposals, checked against what the draft (a mock like the target)
/// proposes from scratch: its cache must track every sequence through acceptances,
/// rejections (sampled requests reject greedy drafts often), preemption and `n > 1`.
struct Checked {
    inner: DraftModelProposer,
    mock: MockModel,
    checked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Proposer for Checked {
    fn name(&self) -> &'static str {
        "checked draft"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        self.inner.propose(ctx, out);
        if !out.tokens.is_empty() {
            assert_eq!(out.tokens, self.mock.reference_greedy(ctx.tokens, ctx.max_tokens), "for {:?}", ctx.tokens);
            self.checked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    fn forget(&mut self, sequence: u64) {
        self.inner.forget(sequence);
    }
}

#[test]
fn the_draft_models_cache_follows_acceptance_rejection_and_preemption() {
    let prompts = prompts();
    let requests = || {
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| Parts { n: 1 + i % 2, ..Parts::sampled(p.clone(), 1 + (i * 5) % 17, i as u64) }.make())
            .collect::<Vec<_>>()
    };
    for blocks in [512, 22] {
        let setup = Setup::new(blocks);
        let (plain, _) = run(&setup, None, requests());
        let checked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let proposer = Checked {
            inner: draft_model(),
            mock: MockModel::new(common::VOCAB, common::MAX_CONTEXT),
            checked: std::sync::Arc::clone(&checked),
        };
        let (got, metrics) = run(&setup, Some((Box::new(proposer), 4)), requests());
        assert_same(&got, &plain, &format!("{blocks} blocks"));
        let (drafted, accepted) = (metrics.spec_draft_tokens.get(), metrics.spec_accepted_tokens.get());
        assert!(accepted > 0 && accepted < drafted, "{blocks} blocks: {accepted} of {drafted} accepted");
        assert!(checked.load(std::sync::atomic::Ordering::Relaxed) > 20, "{blocks} blocks: too few proposals");
        assert_eq!(blocks == 22, metrics.preemptions.get() > 0, "{blocks} blocks: preemptions");
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
