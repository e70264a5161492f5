//! `POST /v1/chat/completions` and `POST /v1/completions`, the request path of DESIGN §4:
//! admit under the concurrency limit (429 past it), check the model, validate, render and
//! tokenize on a blocking worker, submit one engine request per prompt, then answer with one
//! JSON object or a stream of server-sent events.
//!
//! A stream is one chunk per choice delta, then a chunk with `finish_reason` per choice, the
//! usage chunk when `stream_options.include_usage`, and `data: [DONE]`. An error after the
//! stream started is one error event, then `[DONE]`. The concurrency permit and the engine
//! streams live inside the response body: when the client disconnects, hyper drops the body,
//! which cancels the engine requests and frees the slot.
//!
//! A generation that fails after it was submitted (the engine failed it, or the drain cut
//! it) is logged as a warning under its response id, streamed or not: the client's error
//! names no request, the log does.
//!
//! A [`DrainCut`] (a request extension `met serve` adds) ends every response still running
//! when the drain timeout passes: a stream with a final error event and `[DONE]`, a JSON
//! answer with a 503, so no client is left with a silently truncated answer.

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::StreamExt;
use futures_util::stream;
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, watch};

use super::choice_output::{ChoiceOutput, Piece, merge_calls};
use super::dialect::{Dialect, Endpoint};
use super::error::ApiError;
use super::options::{LogprobsShape, TextOptions};
use super::state::{AppState, unix_now};
use super::stream::{ChoiceDelta, Finish, Generation, TokenLogprob};
use super::validate;
use super::wire::{
    ApiJson, ChatChoice, ChatCompletion, ChatDelta, ChatLogprobs, ChatMessageOut, ChatTokenLogprob, Completion,
    CompletionChoice, CompletionLogprobs, GenerationRequest, TopLogprob, TopMap, Usage,
};
use crate::startup::engine::random_seed;

/// The drain timeout's signal to the responses still running. `met serve` adds one to every
/// request as an extension; a request without one is never cut.
#[derive(Debug, Clone, Default)]
pub struct DrainCut(Option<watch::Receiver<bool>>);

impl DrainCut {
    /// A cut and the switch that fires it (`send(true)`).
    pub fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(Some(rx)))
    }

    /// Resolves once the cut fired; never, without a switch or once it is dropped unfired.
    async fn fired(&mut self) {
        let fired = match &mut self.0 {
            Some(rx) => rx.wait_for(|cut| *cut).await.is_ok(),
            None => false,
        };
        if !fired {
            std::future::pending::<()>().await;
        }
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    cut: Option<Extension<DrainCut>>,
    ApiJson(req): ApiJson<GenerationRequest>,
) -> Response {
    let cut = cut.map(|Extension(cut)| cut).unwrap_or_default();
    respond(state, req, Endpoint::Chat, cut).await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    cut: Option<Extension<DrainCut>>,
    ApiJson(req): ApiJson<GenerationRequest>,
) -> Response {
    let cut = cut.map(|Extension(cut)| cut).unwrap_or_default();
    respond(state, req, Endpoint::Completions, cut).await.unwrap_or_else(IntoResponse::into_response)
}

/// What every chunk of a response repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    text: TextOptions,
}

async fn respond(
    state: AppState,
    req: GenerationRequest,
    endpoint: Endpoint,
    mut cut: DrainCut,
) -> Result<Response, ApiError> {
    let permit = state.admit()?;
    let served = state.check_model(req.model.as_deref())?;
    let dialect = match endpoint {
        Endpoint::Chat => Dialect::Chat,
        Endpoint::Completions => Dialect::Completions,
    };
    let parsed = validate::parse(req, dialect, &state)?;
    let worker = state.clone();
    let valid = tokio::task::spawn_blocking(move || validate::tokenize(parsed, &worker))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))??;
    let prompt_tokens = valid.requests.iter().map(|r| r.prompt().len()).sum();
    let mut streams = Vec::with_capacity(valid.requests.len());
    for request in valid.requests {
        streams.push(state.engine().submit(served.attach(request))?);
    }
    let generation = Generation::new(streams, prompt_tokens, state.tokenizer(), &valid.text);
    let prefix = match endpoint {
        Endpoint::Chat => "chatcmpl",
        Endpoint::Completions => "cmpl",
    };
    let meta = Meta {
        id: format!("{prefix}-{:016x}{:016x}", random_seed(), random_seed()),
        created: unix_now(),
        model: served.name,
        text: valid.text,
    };
    if meta.text.stream {
        Ok(event_stream(generation, meta, permit, cut))
    } else {
        // The permit is held until the whole answer is built.
        let response = tokio::select! {
            biased;
            () = cut.fired() => Err(ApiError::drain_cut()),
            response = collect(generation, &meta) => response,
        };
        response.inspect_err(|e| log_failure(&meta, e))
    }
}

/// A generation that failed after it was submitted, in the server log under its response id;
/// the same for a JSON answer and a stream.
fn log_failure(meta: &Meta, e: &ApiError) {
    tracing::warn!("{}: {e}", meta.id);
}

/// Runs the generation to its end and answers with one JSON object.
async fn collect(mut generation: Generation, meta: &Meta) -> Result<Response, ApiError> {
    let count = generation.num_choices();
    let mut texts = vec![String::new(); count];
    let mut logprobs: Vec<Vec<TokenLogprob>> = vec![Vec::new(); count];
    let mut finish = vec![None; count];
    let mut outputs: Vec<ChoiceOutput> = (0..count).map(|_| ChoiceOutput::new(&meta.text.output)).collect();
    let mut pieces: Vec<Piece> = (0..count).map(|_| Piece::default()).collect();
    while let Some(delta) = generation.next().await {
        let delta = delta?;
        let i = delta.index;
        texts[i].push_str(&delta.text);
        pieces[i].append(outputs[i].push(&delta.text));
        if delta.finish.is_some() {
            pieces[i].append(outputs[i].finish());
        }
        logprobs[i].extend(delta.logprobs);
        finish[i] = delta.finish.or(finish[i]);
    }
    let usage = Some(Some(generation.usage()));
    let shape = meta.text.logprobs;
    let parts = texts.into_iter().zip(logprobs).zip(finish).enumerate();
    Ok(match meta.text.endpoint {
        Endpoint::Chat => {
            let choices = parts
                .zip(pieces.into_iter().zip(&outputs))
                .map(|((index, ((_, logprobs), finish)), (piece, output))| ChatChoice {
                    index,
                    message: Some(message(piece)),
                    delta: None,
                    logprobs: chat_logprobs(shape, logprobs),
                    finish_reason: finish.map(|f| output.finish_reason(f)),
                })
                .collect();
            Json(chat(meta, "chat.completion", choices, usage)).into_response()
        }
        Endpoint::Completions => {
            let choices = parts
                .map(|(index, ((text, logprobs), finish))| CompletionChoice {
                    index,
                    text,
                    logprobs: legacy_logprobs(shape, logprobs),
                    finish_reason: finish.map(Finish::as_str),
                })
                .collect();
            Json(completion(meta, choices, usage)).into_response()
        }
    })
}

/// A whole chat answer: `content` is `null` for one that is only tool calls.
fn message(piece: Piece) -> ChatMessageOut {
    let calls = merge_calls(piece.calls);
    let content = (calls.is_empty() || !piece.content.is_empty()).then_some(piece.content);
    ChatMessageOut {
        role: "assistant",
        content,
        reasoning_content: (!piece.reasoning.is_empty()).then_some(piece.reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

/// Where a stream is.
enum Stage {
    Start,
    Running,
    Done,
}

/// Everything a streamed response owns; dropped with the response body.
struct EventStream {
    generation: Generation,
    meta: Meta,
    stage: Stage,
    cut: DrainCut,
    /// Each chat choice's splitter into reasoning, content and tool calls.
    outputs: Vec<ChoiceOutput>,
    _permit: OwnedSemaphorePermit,
}

fn event_stream(generation: Generation, meta: Meta, permit: OwnedSemaphorePermit, cut: DrainCut) -> Response {
    let outputs = (0..generation.num_choices()).map(|_| ChoiceOutput::new(&meta.text.output)).collect();
    let state = EventStream { generation, meta, stage: Stage::Start, cut, outputs, _permit: permit };
    let batches = stream::unfold(state, |mut s| async move {
        let batch = s.next_events().await?;
        Some((batch, s))
    });
    let events = batches.flat_map(|batch| stream::iter(batch.into_iter().map(Ok::<Event, Infallible>)));
    Sse::new(events).into_response()
}

impl EventStream {
    /// The next events to send; `None` after `[DONE]`.
    async fn next_events(&mut self) -> Option<Vec<Event>> {
        match self.stage {
            Stage::Done => None,
            Stage::Start => {
                self.stage = Stage::Running;
                Some(self.role_chunks())
            }
            Stage::Running => Some(match self.next_delta().await {
                Some(Ok(delta)) => self.delta_chunks(delta),
                Some(Err(e)) => {
                    log_failure(&self.meta, &e);
                    self.stage = Stage::Done;
                    vec![e.sse_event(), Event::default().data("[DONE]")]
                }
                None => {
                    self.stage = Stage::Done;
                    let usage = self.meta.text.include_usage.then(|| self.usage_chunk());
                    usage.into_iter().chain([Event::default().data("[DONE]")]).collect()
                }
            }),
        }
    }

    /// The generation's next delta, or the drain cut's error.
    async fn next_delta(&mut self) -> Option<Result<ChoiceDelta, ApiError>> {
        tokio::select! {
            biased;
            () = self.cut.fired() => Some(Err(ApiError::drain_cut())),
            delta = self.generation.next() => delta,
        }
    }

    /// `usage: null` on every chunk but the last when the client asked for usage.
    fn usage_field(&self) -> Option<Option<Usage>> {
        self.meta.text.include_usage.then_some(None)
    }

    /// Chat streams open each choice with the assistant role.
    fn role_chunks(&self) -> Vec<Event> {
        if self.meta.text.endpoint != Endpoint::Chat {
            return Vec::new();
        }
        let chunk = |index| ChatChoice {
            index,
            message: None,
            delta: Some(ChatDelta { role: Some("assistant"), content: Some(String::new()), ..ChatDelta::default() }),
            logprobs: None,
            finish_reason: None,
        };
        let chunks =
            (0..self.generation.num_choices()).map(|i| chat(&self.meta, CHUNK, vec![chunk(i)], self.usage_field()));
        chunks.map(|c| json_event(&c)).collect()
    }

    /// A chunk with the delta's text (or logprobs), then one with its finish reason.
    fn delta_chunks(&mut self, delta: ChoiceDelta) -> Vec<Event> {
        let ChoiceDelta { index, text, logprobs, finish, .. } = delta;
        let shape = self.meta.text.logprobs;
        let mut events = Vec::with_capacity(2);
        let has_content = !text.is_empty() || !logprobs.is_empty();
        match self.meta.text.endpoint {
            Endpoint::Chat => {
                let output = &mut self.outputs[index];
                let mut piece = output.push(&text);
                if finish.is_some() {
                    piece.append(output.finish());
                }
                let finish_reason = finish.map(|f| output.finish_reason(f));
                let choice = |delta, logprobs, finish_reason| ChatChoice {
                    index,
                    message: None,
                    delta: Some(delta),
                    logprobs,
                    finish_reason,
                };
                if !piece.is_empty() || !logprobs.is_empty() {
                    let c = choice(chat_delta(piece), chat_logprobs(shape, logprobs), None);
                    events.push(json_event(&chat(&self.meta, CHUNK, vec![c], self.usage_field())));
                }
                if let Some(reason) = finish_reason {
                    let c = choice(ChatDelta::default(), None, Some(reason));
                    events.push(json_event(&chat(&self.meta, CHUNK, vec![c], self.usage_field())));
                }
            }
            Endpoint::Completions => {
                let choice = |text, logprobs, finish_reason| CompletionChoice { index, text, logprobs, finish_reason };
                if has_content {
                    let c = choice(text, legacy_logprobs(shape, logprobs), None);
                    events.push(json_event(&completion(&self.meta, vec![c], self.usage_field())));
                }
                if let Some(finish) = finish {
                    let c = choice(String::new(), None, Some(finish.as_str()));
                    events.push(json_event(&completion(&self.meta, vec![c], self.usage_field())));
                }
            }
        }
        events
    }

    /// The last chunk when the client asked for usage: no choices, the totals.
    fn usage_chunk(&self) -> Event {
        let usage = Some(Some(self.generation.usage()));
        match self.meta.text.endpoint {
            Endpoint::Chat => json_event(&chat(&self.meta, CHUNK, Vec::new(), usage)),
            Endpoint::Completions => json_event(&completion(&self.meta, Vec::new(), usage)),
        }
    }
}

const CHUNK: &str = "chat.completion.chunk";

/// A chunk's delta of `piece`: its content (also when empty, for a chunk that carries only
/// logprobs), reasoning and tool-call pieces.
fn chat_delta(piece: Piece) -> ChatDelta {
    let Piece { reasoning, content, calls } = piece;
    let content_shown = !content.is_empty() || (reasoning.is_empty() && calls.is_empty());
    ChatDelta {
        role: None,
        content: content_shown.then_some(content),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls: (!calls.is_empty()).then_some(calls),
    }
}

fn chat(meta: &Meta, object: &'static str, choices: Vec<ChatChoice>, usage: Option<Option<Usage>>) -> ChatCompletion {
    ChatCompletion { id: meta.id.clone(), object, created: meta.created, model: meta.model.clone(), choices, usage }
}

fn completion(meta: &Meta, choices: Vec<CompletionChoice>, usage: Option<Option<Usage>>) -> Completion {
    Completion {
        id: meta.id.clone(),
        object: "text_completion",
        created: meta.created,
        model: meta.model.clone(),
        choices,
        usage,
    }
}

fn json_event(value: &impl Serialize) -> Event {
    // The wire types always serialize (non-finite floats become null).
    Event::default().data(serde_json::to_string(value).unwrap_or_default())
}

/// Chat's logprobs shape, when the request asked for it.
fn chat_logprobs(shape: LogprobsShape, tokens: Vec<TokenLogprob>) -> Option<ChatLogprobs> {
    (shape == LogprobsShape::Chat).then(|| ChatLogprobs {
        content: tokens
            .into_iter()
            .map(|t| ChatTokenLogprob {
                token: t.token,
                logprob: t.logprob,
                bytes: t.bytes,
                top_logprobs: t
                    .top
                    .into_iter()
                    .map(|(token, bytes, logprob)| TopLogprob { token, logprob, bytes })
                    .collect(),
            })
            .collect(),
    })
}

/// Completions' legacy logprobs shape, when the request asked for it.
fn legacy_logprobs(shape: LogprobsShape, tokens: Vec<TokenLogprob>) -> Option<CompletionLogprobs> {
    (shape == LogprobsShape::Legacy).then(|| {
        let mut out = CompletionLogprobs::default();
        for t in tokens {
            out.text_offset.push(t.text_offset);
            out.token_logprobs.push(t.logprob);
            out.top_logprobs.push(TopMap(t.top.into_iter().map(|(token, _, logprob)| (token, logprob)).collect()));
            out.tokens.push(t.token);
        }
        out
    })
}
