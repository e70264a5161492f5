//! `ForwardBatch`: one step's tokens, flattened across sequences.
//!
//! Each sequence contributes a contiguous run of rows: the next chunk of its prompt, or
//! its last sampled token. Positions continue from what the cache already holds, slots
//! come from the sequence's block table, and the attention metadata is derived from the
//! per-sequence query and context lengths. Rows of sequences that run through a LoRA
//! adapter are named by runs ([`ForwardBatch::adapter_runs`]); every other row is the base
//! model's.

use met_cache::SequenceBlocks;

use crate::lora::{Adapter, AdapterRun};

/// Which rows of a pushed chunk need logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// None (a prompt chunk that is not the last).
    None,
    /// The last row (the next-token distribution).
    Last,
    /// Every row (prompt logprobs, speculative verification).
    All,
}

/// One sequence's part of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSequence {
    /// Rows of this sequence in the flat batch.
    pub query_len: usize,
    /// Tokens in the cache after this step (earlier tokens + this chunk).
    pub context_len: usize,
    /// This sequence's block table within [`ForwardBatch::block_tables`].
    pub blocks: std::ops::Range<usize>,
}

/// A flat varlen batch for [`crate::Model::forward`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardBatch {
    /// Token id of each row.
    pub token_ids: Vec<u32>,
    /// Position of each row within its sequence.
    pub positions: Vec<u32>,
    /// Cache slot each row's K/V is written to.
    pub slot_mapping: Vec<u32>,
    /// The sequences, in row order.
    pub sequences: Vec<BatchSequence>,
    /// Every sequence's block table (physical block of each logical block), back to back.
    pub block_tables: Vec<u32>,
    /// Rows whose logits are returned, in output order.
    pub logit_rows: Vec<u32>,
    /// With recurrent state (hybrid models): each sequence's state slot, in order.
    pub state_slots: Vec<u32>,
    /// State slots to zero before the step: sequences starting at their first token.
    pub state_zero: Vec<u32>,
    /// `(snapshot, slot)`: states to restore before the step, for sequences resuming at a
    /// cached prefix.
    pub state_restore: Vec<(u32, u32)>,
    /// `(row, slot)`: states to copy out after a row, for the prefix cache's snapshots and
    /// a speculative step's rollback copies; ascending within a sequence.
    pub state_snapshots: Vec<(u32, u32)>,
    /// Rows that run through a LoRA adapter, ascending, one run per adapter and stretch of
    /// consecutive rows ([`Self::adapt_last`]).
    pub adapter_runs: Vec<AdapterRun>,
}

impl ForwardBatch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the next `tokens` of a sequence whose cache already holds `cached` tokens.
    ///
    /// # Panics
    /// If `blocks` cannot hold `cached + tokens.len()` tokens: reserve before pushing.
    pub fn push(&mut self, tokens: &[u32], cached: usize, blocks: &SequenceBlocks, logits: LogitRows) {
        let end = cached + tokens.len();
        assert!(blocks.capacity() >= end, "blocks hold {} tokens, batch needs {end}", blocks.capacity());
        let first_row = self.token_ids.len() as u32;
        self.token_ids.extend_from_slice(tokens);
        self.positions.extend((cached..end).map(|p| p as u32));
        self.slot_mapping.extend((cached..end).map(|p| blocks.slot(p)));
        let rows = first_row..first_row + tokens.len() as u32;
        match logits {
            LogitRows::None => {}
            LogitRows::Last => self.logit_rows.extend(rows.last()),
            LogitRows::All => self.logit_rows.extend(rows),
        }
        if let Some(slot) = blocks.state_slot() {
            self.push_state(slot, blocks, cached, end, first_row);
        }
        let table = self.block_tables.len()..self.block_tables.len() + blocks.block_ids().len();
        self.block_tables.extend(blocks.block_ids().iter().map(|b| b.0));
        self.sequences.push(BatchSequence { query_len: tokens.len(), context_len: end, blocks: table });
    }

    /// Runs the rows of the sequence pushed last through `adapter`.
    ///
    /// # Panics
    /// If no sequence was pushed.
    pub fn adapt_last(&mut self, adapter: &Adapter) {
        let query_len = self.sequences.last().expect("adapt a pushed sequence").query_len;
        let rows = self.token_ids.len() - query_len..self.token_ids.len();
        match self.adapter_runs.last_mut() {
            Some(run) if run.adapter.id() == adapter.id() && run.rows.end == rows.start => run.rows.end = rows.end,
            _ => self.adapter_runs.push(AdapterRun { rows, adapter: adapter.clone() }),
        }
    }

    /// A sequence's recurrent state: its slot, where its state starts when this step is its
    /// first, and the snapshots that fall among its rows `cached..end`.
    fn push_state(&mut self, slot: u32, blocks: &SequenceBlocks, cached: usize, end: usize, first_row: u32) {
        self.state_slots.push(slot);
        match blocks.state_restore() {
            _ if cached == 0 => self.state_zero.push(slot),
            Some((snapshot, at)) if at == cached => self.state_restore.push((snapshot, slot)),
            _ => {}
        }
        let from = self.state_snapshots.len();
        for &(at, snapshot) in blocks.planned_snapshots().iter().chain(blocks.rollback_snapshots()) {
            if at > cached && at <= end {
                self.state_snapshots.push((first_row + (at - cached - 1) as u32, snapshot));
            }
        }
        self.state_snapshots[from..].sort_unstable();
    }

    /// The block table of sequence `i`.
    pub fn block_table(&self, i: usize) -> &[u32] {
        &self.block_tables[self.sequences[i].blocks.clone()]
    }

    /// Empties the batch, keeping its allocations for the next step.
    pub fn clear(&mut self) {
        self.token_ids.clear();
        self.positions.clear();
        self.slot_mapping.clear();
        self.sequences.clear();
        self.block_tables.clear();
        self.logit_rows.clear();
        self.state_slots.clear();
        self.state_zero.clear();
        self.state_restore.clear();
        self.state_snapshots.clear();
        self.adapter_runs.clear();
    }

    /// Rows in the batch.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.token_ids.is_empty()
    }

    /// Every sequence's block table as a row of `width` entries, padded with block 0:
    /// `[sequences, width]` row-major.
    ///
    /// # Panics
    /// If a sequence holds more than `width` blocks.
    pub fn padded_block_tables(&self, width: usize) -> Vec<u32> {
        let mut tables = vec![0u32; self.sequences.len() * width];
        for (i, row) in tables.chunks_mut(width.max(1)).enumerate() {
            let table = self.block_table(i);
            row[..table.len()].copy_from_slice(table);
        }
        tables
    }

    /// Context length of each sequence after this step.
    pub fn context_lens(&self) -> Vec<u32> {
        self.sequences.iter().map(|s| s.context_len as u32).collect()
    }

    /// Prefix sums of query lengths (`[0, q0, q0+q1, ...]`).
    pub fn cu_seqlens_q(&self) -> Vec<u32> {
        let mut acc = 0;
        std::iter::once(0)
            .chain(self.sequences.iter().map(|s| {
                acc += s.query_len as u32;
                acc
            }))
            .collect()
    }
}
