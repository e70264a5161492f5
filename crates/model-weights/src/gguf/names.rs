//! GGUF tensor names to Hugging Face names, declared as data.
//!
//! [`GgufArch`]: super::GgufArch
//!
//! llama.cpp's converter renames every tensor (`gguf-py`'s `TensorNameMap`); this is the
//! reverse of the names its architectures share, as transformers' `integrations/ggml.py`
//! does it. An architecture whose names differ declares them in its [`GgufArch`]
//! (`block_names`), which are looked up first: whole names (`ssm_a`, `ssm_dt.bias`), then
//! names split into a base and a `.weight` / `.bias` suffix that carries over unchanged.
//! Stacked MoE experts (`blk.N.ffn_*_exps.weight`, one 3-D tensor per layer and
//! projection) map to the per-expert names hub checkpoints use.

/// Whole-model tensors: GGUF base → HF base.
const GLOBAL: [(&str, &str); 3] =
    [("token_embd", "model.embed_tokens"), ("output_norm", "model.norm"), ("output", "lm_head")];

/// Per-layer tensors `blk.N.<gguf>` → `model.layers.N.<hf>`, as most architectures name them.
const BLOCK: [(&str, &str); 12] = [
    ("attn_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("ffn_gate_inp", "mlp.gate"),
];

/// Stacked expert tensors `blk.N.<gguf>` → `model.layers.N.mlp.experts.{e}.<hf>`.
const EXPERTS: [(&str, &str); 3] =
    [("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")];

/// GGUF tensors folded into the model config rather than exposed as weights:
/// `rope_freqs` holds Llama 3 rotary scaling factors (see the config module).
pub(crate) const CONFIG_ONLY: [&str; 1] = ["rope_freqs.weight"];

/// What a GGUF tensor becomes under Hugging Face naming.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HfTarget {
    /// One tensor of this name.
    Tensor(String),
    /// A stack of experts along the outermost dimension; expert `e` is
    /// [`HfTarget::expert_name`].
    Experts {
        /// The decoder layer.
        layer: usize,
        /// `gate_proj`, `up_proj` or `down_proj`.
        part: &'static str,
        /// `weight` or `bias`.
        suffix: String,
    },
}

impl HfTarget {
    /// The HF name of expert `e` of a stacked target.
    pub(crate) fn expert_name(layer: usize, e: usize, part: &str, suffix: &str) -> String {
        format!("model.layers.{layer}.mlp.experts.{e}.{part}.{suffix}")
    }
}

/// The HF name of GGUF tensor `name` (per-layer names of `arch` first), or `None` for a
/// name outside the mapping.
pub(crate) fn hf_target(name: &str, arch: &[(&str, &str)]) -> Option<HfTarget> {
    if let Some((layer, part)) = block_part(name)
        && let Some((_, hf)) = arch.iter().find(|(g, _)| *g == part)
    {
        return Some(HfTarget::Tensor(format!("model.layers.{layer}.{hf}")));
    }
    let (base, suffix) = name.rsplit_once('.')?;
    if !matches!(suffix, "weight" | "bias") {
        return None;
    }
    if let Some((_, hf)) = GLOBAL.iter().find(|(g, _)| *g == base) {
        return Some(HfTarget::Tensor(format!("{hf}.{suffix}")));
    }
    let (layer, part) = block_part(base)?;
    if let Some((_, hf)) = arch.iter().chain(BLOCK.iter()).find(|(g, _)| *g == part) {
        return Some(HfTarget::Tensor(format!("model.layers.{layer}.{hf}.{suffix}")));
    }
    let (_, hf) = EXPERTS.iter().find(|(g, _)| *g == part)?;
    Some(HfTarget::Experts { layer, part: hf, suffix: suffix.into() })
}

/// The block number of a `blk.N.*` tensor name.
pub(crate) fn block_of(name: &str) -> Option<usize> {
    block_part(name).map(|(layer, _)| layer)
}

/// The layer and the rest of a `blk.N.<part>` name.
fn block_part(name: &str) -> Option<(usize, &str)> {
    let (layer, part) = name.strip_prefix("blk.")?.split_once('.')?;
    // Only canonical decimal layer numbers, so two GGUF names never map to one HF name.
    let layer_num: usize = layer.parse().ok().filter(|n: &usize| n.to_string() == layer)?;
    Some((layer_num, part))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf_target(name: &str) -> Option<HfTarget> {
        super::hf_target(name, &[])
    }

    fn one(name: &str) -> Option<String> {
        match hf_target(name)? {
            HfTarget::Tensor(n) => Some(n),
            HfTarget::Experts { .. } => None,
        }
    }

    #[test]
    fn maps_global_and_layer_tensors() {
        assert_eq!(one("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
        assert_eq!(one("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(one("output_norm.weight").as_deref(), Some("model.norm.weight"));
        assert_eq!(one("blk.12.attn_q.bias").as_deref(), Some("model.layers.12.self_attn.q_proj.bias"));
        assert_eq!(one("blk.0.ffn_norm.weight").as_deref(), Some("model.layers.0.post_attention_layernorm.weight"));
        assert_eq!(one("blk.3.attn_k_norm.weight").as_deref(), Some("model.layers.3.self_attn.k_norm.weight"));
        assert_eq!(one("blk.1.ffn_gate_inp.weight").as_deref(), Some("model.layers.1.mlp.gate.weight"));
    }

    #[test]
    fn maps_stacked_experts() {
        assert_eq!(
            hf_target("blk.2.ffn_down_exps.weight"),
            Some(HfTarget::Experts { layer: 2, part: "down_proj", suffix: "weight".into() })
        );
        assert_eq!(HfTarget::expert_name(2, 5, "down_proj", "weight"), "model.layers.2.mlp.experts.5.down_proj.weight");
    }

    #[test]
    fn an_architecture_entry_may_map_a_whole_name() {
        let arch = [
            ("ssm_a", "linear_attn.A_log"),
            ("ssm_dt.bias", "linear_attn.dt_bias"),
            ("ssm_out", "linear_attn.out_proj"),
        ];
        let one = |name| match super::hf_target(name, &arch) {
            Some(HfTarget::Tensor(n)) => Some(n),
            _ => None,
        };
        assert_eq!(one("blk.3.ssm_a").as_deref(), Some("model.layers.3.linear_attn.A_log"));
        assert_eq!(one("blk.3.ssm_dt.bias").as_deref(), Some("model.layers.3.linear_attn.dt_bias"));
        assert_eq!(one("blk.3.ssm_out.weight").as_deref(), Some("model.layers.3.linear_attn.out_proj.weight"));
        assert_eq!(one("blk.3.attn_q.weight").as_deref(), Some("model.layers.3.self_attn.q_proj.weight"));
        assert_eq!(one("blk.03.ssm_a"), None);
    }

    #[test]
    fn leaves_other_names_alone() {
        for name in ["rope_freqs.weight", "blk.x.attn_q.weight", "blk.01.attn_q.weight", "blk.0.attn_q.scale", "foo"] {
            assert_eq!(hf_target(name), None, "{name}");
        }
    }
}
