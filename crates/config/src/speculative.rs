//! `SpeculativeConfig`: how an engine proposes tokens for its model to verify (the proposers
//! themselves live in `met-speculative`; this is the validated setting they are built from).

use crate::engine::InvalidSetting;
use crate::named::named_enum;

/// The most tokens one proposal may hold (`--num-speculative-tokens`). Verifying more rows
/// per step than this costs more than the rare long acceptances save.
pub const MAX_SPECULATIVE_TOKENS: usize = 16;

named_enum! {
    /// How proposals are made.
    pub enum SpeculativeMethod ("speculative method") {
        /// Prompt lookup: what followed the last few tokens earlier in the prompt or output.
        Ngram = "ngram",
        /// Self-speculation: the model's own first layers and its head draft.
        SelfSpec = "self",
        /// A second, smaller model of the same vocabulary drafts.
        Draft = "draft",
    }
}

/// Speculative decoding settings of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeculativeConfig {
    /// How tokens are proposed.
    pub method: SpeculativeMethod,
    /// The most tokens proposed (and verified) per sequence and step.
    pub num_tokens: usize,
    /// The shortest suffix prompt lookup matches.
    pub ngram_min: usize,
    /// The longest suffix prompt lookup matches (tried first).
    pub ngram_max: usize,
    /// Self-speculation's draft depth: layers of the target before the early exit; `None`
    /// for a quarter of the target's layers.
    pub self_spec_layers: Option<usize>,
    /// Whether each sequence's draft length adapts to its acceptance (up to `num_tokens`):
    /// two more after a draft accepted whole, one fewer after a rejection.
    pub adaptive: bool,
    /// Speculation pauses while more sequences than this run (`None`: never).
    pub max_batch: Option<usize>,
    /// The draft model of [`SpeculativeMethod::Draft`] (a directory, `.gguf` or hub id), which
    /// startup loads; `None` for the other methods.
    pub draft_model: Option<String>,
}

impl SpeculativeConfig {
    /// Prompt lookup proposing up to `num_tokens`, matching suffixes of 4 down to 2 tokens
    /// (single-token matches are mostly coincidences that cost verification rows), with
    /// adaptive `k` and no batch limit.
    pub fn ngram(num_tokens: usize) -> Self {
        Self {
            method: SpeculativeMethod::Ngram,
            num_tokens,
            ngram_min: 2,
            ngram_max: 4,
            self_spec_layers: None,
            adaptive: true,
            max_batch: None,
            draft_model: None,
        }
    }

    /// Self-speculation proposing up to `num_tokens` from the target's first `layers` layers
    /// (`None`: a quarter of them).
    pub fn self_spec(num_tokens: usize, layers: Option<usize>) -> Self {
        Self { method: SpeculativeMethod::SelfSpec, self_spec_layers: layers, ..Self::ngram(num_tokens) }
    }

    /// Checks every setting.
    ///
    /// # Errors
    /// [`InvalidSetting`] naming the flag of the first bad setting.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let bad = |flag, msg: String| Err(InvalidSetting::new(flag, msg));
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
        if self.max_batch == Some(0) {
            return bad("speculative-max-batch", "must be positive".into());
        }
        if self.self_spec_layers == Some(0) {
            return bad("self-spec-layers", "must be positive".into());
        }
        if self.self_spec_layers.is_some() && self.method != SpeculativeMethod::SelfSpec {
            return bad("self-spec-layers", "needs --speculative self".into());
        }
        if self.draft_model.is_some() && self.method != SpeculativeMethod::Draft {
            return bad("draft-model", "needs --speculative draft".into());
        }
        Ok(())
    }
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
        for (config, flag) in [
            (SpeculativeConfig::self_spec(4, Some(0)), "--self-spec-layers: must be positive"),
            (SpeculativeConfig { max_batch: Some(0), ..SpeculativeConfig::ngram(4) }, "--speculative-max-batch: must"),
            (
                SpeculativeConfig { self_spec_layers: Some(2), ..SpeculativeConfig::ngram(4) },
                "--self-spec-layers: needs",
            ),
            (
                SpeculativeConfig { draft_model: Some("m".into()), ..SpeculativeConfig::ngram(4) },
                "--draft-model: needs --speculative draft",
            ),
        ] {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
    }

    #[test]
    fn methods_are_found_by_name() {
        for (name, method) in [
            ("ngram", SpeculativeMethod::Ngram),
            ("self", SpeculativeMethod::SelfSpec),
            ("draft", SpeculativeMethod::Draft),
        ] {
            assert_eq!(name.parse::<SpeculativeMethod>(), Ok(method));
        }
        let err = "medusa".parse::<SpeculativeMethod>().unwrap_err().to_string();
        assert!(err.starts_with("unknown speculative method `medusa` (expected one of: ngram, self, draft)"), "{err}");
    }
}
