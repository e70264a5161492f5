//! Tool calls and reasoning through the HTTP API in-process, on the mock model: `required`
//! and named tool choices produce calls that parse and match the function's schema (the
//! grammar makes the mock's arbitrary tokens into one), JSON and streamed alike; `auto`
//! finds Hermes calls in the text; the tools reach the template, or a system message when
//! the template shows none; `<think>` blocks become `reasoning_content`; bad tool requests
//! are 400s naming the field.

mod serve_support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{Events, Options, TestServer, chat, error_param, post};

/// A server whose mock model has room for prompts that list tools.
fn server_with(options: Options) -> TestServer {
    TestServer::with(Options { max_context: 2048, ..options })
}

fn plain_server() -> TestServer {
    server_with(Options::default())
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": false
        }
    }})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
                       "required": ["zone"], "additionalProperties": false}
    }})
}

fn check_weather_args(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{arguments:?}: {e}"));
    assert!(args["city"].as_str().is_some_and(|c| c.chars().count() <= 12), "{arguments}");
    assert!(["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()), "{arguments}");
    assert_eq!(args.as_object().unwrap().len(), 2, "{arguments}");
}

fn check_time_args(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{arguments:?}: {e}"));
    assert!(args["zone"].as_i64().is_some_and(|z| (-12..=14).contains(&z)), "{arguments}");
}

/// A streamed chat's content, reasoning, tool calls (merged by index) and finish reason.
async fn stream(server: &TestServer, body: Value) -> (String, String, Vec<(String, String, String)>, String) {
    let mut body = body;
    body["stream"] = json!(true);
    let response = server.send(post("/v1/chat/completions", body.to_string())).await;
    let (mut content, mut reasoning, mut calls, mut finish) = (String::new(), String::new(), Vec::new(), String::new());
    for data in Events::new(response).all().await {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        content.push_str(delta["content"].as_str().unwrap_or(""));
        reasoning.push_str(delta["reasoning_content"].as_str().unwrap_or(""));
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = call["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                let id = call["id"].as_str().expect("a call's first piece has its id").to_owned();
                assert_eq!(call["type"], "function");
                calls.push((id, call["function"]["name"].as_str().unwrap().to_owned(), String::new()));
            }
            calls[i].2.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (content, reasoning, calls, finish)
}

#[tokio::test]
async fn a_named_choice_always_calls_it_with_valid_arguments() {
    let server = plain_server();
    for temperature in [0.0, 1.3] {
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let body = chat(
            "weather in Paris?",
            json!({"tools": [time_tool(), weather_tool()], "tool_choice": named, "max_tokens": 80, "temperature": temperature}),
        );
        let (status, out) = server.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        let message = &out["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null, "{out}");
        let calls = message["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{out}");
        assert_eq!(calls[0]["type"], "function");
        assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        check_weather_args(calls[0]["function"]["arguments"].as_str().unwrap());
        assert_eq!(out["choices"][0]["finish_reason"], "stop", "a forced call ends as OpenAI's do");
        let (content, _, streamed, finish) = stream(&server, body).await;
        assert_eq!(content, "");
        assert_eq!(streamed.len(), 1);
        assert_eq!(streamed[0].1, "get_weather");
        if temperature == 0.0 {
            assert_eq!(streamed[0].2, calls[0]["function"]["arguments"].as_str().unwrap(), "stream and JSON agree");
        }
        check_weather_args(&streamed[0].2);
        assert_eq!(finish, "stop");
    }
}

#[tokio::test]
async fn a_required_choice_makes_calls_of_the_tools() {
    let server = plain_server();
    for (parallel, seed) in [(false, 1), (true, 2), (true, 3)] {
        let body = chat(
            "what now?",
            json!({"tools": [weather_tool(), time_tool()], "tool_choice": "required", "parallel_tool_calls": parallel,
                   "max_tokens": 600, "temperature": 1.0, "seed": seed}),
        );
        let (status, out) = server.post("/v1/chat/completions", body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{out}");
        let calls = out["choices"][0]["message"]["tool_calls"].as_array().unwrap_or_else(|| panic!("{out}"));
        assert!(!calls.is_empty());
        if !parallel {
            assert_eq!(calls.len(), 1, "{out}");
        }
        for call in calls {
            let args = call["function"]["arguments"].as_str().unwrap();
            match call["function"]["name"].as_str().unwrap() {
                "get_weather" => check_weather_args(args),
                "get_time" => check_time_args(args),
                other => panic!("a call of {other}"),
            }
        }
        assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
        let (_, _, streamed, finish) = stream(&server, body).await;
        assert_eq!(streamed.len(), calls.len(), "seeded: the stream makes the same calls");
        assert_eq!(finish, "tool_calls");
    }
}

#[tokio::test]
async fn auto_finds_hermes_calls_in_the_text() {
    let server = plain_server();
    // The grammar stands in for a model that answers with a call.
    let answer = "Sure.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"celsius\"}}\n</tool_call>";
    let body = chat(
        "weather?",
        json!({"tools": [weather_tool()], "max_tokens": 120, "structured_outputs": {"choice": [answer]}}),
    );
    let (status, out) = server.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let message = &out["choices"][0]["message"];
    assert_eq!(message["content"], "Sure.");
    assert_eq!(message["tool_calls"][0]["function"]["name"], "get_weather");
    check_weather_args(message["tool_calls"][0]["function"]["arguments"].as_str().unwrap());
    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
    let (content, _, calls, finish) = stream(&server, body).await;
    assert_eq!((content.as_str(), calls.len(), finish.as_str()), ("Sure.", 1, "tool_calls"));
    // With tool_choice none the same text is content.
    let none = chat(
        "weather?",
        json!({"tools": [weather_tool()], "tool_choice": "none", "max_tokens": 120, "structured_outputs": {"choice": [answer]}}),
    );
    let (_, out) = server.post("/v1/chat/completions", none).await;
    assert_eq!(out["choices"][0]["message"]["content"], answer);
    assert!(out["choices"][0]["message"].get("tool_calls").is_none());
}

#[tokio::test]
async fn tools_reach_the_template_or_a_system_message() {
    let template = "{% if tools %}<|im_start|>system\nTOOLS {{ tools | tojson }}<|im_end|>\n{% endif %}\
                    {% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
                    {% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    let server = server_with(Options { chat_template: Some(template), ..Options::default() });
    let tools = json!([weather_tool()]);
    // `tojson` is Python's `json.dumps`: `, ` and `: ` separators.
    let listed = serde_json::to_string(&tools).unwrap().replace(',', ", ").replace("\":", "\": ");
    let rendered = format!(
        "<|im_start|>system\nTOOLS {listed}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    let (_, out) = server.post("/v1/chat/completions", chat("hi", json!({"tools": tools, "max_tokens": 1}))).await;
    assert_eq!(out["usage"]["prompt_tokens"], server.tokenizer.encode(&rendered, false).unwrap().len(), "{out}");
    // Each engine loop holds a rayon worker while it lives, and a 2-core machine has two:
    // one server at a time per test, as the tests run two at once.
    drop(server);

    // The plain template never reads `tools`: they come as a system message.
    let plain = plain_server();
    let tokens = |out: &Value| out["usage"]["prompt_tokens"].as_u64().unwrap();
    let (_, bare) = plain.post("/v1/chat/completions", chat("hi", json!({"max_tokens": 1}))).await;
    let (_, with) = plain.post("/v1/chat/completions", chat("hi", json!({"tools": tools, "max_tokens": 1}))).await;
    let (_, none) = plain
        .post("/v1/chat/completions", chat("hi", json!({"tools": tools, "tool_choice": "none", "max_tokens": 1})))
        .await;
    assert!(tokens(&with) > tokens(&bare) + 20, "{with} vs {bare}");
    assert_eq!(tokens(&none), tokens(&bare));
    // A conversation with a call and its result renders.
    let turns = json!({"model": "mock-model", "max_tokens": 2, "tools": tools, "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "4 degrees"}
    ]});
    let (status, out) = plain.post("/v1/chat/completions", turns).await;
    assert_eq!(status, StatusCode::OK, "{out}");
}

#[tokio::test]
async fn think_blocks_become_reasoning_content() {
    use met_config::ReasoningParser;
    let server = server_with(Options { reasoning_parser: Some(ReasoningParser::Qwen3), ..Options::default() });
    let answer = "<think>The user greets me.</think>\n\nHello!";
    let body = chat("hi", json!({"max_tokens": 60, "structured_outputs": {"choice": [answer]}}));
    let (status, out) = server.post("/v1/chat/completions", body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{out}");
    let message = &out["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], "The user greets me.");
    assert_eq!(message["content"], "Hello!");
    let (content, reasoning, _, finish) = stream(&server, body).await;
    assert_eq!((content.as_str(), reasoning.as_str(), finish.as_str()), ("Hello!", "The user greets me.", "stop"));
    drop(server); // One engine (and rayon worker) at a time, as above.
    // Without the parser the block stays in the content.
    let plain = plain_server();
    let (_, out) = plain
        .post("/v1/chat/completions", chat("hi", json!({"max_tokens": 60, "structured_outputs": {"choice": [answer]}})))
        .await;
    assert_eq!(out["choices"][0]["message"]["content"], answer);
    assert!(out["choices"][0]["message"].get("reasoning_content").is_none());
}

#[tokio::test]
async fn bad_tool_requests_are_400s_naming_the_field() {
    let server = plain_server();
    let named = |name: &str| json!({"type": "function", "function": {"name": name}});
    let cases = [
        (json!({"tools": [weather_tool()], "tool_choice": named("nope")}), "tool_choice"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"tools": [weather_tool()], "tool_choice": "always"}), "tool_choice"),
        (json!({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}), "tools[0].type"),
        (json!({"tools": [{"type": "function"}]}), "tools[0]"),
        (json!({"tools": [weather_tool(), weather_tool()]}), "tools[1].function.name"),
        (json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}), "tools[0].function.name"),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": [1]}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}], "tool_choice": "required"}),
            "tools",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
    ];
    for (extra, param) in cases {
        let (status, body) = server.post("/v1/chat/completions", chat("hi", extra.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{extra}: {body}");
        assert_eq!(error_param(&body).as_deref(), Some(param), "{extra}: {body}");
    }
}
