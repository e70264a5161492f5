//! Speculative decoding inside the engine: what a decoding sequence verifies this step, and
//! how much of it it keeps.
//!
//! A greedy sequence whose only pending token is its last sampled one may carry a draft:
//! up to `k` tokens from the engine's [`Proposer`]. The scheduler appends them to the
//! sequence's decode row as extra query rows with logits for every row, so one forward
//! pass gives the target's next token after each prefix of the draft. The sampler draws
//! each row as if the tokens had come one at a time (same bans, penalties context and
//! step), and the sequence keeps tokens in order while the target agrees with the draft,
//! plus the target's own token at the first disagreement: exactly the tokens plain greedy
//! decoding would have produced, each checked against the stop rules as it is appended.
//! The K/V of rejected rows sits past the sequence's computed tokens; its blocks go back
//! to the pool and the slots are overwritten by later steps.
//!
//! Requests that sample (temperature above 0) are never speculated on: keeping their
//! distribution needs rejection sampling (Leviathan et al.), which is not built yet.

use met_speculative::{Proposal, ProposalContext, Proposer};

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
    /// `k`) when `seq` is a greedy sequence about to decode; returns the draft's length.
    pub(crate) fn draft(&mut self, seq: &mut Sequence, room: usize) -> usize {
        seq.draft.clear();
        let room = room.min(self.num_tokens);
        if room == 0 || seq.to_compute() != 1 || !seq.request.sampling.is_greedy() {
            return 0;
        }
        let ctx = ProposalContext {
            sequence: seq.key(),
            tokens: &seq.tokens,
            prompt_len: seq.request.prompt_len,
            max_tokens: room,
        };
        self.proposer.propose(&ctx, &mut self.proposal);
        let valid = self.proposal.tokens.iter().take(room).take_while(|&&t| (t as usize) < self.vocab_size);
        seq.draft.extend(valid);
        seq.draft.len()
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
