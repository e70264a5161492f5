//! Shared by the `serve_*` tests: the HTTP app over a real engine on the deterministic
//! `MockModel`, with a tiny byte-level BPE tokenizer built here with the `tokenizers` crate
//! (written to a tempdir as `tokenizer.json` + `tokenizer_config.json` with a ChatML-style
//! template), and helpers to send requests in-process and read server-sent events.
//!
//! The mock's vocabulary is the tokenizer's, so every generated id decodes to text, and
//! `MockModel::reference_greedy` predicts every greedy response. `socket` serves the same
//! app on a real port through `met serve`'s `Server`; `logs` captures what it logs.

#![allow(dead_code)]

pub mod logs;
pub mod socket;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use axum::response::Response;
use futures_util::StreamExt;
use met_cache::PagedKvCache;
use met_config::{EngineConfig, Policy, ReasoningParser, ToolCallParser};
use met_kernels::CpuBackend;
use met_scheduler::Engine;
use met_scheduler::mock::{Faults, MockModel};
use met_server::serve::{AdapterTarget, AppState, HttpOptions, LoraRegistry, ServerConfig, app_with};
use met_telemetry::Metrics;
use met_text::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
use serde_json::{Value, json};
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};
use tower::ServiceExt;

/// The model id the test server serves.
pub const MODEL: &str = "mock-model";
/// The mock's context length.
pub const MAX_CONTEXT: usize = 256;
/// The fixtures of `model-layers`.
fn fixtures() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures")
}

/// The llama fixture's PEFT adapter `name` (`r8`, `r16_rslora`).
pub fn adapter_dir(name: &str) -> std::path::PathBuf {
    fixtures().join("lora").join(name)
}

/// A LoRA registry for adapters of the llama fixture, on the CPU.
fn lora_registry(limits: LoraLimitsForTest, metrics: Arc<Metrics>) -> LoraRegistry {
    let model = met_model_layers::models::read_config(&fixtures().join("hf/llama/config.json")).unwrap();
    let target = AdapterTarget {
        model,
        backend: Arc::new(CpuBackend::new()),
        limits: met_model_layers::lora::LoraLimits { max_rank: limits.max_rank },
    };
    LoraRegistry::new(target, limits.max_loras, MODEL.into(), metrics).expect("LoRA slots on the CPU")
}

/// The template: `<|im_start|>role\ncontent<|im_end|>\n` per message.
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                        {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// What a test may change about the server.
#[derive(Debug, Clone)]
pub struct Options {
    pub api_key: Option<String>,
    pub max_concurrent_requests: usize,
    pub max_body_bytes: usize,
    pub stream_capacity: usize,
    pub kv_blocks: usize,
    pub max_sequences_per_request: usize,
    pub max_tokens_default: usize,
    /// Failures the engine's mock model injects.
    pub faults: Faults,
    pub http: HttpOptions,
    pub no_special_tokens_in_user_content: bool,
    /// Schedule with the priority policy instead of FCFS.
    pub priority_policy: bool,
    /// The engine's `max_num_seqs` (its default when `None`).
    pub max_num_seqs: Option<usize>,
    /// Speculative decoding, when on.
    pub speculative: Option<met_speculative::SpeculativeConfig>,
    /// The chat template (the plain ChatML one above when `None`).
    pub chat_template: Option<&'static str>,
    /// `--tool-call-parser`.
    pub tool_call_parser: Option<ToolCallParser>,
    /// `--reasoning-parser`.
    pub reasoning_parser: Option<ReasoningParser>,
    /// The mock model's context length.
    pub max_context: usize,
    /// `--enable-lora` with these limits; adapters are checked against the llama fixture
    /// of `model-layers` (the mock's outputs do not depend on them).
    pub lora: Option<LoraLimitsForTest>,
}

/// `--max-loras` and `--max-lora-rank` of a test server.
#[derive(Debug, Clone, Copy)]
pub struct LoraLimitsForTest {
    pub max_loras: usize,
    pub max_rank: usize,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            api_key: None,
            max_concurrent_requests: 64,
            max_body_bytes: 1 << 20,
            stream_capacity: 256,
            kv_blocks: 512,
            max_sequences_per_request: ServerConfig::default().max_sequences_per_request,
            max_tokens_default: ServerConfig::default().max_tokens_default,
            faults: Faults::default(),
            http: HttpOptions::default(),
            no_special_tokens_in_user_content: false,
            priority_policy: false,
            max_num_seqs: None,
            speculative: None,
            chat_template: None,
            tool_call_parser: None,
            reasoning_parser: None,
            max_context: MAX_CONTEXT,
            lora: None,
        }
    }
}

/// The app, its state and what tests compare against.
pub struct TestServer {
    pub app: Router,
    pub state: AppState,
    pub metrics: Arc<Metrics>,
    pub tokenizer: Tokenizer,
    pub mock: MockModel,
    _dir: tempfile::TempDir,
}

impl TestServer {
    /// A ready server with default options.
    pub fn new() -> Self {
        Self::with(Options::default())
    }

    /// A ready server with `options`.
    pub fn with(options: Options) -> Self {
        let server = Self::starting(options);
        server.state.set_ready(true);
        server
    }

    /// A server that is not ready yet (`/health` answers 503).
    pub fn starting(options: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_tokenizer(dir.path(), options.chat_template.unwrap_or(TEMPLATE));
        let tokenizer = Tokenizer::from_hf_dir(dir.path()).unwrap();
        let vocab = tokenizer.vocab_size();
        let metrics = Arc::new(Metrics::new());
        let backend = Arc::new(CpuBackend::new());
        let defaults = EngineConfig::default();
        let config = EngineConfig {
            block_size: 4,
            stream_capacity: options.stream_capacity,
            max_num_seqs: options.max_num_seqs.unwrap_or(defaults.max_num_seqs),
            policy: if options.priority_policy { Policy::Priority } else { Policy::Fcfs },
            ..defaults
        };
        let kv = PagedKvCache::new(&*backend, MockModel::layout(), 4, options.kv_blocks, true).unwrap();
        let model = Box::new(MockModel::new(vocab, options.max_context).with_faults(options.faults));
        let mut engine = Engine::new(model, backend, Box::new(kv), config, Arc::clone(&metrics)).unwrap();
        if let Some(speculative) = &options.speculative {
            engine = engine.with_speculative(speculative).unwrap();
        }
        let (handle, _thread) = met_scheduler::spawn(engine);
        let server_config = ServerConfig {
            model_name: MODEL.into(),
            eos_token_ids: tokenizer.eos_ids().to_vec(),
            api_key: options.api_key,
            max_concurrent_requests: options.max_concurrent_requests,
            max_body_bytes: options.max_body_bytes,
            max_sequences_per_request: options.max_sequences_per_request,
            max_tokens_default: options.max_tokens_default,
            no_special_tokens_in_user_content: options.no_special_tokens_in_user_content,
            policy: if options.priority_policy { Policy::Priority } else { Policy::Fcfs },
            tool_call_parser: options.tool_call_parser,
            reasoning_parser: options.reasoning_parser,
        };
        let mut state = AppState::new(handle, tokenizer.clone(), Arc::clone(&metrics), server_config).unwrap();
        if let Some(limits) = options.lora {
            state = state.with_lora(lora_registry(limits, Arc::clone(&metrics)));
        }
        Self {
            app: app_with(state.clone(), options.http),
            state,
            metrics,
            tokenizer,
            mock: MockModel::new(vocab, options.max_context),
            _dir: dir,
        }
    }

    /// Sends `req` to the app.
    pub async fn send(&self, req: Request<Body>) -> Response {
        self.app.clone().oneshot(req).await.unwrap()
    }

    /// POSTs `body` as JSON and reads the JSON answer.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.post_raw(path, body.to_string()).await
    }

    /// POSTs a raw body and reads the JSON answer.
    pub async fn post_raw(&self, path: &str, body: impl Into<Body>) -> (StatusCode, Value) {
        let response = self.send(post(path, body)).await;
        let status = response.status();
        (status, json_body(response).await)
    }

    /// GETs `path`: status and body text.
    pub async fn get(&self, path: &str) -> (StatusCode, String) {
        let response = self.send(Request::get(path).body(Body::empty()).unwrap()).await;
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap())
    }

    /// The greedy continuation of `prompt` the server should produce: the mock's reference,
    /// ending at the first EOS (kept, as the engine keeps it) unless `ignore_eos`.
    pub fn greedy(&self, prompt: &[u32], max_tokens: usize, ignore_eos: bool) -> Vec<u32> {
        let mut ids = self.mock.reference_greedy(prompt, max_tokens);
        let eos = self.tokenizer.eos_ids();
        if let Some(at) = ids.iter().position(|id| eos.contains(id)).filter(|_| !ignore_eos) {
            ids.truncate(at + 1);
        }
        ids
    }

    /// OpenAI's finish reason for a choice that generated `ids`.
    pub fn finish_reason(&self, ids: &[u32]) -> &'static str {
        let eos = self.tokenizer.eos_ids();
        if ids.last().is_some_and(|id| eos.contains(id)) { "stop" } else { "length" }
    }

    /// The text of `ids` as the server writes it (special tokens skipped).
    pub fn text(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap()
    }

    /// The prompt ids the server makes of a user message.
    pub fn chat_prompt(&self, user: &str) -> Vec<u32> {
        let template = ChatTemplate::from_tokenizer(&self.tokenizer).unwrap().unwrap();
        let options = RenderOptions { add_generation_prompt: true, ..RenderOptions::default() };
        let rendered = template.render(&[ChatMessage::text("user", user)], &options).unwrap();
        self.tokenizer.encode(&rendered, false).unwrap()
    }

    /// Waits (up to 10 s) until `check` holds.
    pub async fn eventually(&self, what: &str, check: impl Fn(&Self) -> bool) {
        for _ in 0..1000 {
            if check(self) {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("timed out waiting until {what}");
    }
}

/// A JSON POST request.
pub fn post(path: &str, body: impl Into<Body>) -> Request<Body> {
    Request::post(path).header(header::CONTENT_TYPE, "application/json").body(body.into()).unwrap()
}

/// A chat request body with one user message.
pub fn chat(user: &str, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "messages": [{"role": "user", "content": user}], "temperature": 0});
    merge(&mut body, extra);
    body
}

/// A completions request body.
pub fn completion(prompt: Value, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "prompt": prompt, "temperature": 0});
    merge(&mut body, extra);
    body
}

fn merge(body: &mut Value, extra: Value) {
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
}

/// The body as JSON.
pub async fn json_body(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bytes)))
}

/// Reads server-sent events from a streaming response.
pub struct Events {
    body: axum::body::BodyDataStream,
    buffer: String,
}

impl Events {
    pub fn new(response: Response) -> Self {
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()[header::CONTENT_TYPE].to_str().unwrap().to_owned();
        assert!(content_type.starts_with("text/event-stream"), "{content_type}");
        Self { body: response.into_body().into_data_stream(), buffer: String::new() }
    }

    /// The next event's `data`, or `None` at the end of the body.
    pub async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                return Some(data.join("\n"));
            }
            let chunk = self.body.next().await?.unwrap();
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Every remaining event's data.
    pub async fn all(mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(data) = self.next().await {
            out.push(data);
        }
        out
    }
}

/// Checks the OpenAI error shape and returns its `param`.
pub fn error_param(body: &Value) -> Option<String> {
    let error = body.get("error").unwrap_or_else(|| panic!("not an error: {body}"));
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    assert!(error["type"].is_string(), "{body}");
    assert!(error.get("param").is_some() && error.get("code").is_some(), "{body}");
    error["param"].as_str().map(str::to_owned)
}

/// A byte-level BPE over printable ASCII, space and newline, with a few merges and three
/// special tokens (`<|im_end|>` is eos), written as a Hugging Face tokenizer directory.
fn write_tokenizer(dir: &std::path::Path, template: &str) {
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut tokens: Vec<String> = specials.iter().map(|s| s.to_string()).collect();
    // Byte-level spells space as U+0120 and newline as U+010A.
    tokens.extend(["\u{120}".to_string(), "\u{10A}".to_string()]);
    tokens.extend(('!'..='~').map(String::from));
    let merges: Vec<(String, String)> = [
        ("\u{120}", "t"),
        ("h", "e"),
        ("\u{120}t", "he"),
        ("l", "l"),
        ("o", "r"),
        ("\u{120}", "w"),
        ("\u{120}w", "or"),
        ("i", "n"),
        ("\u{120}", "a"),
        ("e", "r"),
        ("o", "n"),
        ("\u{120}", "s"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    tokens.extend(merges.iter().map(|(a, b)| format!("{a}{b}")));
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().unwrap();
    let mut tokenizer = HfTokenizer::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.add_special_tokens(specials.iter().map(|s| AddedToken::from(*s, true))).unwrap();
    tokenizer.save(dir.join("tokenizer.json"), false).unwrap();
    let config = json!({"eos_token": "<|im_end|>", "chat_template": template});
    std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
}
