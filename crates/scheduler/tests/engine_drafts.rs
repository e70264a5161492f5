//! Speculative decoding with drafts that carry their distributions, and with a draft
//! model: drafts drawn from a tempered distribution and verified by rejection sampling keep
//! the sampling distribution (a two-sample χ² test that a dishonest draft fails); a draft
//! model must share the target's vocabulary, and its cache follows every sequence through
//! acceptance, rejection and preemption. The proposers and runs are `common::speculative`'s.

mod common;

use common::speculative::{assert_same, draft_model, mix, prompts, run, streams};
use common::{Outcome, Parts, Setup, run_all};
use met_config::SamplingParams;
use met_kernels::CpuBackend;
use met_scheduler::mock::MockModel;
use met_speculative::{DraftModelProposer, Proposal, ProposalContext, Proposer, SpeculativeConfig};

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
