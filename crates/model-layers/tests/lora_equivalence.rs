//! LoRA adapters against transformers + peft, float32 references: the llama fixture with
//! two random PEFT adapters (`tests/fixtures/lora`, made by `scripts/lora_fixtures.py`:
//! rank 8 on all seven projections; rank 16 rank-stabilised on five), and the qwen3_moe
//! fixture with two on its routed experts (`tests/fixtures/lora_moe`, made by
//! `scripts/lora_moe_hybrid_fixtures.py`: PEFT's wrapped expert parameters beside q/k/v/o
//! and the dense layer's MLP; the per-expert layout of transformers-4 adapters), and the
//! hybrid fixtures (Qwen3.5, Qwen3.5-MoE, Qwen3-Next) with two each from the same script:
//! PEFT's output for all seven projections (gated attention's doubled `q_proj`, the dense
//! MLP, the shared expert or the routed experts) and a rank-stabilised one on three.
//!
//! One batch mixes rows of the base model and of both adapters. Every row's logits must be
//! within [`LOGIT_TOLERANCE`] of its own reference, and bit for bit what the same sequence
//! gives alone and in prefill chunks (a row never depends on its batch-mates). Greedy
//! continuations decoded in one mixed batch must equal the references. A batch that gives
//! a row the other adapter must fail the same check.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{DEFAULT_BLOCK_SIZE, KvCache, PagedKvCache, StateSizing};
use met_kernels::{CpuBackend, GpuBackend};
use met_model_layers::lora::{Adapter, LoraAdapter, LoraLimits, LoraPool};
use met_model_layers::runner::argmax;
use met_model_layers::{ForwardBatch, LoadOptions, LogitRows, Model, ModelError, load_model};
use met_model_weights::{SafetensorsStore, WeightStore};
use serde::Deserialize;

/// As in `hf_equivalence.rs`: both sides compute in f32 and differ only in summation order.
const LOGIT_TOLERANCE: f32 = 2e-4;
const CHUNK: usize = 5;

/// A base fixture and the two adapters made for it.
#[derive(Clone, Copy, Debug)]
struct Spec {
    /// Under `fixtures/hf`.
    base: &'static str,
    /// Under `fixtures`: the adapters' directories and their references.
    lora: &'static str,
    adapters: [&'static str; 2],
}

const LLAMA: Spec = Spec { base: "llama", lora: "lora", adapters: ["r8", "r16_rslora"] };
const QWEN3_MOE: Spec = Spec { base: "qwen3_moe", lora: "lora_moe", adapters: ["params", "modules"] };
const SPECS: [Spec; 5] = [
    LLAMA,
    QWEN3_MOE,
    Spec { base: "qwen3_5", lora: "lora_qwen3_5", adapters: ["all", "linear"] },
    Spec { base: "qwen3_5_moe", lora: "lora_qwen3_5_moe", adapters: ["all", "linear"] },
    Spec { base: "qwen3_next", lora: "lora_qwen3_next", adapters: ["all", "linear"] },
];

#[derive(Deserialize)]
struct BaseReference {
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
struct AdapterReference {
    greedy: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
struct LoraReference {
    logit_prompts: Vec<usize>,
    adapters: std::collections::HashMap<String, AdapterReference>,
}

struct Fixture {
    spec: Spec,
    model: Box<dyn Model>,
    backend: Arc<dyn GpuBackend>,
    cfg: met_config::ModelConfig,
    adapters: Vec<Adapter>,
    base: BaseReference,
    lora: LoraReference,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn limits() -> LoraLimits {
    LoraLimits { max_rank: 16 }
}

fn load(spec: Spec) -> Fixture {
    let dir = fixtures().join("hf").join(spec.base);
    let cfg = met_model_layers::models::read_config(&dir.join("config.json")).unwrap();
    let store = SafetensorsStore::open(&dir).unwrap();
    let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
    let model = load_model(&cfg, &store, Arc::clone(&backend), &LoadOptions::default()).unwrap();
    // Three slots for two adapters: the free one is zero, and rows never read it.
    let pool = LoraPool::new(&cfg, Arc::clone(&backend), limits(), 3).unwrap();
    model.attach_lora(Arc::clone(&pool)).unwrap();
    let adapters = spec
        .adapters
        .iter()
        .map(|name| Arc::new(LoraAdapter::load(name, &fixtures().join(spec.lora).join(name), &cfg, &pool).unwrap()))
        .collect();
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap();
    let base = serde_json::from_str(&read(dir.join("reference.json"))).unwrap();
    let lora = serde_json::from_str(&read(fixtures().join(spec.lora).join("reference.json"))).unwrap();
    Fixture { spec, model, backend, cfg, adapters, base, lora }
}

/// A cache of `blocks` blocks, with state slots for a hybrid model's sequences.
fn cache(f: &Fixture, blocks: usize) -> PagedKvCache {
    let layout = f.model.kv_layout();
    let states = layout.state.map(|_| StateSizing { sequences: 32, snapshots: 0, interval: 0, rollback: 0 });
    PagedKvCache::with_states(&[&*f.backend], layout, DEFAULT_BLOCK_SIZE, blocks, false, states).unwrap()
}

/// One sequence of a test batch: a prompt and the adapter it runs through (`None`: base).
#[derive(Clone, Copy, Debug)]
struct Row {
    prompt: usize,
    adapter: Option<usize>,
}

/// The reference logits of `row`, `[len, vocab]` flat.
fn reference(spec: Spec, row: Row) -> Vec<f32> {
    let (file, name) = match row.adapter {
        None => (fixtures().join("hf").join(spec.base).join("reference.safetensors"), format!("logits.{}", row.prompt)),
        Some(a) => (
            fixtures().join(spec.lora).join("reference.safetensors"),
            format!("{}.logits.{}", spec.adapters[a], row.prompt),
        ),
    };
    SafetensorsStore::open(&file).unwrap().host(&name).unwrap().to_f32_vec().unwrap()
}

/// Logits at every position of each row's prompt, the rows batched together in prefill
/// chunks of `chunk` tokens; `given[i]` is the adapter row `i` actually runs through.
fn teacher_forced(f: &Fixture, rows: &[Row], given: &[Option<usize>], chunk: usize) -> Vec<Vec<f32>> {
    let mut kv = cache(f, 64);
    let prompts: Vec<&[u32]> = rows.iter().map(|r| &f.base.prompts[r.prompt][..]).collect();
    let mut seqs: Vec<_> = rows.iter().map(|_| (0usize, kv.new_sequence())).collect();
    let mut out = vec![Vec::new(); rows.len()];
    while seqs.iter().zip(&prompts).any(|((done, _), p)| *done < p.len()) {
        let mut batch = ForwardBatch::new();
        let mut taken = Vec::new();
        for (i, (done, blocks)) in seqs.iter_mut().enumerate().filter(|(i, (done, _))| *done < prompts[*i].len()) {
            let n = (prompts[i].len() - *done).min(chunk);
            kv.reserve(blocks, *done + n).unwrap();
            batch.push(&prompts[i][*done..*done + n], *done, blocks, LogitRows::All);
            if let Some(a) = given[i] {
                batch.adapt_last(&f.adapters[a]);
            }
            taken.push((i, n));
            *done += n;
        }
        let logits = f.backend.download_f32(&f.model.forward(&batch, &mut kv).unwrap()).unwrap();
        let mut at = 0;
        for (i, n) in taken {
            let width = n * f.model.vocab_size();
            out[i].extend_from_slice(&logits[at..at + width]);
            at += width;
        }
    }
    out
}

/// Every position of every row whose logits miss the reference, as messages.
fn mismatches(f: &Fixture, rows: &[Row], got: &[Vec<f32>]) -> Vec<String> {
    let vocab = f.model.vocab_size();
    let mut bad = Vec::new();
    for (row, got) in rows.iter().zip(got) {
        let want = reference(f.spec, *row);
        assert_eq!(got.len(), want.len(), "{row:?}: logits shape");
        for (pos, (g, w)) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).enumerate() {
            let diff = g.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            if diff > LOGIT_TOLERANCE || argmax(g) != argmax(w) {
                bad.push(format!("{row:?} position {pos}: max |Δlogit| {diff}"));
            }
        }
    }
    bad
}

/// Base and both adapters over the prompts that have adapter references, interleaved.
fn mixed_rows(f: &Fixture) -> Vec<Row> {
    let prompts = &f.lora.logit_prompts;
    let adapters = [None, Some(0), Some(1)];
    prompts.iter().flat_map(|&prompt| adapters.map(|adapter| Row { prompt, adapter })).collect()
}

#[test]
fn a_mixed_batch_matches_transformers_and_peft_row_by_row() {
    for spec in SPECS {
        let f = load(spec);
        let rows = mixed_rows(&f);
        let given: Vec<_> = rows.iter().map(|r| r.adapter).collect();
        let batched = teacher_forced(&f, &rows, &given, usize::MAX);
        let bad = mismatches(&f, &rows, &batched);
        assert!(bad.is_empty(), "{spec:?}: rows off the reference:\n{}", bad.join("\n"));
        let chunked = teacher_forced(&f, &rows, &given, CHUNK);
        for (i, row) in rows.iter().enumerate() {
            let alone = teacher_forced(&f, &rows[i..=i], &given[i..=i], usize::MAX);
            assert!(alone[0] == batched[i], "{spec:?} {row:?}: alone and batched logits differ");
            assert!(chunked[i] == batched[i], "{spec:?} {row:?}: chunked and batched logits differ");
        }
    }
}

#[test]
fn the_wrong_adapter_on_one_row_fails_the_check() {
    for spec in SPECS {
        let f = load(spec);
        let rows = mixed_rows(&f);
        let mut given: Vec<_> = rows.iter().map(|r| r.adapter).collect();
        // The second adapter's row of the first prompt runs through the first instead.
        given[2] = Some(0);
        let bad = mismatches(&f, &rows, &teacher_forced(&f, &rows, &given, usize::MAX));
        assert!(!bad.is_empty(), "{spec:?}: a row through the wrong adapter matched its reference");
        assert!(bad.iter().all(|m| m.contains("adapter: Some(1)")), "only the swapped row may fail: {bad:?}");
    }
}

/// 16 greedy tokens of every prompt, base and both adapters, decoded in one mixed batch.
#[test]
fn greedy_continuations_in_one_mixed_batch_match_the_references() {
    for spec in SPECS {
        greedy_continuations(&load(spec));
    }
}

/// [`greedy_continuations_in_one_mixed_batch_match_the_references`] for one fixture.
fn greedy_continuations(f: &Fixture) {
    let rows: Vec<Row> = (0..f.base.prompts.len())
        .flat_map(|prompt| [None, Some(0), Some(1)].map(|adapter| Row { prompt, adapter }))
        .collect();
    let mut kv = cache(f, 512);
    let mut seqs: Vec<(Vec<u32>, usize, _)> =
        rows.iter().map(|r| (f.base.prompts[r.prompt].clone(), 0, kv.new_sequence())).collect();
    for _ in 0..16 {
        let mut batch = ForwardBatch::new();
        for ((tokens, done, blocks), row) in seqs.iter_mut().zip(&rows) {
            kv.reserve(blocks, tokens.len()).unwrap();
            batch.push(&tokens[*done..], *done, blocks, LogitRows::Last);
            if let Some(a) = row.adapter {
                batch.adapt_last(&f.adapters[a]);
            }
            *done = tokens.len();
        }
        let logits = f.backend.download_f32(&f.model.forward(&batch, &mut kv).unwrap()).unwrap();
        for ((tokens, _, _), row) in seqs.iter_mut().zip(logits.chunks_exact(f.model.vocab_size())) {
            tokens.push(argmax(row) as u32);
        }
    }
    for ((tokens, _, _), row) in seqs.iter().zip(&rows) {
        let want = match row.adapter {
            None => &f.base.greedy[row.prompt],
            Some(a) => &f.lora.adapters[f.spec.adapters[a]].greedy[row.prompt],
        };
        assert_eq!(&tokens[tokens.len() - 16..], &want[..], "{:?} {row:?}: greedy continuation", f.spec);
    }
}

fn load_error(f: &Fixture, dir: &Path, max_rank: usize) -> String {
    let pool = LoraPool::new(&f.cfg, Arc::clone(&f.backend), LoraLimits { max_rank }, 1).unwrap();
    match LoraAdapter::load("bad", dir, &f.cfg, &pool) {
        Err(e @ ModelError::Adapter { .. }) => e.to_string(),
        other => panic!("expected an adapter error, got {other:?}"),
    }
}

/// Copies adapter `name` of `spec` into a temporary directory, with its config edited by
/// `edit`.
fn edited(spec: Spec, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join(spec.lora).join(name);
    std::fs::copy(src.join("adapter_model.safetensors"), tmp.path().join("adapter_model.safetensors")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("adapter_config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(tmp.path().join("adapter_config.json"), config.to_string()).unwrap();
    tmp
}

#[test]
fn bad_adapters_are_refused_naming_what_is_wrong() {
    let f = load(LLAMA);
    let err = load_error(&f, &fixtures().join("lora/r16_rslora"), 8);
    assert!(err.contains("rank 16 is over --max-lora-rank 8"), "{err}");
    let err = load_error(&f, &fixtures().join("lora/missing"), 16);
    assert!(err.contains("adapter_config.json"), "{err}");
    // The tensors are rank 8; a config claiming 4 makes every shape wrong.
    let err = load_error(&f, edited(LLAMA, "r8", |c| c["r"] = 4.into()).path(), 16);
    assert!(err.contains("lora_A.weight` has shape [8, 128], this model needs [4, 128]"), "{err}");
    let err = load_error(
        &f,
        edited(LLAMA, "r8", |c| c["target_modules"] = serde_json::json!(["q_proj", "embed_tokens"])).path(),
        16,
    );
    assert!(err.contains("`embed_tokens`"), "{err}");
    let err = load_error(&f, edited(LLAMA, "r8", |c| c["target_modules"] = serde_json::json!(["q_proj"])).path(), 16);
    assert!(err.contains("which `target_modules` does not list"), "{err}");
}

/// Adapters on experts that do not fit the experts are refused naming the tensor or field.
#[test]
fn bad_expert_adapters_are_refused_naming_what_is_wrong() {
    let f = load(QWEN3_MOE);
    // Without the rank pattern the fused gate/up tensors (rank 16) do not fit r = 8.
    let err = load_error(&f, edited(QWEN3_MOE, "params", |c| c["rank_pattern"] = serde_json::json!({})).path(), 16);
    assert!(err.contains("8 experts at rank 8 need 64 rows of A and columns of B"), "{err}");
    let err = load_error(
        &f,
        edited(QWEN3_MOE, "params", |c| c["target_parameters"] = serde_json::json!(["down_proj"])).path(),
        16,
    );
    assert!(err.contains("gate_up_proj, which `target_parameters` does not list"), "{err}");
    let err = load_error(
        &f,
        edited(QWEN3_MOE, "modules", |c| c["target_modules"] = serde_json::json!(["v_proj", "gate_proj"])).path(),
        16,
    );
    assert!(err.contains("down_proj, which `target_modules` does not list"), "{err}");
    // One expert's tensors gone.
    let tmp = tempfile::tempdir().unwrap();
    let src = fixtures().join("lora_moe/modules");
    std::fs::copy(src.join("adapter_config.json"), tmp.path().join("adapter_config.json")).unwrap();
    let bytes = std::fs::read(src.join("adapter_model.safetensors")).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let kept: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        file.tensors().into_iter().filter(|(n, _)| !n.contains("layers.2.mlp.experts.5.down_proj")).collect();
    safetensors::serialize_to_file(kept, None, &tmp.path().join("adapter_model.safetensors")).unwrap();
    let err = load_error(&f, tmp.path(), 16);
    assert!(err.contains("layer 2: expert 5 has no down_proj adapter"), "{err}");
}
