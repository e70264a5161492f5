//! LoRA serving (issue 35): adapters loaded and unloaded through vLLM's routes, listed by
//! `/v1/models` under the base model, picked by a request's `model`, counted on
//! `/metrics`; every bad load a 400 or 404 naming what is wrong; a stream running through
//! an adapter that is unloaded finishes unchanged, holding the adapter until it ends. The
//! bad flags are refused by `met serve` before it loads anything.
//!
//! The adapters are the llama fixture's (`model-layers/tests/fixtures/lora`); the mock
//! model's outputs do not depend on them, so what changes with an adapter is tested in
//! `model-layers` and `scheduler`, and through the real model by the live suite.

mod serve_support;

use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};
use serve_support::{
    Events, LoraLimitsForTest, MODEL, Options, TestServer, adapter_dir, chat, completion, error_param, post,
};

fn server(max_loras: usize, max_rank: usize) -> TestServer {
    TestServer::with(Options { lora: Some(LoraLimitsForTest { max_loras, max_rank }), ..Options::default() })
}

/// POSTs `body` to a LoRA route: the status and the body's text.
async fn send(server: &TestServer, path: &str, body: Value) -> (StatusCode, String) {
    let response = server.send(post(path, body.to_string())).await;
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

async fn load(server: &TestServer, name: &str, dir: &str) -> (StatusCode, String) {
    let path = adapter_dir(dir).display().to_string();
    send(server, "/v1/load_lora_adapter", json!({"lora_name": name, "lora_path": path})).await
}

async fn unload(server: &TestServer, name: &str) -> (StatusCode, String) {
    send(server, "/v1/unload_lora_adapter", json!({"lora_name": name})).await
}

/// Checks an OpenAI-shaped error of `status` whose message says `says`; returns its `param`.
fn expect_error(answer: (StatusCode, String), status: StatusCode, says: &str) -> Option<String> {
    assert_eq!(answer.0, status, "{}", answer.1);
    let body: Value = serde_json::from_str(&answer.1).unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains(says), "{body}");
    error_param(&body)
}

fn loaded_gauge(server: &TestServer) -> i64 {
    server.metrics.lora_adapters_loaded.get()
}

#[tokio::test]
async fn adapters_load_list_serve_and_unload() {
    let server = server(2, 16);
    assert_eq!(loaded_gauge(&server), 0);
    let (status, text) = load(&server, "sql", "r8").await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(text, "Success: LoRA adapter 'sql' added successfully.");
    assert_eq!(load(&server, "chat", "r16_rslora").await.0, StatusCode::OK);
    assert_eq!(loaded_gauge(&server), 2);
    assert!(server.get("/metrics").await.1.contains("met_lora_adapters_loaded 2"));

    let models: Value = serde_json::from_str(&server.get("/v1/models").await.1).unwrap();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [MODEL, "sql", "chat"], "the base model first: {models}");
    assert!(models["data"][0].get("parent").is_none(), "{models}");
    assert_eq!(models["data"][1]["parent"], MODEL);
    assert_eq!(models["data"][1]["root"], adapter_dir("r8").display().to_string());

    for (path, body) in [
        ("/v1/chat/completions", chat("hi", json!({"model": "sql", "max_tokens": 3}))),
        ("/v1/completions", completion(json!("hi"), json!({"model": "chat", "max_tokens": 3}))),
    ] {
        let (status, answer) = server.post(path, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["model"], body["model"], "the answer names the adapter");
    }
    let (status, text) = unload(&server, "sql").await;
    assert_eq!((status, text.as_str()), (StatusCode::OK, "Success: LoRA adapter 'sql' removed successfully."));
    assert_eq!(loaded_gauge(&server), 1);
    let (status, body) = server.post("/v1/chat/completions", chat("hi", json!({"model": "sql"}))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    // The name is free again.
    assert_eq!(load(&server, "sql", "r8").await.0, StatusCode::OK);
}

/// vLLM's `load_inplace` replaces the adapter of a name (its path and weights), where a
/// plain load of a taken name is refused naming the way.
#[tokio::test]
async fn load_inplace_replaces_an_adapter() {
    let server = server(1, 16);
    assert_eq!(load(&server, "sql", "r8").await.0, StatusCode::OK);
    let again = load(&server, "sql", "r16_rslora").await;
    assert_eq!(expect_error(again, StatusCode::BAD_REQUEST, "load_inplace").as_deref(), Some("lora_name"));
    let path = adapter_dir("r16_rslora").display().to_string();
    let body = json!({"lora_name": "sql", "lora_path": path, "load_inplace": true});
    let (status, text) = send(&server, "/v1/load_lora_adapter", body).await;
    assert_eq!(status, StatusCode::OK, "{text}");
    assert_eq!(loaded_gauge(&server), 1, "replaced, not added");
    let models: Value = serde_json::from_str(&server.get("/v1/models").await.1).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 2, "{models}");
    assert_eq!(models["data"][1]["root"], path, "{models}");
    // In place of nothing, it loads as a plain load does, within --max-loras.
    let body = json!({"lora_name": "chat", "lora_path": path, "load_inplace": true});
    expect_error(send(&server, "/v1/load_lora_adapter", body).await, StatusCode::BAD_REQUEST, "--max-loras");
    let (status, answer) =
        server.post("/v1/completions", completion(json!("hi"), json!({"model": "sql", "max_tokens": 3}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

#[tokio::test]
async fn bad_loads_and_unloads_name_what_is_wrong() {
    let server = server(2, 8);
    let missing = send(&server, "/v1/load_lora_adapter", json!({"lora_name": "x", "lora_path": "/no/such/dir"})).await;
    let param = expect_error(missing, StatusCode::BAD_REQUEST, "/no/such/dir/adapter_config.json");
    assert_eq!(param.as_deref(), Some("lora_path"));
    let over = expect_error(load(&server, "big", "r16_rslora").await, StatusCode::BAD_REQUEST, "--max-lora-rank 8");
    assert_eq!(over.as_deref(), Some("lora_path"));
    assert_eq!(load(&server, "sql", "r8").await.0, StatusCode::OK);
    let dup = expect_error(load(&server, "sql", "r8").await, StatusCode::BAD_REQUEST, "`sql` is already loaded");
    assert_eq!(dup.as_deref(), Some("lora_name"));
    expect_error(load(&server, MODEL, "r8").await, StatusCode::BAD_REQUEST, "the base model's name");
    expect_error(load(&server, " ", "r8").await, StatusCode::BAD_REQUEST, "`lora_name` is empty");
    assert_eq!(load(&server, "sql2", "r8").await.0, StatusCode::OK);
    expect_error(load(&server, "sql3", "r8").await, StatusCode::BAD_REQUEST, "--max-loras");
    let unknown = expect_error(unload(&server, "nope").await, StatusCode::NOT_FOUND, "no LoRA adapter named `nope`");
    assert_eq!(unknown.as_deref(), Some("lora_name"));
    let no_name = send(&server, "/v1/load_lora_adapter", json!({"lora_path": "/x"})).await;
    expect_error(no_name, StatusCode::BAD_REQUEST, "lora_name");
    // Nothing else changed: the two good adapters still serve.
    assert_eq!(loaded_gauge(&server), 2);
    let (status, body) = server.post("/v1/chat/completions", chat("hi", json!({"model": "sql2"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn without_lora_the_routes_do_not_exist() {
    let server = TestServer::new();
    let answer = load(&server, "sql", "r8").await;
    assert_eq!(expect_error(answer, StatusCode::NOT_FOUND, "no route"), None);
    let models: Value = serde_json::from_str(&server.get("/v1/models").await.1).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");
}

#[tokio::test]
async fn an_unloaded_adapter_lives_until_its_streams_end() {
    // A small stream buffer: the request waits for the reader instead of finishing.
    let server = TestServer::with(Options {
        stream_capacity: 2,
        lora: Some(LoraLimitsForTest { max_loras: 1, max_rank: 16 }),
        ..Options::default()
    });
    assert_eq!(load(&server, "sql", "r8").await.0, StatusCode::OK);
    let adapter = server.state.lora().unwrap().get("sql").unwrap();
    let prompt = server.chat_prompt("a long story");
    let want = server.text(&server.greedy(&prompt, 24, true));
    let body = chat("a long story", json!({"model": "sql", "max_tokens": 24, "ignore_eos": true, "stream": true}));
    let mut events = Events::new(server.send(post("/v1/chat/completions", body.to_string())).await);
    let mut text = String::new();
    let mut add = |data: &str| {
        let chunk: Value = serde_json::from_str(data).unwrap_or(Value::Null);
        text.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or_default());
    };
    add(&events.next().await.unwrap());
    assert_eq!(unload(&server, "sql").await.0, StatusCode::OK);
    assert!(Arc::strong_count(&adapter) > 1, "the running request still holds the adapter");
    // The slot is free for another adapter while the stream runs.
    assert_eq!(load(&server, "other", "r8").await.0, StatusCode::OK);
    for data in events.all().await {
        add(&data);
    }
    assert_eq!(text, want, "the stream ran to its end unchanged");
    server.eventually("the finished request lets the adapter go", |_| Arc::strong_count(&adapter) == 1).await;
}

/// `met serve` with `args`: its exit status and what it printed.
fn serve(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_met"))
        .arg("serve")
        .args(args)
        .env("MET_LOG", "off")
        .output()
        .expect("runs met");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn bad_lora_flags_are_refused_naming_the_flag() {
    for (args, says) in [
        (&["--lora-modules", "a=/x"][..], "--lora-modules: needs --enable-lora"),
        (&["--max-loras", "2"][..], "--max-loras: needs --enable-lora"),
        (&["--enable-lora", "--max-loras", "0"][..], "--max-loras: must be positive"),
        (&["--enable-lora", "--max-lora-rank", "0"][..], "--max-lora-rank: must be positive"),
        (&["--enable-lora", "--lora-modules", "a=/x", "a=/y"][..], "`a` is given twice"),
        (&["--enable-lora", "--lora-modules", "a"][..], "NAME=PATH"),
        (&["--enable-lora", "--max-loras", "1", "--lora-modules", "a=/x", "b=/y"][..], "--max-loras is 1"),
        (&["--enable-lora", "--tensor-parallel-size", "2"][..], "--enable-lora: not available"),
    ] {
        let (ok, stderr) = serve(args);
        assert!(!ok && stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_bad_startup_adapter_stops_met_serve_naming_it() {
    let Some(model) = met_config::default_model_for_test() else { return };
    let model = model.display().to_string();
    let args = ["--port", "0", "--enable-lora", "--lora-modules", "bad=/no/such/adapter", "--model", &model];
    let (ok, stderr) = serve(&args);
    assert!(!ok, "{stderr}");
    assert!(stderr.contains("--lora-modules bad=/no/such/adapter"), "{stderr}");
    assert!(stderr.contains("/no/such/adapter/adapter_config.json"), "{stderr}");
}

/// Every family takes adapters now, the hybrids (gated attention, shared and routed
/// experts) included.
#[test]
fn every_family_passes_the_startup_check() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/hf");
    let target = |name: &str| met_server::serve::AdapterTarget {
        model: met_model_layers::models::read_config(&fixtures.join(name).join("config.json")).unwrap(),
        backend: Arc::new(met_kernels::CpuBackend::new()),
        limits: met_model_layers::lora::LoraLimits { max_rank: 16 },
    };
    for name in ["llama", "qwen3_moe", "qwen3_5", "qwen3_5_moe", "qwen3_next"] {
        assert!(target(name).check().is_ok(), "{name}");
    }
}
