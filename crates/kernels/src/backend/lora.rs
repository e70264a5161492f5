//! Operands of the LoRA op: low-rank adapter deltas added into a projection's output for
//! the rows of a mixed batch that run through an adapter.
//!
//! An adapter replaces a projection `W` by `W + scale · B·A` for its rows only. Rather
//! than merging weights (one copy of `W` per adapter), the delta is computed beside the
//! base product: the rows of each adapter are a contiguous run of the batch (a
//! sequence's rows are contiguous, and runs of one adapter may be several), shrunk to the
//! adapter's rank by `A`, expanded back by `B`, scaled and added into the output columns
//! the projection gives that module (a fused q/k/v or gate/up projection holds several).
//! Rows outside every segment, the base model's, keep the base product bit for bit.

use std::ops::Range;

use crate::Tensor;

/// One adapter module applied to one run of rows ([`GpuBackend::lora_shrink_expand`]).
///
/// [`GpuBackend::lora_shrink_expand`]: crate::GpuBackend::lora_shrink_expand
#[derive(Debug, Clone)]
pub struct LoraSegment<'a> {
    /// The rows of the batch this adapter applies to.
    pub rows: Range<usize>,
    /// `[r, in]`: the shrink to rank `r` (PEFT's `lora_A.weight`).
    pub a: &'a Tensor,
    /// `[n, r]`: the expansion (PEFT's `lora_B.weight`).
    pub b: &'a Tensor,
    /// `lora_alpha / r`, or `lora_alpha / √r` for rank-stabilised adapters.
    pub scale: f32,
    /// The first of the `n` output columns the delta is added into.
    pub column: usize,
}
