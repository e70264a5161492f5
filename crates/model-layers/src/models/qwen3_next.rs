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

use met_config::{
    ArchDefaults, ConfigError, GdnProjections, LinearAttentionConfig, ModelConfig, NormWeight, RawConfig,
};

use super::{Architecture, qwen2, qwen3_moe};

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen3_next", read_config, gguf: None };

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
