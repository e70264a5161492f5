//! The embedded default model (SmolLM2-135M-Instruct, Q4_1 GGUF) end to end against the
//! transformers reference in `tests/fixtures/smollm2/reference.json` (made by
//! `scripts/smollm2_reference.py`): greedy 32-token continuations of every chat case, all
//! in one batch, and the `--chat` and `tokenize` paths from text. Skipped with a note
//! when the model is not installed; `cargo xtask test` installs it and makes it required.
//! Generation runs with exact CPU dots (`--quant-dots exact`), the path that equals
//! transformers; `default_model_int8.rs` checks the integer dots against both.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn met(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_met")).args(args).env("MET_LOG", "off").output().expect("runs met");
    assert!(out.status.success(), "met {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

fn join(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn greedy_continuations_equal_transformers() {
    let Some(model) = met_config::default_model_for_test() else { return };
    let reference = reference();
    let cases = reference["chat"].as_array().unwrap();
    let mut args = vec![
        "generate".to_string(),
        "--quant-dots".into(),
        "exact".into(),
        "--model".into(),
        model.display().to_string(),
    ];
    for case in cases {
        args.extend(["--prompt-ids".into(), join(&ids(&case["prompt_ids"]))]);
    }
    args.extend(["--max-tokens", "32", "--json"].map(String::from));
    let out = met(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), cases.len());
    for (line, case) in lines.iter().zip(cases) {
        let name = case["name"].as_str().unwrap();
        assert_eq!(ids(&line["generated_ids"]), ids(&case["generated_ids"]), "{name}: generated ids");
        assert_eq!(line["text"], case["generated_text"], "{name}: text");
        let stopped = line["finish_reason"] == "stop";
        assert_eq!(stopped, case["stopped_at_eos"].as_bool().unwrap(), "{name}: stop at EOS");
    }
}

#[test]
fn chat_from_text_renders_tokenizes_and_answers_like_transformers() {
    let Some(model) = met_config::default_model_for_test() else { return };
    let reference = reference();
    let case = reference["chat"].as_array().unwrap().iter().find(|c| c["name"] == "user_capital").unwrap();
    let question = case["messages"][0]["content"].as_str().unwrap();
    let model = model.display().to_string();
    let line: Value = serde_json::from_str(&met(&[
        "generate",
        "--quant-dots",
        "exact",
        "--model",
        &model,
        "--chat",
        question,
        "--json",
    ]))
    .unwrap();
    assert_eq!(ids(&line["prompt_ids"]), ids(&case["prompt_ids"]), "template + tokenizer");
    // Without --model, the default model answers, in plain text.
    assert_eq!(
        met(&["generate", "--quant-dots", "exact", "--chat", question, "--max-tokens", "32"]).trim(),
        case["generated_text"].as_str().unwrap()
    );
}

#[test]
fn tokenize_equals_transformers_both_ways() {
    let Some(model) = met_config::default_model_for_test() else { return };
    let model = model.display().to_string();
    for case in reference()["tokenize"].as_array().unwrap().iter().take(12) {
        let text = case["text"].as_str().unwrap();
        if text.is_empty() {
            continue;
        }
        let got: Vec<u64> = serde_json::from_str(&met(&["tokenize", "--model", &model, "--", text])).unwrap();
        assert_eq!(got, ids(&case["ids_add_special_tokens"]), "{text:?}");
        let decoded = met(&["tokenize", "--model", &model, "--decode", &join(&got)]);
        assert_eq!(decoded.strip_suffix('\n').unwrap(), case["decoded"].as_str().unwrap(), "{text:?}");
    }
}

/// `met serve` logs its startup phases in their numbered order, from settings to ready:
/// the tokenizer (8) after the KV cache (6) and the warm-up (7).
#[test]
fn serve_starts_in_the_numbered_phase_order() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let Some(model) = met_config::default_model_for_test() else { return };
    let mut child = Command::new(env!("CARGO_BIN_EXE_met"))
        .args(["serve", "--model", &model.display().to_string(), "--port", "0", "--kv-blocks", "64"])
        .env("MET_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("starts met serve");
    let mut phases = Vec::new();
    let mut log = String::new();
    for line in BufReader::new(child.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        let number = line.split('[').nth(1).and_then(|rest| rest.split(']').next()).and_then(|n| n.trim().parse().ok());
        if let Some(n) = number {
            phases.push(n);
            if n == 11 {
                break;
            }
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let sorted = {
        let mut p: Vec<u32> = phases.clone();
        p.sort_unstable();
        p
    };
    assert_eq!(phases, sorted, "phases out of order:\n{log}");
    assert_eq!(phases.first(), Some(&0), "{log}");
    assert_eq!(phases.last(), Some(&11), "{log}");
    for n in [6, 7, 8] {
        assert!(phases.contains(&n), "phase {n} missing:\n{log}");
    }
}
