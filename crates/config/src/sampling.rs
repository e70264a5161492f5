//! `SamplingParams`: how one request turns logits into tokens.

use crate::RequestField;

/// Per-request sampling settings, validated by [`SamplingParams::validate`]. The defaults
/// are the identity: temperature 1, no truncation, no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Divides the logits; 0 selects greedy decoding (argmax after penalties and bias).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`; 1
    /// keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens seen in the prompt or the
    /// output so far (Hugging Face's rule); 1 is off.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token already generated (OpenAI's rule).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit per time it was already generated (OpenAI's rule).
    pub frequency_penalty: f32,
    /// Added to the logits of the given tokens before anything else.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of this request's random stream. The server pins one for every request so
    /// that a request's draws never depend on what else shares the batch.
    pub seed: u64,
    /// `None`: no logprobs. `Some(k)`: the sampled token's logprob and the `k` most
    /// likely alternatives, computed from the model's raw logits.
    pub logprobs: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: 0,
            logprobs: None,
        }
    }
}

/// Largest `top_logprobs` a request may ask for.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A sampling setting outside its domain, naming the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{field}`: {msg}")]
pub struct InvalidSampling {
    /// The field.
    pub field: RequestField,
    /// What is wrong with it.
    pub msg: String,
}

impl SamplingParams {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// Whether decoding is greedy.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Checks every field against its domain for a model of `vocab_size` tokens.
    ///
    /// # Errors
    /// The first field out of range.
    pub fn validate(&self, vocab_size: usize) -> Result<(), InvalidSampling> {
        let bad = |field, msg: String| Err(InvalidSampling { field, msg });
        let finite = |field, x: f32| if x.is_finite() { Ok(()) } else { bad(field, format!("{x} is not finite")) };
        finite(RequestField::Temperature, self.temperature)?;
        if !(0.0..=100.0).contains(&self.temperature) {
            return bad(RequestField::Temperature, format!("{} is outside [0, 100]", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(RequestField::TopP, format!("{} is outside (0, 1]", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(RequestField::MinP, format!("{} is outside [0, 1]", self.min_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty <= 100.0) {
            return bad(RequestField::RepetitionPenalty, format!("{} is outside (0, 100]", self.repetition_penalty));
        }
        for (field, x) in [
            (RequestField::PresencePenalty, self.presence_penalty),
            (RequestField::FrequencyPenalty, self.frequency_penalty),
        ] {
            if !(-2.0..=2.0).contains(&x) {
                return bad(field, format!("{x} is outside [-2, 2]"));
            }
        }
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                return bad(
                    RequestField::LogitBias,
                    format!("token {token} is outside the vocabulary of {vocab_size}"),
                );
            }
            if !(-100.0..=100.0).contains(&bias) {
                return bad(RequestField::LogitBias, format!("bias {bias} for token {token} is outside [-100, 100]"));
            }
        }
        if let Some(k) = self.logprobs.filter(|&k| k > MAX_TOP_LOGPROBS) {
            return bad(RequestField::TopLogprobs, format!("{k} exceeds the maximum of {MAX_TOP_LOGPROBS}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_out_of_range_fields_are_named() {
        assert!(SamplingParams::default().validate(10).is_ok());
        assert!(SamplingParams::greedy().is_greedy());
        let cases: [(SamplingParams, &str); 8] = [
            (SamplingParams { temperature: -1.0, ..Default::default() }, "temperature"),
            (SamplingParams { temperature: f32::NAN, ..Default::default() }, "temperature"),
            (SamplingParams { top_p: 0.0, ..Default::default() }, "top_p"),
            (SamplingParams { min_p: 1.5, ..Default::default() }, "min_p"),
            (SamplingParams { repetition_penalty: 0.0, ..Default::default() }, "repetition_penalty"),
            (SamplingParams { frequency_penalty: 3.0, ..Default::default() }, "frequency_penalty"),
            (SamplingParams { logit_bias: vec![(10, 1.0)], ..Default::default() }, "logit_bias"),
            (SamplingParams { logprobs: Some(21), ..Default::default() }, "top_logprobs"),
        ];
        for (params, field) in cases {
            assert_eq!(params.validate(10).unwrap_err().field.name(), field);
        }
    }
}
