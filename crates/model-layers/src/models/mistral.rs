//! Mistral (`transformers/models/mistral/modeling_mistral.py`): the Llama layer with a
//! sliding attention window on every layer (`sliding_window`, null for full attention)
//! and no biases. A query at position `p` attends to keys at positions `> p - window`.

use met_config::{ModelConfig, ModelType};

use super::Architecture;
use crate::layers::decoder::LayerKind;

pub(super) const ARCH: Architecture = Architecture { model_type: ModelType::Mistral, layer_kind };

fn layer_kind(_: &ModelConfig, _: usize) -> LayerKind {
    LayerKind { qk_norm: false, moe: false }
}
