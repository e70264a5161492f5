//! Qwen3 (`transformers/models/qwen3/modeling_qwen3.py`): the Llama layer plus an
//! RMSNorm over each query and key head (`q_norm`, `k_norm`, weights of `head_dim`)
//! applied before rotary. `head_dim` is explicit (128 by default) and often differs from
//! `hidden_size / num_attention_heads`. Sliding windows follow Qwen2's rule.

use met_config::{ModelConfig, ModelType};

use super::Architecture;
use crate::layers::decoder::LayerKind;

pub(super) const ARCH: Architecture = Architecture { model_type: ModelType::Qwen3, layer_kind };

fn layer_kind(_: &ModelConfig, _: usize) -> LayerKind {
    LayerKind { qk_norm: true, moe: false }
}
