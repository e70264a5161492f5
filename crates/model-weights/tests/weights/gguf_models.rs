//! Whole-model checks: the tiny Llama fixture against its own Hugging Face checkpoint,
//! and the real SmolLM2 Q4_1 file (skipped when absent).
//!
//! `tiny_llama/model.gguf` was converted from `tiny_llama/model.safetensors` the way
//! llama.cpp converts (Q/K rows permuted, F16 matrices, F32 norms, `rope_freqs`), and
//! transformers reads it back to the original weights (`make_fixtures.py` checks). So
//! every HF tensor must come back from the GGUF exactly, and the config rebuilt from
//! metadata must equal the one `config.json` gives.

use std::path::PathBuf;

use met_config::RopeScaling;
use met_kernels::DType;
use met_model_layers::models::{gguf_config, open_gguf};
use met_model_weights::{GgmlType, SafetensorsStore, TensorSpec, WeightStore, preflight};
use serde::Deserialize;

use crate::gguf_common::fixture;

#[test]
fn tiny_llama_tensors_equal_the_hf_checkpoint() {
    let hf = SafetensorsStore::open(&fixture("tiny_llama/model.safetensors")).unwrap();
    let gguf = open_gguf(&fixture("tiny_llama/model.gguf")).unwrap();
    assert_eq!(gguf.names(), hf.names(), "the same tensor names");
    assert_eq!(gguf.names().len(), 3 + 2 * 9);
    for name in hf.names() {
        let (want, got) = (hf.host(&name).unwrap(), gguf.host(&name).unwrap());
        assert_eq!(got.shape(), want.shape(), "{name}");
        assert_eq!(gguf.info(&name).unwrap().shape, want.shape(), "{name}");
        // F16 in both files (norms widened to F32 in the GGUF, exactly), so values match bit for bit.
        assert_eq!(got.to_f32_vec().unwrap(), want.to_f32_vec().unwrap(), "{name}");
    }
    let q = gguf.host("model.layers.1.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype(), DType::F16, "a permuted F16 tensor stays F16");
    let stored = gguf.file().tensor_data("blk.1.attn_q.weight").unwrap();
    assert_ne!(q.bytes(), stored, "the file's rows are permuted, so un-permuting must change them");
}

#[test]
fn tiny_llama_config_equals_config_json() {
    let want = met_model_layers::models::read_config(&fixture("tiny_llama/config.json")).unwrap();
    let got = gguf_config(&open_gguf(&fixture("tiny_llama/model.gguf")).unwrap()).unwrap();
    assert_eq!(got.model_type, want.model_type);
    assert_eq!(got.vocab_size, want.vocab_size);
    assert_eq!(got.hidden_size, want.hidden_size);
    assert_eq!(got.intermediate_size, want.intermediate_size);
    assert_eq!(got.num_layers, want.num_layers);
    assert_eq!(got.num_heads, want.num_heads);
    assert_eq!(got.num_kv_heads, want.num_kv_heads);
    assert_eq!(got.head_dim, want.head_dim);
    assert_eq!(got.max_position_embeddings, want.max_position_embeddings);
    assert_eq!(got.rms_norm_eps, want.rms_norm_eps);
    assert_eq!(got.rope.theta, want.rope.theta);
    assert_eq!(got.rope.scaling, want.rope.scaling, "Llama 3 scaling recovered from rope_freqs.weight");
    assert!(matches!(got.rope.scaling, RopeScaling::Llama3 { factor: 8.0, .. }));
    assert_eq!(got.tie_word_embeddings, want.tie_word_embeddings);
    assert_eq!(
        (got.qkv_bias, got.o_bias, got.mlp_bias, got.qk_norm),
        (want.qkv_bias, want.o_bias, want.mlp_bias, want.qk_norm)
    );
    assert_eq!(got.layer_windows, want.layer_windows);
    assert_eq!(got.moe, want.moe);
    assert_eq!(got.bos_token_id, want.bos_token_id);
    assert_eq!(got.eos_token_ids, want.eos_token_ids);
    // Only the saved dtype differs: a GGUF has none to report.
    assert_eq!(met_config::ModelConfig { dtype: None, ..want }, got);
}

#[test]
fn tiny_llama_reference_logits_are_recorded() {
    #[derive(Deserialize)]
    struct Logits {
        prompt: Vec<u32>,
        logits: Vec<Vec<f32>>,
    }
    let text = std::fs::read_to_string(fixture("tiny_llama/logits.json")).unwrap();
    let record: Logits = serde_json::from_str(&text).unwrap();
    assert_eq!(record.logits.len(), record.prompt.len());
    assert!(record.logits.iter().all(|row| row.len() == 256 && row.iter().all(|v| v.is_finite())));
}

// --- the real file ------------------------------------------------------------------------

/// `$MET_HOME/models/SmolLM2-135M-Instruct.Q4_1.gguf` (MET_HOME defaults to
/// `~/.cache/met`), if present; otherwise the test is skipped with a note.
fn real_file() -> Option<PathBuf> {
    met_config::default_model_for_test()
}

/// The HF tensors of a tied-embedding Llama of SmolLM2-135M's size.
fn smollm2_specs() -> Vec<TensorSpec> {
    let (h, kv, ff, v) = (576, 192, 1536, 49152);
    let mut specs =
        vec![TensorSpec::new("model.embed_tokens.weight", &[v, h]), TensorSpec::new("model.norm.weight", &[h])];
    for l in 0..30 {
        let p = |s: &str| format!("model.layers.{l}.{s}.weight");
        specs.extend([
            TensorSpec::new(p("input_layernorm"), &[h]),
            TensorSpec::new(p("post_attention_layernorm"), &[h]),
            TensorSpec::new(p("self_attn.q_proj"), &[h, h]),
            TensorSpec::new(p("self_attn.k_proj"), &[kv, h]),
            TensorSpec::new(p("self_attn.v_proj"), &[kv, h]),
            TensorSpec::new(p("self_attn.o_proj"), &[h, h]),
            TensorSpec::new(p("mlp.gate_proj"), &[ff, h]),
            TensorSpec::new(p("mlp.up_proj"), &[ff, h]),
            TensorSpec::new(p("mlp.down_proj"), &[h, ff]),
        ]);
    }
    specs
}

#[test]
fn smollm2_opens_with_hf_names_and_config() {
    let Some(path) = real_file() else { return };
    let store = open_gguf(&path).unwrap();
    assert_eq!(store.file().tensors().len(), 272);
    assert_eq!(store.names().len(), 272);
    preflight(&store, &smollm2_specs(), &[]).unwrap();

    let c = gguf_config(&store).unwrap();
    assert_eq!(c.model_type, "llama");
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (576, 30, 9, 3, 64));
    assert_eq!((c.vocab_size, c.intermediate_size, c.max_position_embeddings), (49152, 1536, 8192));
    assert_eq!((c.rope.theta, c.rope.scaling, c.rms_norm_eps), (100_000.0, RopeScaling::None, 1e-5));
    assert!(c.tie_word_embeddings);
    assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice()), (Some(1), &[2][..]));

    let file = store.file();
    assert_eq!(file.get_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert!(file.get_str("tokenizer.chat_template").unwrap().contains("im_start"));
}

#[derive(Deserialize)]
struct Picks {
    tensors: Vec<Pick>,
}

#[derive(Deserialize)]
struct Pick {
    name: String,
    ggml_type: String,
    row: Option<usize>,
    shape: Vec<usize>,
    values: Vec<f32>,
}

#[test]
fn smollm2_values_match_gguf_py() {
    let Some(path) = real_file() else { return };
    let store = open_gguf(&path).unwrap();
    let text = std::fs::read_to_string(fixture("smollm2_q4_1.json")).unwrap();
    let picks: Picks = serde_json::from_str(&text).unwrap();
    assert!(picks.tensors.iter().any(|p| p.ggml_type == "Q4_1" && p.name.contains("q_proj")));
    for pick in &picks.tensors {
        let host = store.host(&pick.name).unwrap();
        assert_eq!(host.shape(), pick.shape, "{}", pick.name);
        assert_eq!(store.raw(&pick.name).unwrap().unwrap().ggml_type.name(), pick.ggml_type, "{}", pick.name);
        let values = host.to_f32_vec().unwrap();
        let cols = pick.shape.last().copied().unwrap_or(1);
        let start = pick.row.unwrap_or(0) * cols;
        assert_eq!(&values[start..start + pick.values.len()], pick.values, "{} row {:?}", pick.name, pick.row);
    }
}

#[test]
fn smollm2_raw_q4_1_rows_dequantise_to_host() {
    let Some(path) = real_file() else { return };
    let store = open_gguf(&path).unwrap();
    for name in ["model.layers.7.self_attn.q_proj.weight", "model.layers.7.self_attn.k_proj.weight"] {
        let raw = store.raw(name).unwrap().unwrap();
        assert_eq!(raw.ggml_type, GgmlType::Q4_1);
        let (rows, cols) = (raw.shape[0], raw.shape[1]);
        assert_eq!(raw.bytes.len(), rows * cols / 32 * 20);
        let mut out = vec![0f32; rows * cols];
        met_model_weights::gguf::dequantize(raw.ggml_type, &raw.bytes, &mut out);
        assert_eq!(out, store.host(name).unwrap().to_f32_vec().unwrap(), "{name}");
    }
}
