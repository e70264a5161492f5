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
//!
//! How much is proposed: at most `k` tokens, or with adaptive `k` a per-sequence length that
//! grows while drafts are accepted whole and shrinks after rejections; and nothing while
//! more sequences run than the batch limit, where verification rows cost more than they
//! save (measured on the CPU: `bench/results/`).

use std::collections::HashMap;

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
    /// Whether each sequence's draft length follows its acceptance ([`Self::observe`]).
    adaptive: bool,
    /// Per sequence key, the draft length adaptive `k` allows next (absent: `num_tokens`).
    k: HashMap<u64, usize>,
    /// Speculation pauses while more sequences than this run.
    max_batch: Option<usize>,
}

impl Speculation {
    /// Verifies up to `num_tokens` of `proposer`'s tokens per sequence and step, always
    /// that many (no adaptive `k`) and at any batch size.
    pub(crate) fn new(proposer: Box<dyn Proposer>, num_tokens: usize, vocab_size: usize) -> Self {
        Self {
            proposer,
            num_tokens,
            vocab_size,
            proposal: Proposal::default(),
            adaptive: false,
            k: HashMap::new(),
            max_batch: None,
        }
    }

    /// This speculation with adaptive `k` on or off, pausing above `max_batch` running
    /// sequences.
    pub(crate) fn with_policy(self, adaptive: bool, max_batch: Option<usize>) -> Self {
        Self { adaptive, max_batch, ..self }
    }

    /// Whether to speculate in a step with `running` sequences.
    pub(crate) fn active(&self, running: usize) -> bool {
        self.max_batch.is_none_or(|max| running <= max)
    }

    /// Adaptive `k` after a draft of `drafted` tokens of which `accepted` were kept: two
    /// more when all were, one fewer otherwise, within `1..=num_tokens` (the "heuristic"
    /// schedule of Hugging Face's assisted generation). It depends on the sequence's own
    /// history only, so a seeded request still repeats.
    pub(crate) fn observe(&mut self, seq: &Sequence, drafted: usize, accepted: usize) {
        if !self.adaptive || drafted == 0 {
            return;
        }
        let k = self.k_of(seq.key());
        let next = if accepted == drafted { k + 2 } else { k.saturating_sub(1) };
        self.k.insert(seq.key(), next.clamp(1, self.num_tokens));
    }

    fn k_of(&self, key: u64) -> usize {
        self.k.get(&key).copied().unwrap_or(self.num_tokens)
    }

    /// Fills `seq`'s draft with at most `room` proposed tokens (and no more than the
    /// engine's `k`), with their distributions when the proposer has them, when `seq` is
    /// about to decode; returns the draft's length.
    ///
    /// A proposer that [uses the target](Proposer::uses_target) gets `target`, whose
    /// blocks must already have room for `room` tokens past `seq`'s tokens.
    pub(crate) fn draft(&mut self, seq: &mut Sequence, room: usize, target: Option<TargetView<'_>>) -> usize {
        let room = self.room(seq, room);
        if room == 0 || seq.to_compute() != 1 {
            seq.draft.clear();
            return 0;
        }
        let ctx = ProposalContext {
            sequence: seq.key(),
            tokens: seq.tokens(),
            prompt_len: seq.request().prompt_len,
            max_tokens: room,
            target: target.filter(|_| self.proposer.uses_target()),
        };
        self.proposer.propose(&ctx, &mut self.proposal);
        seq.draft.take(&self.proposal, room, self.vocab_size)
    }

    /// The most tokens a draft of `seq` may hold when `room` fit.
    pub(crate) fn room(&self, seq: &Sequence, room: usize) -> usize {
        room.min(self.k_of(seq.key()))
    }

    /// Whether the proposer drafts in the target's cache, so its slots must be reserved
    /// before proposing.
    pub(crate) fn uses_target(&self) -> bool {
        self.proposer.uses_target()
    }

    /// `seq` left the running batch (finished, cancelled or preempted).
    pub(crate) fn forget(&mut self, seq: &Sequence) {
        self.k.remove(&seq.key());
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
