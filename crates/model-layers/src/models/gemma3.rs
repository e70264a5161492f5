//! Gemma 3, text only (`transformers/models/gemma3/modeling_gemma3.py`,
//! `Gemma3ForCausalLM`, `model_type` `gemma3_text`): Gemma 2's layer (four `(1 + w)`
//! norms, GeGLU, scaled embeddings, `query_pre_attn_scalar`) plus a `(1 + w)` RMSNorm over
//! each query and key head before rotary, and no soft-caps by default. Sliding and full
//! layers follow `layer_types`, or `sliding_window_pattern` (every `pattern`-th layer is
//! full, 6 by default). Local (sliding) layers rotate with base `rope_local_base_freq`
//! (10k) and no scaling; global layers with `rope_theta` (1M) and `rope_scaling` (linear
//! on the larger checkpoints). transformers 5 writes both as `rope_parameters:
//! {sliding_attention: {...}, full_attention: {...}}`; both layouts are read.
//!
//! GGUF (llama.cpp's `gemma3`): Gemma 2's tensor names plus `attn_q_norm` / `attn_k_norm`,
//! norm weights stored as `1 + w`, and `{arch}.rope.freq_base` for the global base.

use met_config::{ArchDefaults, ConfigError, ModelConfig, RawConfig, RopeConfig};
use met_model_weights::{GgufArch, GgufMeta, WeightError};
use serde_json::{Map, Value, json};

use super::{Architecture, gemma2};

pub(super) const ARCH: Architecture = Architecture { model_type: "gemma3_text", read_config, gguf: Some(GGUF) };

const GGUF: GgufArch = GgufArch {
    name: "gemma3",
    model_type: "gemma3_text",
    class: "Gemma3ForCausalLM",
    hidden_act: "gelu_pytorch_tanh",
    permutes_qk: false,
    optional_feed_forward: false,
    norm_shift: 1.0,
    block_names: gemma2::GGUF_BLOCK_NAMES,
    gated_delta: None,
    config: Some(gguf_config),
};

/// llama.cpp stores neither the local rotary base nor the layer pattern of Gemma 3; it
/// assumes 10k and every sixth layer global, as the released checkpoints have.
fn gguf_config(m: &GgufMeta<'_>, c: &mut Map<String, Value>) -> Result<(), WeightError> {
    gemma2::gguf_gemma(m, c, 62)?;
    c.insert("rope_local_base_freq".into(), json!(10_000.0));
    c.insert("sliding_window_pattern".into(), json!(6));
    Ok(())
}

/// `Gemma3TextConfig`'s defaults (head_dim 256, 128k positions, bos 2 and eos 1).
const DEFAULTS: ArchDefaults = ArchDefaults {
    head_dim: Some(256),
    max_position_embeddings: 131_072,
    special_tokens: Some((2, 1)),
    rms_norm_eps: 1e-6,
    intermediate_size: None,
};

fn read_config(f: &RawConfig<'_>) -> Result<ModelConfig, ConfigError> {
    if f.opt_bool("use_bidirectional_attention")?.unwrap_or(false) {
        return Err(f.invalid("use_bidirectional_attention", "bidirectional attention is not supported"));
    }
    let mut c = gemma2::read_gemma(f, &DEFAULTS)?;
    c.qk_norm = true;
    c.attention_softcap = ModelConfig::positive_f64(f, "attn_logit_softcapping")?;
    c.final_softcap = ModelConfig::positive_f64(f, "final_logit_softcapping")?;
    let sliding = sliding_layers(f, c.num_layers)?;
    let window = gemma2::window(f)?;
    c.layer_windows = sliding.iter().map(|&s| if s { window } else { None }).collect();
    let (local, global) = ropes(f)?;
    c.rope = global;
    c.layer_rope = sliding.iter().map(|&s| if s { local } else { global }).collect();
    Ok(c)
}

/// Which layers are sliding: `layer_types`, else `sliding_window_pattern`.
fn sliding_layers(f: &RawConfig<'_>, layers: usize) -> Result<Vec<bool>, ConfigError> {
    if let Some(windows) = ModelConfig::windows_from_layer_types(f, layers, 1)? {
        return Ok(windows.iter().map(Option::is_some).collect());
    }
    let pattern = f.opt_usize("sliding_window_pattern")?.unwrap_or(6);
    if pattern == 0 {
        return Err(f.invalid("sliding_window_pattern", "must be positive, found 0"));
    }
    Ok((0..layers).map(|i| (i + 1) % pattern != 0).collect())
}

/// The rotary settings of local (sliding) and global (full) layers, from either layout.
fn ropes(f: &RawConfig<'_>) -> Result<(RopeConfig, RopeConfig), ConfigError> {
    if let Some(params) = f.object("rope_parameters")? {
        let side = |key: &str, theta: f64| -> Result<RopeConfig, ConfigError> {
            let p = params.object(key)?;
            let theta = match p.as_ref().map(|p| p.opt_f64("rope_theta")).transpose()?.flatten() {
                Some(t) => t,
                None => theta,
            };
            RopeConfig::read_scaling(f, p.as_ref(), theta)
        };
        let local = side("sliding_attention", f.opt_f64("rope_local_base_freq")?.unwrap_or(10_000.0))?;
        let global = side("full_attention", f.opt_f64("rope_theta")?.unwrap_or(1_000_000.0))?;
        return Ok((local, global));
    }
    let local_theta = f.opt_f64("rope_local_base_freq")?.unwrap_or(10_000.0);
    let local = RopeConfig::read_scaling(f, None, local_theta)?;
    let global_theta = f.opt_f64("rope_theta")?.unwrap_or(1_000_000.0);
    let global = RopeConfig::read_scaling(f, f.object("rope_scaling")?.as_ref(), global_theta)?;
    Ok((local, global))
}
