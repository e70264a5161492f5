//! `met serve`: the OpenAI-compatible HTTP server, started in the numbered phases of
//! DESIGN §3 and stopped gracefully.
//!
//! Startup binds the socket first (phase 0), so a taken port fails at once and `/health`
//! can answer 503 while the model loads; every other route answers an OpenAI-shaped 503
//! until the router is installed at phase 11. Loading (phases 1-8) runs on a blocking
//! worker, never on the reactor. On SIGINT or SIGTERM the server stops accepting, `/health`
//! turns 503, idle connections close, in-flight requests get `--drain-timeout-secs` to
//! finish (a second signal or the timeout ends them with an error, a final SSE event for a
//! stream, which frees their KV blocks), and the process exits 0. An engine fault (a panic
//! inside a step, a device error) drains the same way, then exits non-zero, so that a
//! supervisor restarts the server.
//!
//! Modules: `server` (from the bound socket to the exit: signals, engine faults, the drain),
//! `listen` (accepting and serving connections: cap, read timeouts, drain),
//! `router` (routes and cross-cutting rules), `openai` (the two completion endpoints),
//! `responses` (the Responses API over the chat path), `anthropic` (Anthropic Messages, the
//! same way), `lora` (the adapters requests may name, loaded and unloaded at run time),
//! `wire` (JSON types), `validate` (wire → engine requests), `structured` (response
//! formats → grammars), `tools` and `tool_parser` (tool definitions, choices and calls),
//! `reasoning` (`<think>` splitting), `choice_output` (a choice's text → reasoning, content
//! and calls), `stream` (tokens → text, stop strings, cancellation), `error` (the one error
//! type), `state`, `progress` (the weight-loading bar) and `fault` (a fault hook for tests,
//! off unless `MET_TEST_ENGINE_FAULT` is set).

mod anthropic;
mod choice_output;
mod dialect;
mod error;
mod fault;
mod listen;
mod lora;
mod openai;
mod options;
mod progress;
mod reasoning;
mod responses;
mod router;
mod server;
mod state;
mod stream;
mod structured;
mod tool_parser;
mod tools;
mod validate;
mod wire;

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use met_config::{EngineSetup, LoadConfig, ModelConfig, ServeConfig};
use met_scheduler::Engine;
use met_telemetry::{Metrics, Phase, PhaseTimer};
use tower::ServiceExt;

pub use error::ApiError;
pub use listen::ConnectionLimits;
pub use lora::{AdapterTarget, LoadedAdapter, LoraRegistry, Served};
pub use openai::DrainCut;
pub use router::{HttpOptions, MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES, app, app_with};
pub use server::Server;
pub use state::{AppState, MAX_N, ServerConfig};

use met_model_layers::lora::LoraLimits;

use crate::resolve::ModelSource;
use crate::startup::engine::build_engine;
use crate::startup::kv_budget::cache_size;
use crate::startup::load::{Text, Weights, load_weights};
use crate::startup::topology::Topology;
use met_text::Tokenizer;
use server::os_signals;

/// What `met serve` serves and how: the model, the engine around it and the HTTP server,
/// each checked (and checked together) when the flags became settings.
#[derive(Debug, Clone)]
pub struct Serve {
    /// The model and its devices.
    pub load: LoadConfig,
    /// The engine.
    pub setup: EngineSetup,
    /// The HTTP server.
    pub serve: ServeConfig,
}

/// Runs `met serve` until SIGINT or SIGTERM, or an engine fault.
///
/// # Errors
/// A port that cannot be bound, a model that cannot be loaded, an engine fault while
/// serving.
pub fn run(args: Serve) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("met-http")
        .build()
        .context("starting the async runtime")?;
    let result = runtime.block_on(serve(args));
    // Blocking workers still tokenizing for cancelled requests are not waited for.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

/// The model and engine, once loaded (phases 1-9).
struct Loaded {
    engine: Engine,
    tokenizer: Tokenizer,
    eos_token_ids: Vec<u32>,
    /// The id clients name the model by.
    model_name: String,
    /// The LoRA adapters, with `--enable-lora`.
    lora: Option<LoraRegistry>,
}

async fn serve(args: Serve) -> Result<()> {
    let Serve { load: load_config, setup, serve: config } = args;
    let timer = PhaseTimer::start(Phase::Settings);
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port))
        .await
        .with_context(|| format!("binding {}:{}", config.host, config.port))?;
    let slot = Arc::new(OnceLock::<Router>::new());
    let read_timeout = config.http_read_timeout;
    let limits = ConnectionLimits { max_connections: config.max_connections, read_timeout };
    let server = Server::start(listener, gate(Arc::clone(&slot)), limits)?;
    let addr = server.local_addr();
    timer.done(format_args!("met {}, listening on http://{addr} (503 until ready)", env!("CARGO_PKG_VERSION")));

    let metrics = Arc::new(Metrics::new());
    let (engine_setup, serve_config, engine_metrics) = (setup.clone(), config.clone(), Arc::clone(&metrics));
    let loaded = tokio::task::spawn_blocking(move || load(&load_config, &engine_setup, &serve_config, engine_metrics))
        .await
        .context("the loading worker failed")??;

    let timer = PhaseTimer::start(Phase::Engine);
    let (handle, _thread) = met_scheduler::spawn(loaded.engine);
    let engine = &setup.engine;
    timer.done(format_args!(
        "{} sequences and {} tokens per step, {} KV tokens",
        engine.max_num_seqs,
        engine.max_batch_tokens,
        handle.limits().kv_capacity
    ));

    let timer = PhaseTimer::start(Phase::Router);
    let drain_timeout = config.drain_timeout;
    let server_config = ServerConfig {
        model_name: loaded.model_name,
        eos_token_ids: loaded.eos_token_ids,
        api_key: config.api_key,
        max_concurrent_requests: config.max_concurrent_requests,
        max_body_bytes: config.max_body_bytes,
        max_sequences_per_request: config.max_sequences_per_request.unwrap_or(engine.max_num_seqs),
        max_tokens_default: config.max_tokens_default,
        no_special_tokens_in_user_content: config.no_special_tokens_in_user_content,
        policy: engine.policy,
        tool_call_parser: config.tool_call_parser,
        reasoning_parser: config.reasoning_parser,
    };
    let auth = match (&server_config.api_key, config.metrics_without_auth) {
        (None, _) => "no API key",
        (Some(_), false) => "API key required but on /health",
        (Some(_), true) => "API key required but on /health and /metrics",
    };
    let options = HttpOptions {
        metrics_without_auth: config.metrics_without_auth,
        allowed_origins: config.allowed_origins,
        body_read_timeout: read_timeout,
    };
    let detail = format!(
        "model `{}`, {auth}, {} concurrent requests",
        server_config.model_name, server_config.max_concurrent_requests
    );
    let mut state = AppState::new(handle, loaded.tokenizer, metrics, server_config)?;
    if let Some(lora) = loaded.lora {
        state = state.with_lora(lora);
    }
    let _ = slot.set(app_with(state.clone(), options));
    timer.done(detail);

    let timer = PhaseTimer::start(Phase::Ready);
    state.set_ready(true);
    timer.done(format_args!("http://{addr}/v1"));
    server.run(&state, drain_timeout, os_signals()?).await
}

/// Phases 1-8 and the engine: model, KV cache, tokenizer, then the `--lora-modules`
/// adapters. Blocking.
fn load(load_config: &LoadConfig, setup: &EngineSetup, serve: &ServeConfig, metrics: Arc<Metrics>) -> Result<Loaded> {
    let fault = fault::from_env()?;
    let progress = progress::WeightBar::for_stderr();
    let (Weights { topology, model, config }, text) = load_weights(load_config, &progress)?;
    // Refused before the KV cache and graphs take their time; the slots are the model's
    // before its graphs are captured, so decode steps with adapters replay too.
    let adapters = adapter_target(serve, config, &topology)?;
    let slots = match (&serve.lora, &adapters) {
        (Some(lora), Some(target)) => {
            let pool = target.slots(lora.max_loras)?;
            model.attach_lora(Arc::clone(&pool)).context("--enable-lora")?;
            Some(pool)
        }
        _ => None,
    };
    let no_tokenizer =
        || format!("{} has no tokenizer (tokenizer.json); met serve needs one", text.source().path().display());
    if !text.has_tokenizer() {
        bail!(no_tokenizer());
    }
    // Every sequence the engine may run, at full context.
    let engine = &setup.engine;
    let demand = engine.max_num_seqs.saturating_mul(model.max_context()).div_ceil(engine.block_size);
    let size = cache_size(setup, &*model, &topology, demand)?;
    let model = fault::inject(fault, model);
    let engine = build_engine(setup, model, &topology, size, Arc::clone(&metrics))?;
    let capacity = engine.limits().kv_capacity;
    if capacity < engine.limits().max_context {
        tracing::warn!(
            "the KV cache holds {capacity} tokens, less than the context of {}: longer requests end with `length`",
            engine.limits().max_context
        );
    }
    let message = no_tokenizer();
    let Text { tokenizer, eos_token_ids, source } = text.load()?;
    let model_name = model_name(serve.served_model_name.clone(), load_config.model.as_deref(), &source);
    let lora = (serve.lora.as_ref().zip(adapters).zip(slots))
        .map(|((lora, target), pool)| LoraRegistry::from_flags(lora, target, pool, model_name.clone(), metrics))
        .transpose()?;
    Ok(Loaded { engine, tokenizer: tokenizer.context(message)?, eos_token_ids, model_name, lora })
}

/// What `--enable-lora` loads adapters for, checked to run on this model and device.
fn adapter_target(serve: &ServeConfig, model: ModelConfig, devices: &Topology) -> Result<Option<AdapterTarget>> {
    let Some(lora) = &serve.lora else { return Ok(None) };
    let limits = LoraLimits { max_rank: lora.max_rank };
    let target = AdapterTarget { model, backend: Arc::clone(devices.lead()), limits };
    target.check()?;
    Ok(Some(target))
}

/// `--served-model-name`, else the hub id the model was given as, else its file or
/// directory name.
fn model_name(served: Option<String>, spec: Option<&str>, source: &ModelSource) -> String {
    if let Some(name) = served {
        return name;
    }
    match spec {
        Some(spec) if !Path::new(spec).exists() => spec.to_owned(),
        _ => source
            .path()
            .file_name()
            .map_or_else(|| source.path().display().to_string(), |name| name.to_string_lossy().into_owned()),
    }
}

/// A router that answers 503 until `slot` holds the real one, then hands every request to it.
fn gate(slot: Arc<OnceLock<Router>>) -> Router {
    Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let app = slot.get().cloned();
        async move {
            Ok::<_, Infallible>(match app {
                Some(app) => app.oneshot(req).await.unwrap_or_else(|never| match never {}),
                None if req.uri().path() == "/health" => {
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(serde_json::json!({"status": "starting"})))
                        .into_response()
                }
                None => ApiError::unavailable("the server is starting: the model is loading").into_response(),
            })
        }
    }))
}
