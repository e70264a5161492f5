//! `EngineConfig`: the serving engine's budgets and cache settings.

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
    /// Token events buffered per request before the engine pauses that request.
    pub stream_capacity: usize,
    /// Whether the engine queues each decode step before reading the tokens the step
    /// before drew, so the host's scheduling and bookkeeping overlap the device's work.
    /// `None`: wherever it can (a backend that queues work, a model that reads its token
    /// ids from the device, no speculative decoding).
    pub async_scheduling: Option<bool>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 256,
            max_batch_tokens: 8192,
            max_prefill_chunk: None,
            block_size: 16,
            prefix_caching: true,
            stream_capacity: 256,
            async_scheduling: None,
        }
    }
}

/// An engine setting that cannot work, naming the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--{flag}: {msg}")]
pub struct InvalidEngineConfig {
    /// The command-line flag (without dashes).
    pub flag: &'static str,
    /// What is wrong with it.
    pub msg: String,
}

impl EngineConfig {
    /// Checks that every budget is positive.
    ///
    /// # Errors
    /// The first zero budget, naming its flag.
    pub fn validate(&self) -> Result<(), InvalidEngineConfig> {
        for (flag, v) in [
            ("max-num-seqs", self.max_num_seqs),
            ("max-batch-tokens", self.max_batch_tokens),
            ("block-size", self.block_size),
            ("stream-capacity", self.stream_capacity),
            ("max-prefill-chunk", self.max_prefill_chunk.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(InvalidEngineConfig { flag, msg: "must be positive".into() });
            }
        }
        Ok(())
    }
}
