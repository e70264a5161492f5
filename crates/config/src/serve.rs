//! `ServeConfig`: how `met serve` listens and what it lets one request ask for, and the
//! parsers it applies to chat answers, and its LoRA adapters.

use std::time::Duration;

use crate::engine::{InvalidSetting, positive};
use crate::lora::LoraConfig;
use crate::named::named_enum;

/// `max_tokens` of a request that gives none, and the most one may ask for, unless
/// `--max-tokens-default` says otherwise.
pub const DEFAULT_MAX_TOKENS: usize = 4096;

named_enum! {
    /// How tool calls are found in a chat answer's text.
    pub enum ToolCallParser ("tool-call parser") {
        /// `<tool_call>` blocks (Hermes, Qwen 2.5 and 3).
        Hermes = "hermes",
        /// A bare JSON call (Llama 3.1 and later).
        Llama3Json = "llama3_json",
        /// `[TOOL_CALLS]` and an array (Mistral).
        Mistral = "mistral",
    }
}

named_enum! {
    /// How reasoning is split off a chat answer.
    pub enum ReasoningParser ("reasoning parser") {
        /// Reasoning from the start until `</think>` (DeepSeek-R1).
        DeepSeekR1 = "deepseek_r1",
        /// Reasoning only inside an opening `<think>` block (Qwen3).
        Qwen3 = "qwen3",
    }
}

/// The HTTP server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// The address to listen on.
    pub host: String,
    /// The port to listen on.
    pub port: u16,
    /// The model id clients use; `None` for the model's file or directory name, or the hub
    /// id it was given as.
    pub served_model_name: Option<String>,
    /// The key every route but `/health` requires, when set.
    pub api_key: Option<String>,
    /// Generation requests served at once; more are answered 429.
    pub max_concurrent_requests: usize,
    /// The largest request body accepted; larger ones are answered 413.
    pub max_body_bytes: usize,
    /// On SIGINT or SIGTERM, how long in-flight requests may go on.
    pub drain_timeout: Duration,
    /// Most sequences (prompts × `n`) one request may run; `None`: the engine's
    /// `max_num_seqs`.
    pub max_sequences_per_request: Option<usize>,
    /// `max_tokens` of a request that gives none, and the most one may ask for.
    pub max_tokens_default: usize,
    /// Whether `/metrics` answers without the API key.
    pub metrics_without_auth: bool,
    /// Origins browsers may call from (`*` for any).
    pub allowed_origins: Vec<String>,
    /// Time a client has to send a request's headers, and again its body; an idle
    /// keep-alive connection closes after it too.
    pub http_read_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Keep special-token text typed in user messages as text.
    pub no_special_tokens_in_user_content: bool,
    /// The tool-call format of chat answers; `None`: the chat template's.
    pub tool_call_parser: Option<ToolCallParser>,
    /// How reasoning is split off chat answers; `None`: it is not.
    pub reasoning_parser: Option<ReasoningParser>,
    /// LoRA adapters (`--enable-lora`); `None`: requests name the base model only.
    pub lora: Option<LoraConfig>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".into(),
            port: 8888,
            served_model_name: None,
            api_key: None,
            max_concurrent_requests: 256,
            max_body_bytes: 4 << 20,
            drain_timeout: Duration::from_secs(30),
            max_sequences_per_request: None,
            max_tokens_default: DEFAULT_MAX_TOKENS,
            metrics_without_auth: false,
            allowed_origins: Vec::new(),
            http_read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            no_special_tokens_in_user_content: false,
            tool_call_parser: None,
            reasoning_parser: None,
            lora: None,
        }
    }
}

impl ServeConfig {
    /// Checks every limit is positive and a given API key is not empty.
    ///
    /// # Errors
    /// The first bad setting, naming its flag.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        positive(&[
            ("max-concurrent-requests", self.max_concurrent_requests),
            ("max-body-bytes", self.max_body_bytes),
            ("max-sequences-per-request", self.max_sequences_per_request.unwrap_or(1)),
            ("max-tokens-default", self.max_tokens_default),
            ("max-connections", self.max_connections),
        ])?;
        if self.http_read_timeout.is_zero() {
            return Err(InvalidSetting::new("http-read-timeout-secs", "must be positive"));
        }
        if self.api_key.as_deref().is_some_and(str::is_empty) {
            // An empty key would otherwise mean "no auth" without anyone having asked for that.
            let msg = "the key (or MET_API_KEY) is empty: give a key, or unset it to serve without one";
            return Err(InvalidSetting::new("api-key", msg));
        }
        self.lora.as_ref().map_or(Ok(()), LoraConfig::validate)
    }
}
