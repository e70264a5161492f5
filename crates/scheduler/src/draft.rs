//! A sequence's speculative draft: the proposed tokens its decode row verifies this step.
//!
//! **Invariants:** a draft is never part of the sequence's tokens until the target agrees
//! with it, and lives for one step (the scheduler clears it after the step's results, on
//! preemption and when its slots cannot be reserved). Its distributions, when it has any,
//! are one row of the vocabulary per token; a draft without them is a point-mass proposal.

use met_kernels::DraftToken;
use met_speculative::Proposal;

/// Proposed tokens and, when the proposer gave them, their distributions.
#[derive(Debug, Default)]
pub(crate) struct Draft {
    tokens: Vec<u32>,
    /// The distribution at each token (`[tokens.len(), vocab]`), or empty.
    probs: Vec<f32>,
}

impl Draft {
    pub(crate) fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Drops the draft, keeping its allocations.
    pub(crate) fn clear(&mut self) {
        self.tokens.clear();
        self.probs.clear();
    }

    /// Replaces the draft with up to `room` of `proposal`'s tokens, up to the first at or
    /// past `vocab` (a proposer's bug must not fail a request), with their distributions
    /// when the proposal holds one per token; returns how many tokens it took.
    pub(crate) fn take(&mut self, proposal: &Proposal, room: usize, vocab: usize) -> usize {
        self.clear();
        let valid = proposal.tokens.iter().take(room).take_while(|&&t| (t as usize) < vocab);
        self.tokens.extend(valid);
        // Distributions of another shape are dropped: the point-mass rule is exact for any
        // proposal, only its acceptance is lower.
        let rows = self.tokens.len() * vocab;
        match &proposal.probs {
            Some(probs) if probs.len() == proposal.tokens.len() * vocab => {
                self.probs.extend_from_slice(&probs[..rows]);
            }
            _ => {}
        }
        self.tokens.len()
    }

    /// Token `j` with the distribution it was drawn from, for the sampler to verify; `None`
    /// past the draft (the row after it) and for point-mass proposals.
    pub(crate) fn token(&self, j: usize) -> Option<DraftToken<'_>> {
        let vocab = self.probs.len().checked_div(self.tokens.len())?;
        let token = *self.tokens.get(j)?;
        (vocab > 0).then(|| DraftToken { token, probs: &self.probs[j * vocab..(j + 1) * vocab] })
    }
}
