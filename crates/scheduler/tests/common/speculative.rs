//! What the speculative-decoding tests share: test proposers of every quality (an oracle
//! that knows the mock's greedy continuation and errs as told, prompt lookup, a draft model
//! equal to the target), a run with or without speculation, and the comparison of two runs'
//! events.

use met_kernels::CpuBackend;
use met_scheduler::mock::MockModel;
use met_scheduler::{Engine, EngineRequest, FinishReason, GeneratedToken};
use met_speculative::{DraftModelProposer, NgramProposer, Proposal, ProposalContext, Proposer};
use met_telemetry::Metrics;

use super::{Outcome, Setup, run_all};
use crate::common;

/// How good a test proposer's guesses are.
#[derive(Debug, Clone, Copy)]
pub enum Quality {
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

pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB)
}

pub fn oracle(quality: Quality) -> Box<dyn Proposer> {
    Box::new(Oracle { mock: MockModel::new(common::VOCAB, common::MAX_CONTEXT), quality })
}

/// The proposers every equivalence test runs with.
pub const PROPOSERS: [&str; 5] = ["right", "wrong", "random", "ngram", "draft"];

/// A draft model equal to the target: a second mock with its own cache, whose greedy
/// tokens are the target's, so every draft of a greedy request is right unless the draft's
/// own cache (catch-up after acceptance, rollback after rejection) is wrong.
pub fn draft_model() -> DraftModelProposer {
    let mock = Box::new(MockModel::new(common::VOCAB, common::MAX_CONTEXT));
    DraftModelProposer::new(mock, std::sync::Arc::new(CpuBackend::new()), common::VOCAB, 1024, 4).unwrap()
}

pub fn proposer(name: &str) -> Box<dyn Proposer> {
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
pub fn run(
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
pub fn streams(o: &Outcome) -> Vec<Vec<(Option<GeneratedToken>, Option<FinishReason>)>> {
    let mut out = vec![Vec::new(); o.tokens.len()];
    for e in &o.events {
        out[e.index].push((e.token.clone(), e.finish.clone()));
    }
    out
}

/// The tokens, finishes and events of `a` and `b` are the same.
pub fn assert_same(a: &[Outcome], b: &[Outcome], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.tokens, y.tokens, "{what}: request {i} tokens");
        assert_eq!(x.finish, y.finish, "{what}: request {i} finish");
        assert_eq!(streams(x), streams(y), "{what}: request {i} events");
    }
}

/// 24 prompts of mixed length, half sharing a prefix; some repeat themselves so prompt
/// lookup finds matches.
pub fn prompts() -> Vec<Vec<u32>> {
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

pub fn requests(prompts: &[Vec<u32>]) -> Vec<EngineRequest> {
    prompts.iter().enumerate().map(|(i, p)| common::greedy(p.clone(), 1 + (i * 5) % 17)).collect()
}
