//! llama.cpp GGUFs of the hybrid fixtures (`qwen3next`, `qwen35`, `qwen35moe`) against
//! the safetensors checkpoints they were converted from.
//!
//! Each `tests/fixtures/hf/<name>/model.gguf` is llama.cpp's `convert_hf_to_gguf.py` run
//! on the `model.safetensors` beside it, in bf16 (`scripts/hybrid_gguf_fixtures.py`). The
//! converter widens to f32 before it transforms, keeps 1-D tensors and norms in f32 and
//! writes matrices back in bf16, so every tensor but `A_log` comes back bit for bit; `A_log`
//! went through `-exp` and comes back through `ln` ([`A_LOG_BOUND`]). Through
//! `met_model_layers::load_model`, the GGUF model must then give the safetensors model's
//! logits (within [`LOGIT_BOUND`], which allows only for that `A_log` rounding) and the
//! greedy tokens of `reference.json`. `qwen3_5/model-mtp.gguf` adds a multi-token-prediction
//! block, which met must leave unread.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use met_cache::{DEFAULT_BLOCK_SIZE, KvCache, PagedKvCache, StateSizing};
use met_config::ModelConfig;
use met_kernels::{CpuBackend, GpuBackend};
use met_model_layers::models::{gguf_config, open_gguf, read_config};
use met_model_layers::runner::{GreedyOptions, argmax, generate_greedy};
use met_model_layers::{ForwardBatch, LoadOptions, LogitRows, Model, load_model};
use met_model_weights::{SafetensorsStore, WeightStore};
use serde::Deserialize;

/// Largest allowed |GGUF − checkpoint| of an `A_log` `x`, less an ulp of `x`: the
/// converter's f32 `exp` is off by at most an ulp of its result (relative 2^-23), which
/// `ln` turns into an absolute 2^-23; the f32 result of `ln` adds at most an ulp of `x`.
const A_LOG_BOUND: f32 = 1.0 / (1 << 22) as f32;

/// Largest allowed |GGUF − safetensors| of any logit: the models differ only by the last
/// bit of some `A_log` values, which moves a decay factor by ~1e-7 relative.
const LOGIT_BOUND: f32 = 1e-5;

#[derive(Deserialize)]
struct Reference {
    prompts: Vec<Vec<u32>>,
    greedy: Vec<Vec<u32>>,
}

fn fixture_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
}

fn reference(name: &str) -> Reference {
    serde_json::from_str(&std::fs::read_to_string(fixture_dir(name).join("reference.json")).unwrap()).unwrap()
}

/// The two configs agree but for what a GGUF cannot say: the saved dtype, and the
/// vision-language wrapper (a GGUF holds the text model only).
fn check_config(name: &str) {
    let dir = fixture_dir(name);
    let want = read_config(&dir.join("config.json")).unwrap();
    let got = gguf_config(&open_gguf(&dir.join("model.gguf")).unwrap()).unwrap();
    let text_type = match want.text_prefix {
        Some(_) => format!("{}_text", want.model_type),
        None => want.model_type.clone(),
    };
    assert_eq!(got.model_type, text_type, "{name}");
    assert_eq!(got.text_prefix, None, "{name}");
    let want = ModelConfig { dtype: None, model_type: text_type, text_prefix: None, ..want };
    assert_eq!(got, want, "{name}");
}

/// Every GGUF tensor that the checkpoint stores under the same name (less the text model's
/// prefix) equals it: bit for bit, `A_log` within [`A_LOG_BOUND`]. Returns the names
/// compared.
fn check_tensors(name: &str) -> Vec<String> {
    let dir = fixture_dir(name);
    let hf = SafetensorsStore::open(&dir.join("model.safetensors")).unwrap();
    let gguf = open_gguf(&dir.join("model.gguf")).unwrap();
    let prefix = if hf.names().iter().any(|n| n.starts_with("model.language_model.")) {
        "model.language_model."
    } else {
        "model."
    };
    let mut compared = Vec::new();
    for g in gguf.names() {
        let stored = g.strip_prefix("model.").map_or(g.clone(), |rest| format!("{prefix}{rest}"));
        let Some(info) = hf.info(&stored) else { continue };
        assert_eq!(gguf.info(&g).unwrap().shape, info.shape, "{name} {g}: shape");
        let want = hf.host(&stored).unwrap().to_f32_vec().unwrap();
        let got = gguf.host(&g).unwrap().to_f32_vec().unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let close = match g.ends_with(".A_log") {
                true => (a - b).abs() <= A_LOG_BOUND + ulp(*b),
                false => a.to_bits() == b.to_bits(),
            };
            assert!(close, "{name} {g}[{i}]: {a} from the GGUF, {b} in the checkpoint");
        }
        compared.push(g);
    }
    compared
}

/// The distance from `x` to the next f32 away from zero.
fn ulp(x: f32) -> f32 {
    f32::from_bits(x.abs().to_bits() + 1) - x.abs()
}

fn load(name: &str, gguf: bool) -> (Box<dyn Model>, Arc<dyn GpuBackend>) {
    load_file(name, gguf.then_some("model.gguf"))
}

/// The fixture's safetensors model, or the GGUF file `gguf` beside it.
fn load_file(name: &str, gguf: Option<&str>) -> (Box<dyn Model>, Arc<dyn GpuBackend>) {
    let dir = fixture_dir(name);
    let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
    let model = if let Some(file) = gguf {
        let store = open_gguf(&dir.join(file)).unwrap();
        load_model(&gguf_config(&store).unwrap(), &store, Arc::clone(&backend), &LoadOptions::default())
    } else {
        let store = SafetensorsStore::open(&dir).unwrap();
        let cfg = read_config(&dir.join("config.json")).unwrap();
        load_model(&cfg, &store, Arc::clone(&backend), &LoadOptions::default())
    };
    (model.unwrap(), backend)
}

fn cache(model: &dyn Model, backend: &dyn GpuBackend) -> PagedKvCache {
    let layout = model.kv_layout();
    let states = layout.state.map(|_| StateSizing { sequences: 8, snapshots: 0, interval: 0, rollback: 0 });
    PagedKvCache::with_states(&[backend], layout, DEFAULT_BLOCK_SIZE, 64, false, states).unwrap()
}

/// Logits at every position of every prompt, all prompts prefilled in one batch.
fn logits(model: &dyn Model, backend: &dyn GpuBackend, prompts: &[Vec<u32>]) -> Vec<f32> {
    let mut kv = cache(model, backend);
    let mut batch = ForwardBatch::new();
    let blocks: Vec<_> = prompts
        .iter()
        .map(|p| {
            let mut b = kv.new_sequence();
            kv.reserve(&mut b, p.len()).unwrap();
            b
        })
        .collect();
    for (p, b) in prompts.iter().zip(&blocks) {
        batch.push(p, 0, b, LogitRows::All);
    }
    backend.download_f32(&model.forward(&batch, &mut kv).unwrap()).unwrap()
}

fn check_logits_and_greedy(name: &str) {
    let reference = reference(name);
    let (hf, hf_backend) = load(name, false);
    let (gguf, backend) = load(name, true);
    let want = logits(&*hf, &*hf_backend, &reference.prompts);
    let got = logits(&*gguf, &*backend, &reference.prompts);
    assert_eq!(got.len(), want.len());
    let vocab = gguf.vocab_size();
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{name}: max |Δlogit| GGUF vs safetensors = {worst:.2e}");
    assert!(worst <= LOGIT_BOUND, "{name}: max |Δlogit| {worst} > {LOGIT_BOUND}");
    for (pos, (g, w)) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).enumerate() {
        assert_eq!(argmax(g), argmax(w), "{name} row {pos}: argmax");
    }
    let options = GreedyOptions { max_new_tokens: 16, ..GreedyOptions::default() };
    let mut kv = cache(&*gguf, &*backend);
    let out = generate_greedy(&*gguf, &*backend, &mut kv, &reference.prompts, &options).unwrap();
    let tokens: Vec<Vec<u32>> = out.into_iter().map(|g| g.tokens).collect();
    assert_eq!(tokens, reference.greedy, "{name}: greedy continuations from the GGUF");
}

#[test]
fn configs_equal_the_checkpoints() {
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        check_config(name);
    }
}

/// The tensors the converter transforms are among those compared: norms (`1 + w`, the gated
/// norm not), `A_log`, the squeezed conv, and Qwen3.5's tiled value heads.
#[test]
fn tensors_equal_the_checkpoints() {
    let transformed = [
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.linear_attn.norm.weight",
        "model.layers.0.linear_attn.A_log",
        "model.layers.0.linear_attn.dt_bias",
        "model.layers.0.linear_attn.conv1d.weight",
        "model.layers.0.linear_attn.out_proj.weight",
        "model.layers.1.self_attn.q_norm.weight",
        "model.layers.1.self_attn.q_proj.weight",
    ];
    let tiled = [
        "model.layers.2.linear_attn.in_proj_qkv.weight",
        "model.layers.2.linear_attn.in_proj_z.weight",
        "model.layers.2.linear_attn.in_proj_b.weight",
        "model.layers.2.linear_attn.in_proj_a.weight",
    ];
    for name in ["qwen3_next", "qwen3_5", "qwen3_5_moe"] {
        let compared = check_tensors(name);
        let must: Vec<&str> = match name {
            "qwen3_next" => [&transformed[..], &["model.layers.2.linear_attn.in_proj_ba.weight"]].concat(),
            _ => [&transformed[..], &tiled[..]].concat(),
        };
        for t in must {
            assert!(compared.iter().any(|c| c == t), "{name}: {t} not compared");
        }
    }
}

#[test]
fn qwen3_next_gguf_matches_safetensors() {
    check_logits_and_greedy("qwen3_next");
}

#[test]
fn qwen3_5_gguf_matches_safetensors() {
    check_logits_and_greedy("qwen3_5");
}

#[test]
fn qwen3_5_moe_gguf_matches_safetensors() {
    check_logits_and_greedy("qwen3_5_moe");
}

/// A GGUF with a multi-token-prediction block (`model-mtp.gguf`: llama.cpp appends it as
/// block 4, with its `nextn` tensors, and sets `nextn_predict_layers`) loads the four
/// decoder layers around it: the config of the file without it, and its logits bit for bit.
#[test]
fn a_gguf_with_a_prediction_block_loads_the_model_around_it() {
    let dir = fixture_dir("qwen3_5");
    let plain = gguf_config(&open_gguf(&dir.join("model.gguf")).unwrap()).unwrap();
    let with_mtp = gguf_config(&open_gguf(&dir.join("model-mtp.gguf")).unwrap()).unwrap();
    assert_eq!(with_mtp, plain, "the prediction block changes no decoder setting");
    let prompts = reference("qwen3_5").prompts;
    let (want, backend) = load_file("qwen3_5", Some("model.gguf"));
    let (got, _) = load_file("qwen3_5", Some("model-mtp.gguf"));
    assert_eq!(logits(&*got, &*backend, &prompts), logits(&*want, &*backend, &prompts));
}
