//! Asynchronous scheduling: a decode step queued before the tokens of the step before are
//! read must change nothing a client sees. Every workload here runs with it off and on (the
//! CPU backend draws at once, so "on" exercises the engine's bookkeeping: steps planned
//! ahead, ids read from the draws, rows of sequences that ended meanwhile discarded) and
//! must give the same tokens and finish reasons, while most decode steps run ahead.

mod common;

use common::{Outcome, Parts, Setup, collect, run_all};
use met_scheduler::mock::MockModel;
use met_scheduler::{Engine, EngineRequest, FinishReason, RequestStream};

fn mock() -> MockModel {
    MockModel::new(common::VOCAB, common::MAX_CONTEXT)
}

/// A small deterministic generator, so the workloads need no dependency.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// `count` requests of every kind the engine treats differently: greedy ones ending on a
/// stop token part-way (so a step is already queued for them when they end), seeded
/// sampled ones, `n = 2`, `min_tokens` with an end token, and lengths of 1 to 40 tokens.
fn workload(seed: u64, count: usize) -> Vec<EngineRequest> {
    let mut rng = Lcg(seed);
    (0..count)
        .map(|i| {
            let prompt: Vec<u32> = (0..1 + rng.below(30)).map(|_| rng.below(60) as u32).collect();
            let max = 1 + rng.below(40) as usize;
            let mut req = match i % 4 {
                0 | 1 => {
                    let mut req = Parts::greedy(prompt.clone(), max);
                    let want = mock().reference_greedy(&prompt, max);
                    if i % 4 == 0 && max > 2 {
                        req.stop.stop_token_ids = vec![want[rng.below(max as u64) as usize]];
                    }
                    req
                }
                2 => Parts::sampled(prompt, max, rng.below(1000)),
                _ => {
                    let mut req = Parts::sampled(prompt, max, rng.below(1000));
                    req.stop.eos_token_ids = vec![rng.below(60) as u32];
                    req.stop.min_new_tokens = (max / 2).max(1);
                    req
                }
            };
            req.n = if i % 7 == 3 { 2 } else { 1 };
            req.make()
        })
        .collect()
}

/// Runs `first`, then `later` once `delay` steps have passed (arrivals while decoding),
/// to the end; returns each request's outcome and how many steps ran ahead, out of all.
fn run_with_arrivals(
    engine: &mut Engine,
    first: Vec<EngineRequest>,
    later: Vec<EngineRequest>,
    delay: usize,
) -> (Vec<Outcome>, usize, usize) {
    let ns: Vec<usize> = first.iter().chain(&later).map(EngineRequest::n).collect();
    let mut streams: Vec<RequestStream> = first.into_iter().map(|r| engine.submit(r).unwrap()).collect();
    let mut later = Some(later);
    let mut outcomes = vec![Outcome::default(); ns.len()];
    let (mut steps, mut ahead) = (0, 0);
    while engine.has_work() || later.is_some() {
        if steps == delay
            && let Some(reqs) = later.take()
        {
            streams.extend(reqs.into_iter().map(|r| engine.submit(r).unwrap()));
        }
        engine.step();
        steps += 1;
        ahead += usize::from(engine.last_step().ahead);
        assert!(steps < 100_000, "the engine does not finish");
        assert_eq!(engine.held_blocks() + engine.free_blocks(), engine.total_blocks(), "blocks leaked");
        for ((s, o), &n) in streams.iter_mut().zip(&mut outcomes).zip(&ns) {
            collect(s, o, n);
        }
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks(), "blocks held after every request finished");
    (outcomes, ahead, steps)
}

#[test]
fn async_scheduling_gives_the_outputs_of_synchronous_scheduling() {
    // Ample blocks, a tight pool (preemption by recompute), chunked prefill, no prefix cache.
    let setups =
        [Setup::new(512), Setup::new(40), Setup::new(512).chunk(3), Setup::new(60).chunk(5).prefix_caching(false)];
    for (k, setup) in setups.iter().enumerate() {
        for seed in [1, 2, 3] {
            let run = |on: bool| {
                let (mut engine, _) = setup.clone().async_scheduling(on).engine();
                run_with_arrivals(&mut engine, workload(seed, 16), workload(seed + 100, 8), 7)
            };
            let (sync, sync_ahead, _) = run(false);
            let (ahead, ahead_steps, steps) = run(true);
            assert_eq!(sync_ahead, 0, "setup {k}: steps ran ahead with async scheduling off");
            assert!(ahead_steps > 0, "setup {k}, seed {seed}: no step ran ahead in {steps}");
            for (i, (a, s)) in ahead.iter().zip(&sync).enumerate() {
                assert_eq!((&a.tokens, &a.finish), (&s.tokens, &s.finish), "setup {k}, seed {seed}, request {i}");
            }
        }
    }
}

#[test]
fn a_steady_decode_runs_ahead_and_stop_tokens_end_without_an_extra_token() {
    let prompts: Vec<Vec<u32>> = (0..8u32).map(|i| vec![i, i + 3, 7, 1]).collect();
    let want: Vec<Vec<u32>> = prompts.iter().map(|p| mock().reference_greedy(p, 30)).collect();
    let requests: Vec<EngineRequest> = prompts
        .iter()
        .zip(&want)
        .enumerate()
        .map(|(i, (p, w))| {
            let mut req = Parts::greedy(p.clone(), 30);
            if i == 2 {
                // Ends on its 6th token, while its 7th is already being computed.
                req.stop.stop_token_ids = vec![w[5]];
            }
            req.make()
        })
        .collect();
    let (mut engine, _) = Setup::new(512).async_scheduling(true).engine();
    let (out, ahead, steps) = run_with_arrivals(&mut engine, requests, Vec::new(), 0);
    for (i, (o, w)) in out.iter().zip(&want).enumerate() {
        if i == 2 {
            let end = w.iter().position(|&t| t == w[5]).unwrap();
            assert_eq!(o.tokens[0], w[..=end], "request 2 must stop at its stop token");
            assert_eq!(o.finish[0], Some(FinishReason::Stop));
        } else {
            assert_eq!(o.tokens[0], *w, "request {i}");
            assert_eq!(o.finish[0], Some(FinishReason::Length));
        }
    }
    // The prefill step and the last (whose tokens end every request by length, so nothing
    // is left to queue) run synchronously; every decode step between runs ahead.
    assert!(ahead >= steps - 3, "{ahead} of {steps} steps ran ahead");
}

#[test]
fn a_request_cancelled_while_its_step_is_in_flight_frees_its_blocks() {
    let (mut engine, _) = Setup::new(256).async_scheduling(true).engine();
    let mut keep = engine.submit(common::greedy(vec![1, 2, 3], 20)).unwrap();
    let dropped = engine.submit(common::greedy(vec![4, 5, 6], 20)).unwrap();
    for _ in 0..5 {
        engine.step();
    }
    assert!(engine.last_step().ahead, "the step before the cancellation should be in flight");
    drop(dropped);
    let mut steps = 0;
    while engine.has_work() {
        engine.step();
        steps += 1;
        assert!(steps < 100, "the engine does not finish");
    }
    let mut out = Outcome::default();
    collect(&mut keep, &mut out, 1);
    assert_eq!(out.tokens[0], mock().reference_greedy(&[1, 2, 3], 20));
    assert_eq!(engine.free_blocks(), engine.total_blocks());
}

#[test]
fn the_common_suite_passes_ahead() {
    // `run_all` checks block accounting after every step.
    let requests = workload(9, 24);
    let sync = run_all(&mut Setup::new(64).engine().0, requests.clone());
    let ahead = run_all(&mut Setup::new(64).async_scheduling(true).engine().0, requests);
    for (i, (a, s)) in ahead.iter().zip(&sync).enumerate() {
        assert_eq!((&a.tokens, &a.finish), (&s.tokens, &s.finish), "request {i}");
    }
}
