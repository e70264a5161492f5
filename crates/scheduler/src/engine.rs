//! The engine: a model, its KV cache and the scheduler, stepped on one thread.
//!
//! `step` is the whole serving loop in four lines: reap cancelled requests, schedule a
//! batch, run it through the model, sample and hand the results back to the scheduler.

use std::sync::Arc;
use std::time::Instant;

use met_cache::KvCache;
use met_config::EngineConfig;
use met_kernels::{GpuBackend, SampleRow};
use met_model_layers::Model;
use met_telemetry::{Metrics, StepStats};

use crate::policy::SchedulingPolicy;
use crate::request::{EngineRequest, FinishReason, RequestShared, RequestStream, TokenEvent};
use crate::scheduler::{Plan, Scheduler};
use crate::sequence::Sequence;
use crate::{EngineError, RequestId, SubmitError};

/// Everything the engine thread owns.
pub struct Engine {
    model: Box<dyn Model>,
    backend: Arc<dyn GpuBackend>,
    kv: Box<dyn KvCache>,
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    arrivals: u64,
    next_id: u64,
}

/// Facts a request is validated against before it reaches the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLimits {
    /// Tokens the model knows.
    pub vocab_size: usize,
    /// Longest context the model supports.
    pub max_context: usize,
    /// Tokens the whole KV cache holds.
    pub kv_capacity: usize,
    /// Events buffered per request stream.
    pub stream_capacity: usize,
}

impl Engine {
    /// An engine over `model` with the cache `kv`, scheduling with `policy`.
    ///
    /// # Errors
    /// [`EngineError::Config`] for an invalid `config` or a cache whose block size differs
    /// from it.
    pub fn new(
        model: Box<dyn Model>,
        backend: Arc<dyn GpuBackend>,
        kv: Box<dyn KvCache>,
        config: EngineConfig,
        policy: Box<dyn SchedulingPolicy>,
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
        let scheduler = Scheduler::new(config, model.max_context(), policy, Arc::clone(&metrics));
        Ok(Self { model, backend, kv, scheduler, metrics, arrivals: 0, next_id: 0 })
    }

    /// The limits requests are validated against.
    pub fn limits(&self) -> EngineLimits {
        EngineLimits {
            vocab_size: self.model.vocab_size(),
            max_context: self.model.max_context(),
            kv_capacity: self.kv.num_blocks() * self.kv.block_size(),
            stream_capacity: self.scheduler.stream_capacity(),
        }
    }

    /// Validates `req` and queues it, for callers that step the engine themselves
    /// (tests, benchmarks, batch jobs); servers use [`crate::spawn`] and a handle.
    ///
    /// # Errors
    /// [`SubmitError::Invalid`] naming the field that cannot work.
    pub fn submit(&mut self, req: EngineRequest) -> Result<RequestStream, SubmitError> {
        let limits = self.limits();
        validate(&req, &limits)?;
        self.next_id += 1;
        let id = RequestId(self.next_id);
        let (tx, rx) = tokio::sync::mpsc::channel(limits.stream_capacity);
        self.add(id, req, tx);
        Ok(RequestStream::new(id, rx))
    }

    /// Queues a validated request whose events go to `events`.
    pub(crate) fn add(&mut self, id: RequestId, req: EngineRequest, events: tokio::sync::mpsc::Sender<TokenEvent>) {
        self.arrivals += 1;
        let shared = RequestShared::new(id, &req, self.arrivals, events);
        for index in 0..req.n {
            self.scheduler.add(Sequence::new(Arc::clone(&shared), index, req.prompt.clone()));
        }
    }

    /// Whether a request is unfinished.
    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Runs one step: schedule, forward, sample, postprocess.
    pub fn step(&mut self) {
        let start = Instant::now();
        self.scheduler.reap();
        let mut counts = StepStats::default();
        let plan = self.scheduler.schedule(&*self.kv, &mut counts);
        if !plan.entries.is_empty() {
            match self.run(&plan) {
                Ok(samples) => self.scheduler.postprocess(&plan, samples, &*self.kv),
                Err(e) => self.scheduler.fail_running(&FinishReason::Error(e.to_string())),
            }
        }
        self.scheduler.recycle(plan);
        self.record(counts, start);
    }

    fn run(&mut self, plan: &Plan) -> Result<Vec<met_kernels::Sampled>, EngineError> {
        let logits = self.model.forward(&plan.batch, &mut *self.kv)?;
        let running = &self.scheduler.running;
        let banned: Vec<Vec<u32>> = plan
            .entries
            .iter()
            .filter(|e| e.sample)
            .map(|e| {
                let s = &running[e.seq];
                s.request.stop.banned(s.output().len())
            })
            .collect();
        let rows: Vec<SampleRow<'_>> = plan
            .entries
            .iter()
            .filter(|e| e.sample)
            .zip(&banned)
            .enumerate()
            .map(|(row, (e, banned))| {
                let s = &running[e.seq];
                SampleRow {
                    logits_row: row,
                    params: &s.request.sampling,
                    prompt: s.prompt(),
                    output: s.output(),
                    seed: s.seed,
                    step: s.output().len() as u64,
                    banned,
                }
            })
            .collect();
        Ok(self.backend.sample(&logits, &rows)?)
    }

    fn record(&self, mut stats: StepStats, start: Instant) {
        stats.duration = start.elapsed();
        stats.waiting = self.scheduler.num_waiting();
        stats.running = self.scheduler.num_running();
        stats.kv_blocks_used = self.kv.num_blocks() - self.kv.num_free_blocks();
        self.metrics.step(&stats);
    }

    /// Distinct KV blocks held by running sequences.
    pub fn held_blocks(&self) -> usize {
        self.scheduler.held_blocks()
    }

    /// KV blocks not held by any sequence.
    pub fn free_blocks(&self) -> usize {
        self.kv.num_free_blocks()
    }

    /// KV blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.kv.num_blocks()
    }
}

pub(crate) fn validate(req: &EngineRequest, limits: &EngineLimits) -> Result<(), SubmitError> {
    let invalid = |field: &'static str, msg: String| Err(SubmitError::Invalid { field, msg });
    let len = req.prompt.len();
    if len == 0 {
        return invalid("prompt", "the prompt is empty".into());
    }
    if let Some(id) = req.prompt.iter().find(|&&id| id as usize >= limits.vocab_size) {
        return invalid("prompt", format!("token id {id} is outside the vocabulary of {}", limits.vocab_size));
    }
    if len >= limits.max_context {
        return invalid(
            "prompt",
            format!(
                "the prompt has {len} tokens; the model's context of {} leaves no room to generate",
                limits.max_context
            ),
        );
    }
    if len + 1 > limits.kv_capacity {
        return invalid(
            "prompt",
            format!("the prompt has {len} tokens and can never fit the KV cache of {} tokens", limits.kv_capacity),
        );
    }
    if req.n == 0 {
        return invalid("n", "must be at least 1".into());
    }
    if req.stop.max_new_tokens == 0 {
        return invalid("max_tokens", "must be at least 1".into());
    }
    if let Some(id) = req.stop.stop_token_ids.iter().find(|&&id| id as usize >= limits.vocab_size) {
        return invalid("stop_token_ids", format!("token id {id} is outside the vocabulary of {}", limits.vocab_size));
    }
    req.sampling.validate(limits.vocab_size).map_err(|e| SubmitError::Invalid { field: e.field, msg: e.msg })
}
