//! Mistral (`transformers/models/mistral/modeling_mistral.py`): the Llama layer with a
//! sliding attention window on every layer (`sliding_window`, 4096 when absent, null for
//! full attention) and no biases. A query at position `p` attends to keys at positions
//! `> p - window`.

use met_config::{ArchDefaults, ConfigError, ModelConfig, RawConfig};

use super::Architecture;

/// Mistral GGUFs say `llama` (see `llama.rs`).
pub(super) const ARCH: Architecture = Architecture { model_type: "mistral", read_config, gguf: None };

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let defaults = ArchDefaults { max_position_embeddings: 131_072, ..super::llama::DEFAULTS };
    let mut c = ModelConfig::read_common(f, &defaults)?;
    (c.qkv_bias, c.o_bias, c.mlp_bias) = (false, false, false);
    // Mistral's configuration class defaults the window to 4096; only an explicit null
    // means full attention.
    let window = if f.has_key("sliding_window") { ModelConfig::sliding_window(f)? } else { Some(4096) };
    c.layer_windows = vec![window; c.num_layers];
    Ok(c)
}
