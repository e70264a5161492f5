//! One continuation of a request inside the engine: its tokens, how many of them are in
//! the KV cache and the events it could not deliver yet ([`Sequence`]), and the blocks it
//! holds while it runs ([`Running`]). A waiting or finished sequence holds no blocks by
//! type, not by convention.

use std::collections::VecDeque;
use std::sync::Arc;

use std::time::Instant;

use met_cache::SequenceBlocks;
use met_kernels::DraftToken;
use met_telemetry::FinishLabel;
use tokio::sync::mpsc::error::TrySendError;

use crate::constraint::Constrained;
use crate::policy::SeqInfo;
use crate::request::{RequestShared, TokenEvent};

#[derive(Debug)]
pub(crate) struct Sequence {
    pub(crate) request: Arc<RequestShared>,
    /// Which of the request's `n` continuations.
    pub(crate) index: usize,
    /// Prompt followed by the generated tokens.
    pub(crate) tokens: Vec<u32>,
    /// Leading tokens whose K/V is in the cache.
    pub(crate) computed: usize,
    /// Prompt tokens reused at first admission (reported to the client).
    pub(crate) cached_prompt_tokens: usize,
    pub(crate) admitted_before: bool,
    pub(crate) seed: u64,
    /// Scheduler tick of the last admission.
    pub(crate) admitted: u64,
    /// Events the client's bounded stream had no room for; the sequence pauses until
    /// they are delivered.
    pub(crate) pending: VecDeque<TokenEvent>,
    pub(crate) finished: bool,
    /// Set when the sequence ends, until its finish is recorded in the metrics.
    pub(crate) finish_reason: Option<FinishLabel>,
    /// When its last token was sampled (inter-token latency).
    pub(crate) last_token: Option<Instant>,
    /// Proposed tokens verified after its decode row this step (speculative decoding);
    /// never part of `tokens` until the target agrees with them.
    pub(crate) draft: Vec<u32>,
    /// The draft's distribution at each of `draft`'s tokens (`[draft.len(), vocab]`), or
    /// empty for point-mass proposals.
    pub(crate) draft_probs: Vec<f32>,
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
            tokens: prompt,
            computed: 0,
            cached_prompt_tokens: 0,
            admitted_before: false,
            seed,
            admitted: 0,
            pending: VecDeque::new(),
            finished: false,
            finish_reason: None,
            last_token: None,
            draft: Vec::new(),
            draft_probs: Vec::new(),
            constraint,
        }
    }

    pub(crate) fn prompt(&self) -> &[u32] {
        &self.tokens[..self.request.prompt_len]
    }

    pub(crate) fn output(&self) -> &[u32] {
        &self.tokens[self.request.prompt_len..]
    }

    /// Tokens not yet in the cache: the rest of the prompt, or the last sampled token.
    pub(crate) fn to_compute(&self) -> usize {
        self.tokens.len() - self.computed
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

    /// Drops this step's draft, keeping its allocations.
    pub(crate) fn clear_draft(&mut self) {
        self.draft.clear();
        self.draft_probs.clear();
    }

    /// Draft token `j` with the distribution it was drawn from, for the sampler to verify;
    /// `None` past the draft (the row after it) and for point-mass proposals.
    pub(crate) fn draft_token(&self, j: usize) -> Option<DraftToken<'_>> {
        let vocab = self.draft_probs.len().checked_div(self.draft.len())?;
        let token = *self.draft.get(j)?;
        (vocab > 0).then(|| DraftToken { token, probs: &self.draft_probs[j * vocab..(j + 1) * vocab] })
    }

    /// Whether undelivered events hold the sequence back.
    pub(crate) fn paused(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Sends `event`, queueing it when the stream is full.
    pub(crate) fn emit(&mut self, event: TokenEvent) {
        if !self.pending.is_empty() {
            self.pending.push_back(event);
            return self.flush();
        }
        match self.request.events.try_send(event) {
            Ok(()) => {}
            Err(TrySendError::Full(event)) => self.pending.push_back(event),
            // The client is gone; cancellation reaps the sequence.
            Err(TrySendError::Closed(_)) => {}
        }
    }

    /// Delivers queued events while the stream has room.
    pub(crate) fn flush(&mut self) {
        while let Some(event) = self.pending.pop_front() {
            match self.request.events.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.pending.push_front(event);
                    return;
                }
                // The client is gone; cancellation reaps the sequence.
                Err(TrySendError::Closed(_)) => {
                    self.pending.clear();
                    return;
                }
            }
        }
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

/// The random stream of continuation `index` of a request seeded with `seed`.
fn continuation_seed(seed: u64, index: usize) -> u64 {
    // SplitMix64's finaliser: distinct, well-mixed streams per continuation.
    let mut z = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
