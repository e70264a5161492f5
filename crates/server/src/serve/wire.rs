//! The JSON on the wire: OpenAI's request and response objects (plus vLLM's `/tokenize`
//! and `/detokenize`), as serde types, and [`ApiJson`], the body extractor that turns every
//! way a body can be wrong into an [`ApiError`].
//!
//! Requests are deliberately loose (every field optional, unknown fields ignored, one
//! struct for both completion endpoints); `validate` is where they become typed. Wrong
//! types are caught here and name the field by its JSON path (`messages[0].content`).

use std::collections::BTreeMap;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize, Serializer};

use super::error::ApiError;
use super::state::AppState;
pub use super::structured::{ResponseFormat, StructuredOutputs};
use met_text::ChatMessage;

/// A JSON request body; malformed JSON, wrong types and oversized bodies are [`ApiError`]s.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        // The router's body layer has already read the body (checking its type, size and
        // read timeout); `DefaultBodyLimit` still guards a router used without it.
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::payload_too_large(state.max_body_bytes())
            } else {
                ApiError::malformed(rejection.body_text())
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// `bytes` as a `T`, naming the field at fault on a type error.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Serde would also read a struct from an array; every request body is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::malformed("the body must be a JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut *de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if inner.is_data() && path != "." {
            ApiError::invalid(path.clone(), format!("`{path}`: {inner}"))
        } else {
            ApiError::malformed(format!("the body is not valid JSON for this endpoint: {inner}"))
        }
    })?;
    // One body, one reading: bytes after the object (`{...} xyz`, a second object) would let
    // a proxy and this server disagree about what was sent.
    de.end().map_err(|e| ApiError::malformed(format!("the body has bytes after the JSON object: {e}")))?;
    Ok(value)
}

/// `POST /v1/chat/completions` and `POST /v1/completions`: every field either takes.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenerationRequest {
    /// The model; must be the served one when present.
    pub model: Option<String>,
    /// Chat: the conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Completions: the prompt(s).
    pub prompt: Option<Prompt>,
    /// Most tokens to generate per choice.
    pub max_tokens: Option<u64>,
    /// Chat: the newer name of `max_tokens` (wins when both are given).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature; 0 is greedy.
    pub temperature: Option<f32>,
    /// Nucleus sampling threshold.
    pub top_p: Option<f32>,
    /// Keep the K most likely tokens (0 or -1: all).
    pub top_k: Option<i64>,
    /// Drop tokens less likely than this fraction of the best.
    pub min_p: Option<f32>,
    /// OpenAI presence penalty.
    pub presence_penalty: Option<f32>,
    /// OpenAI frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Hugging Face repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string key) to bias.
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Seed of the random stream (any integer).
    pub seed: Option<serde_json::Number>,
    /// Up to four stop strings.
    pub stop: Option<Stop>,
    /// Extra token ids that end generation (vLLM).
    pub stop_token_ids: Option<Vec<u32>>,
    /// Choices per prompt.
    pub n: Option<u64>,
    /// Chat: `true`; completions: the number of alternatives per token.
    pub logprobs: Option<Logprobs>,
    /// Chat: alternatives per token, with `logprobs: true`.
    pub top_logprobs: Option<u64>,
    /// Stream server-sent events.
    pub stream: Option<bool>,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Generate through end-of-sequence tokens.
    pub ignore_eos: Option<bool>,
    /// End tokens are banned until this many tokens were generated.
    pub min_tokens: Option<u64>,
    /// An end-user id; accepted and ignored.
    pub user: Option<String>,
    /// Scheduling priority, as vLLM takes it: lower runs first; anything but 0 needs a
    /// server started with `--policy priority`.
    pub priority: Option<i64>,
    /// Leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    /// Chat: append the assistant header (default true).
    pub add_generation_prompt: Option<bool>,
    /// Chat: continue the final (assistant) message instead of starting a new one.
    pub continue_final_message: Option<bool>,
    /// Chat: extra variables for the template (`enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// OpenAI's structured output: `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's structured output: `json`, `regex`, `choice`, `grammar` or `json_object`.
    pub structured_outputs: Option<StructuredOutputs>,
    /// Chat: functions the model may call (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<serde_json::Value>>,
    /// Chat: `none`, `auto`, `required` or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<serde_json::Value>,
    /// Chat: allow several calls in one answer (default true).
    pub parallel_tool_calls: Option<bool>,
}

/// A completions prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
    /// One prompt as token ids.
    Ids(Vec<u32>),
    /// Several prompts as token ids.
    IdLists(Vec<Vec<u32>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `logprobs`: a boolean (chat) or a count (completions).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    /// Chat's switch.
    Bool(bool),
    /// Completions' number of alternatives.
    Count(u64),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    /// Send a last chunk with the usage (and `usage: null` on the others).
    pub include_usage: Option<bool>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    /// Tokens of the rendered prompt(s).
    pub prompt_tokens: usize,
    /// Tokens generated, over every choice.
    pub completion_tokens: usize,
    /// The sum.
    pub total_tokens: usize,
    /// Prompt details.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: usize,
}

/// A chat completion, or one chunk of a streamed one (`object` tells which).
#[derive(Debug, Serialize)]
pub struct ChatCompletion {
    /// `chatcmpl-...`, the same on every chunk.
    pub id: String,
    /// `chat.completion` or `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model.
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Absent on chunks unless `include_usage`; `null` on every chunk but the last then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One chat choice: `message` in a completion, `delta` in a chunk.
#[derive(Debug, Serialize)]
pub struct ChatChoice {
    /// The choice's index.
    pub index: usize,
    /// The whole message (completions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<ChatMessageOut>,
    /// What this chunk adds (chunks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<ChatDelta>,
    /// Token logprobs, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` or `length` on the choice's last chunk; `null` before.
    pub finish_reason: Option<&'static str>,
}

/// The assistant's message.
#[derive(Debug, Serialize)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text; `null` for an answer that is only tool calls.
    pub content: Option<String>,
    /// The reasoning, split off with `--reasoning-parser`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls the model made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// A tool call of a message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallOut {
    /// `call_...`.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCallOut,
}

/// A called function.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionCallOut {
    /// Its name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// A streamed piece of a tool call: the first of a call has its id, type and name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCallDelta {
    /// Which call of the message.
    pub index: usize,
    /// `call_...`, on a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, on a call's first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The name (first piece) and a part of the arguments.
    pub function: FunctionDelta,
}

/// A streamed piece of a called function.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionDelta {
    /// The name, on a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// More of the arguments' JSON text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// What a chunk adds to a message.
#[derive(Debug, Default, Serialize)]
pub struct ChatDelta {
    /// `assistant` on a choice's first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// New reasoning text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// New tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// Chat logprobs: one entry per generated token.
#[derive(Debug, Serialize)]
pub struct ChatLogprobs {
    /// The tokens.
    pub content: Vec<ChatTokenLogprob>,
}

/// A generated token's logprob and its alternatives.
#[derive(Debug, Serialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes (a token may hold part of a character).
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, best first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// An alternative token at one position.
#[derive(Debug, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its bytes.
    pub bytes: Vec<u8>,
}

/// A text completion, or one chunk of a streamed one.
#[derive(Debug, Serialize)]
pub struct Completion {
    /// `cmpl-...`, the same on every chunk.
    pub id: String,
    /// Always `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model.
    pub model: String,
    /// The choices.
    pub choices: Vec<CompletionChoice>,
    /// As [`ChatCompletion::usage`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Option<Usage>>,
}

/// One completion choice (or its new text, in a chunk).
#[derive(Debug, Serialize)]
pub struct CompletionChoice {
    /// `prompt index * n + continuation`.
    pub index: usize,
    /// The text.
    pub text: String,
    /// Legacy logprobs, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length` at the end; `null` before.
    pub finish_reason: Option<&'static str>,
}

/// The legacy completions logprobs: parallel lists, one entry per token.
#[derive(Debug, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Each token's text.
    pub tokens: Vec<String>,
    /// Each token's log-probability.
    pub token_logprobs: Vec<f32>,
    /// The alternatives at each position, text to logprob.
    pub top_logprobs: Vec<TopMap>,
    /// Each token's character offset in the choice's text.
    pub text_offset: Vec<usize>,
}

/// Alternatives as a JSON object, best first (a repeated text keeps its best logprob).
#[derive(Debug, Default)]
pub struct TopMap(pub Vec<(String, f32)>);

impl Serialize for TopMap {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = serializer.serialize_map(None)?;
        let mut seen = std::collections::HashSet::new();
        for (token, logprob) in &self.0 {
            if seen.insert(token.as_str()) {
                map.serialize_entry(token, logprob)?;
            }
        }
        map.end()
    }
}

/// `POST /tokenize`: a text prompt or chat messages.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenizeRequest {
    /// The model; must be the served one when present.
    pub model: Option<String>,
    /// Text to tokenize.
    pub prompt: Option<String>,
    /// Messages to render with the chat template, then tokenize.
    pub messages: Option<Vec<ChatMessage>>,
    /// Add the tokenizer's bos/eos around a text prompt (default true).
    pub add_special_tokens: Option<bool>,
    /// Chat: append the assistant header (default true).
    pub add_generation_prompt: Option<bool>,
}

/// `POST /tokenize`'s answer.
#[derive(Debug, Serialize)]
pub struct TokenizeResponse {
    /// Number of tokens.
    pub count: usize,
    /// The model's context length.
    pub max_model_len: usize,
    /// The ids.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    /// The model; must be the served one when present.
    #[serde(default)]
    pub model: Option<String>,
    /// Ids to decode.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`'s answer.
#[derive(Debug, Serialize)]
pub struct DetokenizeResponse {
    /// The text (special tokens kept).
    pub prompt: String,
}

/// `GET /v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelList {
    /// Always `list`.
    pub object: &'static str,
    /// The served model, then its LoRA adapters.
    pub data: Vec<ModelCard>,
}

/// One model of `/v1/models`.
#[derive(Debug, Serialize)]
pub struct ModelCard {
    /// The id requests name it by.
    pub id: String,
    /// Always `model`.
    pub object: &'static str,
    /// Unix seconds the server started.
    pub created: u64,
    /// Always `met`.
    pub owned_by: &'static str,
    /// The model's context length.
    pub max_model_len: usize,
    /// A LoRA adapter's directory (vLLM's field); absent for the base model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The model a LoRA adapter runs on; absent for the base model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

/// `POST /v1/load_lora_adapter` (vLLM's body).
#[derive(Debug, Deserialize)]
pub struct LoadLoraRequest {
    /// The name requests will give as their `model`.
    pub lora_name: String,
    /// The PEFT directory to read it from, on the server's file system.
    pub lora_path: String,
    /// Replace an adapter already loaded under this name (vLLM's `load_inplace`): new
    /// requests get the new weights, running ones finish on the old.
    #[serde(default)]
    pub load_inplace: bool,
}

/// `POST /v1/unload_lora_adapter` (vLLM's body).
#[derive(Debug, Deserialize)]
pub struct UnloadLoraRequest {
    /// The adapter to forget.
    pub lora_name: String,
}
