//! The wire: one chat completion of 1,024 tokens through `met serve`'s router, in
//! process, over a real engine on the nearly free mock model (`MockModel::last_token_only`,
//! seeded sampling), read to the end of its body.
//!
//! - `chat/json`: `stream: false`, the baseline: template, tokenization, the engine's 1,024
//!   steps, incremental detokenization and one JSON response.
//! - `chat/sse`: `stream: true`: the same plus one server-sent event per token (a
//!   `chat.completion.chunk` with the delta, serialised and framed), the role and usage
//!   chunks and `[DONE]`.
//! - `chat/sse_stop4`: streamed with four stop strings that never match, so every delta is
//!   first checked for the start of one across the token boundary and held back or
//!   released.
//!
//! The differences between the three are the per-token cost of SSE chunk encoding and of
//! stop-string matching. Both are private to `met serve` (`serve::openai`, `serve::stream`),
//! so this bench reaches them the way a client does, through `met_server::serve::app`; the
//! engine's own per-token cost is in all three. Throughput is in generated tokens. The mock
//! model's vocabulary must be the tokenizer's, so this bench always uses the in-memory
//! byte-level BPE of `support/mod.rs`, never the default model. A request takes about ten
//! milliseconds, so samples are few and flat.

mod support;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use met_cache::PagedKvCache;
use met_config::EngineConfig;
use met_kernels::CpuBackend;
use met_scheduler::Engine;
use met_scheduler::mock::MockModel;
use met_server::serve::{AppState, ServerConfig, app};
use met_telemetry::Metrics;
use serde_json::{Value, json};
use tower::ServiceExt;

const MODEL: &str = "mock-model";
/// Tokens generated per request.
const TOKENS: usize = 1024;
const MAX_CONTEXT: usize = 4096;
const KV_BLOCKS: usize = 1024;

/// The router over a running engine on the mock model.
fn server() -> Router {
    let tokenizer = support::in_memory_tokenizer();
    let metrics = Arc::new(Metrics::new());
    let backend = Arc::new(CpuBackend::new());
    let config = EngineConfig::default();
    let kv =
        PagedKvCache::new(&*backend, MockModel::layout(), config.block_size, KV_BLOCKS, true).expect("a valid cache");
    let model = Box::new(MockModel::last_token_only(tokenizer.vocab_size(), MAX_CONTEXT));
    let engine = Engine::new(model, backend, Box::new(kv), config, Arc::clone(&metrics)).expect("a valid engine");
    let (handle, _thread) = met_scheduler::spawn(engine);
    let server_config = ServerConfig {
        model_name: MODEL.into(),
        eos_token_ids: tokenizer.eos_ids().to_vec(),
        api_key: None,
        max_concurrent_requests: 64,
        max_body_bytes: 1 << 20,
        ..ServerConfig::default()
    };
    let state = AppState::new(handle, tokenizer, metrics, server_config).expect("the template compiles");
    state.set_ready(true);
    app(state)
}

/// A greedy chat request for exactly [`TOKENS`] tokens, with `extra` fields merged in.
fn request(extra: Value) -> Vec<u8> {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the capital of France, briefly."}],
        "temperature": 1,
        "seed": 1234,
        "max_tokens": TOKENS,
        "ignore_eos": true,
    });
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        body.extend(extra);
    }
    body.to_string().into_bytes()
}

/// Sends one request and reads the whole body.
async fn complete(router: &Router, body: &[u8]) -> Vec<u8> {
    let req = Request::post("/v1/chat/completions")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    let response = router.clone().oneshot(req).await.expect("the router is infallible");
    assert_eq!(response.status(), StatusCode::OK);
    axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("the body is read").to_vec()
}

fn chat(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let router = server();
    let stream = json!({"stream": true, "stream_options": {"include_usage": true}});
    let mut stop = stream.clone();
    stop["stop"] = json!(["\nUser:", "<|im_start|>user", "###", "The end of the answer."]);
    let cases = [("json", request(json!({}))), ("sse", request(stream)), ("sse_stop4", request(stop))];
    let mut group = c.benchmark_group("chat");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements(TOKENS as u64));
    for (name, body) in cases {
        let first = String::from_utf8(runtime.block_on(complete(&router, &body))).expect("UTF-8 JSON");
        let generated = format!("\"completion_tokens\":{TOKENS}");
        assert!(first.contains(&generated), "{name}: every token is generated (no stop string fires): {first}");
        group.bench_function(format!("{name}/{TOKENS}_tokens"), |b| {
            b.iter(|| runtime.block_on(complete(&router, &body)));
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = chat
}
criterion_main!(benches);
