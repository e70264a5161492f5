//! Request lifecycle (issue 5 item 7): a client that goes away mid-stream cancels its
//! sequence and its KV blocks return to the pool; the concurrency limit answers 429 instead
//! of queueing; the API key guards every route but `/health`; a signal drains the server
//! (on a real socket) and ends it cleanly.

mod serve_support;

use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use met_telemetry::FinishLabel;
use serde_json::json;
use serve_support::socket::{read_to_end, send_post, send_post_part};
use serve_support::{Events, Options, TestServer, chat, completion, error_param, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn cancelled(server: &TestServer) -> u64 {
    server.metrics.requests_finished.get_or_create(&FinishLabel::Cancelled).get()
}

#[tokio::test]
async fn a_client_that_disconnects_frees_its_kv_blocks() {
    // A small stream buffer: the engine pauses the request instead of finishing it while
    // nobody reads.
    let server = TestServer::with(Options { stream_capacity: 2, ..Options::default() });
    let body = completion(json!("a long story"), json!({"max_tokens": 200, "ignore_eos": true, "stream": true}));
    let mut events = Events::new(server.send(post("/v1/completions", body.to_string())).await);
    for _ in 0..3 {
        assert!(events.next().await.is_some());
    }
    server.eventually("the request holds blocks", |s| s.metrics.kv_blocks_used.get() > 0).await;
    assert_eq!(cancelled(&server), 0);
    drop(events);
    server.eventually("the request is cancelled", |s| cancelled(s) == 1).await;
    server.eventually("its blocks are free", |s| s.metrics.kv_blocks_used.get() == 0).await;
    let text = server.get("/metrics").await.1;
    assert!(text.contains("met_kv_blocks_used 0"), "{text}");
    assert!(text.contains(r#"met_requests_finished_total{reason="cancelled"} 1"#), "{text}");
    // The engine keeps serving.
    let (status, body) = server.post("/v1/chat/completions", chat("next", json!({"max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn over_the_concurrency_limit_requests_get_429() {
    let server = TestServer::with(Options { max_concurrent_requests: 1, stream_capacity: 2, ..Options::default() });
    let long = completion(json!("hold"), json!({"max_tokens": 100, "ignore_eos": true, "stream": true}));
    let mut held = Events::new(server.send(post("/v1/completions", long.to_string())).await);
    assert!(held.next().await.is_some());
    let (status, body) = server.post("/v1/chat/completions", chat("me too", json!({"max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    error_param(&body);
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    // Other endpoints are not limited.
    assert_eq!(server.get("/v1/models").await.0, StatusCode::OK);
    drop(held);
    let (status, body) = server.post("/v1/chat/completions", chat("now", json!({"max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn the_api_key_guards_v1() {
    let server = TestServer::with(Options { api_key: Some("sk-secret".into()), ..Options::default() });
    let body = chat("key", json!({"max_tokens": 2})).to_string();
    let with = |auth: Option<&str>| {
        let mut request = Request::post("/v1/chat/completions").header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = auth {
            request = request.header(header::AUTHORIZATION, auth);
        }
        request.body(Body::from(body.clone())).unwrap()
    };
    for auth in [None, Some("Bearer sk-wrong"), Some("Bearer sk-secre"), Some("sk-secret"), Some("Bearer ")] {
        let response = server.send(with(auth)).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{auth:?}");
        let body = serve_support::json_body(response).await;
        error_param(&body);
        assert_eq!(body["error"]["code"], "invalid_api_key");
    }
    let response = server.send(with(Some("Bearer sk-secret"))).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(server.get("/v1/models").await.0, StatusCode::UNAUTHORIZED);
    let models = Request::get("/v1/models").header(header::AUTHORIZATION, "Bearer sk-secret").body(Body::empty());
    assert_eq!(server.send(models.unwrap()).await.status(), StatusCode::OK);
    // Only /health answers without the key (`/metrics` with `--metrics-without-auth`, in
    // serve_http.rs).
    assert_eq!(server.get("/health").await.0, StatusCode::OK);
    assert_eq!(server.get("/metrics").await.0, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_signal_lets_in_flight_requests_finish_and_ends_the_server_cleanly() {
    let server = TestServer::new();
    let serving = server.serve_on_socket(Duration::from_secs(600)).await;
    // In flight when the signal comes: a request still sending its body, and an idle
    // connection. A request answered after them shows that both were accepted.
    let body = completion(json!([5, 6, 7]), json!({"max_tokens": 6, "ignore_eos": true})).to_string().into_bytes();
    let mut uploading = send_post_part(serving.addr, "/v1/completions", &body, 10).await;
    let mut idle = tokio::net::TcpStream::connect(serving.addr).await.unwrap();
    let one = completion(json!([5]), json!({"max_tokens": 1}));
    let answer = read_to_end(send_post(serving.addr, "/v1/completions", &one).await).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    serving.signals.send("SIGTERM").await.unwrap();
    serving.wait_until_closed().await;
    assert!(!server.state.is_ready());
    assert_eq!(idle.read(&mut [0; 16]).await.unwrap(), 0, "the idle connection is closed");
    uploading.write_all(&body[10..]).await.unwrap();
    let answer = read_to_end(uploading).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let text = server.text(&server.greedy(&[5, 6, 7], 6, true));
    assert!(answer.contains(&serde_json::to_string(&text).unwrap()), "{answer}");
    serving.ended_within(Duration::from_secs(10)).await.expect("a signal is an orderly stop");
}
