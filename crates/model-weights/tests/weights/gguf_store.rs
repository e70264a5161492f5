//! `GgufStore` on small synthetic files: Hugging Face names and shapes for each
//! architecture, the Llama Q/K un-permutation (f32 and raw quantised bytes), stacked
//! experts, the config rebuilt from metadata, and the errors.

use met_config::RopeScaling;
use met_kernels::DType;
use met_model_layers::models::{gguf_config, open_gguf};
use met_model_weights::{GgmlType, GgufStore, TensorSpec, WeightError, WeightStore, preflight};

use proptest::prelude::*;

use crate::gguf_common::{Gguf, q8_0, temp_file};

const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FF: usize = 32;
const VOCAB: usize = 40;

/// llama.cpp's converter permutation (`LlamaModel.permute`) of the rows of an HF
/// matrix: view rows as `[heads, 2, d/2]`, swap the last two axes, flatten.
fn converter_permute<T: Clone>(rows: &[T], heads: usize) -> Vec<T> {
    let d = rows.len() / heads;
    let mut out = Vec::with_capacity(rows.len());
    for h in 0..heads {
        for i in 0..d / 2 {
            for s in 0..2 {
                out.push(rows[h * d + s * (d / 2) + i].clone());
            }
        }
    }
    out
}

/// An HF `[rows, cols]` matrix of small distinct integers (exact in Q8_0 with d = 1).
pub(crate) fn int_matrix(rows: usize, cols: usize, seed: usize) -> Vec<Vec<i8>> {
    (0..rows).map(|r| (0..cols).map(|c| (((r * 7 + c * 3 + seed) % 200) as i16 - 100) as i8).collect()).collect()
}

fn to_f32(m: &[Vec<i8>]) -> Vec<f32> {
    m.iter().flatten().map(|&q| f32::from(q)).collect()
}

fn ramp(n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 - n as f32 / 2.0) * scale).collect()
}

/// The common `{arch}.*` metadata of the synthetic models.
pub(crate) fn metadata(arch: &str, layers: u32) -> Gguf {
    let k = |s: &str| format!("{arch}.{s}");
    Gguf::new()
        .str("general.architecture", arch)
        .u32(&k("block_count"), layers)
        .u32(&k("context_length"), 4096)
        .u32(&k("embedding_length"), HIDDEN as u32)
        .u32(&k("feed_forward_length"), FF as u32)
        .u32(&k("attention.head_count"), HEADS as u32)
        .u32(&k("attention.head_count_kv"), KV_HEADS as u32)
        .f32(&k("rope.freq_base"), 10_000.0)
        .f32(&k("attention.layer_norm_rms_epsilon"), 1e-6)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
}

/// A one-layer llama: Q/K in Q8_0 (permuted as the converter does), V in F16, the
/// rest F32, untied output head.
fn llama() -> (Gguf, Vec<Vec<i8>>, Vec<Vec<i8>>) {
    let q = int_matrix(HEADS * HEAD_DIM, HIDDEN, 1);
    let k = int_matrix(KV_HEADS * HEAD_DIM, HIDDEN, 2);
    let stored_q: Vec<i8> = converter_permute(&q, HEADS).concat();
    let stored_k: Vec<i8> = converter_permute(&k, KV_HEADS).concat();
    let gguf = metadata("llama", 1)
        .u32("llama.vocab_size", VOCAB as u32)
        .f32_tensor("token_embd.weight", &[VOCAB, HIDDEN], &ramp(VOCAB * HIDDEN, 0.01))
        .f32_tensor("output_norm.weight", &[HIDDEN], &ramp(HIDDEN, 0.1))
        .f32_tensor("output.weight", &[VOCAB, HIDDEN], &ramp(VOCAB * HIDDEN, 0.02))
        .f32_tensor("blk.0.attn_norm.weight", &[HIDDEN], &ramp(HIDDEN, 0.3))
        .f32_tensor("blk.0.ffn_norm.weight", &[HIDDEN], &ramp(HIDDEN, 0.4))
        .tensor("blk.0.attn_q.weight", &[HEADS * HEAD_DIM, HIDDEN], GgmlType::Q8_0, q8_0(1.0, &stored_q))
        .tensor("blk.0.attn_k.weight", &[KV_HEADS * HEAD_DIM, HIDDEN], GgmlType::Q8_0, q8_0(1.0, &stored_k))
        .f16_tensor("blk.0.attn_v.weight", &[KV_HEADS * HEAD_DIM, HIDDEN], &ramp(KV_HEADS * HEAD_DIM * HIDDEN, 0.25))
        .f32_tensor("blk.0.attn_output.weight", &[HIDDEN, HEADS * HEAD_DIM], &ramp(HIDDEN * HIDDEN, 0.5))
        .f32_tensor("blk.0.ffn_gate.weight", &[FF, HIDDEN], &ramp(FF * HIDDEN, 0.6))
        .f32_tensor("blk.0.ffn_up.weight", &[FF, HIDDEN], &ramp(FF * HIDDEN, 0.7))
        .f32_tensor("blk.0.ffn_down.weight", &[HIDDEN, FF], &ramp(FF * HIDDEN, 0.8));
    (gguf, q, k)
}

pub(crate) fn open(gguf: &Gguf) -> (tempfile::TempDir, std::path::PathBuf, Result<GgufStore, WeightError>) {
    let (dir, path) = temp_file(&gguf.bytes());
    let store = open_gguf(&path);
    (dir, path, store)
}

/// The tensors a one-layer llama of the constants above expects, HF names and shapes.
fn llama_specs(layers: usize, tied: bool) -> Vec<TensorSpec> {
    let mut specs = vec![
        TensorSpec::new("model.embed_tokens.weight", &[VOCAB, HIDDEN]),
        TensorSpec::new("model.norm.weight", &[HIDDEN]),
    ];
    if !tied {
        specs.push(TensorSpec::new("lm_head.weight", &[VOCAB, HIDDEN]));
    }
    for l in 0..layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        specs.extend([
            TensorSpec::new(p("input_layernorm.weight"), &[HIDDEN]),
            TensorSpec::new(p("post_attention_layernorm.weight"), &[HIDDEN]),
            TensorSpec::new(p("self_attn.q_proj.weight"), &[HEADS * HEAD_DIM, HIDDEN]),
            TensorSpec::new(p("self_attn.k_proj.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN]),
            TensorSpec::new(p("self_attn.v_proj.weight"), &[KV_HEADS * HEAD_DIM, HIDDEN]),
            TensorSpec::new(p("self_attn.o_proj.weight"), &[HIDDEN, HEADS * HEAD_DIM]),
            TensorSpec::new(p("mlp.gate_proj.weight"), &[FF, HIDDEN]),
            TensorSpec::new(p("mlp.up_proj.weight"), &[FF, HIDDEN]),
            TensorSpec::new(p("mlp.down_proj.weight"), &[HIDDEN, FF]),
        ]);
    }
    specs
}

#[test]
fn llama_tensors_have_hf_names_shapes_and_values() {
    let (gguf, q, k) = llama();
    let (_d, path, store) = open(&gguf);
    let store = store.unwrap();
    preflight(&store, &llama_specs(1, false), &[]).unwrap();
    assert!(store.describe().contains(&path.display().to_string()));

    // Un-permuted Q and K equal the HF matrices, dequantised and still quantised.
    for (name, hf) in [("model.layers.0.self_attn.q_proj.weight", &q), ("model.layers.0.self_attn.k_proj.weight", &k)] {
        let host = store.host(name).unwrap();
        assert_eq!(host.dtype(), DType::Quant(met_kernels::quant::QuantFormat::Q8_0), "blocks stay blocks");
        assert_eq!(host.to_f32_vec().unwrap(), to_f32(hf), "{name}");
        let raw = store.raw(name).unwrap().unwrap();
        assert_eq!(raw.ggml_type, GgmlType::Q8_0);
        assert_eq!(raw.shape, [hf.len(), HIDDEN]);
        assert_eq!(raw.bytes.as_ref(), q8_0(1.0, &hf.concat()), "{name}: raw rows in HF order");
    }
    // Unpermuted F16 and F32 tensors are borrowed as stored.
    let v = store.host("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!((v.dtype(), v.shape()), (DType::F16, &[KV_HEADS * HEAD_DIM, HIDDEN][..]));
    assert_eq!(v.to_f32_vec().unwrap(), ramp(KV_HEADS * HEAD_DIM * HIDDEN, 0.25));
    let down = store.host("model.layers.0.mlp.down_proj.weight").unwrap();
    assert_eq!((down.dtype(), down.shape()), (DType::F32, &[HIDDEN, FF][..]));
    assert_eq!(down.to_f32_vec().unwrap(), ramp(FF * HIDDEN, 0.8));
    assert!(matches!(
        store.raw("model.layers.0.mlp.down_proj.weight").unwrap().unwrap().bytes,
        std::borrow::Cow::Borrowed(_)
    ));
    assert!(store.raw("nope").is_none());
    assert!(matches!(store.host("nope"), Err(WeightError::Missing { .. })));
}

#[test]
fn permuted_f16_projections_keep_their_dtype() {
    let q: Vec<f32> = (0..HEADS * HEAD_DIM * HIDDEN).map(|i| (i / HIDDEN) as f32).collect();
    let rows: Vec<Vec<f32>> = q.chunks(HIDDEN).map(<[f32]>::to_vec).collect();
    let stored = converter_permute(&rows, HEADS).concat();
    let gguf = metadata("llama", 1).f16_tensor("blk.0.attn_q.weight", &[HEADS * HEAD_DIM, HIDDEN], &stored);
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    let host = store.host("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(host.dtype(), DType::F16);
    assert_eq!(host.to_f32_vec().unwrap(), q, "row r of HF q_proj holds r");
}

#[test]
fn llama_config_from_metadata() {
    let (gguf, _, _) = llama();
    let (_d, path, store) = open(&gguf);
    let store = store.unwrap();
    let json = store.config_json().unwrap();
    assert_eq!(json["model_type"], "llama");
    assert_eq!(json["rms_norm_eps"], 1e-6, "the f32 metadata is written back as its decimal");
    let c = gguf_config(&store).unwrap();
    assert_eq!(c.model_type, "llama");
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads), (HIDDEN, 1, HEADS, KV_HEADS));
    assert_eq!((c.head_dim, c.intermediate_size, c.vocab_size), (HEAD_DIM, FF, VOCAB));
    assert_eq!((c.max_position_embeddings, c.rms_norm_eps, c.rope.theta), (4096, 1e-6, 10_000.0));
    assert_eq!(c.rope.scaling, RopeScaling::None);
    assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.mlp_bias && !c.qk_norm);
    assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice()), (Some(1), &[2][..]));
    assert!(store.file().path() == path);

    let linear = gguf.clone().str("llama.rope.scaling.type", "linear").f32("llama.rope.scaling.factor", 4.0);
    let (_d, _p, store) = open(&linear);
    assert_eq!(gguf_config(&store.unwrap()).unwrap().rope.scaling, RopeScaling::Linear { factor: 4.0 });
}

#[test]
fn vocab_size_falls_back_to_the_tokenizer_then_the_embedding() {
    let tokens: Vec<String> = (0..VOCAB + 3).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let norm = |g: Gguf| g.f32_tensor("output_norm.weight", &[2], &[1.0, 1.0]);
    let (_d, _p, store) = open(&norm(metadata("llama", 1).strs("tokenizer.ggml.tokens", &refs)));
    assert_eq!(gguf_config(&store.unwrap()).unwrap().vocab_size, VOCAB + 3);
    let embd_only = metadata("llama", 1).f32_tensor("token_embd.weight", &[7, 2], &[0.0; 14]);
    let (_d, _p, store) = open(&embd_only);
    assert_eq!(gguf_config(&store.unwrap()).unwrap().vocab_size, 7);
    let (_d, path, store) = open(&norm(metadata("llama", 1)));
    assert_metadata_error(store.unwrap().config_json().unwrap_err(), &path, "llama.vocab_size", "missing");
}

#[test]
fn qwen2_keeps_rows_and_has_biases() {
    let q = ramp(HEADS * HEAD_DIM * HIDDEN, 1.0);
    let gguf = metadata("qwen2", 1)
        .u32("qwen2.vocab_size", VOCAB as u32)
        .f32_tensor("token_embd.weight", &[VOCAB, HIDDEN], &ramp(VOCAB * HIDDEN, 0.01))
        .f32_tensor("blk.0.attn_q.weight", &[HEADS * HEAD_DIM, HIDDEN], &q)
        .f32_tensor("blk.0.attn_q.bias", &[HEADS * HEAD_DIM], &ramp(HEADS * HEAD_DIM, 1.0))
        .f32_tensor("blk.0.attn_k.bias", &[KV_HEADS * HEAD_DIM], &ramp(KV_HEADS * HEAD_DIM, 1.0));
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    assert_eq!(store.host("model.layers.0.self_attn.q_proj.weight").unwrap().to_f32_vec().unwrap(), q);
    let bias = store.host("model.layers.0.self_attn.q_proj.bias").unwrap();
    assert_eq!(bias.to_f32_vec().unwrap(), ramp(HEADS * HEAD_DIM, 1.0), "qwen2 rows are not permuted");
    let c = gguf_config(&store).unwrap();
    assert_eq!(c.model_type, "qwen2");
    assert!(c.qkv_bias && c.tie_word_embeddings);
    assert_eq!(store.config_json().unwrap()["attention_bias"], true);
}

#[test]
fn llama_biases_are_permuted_too() {
    let bias: Vec<f32> = (0..HEADS * HEAD_DIM).map(|r| r as f32).collect();
    let stored = converter_permute(&bias, HEADS);
    let gguf = metadata("llama", 1).f32_tensor("blk.0.attn_q.bias", &[HEADS * HEAD_DIM], &stored);
    let (_d, _p, store) = open(&gguf);
    assert_eq!(store.unwrap().host("model.layers.0.self_attn.q_proj.bias").unwrap().to_f32_vec().unwrap(), bias);
}

#[test]
fn qwen3_q_k_norms_and_head_dim() {
    let gguf = metadata("qwen3", 1)
        .u32("qwen3.attention.key_length", 32)
        .u32("qwen3.vocab_size", VOCAB as u32)
        .f32_tensor("blk.0.attn_q_norm.weight", &[32], &ramp(32, 1.0))
        .f32_tensor("blk.0.attn_k_norm.weight", &[32], &ramp(32, 2.0));
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    assert_eq!(store.names(), ["model.layers.0.self_attn.k_norm.weight", "model.layers.0.self_attn.q_norm.weight"]);
    let c = gguf_config(&store).unwrap();
    assert_eq!((c.model_type.as_str(), c.head_dim, c.qk_norm), ("qwen3", 32, true));
}

/// A one-layer Gemma 2: llama.cpp's names for the four norms (`ffn_norm` is the
/// pre-feed-forward one), norm weights stored as `1 + w`, and the soft-caps and window in
/// `gemma2.*` keys.
#[test]
fn gemma2_names_norms_and_config() {
    let stored: Vec<f32> = ramp(HIDDEN, 0.01).iter().map(|v| v + 1.0).collect();
    // What the converter started from, up to the f32 rounding of its `w + 1`.
    let w: Vec<f32> = stored.iter().map(|v| v - 1.0).collect();
    let gguf = metadata("gemma2", 1)
        .u32("gemma2.attention.key_length", HEAD_DIM as u32)
        .u32("gemma2.attention.sliding_window", 16)
        .f32("gemma2.attn_logit_softcapping", 50.0)
        .f32("gemma2.final_logit_softcapping", 30.0)
        .u32("gemma2.vocab_size", VOCAB as u32)
        .f32_tensor("blk.0.attn_norm.weight", &[HIDDEN], &stored)
        .f32_tensor("blk.0.post_attention_norm.weight", &[HIDDEN], &stored)
        .f32_tensor("blk.0.ffn_norm.weight", &[HIDDEN], &stored)
        .f32_tensor("blk.0.post_ffw_norm.weight", &[HIDDEN], &stored)
        .f32_tensor("blk.0.attn_q.weight", &[HEADS * HEAD_DIM, HIDDEN], &ramp(HEADS * HEAD_DIM * HIDDEN, 0.5));
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    let layer = |n: &str| format!("model.layers.0.{n}.weight");
    for norm in
        ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"]
    {
        assert_eq!(
            store.host(&layer(norm)).unwrap().to_f32_vec().unwrap(),
            w,
            "{norm}: the converter's 1 is taken off"
        );
    }
    let q = store.host(&layer("self_attn.q_proj")).unwrap().to_f32_vec().unwrap();
    assert_eq!(q, ramp(HEADS * HEAD_DIM * HIDDEN, 0.5), "gemma2 rows are neither permuted nor shifted");
    let json = store.config_json().unwrap();
    assert_eq!(
        (json["model_type"].as_str(), json["hidden_activation"].as_str()),
        (Some("gemma2"), Some("gelu_pytorch_tanh"))
    );
    let c = gguf_config(&store).unwrap();
    assert_eq!((c.attention_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(c.layer_windows, [Some(16)]);
    assert_eq!(c.attention_scale, Some((HEAD_DIM as f64).powf(-0.5)), "query_pre_attn_scalar is the head dim");
    assert!(c.scale_embeddings && c.tie_word_embeddings);
    assert_eq!(c.activation, met_config::Activation::GeluTanh);
    assert_eq!(c.norm_weight, met_config::NormWeight::UnitOffset);
}

/// Gemma 3: the global rotary base from `rope.freq_base`, llama.cpp's assumed local base
/// and layer pattern (every sixth layer global), q/k norms shifted like the others.
#[test]
fn gemma3_rope_pattern_and_q_k_norms() {
    let stored: Vec<f32> = ramp(32, 0.01).iter().map(|v| v + 1.0).collect();
    let w: Vec<f32> = stored.iter().map(|v| v - 1.0).collect();
    let gguf = metadata("gemma3", 7)
        .without("gemma3.rope.freq_base")
        .f32("gemma3.rope.freq_base", 1_000_000.0)
        .u32("gemma3.attention.key_length", 32)
        .u32("gemma3.attention.sliding_window", 512)
        .u32("gemma3.vocab_size", VOCAB as u32)
        .f32_tensor("blk.0.attn_q_norm.weight", &[32], &stored)
        .f32_tensor("blk.0.attn_k_norm.weight", &[32], &stored);
    // Every layer holds a tensor, as the layer count's bound on the file requires.
    let gguf = (1..7).fold(gguf, |g, i| g.f32_tensor(&format!("blk.{i}.attn_norm.weight"), &[HIDDEN], &[1.0; HIDDEN]));
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    let q_norm = store.host("model.layers.0.self_attn.q_norm.weight").unwrap().to_f32_vec().unwrap();
    assert_eq!(q_norm, w);
    let c = gguf_config(&store).unwrap();
    assert_eq!(c.model_type, "gemma3_text");
    assert!(c.qk_norm);
    let sliding = [true, true, true, true, true, false, true];
    assert_eq!(c.layer_windows, sliding.map(|s| s.then_some(512)));
    let thetas: Vec<f64> = c.layer_rope.iter().map(|r| r.theta).collect();
    assert_eq!(thetas, sliding.map(|s| if s { 10_000.0 } else { 1_000_000.0 }));
    assert_eq!((c.attention_softcap, c.final_softcap), (None, None));
}

const E: usize = 4;

/// A two-layer Qwen3-MoE: layer 0 routed (F32 gate/down stacks, Q8_0 up), layer 1 dense.
fn qwen3_moe() -> (Gguf, Vec<f32>, Vec<f32>) {
    let gate = ramp(E * FF * HIDDEN, 0.5);
    let down = ramp(E * HIDDEN * FF, 0.25);
    let gguf = metadata("qwen3moe", 2)
        .u32("qwen3moe.vocab_size", VOCAB as u32)
        .u32("qwen3moe.expert_count", E as u32)
        .u32("qwen3moe.expert_used_count", 2)
        .u32("qwen3moe.expert_feed_forward_length", FF as u32)
        .f32_tensor("blk.0.ffn_gate_inp.weight", &[E, HIDDEN], &ramp(E * HIDDEN, 1.0))
        .f32_tensor("blk.0.ffn_gate_exps.weight", &[E, FF, HIDDEN], &gate)
        .tensor("blk.0.ffn_up_exps.weight", &[E, FF, HIDDEN], GgmlType::Q8_0, q8_0(0.5, &vec![3; E * FF * HIDDEN]))
        .f32_tensor("blk.0.ffn_down_exps.weight", &[E, HIDDEN, FF], &down)
        .f32_tensor("blk.1.ffn_gate.weight", &[FF, HIDDEN], &ramp(FF * HIDDEN, 1.0));
    (gguf, gate, down)
}

#[test]
fn qwen3_moe_experts_are_split_per_expert() {
    let (gguf, gate, down) = qwen3_moe();
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    assert_eq!(store.info("model.layers.0.mlp.gate.weight").unwrap().shape, [E, HIDDEN]);
    for e in 0..E {
        let name = |p: &str| format!("model.layers.0.mlp.experts.{e}.{p}.weight");
        let g = store.host(&name("gate_proj")).unwrap();
        assert_eq!(g.shape(), [FF, HIDDEN]);
        assert_eq!(g.to_f32_vec().unwrap(), gate[e * FF * HIDDEN..(e + 1) * FF * HIDDEN], "expert {e}");
        let d = store.host(&name("down_proj")).unwrap();
        assert_eq!(d.shape(), [HIDDEN, FF]);
        assert_eq!(d.to_f32_vec().unwrap(), down[e * FF * HIDDEN..(e + 1) * FF * HIDDEN], "expert {e}");
        let up = store.raw(&name("up_proj")).unwrap().unwrap();
        assert_eq!(
            (up.ggml_type, up.shape.as_slice(), up.bytes.len()),
            (GgmlType::Q8_0, &[FF, HIDDEN][..], FF * HIDDEN / 32 * 34)
        );
        assert_eq!(store.host(&name("up_proj")).unwrap().to_f32_vec().unwrap(), vec![1.5; FF * HIDDEN]);
    }
    assert!(store.host("model.layers.0.mlp.experts.4.gate_proj.weight").is_err());
    let c = gguf_config(&store).unwrap();
    let moe = c.moe.unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (E, 2, FF));
    assert!(moe.norm_topk_prob);
    assert_eq!(moe.sparse_layers, [true, false], "layer 1 has a dense MLP");
}

#[test]
fn other_tensors_keep_their_gguf_names_and_rope_freqs_is_hidden() {
    let (gguf, _, _) = llama();
    let gguf =
        gguf.f32_tensor("blk.0.weird.weight", &[2], &[1.0, 2.0]).f32_tensor("rope_freqs.weight", &[8], &[1.0; 8]);
    let (_d, _p, store) = open(&gguf);
    let store = store.unwrap();
    assert!(store.names().contains(&"blk.0.weird.weight".to_string()));
    assert!(!store.names().iter().any(|n| n.contains("rope_freqs")));
    let err = preflight(&store, &llama_specs(1, false), &[]).unwrap_err().to_string();
    assert!(err.contains("unexpected: blk.0.weird.weight"), "{err}");
}

#[test]
fn unsupported_ggml_types_are_listed_but_unloadable() {
    let (gguf, _, _) = llama();
    let gguf = gguf.tensor("blk.0.ffn_up.bias", &[256], GgmlType::Q2_K, vec![0; 84]);
    let (_d, path, store) = open(&gguf);
    let store = store.unwrap();
    let name = "model.layers.0.mlp.up_proj.bias";
    assert!(store.names().contains(&name.to_string()));
    assert!(store.info(name).is_none());
    let err = store.host(name).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, WeightError::UnsupportedGgmlType { .. }), "{msg}");
    assert!(msg.contains(name) && msg.contains("Q2_K") && msg.contains(&path.display().to_string()), "{msg}");
    assert_eq!(store.raw(name).unwrap().unwrap().ggml_type, GgmlType::Q2_K, "raw access still works");
    let mut specs = llama_specs(1, false);
    specs.push(TensorSpec::new(name, &[256]));
    let report = preflight(&store, &specs, &[]).unwrap_err().to_string();
    assert!(report.contains("unloadable") && report.contains("Q2_K"), "{report}");
}

/// Asserts a metadata error about `key` of the file at `path` containing `needle`.
pub(crate) fn assert_metadata_error(err: WeightError, path: &std::path::Path, key: &str, needle: &str) {
    let msg = err.to_string();
    assert!(matches!(&err, WeightError::Metadata { key: k, .. } if k == key), "{msg}");
    assert!(msg.contains(&path.display().to_string()) && msg.contains(needle), "{msg}");
}

#[test]
fn unsupported_architecture() {
    let (_d, path, store) = open(&Gguf::new().str("general.architecture", "phi3"));
    assert_metadata_error(store.unwrap_err(), &path, "general.architecture", "unsupported architecture `phi3`");
    let (_d, path, store) = open(&Gguf::new());
    assert_metadata_error(store.unwrap_err(), &path, "general.architecture", "missing");
}

#[test]
fn missing_or_bad_config_keys_are_named() {
    let gguf = Gguf::new().str("general.architecture", "llama").u32("llama.attention.head_count", 4);
    let (_d, path, store) = open(&gguf);
    assert_metadata_error(store.unwrap().config_json().unwrap_err(), &path, "llama.embedding_length", "missing");

    let huge = metadata("llama", 1).without("llama.block_count").u64("llama.block_count", 1 << 40);
    let (_d, path, store) = open(&huge);
    let err = store.unwrap().config_json().unwrap_err();
    assert_metadata_error(err, &path, "llama.block_count", "holds only");

    let bad_type = metadata("llama", 1).without("llama.context_length").str("llama.context_length", "long").f32_tensor(
        "output_norm.weight",
        &[2],
        &[1.0, 1.0],
    );
    let (_d, path, store) = open(&bad_type);
    let store = store.unwrap_or_else(|e| panic!("{e}"));
    assert_metadata_error(
        store.config_json().unwrap_err(),
        &path,
        "llama.context_length",
        "expected an unsigned integer",
    );

    // A value the config validator rejects comes back as a config error naming the file.
    let zero_heads = metadata("qwen2", 1)
        .without("qwen2.attention.head_count")
        .u32("qwen2.attention.head_count", 0)
        .u32("qwen2.vocab_size", 8)
        .f32_tensor("output_norm.weight", &[2], &[1.0, 1.0]);
    let (_d, path, store) = open(&zero_heads);
    let err = gguf_config(&store.unwrap()).unwrap_err();
    assert!(matches!(err, WeightError::Config(_)), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()), "{err}");
}

#[test]
fn projections_that_do_not_split_into_heads_fail_at_open() {
    let gguf = metadata("llama", 1).f32_tensor("blk.0.attn_k.weight", &[30, 2], &[0.0; 60]);
    let (_d, path, store) = open(&gguf);
    let msg = store.unwrap_err().to_string();
    assert!(msg.contains("blk.0.attn_k.weight") && msg.contains(&path.display().to_string()), "{msg}");
}

#[test]
fn two_tensors_for_one_hf_name_fail_at_open() {
    let gguf =
        metadata("llama", 1).f32_tensor("output.weight", &[2], &[0.0; 2]).f32_tensor("lm_head.weight", &[2], &[0.0; 2]);
    let (_d, _p, store) = open(&gguf);
    let msg = store.unwrap_err().to_string();
    assert!(msg.contains("both map to `lm_head.weight`"), "{msg}");
    let bad_experts = metadata("qwen3moe", 1).f32_tensor("blk.0.ffn_up_exps.weight", &[4, 4], &[0.0; 16]);
    let (_d, _p, store) = open(&bad_experts);
    assert!(store.unwrap_err().to_string().contains("3-D"));
}

#[test]
fn rope_freqs_that_are_not_llama3_are_refused() {
    let gguf = metadata("llama", 1)
        .u32("llama.vocab_size", 8)
        .u32("llama.attention.key_length", HEAD_DIM as u32)
        .f32_tensor("rope_freqs.weight", &[HEAD_DIM / 2], &[1.0, 2.0, 1.0, 2.0, 1.0, 2.0, 1.0, 2.0]);
    let (_d, path, store) = open(&gguf);
    let err = store.unwrap().config_json().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, WeightError::Format { .. }), "{msg}");
    assert!(msg.contains("rope_freqs.weight") && msg.contains(&path.display().to_string()), "{msg}");
}

#[test]
fn an_expert_count_that_disagrees_with_the_tensors_is_refused() {
    let (gguf, _, _) = qwen3_moe();
    let gguf = gguf.without("qwen3moe.expert_count").u64("qwen3moe.expert_count", 1 << 50);
    let (_d, path, store) = open(&gguf);
    assert_metadata_error(store.unwrap().config_json().unwrap_err(), &path, "qwen3moe.expert_count", "has dims");
}

/// Everything a loader does with a store; any outcome but a panic is fine.
fn exercise(bytes: &[u8]) {
    let (_dir, path) = temp_file(bytes);
    let Ok(store) = open_gguf(&path) else { return };
    for name in store.names() {
        let _ = store.info(&name);
        let _ = store.host(&name).map(|h| h.to_f32_vec());
    }
    let _ = gguf_config(&store);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn corrupted_models_never_panic(
        moe in any::<bool>(),
        edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..4),
        header_only in any::<bool>(),
    ) {
        let mut bytes = if moe { qwen3_moe().0.bytes() } else { llama().0.bytes() };
        let span = if header_only { 2000.min(bytes.len()) } else { bytes.len() };
        for (at, value) in edits {
            bytes[(at * span as f64) as usize] = value;
        }
        exercise(&bytes);
    }
}
