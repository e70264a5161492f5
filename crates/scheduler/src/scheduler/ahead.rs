//! The plan of a step queued ahead: made while the tokens of the step in flight are still
//! on the device (asynchronous scheduling, see the engine's docs).
//!
//! **Invariants:** a plan is made ahead only when nothing but those tokens could change it,
//! so it is the plan the scheduler would have made after them, but for the rows of
//! sequences those tokens end: every entry of the step in flight samples one token (no
//! draft), every running sequence is in it and none is paused, no waiting sequence could be
//! admitted, and each block table has room for one more token. Each row's token id is not
//! known on the host: the model reads it from the draws on the device. Once the step in
//! flight is postprocessed, the plan is pointed at the running list as it is then
//! ([`Scheduler::remap`]), and the rows of sequences that ended meanwhile are left unread.

use std::collections::HashMap;

use met_cache::KvCache;
use met_model_layers::LogitRows;

use super::{Plan, Scheduled, Scheduler};
use crate::sequence::Running;

impl Scheduler {
    /// The step after `prev`, planned while `prev`'s draws are still on the device, when
    /// nothing but those draws could change it (see the module's docs). Each sequence that
    /// `prev`'s token will not end by length gets one decode row, whose token id is element
    /// `fed[i]` of `prev`'s draws for row `i`; one that a stop token ends leaves the plan
    /// when `prev` is resolved ([`Self::remap`]). `None`: schedule after `prev`.
    pub(crate) fn continue_plan(&mut self, prev: &Plan, kv: &dyn KvCache) -> Option<(Plan, Vec<u32>)> {
        if !self.may_plan_ahead(prev) {
            return None;
        }
        let mut plan = self.empty_plan();
        let mut fed = Vec::with_capacity(prev.entries.len());
        for (row, e) in prev.entries.iter().enumerate() {
            let Running { seq, blocks } = &mut self.running[e.seq];
            // The position of `prev`'s draw, which this row computes.
            let position = seq.tokens().len();
            if seq.output().len() + 1 >= seq.request().stop.max_new_tokens || position + 1 >= self.max_context {
                continue;
            }
            if kv.reserve(blocks, position + 1).is_err() {
                self.recycle(plan);
                return None;
            }
            let logits_row = plan.batch.logit_rows.len();
            plan.batch.push(&[0], position, blocks, LogitRows::Last);
            seq.request().adapt(&mut plan.batch);
            plan.entries.push(Scheduled { seq: e.seq, len: 1, sample: true, draft: 0, logits_row });
            fed.push(row as u32);
        }
        if plan.entries.is_empty() {
            self.recycle(plan);
            return None;
        }
        self.tick += 1;
        Some((plan, fed))
    }

    /// Whether only `prev`'s draws stand between the scheduler and the plan after it.
    fn may_plan_ahead(&self, prev: &Plan) -> bool {
        let n = prev.entries.len();
        let admissible = n < self.config.max_num_seqs && self.waiting.iter().any(|s| !s.paused());
        self.speculation.is_none()
            && !admissible
            && n == self.running.len()
            && n <= self.config.max_batch_tokens
            && prev.entries.iter().all(|e| e.sample && e.draft == 0 && !self.running[e.seq].paused())
    }

    /// The sequence of each of `entries`, for [`Self::remap`].
    pub(crate) fn keys(&self, entries: &[Scheduled]) -> Vec<u64> {
        entries.iter().map(|e| self.running[e.seq].key()).collect()
    }

    /// Points `plan`'s entries, whose sequences were `keys`, at those sequences' places in
    /// the running list now, and drops the entries of sequences no longer running (ended,
    /// failed or cancelled meanwhile); the rows they computed are left unread. The batch is
    /// left as it ran.
    pub(crate) fn remap(&self, plan: &mut Plan, keys: &[u64]) {
        let now: HashMap<u64, usize> = self.running.iter().enumerate().map(|(i, r)| (r.key(), i)).collect();
        let mut keys = keys.iter();
        plan.entries.retain_mut(|e| {
            let key = keys.next().expect("one key per entry");
            now.get(key).map(|&i| e.seq = i).is_some()
        });
    }
}
