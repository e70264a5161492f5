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
//! Under tensor parallelism each rank runs this stack on its [`Shard`] of the weights: the
//! embedding and head vocabulary-parallel, the layers' collectives inside their row-parallel
//! projections ([`crate::parallel`]); the stream between layers is the same on every rank.
//!
//! The same stack cut after its first `L` layers (then the final norm and head) is the
//! model's own early-exit draft ([`EarlyExit`]): the same code path, stopped early.

use std::sync::{Arc, OnceLock};

use met_cache::{KvCache, KvLayout, KvPools};
use met_config::{KvCacheDtype, ModelConfig, NormPlacement, RopeConfig};
use met_kernels::{DType, GpuBackend, HostTensor, Tensor};
use met_model_weights::{TensorSpec, WeightStore};

use super::gated_delta_net::GatedDeltaNet;
use super::mixer::{Mixer, RecurrentStep, attention_layers, state_layout};
use super::mlp::Mlp;
use super::norm::load_norm;
use super::rotary::inv_freq;
use super::self_attention::{SelfAttention, StepInputs};
use super::{Loader, spec};
use crate::attention::{AttentionBackend, BatchLayout, StepMetadata, widest_table};
use crate::graphs::{DecodeGraphs, GraphCapture, GraphSettings};
use crate::lora::{LayerLora, LoraPool, StepLora};
use crate::parallel::{Param, Reduce, Shard, Sharding};
use crate::{EarlyExit, ForwardBatch, Model, ModelError, Result};

/// The token embedding: each rank a share of the vocabulary's rows, completed by an
/// all-reduce.
pub const EMBED: Param = Param::new("model.embed_tokens.weight", Sharding::Vocab);
/// The final norm.
pub const FINAL_NORM: Param = Param::replicated("model.norm.weight");
/// The output head (absent when tied to the embedding): each rank the logits of its share
/// of the vocabulary, all-gathered.
pub const LM_HEAD: Param = Param::new("lm_head.weight", Sharding::Vocab);
const INPUT_NORM: Param = Param::replicated("input_layernorm.weight");
/// Llama's norm before the MLP; Gemma's norm of the attention output.
const POST_ATTENTION_NORM: Param = Param::replicated("post_attention_layernorm.weight");
/// Gemma's norm before the MLP.
const PRE_FEEDFORWARD_NORM: Param = Param::replicated("pre_feedforward_layernorm.weight");
/// Gemma's norm of the MLP output.
const POST_FEEDFORWARD_NORM: Param = Param::replicated("post_feedforward_layernorm.weight");

/// Checkpoint prefix of layer `i`.
pub fn layer_prefix(i: usize) -> String {
    format!("model.layers.{i}.")
}

/// The checkpoint names of a layer's norms: before attention, before the MLP, and (for
/// the sandwich placement) on the attention and MLP outputs.
fn norm_names(placement: NormPlacement) -> (Param, Option<[Param; 2]>) {
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
    let mut specs = vec![spec("", EMBED.name, &[v, h]), spec("", FINAL_NORM.name, &[h])];
    if !cfg.tie_word_embeddings {
        specs.push(spec("", LM_HEAD.name, &[v, h]));
    }
    let (pre_mlp, branch) = norm_names(cfg.norm_placement);
    for i in 0..cfg.num_layers {
        let prefix = layer_prefix(i);
        specs.push(spec(&prefix, INPUT_NORM.name, &[h]));
        specs.push(spec(&prefix, pre_mlp.name, &[h]));
        specs.extend(branch.iter().flatten().map(|p| spec(&prefix, p.name, &[h])));
        match cfg.linear_attention.as_ref().filter(|la| la.is_linear(i)) {
            Some(la) => specs.extend(GatedDeltaNet::tensors(cfg, la, &prefix)),
            None => specs.extend(SelfAttention::tensors(cfg, &prefix, cfg.qk_norm)),
        }
        match (is_moe(cfg, i), &cfg.moe) {
            (true, Some(moe)) => specs.extend(Mlp::moe_tensors(cfg, moe, &prefix)),
            _ => specs.extend(Mlp::dense_tensors(cfg, &prefix)),
        }
    }
    specs
}

struct DecoderLayer {
    input_norm: Tensor,
    mixer: Mixer,
    /// The norm before the MLP.
    post_norm: Tensor,
    mlp: Mlp,
    /// Sandwich placement: the norms of the attention and MLP outputs.
    branch_norms: Option<[Tensor; 2]>,
    eps: f32,
}

impl DecoderLayer {
    /// The token mixer of `x [t, hidden]` (self-attention over this layer's K/V pools, or
    /// a Gated DeltaNet over its state pools), its output normalised under the sandwich
    /// placement.
    fn attend(
        &self,
        b: &dyn GpuBackend,
        attention: &dyn AttentionBackend,
        x: &Tensor,
        step: &DeviceStep,
        kv: &KvPools,
        lora: LayerLora<'_>,
    ) -> Result<Tensor> {
        let out = match &self.mixer {
            Mixer::Attention(a, j) => {
                let inputs = StepInputs { positions: &step.positions, meta: &step.meta, lora };
                a.forward(b, attention, x, &inputs, kv.layer(*j))?
            }
            Mixer::Linear(gdn, r) => {
                let recurrent = step.recurrent.as_ref().expect("hybrid steps carry recurrent metadata");
                gdn.forward(b, x, &recurrent.batch(), kv.state(*r), lora)?
            }
        };
        match &self.branch_norms {
            Some([post_attention, _]) => Ok(b.rms_norm(&out, post_attention, self.eps)?),
            None => Ok(out),
        }
    }

    /// The MLP of `x [t, hidden]`, its output normalised under the sandwich placement.
    fn feed_forward(&self, b: &dyn GpuBackend, x: &Tensor, lora: LayerLora<'_>) -> Result<Tensor> {
        let out = self.mlp.forward(b, x, lora)?;
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
    /// This rank's share of the model (all of it on one device).
    shard: Shard,
    /// The all-reduce completing the vocabulary-parallel embedding.
    embed_reduce: Reduce,
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
    /// The slots of the LoRA adapters it serves, once attached (graphs record them).
    pub(crate) lora: OnceLock<Arc<LoraPool>>,
}

/// Where a step's token ids come from.
#[derive(Clone, Copy)]
pub(crate) enum StepIds<'a> {
    /// The batch's `token_ids`.
    Host,
    /// Element `rows[i]` of the device vector `tokens` for row `i` ([`Model::forward_fed`]).
    Fed { tokens: &'a Tensor, rows: &'a [u32] },
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
    /// Under tensor parallelism, the order of the all-gathered logits' rows
    /// ([`Shard::logit_order`]).
    pub logit_order: Option<Tensor>,
    /// Hybrid models: the recurrent layers' metadata.
    pub recurrent: Option<RecurrentStep>,
    /// With LoRA adapters: their slots and each row's.
    pub lora: Option<StepLora>,
}

/// The element type of `backend`'s KV pools for `--kv-cache-dtype dtype`: its float dtype,
/// or e4m3 where it has attention kernels for that.
///
/// # Errors
/// [`ModelError::Unsupported`] for a cache dtype the backend cannot attend over.
pub fn kv_pool_dtype(backend: &dyn GpuBackend, dtype: KvCacheDtype) -> Result<DType> {
    if !dtype.is_fp8() {
        return Ok(backend.float_dtype());
    }
    if !backend.supports_kv_dtype(DType::F8E4M3) {
        return Err(ModelError::Unsupported(format!(
            "--kv-cache-dtype {dtype}: the {} backend has no attention kernels for an fp8 KV cache yet (the CPU has); \
             use --kv-cache-dtype auto",
            backend.name()
        )));
    }
    Ok(DType::F8E4M3)
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
        Self::load_shard(cfg, store, backend, attention, Shard::single(cfg))
    }

    /// The model with its KV cache of `dtype`: e4m3 pools for the FP8 kinds, where the
    /// backend has attention kernels for them.
    ///
    /// # Errors
    /// [`ModelError::Unsupported`] for a cache dtype the backend cannot attend over.
    pub fn with_kv_cache_dtype(mut self, dtype: KvCacheDtype) -> Result<Self> {
        self.kv_layout.dtype = kv_pool_dtype(&*self.backend, dtype)?;
        Ok(self)
    }

    /// [`Self::load`] of `shard`'s share of the model: one rank of a tensor-parallel group.
    ///
    /// # Errors
    /// As [`Self::load`].
    pub(crate) fn load_shard(
        cfg: &ModelConfig,
        store: &dyn WeightStore,
        backend: Arc<dyn GpuBackend>,
        attention: Arc<dyn AttentionBackend>,
        shard: Shard,
    ) -> Result<Self> {
        let b = &*backend;
        if cfg.linear_attention.is_some() {
            let why = if shard.world_size() > 1 {
                Some("met does not split them over tensor-parallel ranks yet".to_owned())
            } else if !b.supports_recurrent() {
                Some(format!("the {} backend cannot run them yet (the CPU can)", b.name()))
            } else {
                None
            };
            if let Some(why) = why {
                return Err(ModelError::Unsupported(format!("`{}` has Gated DeltaNet layers: {why}", cfg.model_type)));
            }
        }
        let loader = Loader { cfg, store, backend: b, shard: &shard };
        let layers = load_layers(&loader)?;
        let embed = shard.load_embedding(store, b, EMBED.name)?;
        let lm_head = match (cfg.tie_word_embeddings, shard.world_size()) {
            (true, 1) => embed.clone(),
            // A rank's embedding share has a zero row past its vocabulary that the head
            // must not have: read the head's share of the tied rows again.
            (true, _) => shard.load(store, b, EMBED.name, LM_HEAD.sharding)?,
            (false, _) => shard.load(store, b, LM_HEAD.name, LM_HEAD.sharding)?,
        };
        Ok(Self {
            norm: load_norm(store, FINAL_NORM.name, b, cfg.norm_weight)?,
            embed,
            lm_head,
            embed_reduce: shard.reduce_for(EMBED.sharding),
            embed_scale: cfg.scale_embeddings.then(|| (cfg.hidden_size as f64).sqrt() as f32),
            final_softcap: cfg.final_softcap.map(|c| c as f32),
            layers,
            eps: cfg.rms_norm_eps as f32,
            vocab_size: cfg.vocab_size,
            kv_layout: KvLayout {
                num_layers: attention_layers(cfg),
                num_kv_heads: shard.num_kv_heads(),
                head_dim: cfg.head_dim,
                dtype: backend.float_dtype(),
                state: state_layout(cfg, backend.float_dtype()),
            },
            max_context: cfg.max_position_embeddings,
            graphs: OnceLock::new(),
            lora: OnceLock::new(),
            shard,
            backend,
            attention,
        })
    }

    /// `ids [t] -> [t, hidden]`: the embedding rows, times `√hidden` when the recipe says
    /// (cast to the model dtype first, as transformers casts Gemma's normaliser).
    fn embed(&self, b: &dyn GpuBackend, ids: &Tensor) -> Result<Tensor> {
        let rows = self.embed_reduce.apply(b.embedding(ids, &self.embed)?)?;
        match self.embed_scale {
            Some(s) => Ok(b.scale(&rows, s)?),
            None => Ok(rows),
        }
    }

    /// `x [r, hidden] -> [r, vocab]`: the head in the device's float type, as transformers
    /// computes `lm_head` in the model's dtype. Sampling reads those values as f32 (the
    /// upcast is exact), so they are not cast here, which would copy the batch's logits
    /// (256 rows of a 128k vocabulary: 131 MB of f32); a final soft-cap is computed in f32,
    /// on the cast. Under tensor parallelism each rank's share of the vocabulary is
    /// gathered (`order`: [`DeviceStep::logit_order`]) first.
    fn logits(&self, b: &dyn GpuBackend, x: &Tensor, order: Option<&Tensor>) -> Result<Tensor> {
        let share = b.matmul(x, &self.lm_head, None)?;
        let logits = self.shard.gather_logits(b, share, order, self.vocab_size)?;
        match self.final_softcap {
            Some(cap) => Ok(b.softcap(&b.cast(&logits, DType::F32)?, cap)?),
            None => Ok(logits),
        }
    }

    /// The batch's inputs on the device (the eager path). Fed ids are gathered on the
    /// device; the embedding's check of them then waits for the device on CUDA.
    fn upload_step(&self, batch: &ForwardBatch, ids: StepIds<'_>) -> Result<DeviceStep> {
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
        let logit_count = logit_rows.as_ref().map_or(t, |r| r.elem_count());
        Ok(DeviceStep {
            ids: match ids {
                StepIds::Host => {
                    b.upload(&HostTensor::from_u32(&self.shard.local_ids(&batch.token_ids), &[t]), DType::U32)?
                }
                StepIds::Fed { tokens, rows } => b.gather_u32(tokens, rows)?,
            },
            positions: b.upload(&HostTensor::from_u32(&batch.positions, &[t]), DType::U32)?,
            meta: self
                .attention
                .prepare(&BatchLayout::of(batch, widest_table(batch)).with_slots(&batch.slot_mapping))?,
            logit_rows,
            logit_order: self.shard.logit_order(b, logit_count)?,
            recurrent: match self.kv_layout.state {
                Some(_) => Some(RecurrentStep::upload(b, batch)?),
                None => None,
            },
            lora: StepLora::eager(b, batch, self.lora.get())?,
        })
    }

    /// The forward pass over inputs already on the device: only device work, no upload and
    /// no wait, so a graph can record it.
    pub(crate) fn run(&self, step: &DeviceStep, kv: &KvPools) -> Result<Tensor> {
        self.run_layers(step, kv, self.layers.len())
    }

    /// [`Self::run`] through the first `layers` layers only, then the final norm and head.
    fn run_layers(&self, step: &DeviceStep, kv: &KvPools, layers: usize) -> Result<Tensor> {
        let b = &*self.backend;
        if let Some(recurrent) = &step.recurrent {
            recurrent.prepare(b, kv)?;
        }
        // [t, hidden] throughout; `residual` carries the stream between fused norms.
        let mut hidden = self.embed(b, &step.ids)?;
        let mut residual: Option<Tensor> = None;
        for (i, layer) in self.layers.iter().take(layers).enumerate() {
            let lora = LayerLora::new(step.lora.as_ref(), i);
            let (normed, res) = match &residual {
                None => (b.rms_norm(&hidden, &layer.input_norm, self.eps)?, hidden),
                Some(r) => b.add_rms_norm(&hidden, r, &layer.input_norm, self.eps)?,
            };
            let attn = layer.attend(b, &*self.attention, &normed, step, kv, lora)?;
            let (normed, res) = b.add_rms_norm(&attn, &res, &layer.post_norm, self.eps)?;
            hidden = layer.feed_forward(b, &normed, lora)?;
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
        self.logits(b, &last, step.logit_order.as_ref())
    }

    /// The attention backend the layers attend through.
    pub(crate) fn attention(&self) -> &dyn AttentionBackend {
        &*self.attention
    }

    pub(crate) fn backend(&self) -> &Arc<dyn GpuBackend> {
        &self.backend
    }

    fn check(&self, batch: &ForwardBatch, kv: &dyn KvCache) -> Result<()> {
        check_cache(kv, self.kv_layout, 1)?;
        // Requests are checked against the vocabulary when they are made
        // (`met_scheduler::EngineRequest::new`), and the embedding gather refuses an id
        // past its table on every backend; here it is only asserted.
        debug_assert!(
            batch.token_ids.iter().all(|&id| (id as usize) < self.vocab_size),
            "a token id outside the vocabulary of {}",
            self.vocab_size
        );
        check_batch(batch, self.max_context)
    }

    /// The forward pass over `kv`'s pools of this rank, checks done: a graph replay for a
    /// decode step that one holds, else eager.
    pub(crate) fn forward_on(&self, batch: &ForwardBatch, kv: &KvPools, ids: StepIds<'_>) -> Result<Tensor> {
        if let Some(graphs) = self.graphs.get()
            && let Some(logits) = graphs.replay(self, batch, kv, ids)?
        {
            return Ok(logits);
        }
        self.run_layers(&self.upload_step(batch, ids)?, kv, self.layers.len())
    }

    /// Records decode graphs over this rank's pools ([`Model::capture_graphs`]).
    pub(crate) fn capture_on(&self, kv: &KvPools, settings: &GraphSettings) -> Result<GraphCapture> {
        if !self.backend.supports_graphs() {
            return Ok(GraphCapture::Skipped(format!("the {} backend runs eagerly", self.backend.name())));
        }
        let (graphs, capture) = DecodeGraphs::capture(self, kv, settings)?;
        self.graphs.set(graphs).map_err(|_| ModelError::Unsupported("decode graphs were already captured".into()))?;
        Ok(capture)
    }

    /// Whether the model has recurrent layers (and so state slots in its cache).
    pub(crate) fn is_hybrid(&self) -> bool {
        self.kv_layout.state.is_some()
    }

    /// Token ids as this rank's embedding rows (the ids themselves on one device).
    pub(crate) fn local_ids<'a>(&self, ids: &'a [u32]) -> std::borrow::Cow<'a, [u32]> {
        self.shard.local_ids(ids)
    }

    /// The order of gathered logits for a step of `rows` logit rows (none on one device).
    pub(crate) fn logit_order(&self, rows: usize) -> Result<Option<Tensor>> {
        self.shard.logit_order(&*self.backend, rows)
    }
}

/// Checks that `kv` is laid out as `layout` on `ranks` ranks.
pub(crate) fn check_cache(kv: &dyn KvCache, layout: KvLayout, ranks: usize) -> Result<()> {
    if kv.layout() != layout || kv.num_ranks() != ranks {
        return Err(ModelError::Batch(format!(
            "the KV cache is laid out as {:?} on {} ranks, the model needs {layout:?} on {ranks}",
            kv.layout(),
            kv.num_ranks()
        )));
    }
    Ok(())
}

/// Checks a batch's contexts against `max_context` and its logit rows against its rows.
pub(crate) fn check_batch(batch: &ForwardBatch, max_context: usize) -> Result<()> {
    if let Some(s) = batch.sequences.iter().find(|s| s.context_len > max_context) {
        return Err(ModelError::Batch(format!(
            "a context of {} tokens exceeds the model's maximum of {max_context}",
            s.context_len
        )));
    }
    if let Some(&r) = batch.logit_rows.iter().find(|&&r| r as usize >= batch.num_tokens()) {
        return Err(ModelError::Batch(format!("logit row {r} is past the batch of {}", batch.num_tokens())));
    }
    Ok(())
}

/// Every layer of the loader's recipe, layers of one rotary setting sharing its table.
fn load_layers(l: &Loader<'_>) -> Result<Vec<DecoderLayer>> {
    let (cfg, b) = (l.cfg, l.backend);
    let mut ropes = RotaryTables::default();
    let (pre_mlp, branch) = norm_names(cfg.norm_placement);
    let (mut attention_layers, mut recurrent_layers) = (0, 0);
    (0..cfg.num_layers)
        .map(|i| {
            let prefix = layer_prefix(i);
            let norm = |p: Param| load_norm(l.store, &p.at(&prefix, ""), b, cfg.norm_weight);
            let mlp = match (is_moe(cfg, i), &cfg.moe) {
                (true, Some(moe)) => Mlp::load_moe(l, moe, &prefix)?,
                _ => Mlp::load_dense(l, &prefix)?,
            };
            let mixer = match cfg.linear_attention.as_ref().filter(|la| la.is_linear(i)) {
                Some(la) => {
                    recurrent_layers += 1;
                    Mixer::Linear(GatedDeltaNet::load(l, la, &prefix)?, recurrent_layers - 1)
                }
                None => {
                    let rope = cfg.layer_rope.get(i).unwrap_or(&cfg.rope);
                    let inv_freq = ropes.get(b, rope, cfg.rotary_dim)?;
                    attention_layers += 1;
                    Mixer::Attention(SelfAttention::load(l, &prefix, i, inv_freq)?, attention_layers - 1)
                }
            };
            Ok(DecoderLayer {
                input_norm: norm(INPUT_NORM)?,
                mixer,
                post_norm: norm(pre_mlp)?,
                mlp,
                branch_norms: branch.map(|[a, m]| Ok::<_, ModelError>([norm(a)?, norm(m)?])).transpose()?,
                eps: cfg.rms_norm_eps as f32,
            })
        })
        .collect()
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
        self.forward_on(batch, kv.pools(0), StepIds::Host)
    }

    fn feeds_tokens(&self) -> bool {
        // Under tensor parallelism each rank maps ids to its share of the vocabulary on
        // the host (`Shard::local_ids`).
        self.shard.world_size() == 1
    }

    fn forward_fed(&self, batch: &ForwardBatch, tokens: &Tensor, rows: &[u32], kv: &mut dyn KvCache) -> Result<Tensor> {
        if !self.feeds_tokens() {
            return Err(ModelError::Unsupported("a tensor-parallel model reads its token ids from the host".into()));
        }
        if rows.len() != batch.num_tokens() {
            return Err(ModelError::Batch(format!(
                "{} fed ids for a batch of {} rows",
                rows.len(),
                batch.num_tokens()
            )));
        }
        self.check(batch, kv)?;
        self.forward_on(batch, kv.pools(0), StepIds::Fed { tokens, rows })
    }

    fn capture_graphs(&self, kv: &dyn KvCache, settings: &GraphSettings) -> Result<GraphCapture> {
        if !self.backend.supports_graphs() {
            return Ok(GraphCapture::Skipped(format!("the {} backend runs eagerly", self.backend.name())));
        }
        check_cache(kv, self.kv_layout, 1)
            .map_err(|_| ModelError::Batch("graphs need the model's own KV cache layout".into()))?;
        self.capture_on(kv.pools(0), settings)
    }

    fn attach_lora(&self, pool: Arc<LoraPool>) -> Result<()> {
        pool.check_attach(&*self.backend, self.shard.world_size(), self.graphs.get().is_some())?;
        self.lora.set(pool).map_err(|_| ModelError::Unsupported("LoRA slots were already attached".into()))
    }

    fn graph_replays(&self) -> u64 {
        self.graphs.get().map_or(0, DecodeGraphs::replays)
    }

    fn early_exit(&self) -> Option<&dyn EarlyExit> {
        // A draft through the first layers would advance the recurrent state in the
        // target's own slots.
        self.kv_layout.state.is_none().then_some(self as &dyn EarlyExit)
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
        let step = self.upload_step(batch, StepIds::Host)?;
        self.run_layers(&step, kv.pools(0), layers)
    }
}
