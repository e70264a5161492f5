//! MLPs: the dense gated MLP and the routed mixture of experts (Qwen3-MoE).
//!
//! Dense: `down(act(gate(x)) · up(x))` with gate and up fused into one projection, `act`
//! SiLU (SwiGLU) or GELU-tanh (GeGLU, Gemma).
//! MoE (`Qwen3MoeSparseMoeBlock`): a router picks the top-k experts per token from a
//! softmax over `gate(x)` (optionally renormalised), and the chosen experts' SwiGLU MLPs
//! are summed with those weights. Expert weights are stacked `[experts, ...]` at load.
//!
//! Under tensor parallelism gate/up are column-parallel and down row-parallel, for the
//! dense MLP and within each expert alike: every rank holds a share of every expert's
//! intermediate rows and computes the same routing from the same (replicated) input, so
//! its partial outputs need only the all-reduce that ends every row-parallel product.

use met_config::{Activation, ModelConfig, MoeConfig};
use met_kernels::{GpuBackend, Tensor};
use met_model_weights::TensorSpec;

use super::linear::Linear;
use super::{Loader, spec};
use crate::Result;
use crate::lora::{LayerLora, LoraModule};
use crate::parallel::{Param, Reduce, Sharding, Unit};

/// Gate and up, fused: each rank its share of the intermediate rows.
const GATE_UP: [Param; 2] = [
    Param::new("mlp.gate_proj", Sharding::Column(Unit::Intermediate)),
    Param::new("mlp.up_proj", Sharding::Column(Unit::Intermediate)),
];
/// Down: each rank the columns of its intermediate rows, then an all-reduce.
const DOWN: Param = Param::new("mlp.down_proj", Sharding::Row(Unit::Intermediate));
/// The router, which every rank runs on the whole input.
const ROUTER: Param = Param::replicated("mlp.gate.weight");
/// Each expert's gate and up (`mlp.experts.{e}.` prefixed), sharded like the dense MLP's.
const EXPERT_GATE_UP: [Param; 2] = [
    Param::new("gate_proj", Sharding::Column(Unit::ExpertIntermediate)),
    Param::new("up_proj", Sharding::Column(Unit::ExpertIntermediate)),
];
/// Each expert's down.
/// The shared expert every token runs beside its routed ones (Qwen3-Next, Qwen3.5-MoE),
/// and its one-column sigmoid gate.
const SHARED_GATE_UP: [Param; 2] = [
    Param::new("mlp.shared_expert.gate_proj", Sharding::Column(Unit::Intermediate)),
    Param::new("mlp.shared_expert.up_proj", Sharding::Column(Unit::Intermediate)),
];
const SHARED_DOWN: Param = Param::new("mlp.shared_expert.down_proj", Sharding::Row(Unit::Intermediate));
const SHARED_GATE: Param = Param::replicated("mlp.shared_expert_gate");

const EXPERT_DOWN: Param = Param::new("down_proj", Sharding::Row(Unit::ExpertIntermediate));

/// The checkpoint name of expert `e`'s `part` weight under `prefix`.
fn expert(prefix: &str, e: usize, part: &Param) -> String {
    part.at(&format!("{prefix}mlp.experts.{e}."), ".weight")
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
        /// The all-reduce of the experts' row-parallel output.
        reduce: Reduce,
        /// The shared expert and its gate `[1, hidden]`.
        shared: Option<Box<(Mlp, Linear)>>,
    },
}

impl Mlp {
    /// The checkpoint tensors of a dense MLP.
    pub fn dense_tensors(cfg: &ModelConfig, prefix: &str) -> Vec<TensorSpec> {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let mut specs: Vec<TensorSpec> = GATE_UP.iter().map(|p| spec(prefix, &p.at("", ".weight"), &[i, h])).collect();
        specs.push(spec(prefix, &DOWN.at("", ".weight"), &[h, i]));
        if cfg.mlp_bias {
            specs.extend(GATE_UP.iter().map(|p| spec(prefix, &p.at("", ".bias"), &[i])));
            specs.push(spec(prefix, &DOWN.at("", ".bias"), &[h]));
        }
        specs
    }

    /// The checkpoint tensors of a mixture-of-experts MLP (per-expert names, as on the hub).
    pub fn moe_tensors(cfg: &ModelConfig, moe: &MoeConfig, prefix: &str) -> Vec<TensorSpec> {
        let (h, i) = (cfg.hidden_size, moe.expert_intermediate_size);
        let mut specs = vec![spec(prefix, ROUTER.name, &[moe.num_experts, h])];
        if let Some(s) = moe.shared_expert_intermediate_size {
            specs.extend(SHARED_GATE_UP.iter().map(|p| spec(prefix, &p.at("", ".weight"), &[s, h])));
            specs.push(spec(prefix, &SHARED_DOWN.at("", ".weight"), &[h, s]));
            specs.push(spec(prefix, &SHARED_GATE.at("", ".weight"), &[1, h]));
        }
        for e in 0..moe.num_experts {
            specs.extend(EXPERT_GATE_UP.iter().map(|p| spec("", &expert(prefix, e, p), &[i, h])));
            specs.push(spec("", &expert(prefix, e, &EXPERT_DOWN), &[h, i]));
        }
        specs
    }

    /// Loads the loader's share of a dense MLP.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load_dense(l: &Loader<'_>, prefix: &str) -> Result<Self> {
        Ok(Self::Dense {
            gate_up: Linear::load(l, prefix, &GATE_UP, l.cfg.mlp_bias)?,
            down: Linear::load(l, prefix, &[DOWN], l.cfg.mlp_bias)?,
            activation: l.cfg.activation,
        })
    }

    /// Loads the loader's share of a mixture of experts, stacking the experts' weights.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load_moe(l: &Loader<'_>, moe: &MoeConfig, prefix: &str) -> Result<Self> {
        let (h, i, e) = (l.cfg.hidden_size, l.shard.expert_intermediate(), moe.num_experts);
        let names = |parts: &[Param]| -> Vec<(String, Sharding)> {
            (0..e).flat_map(|x| parts.iter().map(move |p| (expert(prefix, x, p), p.sharding))).collect()
        };
        let stacked = |parts: &[Param]| l.shard.load_fused(l.store, l.backend, &names(parts));
        Ok(Self::Moe {
            router: l.shard.load(l.store, l.backend, &ROUTER.at(prefix, ""), ROUTER.sharding)?,
            // Rows [gate_0; up_0; gate_1; up_1; ...] viewed as [e, 2i, h].
            gate_up: stacked(&EXPERT_GATE_UP)?.reshape(&[e, 2 * i, h])?,
            // Rows [down_0; down_1; ...] viewed as [e, h, i].
            down: stacked(&[EXPERT_DOWN])?.reshape(&[e, h, i])?,
            top_k: moe.experts_per_token,
            renormalize: moe.norm_topk_prob,
            reduce: l.shard.reduce_for(EXPERT_DOWN.sharding),
            shared: match moe.shared_expert_intermediate_size {
                Some(_) => {
                    let expert = Self::Dense {
                        gate_up: Linear::load(l, prefix, &SHARED_GATE_UP, false)?,
                        down: Linear::load(l, prefix, &[SHARED_DOWN], false)?,
                        activation: l.cfg.activation,
                    };
                    Some(Box::new((expert, Linear::load(l, prefix, &[SHARED_GATE], false)?)))
                }
                None => None,
            },
        })
    }

    /// `x [t, hidden] -> [t, hidden]`.
    ///
    /// # Errors
    /// On device failure.
    /// A dense MLP (a shared expert too) adds the deltas of `lora`'s adapters to its
    /// projections, routed experts those of adapters on experts.
    pub fn forward(&self, backend: &dyn GpuBackend, x: &Tensor, lora: LayerLora<'_>) -> Result<Tensor> {
        match self {
            Self::Dense { gate_up, down, activation } => {
                let adapted = lora.adapts(&[LoraModule::Gate, LoraModule::Up]);
                let act = match (activation, &gate_up.bias) {
                    (Activation::Silu, None) if !adapted => backend.matmul_silu_mul(x, &gate_up.weight)?,
                    (Activation::Silu, _) => backend.silu_mul(&Self::gate_up(backend, gate_up, x, lora)?)?,
                    (Activation::GeluTanh, _) => backend.gelu_tanh_mul(&Self::gate_up(backend, gate_up, x, lora)?)?,
                };
                lora.project(backend, &act, &[(LoraModule::Down, 0)], || down.forward(backend, &act))
            }
            Self::Moe { router, gate_up, down, top_k, renormalize, reduce, shared } => {
                let logits =
                    lora.project(backend, x, &[(LoraModule::Router, 0)], || Ok(backend.matmul(x, router, None)?))?;
                let routing = backend.topk_routing(&logits, *top_k, *renormalize)?;
                let adapters = lora.experts();
                let experts = adapters.as_ref().map(|e| e.op());
                // The shared expert's output and its `[t, 1]` gates, one per token, broadcast
                // over the output: on one device they add in where the routed rows combine,
                // and a gate without bias or adapter goes there as its weight, for the backend
                // to take its product where it combines.
                let shared = match shared {
                    Some(shared) => {
                        let (expert, gate) = &**shared;
                        let out = expert.forward(backend, x, lora)?;
                        if reduce.is_identity() && gate.is_plain() && !lora.adapts(&[LoraModule::SharedGate]) {
                            return Ok(backend.moe_experts_shared_gate_weight(
                                x,
                                &routing,
                                (gate_up, down),
                                experts.as_ref(),
                                (&out, &gate.weight),
                            )?);
                        }
                        let gate =
                            lora.project(backend, x, &[(LoraModule::SharedGate, 0)], || gate.forward(backend, x))?;
                        Some((out, gate))
                    }
                    None => None,
                };
                if reduce.is_identity()
                    && let Some((out, gate)) = &shared
                {
                    return Ok(backend.moe_experts_shared(
                        x,
                        &routing,
                        (gate_up, down),
                        experts.as_ref(),
                        (out, gate),
                    )?);
                }
                let routed = match &experts {
                    Some(experts) => backend.moe_experts_lora(x, &routing, gate_up, down, experts)?,
                    None => backend.moe_experts(x, &routing, gate_up, down)?,
                };
                let routed = reduce.apply(routed)?;
                match shared {
                    Some((out, gate)) => Ok(backend.sigmoid_mul_add(&out, &gate, &routed)?),
                    None => Ok(routed),
                }
            }
        }
    }

    /// The fused gate/up product of `x`, with the adapters' gate and up deltas in their
    /// halves.
    fn gate_up(backend: &dyn GpuBackend, gate_up: &Linear, x: &Tensor, lora: LayerLora<'_>) -> Result<Tensor> {
        let half = gate_up.weight.dims()[0] / 2;
        lora.project(backend, x, &[(LoraModule::Gate, 0), (LoraModule::Up, half)], || gate_up.forward(backend, x))
    }
}
