//! `EngineConfig`: what the serving engine's scheduler reads (budgets, the KV cache's block
//! size and prefix caching, the policy, asynchronous scheduling), and the error every
//! setting of this crate reports, naming its flag.

use crate::named::named_enum;

named_enum! {
    /// Which waiting sequence is admitted first, and which running one is preempted when KV
    /// blocks run out.
    pub enum Policy ("policy") {
        /// First come, first served; preempts the most recently admitted sequence.
        Fcfs = "fcfs",
        /// Lowest `priority` value first, then arrival; preempts the lowest-priority sequence.
        Priority = "priority",
    }
}

named_enum! {
    /// Whether the engine queues each decode step before reading the tokens of the step
    /// before, so that the host's scheduling and bookkeeping overlap the device's work.
    pub enum AsyncScheduling ("async scheduling setting") {
        /// On where it can pay: a backend that queues work (CUDA), a model that reads its
        /// token ids from the device, no speculative decoding.
        Auto = "auto",
        /// On wherever the model can read its token ids from the device.
        On = "on",
        /// Every step reads its tokens before the next is planned.
        Off = "off",
    }
}

impl AsyncScheduling {
    /// Whether steps go ahead of their tokens, on a backend that does (`queues_work`) or
    /// does not queue work.
    pub fn enabled(self, queues_work: bool) -> bool {
        match self {
            Self::Auto => queues_work,
            Self::On => true,
            Self::Off => false,
        }
    }
}

/// Scheduling budgets and KV cache settings of the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// Most sequences in one step.
    pub max_num_seqs: usize,
    /// Most tokens (decode rows plus prefill chunk tokens) in one step.
    pub max_batch_tokens: usize,
    /// Most tokens of one prompt computed per step (`None`: as many as the budget
    /// allows). Smaller chunks keep decode latency steady while long prompts prefill.
    pub max_prefill_chunk: Option<usize>,
    /// Tokens per KV cache block.
    pub block_size: usize,
    /// Whether full blocks are shared across requests through the prefix cache.
    pub prefix_caching: bool,
    /// Hybrid models with prefix caching: a snapshot of the recurrent state every this many
    /// full blocks, where a later request sharing the prefix can resume (0: none, so no
    /// prefix hits on such models). The default, 16, was measured on the H200 against 4 and
    /// 64 (Qwen3.6-35B-A3B, 16k-token prefix hits: 40 ms against 153 and 56 ms,
    /// `bench/results/device-2026-12-05/`): 4 asks for more snapshots than the budget holds,
    /// 64 recomputes up to 1,024 tokens a hit.
    pub state_snapshot_interval: usize,
    /// Token events buffered per request before the engine pauses that request.
    pub stream_capacity: usize,
    /// Whether decode steps are queued ahead of their tokens.
    pub async_scheduling: AsyncScheduling,
    /// Which sequences are admitted and preempted first.
    pub policy: Policy,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_batch_tokens: 8192,
            max_prefill_chunk: None,
            block_size: 16,
            prefix_caching: true,
            state_snapshot_interval: 16,
            stream_capacity: 256,
            async_scheduling: AsyncScheduling::Auto,
            policy: Policy::Fcfs,
        }
    }
}

/// A setting that cannot work, naming its command-line flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {msg}")]
pub struct InvalidSetting {
    /// The command-line flag (without dashes), with its value where that is what is wrong
    /// (`speculative self`).
    pub flag: &'static str,
    /// What is wrong with it.
    pub msg: String,
}

impl InvalidSetting {
    /// `flag` is wrong because of `msg`.
    pub fn new(flag: &'static str, msg: impl Into<String>) -> Self {
        Self { flag, msg: msg.into() }
    }
}

/// Refuses the first of `values` that is zero, naming its flag.
pub(crate) fn positive(values: &[(&'static str, usize)]) -> Result<(), InvalidSetting> {
    match values.iter().find(|(_, v)| *v == 0) {
        Some(&(flag, _)) => Err(InvalidSetting::new(flag, "must be positive")),
        None => Ok(()),
    }
}

impl EngineConfig {
    /// Checks that every budget is positive.
    ///
    /// # Errors
    /// The first zero budget, naming its flag.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        positive(&[
            ("max-num-seqs", self.max_num_seqs),
            ("max-batch-tokens", self.max_batch_tokens),
            ("block-size", self.block_size),
            ("stream-capacity", self.stream_capacity),
            ("max-prefill-chunk", self.max_prefill_chunk.unwrap_or(1)),
        ])
    }
}
