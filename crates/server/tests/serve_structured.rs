//! Structured output through the HTTP API in-process, on the mock model: `response_format`
//! and vLLM's `structured_outputs` hold every choice's text to its schema, expression,
//! choices or grammar (JSON and streamed, greedy and sampled, `n > 1`), and every bad
//! grammar is a 400 naming the field. The mock's own continuation is nothing like JSON, so
//! each check fails unless the masks reach the sampler.

mod serve_support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{Events, TestServer, chat, completion, error_param, post};

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "pet": {"enum": ["cat", "dog", null]}
        },
        "required": ["name", "age", "pet"],
        "additionalProperties": false
    })
}

fn check_person(text: &str) {
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let o = v.as_object().unwrap_or_else(|| panic!("{text}"));
    assert_eq!(o.len(), 3, "{text}");
    assert!(o["name"].as_str().is_some_and(|s| s.chars().count() <= 8), "{text}");
    assert!(o["age"].as_u64().is_some_and(|a| a <= 150), "{text}");
    assert!(["cat", "dog"].contains(&o["pet"].as_str().unwrap_or("cat")) || o["pet"].is_null(), "{text}");
}

fn contents(body: &Value) -> Vec<String> {
    body["choices"].as_array().unwrap().iter().map(|c| c["message"]["content"].as_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn json_schema_output_parses_and_validates_greedy_and_sampled() {
    let server = TestServer::new();
    let format =
        json!({"type": "json_schema", "json_schema": {"name": "person", "schema": person_schema(), "strict": true}});
    for extra in [json!({"temperature": 0}), json!({"temperature": 1.0, "seed": 5, "n": 3})] {
        let mut body = chat("describe someone", json!({"response_format": format, "max_tokens": 200}));
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let (status, body) = server.post("/v1/chat/completions", body).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        for (text, choice) in contents(&body).iter().zip(body["choices"].as_array().unwrap()) {
            check_person(text);
            assert_eq!(choice["finish_reason"], "stop", "{body}");
        }
    }
    // Without the format the mock's text is no JSON at all.
    let (_, free) = server.post("/v1/chat/completions", chat("describe someone", json!({"max_tokens": 40}))).await;
    assert!(serde_json::from_str::<Value>(&contents(&free)[0]).is_err(), "{free}");
}

#[tokio::test]
async fn json_object_and_streamed_json_schema_parse() {
    let server = TestServer::new();
    let (status, body) = server
        .post(
            "/v1/completions",
            completion(json!("x"), json!({"response_format": {"type": "json_object"}, "max_tokens": 200})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let text = body["choices"][0]["text"].as_str().unwrap();
    // A free-form object may be cut by max_tokens; when it ends by itself it parses.
    if body["choices"][0]["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text}");
    } else {
        assert!(text.starts_with('{'), "{text}");
    }
    let format = json!({"type": "json_schema", "json_schema": {"name": "p", "schema": person_schema()}});
    let req = chat("someone", json!({"response_format": format, "stream": true, "max_tokens": 200}));
    let response = server.send(post("/v1/chat/completions", req.to_string())).await;
    let mut text = String::new();
    for data in Events::new(response).all().await {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    check_person(&text);
}

#[tokio::test]
async fn structured_outputs_regex_choice_and_grammar_hold() {
    let server = TestServer::new();
    let cases = [
        (json!({"regex": "[a-c]{3}-[0-9]{2}"}), "regex"),
        (json!({"choice": ["alpha", "beta", "gamma delta"]}), "choice"),
        (json!({"grammar": "start: \"(\" NUM (\"+\" NUM)* \")\"\nNUM: /[0-9]/"}), "grammar"),
        (json!({"json": serde_json::to_string(&person_schema()).unwrap()}), "json"),
    ];
    for (outputs, kind) in cases {
        for temperature in [0.0, 1.2] {
            let req = chat("go", json!({"structured_outputs": outputs, "max_tokens": 60, "temperature": temperature}));
            let (status, body) = server.post("/v1/chat/completions", req).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            let text = &contents(&body)[0];
            let ok = match kind {
                "regex" => {
                    text.len() == 6
                        && text[..3].chars().all(|c| ('a'..='c').contains(&c))
                        && &text[3..4] == "-"
                        && text[4..].chars().all(|c| c.is_ascii_digit())
                }
                "choice" => ["alpha", "beta", "gamma delta"].contains(&text.as_str()),
                "grammar" => {
                    text.starts_with('(')
                        && text.ends_with(')')
                        && text[1..text.len() - 1]
                            .split('+')
                            .all(|n| n.len() == 1 && n.chars().all(|c| c.is_ascii_digit()))
                }
                _ => {
                    check_person(text);
                    true
                }
            };
            assert!(ok, "{kind}: {text:?}");
            assert_eq!(body["choices"][0]["finish_reason"], "stop", "{kind}: {body}");
        }
    }
}

#[tokio::test]
async fn bad_structured_requests_are_400s_naming_the_field() {
    let server = TestServer::new();
    let schema =
        |s: Value| json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}});
    let cases = [
        (schema(json!({"type": "integr"})), "response_format.json_schema.schema"),
        (schema(json!({"type": "integer", "minimum": 3, "maximum": 1})), "response_format.json_schema.schema"),
        (schema(json!([1, 2])), "response_format.json_schema.schema"),
        (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema.schema"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
        (json!({"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs.regex"),
        (json!({"structured_outputs": {"grammar": "start: ( ("}}), "structured_outputs.grammar"),
        (json!({"structured_outputs": {"choice": []}}), "structured_outputs.choice"),
        (json!({"structured_outputs": {"json": "{not json"}}), "structured_outputs.json"),
        (json!({"structured_outputs": {"regex": "a", "choice": ["a"]}}), "structured_outputs"),
        (json!({"structured_outputs": {}}), "structured_outputs"),
        (
            json!({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}),
            "structured_outputs",
        ),
        (json!({"response_format": "json"}), "response_format"),
    ];
    for (extra, param) in cases {
        let (status, body) = server.post("/v1/chat/completions", chat("hi", extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {body}");
        assert_eq!(error_param(&body).as_deref(), Some(param), "{extra}: {body}");
    }
    // Nothing was left running.
    let (status, _) = server.post("/v1/chat/completions", chat("hi", json!({"max_tokens": 2}))).await;
    assert_eq!(status, StatusCode::OK);
}
