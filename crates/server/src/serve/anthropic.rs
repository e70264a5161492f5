//! `POST /v1/messages` and `POST /v1/messages/count_tokens`: Anthropic's Messages API over
//! the chat path. `system`, `messages` with content blocks (`text`, `tool_use`,
//! `tool_result`), `tools` (`input_schema`), `tool_choice` (`auto`, `any`, `tool`, `none`),
//! `stop_sequences` and `max_tokens` become a chat request that `validate` checks and the
//! engine runs as any other; the answer is content blocks (`thinking`, `text`, `tool_use`)
//! with a `stop_reason`, and a stream is Anthropic's events (`message_start`,
//! `content_block_start`, `content_block_delta`, `content_block_stop`, `message_delta`,
//! `message_stop`).
//!
//! Errors keep Anthropic's shape, `{"type": "error", "error": {"type":
//! "invalid_request_error", "message": ...}}`, with the status the chat path gives them;
//! the message names the field, in this API's names where they differ. (Failures of the
//! HTTP layer before the handler, such as a wrong content type, stay OpenAI-shaped.)

use std::convert::Infallible;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Deserialize;
use serde_json::{Value, json};

use super::choice_output::{Answer, ChoiceOutput};
use super::dialect::Dialect;
use super::error::ApiError;
use super::state::AppState;
use super::stream::{Finish, Generation};
use super::validate;
use super::wire::{ApiJson, GenerationRequest, Stop};
use crate::startup::engine::random_seed;
use met_text::ChatMessage;

/// The body of `POST /v1/messages` (and of `count_tokens`, which reads the prompt fields).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct MessagesRequest {
    /// The model; must be the served one when present.
    pub model: Option<String>,
    /// A system prompt: text, or text blocks.
    pub system: Option<Value>,
    /// The conversation.
    pub messages: Option<Vec<Value>>,
    /// Most tokens to generate (required by the API).
    pub max_tokens: Option<u64>,
    /// Texts that end the answer.
    pub stop_sequences: Option<Vec<String>>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f32>,
    /// Keep the K most likely tokens.
    pub top_k: Option<i64>,
    /// Stream events.
    pub stream: Option<bool>,
    /// Tools: `{"name", "description", "input_schema"}`.
    pub tools: Option<Vec<Value>>,
    /// `{"type": "auto" | "any" | "tool" | "none", "name"}`.
    pub tool_choice: Option<Value>,
}

/// Anthropic's error JSON for `e`.
fn anthropic_error(e: &ApiError) -> Value {
    let kind = match e.status {
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::FORBIDDEN => "permission_error",
        StatusCode::NOT_FOUND => "not_found_error",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
        StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
        s if s.is_server_error() => "api_error",
        _ => "invalid_request_error",
    };
    let message = match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    };
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

fn error_response(e: &ApiError) -> Response {
    (e.status, Json(anthropic_error(e))).into_response()
}

/// Whether `path` is one of the Anthropic routes.
fn is_anthropic_route(path: &str) -> bool {
    path == "/v1/messages" || path.starts_with("/v1/messages/")
}

/// A layer over the whole router: errors answered on an Anthropic route before its handler
/// runs (the API key, the body's type, size and JSON, the method) get Anthropic's error
/// body, with the status and headers (`Retry-After`, `Connection: close`) they had.
pub async fn own_error_format(req: Request, next: Next) -> Response {
    let anthropic = is_anthropic_route(req.uri().path());
    let mut response = next.run(req).await;
    if anthropic && let Some(e) = response.extensions_mut().remove::<ApiError>() {
        let (mut parts, _) = response.into_parts();
        parts.headers.remove(header::CONTENT_LENGTH);
        let body = Json(anthropic_error(&e)).into_response().into_body();
        return Response::from_parts(parts, body);
    }
    response
}

/// `POST /v1/messages`.
pub async fn messages(State(state): State<AppState>, ApiJson(req): ApiJson<MessagesRequest>) -> Response {
    respond(state, req).await.unwrap_or_else(|e| error_response(&e))
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens, as the model would see them.
pub async fn count_tokens(State(state): State<AppState>, ApiJson(mut req): ApiJson<MessagesRequest>) -> Response {
    req.max_tokens = Some(1);
    req.stream = None;
    let counted = async {
        state.check_model(req.model.as_deref())?;
        let valid = validated(&state, req).await?;
        Ok::<_, ApiError>(valid.requests.iter().map(|r| r.prompt().len()).sum::<usize>())
    };
    match counted.await {
        Ok(n) => Json(json!({"input_tokens": n})).into_response(),
        Err(e) => error_response(&e),
    }
}

/// `req` checked as a chat request and its prompt tokenized (off the async threads), with
/// field names as Anthropic spells them in any error.
async fn validated(state: &AppState, req: MessagesRequest) -> Result<validate::Validated, ApiError> {
    let parsed = validate::parse(chat_request(req)?, Dialect::Messages, state)?;
    let worker = state.clone();
    tokio::task::spawn_blocking(move || validate::tokenize(parsed, &worker))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizing failed: {e}")))?
}

async fn respond(state: AppState, req: MessagesRequest) -> Result<Response, ApiError> {
    let permit = state.admit()?;
    let served = state.check_model(req.model.as_deref())?;
    if req.max_tokens.is_none() {
        return Err(ApiError::invalid("max_tokens", "max_tokens: is required"));
    }
    let stream = req.stream.unwrap_or(false);
    let valid = validated(&state, req).await?;
    let prompt_tokens = valid.requests.iter().map(|r| r.prompt().len()).sum();
    let mut streams = Vec::with_capacity(valid.requests.len());
    for request in valid.requests {
        streams.push(state.engine().submit(served.attach(request))?);
    }
    let mut generation = Generation::new(streams, prompt_tokens, state.tokenizer(), &valid.text);
    let answer = Answer::new(ChoiceOutput::new(&valid.text.output));
    let meta = Meta { id: format!("msg_{:016x}{:016x}", random_seed(), random_seed()), model: served.name };
    if stream {
        return Ok(event_stream(generation, answer, meta, permit));
    }
    let mut answer = answer;
    while let Some(delta) = generation.next().await {
        let delta = delta?;
        answer.push(&delta);
    }
    let usage = generation.usage();
    let body = json!({
        "id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
        "content": answer.blocks(), "stop_reason": answer.stop_reason(), "stop_sequence": answer.stop_sequence,
        "usage": {"input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                  "cache_read_input_tokens": usage.prompt_tokens_details.cached_tokens},
    });
    Ok(Json(body).into_response())
}

struct Meta {
    id: String,
    model: String,
}

/// The chat request a Messages request stands for.
fn chat_request(req: MessagesRequest) -> Result<GenerationRequest, ApiError> {
    let mut messages = Vec::new();
    match req.system {
        None => {}
        Some(Value::String(s)) => messages.push(ChatMessage::text("system", s)),
        Some(Value::Array(blocks)) => messages.push(ChatMessage::text("system", block_texts("system", &blocks)?)),
        Some(_) => return Err(ApiError::invalid("system", "system: must be a string or a list of text blocks")),
    }
    let given = req.messages.ok_or_else(|| ApiError::invalid("messages", "messages: is required"))?;
    for (i, m) in given.into_iter().enumerate() {
        messages.extend(chat_messages(i, &m)?);
    }
    let tools = req.tools.map(|tools| {
        let function = |t: Value| {
            json!({"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                   "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object", "properties": {}}))}})
        };
        tools.into_iter().map(function).collect()
    });
    let tool_choice = match req.tool_choice {
        None => None,
        Some(c) => Some(match c.get("type").and_then(Value::as_str) {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": c.get("name")}}),
            _ => return Err(ApiError::invalid("tool_choice", "tool_choice: `type` is auto, any, tool or none")),
        }),
    };
    Ok(GenerationRequest {
        messages: Some(messages),
        max_tokens: req.max_tokens,
        stop: req.stop_sequences.map(Stop::Many),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        tools,
        tool_choice,
        ..GenerationRequest::default()
    })
}

fn block_texts(field: &str, blocks: &[Value]) -> Result<String, ApiError> {
    let texts: Option<Vec<&str>> = blocks
        .iter()
        .map(|b| {
            if b.get("type").and_then(Value::as_str) == Some("text") {
                b.get("text").and_then(Value::as_str)
            } else {
                None
            }
        })
        .collect();
    let texts = texts
        .ok_or_else(|| ApiError::invalid(field.to_owned(), format!("{field}: only text blocks are supported here")))?;
    Ok(texts.join("\n"))
}

/// One Anthropic message as chat messages: its text and tool calls, and each tool result as
/// a `tool` message.
fn chat_messages(i: usize, m: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let field = format!("messages[{i}]");
    let role = m
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(field.clone(), format!("{field}: needs a role")))?;
    let blocks = match m.get("content") {
        Some(Value::String(s)) => return Ok(vec![ChatMessage::text(role, s.clone())]),
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(ApiError::invalid(
                format!("{field}.content"),
                format!("{field}.content: a string or a list of blocks"),
            ));
        }
    };
    let (mut text, mut calls, mut results) = (Vec::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let at = format!("{field}.content[{j}]");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push(b.get("text").and_then(Value::as_str).unwrap_or_default().to_owned()),
            Some("tool_use") => {
                let arguments = b.get("input").cloned().unwrap_or(json!({})).to_string();
                calls.push(json!({"id": b.get("id"), "type": "function",
                                  "function": {"name": b.get("name"), "arguments": arguments}}));
            }
            Some("tool_result") => {
                let content = match b.get("content") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => block_texts(&at, parts)?,
                    _ => String::new(),
                };
                let mut r = ChatMessage::text("tool", content);
                r.extra.insert("tool_call_id".into(), b.get("tool_use_id").cloned().unwrap_or_default());
                results.push(r);
            }
            other => {
                return Err(ApiError::invalid(
                    at.clone(),
                    format!("{at}: `{}` blocks are not supported", other.unwrap_or("?")),
                ));
            }
        }
    }
    let mut out = results;
    if !text.is_empty() || !calls.is_empty() {
        let mut m = ChatMessage::text(role, text.join("\n"));
        if !calls.is_empty() {
            m.extra.insert("tool_calls".into(), Value::Array(calls));
        }
        out.push(m);
    }
    Ok(out)
}

impl Answer {
    fn tool_blocks(&self) -> Vec<Value> {
        let input = |args: &str| serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}));
        self.calls()
            .into_iter()
            .map(|c| {
                json!({"type": "tool_use", "id": c.id.replacen("call_", "toolu_", 1), "name": c.function.name,
                            "input": input(&c.function.arguments)})
            })
            .collect()
    }

    fn blocks(&self) -> Vec<Value> {
        let mut blocks = Vec::new();
        if !self.piece.reasoning.is_empty() {
            blocks.push(json!({"type": "thinking", "thinking": self.piece.reasoning, "signature": ""}));
        }
        let tools = self.tool_blocks();
        if !self.piece.content.is_empty() || tools.is_empty() {
            blocks.push(json!({"type": "text", "text": self.piece.content}));
        }
        blocks.extend(tools);
        blocks
    }

    fn stop_reason(&self) -> &'static str {
        if !self.piece.calls.is_empty() {
            "tool_use"
        } else if self.finish == Some(Finish::Length) {
            "max_tokens"
        } else if self.stop_sequence.is_some() {
            "stop_sequence"
        } else {
            "end_turn"
        }
    }
}

/// Which content block a stream has open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
}

struct EventStream {
    generation: Generation,
    answer: Answer,
    open: Open,
    index: usize,
    done: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

fn event(kind: &str, mut body: Value) -> Event {
    body["type"] = json!(kind);
    Event::default().event(kind).data(body.to_string())
}

fn event_stream(
    generation: Generation,
    answer: Answer,
    meta: Meta,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response {
    let start = json!({"message": {"id": meta.id, "type": "message", "role": "assistant", "model": meta.model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 0, "output_tokens": 0}}});
    let first = vec![event("message_start", start)];
    let s = EventStream { generation, answer, open: Open::None, index: 0, done: false, _permit: permit };
    let batches = stream::unfold((s, Some(first)), |(mut s, first)| async move {
        if let Some(first) = first {
            return Some((first, (s, None)));
        }
        let batch = s.next_events().await?;
        Some((batch, (s, None)))
    });
    let events =
        futures_util::StreamExt::flat_map(batches, |b| stream::iter(b.into_iter().map(Ok::<Event, Infallible>)));
    Sse::new(events).into_response()
}

impl EventStream {
    async fn next_events(&mut self) -> Option<Vec<Event>> {
        if self.done {
            return None;
        }
        let mut events = Vec::new();
        match self.generation.next().await {
            Some(Ok(delta)) => {
                let piece = self.answer.push(&delta);
                if !piece.reasoning.is_empty() {
                    self.switch(Open::Thinking, &mut events);
                    let d = json!({"type": "thinking_delta", "thinking": piece.reasoning});
                    events.push(event("content_block_delta", json!({"index": self.index, "delta": d})));
                }
                if !piece.content.is_empty() {
                    self.switch(Open::Text, &mut events);
                    let d = json!({"type": "text_delta", "text": piece.content});
                    events.push(event("content_block_delta", json!({"index": self.index, "delta": d})));
                }
            }
            Some(Err(e)) => {
                self.done = true;
                events.push(event("error", anthropic_error(&e)));
            }
            None => {
                self.done = true;
                self.closing(&mut events);
            }
        }
        Some(events)
    }

    /// Makes `kind` the open block, closing the one before.
    fn switch(&mut self, kind: Open, events: &mut Vec<Event>) {
        if self.open == kind {
            return;
        }
        self.close(events);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            _ => json!({"type": "text", "text": ""}),
        };
        events.push(event("content_block_start", json!({"index": self.index, "content_block": block})));
        self.open = kind;
    }

    fn close(&mut self, events: &mut Vec<Event>) {
        if self.open != Open::None {
            events.push(event("content_block_stop", json!({"index": self.index})));
            self.index += 1;
            self.open = Open::None;
        }
    }

    fn closing(&mut self, events: &mut Vec<Event>) {
        let tools = self.answer.tool_blocks();
        if tools.is_empty() && self.open == Open::None && self.index == 0 {
            self.switch(Open::Text, events);
        }
        self.close(events);
        for block in tools {
            let start = json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}});
            events.push(event("content_block_start", json!({"index": self.index, "content_block": start})));
            let d = json!({"type": "input_json_delta", "partial_json": block["input"].to_string()});
            events.push(event("content_block_delta", json!({"index": self.index, "delta": d})));
            events.push(event("content_block_stop", json!({"index": self.index})));
            self.index += 1;
        }
        let usage = self.generation.usage();
        let delta = json!({"delta": {"stop_reason": self.answer.stop_reason(), "stop_sequence": self.answer.stop_sequence},
                           "usage": {"output_tokens": usage.completion_tokens}});
        events.push(event("message_delta", delta));
        events.push(event("message_stop", json!({})));
    }
}
