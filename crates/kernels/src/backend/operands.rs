//! The operands and results of [`crate::GpuBackend`]'s ops: the attention batch layout and
//! layer facts, MoE routing, the rows `sample` draws and what it returns, memory figures,
//! the runs of `random_uniform` and the fused QKV prologue.
//!
//! They are plain data that every backend reads the same way, kept apart from the trait so
//! that the trait reads as the list of ops; `backend` re-exports them, and the crate root
//! exports them from there.

use std::fmt::Debug;

use met_config::SamplingParams;

use crate::{Result, Tensor};

/// Batch layout for [`crate::GpuBackend::paged_attention`], as device tensors.
///
/// The batch is varlen: sequence `s` owns query rows `cu_seqlens_q[s]..cu_seqlens_q[s+1]`
/// of the flat token dimension, and after this step's KV write its context is
/// `seq_lens[s]` tokens long. The query rows are the *last* tokens of that context, so
/// query row `i` of sequence `s` sits at position `seq_lens[s] - q_len(s) + i`: prefill
/// chunks and decode rows (q_len 1) mix freely. This is FlashAttention's varlen layout with
/// a paged KV cache.
#[derive(Debug, Clone)]
pub struct AttentionMeta {
    /// `u32 [seqs + 1]`: prefix sums of query lengths.
    pub cu_seqlens_q: Tensor,
    /// `u32 [seqs]`: context length of each sequence, new tokens included.
    pub seq_lens: Tensor,
    /// `u32 [seqs, max_blocks]`: physical block of each logical block (padded with 0).
    pub block_tables: Tensor,
    /// Longest query of the batch.
    pub max_seqlen_q: usize,
    /// Longest context of the batch.
    pub max_seqlen_k: usize,
}

/// Fixed facts of one attention layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; `num_heads` is a multiple of it (grouped-query attention).
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Multiplier of `q·k` before softmax, usually `head_dim^-0.5`.
    pub scale: f32,
    /// When set, a query at position `p` sees only keys at positions `> p - window`.
    pub sliding_window: Option<usize>,
    /// When set, scores become `cap * tanh(score / cap)` before softmax.
    pub softcap: Option<f32>,
    /// What an FP8 cache's keys and values are multiplied by when read.
    pub kv_scales: KvScales,
}

/// The scales of one layer's FP8 KV cache: a key element `x` is stored as the byte
/// `e4m3(x / self.k)` and read as `value(byte) · self.k`, a value element likewise with
/// `self.v`. 1.0 unless the checkpoint gives them; a float cache ignores them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvScales {
    /// The keys' scale.
    pub k: f32,
    /// The values' scale.
    pub v: f32,
}

impl KvScales {
    /// Both 1.0.
    pub const UNIT: Self = Self { k: 1.0, v: 1.0 };
}

impl Default for KvScales {
    fn default() -> Self {
        Self::UNIT
    }
}

/// Output of [`crate::GpuBackend::topk_routing`]: per token, the chosen experts and their
/// weights.
#[derive(Debug, Clone)]
pub struct Routing {
    /// `f32 [t, k]`: routing weight of each chosen expert.
    pub weights: Tensor,
    /// `u32 [t, k]`: chosen experts, best first.
    pub experts: Tensor,
}

/// One token to draw for one sequence in [`crate::GpuBackend::sample`].
#[derive(Debug, Clone, Copy)]
pub struct SampleRow<'a> {
    /// Row of the logits tensor to draw from. Several sample rows may share a logits row
    /// (the `n` choices of one prompt).
    pub logits_row: usize,
    /// Temperature, truncation, penalties, bias and logprob settings.
    pub params: &'a SamplingParams,
    /// The sequence's prompt (seen by the repetition penalty).
    pub prompt: &'a [u32],
    /// Tokens generated so far (seen by every penalty).
    pub output: &'a [u32],
    /// The random stream of this sequence.
    pub seed: u64,
    /// Position in that stream: draw `step` of `seed` is the same whatever else is in the
    /// batch, so a seeded request is reproducible.
    pub step: u64,
    /// Tokens that must not be drawn this step (end tokens before `min_tokens`).
    pub banned: &'a [u32],
    /// A speculative draft token this row verifies, with the draft distribution it was
    /// drawn from; `None` for a plain draw. See [`DraftToken`].
    pub draft: Option<DraftToken<'a>>,
}

/// A token a draft drew from its distribution `q`, for a [`SampleRow`] to verify by
/// rejection sampling (Leviathan et al., 2023) against the row's own distribution `p`, the
/// one a plain draw would use (bias, penalties, bans, temperature, min-p, top-k, top-p).
///
/// With temperature above 0 the row returns `token` (accepts it) with probability
/// `min(1, p(token) / q(token))`, decided by the uniform
/// `rng::uniform(rng::accept_stream(seed), step)`; otherwise it draws from
/// `max(0, p − q)`, renormalised, by inverse CDF at `rng::uniform(seed, step)`, which
/// never yields `token`. Either way the result is distributed as `p` when `token` was
/// drawn from `q`, and the result equals `token` exactly when it was accepted. Greedy rows
/// ignore it (their `p` is a point mass at the argmax).
///
/// A draft without a distribution (a point mass at its token, as prompt lookup's) needs no
/// `DraftToken`: for it the rule is "accept with probability `p(token)`, else draw from `p`
/// without `token`", which is exactly a plain draw compared with the token. That is also
/// what a backend that does not implement this verification does (the CUDA backend draws
/// plainly): the distribution stays exact, only fewer drafts are accepted.
#[derive(Debug, Clone, Copy)]
pub struct DraftToken<'a> {
    /// The proposed token.
    pub token: u32,
    /// `q`: the draft's probabilities over the vocabulary, `token` drawn from them.
    pub probs: &'a [f32],
}

/// The result of [`crate::GpuBackend::sample`] for one row.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    /// The drawn token.
    pub token: u32,
    /// When `params.logprobs` is set: its log-probability under the model's raw logits
    /// (before bias, penalties, temperature and truncation).
    pub logprob: Option<f32>,
    /// When `params.logprobs` is `Some(k)`: the `k` most likely tokens under the raw
    /// logits with their log-probabilities, best first.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// The draws of [`crate::GpuBackend::sample_later`]: the tokens on the device at once, the
/// whole results once waited for.
pub struct LaterSample {
    /// `u32 [rows]`: the drawn tokens, on the backend that drew them, for later ops to read.
    pub tokens: Tensor,
    results: Box<dyn FnOnce() -> Result<Vec<Sampled>> + Send>,
}

impl LaterSample {
    /// Draws whose `tokens` are on the device, and whose results `results` returns once
    /// they reach the host.
    pub fn new(tokens: Tensor, results: impl FnOnce() -> Result<Vec<Sampled>> + Send + 'static) -> Self {
        Self { tokens, results: Box::new(results) }
    }

    /// Waits for the draws: what [`crate::GpuBackend::sample`] would have returned.
    ///
    /// # Errors
    /// As [`crate::GpuBackend::sample`]'s, and a device error that happened meanwhile.
    pub fn wait(self) -> Result<Vec<Sampled>> {
        (self.results)()
    }
}

impl Debug for LaterSample {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaterSample").field("tokens", &self.tokens).finish_non_exhaustive()
    }
}

/// Device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free now.
    pub free: usize,
    /// Bytes on the device.
    pub total: usize,
}

/// A run of [`crate::GpuBackend::random_uniform`]: `len` elements, element `j` being
/// `bound · rng::weight_uniform(key, j)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniformRun {
    /// Elements in the run.
    pub len: usize,
    /// The stream's key.
    pub key: u64,
    /// Half-width of the uniform range.
    pub bound: f32,
}

impl UniformRun {
    /// The run's values in f32, generated in parallel on the host.
    #[must_use]
    pub fn host_values(&self) -> Vec<f32> {
        use rayon::prelude::*;
        (0..self.len as u64).into_par_iter().map(|j| self.bound * crate::rng::weight_uniform(self.key, j)).collect()
    }
}

/// What [`crate::GpuBackend::qkv_rotary_write`] needs besides the fused projection.
#[derive(Debug, Clone, Copy)]
pub struct QkvPrologue<'a> {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Per-head RMSNorm weights of queries and keys `[d]` (Qwen3, Gemma 3), applied before
    /// rotary; either dtype of [`crate::GpuBackend::rms_norm`]'s weight.
    pub qk_norm: Option<(&'a Tensor, &'a Tensor)>,
    /// The norm's epsilon.
    pub eps: f32,
    /// `u32 [t]`: position of each row.
    pub positions: &'a Tensor,
    /// `f32 [half]`: rotary inverse frequencies.
    pub inv_freq: &'a Tensor,
    /// The scales keys and values are stored under in an FP8 cache.
    pub kv_scales: KvScales,
}
