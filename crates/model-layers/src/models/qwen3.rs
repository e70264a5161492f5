//! Qwen3 (`transformers/models/qwen3/modeling_qwen3.py`): the Llama layer plus an
//! RMSNorm over each query and key head (`q_norm`, `k_norm`, weights of `head_dim`)
//! applied before rotary. `head_dim` is explicit (128 by default) and often differs from
//! `hidden_size / num_attention_heads`. Sliding windows follow Qwen2's rule.

use met_config::{ArchDefaults, ConfigError, ModelConfig, RawConfig};
use met_model_weights::GgufArch;

use super::{Architecture, qwen2};

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen3", read_config, gguf: Some(GGUF) };

const GGUF: GgufArch = GgufArch {
    name: "qwen3",
    model_type: "qwen3",
    class: "Qwen3ForCausalLM",
    hidden_act: "silu",
    permutes_qk: false,
    optional_feed_forward: false,
    norm_shift: 0.0,
    block_names: &[],
    gated_delta: None,
    config: None,
};

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    // Qwen3's configuration class defaults head_dim to 128 rather than deriving it.
    let defaults = ArchDefaults { head_dim: Some(128), ..qwen2::DEFAULTS };
    let mut c = ModelConfig::read_common(f, &defaults)?;
    c.mlp_bias = false;
    c.qk_norm = true;
    c.layer_windows = qwen2::windows(f, c.num_layers)?;
    Ok(c)
}
