//! The Gated DeltaNet token mixer of hybrid models (`Qwen3NextGatedDeltaNet`,
//! `Qwen3_5GatedDeltaNet` in transformers): a linear-attention layer whose memory of the
//! sequence is a fixed-size state, not a K/V cache.
//!
//! Per step: one projection yields the convolution's input (queries, keys, values) and the
//! output gate `z`, another the delta rule's gates `b` and `a`; a causal depthwise
//! convolution (SiLU) mixes each channel with its last `width - 1` inputs; the gated delta
//! rule updates each value head's `[d_k, d_v]` state and reads it with the query; a gated
//! RMSNorm (`w · norm(o) · silu(z)`, a plain `w`) and the output projection close it. The
//! convolution window and the delta-rule state live in the cache's state pools at the
//! sequence's slot ([`met_cache::StateLayout`]).
//!
//! Checkpoints name the projections as Qwen3.5 does; Qwen3-Next's grouped
//! `in_proj_qkvz` / `in_proj_ba` are presented under those names by the checkpoint view.

use met_config::{LinearAttentionConfig, ModelConfig};
use met_kernels::{DType, DeltaRule, GpuBackend, HostTensor, RecurrentBatch, Tensor};
use met_model_weights::{TensorSpec, WeightStore};

use super::linear::Linear;
use super::{Loader, spec};
use crate::Result;
use crate::lora::{LayerLora, LoraModule};
use crate::parallel::Param;

/// Queries, keys and values (the convolution's input), then the output gate `z`.
const IN_QKV_Z: [Param; 2] = [Param::replicated("linear_attn.in_proj_qkv"), Param::replicated("linear_attn.in_proj_z")];
/// The delta rule's `b` (β) and `a` (decay) gates.
const IN_B_A: [Param; 2] = [Param::replicated("linear_attn.in_proj_b"), Param::replicated("linear_attn.in_proj_a")];
const CONV: &str = "linear_attn.conv1d.weight";
const A_LOG: &str = "linear_attn.A_log";
const DT_BIAS: &str = "linear_attn.dt_bias";
const NORM: &str = "linear_attn.norm.weight";
const OUT: Param = Param::replicated("linear_attn.out_proj");

/// The layer's four input projections as one product where the checkpoint stores them in
/// one float dtype (queries, keys, values, `z`, `b`, `a` rows back to back): a kernel fewer a
/// step. Quantized ones stay two products, their blocks and scales kept as the file has them.
const IN_ALL: [Param; 4] = [IN_QKV_Z[0], IN_QKV_Z[1], IN_B_A[0], IN_B_A[1]];

/// The layer's input projections: one fused product, or `qkv | z` and `b | a`.
enum InProj {
    Fused(Linear),
    Pair { qkv_z: Linear, b_a: Linear },
}

/// One Gated DeltaNet layer.
pub struct GatedDeltaNet {
    in_proj: InProj,
    /// `[channels, width]`.
    conv: Tensor,
    /// `f32 [h_v]`.
    a_log: Tensor,
    /// `f32 [h_v]`.
    dt_bias: Tensor,
    /// `[d_v]`, applied as is.
    norm: Tensor,
    out: Linear,
    shape: LinearAttentionConfig,
    eps: f32,
}

impl GatedDeltaNet {
    /// The checkpoint tensors of the layer under `prefix` (e.g. `model.layers.0.`).
    pub fn tensors(cfg: &ModelConfig, la: &LinearAttentionConfig, prefix: &str) -> Vec<TensorSpec> {
        let (h, c, v, hv) = (cfg.hidden_size, la.conv_dim(), la.value_dim(), la.num_value_heads);
        let w = |p: &Param| format!("{}.weight", p.name);
        vec![
            spec(prefix, &w(&IN_QKV_Z[0]), &[c, h]),
            spec(prefix, &w(&IN_QKV_Z[1]), &[v, h]),
            spec(prefix, &w(&IN_B_A[0]), &[hv, h]),
            spec(prefix, &w(&IN_B_A[1]), &[hv, h]),
            spec(prefix, CONV, &[c, 1, la.conv_kernel]),
            spec(prefix, A_LOG, &[hv]),
            spec(prefix, DT_BIAS, &[hv]),
            spec(prefix, NORM, &[la.value_head_dim]),
            spec(prefix, &w(&OUT), &[h, v]),
        ]
    }

    /// Loads the layer under `prefix`.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped.
    pub fn load(l: &Loader<'_>, la: &LinearAttentionConfig, prefix: &str) -> Result<Self> {
        let b = l.backend;
        let conv = met_model_weights::load(l.store, &format!("{prefix}{CONV}"), b)?;
        let dtypes: Vec<_> = IN_ALL.iter().map(|p| l.store.info(&p.at(prefix, ".weight")).map(|i| i.dtype)).collect();
        let one_float = dtypes.iter().all(|d| matches!(d, Some(d) if d.is_float() && Some(*d) == dtypes[0]));
        let in_proj = if one_float {
            InProj::Fused(Linear::load(l, prefix, &IN_ALL, false)?)
        } else {
            InProj::Pair {
                qkv_z: Linear::load(l, prefix, &IN_QKV_Z, false)?,
                b_a: Linear::load(l, prefix, &IN_B_A, false)?,
            }
        };
        Ok(Self {
            in_proj,
            conv: conv.reshape(&[la.conv_dim(), la.conv_kernel])?,
            a_log: load_f32(l.store, &format!("{prefix}{A_LOG}"), b)?,
            dt_bias: load_f32(l.store, &format!("{prefix}{DT_BIAS}"), b)?,
            norm: met_model_weights::load(l.store, &format!("{prefix}{NORM}"), b)?,
            out: Linear::load(l, prefix, &[OUT], false)?,
            shape: la.clone(),
            eps: l.cfg.rms_norm_eps as f32,
        })
    }

    /// `x [t, hidden] -> [t, hidden]`, carrying each sequence's state in `state` (this
    /// layer's convolution-window and delta-rule pools), each projection with the deltas
    /// of `lora`'s adapters.
    ///
    /// # Errors
    /// On device failure.
    pub fn forward(
        &self,
        b: &dyn GpuBackend,
        x: &Tensor,
        batch: &RecurrentBatch<'_>,
        state: (&Tensor, &Tensor),
        lora: LayerLora<'_>,
    ) -> Result<Tensor> {
        let la = &self.shape;
        let t = x.dims()[0];
        let (c, hv) = (la.conv_dim(), la.num_value_heads);
        let v = la.value_dim();
        let [qkv, z, beta, decay]: [Tensor; 4] = match &self.in_proj {
            InProj::Fused(all) => {
                // Adapters in two passes over the one product (a pass takes up to three
                // modules); their columns are disjoint, so this is the adapters of each part.
                let (qz, ba) = (
                    [(LoraModule::LinQkv, 0), (LoraModule::LinZ, c)],
                    [(LoraModule::LinB, c + v), (LoraModule::LinA, c + v + hv)],
                );
                let out = lora.project(b, x, &qz, || lora.project(b, x, &ba, || all.forward(b, x)))?;
                split_n(b.split_columns(&out, &[c, v, hv, hv])?)
            }
            InProj::Pair { qkv_z, b_a } => {
                let qz =
                    lora.project(b, x, &[(LoraModule::LinQkv, 0), (LoraModule::LinZ, c)], || qkv_z.forward(b, x))?;
                let [qkv, z]: [Tensor; 2] = split_n(b.split_columns(&qz, &[c, v])?);
                let ba = lora.project(b, x, &[(LoraModule::LinB, 0), (LoraModule::LinA, hv)], || b_a.forward(b, x))?;
                let [beta, decay]: [Tensor; 2] = split_n(b.split_columns(&ba, &[hv, hv])?);
                [qkv, z, beta, decay]
            }
        };
        let mixed = b.causal_conv1d(&qkv, &self.conv, state.0, batch)?;
        let rule = DeltaRule {
            num_key_heads: la.num_key_heads,
            num_value_heads: hv,
            key_dim: la.key_head_dim,
            value_dim: la.value_head_dim,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
        };
        let o = b.gated_delta_rule(&mixed, &decay, &beta, &rule, state.1, batch)?;
        let dv = la.value_head_dim;
        let normed = b.rms_norm_gated(&o.reshape(&[t * hv, dv])?, &z.reshape(&[t * hv, dv])?, &self.norm, self.eps)?;
        let normed = normed.reshape(&[t, hv * dv])?;
        lora.project(b, &normed, &[(LoraModule::LinOut, 0)], || self.out.forward(b, &normed))
    }
}

fn split_n<const N: usize>(parts: Vec<Tensor>) -> [Tensor; N] {
    parts.try_into().unwrap_or_else(|p: Vec<Tensor>| panic!("split into {N} gave {} parts", p.len()))
}

/// Loads `name` as f32 whatever it is stored as (the decay parameters stay f32 on every
/// device, as transformers computes them in f32).
fn load_f32(store: &dyn WeightStore, name: &str, b: &dyn GpuBackend) -> Result<Tensor> {
    let (values, shape) = match store.uniform_run(name) {
        Some(run) => (run.host_values(), vec![run.len]),
        None => {
            let host = store.host(name)?;
            (host.to_f32_vec()?, host.shape().to_vec())
        }
    };
    Ok(b.upload(&HostTensor::from_f32(&values, &shape), DType::F32)?)
}
