//! Request semantics through the engine: seeded sampling, `n > 1`, stop conditions,
//! priority, cancellation by dropping the stream, backpressure, validation, and the
//! threaded handle.

mod common;

use std::time::Duration;

use common::{Outcome, Parts, Setup, VOCAB, collect, greedy, run_all, sampled};
use met_scheduler::mock::MockModel;
use met_scheduler::{EngineRequest, FinishReason, RequestErrorKind, spawn};

fn mock() -> MockModel {
    MockModel::new(VOCAB, common::MAX_CONTEXT)
}

#[test]
fn a_seeded_request_gives_the_same_tokens_alone_and_in_a_crowd() {
    let probe = sampled(vec![3, 1, 4, 1, 5], 12, 42);
    let (mut engine, _) = Setup::new(128).engine();
    let alone = run_all(&mut engine, vec![probe.clone()]);
    let mut crowd: Vec<EngineRequest> =
        (0..9).map(|i| sampled(vec![i, i + 1, 9], 5 + i as usize, 7 + u64::from(i))).collect();
    crowd.insert(4, probe.clone());
    let (mut engine, _) = Setup::new(128).chunk(2).engine();
    let together = run_all(&mut engine, crowd);
    assert_eq!(together[4].tokens, alone[0].tokens);
    let other_seed = run_all(&mut Setup::new(128).engine().0, vec![sampled(vec![3, 1, 4, 1, 5], 12, 43)]);
    assert_ne!(other_seed[0].tokens, alone[0].tokens, "a different seed should draw differently");
}

#[test]
fn n_continuations_share_the_prompt_blocks() {
    for prefix in [true, false] {
        let prompt: Vec<u32> = (0..10).collect();
        let mut req = Parts::sampled(prompt.clone(), 8, 5);
        req.n = 3;
        let (mut engine, _) = Setup::new(64).prefix_caching(prefix).engine();
        let out = run_all(&mut engine, vec![req.make()]);
        let o = &out[0];
        assert_eq!(o.tokens.len(), 3);
        assert!(o.tokens.iter().all(|t| t.len() == 8));
        assert!(o.tokens[0] != o.tokens[1] || o.tokens[1] != o.tokens[2], "continuations should differ");
        // The siblings reuse the first's two full blocks (the last prompt token is computed).
        assert_eq!(o.cached, [0, 8, 8], "prefix caching {prefix}");
    }
    // Greedy continuations are all the reference.
    let mut req = Parts::greedy((0..10).collect(), 6);
    req.n = 2;
    let out = run_all(&mut Setup::new(64).engine().0, vec![req.make()]);
    let want = mock().reference_greedy(&(0..10).collect::<Vec<_>>(), 6);
    assert_eq!(out[0].tokens, [want.clone(), want]);
}

#[test]
fn stop_tokens_min_tokens_and_eos() {
    let prompt = vec![9, 8, 7];
    let want = mock().reference_greedy(&prompt, 10);
    // A stop token ends the sequence and is its last token.
    let mut req = Parts::greedy(prompt.clone(), 10);
    req.stop.stop_token_ids = vec![want[3]];
    let first = want.iter().position(|&t| t == want[3]).unwrap();
    let o = &run_all(&mut Setup::new(64).engine().0, vec![req.make()])[0];
    assert_eq!(o.tokens[0], want[..=first]);
    assert_eq!(o.finish[0], Some(FinishReason::Stop));

    // min_tokens bans end tokens until it is reached.
    let mut req = Parts::greedy(prompt.clone(), 10);
    req.stop.eos_token_ids = vec![want[0]];
    req.stop.min_new_tokens = 4;
    let o = &run_all(&mut Setup::new(64).engine().0, vec![req.make()])[0];
    assert!(o.tokens[0].len() >= 4);
    assert!(!o.tokens[0][..3].contains(&want[0]), "an end token came before min_tokens: {:?}", o.tokens[0]);

    // ignore_eos generates through end tokens.
    let mut req = Parts::greedy(prompt.clone(), 10);
    req.stop.eos_token_ids = vec![want[0]];
    req.stop.ignore_eos = true;
    let o = &run_all(&mut Setup::new(64).engine().0, vec![req.make()])[0];
    assert_eq!(o.tokens[0], want);
    assert_eq!(o.finish[0], Some(FinishReason::Length));
}

#[test]
fn the_priority_policy_admits_urgent_requests_first() {
    let mut setup = Setup::new(64);
    setup.priority = true;
    setup.config.max_num_seqs = 1;
    let (mut engine, _) = setup.engine();
    let low = greedy(vec![1, 2], 3).with_priority(5);
    let high = greedy(vec![3, 4], 3).with_priority(-1);
    let mut s_low = engine.submit(low).unwrap();
    let mut s_high = engine.submit(high).unwrap();
    engine.step();
    assert!(s_high.try_next().is_some(), "the urgent request ran first");
    assert!(s_low.try_next().is_none());
    while engine.has_work() {
        engine.step();
    }
}

#[test]
fn dropping_the_stream_cancels_and_frees_blocks() {
    let (mut engine, metrics) = Setup::new(64).engine();
    let keep = engine.submit(greedy(vec![1, 2, 3], 20)).unwrap();
    let cancel = engine.submit(greedy((0..30).collect(), 20)).unwrap();
    for _ in 0..3 {
        engine.step();
    }
    assert!(engine.held_blocks() > 2);
    drop(cancel);
    engine.step();
    let mut keep = keep;
    let mut out = Outcome::default();
    while engine.has_work() {
        engine.step();
        collect(&mut keep, &mut out, 1);
    }
    collect(&mut keep, &mut out, 1);
    assert_eq!(out.tokens[0], mock().reference_greedy(&[1, 2, 3], 20));
    assert_eq!(engine.free_blocks(), engine.total_blocks());
    assert!(metrics.render().contains(r#"met_requests_finished_total{reason="cancelled"} 1"#), "{}", metrics.render());
}

#[test]
fn a_slow_reader_pauses_its_request_without_losing_tokens() {
    let mut setup = Setup::new(64);
    setup.config.stream_capacity = 2;
    let (mut engine, _) = setup.engine();
    let mut stream = engine.submit(greedy(vec![5, 6], 20)).unwrap();
    for _ in 0..50 {
        engine.step();
    }
    assert!(engine.has_work());
    let mut tokens = Vec::new();
    while let Some(e) = stream.try_next() {
        tokens.extend(e.token.map(|t| t.id));
    }
    // Only the buffered events were delivered; the request is paused, not finished.
    assert_eq!(tokens.len(), 2);
    let mut out = Outcome::default();
    for _ in 0..200 {
        engine.step();
        collect(&mut stream, &mut out, 1);
    }
    tokens.extend(&out.tokens[0]);
    assert_eq!(tokens, mock().reference_greedy(&[5, 6], 20));
    assert_eq!(out.finish[0], Some(FinishReason::Length));
}

#[test]
fn invalid_requests_are_refused_naming_the_field() {
    let (engine, _) = Setup::new(8).engine();
    let limits = engine.limits();
    let refused = |r: Parts| match r.try_make(&limits) {
        Err(e) => (e.field.name(), e.kind),
        Ok(r) => panic!("expected an invalid request, got {r:?}"),
    };
    let field = |r: Parts| refused(r).0;
    assert_eq!(field(Parts::greedy(vec![], 4)), "prompt");
    assert_eq!(field(Parts::greedy(vec![VOCAB as u32], 4)), "prompt");
    assert_eq!(field(Parts::greedy(vec![1; 40], 4)), "prompt"); // 8 blocks of 4 hold 32 tokens
    assert_eq!(field(Parts::greedy(vec![1], 0)), "max_tokens");
    let mut n0 = Parts::greedy(vec![1], 4);
    n0.n = 0;
    assert_eq!(field(n0), "n");
    let mut hot = Parts::greedy(vec![1], 4);
    hot.sampling.temperature = -1.0;
    assert_eq!(field(hot), "temperature");
    // Past the model's context: OpenAI's `context_length_exceeded`, on the prompt or on
    // max_tokens. Those the mock's cache could hold are still refused by the context.
    let (mut big, _) = Setup::new(1024).engine();
    let limits = big.limits();
    let context = limits.max_context;
    let refused = |r: Parts| r.try_make(&limits).map(drop).map_err(|e| (e.field.name(), e.kind));
    assert_eq!(refused(Parts::greedy(vec![1; context], 1)), Err(("prompt", RequestErrorKind::ContextLength)));
    assert_eq!(refused(Parts::greedy(vec![1; 10], context - 9)), Err(("max_tokens", RequestErrorKind::ContextLength)));
    let fits = Parts::greedy(vec![1; 10], context - 10).try_make(&limits).unwrap();
    assert!(big.submit(fits).is_ok(), "a prompt and max_tokens that fill the context exactly");
}

#[test]
fn the_threaded_handle_serves_concurrent_clients() {
    let (engine, _) = Setup::new(256).engine();
    let (handle, thread) = spawn(engine);
    let clients: Vec<_> = (0..8u32)
        .map(|i| {
            let handle = handle.clone();
            std::thread::spawn(move || {
                let prompt = vec![i, i + 2, i + 4];
                let mut stream = handle.submit(greedy(prompt.clone(), 6)).unwrap();
                let mut tokens = Vec::new();
                let mut finish = None;
                while let Some(e) = stream.blocking_next() {
                    tokens.extend(e.token.map(|t| t.id));
                    finish = e.finish;
                }
                (prompt, tokens, finish)
            })
        })
        .collect();
    for c in clients {
        let (prompt, tokens, finish) = c.join().unwrap();
        assert_eq!(tokens, mock().reference_greedy(&prompt, 6));
        assert_eq!(finish, Some(FinishReason::Length));
    }
    // A client that leaves early does not stall the engine.
    let mut early = handle.submit(greedy(vec![1, 1], 50)).unwrap();
    assert!(early.blocking_next().is_some());
    drop(early);
    let mut after = handle.submit(greedy(vec![2, 2], 3)).unwrap();
    let mut n = 0;
    while let Some(e) = after.blocking_next() {
        n += usize::from(e.token.is_some());
    }
    assert_eq!(n, 3);
    drop(handle);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(thread.join().is_ok()).unwrap());
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true), "the engine thread ends with its handles");
}

#[test]
fn a_step_reports_where_its_time_went() {
    let (mut engine, _) = Setup::new(64).engine();
    let _stream = engine.submit(greedy(vec![1, 2, 3], 4)).unwrap();
    engine.step();
    let last = *engine.last_step();
    let p = last.phases;
    // The step ran every phase; together they fit in its wall time.
    assert_eq!(last.generated_tokens, 1);
    assert!(p.forward > Duration::ZERO && p.sample > Duration::ZERO && p.postprocess > Duration::ZERO, "{p:?}");
    assert!(p.schedule + p.forward + p.sample + p.postprocess <= last.duration, "{p:?} in {:?}", last.duration);
    // A step with nothing to run spends nothing on the model.
    let (mut idle, _) = Setup::new(64).engine();
    idle.step();
    assert_eq!(idle.last_step().phases.forward, Duration::ZERO);
}
