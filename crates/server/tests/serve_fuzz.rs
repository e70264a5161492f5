//! Fuzzing the request parser and validator (issue 17 item 8) with proptest, through the
//! in-process router over the mock model: arbitrary bytes, mutated JSON, and arbitrary JSON
//! values (nested objects keyed mostly by the real field names, over a valid request or on
//! their own). Whatever arrives, nothing panics, nothing is a 5xx, every rejection is a 4xx
//! with OpenAI's error JSON, and every success is a whole answer (JSON, or a stream of JSON
//! chunks ending in `[DONE]` with no error event).
//!
//! The case counts keep the whole file to a few seconds; `PROPTEST_CASES` raises them for
//! a longer local run.

mod serve_support;

use axum::http::{StatusCode, header};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use serve_support::{MODEL, Options, TestServer, post};

/// Every field a request body may hold, and the keys nested inside them.
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "max_completion_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stop_token_ids",
    "n",
    "logprobs",
    "top_logprobs",
    "stream",
    "stream_options",
    "include_usage",
    "ignore_eos",
    "user",
    "skip_special_tokens",
    "add_generation_prompt",
    "continue_final_message",
    "chat_template_kwargs",
    "role",
    "content",
    "type",
    "text",
    "tokens",
    "add_special_tokens",
];

const PATHS: &[&str] = &["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"];

/// Cases per property, unless `PROPTEST_CASES` says otherwise.
fn runner(cases: u32) -> TestRunner {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(cases);
    TestRunner::new(Config { cases, failure_persistence: None, ..Config::default() })
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-3i64..300).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-3.0f64..3.0).prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[ -~]{0,12}".prop_map(Value::from),
        prop::sample::select(FIELDS).prop_map(Value::from),
        prop::sample::select(&["user", "assistant", "system", "text", MODEL, "<|im_start|>", "<|im_end|>"][..])
            .prop_map(Value::from),
    ]
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![4 => prop::sample::select(FIELDS).prop_map(String::from), 1 => "[a-z_0-9]{0,8}"]
}

/// Any JSON value, a few levels deep.
fn value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(3, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..6).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A valid request for `path`, small enough to answer quickly.
fn base(path: &str) -> Value {
    match path {
        "/v1/chat/completions" => {
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "temperature": 0})
        }
        "/tokenize" => json!({"model": MODEL, "prompt": "hi there"}),
        "/detokenize" => json!({"model": MODEL, "tokens": [5, 6, 7]}),
        _ => json!({"model": MODEL, "prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0}),
    }
}

/// A body: a valid request with fields replaced, or random fields alone, or any value.
fn request() -> impl Strategy<Value = (&'static str, Value)> {
    let fields = prop::collection::vec((key(), value()), 0..6);
    (prop::sample::select(PATHS), 0..3u8, fields, value()).prop_map(|(path, shape, fields, any)| {
        let body = match shape {
            0 => {
                let mut body = base(path);
                body.as_object_mut().expect("an object").extend(fields);
                body
            }
            1 => Value::Object(fields.into_iter().collect()),
            _ => any,
        };
        (path, body)
    })
}

/// Bytes: random ones, or a request's JSON truncated, with a byte put in, or with
/// something after it.
fn bytes() -> impl Strategy<Value = (&'static str, Vec<u8>)> {
    let random = (prop::sample::select(PATHS), prop::collection::vec(any::<u8>(), 0..200));
    let mutated =
        (request(), any::<prop::sample::Index>(), any::<u8>(), 0..3u8).prop_map(|((path, body), at, byte, how)| {
            let mut bytes = body.to_string().into_bytes();
            let at = at.index(bytes.len() + 1);
            match how {
                0 => bytes.truncate(at),
                1 => bytes.insert(at, byte),
                _ => bytes.extend_from_slice(b" {\"n\": 2}"),
            }
            (path, bytes)
        });
    prop_oneof![random, mutated]
}

/// The server every case goes to: few sequences per request, so accepted cases are quick.
fn server() -> TestServer {
    TestServer::with(Options { max_sequences_per_request: 8, max_tokens_default: 8, ..Options::default() })
}

/// Sends one body and checks the answer's shape.
async fn check(server: &TestServer, path: &str, body: Vec<u8>) -> Result<(), TestCaseError> {
    let response = server.send(post(path, body)).await;
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    let text = String::from_utf8_lossy(&bytes);
    prop_assert!(status.is_success() || status.is_client_error(), "{path}: {status} {text}");
    if content_type.as_deref().is_some_and(|c| c.starts_with("text/event-stream")) {
        prop_assert_eq!(status, StatusCode::OK);
        let events: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
        prop_assert_eq!(events.last().copied(), Some("[DONE]"), "{}", text);
        for event in &events[..events.len() - 1] {
            let chunk: Value = serde_json::from_str(event).map_err(|e| TestCaseError::fail(format!("{e}: {event}")))?;
            prop_assert!(chunk.get("error").is_none(), "{path}: an error inside the stream: {event}");
        }
        return Ok(());
    }
    prop_assert!(content_type.as_deref().is_some_and(|c| c.starts_with("application/json")), "{content_type:?}");
    let json: Value = serde_json::from_slice(&bytes).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
    if status.is_success() {
        prop_assert!(json.get("error").is_none(), "{text}");
        return Ok(());
    }
    let error = &json["error"];
    prop_assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{text}");
    prop_assert!(error["type"].is_string(), "{text}");
    prop_assert!(error.get("param").is_some() && error.get("code").is_some(), "{text}");
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
fn arbitrary_bytes_are_answered_with_a_4xx_json_error_or_an_answer() {
    let rt = runtime();
    let server = server();
    runner(96).run(&bytes(), |(path, body)| rt.block_on(check(&server, path, body))).unwrap();
}

#[test]
fn arbitrary_json_values_are_answered_with_a_4xx_json_error_or_an_answer() {
    let rt = runtime();
    let server = server();
    runner(160)
        .run(&request(), |(path, body)| rt.block_on(check(&server, path, body.to_string().into_bytes())))
        .unwrap();
    // After all of that, a plain request still gets its normal answer.
    rt.block_on(async {
        let (status, answer) = server.post("/v1/completions", base("/v1/completions")).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(server.get("/health").await.0, StatusCode::OK);
    });
}
