//! Speculative decoding inside the engine: what a decoding sequence verifies this step, and
//! how much of it it keeps.
//!
//! A sequence whose only pending token is its last sampled one may carry a draft: up to
//! `k` tokens from the engine's [`Proposer`]. The scheduler appends them to the sequence's
//! decode row as extra query rows with logits for every row, so one forward pass gives the
//! target's distribution after each prefix of the draft. The sampler handles each row as
//! if the tokens had come one at a time (same bans, penalties context, seed and step), and
//! the sequence keeps tokens in order while the row's result equals the draft token, plus
//! the row's own token at the first that does not, each checked against the stop rules as
//! it is appended. The K/V of rejected rows sits past the sequence's computed tokens; its
//! blocks go back to the pool and the slots are overwritten by later steps.
//!
//! Which result a row gives is rejection sampling (Leviathan et al., 2023), and the target's
//! distribution is kept exactly for every request:
//! - greedy rows take the argmax, so the output is plain greedy decoding's;
//! - a proposal without distributions (prompt lookup) is a point mass at each token, whose
//!   rule (accept with probability `p(x)`, else draw from `p` without `x`) is a plain draw
//!   compared with the token. A seeded request therefore gets exactly the tokens it gets
//!   with speculation off, whatever was proposed;
//! - a proposal with distributions `q` passes them to the sampler
//!   ([`met_kernels::DraftToken`]), which accepts with probability `min(1, p(x) / q(x))`
//!   and otherwise draws from `max(0, p − q)`. A seeded request is reproducible for the
//!   same drafts, but its tokens differ from speculation off's (same distribution, other
//!   draws).

use met_speculative::{Proposal, ProposalContext, Proposer, TargetView};

use crate::sequence::Sequence;

/// The engine's proposer and its limits.
pub(crate) struct Speculation {
    proposer: Box<dyn Proposer>,
    /// Most tokens proposed per sequence and step.
    num_tokens: usize,
    /// Proposed ids at or past it are dropped (a proposer's bug must not fail a request).
    vocab_size: usize,
    /// Reused between calls.
    proposal: Proposal,
}

impl Speculation {
    pub(crate) fn new(proposer: Box<dyn Proposer>, num_tokens: usize, vocab_size: usize) -> Self {
        Self { proposer, num_tokens, vocab_size, proposal: Proposal::default() }
    }

    /// Fills `seq.draft` with at most `room` proposed tokens (and no more than the engine's
    /// `k`), and `seq.draft_probs` with their distributions when the proposer has them, when
    /// `seq` is about to decode; returns the draft's length.
    ///
    /// A proposer that [uses the target](Proposer::uses_target) gets `target`, whose
    /// blocks must already have room for `room` tokens past `seq.tokens`.
    pub(crate) fn draft(&mut self, seq: &mut Sequence, room: usize, target: Option<TargetView<'_>>) -> usize {
        seq.clear_draft();
        let room = self.room(room);
        if room == 0 || seq.to_compute() != 1 {
            return 0;
        }
        let ctx = ProposalContext {
            sequence: seq.key(),
            tokens: &seq.tokens,
            prompt_len: seq.request.prompt_len,
            max_tokens: room,
            target: target.filter(|_| self.proposer.uses_target()),
        };
        self.proposer.propose(&ctx, &mut self.proposal);
        let valid = self.proposal.tokens.iter().take(room).take_while(|&&t| (t as usize) < self.vocab_size);
        seq.draft.extend(valid);
        // Distributions of another shape are dropped: the point-mass rule is exact for any
        // proposal, only its acceptance is lower.
        let rows = seq.draft.len() * self.vocab_size;
        match &self.proposal.probs {
            Some(probs) if probs.len() == self.proposal.tokens.len() * self.vocab_size => {
                seq.draft_probs.extend_from_slice(&probs[..rows]);
            }
            _ => {}
        }
        seq.draft.len()
    }

    /// The most tokens a draft may hold when `room` fit.
    pub(crate) fn room(&self, room: usize) -> usize {
        room.min(self.num_tokens)
    }

    /// Whether the proposer drafts in the target's cache, so its slots must be reserved
    /// before proposing.
    pub(crate) fn uses_target(&self) -> bool {
        self.proposer.uses_target()
    }

    /// `seq` left the running batch (finished, cancelled or preempted).
    pub(crate) fn forget(&mut self, seq: &Sequence) {
        self.proposer.forget(seq.key());
    }
}

impl std::fmt::Debug for Speculation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("proposer", &self.proposer.name())
            .field("num_tokens", &self.num_tokens)
            .finish_non_exhaustive()
    }
}
