//! The attention-backend seam, as a model uses it.
//!
//! Backends live in `met-kernels` ([`met_kernels::attention`]): each is a family of kernels
//! with its own step metadata, chosen at startup ([`AttentionBackendKind`]). This module only turns a
//! [`ForwardBatch`] into the backend-neutral [`StepLayout`] they prepare from.

pub use met_kernels::attention::{AttentionBackend, AttentionBackendKind, StepLayout, StepMetadata, attention_backend};

use crate::ForwardBatch;

/// The host-side layout of a batch, owned: block tables padded to the widest sequence.
#[derive(Debug, Clone)]
pub(crate) struct BatchLayout {
    pub cu_seqlens_q: Vec<u32>,
    pub seq_lens: Vec<u32>,
    pub block_tables: Vec<u32>,
    pub max_blocks: usize,
}

impl BatchLayout {
    /// `batch`'s layout, its block tables `max_blocks` wide (at least its widest).
    pub(crate) fn of(batch: &ForwardBatch, max_blocks: usize) -> Self {
        Self {
            cu_seqlens_q: batch.cu_seqlens_q(),
            seq_lens: batch.context_lens(),
            block_tables: batch.padded_block_tables(max_blocks),
            max_blocks,
        }
    }

    /// The layout with the rows' cache `slots`.
    pub(crate) fn with_slots<'a>(&'a self, slots: &'a [u32]) -> StepLayout<'a> {
        StepLayout {
            cu_seqlens_q: &self.cu_seqlens_q,
            seq_lens: &self.seq_lens,
            block_tables: &self.block_tables,
            max_blocks: self.max_blocks,
            slots,
        }
    }
}

/// The widest block table of `batch` (at least 1).
pub(crate) fn widest_table(batch: &ForwardBatch) -> usize {
    batch.sequences.iter().map(|s| s.blocks.len()).max().unwrap_or(0).max(1)
}
