//! MLPs: the dense gated MLP and the routed mixture of experts (Qwen3-MoE).
//!
//! Dense: `down(act(gate(x)) · up(x))` with gate and up fused into one projection, `act`
//! SiLU (SwiGLU) or GELU-tanh (GeGLU, Gemma).
//! MoE (`Qwen3MoeSparseMoeBlock`): a router picks the top-k experts per token from a
//! softmax over `gate(x)` (optionally renormalised), and the chosen experts' SwiGLU MLPs
//! are summed with those weights. Expert weights are stacked `[experts, ...]` at load.

use met_config::{Activation, ModelConfig, MoeConfig};
use met_kernels::{GpuBackend, Tensor};
use met_model_weights::{TensorSpec, WeightStore, load, load_concat};

use super::linear::Linear;
use super::spec;
use crate::Result;

const GATE_UP: [&str; 2] = ["mlp.gate_proj", "mlp.up_proj"];
const DOWN: &str = "mlp.down_proj";
const ROUTER: &str = "mlp.gate.weight";

fn expert(e: usize, part: &str) -> String {
    format!("mlp.experts.{e}.{part}.weight")
}

/// A layer's MLP.
pub enum Mlp {
    /// Dense gated MLP.
    Dense {
        /// `[2 · intermediate, hidden]`: gate rows then up rows.
        gate_up: Linear,
        /// `[hidden, intermediate]`.
        down: Linear,
        /// The gate's activation.
        activation: Activation,
    },
    /// Routed experts.
    Moe {
        /// `[experts, hidden]` router.
        router: Tensor,
        /// `[experts, 2 · intermediate, hidden]`.
        gate_up: Tensor,
        /// `[experts, hidden, intermediate]`.
        down: Tensor,
        /// Experts per token.
        top_k: usize,
        /// Whether chosen weights are renormalised to sum to one.
        renormalize: bool,
    },
}

impl Mlp {
    /// The checkpoint tensors of a dense MLP.
    pub fn dense_tensors(cfg: &ModelConfig, prefix: &str) -> Vec<TensorSpec> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let mut specs = vec![
            spec(prefix, &format!("{}.weight", GATE_UP[0]), &[i, h]),
            spec(prefix, &format!("{}.weight", GATE_UP[1]), &[i, h]),
            spec(prefix, &format!("{DOWN}.weight"), &[h, i]),
        ];
        if cfg.mlp_bias {
            specs.extend(GATE_UP.iter().map(|p| spec(prefix, &format!("{p}.bias"), &[i])));
            specs.push(spec(prefix, &format!("{DOWN}.bias"), &[h]));
        }
        specs
    }

    /// The checkpoint tensors of a mixture-of-experts MLP (per-expert names, as on the hub).
    pub fn moe_tensors(cfg: &ModelConfig, moe: &MoeConfig, prefix: &str) -> Vec<TensorSpec> {
        let (h, i) = (cfg.hidden_size, moe.expert_intermediate_size);
        let mut specs = vec![spec(prefix, ROUTER, &[moe.num_experts, h])];
        for e in 0..moe.num_experts {
            specs.push(spec(prefix, &expert(e, "gate_proj"), &[i, h]));
            specs.push(spec(prefix, &expert(e, "up_proj"), &[i, h]));
            specs.push(spec(prefix, &expert(e, "down_proj"), &[h, i]));
        }
        specs
    }

    /// Loads a dense MLP.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load_dense(
        cfg: &ModelConfig,
        store: &dyn WeightStore,
        backend: &dyn GpuBackend,
        prefix: &str,
    ) -> Result<Self> {
        Ok(Self::Dense {
            gate_up: Linear::load_fused(store, backend, prefix, &GATE_UP, cfg.mlp_bias)?,
            down: Linear::load_fused(store, backend, prefix, &[DOWN], cfg.mlp_bias)?,
            activation: cfg.activation,
        })
    }

    /// Loads a mixture of experts, stacking the experts' weights.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load_moe(
        cfg: &ModelConfig,
        moe: &MoeConfig,
        store: &dyn WeightStore,
        backend: &dyn GpuBackend,
        prefix: &str,
    ) -> Result<Self> {
        let (h, i, e) = (cfg.hidden_size, moe.expert_intermediate_size, moe.num_experts);
        let names = |parts: &[&str]| -> Vec<String> {
            (0..e).flat_map(|x| parts.iter().map(move |p| format!("{prefix}{}", expert(x, p)))).collect()
        };
        let stacked = |names: Vec<String>| {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            load_concat(store, &refs, backend)
        };
        Ok(Self::Moe {
            router: load(store, &format!("{prefix}{ROUTER}"), backend)?,
            // Rows [gate_0; up_0; gate_1; up_1; ...] viewed as [e, 2i, h].
            gate_up: stacked(names(&["gate_proj", "up_proj"]))?.reshape(&[e, 2 * i, h])?,
            // Rows [down_0; down_1; ...] viewed as [e, h, i].
            down: stacked(names(&["down_proj"]))?.reshape(&[e, h, i])?,
            top_k: moe.experts_per_token,
            renormalize: moe.norm_topk_prob,
        })
    }

    /// `x [t, hidden] -> [t, hidden]`.
    ///
    /// # Errors
    /// On device failure.
    pub fn forward(&self, backend: &dyn GpuBackend, x: &Tensor) -> Result<Tensor> {
        match self {
            Self::Dense { gate_up, down, activation } => {
                let act = match (activation, &gate_up.bias) {
                    (Activation::Silu, None) => backend.matmul_silu_mul(x, &gate_up.weight)?,
                    (Activation::Silu, Some(_)) => backend.silu_mul(&gate_up.forward(backend, x)?)?,
                    (Activation::GeluTanh, _) => backend.gelu_tanh_mul(&gate_up.forward(backend, x)?)?,
                };
                down.forward(backend, &act)
            }
            Self::Moe { router, gate_up, down, top_k, renormalize } => {
                let logits = backend.matmul(x, router, None)?;
                let routing = backend.topk_routing(&logits, *top_k, *renormalize)?;
                Ok(backend.moe_experts(x, &routing, gate_up, down)?)
            }
        }
    }
}
