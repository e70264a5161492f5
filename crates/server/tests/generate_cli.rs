//! `met generate` end to end: the binary on the Hugging Face fixtures, on dummy weights
//! from a real config, and on bad input (a message and a non-zero exit, never a panic).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> PathBuf {
    repo().join("crates/model-layers/tests/fixtures/hf").join(name)
}

fn met(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_met")).args(args).env("MET_LOG", "off").output().expect("runs met")
}

fn ids(v: &[u32]) -> String {
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn json_output_matches_the_transformers_reference() {
    let dir = fixture("qwen3");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone()).unwrap();
    let greedy: Vec<Vec<u32>> = serde_json::from_value(reference["greedy"].clone()).unwrap();
    let mut args = vec!["generate".to_string(), "--model".into(), dir.display().to_string()];
    for p in &prompts {
        args.extend(["--prompt-ids".into(), ids(p)]);
    }
    args.extend(["--max-tokens", "16", "--temperature", "0", "--json", "--top-logprobs", "3"].map(String::from));
    let out = met(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), prompts.len());
    for ((line, prompt), want) in lines.iter().zip(&prompts).zip(&greedy) {
        let got: Vec<u32> = serde_json::from_value(line["generated_ids"].clone()).unwrap();
        assert_eq!(&got, want);
        assert_eq!(serde_json::from_value::<Vec<u32>>(line["prompt_ids"].clone()).unwrap(), *prompt);
        let steps = line["top_logprobs"].as_array().unwrap();
        assert_eq!(steps.len(), 16);
        for (step, &token) in steps.iter().zip(&got) {
            let pairs = step.as_array().unwrap();
            assert_eq!(pairs.len(), 3);
            // Greedy picks the best candidate; logprobs are sorted and negative.
            assert_eq!(pairs[0][0].as_u64().unwrap(), u64::from(token));
            let lps: Vec<f64> = pairs.iter().map(|p| p[1].as_f64().unwrap()).collect();
            assert!(lps.windows(2).all(|w| w[0] >= w[1]) && lps[0] <= 0.0, "{lps:?}");
        }
    }
}

#[test]
fn dummy_weights_run_from_a_real_config() {
    let out = met(&[
        "generate",
        "--model",
        repo().join("configs/Qwen3-0.6B").to_str().unwrap(),
        "--load-format",
        "dummy",
        "--hf-overrides",
        r#"{"num_hidden_layers": 1}"#,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["generated_ids"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_input_is_a_message_and_a_failure() {
    let llama = fixture("llama");
    let llama = llama.to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (&["--model", "/nonexistent/model", "--prompt-ids", "1"], "does not exist"),
        (&["--model", llama, "--prompt-ids", "1,x"], "`x` is not a token id"),
        (&["--model", llama, "--prompt-ids", "1,512"], "token id 512 is outside the vocabulary of 512"),
        (&["--model", llama, "--prompt-ids", "1", "--max-tokens", "1000"], "exceed the model's context"),
        (&["--model", llama, "--prompt-ids", "1", "--hf-overrides", "{"], "--hf-overrides"),
        (&["--model", llama, "--prompt-ids", "1", "--device", "tpu"], "unknown device"),
    ];
    for (args, expected) in cases {
        let out = met(&[&["generate"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
