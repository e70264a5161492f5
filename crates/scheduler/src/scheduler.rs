//! The scheduler: a state machine over waiting and running sequences that turns each
//! engine step into one mixed batch, and takes the step's results back.
//!
//! A sequence waits, runs (admitted, holding its KV blocks), and finishes; preemption sends
//! a running one back to waiting. Its state is the list it is in: `waiting`, `running`, or
//! `draining` (finished, its last events not delivered yet). Each responsibility has a file:
//! - [`schedule`](mod@schedule): a step's plan, running sequences first, then admission,
//!   preempting when blocks run out;
//! - [`ahead`]: the plan of a step queued before the tokens of the step in flight are read;
//! - [`sampling`]: the sampler's rows and the grammar masks of a plan;
//! - [`postprocess`]: a step's results applied: tokens appended and stop-checked, drafts
//!   accepted, events sent, finished and failed sequences retired.
//!
//! **Invariants:** a plan's entries index the running list, which changes only in
//! [`Scheduler::reap`], scheduling and postprocessing, so a plan stays valid from the
//! one to the other; a plan made ahead is pointed at the list as it is after the step
//! before it ([`Scheduler::remap`]). A sequence the model or sampler failed on ends its
//! whole request (every continuation) with `Error`.

mod ahead;
mod postprocess;
mod sampling;
mod schedule;

use std::sync::Arc;

use met_config::EngineConfig;
use met_kernels::Sampled;
use met_model_layers::ForwardBatch;
use met_telemetry::{FinishLabel, Metrics};

use crate::policy::SchedulingPolicy;
use crate::sequence::{Running, Sequence};
use crate::speculate::Speculation;

/// One sequence's part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scheduled {
    /// Index into the running list.
    pub(crate) seq: usize,
    /// Rows computed this step, `draft` included.
    pub(crate) len: usize,
    /// Whether this step completes the sequence's pending tokens and so samples a token.
    pub(crate) sample: bool,
    /// Proposed tokens verified after the decode row (the sequence's draft); each adds a
    /// logits row and a sample.
    pub(crate) draft: usize,
    /// The step's logits row of its first sample.
    pub(crate) logits_row: usize,
}

impl Scheduled {
    /// Logits rows, and samples, of this entry.
    pub(crate) fn samples(&self) -> usize {
        if self.sample { 1 + self.draft } else { 0 }
    }
}

/// What one step runs.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub(crate) batch: ForwardBatch,
    pub(crate) entries: Vec<Scheduled>,
}

/// What a step did for one of its entries.
#[derive(Debug)]
pub(crate) enum EntryResult {
    /// Its tokens were computed; it samples nothing this step.
    Computed,
    /// Its tokens were computed and these tokens sampled, one per logits row: the next
    /// token, then with a draft of `k` the target's token after each of its prefixes.
    Sampled(Vec<Sampled>),
    /// The model or the sampler failed on this sequence alone; the message says how.
    Failed(String),
}

pub(crate) struct Scheduler {
    config: EngineConfig,
    max_context: usize,
    policy: Box<dyn SchedulingPolicy>,
    waiting: Vec<Sequence>,
    running: Vec<Running>,
    /// Finished sequences whose last events are not delivered yet (no blocks held).
    draining: Vec<Sequence>,
    tick: u64,
    metrics: Arc<Metrics>,
    /// The last step's plan, cleared and reused so steady-state steps do not allocate.
    spare: Plan,
    /// Speculative decoding, when on.
    speculation: Option<Speculation>,
}

impl Scheduler {
    pub(crate) fn new(
        config: EngineConfig,
        max_context: usize,
        policy: Box<dyn SchedulingPolicy>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            config,
            max_context,
            policy,
            waiting: Vec::new(),
            running: Vec::new(),
            draining: Vec::new(),
            tick: 0,
            metrics,
            spare: Plan::default(),
            speculation: None,
        }
    }

    /// Admits and preempts as `policy` says from now on.
    pub(crate) fn set_policy(&mut self, policy: Box<dyn SchedulingPolicy>) {
        self.policy = policy;
    }

    /// Verifies proposals of `speculation` from now on.
    pub(crate) fn speculate(&mut self, speculation: Speculation) {
        self.speculation = Some(speculation);
    }

    pub(crate) fn add(&mut self, seq: Sequence) {
        self.waiting.push(seq);
    }

    /// Whether any sequence is waiting, running or still delivering events.
    pub(crate) fn has_work(&self) -> bool {
        !(self.waiting.is_empty() && self.running.is_empty() && self.draining.is_empty())
    }

    /// Delivers queued events and drops the sequences of cancelled requests.
    pub(crate) fn reap(&mut self) {
        let metrics = &self.metrics;
        self.waiting.iter_mut().for_each(Sequence::flush);
        self.running.iter_mut().for_each(|r| r.flush());
        for seq in self.waiting.extract_if(.., |s| s.request().cancelled()) {
            metrics.finished(FinishLabel::Cancelled, seq.stats());
        }
        for run in self.running.extract_if(.., |r| r.request().cancelled()) {
            metrics.finished(FinishLabel::Cancelled, run.stats());
            if let Some(spec) = &mut self.speculation {
                spec.forget(&run);
            }
        }
        self.draining.iter_mut().for_each(Sequence::flush);
        self.draining.retain(|s| s.paused() && !s.request().cancelled());
    }

    /// An empty plan, in the last one's allocations.
    fn empty_plan(&mut self) -> Plan {
        let mut plan = std::mem::take(&mut self.spare);
        plan.batch.clear();
        plan.entries.clear();
        plan
    }

    /// Takes back a finished step's plan for reuse.
    pub(crate) fn recycle(&mut self, mut plan: Plan) {
        // The plan keeps its allocations but not its adapters, so an unloaded adapter's
        // weights go with its last request rather than at the next step.
        plan.batch.adapter_runs.clear();
        self.spare = plan;
    }

    pub(crate) fn held_blocks(&self) -> usize {
        let mut ids: Vec<u32> = self.running.iter().flat_map(|r| r.blocks.block_ids().iter().map(|b| b.0)).collect();
        ids.sort_unstable();
        ids.dedup();
        ids.len()
    }

    pub(crate) fn stream_capacity(&self) -> usize {
        self.config.stream_capacity
    }

    pub(crate) fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub(crate) fn num_running(&self) -> usize {
        self.running.len()
    }
}
