//! A step's plan: running sequences first, then admission, preempting when blocks run out.
//!
//! A step first serves running sequences in admission order (a decode row, with the
//! sequence's draft when speculation proposes one, or the next chunk of a prompt being
//! prefilled), then admits waiting sequences in the policy's order while the token budget
//! (`max_batch_tokens`), the sequence budget (`max_num_seqs`) and the KV cache allow. A
//! running sequence that cannot get a block preempts the policy's victim among itself and
//! the sequences after it, by recompute: the victim drops its blocks and waits, and on
//! readmission recomputes its tokens (reusing whatever the prefix cache still holds).
//!
//! **Invariants:** every planned entry's blocks have room for its rows. The first running
//! sequence can always preempt every other, so the engine never deadlocks; one that cannot
//! fit even alone ends with `Length`. A draft never preempts: it is only worth its rows when
//! they cost nothing else. Admission is head-of-line: a waiting sequence that does not fit
//! holds back the ones after it.

use met_cache::{KvCache, SequenceBlocks};
use met_model_layers::{ForwardBatch, LogitRows, Model};
use met_speculative::TargetView;
use met_telemetry::StepStats;

use super::{Plan, Scheduled, Scheduler};
use crate::request::FinishReason;
use crate::sequence::{Running, Sequence};

impl Scheduler {
    /// Chooses this step's work; a proposer that drafts with the target gets `model`.
    pub(crate) fn schedule(&mut self, kv: &dyn KvCache, model: &dyn Model, counts: &mut StepStats) -> Plan {
        self.tick += 1;
        let mut plan = self.empty_plan();
        let mut budget = self.config.max_batch_tokens;
        self.schedule_running(kv, model, &mut plan, &mut budget, counts);
        self.admit_waiting(kv, &mut plan, &mut budget, counts);
        counts.batch_tokens = plan.batch.num_tokens();
        counts.prompt_tokens = plan
            .entries
            .iter()
            .map(|e| {
                let s = &self.running[e.seq];
                // Rows before the last sampled token are prompt (or recomputed) tokens.
                s.request().prompt_len.saturating_sub(s.computed()).min(e.len)
            })
            .sum();
        plan
    }

    fn schedule_running(
        &mut self,
        kv: &dyn KvCache,
        model: &dyn Model,
        plan: &mut Plan,
        budget: &mut usize,
        counts: &mut StepStats,
    ) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 && plan.entries.len() < self.config.max_num_seqs {
            if self.running[i].paused() {
                i += 1;
                continue;
            }
            let n = self.running[i].to_compute().min(*budget).min(self.chunk_limit());
            let draft = self.reserve_draft(kv, model, i, *budget - n);
            if draft == 0 && !self.make_room(kv, i, n, counts) {
                continue; // running[i] was preempted or finished; the next one moved to i.
            }
            self.push(plan, i, n + draft, draft);
            *budget -= n + draft;
            i += 1;
        }
    }

    /// Proposes up to `room` tokens for `running[i]` to verify after its decode row and
    /// reserves their slots with the row's; returns the draft's length, 0 (and no
    /// reservation) without a proposal or when the blocks are not free. A proposer that
    /// drafts in the target's cache gets the slots of a full draft first, and what it
    /// leaves unused goes back.
    fn reserve_draft(&mut self, kv: &dyn KvCache, model: &dyn Model, i: usize, room: usize) -> usize {
        let running = self.running.len();
        let Some(spec) = self.speculation.as_mut().filter(|s| s.active(running)) else { return 0 };
        let Running { seq, blocks } = &mut self.running[i];
        if seq.constraint.is_some() {
            return 0; // A constraint's state must see each token once, in order.
        }
        let generated = seq.output().len();
        // Every accepted token and the target's own one must fit the length and context.
        let room = room
            .min(seq.request().stop.max_new_tokens.saturating_sub(generated + 1))
            .min(self.max_context.saturating_sub(seq.tokens().len()));
        let target = if spec.uses_target() && seq.to_compute() == 1 && spec.room(seq, room) > 0 {
            if kv.reserve(blocks, seq.tokens().len() + spec.room(seq, room)).is_err() {
                return 0;
            }
            Some(TargetView { model, kv, blocks })
        } else {
            None
        };
        let reserved = target.is_some();
        let draft = spec.draft(seq, room, target);
        if reserved {
            // The decode row's own slot stays reserved whatever was proposed.
            blocks.truncate(seq.tokens().len() + draft);
        } else if draft > 0 && kv.reserve(blocks, seq.tokens().len() + draft).is_err() {
            seq.draft.clear();
            return 0;
        }
        if draft > 0 && !kv.allow_rollback(blocks, seq.computed(), seq.tokens().len() + draft) {
            seq.draft.clear();
            blocks.truncate(seq.tokens().len());
            return 0;
        }
        draft
    }

    /// Reserves blocks for `n` more tokens of `running[i]`, preempting victims among
    /// `running[i..]` until it fits. Returns false when `running[i]` itself left.
    fn make_room(&mut self, kv: &dyn KvCache, i: usize, n: usize, counts: &mut StepStats) -> bool {
        loop {
            let Running { seq, blocks } = &mut self.running[i];
            if kv.reserve(blocks, seq.computed() + n).is_ok() {
                return true;
            }
            let infos: Vec<_> = self.running[i..].iter().map(|r| r.info()).collect();
            let victim = i + self.policy.victim(&infos);
            if victim == i && self.running[..i].iter().all(|r| r.blocks.block_ids().is_empty()) {
                // Nothing else holds blocks: the sequence cannot fit even alone.
                let seq = self.running.remove(i).release();
                self.retire(seq, FinishReason::Length);
                return false;
            }
            self.preempt(victim);
            counts.preemptions += 1;
            if victim == i {
                return false;
            }
        }
    }

    /// Sends `running[i]` back to waiting without its blocks, to recompute its tokens.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i).release();
        if let Some(spec) = &mut self.speculation {
            spec.forget(&seq);
        }
        seq.recompute();
        self.waiting.push(seq);
    }

    fn admit_waiting(&mut self, kv: &dyn KvCache, plan: &mut Plan, budget: &mut usize, counts: &mut StepStats) {
        let policy = &self.policy;
        self.waiting.sort_by(|a, b| policy.admission_order(&a.info(), &b.info()));
        let mut j = 0;
        while j < self.waiting.len() && *budget > 0 && plan.entries.len() < self.config.max_num_seqs {
            let seq = &self.waiting[j];
            // A continuation other than the first waits until the first computed the
            // prompt, so it can share those blocks.
            if seq.paused() || (seq.index() > 0 && !seq.request().prompt_ready()) {
                j += 1;
                continue;
            }
            if seq.tokens().len().div_ceil(kv.block_size()) > kv.num_blocks() {
                let seq = self.waiting.remove(j);
                self.retire(seq, FinishReason::Length);
                continue;
            }
            let (blocks, hit) = self.cached_prefix(kv, seq);
            let n = (seq.tokens().len() - hit).min(*budget).min(self.chunk_limit());
            let Some(blocks) = reserved(kv, blocks, hit + n) else {
                break; // Head-of-line: later sequences wait behind this one.
            };
            let mut seq = self.waiting.remove(j);
            counts.prefix_cache_hit_tokens += hit;
            seq.admit(hit, self.tick);
            self.running.push(Running { seq, blocks });
            self.push(plan, self.running.len() - 1, n, 0);
            *budget -= n;
        }
    }

    /// New blocks for waiting `seq` holding what the cache already has of its tokens (its
    /// first continuation's prompt blocks, or a cached prefix), and how many tokens that is.
    /// The last token is always left to compute, for its logits.
    fn cached_prefix(&self, kv: &dyn KvCache, seq: &Sequence) -> (SequenceBlocks, usize) {
        let limit = seq.tokens().len() - 1;
        if let Some(sibling) = self.sibling_blocks(seq) {
            let blocks = kv.fork(sibling, limit.min(seq.request().prompt_len));
            let hit = blocks.capacity();
            return (blocks, hit);
        }
        let mut blocks = kv.new_sequence().in_namespace(seq.request().cache_namespace());
        let hit = kv.match_prefix(&mut blocks, seq.tokens(), limit);
        (blocks, hit)
    }

    fn chunk_limit(&self) -> usize {
        self.config.max_prefill_chunk.unwrap_or(usize::MAX).max(1)
    }

    /// The blocks of the request's first continuation, once its prompt is computed.
    fn sibling_blocks(&self, seq: &Sequence) -> Option<&SequenceBlocks> {
        if seq.index() == 0 {
            return None;
        }
        self.running
            .iter()
            .find(|s| s.request().id == seq.request().id && s.index() == 0 && s.prompt_computed())
            .map(|s| &s.blocks)
    }

    /// Plans `n` rows of `running[i]`, the last `draft` of them its proposed tokens.
    fn push(&self, plan: &mut Plan, i: usize, n: usize, draft: usize) {
        let sample = self.running[i].computed() + n - draft == self.running[i].tokens().len();
        let e = Scheduled { seq: i, len: n, sample, draft, logits_row: plan.batch.logit_rows.len() };
        self.push_to(&mut plan.batch, e);
        plan.entries.push(e);
    }

    /// Appends entry `e`'s rows to `batch`.
    fn push_to(&self, batch: &mut ForwardBatch, e: Scheduled) {
        let Running { seq, blocks } = &self.running[e.seq];
        let pending = &seq.tokens()[seq.computed()..seq.computed() + e.len - e.draft];
        if e.draft == 0 {
            let rows = if e.sample { LogitRows::Last } else { LogitRows::None };
            batch.push(pending, seq.computed(), blocks, rows);
        } else {
            let rows = [pending, &seq.draft.tokens()[..e.draft]].concat();
            batch.push(&rows, seq.computed(), blocks, LogitRows::All);
        }
        seq.request().adapt(batch);
    }

    /// A batch of entry `e` of this step's plan alone (to find which sequence failed a batch).
    pub(crate) fn batch_of(&self, e: &Scheduled) -> ForwardBatch {
        let mut batch = ForwardBatch::default();
        self.push_to(&mut batch, *e);
        batch
    }
}

/// `blocks` with room for `tokens`, or `None` (and the blocks back to the cache) when the
/// cache has too few free.
fn reserved(kv: &dyn KvCache, mut blocks: SequenceBlocks, tokens: usize) -> Option<SequenceBlocks> {
    kv.reserve(&mut blocks, tokens).ok().map(|()| blocks)
}
