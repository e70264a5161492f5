//! `met bench throughput` and `met bench latency` end to end: the binary on a Hugging Face
//! fixture and on dummy weights from a bare config, the JSON result's figures checked for
//! consistency (every token made, steps and phases adding up), and bad flags answered with
//! a message naming the flag.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> String {
    repo().join("crates/model-layers/tests/fixtures/hf").join(name).display().to_string()
}

fn met(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_met")).args(args).env("MET_LOG", "off").output().expect("runs met")
}

/// Runs `met bench ARGS --output FILE` and returns the JSON result.
fn bench(args: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("result.json");
    let mut all = vec!["bench"];
    all.extend(args);
    all.extend(["--output", path.to_str().unwrap()]);
    let out = met(&all);
    assert!(out.status.success(), "met {all:?}: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!String::from_utf8_lossy(&out.stdout).is_empty(), "a summary line is printed");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

#[test]
fn throughput_makes_every_token_and_reports_consistent_rates() {
    let r = bench(&[
        "throughput",
        "--model",
        &fixture("llama"),
        "--num-prompts",
        "12",
        "--input-len",
        "40",
        "--output-len",
        "9",
        "--max-num-seqs",
        "5",
        "--max-prefill-chunk",
        "16",
    ]);
    assert_eq!(r["bench"], "throughput");
    assert_eq!(num(&r, "output_tokens"), 12.0 * 9.0);
    assert_eq!(num(&r, "prompt_tokens"), 12.0 * 40.0);
    let elapsed = num(&r, "elapsed_s");
    assert!(elapsed > 0.0);
    assert!((num(&r, "output_tokens_per_s") - 108.0 / elapsed).abs() < 1e-6 * num(&r, "output_tokens_per_s"));
    assert!((num(&r, "total_tokens_per_s") - 588.0 / elapsed).abs() < 1e-6 * num(&r, "total_tokens_per_s"));
    // 12 requests through 5 slots: the last ones start after others finish, so fewer than
    // all steps are pure decode, and there are at least 9 steps per wave of 5.
    let (steps, decode_steps) = (num(&r, "steps"), num(&r, "decode_steps"));
    assert!(steps >= 27.0 && decode_steps < steps, "{steps} steps, {decode_steps} pure decode");
    for key in ["command_line", "met_version", "date", "machine", "device", "model"] {
        assert!(!r[key].is_null(), "`{key}` is in the result");
    }
    assert_eq!(r["device"], "cpu");
}

#[test]
fn speculation_is_reported_and_keeps_every_token() {
    let base =
        ["throughput", "--model", &fixture("llama"), "--num-prompts", "4", "--input-len", "24", "--output-len", "12"];
    let plain = bench(&base);
    assert!(plain["speculative"].is_null(), "no speculative figures without --speculative");
    let ngram = ["--speculative", "ngram", "--speculative-ngram-min", "1"];
    // The 4 requests run at once: speculation needs the CPU's batch limit raised to 4.
    let r = bench(&[&base[..], &ngram, &["--speculative-max-batch", "4"]].concat());
    assert_eq!(num(&r, "output_tokens"), 4.0 * 12.0);
    let spec = &r["speculative"];
    let (drafts, drafted, accepted) = (num(spec, "drafts"), num(spec, "draft_tokens"), num(spec, "accepted_tokens"));
    assert!(drafts > 0.0 && drafted >= drafts && accepted <= drafted, "{spec}");
    if accepted > 0.0 {
        assert!((num(spec, "tokens_per_step") - (1.0 + accepted / drafts)).abs() < 1e-9, "{spec}");
    }
    // By default the CPU pauses speculation above one running sequence: nothing is drafted,
    // every token still comes.
    let paused = bench(&[&base[..], &ngram].concat());
    assert_eq!(num(&paused, "output_tokens"), 4.0 * 12.0);
    assert_eq!(num(&paused["speculative"], "drafts"), 0.0, "{}", paused["speculative"]);
}

#[test]
fn latency_times_prefill_and_every_decode_step() {
    let r = bench(&[
        "latency",
        "--model",
        &fixture("qwen3"),
        "--batch-size",
        "3",
        "--input-len",
        "33",
        "--output-len",
        "7",
        "--num-iters",
        "2",
        "--num-warmup",
        "1",
    ]);
    assert_eq!(r["bench"], "latency");
    for key in ["prefill_ms", "decode_step_ms", "batch_ms"] {
        let s = &r[key];
        let (mean, p50, p90, p99) = (num(s, "mean"), num(s, "p50"), num(s, "p90"), num(s, "p99"));
        assert!(mean > 0.0 && p50 > 0.0 && p50 <= p90 && p90 <= p99, "{key}: {s}");
    }
    // The 3 prompts fit one step, which makes every first token; then 6 pure decode steps
    // per measured iteration, the warm-up's not counted.
    assert_eq!(num(&r, "decode_steps"), 2.0 * 6.0, "{r}");
    let tok_s = 3.0 * 1e3 / num(&r["decode_step_ms"], "p50");
    assert!((num(&r, "decode_tokens_per_s") - tok_s).abs() < 1e-6 * tok_s, "{r}");
    // The CPU computes synchronously: there is no device wait to split a step's time by.
    assert!(r["decode_host_ms"].is_null(), "{r}");
}

#[test]
fn dummy_weights_from_a_bare_config_run_offline() {
    let config = repo().join("configs/Qwen3-0.6B").display().to_string();
    let r = bench(&[
        "latency",
        "--model",
        &config,
        "--load-format",
        "dummy",
        "--hf-overrides",
        r#"{"num_hidden_layers": 1, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512}"#,
        "--batch-size",
        "2",
        "--input-len",
        "20",
        "--output-len",
        "4",
        "--num-iters",
        "1",
        "--num-warmup",
        "0",
    ]);
    assert!(num(&r, "load_s") >= 0.0 && num(&r["decode_step_ms"], "p50") > 0.0, "{r}");
}

#[test]
fn bad_flags_name_themselves() {
    let model = fixture("qwen3");
    for (args, needle) in [
        (vec!["bench", "throughput", "--model", &model, "--num-prompts", "0"], "--num-prompts"),
        (vec!["bench", "latency", "--model", &model, "--batch-size", "0"], "--batch-size"),
        (vec!["bench", "latency", "--model", &model, "--output-len", "0"], "--output-len"),
        (vec!["bench", "latency", "--model", &model, "--num-iters", "0"], "--num-iters"),
        (vec!["bench", "latency", "--model", &model, "--input-len", "100000"], "context"),
        (vec!["bench", "throughput", "--model", "/no/such/model"], "/no/such/model"),
    ] {
        let out = met(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
