//! Qwen3-MoE (`transformers/models/qwen3_moe/modeling_qwen3_moe.py`): Qwen3 attention with
//! a routed mixture of experts in place of the MLP on sparse layers. Layer `i` is sparse
//! unless listed in `mlp_only_layers`, and only when `(i + 1) % decoder_sparse_step == 0`;
//! other layers keep a dense MLP of `intermediate_size`. Routing: softmax over the router
//! logits in f32, top `num_experts_per_tok`, renormalised when `norm_topk_prob`. There is
//! no shared expert. Sliding windows, when enabled, cover every layer.

use met_config::{ArchDefaults, ConfigError, ModelConfig, MoeConfig, RawConfig};
use met_model_weights::{GgufArch, GgufMeta, WeightError};
use serde_json::{Map, Value, json};

use super::{Architecture, qwen2};

pub(super) const ARCH: Architecture = Architecture { model_type: "qwen3_moe", read_config, gguf: Some(GGUF) };

/// llama.cpp's `qwen3moe`: experts stacked per layer (`blk.N.ffn_*_exps`, which the store
/// splits into the per-expert names hub checkpoints use).
const GGUF: GgufArch = GgufArch {
    name: "qwen3moe",
    model_type: "qwen3_moe",
    class: "Qwen3MoeForCausalLM",
    hidden_act: "silu",
    permutes_qk: false,
    optional_feed_forward: true,
    norm_shift: 0.0,
    block_names: &[],
    gated_delta: None,
    config: Some(gguf_config),
};

/// Routing settings; layers without stacked experts are dense (`mlp_only_layers`).
pub(super) fn gguf_config(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    let file = m.file();
    let experts = m.req_u64("expert_count")?;
    let stacks = file.tensors().iter().filter(|t| t.name.ends_with("_exps.weight"));
    if let Some(t) = stacks.clone().find(|t| t.dims.get(2).map(|&e| e as u64) != Some(experts)) {
        let msg = format!("{experts} experts, but `{}` has dims {:?}", t.name, t.dims);
        return Err(file.metadata_error(&m.key("expert_count"), msg));
    }
    if experts > 0 && stacks.count() == 0 {
        let msg = format!("{experts} experts, but the file holds no stacked expert tensors");
        return Err(file.metadata_error(&m.key("expert_count"), msg));
    }
    c.insert("num_experts".into(), json!(experts));
    c.insert("num_experts_per_tok".into(), json!(m.req_u64("expert_used_count")?));
    c.insert("moe_intermediate_size".into(), json!(m.req_u64("expert_feed_forward_length")?));
    // llama.cpp always renormalises the chosen experts' weights for qwen3moe.
    c.insert("norm_topk_prob".into(), json!(true));
    c.insert("decoder_sparse_step".into(), json!(1));
    let layers = m.req_u64("block_count")?;
    let dense: Vec<u64> =
        (0..layers).filter(|i| file.tensor(&format!("blk.{i}.ffn_gate_exps.weight")).is_none()).collect();
    c.insert("mlp_only_layers".into(), json!(dense));
    Ok(())
}

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    let defaults = ArchDefaults { intermediate_size: Some(0), ..qwen2::DEFAULTS };
    let mut c = ModelConfig::read_common(f, &defaults)?;
    c.mlp_bias = false;
    c.qk_norm = true;
    let window =
        if f.opt_bool("use_sliding_window")?.unwrap_or(false) { ModelConfig::sliding_window(f)? } else { None };
    c.layer_windows = vec![window; c.num_layers];
    c.moe = Some(read_moe(f, c.num_layers)?);
    Ok(c)
}

pub(super) fn read_moe(f: &RawConfig<'_>, layers: usize) -> Result<MoeConfig, ConfigError> {
    // transformers 5 writes `num_local_experts`; hub checkpoints say `num_experts`.
    let num_experts = match f.get("num_experts") {
        Some(_) => f.positive("num_experts")?,
        None if f.get("num_local_experts").is_some() => f.positive("num_local_experts")?,
        None => f.positive("num_experts")?,
    };
    let experts_per_token = f.positive("num_experts_per_tok")?;
    if experts_per_token > num_experts {
        return Err(
            f.invalid("num_experts_per_tok", format!("{experts_per_token} exceeds num_experts = {num_experts}"))
        );
    }
    let step = f.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(f.invalid("decoder_sparse_step", "must be positive, found 0"));
    }
    let dense = f.usize_list("mlp_only_layers")?;
    Ok(MoeConfig {
        num_experts,
        experts_per_token,
        expert_intermediate_size: f.positive("moe_intermediate_size")?,
        norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(false),
        shared_expert_intermediate_size: None,
        sparse_layers: (0..layers).map(|i| !dense.contains(&i) && (i + 1) % step == 0).collect(),
    })
}
