//! Tensor parallelism: one model split across the ranks of a [`Collective`] group, each
//! rank a device holding its share of every layer.
//!
//! The split is Megatron-LM's, as vLLM and SGLang shard too. Attention heads divide among
//! the ranks: q/k/v are column-parallel (each rank computes its heads), o is row-parallel
//! (each rank multiplies its heads' columns and an all-reduce sums the partial outputs).
//! KV heads divide the same way, or are replicated when there are fewer of them than ranks.
//! The MLP's gate/up are column-parallel and down row-parallel, likewise each routed
//! expert's (every rank holds a share of every expert, so routing needs no exchange).
//! The embedding and the output head are vocabulary-parallel: each rank holds a share of
//! the vocabulary's rows; the embedding gives zero rows for ids outside it and an
//! all-reduce completes them, and each rank's logits are all-gathered into the full
//! vocabulary. Norms and routers are replicated, so between layers every rank holds the
//! same residual stream.
//!
//! Each layer declares the rule of every checkpoint tensor next to its name (a [`Param`]);
//! a [`Shard`] (one rank's ranges of heads, intermediate rows and vocabulary, and its
//! collective) turns a rule into the slice that rank loads and the all-reduce that ends a
//! row-parallel product ([`Reduce`]).
//!
//! Invariant: with one rank every rule takes the whole tensor and no collective runs, so a
//! single-device model loads and computes exactly as it would without this module.

mod model;

use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

use met_config::ModelConfig;
use met_kernels::{Collective, DType, GpuBackend, HostTensor, Tensor};
use met_model_weights::{Slice, WeightStore, load_slices};

pub use model::{TensorParallelModel, load_tensor_parallel};

use crate::{ModelError, Result};

/// How a checkpoint tensor is divided among tensor-parallel ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sharding {
    /// Every rank holds all of it (norms, routers).
    Replicated,
    /// Column-parallel: each rank holds its share of the output rows (dim 0; a bias alike),
    /// and its output stays split.
    Column(Unit),
    /// Row-parallel: each rank holds its share of the input columns (the last dim); an
    /// all-reduce sums the partial products, and only rank 0 adds a bias.
    Row(Unit),
    /// Vocabulary-parallel: each rank holds an equal share of the vocabulary's rows (the
    /// last share padded with zero rows).
    Vocab,
}

/// The unit a split dimension is divided in: a rank's share is whole units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Query heads, `head_dim` rows each.
    QueryHeads,
    /// Key/value heads, `head_dim` rows each (replicated when fewer than the ranks).
    KvHeads,
    /// Rows of the dense MLP's intermediate dimension.
    Intermediate,
    /// Rows of each routed expert's intermediate dimension.
    ExpertIntermediate,
}

/// A checkpoint tensor (or a projection's prefix, for its `.weight` and `.bias`) and how it
/// is sharded: the declaration each layer makes next to the code that loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Param {
    /// The name within a layer (`self_attn.q_proj`) or the model.
    pub name: &'static str,
    /// How ranks divide it.
    pub sharding: Sharding,
}

impl Param {
    /// A tensor sharded by `sharding`.
    pub const fn new(name: &'static str, sharding: Sharding) -> Self {
        Self { name, sharding }
    }

    /// A tensor every rank holds whole.
    pub const fn replicated(name: &'static str) -> Self {
        Self { name, sharding: Sharding::Replicated }
    }

    /// The checkpoint name under `prefix` (a layer's `model.layers.3.`), with `suffix`
    /// (`.weight`, `.bias`, or nothing).
    pub fn at(&self, prefix: &str, suffix: &str) -> String {
        format!("{prefix}{}{suffix}", self.name)
    }
}

/// Checks that `cfg` divides evenly among `world` ranks: query heads, KV heads (a multiple
/// of `world`, or a divisor of it, when they are replicated) and the intermediate sizes.
///
/// # Errors
/// [`ModelError::Unsupported`] naming the config field that does not divide.
pub fn check_world(cfg: &ModelConfig, world: usize) -> Result<()> {
    let fail = |msg: String| Err(ModelError::Unsupported(format!("tensor parallelism over {world} ranks: {msg}")));
    if world == 0 {
        return fail("needs at least one rank".into());
    }
    let (heads, kv) = (cfg.num_heads, cfg.num_kv_heads);
    if !heads.is_multiple_of(world) {
        return fail(format!("num_attention_heads ({heads}) is not a multiple of {world}"));
    }
    if !kv.is_multiple_of(world) && !world.is_multiple_of(kv) {
        return fail(format!(
            "num_key_value_heads ({kv}) must be a multiple of {world}, or divide it to be replicated"
        ));
    }
    if !cfg.intermediate_size.is_multiple_of(world) {
        return fail(format!("intermediate_size ({}) is not a multiple of {world}", cfg.intermediate_size));
    }
    if let Some(moe) = &cfg.moe
        && !moe.expert_intermediate_size.is_multiple_of(world)
    {
        return fail(format!("moe_intermediate_size ({}) is not a multiple of {world}", moe.expert_intermediate_size));
    }
    Ok(())
}

/// One rank's share of a model: the ranges of every split dimension it holds, and the
/// collective that joins it to the other ranks (none on a single device).
#[derive(Clone)]
pub struct Shard {
    rank: usize,
    world: usize,
    head_dim: usize,
    q_heads: Range<usize>,
    kv_heads: Range<usize>,
    intermediate: Range<usize>,
    expert_intermediate: Range<usize>,
    /// The vocabulary rows this rank holds, and the padded share every rank holds.
    vocab: Range<usize>,
    vocab_share: usize,
    collective: Option<Arc<dyn Collective>>,
}

/// Rank `rank`'s equal share of `total` (a multiple of `world`).
fn share(total: usize, rank: usize, world: usize) -> Range<usize> {
    let n = total / world;
    rank * n..(rank + 1) * n
}

impl Shard {
    /// The whole model on one device.
    pub fn single(cfg: &ModelConfig) -> Self {
        let expert = cfg.moe.as_ref().map_or(0, |m| m.expert_intermediate_size);
        Self {
            rank: 0,
            world: 1,
            head_dim: cfg.head_dim,
            q_heads: 0..cfg.num_heads,
            kv_heads: 0..cfg.num_kv_heads,
            intermediate: 0..cfg.intermediate_size,
            expert_intermediate: 0..expert,
            vocab: 0..cfg.vocab_size,
            vocab_share: cfg.vocab_size,
            collective: None,
        }
    }

    /// The share of the rank `collective` speaks for.
    ///
    /// # Errors
    /// As [`check_world`].
    pub fn of(cfg: &ModelConfig, collective: Arc<dyn Collective>) -> Result<Self> {
        let (rank, world) = (collective.rank(), collective.world_size());
        check_world(cfg, world)?;
        let kv = cfg.num_kv_heads;
        let kv_heads = if kv >= world {
            share(kv, rank, world)
        } else {
            // Fewer KV heads than ranks: each is replicated on `world / kv` neighbouring
            // ranks, whose query heads are exactly the ones that read it.
            let head = rank / (world / kv);
            head..head + 1
        };
        let expert = cfg.moe.as_ref().map_or(0, |m| m.expert_intermediate_size);
        let vocab_share = cfg.vocab_size.div_ceil(world);
        let start = (rank * vocab_share).min(cfg.vocab_size);
        Ok(Self {
            rank,
            world,
            head_dim: cfg.head_dim,
            q_heads: share(cfg.num_heads, rank, world),
            kv_heads,
            intermediate: share(cfg.intermediate_size, rank, world),
            expert_intermediate: share(expert, rank, world),
            vocab: start..(start + vocab_share).min(cfg.vocab_size),
            vocab_share,
            collective: Some(collective),
        })
    }

    /// This rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// Query heads this rank computes.
    pub(crate) fn num_heads(&self) -> usize {
        self.q_heads.len()
    }

    /// KV heads this rank holds.
    pub(crate) fn num_kv_heads(&self) -> usize {
        self.kv_heads.len()
    }

    /// Rows of each expert's intermediate dimension this rank holds.
    pub(crate) fn expert_intermediate(&self) -> usize {
        self.expert_intermediate.len()
    }

    /// The rows (of dim 0, or columns of the last dim) `unit` gives this rank.
    fn units(&self, unit: Unit) -> Range<usize> {
        let heads = |r: &Range<usize>| r.start * self.head_dim..r.end * self.head_dim;
        match unit {
            Unit::QueryHeads => heads(&self.q_heads),
            Unit::KvHeads => heads(&self.kv_heads),
            Unit::Intermediate => self.intermediate.clone(),
            Unit::ExpertIntermediate => self.expert_intermediate.clone(),
        }
    }

    /// The slice of a weight this rank loads.
    fn slice(&self, sharding: Sharding) -> Slice {
        match sharding {
            _ if self.world == 1 => Slice::Whole,
            Sharding::Replicated => Slice::Whole,
            Sharding::Column(unit) => Slice::rows(self.units(unit)),
            Sharding::Row(unit) => Slice::Columns(self.units(unit)),
            Sharding::Vocab => Slice::Rows { range: self.vocab.clone(), len: self.vocab_share },
        }
    }

    /// The slice of a bias this rank loads: a row-parallel bias is added once, by rank 0.
    fn bias_slice(&self, sharding: Sharding) -> Option<Slice> {
        match sharding {
            Sharding::Row(_) if self.rank != 0 => None,
            Sharding::Row(_) => Some(Slice::Whole),
            other => Some(self.slice(other)),
        }
    }

    /// Loads this rank's share of `name`.
    pub(crate) fn load(&self, store: &dyn WeightStore, b: &dyn GpuBackend, name: &str, s: Sharding) -> Result<Tensor> {
        Ok(load_slices(store, &[(name, self.slice(s))], b)?)
    }

    /// Loads this rank's shares of several tensors (full checkpoint names, each with its
    /// rule) fused along dim 0: the weights of a fused projection, or stacked experts.
    pub(crate) fn load_fused(
        &self,
        store: &dyn WeightStore,
        b: &dyn GpuBackend,
        parts: &[(String, Sharding)],
    ) -> Result<Tensor> {
        let parts: Vec<(&str, Slice)> = parts.iter().map(|(n, s)| (n.as_str(), self.slice(*s))).collect();
        Ok(load_slices(store, &parts, b)?)
    }

    /// Loads this rank's share of the fused bias of `parts` (`None` on a rank that adds no
    /// bias).
    pub(crate) fn load_bias(
        &self,
        store: &dyn WeightStore,
        b: &dyn GpuBackend,
        parts: &[(String, Sharding)],
    ) -> Result<Option<Tensor>> {
        let slices: Option<Vec<(&str, Slice)>> =
            parts.iter().map(|(n, s)| Some((n.as_str(), self.bias_slice(*s)?))).collect();
        slices.map(|p| Ok(load_slices(store, &p, b)?)).transpose()
    }

    /// The all-reduce that ends a product of `sharding` (none unless row-parallel across
    /// several ranks).
    pub(crate) fn reduce_for(&self, sharding: Sharding) -> Reduce {
        match (sharding, &self.collective) {
            (Sharding::Row(_) | Sharding::Vocab, Some(c)) if self.world > 1 => Reduce(Some(Arc::clone(c))),
            _ => Reduce(None),
        }
    }

    /// This rank's embedding table: its vocabulary share plus one zero row, which ids
    /// outside the share select ([`Self::local_ids`]), so the all-reduce of every rank's
    /// rows is exactly each id's embedding. The whole table on one device.
    pub(crate) fn load_embedding(&self, store: &dyn WeightStore, b: &dyn GpuBackend, name: &str) -> Result<Tensor> {
        let slice = match self.world {
            1 => Slice::Whole,
            _ => Slice::Rows { range: self.vocab.clone(), len: self.vocab_share + 1 },
        };
        Ok(load_slices(store, &[(name, slice)], b)?)
    }

    /// Token ids as rows of this rank's embedding table: the id's row within the share, or
    /// the zero row past it. Unchanged on one device.
    pub(crate) fn local_ids<'a>(&self, ids: &'a [u32]) -> Cow<'a, [u32]> {
        if self.world == 1 {
            return Cow::Borrowed(ids);
        }
        let (start, zero_row) = (self.vocab.start as u32, self.vocab_share as u32);
        let local = |&id: &u32| if self.vocab.contains(&(id as usize)) { id - start } else { zero_row };
        Cow::Owned(ids.iter().map(local).collect())
    }

    /// `u32 [rows · world]`: the order of the all-gathered logits' rows (rank-major,
    /// `[world · rows, share]`) that makes them row-major `[rows, world · share]`, for a step
    /// with `rows` logit rows; `None` on one device.
    pub(crate) fn logit_order(&self, b: &dyn GpuBackend, rows: usize) -> Result<Option<Tensor>> {
        if self.world == 1 {
            return Ok(None);
        }
        let order: Vec<u32> =
            (0..rows).flat_map(|row| (0..self.world).map(move |rank| (rank * rows + row) as u32)).collect();
        Ok(Some(b.upload(&HostTensor::from_u32(&order, &[order.len()]), DType::U32)?))
    }

    /// The full logits `[rows, vocab]` from this rank's share `[rows, share]`, by
    /// all-gather, reordering with `order` ([`Self::logit_order`]) and dropping the padding.
    /// The share itself on one device.
    pub(crate) fn gather_logits(
        &self,
        b: &dyn GpuBackend,
        share: Tensor,
        order: Option<&Tensor>,
        vocab: usize,
    ) -> Result<Tensor> {
        let (Some(collective), Some(order)) = (&self.collective, order) else { return Ok(share) };
        let rows = share.dims()[0];
        // [world · rows, share] rank-major -> [rows · world, share] -> [rows, world · share]
        let gathered = b.gather_rows(&collective.all_gather(&share)?, order)?;
        let padded = gathered.reshape(&[rows, self.world * self.vocab_share])?;
        if self.world * self.vocab_share == vocab {
            return Ok(padded);
        }
        let mut parts = b.split_columns(&padded, &[vocab, self.world * self.vocab_share - vocab])?;
        Ok(parts.swap_remove(0))
    }
}

/// The all-reduce that ends a row-parallel product across ranks; nothing on one device.
#[derive(Clone, Default)]
pub struct Reduce(Option<Arc<dyn Collective>>);

impl Reduce {
    /// Whether the product needs no sum across ranks.
    pub fn is_identity(&self) -> bool {
        self.0.is_none()
    }

    /// `x` summed over the ranks (`x` itself without a group).
    ///
    /// # Errors
    /// When the collective fails.
    pub fn apply(&self, x: Tensor) -> Result<Tensor> {
        match &self.0 {
            Some(c) => Ok(c.all_reduce_sum(&x)?),
            None => Ok(x),
        }
    }
}

impl std::fmt::Debug for Reduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Reduce(all-reduce)" } else { "Reduce(none)" })
    }
}
