//! A step's results applied: computed tokens advanced, full blocks registered in the prefix
//! cache, sampled tokens appended and stop-checked one at a time, drafts accepted or cut,
//! events sent, and finished or failed sequences retired.
//!
//! **Invariants:** every sampled token becomes its own event, checked against the stop
//! rules (stop tokens, the constraint, `max_tokens`, the context) before the next is
//! appended, so a draft's tokens end a sequence exactly where plain decoding would. A
//! sequence leaves the running list only after the whole step is applied, so the plan's
//! indices hold throughout; its blocks go back with it. A retired sequence is recorded in
//! the metrics once, and kept (without blocks) only until its last events are delivered.

use std::sync::atomic::Ordering;
use std::time::Instant;

use met_cache::KvCache;
use met_kernels::Sampled;
use met_telemetry::{Metrics, StepStats};

use super::{EntryResult, Plan, Scheduled, Scheduler};
use crate::constraint::Constrained;
use crate::request::{FinishReason, GeneratedToken, RequestId};
use crate::sequence::{Running, Sequence};

impl Scheduler {
    /// Applies a step's results, one per entry: advances computed tokens, registers full
    /// blocks in the prefix cache, appends sampled tokens, sends events and retires finished
    /// sequences, then ends the requests of failed entries.
    ///
    /// A drafted entry keeps its samples while they agree with the draft, plus the first
    /// that does not; the K/V of the rest is dropped with the blocks past the sequence's
    /// computed tokens. `counts` gets the tokens generated and the drafts' outcomes.
    pub(crate) fn postprocess(
        &mut self,
        plan: &Plan,
        results: Vec<EntryResult>,
        kv: &dyn KvCache,
        counts: &mut StepStats,
    ) {
        // One clock read per step: every token of a step is sampled at the same time.
        let now = Instant::now();
        let mut failed: Vec<(RequestId, String)> = Vec::new();
        for (e, result) in plan.entries.iter().zip(results) {
            match result {
                EntryResult::Failed(msg) => failed.push((self.running[e.seq].request().id, msg)),
                EntryResult::Computed => self.apply(e, None, kv, now, counts),
                EntryResult::Sampled(samples) => self.apply(e, Some(samples), kv, now, counts),
            }
        }
        let done: Vec<Sequence> = self.running.extract_if(.., |s| s.has_ended()).map(Running::release).collect();
        for seq in done {
            self.drain(seq);
        }
        for (id, msg) in failed {
            self.fail_request(id, &msg);
        }
    }

    /// Applies entry `e` to its sequence: its rows are computed, its `samples` (sampled at
    /// `now`) appended while they agree with its draft, and its full blocks committed.
    fn apply(
        &mut self,
        e: &Scheduled,
        samples: Option<Vec<Sampled>>,
        kv: &dyn KvCache,
        now: Instant,
        counts: &mut StepStats,
    ) {
        let Running { seq, blocks } = &mut self.running[e.seq];
        let draft = std::mem::take(&mut seq.draft);
        seq.mark_computed(e.len - e.draft);
        if let Some(samples) = samples {
            let accepted = accept(seq, samples, &draft.tokens()[..e.draft], now, &self.metrics, self.max_context);
            counts.generated_tokens += accepted + 1;
            if e.draft > 0 {
                counts.drafts += 1;
                counts.draft_tokens += e.draft;
                counts.accepted_tokens += accepted;
                blocks.truncate(seq.computed());
                if let Some(spec) = &mut self.speculation {
                    spec.observe(seq, e.draft, accepted);
                }
            }
        }
        kv.commit(blocks, seq.tokens(), seq.computed());
        if seq.index() == 0 && seq.prompt_computed() {
            seq.request().prompt_ready.store(true, Ordering::Relaxed);
        }
        // Keep the allocations for the next draft.
        seq.draft = draft;
        seq.draft.clear();
    }

    /// Ends every unfinished continuation of request `id` with `Error(msg)`: a request whose
    /// sequence failed has failed (and its siblings may be waiting for that one's prompt).
    fn fail_request(&mut self, id: RequestId, msg: &str) {
        let running = self.running.extract_if(.., |r| r.request().id == id).map(Running::release);
        let seqs: Vec<Sequence> = running.chain(self.waiting.extract_if(.., |s| s.request().id == id)).collect();
        for seq in seqs {
            self.retire(seq, FinishReason::Error(msg.to_owned()));
        }
    }

    /// Ends every running and waiting sequence with `reason` (after an engine-level fault).
    pub(crate) fn fail_all(&mut self, reason: &FinishReason) {
        let running = std::mem::take(&mut self.running).into_iter().map(Running::release);
        let seqs: Vec<Sequence> = running.chain(std::mem::take(&mut self.waiting)).collect();
        for seq in seqs {
            self.retire(seq, reason.clone());
        }
    }

    /// Sends a sequence's last event, without a token, and drops it.
    pub(super) fn retire(&mut self, mut seq: Sequence, reason: FinishReason) {
        seq.end(None, reason);
        self.drain(seq);
    }

    /// Records a sequence that ended in the metrics, and keeps it (its blocks already
    /// released) only until its events are delivered.
    fn drain(&mut self, mut seq: Sequence) {
        if let Some(spec) = &mut self.speculation {
            spec.forget(&seq);
        }
        if let Some(reason) = seq.take_ended() {
            self.metrics.finished(reason, seq.stats());
        }
        if seq.paused() {
            self.draining.push(seq);
        }
    }
}

/// Appends `samples` to `seq` one at a time, each checked against the stop rules and sent
/// as its own event, while they agree with `draft`; stops after the first that does not (the
/// target's own token) or that ends the sequence. Each agreeing draft token becomes a
/// computed token, its K/V written by its verification row. Returns the draft tokens kept.
fn accept(
    seq: &mut Sequence,
    samples: Vec<Sampled>,
    draft: &[u32],
    now: Instant,
    metrics: &Metrics,
    max_context: usize,
) -> usize {
    let mut accepted = 0;
    for (j, s) in samples.into_iter().enumerate() {
        let agrees = draft.get(j) == Some(&s.token);
        if append(seq, s, now, metrics, max_context) || !agrees {
            break;
        }
        seq.mark_computed(1);
        accepted += 1;
    }
    accepted
}

/// Appends sampled token `s` to `seq` and sends its event; returns whether it ended `seq`.
fn append(seq: &mut Sequence, s: Sampled, now: Instant, metrics: &Metrics, max_context: usize) -> bool {
    match seq.push_token(s.token, now) {
        None => metrics.first_token(now - seq.request().arrived),
        Some(last) => metrics.inter_token(now - last),
    }
    let finish = stop_reason(seq, s.token, max_context);
    let token = GeneratedToken { id: s.token, logprob: s.logprob, top_logprobs: s.top_logprobs };
    match finish {
        Some(reason) => seq.end(Some(token), reason),
        None => seq.send_token(token),
    }
    seq.has_ended()
}

/// How `seq` ends with its just appended `token`, if it does: a stop token, its constraint
/// complete or refusing the token, or its length.
fn stop_reason(seq: &mut Sequence, token: u32, max_context: usize) -> Option<FinishReason> {
    let generated = seq.output().len();
    let stop = &seq.request().stop;
    if stop.is_stop(token, generated) {
        return Some(FinishReason::Stop);
    }
    if let Some(reason) = seq.constraint.as_mut().and_then(|c| advance(c, token)) {
        return Some(reason);
    }
    let stop = &seq.request().stop;
    (generated >= stop.max_new_tokens || seq.tokens().len() >= max_context).then_some(FinishReason::Length)
}

/// Moves a sequence's constraint past `token`: how the sequence ends when the constraint
/// is complete (`Stop`) or refuses the token (`Error`).
fn advance(c: &mut Constrained, token: u32) -> Option<FinishReason> {
    match c.state.accept(token) {
        Err(msg) => Some(FinishReason::Error(format!("structured output: {msg}"))),
        Ok(()) => c.state.is_complete().then_some(FinishReason::Stop),
    }
}
