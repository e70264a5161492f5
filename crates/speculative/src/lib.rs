//! Speculative decoding for met: cheap guesses of a sequence's next tokens that the target
//! model checks in one forward pass.
//!
//! A [`Proposer`] looks at a sequence's tokens (prompt plus generated) and proposes up to
//! `k` tokens that may follow. The engine (`met-scheduler`) appends them to the sequence's
//! decode row as extra query rows, gets the target's logits for every one, and keeps the
//! longest prefix the target agrees with plus the target's own next token, so a proposer
//! can only change how fast tokens come, never which tokens come (greedy requests, and
//! sampled ones with point-mass proposals) or how they are distributed (proposals with
//! distributions). A wrong proposal costs the verification rows and nothing else.
//!
//! This crate holds the seam and the proposers; verification lives in the engine, which
//! owns the batch and the KV cache, and in the sampler, which does the rejection sampling
//! of sampled requests (`met_kernels::DraftToken`). [`NgramProposer`] is prompt lookup: it
//! finds the last few tokens earlier in the sequence and proposes what followed them there,
//! which pays off on input-grounded work (code edits, quoting answers).
//! [`EarlyExitProposer`] drafts with the target's own first layers in the target's cache
//! (it asks for the target, [`Proposer::uses_target`]), [`DraftModelProposer`] with a second
//! model in a cache of its own, kept per sequence by the stable sequence key the trait
//! hands every proposer. [`Proposal::probs`] carries a draft's distributions, from which
//! its tokens must have been drawn, for rejection sampling. A proposal without them is
//! verified as a point mass, which is exact for any tokens however they were chosen.

mod draft_model;
mod early_exit;
mod ngram;

use std::sync::Arc;

use met_cache::{KvCache, SequenceBlocks};
use met_config::{InvalidSetting, SamplingParams};
pub use met_config::{MAX_SPECULATIVE_TOKENS, SpeculativeConfig, SpeculativeMethod};
use met_kernels::{GpuBackend, SampleRow, Tensor};
use met_model_layers::Model;

pub use draft_model::DraftModelProposer;
pub use early_exit::EarlyExitProposer;
pub use ngram::NgramProposer;

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
    /// The target model and its cache, for proposers that draft with the target itself
    /// ([`Proposer::uses_target`]); `None` for the others.
    pub target: Option<TargetView<'a>>,
}

/// The target model, its KV cache and the sequence's blocks, lent to a proposer that drafts
/// with the target's own layers. Every token but the last of the context is in the cache,
/// and the blocks have room for `max_tokens` more positions after the context's last
/// token, so the proposer may write the K/V of the last token and of its own draft there
/// (the target's verification pass overwrites them).
#[derive(Clone, Copy)]
pub struct TargetView<'a> {
    /// The target model.
    pub model: &'a dyn Model,
    /// The target's KV cache.
    pub kv: &'a dyn KvCache,
    /// The sequence's blocks in it.
    pub blocks: &'a SequenceBlocks,
}

impl std::fmt::Debug for TargetView<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TargetView").field("blocks", &self.blocks.block_ids()).finish_non_exhaustive()
    }
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

    /// Whether it drafts with the target model itself, in the target's KV cache: the engine
    /// then reserves the slots of a full proposal before proposing and lends the target
    /// ([`ProposalContext::target`]).
    fn uses_target(&self) -> bool {
        false
    }
}

/// The proposer `config` describes, for the target `model` on `backend`.
///
/// # Errors
/// [`SpeculativeError::Invalid`] for settings [`SpeculativeConfig::validate`] refuses, and
/// for self-speculation on a model that cannot exit early or with as many layers as the
/// model has (the draft would be the target). A draft model is loaded by the caller
/// ([`DraftModelProposer::new`]), so [`SpeculativeMethod::Draft`] is refused here.
pub fn proposer(
    config: &SpeculativeConfig,
    model: &dyn Model,
    backend: Arc<dyn GpuBackend>,
) -> Result<Box<dyn Proposer>, SpeculativeError> {
    config.validate()?;
    Ok(match config.method {
        SpeculativeMethod::Ngram => Box::new(NgramProposer::new(config.ngram_min..=config.ngram_max)),
        SpeculativeMethod::SelfSpec => {
            let bad = |msg: String| SpeculativeError::Invalid(InvalidSetting::new("self-spec-layers", msg));
            let exit = model.early_exit().ok_or_else(|| bad("this model cannot run as its own draft".into()))?;
            let total = exit.num_layers();
            let layers = config.self_spec_layers.unwrap_or((total / 4).max(1));
            if layers >= total {
                return Err(bad(format!("{layers} is not below the model's {total} layers")));
            }
            Box::new(EarlyExitProposer::new(layers, backend))
        }
        SpeculativeMethod::Draft => {
            let msg = "--speculative draft needs the draft model (`--draft-model`)";
            return Err(SpeculativeError::Invalid(InvalidSetting::new("draft-model", msg)));
        }
    })
}
/// The argmax of logits row 0, taken by the backend's sampler (on the device, so only the
/// token comes back); `None` when sampling fails.
fn greedy_token(backend: &dyn GpuBackend, logits: &Tensor) -> Option<u32> {
    let greedy = SamplingParams::greedy();
    let row = SampleRow {
        logits_row: 0,
        params: &greedy,
        prompt: &[],
        output: &[],
        seed: 0,
        step: 0,
        banned: &[],
        draft: None,
    };
    Some(backend.sample(logits, &[row]).ok()?.first()?.token)
}

/// Errors of speculative settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpeculativeError {
    /// A setting that cannot work, naming its flag.
    #[error(transparent)]
    Invalid(#[from] InvalidSetting),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_name_their_flag() {
        let build = |config: &SpeculativeConfig| proposer(config, &mock::Layered(4), mock::backend());
        for (config, flag) in [
            (SpeculativeConfig::ngram(0), "--num-speculative-tokens"),
            (SpeculativeConfig::ngram(MAX_SPECULATIVE_TOKENS + 1), "--num-speculative-tokens"),
            (SpeculativeConfig { ngram_min: 0, ..SpeculativeConfig::ngram(4) }, "--speculative-ngram-min"),
            (
                SpeculativeConfig { ngram_min: 3, ngram_max: 2, ..SpeculativeConfig::ngram(4) },
                "--speculative-ngram-max",
            ),
            (SpeculativeConfig::self_spec(4, Some(0)), "--self-spec-layers: must be positive"),
            (SpeculativeConfig { max_batch: Some(0), ..SpeculativeConfig::ngram(4) }, "--speculative-max-batch: must"),
            (
                SpeculativeConfig { self_spec_layers: Some(2), ..SpeculativeConfig::ngram(4) },
                "--self-spec-layers: needs",
            ),
        ] {
            let err = build(&config).err().expect("refused").to_string();
            assert!(err.starts_with(flag), "{err}");
        }
        assert!(build(&SpeculativeConfig::ngram(MAX_SPECULATIVE_TOKENS)).is_ok());
        assert!(build(&SpeculativeConfig::ngram(1)).is_ok());
    }

    #[test]
    fn self_speculation_needs_fewer_layers_than_the_target() {
        let proposer =
            |layers, model: &dyn Model| proposer(&SpeculativeConfig::self_spec(4, layers), model, mock::backend());
        assert!(proposer(Some(3), &mock::Layered(4)).is_ok());
        assert!(proposer(None, &mock::Layered(1)).is_err(), "a quarter of one layer is one layer, the target");
        for (layers, want) in
            [(Some(4), "--self-spec-layers: 4 is not below the model's 4 layers"), (Some(9), "9 is not")]
        {
            let err = proposer(layers, &mock::Layered(4)).err().expect("refused").to_string();
            assert!(err.contains(want), "{err}");
        }
        let err = proposer(Some(1), &mock::NoExit).err().expect("refused").to_string();
        assert!(err.contains("this model cannot run as its own draft"), "{err}");
    }

    #[test]
    fn each_method_builds_its_proposer() {
        for &method in SpeculativeMethod::ALL {
            let config = SpeculativeConfig { method, ..SpeculativeConfig::ngram(3) };
            match proposer(&config, &mock::Layered(8), mock::backend()) {
                Ok(proposer) => assert_eq!(proposer.name(), method.name()),
                // The draft model is loaded by the caller (`DraftModelProposer::new`).
                Err(e) => assert!(
                    method == SpeculativeMethod::Draft && e.to_string().starts_with("--draft-model: "),
                    "{method}: {e}"
                ),
            }
        }
    }

    /// Models that only answer what building a proposer asks.
    mod mock {
        use std::sync::Arc;

        use met_cache::{KvCache, KvLayout};
        use met_kernels::{CpuBackend, DType, GpuBackend, Tensor};
        use met_model_layers::{EarlyExit, ForwardBatch, Model, ModelError, Result};

        pub(super) fn backend() -> Arc<dyn GpuBackend> {
            Arc::new(CpuBackend::new())
        }

        /// A model of this many layers that can exit early (and never runs).
        pub(super) struct Layered(pub usize);

        /// A model that cannot exit early.
        pub(super) struct NoExit;

        fn unused() -> ModelError {
            ModelError::Unsupported("a test double that never runs".into())
        }

        macro_rules! facts {
            () => {
                fn forward(&self, _: &ForwardBatch, _: &mut dyn KvCache) -> Result<Tensor> {
                    Err(unused())
                }
                fn vocab_size(&self) -> usize {
                    8
                }
                fn kv_layout(&self) -> KvLayout {
                    KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 2, dtype: DType::F32, state: None }
                }
                fn max_context(&self) -> usize {
                    64
                }
            };
        }

        impl Model for Layered {
            facts!();
            fn early_exit(&self) -> Option<&dyn EarlyExit> {
                Some(self)
            }
        }

        impl EarlyExit for Layered {
            fn num_layers(&self) -> usize {
                self.0
            }
            fn forward_early_exit(&self, _: &ForwardBatch, _: &dyn KvCache, _: usize) -> Result<Tensor> {
                Err(unused())
            }
        }

        impl Model for NoExit {
            facts!();
        }
    }
}
