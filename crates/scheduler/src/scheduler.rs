//! The scheduler: a state machine over waiting and running sequences that turns each
//! engine step into one mixed batch.
//!
//! A step first serves running sequences in admission order (a decode row, or the next
//! chunk of a prompt being prefilled), then admits waiting sequences in the policy's order
//! while the token budget (`max_batch_tokens`), the sequence budget (`max_num_seqs`) and
//! the KV cache allow. A running sequence that cannot get a block preempts the policy's
//! victim among itself and the sequences after it, by recompute: the victim drops its
//! blocks and waits, and on readmission recomputes its tokens (reusing whatever the prefix
//! cache still holds). The first running sequence can always preempt every other, so the
//! engine never deadlocks; one that cannot fit even alone ends with `Length`. A sequence the
//! model or sampler failed on ends its whole request (every continuation) with `Error`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use met_cache::{KvCache, SequenceBlocks};
use met_config::EngineConfig;
use met_kernels::{SampleRow, Sampled};
use met_model_layers::{ForwardBatch, LogitRows, Model};
use met_speculative::TargetView;
use met_telemetry::{FinishLabel, Metrics, StepStats};

use crate::constraint::{Constrained, mask_words};
use crate::policy::SchedulingPolicy;
use crate::request::{FinishReason, GeneratedToken, RequestId};
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
    pub(crate) fn recycle(&mut self, plan: Plan) {
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
        let mut blocks = kv.new_sequence();
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

/// What the sampler needs besides the plan: per logits row, the tokens it may not draw,
/// and the output of each drafted sequence extended by its draft.
#[derive(Debug, Default)]
pub(crate) struct SampleInputs {
    banned: Vec<Vec<u32>>,
    drafted: Vec<Vec<u32>>,
}

impl Scheduler {
    /// What the sampler needs for the logits rows of `entries` among `vocab` tokens: each
    /// row's banned tokens (end tokens before `min_tokens`, counted as if the draft's
    /// tokens before the row had been generated) and each draft's extended output.
    pub(crate) fn sample_inputs(&self, entries: &[Scheduled], vocab: usize) -> SampleInputs {
        let mut inputs = SampleInputs::default();
        for e in entries.iter().filter(|e| e.sample) {
            let s = &self.running[e.seq];
            let generated = s.output().len();
            inputs.banned.extend((0..=e.draft).map(|j| s.request().stop.banned(generated + j, vocab)));
            if e.draft > 0 {
                inputs.drafted.push([s.output(), &s.draft.tokens()[..e.draft]].concat());
            }
        }
        inputs
    }

    /// The sampler's row for each logits row of `entries`, in order: the entry's own logits
    /// rows, or with `compact` (logits that hold only the sampled rows, in order) row `r`
    /// reads logits row `r`. A draft's row verifies the draft's token against its
    /// distribution when the proposer gave one.
    pub(crate) fn sample_rows<'a>(
        &'a self,
        entries: &[Scheduled],
        inputs: &'a SampleInputs,
        compact: bool,
    ) -> Vec<SampleRow<'a>> {
        let mut rows = Vec::with_capacity(inputs.banned.len());
        let mut drafted = inputs.drafted.iter();
        for e in entries.iter().filter(|e| e.sample) {
            let s = &self.running[e.seq];
            let generated = s.output().len();
            let output = if e.draft > 0 { drafted.next().expect("one per draft") } else { s.output() };
            for j in 0..=e.draft {
                let row = rows.len();
                rows.push(SampleRow {
                    logits_row: if compact { row } else { e.logits_row + j },
                    params: &s.request().sampling,
                    prompt: s.prompt(),
                    output: &output[..generated + j],
                    seed: s.seed(),
                    step: (generated + j) as u64,
                    banned: &inputs.banned[row],
                    draft: s.draft.token(j),
                });
            }
        }
        rows
    }

    /// Whether a sequence that samples in `entries` has a constraint.
    pub(crate) fn constrains(&self, entries: &[Scheduled]) -> bool {
        entries.iter().any(|e| e.sample && self.running[e.seq].constraint.is_some())
    }

    /// Computes the mask of every constrained sequence that samples in `entries`, over
    /// `vocab` tokens, spread over a few threads of their own (each state is its own). Not
    /// on rayon: the engine loop is itself a job of the rayon pool and waits for these masks,
    /// so where no other worker is free (one core, or several engines in one process) a
    /// rayon job of theirs would never run.
    pub(crate) fn compute_masks(&mut self, entries: &[Scheduled], vocab: usize) {
        const MASK_THREADS: usize = 8;
        let mut samples = vec![false; self.running.len()];
        entries.iter().filter(|e| e.sample).for_each(|e| samples[e.seq] = true);
        let mut states: Vec<&mut Constrained> = (self.running.iter_mut().zip(samples))
            .filter(|(_, sampled)| *sampled)
            .filter_map(|(r, _)| r.seq.constraint.as_mut())
            .collect();
        let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(MASK_THREADS);
        if states.len() < 2 || threads < 2 {
            states.into_iter().for_each(|c| c.compute(vocab));
            return;
        }
        let per_thread = states.len().div_ceil(threads);
        std::thread::scope(|s| {
            for chunk in states.chunks_mut(per_thread) {
                s.spawn(move || chunk.iter_mut().for_each(|c| c.compute(vocab)));
            }
        });
    }

    /// For the sampler's rows of `entries` (as [`Self::sample_rows`] orders them), the
    /// logits row each reads and its mask over `vocab` tokens, concatenated: the computed
    /// mask of a constrained sequence, every token for the others. `None` when no row is
    /// constrained.
    pub(crate) fn logit_masks(&self, entries: &[Scheduled], vocab: usize) -> Option<(Vec<u32>, Vec<u32>)> {
        if !self.constrains(entries) {
            return None;
        }
        let words = mask_words(vocab);
        let (mut rows, mut masks) = (Vec::new(), Vec::new());
        for e in entries.iter().filter(|e| e.sample) {
            for j in 0..e.samples() {
                rows.push((e.logits_row + j) as u32);
                match &self.running[e.seq].constraint {
                    Some(c) if c.mask.len() == words => masks.extend_from_slice(&c.mask),
                    // A failed mask allows nothing; its entry fails (`mask_error`).
                    Some(_) => masks.resize(masks.len() + words, 0),
                    None => masks.resize(masks.len() + words, u32::MAX),
                }
            }
        }
        Some((rows, masks))
    }

    /// Why entry `e`'s mask could not be computed this step, if it could not.
    pub(crate) fn mask_error(&self, e: &Scheduled) -> Option<String> {
        let c = self.running[e.seq].constraint.as_ref()?;
        c.error.as_ref().map(|msg| format!("structured output: {msg}"))
    }
}

impl Scheduler {
    /// Applies a step's results, one per entry: advances computed tokens, registers full
    /// blocks in the prefix cache, appends sampled tokens, sends events and retires finished
    /// sequences, then ends the requests of failed entries.
    ///
    /// A drafted entry keeps its samples while they agree with the draft, plus the first
    /// that does not; the K/V of the rest is dropped with the blocks past the sequence's
    /// computed tokens. `counts` gets the tokens generated and the drafts' outcomes.
    pub(crate) fn postprocess(
        &mut self,
        plan: &Plan,
        results: Vec<EntryResult>,
        kv: &dyn KvCache,
        counts: &mut StepStats,
    ) {
        // One clock read per step: every token of a step is sampled at the same time.
        let now = Instant::now();
        let mut failed: Vec<(RequestId, String)> = Vec::new();
        for (e, result) in plan.entries.iter().zip(results) {
            match result {
                EntryResult::Failed(msg) => failed.push((self.running[e.seq].request().id, msg)),
                EntryResult::Computed => self.apply(e, None, kv, now, counts),
                EntryResult::Sampled(samples) => self.apply(e, Some(samples), kv, now, counts),
            }
        }
        let done: Vec<Sequence> = self.running.extract_if(.., |s| s.has_ended()).map(Running::release).collect();
        for seq in done {
            self.drain(seq);
        }
        for (id, msg) in failed {
            self.fail_request(id, &msg);
        }
    }

    /// Applies entry `e` to its sequence: its rows are computed, its `samples` (sampled at
    /// `now`) appended while they agree with its draft, and its full blocks committed.
    fn apply(
        &mut self,
        e: &Scheduled,
        samples: Option<Vec<Sampled>>,
        kv: &dyn KvCache,
        now: Instant,
        counts: &mut StepStats,
    ) {
        let Running { seq, blocks } = &mut self.running[e.seq];
        let draft = std::mem::take(&mut seq.draft);
        seq.mark_computed(e.len - e.draft);
        if let Some(samples) = samples {
            let accepted = accept(seq, samples, &draft.tokens()[..e.draft], now, &self.metrics, self.max_context);
            counts.generated_tokens += accepted + 1;
            if e.draft > 0 {
                counts.drafts += 1;
                counts.draft_tokens += e.draft;
                counts.accepted_tokens += accepted;
                blocks.truncate(seq.computed());
                if let Some(spec) = &mut self.speculation {
                    spec.observe(seq, e.draft, accepted);
                }
            }
        }
        kv.commit(blocks, seq.tokens(), seq.computed());
        if seq.index() == 0 && seq.prompt_computed() {
            seq.request().prompt_ready.store(true, Ordering::Relaxed);
        }
        // Keep the allocations for the next draft.
        seq.draft = draft;
        seq.draft.clear();
    }

    /// Ends every unfinished continuation of request `id` with `Error(msg)`: a request whose
    /// sequence failed has failed (and its siblings may be waiting for that one's prompt).
    fn fail_request(&mut self, id: RequestId, msg: &str) {
        let running = self.running.extract_if(.., |r| r.request().id == id).map(Running::release);
        let seqs: Vec<Sequence> = running.chain(self.waiting.extract_if(.., |s| s.request().id == id)).collect();
        for seq in seqs {
            self.retire(seq, FinishReason::Error(msg.to_owned()));
        }
    }

    /// Ends every running and waiting sequence with `reason` (after an engine-level fault).
    pub(crate) fn fail_all(&mut self, reason: &FinishReason) {
        let running = std::mem::take(&mut self.running).into_iter().map(Running::release);
        let seqs: Vec<Sequence> = running.chain(std::mem::take(&mut self.waiting)).collect();
        for seq in seqs {
            self.retire(seq, reason.clone());
        }
    }

    /// Sends a sequence's last event, without a token, and drops it.
    fn retire(&mut self, mut seq: Sequence, reason: FinishReason) {
        seq.end(None, reason);
        self.drain(seq);
    }

    /// Records a sequence that ended in the metrics, and keeps it (its blocks already
    /// released) only until its events are delivered.
    fn drain(&mut self, mut seq: Sequence) {
        if let Some(spec) = &mut self.speculation {
            spec.forget(&seq);
        }
        if let Some(reason) = seq.take_ended() {
            self.metrics.finished(reason, seq.stats());
        }
        if seq.paused() {
            self.draining.push(seq);
        }
    }
}

/// Appends `samples` to `seq` one at a time, each checked against the stop rules and sent
/// as its own event, while they agree with `draft`; stops after the first that does not (the
/// target's own token) or that ends the sequence. Each agreeing draft token becomes a
/// computed token, its K/V written by its verification row. Returns the draft tokens kept.
fn accept(
    seq: &mut Sequence,
    samples: Vec<Sampled>,
    draft: &[u32],
    now: Instant,
    metrics: &Metrics,
    max_context: usize,
) -> usize {
    let mut accepted = 0;
    for (j, s) in samples.into_iter().enumerate() {
        let agrees = draft.get(j) == Some(&s.token);
        if append(seq, s, now, metrics, max_context) || !agrees {
            break;
        }
        seq.mark_computed(1);
        accepted += 1;
    }
    accepted
}

/// Appends sampled token `s` to `seq` and sends its event; returns whether it ended `seq`.
fn append(seq: &mut Sequence, s: Sampled, now: Instant, metrics: &Metrics, max_context: usize) -> bool {
    match seq.push_token(s.token, now) {
        None => metrics.first_token(now - seq.request().arrived),
        Some(last) => metrics.inter_token(now - last),
    }
    let finish = stop_reason(seq, s.token, max_context);
    let token = GeneratedToken { id: s.token, logprob: s.logprob, top_logprobs: s.top_logprobs };
    match finish {
        Some(reason) => seq.end(Some(token), reason),
        None => seq.send_token(token),
    }
    seq.has_ended()
}

/// How `seq` ends with its just appended `token`, if it does: a stop token, its constraint
/// complete or refusing the token, or its length.
fn stop_reason(seq: &mut Sequence, token: u32, max_context: usize) -> Option<FinishReason> {
    let generated = seq.output().len();
    let stop = &seq.request().stop;
    if stop.is_stop(token, generated) {
        return Some(FinishReason::Stop);
    }
    if let Some(reason) = seq.constraint.as_mut().and_then(|c| advance(c, token)) {
        return Some(reason);
    }
    let stop = &seq.request().stop;
    (generated >= stop.max_new_tokens || seq.tokens().len() >= max_context).then_some(FinishReason::Length)
}

/// Moves a sequence's constraint past `token`: how the sequence ends when the constraint
/// is complete (`Stop`) or refuses the token (`Error`).
fn advance(c: &mut Constrained, token: u32) -> Option<FinishReason> {
    match c.state.accept(token) {
        Err(msg) => Some(FinishReason::Error(format!("structured output: {msg}"))),
        Ok(()) => c.state.is_complete().then_some(FinishReason::Stop),
    }
}
