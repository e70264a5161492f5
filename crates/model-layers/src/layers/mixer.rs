//! A layer's token mixer: self-attention over the paged K/V cache, or, in a hybrid model,
//! a Gated DeltaNet over the cache's recurrent-state slots; and the per-step metadata the
//! recurrent layers share.
//!
//! Attention layers and recurrent layers are numbered apart: attention layer `j` owns the
//! cache's K/V pools `j`, recurrent layer `r` its state pools `r`, so the cache holds K/V
//! only for the layers that attend.
//!
//! Before a step's first recurrent layer runs, the slots of sequences that start there are
//! made ready: zeroed for a sequence at its first token, or copied from the prefix cache's
//! snapshot it resumes at. The scheduler never sees any of this: it reserves, the cache
//! hands out slots, and the batch carries them ([`ForwardBatch::state_slots`]).

use met_cache::{KvPools, StateLayout};
use met_config::ModelConfig;
use met_kernels::{DType, GpuBackend, HostTensor, NO_STATE_SLOT, RecurrentBatch, StateSnapshot, Tensor};

use super::gated_delta_net::GatedDeltaNet;
use super::self_attention::SelfAttention;
use crate::{ForwardBatch, ModelError, Result};

/// A layer's token mixer.
pub(crate) enum Mixer {
    /// Self-attention; the index of its K/V pools.
    Attention(SelfAttention, usize),
    /// A Gated DeltaNet; the index of its state pools.
    Linear(GatedDeltaNet, usize),
}

/// The recurrent state a model built from `cfg` keeps per sequence, for hybrid models.
pub(crate) fn state_layout(cfg: &ModelConfig, float: DType) -> Option<StateLayout> {
    let la = cfg.linear_attention.as_ref()?;
    Some(StateLayout {
        num_layers: la.layers.iter().filter(|&&l| l).count(),
        conv: [la.conv_dim(), la.conv_kernel - 1],
        conv_dtype: float,
        recurrent: [la.num_value_heads, la.key_head_dim, la.value_head_dim],
        recurrent_dtype: DType::F32,
    })
}

/// Layers that attend (all of them in a model without recurrent layers).
pub(crate) fn attention_layers(cfg: &ModelConfig) -> usize {
    (0..cfg.num_layers).filter(|&i| !cfg.linear_attention.as_ref().is_some_and(|la| la.is_linear(i))).count()
}

/// One step's recurrent metadata on the device.
pub(crate) struct RecurrentStep {
    /// `u32 [s + 1]`.
    cu_seqlens: Tensor,
    /// `u32 [s]`.
    slots: Tensor,
    snapshots: Vec<StateSnapshot>,
    zero: Vec<u32>,
    restore: Vec<(u32, u32)>,
}

impl RecurrentStep {
    /// The metadata of `batch`.
    ///
    /// # Errors
    /// [`ModelError::Batch`] when a sequence has no state slot (its cache holds no
    /// recurrent state); device errors.
    pub(crate) fn upload(b: &dyn GpuBackend, batch: &ForwardBatch) -> Result<Self> {
        let s = batch.sequences.len();
        if batch.state_slots.len() != s {
            return Err(ModelError::Batch(format!(
                "{} of {s} sequences have a recurrent-state slot: a hybrid model needs a cache with state slots",
                batch.state_slots.len()
            )));
        }
        let cu = batch.cu_seqlens_q();
        Ok(Self {
            cu_seqlens: b.upload(&HostTensor::from_u32(&cu, &[s + 1]), DType::U32)?,
            slots: b.upload(&HostTensor::from_u32(&batch.state_slots, &[s]), DType::U32)?,
            snapshots: batch.state_snapshots.iter().map(|&(row, slot)| StateSnapshot { row, slot }).collect(),
            zero: batch.state_zero.clone(),
            restore: batch.state_restore.clone(),
        })
    }

    /// The metadata a decode graph of `size` sequences records: one row each, no slots
    /// yet (every row [`NO_STATE_SLOT`], so the recording touches no state), nothing to
    /// zero, restore or snapshot. Each replay writes its sequences' slots first
    /// ([`Self::write_slots`]).
    ///
    /// # Errors
    /// On device failure.
    pub(crate) fn for_graph(b: &dyn GpuBackend, size: usize) -> Result<Self> {
        let cu: Vec<u32> = (0..=size as u32).collect();
        Ok(Self {
            cu_seqlens: b.upload(&HostTensor::from_u32(&cu, &[size + 1]), DType::U32)?,
            slots: b.upload(&HostTensor::from_u32(&vec![NO_STATE_SLOT; size], &[size]), DType::U32)?,
            snapshots: Vec::new(),
            zero: Vec::new(),
            restore: Vec::new(),
        })
    }

    /// A graph's slots for a replay: the batch's, then [`NO_STATE_SLOT`] for the padding
    /// rows, which so start from a zero state and keep none.
    ///
    /// # Errors
    /// On device failure.
    pub(crate) fn write_slots(&self, b: &dyn GpuBackend, slots: &[u32]) -> Result<()> {
        let mut padded = slots.to_vec();
        padded.resize(self.slots.elem_count(), NO_STATE_SLOT);
        Ok(b.write_u32(&self.slots, &padded)?)
    }

    /// Zeroes or restores the slots of sequences that start in this step.
    ///
    /// # Errors
    /// On device failure.
    pub(crate) fn prepare(&self, b: &dyn GpuBackend, kv: &KvPools) -> Result<()> {
        start_states(b, kv, &self.zero, &self.restore)
    }

    /// The batch as the recurrent ops see it.
    pub(crate) fn batch(&self) -> RecurrentBatch<'_> {
        RecurrentBatch { cu_seqlens: &self.cu_seqlens, slots: &self.slots, snapshots: &self.snapshots }
    }
}

/// Zeroes the slots in `zero` and restores `(snapshot, slot)` pairs, in every state pool.
fn start_states(b: &dyn GpuBackend, kv: &KvPools, zero: &[u32], restore: &[(u32, u32)]) -> Result<()> {
    let pools = kv.state_pools();
    if !zero.is_empty() {
        b.zero_state_slots(&pools, zero)?;
    }
    if !restore.is_empty() {
        b.copy_state_slots(&pools, restore)?;
    }
    Ok(())
}

/// The state work of a replayed decode step that its graph does not record, before the
/// replay: the slots of sequences that start there are zeroed or restored.
///
/// # Errors
/// On device failure.
pub(crate) fn before_replay(b: &dyn GpuBackend, kv: &KvPools, batch: &ForwardBatch) -> Result<()> {
    start_states(b, kv, &batch.state_zero, &batch.state_restore)
}

/// ... and after it: the snapshots are copied out. In a decode step row `i` is sequence
/// `i`'s only row, so a snapshot after it is that sequence's state after the step, a copy
/// of its slot.
///
/// # Errors
/// On device failure.
pub(crate) fn after_replay(b: &dyn GpuBackend, kv: &KvPools, batch: &ForwardBatch) -> Result<()> {
    let slot_of_row = |row: u32| batch.state_slots[row as usize];
    let pairs: Vec<(u32, u32)> = batch.state_snapshots.iter().map(|&(row, snap)| (slot_of_row(row), snap)).collect();
    if !pairs.is_empty() {
        b.copy_state_slots(&kv.state_pools(), &pairs)?;
    }
    Ok(())
}
