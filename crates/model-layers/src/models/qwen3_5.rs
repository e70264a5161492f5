//! Qwen3.5 and Qwen3.6 (`transformers/models/qwen3_5/modeling_qwen3_5.py`,
//! `qwen3_5_moe/modeling_qwen3_5_moe.py`): Qwen3-Next's hybrid layers in a vision-language
//! checkpoint. met serves the text model: the config's `text_config`, the tensors under
//! `model.language_model.` (the vision tower's `model.visual.*` is not read).
//!
//! What differs from Qwen3-Next ([`super::qwen3_next`]):
//! - The Gated DeltaNet's projections are stored apart and head-major (`in_proj_qkv`,
//!   `in_proj_z`, `in_proj_b`, `in_proj_a`).
//! - `rope_parameters` carries `partial_rotary_factor` and interleaved multimodal rotary
//!   sections (`mrope_section`); a text token has the same position on all three axes, so
//!   the sections rotate as plain rotary does.
//! - `qwen3_5` has a dense MLP in every layer; `qwen3_5_moe` routed experts in every layer
//!   (always renormalised) plus the gated shared expert, its experts stacked in the
//!   checkpoint (`experts.gate_up_proj [e, 2i, h]`, `experts.down_proj [e, h, i]`).
//! - `attn_output_gate` is stated in the config; transformers always gates, so a config
//!   that says `false` is refused.
//!
//! A text-only checkpoint (`qwen3_5_text`, `Qwen3_5ForCausalLM`; `qwen3_5_moe_text`,
//! `Qwen3_5MoeForCausalLM`) keeps its tensors under `model.` and its fields at the top
//! level. llama.cpp's `qwen35` and `qwen35moe` GGUFs hold the text model, so they load as
//! text-only checkpoints; their value heads are stored tiled (see `met_model_weights`'
//! `gguf/gated_delta.rs`), the rest as `qwen3next` writes it.

use met_config::{ConfigError, GdnProjections, ModelConfig, RawConfig};
use met_model_weights::{GgufArch, GgufMeta, VHeadOrder, WeightError};
use serde_json::{Map, Value, json};

use super::{Architecture, qwen3_moe, qwen3_next};

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen3_5", read_config: dense_vl, gguf: None };
pub(super) const TEXT: Architecture =
    Architecture { model_type: "qwen3_5_text", read_config: dense_text, gguf: Some(GGUF_DENSE) };
pub(super) const MOE: Architecture = Architecture { model_type: "qwen3_5_moe", read_config: moe_vl, gguf: None };
pub(super) const MOE_TEXT: Architecture =
    Architecture { model_type: "qwen3_5_moe_text", read_config: moe_text, gguf: Some(GGUF_MOE) };

/// llama.cpp's `qwen35`: the dense text model.
const GGUF_DENSE: GgufArch = GgufArch {
    name: "qwen35",
    model_type: "qwen3_5_text",
    class: "Qwen3_5ForCausalLM",
    hidden_act: "silu",
    permutes_qk: false,
    optional_feed_forward: false,
    norm_shift: 1.0,
    block_names: qwen3_next::GGUF_HYBRID_NAMES,
    gated_delta: Some(VHeadOrder::Tiled),
    config: Some(gguf_dense),
};

/// llama.cpp's `qwen35moe`: the MoE text model, experts stacked per layer.
const GGUF_MOE: GgufArch = GgufArch {
    name: "qwen35moe",
    model_type: "qwen3_5_moe_text",
    class: "Qwen3_5MoeForCausalLM",
    optional_feed_forward: true,
    config: Some(gguf_moe),
    ..GGUF_DENSE
};

fn gguf_dense(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    c.insert("attn_output_gate".into(), json!(true));
    qwen3_next::gguf_hybrid(m, c)
}

fn gguf_moe(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    qwen3_moe::gguf_config(m, c)?;
    qwen3_next::gguf_shared_expert(m, c)?;
    gguf_dense(m, c)
}

fn dense_vl(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    vision_language(f, "qwen3_5", dense_text)
}

fn moe_vl(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    vision_language(f, "qwen3_5_moe", moe_text)
}

/// The text model of a vision-language config, read by `text`.
fn vision_language(
    f: &RawConfig<'_>,
    model_type: &str,
    text: fn(&RawConfig<'_>) -> Result<ModelConfig, ConfigError>,
) -> Result<ModelConfig, ConfigError> {
    let inner = f.object("text_config")?.ok_or_else(|| f.missing("text_config"))?;
    let mut c = text(&inner)?;
    c.model_type = model_type.into();
    c.text_prefix = Some("model.language_model.".into());
    if let Some(tied) = f.opt_bool("tie_word_embeddings")? {
        c.tie_word_embeddings = tied;
    }
    // A quantized vision-language checkpoint says so at the top level.
    if let Some(q) = met_config::QuantConfig::read(f)? {
        c.quantization = Some(q);
    }
    Ok(c)
}

fn dense_text(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let c = common(f)?;
    if c.intermediate_size == 0 {
        return Err(f.missing("intermediate_size"));
    }
    Ok(c)
}

fn moe_text(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let mut c = common(f)?;
    let mut moe = qwen3_moe::read_moe(f, c.num_layers)?;
    moe.norm_topk_prob = true;
    moe.shared_expert_intermediate_size = Some(f.positive("shared_expert_intermediate_size")?);
    c.moe = Some(moe);
    Ok(c)
}

fn common(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    if f.opt_bool("attn_output_gate")? == Some(false) {
        return Err(f.invalid("attn_output_gate", "false: Qwen3.5's attention is always gated"));
    }
    qwen3_next::read_hybrid(f, GdnProjections::Separate)
}
