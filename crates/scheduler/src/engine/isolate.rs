//! Fault isolation: one bad sequence never fails its batch.
//!
//! When the forward pass fails for a batch, each of its sequences runs alone; when the
//! sampler fails for a batch's rows, each row is sampled alone. Only the sequences that fail
//! alone end (their entry's result is [`EntryResult::Failed`]); the others keep the outputs
//! they would have had anyway, since sampling is a pure function of a row and rerunning a
//! sequence writes the same K/V at the same slots again.
//!
//! **Invariant:** a device error belongs to no sequence ([`blame`]): it is returned as the
//! engine's own, and the engine faults.

use met_kernels::{SampleRow, Tensor};

use super::{Engine, Results};
use crate::EngineError;
use crate::scheduler::{EntryResult, Plan, Scheduled};

impl Engine {
    /// Runs and samples each entry of `plan` alone, after its batch's forward pass failed
    /// with `error`: only the sequences that fail alone fail.
    pub(super) fn run_alone(&mut self, error: EngineError, plan: &Plan) -> Results {
        blame(error)?;
        let mut results = Vec::with_capacity(plan.entries.len());
        for entry in &plan.entries {
            let batch = self.scheduler.batch_of(entry);
            // Its logits are the only ones of its batch.
            let alone = Scheduled { logits_row: 0, ..*entry };
            let result = match self.model.forward(&batch, &mut *self.kv) {
                Ok(logits) => self.sample_now(&logits, &[alone])?.remove(0),
                Err(e) => EntryResult::Failed(blame(e.into())?),
            };
            results.push(result);
        }
        Ok(results)
    }

    /// Samples `entries` from `logits` again after their draws failed with `error`.
    pub(super) fn resample(&self, error: EngineError, logits: &Tensor, entries: &[Scheduled]) -> Results {
        blame(error)?;
        self.sample_now(logits, entries)
    }

    /// Samples the rows of `entries` from `logits` (each sampling entry's rows, in order:
    /// one, or one per draft token more). When the batch fails, each row is sampled alone
    /// to find the ones that fail; an entry with a failed row fails.
    pub(super) fn sample_now(&self, logits: &Tensor, entries: &[Scheduled]) -> Results {
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
