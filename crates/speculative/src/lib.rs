//! Speculative decoding for met: cheap guesses of a sequence's next tokens that the target
//! model checks in one forward pass.
//!
//! A [`Proposer`] looks at a sequence's tokens (prompt plus generated) and proposes up to
//! `k` tokens that may follow. The engine (`met-scheduler`) appends them to the sequence's
//! decode row as extra query rows, gets the target's logits for every one, and keeps the
//! longest prefix the target agrees with plus the target's own next token, so a proposer
//! can only change how fast tokens come, never which tokens come. A wrong proposal costs
//! the verification rows and nothing else.
//!
//! This crate holds the seam and the proposers; verification lives in the engine, which
//! owns the batch and the KV cache, and in the sampler, which does the rejection sampling
//! of sampled requests (`met_kernels::DraftToken`). [`NgramProposer`] is prompt lookup: it
//! finds the last few tokens earlier in the sequence and proposes what followed them there,
//! which pays off on input-grounded work (code edits, quoting answers). A draft model or
//! the target's own first layers would be further `Proposer`s: the trait hands them a
//! stable sequence key, so they can keep per-sequence state, and [`Proposal::probs`]
//! carries a draft's distributions, from which its tokens must have been drawn, for
//! rejection sampling. A proposal without them is verified as a point mass, which is exact
//! for any tokens however they were chosen.

mod ngram;

pub use ngram::NgramProposer;

/// The most tokens one proposal may hold (`--num-speculative-tokens`). Verifying more rows
/// per step than this costs more than the rare long acceptances save.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

/// Proposal methods, by their command-line name (`--speculative`).
pub const METHOD_NAMES: &[&str] = &["ngram"];

/// One sequence, as a proposer sees it.
#[derive(Debug, Clone, Copy)]
pub struct ProposalContext<'a> {
    /// Stable for the sequence's life (its request and continuation), so a proposer with
    /// per-sequence state can find it again; see [`Proposer::forget`].
    pub sequence: u64,
    /// The prompt followed by every token generated so far.
    pub tokens: &'a [u32],
    /// How many of `tokens` are the prompt.
    pub prompt_len: usize,
    /// The most tokens to propose.
    pub max_tokens: usize,
}

/// Proposed tokens, reused across steps so proposing does not allocate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Proposal {
    /// The proposed continuation, at most the context's `max_tokens` long; empty when the
    /// proposer has no guess.
    pub tokens: Vec<u32>,
    /// The proposer's distribution over the vocabulary at each proposed position
    /// (`[tokens.len(), vocab]`, row-major), for rejection sampling; `None` when each
    /// proposed token is certain (a point mass), as prompt lookup's are.
    pub probs: Option<Vec<f32>>,
}

impl Proposal {
    /// Empties it, keeping its allocations.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.probs = None;
    }
}

/// Something that guesses a sequence's next tokens.
pub trait Proposer: Send {
    /// The method's name, as `--speculative` takes it.
    fn name(&self) -> &'static str;

    /// Writes into the empty `out` up to `ctx.max_tokens` tokens that may follow
    /// `ctx.tokens`, most likely first; leaves it empty without a guess.
    fn propose(&mut self, ctx: &ProposalContext<'_>, out: &mut Proposal);

    /// Sequence `sequence` ended or was preempted: drop any state kept for it. Stateless
    /// proposers ignore it.
    fn forget(&mut self, sequence: u64) {
        let _ = sequence;
    }
}

/// How proposals are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Prompt lookup: [`NgramProposer`].
    Ngram,
}

impl Method {
    /// The method named `name` ([`METHOD_NAMES`]).
    ///
    /// # Errors
    /// [`SpeculativeError::Invalid`] naming `--speculative` for an unknown name.
    pub fn from_name(name: &str) -> Result<Self, SpeculativeError> {
        match name {
            "ngram" => Ok(Self::Ngram),
            _ => Err(SpeculativeError::Invalid {
                flag: "speculative",
                msg: format!("unknown method `{name}`; expected one of: {}", METHOD_NAMES.join(", ")),
            }),
        }
    }
}

/// Speculative decoding settings of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// How tokens are proposed.
    pub method: Method,
    /// The most tokens proposed (and verified) per sequence and step.
    pub num_tokens: usize,
    /// The shortest suffix prompt lookup matches.
    pub ngram_min: usize,
    /// The longest suffix prompt lookup matches (tried first).
    pub ngram_max: usize,
}

impl SpeculativeConfig {
    /// Prompt lookup proposing up to `num_tokens`, matching suffixes of 4 down to 2 tokens
    /// (single-token matches are mostly coincidences that cost verification rows).
    pub fn ngram(num_tokens: usize) -> Self {
        Self { method: Method::Ngram, num_tokens, ngram_min: 2, ngram_max: 4 }
    }

    /// Checks every setting.
    ///
    /// # Errors
    /// [`SpeculativeError::Invalid`] naming the flag of the first bad setting.
    pub fn validate(&self) -> Result<(), SpeculativeError> {
        let bad = |flag, msg: String| Err(SpeculativeError::Invalid { flag, msg });
        if !(1..=MAX_SPECULATIVE_TOKENS).contains(&self.num_tokens) {
            let msg = format!("{} is outside 1..={MAX_SPECULATIVE_TOKENS}", self.num_tokens);
            return bad("num-speculative-tokens", msg);
        }
        if self.ngram_min == 0 {
            return bad("speculative-ngram-min", "must be positive".into());
        }
        if self.ngram_max < self.ngram_min {
            let msg = format!("{} is below --speculative-ngram-min {}", self.ngram_max, self.ngram_min);
            return bad("speculative-ngram-max", msg);
        }
        Ok(())
    }

    /// The proposer these settings describe.
    ///
    /// # Errors
    /// [`SpeculativeError::Invalid`] for settings [`Self::validate`] refuses.
    pub fn proposer(&self) -> Result<Box<dyn Proposer>, SpeculativeError> {
        self.validate()?;
        Ok(match self.method {
            Method::Ngram => Box::new(NgramProposer::new(self.ngram_min..=self.ngram_max)),
        })
    }
}

/// Errors of speculative settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpeculativeError {
    /// A setting that cannot work, naming its flag (without dashes).
    #[error("--{flag}: {msg}")]
    Invalid {
        /// The command-line flag.
        flag: &'static str,
        /// What is wrong with it.
        msg: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_name_their_flag() {
        for (config, flag) in [
            (SpeculativeConfig::ngram(0), "--num-speculative-tokens"),
            (SpeculativeConfig::ngram(MAX_SPECULATIVE_TOKENS + 1), "--num-speculative-tokens"),
            (SpeculativeConfig { ngram_min: 0, ..SpeculativeConfig::ngram(4) }, "--speculative-ngram-min"),
            (
                SpeculativeConfig { ngram_min: 3, ngram_max: 2, ..SpeculativeConfig::ngram(4) },
                "--speculative-ngram-max",
            ),
        ] {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
        assert!(SpeculativeConfig::ngram(MAX_SPECULATIVE_TOKENS).validate().is_ok());
        assert!(SpeculativeConfig::ngram(1).proposer().is_ok());
    }

    #[test]
    fn methods_are_found_by_name() {
        for name in METHOD_NAMES {
            assert_eq!(
                SpeculativeConfig { method: Method::from_name(name).unwrap(), ..SpeculativeConfig::ngram(3) }
                    .proposer()
                    .unwrap()
                    .name(),
                *name
            );
        }
        let err = Method::from_name("draft").unwrap_err().to_string();
        assert!(err.starts_with("--speculative: unknown method `draft`"), "{err}");
    }
}
