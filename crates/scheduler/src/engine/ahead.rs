//! Asynchronous scheduling: a decode step left in flight, and the step after it planned and
//! queued before its tokens are read.
//!
//! **Invariants:** at most one step is in flight, and only while scheduling runs ahead; an
//! engine-level fault drops it. A step planned ahead is queued before the step in flight is
//! resolved, and sampled only after it: its rows were planned without those tokens, so the
//! rows of sequences they ended are dropped first, and the masks of its constrained
//! sequences, which need them, are computed then.

use std::time::Instant;

use met_kernels::{LaterSample, Tensor};
use met_telemetry::StepStats;

use super::Engine;
use crate::scheduler::Plan;

/// A step queued and sampled, its draws not read yet.
pub(super) struct InFlight {
    pub(super) plan: Plan,
    /// Kept to draw row by row when the batch's draws fail.
    pub(super) logits: Tensor,
    pub(super) draws: LaterSample,
}

/// The step a call of [`Engine::step`] runs.
#[expect(clippy::large_enum_variant, reason = "one a step, moved twice: a box would allocate every step")]
pub(super) enum Next {
    /// Planned with every token known.
    Now(Plan),
    /// Planned while `prev` is in flight: its ids are element `fed[i]` of `prev`'s draws
    /// for row `i`, read on the device.
    Ahead { plan: Plan, prev: InFlight, fed: Vec<u32> },
}

impl Engine {
    /// The step after `prev`, planned without its tokens, and where its ids are among
    /// them; `None` when `prev` must be resolved first
    /// ([`crate::scheduler::Scheduler::continue_plan`] says when).
    pub(super) fn plan_ahead(&mut self, prev: &InFlight, counts: &mut StepStats) -> Option<(Plan, Vec<u32>)> {
        let begun = Instant::now();
        let next = self.scheduler.continue_plan(&prev.plan, &*self.kv);
        counts.phases.schedule = begun.elapsed();
        next
    }

    /// Resolves `prev` behind `plan`, the step queued after it, and returns `plan` without
    /// the entries of sequences that ended meanwhile, its masks computed when `masks` (its
    /// forward pass was queued); `None` when no entry is left, or after a fault.
    pub(super) fn resolve_behind(
        &mut self,
        prev: InFlight,
        mut plan: Plan,
        masks: bool,
        counts: &mut StepStats,
    ) -> Option<Plan> {
        let keys = self.scheduler.keys(&plan.entries);
        self.resolve(prev, counts);
        if self.fault().is_some() {
            self.scheduler.recycle(plan);
            return None;
        }
        self.scheduler.reap();
        self.scheduler.remap(&mut plan, &keys);
        let plan = self.unless_empty(plan)?;
        if masks && self.scheduler.constrains(&plan.entries) {
            // Their states have just taken `prev`'s tokens.
            self.scheduler.compute_masks(&plan.entries, self.model.vocab_size());
        }
        Some(plan)
    }

    /// Waits for `prev`'s draws and hands them to the scheduler.
    pub(super) fn resolve(&mut self, prev: InFlight, counts: &mut StepStats) {
        let begun = Instant::now();
        let InFlight { plan, logits, draws } = prev;
        let results = match draws.wait() {
            Ok(sampled) => Ok(self.entry_results(&plan.entries, sampled.into_iter().map(Ok))),
            // A row that cannot be drawn: draw row by row to find it.
            Err(e) => self.resample(e.into(), &logits, &plan.entries),
        };
        counts.phases.sample += begun.elapsed();
        self.postprocess(plan, results, counts);
    }
}
