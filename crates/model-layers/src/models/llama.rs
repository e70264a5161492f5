//! Llama (`transformers/models/llama/modeling_llama.py`): pre-norm decoder with
//! grouped-query attention, rotary embedding (plain, linear or Llama 3 scaling) and a
//! SwiGLU MLP. `attention_bias` adds biases to q/k/v/o and `mlp_bias` to the MLP, both
//! resolved by `met-config`. Also serves SmolLM, TinyLlama and other Llama-shaped models.

use met_config::{ModelConfig, ModelType};

use super::Architecture;
use crate::layers::decoder::LayerKind;

pub(super) const ARCH: Architecture = Architecture { model_type: ModelType::Llama, layer_kind };

fn layer_kind(_: &ModelConfig, _: usize) -> LayerKind {
    LayerKind { qk_norm: false, moe: false }
}
