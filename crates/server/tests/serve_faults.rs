//! One bad request never hurts another (issue 17 items 1 and 5), through the HTTP API in
//! process: a request that could never sample is a 400 naming the field; a sequence the
//! model or sampler fails on (the mock's injected faults) fails its own request alone, the
//! others answer exactly as they would have; an engine-level fault fails what runs, turns
//! `/health` to 503 and refuses new work; and limits count sequences, not HTTP requests.

mod serve_support;

use axum::http::StatusCode;
use futures_util::future::join_all;
use met_scheduler::mock::Faults;
use serde_json::{Value, json};
use serve_support::{Options, TestServer, completion, error_param};

/// The first prompt token the mock fails on; no good prompt starts with it.
const BAD: u32 = 50;

const COMPLETIONS: &str = "/v1/completions";

/// Posts `body` and checks the status and the error's `param`.
async fn expect_error(server: &TestServer, path: &str, body: Value, status: StatusCode, param: &str) {
    let (got, answer) = server.post(path, body).await;
    assert_eq!(got, status, "{answer}");
    assert_eq!(error_param(&answer).as_deref(), Some(param), "{answer}");
}

#[tokio::test]
async fn a_request_that_can_never_sample_is_a_400_naming_the_field() {
    let server = TestServer::new();
    let every_token: Vec<u32> = (0..server.tokenizer.vocab_size() as u32).collect();
    // The request, as JSON and as a stream: refused before anything runs.
    for stream in [false, true] {
        let body = completion(
            json!("Hi"),
            json!({"max_tokens": 5, "min_tokens": 2, "stop_token_ids": every_token, "stream": stream}),
        );
        expect_error(&server, COMPLETIONS, body, StatusCode::BAD_REQUEST, "stop_token_ids").await;
    }
    // The model's EOS completes the ban set.
    let eos = server.tokenizer.eos_ids()[0];
    let without_eos: Vec<u32> = every_token.iter().copied().filter(|&t| t != eos).collect();
    let body = completion(json!("Hi"), json!({"max_tokens": 5, "min_tokens": 1, "stop_token_ids": without_eos}));
    expect_error(&server, COMPLETIONS, body, StatusCode::BAD_REQUEST, "stop_token_ids").await;
    // The same stop set without min_tokens simply stops after one token.
    let body = completion(json!("Hi"), json!({"max_tokens": 5, "stop_token_ids": every_token}));
    let (status, answer) = server.post(COMPLETIONS, body).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 1, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
}

/// Seven greedy requests with id prompts, and what each must answer.
fn good_prompts() -> Vec<Vec<u32>> {
    (0..7u32).map(|i| (0..4 + i).map(|j| 5 + (i * 11 + j) % 40).collect()).collect()
}

fn good_body(prompt: &[u32]) -> Value {
    completion(json!(prompt), json!({"max_tokens": 8, "ignore_eos": true}))
}

#[tokio::test]
async fn a_hostile_request_in_a_batch_of_8_leaves_the_other_7_unchanged() {
    for faults in
        [Faults { nan_logits: Some(BAD), ..Faults::default() }, Faults { fail_batch: Some(BAD), ..Faults::default() }]
    {
        let server = TestServer::with(Options { faults, ..Options::default() });
        let prompts = good_prompts();
        let mut bodies: Vec<Value> = prompts.iter().map(|p| good_body(p)).collect();
        bodies.insert(2, completion(json!([BAD, 6, 7]), json!({"max_tokens": 8, "n": 2})));
        let answers = join_all(bodies.into_iter().map(|b| server.post(COMPLETIONS, b))).await;
        let (status, bad) = &answers[2];
        assert_eq!(*status, StatusCode::INTERNAL_SERVER_ERROR, "{faults:?}: {bad}");
        assert!(error_param(bad).is_none() && bad["error"]["type"] == "server_error", "{bad}");
        let good = answers.iter().enumerate().filter(|&(i, _)| i != 2).map(|(_, a)| a);
        for (prompt, (status, answer)) in prompts.iter().zip(good) {
            assert_eq!(*status, StatusCode::OK, "{faults:?}: {answer}");
            let want = server.text(&server.greedy(prompt, 8, true));
            assert_eq!(answer["choices"][0]["text"], want.as_str(), "{faults:?}: {answer}");
        }
        // A sequence's failure is not the engine's: still healthy, still serving.
        assert_eq!(server.get("/health").await.0, StatusCode::OK);
        let (status, answer) = server.post(COMPLETIONS, good_body(&prompts[0])).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
}

#[tokio::test]
async fn an_engine_fault_turns_health_503_and_refuses_new_requests() {
    let server = TestServer::with(Options {
        faults: Faults { device_error: Some(BAD), ..Faults::default() },
        ..Options::default()
    });
    assert_eq!(server.get("/health").await.0, StatusCode::OK);
    let (status, answer) = server.post(COMPLETIONS, completion(json!([BAD, 6]), json!({"max_tokens": 4}))).await;
    assert!(status.is_server_error(), "{answer}");
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("device error")), "{answer}");
    let (status, body) = server.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    let (status, answer) = server.post(COMPLETIONS, good_body(&[5, 6, 7])).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(server.state.engine().fault().is_some());
}

#[tokio::test]
async fn limits_count_sequences_not_requests() {
    let server = TestServer::with(Options { max_sequences_per_request: 8, ..Options::default() });
    let three = json!(["a", "b", "c"]);
    expect_error(
        &server,
        COMPLETIONS,
        completion(three, json!({"n": 3, "max_tokens": 2})),
        StatusCode::BAD_REQUEST,
        "n",
    )
    .await;
    let nine = json!(["a", "b", "c", "d", "e", "f", "g", "h", "i"]);
    expect_error(&server, COMPLETIONS, completion(nine, json!({"max_tokens": 2})), StatusCode::BAD_REQUEST, "prompt")
        .await;
    let chat = serve_support::chat("hi", json!({"n": 9, "max_tokens": 2}));
    expect_error(&server, "/v1/chat/completions", chat, StatusCode::BAD_REQUEST, "n").await;
    // Exactly at the limit is fine.
    let (status, answer) =
        server.post(COMPLETIONS, completion(json!(["a", "b"]), json!({"n": 4, "max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"].as_array().map(Vec::len), Some(8), "{answer}");
}

#[tokio::test]
async fn max_tokens_default_caps_only_requests_that_give_none() {
    let server = TestServer::with(Options { max_tokens_default: 5, ..Options::default() });
    let prompt = json!([5, 6, 7]);
    let (status, answer) = server.post(COMPLETIONS, completion(prompt.clone(), json!({"ignore_eos": true}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (answer["usage"]["completion_tokens"].as_u64(), &answer["choices"][0]["finish_reason"]),
        (Some(5), &json!("length"))
    );
    let explicit = json!({"ignore_eos": true, "max_tokens": 20});
    let (status, answer) = server.post(COMPLETIONS, completion(prompt.clone(), explicit)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 20, "{answer}");
    let body = completion(prompt, json!({"min_tokens": 6}));
    expect_error(&server, COMPLETIONS, body, StatusCode::BAD_REQUEST, "min_tokens").await;
}
