//! Recurrent-state slots: the fixed-size state a hybrid model's linear-attention layers
//! keep per sequence, beside the paged K/V of its attention layers.
//!
//! A recurrent layer summarises every token a sequence has seen in one state (Gated
//! DeltaNet: a convolution window and a delta-rule matrix), so the cache holds, per layer,
//! pools of *slots* rather than blocks. A sequence takes one slot when it first reserves
//! room and gives it back when its [`SequenceBlocks`](crate::SequenceBlocks) guard drops
//! (finish, cancel, preemption); the model reads and writes the slot's contents, the cache
//! only hands slots out.
//!
//! A state cannot be cut back to an earlier token, so sharing a prefix needs the state at
//! the prefix's end. With prefix caching on, the cache plans *snapshots*: every
//! `interval` full blocks, the step that computes the token ending that block copies the
//! sequence's state into a snapshot slot, which [`commit`](crate::KvCache::commit) keys by
//! the block's chain hash. A later sequence (or a fork) shares blocks only up to the last
//! one with a snapshot, and starts from a copy of it. Evicting a block evicts its
//! snapshot; the snapshot slots are a bounded pool, and when it is empty the least recently
//! freed snapshot of a block nobody holds is taken back.
//!
//! A speculative verification computes tokens the sequence may not keep, and a state cannot
//! forget them: for such a step ([`KvCache::allow_rollback`](crate::KvCache::allow_rollback))
//! the state after each of its tokens is copied into the sequence's own *rollback* slots,
//! and cutting the sequence back ([`SequenceBlocks::truncate`](crate::SequenceBlocks::truncate))
//! restores the one at the cut before its next step.
//!
//! Invariant: every slot is exactly one of free, held by one live sequence (its own slot,
//! its rollback slots, or a planned snapshot), or keyed by one chain hash.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use met_kernels::DType;

/// The per-sequence state of a model's recurrent layers, on one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateLayout {
    /// Recurrent layers, each with its own pools.
    pub num_layers: usize,
    /// One sequence's convolution window in each layer: `[channels, width - 1]`.
    pub conv: [usize; 2],
    /// Element type of the convolution windows.
    pub conv_dtype: DType,
    /// One sequence's recurrent matrix in each layer: `[heads, key_dim, value_dim]`.
    pub recurrent: [usize; 3],
    /// Element type of the recurrent matrices (f32, as `mamba_ssm_dtype` says).
    pub recurrent_dtype: DType,
}

impl StateLayout {
    /// Bytes one slot takes across all layers.
    pub fn bytes_per_slot(&self) -> usize {
        let conv = self.conv.iter().product::<usize>() * self.conv_dtype.size_in_bytes();
        let recurrent = self.recurrent.iter().product::<usize>() * self.recurrent_dtype.size_in_bytes();
        self.num_layers * (conv + recurrent)
    }
}

/// How many state slots a cache holds, and how often it snapshots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSizing {
    /// Slots for running sequences: at least the most sequences a step can hold.
    pub sequences: usize,
    /// Slots for prefix-cache snapshots (0: prefix hits on the model are impossible).
    pub snapshots: usize,
    /// A snapshot every this many full blocks (0: none).
    pub interval: usize,
    /// Rollback slots per sequence slot: the most tokens a speculative step may compute
    /// beyond the one it keeps for sure (0: no speculation).
    pub rollback: usize,
}

impl StateSizing {
    /// Slots in each state pool.
    pub fn slots(&self) -> usize {
        self.sequences * (1 + self.rollback) + self.snapshots
    }
}

/// The state slots of a cache and its occupancy, as `/metrics` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateUsage {
    /// Slots for running sequences.
    pub sequence_slots: usize,
    /// Of those, held by a sequence.
    pub sequences_held: usize,
    /// Slots for snapshots.
    pub snapshot_slots: usize,
    /// Of those, holding a snapshot keyed in the prefix cache.
    pub snapshots_cached: usize,
    /// Rollback slots per sequence slot (the longest speculative step it can undo).
    pub rollback: usize,
    /// Bytes of all slots on one device.
    pub bytes: usize,
}

/// Slot bookkeeping, under the block pool's lock.
#[derive(Debug)]
pub(crate) struct StateSlots {
    sizing: StateSizing,
    /// Pool slots `0 .. sequences` serve sequences, the rest snapshots.
    free_sequence: Vec<u32>,
    free_snapshot: Vec<u32>,
    /// Chain hash of a full block → the snapshot slot of the state after it.
    snapshots: HashMap<u64, u32>,
}

impl StateSlots {
    pub(crate) fn new(sizing: StateSizing) -> Self {
        let seq = sizing.sequences as u32;
        let total = seq + sizing.snapshots as u32;
        // Reversed so that `pop` hands out low slots first.
        Self {
            sizing,
            free_sequence: (0..seq).rev().collect(),
            free_snapshot: (seq..total).rev().collect(),
            snapshots: HashMap::new(),
        }
    }

    /// Rollback slot `j` of the sequence holding slot `slot`, if the sizing has it.
    pub(crate) fn rollback_slot(&self, slot: u32, j: usize) -> Option<u32> {
        let StateSizing { sequences, snapshots, rollback, .. } = self.sizing;
        (j < rollback).then(|| (sequences + snapshots + slot as usize * rollback + j) as u32)
    }

    pub(crate) fn interval(&self) -> usize {
        if self.sizing.snapshots == 0 { 0 } else { self.sizing.interval }
    }

    pub(crate) fn take_sequence_slot(&mut self) -> Option<u32> {
        self.free_sequence.pop()
    }

    pub(crate) fn free_sequence_slot(&mut self, slot: u32) {
        self.free_sequence.push(slot);
    }

    pub(crate) fn take_snapshot_slot(&mut self) -> Option<u32> {
        self.free_snapshot.pop()
    }

    pub(crate) fn free_snapshot_slot(&mut self, slot: u32) {
        self.free_snapshot.push(slot);
    }

    /// The snapshot after the block whose chain hash is `hash`.
    pub(crate) fn snapshot(&self, hash: u64) -> Option<u32> {
        self.snapshots.get(&hash).copied()
    }

    /// Keys `slot` by `hash`, or frees it when that block already has a snapshot.
    pub(crate) fn key(&mut self, hash: u64, slot: u32) {
        match self.snapshots.entry(hash) {
            Entry::Occupied(_) => self.free_snapshot.push(slot),
            Entry::Vacant(e) => {
                e.insert(slot);
            }
        }
    }

    /// Frees the snapshot keyed by `hash`, if any (its block was evicted).
    pub(crate) fn forget(&mut self, hash: u64) {
        if let Some(slot) = self.snapshots.remove(&hash) {
            self.free_snapshot.push(slot);
        }
    }

    pub(crate) fn usage(&self, layout: &StateLayout) -> StateUsage {
        let StateSizing { sequences, snapshots, rollback, .. } = self.sizing;
        StateUsage {
            rollback,
            sequence_slots: sequences,
            sequences_held: sequences - self.free_sequence.len(),
            snapshot_slots: snapshots,
            snapshots_cached: self.snapshots.len(),
            bytes: self.sizing.slots() * layout.bytes_per_slot(),
        }
    }
}

/// A sequence's part of the state bookkeeping.
#[derive(Debug, Default)]
pub(crate) struct SequenceState {
    /// Its slot, once it reserved room.
    pub(crate) slot: Option<u32>,
    /// The snapshot it starts from and the tokens that snapshot covers.
    pub(crate) restore: Option<(u32, usize)>,
    /// Snapshots planned but not yet keyed: `(tokens covered, slot)`, ascending.
    pub(crate) planned: Vec<(usize, u32)>,
    /// Rollback copies of the current speculative step: `(tokens covered, slot)`,
    /// ascending.
    pub(crate) rollback: Vec<(usize, u32)>,
}
