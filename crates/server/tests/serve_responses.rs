//! The Responses API in-process, on the mock model: answers equal the chat path's for the
//! same conversation (instructions, input items, a stored previous response), streams are
//! the typed events in order whose deltas add up to the answer, function tools come back as
//! `function_call` items and go on with `function_call_output`, `text.format` holds the
//! output to a schema, and errors name this API's fields.

mod serve_support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{Events, Options, TestServer, error_param, post};

fn server() -> TestServer {
    TestServer::with(Options { max_context: 2048, ..Options::default() })
}

fn output_text(resp: &Value) -> String {
    let items = resp["output"].as_array().unwrap_or_else(|| panic!("{resp}"));
    let messages = items.iter().filter(|i| i["type"] == "message");
    messages
        .flat_map(|m| m["content"].as_array().unwrap().iter().map(|c| c["text"].as_str().unwrap().to_owned()))
        .collect()
}

async fn chat_text(server: &TestServer, messages: Value, max_tokens: u64) -> (String, Value) {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let (status, out) = server.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    (out["choices"][0]["message"]["content"].as_str().unwrap().to_owned(), out)
}

#[tokio::test]
async fn an_answer_equals_the_chat_answer_for_the_same_conversation() {
    let server = server();
    let req = json!({"input": "hello world", "instructions": "be brief", "max_output_tokens": 12, "temperature": 0});
    let (status, resp) = server.post("/v1/responses", req).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    assert!(resp["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(resp["object"], "response");
    let messages = json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]);
    let (want, chat) = chat_text(&server, messages, 12).await;
    assert_eq!(output_text(&resp), want);
    assert_eq!(resp["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    assert_eq!(resp["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
    let status = if chat["choices"][0]["finish_reason"] == "length" { "incomplete" } else { "completed" };
    assert_eq!(resp["status"], status, "{resp}");
    // Items as input: a developer message and text parts.
    let items = json!([{"role": "developer", "content": "be brief"},
                       {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello world"}]}]);
    let (_, again) =
        server.post("/v1/responses", json!({"input": items, "max_output_tokens": 12, "temperature": 0})).await;
    assert_eq!(output_text(&again), want);
}

#[tokio::test]
async fn a_stream_is_the_typed_events_adding_up_to_the_answer() {
    let server = server();
    let req = json!({"input": "tell me", "max_output_tokens": 10, "temperature": 0, "stream": true});
    let response = server.send(post("/v1/responses", req.to_string())).await;
    let events: Vec<Value> =
        Events::new(response).all().await.iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(&kinds[..2], ["response.created", "response.in_progress"]);
    assert_eq!(*kinds.last().unwrap(), "response.completed");
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let done = events.iter().find(|e| e["type"] == "response.output_text.done").unwrap();
    assert_eq!(done["text"], deltas);
    let completed = &events.last().unwrap()["response"];
    assert_eq!(output_text(completed), deltas);
    let (want, _) = chat_text(&server, json!([{"role": "user", "content": "tell me"}]), 10).await;
    assert_eq!(deltas, want);
}

#[tokio::test]
async fn previous_response_id_continues_the_stored_conversation() {
    let server = server();
    let (_, first) =
        server.post("/v1/responses", json!({"input": "one", "max_output_tokens": 6, "temperature": 0})).await;
    let id = first["id"].as_str().unwrap();
    let req = json!({"input": "two", "previous_response_id": id, "max_output_tokens": 6, "temperature": 0});
    let (status, second) = server.post("/v1/responses", req).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let messages = json!([{"role": "user", "content": "one"}, {"role": "assistant", "content": output_text(&first)},
                          {"role": "user", "content": "two"}]);
    let (want, chat) = chat_text(&server, messages, 6).await;
    assert_eq!(output_text(&second), want);
    assert_eq!(second["usage"]["input_tokens"], chat["usage"]["prompt_tokens"]);
    let (status, missing) =
        server.post("/v1/responses", json!({"input": "x", "previous_response_id": "resp_nope"})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");
    assert_eq!(error_param(&missing).as_deref(), Some("previous_response_id"));
}

#[tokio::test]
async fn function_tools_and_text_formats_hold() {
    let server = server();
    let tool = json!({"type": "function", "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string", "maxLength": 10}}, "required": ["city"], "additionalProperties": false}});
    let req = json!({"input": "weather?", "tools": [tool], "tool_choice": {"type": "function", "name": "get_weather"},
                     "max_output_tokens": 60});
    let (status, resp) = server.post("/v1/responses", req).await;
    assert_eq!(status, StatusCode::OK, "{resp}");
    let call = resp["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap_or_else(|| panic!("{resp}"));
    assert_eq!(call["name"], "get_weather");
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{call}");
    let items = json!([{"role": "user", "content": "weather?"}, call,
                       {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}]);
    let (status, next) =
        server.post("/v1/responses", json!({"input": items, "tools": [tool], "max_output_tokens": 4})).await;
    assert_eq!(status, StatusCode::OK, "{next}");
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": false});
    let format = json!({"format": {"type": "json_schema", "name": "r", "schema": schema, "strict": true}});
    let (_, out) = server.post("/v1/responses", json!({"input": "ok?", "text": format, "max_output_tokens": 40})).await;
    let v: Value = serde_json::from_str(&output_text(&out)).unwrap_or_else(|e| panic!("{out}: {e}"));
    assert!(v["ok"].is_boolean());
}

#[tokio::test]
async fn errors_name_this_apis_fields() {
    let server = server();
    let bad_schema = json!({"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}});
    let cases = [
        (json!({"max_output_tokens": 4}), "input"),
        (json!({"input": 5}), "input"),
        (json!({"input": [{"type": "image", "url": "x"}]}), "input[0].type"),
        (json!({"input": "x", "max_output_tokens": 0}), "max_output_tokens"),
        (json!({"input": "x", "text": bad_schema}), "text.format.schema"),
        (json!({"input": "x", "temperature": -1}), "temperature"),
    ];
    for (req, param) in cases {
        let (status, body) = server.post("/v1/responses", req.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{req}: {body}");
        assert_eq!(error_param(&body).as_deref(), Some(param), "{req}: {body}");
    }
}
