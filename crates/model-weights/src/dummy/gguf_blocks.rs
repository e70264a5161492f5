//! Dummy weights in the blocks of a GGUF file ([`super::DummyStore::gguf_blocks`]), so a
//! benchmark can run a Q4_K_M- or Q8_0-shaped model from `config.json` alone.
//!
//! Which tensors, as llama.cpp's quantizer treats a Llama-family model:
//! - the projections of the decoder layers (`q/k/v/o_proj`, `gate/up/down_proj` of
//!   `model.layers.*`, MoE experts' included), the embedding and the output head, where
//!   their rows are whole blocks;
//! - **Q4_K_M**: Q4_K, with `v_proj` and `down_proj` in Q6_K on every other layer (llama.cpp
//!   raises about half of them) and the output head in Q6_K; **Q8_0**: Q8_0 throughout;
//! - every other tensor (norms, routers, biases) stays float.
//!
//! A block's quants are random bytes and its scales are chosen so that its values span
//! about the float weight's bound ±b (`sqrt(3 / fan_in)`): Q4_K `d = 2b / (15 · 63)`,
//! `dmin = b / 63` with every 6-bit scale and min 63 (values `d·63·q − b` for q in 0..15);
//! Q6_K `d = b / (32 · 64)` with scales 64 (values `d·64·(q − 32)`); Q8_0 `d = b / 127`.

use std::borrow::Cow;

use half::f16;
use met_kernels::quant::QuantFormat;
use met_kernels::rng::mix64;
use rayon::prelude::*;

/// The block formats a dummy GGUF-shaped store can imitate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufRecipe {
    /// Q4_K, with half the `v_proj` / `down_proj` and the head in Q6_K.
    Q4KM,
    /// Q8_0 throughout.
    Q80,
}

impl GgufRecipe {
    pub(super) fn describe(self) -> &'static str {
        match self {
            Self::Q4KM => "GGUF Q4_K_M-shaped",
            Self::Q80 => "GGUF Q8_0-shaped",
        }
    }

    /// The format of tensor `name` of `shape`, or `None` to keep it float.
    pub(super) fn format(self, name: &str, shape: &[usize]) -> Option<QuantFormat> {
        let &[_, k] = shape else { return None };
        let layer = name.strip_prefix("model.layers.").and_then(|rest| rest.split('.').next()?.parse::<usize>().ok());
        let projection = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
            .iter()
            .any(|p| name.ends_with(&format!(".{p}.weight")));
        let head = name == "lm_head.weight";
        let quantized = head || name.ends_with("embed_tokens.weight") || (layer.is_some() && projection);
        if !quantized {
            return None;
        }
        let format = match self {
            Self::Q80 => QuantFormat::Q8_0,
            Self::Q4KM if head => QuantFormat::Q6_K,
            Self::Q4KM
                if layer.is_some_and(|l| l % 2 == 0)
                    && (name.ends_with(".v_proj.weight") || name.ends_with(".down_proj.weight")) =>
            {
                QuantFormat::Q6_K
            }
            Self::Q4KM => QuantFormat::Q4_K,
        };
        k.is_multiple_of(format.block_elems()).then_some(format)
    }
}

/// The blocks of a `[n, k]` weight of bound `bound` in `format`, drawn from `key`.
pub(super) fn blocks(format: QuantFormat, n: usize, k: usize, bound: f32, key: u64) -> Cow<'static, [u8]> {
    let size = format.block_bytes();
    let mut bytes = vec![0u8; n * k / format.block_elems() * size];
    let half_bytes = |v: f32| f16::from_f32(v).to_le_bytes();
    bytes.par_chunks_mut(size).enumerate().for_each(|(i, block)| {
        let mut state = mix64(key ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for chunk in block.chunks_mut(8) {
            state = mix64(state);
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
        match format {
            // d, dmin, scales[12], qs[128].
            QuantFormat::Q4_K => {
                block[..2].copy_from_slice(&half_bytes(2.0 * bound / (15.0 * 63.0)));
                block[2..4].copy_from_slice(&half_bytes(bound / 63.0));
                block[4..16].fill(0xff);
            }
            // ql[128], qh[64], scales[16], d.
            QuantFormat::Q6_K => {
                block[192..208].fill(64);
                block[208..].copy_from_slice(&half_bytes(bound / (32.0 * 64.0)));
            }
            // d, qs[32].
            QuantFormat::Q8_0 => block[..2].copy_from_slice(&half_bytes(bound / 127.0)),
            other => unreachable!("no dummy blocks of {other}"),
        }
    });
    Cow::Owned(bytes)
}

#[cfg(test)]
mod tests {
    use met_kernels::{DType, HostTensor};

    use super::*;

    #[test]
    fn the_recipes_pick_llama_cpp_s_formats() {
        use QuantFormat::{Q4_K, Q6_K, Q8_0};
        let m = GgufRecipe::Q4KM;
        let at = |name: &str| m.format(name, &[512, 1024]);
        assert_eq!(at("model.layers.0.self_attn.q_proj.weight"), Some(Q4_K));
        assert_eq!(at("model.layers.0.self_attn.v_proj.weight"), Some(Q6_K));
        assert_eq!(at("model.layers.1.self_attn.v_proj.weight"), Some(Q4_K));
        assert_eq!(at("model.layers.2.mlp.down_proj.weight"), Some(Q6_K));
        assert_eq!(at("model.layers.3.mlp.down_proj.weight"), Some(Q4_K));
        assert_eq!(at("model.layers.3.mlp.gate_proj.weight"), Some(Q4_K));
        assert_eq!(at("lm_head.weight"), Some(Q6_K));
        assert_eq!(at("model.embed_tokens.weight"), Some(Q4_K));
        // Experts as the dense projections; routers, norms and rows of partial blocks float.
        assert_eq!(at("model.layers.0.mlp.experts.3.up_proj.weight"), Some(Q4_K));
        assert_eq!(at("model.layers.0.mlp.experts.3.down_proj.weight"), Some(Q6_K));
        assert_eq!(at("model.layers.0.mlp.gate.weight"), None);
        assert_eq!(at("model.layers.0.mlp.shared_expert_gate.weight"), None);
        assert_eq!(m.format("model.layers.0.input_layernorm.weight", &[1024]), None);
        assert_eq!(m.format("model.layers.0.self_attn.q_proj.weight", &[512, 1000]), None);
        assert_eq!(GgufRecipe::Q80.format("model.layers.0.self_attn.v_proj.weight", &[512, 1024]), Some(Q8_0));
        assert_eq!(GgufRecipe::Q80.format("model.layers.0.self_attn.q_proj.weight", &[512, 1000]), None);
    }

    #[test]
    fn blocks_decode_within_the_weight_s_bound() {
        let (n, k, bound) = (16, 512, 0.05f32);
        for format in [QuantFormat::Q4_K, QuantFormat::Q6_K, QuantFormat::Q8_0] {
            let host = HostTensor::from_bytes(DType::Quant(format), &[n, k], blocks(format, n, k, bound, 7)).unwrap();
            let v = host.to_f32_vec().unwrap();
            let max = v.iter().fold(0f32, |a, x| a.max(x.abs()));
            let mean = v.iter().sum::<f32>() / v.len() as f32;
            // f16 rounding of d moves the extremes by a few parts in a thousand.
            assert!(max <= bound * 1.01 && max > 0.9 * bound, "{format}: max {max}, bound {bound}");
            assert!(mean.abs() < 0.05 * bound, "{format}: mean {mean}");
            assert_ne!(blocks(format, n, k, bound, 7), blocks(format, n, k, bound, 8), "{format}: the key");
        }
    }
}
