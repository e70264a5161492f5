//! Qwen3-Next (`transformers/models/qwen3_next/modeling_qwen3_next.py`): a hybrid of Gated
//! DeltaNet layers and gated full attention, with routed experts plus a gated shared
//! expert in every sparse layer.
//!
//! - Token mixers: layers named `linear_attention` in `layer_types` (or, in hub configs
//!   without it, all but every `full_attention_interval`-th) are Gated DeltaNets whose
//!   checkpoints group the q/k/v/z and b/a projection rows per key head; the others are
//!   attention whose `q_proj` is doubled, each head's query rows followed by its gate
//!   rows, the output multiplied by `sigmoid(gate)` before `o_proj`.
//! - Attention rotates the first `partial_rotary_factor · head_dim` elements of each head
//!   and normalises q and k per head first.
//! - Every RMSNorm is zero-centred, `(1 + w)` (`Qwen3NextRMSNorm`), q/k norms included; the
//!   Gated DeltaNet's closing gated norm alone applies a plain `w`.
//! - The MoE (`Qwen2MoeSparseMoeBlock`): softmax routing over the experts, top
//!   `num_experts_per_tok`, renormalised when `norm_topk_prob`, plus a shared expert of
//!   `shared_expert_intermediate_size` scaled by `sigmoid(shared_expert_gate · x)`.
//!   Layers in `mlp_only_layers` keep a dense MLP.
//! - Multi-token-prediction tensors (`mtp.*`) are not read.
//!
//! llama.cpp's `qwen3next` GGUFs load too: the names and hooks below rebuild the config from
//! its `ssm.*` keys, and the store undoes the converter's Gated DeltaNet transformations
//! (`met_model_weights`' `gguf/gated_delta.rs`).

use met_config::{
    ArchDefaults, ConfigError, GdnProjections, LinearAttentionConfig, ModelConfig, NormWeight, RawConfig,
};
use met_model_weights::{GgufArch, GgufMeta, VHeadOrder, WeightError};
use serde_json::{Map, Value, json};

use super::{Architecture, qwen2, qwen3_moe};

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen3_next", read_config, gguf: Some(GGUF) };

/// llama.cpp's `qwen3next`: norms stored as `1 + w` (the gated DeltaNet norm excepted),
/// `in_proj_qkvz` split into `attn_qkv` and `attn_gate`, value heads grouped as in the
/// checkpoint.
const GGUF: GgufArch = GgufArch {
    name: "qwen3next",
    model_type: "qwen3_next",
    class: "Qwen3NextForCausalLM",
    hidden_act: "silu",
    permutes_qk: false,
    optional_feed_forward: true,
    norm_shift: 1.0,
    block_names: GGUF_HYBRID_NAMES,
    gated_delta: Some(VHeadOrder::Grouped),
    config: Some(gguf_config),
};

/// llama.cpp's per-layer names of the hybrids (`qwen3next`, `qwen35`, `qwen35moe`) that
/// differ from the common table: Gated DeltaNet (`ssm_*`, `attn_qkv`, `attn_gate`), the
/// shared expert, and the post-attention norm.
pub(super) const GGUF_HYBRID_NAMES: &[(&str, &str)] = &[
    ("post_attention_norm", "post_attention_layernorm"),
    ("attn_qkv", "linear_attn.in_proj_qkv"),
    ("attn_gate", "linear_attn.in_proj_z"),
    ("ssm_ba", "linear_attn.in_proj_ba"),
    ("ssm_beta", "linear_attn.in_proj_b"),
    ("ssm_alpha", "linear_attn.in_proj_a"),
    ("ssm_a", "linear_attn.A_log"),
    ("ssm_dt.bias", "linear_attn.dt_bias"),
    ("ssm_conv1d", "linear_attn.conv1d"),
    ("ssm_norm", "linear_attn.norm"),
    ("ssm_out", "linear_attn.out_proj"),
    ("ffn_gate_inp_shexp", "mlp.shared_expert_gate"),
    ("ffn_gate_shexp", "mlp.shared_expert.gate_proj"),
    ("ffn_up_shexp", "mlp.shared_expert.up_proj"),
    ("ffn_down_shexp", "mlp.shared_expert.down_proj"),
];

fn gguf_config(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    qwen3_moe::gguf_config(m, c)?;
    gguf_shared_expert(m, c)?;
    gguf_hybrid(m, c)
}

/// The shared expert's width.
pub(super) fn gguf_shared_expert(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    c.insert("shared_expert_intermediate_size".into(), json!(m.req_u64("expert_shared_feed_forward_length")?));
    Ok(())
}

/// The Gated DeltaNet shape from `ssm.*` (as llama.cpp's converter writes it: key heads in
/// `group_count`, value heads in `time_step_rank`, key head dim in `state_size`, all value
/// dims in `inner_size`), the layer pattern and the rotary fraction.
pub(super) fn gguf_hybrid(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    let v_heads = m.req_u64("ssm.time_step_rank")?;
    let inner = m.req_u64("ssm.inner_size")?;
    if v_heads == 0 || !inner.is_multiple_of(v_heads) {
        let msg = format!("{inner} does not split into {v_heads} value heads (ssm.time_step_rank)");
        return Err(m.file().metadata_error(&m.key("ssm.inner_size"), msg));
    }
    c.insert("linear_conv_kernel_dim".into(), json!(m.req_u64("ssm.conv_kernel")?));
    c.insert("linear_key_head_dim".into(), json!(m.req_u64("ssm.state_size")?));
    c.insert("linear_num_key_heads".into(), json!(m.req_u64("ssm.group_count")?));
    c.insert("linear_num_value_heads".into(), json!(v_heads));
    c.insert("linear_value_head_dim".into(), json!(inner / v_heads));
    let layers = c.get("num_hidden_layers").and_then(Value::as_u64).unwrap_or(0);
    c.insert("layer_types".into(), json!(gguf_layer_types(m, layers)?));
    let head_dim = c.get("head_dim").and_then(Value::as_u64).unwrap_or(0);
    c.insert("partial_rotary_factor".into(), json!(gguf_rotary_factor(m, head_dim)?));
    Ok(())
}

/// Which layers are Gated DeltaNets, as llama.cpp decides: `attention.recurrent_layers`,
/// else all but every `full_attention_interval`-th layer (4 when absent).
fn gguf_layer_types(m: &GgufMeta<'_>, layers: u64) -> Result<Vec<&'static str>, WeightError> {
    let key = m.key("attention.recurrent_layers");
    let recurrent: Vec<bool> = match m.file().get(&key) {
        Some(_) => {
            let flags = m.file().get_array(&key)?;
            if (flags.len() as u64) < layers {
                return Err(m.file().metadata_error(&key, format!("{} entries for {layers} layers", flags.len())));
            }
            let flag = |v: &met_model_weights::GgufValue| {
                v.as_bool().ok_or_else(|| m.file().metadata_error(&key, format!("expected booleans, found {v}")))
            };
            flags.iter().take(layers as usize).map(flag).collect::<Result<_, _>>()?
        }
        None => {
            let every = m.opt_u64("full_attention_interval")?.unwrap_or(4);
            if every == 0 {
                return Err(m.file().metadata_error(&m.key("full_attention_interval"), "must be positive, found 0"));
            }
            (0..layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    Ok(recurrent.iter().map(|&r| if r { "linear_attention" } else { "full_attention" }).collect())
}

/// `rope.dimension_count / head_dim` (llama.cpp rotates the whole head when the key is
/// absent), checked to give back the same rotary width.
fn gguf_rotary_factor(m: &GgufMeta<'_>, head_dim: u64) -> Result<f64, WeightError> {
    let Some(rotary) = m.opt_u64("rope.dimension_count")? else { return Ok(1.0) };
    let factor = rotary as f64 / head_dim as f64;
    if head_dim == 0 || (head_dim as f64 * factor) as u64 != rotary {
        let msg = format!("{rotary} rotary dims are no fraction of head_dim {head_dim} that met can express");
        return Err(m.file().metadata_error(&m.key("rope.dimension_count"), msg));
    }
    Ok(factor)
}

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let mut c = read_hybrid(f, GdnProjections::Grouped)?;
    let mut moe = qwen3_moe::read_moe(f, c.num_layers)?;
    moe.shared_expert_intermediate_size = Some(f.positive("shared_expert_intermediate_size")?);
    if moe.sparse_layers.iter().any(|s| !s) && c.intermediate_size == 0 {
        return Err(f.missing("intermediate_size"));
    }
    c.moe = Some(moe);
    Ok(c)
}

/// The fields the Qwen3-Next family shares (Qwen3.5 and 3.6 too): the hybrid layer
/// pattern and Gated DeltaNet shape, gated attention with q/k norm and partial rotary,
/// zero-centred norms.
///
/// # Errors
/// A [`ConfigError`] naming the first bad field.
pub(super) fn read_hybrid(f: &RawConfig<'_>, projections: GdnProjections) -> Result<ModelConfig, ConfigError> {
    let defaults = ArchDefaults { intermediate_size: Some(0), ..qwen2::DEFAULTS };
    let mut c = ModelConfig::read_common(f, &defaults)?;
    c.qk_norm = true;
    c.norm_weight = NormWeight::UnitOffset;
    c.attn_output_gate = true;
    c.rotary_dim = rotary_dim(f, c.head_dim)?;
    c.linear_attention = Some(LinearAttentionConfig::read(f, c.num_layers, projections)?);
    Ok(c)
}

/// `int(head_dim · partial_rotary_factor)`, the factor read from `rope_parameters` or the
/// top level (1 when absent).
fn rotary_dim(f: &RawConfig<'_>, head_dim: usize) -> Result<usize, ConfigError> {
    const KEY: &str = "partial_rotary_factor";
    let nested = match f.object("rope_parameters")? {
        Some(p) => p.opt_f64(KEY)?,
        None => None,
    };
    let factor = match nested {
        Some(v) => v,
        None => f.opt_f64(KEY)?.unwrap_or(1.0),
    };
    let dim = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || dim < 2 || !dim.is_multiple_of(2) {
        let msg = format!(
            "{factor} of head_dim {head_dim} is {dim} elements; rotary needs an even number from 2 to head_dim"
        );
        return Err(f.invalid(KEY, msg));
    }
    Ok(dim)
}
