//! `config.json` parsing by each architecture's rules (`src/models/<arch>.rs`) against real
//! checkpoint configs (in `configs/` at the repo root) and hand-written edge cases: both
//! rope layouts, per-layer windows, and errors that name the field.

use std::path::{Path, PathBuf};

use met_config::{ConfigError, ModelConfig, RopeScaling};
use met_model_layers::models::{config_from_json, read_config, read_config_with_overrides};

fn real(name: &str) -> ModelConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs").join(name).join("config.json");
    read_config(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn parse(json: &str) -> Result<ModelConfig, ConfigError> {
    config_from_json(&PathBuf::from("test/config.json"), json)
}

fn message(json: &str) -> String {
    parse(json).unwrap_err().to_string()
}

const BASE: &str = r#""vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2"#;

#[test]
fn llama_3_1_8b() {
    let c = real("Llama-3.1-8B-Instruct");
    assert_eq!(c.model_type, "llama");
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (4096, 32, 32, 8, 128));
    assert_eq!(c.vocab_size, 128_256);
    assert_eq!(c.rope.theta, 500_000.0);
    assert_eq!(
        c.rope.scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192
        }
    );
    assert_eq!(c.eos_token_ids, [128_001, 128_008, 128_009]);
    assert!(!c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
    assert!(c.layer_windows.iter().all(Option::is_none));
}

#[test]
fn qwen3_0_6b() {
    let c = real("Qwen3-0.6B");
    assert_eq!(c.model_type, "qwen3");
    assert_eq!((c.hidden_size, c.num_heads, c.head_dim), (1024, 16, 128));
    assert!(c.qk_norm && c.tie_word_embeddings);
    assert_eq!(c.rope.theta, 1e6);
    assert_eq!(c.rope.scaling, RopeScaling::None);
    assert_eq!(c.eos_token_ids, [151_645]);
    assert!(c.moe.is_none());
}

#[test]
fn qwen3_30b_a3b() {
    let c = real("Qwen3-30B-A3B");
    let moe = c.moe.as_ref().expect("moe settings");
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (128, 8, 768));
    assert!(moe.norm_topk_prob);
    assert_eq!(moe.sparse_layers.len(), 48);
    assert!(moe.sparse_layers.iter().all(|&s| s));
}

#[test]
fn qwen3_8b_is_untied() {
    assert!(!real("Qwen3-8B").tie_word_embeddings);
}

#[test]
fn both_rope_layouts_parse_to_the_same_config() {
    let classic = parse(&format!(
        r#"{{"model_type": "llama", {BASE}, "rope_theta": 500000.0,
            "rope_scaling": {{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
    ))
    .unwrap();
    let v5 = parse(&format!(
        r#"{{"model_type": "llama", {BASE}, "rope_parameters": {{"rope_type": "llama3",
            "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}}"#
    ))
    .unwrap();
    assert_eq!(classic, v5);
    let old_key =
        parse(&format!(r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"type": "linear", "factor": 2}}}}"#))
            .unwrap();
    assert_eq!(old_key.rope.scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(old_key.rope.theta, 10_000.0);
    let default = parse(&format!(
        r#"{{"model_type": "qwen2", {BASE}, "rope_parameters": {{"rope_type": "default", "rope_theta": 1e6}}}}"#
    ))
    .unwrap();
    assert_eq!((default.rope.theta, default.rope.scaling), (1e6, RopeScaling::None));
}

#[test]
fn per_architecture_biases_and_norms() {
    let qwen2 = parse(&format!(r#"{{"model_type": "qwen2", {BASE}}}"#)).unwrap();
    assert!(qwen2.qkv_bias && !qwen2.o_bias && !qwen2.qk_norm);
    let llama =
        parse(&format!(r#"{{"model_type": "llama", {BASE}, "attention_bias": true, "mlp_bias": true}}"#)).unwrap();
    assert!(llama.qkv_bias && llama.o_bias && llama.mlp_bias);
    let mistral = parse(&format!(r#"{{"model_type": "mistral", {BASE}, "attention_bias": true}}"#)).unwrap();
    assert!(!mistral.qkv_bias);
    // Qwen3 defaults head_dim to 128 instead of deriving it.
    assert_eq!(parse(&format!(r#"{{"model_type": "qwen3", {BASE}}}"#)).unwrap().head_dim, 128);
    assert_eq!(llama.head_dim, 16);
}

#[test]
fn sliding_windows_follow_each_architecture() {
    let mistral = parse(&format!(r#"{{"model_type": "mistral", {BASE}, "sliding_window": 8}}"#)).unwrap();
    assert_eq!(mistral.layer_windows, [Some(8); 4]);
    let mistral_default = parse(&format!(r#"{{"model_type": "mistral", {BASE}}}"#)).unwrap();
    assert_eq!(mistral_default.layer_windows, [Some(4096); 4]);
    let mistral_full = parse(&format!(r#"{{"model_type": "mistral", {BASE}, "sliding_window": null}}"#)).unwrap();
    assert_eq!(mistral_full.layer_windows, [None; 4]);
    let off = parse(&format!(r#"{{"model_type": "qwen2", {BASE}, "sliding_window": 8, "use_sliding_window": false}}"#))
        .unwrap();
    assert_eq!(off.layer_windows, [None; 4]);
    let from = parse(&format!(
        r#"{{"model_type": "qwen3", {BASE}, "sliding_window": 8, "use_sliding_window": true, "max_window_layers": 2}}"#
    ))
    .unwrap();
    assert_eq!(from.layer_windows, [None, None, Some(8), Some(8)]);
    let typed = parse(&format!(
        r#"{{"model_type": "qwen2", {BASE}, "sliding_window": 8, "use_sliding_window": true,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]}}"#
    ))
    .unwrap();
    assert_eq!(typed.layer_windows, [Some(8), None, Some(8), None]);
}

#[test]
fn moe_layers_honour_mlp_only_layers_and_sparse_step() {
    let c = parse(&format!(
        r#"{{"model_type": "qwen3_moe", {BASE}, "num_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "mlp_only_layers": [0], "decoder_sparse_step": 2}}"#
    ))
    .unwrap();
    assert_eq!(c.moe.unwrap().sparse_layers, [false, true, false, true]);
    let v5 = parse(&format!(
        r#"{{"model_type": "qwen3_moe", {BASE}, "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}}"#
    ))
    .unwrap();
    assert_eq!(v5.moe.unwrap().num_experts, 8);
}

#[test]
fn errors_name_the_field() {
    let missing = message(r#"{"model_type": "llama", "vocab_size": 10}"#);
    assert!(missing.contains("missing field `hidden_size`"), "{missing}");
    assert!(missing.contains("test/config.json"), "{missing}");

    let typed = message(&format!(r#"{{"model_type": "llama", {BASE}, "rms_norm_eps": "small"}}"#));
    assert!(typed.contains("`rms_norm_eps`") && typed.contains("expected a number"), "{typed}");

    let negative = message(&format!(
        r#"{{"model_type": "llama", {}}}"#,
        BASE.replace(r#""hidden_size": 64"#, r#""hidden_size": -64"#)
    ));
    assert!(negative.contains("`hidden_size`"), "{negative}");

    let unsupported = message(&format!(r#"{{"model_type": "gpt2", {BASE}}}"#));
    assert!(unsupported.contains("`gpt2`") && unsupported.contains("qwen3_moe"), "{unsupported}");

    let gqa = message(
        &format!(r#"{{"model_type": "llama", {BASE}}}"#)
            .replace(r#""num_key_value_heads": 2"#, r#""num_key_value_heads": 3"#),
    );
    assert!(gqa.contains("`num_key_value_heads`"), "{gqa}");

    let rope =
        message(&format!(r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"rope_type": "yarn", "factor": 4}}}}"#));
    assert!(rope.contains("`rope_scaling.rope_type`") && rope.contains("yarn"), "{rope}");

    let nested = message(&format!(r#"{{"model_type": "llama", {BASE}, "rope_scaling": {{"rope_type": "linear"}}}}"#));
    assert!(nested.contains("missing field `rope_scaling.factor`"), "{nested}");

    let act = message(&format!(r#"{{"model_type": "llama", {BASE}, "hidden_act": "gelu"}}"#));
    assert!(act.contains("`hidden_act`"), "{act}");

    assert!(message("[1, 2]").contains("not a JSON object"));
    assert!(message("{").contains("not a JSON object"));
}

#[test]
fn overrides_replace_top_level_fields() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, format!(r#"{{"model_type": "llama", {BASE}}}"#)).unwrap();
    let c = read_config_with_overrides(&path, r#"{"num_hidden_layers": 2}"#).unwrap();
    assert_eq!(c.num_layers, 2);
    let bad = read_config_with_overrides(&path, "not json").unwrap_err().to_string();
    assert!(bad.contains("--hf-overrides"), "{bad}");
    let io = read_config(&dir.path().join("absent.json")).unwrap_err().to_string();
    assert!(io.contains("absent.json"), "{io}");
}

#[test]
fn gemma2_defaults_alternate_windows_and_softcaps() {
    let c = parse(&format!(r#"{{"model_type": "gemma2", {BASE}, "head_dim": 16, "sliding_window": 8}}"#)).unwrap();
    assert_eq!(c.layer_windows, [Some(8), None, Some(8), None], "even layers slide");
    assert_eq!((c.attention_softcap, c.final_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(c.attention_scale, Some(256f64.powf(-0.5)), "query_pre_attn_scalar defaults to 256");
    assert_eq!(c.activation, met_config::Activation::GeluTanh);
    assert_eq!(c.norm_weight, met_config::NormWeight::UnitOffset);
    assert_eq!(c.norm_placement, met_config::NormPlacement::Sandwich);
    assert!(c.scale_embeddings && c.tie_word_embeddings && !c.qk_norm);
    assert_eq!((c.bos_token_id, c.eos_token_ids.as_slice()), (Some(2), &[1][..]));
    assert_eq!(parse(&format!(r#"{{"model_type": "gemma2", {BASE}}}"#)).unwrap().head_dim, 256);

    let uncapped = parse(&format!(
        r#"{{"model_type": "gemma2", {BASE}, "attn_logit_softcapping": null, "final_logit_softcapping": null,
            "query_pre_attn_scalar": 144, "sliding_window": null}}"#
    ))
    .unwrap();
    assert_eq!((uncapped.attention_softcap, uncapped.final_softcap), (None, None));
    assert_eq!(uncapped.attention_scale, Some(144f64.powf(-0.5)));
    assert_eq!(uncapped.layer_windows, [None; 4]);

    let bad = message(&format!(r#"{{"model_type": "gemma2", {BASE}, "final_logit_softcapping": -1}}"#));
    assert!(bad.contains("`final_logit_softcapping`"), "{bad}");
    let act = message(&format!(r#"{{"model_type": "gemma2", {BASE}, "hidden_activation": "relu"}}"#));
    assert!(act.contains("`hidden_activation`"), "{act}");
}

#[test]
fn gemma3_layer_pattern_and_rope_per_layer_in_both_layouts() {
    let hub = parse(&format!(
        r#"{{"model_type": "gemma3_text", {BASE}, "sliding_window": 8, "sliding_window_pattern": 2,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "rope_scaling": {{"rope_type": "linear", "factor": 8.0}}}}"#
    ))
    .unwrap();
    assert_eq!(hub.layer_windows, [Some(8), None, Some(8), None]);
    let local = met_config::RopeConfig { theta: 10_000.0, scaling: RopeScaling::None };
    let global = met_config::RopeConfig { theta: 1e6, scaling: RopeScaling::Linear { factor: 8.0 } };
    assert_eq!(hub.layer_rope, [local, global, local, global], "scaling on global layers only");
    assert_eq!(hub.rope, global);
    assert!(hub.qk_norm && hub.scale_embeddings);
    assert_eq!((hub.attention_softcap, hub.final_softcap), (None, None));

    let v5 = parse(&format!(
        r#"{{"model_type": "gemma3_text", {BASE}, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {{"sliding_attention": {{"rope_type": "default", "rope_theta": 10000.0}},
                "full_attention": {{"rope_type": "linear", "rope_theta": 1000000.0, "factor": 8.0}}}}}}"#
    ))
    .unwrap();
    assert_eq!((v5.layer_windows, v5.layer_rope), (hub.layer_windows, hub.layer_rope));

    let defaults = parse(&format!(r#"{{"model_type": "gemma3_text", {BASE}, "num_hidden_layers": 7}}"#)).unwrap();
    let sliding = [true, true, true, true, true, false, true];
    assert_eq!(defaults.layer_windows, sliding.map(|s| s.then_some(4096)), "every sixth layer is global");
    let thetas: Vec<f64> = defaults.layer_rope.iter().map(|r| r.theta).collect();
    assert_eq!(thetas, sliding.map(|s| if s { 10_000.0 } else { 1e6 }));

    let nested = message(&format!(
        r#"{{"model_type": "gemma3_text", {BASE},
            "rope_parameters": {{"full_attention": {{"rope_type": "linear"}}}}}}"#
    ));
    assert!(nested.contains("`rope_parameters.full_attention.factor`"), "{nested}");
    let bidirectional =
        message(&format!(r#"{{"model_type": "gemma3_text", {BASE}, "use_bidirectional_attention": true}}"#));
    assert!(bidirectional.contains("`use_bidirectional_attention`"), "{bidirectional}");
}

/// The hybrid recipe shared by the Qwen3-Next family: three Gated DeltaNet layers then one
/// gated attention layer, zero-centred norms, a quarter of each head rotated.
fn assert_hybrid(c: &ModelConfig, layers: usize, (hk, hv): (usize, usize)) {
    let la = c.linear_attention.as_ref().expect("hybrid");
    assert_eq!(la.layers.len(), layers);
    assert!((0..layers).all(|i| la.is_linear(i) == ((i + 1) % 4 != 0)), "{:?}", la.layers);
    assert_eq!(
        (la.num_key_heads, la.num_value_heads, la.key_head_dim, la.value_head_dim, la.conv_kernel),
        (hk, hv, 128, 128, 4)
    );
    assert!(c.attn_output_gate && c.qk_norm);
    assert_eq!(c.norm_weight, met_config::NormWeight::UnitOffset);
    assert_eq!((c.head_dim, c.rotary_dim), (256, 64));
    assert_eq!(c.rope.theta, 10_000_000.0);
}

#[test]
fn qwen3_next_80b() {
    let c = real("Qwen3-Next-80B-A3B-Thinking");
    assert_eq!(c.model_type, "qwen3_next");
    assert_hybrid(&c, 48, (16, 32));
    assert_eq!(c.linear_attention.as_ref().unwrap().projections, met_config::GdnProjections::Grouped);
    let moe = c.moe.as_ref().unwrap();
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (512, 10, 512));
    assert_eq!(moe.shared_expert_intermediate_size, Some(512));
    assert!(moe.norm_topk_prob && moe.sparse_layers.iter().all(|&s| s));
    assert_eq!(c.text_prefix, None);
}

#[test]
fn qwen3_5_27b_serves_its_text_model() {
    let c = real("Qwen3.5-27B");
    assert_eq!(c.model_type, "qwen3_5");
    assert_hybrid(&c, 64, (16, 48));
    assert_eq!((c.hidden_size, c.intermediate_size, c.vocab_size), (5120, 17408, 248_320));
    assert_eq!(c.linear_attention.as_ref().unwrap().projections, met_config::GdnProjections::Separate);
    assert!(c.moe.is_none());
    assert_eq!(c.text_prefix.as_deref(), Some("model.language_model."));
    assert_eq!(c.eos_token_ids, [248_044]);
}

#[test]
fn qwen3_5_and_3_6_moe() {
    for (name, layers, hv, experts_size) in
        [("Qwen3.5-35B-A3B", 40, 32, 512), ("Qwen3.6-35B-A3B", 40, 32, 512), ("Qwen3.5-122B-A10B", 48, 64, 1024)]
    {
        let c = real(name);
        assert_eq!(c.model_type, "qwen3_5_moe", "{name}");
        assert_hybrid(&c, layers, (16, hv));
        let moe = c.moe.as_ref().unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size), (256, 8, experts_size));
        assert_eq!(moe.shared_expert_intermediate_size, Some(experts_size), "{name}");
        assert!(moe.norm_topk_prob, "{name}: Qwen3.5-MoE always renormalises");
        assert!(!c.tie_word_embeddings, "{name}");
    }
}

#[test]
fn hybrid_configs_that_met_cannot_serve_are_refused_naming_the_field() {
    let hybrid = serde_json::json!({
        "model_type": "qwen3_next", "vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
        "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4, "full_attention_interval": 2,
        "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32, "partial_rotary_factor": 0.25
    });
    assert!(parse(&hybrid.to_string()).is_ok());
    let bad = serde_json::json!([
        ["linear_num_value_heads", 3],
        ["mamba_ssm_dtype", "bfloat16"],
        ["partial_rotary_factor", 0.1],
        ["layer_types", ["linear_attention", "full_attention"]],
        ["layer_types", ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]],
        ["linear_conv_kernel_dim", 1]
    ]);
    for pair in bad.as_array().unwrap() {
        let (field, value) = (pair[0].as_str().unwrap(), &pair[1]);
        let mut json = hybrid.clone();
        json[field] = value.clone();
        let msg = message(&json.to_string());
        assert!(msg.contains(field), "{field} = {value}: {msg}");
    }
    let vl = r#"{"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text", "attn_output_gate": false}}"#;
    assert!(message(vl).contains("attn_output_gate"), "{}", message(vl));
    assert!(message(r#"{"model_type": "qwen3_5"}"#).contains("text_config"));
}

#[test]
fn fp8_checkpoints_name_their_scales() {
    use met_config::ScaleLayout;
    for name in ["Qwen3-30B-A3B-FP8", "Qwen3-32B-FP8"] {
        let q = real(name).quantization.unwrap_or_else(|| panic!("{name}: quantized"));
        assert_eq!(
            (q.method.as_str(), q.scales, q.static_activations),
            ("fp8", Some(ScaleLayout::Block(128, 128)), false)
        );
    }
    let moe = real("Qwen3-30B-A3B-FP8").quantization.unwrap();
    assert!(moe.unquantized.iter().any(|m| m == "lm_head"), "the MoE lists what stays in bf16");
    let llama = real("Meta-Llama-3-8B-Instruct-FP8").quantization.unwrap();
    assert_eq!((llama.scales, llama.static_activations), (None, true));
    assert_eq!(real("Qwen3-8B").quantization, None);
    // A vision-language config keeps `quantization_config` beside `text_config`.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/Qwen3.5-27B/config.json");
    let vl = read_config_with_overrides(
        &path,
        r#"{"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}"#,
    )
    .unwrap();
    assert_eq!(vl.quantization.unwrap().scales, Some(ScaleLayout::Block(128, 128)));
}
