//! From logits to draws: the constrained rows masked, the sampler's rows built, and the
//! tokens drawn at once or left on the device for the next step to read.
//!
//! **Invariant:** masks depend only on tokens already sampled, so a step planned with every
//! token known computes them on a thread of their own while its forward pass runs; the
//! sampler's rows and the draws handed back follow the order of the plan's sampling
//! entries (see the scheduler's `sampling.rs`).

use met_kernels::{DType, HostTensor, LaterSample, SampleRow, Sampled, Tensor};
use met_model_layers::ModelError;

use super::{Engine, Results};
use crate::EngineError;
use crate::scheduler::{EntryResult, Plan, Scheduled};

/// A step's draws: read now, or still on the device.
pub(super) enum Draws {
    /// Left on the device (asynchronous scheduling); the next step reads them.
    Later(LaterSample),
    /// Each entry's result.
    Now(Results),
}

impl Engine {
    /// The forward pass of `plan`, with the masks of its constrained sequences computed
    /// meanwhile on a thread of their own (the masks depend only on tokens already sampled).
    pub(super) fn forward_and_mask(&mut self, plan: &Plan) -> Result<Tensor, ModelError> {
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

    /// Draws the tokens of `entries` from `logits`: left on the device when scheduling
    /// runs ahead, unless that fails, and else sampled now.
    pub(super) fn draw(&self, logits: &Tensor, entries: &[Scheduled]) -> Draws {
        if !self.ahead {
            return Draws::Now(self.sample_now(logits, entries));
        }
        match self.sample_later(logits, entries) {
            Ok(draws) => Draws::Later(draws),
            Err(e) => Draws::Now(self.resample(e, logits, entries)),
        }
    }

    /// [`Self::sample_now`]'s draws left on the device ([`met_kernels::GpuBackend::sample_later`]).
    fn sample_later(&self, logits: &Tensor, entries: &[Scheduled]) -> Result<LaterSample, EngineError> {
        self.with_rows(logits, entries, |logits, rows| Ok(self.backend.sample_later(logits, rows)?))
    }

    /// Runs `draw` over the sampler rows of `entries`, on `logits` with the constrained
    /// rows masked (then holding only the sampled rows, in order).
    pub(super) fn with_rows<T>(
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

    /// One result per entry from the draws of its rows, in order.
    pub(super) fn entry_results(
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
}
