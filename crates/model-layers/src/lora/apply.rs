//! Adapters inside a forward pass: the runs of rows a batch assigns to each adapter, and
//! the one call per projection that adds their deltas.
//!
//! Rows no run names are the base model's and come out of a projection bit for bit as
//! without adapters; a run's rows get exactly their adapter's delta, computed from those
//! rows alone on the CPU, so a row's output does not depend on its batch-mates.

use std::ops::Range;

use met_kernels::{GpuBackend, LoraSegment, Tensor};

use super::{Adapter, LoraModule};
use crate::Result;

/// Consecutive rows of a batch that run through one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterRun {
    /// Rows of the flat batch.
    pub rows: Range<usize>,
    /// The adapter they run through.
    pub adapter: Adapter,
}

/// The adapters of one step as a layer sees them.
#[derive(Debug, Clone, Copy)]
pub struct LayerLora<'a> {
    runs: &'a [AdapterRun],
    layer: usize,
}

impl<'a> LayerLora<'a> {
    /// Layer `layer` of a step with `runs`.
    pub fn new(runs: &'a [AdapterRun], layer: usize) -> Self {
        Self { runs, layer }
    }

    /// No adapter on any row.
    pub fn none() -> Self {
        Self { runs: &[], layer: 0 }
    }

    /// Whether any run adapts one of `modules` in this layer.
    pub fn adapts(&self, modules: &[LoraModule]) -> bool {
        self.runs.iter().any(|r| modules.iter().any(|&m| r.adapter.pair(self.layer, m).is_some()))
    }

    /// `out [t, N]` of a projection of `x [t, in]` fused from `parts` (each module and its
    /// first output column), plus every run's deltas of those modules.
    ///
    /// # Errors
    /// On device failure.
    pub fn apply(&self, b: &dyn GpuBackend, x: &Tensor, out: Tensor, parts: &[(LoraModule, usize)]) -> Result<Tensor> {
        let segments: Vec<LoraSegment<'_>> = self
            .runs
            .iter()
            .flat_map(|run| {
                parts.iter().filter_map(move |&(module, column)| {
                    let pair = run.adapter.pair(self.layer, module)?;
                    let scale = run.adapter.scale();
                    Some(LoraSegment { rows: run.rows.clone(), a: &pair.a, b: &pair.b, scale, column })
                })
            })
            .collect();
        if segments.is_empty() {
            return Ok(out);
        }
        Ok(b.lora_shrink_expand(x, &out, &segments)?)
    }
}
