//! [`AppState`]: what every handler shares: the engine handle, the tokenizer and chat
//! template, the metrics, the server's settings and its LoRA adapters. Cheap to clone (one
//! `Arc`).
//!
//! **Invariant:** nothing here is locked across an `.await`: the engine is reached through
//! its channel-backed handle, the tokenizer and template are immutable, the ready flag is an
//! atomic, the concurrency limit a semaphore whose permits are taken without waiting, and
//! the LoRA registry's lock is held only to read or change its map.
//! Health is the ready flag and the engine's own fault record: an engine that faulted
//! (a panic inside a step, a device error) makes `/health` answer 503 for good.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use met_config::{DEFAULT_MAX_TOKENS, Policy, ReasoningParser, ToolCallParser};
use met_grammar::{GrammarError, Grammars};
use met_scheduler::EngineHandle;
use met_telemetry::Metrics;
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::error::ApiError;
use super::lora::{LoraRegistry, Served};
use met_text::{ChatMessage, ChatTemplate, TextError, Tokenizer};

/// Largest `n` a request may ask for.
pub const MAX_N: usize = 128;

/// The server's settings that are not the engine's. The default is `met serve`'s defaults
/// for a model named `met` with no end-of-sequence tokens.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model id clients send and `/v1/models` lists.
    pub model_name: String,
    /// The model's end-of-sequence ids; every request stops on them unless `ignore_eos`.
    pub eos_token_ids: Vec<u32>,
    /// When set, `/v1/*` requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Generation requests served at once; the next one is answered 429.
    pub max_concurrent_requests: usize,
    /// Largest request body, in bytes; larger ones are answered 413.
    pub max_body_bytes: usize,
    /// Most sequences (prompts × `n`) one request may run; more is a 400.
    pub max_sequences_per_request: usize,
    /// `max_tokens` of a request that gives none (never more than the context leaves), and
    /// the most one may ask for; more is a 400.
    pub max_tokens_default: usize,
    /// Special-token text in user messages stays text instead of becoming control tokens
    /// (`--no-special-tokens-in-user-content`).
    pub no_special_tokens_in_user_content: bool,
    /// The engine's scheduling policy; under `priority`, requests may set `priority`.
    pub policy: Policy,
    /// The tool-call format (`--tool-call-parser`); `None`: the chat template's own.
    pub tool_call_parser: Option<ToolCallParser>,
    /// The reasoning format (`--reasoning-parser`); `None`: reasoning stays in the content.
    pub reasoning_parser: Option<ReasoningParser>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            model_name: "met".into(),
            eos_token_ids: Vec::new(),
            api_key: None,
            max_concurrent_requests: 256,
            max_body_bytes: 4 << 20,
            max_sequences_per_request: 256,
            max_tokens_default: DEFAULT_MAX_TOKENS,
            no_special_tokens_in_user_content: false,
            policy: Policy::Fcfs,
            tool_call_parser: None,
            reasoning_parser: None,
        }
    }
}

/// The handlers' shared state.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Shared>,
}

struct Shared {
    engine: EngineHandle,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// The grammar engine over the tokenizer, built by the first structured request.
    grammars: OnceLock<Result<Grammars, GrammarError>>,
    /// Conversations of the Responses API, for `previous_response_id`.
    responses: ResponseStore,
    metrics: Arc<Metrics>,
    config: ServerConfig,
    /// The LoRA adapters, with `--enable-lora`.
    lora: Option<LoraRegistry>,
    permits: Arc<Semaphore>,
    ready: AtomicBool,
    created: u64,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("model", &self.inner.config.model_name).finish_non_exhaustive()
    }
}

impl AppState {
    /// State over a running engine. `metrics` should be the registry the engine records into,
    /// so that `/metrics` shows both. Not ready until [`AppState::set_ready`].
    ///
    /// # Errors
    /// The tokenizer's chat template does not compile.
    pub fn new(
        engine: EngineHandle,
        tokenizer: Tokenizer,
        metrics: Arc<Metrics>,
        config: ServerConfig,
    ) -> Result<Self, TextError> {
        let template = ChatTemplate::from_tokenizer(&tokenizer)?;
        let permits = Arc::new(Semaphore::new(config.max_concurrent_requests));
        let shared = Shared {
            engine,
            tokenizer,
            template,
            grammars: OnceLock::new(),
            responses: ResponseStore::default(),
            metrics,
            config,
            lora: None,
            permits,
            ready: AtomicBool::new(false),
            created: unix_now(),
        };
        Ok(Self { inner: Arc::new(shared) })
    }

    /// The same state serving LoRA adapters from `lora`.
    ///
    /// # Panics
    /// When the state was already cloned: adapters are set up before anything shares it.
    pub fn with_lora(mut self, lora: LoraRegistry) -> Self {
        let shared = Arc::get_mut(&mut self.inner).expect("LoRA is set up before the state is shared");
        shared.lora = Some(lora);
        self
    }

    /// The LoRA adapters, when the server serves them.
    pub fn lora(&self) -> Option<&LoraRegistry> {
        self.inner.lora.as_ref()
    }

    /// Marks the server ready (`/health` answers 200) or not (503, while draining).
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// Whether `/health` answers 200: the server is ready and its engine has not faulted.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire) && self.inner.engine.fault().is_none()
    }

    /// The engine.
    pub fn engine(&self) -> &EngineHandle {
        &self.inner.engine
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// The chat template, if the model has one.
    pub fn template(&self) -> Option<&ChatTemplate> {
        self.inner.template.as_ref()
    }

    /// The grammar engine of the served tokenizer (structured output), built on first use
    /// (tens of milliseconds for a large vocabulary): call it on a blocking worker.
    ///
    /// # Errors
    /// When the tokenizer cannot be described to the grammar engine (no end token).
    pub fn grammars(&self) -> Result<&Grammars, GrammarError> {
        let vocab = self.inner.engine.limits().vocab_size;
        self.inner.grammars.get_or_init(|| Grammars::new(&self.inner.tokenizer, vocab)).as_ref().map_err(Clone::clone)
    }

    /// The Responses API's stored conversations.
    pub fn responses(&self) -> &ResponseStore {
        &self.inner.responses
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The server settings.
    pub fn config(&self) -> &ServerConfig {
        &self.inner.config
    }

    /// The body limit in bytes.
    pub fn max_body_bytes(&self) -> usize {
        self.inner.config.max_body_bytes
    }

    /// Unix seconds the state was built (the model's `created`).
    pub fn created(&self) -> u64 {
        self.inner.created
    }

    /// The model's context length.
    pub fn max_context(&self) -> usize {
        self.inner.engine.limits().max_context
    }

    /// A slot among the concurrent generation requests, held until the response ends.
    ///
    /// # Errors
    /// 429 when every slot is taken: requests never queue here.
    pub fn admit(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        Arc::clone(&self.inner.permits)
            .try_acquire_owned()
            .map_err(|_| ApiError::too_many_requests(self.inner.config.max_concurrent_requests))
    }

    /// The model a request's `model` field names: the base model when absent or its own
    /// name, else the LoRA adapter loaded under that name.
    ///
    /// # Errors
    /// 404 for a model this server does not serve.
    pub fn check_model(&self, model: Option<&str>) -> Result<Served, ApiError> {
        let base = &self.inner.config.model_name;
        match model {
            None => Ok(Served { name: base.clone(), adapter: None }),
            Some(m) if m == base => Ok(Served { name: base.clone(), adapter: None }),
            Some(m) => match self.lora().and_then(|l| l.get(m)) {
                Some(adapter) => Ok(Served { name: m.to_owned(), adapter: Some(adapter) }),
                None => Err(ApiError::model_not_found(m, base)),
            },
        }
    }

    /// Whether an `Authorization` header value carries the API key (always, with no key
    /// set). Compares in constant time, so response timing does not leak the key.
    pub fn authorized(&self, header: Option<&[u8]>) -> bool {
        let given = header.and_then(|h| h.strip_prefix(b"Bearer ")).unwrap_or_default();
        self.key_matches(given)
    }

    /// Whether `given` is the API key (always, with no key set), compared in constant time.
    pub fn key_matches(&self, given: &[u8]) -> bool {
        let Some(key) = &self.inner.config.api_key else { return true };
        bool::from(given.ct_eq(key.as_bytes()))
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Conversations kept for `previous_response_id`.
pub const STORED_RESPONSES: usize = 1024;

/// The stored conversations, oldest first.
#[derive(Debug, Default)]
pub struct ResponseStore {
    entries: Mutex<VecDeque<(String, Vec<ChatMessage>)>>,
}

impl ResponseStore {
    pub(super) fn get(&self, id: &str) -> Option<Vec<ChatMessage>> {
        let entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.iter().find(|(k, _)| k == id).map(|(_, m)| m.clone())
    }

    pub(super) fn put(&self, id: String, messages: Vec<ChatMessage>) {
        let mut entries = self.entries.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if entries.len() == STORED_RESPONSES {
            entries.pop_front();
        }
        entries.push_back((id, messages));
    }
}
