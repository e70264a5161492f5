//! The engine: a model, its KV cache and the scheduler, stepped on one thread.
//!
//! `step` is the whole serving loop in four lines: reap cancelled requests, schedule a
//! batch, run it through the model, sample and hand the results back to the scheduler.
//!
//! With asynchronous scheduling (on where the backend queues work), a decode step is left
//! in flight: its tokens stay on the device ([`GpuBackend::sample_later`]). The next call
//! plans the step after it without them ([`Scheduler::continue_plan`]), queues that step
//! with its ids read from the device ([`Model::forward_fed`]), and only then waits for the
//! tokens and hands them to the scheduler, so the host's scheduling and bookkeeping run
//! while the device computes. A sequence that a stop token ended meanwhile has its extra
//! row discarded; anything else that needs the tokens first (admissions, preemption,
//! speculation) schedules after them, as without it. So the same batches run either way,
//! but for those discarded rows (on a GPU, a batch one row larger can round the others
//! differently, as any other change of batch can).
//!
//! One bad sequence never fails its batch: when the forward pass or the sampler fails for
//! the batch, each sequence is run (or its row sampled) alone, and only those that fail
//! alone end, with [`FinishReason::Error`]; the others go on with the outputs they would
//! have had anyway (sampling is a pure function of a row). A device error belongs to no
//! sequence: it is an engine-level fault, as is a panic inside a step ([`crate::spawn`]
//! catches it). A fault ends every request with an error and is recorded once in the
//! engine's [`Health`], which handles report and refuse new work by.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use met_cache::KvCache;
use met_config::EngineConfig;
use met_kernels::{DType, GpuBackend, HostTensor, LaterSample, SampleRow, Sampled, Tensor};
use met_model_layers::Model;
use met_speculative::{DraftModelProposer, Proposer, SpeculativeConfig};
use met_telemetry::{Metrics, StepStats};

use crate::policy::SchedulingPolicy;
use crate::request::{EngineLimits, EngineRequest, FinishReason, RequestShared, RequestStream, TokenEvent};
use crate::scheduler::{EntryResult, Plan, Scheduled, Scheduler};
use crate::sequence::Sequence;
use crate::speculate::Speculation;
use crate::{EngineError, RequestId, SubmitError};

/// Everything the engine thread owns.
pub struct Engine {
    model: Box<dyn Model>,
    backend: Arc<dyn GpuBackend>,
    kv: Box<dyn KvCache>,
    scheduler: Scheduler,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    arrivals: u64,
    next_id: u64,
    last_step: StepStats,
    /// Whether decode steps are queued ahead of their tokens (asynchronous scheduling).
    ahead: bool,
    /// The step whose tokens are still on the device.
    in_flight: Option<InFlight>,
}

/// A step queued and sampled, its draws not read yet.
struct InFlight {
    plan: Plan,
    /// Kept to draw row by row when the batch's draws fail.
    logits: Tensor,
    draws: LaterSample,
}

/// An engine-level fault, once one happened: shared by the engine and its handles.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fault: OnceLock<String>,
    changed: tokio::sync::Notify,
}

impl Health {
    /// Records `fault` (the first one wins) and wakes whoever waits for it.
    pub(crate) fn fail(&self, fault: String) {
        let _ = self.fault.set(fault);
        self.changed.notify_waiters();
    }

    /// The fault, if one happened.
    pub(crate) fn fault(&self) -> Option<&str> {
        self.fault.get().map(String::as_str)
    }

    /// Waits until a fault happens and returns it.
    pub(crate) async fn wait(&self) -> String {
        loop {
            // Registered before the check, so a fault recorded in between still wakes it.
            let changed = self.changed.notified();
            if let Some(fault) = self.fault() {
                return fault.to_owned();
            }
            changed.await;
        }
    }
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
        let ahead = config.async_scheduling.enabled(backend.queues_work()) && model.feeds_tokens();
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

    /// This engine, verifying the proposals of `speculative`'s proposer for every decoding
    /// sequence: outputs keep their distribution, and greedy ones stay those of plain
    /// decoding (see `speculate.rs`).
    ///
    /// # Errors
    /// [`EngineError::Config`] naming the flag of a setting that cannot work, for this
    /// model too (self-speculation's layers).
    pub fn with_speculative(self, speculative: &SpeculativeConfig) -> Result<Self, EngineError> {
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
        let config = |e: met_speculative::SpeculativeError| EngineError::Config(e.to_string());
        speculative.validate().map_err(|e| EngineError::Config(e.to_string()))?;
        let (vocab, blocks, block_size) = (self.model.vocab_size(), self.kv.num_blocks(), self.kv.block_size());
        let proposer = DraftModelProposer::new(draft, draft_backend, vocab, blocks, block_size).map_err(config)?;
        Ok(self.with_proposer_config(Box::new(proposer), speculative))
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

    /// The limits requests are checked against ([`EngineRequest::new`]).
    pub fn limits(&self) -> EngineLimits {
        EngineLimits {
            vocab_size: self.model.vocab_size(),
            max_context: self.model.max_context(),
            kv_capacity: self.kv.num_blocks() * self.kv.block_size(),
            stream_capacity: self.scheduler.stream_capacity(),
        }
    }

    /// Queues `req`, for callers that step the engine themselves (tests, benchmarks, batch
    /// jobs); servers use [`crate::spawn`] and a handle.
    ///
    /// # Errors
    /// [`SubmitError::Invalid`] for a request made against another engine's limits that
    /// does not fit this one's;
    /// [`SubmitError::EngineStopped`] after an engine-level fault.
    pub fn submit(&mut self, req: EngineRequest) -> Result<RequestStream, SubmitError> {
        if self.fault().is_some() {
            return Err(SubmitError::EngineStopped);
        }
        let limits = self.limits();
        req.fits(&limits)?;
        self.next_id += 1;
        let id = RequestId(self.next_id);
        let (tx, rx) = tokio::sync::mpsc::channel(limits.stream_capacity);
        self.add(id, req, tx);
        Ok(RequestStream::new(id, rx))
    }

    /// Queues a request checked against this engine's limits, whose events go to `events`.
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

    /// Runs one step: schedule, forward, sample, postprocess. A sequence that fails ends
    /// alone; an engine-level fault ends every request (see [`Engine::fault`]). With
    /// asynchronous scheduling a decode step's postprocessing happens in the next call,
    /// after the step that follows it is queued (see the module's docs).
    pub fn step(&mut self) {
        let start = Instant::now();
        let mut counts = StepStats::default();
        if let Some(prev) = self.in_flight.take() {
            let next = self.scheduler.continue_plan(&prev.plan, &*self.kv);
            counts.phases.schedule = start.elapsed();
            match next {
                Some((plan, fed)) => self.step_ahead(prev, plan, &fed, &mut counts),
                None => {
                    self.resolve(prev, &mut counts);
                    self.step_now(&mut counts);
                }
            }
        } else {
            self.step_now(&mut counts);
        }
        self.record(counts, start);
    }

    /// A step planned with every token known: leaves it in flight when it may be.
    fn step_now(&mut self, counts: &mut StepStats) {
        if self.fault().is_some() {
            return;
        }
        let start = Instant::now();
        self.scheduler.reap();
        let plan = self.scheduler.schedule(&*self.kv, &*self.model, counts);
        counts.phases.schedule += start.elapsed();
        if plan.entries.is_empty() {
            self.scheduler.recycle(plan);
            return;
        }
        if self.ahead {
            let begun = Instant::now();
            let forward = self.forward_and_mask(&plan);
            counts.phases.forward += begun.elapsed();
            return self.sample_or_settle(plan, forward, counts);
        }
        let results = self.run(&plan, counts);
        self.settle(plan, results, counts);
    }

    /// Queues `plan`, the step after `prev`, with its ids read from `prev`'s draws; then
    /// resolves `prev` and leaves `plan` in flight.
    fn step_ahead(&mut self, prev: InFlight, mut plan: Plan, fed: &[u32], counts: &mut StepStats) {
        let begun = Instant::now();
        let forward = self.model.forward_fed(&plan.batch, &prev.draws.tokens, fed, &mut *self.kv);
        counts.phases.forward += begun.elapsed();
        counts.ahead = true;
        counts.batch_tokens = plan.batch.num_tokens();
        let keys = self.scheduler.keys(&plan.entries);
        self.resolve(prev, counts);
        if self.fault().is_some() {
            self.scheduler.recycle(plan);
            return;
        }
        self.scheduler.reap();
        self.scheduler.remap(&mut plan, &keys);
        if plan.entries.is_empty() {
            self.scheduler.recycle(plan);
            return;
        }
        if forward.is_ok() && self.scheduler.constrains(&plan.entries) {
            // Their states have just taken `prev`'s tokens.
            self.scheduler.compute_masks(&plan.entries, self.model.vocab_size());
        }
        self.sample_or_settle(plan, forward, counts);
    }

    /// Leaves `plan`'s draws in flight once its forward pass is queued; when the pass or
    /// the draws fail, finds the sequences that fail alone and settles the step now.
    fn sample_or_settle(
        &mut self,
        plan: Plan,
        forward: Result<Tensor, met_model_layers::ModelError>,
        counts: &mut StepStats,
    ) {
        let results = match forward {
            Ok(logits) => {
                let begun = Instant::now();
                let draws = self.sample_later(&logits, &plan.entries);
                counts.phases.sample += begun.elapsed();
                match draws {
                    Ok(draws) => {
                        self.in_flight = Some(InFlight { plan, logits, draws });
                        return;
                    }
                    Err(e) => blame(e).and_then(|_| self.sample(&logits, &plan.entries)),
                }
            }
            Err(e) => blame(e.into()).and_then(|_| self.run_alone(&plan)),
        };
        self.settle(plan, results, counts);
    }

    /// Waits for `prev`'s draws and hands them to the scheduler.
    fn resolve(&mut self, prev: InFlight, counts: &mut StepStats) {
        let begun = Instant::now();
        let InFlight { plan, logits, draws } = prev;
        let results = match draws.wait() {
            Ok(sampled) => Ok(self.entry_results(&plan.entries, sampled.into_iter().map(Ok))),
            // A row that cannot be drawn: draw row by row to find it.
            Err(e) => blame(e.into()).and_then(|_| self.sample(&logits, &plan.entries)),
        };
        counts.phases.sample += begun.elapsed();
        self.settle(plan, results, counts);
    }

    /// Hands a step's results to the scheduler, or ends every request on a fault.
    fn settle(&mut self, plan: Plan, results: Result<Vec<EntryResult>, EngineError>, counts: &mut StepStats) {
        match results {
            Ok(results) => {
                let begun = Instant::now();
                self.scheduler.postprocess(&plan, results, &*self.kv, counts);
                counts.phases.postprocess += begun.elapsed();
            }
            Err(fault) => self.fail(&fault.to_string()),
        }
        self.scheduler.recycle(plan);
    }

    /// What the last step did and where its time went.
    pub fn last_step(&self) -> &StepStats {
        &self.last_step
    }

    /// The engine-level fault (a device error, a panic inside a step) that ended every
    /// request, if one happened. A faulted engine accepts no more requests.
    pub fn fault(&self) -> Option<&str> {
        self.health.fault()
    }

    /// Records an engine-level fault and ends every request with it.
    pub(crate) fn fail(&mut self, fault: &str) {
        self.in_flight = None;
        self.health.fail(fault.to_owned());
        self.scheduler.fail_all(&FinishReason::Error(fault.to_owned()));
    }

    pub(crate) fn health(&self) -> Arc<Health> {
        Arc::clone(&self.health)
    }

    /// Forwards and samples `plan`: one result per entry. When the batch fails, each
    /// sequence runs alone to find the ones that fail; only a device error is `Err`.
    fn run(&mut self, plan: &Plan, counts: &mut StepStats) -> Result<Vec<EntryResult>, EngineError> {
        let begun = Instant::now();
        let forward = self.forward_and_mask(plan);
        counts.phases.forward = begun.elapsed();
        let batch_error = match forward {
            Ok(logits) => {
                let begun = Instant::now();
                let results = self.sample(&logits, &plan.entries);
                counts.phases.sample = begun.elapsed();
                return results;
            }
            Err(e) => EngineError::from(e),
        };
        blame(batch_error)?;
        self.run_alone(plan)
    }

    /// Runs and samples each entry of `plan` alone, after the batch failed: only the
    /// sequences that fail alone fail. Rerunning a sequence writes the same K/V at the same
    /// slots again.
    fn run_alone(&mut self, plan: &Plan) -> Result<Vec<EntryResult>, EngineError> {
        let mut results = Vec::with_capacity(plan.entries.len());
        for entry in &plan.entries {
            let batch = self.scheduler.batch_of(entry);
            // Its logits are the only ones of its batch.
            let alone = Scheduled { logits_row: 0, ..*entry };
            let result = match self.model.forward(&batch, &mut *self.kv) {
                Ok(logits) => self.sample(&logits, &[alone])?.remove(0),
                Err(e) => EntryResult::Failed(blame(e.into())?),
            };
            results.push(result);
        }
        Ok(results)
    }

    /// The forward pass of `plan`, with the masks of its constrained sequences computed
    /// meanwhile on a thread of their own (the masks depend only on tokens already sampled).
    fn forward_and_mask(&mut self, plan: &Plan) -> Result<Tensor, met_model_layers::ModelError> {
        let (model, kv, scheduler) = (&self.model, &mut self.kv, &mut self.scheduler);
        if !scheduler.constrains(&plan.entries) {
            return model.forward(&plan.batch, &mut **kv);
        }
        let vocab = model.vocab_size();
        std::thread::scope(|s| {
            let masks = s.spawn(|| scheduler.compute_masks(&plan.entries, vocab));
            let logits = model.forward(&plan.batch, &mut **kv);
            if let Err(panic) = masks.join() {
                std::panic::resume_unwind(panic);
            }
            logits
        })
    }

    /// `logits` with every constrained row masked to the tokens its constraint allows, its
    /// rows those of `entries`' sampler rows; `None` when no row is constrained.
    fn masked(&self, logits: &Tensor, entries: &[Scheduled]) -> Result<Option<Tensor>, EngineError> {
        let vocab = self.model.vocab_size();
        let Some((rows, masks)) = self.scheduler.logit_masks(entries, vocab) else { return Ok(None) };
        let b = &self.backend;
        let rows_t = b.upload(&HostTensor::from_u32(&rows, &[rows.len()]), DType::U32)?;
        let masks_t =
            b.upload(&HostTensor::from_u32(&masks, &[rows.len(), masks.len() / rows.len().max(1)]), DType::U32)?;
        Ok(Some(b.mask_logits(logits, &rows_t, &masks_t)?))
    }

    /// Samples the rows of `entries` from `logits` (each sampling entry's rows, in order:
    /// one, or one per draft token more). When the batch fails, each row is sampled alone
    /// to find the ones that fail; an entry with a failed row fails.
    fn sample(&self, logits: &Tensor, entries: &[Scheduled]) -> Result<Vec<EntryResult>, EngineError> {
        let sampled = self.with_rows(logits, entries, |logits, rows| match self.backend.sample(logits, rows) {
            Ok(samples) => Ok(samples.into_iter().map(Ok).collect()),
            Err(e) => {
                blame(e.into())?;
                let alone = |row: &SampleRow<'_>| match self.backend.sample(logits, std::slice::from_ref(row)) {
                    Ok(mut one) => Ok(Ok(one.remove(0))),
                    Err(e) => blame(e.into()).map(Err),
                };
                rows.iter().map(alone).collect::<Result<Vec<_>, _>>()
            }
        })?;
        Ok(self.entry_results(entries, sampled.into_iter()))
    }

    /// [`Self::sample`]'s draws left on the device ([`GpuBackend::sample_later`]).
    fn sample_later(&self, logits: &Tensor, entries: &[Scheduled]) -> Result<LaterSample, EngineError> {
        self.with_rows(logits, entries, |logits, rows| Ok(self.backend.sample_later(logits, rows)?))
    }

    /// Runs `draw` over the sampler rows of `entries`, on `logits` with the constrained
    /// rows masked (then holding only the sampled rows, in order).
    fn with_rows<T>(
        &self,
        logits: &Tensor,
        entries: &[Scheduled],
        draw: impl FnOnce(&Tensor, &[SampleRow<'_>]) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let masked = self.masked(logits, entries)?;
        let inputs = self.scheduler.sample_inputs(entries, self.model.vocab_size());
        let rows = self.scheduler.sample_rows(entries, &inputs, masked.is_some());
        draw(masked.as_ref().unwrap_or(logits), &rows)
    }

    /// One result per entry from the draws of its rows, in order.
    fn entry_results(
        &self,
        entries: &[Scheduled],
        mut sampled: impl Iterator<Item = Result<Sampled, String>>,
    ) -> Vec<EntryResult> {
        let results = entries.iter().map(|e| {
            if !e.sample {
                return EntryResult::Computed;
            }
            if let Some(msg) = self.scheduler.mask_error(e) {
                sampled.by_ref().take(e.samples()).for_each(drop);
                return EntryResult::Failed(msg);
            }
            // Taken in full before looking at them, so the next entry starts at its own rows.
            let mine: Vec<Result<_, String>> = sampled.by_ref().take(e.samples()).collect();
            mine.into_iter().collect::<Result<Vec<_>, _>>().map_or_else(EntryResult::Failed, EntryResult::Sampled)
        });
        results.collect()
    }

    fn record(&mut self, mut stats: StepStats, start: Instant) {
        stats.duration = start.elapsed();
        stats.waiting = self.scheduler.num_waiting();
        stats.running = self.scheduler.num_running();
        stats.kv_blocks_used = self.kv.num_blocks() - self.kv.num_free_blocks();
        self.metrics.step(&stats);
        self.last_step = stats;
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

/// The message a sequence that failed ends with, or the error back when it is the
/// engine's (a device error, which no sequence owns).
fn blame(e: EngineError) -> Result<String, EngineError> {
    let device = |e: &met_kernels::Error| matches!(e, met_kernels::Error::Device(_));
    match &e {
        EngineError::Kernels(k) | EngineError::Model(met_model_layers::ModelError::Kernels(k)) if device(k) => Err(e),
        _ => Ok(e.to_string()),
    }
}
