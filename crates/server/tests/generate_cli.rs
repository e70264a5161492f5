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
    let cases: [(&[&str], &str); 23] = [
        (&["--model", "/nonexistent/model", "--prompt-ids", "1"], "cannot find model `/nonexistent/model`"),
        (&["--model", llama, "--chat", "hi"], "need a tokenizer"),
        (&["--model", llama], "no prompts"),
        (&["--model", llama, "--prompt-ids", "1,x"], "`x` is not a token id"),
        (&["--model", llama, "--prompt-ids", "1,512"], "token id 512 is outside the vocabulary of 512"),
        (
            &["--model", llama, "--prompt-ids", "1", "--max-tokens", "1000"],
            "more than the model's maximum context length",
        ),
        (&["--model", llama, "--prompt-ids", "1", "--hf-overrides", "{"], "--hf-overrides"),
        (&["--model", llama, "--prompt-ids", "1", "--device", "tpu"], "unknown device"),
        (&["--model", llama, "--prompt-ids", "1", "--policy", "lifo"], "[possible values: fcfs, priority]"),
        (
            &["--model", llama, "--prompt-ids", "1", "--attention-backend", "xformers"],
            "[possible values: flash, paged]",
        ),
        (&["--model", llama, "--prompt-ids", "1", "--speculative", "medusa"], "[possible values: ngram, self, draft]"),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "ngram", "--num-speculative-tokens", "0"],
            "--num-speculative-tokens: 0 is outside 1..=16",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "ngram", "--num-speculative-tokens", "17"],
            "--num-speculative-tokens: 17 is outside 1..=16",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--num-speculative-tokens", "4"],
            "--num-speculative-tokens: needs --speculative",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "ngram", "--speculative-ngram-min", "0"],
            "--speculative-ngram-min: must be positive",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "self", "--self-spec-layers", "2"],
            "--self-spec-layers: 2 is not below the model's 2 layers",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "self", "--self-spec-layers", "0"],
            "--self-spec-layers: must be positive",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--self-spec-layers", "1"],
            "--self-spec-layers: needs --speculative",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "ngram", "--self-spec-layers", "1"],
            "--self-spec-layers: needs --speculative self",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "draft"],
            "--draft-model: --speculative draft needs one",
        ),
        (&["--model", llama, "--prompt-ids", "1", "--draft-model", llama], "--draft-model: needs --speculative draft"),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative", "ngram", "--speculative-max-batch", "0"],
            "--speculative-max-batch: must be positive",
        ),
        (
            &["--model", llama, "--prompt-ids", "1", "--speculative-fixed-k"],
            "--speculative-fixed-k: needs --speculative",
        ),
    ];
    for (args, expected) in cases {
        let out = met(&[&["generate"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A draft model must have the target's vocabulary: a clear error, not a panic.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let llama = fixture("llama");
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
        "--speculative",
        "draft",
        "--draft-model",
        llama.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("--draft-model: the draft model has a vocabulary of 512 tokens, the target 151936"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `generated_ids` of every output line.
fn generated(out: &Output) -> Vec<Vec<u32>> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_value(serde_json::from_str::<serde_json::Value>(l).unwrap()["generated_ids"].clone())
                .unwrap()
        })
        .collect()
}

#[test]
fn engine_flags_do_not_change_greedy_output() {
    let dir = fixture("llama_tied");
    let dir = dir.to_str().unwrap();
    // Another architecture with the same vocabulary as the draft.
    let draft = fixture("qwen2").to_str().unwrap().to_owned();
    let base = [
        "generate",
        "--model",
        dir,
        "--prompt-ids",
        "5,6,7,8,9,10,11,12,13",
        "--prompt-ids",
        "5,6,7,8,9,10,11,12,14",
        "--prompt-ids",
        "300",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--json",
    ];
    let reference = generated(&met(&base));
    for extra in [
        &["--no-prefix-caching"][..],
        &["--kv-blocks", "2", "--block-size", "16"][..],
        &["--max-prefill-chunk", "3", "--max-batch-tokens", "4"][..],
        &["--max-num-seqs", "1", "--policy", "priority"][..],
        &["--speculative", "ngram", "--speculative-ngram-min", "1"][..],
        &["--speculative", "self", "--self-spec-layers", "1", "--num-speculative-tokens", "3"][..],
        &["--speculative", "draft", "--draft-model", &draft][..],
        &[
            "--speculative",
            "ngram",
            "--num-speculative-tokens",
            "16",
            "--speculative-ngram-min",
            "1",
            "--max-batch-tokens",
            "5",
        ][..],
    ] {
        assert_eq!(generated(&met(&[&base[..], extra].concat())), reference, "{extra:?}");
    }
}

#[test]
fn timing_reports_speculative_acceptance() {
    let dir = fixture("llama_tied");
    let args = [
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--prompt-ids",
        "5,6,7,8,9,10,11,12,13",
        "--max-tokens",
        "12",
        "--ignore-eos",
        "--timing",
        "--speculative",
        "self",
        "--self-spec-layers",
        "1",
    ];
    let out = met(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().rev().find(|l| l.starts_with('{')).expect("a timing line");
    let timing: serde_json::Value = serde_json::from_str(line).unwrap();
    let spec = &timing["speculative"];
    let (drafted, accepted) = (spec["draft_tokens"].as_u64().unwrap(), spec["accepted_tokens"].as_u64().unwrap());
    assert!(drafted > 0 && accepted <= drafted, "{timing}");
    let plain = met(&args[..args.len() - 4]);
    let plain: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&plain.stderr).lines().rev().find(|l| l.starts_with('{')).expect("a timing line"),
    )
    .unwrap();
    assert!(plain.get("speculative").is_none(), "{plain}");
}

#[test]
fn seeded_sampling_is_reproducible_and_n_gives_choices() {
    let dir = fixture("qwen2");
    let dir = dir.to_str().unwrap();
    let args = [
        "generate",
        "--model",
        dir,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "10",
        "--temperature",
        "1.0",
        "--top-p",
        "0.9",
        "--seed",
        "7",
        "-n",
        "3",
        "--json",
    ];
    let first = generated(&met(&args));
    assert_eq!(first.len(), 3);
    assert_eq!(generated(&met(&args)), first);
    // Speculation keeps a seeded request's tokens: its drafts are point masses.
    let draft = fixture("llama").to_str().unwrap().to_owned();
    for speculative in [
        &["--speculative", "ngram", "--speculative-ngram-min", "1"][..],
        &["--speculative", "self"][..],
        &["--speculative", "draft", "--draft-model", &draft][..],
    ] {
        assert_eq!(generated(&met(&[&args[..], speculative].concat())), first, "{speculative:?}");
    }
    assert!(first[0] != first[1] || first[1] != first[2], "three samples at temperature 1 are identical: {first:?}");
    let other = generated(&met(&[&args[..args.len() - 5], &["--seed", "8", "-n", "3", "--json"]].concat()));
    assert_ne!(other, first);
}

#[test]
fn prompts_come_from_a_jsonl_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompts.jsonl");
    std::fs::write(&file, "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 2}\n\n{\"prompt_ids\": [4], \"n\": 2}\n")
        .unwrap();
    let model = fixture("qwen3");
    let out =
        met(&["generate", "--model", model.to_str().unwrap(), "--prompts-file", file.to_str().unwrap(), "--json"]);
    let lens: Vec<usize> = generated(&out).iter().map(Vec::len).collect();
    assert_eq!(lens, [2, 16, 16]);
    // A per-prompt priority, for `--policy priority`, changes no output.
    std::fs::write(&file, "{\"prompt_ids\": [1, 2, 3], \"max_tokens\": 2, \"priority\": 1}\n{\"prompt_ids\": [4], \"n\": 2, \"priority\": -3}\n")
        .unwrap();
    let args = ["generate", "--model", model.to_str().unwrap(), "--prompts-file", file.to_str().unwrap(), "--json"];
    let prioritised = met(&[&args[..], &["--policy", "priority", "--max-num-seqs", "1"]].concat());
    assert_eq!(generated(&prioritised), generated(&out), "{}", String::from_utf8_lossy(&prioritised.stderr));

    std::fs::write(&file, "{\"prompt_ids\": [1]}\n{\"prompt_idz\": [1]}\n").unwrap();
    let out = met(&["generate", "--model", model.to_str().unwrap(), "--prompts-file", file.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("line 2") && stderr.contains("prompt_idz"), "{stderr}");
}

#[test]
fn tokenize_reports_missing_tokenizers_and_bad_ids() {
    let llama = fixture("llama");
    let out = met(&["tokenize", "--model", llama.to_str().unwrap(), "hello"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("has no tokenizer"), "{stderr}");
    let out = met(&["tokenize", "--decode", "1,x"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("`x` is not a token id"));
}

/// `--tensor-parallel-size` on the CPU: the ranks are threads joined in process, and the
/// greedy tokens are transformers' at 2 and 4 ranks; startup reports the world size.
#[test]
fn tensor_parallel_ranks_give_the_transformers_tokens() {
    let dir = fixture("qwen3_moe");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone()).unwrap();
    let greedy: Vec<Vec<u32>> = serde_json::from_value(reference["greedy"].clone()).unwrap();
    for world in ["2", "4"] {
        let mut args = vec!["generate", "--model", dir.to_str().unwrap(), "--device", "cpu"];
        args.extend(["--tensor-parallel-size", world, "--max-tokens", "16", "--json", "--max-prefill-chunk", "5"]);
        let prompt_ids: Vec<String> = prompts.iter().map(|p| ids(p)).collect();
        for p in &prompt_ids {
            args.extend(["--prompt-ids", p.as_str()]);
        }
        let out = Command::new(env!("CARGO_BIN_EXE_met")).args(&args).env("MET_LOG", "info").output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(stderr.contains(&format!("world size {world}, ranks joined by")), "{stderr}");
        let got: Vec<Vec<u32>> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_value(serde_json::from_str::<serde_json::Value>(l).unwrap()["generated_ids"].clone())
                    .unwrap()
            })
            .collect();
        assert_eq!(got, greedy, "TP={world}");
    }
}

/// A world size the model or the build cannot use is refused before anything runs, with
/// the flag named.
#[test]
fn bad_tensor_parallel_sizes_are_refused() {
    let qwen3 = fixture("qwen3");
    let model = qwen3.to_str().unwrap();
    let fails = |args: &[&str], want: &str| {
        let out = met(&[&["generate", "--model", model, "--prompt-ids", "1,2"], args].concat());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(stderr.contains(want), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    };
    fails(&["--tensor-parallel-size", "3"], "--tensor-parallel-size 3");
    fails(&["--tensor-parallel-size", "3"], "num_attention_heads (4) is not a multiple of 3");
    fails(&["--tensor-parallel-size", "0"], "is not a number of devices");
    fails(&["--tensor-parallel-size", "2", "--speculative", "self"], "--speculative self: not available");
    #[cfg(not(feature = "cuda"))]
    fails(&["--tensor-parallel-size", "2", "--device", "cuda"], "no CUDA support");
}
