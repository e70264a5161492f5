//! Structured output inside the engine: the seam a grammar engine plugs into.
//!
//! A request may carry a [`Constraint`] (a compiled JSON Schema, regular expression or
//! grammar); each of its continuations starts its own [`ConstraintState`]. Every step in
//! which a constrained sequence samples, the engine asks its state for the tokens allowed
//! next, as a packed bitmask, while the model computes the logits (on a thread of its own,
//! so the mask costs the step nothing when it is ready first), then samples from logits
//! masked on the device ([`met_kernels::GpuBackend::mask_logits`]) and hands the drawn
//! token back to the state. A state that is complete ends its sequence with
//! [`crate::FinishReason::Stop`]; one that fails (a grammar engine's own error) ends the
//! request with [`crate::FinishReason::Error`].
//!
//! **Invariant:** a constrained sequence never carries a speculative draft, so its state
//! sees every token once, in order, and preemption by recompute keeps it valid (the
//! sequence's tokens do not change).

use std::fmt::Debug;
use std::sync::Arc;

/// A compiled constraint, shared by a request's continuations.
pub trait Constraint: Send + Sync + Debug {
    /// A fresh matcher at the start of the output.
    fn start(&self) -> Box<dyn ConstraintState>;
}

/// One sequence's position in a [`Constraint`].
pub trait ConstraintState: Send {
    /// Writes the tokens allowed next into `mask` (bit `t % 32` of word `t / 32` allows
    /// token `t`; `mask` covers the engine's vocabulary, zeroed). Allowing the end-of-sequence
    /// token is how a complete constraint lets the sequence stop.
    ///
    /// # Errors
    /// The grammar engine's message when it cannot go on; the request then fails.
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String>;

    /// Advances past `token`, which the last mask allowed.
    ///
    /// # Errors
    /// The grammar engine's message for a token it refuses.
    fn accept(&mut self, token: u32) -> Result<(), String>;

    /// Whether nothing more may follow: the sequence ends here.
    fn is_complete(&self) -> bool;
}

/// A request's constraint, compared by identity (two requests hold equal constraints only
/// when they share one).
#[derive(Debug, Clone)]
pub struct SharedConstraint(pub Arc<dyn Constraint>);

impl PartialEq for SharedConstraint {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// Words of a packed mask over `vocab` tokens.
pub(crate) fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}

/// A sequence's constraint state and the mask it computed for this step.
pub(crate) struct Constrained {
    pub(crate) state: Box<dyn ConstraintState>,
    /// The allowed tokens of the step being run, once computed.
    pub(crate) mask: Vec<u32>,
    /// Why the mask could not be computed this step.
    pub(crate) error: Option<String>,
}

impl Constrained {
    pub(crate) fn new(constraint: &SharedConstraint) -> Self {
        Self { state: constraint.0.start(), mask: Vec::new(), error: None }
    }

    /// Computes this step's mask over `vocab` tokens.
    pub(crate) fn compute(&mut self, vocab: usize) {
        self.mask.clear();
        self.mask.resize(mask_words(vocab), 0);
        self.error = self.state.fill_mask(&mut self.mask).err();
    }
}

impl Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrained").field("error", &self.error).finish_non_exhaustive()
    }
}
