//! Structured output through the engine: a request's constraint decides which tokens each
//! step may sample, each continuation walks its own state, a complete constraint stops the
//! sequence, and a constraint's failure ends its request alone. The constraints here are
//! test doubles of a grammar engine (`met-grammar` holds the real one to the same seam).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Parts, Setup, greedy, run_all, sampled};
use met_scheduler::{Constraint, ConstraintState, EngineRequest, FinishReason, SharedConstraint};
use met_speculative::SpeculativeConfig;

fn allow(mask: &mut [u32], token: u32) {
    mask[token as usize / 32] |= 1 << (token % 32);
}

/// Allows exactly `tokens`, one after the other, then is complete.
#[derive(Debug)]
struct Script {
    tokens: Vec<u32>,
    /// Masks computed, by every state of it.
    masks: Arc<AtomicUsize>,
}

struct ScriptState {
    tokens: Vec<u32>,
    at: usize,
    masks: Arc<AtomicUsize>,
}

impl Constraint for Script {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(ScriptState { tokens: self.tokens.clone(), at: 0, masks: Arc::clone(&self.masks) })
    }
}

impl ConstraintState for ScriptState {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        self.masks.fetch_add(1, Ordering::Relaxed);
        allow(mask, self.tokens[self.at]);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        if token != self.tokens[self.at] {
            return Err(format!("token {token} is not {}", self.tokens[self.at]));
        }
        self.at += 1;
        Ok(())
    }

    fn is_complete(&self) -> bool {
        self.at == self.tokens.len()
    }
}

/// Allows the tokens of `allowed` forever; fails its mask after `fail_after` tokens.
#[derive(Debug)]
struct Subset {
    allowed: Vec<u32>,
    fail_after: Option<usize>,
}

struct SubsetState {
    allowed: Vec<u32>,
    fail_after: Option<usize>,
    seen: usize,
}

impl Constraint for Subset {
    fn start(&self) -> Box<dyn ConstraintState> {
        Box::new(SubsetState { allowed: self.allowed.clone(), fail_after: self.fail_after, seen: 0 })
    }
}

impl ConstraintState for SubsetState {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        if self.fail_after == Some(self.seen) {
            return Err("the grammar gave up".into());
        }
        self.allowed.iter().for_each(|&t| allow(mask, t));
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.seen += 1;
        if self.allowed.contains(&token) { Ok(()) } else { Err(format!("token {token} was masked")) }
    }

    fn is_complete(&self) -> bool {
        false
    }
}

fn script(tokens: &[u32]) -> (SharedConstraint, Arc<AtomicUsize>) {
    let masks = Arc::new(AtomicUsize::new(0));
    (SharedConstraint(Arc::new(Script { tokens: tokens.to_vec(), masks: Arc::clone(&masks) })), masks)
}

fn subset(allowed: &[u32], fail_after: Option<usize>) -> SharedConstraint {
    SharedConstraint(Arc::new(Subset { allowed: allowed.to_vec(), fail_after }))
}

/// Greedy and seeded requests of different lengths, unconstrained.
fn crowd() -> Vec<EngineRequest> {
    (0..6u32)
        .map(|i| {
            let prompt: Vec<u32> = (0..2 + i).map(|j| (i * 5 + j) % 50).collect();
            if i % 2 == 0 { greedy(prompt, 5 + i as usize) } else { sampled(prompt, 5 + i as usize, u64::from(i)) }
        })
        .collect()
}

const SCRIPT: [u32; 5] = [7, 63, 0, 31, 32];

#[test]
fn a_script_constraint_forces_its_tokens_and_stops_every_continuation() {
    let alone = run_all(&mut Setup::new(256).engine().0, crowd());
    for (chunk, kv_blocks) in [(None, 256), (Some(2), 256), (None, 12)] {
        let (constraint, masks) = script(&SCRIPT);
        let mut parts = Parts::sampled(vec![1, 2, 3, 4, 5, 6], 40, 3);
        parts.n = 2;
        let constrained = parts.make().with_constraint(constraint);
        let greedy_one = greedy(vec![9, 9, 9], 40).with_constraint(script(&SCRIPT[1..]).0);
        let mut requests = crowd();
        requests.insert(2, constrained);
        requests.push(greedy_one);
        let mut setup = Setup::new(kv_blocks);
        setup.config.max_prefill_chunk = chunk;
        let mut out = run_all(&mut setup.engine().0, requests);
        let last = out.pop().unwrap();
        assert_eq!(last.tokens, vec![SCRIPT[1..].to_vec()]);
        let two = out.remove(2);
        assert_eq!(two.tokens, vec![SCRIPT.to_vec(); 2], "chunk {chunk:?}, {kv_blocks} blocks");
        assert_eq!(two.finish, vec![Some(FinishReason::Stop); 2]);
        // One mask per sampled token, per continuation (a preempted sequence recomputes
        // its K/V, not its constraint).
        assert_eq!(masks.load(Ordering::Relaxed), 2 * SCRIPT.len());
        if kv_blocks == 256 {
            for (got, want) in out.iter().zip(&alone) {
                assert_eq!((&got.tokens, &got.finish), (&want.tokens, &want.finish), "chunk {chunk:?}");
            }
        }
    }
}

#[test]
fn sampled_and_greedy_tokens_stay_inside_the_allowed_set() {
    let allowed = [3u32, 17, 40, 41, 62];
    let requests: Vec<EngineRequest> = (0..4u64)
        .map(|seed| {
            let prompt = vec![seed as u32 + 1, 5, 8];
            let req = if seed == 0 { greedy(prompt, 30) } else { sampled(prompt, 30, seed) };
            req.with_constraint(subset(&allowed, None))
        })
        .collect();
    for out in run_all(&mut Setup::new(256).engine().0, requests) {
        assert_eq!(out.finish, vec![Some(FinishReason::Length)]);
        assert_eq!(out.tokens[0].len(), 30);
        assert!(out.tokens[0].iter().all(|t| allowed.contains(t)), "{:?}", out.tokens);
    }
    // The same prompts without the constraint leave the set: the mask is what kept them in.
    let free: Vec<EngineRequest> = (1..4u64).map(|seed| sampled(vec![seed as u32 + 1, 5, 8], 30, seed)).collect();
    let outside = run_all(&mut Setup::new(256).engine().0, free);
    assert!(outside.iter().any(|o| o.tokens[0].iter().any(|t| !allowed.contains(t))));
}

#[test]
fn a_failing_constraint_ends_its_request_alone() {
    let alone = run_all(&mut Setup::new(256).engine().0, crowd());
    let mut requests = crowd();
    requests.insert(1, greedy(vec![4, 4], 20).with_constraint(subset(&[1, 2], Some(3))));
    let (mut engine, _) = Setup::new(256).engine();
    let mut out = run_all(&mut engine, requests);
    let failed = out.remove(1);
    assert_eq!(failed.tokens[0].len(), 3);
    assert!(
        matches!(&failed.finish[0], Some(FinishReason::Error(m)) if m.contains("the grammar gave up")),
        "{:?}",
        failed.finish
    );
    for (got, want) in out.iter().zip(&alone) {
        assert_eq!((&got.tokens, &got.finish), (&want.tokens, &want.finish));
    }
    assert!(engine.fault().is_none());
}

#[test]
fn a_constrained_sequence_is_never_speculated_on() {
    // A repeating prompt gives prompt lookup something to propose; the constraint's state
    // would see drafted tokens twice (and refuse them) if it were drafted.
    let prompt: Vec<u32> = [7, 63, 0, 31].repeat(4);
    let (constraint, masks) = script(&SCRIPT);
    let config = SpeculativeConfig { ngram_min: 1, ..SpeculativeConfig::ngram(4) };
    let mut engine = Setup::new(256).engine().0.with_speculative(&config).unwrap();
    let out = run_all(&mut engine, vec![greedy(prompt.clone(), 20).with_constraint(constraint), greedy(prompt, 20)]);
    assert_eq!(out[0].tokens, vec![SCRIPT.to_vec()]);
    assert_eq!(out[0].finish, vec![Some(FinishReason::Stop)]);
    assert_eq!(masks.load(Ordering::Relaxed), SCRIPT.len());
    assert_eq!(out[1].tokens[0].len(), 20);
}
