//! The engine: a model, its KV cache and the scheduler, stepped on one thread.
//!
//! [`Engine::step`] is the serving loop, a line per phase: schedule a batch, run it through
//! the model, catch up with the step still in flight, sample, and hand the results back to
//! the scheduler (postprocess). Each phase can end the step: nothing to schedule, a fault,
//! or draws left on the device for the next step to read. How logits become tokens (grammar
//! masks, the sampler's rows, draws taken now or left on the device) is `draw.rs`.
//!
//! With asynchronous scheduling (on where the backend queues work), a decode step is left
//! in flight: its tokens stay on the device ([`GpuBackend::sample_later`]). The next call
//! plans the step after it without them ([`Scheduler::continue_plan`]), queues that step
//! with its ids read from the device ([`Model::forward_fed`]), and only then catches up:
//! waits for the tokens and hands them to the scheduler, so the host's scheduling and
//! bookkeeping run while the device computes (`ahead.rs`). A sequence that a stop token
//! ended meanwhile has its extra row discarded; anything else that needs the tokens first
//! (admissions, preemption, speculation) schedules after them, as without it. So the same
//! batches run either way, but for those discarded rows (on a GPU, a batch one row larger
//! can round the others differently, as any other change of batch can).
//!
//! One bad sequence never fails its batch (`isolate.rs`): when the forward pass or the
//! sampler fails for the batch, each sequence is run (or its row sampled) alone, and only
//! those that fail alone end, with [`FinishReason::Error`]; the others go on with the
//! outputs they would have had anyway (sampling is a pure function of a row). A device
//! error belongs to no sequence: it is an engine-level fault, as is a panic inside a step
//! ([`crate::spawn`] catches it). A fault ends every request with an error and is recorded
//! once in the engine's [`Health`], which handles report and refuse new work by.

mod ahead;
mod build;
mod draw;
mod isolate;

use std::sync::Arc;
use std::time::Instant;

use met_cache::KvCache;
use met_kernels::{GpuBackend, Tensor};
use met_model_layers::{Model, ModelError};
use met_telemetry::{Metrics, StepStats};

use self::ahead::{InFlight, Next};
use self::draw::Draws;
use crate::health::Health;
use crate::request::{EngineLimits, EngineRequest, FinishReason, RequestShared, RequestStream, TokenEvent};
use crate::scheduler::{EntryResult, Plan, Scheduler};
use crate::sequence::Sequence;
use crate::{EngineError, RequestId, SubmitError};

/// A step's logits, or why its forward pass failed.
type Logits = Result<Tensor, ModelError>;

/// A step's result for each of its entries, or the engine-level fault that ended it.
type Results = Result<Vec<EntryResult>, EngineError>;

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

impl Engine {
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

    /// Runs one step: schedule, forward, catch up with the step in flight, sample,
    /// postprocess. A phase that leaves the next nothing to do ends the step: nothing was
    /// scheduled, a fault, or draws left in flight, which the next call postprocesses after
    /// queueing the step that follows (see the module's docs). A sequence that fails ends
    /// alone; an engine-level fault ends every request (see [`Engine::fault`]).
    pub fn step(&mut self) {
        let start = Instant::now();
        let mut counts = StepStats::default();
        let drawn = self
            .schedule(&mut counts)
            .map(|next| self.forward(next, &mut counts))
            .and_then(|(next, logits)| self.catch_up(next, logits, &mut counts))
            .and_then(|(plan, logits)| self.sample(plan, logits, &mut counts));
        if let Some((plan, results)) = drawn {
            self.postprocess(plan, results, &mut counts);
        }
        self.record(counts, start);
    }

    /// The step to run: planned ahead of the step in flight when only its tokens could
    /// change the plan; otherwise, that step resolved, planned with every token known.
    /// `None` when there is nothing to run, or after a fault.
    fn schedule(&mut self, counts: &mut StepStats) -> Option<Next> {
        if let Some(prev) = self.in_flight.take() {
            if let Some((plan, fed)) = self.plan_ahead(&prev, counts) {
                return Some(Next::Ahead { plan, prev, fed });
            }
            self.resolve(prev, counts);
        }
        if self.fault().is_some() {
            return None;
        }
        let begun = Instant::now();
        self.scheduler.reap();
        let plan = self.scheduler.schedule(&*self.kv, &*self.model, counts);
        counts.phases.schedule += begun.elapsed();
        self.unless_empty(plan).map(Next::Now)
    }

    /// Queues the forward pass of `next`: a step planned now with the masks of its
    /// constrained sequences computed meanwhile, one planned ahead with its ids read from
    /// the draws of the step in flight.
    fn forward(&mut self, next: Next, counts: &mut StepStats) -> (Next, Logits) {
        let begun = Instant::now();
        let logits = match &next {
            Next::Now(plan) => self.forward_and_mask(plan),
            Next::Ahead { plan, prev, fed } => {
                counts.ahead = true;
                counts.batch_tokens = plan.batch.num_tokens();
                self.model.forward_fed(&plan.batch, &prev.draws.tokens, fed, &mut *self.kv)
            }
        };
        counts.phases.forward += begun.elapsed();
        (next, logits)
    }

    /// For a step planned ahead, resolves the step in flight now that this one is queued,
    /// and fits the plan to what its tokens did ([`Self::resolve_behind`]). `None` when no
    /// entry is left to sample, or after a fault.
    fn catch_up(&mut self, next: Next, logits: Logits, counts: &mut StepStats) -> Option<(Plan, Logits)> {
        match next {
            Next::Now(plan) => Some((plan, logits)),
            Next::Ahead { plan, prev, .. } => {
                let plan = self.resolve_behind(prev, plan, logits.is_ok(), counts)?;
                Some((plan, logits))
            }
        }
    }

    /// Draws `plan`'s tokens from `logits`: left in flight on the device when scheduling
    /// runs ahead (`None`), else every entry's result. When the forward pass or the
    /// draws fail for the batch, the sequences that fail alone are found.
    fn sample(&mut self, plan: Plan, logits: Logits, counts: &mut StepStats) -> Option<(Plan, Results)> {
        let logits = match logits {
            Ok(logits) => logits,
            Err(e) => {
                let results = self.run_alone(e.into(), &plan);
                return Some((plan, results));
            }
        };
        let begun = Instant::now();
        let draws = self.draw(&logits, &plan.entries);
        counts.phases.sample += begun.elapsed();
        match draws {
            Draws::Later(draws) => {
                self.in_flight = Some(InFlight { plan, logits, draws });
                None
            }
            Draws::Now(results) => Some((plan, results)),
        }
    }

    /// Hands a step's results to the scheduler, or ends every request on a fault.
    fn postprocess(&mut self, plan: Plan, results: Results, counts: &mut StepStats) {
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

    /// `plan`, unless it has no entries (then taken back for reuse).
    fn unless_empty(&mut self, plan: Plan) -> Option<Plan> {
        if plan.entries.is_empty() {
            self.scheduler.recycle(plan);
            return None;
        }
        Some(plan)
    }

    fn record(&mut self, mut stats: StepStats, start: Instant) {
        stats.duration = start.elapsed();
        stats.waiting = self.scheduler.num_waiting();
        stats.running = self.scheduler.num_running();
        stats.kv_blocks_used = self.kv.num_blocks() - self.kv.num_free_blocks();
        stats.state = self.kv.state_usage().map(|u| (u.sequences_held, u.snapshots_cached));
        // One line a step for whoever asks (`MET_LOG=met_scheduler=debug`): what the step
        // held and where its time went, to read a slow step off a live server.
        tracing::debug!(
            "step {:.2} ms: {} tokens ({} prompt, {} from the prefix cache), {} sampled, {} preempted, \
             {} running, {} waiting, schedule {:.2} / forward {:.2} / sample {:.2} / postprocess {:.2} ms{}",
            ms(stats.duration),
            stats.batch_tokens,
            stats.prompt_tokens,
            stats.prefix_cache_hit_tokens,
            stats.generated_tokens,
            stats.preemptions,
            stats.running,
            stats.waiting,
            ms(stats.phases.schedule),
            ms(stats.phases.forward),
            ms(stats.phases.sample),
            ms(stats.phases.postprocess),
            if stats.ahead { ", ahead" } else { "" },
        );
        if let Some(times) = self.backend.kernel_times() {
            tracing::info!("step kernel times: {times}");
        }
        self.metrics.step(&stats);
        self.last_step = stats;
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

/// Milliseconds of `d`, for the step log.
fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
