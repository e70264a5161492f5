//! Fault isolation: one bad sequence never fails its batch. The mock injects each fault
//! for the sequences whose first token is [`BAD`]; a crowd of good requests runs beside it
//! and must produce exactly what it produces alone. Engine-level faults (a device error,
//! a panic inside a step) end every request with an error and stop the engine, never hang.
//! Requests that could never sample are refused before they reach the engine.

mod common;

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use common::{Outcome, Parts, Setup, VOCAB, collect, greedy, run_all};
use met_config::SamplingParams;
use met_scheduler::mock::Faults;
use met_scheduler::{EngineRequest, FinishReason, RequestStream, SubmitError, spawn};

/// The first token that triggers a fault; no good prompt starts with it.
const BAD: u32 = VOCAB as u32 - 1;

fn sampled(prompt: Vec<u32>, max_new_tokens: usize, seed: u64) -> Parts {
    Parts::with(
        prompt,
        max_new_tokens,
        SamplingParams { temperature: 0.8, top_p: 0.9, seed, ..SamplingParams::default() },
    )
}

/// Eight good requests: greedy and seeded, of different lengths, one with `n = 2`.
fn crowd() -> Vec<EngineRequest> {
    (0..8u32)
        .map(|i| {
            let prompt: Vec<u32> = (0..3 + i).map(|j| (i * 7 + j) % 60).collect();
            let max = 6 + i as usize;
            let mut req = if i % 2 == 0 { Parts::greedy(prompt, max) } else { sampled(prompt, max, u64::from(i)) };
            req.n = if i == 5 { 2 } else { 1 };
            req.make()
        })
        .collect()
}

fn is_error(finish: &Option<FinishReason>, says: &str) -> bool {
    matches!(finish, Some(FinishReason::Error(msg)) if msg.contains(says))
}

/// Runs the crowd with `bad` among it under `faults`: `bad` must end with an error saying
/// `says`, and every other request exactly as the crowd does without it.
fn check_isolated(faults: Faults, bad: EngineRequest, says: &str) {
    let alone = run_all(&mut Setup::new(256).engine().0, crowd());
    for (chunk, ahead) in [(None, false), (Some(3), false), (None, true), (Some(3), true)] {
        let mut requests = crowd();
        requests.insert(3, bad.clone());
        let mut setup = Setup::new(256).async_scheduling(ahead);
        setup.config.max_prefill_chunk = chunk;
        setup.faults = faults;
        let (mut engine, metrics) = setup.engine();
        let mut out = run_all(&mut engine, requests);
        let failed = out.remove(3);
        assert_eq!(failed.finish.len(), bad.n());
        assert!(failed.finish.iter().all(|f| is_error(f, says)), "chunk {chunk:?}, ahead {ahead}: {:?}", failed.finish);
        let errors = format!(r#"met_requests_finished_total{{reason="error"}} {}"#, bad.n());
        assert!(metrics.render().contains(&errors), "{}", metrics.render());
        for (i, (got, want)) in out.iter().zip(&alone).enumerate() {
            assert_eq!(
                (&got.tokens, &got.finish),
                (&want.tokens, &want.finish),
                "request {i}, chunk {chunk:?}, ahead {ahead}"
            );
        }
        assert!(engine.fault().is_none(), "a sequence's failure is not the engine's");
    }
}

#[test]
fn a_row_the_sampler_refuses_ends_its_request_alone() {
    let faults = Faults { nan_logits: Some(BAD), ..Faults::default() };
    check_isolated(faults, greedy(vec![BAD, 1, 2, 3, 4], 8), "banned or masked");
    check_isolated(faults, sampled(vec![BAD, 5], 8, 9).make(), "banned or masked");
}

#[test]
fn a_batch_the_model_fails_on_ends_only_the_sequence_that_fails_alone() {
    let faults = Faults { fail_batch: Some(BAD), ..Faults::default() };
    check_isolated(faults, greedy(vec![BAD, 1, 2, 3, 4], 8), "cannot run");
    // Every continuation of the request ends, also those waiting for its prompt.
    let mut two = sampled(vec![BAD, 7, 7], 8, 3);
    two.n = 2;
    check_isolated(faults, two.make(), "cannot run");
}

/// Every event left on `stream`.
fn drain(stream: &mut RequestStream, n: usize) -> Outcome {
    let mut out = Outcome::default();
    collect(stream, &mut out, n);
    out
}

#[test]
fn a_device_error_ends_every_request_and_stops_the_engine() {
    for ahead in [false, true] {
        device_error_ends_everything(ahead);
    }
}

fn device_error_ends_everything(ahead: bool) {
    let mut setup = Setup::new(256).async_scheduling(ahead);
    setup.faults.device_error = Some(BAD);
    setup.config.max_num_seqs = 4;
    let (mut engine, _) = setup.engine();
    let mut streams: Vec<RequestStream> = (0..3).map(|i| engine.submit(greedy(vec![i, i + 1], 50)).unwrap()).collect();
    for _ in 0..3 {
        engine.step();
    }
    streams.push(engine.submit(greedy(vec![BAD, 1], 5)).unwrap());
    // Waits: the other four fill `max_num_seqs`.
    streams.push(engine.submit(greedy(vec![9, 9], 5)).unwrap());
    let mut steps = 0;
    while engine.has_work() {
        engine.step();
        steps += 1;
        assert!(steps < 100, "the engine does not stop");
    }
    assert!(engine.fault().is_some_and(|f| f.contains("device error")), "{:?}", engine.fault());
    for (i, stream) in streams.iter_mut().enumerate() {
        let out = drain(stream, 1);
        assert!(is_error(&out.finish[0], "device error"), "request {i}: {:?}", out.finish);
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks());
    assert_eq!(engine.submit(greedy(vec![1], 2)).unwrap_err(), SubmitError::EngineStopped);
}

#[test]
fn a_panic_in_a_step_ends_every_request_and_the_engine_thread() {
    let mut setup = Setup::new(256);
    setup.faults.panic = Some(BAD);
    let (engine, _) = setup.engine();
    let (handle, thread) = spawn(engine);
    let (tx, rx) = std::sync::mpsc::channel();
    let client = handle.clone();
    std::thread::spawn(move || {
        // Long enough that the good requests are still running when the bad one arrives.
        let mut streams: Vec<RequestStream> =
            (0..3).map(|i| client.submit(greedy(vec![i, 2, 3], 500)).unwrap()).collect();
        streams.push(client.submit(greedy(vec![BAD, 2], 4)).unwrap());
        let finishes: Vec<Option<FinishReason>> = streams
            .iter_mut()
            .map(|s| {
                let mut last = None;
                while let Some(e) = s.blocking_next() {
                    last = e.finish;
                }
                last
            })
            .collect();
        tx.send(finishes).unwrap();
    });
    let finishes = rx.recv_timeout(Duration::from_secs(20)).expect("the requests end instead of hanging");
    for (i, finish) in finishes.iter().enumerate() {
        assert!(is_error(finish, "the engine panicked: mock fault"), "request {i}: {finish:?}");
    }
    assert!(handle.fault().is_some_and(|f| f.contains("panicked")), "{:?}", handle.fault());
    assert_eq!(handle.submit(greedy(vec![1], 2)).unwrap_err(), SubmitError::EngineStopped);
    // The fault is already there, so waiting for it returns at the first poll.
    let mut wait = std::pin::pin!(handle.wait_for_fault());
    let poll = wait.as_mut().poll(&mut Context::from_waker(Waker::noop()));
    assert!(matches!(&poll, Poll::Ready(f) if f.contains("panicked")), "{poll:?}");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(thread.join().is_ok()).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true), "the engine thread ends by itself");
}

#[test]
fn requests_that_can_never_sample_are_refused_naming_the_field() {
    let (mut engine, _) = Setup::new(64).engine();
    let limits = engine.limits();
    let field = |r: Parts| match r.try_make(&limits) {
        Err(e) => e.field.name(),
        Ok(r) => panic!("expected an invalid request, got {r:?}"),
    };
    // The issue's request: every token a stop token while min_tokens bans them.
    let mut all = Parts::greedy(vec![1, 2], 5);
    all.stop.min_new_tokens = 2;
    all.stop.stop_token_ids = (0..VOCAB as u32).collect();
    assert_eq!(field(all.clone()), "stop_token_ids");
    // Stop and end-of-sequence tokens together, listed twice over.
    let mut split = all.clone();
    split.stop.stop_token_ids = (0..40).chain(0..40).collect();
    split.stop.eos_token_ids = (40..VOCAB as u32).collect();
    assert_eq!(field(split.clone()), "stop_token_ids");
    let mut long = Parts::greedy(vec![1], 3);
    long.stop.min_new_tokens = 4;
    assert_eq!(field(long.clone()), "min_tokens");
    // A request made against other limits is checked again against the engine's.
    let other = met_scheduler::EngineLimits { vocab_size: 2 * VOCAB, ..limits };
    let mut wide = Parts::greedy(vec![VOCAB as u32 + 1], 3).try_make(&other).unwrap();
    match engine.submit(wide.clone()) {
        Err(SubmitError::Invalid(e)) => assert_eq!(e.field.name(), "prompt"),
        other => panic!("expected the engine to refuse {wide:?}, got {other:?}"),
    }
    wide = Parts::greedy(vec![1], 3).try_make(&other).unwrap();
    assert!(engine.submit(wide).is_ok(), "a request that fits the engine is taken whatever it was made against");

    // What can sample is still accepted: `ignore_eos` lifts the end-of-sequence bans, and
    // without min_tokens a stop on every token ends after one.
    let (mut engine, _) = Setup::new(64).engine();
    split.stop.ignore_eos = true;
    let mut stop_all = all;
    stop_all.stop.min_new_tokens = 0;
    let out = run_all(&mut engine, vec![split.make(), stop_all.make()]);
    assert!(out[0].tokens[0].len() >= 2 && out[0].tokens[0][..2].iter().all(|&t| t >= 40), "{:?}", out[0].tokens);
    assert_eq!((out[1].tokens[0].len(), &out[1].finish[0]), (1, &Some(FinishReason::Stop)));
}
