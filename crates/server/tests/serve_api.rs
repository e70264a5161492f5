//! The OpenAI-compatible API in-process (`app(state)` driven with `oneshot`, no sockets)
//! over a real engine on the mock model: chat and completions, JSON and SSE, `n`, seeds,
//! stop strings across token boundaries, logprobs, usage, and the small endpoints.
//!
//! Expected outputs come from `MockModel::reference_greedy`, so each test fails if the
//! server loses, reorders or mis-decodes a token.

mod serve_support;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{Events, MAX_CONTEXT, MODEL, Options, TestServer, chat, completion};

#[tokio::test]
async fn chat_completion_is_the_greedy_continuation_with_usage() {
    let server = TestServer::new();
    let prompt = server.chat_prompt("hello world");
    let expected = server.greedy(&prompt, 12, false);
    let (status, body) = server.post("/v1/chat/completions", chat("hello world", json!({"max_tokens": 12}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], server.text(&expected));
    assert_eq!(choice["finish_reason"], server.finish_reason(&expected));
    assert_eq!(choice["logprobs"], Value::Null);
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], prompt.len(), "the rendered prompt's token count");
    assert_eq!(usage["completion_tokens"], expected.len());
    assert_eq!(usage["total_tokens"], prompt.len() + expected.len());
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
}

#[tokio::test]
async fn cached_tokens_count_prefix_cache_hits() {
    let server = TestServer::new();
    let body = chat("a prompt long enough to fill a few cache blocks", json!({"max_tokens": 2}));
    let (_, first) = server.post("/v1/chat/completions", body.clone()).await;
    let (_, second) = server.post("/v1/chat/completions", body).await;
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "{cached} of {prompt}");
}

#[tokio::test]
async fn completions_take_text_ids_and_several_prompts() {
    let server = TestServer::new();
    let ids = server.tokenizer.encode("the world", true).unwrap();
    let expected = server.text(&server.greedy(&ids, 8, true));
    for prompt in [json!("the world"), json!(ids)] {
        let (status, body) =
            server.post("/v1/completions", completion(prompt, json!({"max_tokens": 8, "ignore_eos": true}))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["object"], "text_completion");
        assert!(body["id"].as_str().unwrap().starts_with("cmpl-"));
        assert_eq!(body["choices"][0]["text"], expected);
        assert_eq!(body["choices"][0]["finish_reason"], "length");
        assert_eq!(body["usage"]["prompt_tokens"], ids.len());
        assert_eq!(body["usage"]["completion_tokens"], 8);
    }
    let other = server.tokenizer.encode("in", true).unwrap();
    let body = completion(json!(["the world", "in"]), json!({"max_tokens": 4, "n": 2, "ignore_eos": true}));
    let (status, body) = server.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "two prompts, two choices each");
    for (i, choice) in choices.iter().enumerate() {
        assert_eq!(choice["index"], i);
        let prompt = if i < 2 { &ids } else { &other };
        assert_eq!(choice["text"], server.text(&server.greedy(prompt, 4, true)), "choice {i}");
    }
    assert_eq!(body["usage"]["prompt_tokens"], ids.len() + other.len());
    assert_eq!(body["usage"]["completion_tokens"], 16);
}

#[tokio::test]
async fn a_chat_stream_ends_with_finish_usage_and_done() {
    let server = TestServer::new();
    let prompt = server.chat_prompt("stream me");
    let expected = server.greedy(&prompt, 10, false);
    let body = chat("stream me", json!({"max_tokens": 10, "stream": true, "stream_options": {"include_usage": true}}));
    let events =
        Events::new(server.send(serve_support::post("/v1/chat/completions", body.to_string())).await).all().await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let id = chunks[0]["id"].clone();
    assert!(chunks.iter().all(|c| c["id"] == id && c["object"] == "chat.completion.chunk" && c["model"] == MODEL));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], expected.len());
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], prompt.len());
    assert!(rest.iter().all(|c| c["usage"].is_null()), "usage is null until the last chunk");
    let (finish, deltas) = rest.split_last().unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], server.finish_reason(&expected));
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    assert!(deltas.iter().all(|c| c["choices"][0]["finish_reason"].is_null()));
    let text: String = deltas.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, server.text(&expected));
}

#[tokio::test]
async fn a_completion_stream_without_usage_has_no_usage_field() {
    let server = TestServer::new();
    let body = completion(json!("the"), json!({"max_tokens": 5, "stream": true, "ignore_eos": true}));
    let events = Events::new(server.send(serve_support::post("/v1/completions", body.to_string())).await).all().await;
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    assert!(chunks.iter().all(|c| c.get("usage").is_none() && c["object"] == "text_completion"));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    let ids = server.tokenizer.encode("the", true).unwrap();
    assert_eq!(text, server.text(&server.greedy(&ids, 5, true)));
}

#[tokio::test]
async fn n_choices_stream_separately_and_are_counted_in_usage() {
    let server = TestServer::new();
    let body = chat(
        "two please",
        json!({"max_tokens": 6, "n": 2, "temperature": 1.0, "seed": 3, "ignore_eos": true, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    let events =
        Events::new(server.send(serve_support::post("/v1/chat/completions", body.to_string())).await).all().await;
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let mut finished = [0, 0];
    for c in &chunks[..chunks.len() - 1] {
        let index = c["choices"][0]["index"].as_u64().unwrap() as usize;
        if !c["choices"][0]["finish_reason"].is_null() {
            finished[index] += 1;
        }
    }
    assert_eq!(finished, [1, 1], "one finish chunk per choice");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 12);
}

#[tokio::test]
async fn a_seed_reproduces_a_sampled_answer() {
    let server = TestServer::new();
    let ask = |seed: u64| {
        let body = chat("sample", json!({"max_tokens": 20, "temperature": 1.0, "seed": seed, "ignore_eos": true}));
        let server = &server;
        async move { server.post("/v1/chat/completions", body).await.1["choices"][0]["message"]["content"].clone() }
    };
    let (a, b, c) = (ask(7).await, ask(7).await, ask(8).await);
    assert_eq!(a, b);
    assert_ne!(a, c, "another seed draws another answer");
}

/// The first place where a two-character string spans two generated tokens, and is not found
/// earlier in the text.
fn straddling_stop(server: &TestServer, ids: &[u32]) -> String {
    let full = server.text(ids);
    for i in 1..ids.len() {
        let (left, right) = (server.text(&ids[i - 1..i]), server.text(&ids[i..=i]));
        let (Some(a), Some(b)) = (left.chars().last(), right.chars().next()) else { continue };
        let stop = format!("{a}{b}");
        let boundary = server.text(&ids[..i]).len();
        if full.find(&stop) == Some(boundary - a.len_utf8()) {
            return stop;
        }
    }
    panic!("no straddling pair in {full:?}");
}

#[tokio::test]
async fn stop_strings_match_across_tokens_and_never_appear() {
    let server = TestServer::new();
    let prompt = server.tokenizer.encode("once upon", true).unwrap();
    let ids = server.greedy(&prompt, 40, true);
    let stop = straddling_stop(&server, &ids);
    let full = server.text(&ids);
    let expected = &full[..full.find(&stop).unwrap()];
    let extra = json!({"max_tokens": 40, "ignore_eos": true, "stop": ["never matches", stop]});
    let (status, body) = server.post("/v1/completions", completion(json!("once upon"), extra.clone())).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["choices"][0]["text"], expected, "stop {stop:?} in {full:?}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let mut stream = extra;
    stream["stream"] = json!(true);
    let request = serve_support::post("/v1/completions", completion(json!("once upon"), stream).to_string());
    let events = Events::new(server.send(request).await).all().await;
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, expected);
    assert!(chunks.iter().all(|c| !c["choices"][0]["text"].as_str().unwrap_or_default().contains(&stop)));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn chat_logprobs_have_openai_shape_and_the_models_values() {
    let server = TestServer::new();
    let prompt = server.chat_prompt("logprobs");
    let body = chat("logprobs", json!({"max_tokens": 5, "ignore_eos": true, "logprobs": true, "top_logprobs": 3}));
    let (status, body) = server.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let content = body["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    let ids = server.greedy(&prompt, 5, true);
    let mut history = prompt.clone();
    for (entry, &id) in content.iter().zip(&ids) {
        let token = server.tokenizer.decode(&[id], false).unwrap();
        assert_eq!(entry["token"], token);
        assert_eq!(entry["bytes"], json!(token.as_bytes()));
        let expected = log_softmax(&server.mock.logits(&history))[id as usize];
        assert!((entry["logprob"].as_f64().unwrap() - f64::from(expected)).abs() < 1e-3, "{entry}");
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert!(top.iter().all(|t| t["token"].is_string() && t["logprob"].is_number() && t["bytes"].is_array()));
        assert_eq!(top[0]["token"], token, "greedy picks the most likely token");
        history.push(id);
    }
}

#[tokio::test]
async fn completion_logprobs_use_the_legacy_shape() {
    let server = TestServer::new();
    let body = completion(json!("the"), json!({"max_tokens": 6, "ignore_eos": true, "logprobs": 2}));
    let (status, body) = server.post("/v1/completions", body).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let lp = &body["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.len(), 6);
    assert_eq!(tokens.concat(), body["choices"][0]["text"].as_str().unwrap());
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 6);
    let tops = lp["top_logprobs"].as_array().unwrap();
    assert!(tops.iter().all(|t| t.as_object().is_some_and(|m| (1..=2).contains(&m.len()))));
    let offsets: Vec<u64> = lp["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    let mut at = 0;
    for (offset, token) in offsets.iter().zip(&tokens) {
        assert_eq!(*offset, at);
        at += token.chars().count() as u64;
    }
}

#[tokio::test]
async fn max_tokens_one_gives_one_token() {
    let server = TestServer::new();
    for (path, body) in [
        ("/v1/chat/completions", chat("one", json!({"max_tokens": 1, "ignore_eos": true}))),
        ("/v1/completions", completion(json!("one"), json!({"max_tokens": 1, "ignore_eos": true}))),
        ("/v1/chat/completions", chat("one", json!({"max_completion_tokens": 1, "ignore_eos": true}))),
    ] {
        let (status, body) = server.post(path, body).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["usage"]["completion_tokens"], 1, "{path}");
        assert_eq!(body["choices"][0]["finish_reason"], "length");
    }
}

#[tokio::test]
async fn without_max_tokens_generation_may_fill_the_context() {
    let server = TestServer::new();
    let (status, body) = server.post("/v1/completions", completion(json!("fill"), json!({"ignore_eos": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let prompt = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert_eq!(body["usage"]["completion_tokens"], MAX_CONTEXT - prompt);
}

#[tokio::test]
async fn tokenize_and_detokenize_round_trip() {
    let server = TestServer::new();
    let (status, body) = server.post("/tokenize", json!({"prompt": "hello there world"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let tokens = body["tokens"].clone();
    assert_eq!(tokens, json!(server.tokenizer.encode("hello there world", true).unwrap()));
    assert_eq!(body["count"], tokens.as_array().unwrap().len());
    assert_eq!(body["max_model_len"], MAX_CONTEXT);
    let (status, body) = server.post("/detokenize", json!({"tokens": tokens})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["prompt"], "hello there world");
    let (_, body) = server.post("/tokenize", json!({"messages": [{"role": "user", "content": "hi"}]})).await;
    assert_eq!(body["tokens"], json!(server.chat_prompt("hi")));
}

#[tokio::test]
async fn models_health_and_metrics() {
    let server = TestServer::starting(Options::default());
    let (status, _) = server.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    server.state.set_ready(true);
    let (status, _) = server.get("/health").await;
    assert_eq!(status, StatusCode::OK);

    let (status, body) = server.get("/v1/models").await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");

    server.post("/v1/chat/completions", chat("count me", json!({"max_tokens": 2}))).await;
    server.post("/v1/chat/completions", json!({"messages": []})).await;
    let response = server.send(axum::http::Request::get("/metrics").body(axum::body::Body::empty()).unwrap()).await;
    let content_type = response.headers()["content-type"].to_str().unwrap().to_owned();
    assert_eq!(content_type, met_telemetry::metrics::CONTENT_TYPE);
    // The engine records a request's totals just after its last event.
    server
        .eventually("the request's totals are recorded", |s| {
            s.metrics.render().contains("met_request_duration_seconds_count 1")
        })
        .await;
    let text = server.get("/metrics").await.1;
    for line in [
        r#"met_http_requests_total{endpoint="/v1/chat/completions",status="200"} 1"#,
        r#"met_http_requests_total{endpoint="/v1/chat/completions",status="400"} 1"#,
        r#"met_http_requests_total{endpoint="/health",status="503"} 1"#,
        r#"met_http_requests_total{endpoint="/v1/models",status="200"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    for histogram in [
        "met_time_to_first_token_seconds_count 1",
        "met_inter_token_latency_seconds_count",
        "met_request_duration_seconds_count 1",
        "met_request_prompt_tokens_count 1",
        "met_request_generation_tokens_count 1",
        "met_kv_blocks_used",
    ] {
        assert!(text.contains(histogram), "missing {histogram} in\n{text}");
    }
}

/// The value of the unlabelled sample `name` in a Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    let line = text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' '));
    line.unwrap_or_else(|| panic!("no {name} in\n{text}")).trim().parse().unwrap()
}

/// With speculation on, `/metrics` reports the drafts' counters and, consistent with them,
/// the acceptance rate and the tokens a verifying step yields.
#[tokio::test]
async fn metrics_report_speculative_acceptance() {
    // Prompt lookup of single tokens, so the mock's short-period output gets proposals.
    let speculative =
        met_speculative::SpeculativeConfig { ngram_min: 1, ..met_speculative::SpeculativeConfig::ngram(4) };
    let server = TestServer::with(Options { speculative: Some(speculative), ..Options::default() });
    let body = chat("repeat repeat repeat repeat", json!({"max_tokens": 48, "ignore_eos": true}));
    let (status, _) = server.post("/v1/chat/completions", body).await;
    assert_eq!(status, StatusCode::OK);
    server
        .eventually("the request's totals are recorded", |s| {
            s.metrics.render().contains("met_request_duration_seconds_count 1")
        })
        .await;
    let text = server.get("/metrics").await.1;
    let drafts = sample(&text, "met_spec_decode_drafts_total");
    let drafted = sample(&text, "met_spec_decode_draft_tokens_total");
    let accepted = sample(&text, "met_spec_decode_accepted_tokens_total");
    assert!(drafts > 0.0 && drafted >= drafts && accepted <= drafted, "{text}");
    let rate = sample(&text, "met_spec_decode_acceptance_rate");
    let per_step = sample(&text, "met_spec_decode_tokens_per_step");
    assert!((rate - accepted / drafted).abs() < 1e-9, "{text}");
    assert!((per_step - (1.0 + accepted / drafts)).abs() < 1e-9, "{text}");
}

fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f32 = logits.iter().map(|l| (l - max).exp()).sum();
    logits.iter().map(|l| l - max - sum.ln()).collect()
}

/// `priority` through the API: with one sequence at a time and a request holding it, a
/// later request with a lower priority value is served before an earlier one under
/// `--policy priority`, while FCFS serves them in arrival order; a server without priority
/// scheduling refuses a non-zero priority, as vLLM does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_policy_serves_the_more_urgent_request_first() {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    for priority_policy in [true, false] {
        let faults = met_scheduler::mock::Faults { step_delay: Some(Duration::from_millis(3)), ..Default::default() };
        let server = Arc::new(TestServer::with(Options {
            priority_policy,
            max_num_seqs: Some(1),
            faults,
            ..Options::default()
        }));
        let waiting =
            |n: usize| move |s: &TestServer| s.metrics.render().contains(&format!("met_requests_waiting {n}\n"));
        let done = Arc::new(Mutex::new(Vec::new()));
        let send = |name: &'static str, max_tokens: usize, priority: i64| {
            let (server, done) = (Arc::clone(&server), Arc::clone(&done));
            let mut extra = json!({"max_tokens": max_tokens, "ignore_eos": true});
            if priority != 0 {
                extra["priority"] = json!(priority);
            }
            tokio::spawn(async move {
                let (status, body) = server.post("/v1/completions", completion(json!([1, 2, 3]), extra)).await;
                assert_eq!(status, StatusCode::OK, "{name}: {body}");
                done.lock().unwrap().push(name);
            })
        };
        // The first request holds the only seat for 60 slow steps.
        let first = send("first", 60, 0);
        server.eventually("the first request runs", |s| s.metrics.render().contains("met_requests_running 1\n")).await;
        let (early, urgent) = if priority_policy { (5, -1) } else { (0, 0) };
        // Each later request generates for 20 slow steps (60 ms), so the order in which the
        // clients read their responses is the order they were served in, even when a loaded
        // machine delivers a finished response a few steps late.
        let early = send("early", 20, early);
        server.eventually("the early request waits", waiting(1)).await;
        let urgent = send("urgent", 20, urgent);
        server.eventually("both wait", waiting(2)).await;
        for task in [first, early, urgent] {
            task.await.unwrap();
        }
        let order = done.lock().unwrap().clone();
        let want = if priority_policy { ["first", "urgent", "early"] } else { ["first", "early", "urgent"] };
        assert_eq!(order, want, "priority policy {priority_policy}");
    }

    let server = TestServer::new();
    let (status, body) =
        server.post("/v1/completions", completion(json!([1, 2, 3]), json!({"max_tokens": 2, "priority": 3}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["param"], "priority", "{body}");
}
