//! What the sampler needs of a plan: one row per logits row of each sampling entry, and the
//! grammar masks of constrained sequences.
//!
//! **Invariants:** the sampler's rows, the masks' rows and the results handed back all
//! follow one order: the sampling entries of the plan in order, each with one row, or one
//! per draft token more. A draft's row `j` sees the output extended by the draft's first
//! `j` tokens at step `generated + j`, as plain decoding would have sampled it. A mask is
//! computed only from tokens already sampled, so it may be computed while the model runs;
//! a mask that could not be computed allows nothing and fails its entry ([`Scheduler::mask_error`]).

use met_kernels::SampleRow;

use super::{Scheduled, Scheduler};
use crate::constraint::{Constrained, mask_words};

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
