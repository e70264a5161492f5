//! Causal attention for the `flash` backend on the CPU: the reference's per-row kernel.
//!
//! Every query row, whether a decode row, a speculative token or a prompt's row, is attended
//! by `attention::attend_rows`: one task per (row, KV head), an online softmax over runs of
//! keys that start at the row's first visible key. A row's output is therefore a function of
//! its query and the keys it sees alone, the same bits however its sequence's prompt was
//! chunked, whether it was recomputed after a preemption, and whatever sequences share the
//! step. (Prompts were once attended in tiles through GEMMs, whose score and weighting sums
//! ran in another order than a decode row's: a sequence's cache then depended on how its
//! prompt had been batched.)

use crate::Tensor;
use crate::backend::{AttentionMeta, AttentionParams};
use crate::error::Result;

use super::attention::{Step, attend_rows};

pub(super) fn flash_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    Ok(attend_rows(&Step::read("flash_attention", q, (k_cache, v_cache), meta, p)?, p))
}
