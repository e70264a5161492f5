//! Qwen3-MoE (`transformers/models/qwen3_moe/modeling_qwen3_moe.py`): Qwen3 attention with
//! a routed mixture of experts in place of the MLP on sparse layers. Layer `i` is sparse
//! unless listed in `mlp_only_layers`, and only when `(i + 1) % decoder_sparse_step == 0`
//! (resolved by `met-config` into `MoeConfig::sparse_layers`); other layers keep a dense
//! MLP of `intermediate_size`. Routing: softmax over the router logits in f32, top
//! `num_experts_per_tok`, renormalised when `norm_topk_prob`. There is no shared expert.

use met_config::{ModelConfig, ModelType};

use super::Architecture;
use crate::layers::decoder::LayerKind;

pub(super) const ARCH: Architecture = Architecture { model_type: ModelType::Qwen3Moe, layer_kind };

fn layer_kind(cfg: &ModelConfig, layer: usize) -> LayerKind {
    let moe = cfg.moe.as_ref().is_some_and(|m| m.sparse_layers.get(layer).copied().unwrap_or(false));
    LayerKind { qk_norm: true, moe }
}
