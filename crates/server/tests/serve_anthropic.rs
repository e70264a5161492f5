//! Anthropic Messages in-process, on the mock model: answers equal the chat path's for the
//! same conversation, streams are Anthropic's events adding up to the answer, tools come
//! back as `tool_use` blocks matching their `input_schema` and go on with `tool_result`,
//! `count_tokens` counts the rendered prompt, and errors are Anthropic-shaped.

mod serve_support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{Events, Options, TestServer, post};

fn server() -> TestServer {
    TestServer::with(Options { max_context: 2048, ..Options::default() })
}

fn text_of(resp: &Value) -> String {
    let blocks = resp["content"].as_array().unwrap_or_else(|| panic!("{resp}"));
    blocks.iter().filter(|b| b["type"] == "text").map(|b| b["text"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_message_equals_the_chat_answer_and_counts_its_tokens() {
    let server = server();
    let req = json!({"system": "be brief", "max_tokens": 10, "temperature": 0,
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "hello world"}]}]});
    let (status, resp) = server.post("/v1/messages", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(resp["type"], "message");
    assert_eq!(resp["role"], "assistant");
    let chat = json!({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
                      "max_tokens": 10, "temperature": 0});
    let (_, want) = server.post("/v1/chat/completions", chat).await;
    assert_eq!(text_of(&resp), want["choices"][0]["message"]["content"].as_str().unwrap());
    assert_eq!(resp["usage"]["input_tokens"], want["usage"]["prompt_tokens"]);
    let reason = if want["choices"][0]["finish_reason"] == "length" { "max_tokens" } else { "end_turn" };
    assert_eq!(resp["stop_reason"], reason);
    let (status, count) = server.post("/v1/messages/count_tokens", req).await;
    assert_eq!(status, StatusCode::OK, "{count}");
    assert_eq!(count["input_tokens"], want["usage"]["prompt_tokens"]);
}

#[tokio::test]
async fn a_stream_is_anthropics_events() {
    let server = server();
    let req =
        json!({"max_tokens": 8, "temperature": 0, "stream": true, "messages": [{"role": "user", "content": "go"}]});
    let response = server.send(post("/v1/messages", req.to_string())).await;
    let events: Vec<Value> =
        Events::new(response).all().await.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "message_start");
    assert_eq!(&kinds[kinds.len() - 2..], ["message_delta", "message_stop"]);
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "content_block_delta")
        .map(|e| e["delta"]["text"].as_str().unwrap())
        .collect();
    let (_, whole) = server
        .post(
            "/v1/messages",
            json!({"max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(text, text_of(&whole));
}

#[tokio::test]
async fn tools_come_back_as_tool_use_blocks() {
    let server = server();
    let tool = json!({"name": "get_weather", "description": "weather", "input_schema": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}});
    let req = json!({"max_tokens": 60, "tools": [tool], "tool_choice": {"type": "tool", "name": "get_weather"},
                     "messages": [{"role": "user", "content": "weather?"}]});
    let (status, resp) = server.post("/v1/messages", req).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let call = resp["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap_or_else(|| panic!("{resp}"));
    assert_eq!(call["name"], "get_weather");
    assert!(call["input"]["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{call}");
    assert!(call["id"].as_str().unwrap().starts_with("toolu_"));
    let next = json!({"max_tokens": 4, "tools": [tool], "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}]});
    let (status, out) = server.post("/v1/messages", next).await;
    assert_eq!(status, StatusCode::OK, "{out}");
}

#[tokio::test]
async fn errors_are_anthropic_shaped() {
    let server = server();
    let cases = [
        json!({"messages": [{"role": "user", "content": "x"}]}),
        json!({"max_tokens": 5}),
        json!({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
        json!({"max_tokens": 5, "temperature": -2, "messages": [{"role": "user", "content": "x"}]}),
        json!({"max_tokens": 5, "tool_choice": {"type": "sometimes"}, "messages": [{"role": "user", "content": "x"}]}),
    ];
    let names = ["max_tokens", "messages", "messages[0].content[0]", "temperature", "tool_choice"];
    for (req, name) in cases.into_iter().zip(names) {
        let (status, body) = server.post("/v1/messages", req.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{req}: {body}");
        assert_eq!(body["type"], "error", "{body}");
        assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
        assert!(body["error"]["message"].as_str().unwrap().contains(name), "{req}: {body}");
    }
    let (status, body) = server.post("/v1/messages", json!({"model": "other", "max_tokens": 5, "messages": []})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["type"], "not_found_error", "{body}");
}

/// Errors raised before the handler runs (the API key, the body's type, size and JSON, the
/// method) are Anthropic-shaped on the Anthropic routes, keep their status and headers, and
/// stay OpenAI-shaped on the OpenAI routes.
#[tokio::test]
async fn errors_before_the_handler_are_anthropic_shaped_too() {
    use axum::body::Body;
    use axum::http::{Request, header};
    let server = TestServer::with(Options { api_key: Some("k".into()), max_body_bytes: 1000, ..Options::default() });
    let body = json!({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}).to_string();
    let keyed = |path: &str, content_type: &str, body: String| {
        Request::post(path)
            .header(header::AUTHORIZATION, "Bearer k")
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .unwrap()
    };
    let cases = [
        ("no key", post("/v1/messages", body.clone()), StatusCode::UNAUTHORIZED, "authentication_error"),
        (
            "text/plain",
            keyed("/v1/messages", "text/plain", body.clone()),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
        ),
        (
            "bad JSON",
            keyed("/v1/messages", "application/json", "{".into()),
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
        ),
        (
            "too large",
            keyed("/v1/messages/count_tokens", "application/json", "x".repeat(2000)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
    ];
    for (what, req, status, kind) in cases {
        let response = server.send(req).await;
        assert_eq!(response.status(), status, "{what}");
        let close = response.headers().get(header::CONNECTION).cloned();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(body["type"], "error", "{what}: {body}");
        assert_eq!(body["error"]["type"], kind, "{what}: {body}");
        assert!(!body["error"]["message"].as_str().unwrap().is_empty(), "{what}: {body}");
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            assert_eq!(close.as_ref().map(|v| v.as_bytes()), Some(&b"close"[..]), "{what}: Connection: close kept");
        }
    }
    let get = Request::get("/v1/messages").header(header::AUTHORIZATION, "Bearer k").body(Body::empty()).unwrap();
    let response = server.send(get).await;
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap()["type"], "error");
    // The OpenAI routes keep OpenAI's shape.
    let (status, body) = server.post("/v1/chat/completions", json!({"messages": []})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(body.get("type").is_none() && body["error"]["type"].is_string(), "{body}");
}

/// A stop sequence that ends the answer is reported as Anthropic does: `stop_reason`
/// `stop_sequence` and the string itself, in the message and in the stream's `message_delta`.
#[tokio::test]
async fn a_matched_stop_sequence_is_reported() {
    let server = server();
    let messages = json!([{"role": "user", "content": "tell me"}]);
    let (_, whole) =
        server.post("/v1/messages", json!({"max_tokens": 24, "temperature": 0, "messages": messages})).await;
    let text = text_of(&whole);
    let chars: Vec<char> = text.chars().collect();
    // A two-character piece whose first occurrence is past the start of the answer.
    let (at, stop) = (1..chars.len().saturating_sub(1))
        .map(|i| (i, chars[i..i + 2].iter().collect::<String>()))
        .find(|(i, s)| text.find(s.as_str()) == Some(chars[..*i].iter().map(|c| c.len_utf8()).sum()))
        .unwrap_or_else(|| panic!("no usable stop sequence in {text:?}"));
    let prefix: String = chars[..at].iter().collect();
    let req = json!({"max_tokens": 24, "temperature": 0, "messages": messages, "stop_sequences": ["zzzz-never", stop]});
    let (status, resp) = server.post("/v1/messages", req.clone()).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert_eq!(text_of(&resp), prefix, "the answer ends before the stop sequence");
    assert_eq!(resp["stop_reason"], "stop_sequence", "{resp}");
    assert_eq!(resp["stop_sequence"], stop, "{resp}");
    let mut streamed = req;
    streamed["stream"] = json!(true);
    let events: Vec<Value> = Events::new(server.send(post("/v1/messages", streamed.to_string())).await)
        .all()
        .await
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let delta = events.iter().find(|e| e["type"] == "message_delta").expect("a message_delta event");
    assert_eq!(delta["delta"]["stop_reason"], "stop_sequence", "{delta}");
    assert_eq!(delta["delta"]["stop_sequence"], stop, "{delta}");
    // Without a match the answer ends as before, with no stop sequence.
    assert_eq!(whole["stop_sequence"], Value::Null, "{whole}");
}
