//! Self-speculation: the target's own first `L` layers, then its final norm and head, as
//! the draft (LayerSkip's early exit, here without the early-exit training, so acceptance
//! depends on how much of the answer the early layers already know).
//!
//! Draft KV: the draft's layers are the target's first layers, so the K/V they compute for
//! a token are the target's own for those layers. The draft therefore needs no cache of its
//! own: it reads the target's cache for the context, writes its draft tokens' K/V into the
//! target's cache at the slots the engine reserved past the context (only layers `< L`),
//! and the target's verification pass over the same positions overwrites them with
//! identical values for accepted tokens; rejected positions lie past the sequence's
//! computed tokens and are overwritten later. Drafting `k` tokens is `k` passes of one row
//! through `L` layers and the head, per sequence.
//!
//! The draft proposes its argmax at each position as a point mass: exact for every request
//! (see `met_kernels::DraftToken`), the tokens most likely to be accepted for greedy ones.
//! Drawing sampled requests' drafts from the draft's distribution, which the sampler's
//! rejection step supports, would accept more of them at high temperatures; not done yet.

use std::sync::Arc;

use met_kernels::GpuBackend;
use met_model_layers::{EarlyExit, ForwardBatch, LogitRows};

use crate::{Proposal, ProposalContext, Proposer, TargetView, greedy_token};

/// Drafts with the target's first `layers` layers.
pub struct EarlyExitProposer {
    layers: usize,
    backend: Arc<dyn GpuBackend>,
    /// Reused between passes.
    batch: ForwardBatch,
}

impl EarlyExitProposer {
    /// Drafts with the first `layers` layers of the target, whose logits live on `backend`.
    pub fn new(layers: usize, backend: Arc<dyn GpuBackend>) -> Self {
        Self { layers, backend, batch: ForwardBatch::default() }
    }

    /// The draft's next token after `token` at `position`, writing its K/V; `None` when the
    /// pass fails (no proposal is better than a failed request).
    fn next(&mut self, exit: &dyn EarlyExit, target: &TargetView<'_>, token: u32, position: usize) -> Option<u32> {
        self.batch.clear();
        self.batch.push(&[token], position, target.blocks, LogitRows::Last);
        let logits = exit.forward_early_exit(&self.batch, target.kv, self.layers).ok()?;
        greedy_token(&*self.backend, &logits)
    }
}

impl Proposer for EarlyExitProposer {
    fn name(&self) -> &'static str {
        "self"
    }

    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal) {
        out.clear();
        let Some(target) = ctx.target else { return };
        let (Some(exit), Some(&last)) = (target.model.early_exit(), ctx.tokens.last()) else { return };
        // The context's last token is not in the cache yet: the first pass computes it.
        let start = ctx.tokens.len() - 1;
        let passes = ctx.max_tokens.min(target.blocks.capacity().saturating_sub(start));
        let mut token = last;
        for j in 0..passes {
            match self.next(exit, &target, token, start + j) {
                Some(next) => token = next,
                None => return,
            }
            out.tokens.push(token);
        }
    }

    fn uses_target(&self) -> bool {
        true
    }
}

impl std::fmt::Debug for EarlyExitProposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EarlyExitProposer").field("layers", &self.layers).finish_non_exhaustive()
    }
}
