//! Self-attention: fused q/k/v projection, the prologue (split into heads, optional per-head
//! q/k RMSNorm (Qwen3, Gemma 3), rotary, K/V into the cache) as one backend op, the attention
//! backend over the paged cache, and the output projection.
//!
//! Follows `LlamaAttention` / `Qwen3Attention` / `Gemma2Attention` in transformers: queries
//! and keys are normalised per head *before* rotary, scores are scaled by `head_dim^-0.5`
//! (or the recipe's scale) and optionally soft-capped; each layer has its own rotary
//! frequencies and window (Gemma 3's local and global layers differ in both).
//!
//! Under tensor parallelism a rank computes its share of the heads: q/k/v are
//! column-parallel by heads, o is row-parallel and its partial outputs are summed across
//! ranks (the rules below, next to the names).

use met_config::ModelConfig;
use met_kernels::{AttentionParams, GpuBackend, KvScales, QkvPrologue, Tensor};
use met_model_weights::{TensorSpec, WeightStore};

use super::linear::Linear;
use super::norm::load_norm;
use super::{Loader, spec};
use crate::attention::{AttentionBackend, StepMetadata};
use crate::lora::{LayerLora, LoraModule};
use crate::parallel::{Param, Sharding, Unit};
use crate::{ModelError, Result};

/// q, k and v, fused into one projection: each rank its query heads and KV heads.
const QKV: [Param; 3] = [
    Param::new("self_attn.q_proj", Sharding::Column(Unit::QueryHeads)),
    Param::new("self_attn.k_proj", Sharding::Column(Unit::KvHeads)),
    Param::new("self_attn.v_proj", Sharding::Column(Unit::KvHeads)),
];
/// The output projection: each rank the columns of its query heads, then an all-reduce.
const O: Param = Param::new("self_attn.o_proj", Sharding::Row(Unit::QueryHeads));
/// Gated attention's output gate (the gate half of a doubled `q_proj`, de-interleaved by
/// the checkpoint view): column-parallel by query heads like the queries.
const Q_GATE: Param = Param::new("self_attn.q_gate", Sharding::Column(Unit::QueryHeads));
/// Per-head norms of `head_dim` weights, the same for every head.
const Q_NORM: Param = Param::replicated("self_attn.q_norm.weight");
const K_NORM: Param = Param::replicated("self_attn.k_norm.weight");

/// Per-token inputs shared by every layer of one step.
pub struct StepInputs<'a> {
    /// `u32 [t]` positions.
    pub positions: &'a Tensor,
    /// Attention metadata of the step.
    pub meta: &'a StepMetadata,
    /// The step's LoRA adapters at this layer.
    pub lora: LayerLora<'a>,
}

/// One layer's self-attention.
pub struct SelfAttention {
    qkv: Linear,
    /// Gated attention: the output is multiplied by `sigmoid(x · gateᵀ)` before `o`.
    gate: Option<Linear>,
    o: Linear,
    qk_norm: Option<(Tensor, Tensor)>,
    /// `f32 [head_dim / 2]`: this layer's rotary inverse frequencies.
    inv_freq: Tensor,
    params: AttentionParams,
    eps: f32,
}

impl SelfAttention {
    /// The checkpoint tensors of layer `prefix` (e.g. `model.layers.3.`).
    pub fn tensors(cfg: &ModelConfig, prefix: &str, qk_norm: bool) -> Vec<TensorSpec> {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let outs = [cfg.num_heads * d, cfg.num_kv_heads * d, cfg.num_kv_heads * d];
        let mut specs = Vec::new();
        for (param, out) in QKV.iter().zip(outs) {
            specs.push(spec(prefix, &format!("{}.weight", param.name), &[out, h]));
            if cfg.qkv_bias {
                specs.push(spec(prefix, &format!("{}.bias", param.name), &[out]));
            }
        }
        if cfg.attn_output_gate {
            specs.push(spec(prefix, &format!("{}.weight", Q_GATE.name), &[outs[0], h]));
        }
        specs.push(spec(prefix, &format!("{}.weight", O.name), &[h, outs[0]]));
        if cfg.o_bias {
            specs.push(spec(prefix, &format!("{}.bias", O.name), &[h]));
        }
        if qk_norm {
            specs.push(spec(prefix, Q_NORM.name, &[d]));
            specs.push(spec(prefix, K_NORM.name, &[d]));
        }
        specs
    }

    /// Loads the loader's share of the heads of layer `layer` (checkpoint prefix `prefix`),
    /// rotating with `inv_freq`.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load(l: &Loader<'_>, prefix: &str, layer: usize, inv_freq: Tensor) -> Result<Self> {
        let cfg = l.cfg;
        let norm = |p: Param| load_norm(l.store, &p.at(prefix, ""), l.backend, cfg.norm_weight);
        let qk_norm = if cfg.qk_norm { Some((norm(Q_NORM)?, norm(K_NORM)?)) } else { None };
        Ok(Self {
            qkv: Linear::load(l, prefix, &QKV, cfg.qkv_bias)?,
            gate: if cfg.attn_output_gate { Some(Linear::load(l, prefix, &[Q_GATE], false)?) } else { None },
            o: Linear::load(l, prefix, &[O], cfg.o_bias)?,
            qk_norm,
            inv_freq,
            params: AttentionParams {
                num_heads: l.shard.num_heads(),
                num_kv_heads: l.shard.num_kv_heads(),
                head_dim: cfg.head_dim,
                scale: cfg.attention_scale.map_or((cfg.head_dim as f32).powf(-0.5), |s| s as f32),
                sliding_window: cfg.window(layer),
                softcap: cfg.attention_softcap.map(|c| c as f32),
                kv_scales: kv_scales(l.store, prefix)?,
            },
            eps: cfg.rms_norm_eps as f32,
        })
    }

    /// `x [t, hidden] -> [t, hidden]`, writing this step's K/V into `cache`.
    ///
    /// # Errors
    /// On device failure.
    pub fn forward(
        &self,
        backend: &dyn GpuBackend,
        attention: &dyn AttentionBackend,
        x: &Tensor,
        step: &StepInputs<'_>,
        cache: (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let AttentionParams { num_heads: h, num_kv_heads: hkv, head_dim: d, .. } = self.params;
        let t = x.dims()[0];
        let (q_cols, kv_cols) = (h * d, hkv * d);
        let parts = [(LoraModule::Q, 0), (LoraModule::K, q_cols), (LoraModule::V, q_cols + kv_cols)];
        let qkv = step.lora.project(backend, x, &parts, || self.qkv.forward(backend, x))?;
        let prologue = QkvPrologue {
            num_heads: h,
            num_kv_heads: hkv,
            head_dim: d,
            qk_norm: self.qk_norm.as_ref().map(|(q, k)| (q, k)),
            eps: self.eps,
            positions: step.positions,
            inv_freq: &self.inv_freq,
            kv_scales: self.params.kv_scales,
        };
        // Split into heads, q/k norm, rotary, and k/v into the cache: q [t, h, d].
        let q = backend.qkv_rotary_write(&qkv, &prologue, cache.0, cache.1, &step.meta.slots)?;
        let out = attention.attend(&q, cache, step.meta, &self.params)?;
        // [t, h, d] -> [t, h * d]
        let out = out.reshape(&[t, h * d])?;
        let out = match &self.gate {
            Some(gate) => {
                let gate = step.lora.project(backend, x, &[(LoraModule::QGate, 0)], || gate.forward(backend, x))?;
                backend.sigmoid_mul(&out, &gate)?
            }
            None => out,
        };
        step.lora.project(backend, &out, &[(LoraModule::O, 0)], || self.o.forward(backend, &out))
    }
}

/// Layer `prefix`'s FP8 KV-cache scales where the checkpoint has them (`self_attn.k_scale`
/// and `self_attn.v_scale`, one positive number each, as FP8 checkpoints with a KV-cache
/// scheme store them), else 1.0. A float cache ignores them.
fn kv_scales(store: &dyn WeightStore, prefix: &str) -> Result<KvScales> {
    let one = |name: &str| -> Result<f32> {
        let full = format!("{prefix}self_attn.{name}");
        if store.info(&full).is_none() {
            return Ok(1.0);
        }
        match store.host(&full)?.to_f32_vec()?[..] {
            [s] if s.is_finite() && s > 0.0 => Ok(s),
            ref v => Err(ModelError::Unsupported(format!(
                "{full}: a KV-cache scale is one positive number; the checkpoint has {v:?}"
            ))),
        }
    };
    Ok(KvScales { k: one("k_scale")?, v: one("v_scale")? })
}
