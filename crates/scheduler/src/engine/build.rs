//! Building an engine: over a model, its cache and a backend, then, optionally, with a
//! policy of the caller's own and with speculative decoding (a proposer, the target's own
//! layers, or a draft model). Speculation turns asynchronous scheduling off: a step's
//! proposals need the tokens of the step before.

use std::sync::Arc;

use met_cache::KvCache;
use met_config::EngineConfig;
use met_kernels::GpuBackend;
use met_model_layers::Model;
use met_speculative::{DraftModelProposer, Proposer, SpeculativeConfig};
use met_telemetry::{Metrics, StepStats};

use super::Engine;
use crate::EngineError;
use crate::health::Health;
use crate::policy::{SchedulingPolicy, policy};
use crate::scheduler::Scheduler;
use crate::speculate::Speculation;

impl Engine {
    /// An engine over `model` with the cache `kv`, sampling on `backend`, scheduling as
    /// `config` says (its built-in policy included; [`Self::with_policy`] swaps in another).
    ///
    /// # Errors
    /// [`EngineError::Config`] for an invalid `config` or a cache whose block size differs
    /// from it.
    pub fn new(
        model: Box<dyn Model>,
        backend: Arc<dyn GpuBackend>,
        kv: Box<dyn KvCache>,
        config: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EngineError> {
        config.validate().map_err(|e| EngineError::Config(e.to_string()))?;
        if kv.block_size() != config.block_size {
            return Err(EngineError::Config(format!(
                "the KV cache has blocks of {} tokens, the engine is configured for {}",
                kv.block_size(),
                config.block_size
            )));
        }
        metrics.set_kv_capacity(kv.num_blocks());
        metrics.set_batch_invariant(backend.batch_invariant());
        if let Some(u) = kv.state_usage() {
            metrics.set_state_capacity(u.sequence_slots, u.snapshot_slots, u.bytes);
        }
        let ahead = config.async_scheduling.enabled(backend.queues_work()) && model.feeds_tokens();
        let policy = policy(config.policy);
        let scheduler = Scheduler::new(config, model.max_context(), policy, Arc::clone(&metrics));
        let health = Arc::new(Health::default());
        Ok(Self {
            model,
            backend,
            kv,
            scheduler,
            metrics,
            health,
            arrivals: 0,
            next_id: 0,
            last_step: StepStats::default(),
            ahead,
            in_flight: None,
        })
    }

    /// This engine, admitting and preempting as `policy` says (a policy of the caller's own;
    /// the built-in ones are chosen by [`EngineConfig::policy`]).
    #[must_use]
    pub fn with_policy(mut self, policy: Box<dyn SchedulingPolicy>) -> Self {
        self.scheduler.set_policy(policy);
        self
    }

    /// This engine, verifying the proposals of `speculative`'s proposer for every decoding
    /// sequence: outputs keep their distribution, and greedy ones stay those of plain
    /// decoding (see `speculate.rs`).
    ///
    /// # Errors
    /// [`EngineError::Config`] naming the flag of a setting that cannot work, for this
    /// model too (self-speculation's layers).
    pub fn with_speculative(self, speculative: &SpeculativeConfig) -> Result<Self, EngineError> {
        self.can_roll_back(speculative.num_tokens)?;
        let proposer = met_speculative::proposer(speculative, &*self.model, Arc::clone(&self.backend))
            .map_err(|e| EngineError::Config(e.to_string()))?;
        Ok(self.with_proposer_config(proposer, speculative))
    }

    /// This engine, drafting with `draft` (`--speculative draft`), a second model of the
    /// same vocabulary on `draft_backend`, with a KV cache of as many blocks as this
    /// engine's, and verifying up to `speculative.num_tokens` of its tokens per step.
    ///
    /// # Errors
    /// [`EngineError::Config`] naming `--draft-model` for a draft of another vocabulary or
    /// a cache the device cannot hold, and for settings that cannot work.
    pub fn with_draft_model(
        self,
        speculative: &SpeculativeConfig,
        draft: Box<dyn Model>,
        draft_backend: Arc<dyn GpuBackend>,
    ) -> Result<Self, EngineError> {
        self.can_roll_back(speculative.num_tokens)?;
        let config = |e: met_speculative::SpeculativeError| EngineError::Config(e.to_string());
        speculative.validate().map_err(|e| EngineError::Config(e.to_string()))?;
        let (vocab, blocks, block_size) = (self.model.vocab_size(), self.kv.num_blocks(), self.kv.block_size());
        let proposer = DraftModelProposer::new(draft, draft_backend, vocab, blocks, block_size).map_err(config)?;
        Ok(self.with_proposer_config(Box::new(proposer), speculative))
    }

    /// Verifying a draft of `k` tokens keeps only the accepted ones: the cache must be able
    /// to forget the rest. Paged K/V always can; a recurrent state (a hybrid model's) needs
    /// a rollback copy per drafted token ([`KvCache::allow_rollback`]).
    fn can_roll_back(&self, k: usize) -> Result<(), EngineError> {
        match self.kv.state_usage() {
            Some(usage) if usage.rollback < k => Err(EngineError::Config(format!(
                "speculating {k} tokens on a model with recurrent (linear-attention) layers needs {k} rollback \
                 state slots per sequence; the KV cache has {}",
                usage.rollback
            ))),
            _ => Ok(()),
        }
    }

    /// This engine, verifying the tokens of `proposer` as `speculative` says: up to its `k`,
    /// adaptive or not, and only while at most its `max_batch` sequences run (its method and
    /// the method's own settings are the proposer's business).
    #[must_use]
    pub fn with_proposer_config(mut self, proposer: Box<dyn Proposer>, speculative: &SpeculativeConfig) -> Self {
        self.ahead = false;
        let speculation = Speculation::new(proposer, speculative.num_tokens, self.model.vocab_size());
        self.scheduler.speculate(speculation.with_policy(speculative.adaptive, speculative.max_batch));
        self
    }

    /// This engine, verifying `num_tokens` tokens of `proposer` per sequence and step (any
    /// proposer, including test doubles; greedy outputs do not depend on it), with a fixed
    /// `k` and no batch limit.
    #[must_use]
    pub fn with_proposer(mut self, proposer: Box<dyn Proposer>, num_tokens: usize) -> Self {
        self.ahead = false;
        self.scheduler.speculate(Speculation::new(proposer, num_tokens, self.model.vocab_size()));
        self
    }
}
