//! The KV cache seam of met.
//!
//! [`KvCache`] owns the per-layer K/V pools (device tensors made through
//! [`met_kernels::GpuBackend`]) and the bookkeeping of their fixed-size blocks. A sequence
//! holds its blocks through a [`SequenceBlocks`] guard: its block table maps logical block
//! `i` (tokens `i·block_size ..`) to a physical block, and dropping the guard returns the
//! blocks to the pool. That drop is the only way blocks are freed, so a cancelled request
//! cannot leak them.
//!
//! With prefix caching on, full blocks are hashed as a chain (parent hash + the block's
//! token ids) once their K/V is written; a new sequence reuses the blocks of its longest
//! cached prefix, and blocks no sequence references stay cached until the pool needs them
//! (least recently freed first). Each chain starts from its sequence's namespace, so a
//! prefix computed through one LoRA adapter is never reused by another or by the base
//! model ([`SequenceBlocks::in_namespace`]).
//!
//! Under tensor parallelism the cache stays one: one block manager and one block table per
//! sequence, while each rank's device holds its share of every block ([`KvPools`]: the
//! rank's K/V heads of every layer), so a block id means the same tokens on every rank.
//!
//! A hybrid model's recurrent layers keep a fixed-size state per sequence instead of K/V
//! per token: the cache then also holds pools of state slots, one per running sequence
//! plus prefix-cache snapshots ([`state`]), handed out through the same guard.
//!
//! This crate never reads tensor contents; it does bookkeeping on the host and hands the
//! pools to the model, which writes and reads them through the backend.
//!
//! Invariant: at every moment, blocks referenced by live guards + free blocks = total.

mod block;
mod paged;
mod state;

pub use block::{BlockId, SequenceBlocks};
pub use paged::PagedKvCache;
pub use state::{StateLayout, StateSizing, StateUsage};

use met_kernels::{DType, Tensor};

/// Tokens per block unless configured otherwise.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// The shape of the K/V state a model keeps per token on one device (under tensor
/// parallelism, one rank's share: its K/V heads).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Attention layers, each with its own K and V pool (a hybrid model's full-attention
    /// layers only).
    pub num_layers: usize,
    /// Key/value heads per layer.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Element type of the pools.
    pub dtype: DType,
    /// The per-sequence state of recurrent layers, for hybrid models.
    pub state: Option<StateLayout>,
}

impl KvLayout {
    /// Bytes one block of `block_size` tokens takes across all layers, K and V.
    pub fn bytes_per_block(&self, block_size: usize) -> usize {
        2 * self.num_layers * block_size * self.num_kv_heads * self.head_dim * self.dtype.size_in_bytes()
    }
}

/// Not enough free blocks for a request. A scheduling outcome (wait, preempt), not a
/// failure of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("out of KV cache blocks: {needed} needed, {free} free")]
pub struct OutOfBlocks {
    /// Blocks the request needed.
    pub needed: usize,
    /// Blocks that were free.
    pub free: usize,
}

/// Errors building a cache.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// Allocating the pools failed on the device.
    #[error("allocating the KV cache: {0}")]
    Kernels(#[from] met_kernels::Error),
    /// The configuration cannot make a usable cache.
    #[error("invalid KV cache configuration: {0}")]
    Config(String),
}

/// One rank's K/V pools: the key and value pool of every layer, each `[blocks, block_size,
/// kv_heads, head_dim]` with this rank's heads.
#[derive(Debug, Clone)]
pub struct KvPools {
    layers: Vec<(Tensor, Tensor)>,
    /// Per recurrent layer, its convolution-window and recurrent-matrix pools, each
    /// `[slots, ...]` as the [`StateLayout`] says.
    states: Vec<(Tensor, Tensor)>,
}

impl KvPools {
    /// Pools from every layer's `(key, value)` pair.
    pub fn new(layers: Vec<(Tensor, Tensor)>) -> Self {
        Self { layers, states: Vec::new() }
    }

    /// [`Self::new`] plus every recurrent layer's `(conv, recurrent)` state pools.
    pub fn with_states(layers: Vec<(Tensor, Tensor)>, states: Vec<(Tensor, Tensor)>) -> Self {
        Self { layers, states }
    }

    /// The convolution-window and recurrent-matrix pools of recurrent layer `layer`.
    ///
    /// # Panics
    /// If `layer` is past the pools' recurrent layers.
    pub fn state(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (c, r) = &self.states[layer];
        (c, r)
    }

    /// Every state pool, for ops over all of them (zeroing or copying a slot).
    pub fn state_pools(&self) -> Vec<&Tensor> {
        self.states.iter().flat_map(|(c, r)| [c, r]).collect()
    }

    /// The K and V pools of `layer`.
    ///
    /// # Panics
    /// If `layer` is past the pools' layers.
    pub fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        let (k, v) = &self.layers[layer];
        (k, v)
    }

    /// Layers held.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Blocks in each pool (0 without layers).
    pub fn num_blocks(&self) -> usize {
        self.layers.first().map_or(0, |(k, _)| k.dims()[0])
    }

    /// Tokens per block (0 without layers).
    pub fn block_size(&self) -> usize {
        self.layers.first().map_or(0, |(k, _)| k.dims()[1])
    }
}

/// Paged K/V storage plus its block bookkeeping.
pub trait KvCache: Send {
    /// The per-token K/V shape.
    fn layout(&self) -> KvLayout;

    /// Tokens per block.
    fn block_size(&self) -> usize;

    /// Blocks in the pool.
    fn num_blocks(&self) -> usize;

    /// Blocks not held by any sequence.
    fn num_free_blocks(&self) -> usize;

    /// Whether `blocks` more blocks could be handed out now.
    fn can_allocate(&self, blocks: usize) -> bool {
        self.num_free_blocks() >= blocks
    }

    /// An empty block table for a new sequence.
    fn new_sequence(&self) -> SequenceBlocks;

    /// Grows `seq` so it has slots for its first `tokens` tokens. All or nothing: on
    /// failure `seq` is unchanged.
    ///
    /// # Errors
    /// [`OutOfBlocks`] when the pool cannot supply the missing blocks.
    fn reserve(&self, seq: &mut SequenceBlocks, tokens: usize) -> Result<(), OutOfBlocks>;

    /// Whether full blocks are shared between sequences through the prefix cache.
    fn prefix_caching(&self) -> bool;

    /// Attaches to the empty `seq` the cached blocks of the longest cached prefix of
    /// `tokens`, covering at most `limit` tokens (pass `tokens.len() - 1` so the last
    /// token is computed and yields logits). Returns the tokens covered, a multiple of the
    /// block size; 0 with prefix caching off.
    ///
    /// # Panics
    /// If `seq` already holds blocks.
    fn match_prefix(&self, seq: &mut SequenceBlocks, tokens: &[u32], limit: usize) -> usize;

    /// Records that the K/V of `tokens[..computed]` is in `seq`'s blocks, making its full
    /// blocks reusable by later sequences. A no-op with prefix caching off.
    fn commit(&self, seq: &mut SequenceBlocks, tokens: &[u32], computed: usize);

    /// Lets the coming step, which computes tokens `from..to` of `seq`, be cut back to any
    /// count from `from + 1` by [`SequenceBlocks::truncate`] (a speculative verification
    /// keeps only the accepted tokens). K/V needs nothing: a cut forgets slots that later
    /// tokens overwrite. A recurrent state is copied after each of those tokens, and a cut
    /// restores the copy at its count. Returns false when the cache cannot keep that many
    /// copies (the step must not run with those tokens).
    fn allow_rollback(&self, seq: &mut SequenceBlocks, from: usize, to: usize) -> bool {
        let _ = (seq, from, to);
        true
    }

    /// A new sequence sharing the first `tokens / block_size` full blocks of `seq`
    /// (refcounted, whether or not prefix caching is on): the `n` choices of one prompt.
    fn fork(&self, seq: &SequenceBlocks, tokens: usize) -> SequenceBlocks;

    /// The state slots and their occupancy, for a cache with recurrent state.
    fn state_usage(&self) -> Option<StateUsage> {
        None
    }

    /// Tensor-parallel ranks that each hold a share of every block (1 on one device).
    fn num_ranks(&self) -> usize;

    /// Rank `rank`'s pools, laid out as [`Self::layout`] says.
    ///
    /// # Panics
    /// If `rank >= num_ranks()`.
    fn pools(&self, rank: usize) -> &KvPools;

    /// The K and V pools of `layer` on rank 0 (the only rank on one device), each
    /// `[blocks, block_size, kv_heads, head_dim]`.
    ///
    /// # Panics
    /// If `layer >= layout().num_layers`.
    fn layer(&self, layer: usize) -> (&Tensor, &Tensor) {
        self.pools(0).layer(layer)
    }
}
