//! Qwen2 / Qwen2.5 (`transformers/models/qwen2/modeling_qwen2.py`): the Llama layer with
//! biases on the q/k/v projections (never on o). With `use_sliding_window`, layers from
//! `max_window_layers` on (or those `layer_types` marks) attend through a sliding window.

use met_config::{ArchDefaults, ConfigError, ModelConfig, RawConfig};
use met_model_weights::GgufArch;

use super::Architecture;

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen2", read_config, gguf: Some(GGUF) };

const GGUF: GgufArch = GgufArch {
    name: "qwen2",
    model_type: "qwen2",
    class: "Qwen2ForCausalLM",
    hidden_act: "silu",
    permutes_qk: false,
    optional_feed_forward: false,
    norm_shift: 0.0,
    block_names: &[],
    gated_delta: None,
    config: None,
};

/// Qwen's configuration classes: 32k positions, no default special tokens.
pub(super) const DEFAULTS: ArchDefaults = ArchDefaults {
    head_dim: None,
    max_position_embeddings: 32_768,
    special_tokens: None,
    rms_norm_eps: 1e-6,
    intermediate_size: None,
};

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let mut c = ModelConfig::read_common(f, &DEFAULTS)?;
    (c.qkv_bias, c.o_bias, c.mlp_bias) = (true, false, false);
    c.layer_windows = windows(f, c.num_layers)?;
    Ok(c)
}

/// Qwen's window rule: none unless `use_sliding_window`; then the layers `layer_types`
/// marks `sliding_attention`, or else those from `max_window_layers` (28) on.
pub(super) fn windows(f: &RawConfig<'_>, layers: usize) -> Result<Vec<Option<usize>>, ConfigError> {
    let window =
        if f.opt_bool("use_sliding_window")?.unwrap_or(false) { ModelConfig::sliding_window(f)? } else { None };
    let Some(w) = window else { return Ok(vec![None; layers]) };
    if let Some(windows) = ModelConfig::windows_from_layer_types(f, layers, w)? {
        return Ok(windows);
    }
    let first = f.opt_usize("max_window_layers")?.unwrap_or(28);
    Ok((0..layers).map(|i| (i >= first).then_some(w)).collect())
}
