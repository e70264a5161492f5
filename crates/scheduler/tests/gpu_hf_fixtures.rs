//! The Hugging Face fixtures of `model-layers` on the GPU, in bf16, against the float32
//! transformers references: teacher-forced logits with all prompts in one batch and in
//! prefill chunks of 5, and greedy continuations through the engine (one batch, chunks of 5
//! with blocks of 4, and a pool small enough to force preemption).
//!
//! Compiled with the `cuda` feature and run on the GPU machine (`cargo xtask gpu-bundle`).
//! The CUDA backend stores weights and activations in bf16, so it cannot equal an f32
//! reference exactly. The bounds, and why:
//! - [`LOGIT_TOLERANCE`]: max |met − reference| of a logit, relative to the largest |logit|
//!   of its row. bf16 keeps 8 significant bits: rounding the lm_head output (as
//!   transformers does in bf16) alone moves a logit of magnitude L by up to L·2⁻⁹, and the
//!   hidden state reaches the head through 2–3 layers of roundings of 2⁻⁹ relative each.
//!   Measured on the H200: 0.7–1.5% of the row's max |logit| across the six fixtures
//!   before Gemma (logits reach 18 to 45); 2% is about five bf16 steps.
//!   The Gemma fixtures are far more sensitive to bf16: their sandwich norms, soft-caps and
//!   sharp attention amplify each rounding, and transformers itself in bf16 moves 15.2%
//!   (Gemma 2) and 19.8% (Gemma 3) of the row's max |logit| from its float32 reference
//!   (`scripts/hf_bf16_noise.py`; 1.0–1.5% for the Llama and Qwen fixtures). Their bound
//!   ([`gemma_tolerance`]) is that noise floor: met in bf16 may move no further than
//!   transformers in bf16 does. The H200 measured 11.7% and 14.2%.
//! - Argmax and greedy tokens must equal the reference wherever the reference's top-2 margin
//!   exceeds twice the row's tolerance: no two logits that each move by at most the
//!   tolerance can swap across that margin. Positions under it are counted and printed.
//! - MoE: a token whose k-th and (k+1)-th router logits are within [`ROUTER_DECISIVE_GAP`]
//!   may be routed to another expert in bf16: the router logits are themselves rounded to
//!   bf16 (up to 2⁻⁸ = 0.0039 each at magnitude 1–2) from a bf16 hidden state (about as
//!   much again), so a gap moves by up to ~0.015. A different expert moves everything after
//!   that token by more than any logit tolerance, so greedy steps whose context holds such
//!   a token are not held to the reference. The gaps come from the reference path on the
//!   CPU (`gpu/router_spy.rs`); the first H200 run departed right after a token with a gap
//!   of 0.007.
//! - A greedy continuation that departs from the reference at a non-decisive step is
//!   compared no further (its context differs from then on); one that departs at a decisive
//!   step fails. Reference margins along the greedy path come from the f32 CPU backend,
//!   which equals transformers within 2e-4 (`model-layers/tests/hf_equivalence.rs`).

#![cfg(feature = "cuda")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{KvCache, KvLayout, PagedKvCache, StateSizing};
use met_config::{AsyncScheduling, EngineConfig, KvCacheDtype, ModelConfig, SamplingParams};
use met_kernels::{CudaBackend, DType, GpuBackend};
use met_model_layers::attention::AttentionBackendKind;
use met_model_layers::{ForwardBatch, GraphCapture, GraphSettings, LoadOptions, LogitRows, Model, load_model};
use met_model_weights::{SafetensorsStore, WeightStore};
use met_scheduler::{Engine, EngineRequest, StopCriteria};
use met_telemetry::Metrics;

#[path = "gpu/router_spy.rs"]
mod router_spy;

use router_spy::RouterSpy;

/// Largest allowed |met − transformers| of a logit in bf16, relative to the largest |logit|
/// of its row (see the module docs).
const LOGIT_TOLERANCE: f32 = 0.02;

/// The bound of the fixtures that bf16 moves more than the others: transformers' own bf16
/// deviation from float32 on them, rounded up (`scripts/hf_bf16_noise.py`: Gemma 2 15.21%,
/// Gemma 3 19.84%); for the hybrids 1.5 times it, as issue 33's precision bound says
/// (Qwen3-Next 41.96%, Qwen3.5-MoE 51.54%: bf16 flips their router choices and the delta
/// rule's decays compound each rounding); see the module docs.
fn gemma_tolerance(name: &str) -> Option<f32> {
    match name {
        "gemma2" => Some(0.16),
        "gemma3" => Some(0.20),
        "qwen3_next" => Some(0.63),
        "qwen3_5_moe" => Some(0.78),
        _ => None,
    }
}

/// The hybrid fixtures (their caches hold recurrent state beside the K/V).
fn is_hybrid(name: &str) -> bool {
    name.starts_with("qwen3_next") || name.starts_with("qwen3_5")
}
/// Router-logit gap between the k-th and (k+1)-th expert under which bf16 may route a token
/// differently (see the module docs).
const ROUTER_DECISIVE_GAP: f32 = 0.03;
/// Tokens generated per prompt.
const NEW_TOKENS: usize = 16;

struct Fixture {
    name: &'static str,
    dir: PathBuf,
    cfg: ModelConfig,
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
    /// The logit bound relative to the row's max |logit|.
    tolerance: f32,
}

/// The fixtures: `MET_HF_FIXTURES` (set by the gpu-bundle runner to those of the working
/// tree a device run carries), else the source tree's.
fn fixtures_dir() -> PathBuf {
    std::env::var_os("MET_HF_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../model-layers/tests/fixtures/hf"))
}

fn fixture(name: &'static str) -> Fixture {
    let dir = fixtures_dir().join(name);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap()).unwrap();
    let prompts: Vec<Vec<u32>> = serde_json::from_value(reference["prompts"].clone()).unwrap();
    let greedy = serde_json::from_value(reference["greedy"].clone()).unwrap();
    let store = SafetensorsStore::open(&dir.join("reference.safetensors")).unwrap();
    let logits =
        (0..prompts.len()).map(|i| store.host(&format!("logits.{i}")).unwrap().to_f32_vec().unwrap()).collect();
    let tolerance = gemma_tolerance(name).unwrap_or(LOGIT_TOLERANCE);
    Fixture { name, dir, cfg, prompts, greedy, logits, tolerance }
}

fn model(f: &Fixture, backend: &Arc<dyn GpuBackend>, attention: AttentionBackendKind) -> Box<dyn Model> {
    model_with(f, backend, &LoadOptions { attention_backend: attention, ..LoadOptions::default() })
}

fn model_with(f: &Fixture, backend: &Arc<dyn GpuBackend>, options: &LoadOptions) -> Box<dyn Model> {
    let store = SafetensorsStore::open(&f.dir).unwrap();
    load_model(&f.cfg, &store, Arc::clone(backend), options).unwrap()
}

fn cuda() -> Arc<dyn GpuBackend> {
    Arc::new(CudaBackend::new().expect("these tests need a CUDA GPU"))
}

/// Logits at every position of every prompt, all prompts batched, in chunks of `chunk`.
fn teacher_forced(model: &dyn Model, backend: &dyn GpuBackend, prompts: &[Vec<u32>], chunk: usize) -> Vec<Vec<f32>> {
    let mut kv = kv_cache(backend, model.kv_layout(), 16, 64, false);
    let mut out = vec![Vec::new(); prompts.len()];
    let mut seqs: Vec<_> = (0..prompts.len()).map(|i| (i, 0usize, kv.new_sequence())).collect();
    while seqs.iter().any(|(i, done, _)| *done < prompts[*i].len()) {
        let mut batch = ForwardBatch::new();
        let mut rows = Vec::new();
        for (i, done, blocks) in seqs.iter_mut().filter(|(i, done, _)| *done < prompts[*i].len()) {
            let n = (prompts[*i].len() - *done).min(chunk);
            kv.reserve(blocks, *done + n).unwrap();
            batch.push(&prompts[*i][*done..*done + n], *done, blocks, LogitRows::All);
            rows.push((*i, n));
            *done += n;
        }
        let logits = backend.download_f32(&model.forward(&batch, &mut kv).unwrap()).unwrap();
        let mut at = 0;
        for (i, n) in rows {
            let width = n * model.vocab_size();
            out[i].extend_from_slice(&logits[at..at + width]);
            at += width;
        }
    }
    out
}

/// The tolerance of a row of reference logits, and the margin above which its argmax is
/// decisive.
fn tolerance(f: &Fixture, row: &[f32]) -> (f32, f32) {
    let tol = f.tolerance * row.iter().fold(0f32, |m, v| m.max(v.abs()));
    (tol, 2.0 * tol)
}

/// Top-1 minus top-2 of a row, and its argmax (first maximum).
fn margin(row: &[f32]) -> (f32, u32) {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    let second = row.iter().enumerate().filter(|&(i, _)| i != best).map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
    (row[best] - second, best as u32)
}

/// Checks teacher-forced GPU logits in one mode, printing the worst difference and the
/// positions checked; returns the failures (asserted at the end of [`run`], so a failure
/// still reports every mode).
fn check_logits(f: &Fixture, got: &[Vec<f32>], mode: &str) -> Vec<String> {
    let vocab = f.cfg.vocab_size;
    let (mut worst, mut checked, mut positions, mut failures) = (0f32, 0, 0, Vec::new());
    for (p, (got, want)) in got.iter().zip(&f.logits).enumerate() {
        assert_eq!(got.len(), want.len(), "{} {mode} prompt {p}: logits shape", f.name);
        for (pos, (g, w)) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).enumerate() {
            positions += 1;
            let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            let (tol, decisive) = tolerance(f, w);
            worst = worst.max(diff / (tol / f.tolerance));
            if diff > tol {
                failures.push(format!("prompt {p} position {pos}: max |Δlogit| {diff} > {tol}"));
            }
            let ((want_margin, want_top), (_, got_top)) = (margin(w), margin(g));
            if want_margin > decisive {
                checked += 1;
                if got_top != want_top {
                    failures.push(format!(
                        "prompt {p} position {pos}: argmax {got_top} != {want_top} (margin {want_margin})"
                    ));
                }
            }
        }
    }
    eprintln!(
        "GPU-FIXTURE {} logits {mode}: max |Δlogit| {:.2}% of the row's max |logit| (bound {:.0}%), argmax checked at {checked} of {positions} positions",
        f.name,
        100.0 * worst,
        100.0 * f.tolerance
    );
    failures.into_iter().map(|e| format!("{mode}: {e}")).collect()
}

/// What the reference path says about one greedy step.
#[derive(Debug, Clone, Copy)]
struct Step {
    /// The reference's top-2 logit margin.
    margin: f32,
    /// The margin above which the step is decisive.
    decisive: f32,
    /// Whether every token of the step's context had a clear expert choice.
    routed_clearly: bool,
}

/// The reference's top-2 margin at each greedy step, from the f32 CPU model fed the prompt
/// and the reference continuation (one forward pass, so router gaps line up with its rows).
fn greedy_steps(f: &Fixture) -> Vec<Vec<Step>> {
    let spy = Arc::new(RouterSpy::default());
    let cpu: Arc<dyn GpuBackend> = spy.clone();
    let m = model(f, &cpu, AttentionBackendKind::default());
    let full: Vec<Vec<u32>> =
        f.prompts.iter().zip(&f.greedy).map(|(p, g)| [&p[..], &g[..NEW_TOKENS - 1]].concat()).collect();
    let logits = teacher_forced(&*m, &*cpu, &full, usize::MAX);
    let gaps = spy.gaps();
    let vocab = f.cfg.vocab_size;
    let mut first_row = 0;
    f.prompts
        .iter()
        .zip(&full)
        .zip(&logits)
        .map(|((p, seq), l)| {
            let seq_gaps = gaps.get(first_row..first_row + seq.len()).unwrap_or(&[]);
            first_row += seq.len();
            l.chunks_exact(vocab)
                .enumerate()
                .skip(p.len() - 1)
                .map(|(pos, row)| Step {
                    margin: margin(row).0,
                    decisive: tolerance(f, row).1,
                    routed_clearly: seq_gaps.iter().take(pos + 1).all(|&g| g > ROUTER_DECISIVE_GAP),
                })
                .collect()
        })
        .collect()
}

/// A cache of `blocks` blocks for `layout`; for a hybrid model with a state slot per
/// sequence and, with prefix caching, a snapshot every block.
fn kv_cache(
    backend: &dyn GpuBackend,
    layout: KvLayout,
    block_size: usize,
    blocks: usize,
    prefix: bool,
) -> PagedKvCache {
    let sizing = StateSizing { sequences: 64, snapshots: if prefix { 64 } else { 0 }, interval: 1, rollback: 0 };
    let states = layout.state.map(|_| sizing);
    PagedKvCache::with_states(&[backend], layout, block_size, blocks, prefix, states).unwrap()
}

/// Greedy continuations through the engine on `backend`.
fn through_engine(f: &Fixture, backend: &Arc<dyn GpuBackend>, config: EngineConfig, blocks: usize) -> Vec<Vec<u32>> {
    through_engine_with(f, backend, config, blocks, false).0
}

/// [`through_engine`], with decode graphs when `graphs`; also returns the steps that ran
/// ahead of the draws before them.
fn through_engine_with(
    f: &Fixture,
    backend: &Arc<dyn GpuBackend>,
    config: EngineConfig,
    blocks: usize,
    graphs: bool,
) -> (Vec<Vec<u32>>, usize) {
    let m = model(f, backend, AttentionBackendKind::default());
    let kv = kv_cache(&**backend, m.kv_layout(), config.block_size, blocks, config.prefix_caching);
    if graphs {
        let capture = m.capture_graphs(&kv, &GraphSettings::up_to(8)).unwrap();
        assert!(matches!(capture, GraphCapture::Captured { .. }), "{}: {capture}", f.name);
    }
    let mut engine = Engine::new(m, Arc::clone(backend), Box::new(kv), config, Arc::new(Metrics::new())).unwrap();
    let mut streams: Vec<_> = f
        .prompts
        .iter()
        .map(|p| {
            let stop = StopCriteria { max_new_tokens: NEW_TOKENS, ..StopCriteria::default() };
            let req = EngineRequest::new(p.clone(), SamplingParams::greedy(), stop, 1, &engine.limits()).unwrap();
            engine.submit(req)
        })
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = vec![Vec::new(); f.prompts.len()];
    let mut ahead = 0;
    while engine.has_work() {
        engine.step();
        ahead += usize::from(engine.last_step().ahead);
        for (s, o) in streams.iter_mut().zip(&mut out) {
            while let Some(e) = s.try_next() {
                o.extend(e.token.map(|t| t.id));
            }
        }
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks(), "{}: blocks leaked", f.name);
    (out, ahead)
}

/// Compares greedy continuations with the reference under the margin rule, printing the
/// agreement; returns the failures.
fn check_greedy(f: &Fixture, got: &[Vec<u32>], steps: &[Vec<Step>], mode: &str) -> Vec<String> {
    let (mut equal, mut skipped, mut failures) = (0, 0, Vec::new());
    for (p, ((got, want), steps)) in got.iter().zip(&f.greedy).zip(steps).enumerate() {
        assert_eq!(got.len(), NEW_TOKENS, "{} {mode} prompt {p}: length", f.name);
        if let Some(step) = (0..NEW_TOKENS).find(|&s| got[s] != want[s]) {
            equal += step;
            skipped += NEW_TOKENS - step;
            let what = format!("prompt {p} step {step}: drew {} where the reference drew {}", got[step], want[step]);
            let s = steps[step];
            if s.margin > s.decisive && s.routed_clearly {
                failures.push(format!("{what} with margin {} > {}", s.margin, s.decisive));
            } else if s.routed_clearly {
                eprintln!("{} {mode} {what} (excused: reference margin {:.3} <= {:.3})", f.name, s.margin, s.decisive);
            } else {
                eprintln!(
                    "{} {mode} {what} (excused: a token of its context has a router gap <= {ROUTER_DECISIVE_GAP})",
                    f.name
                );
            }
        } else {
            equal += NEW_TOKENS;
        }
    }
    let total = f.prompts.len() * NEW_TOKENS;
    eprintln!(
        "GPU-FIXTURE {} greedy {mode}: {equal} of {total} steps equal, {skipped} not compared after an excused departure",
        f.name
    );
    failures.into_iter().map(|e| format!("{mode}: {e}")).collect()
}

fn run(name: &'static str) {
    let f = fixture(name);
    let gpu = cuda();
    let mut failures = Vec::new();
    // The logits through every attention backend; the engine runs below use the default.
    for &attention in AttentionBackendKind::ALL {
        let m = model(&f, &gpu, attention);
        for (mode, chunk) in [("one batch", usize::MAX), ("chunks of 5", 5)] {
            let got = teacher_forced(&*m, &*gpu, &f.prompts, chunk);
            failures.extend(check_logits(&f, &got, &format!("{mode}, {attention}")));
        }
    }
    let steps = greedy_steps(&f);
    let chunked = EngineConfig { max_prefill_chunk: Some(5), block_size: 4, ..EngineConfig::default() };
    let tight = EngineConfig { block_size: 4, ..EngineConfig::default() };
    // The hybrids' longest prompt needs 44 blocks of 4 alone.
    let (roomy, tight_blocks) = if is_hybrid(name) { (128, 48) } else { (64, 24) };
    for (mode, config, blocks) in [
        ("engine", EngineConfig::default(), roomy),
        ("engine chunks of 5", chunked, roomy),
        ("engine preempting", tight, tight_blocks),
    ] {
        let got = through_engine(&f, &gpu, config, blocks);
        failures.extend(check_greedy(&f, &got, &steps, mode));
    }
    // Asynchronous scheduling (on by default here) runs the same batches as synchronous
    // scheduling when no request ends on a stop token, so the tokens must be equal, not
    // close: eagerly (fed ids gathered, then checked by the embedding) and from graphs
    // (fed ids gathered into the graph's inputs on the device).
    for graphs in [false, true] {
        let with = |on: bool| EngineConfig {
            async_scheduling: if on { AsyncScheduling::On } else { AsyncScheduling::Off },
            ..EngineConfig::default()
        };
        let (on, ahead) = through_engine_with(&f, &gpu, with(true), roomy, graphs);
        let (off, none) = through_engine_with(&f, &gpu, with(false), roomy, graphs);
        assert_eq!(none, 0, "{name}: steps ran ahead with asynchronous scheduling off");
        assert!(ahead >= NEW_TOKENS - 3, "{name}: only {ahead} steps ran ahead (graphs {graphs})");
        assert_eq!(on, off, "{name}: asynchronous scheduling changed the tokens (graphs {graphs})");
        eprintln!("GPU-ASYNC {name} graphs {graphs}: {ahead} steps ran ahead; tokens equal to synchronous scheduling");
    }
    assert!(
        failures.is_empty(),
        "{name}: {} failures, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(8)]
    );
}

/// `--kv-cache-dtype fp8` (unit scales) on the GPU: e4m3 pools of half bf16's bytes, the
/// prompts teacher-forced through every attention backend, in one batch and in chunks of 5,
/// against float32 transformers whose attention layers see the keys and values an e4m3
/// cache holds (`scripts/fp8_kv_reference.py`). The bound is the fixture's bf16 bound or
/// 1.5 times transformers' own distance in bf16 over the same e4m3 keys and values, the
/// larger: computing in bf16 moves a key at an e4m3 rounding midpoint by a whole e4m3 step,
/// so an e4m3 cache makes bf16's distance several times its usual (the script measured
/// 2.83% for llama, 5.35% qwen3, 51.4% gemma2, 30.0% qwen3_next; the H200 first measured
/// met at 2.86%, 5.59%, 59.75% and 60.31%, failing the plain bf16 bounds of 2%, 2%, 16%).
fn run_fp8_kv(name: &'static str) {
    let mut f = fixture(name);
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.join("fp8_kv.json")).unwrap()).unwrap();
    let noise = meta["unit_bf16_noise"].as_f64().expect("fp8_kv.json: unit_bf16_noise") as f32;
    f.tolerance = f.tolerance.max(1.5 * noise);
    let refs = SafetensorsStore::open(&f.dir.join("fp8_kv.safetensors")).unwrap();
    f.logits =
        (0..f.prompts.len()).map(|i| refs.host(&format!("unit.logits.{i}")).unwrap().to_f32_vec().unwrap()).collect();
    let gpu = cuda();
    let bf16_bytes = model(&f, &gpu, AttentionBackendKind::default()).kv_layout().bytes_per_block(16);
    let mut failures = Vec::new();
    for &attention in AttentionBackendKind::ALL {
        let options = LoadOptions { attention_backend: attention, kv_cache_dtype: KvCacheDtype::Fp8 };
        let m = model_with(&f, &gpu, &options);
        assert_eq!(m.kv_layout().dtype, DType::F8E4M3, "{name}: the fp8 cache's pools");
        assert_eq!(2 * m.kv_layout().bytes_per_block(16), bf16_bytes, "{name}: fp8 bytes per block");
        for (mode, chunk) in [("one batch", usize::MAX), ("chunks of 5", 5)] {
            let got = teacher_forced(&*m, &*gpu, &f.prompts, chunk);
            failures.extend(check_logits(&f, &got, &format!("fp8 KV, {mode}, {attention}")));
        }
    }
    assert!(
        failures.is_empty(),
        "{name} fp8 KV: {} failures, the first: {:?}",
        failures.len(),
        &failures[..failures.len().min(8)]
    );
}

mod fp8_kv {
    #[test]
    fn llama() {
        super::run_fp8_kv("llama");
    }

    #[test]
    fn qwen3() {
        super::run_fp8_kv("qwen3");
    }

    #[test]
    fn gemma2() {
        super::run_fp8_kv("gemma2");
    }

    #[test]
    fn qwen3_next() {
        super::run_fp8_kv("qwen3_next");
    }
}

macro_rules! fixture_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            run(stringify!($name));
        }
    )*};
}

// `qwen3_5` is not here yet: on the H200 met's bf16 logits moved 15.49% of the row's max
// |logit| from the float32 reference where transformers' own bf16 moves 7.70%
// (`bench/results/hybrid-2026-12-03/`), past the 1.5x bound; open in issue 33.
fixture_tests!(llama, llama_tied, mistral, qwen2, qwen3, qwen3_moe, gemma2, gemma3, qwen3_next, qwen3_5_moe);
