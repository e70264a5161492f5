//! What goes into the engine (a validated request) and what comes out (token events).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use met_config::SamplingParams;
use tokio::sync::mpsc;

/// Identifies a request for its whole life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// When a sequence stops.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopCriteria {
    /// Most tokens to generate.
    pub max_new_tokens: usize,
    /// End tokens are banned until this many tokens were generated.
    pub min_new_tokens: usize,
    /// Extra tokens that end the sequence (kept as its last token).
    pub stop_token_ids: Vec<u32>,
    /// The model's end-of-sequence tokens.
    pub eos_token_ids: Vec<u32>,
    /// Keep generating through end-of-sequence tokens.
    pub ignore_eos: bool,
}

impl StopCriteria {
    /// Whether `token`, generated as the `generated`-th token, ends the sequence.
    pub(crate) fn is_stop(&self, token: u32, generated: usize) -> bool {
        generated >= self.min_new_tokens
            && (self.stop_token_ids.contains(&token) || (!self.ignore_eos && self.eos_token_ids.contains(&token)))
    }

    /// Tokens banned while fewer than `min_new_tokens` were generated, among the `vocab`
    /// the model knows (an end token past the vocabulary can never be drawn anyway).
    pub(crate) fn banned(&self, generated: usize, vocab: usize) -> Vec<u32> {
        if generated >= self.min_new_tokens {
            return Vec::new();
        }
        self.ending_tokens().filter(|&t| (t as usize) < vocab).collect()
    }

    /// The stop tokens and, unless `ignore_eos`, the end-of-sequence tokens.
    fn ending_tokens(&self) -> impl Iterator<Item = u32> + '_ {
        let eos = if self.ignore_eos { &[][..] } else { &self.eos_token_ids[..] };
        self.stop_token_ids.iter().chain(eos).copied()
    }

    /// Whether the tokens banned before `min_new_tokens` cover all of a `vocab`, so that
    /// nothing could be sampled.
    pub(crate) fn bans_everything(&self, vocab: usize) -> bool {
        if self.min_new_tokens == 0 || self.stop_token_ids.len() + self.eos_token_ids.len() < vocab {
            return false;
        }
        let mut seen = vec![false; vocab];
        self.ending_tokens().filter(|&t| (t as usize) < vocab).for_each(|t| seen[t as usize] = true);
        seen.into_iter().all(|s| s)
    }
}

/// A request for the engine. [`crate::EngineHandle::submit`] validates it against the
/// model and cache before the engine sees it, and refuses one that could never sample
/// (`min_tokens` above `max_tokens`, or end tokens banned by `min_tokens` that cover the
/// whole vocabulary).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// How tokens are drawn (with its seed pinned).
    pub sampling: SamplingParams,
    /// When each sequence stops.
    pub stop: StopCriteria,
    /// Independent continuations of the prompt; they share the prompt's KV blocks.
    pub n: usize,
    /// Scheduling priority for the priority policy: lower runs first.
    pub priority: i32,
}

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop or end-of-sequence token.
    Stop,
    /// `max_new_tokens`, the model's context, or a KV cache too small for the sequence.
    Length,
    /// The engine shut down before the sequence finished.
    Cancelled,
    /// The model or the sampler failed on this request (its other continuations end too),
    /// or an engine-level fault ended every request; the message says how.
    Error(String),
}

/// A generated token with its log-probabilities.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The token id.
    pub id: u32,
    /// Its log-probability under the model's raw logits, when logprobs were requested.
    pub logprob: Option<f32>,
    /// The most likely alternatives when requested, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// One event of a request's stream.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    /// Which of the `n` continuations.
    pub index: usize,
    /// The new token; `None` only for a finish that brings no token.
    pub token: Option<GeneratedToken>,
    /// Prompt tokens this continuation took from the prefix cache (or its sibling).
    pub cached_prompt_tokens: usize,
    /// Set on the continuation's last event.
    pub finish: Option<FinishReason>,
}

/// The receiving end of a request's events. Dropping it cancels the request and frees
/// its KV blocks: that is the only way to cancel.
#[derive(Debug)]
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::Receiver<TokenEvent>,
}

impl RequestStream {
    pub(crate) fn new(id: RequestId, rx: mpsc::Receiver<TokenEvent>) -> Self {
        Self { id, rx }
    }

    /// The request's id.
    pub fn id(&self) -> RequestId {
        self.id
    }

    /// The next event, or `None` once every continuation has finished.
    pub async fn next(&mut self) -> Option<TokenEvent> {
        self.rx.recv().await
    }

    /// The next event if one is ready, without waiting.
    pub fn try_next(&mut self) -> Option<TokenEvent> {
        self.rx.try_recv().ok()
    }

    /// [`Self::next`] for synchronous callers. Must not be called from an async runtime.
    pub fn blocking_next(&mut self) -> Option<TokenEvent> {
        self.rx.blocking_recv()
    }
}

/// What every continuation of a request shares inside the engine.
#[derive(Debug)]
pub(crate) struct RequestShared {
    pub(crate) id: RequestId,
    pub(crate) prompt_len: usize,
    pub(crate) sampling: SamplingParams,
    pub(crate) stop: StopCriteria,
    pub(crate) priority: i32,
    pub(crate) arrival: u64,
    pub(crate) arrived: Instant,
    /// Set once the first continuation has computed the whole prompt: the others may then
    /// share its blocks.
    pub(crate) prompt_ready: AtomicBool,
    /// Dropped with the last continuation, which ends the stream.
    pub(crate) events: mpsc::Sender<TokenEvent>,
}

impl RequestShared {
    pub(crate) fn new(id: RequestId, req: &EngineRequest, arrival: u64, events: mpsc::Sender<TokenEvent>) -> Arc<Self> {
        Arc::new(Self {
            id,
            prompt_len: req.prompt.len(),
            sampling: req.sampling.clone(),
            stop: req.stop.clone(),
            priority: req.priority,
            arrival,
            arrived: Instant::now(),
            prompt_ready: AtomicBool::new(false),
            events,
        })
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.events.is_closed()
    }

    pub(crate) fn prompt_ready(&self) -> bool {
        self.prompt_ready.load(Ordering::Relaxed)
    }
}
