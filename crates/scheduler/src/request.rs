//! What goes into the engine (a validated request) and what comes out (token events).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use met_config::{RequestField, SamplingParams};
use met_model_layers::lora::Adapter;
use tokio::sync::mpsc;

use crate::constraint::SharedConstraint;

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

/// Facts a request is checked against when it is made ([`EngineRequest::new`]): an
/// engine's, from [`crate::Engine::limits`] or [`crate::EngineHandle::limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Tokens the model knows.
    pub vocab_size: usize,
    /// Longest context the model supports.
    pub max_context: usize,
    /// Tokens the whole KV cache holds.
    pub kv_capacity: usize,
    /// Events buffered per request stream.
    pub stream_capacity: usize,
}

impl EngineLimits {
    /// Refuses an id of `ids` outside the vocabulary, naming `field`.
    ///
    /// # Errors
    /// [`RequestErrorKind::Invalid`] naming `field` and the first such id.
    pub fn check_token_ids(&self, field: RequestField, ids: &[u32]) -> Result<(), RequestError> {
        match ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            None => Ok(()),
            Some(id) => Err(RequestError {
                kind: RequestErrorKind::Invalid,
                field,
                msg: format!("token id {id} is outside the vocabulary of {}", self.vocab_size),
            }),
        }
    }
}

/// What kind of field a [`RequestError`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestErrorKind {
    /// A value that can never work with this model and cache.
    Invalid,
    /// The prompt, or the prompt with `max_tokens`, is longer than the model's context
    /// (OpenAI's `context_length_exceeded`).
    ContextLength,
}

/// Why a request cannot be made. The message names no field but `field` itself, which each
/// front end spells its own way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{field}`: {msg}")]
pub struct RequestError {
    /// What kind of problem it is.
    pub kind: RequestErrorKind,
    /// The field at fault.
    pub field: RequestField,
    /// What is wrong.
    pub msg: String,
}

/// A request for the engine, checked against an engine's limits when it is made: it can
/// only be built by [`EngineRequest::new`], so a request an engine holds can always be
/// served, and no front end repeats the checks.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineRequest {
    pub(crate) prompt: Vec<u32>,
    pub(crate) sampling: SamplingParams,
    pub(crate) stop: StopCriteria,
    pub(crate) n: usize,
    pub(crate) priority: i32,
    /// What the output must match (structured output), if anything.
    pub(crate) constraint: Option<SharedConstraint>,
    /// The LoRA adapter its tokens run through; `None` for the base model.
    pub(crate) adapter: Option<Adapter>,
    /// The limits it was checked against; an engine with other ones checks it again.
    pub(crate) limits: EngineLimits,
}

impl EngineRequest {
    /// `n` continuations of `prompt`, drawn with `sampling` (its seed pinned) until `stop`.
    ///
    /// # Errors
    /// A [`RequestError`] naming the first field that cannot work with `limits`:
    /// - `prompt`: empty, an id outside the vocabulary, or longer than the KV cache;
    ///   as [`RequestErrorKind::ContextLength`], no shorter than the context;
    /// - `max_tokens`: zero, or (`ContextLength`) more than the context leaves after the
    ///   prompt;
    /// - `n`: zero; `min_tokens`: above `max_tokens`;
    /// - `stop_token_ids`: an id outside the vocabulary, or end tokens that, banned until
    ///   `min_tokens`, cover the whole vocabulary (nothing could be sampled);
    /// - a sampling field that [`SamplingParams::validate`] refuses.
    pub fn new(
        prompt: Vec<u32>,
        sampling: SamplingParams,
        stop: StopCriteria,
        n: usize,
        limits: &EngineLimits,
    ) -> Result<Self, RequestError> {
        check(&prompt, &sampling, &stop, n, limits)?;
        Ok(Self { prompt, sampling, stop, n, priority: 0, constraint: None, adapter: None, limits: *limits })
    }

    /// The same request with scheduling priority `priority` (lower runs first, under the
    /// `priority` policy).
    #[must_use]
    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    /// The same request with every continuation's output held to `constraint`: each
    /// step samples only tokens it allows, and the sequence stops once it is complete.
    #[must_use]
    pub fn with_constraint(mut self, constraint: SharedConstraint) -> Self {
        self.constraint = Some(constraint);
        self
    }

    /// The same request run through LoRA adapter `adapter`, which it holds (loaded and
    /// unchanged) until it finishes.
    #[must_use]
    pub fn with_adapter(mut self, adapter: Adapter) -> Self {
        self.adapter = Some(adapter);
        self
    }

    /// The adapter it runs through, if any.
    pub fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// The constraint its output is held to, if any.
    pub fn constraint(&self) -> Option<&SharedConstraint> {
        self.constraint.as_ref()
    }

    /// Prompt token ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// How tokens are drawn.
    pub fn sampling(&self) -> &SamplingParams {
        &self.sampling
    }

    /// When each sequence stops.
    pub fn stop(&self) -> &StopCriteria {
        &self.stop
    }

    /// Independent continuations of the prompt; they share the prompt's KV blocks.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Scheduling priority for the priority policy: lower runs first.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Checks it against `limits` if it was made against others (another engine's), so
    /// an engine only ever holds requests that fit it.
    pub(crate) fn fits(&self, limits: &EngineLimits) -> Result<(), RequestError> {
        if &self.limits == limits {
            return Ok(());
        }
        check(&self.prompt, &self.sampling, &self.stop, self.n, limits)
    }
}

/// Every check of [`EngineRequest::new`], in the order it reports them.
fn check(
    prompt: &[u32],
    sampling: &SamplingParams,
    stop: &StopCriteria,
    n: usize,
    limits: &EngineLimits,
) -> Result<(), RequestError> {
    let error = |kind, field, msg: String| Err(RequestError { kind, field, msg });
    let invalid = |field, msg| error(RequestErrorKind::Invalid, field, msg);
    let (len, context, vocab) = (prompt.len(), limits.max_context, limits.vocab_size);
    if len == 0 {
        return invalid(RequestField::Prompt, "the prompt is empty".into());
    }
    limits.check_token_ids(RequestField::Prompt, prompt)?;
    if len >= context {
        let msg = format!("the prompt has {len} tokens; the model's maximum context length is {context} tokens");
        return error(RequestErrorKind::ContextLength, RequestField::Prompt, msg);
    }
    if len + 1 > limits.kv_capacity {
        let msg =
            format!("the prompt has {len} tokens and can never fit the KV cache of {} tokens", limits.kv_capacity);
        return invalid(RequestField::Prompt, msg);
    }
    if n == 0 {
        return invalid(RequestField::N, "must be at least 1".into());
    }
    let max = stop.max_new_tokens;
    if max == 0 {
        return invalid(RequestField::MaxTokens, "must be at least 1".into());
    }
    if max > context - len {
        let msg = format!(
            "the prompt has {len} tokens and asks for up to {max} more: {} in all, more than the model's maximum \
             context length of {context} tokens",
            len.saturating_add(max)
        );
        return error(RequestErrorKind::ContextLength, RequestField::MaxTokens, msg);
    }
    if stop.min_new_tokens > max {
        let msg = format!("{} is above the most tokens to generate ({max})", stop.min_new_tokens);
        return invalid(RequestField::MinTokens, msg);
    }
    limits.check_token_ids(RequestField::StopTokenIds, &stop.stop_token_ids)?;
    if stop.bans_everything(vocab) {
        let msg = format!(
            "while fewer than {} tokens are generated, the stop tokens and the end-of-sequence tokens ban all \
             {vocab} tokens of the vocabulary: nothing could be sampled",
            stop.min_new_tokens
        );
        return invalid(RequestField::StopTokenIds, msg);
    }
    sampling.validate(vocab).map_err(|e| RequestError { kind: RequestErrorKind::Invalid, field: e.field, msg: e.msg })
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
    pub(crate) constraint: Option<SharedConstraint>,
    pub(crate) adapter: Option<Adapter>,
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
            constraint: req.constraint.clone(),
            adapter: req.adapter.clone(),
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

    /// The prefix-cache namespace of its tokens: its adapter's, or the base model's 0.
    pub(crate) fn cache_namespace(&self) -> u64 {
        self.adapter.as_ref().map_or(0, |a| a.id().0)
    }

    /// Runs the rows `batch` holds last for it through its adapter, if any.
    pub(crate) fn adapt(&self, batch: &mut met_model_layers::ForwardBatch) {
        if let Some(adapter) = &self.adapter {
            batch.adapt_last(adapter);
        }
    }
}
