//! The model seam of met.
//!
//! A [`Model`] runs one forward pass over a flat varlen [`ForwardBatch`]: several
//! sequences, each contributing a prefill chunk or a decode row, reading and writing the
//! paged KV cache it is handed. Models never own a cache and never assume one sequence,
//! so the scheduler is free to mix requests in any step.
//!
//! Architectures live one per file in [`models`], are built from the shared layers in
//! [`layers`], and register by Hugging Face `model_type`. Attention goes through the
//! [`attention::AttentionBackend`] seam, chosen at startup. [`parallel`] splits a model
//! across the devices of a tensor-parallel group behind the same [`Model`] seam.

pub mod attention;
mod batch;
pub mod graphs;
pub mod layers;
pub mod lora;
pub mod models;
pub mod parallel;
pub mod runner;

use met_cache::{KvCache, KvLayout};
use met_kernels::Tensor;

pub use batch::{BatchSequence, ForwardBatch, LogitRows};
pub use graphs::{GraphCapture, GraphSettings};
pub use layers::decoder::kv_pool_dtype;
pub use models::{LoadOptions, load_model, tensor_specs};

/// What can fail while building or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A device op failed or rejected its operands.
    #[error(transparent)]
    Kernels(#[from] met_kernels::Error),
    /// Weights could not be read or did not match the architecture.
    #[error(transparent)]
    Weights(#[from] met_model_weights::WeightError),
    /// The KV cache could not be built or grown.
    #[error(transparent)]
    Cache(#[from] met_cache::CacheError),
    /// The KV cache has no room for the batch.
    #[error(transparent)]
    OutOfBlocks(#[from] met_cache::OutOfBlocks),
    /// A batch that cannot run on this model (a token id past the vocabulary, a context
    /// past the model's limit, a cache of another layout).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// The architecture or a setting is not supported.
    #[error("{0}")]
    Unsupported(String),
    /// A LoRA adapter that cannot be loaded: a missing file, a setting met does not
    /// implement, or weights that do not fit the model.
    #[error("LoRA adapter `{name}`: {msg}")]
    Adapter {
        /// The name it was to be loaded as.
        name: String,
        /// What is wrong.
        msg: String,
    },
    /// A tensor-parallel rank failed, or could not start.
    #[error("tensor parallelism: {0}")]
    Parallel(String),
}

/// `Result` with [`ModelError`].
pub type Result<T> = std::result::Result<T, ModelError>;

/// A decoder-only language model.
pub trait Model: Send + Sync {
    /// Runs the batch: writes its K/V into `kv` at the batch's slots and returns logits
    /// `[batch.logit_rows.len(), vocab]`, one row per requested row, in order: in the
    /// backend's float type (bf16 on CUDA, f32 on the CPU), or f32 where a final soft-cap
    /// applies. [`GpuBackend::sample`](met_kernels::GpuBackend::sample) reads either.
    ///
    /// # Errors
    /// [`ModelError::Batch`] for a malformed batch; device errors otherwise.
    fn forward(&self, batch: &ForwardBatch, kv: &mut dyn KvCache) -> Result<Tensor>;

    /// Whether [`Self::forward_fed`] works: the model reads its step's token ids from the
    /// device.
    fn feeds_tokens(&self) -> bool {
        false
    }

    /// [`Self::forward`] with row `i`'s token id read from element `rows[i]` of `tokens`
    /// (`u32`, on the model's backend) instead of from `batch.token_ids`: a step queued
    /// before the host has the tokens the step before drew ([`GpuBackend::sample_later`]).
    ///
    /// # Errors
    /// As [`Self::forward`]; [`ModelError::Unsupported`] where [`Self::feeds_tokens`] is false.
    ///
    /// [`GpuBackend::sample_later`]: met_kernels::GpuBackend::sample_later
    fn forward_fed(&self, batch: &ForwardBatch, tokens: &Tensor, rows: &[u32], kv: &mut dyn KvCache) -> Result<Tensor> {
        let _ = (batch, tokens, rows, kv);
        Err(ModelError::Unsupported("this model reads its token ids from the host".into()))
    }

    /// Rows of the logits.
    fn vocab_size(&self) -> usize;

    /// What the model keeps per token in the KV cache.
    fn kv_layout(&self) -> KvLayout;

    /// The longest context (prompt + generated) the model supports.
    fn max_context(&self) -> usize;

    /// Records decode steps of the sizes in `settings` as graphs over `kv` (the cache every
    /// later step uses), so that [`Self::forward`] replays them; startup phase 7. Models or
    /// backends without graphs say why they skip.
    ///
    /// # Errors
    /// When recording fails on the device.
    fn capture_graphs(&self, kv: &dyn KvCache, settings: &GraphSettings) -> Result<GraphCapture> {
        let _ = (kv, settings);
        Ok(GraphCapture::Skipped("this model runs eagerly".into()))
    }

    /// Serves LoRA adapters from `pool`'s slots: every step then leaves room for their
    /// deltas, and graphs captured after this call record them, so decode steps with
    /// adapters replay too. Call it before [`Self::capture_graphs`], once.
    ///
    /// # Errors
    /// [`ModelError::Unsupported`] for models that take no adapters (the default), or a
    /// second pool.
    fn attach_lora(&self, pool: std::sync::Arc<lora::LoraPool>) -> Result<()> {
        let _ = pool;
        Err(ModelError::Unsupported("this model serves no LoRA adapters".into()))
    }

    /// How many forward passes so far ran from a captured graph.
    fn graph_replays(&self) -> u64 {
        0
    }

    /// The model as its own early-exit draft, when it can run a prefix of its layers
    /// ([`EarlyExit`]); `None` for models that cannot.
    fn early_exit(&self) -> Option<&dyn EarlyExit> {
        None
    }
}

/// A model whose first layers, followed by its final norm and output head, make a cheaper
/// draft of itself (self-speculative decoding: LayerSkip's early exit, without a second
/// checkpoint). Only some models can, so it is a capability of its own, found through
/// [`Model::early_exit`].
///
/// The draft's layers are the target's first layers, so the K/V they write for a token
/// equal what the full model writes for it in those layers: a draft shares the target's
/// KV cache, and the target's own pass over the same slots overwrites them.
pub trait EarlyExit: Send + Sync {
    /// Layers of the full model.
    fn num_layers(&self) -> usize;

    /// Runs `batch` through the first `layers` layers only, then the final norm and head:
    /// writes those layers' K/V into `kv` at the batch's slots and returns logits as
    /// [`Model::forward`] does. Always eager (no captured graph).
    ///
    /// # Errors
    /// [`ModelError::Batch`] for a malformed batch or `layers` outside `1..=num_layers`;
    /// device errors otherwise.
    fn forward_early_exit(&self, batch: &ForwardBatch, kv: &dyn KvCache, layers: usize) -> Result<Tensor>;
}
