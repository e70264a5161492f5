//! Which weights a quantized checkpoint stores as float8, and the scales it keeps beside
//! them: the rule [`super::DummyStore::quantized`] follows, so that random weights have a
//! real FP8 checkpoint's names, dtypes and shapes, and load through the same view.
//!
//! The rule, as transformers' `fp8` (Qwen's block-wise checkpoints, AutoFP8's per-tensor
//! ones) and compressed-tensors' float8 schemes write the architectures met serves:
//! - **Float8**: the weight of every linear layer inside the decoder layers, which in these
//!   models are exactly the 2-D `model.layers.*.weight` tensors (norms are 1-D, the Gated
//!   DeltaNet's short convolution 3-D): attention q/k/v/o and the query gate, the Gated
//!   DeltaNet's projections, the MLP's, the shared expert's and every expert's
//!   gate/up/down. Quantizers convert linear layers (`nn.Linear`), and nothing else.
//! - **Float**: everything else. The embedding is no linear layer. The output head
//!   (`lm_head`) is outside the decoder layers and always kept: transformers keeps the
//!   output embedding, AutoFP8 ignores `.*lm_head` by default, and compressed-tensors
//!   recipes list it in `ignore`. The MoE router (`mlp.gate`) and the shared expert's gate
//!   (`mlp.shared_expert_gate`) are always kept too, listed or not: they pick experts
//!   rather than project, and the FP8 checkpoints of these families keep them in bf16
//!   (Qwen3-30B-A3B-FP8 lists every router in `modules_to_not_convert`). And so is every
//!   module the config leaves unquantized ([`QuantConfig::unquantized`]).
//! - An unquantized-list entry matches as the library that wrote the list matches it,
//!   against the module's name in the checkpoint (a vision-language checkpoint keeps the
//!   text model's `model.` under its text prefix, `model.language_model.`).
//!   transformers' `modules_to_not_convert`: a module whose name starts or ends with the
//!   entry (its `should_convert_module`, with the entry read literally rather than as a
//!   regular expression). compressed-tensors' `ignore`: the module's whole name, or, for
//!   `re:<pattern>`, the pattern from the start of the name, with `.*` any run of
//!   characters, `.` and `\.` a dot and a final `$` the end of the name (the syntax ignore
//!   lists use; any other regular-expression syntax is matched literally).
//!
//! The companions of a float8 weight `<module>.weight` `[n, k]`, as each format names and
//! shapes them: transformers' block-wise `fp8` `<module>.weight_scale_inv`
//! `[ceil(n / rows), ceil(k / cols)]`; its per-tensor form (no `weight_block_size`, as
//! AutoFP8 writes it) `<module>.weight_scale` of shape `[]`; compressed-tensors
//! `<module>.weight_scale` `[1]` per tensor, `[n, 1]` per channel and the block grid per
//! block. With static activation scales, `<module>.input_scale`, shaped as a per-tensor
//! weight scale.

use met_config::{QuantConfig, ScaleLayout};
use met_kernels::fp8::E4M3_MAX;

use crate::is_ignored;

/// The static input scale of every float8 weight: activations up to 16 in magnitude (a
/// few standard deviations of the unit-scale activations dummy weights keep) fit e4m3's
/// ±448 unclipped. met does not read it; a checkpoint with static activations has one.
const INPUT_SCALE: f32 = 16.0 / E4M3_MAX;

/// The library whose conventions a quantized checkpoint follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// transformers' `fp8` (and AutoFP8, which writes the same `quant_method`).
    Transformers,
    /// `compressed-tensors`.
    CompressedTensors,
}

/// A quantization config, read for the tensors its checkpoints hold.
pub(super) struct Scheme<'a> {
    quant: &'a QuantConfig,
    format: Format,
    /// Where the checkpoint keeps what met names `model.` (a vision-language one's text
    /// model), when elsewhere.
    text_prefix: Option<&'a str>,
}

impl<'a> Scheme<'a> {
    /// The scheme of `quant`, for a checkpoint that keeps its text model under
    /// `text_prefix` (`None`: under `model.`).
    pub(super) fn new(quant: &'a QuantConfig, text_prefix: Option<&'a str>) -> Self {
        let format = match quant.method.as_str() {
            "compressed-tensors" => Format::CompressedTensors,
            _ => Format::Transformers,
        };
        Self { quant, format, text_prefix }
    }

    /// Whether a checkpoint of this scheme stores `name`, of `shape`, as float8.
    pub(super) fn quantizes(&self, name: &str, shape: &[usize]) -> bool {
        let Some(module) = name.strip_suffix(".weight") else { return false };
        let is_gate = module.ends_with(".mlp.gate") || module.ends_with(".mlp.shared_expert_gate");
        shape.len() == 2 && module.starts_with("model.layers.") && !is_gate && !self.leaves_unquantized(module)
    }

    /// Whether the config's unquantized list names `module` (a met name).
    fn leaves_unquantized(&self, module: &str) -> bool {
        let stored = match (self.text_prefix, module.strip_prefix("model.")) {
            (Some(prefix), Some(rest)) => format!("{prefix}{rest}"),
            _ => module.to_owned(),
        };
        let module = stored.as_str();
        self.quant.unquantized.iter().any(|entry| match self.format {
            Format::Transformers => module.starts_with(entry.as_str()) || module.ends_with(entry.as_str()),
            Format::CompressedTensors => match entry.strip_prefix("re:") {
                Some(pattern) => is_ignored(module, &[&glob_of(pattern)]),
                None => module == entry,
            },
        })
    }

    /// The tensors stored beside the float8 weight `name` of `shape` (2-D, one that
    /// [`Self::quantizes`]): each name, shape and value, every scale `scale`.
    pub(super) fn companions(&self, name: &str, shape: &[usize], scale: f32) -> Vec<(String, Vec<usize>, f32)> {
        let module = name.strip_suffix(".weight").unwrap_or(name);
        let (n, k) = (shape[0], shape[1]);
        let per_tensor = match self.format {
            Format::Transformers => vec![],
            Format::CompressedTensors => vec![1],
        };
        let (suffix, scale_shape) = match (self.format, self.quant.scales) {
            (Format::Transformers, Some(ScaleLayout::Block(rows, cols))) => {
                ("weight_scale_inv", vec![n.div_ceil(rows), k.div_ceil(cols)])
            }
            (_, Some(ScaleLayout::Block(rows, cols))) => ("weight_scale", vec![n.div_ceil(rows), k.div_ceil(cols)]),
            (_, Some(ScaleLayout::Channel)) => ("weight_scale", vec![n, 1]),
            (_, Some(ScaleLayout::Tensor) | None) => ("weight_scale", per_tensor.clone()),
        };
        let mut out = vec![(format!("{module}.{suffix}"), scale_shape, scale)];
        if self.quant.static_activations {
            out.push((format!("{module}.input_scale"), per_tensor, INPUT_SCALE));
        }
        out
    }

    /// The scheme in words, e.g. `fp8 (128x128 block scales)`.
    pub(super) fn describe(&self) -> String {
        let scales = match self.quant.scales {
            Some(ScaleLayout::Block(rows, cols)) => format!("{rows}x{cols} block"),
            Some(ScaleLayout::Channel) => "per-channel".into(),
            Some(ScaleLayout::Tensor) | None => "per-tensor".into(),
        };
        let inputs = if self.quant.static_activations { ", static input scales" } else { "" };
        format!("{} ({scales} scales{inputs})", self.quant.method)
    }
}

/// The [`is_ignored`] pattern of a compressed-tensors `re:` pattern, in the syntax ignore
/// lists use: anchored at the start, `.*` any run, `.` and `\.` a dot, `$` the end.
fn glob_of(pattern: &str) -> String {
    let (body, anchored) = match pattern.strip_suffix('$') {
        Some(body) => (body, true),
        None => (pattern, false),
    };
    let glob = body.replace(".*", "*").replace("\\.", ".");
    if anchored { glob } else { format!("{glob}*") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(method: &str, scales: Option<ScaleLayout>, unquantized: &[&str]) -> QuantConfig {
        QuantConfig {
            method: method.into(),
            scales,
            static_activations: false,
            unquantized: unquantized.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn the_decoder_layers_linear_weights_are_quantized() {
        let q = config("fp8", Some(ScaleLayout::Block(128, 128)), &[]);
        let s = Scheme::new(&q, None);
        for name in [
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.3.mlp.down_proj.weight",
            "model.layers.1.mlp.experts.7.up_proj.weight",
            "model.layers.2.mlp.shared_expert.gate_proj.weight",
            "model.layers.0.linear_attn.in_proj_qkv.weight",
        ] {
            assert!(s.quantizes(name, &[8, 64]), "{name}");
        }
        for (name, shape) in [
            ("model.embed_tokens.weight", &[8, 64][..]),
            ("lm_head.weight", &[8, 64]),
            ("model.layers.0.mlp.gate.weight", &[8, 64]),
            ("model.layers.0.mlp.shared_expert_gate.weight", &[1, 64]),
            ("model.layers.0.input_layernorm.weight", &[64]),
            ("model.layers.0.self_attn.q_proj.bias", &[8]),
            ("model.layers.0.linear_attn.conv1d.weight", &[8, 1, 4]),
        ] {
            assert!(!s.quantizes(name, shape), "{name}");
        }
    }

    #[test]
    fn unquantized_entries_match_as_their_library_matches_them() {
        let fp8 = config("fp8", None, &["model.layers.1.self_attn", "o_proj"]);
        let s = Scheme::new(&fp8, None);
        assert!(!s.quantizes("model.layers.1.self_attn.q_proj.weight", &[8, 64]), "a prefix");
        assert!(!s.quantizes("model.layers.0.self_attn.o_proj.weight", &[8, 64]), "a suffix");
        assert!(s.quantizes("model.layers.0.self_attn.q_proj.weight", &[8, 64]));

        let ct = config(
            "compressed-tensors",
            Some(ScaleLayout::Channel),
            &["model.layers.0.mlp.down_proj", "re:.*self_attn\\.k_proj$", "re:model.layers.2."],
        );
        let s = Scheme::new(&ct, None);
        assert!(!s.quantizes("model.layers.0.mlp.down_proj.weight", &[8, 64]), "the whole name");
        assert!(s.quantizes("model.layers.10.mlp.down_proj.weight", &[8, 64]), "only the whole name");
        assert!(!s.quantizes("model.layers.5.self_attn.k_proj.weight", &[8, 64]), "a pattern to the end");
        assert!(!s.quantizes("model.layers.2.mlp.up_proj.weight", &[8, 64]), "a pattern from the start");
        assert!(s.quantizes("model.layers.5.self_attn.q_proj.weight", &[8, 64]));
    }

    /// A vision-language checkpoint lists its text model's modules under its text prefix.
    #[test]
    fn unquantized_entries_name_a_vision_language_checkpoints_modules() {
        let q =
            config("fp8", Some(ScaleLayout::Block(128, 128)), &["model.language_model.layers.0.linear_attn.in_proj_b"]);
        let name = "model.layers.0.linear_attn.in_proj_b.weight";
        assert!(!Scheme::new(&q, Some("model.language_model.")).quantizes(name, &[16, 64]));
        assert!(
            Scheme::new(&q, Some("model.language_model."))
                .quantizes("model.layers.1.linear_attn.in_proj_b.weight", &[16, 64])
        );
        assert!(Scheme::new(&q, None).quantizes(name, &[16, 64]));
    }

    #[test]
    fn companions_are_named_and_shaped_as_each_format_stores_them() {
        let name = "model.layers.0.mlp.up_proj.weight";
        let names = |q: &QuantConfig| -> Vec<(String, Vec<usize>)> {
            Scheme::new(q, None).companions(name, &[300, 200], 0.5).into_iter().map(|(n, s, _)| (n, s)).collect()
        };
        let scale = |suffix: &str, shape: &[usize]| (format!("model.layers.0.mlp.up_proj.{suffix}"), shape.to_vec());
        let block = config("fp8", Some(ScaleLayout::Block(128, 128)), &[]);
        assert_eq!(names(&block), [scale("weight_scale_inv", &[3, 2])]);
        let mut per_tensor = config("fp8", None, &[]);
        per_tensor.static_activations = true;
        assert_eq!(names(&per_tensor), [scale("weight_scale", &[]), scale("input_scale", &[])]);
        let channel = config("compressed-tensors", Some(ScaleLayout::Channel), &[]);
        assert_eq!(names(&channel), [scale("weight_scale", &[300, 1])]);
        let mut tensor = config("compressed-tensors", Some(ScaleLayout::Tensor), &[]);
        tensor.static_activations = true;
        assert_eq!(names(&tensor), [scale("weight_scale", &[1]), scale("input_scale", &[1])]);
        let ct_block = config("compressed-tensors", Some(ScaleLayout::Block(128, 64)), &[]);
        assert_eq!(names(&ct_block), [scale("weight_scale", &[3, 4])]);
    }
}
