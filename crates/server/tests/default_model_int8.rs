//! The default model's greedy output with integer CPU dots (`--quant-dots int8`, the
//! default) against the exact path and against transformers, on the reference
//! prompts of `tests/fixtures/smollm2/reference.json` (made by
//! `scripts/smollm2_reference.py`).
//!
//! Integer dots quantise activations to 8 bits, so logits move a little and a greedy step
//! whose top-2 margin is smaller than that movement may pick the runner-up; after such a
//! step the continuations legitimately differ. The test measures the movement (the
//! largest change of any difference between two top-5 logits while the contexts still
//! agree), requires it to stay under [`NOISE`], and allows a divergence only at a step
//! whose margin is under [`DIVERGENCE_MARGIN`]. Skipped with a note when the model is not installed, like
//! `default_model.rs`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Bound on how far int8 dots move a difference of two top-5 logits, in logits. Measured
/// on these prompts (2026-12-02, AMD EPYC Zen 4): 0.614 with the AVX-512 VNNI kernels,
/// 0.605 with AVX2 (`MET_CPU_SIMD=avx2`), 0.466 with the scalar ones (each level leaves the
/// exact path at other steps, so it measures other steps); the top-1 minus top-2 margin
/// itself moved by 0.34 at most and 0.18 at the median step. Every divergence then was at
/// a step whose exact margin was at most 0.088.
///
/// The largest move is chaotic in the model's other numerics: on an Intel Xeon (AVX-512
/// VNNI, 2026-12-02) it was 0.547 with the per-key CPU attention, 0.711 with the grouped
/// attention of `69b17e4` and libm's `expf`, and 1.020 with that attention's own
/// exponential (within 2 ulp of libm's), all at late steps of the `code` case, which none
/// of them left the exact path on; the other cases stayed under 0.54. The bound leaves
/// 20 % headroom over the largest measurement.
const NOISE: f64 = 1.25;

/// Bound on the exact top-1 minus top-2 margin of a step where int8 leaves the exact path
/// (or transformers'). The measurements above found every divergence at a margin of at
/// most 0.20 (`multi_turn`, step 2; most at 0.09 or less); the bound is the one the test
/// held before its noise bound was restated.
const DIVERGENCE_MARGIN: f64 = 0.75;

fn reference() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/smollm2/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
}

/// Greedy 32-token continuations of every case in one batch, with top-5 logprobs.
fn generate(model: &Path, cases: &[Value], dots: &str) -> Vec<Value> {
    let mut args: Vec<String> =
        ["generate", "--device", "cpu", "--quant-dots", dots, "--model"].map(String::from).into();
    args.push(model.display().to_string());
    for case in cases {
        let prompt: Vec<String> = ids(&case["prompt_ids"]).iter().map(u64::to_string).collect();
        args.extend(["--prompt-ids".into(), prompt.join(",")]);
    }
    args.extend(["--max-tokens", "32", "--top-logprobs", "5", "--json"].map(String::from));
    let out = Command::new(env!("CARGO_BIN_EXE_met")).args(&args).env("MET_LOG", "off").output().expect("runs met");
    assert!(out.status.success(), "met {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Step `s`'s top logprobs by token id.
fn top(line: &Value, s: usize) -> HashMap<u64, f64> {
    let step = line["top_logprobs"][s].as_array().unwrap();
    step.iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap())).collect()
}

/// Step `s`'s top-1 minus top-2 logprob (equal to the logit margin), from `line` or, where
/// it stopped before step `s`, from `other`.
fn margin(line: &Value, other: &Value, s: usize) -> f64 {
    let step = line["top_logprobs"][s].as_array().or_else(|| other["top_logprobs"][s].as_array()).unwrap();
    step[0][1].as_f64().unwrap() - step[1][1].as_f64().unwrap()
}

/// The first index where `a` and `b` differ, if any.
fn divergence(a: &[u64], b: &[u64]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y).or((a.len() != b.len()).then(|| a.len().min(b.len())))
}

#[test]
fn int8_dots_agree_with_exact_and_transformers_within_the_measured_noise() {
    let Some(model) = met_config::default_model_for_test() else { return };
    let reference = reference();
    let cases = reference["chat"].as_array().unwrap();
    let (exact, int8) = (generate(&model, cases, "exact"), generate(&model, cases, "int8"));
    assert_eq!((exact.len(), int8.len()), (cases.len(), cases.len()));

    // The noise: while both runs have seen the same tokens, how far any difference of two
    // top-5 logits moves (logprobs share one shift per step, which the difference cancels).
    let mut noise = 0f64;
    for (e, i) in exact.iter().zip(&int8) {
        let (eg, ig) = (ids(&e["generated_ids"]), ids(&i["generated_ids"]));
        let last = divergence(&eg, &ig).unwrap_or(eg.len().saturating_sub(1)).min(eg.len().min(ig.len()) - 1);
        for s in 0..=last {
            let (te, ti) = (top(e, s), top(i, s));
            let moves: Vec<f64> = te.iter().filter_map(|(t, lp)| ti.get(t).map(|li| li - lp)).collect();
            let (lo, hi) = moves.iter().fold((f64::MAX, f64::MIN), |(lo, hi), d| (lo.min(*d), hi.max(*d)));
            noise = noise.max(hi - lo);
        }
    }
    println!("int8 vs exact: largest move of a top-5 logit difference {noise:.4} (bound {NOISE})");
    assert!(noise <= NOISE, "int8 noise {noise} is above the stated {NOISE}");

    for ((e, i), case) in exact.iter().zip(&int8).zip(cases) {
        let name = case["name"].as_str().unwrap();
        let (eg, ig, hf) = (ids(&e["generated_ids"]), ids(&i["generated_ids"]), ids(&case["generated_ids"]));
        if let Some(s) = divergence(&eg, &ig) {
            let m = margin(e, i, s);
            println!("{name}: int8 leaves the exact path at step {s}, exact margin {m:.4}");
            assert!(
                m <= DIVERGENCE_MARGIN,
                "{name}: int8 differs from exact at step {s}, whose margin {m} is above {DIVERGENCE_MARGIN}"
            );
        }
        if let Some(s) = divergence(&hf, &ig) {
            let m = case["step_margins"][s].as_f64().unwrap_or(0.0);
            println!("{name}: int8 leaves transformers at step {s}, transformers margin {m:.4}");
            assert!(
                m <= DIVERGENCE_MARGIN,
                "{name}: int8 differs from transformers at step {s}, whose margin {m} is above {DIVERGENCE_MARGIN}"
            );
        }
    }
}
