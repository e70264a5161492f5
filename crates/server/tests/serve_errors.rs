//! Every way a request can be wrong (issue 5 item 6) answers an OpenAI-shaped error with
//! the right status and `param`, and none of them stops the server from serving the next
//! request.

mod serve_support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use serde_json::{Value, json};
use serve_support::{MAX_CONTEXT, Options, TestServer, chat, completion, error_param};

/// Posts `body` and checks the status and the error's `param`.
async fn expect_error(server: &TestServer, path: &str, body: impl Into<Body>, status: StatusCode, param: Option<&str>) {
    let (got, body) = server.post_raw(path, body).await;
    assert_eq!(got, status, "{body}");
    assert_eq!(error_param(&body).as_deref(), param, "{body}");
}

#[tokio::test]
async fn malformed_json_and_wrong_types() {
    let server = TestServer::new();
    let chat_path = "/v1/chat/completions";
    expect_error(&server, chat_path, "{not json", StatusCode::BAD_REQUEST, None).await;
    expect_error(&server, chat_path, "", StatusCode::BAD_REQUEST, None).await;
    expect_error(&server, chat_path, "[1, 2]", StatusCode::BAD_REQUEST, None).await;
    for (body, param) in [
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}), "temperature"),
        (json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}), "max_tokens"),
        (json!({"messages": [{"role": "user", "content": "x"}], "n": 1.5}), "n"),
        (json!({"messages": [{"role": "user", "content": "x"}], "stop": 3}), "stop"),
        (json!({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}), "stream"),
        (json!({"messages": [{"role": "user"}], "logit_bias": {"1": "x"}}), "logit_bias.1"),
        (json!({"messages": [{"content": "x"}]}), "messages[0]"),
    ] {
        expect_error(&server, chat_path, body.to_string(), StatusCode::BAD_REQUEST, Some(param)).await;
    }
    for prompt in [json!([-1]), json!({"a": 1}), json!([[1], "x"])] {
        let body = json!({"prompt": prompt}).to_string();
        expect_error(&server, "/v1/completions", body, StatusCode::BAD_REQUEST, Some("prompt")).await;
    }
}

#[tokio::test]
async fn missing_or_empty_prompts() {
    let server = TestServer::new();
    let chat_path = "/v1/chat/completions";
    for body in [json!({}), json!({"messages": []}), json!({"messages": null})] {
        expect_error(&server, chat_path, body.to_string(), StatusCode::BAD_REQUEST, Some("messages")).await;
    }
    let image = json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]});
    expect_error(&server, chat_path, image.to_string(), StatusCode::BAD_REQUEST, Some("messages[0].content")).await;
    for prompt in [json!(null), json!(""), json!([]), json!([[]]), json!([""])] {
        let body = json!({"prompt": prompt}).to_string();
        expect_error(&server, "/v1/completions", body, StatusCode::BAD_REQUEST, Some("prompt")).await;
    }
    let outside = json!({"prompt": [1, 100_000]}).to_string();
    expect_error(&server, "/v1/completions", outside, StatusCode::BAD_REQUEST, Some("prompt")).await;
}

#[tokio::test]
async fn unknown_model_is_404() {
    let server = TestServer::new();
    let mut body = chat("x", json!({}));
    body["model"] = json!("gpt-4o");
    let (status, body) = server.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_param(&body).as_deref(), Some("model"));
    assert_eq!(body["error"]["code"], "model_not_found");
    let (status, _) = server.post("/tokenize", json!({"model": "other", "prompt": "x"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn prompts_longer_than_the_context_name_both_lengths() {
    let server = TestServer::new();
    let ids: Vec<u32> = vec![5; MAX_CONTEXT + 10];
    let (status, body) = server.post("/v1/completions", completion(json!(ids), json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_param(&body).as_deref(), Some("prompt"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(&(MAX_CONTEXT + 10).to_string()) && message.contains(&MAX_CONTEXT.to_string()),
        "{message}"
    );
    assert_eq!(body["error"]["code"], "context_length_exceeded");

    let (status, body) =
        server.post("/v1/completions", completion(json!(vec![5; 100]), json!({"max_tokens": 200}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_param(&body).as_deref(), Some("max_tokens"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("100") && message.contains("200") && message.contains(&MAX_CONTEXT.to_string()));
    let long = "word ".repeat(MAX_CONTEXT);
    let (status, body) = server.post("/v1/chat/completions", chat(&long, json!({}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_param(&body).as_deref(), Some("messages"));
}

#[tokio::test]
async fn out_of_range_fields_are_named() {
    let server = TestServer::new();
    let cases = [
        (json!({"n": 0}), "n"),
        (json!({"n": 129}), "n"),
        (json!({"max_tokens": 0}), "max_tokens"),
        (json!({"max_completion_tokens": 0}), "max_completion_tokens"),
        (json!({"temperature": -0.5}), "temperature"),
        (json!({"temperature": 1e39}), "temperature"),
        (json!({"top_p": 0}), "top_p"),
        (json!({"top_k": -2}), "top_k"),
        (json!({"min_p": 2}), "min_p"),
        (json!({"presence_penalty": 3}), "presence_penalty"),
        (json!({"frequency_penalty": -3}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"100000": 1}}), "logit_bias"),
        (json!({"logit_bias": {"1": 101}}), "logit_bias"),
        (json!({"seed": 1.5}), "seed"),
        (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
        (json!({"stop": ""}), "stop"),
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": 3}), "logprobs"),
        (json!({"min_tokens": 5, "max_tokens": 2}), "min_tokens"),
        (json!({"stop_token_ids": [100000]}), "stop_token_ids"),
    ];
    for (extra, param) in cases {
        let (status, body) = server.post("/v1/chat/completions", chat("x", extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra} -> {body}");
        assert_eq!(error_param(&body).as_deref(), Some(param), "{extra} -> {body}");
    }
    let (status, body) = server.post("/v1/completions", completion(json!("x"), json!({"logprobs": 21}))).await;
    assert_eq!((status, error_param(&body).as_deref()), (StatusCode::BAD_REQUEST, Some("logprobs")));
    let (status, body) = server.post("/v1/completions", completion(json!("x"), json!({"logprobs": true}))).await;
    assert_eq!((status, error_param(&body).as_deref()), (StatusCode::BAD_REQUEST, Some("logprobs")));
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let server = TestServer::new();
    let extra = json!({"max_tokens": 2, "user": "u1", "frobnicate": {"deep": [1, 2]}, "response_format": null});
    let (status, body) = server.post("/v1/chat/completions", chat("x", extra)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn oversized_bodies_wrong_methods_and_unknown_routes() {
    let server = TestServer::with(Options { max_body_bytes: 1000, ..Options::default() });
    let big = chat(&"x".repeat(2000), json!({})).to_string();
    let (status, body) = server.post_raw("/v1/chat/completions", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    error_param(&body);

    for (method, path) in
        [("GET", "/v1/chat/completions"), ("DELETE", "/v1/completions"), ("POST", "/v1/models"), ("POST", "/health")]
    {
        let response = server.send(Request::builder().method(method).uri(path).body(Body::empty()).unwrap()).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        error_param(&serve_support::json_body(response).await);
    }
    let (status, body) = server.post("/v1/nothing", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    error_param(&body);
}

#[tokio::test]
async fn no_input_stops_the_server() {
    let server = TestServer::new();
    let bodies = [
        "null",
        "0",
        "\"s\"",
        "{\"messages\": [{}]}",
        "{\"messages\": [{\"role\": 1}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": {\"x\": 1}}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}",
        "{\"prompt\": \"\\u0000\\u0001\", \"max_tokens\": 1}",
        "{\"prompt\": [0, 1, 2], \"n\": 128, \"max_tokens\": 1}",
        "{\"prompt\": \"x\", \"max_tokens\": 18446744073709551615}",
        "{\"prompt\": \"x\", \"seed\": -1, \"max_tokens\": 1}",
        "{\"prompt\": \"x\", \"stream\": true, \"max_tokens\": 1, \"stream_options\": 5}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": {\"messages\": 1}}",
    ];
    for body in bodies {
        let (status, json) = server.post_raw("/v1/completions", body).await;
        assert!(status.is_success() || status.is_client_error(), "{body}: {status} {json}");
        if !status.is_success() {
            error_param(&json);
        }
        let (status, _) = server.post_raw("/v1/chat/completions", body).await;
        assert!(status.is_success() || status.is_client_error(), "{body}: {status}");
    }
    let (status, body) = server.post("/v1/chat/completions", chat("still here?", json!({"max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn detokenize_rejects_ids_outside_the_vocabulary() {
    let server = TestServer::new();
    let (status, body) = server.post("/detokenize", json!({"tokens": [1, 100000]})).await;
    assert_eq!((status, error_param(&body).as_deref()), (StatusCode::BAD_REQUEST, Some("tokens")));
    let (status, body) = server.post("/tokenize", json!({"prompt": "a", "messages": []})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let _: Value = body;
}
