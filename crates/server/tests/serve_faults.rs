//! One bad request never hurts another (issue 17 items 1 and 5), through the HTTP API in
//! process: a request that could never sample is a 400 naming the field; a sequence the
//! model or sampler fails on (the mock's injected faults) fails its own request alone, the
//! others answer exactly as they would have, and the failure is logged; an engine-level
//! fault fails what runs, turns `/health` to 503, refuses new work and ends the server with
//! an error once it has drained (on a real socket); and limits count sequences and tokens,
//! not HTTP requests.

mod serve_support;

use std::time::Duration;

use axum::http::StatusCode;
use futures_util::future::join_all;
use met_scheduler::mock::Faults;
use serde_json::{Value, json};
use serve_support::logs::Logs;
use serve_support::socket::{read_to_end, send_post, send_post_part};
use serve_support::{Events, Options, TestServer, completion, error_param};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
    // The issue's request, as JSON and as a stream: refused before anything runs.
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
async fn an_engine_fault_drains_the_server_and_ends_it_with_an_error() {
    // A small stream buffer: the stream below is still running (paused) when the fault comes.
    let server = TestServer::with(Options {
        stream_capacity: 2,
        faults: Faults { device_error: Some(BAD), ..Faults::default() },
        ..Options::default()
    });
    // Far longer than the test waits: the drain must end because the requests did.
    let serving = server.serve_on_socket(Duration::from_secs(600)).await;
    let addr = serving.addr;
    let answer = read_to_end(send_post(addr, COMPLETIONS, &good_body(&[5, 6, 7])).await).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // In flight when the fault comes: a generation (in process), a request still sending its
    // body, and an idle connection (both accepted before the request that faults, which is
    // answered).
    let long = completion(json!([5, 6, 7]), json!({"max_tokens": 200, "ignore_eos": true, "stream": true}));
    let mut stream = Events::new(server.send(serve_support::post(COMPLETIONS, long.to_string())).await);
    assert!(stream.next().await.is_some());
    let late = good_body(&[8, 9]).to_string().into_bytes();
    let mut uploading = send_post_part(addr, COMPLETIONS, &late, 10).await;
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();

    let fault = completion(json!([BAD, 6]), json!({"max_tokens": 4}));
    let answer = read_to_end(send_post(addr, COMPLETIONS, &fault).await).await;
    assert!(answer.starts_with("HTTP/1.1 5") && answer.contains("device error"), "{answer}");
    serving.wait_until_closed().await;
    let rest = stream.all().await;
    assert!(rest.iter().any(|e| e.contains(r#"{"error":"#)) && rest.last().unwrap() == "[DONE]", "{rest:?}");
    // The request that was still uploading is answered, with an error: the engine is gone.
    uploading.write_all(&late[10..]).await.unwrap();
    let answer = read_to_end(uploading).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(idle.read(&mut [0; 16]).await.unwrap(), 0, "the idle connection is closed");

    let error = serving.ended_within(Duration::from_secs(10)).await.expect_err("an engine fault is an error");
    assert!(format!("{error:#}").contains("device error"), "{error:#}");
    assert!(!server.state.is_ready());
}

#[tokio::test]
async fn failed_generations_are_logged_with_their_response_id() {
    let server = TestServer::with(Options {
        faults: Faults { fail_batch: Some(BAD), ..Faults::default() },
        ..Options::default()
    });
    let logs = Logs::capture();
    let (status, answer) = server.post(COMPLETIONS, completion(json!([BAD, 6, 7]), json!({"max_tokens": 4}))).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{answer}");
    let stream = completion(json!([BAD, 6, 7]), json!({"max_tokens": 4, "stream": true}));
    let response = server.send(serve_support::post(COMPLETIONS, stream.to_string())).await;
    let events = Events::new(response).all().await;
    assert!(events[0].contains("generation failed"), "{events:?}");
    let (status, answer) = server.post(COMPLETIONS, good_body(&[5, 6, 7])).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let lines = logs.lines();
    let failures: Vec<&String> = lines.iter().filter(|l| l.contains("generation failed")).collect();
    assert_eq!(failures.len(), 2, "one warning per failed request, JSON or stream: {lines:#?}");
    for line in failures {
        let id = line.split_whitespace().nth(1).unwrap_or_default();
        assert!(line.starts_with("WARN") && id.starts_with("cmpl-") && id.ends_with(':'), "{line}");
    }
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
async fn max_tokens_default_is_the_default_and_the_cap() {
    let server = TestServer::with(Options { max_tokens_default: 5, ..Options::default() });
    let prompt = json!([5, 6, 7]);
    let (status, answer) = server.post(COMPLETIONS, completion(prompt.clone(), json!({"ignore_eos": true}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (answer["usage"]["completion_tokens"].as_u64(), &answer["choices"][0]["finish_reason"]),
        (Some(5), &json!("length"))
    );
    for max_tokens in [3, 5] {
        let explicit = json!({"ignore_eos": true, "max_tokens": max_tokens});
        let (status, answer) = server.post(COMPLETIONS, completion(prompt.clone(), explicit)).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"], max_tokens, "{answer}");
    }
    // Above the cap, streamed or not, by either name: a 400 naming the field and the cap.
    let over = [
        (COMPLETIONS, completion(prompt.clone(), json!({"max_tokens": 6})), "max_tokens"),
        (COMPLETIONS, completion(prompt.clone(), json!({"max_tokens": 20, "stream": true})), "max_tokens"),
        ("/v1/chat/completions", serve_support::chat("hi", json!({"max_tokens": 6})), "max_tokens"),
        (
            "/v1/chat/completions",
            serve_support::chat("hi", json!({"max_completion_tokens": 6})),
            "max_completion_tokens",
        ),
        (COMPLETIONS, completion(prompt.clone(), json!({"max_tokens": u64::MAX})), "max_tokens"),
    ];
    for (path, body, param) in over {
        let (status, answer) = server.post(path, body).await;
        assert_eq!((status, error_param(&answer).as_deref()), (StatusCode::BAD_REQUEST, Some(param)), "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("at most 5") && message.contains("--max-tokens-default"), "{message}");
    }
    let body = completion(prompt, json!({"min_tokens": 6}));
    expect_error(&server, COMPLETIONS, body, StatusCode::BAD_REQUEST, "min_tokens").await;
}
