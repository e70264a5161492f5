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
//! same way),
//! `wire` (JSON types), `validate` (wire → engine requests), `structured` (response
//! formats → grammars), `tools` and `tool_parser` (tool definitions, choices and calls),
//! `reasoning` (`<think>` splitting), `choice_output` (a choice's text → reasoning, content
//! and calls), `stream` (tokens → text, stop strings, cancellation), `error` (the one error type), `state`, `config_file` (`--config
//! FILE.toml`), `progress` (the weight-loading bar) and `fault` (a fault hook for tests,
//! off unless `MET_TEST_ENGINE_FAULT` is set).

mod anthropic;
mod choice_output;
mod config_file;
mod error;
mod fault;
mod listen;
mod openai;
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
use met_config::EngineConfig;
use met_scheduler::Engine;
use met_telemetry::{Metrics, Phase, PhaseTimer};
use tower::ServiceExt;

pub use config_file::{merge as merge_config_file, merge_text as merge_config_text};
pub use error::ApiError;
pub use listen::ConnectionLimits;
pub use openai::DrainCut;
pub use reasoning::{REASONING_PARSER_NAMES, ReasoningKind};
pub use router::{HttpOptions, MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES, app, app_with};
pub use server::Server;
pub use state::{AppState, DEFAULT_MAX_TOKENS, MAX_N, ServerConfig};
pub use tool_parser::{PARSER_NAMES, ParserKind};

use crate::cli::{EngineArgs, ServeArgs};
use crate::resolve::ModelSource;
use crate::startup::engine::{build_engine, check_parallel, engine_config};
use crate::startup::kv_budget::kv_blocks;
use crate::startup::load::{Text, Weights, load_weights};
use met_text::Tokenizer;
use server::os_signals;

/// Runs `met serve` until SIGINT or SIGTERM, or an engine fault.
///
/// # Errors
/// Invalid settings, a port that cannot be bound, a model that cannot be loaded, an engine
/// fault while serving.
pub fn run(args: ServeArgs) -> Result<()> {
    let args = match &args.config {
        Some(path) => config_file::merge(path, std::env::args_os().collect())?,
        None => args,
    };
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
    source: ModelSource,
}

async fn serve(mut args: ServeArgs) -> Result<()> {
    let timer = PhaseTimer::start(Phase::Settings);
    if let Some(model) = args.model_path.take() {
        args.model.model = Some(model);
    }
    // Checked before anything loads; `--policy` clap checked when it parsed the flags.
    let engine_config = engine_config(&args.engine)?;
    check_parallel(args.model.tensor_parallel_size, &args.engine)?;
    if args.max_concurrent_requests == 0 || args.max_body_bytes == 0 {
        bail!("--max-concurrent-requests and --max-body-bytes must be positive");
    }
    if args.max_sequences_per_request == Some(0) || args.max_tokens_default == 0 {
        bail!("--max-sequences-per-request and --max-tokens-default must be positive");
    }
    if args.http_read_timeout_secs == 0 || args.max_connections == 0 {
        bail!("--http-read-timeout-secs and --max-connections must be positive");
    }
    if args.api_key.as_deref().is_some_and(str::is_empty) {
        // An empty key would otherwise mean "no auth" without anyone having asked for that.
        bail!("--api-key (or MET_API_KEY) is empty: give a key, or unset it to serve without one");
    }
    let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
        .await
        .with_context(|| format!("binding {}:{}", args.host, args.port))?;
    let slot = Arc::new(OnceLock::<Router>::new());
    let read_timeout = Duration::from_secs(args.http_read_timeout_secs);
    let limits = ConnectionLimits { max_connections: args.max_connections, read_timeout };
    let server = Server::start(listener, gate(Arc::clone(&slot)), limits)?;
    let addr = server.local_addr();
    timer.done(format_args!("met {}, listening on http://{addr} (503 until ready)", env!("CARGO_PKG_VERSION")));

    let metrics = Arc::new(Metrics::new());
    let spec = args.model.model.clone();
    let (model_args, engine_args, engine_metrics) = (args.model, args.engine.clone(), Arc::clone(&metrics));
    let loaded = tokio::task::spawn_blocking(move || load(&model_args, &engine_args, engine_config, engine_metrics))
        .await
        .context("the loading worker failed")??;

    let timer = PhaseTimer::start(Phase::Engine);
    let (handle, _thread) = met_scheduler::spawn(loaded.engine);
    timer.done(format_args!(
        "{} sequences and {} tokens per step, {} KV tokens",
        args.engine.max_num_seqs,
        args.engine.max_batch_tokens,
        handle.limits().kv_capacity
    ));

    let timer = PhaseTimer::start(Phase::Router);
    let config = ServerConfig {
        model_name: model_name(args.served_model_name, spec.as_deref(), &loaded.source),
        eos_token_ids: loaded.eos_token_ids,
        api_key: args.api_key,
        max_concurrent_requests: args.max_concurrent_requests,
        max_body_bytes: args.max_body_bytes,
        max_sequences_per_request: args.max_sequences_per_request.unwrap_or(args.engine.max_num_seqs),
        max_tokens_default: args.max_tokens_default,
        no_special_tokens_in_user_content: args.no_special_tokens_in_user_content,
        priority_scheduling: args.engine.policy == "priority",
        tool_call_parser: args.tool_call_parser.as_deref().and_then(ParserKind::from_name),
        reasoning_parser: args.reasoning_parser.as_deref().and_then(ReasoningKind::from_name),
    };
    let auth = match (&config.api_key, args.metrics_without_auth) {
        (None, _) => "no API key",
        (Some(_), false) => "API key required but on /health",
        (Some(_), true) => "API key required but on /health and /metrics",
    };
    let options = HttpOptions {
        metrics_without_auth: args.metrics_without_auth,
        allowed_origins: args.allowed_origins,
        body_read_timeout: read_timeout,
    };
    let detail =
        format!("model `{}`, {auth}, {} concurrent requests", config.model_name, config.max_concurrent_requests);
    let state = AppState::new(handle, loaded.tokenizer, metrics, config)?;
    let _ = slot.set(app_with(state.clone(), options));
    timer.done(detail);

    let timer = PhaseTimer::start(Phase::Ready);
    state.set_ready(true);
    timer.done(format_args!("http://{addr}/v1"));
    server.run(&state, Duration::from_secs(args.drain_timeout_secs), os_signals()?).await
}

/// Phases 1-8 and the engine: model, KV cache, tokenizer. Blocking.
fn load(
    model_args: &crate::cli::ModelArgs,
    engine_args: &EngineArgs,
    config: EngineConfig,
    metrics: Arc<Metrics>,
) -> Result<Loaded> {
    let fault = fault::from_env()?;
    let progress = progress::WeightBar::for_stderr();
    let (Weights { topology, model }, text) = load_weights(model_args, &progress)?;
    let no_tokenizer =
        || format!("{} has no tokenizer (tokenizer.json); met serve needs one", text.source().path().display());
    if !text.has_tokenizer() {
        bail!(no_tokenizer());
    }
    // Every sequence the engine may run, at full context.
    let demand = engine_args.max_num_seqs.saturating_mul(model.max_context()).div_ceil(config.block_size);
    let blocks = kv_blocks(engine_args, &config, &*model, &topology, demand)?;
    let model = fault::inject(fault, model);
    let engine = build_engine(engine_args, config, model, &topology, blocks, metrics)?;
    let capacity = engine.limits().kv_capacity;
    if capacity < engine.limits().max_context {
        tracing::warn!(
            "the KV cache holds {capacity} tokens, less than the context of {}: longer requests end with `length`",
            engine.limits().max_context
        );
    }
    let message = no_tokenizer();
    let Text { tokenizer, eos_token_ids, source } = text.load()?;
    Ok(Loaded { engine, tokenizer: tokenizer.context(message)?, eos_token_ids, source })
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
