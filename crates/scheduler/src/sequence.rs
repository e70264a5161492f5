//! One continuation of a request inside the engine: its tokens, how many of them are in
//! the KV cache, its draft and constraint and the events it could not deliver yet
//! ([`Sequence`]), and the blocks it holds while it runs ([`Running`]).
//!
//! **Invariants:** a waiting or finished sequence holds no blocks by type, not by
//! convention. Its request, continuation index and seed never change; its tokens only grow,
//! by sampled tokens ([`Sequence::push_token`]), and its computed tokens never pass them. A
//! value that only means something in one state exists only in it: the prompt tokens
//! reported as cached once the sequence was first admitted, how it ended from the event
//! that ended it until its metrics are recorded.

use std::sync::Arc;
use std::time::Instant;

use met_cache::SequenceBlocks;
use met_telemetry::{FinishLabel, RequestStats};

use crate::constraint::Constrained;
use crate::draft::Draft;
use crate::outbox::Outbox;
use crate::policy::SeqInfo;
use crate::request::{FinishReason, GeneratedToken, RequestShared, TokenEvent};

#[derive(Debug)]
pub(crate) struct Sequence {
    request: Arc<RequestShared>,
    /// Which of the request's `n` continuations.
    index: usize,
    seed: u64,
    /// Prompt followed by the generated tokens.
    tokens: Vec<u32>,
    /// Leading tokens whose K/V is in the cache.
    computed: usize,
    /// Prompt tokens the cache held at its first admission (reported to the client);
    /// `None` until then, and kept as it was through preemption and readmission.
    cached_prompt: Option<usize>,
    /// Scheduler tick of the last admission.
    admitted: u64,
    /// When its last token was sampled (inter-token latency).
    last_token: Option<Instant>,
    /// Events the client's bounded stream had no room for; the sequence pauses until they
    /// are delivered.
    outbox: Outbox,
    /// How it ended, from the event that ended it until its metrics record it.
    ended: Option<FinishLabel>,
    /// Proposed tokens verified after its decode row this step (speculative decoding).
    pub(crate) draft: Draft,
    /// Its place in the request's constraint (structured output), if it has one.
    pub(crate) constraint: Option<Constrained>,
}

impl Sequence {
    pub(crate) fn new(request: Arc<RequestShared>, index: usize, prompt: Vec<u32>) -> Self {
        let constraint = request.constraint.as_ref().map(Constrained::new);
        let seed = if index == 0 { request.sampling.seed } else { continuation_seed(request.sampling.seed, index) };
        Self {
            request,
            index,
            seed,
            tokens: prompt,
            computed: 0,
            cached_prompt: None,
            admitted: 0,
            last_token: None,
            outbox: Outbox::default(),
            ended: None,
            draft: Draft::default(),
            constraint,
        }
    }

    /// What every continuation of its request shares.
    pub(crate) fn request(&self) -> &RequestShared {
        &self.request
    }

    /// Which of the request's `n` continuations it is.
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// The seed of its own random stream.
    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// Prompt followed by the generated tokens.
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub(crate) fn prompt(&self) -> &[u32] {
        &self.tokens[..self.request.prompt_len]
    }

    pub(crate) fn output(&self) -> &[u32] {
        &self.tokens[self.request.prompt_len..]
    }

    /// Leading tokens whose K/V is in the cache.
    pub(crate) fn computed(&self) -> usize {
        self.computed
    }

    /// Tokens not yet in the cache: the rest of the prompt, or the last sampled token.
    pub(crate) fn to_compute(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Whether the whole prompt is in the cache.
    pub(crate) fn prompt_computed(&self) -> bool {
        self.computed >= self.request.prompt_len
    }

    /// A key unique to this continuation of this request, for proposers that keep
    /// per-sequence state.
    pub(crate) fn key(&self) -> u64 {
        // Request ids count up from 1 and `n` stays far below 2^20.
        (self.request.id.0 << 20) | self.index as u64
    }

    pub(crate) fn info(&self) -> SeqInfo {
        SeqInfo {
            request: self.request.id,
            priority: self.request.priority,
            arrival: self.request.arrival,
            admitted: self.admitted,
        }
    }

    /// Admits it at scheduler tick `tick` with its first `hit` tokens already in the cache.
    pub(crate) fn admit(&mut self, hit: usize, tick: u64) {
        self.cached_prompt.get_or_insert(hit.min(self.request.prompt_len));
        self.computed = hit;
        self.admitted = tick;
    }

    /// Records that `n` more of its tokens are in the cache.
    pub(crate) fn mark_computed(&mut self, n: usize) {
        self.computed += n;
    }

    /// Forgets its computed tokens and its draft (preemption by recompute: it computes
    /// them again once readmitted).
    pub(crate) fn recompute(&mut self) {
        self.computed = 0;
        self.draft.clear();
    }

    /// Appends sampled `token` at time `now`; returns when the token before it was sampled,
    /// `None` for its first.
    pub(crate) fn push_token(&mut self, token: u32, now: Instant) -> Option<Instant> {
        self.tokens.push(token);
        self.last_token.replace(now)
    }

    /// Sends a generated token that does not end it.
    pub(crate) fn send_token(&mut self, token: GeneratedToken) {
        self.send(Some(token), None);
    }

    /// Sends its last event, with the token that ended it if one did, and keeps how it
    /// ended until its metrics are recorded ([`Self::take_ended`]).
    pub(crate) fn end(&mut self, token: Option<GeneratedToken>, reason: FinishReason) {
        self.ended = Some(label(&reason));
        self.send(token, Some(reason));
    }

    /// Whether it has sent its last event.
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.is_some()
    }

    /// How it ended, once, for the metrics.
    pub(crate) fn take_ended(&mut self) -> Option<FinishLabel> {
        self.ended.take()
    }

    /// What the metrics record of its request when it ends.
    pub(crate) fn stats(&self) -> RequestStats {
        RequestStats {
            duration: self.request.arrived.elapsed(),
            prompt_tokens: self.request.prompt_len,
            generated_tokens: self.output().len(),
        }
    }

    /// Whether undelivered events hold the sequence back.
    pub(crate) fn paused(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Delivers queued events while the stream has room.
    pub(crate) fn flush(&mut self) {
        self.outbox.flush(&self.request.events);
    }

    fn send(&mut self, token: Option<GeneratedToken>, finish: Option<FinishReason>) {
        let cached_prompt_tokens = self.cached_prompt.unwrap_or(0);
        let event = TokenEvent { index: self.index, token, cached_prompt_tokens, finish };
        self.outbox.send(&self.request.events, event);
    }
}

/// A sequence admitted to the running batch, with the KV blocks of its computed tokens.
#[derive(Debug)]
pub(crate) struct Running {
    pub(crate) seq: Sequence,
    pub(crate) blocks: SequenceBlocks,
}

impl Running {
    /// The sequence without its blocks (they return to the cache): preempted, finished or
    /// failed.
    pub(crate) fn release(self) -> Sequence {
        self.seq
    }
}

impl std::ops::Deref for Running {
    type Target = Sequence;

    fn deref(&self) -> &Sequence {
        &self.seq
    }
}

impl std::ops::DerefMut for Running {
    fn deref_mut(&mut self) -> &mut Sequence {
        &mut self.seq
    }
}

/// The metrics' label of a finish.
fn label(reason: &FinishReason) -> FinishLabel {
    match reason {
        FinishReason::Stop => FinishLabel::Stop,
        FinishReason::Length => FinishLabel::Length,
        FinishReason::Cancelled => FinishLabel::Cancelled,
        FinishReason::Error(_) => FinishLabel::Error,
    }
}

/// The random stream of continuation `index` of a request seeded with `seed`.
fn continuation_seed(seed: u64, index: usize) -> u64 {
    // SplitMix64's finaliser: distinct, well-mixed streams per continuation.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
