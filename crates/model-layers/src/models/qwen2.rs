//! Qwen2 / Qwen2.5 (`transformers/models/qwen2/modeling_qwen2.py`): the Llama layer with
//! biases on the q/k/v projections (never on o). With `use_sliding_window`, layers from
//! `max_window_layers` on (or those `layer_types` marks) attend through a sliding window.

use met_config::{ModelConfig, ModelType};

use super::Architecture;
use crate::layers::decoder::LayerKind;

pub(super) const ARCH: Architecture = Architecture { model_type: ModelType::Qwen2, layer_kind };

fn layer_kind(_: &ModelConfig, _: usize) -> LayerKind {
    LayerKind { qk_norm: false, moe: false }
}
