//! [`RequestField`]: the request fields the engine's checks can refuse, as a typed value, so
//! that each API dialect names them its own way (`max_tokens`, `max_completion_tokens`,
//! `max_output_tokens`) without rewriting messages.

/// A field of a generation request that a check below the HTTP layer can refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestField {
    /// The prompt (`prompt`, `messages`, `input`).
    Prompt,
    /// The most tokens to generate.
    MaxTokens,
    /// The fewest tokens to generate before an end token may end the sequence.
    MinTokens,
    /// Continuations per prompt.
    N,
    /// Extra token ids that end generation.
    StopTokenIds,
    /// The sampling temperature.
    Temperature,
    /// Nucleus sampling's threshold.
    TopP,
    /// Min-p sampling's threshold.
    MinP,
    /// Hugging Face's repetition penalty.
    RepetitionPenalty,
    /// OpenAI's presence penalty.
    PresencePenalty,
    /// OpenAI's frequency penalty.
    FrequencyPenalty,
    /// Biases added to given tokens' logits.
    LogitBias,
    /// How many alternatives' logprobs to report (`top_logprobs`; `logprobs` in completions).
    TopLogprobs,
}

impl RequestField {
    /// Its name in OpenAI's chat completions API, the default every dialect starts from.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Prompt => "prompt",
            Self::MaxTokens => "max_tokens",
            Self::MinTokens => "min_tokens",
            Self::N => "n",
            Self::StopTokenIds => "stop_token_ids",
            Self::Temperature => "temperature",
            Self::TopP => "top_p",
            Self::MinP => "min_p",
            Self::RepetitionPenalty => "repetition_penalty",
            Self::PresencePenalty => "presence_penalty",
            Self::FrequencyPenalty => "frequency_penalty",
            Self::LogitBias => "logit_bias",
            Self::TopLogprobs => "top_logprobs",
        }
    }
}

impl std::fmt::Display for RequestField {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
