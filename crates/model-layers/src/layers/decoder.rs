//! The decoder stack every supported architecture shares: token embedding (optionally
//! scaled by `√hidden`), N layers of (RMSNorm → self-attention → residual → RMSNorm → MLP
//! → residual), a final RMSNorm and the output head (optionally soft-capped).
//! Architectures differ only in the recipe their own file in `models/` reads into the
//! [`ModelConfig`]: norm weighting and placement (Gemma's sandwich adds a norm on each
//! branch's output before its residual add), activation, biases, q/k norm, experts, and
//! per layer the rotary frequencies and window.
//!
//! The residual add is fused into the following RMSNorm (`add_rms_norm`), in the same
//! order of operations as transformers' `LlamaDecoderLayer` / `Gemma2DecoderLayer`.
//!
//! The same stack cut after its first `L` layers (then the final norm and head) is the
//! model's own early-exit draft ([`EarlyExit`]): the same code path, stopped early.

use std::sync::{Arc, OnceLock};

use met_cache::{KvCache, KvLayout};
use met_config::{ModelConfig, NormPlacement, RopeConfig};
use met_kernels::{DType, GpuBackend, HostTensor, Tensor};
use met_model_weights::{TensorSpec, WeightStore, load};

use super::mlp::Mlp;
use super::norm::load_norm;
use super::rotary::inv_freq;
use super::self_attention::{SelfAttention, StepInputs};
use super::spec;
use crate::attention::{AttentionBackend, BatchLayout, StepMetadata, widest_table};
use crate::graphs::{DecodeGraphs, GraphCapture, GraphSettings};
use crate::{EarlyExit, ForwardBatch, Model, ModelError, Result};

/// Checkpoint name of the token embedding.
pub const EMBED: &str = "model.embed_tokens.weight";
/// Checkpoint name of the final norm.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Checkpoint name of the output head (absent when tied to the embedding).
pub const LM_HEAD: &str = "lm_head.weight";
const INPUT_NORM: &str = "input_layernorm.weight";
/// Llama's norm before the MLP; Gemma's norm of the attention output.
const POST_ATTENTION_NORM: &str = "post_attention_layernorm.weight";
/// Gemma's norm before the MLP.
const PRE_FEEDFORWARD_NORM: &str = "pre_feedforward_layernorm.weight";
/// Gemma's norm of the MLP output.
const POST_FEEDFORWARD_NORM: &str = "post_feedforward_layernorm.weight";

/// Checkpoint prefix of layer `i`.
pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}.")
}

/// The checkpoint names of a layer's norms: before attention, before the MLP, and (for
/// the sandwich placement) on the attention and MLP outputs.
fn norm_names(placement: NormPlacement) -> (&'static str, Option<[&'static str; 2]>) {
    match placement {
        NormPlacement::Pre => (POST_ATTENTION_NORM, None),
        NormPlacement::Sandwich => (PRE_FEEDFORWARD_NORM, Some([POST_ATTENTION_NORM, POST_FEEDFORWARD_NORM])),
    }
}

/// Whether layer `i` routes experts.
fn is_moe(cfg: &ModelConfig, i: usize) -> bool {
    cfg.moe.as_ref().is_some_and(|m| m.sparse_layers.get(i).copied().unwrap_or(false))
}

/// Every checkpoint tensor of a decoder built from `cfg`.
pub fn tensors(cfg: &ModelConfig) -> Vec<TensorSpec> {
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut specs = vec![spec("", EMBED, &[v, h]), spec("", FINAL_NORM, &[h])];
    if !cfg.tie_word_embeddings {
        specs.push(spec("", LM_HEAD, &[v, h]));
    }
    let (pre_mlp, branch) = norm_names(cfg.norm_placement);
    for i in 0..cfg.num_layers {
        let prefix = layer_prefix(i);
        specs.push(spec(&prefix, INPUT_NORM, &[h]));
        specs.push(spec(&prefix, pre_mlp, &[h]));
        specs.extend(branch.iter().flatten().map(|name| spec(&prefix, name, &[h])));
        specs.extend(SelfAttention::tensors(cfg, &prefix, cfg.qk_norm));
        match (is_moe(cfg, i), &cfg.moe) {
            (true, Some(moe)) => specs.extend(Mlp::moe_tensors(cfg, moe, &prefix)),
            _ => specs.extend(Mlp::dense_tensors(cfg, &prefix)),
        }
    }
    specs
}

struct DecoderLayer {
    input_norm: Tensor,
    attention: SelfAttention,
    /// The norm before the MLP.
    post_norm: Tensor,
    mlp: Mlp,
    /// Sandwich placement: the norms of the attention and MLP outputs.
    branch_norms: Option<[Tensor; 2]>,
    eps: f32,
}

impl DecoderLayer {
    /// Self-attention of `x [t, hidden]`, its output normalised under the sandwich placement.
    fn attend(
        &self,
        b: &dyn GpuBackend,
        attention: &dyn AttentionBackend,
        x: &Tensor,
        inputs: &StepInputs<'_>,
        cache: (&Tensor, &Tensor),
    ) -> Result<Tensor> {
        let out = self.attention.forward(b, attention, x, inputs, cache)?;
        match &self.branch_norms {
            Some([post_attention, _]) => Ok(b.rms_norm(&out, post_attention, self.eps)?),
            None => Ok(out),
        }
    }

    /// The MLP of `x [t, hidden]`, its output normalised under the sandwich placement.
    fn feed_forward(&self, b: &dyn GpuBackend, x: &Tensor) -> Result<Tensor> {
        let out = self.mlp.forward(b, x)?;
        match &self.branch_norms {
            Some([_, post_feedforward]) => Ok(b.rms_norm(&out, post_feedforward, self.eps)?),
            None => Ok(out),
        }
    }
}

/// A decoder-only transformer on one backend.
pub struct DecoderModel {
    backend: Arc<dyn GpuBackend>,
    attention: Arc<dyn AttentionBackend>,
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: Tensor,
    /// `√hidden`, when embeddings are scaled (Gemma).
    embed_scale: Option<f32>,
    /// The logits' soft-cap (Gemma 2).
    final_softcap: Option<f32>,
    eps: f32,
    vocab_size: usize,
    kv_layout: KvLayout,
    max_context: usize,
    /// Decode steps recorded as graphs, once captured.
    graphs: OnceLock<DecodeGraphs>,
}

/// One step's inputs on the device.
pub(crate) struct DeviceStep {
    /// `u32 [t]` token ids.
    pub ids: Tensor,
    /// `u32 [t]` positions.
    pub positions: Tensor,
    /// Attention metadata and cache slots.
    pub meta: StepMetadata,
    /// `u32 [r]`: rows whose logits are returned; `None` for every row in order.
    pub logit_rows: Option<Tensor>,
}

impl DecoderModel {
    /// Loads every layer of the recipe `cfg` from `store` onto `backend`. Run preflight
    /// first: this stops at the first missing tensor.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped, or the device fails.
    pub fn load(
        cfg: &ModelConfig,
        store: &dyn WeightStore,
        backend: Arc<dyn GpuBackend>,
        attention: Arc<dyn AttentionBackend>,
    ) -> Result<Self> {
        let b = &*backend;
        let mut ropes = RotaryTables::default();
        let (pre_mlp, branch) = norm_names(cfg.norm_placement);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let prefix = layer_prefix(i);
                let norm = |name: &str| load_norm(store, &format!("{prefix}{name}"), b, cfg.norm_weight);
                let mlp = match (is_moe(cfg, i), &cfg.moe) {
                    (true, Some(moe)) => Mlp::load_moe(cfg, moe, store, b, &prefix)?,
                    _ => Mlp::load_dense(cfg, store, b, &prefix)?,
                };
                let rope = cfg.layer_rope.get(i).unwrap_or(&cfg.rope);
                let inv_freq = ropes.get(b, rope, cfg.head_dim)?;
                Ok(DecoderLayer {
                    input_norm: norm(INPUT_NORM)?,
                    attention: SelfAttention::load(cfg, store, b, &prefix, i, inv_freq)?,
                    post_norm: norm(pre_mlp)?,
                    mlp,
                    branch_norms: branch.map(|[a, m]| Ok::<_, ModelError>([norm(a)?, norm(m)?])).transpose()?,
                    eps: cfg.rms_norm_eps as f32,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = load(store, EMBED, b)?;
        let lm_head = if cfg.tie_word_embeddings { embed.clone() } else { load(store, LM_HEAD, b)? };
        Ok(Self {
            norm: load_norm(store, FINAL_NORM, b, cfg.norm_weight)?,
            embed,
            lm_head,
            embed_scale: cfg.scale_embeddings.then(|| (cfg.hidden_size as f64).sqrt() as f32),
            final_softcap: cfg.final_softcap.map(|c| c as f32),
            layers,
            eps: cfg.rms_norm_eps as f32,
            vocab_size: cfg.vocab_size,
            kv_layout: KvLayout {
                num_layers: cfg.num_layers,
                num_kv_heads: cfg.num_kv_heads,
                head_dim: cfg.head_dim,
                dtype: backend.float_dtype(),
            },
            max_context: cfg.max_position_embeddings,
            graphs: OnceLock::new(),
            backend,
            attention,
        })
    }

    /// `ids [t] -> [t, hidden]`: the embedding rows, times `√hidden` when the recipe says
    /// (cast to the model dtype first, as transformers casts Gemma's normaliser).
    fn embed(&self, b: &dyn GpuBackend, ids: &Tensor) -> Result<Tensor> {
        let rows = b.embedding(ids, &self.embed)?;
        match self.embed_scale {
            Some(s) => Ok(b.scale(&rows, s)?),
            None => Ok(rows),
        }
    }

    /// `x [r, hidden] -> f32 [r, vocab]`: the head in the device's float type, then f32 for
    /// sampling (as transformers computes `lm_head` in the model's dtype and upcasts),
    /// soft-capped when the recipe says.
    fn logits(&self, b: &dyn GpuBackend, x: &Tensor) -> Result<Tensor> {
        let logits = b.cast(&b.matmul(x, &self.lm_head, None)?, DType::F32)?;
        match self.final_softcap {
            Some(cap) => Ok(b.softcap(&logits, cap)?),
            None => Ok(logits),
        }
    }

    /// The batch's inputs on the device (the eager path).
    fn upload_step(&self, batch: &ForwardBatch) -> Result<DeviceStep> {
        let b = &*self.backend;
        let t = batch.num_tokens();
        let every_row =
            batch.logit_rows.iter().enumerate().all(|(i, &r)| r as usize == i) && batch.logit_rows.len() == t;
        let logit_rows = if every_row {
            None
        } else {
            let rows = &batch.logit_rows;
            Some(b.upload(&HostTensor::from_u32(rows, &[rows.len()]), DType::U32)?)
        };
        Ok(DeviceStep {
            ids: b.upload(&HostTensor::from_u32(&batch.token_ids, &[t]), DType::U32)?,
            positions: b.upload(&HostTensor::from_u32(&batch.positions, &[t]), DType::U32)?,
            meta: self
                .attention
                .prepare(&BatchLayout::of(batch, widest_table(batch)).with_slots(&batch.slot_mapping))?,
            logit_rows,
        })
    }

    /// The forward pass over inputs already on the device: only device work, no upload and
    /// no wait, so a graph can record it.
    pub(crate) fn run(&self, step: &DeviceStep, kv: &dyn KvCache) -> Result<Tensor> {
        self.run_layers(step, kv, self.layers.len())
    }

    /// [`Self::run`] through the first `layers` layers only, then the final norm and head.
    fn run_layers(&self, step: &DeviceStep, kv: &dyn KvCache, layers: usize) -> Result<Tensor> {
        let b = &*self.backend;
        let inputs = StepInputs { positions: &step.positions, meta: &step.meta };
        // [t, hidden] throughout; `residual` carries the stream between fused norms.
        let mut hidden = self.embed(b, &step.ids)?;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate().take(layers) {
            let (normed, res) = match &residual {
                None => (b.rms_norm(&hidden, &layer.input_norm, self.eps)?, hidden),
                Some(r) => b.add_rms_norm(&hidden, r, &layer.input_norm, self.eps)?,
            };
            let attn = layer.attend(b, &*self.attention, &normed, &inputs, kv.layer(i))?;
            let (normed, res) = b.add_rms_norm(&attn, &res, &layer.post_norm, self.eps)?;
            hidden = layer.feed_forward(b, &normed)?;
            residual = Some(res);
        }
        let normed = match &residual {
            None => b.rms_norm(&hidden, &self.norm, self.eps)?,
            Some(r) => b.add_rms_norm(&hidden, r, &self.norm, self.eps)?.0,
        };
        let last = match &step.logit_rows {
            Some(rows) => b.gather_rows(&normed, rows)?,
            None => normed,
        };
        self.logits(b, &last)
    }

    /// The attention backend the layers attend through.
    pub(crate) fn attention(&self) -> &dyn AttentionBackend {
        &*self.attention
    }

    pub(crate) fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    fn check(&self, batch: &ForwardBatch, kv: &dyn KvCache) -> Result<()> {
        if kv.layout() != self.kv_layout {
            return Err(ModelError::Batch(format!(
                "the KV cache is laid out as {:?}, the model needs {:?}",
                kv.layout(),
                self.kv_layout
            )));
        }
        // Requests are checked against the vocabulary when they are made
        // (`met_scheduler::EngineRequest::new`), and the embedding gather refuses an id
        // past its table on every backend; here it is only asserted.
        debug_assert!(
            batch.token_ids.iter().all(|&id| (id as usize) < self.vocab_size),
            "a token id outside the vocabulary of {}",
            self.vocab_size
        );
        if let Some(s) = batch.sequences.iter().find(|s| s.context_len > self.max_context) {
            return Err(ModelError::Batch(format!(
                "a context of {} tokens exceeds the model's maximum of {}",
                s.context_len, self.max_context
            )));
        }
        if let Some(&r) = batch.logit_rows.iter().find(|&&r| r as usize >= batch.num_tokens()) {
            return Err(ModelError::Batch(format!("logit row {r} is past the batch of {}", batch.num_tokens())));
        }
        Ok(())
    }
}

/// One device table of rotary frequencies per distinct [`RopeConfig`], shared by the layers
/// that use it (Gemma 3 has two: local and global).
#[derive(Default)]
struct RotaryTables(Vec<(RopeConfig, Tensor)>);

impl RotaryTables {
    /// `f32 [head_dim / 2]` for `rope`, uploaded on first use. The frequencies stay f32 on
    /// every device, as transformers keeps them.
    fn get(&mut self, b: &dyn GpuBackend, rope: &RopeConfig, head_dim: usize) -> Result<Tensor> {
        if let Some((_, t)) = self.0.iter().find(|(r, _)| r == rope) {
            return Ok(t.clone());
        }
        let freqs = inv_freq(rope, head_dim);
        let t = b.upload(&HostTensor::from_f32(&freqs, &[freqs.len()]), DType::F32)?;
        self.0.push((*rope, t.clone()));
        Ok(t)
    }
}

impl Model for DecoderModel {
    fn forward(&self, batch: &ForwardBatch, kv: &mut dyn KvCache) -> Result<Tensor> {
        self.check(batch, kv)?;
        if let Some(graphs) = self.graphs.get()
            && let Some(logits) = graphs.replay(self, batch, &*kv)?
        {
            return Ok(logits);
        }
        self.run(&self.upload_step(batch)?, &*kv)
    }

    fn capture_graphs(&self, kv: &dyn KvCache, settings: &GraphSettings) -> Result<GraphCapture> {
        if !self.backend.supports_graphs() {
            return Ok(GraphCapture::Skipped(format!("the {} backend runs eagerly", self.backend.name())));
        }
        if kv.layout() != self.kv_layout {
            return Err(ModelError::Batch("graphs need the model's own KV cache layout".into()));
        }
        let (graphs, capture) = DecodeGraphs::capture(self, kv, settings)?;
        self.graphs.set(graphs).map_err(|_| ModelError::Unsupported("decode graphs were already captured".into()))?;
        Ok(capture)
    }

    fn graph_replays(&self) -> u64 {
        self.graphs.get().map_or(0, DecodeGraphs::replays)
    }

    fn early_exit(&self) -> Option<&dyn EarlyExit> {
        Some(self)
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn kv_layout(&self) -> KvLayout {
        self.kv_layout
    }

    fn max_context(&self) -> usize {
        self.max_context
    }
}

impl EarlyExit for DecoderModel {
    fn num_layers(&self) -> usize {
        self.layers.len()
    }

    fn forward_early_exit(&self, batch: &ForwardBatch, kv: &dyn KvCache, layers: usize) -> Result<Tensor> {
        if !(1..=self.layers.len()).contains(&layers) {
            return Err(ModelError::Batch(format!(
                "an early exit after {layers} layers; the model has {}",
                self.layers.len()
            )));
        }
        self.check(batch, kv)?;
        self.run_layers(&self.upload_step(batch)?, kv, layers)
    }
}
