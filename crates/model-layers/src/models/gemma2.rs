//! Gemma 2 (`transformers/models/gemma2/modeling_gemma2.py`): grouped-query attention with
//! four RMSNorms per layer, each `(1 + w) · x̂` in f32 (`Gemma2RMSNorm`; weights are stored
//! around 0): `input_layernorm` before attention, `post_attention_layernorm` on its output
//! before the residual add, `pre_feedforward_layernorm` before the MLP and
//! `post_feedforward_layernorm` on its output. The MLP is GeGLU
//! (`gelu_pytorch_tanh(gate) · up`). Embeddings are multiplied by `√hidden_size` cast to the
//! model dtype. Scores are scaled by `query_pre_attn_scalar^-0.5` and soft-capped
//! (`attn_logit_softcapping`), logits too (`final_logit_softcapping`). Layers alternate
//! sliding (even) and full attention (odd) unless `layer_types` says otherwise.
//!
//! GGUF (llama.cpp's `gemma2`): `attn_norm`, `post_attention_norm`, `ffn_norm` (the
//! pre-feed-forward norm) and `post_ffw_norm`, norm weights stored as `1 + w`, and the
//! soft-caps under `{arch}.attn_logit_softcapping` / `{arch}.final_logit_softcapping`.

use met_config::{Activation, ArchDefaults, ConfigError, ModelConfig, NormPlacement, NormWeight, RawConfig};
use met_model_weights::{GgufArch, GgufMeta, WeightError, insert_opt};
use serde_json::{Map, Value, json};

use super::Architecture;

pub(super) const ARCH: Architecture = Architecture { model_type: "gemma2", read_config, gguf: Some(GGUF) };

const GGUF: GgufArch = GgufArch {
    name: "gemma2",
    model_type: "gemma2",
    class: "Gemma2ForCausalLM",
    hidden_act: "gelu_pytorch_tanh",
    permutes_qk: false,
    optional_feed_forward: false,
    norm_shift: 1.0,
    block_names: GGUF_BLOCK_NAMES,
    gated_delta: None,
    config: Some(gguf_config),
};

/// Gemma's four norms under llama.cpp's names (`ffn_norm` is the pre-feed-forward norm).
pub(super) const GGUF_BLOCK_NAMES: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

fn gguf_config(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    gguf_gemma(m, c, 46)?;
    insert_opt(c, "attn_logit_softcapping", m.opt_decimal("attn_logit_softcapping")?);
    insert_opt(c, "final_logit_softcapping", m.opt_decimal("final_logit_softcapping")?);
    Ok(())
}

/// What Gemma 2 and 3 GGUFs share: the activation, the window, and the attention scale,
/// which llama.cpp does not store but derives as it does here: `hidden / heads` for the
/// 27B model (`layers_27b` layers), else `head_dim`.
pub(super) fn gguf_gemma(m: &GgufMeta<'_>, c: &mut Map<String, Value>, layers_27b: u64) -> Result<(), WeightError> {
    c.insert("hidden_activation".into(), json!("gelu_pytorch_tanh"));
    c.insert("sliding_window".into(), json!(m.opt_u64("attention.sliding_window")?));
    let hidden = m.req_u64("embedding_length")?;
    let heads = m.req_u64("attention.head_count")?;
    let scalar = match (m.req_u64("block_count")? == layers_27b, m.opt_u64("attention.key_length")?) {
        (false, Some(d)) => d,
        _ => hidden / heads.max(1),
    };
    c.insert("query_pre_attn_scalar".into(), json!(scalar));
    Ok(())
}

/// `Gemma2Config`'s defaults (head_dim 256, 8k positions, bos 2 and eos 1).
const DEFAULTS: ArchDefaults = ArchDefaults {
    head_dim: Some(256),
    max_position_embeddings: 8192,
    special_tokens: Some((2, 1)),
    rms_norm_eps: 1e-6,
    intermediate_size: None,
};

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let mut c = read_gemma(f, &DEFAULTS)?;
    c.attention_softcap = softcap(f, "attn_logit_softcapping", 50.0)?;
    c.final_softcap = softcap(f, "final_logit_softcapping", 30.0)?;
    let window = window(f)?;
    c.layer_windows = match window {
        Some(w) => match ModelConfig::windows_from_layer_types(f, c.num_layers, w)? {
            Some(windows) => windows,
            None => (0..c.num_layers).map(|i| (i % 2 == 0).then_some(w)).collect(),
        },
        None => vec![None; c.num_layers],
    };
    Ok(c)
}

/// What Gemma 2 and 3 share: the common fields with Gemma's defaults, `(1 + w)` sandwich
/// norms, GeGLU, scaled embeddings, tied embeddings by default and
/// `query_pre_attn_scalar` (256 when absent).
pub(super) fn read_gemma(f: &RawConfig<'_>, defaults: &ArchDefaults) -> Result<ModelConfig, ConfigError> {
    let mut c = ModelConfig::read_common(f, defaults)?;
    c.mlp_bias = false;
    c.tie_word_embeddings = f.opt_bool("tie_word_embeddings")?.unwrap_or(true);
    c.activation = Activation::read(f, "hidden_activation", Activation::GeluTanh)?;
    c.norm_weight = NormWeight::UnitOffset;
    c.norm_placement = NormPlacement::Sandwich;
    c.scale_embeddings = true;
    let scalar = ModelConfig::positive_f64(f, "query_pre_attn_scalar")?.unwrap_or(256.0);
    c.attention_scale = Some(scalar.powf(-0.5));
    Ok(c)
}

/// `sliding_window` (4096 when absent, null for none).
pub(super) fn window(f: &RawConfig<'_>) -> Result<Option<usize>, ConfigError> {
    if f.has_key("sliding_window") { ModelConfig::sliding_window(f) } else { Ok(Some(4096)) }
}

/// A soft-cap: `default` when the key is absent, none when it is null.
pub(super) fn softcap(f: &RawConfig<'_>, key: &str, default: f64) -> Result<Option<f64>, ConfigError> {
    if f.has_key(key) { ModelConfig::positive_f64(f, key) } else { Ok(Some(default)) }
}
