//! Llama (`transformers/models/llama/modeling_llama.py`): pre-norm decoder with
//! grouped-query attention, rotary embedding (plain, linear or Llama 3 scaling) and a
//! SwiGLU MLP. `attention_bias` adds biases to q/k/v/o and `mlp_bias` to the MLP. Also
//! serves SmolLM, TinyLlama and other Llama-shaped models.

use met_config::{ArchDefaults, ConfigError, ModelConfig, RawConfig};
use met_model_weights::{GgufArch, GgufMeta, WeightError};
use serde_json::{Map, Value, json};

use super::Architecture;

pub(super) const ARCH: Architecture = Architecture { model_type: "llama", read_config, gguf: Some(GGUF) };

/// llama.cpp's `llama` (also Mistral's GGUFs): Q/K rows permuted for its rotary layout.
const GGUF: GgufArch = GgufArch {
    name: "llama",
    model_type: "llama",
    class: "LlamaForCausalLM",
    hidden_act: "silu",
    permutes_qk: true,
    optional_feed_forward: false,
    norm_shift: 0.0,
    block_names: &[],
    gated_delta: None,
    config: Some(gguf_config),
};

/// `mlp_bias`, which only the tensors say.
fn gguf_config(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    c.insert("mlp_bias".into(), json!(m.file().tensor("blk.0.ffn_up.bias").is_some()));
    Ok(())
}

/// `LlamaConfig`'s defaults: 2048 positions, bos 1 and eos 2.
pub(super) const DEFAULTS: ArchDefaults = ArchDefaults {
    head_dim: None,
    max_position_embeddings: 2048,
    special_tokens: Some((1, 2)),
    rms_norm_eps: 1e-6,
    intermediate_size: None,
};

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    ModelConfig::read_common(f, &DEFAULTS)
}
