//! Operands of the recurrent (linear-attention) ops: the Gated DeltaNet token mixer of
//! hybrid models (Qwen3-Next, Qwen3.5/3.6).
//!
//! A recurrent layer keeps, per sequence, a fixed-size state instead of per-token K/V: the
//! last `width - 1` inputs of its causal depthwise convolution and the `[h_v, d_k, d_v]`
//! matrix of its delta rule. States live in pools of slots (`[slots, ...]` tensors the
//! cache owns); a step names each sequence's slot, and the ops read the state there before
//! the sequence's first row and leave the state after its last row there. A slot holds
//! whatever its owner left: a sequence that starts fresh has its slot zeroed first
//! ([`GpuBackend::zero_state_slots`](crate::GpuBackend::zero_state_slots)).
//!
//! Snapshots copy the state after a given row into another slot of the same pool, so a
//! prefix cache can later restore a sequence at that point.

use crate::Tensor;

/// The sequences of one step as the recurrent ops see them.
#[derive(Debug, Clone, Copy)]
pub struct RecurrentBatch<'a> {
    /// `u32 [s + 1]`: sequence `i` owns rows `cu_seqlens[i] .. cu_seqlens[i + 1]` of the
    /// step (prefix sums of the query lengths).
    pub cu_seqlens: &'a Tensor,
    /// `u32 [s]`: the state slot of each sequence, or [`NO_STATE_SLOT`].
    pub slots: &'a Tensor,
    /// The states to copy out within the step: after row `row` (a flat row of the step)
    /// has been consumed, the state of that row's sequence is copied into slot `slot`.
    /// Rows are ascending within a sequence; a row may be the sequence's last.
    pub snapshots: &'a [StateSnapshot],
}

/// The slot of a sequence that keeps no state: it starts from a zero state and its state
/// after the step is dropped. A captured decode step's padding rows take it, so a replay
/// with fewer sequences than the graph's size reads and writes no other sequence's state.
pub const NO_STATE_SLOT: u32 = u32::MAX;

/// One state copy made within a step ([`RecurrentBatch::snapshots`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSnapshot {
    /// The flat row after which the state is taken.
    pub row: u32,
    /// The pool slot it is copied into.
    pub slot: u32,
}

/// The shape and parameters of a Gated DeltaNet layer's delta rule.
#[derive(Debug, Clone, Copy)]
pub struct DeltaRule<'a> {
    /// Key (and query) heads `h_k`.
    pub num_key_heads: usize,
    /// Value heads `h_v`, a multiple of `h_k`: value head `j` reads key head
    /// `j / (h_v / h_k)`.
    pub num_value_heads: usize,
    /// Elements per key head `d_k`.
    pub key_dim: usize,
    /// Elements per value head `d_v`.
    pub value_dim: usize,
    /// `f32 [h_v]`: the log of each head's decay rate, `A_log`.
    pub a_log: &'a Tensor,
    /// `f32 [h_v]`: each head's time-step bias, `dt_bias`.
    pub dt_bias: &'a Tensor,
}
