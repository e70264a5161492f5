//! `POST /v1/responses`: OpenAI's Responses API over the chat path. A request's
//! `instructions`, `input` (a string, or items: messages, `function_call`s and their
//! `function_call_output`s), `tools`, `tool_choice`, `text.format` and
//! `max_output_tokens` become a chat request that `validate` checks and the engine runs as
//! any other; each answer becomes `output` items (`reasoning`, `message` with
//! `output_text`, `function_call`), and a stream is the typed events (`response.created`,
//! `response.output_item.added`, `response.output_text.delta`, ..., `response.completed`),
//! each with its `sequence_number`.
//!
//! `previous_response_id` continues a stored conversation: every answer is kept (its input
//! and output as chat messages) in a bounded in-memory store, the oldest dropped first, so
//! an id that fell out, or never existed, is a 404 naming it. Errors keep OpenAI's shape,
//! with this API's field names (`input`, `max_output_tokens`, `text.format`).

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use serde::Deserialize;
use serde_json::{Value, json};

use super::choice_output::{Answer, ChoiceOutput};
use super::dialect::Dialect;
use super::error::ApiError;
use super::state::{AppState, STORED_RESPONSES, unix_now};
use super::stream::{Finish, Generation};
use super::validate;
use super::wire::{ApiJson, GenerationRequest, ResponseFormat, ToolCallOut, Usage};
use crate::startup::engine::random_seed;
use met_text::ChatMessage;

/// The body of `POST /v1/responses`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ResponsesRequest {
    /// The model; must be the served one when present.
    pub model: Option<String>,
    /// A user message, or a list of input items.
    pub input: Option<Value>,
    /// A system message put first (not carried to later responses).
    pub instructions: Option<String>,
    /// The stored response this one continues.
    pub previous_response_id: Option<String>,
    /// Most tokens to generate.
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f32>,
    /// Stream typed events.
    pub stream: Option<bool>,
    /// Function tools: `{"type": "function", "name", "description", "parameters"}`.
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto`, `required` or `{"type": "function", "name"}`.
    pub tool_choice: Option<Value>,
    /// Allow several calls in one answer.
    pub parallel_tool_calls: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<Value>,
    /// Keep the response for `previous_response_id` (default true).
    pub store: Option<bool>,
    /// A seed (met's extension, as on chat).
    pub seed: Option<serde_json::Number>,
}

/// `POST /v1/responses`.
pub async fn responses(State(state): State<AppState>, ApiJson(req): ApiJson<ResponsesRequest>) -> Response {
    respond(state, req).await.unwrap_or_else(IntoResponse::into_response)
}

/// Everything the answer repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    /// The request's own fields, echoed in the response object.
    echo: Value,
    /// The conversation so far, without `instructions`, to store with the answer.
    history: Vec<ChatMessage>,
    store: bool,
}

async fn respond(state: AppState, req: ResponsesRequest) -> Result<Response, ApiError> {
    let permit = state.admit()?;
    let served = state.check_model(req.model.as_deref())?;
    let stream = req.stream.unwrap_or(false);
    let echo = json!({
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": req.temperature.unwrap_or(1.0), "top_p": req.top_p.unwrap_or(1.0),
        "tools": req.tools.clone().unwrap_or_default(), "tool_choice": req.tool_choice.clone().unwrap_or(json!("auto")),
        "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": req.previous_response_id,
        "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
    });
    let store = req.store.unwrap_or(true);
    let (chat, history) = chat_request(&state, req)?;
    let parsed = validate::parse(chat, Dialect::Responses, &state)?;
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
    let output = ChoiceOutput::new(&valid.text.output);
    let meta = Meta {
        id: format!("resp_{:016x}{:016x}", random_seed(), random_seed()),
        created: unix_now(),
        model: served.name,
        echo,
        history,
        store,
    };
    if stream {
        return Ok(event_stream(state, generation, output, meta, permit));
    }
    let mut answer = Answer::new(output);
    let mut generation = generation;
    while let Some(delta) = generation.next().await {
        let delta = delta?;
        answer.push(&delta);
    }
    let body = answer.response(&meta, "completed", Some(generation.usage()));
    answer.store(&state, &meta);
    Ok(Json(body).into_response())
}

/// The chat request a Responses request stands for, and its conversation without the
/// instructions (what a later `previous_response_id` continues).
fn chat_request(state: &AppState, req: ResponsesRequest) -> Result<(GenerationRequest, Vec<ChatMessage>), ApiError> {
    let mut history = match &req.previous_response_id {
        Some(id) => state.responses().get(id).ok_or_else(|| previous_not_found(id))?,
        None => Vec::new(),
    };
    history.extend(input_messages(req.input)?);
    let mut messages: Vec<ChatMessage> = req.instructions.iter().map(|i| ChatMessage::text("system", i)).collect();
    messages.extend(history.iter().cloned());
    let tools = req.tools.map(|tools| tools.into_iter().map(chat_tool).collect());
    let tool_choice = req.tool_choice.map(|c| match c.get("name") {
        Some(name) if c.get("type").and_then(Value::as_str) == Some("function") => {
            json!({"type": "function", "function": {"name": name}})
        }
        _ => c,
    });
    let response_format = match req.text.as_ref().and_then(|t| t.get("format")) {
        None => None,
        Some(format) => Some(response_format(format)?),
    };
    let chat = GenerationRequest {
        messages: Some(messages),
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        seed: req.seed,
        tools,
        tool_choice,
        parallel_tool_calls: req.parallel_tool_calls,
        response_format,
        ..GenerationRequest::default()
    };
    Ok((chat, history))
}

fn previous_not_found(id: &str) -> ApiError {
    let mut e = ApiError::invalid(
        "previous_response_id",
        format!("no stored response `{id}` (the store keeps the last {STORED_RESPONSES})"),
    );
    e.status = StatusCode::NOT_FOUND;
    e
}

/// `text.format` as chat's `response_format` (the schema sits beside the type, not under
/// `json_schema`).
fn response_format(format: &Value) -> Result<ResponseFormat, ApiError> {
    let kind = format.get("type").and_then(Value::as_str).unwrap_or("text").to_owned();
    let spec = (kind == "json_schema").then(|| json!({"name": format.get("name"), "schema": format.get("schema")}));
    let wire = json!({"type": kind, "json_schema": spec});
    serde_json::from_value(wire).map_err(|e| ApiError::invalid("text.format", format!("`text.format`: {e}")))
}

/// A Responses function tool as a chat tool.
fn chat_tool(tool: Value) -> Value {
    if tool.get("function").is_some() {
        return tool;
    }
    let mut function = serde_json::Map::new();
    for key in ["name", "description", "parameters", "strict"] {
        if let Some(v) = tool.get(key) {
            function.insert(key.into(), v.clone());
        }
    }
    json!({"type": tool.get("type").cloned().unwrap_or(json!("function")), "function": function})
}

/// The input as chat messages.
fn input_messages(input: Option<Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        None => return Err(ApiError::invalid("input", "is required")),
        Some(Value::String(text)) => return Ok(vec![ChatMessage::text("user", text)]),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ApiError::invalid("input", "must be a string or a list of items")),
    };
    items.into_iter().enumerate().map(|(i, item)| input_item(i, item)).collect()
}

fn input_item(i: usize, item: Value) -> Result<ChatMessage, ApiError> {
    let field = |k: &str| item.get(k).and_then(Value::as_str).map(str::to_owned);
    let bad = |msg: &str| ApiError::invalid(format!("input[{i}]"), msg.to_owned());
    match field("type").as_deref() {
        Some("function_call") => {
            let (Some(call_id), Some(name)) = (field("call_id"), field("name")) else {
                return Err(bad("a `function_call` needs `call_id` and `name`"));
            };
            let arguments = field("arguments").unwrap_or_else(|| "{}".into());
            let call = json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
            let mut m = ChatMessage::text("assistant", "");
            m.content = None;
            m.extra.insert("tool_calls".into(), json!([call]));
            Ok(m)
        }
        Some("function_call_output") => {
            let Some(call_id) = field("call_id") else { return Err(bad("a `function_call_output` needs `call_id`")) };
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let mut m = ChatMessage::text("tool", output);
            m.extra.insert("tool_call_id".into(), json!(call_id));
            Ok(m)
        }
        None | Some("message") => {
            let role = field("role").ok_or_else(|| bad("a message needs a `role`"))?;
            let role = if role == "developer" { "system".to_owned() } else { role };
            let text = match item.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let text_of = |p: &Value| p.get("text").and_then(Value::as_str).map(str::to_owned);
                    let texts: Option<Vec<String>> = parts.iter().map(text_of).collect();
                    texts
                        .ok_or_else(|| bad("only text content parts (`input_text`, `output_text`) are supported"))?
                        .join("\n")
                }
                _ => return Err(bad("a message's `content` is a string or a list of parts")),
            };
            Ok(ChatMessage::text(role, text))
        }
        Some(other) => Err(ApiError::invalid(format!("input[{i}].type"), format!("`{other}` items are not supported"))),
    }
}

impl Answer {
    /// The `output` items: reasoning, the message, then the calls.
    fn items(&self, meta: &Meta) -> Vec<Value> {
        let mut items = Vec::new();
        if !self.piece.reasoning.is_empty() {
            items.push(json!({"type": "reasoning", "id": format!("rs_{}", &meta.id[5..]), "summary": [],
                              "content": [{"type": "reasoning_text", "text": self.piece.reasoning}]}));
        }
        let calls = self.calls();
        if !self.piece.content.is_empty() || calls.is_empty() {
            items.push(message_item(meta, &self.piece.content, "completed"));
        }
        items.extend(calls.iter().map(call_item));
        items
    }

    fn response(&self, meta: &Meta, status: &str, usage: Option<Usage>) -> Value {
        let incomplete = self.finish == Some(Finish::Length);
        let status = if incomplete && status == "completed" { "incomplete" } else { status };
        let output = if status == "in_progress" { Vec::new() } else { self.items(meta) };
        let details = if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null };
        let usage = usage.map(|u| {
            json!({
                "input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
                "output_tokens": u.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": u.total_tokens,
            })
        });
        let mut body = json!({
            "id": meta.id, "object": "response", "created_at": meta.created, "status": status, "model": meta.model,
            "output": output, "error": null, "incomplete_details": details, "usage": usage,
        });
        if let (Some(body), Some(echo)) = (body.as_object_mut(), meta.echo.as_object()) {
            body.extend(echo.clone());
        }
        body
    }

    /// Keeps the conversation with this answer for `previous_response_id`.
    fn store(&self, state: &AppState, meta: &Meta) {
        if !meta.store {
            return;
        }
        let mut messages = meta.history.clone();
        let calls = self.calls();
        let mut reply = ChatMessage::text("assistant", self.piece.content.clone());
        if !calls.is_empty() {
            reply.extra.insert("tool_calls".into(), serde_json::to_value(&calls).unwrap_or_default());
        }
        messages.push(reply);
        state.responses().put(meta.id.clone(), messages);
    }
}

fn message_item(meta: &Meta, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{}", &meta.id[5..]), "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn call_item(call: &ToolCallOut) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", call.id.trim_start_matches("call_")), "call_id": call.id,
           "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
}

/// The typed event stream of one answer.
struct EventStream {
    state: AppState,
    generation: Generation,
    answer: Answer,
    meta: Meta,
    sequence: u64,
    /// The message item was opened (its first text arrived).
    opened: bool,
    done: bool,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

fn event_stream(
    state: AppState,
    generation: Generation,
    output: ChoiceOutput,
    meta: Meta,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> Response {
    let mut s = EventStream {
        state,
        generation,
        answer: Answer::new(output),
        meta,
        sequence: 0,
        opened: false,
        done: false,
        _permit: permit,
    };
    let created = s.answer.response(&s.meta, "in_progress", None);
    let first = vec![
        s.event("response.created", json!({"response": created})),
        s.event("response.in_progress", json!({"response": created})),
    ];
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
    fn event(&mut self, kind: &str, mut body: Value) -> Event {
        body["type"] = json!(kind);
        body["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        Event::default().event(kind).data(body.to_string())
    }

    async fn next_events(&mut self) -> Option<Vec<Event>> {
        if self.done {
            return None;
        }
        match self.generation.next().await {
            Some(Ok(delta)) => {
                let piece = self.answer.push(&delta);
                Some(self.text_events(&piece.content))
            }
            Some(Err(e)) => {
                self.done = true;
                let body = json!({"code": e.code, "message": e.message, "param": e.param});
                Some(vec![self.event("error", body)])
            }
            None => {
                self.done = true;
                Some(self.closing_events())
            }
        }
    }

    /// The message item's opening events on its first text, then a text delta.
    fn text_events(&mut self, text: &str) -> Vec<Event> {
        let mut events = Vec::new();
        if text.is_empty() {
            return events;
        }
        if !self.opened {
            self.opened = true;
            let item = message_item(&self.meta, "", "in_progress");
            let mut item = item;
            item["content"] = json!([]);
            events.push(self.event("response.output_item.added", json!({"output_index": 0, "item": item})));
            let part = json!({"type": "output_text", "text": "", "annotations": []});
            let item_id = format!("msg_{}", &self.meta.id[5..]);
            events.push(self.event(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": 0, "content_index": 0, "part": part}),
            ));
        }
        let item_id = format!("msg_{}", &self.meta.id[5..]);
        events.push(self.event(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": 0, "content_index": 0, "delta": text, "logprobs": []}),
        ));
        events
    }

    /// The items' closing events, the calls and reasoning as whole items, and
    /// `response.completed` with the whole response.
    fn closing_events(&mut self) -> Vec<Event> {
        let mut events = Vec::new();
        let item_id = format!("msg_{}", &self.meta.id[5..]);
        let text = self.answer.piece.content.clone();
        let mut index = 0;
        if self.opened {
            let part = json!({"type": "output_text", "text": text, "annotations": []});
            let base = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
            let mut done = base.clone();
            done["text"] = json!(text);
            done["logprobs"] = json!([]);
            events.push(self.event("response.output_text.done", done));
            let mut part_done = base;
            part_done["part"] = part;
            events.push(self.event("response.content_part.done", part_done));
            let item = message_item(&self.meta, &text, "completed");
            events.push(self.event("response.output_item.done", json!({"output_index": 0, "item": item})));
            index = 1;
        }
        let items: Vec<Value> = self.answer.items(&self.meta).into_iter().filter(|i| i["type"] != "message").collect();
        for item in items {
            let mut added = item.clone();
            if added["type"] == "function_call" {
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                events.push(self.event("response.output_item.added", json!({"output_index": index, "item": added})));
                let body = json!({"item_id": item["id"], "output_index": index, "arguments": item["arguments"]});
                events.push(self.event("response.function_call_arguments.done", body));
            } else {
                events.push(self.event("response.output_item.added", json!({"output_index": index, "item": item})));
            }
            events.push(self.event("response.output_item.done", json!({"output_index": index, "item": item})));
            index += 1;
        }
        let usage = Some(self.generation.usage());
        let response = self.answer.response(&self.meta, "completed", usage);
        self.answer.store(&self.state, &self.meta);
        events.push(self.event("response.completed", json!({"response": response})));
        events
    }
}
