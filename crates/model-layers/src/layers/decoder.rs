//! The decoder stack every supported architecture shares: token embedding, N layers of
//! (RMSNorm → self-attention → residual → RMSNorm → MLP → residual), a final RMSNorm and
//! the output head. Architectures differ only in what each layer contains
//! ([`LayerKind`]), which their own file in `models/` decides.
//!
//! The residual add is fused into the following RMSNorm (`add_rms_norm`), in the same
//! order of operations as transformers' `LlamaDecoderLayer`.

use std::sync::{Arc, OnceLock};

use met_cache::{KvCache, KvLayout};
use met_config::ModelConfig;
use met_kernels::{DType, GpuBackend, HostTensor, Tensor};
use met_model_weights::{TensorSpec, WeightStore, load};

use super::mlp::Mlp;
use super::rotary::inv_freq;
use super::self_attention::{SelfAttention, StepInputs};
use super::spec;
use crate::attention::{AttentionBackend, StepMetadata};
use crate::graphs::{DecodeGraphs, GraphCapture, GraphSettings};
use crate::{ForwardBatch, Model, ModelError, Result};

/// Checkpoint name of the token embedding.
pub const EMBED: &str = "model.embed_tokens.weight";
/// Checkpoint name of the final norm.
pub const FINAL_NORM: &str = "model.norm.weight";
/// Checkpoint name of the output head (absent when tied to the embedding).
pub const LM_HEAD: &str = "lm_head.weight";
const INPUT_NORM: &str = "input_layernorm.weight";
const POST_NORM: &str = "post_attention_layernorm.weight";

/// Checkpoint prefix of layer `i`.
pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}.")
}

/// What one decoder layer contains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    /// Per-head RMSNorm on queries and keys before rotary.
    pub qk_norm: bool,
    /// Routed experts instead of a dense MLP.
    pub moe: bool,
}

/// Every checkpoint tensor of a decoder whose layer `i` is `kind(i)`.
pub fn tensors(cfg: &ModelConfig, kind: impl Fn(usize) -> LayerKind) -> Vec<TensorSpec> {
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut specs = vec![spec("", EMBED, &[v, h]), spec("", FINAL_NORM, &[h])];
    if !cfg.tie_word_embeddings {
        specs.push(spec("", LM_HEAD, &[v, h]));
    }
    for i in 0..cfg.num_layers {
        let (prefix, kind) = (layer_prefix(i), kind(i));
        specs.push(spec(&prefix, INPUT_NORM, &[h]));
        specs.push(spec(&prefix, POST_NORM, &[h]));
        specs.extend(SelfAttention::tensors(cfg, &prefix, kind.qk_norm));
        match (kind.moe, &cfg.moe) {
            (true, Some(moe)) => specs.extend(Mlp::moe_tensors(cfg, moe, &prefix)),
            _ => specs.extend(Mlp::dense_tensors(cfg, &prefix)),
        }
    }
    specs
}

struct DecoderLayer {
    input_norm: Tensor,
    attention: SelfAttention,
    post_norm: Tensor,
    mlp: Mlp,
}

/// A decoder-only transformer on one backend.
pub struct DecoderModel {
    backend: Arc<dyn GpuBackend>,
    attention: Arc<dyn AttentionBackend>,
    embed: Tensor,
    layers: Vec<DecoderLayer>,
    norm: Tensor,
    lm_head: Tensor,
    inv_freq: Tensor,
    eps: f32,
    vocab_size: usize,
    kv_layout: KvLayout,
    max_context: usize,
    /// Whether a layer routes experts (whose host-side grouping rules out graphs).
    has_moe: bool,
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
    /// Loads every layer from `store` onto `backend`. Run preflight first: this stops at
    /// the first missing tensor.
    ///
    /// # Errors
    /// When a tensor is missing or mis-shaped, or the device fails.
    pub fn load(
        cfg: &ModelConfig,
        kind: impl Fn(usize) -> LayerKind,
        store: &dyn WeightStore,
        backend: Arc<dyn GpuBackend>,
        attention: Arc<dyn AttentionBackend>,
    ) -> Result<Self> {
        let b = &*backend;
        let has_moe = cfg.moe.is_some() && (0..cfg.num_layers).any(|i| kind(i).moe);
        let layers = (0..cfg.num_layers)
            .map(|i| {
                let (prefix, kind) = (layer_prefix(i), kind(i));
                let mlp = match (kind.moe, &cfg.moe) {
                    (true, Some(moe)) => Mlp::load_moe(cfg, moe, store, b, &prefix)?,
                    (true, None) => return Err(ModelError::Unsupported("an MoE layer needs MoE settings".into())),
                    (false, _) => Mlp::load_dense(cfg, store, b, &prefix)?,
                };
                Ok(DecoderLayer {
                    input_norm: load(store, &format!("{prefix}{INPUT_NORM}"), b)?,
                    attention: SelfAttention::load(cfg, store, b, &prefix, i, kind.qk_norm)?,
                    post_norm: load(store, &format!("{prefix}{POST_NORM}"), b)?,
                    mlp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let embed = load(store, EMBED, b)?;
        let lm_head = if cfg.tie_word_embeddings { embed.clone() } else { load(store, LM_HEAD, b)? };
        let freqs = inv_freq(&cfg.rope, cfg.head_dim);
        Ok(Self {
            // Rotary frequencies stay f32 on every device, as transformers keeps them.
            inv_freq: b.upload(&HostTensor::from_f32(&freqs, &[freqs.len()]), DType::F32)?,
            norm: load(store, FINAL_NORM, b)?,
            embed,
            lm_head,
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
            has_moe,
            graphs: OnceLock::new(),
            backend,
            attention,
        })
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
            meta: self.attention.prepare(batch)?,
            logit_rows,
        })
    }

    /// The forward pass over inputs already on the device: only device work, no upload and
    /// no wait, so a graph can record it.
    pub(crate) fn run(&self, step: &DeviceStep, kv: &dyn KvCache) -> Result<Tensor> {
        let b = &*self.backend;
        let inputs = StepInputs { positions: &step.positions, inv_freq: &self.inv_freq, meta: &step.meta };
        // [t, hidden] throughout; `residual` carries the stream between fused norms.
        let mut hidden = b.embedding(&step.ids, &self.embed)?;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().enumerate() {
            let (normed, res) = match &residual {
                None => (b.rms_norm(&hidden, &layer.input_norm, self.eps)?, hidden),
                Some(r) => b.add_rms_norm(&hidden, r, &layer.input_norm, self.eps)?,
            };
            let attn = layer.attention.forward(b, &*self.attention, &normed, &inputs, kv.layer(i))?;
            let (normed, res) = b.add_rms_norm(&attn, &res, &layer.post_norm, self.eps)?;
            hidden = layer.mlp.forward(b, &normed)?;
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
        // Logits in the device's float type, then f32 for sampling (as transformers
        // computes `lm_head` in the model's dtype and upcasts).
        Ok(b.cast(&b.matmul(&last, &self.lm_head, None)?, DType::F32)?)
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
        if self.has_moe {
            return Ok(GraphCapture::Skipped("expert routing is grouped on the host; MoE models run eagerly".into()));
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
