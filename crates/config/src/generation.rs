//! `GenerationConfig`: a checkpoint's `generation_config.json`.

use std::path::Path;

use crate::ConfigError;
use crate::fields::{RawConfig, read};

/// End-of-sequence ids and default sampling settings a checkpoint ships with. Every field
/// is optional in the file; absent fields are `None` (or empty).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// Tokens that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Beginning-of-sequence token.
    pub bos_token_id: Option<u32>,
    /// Padding token.
    pub pad_token_id: Option<u32>,
    /// Whether the model samples by default (otherwise greedy).
    pub do_sample: Option<bool>,
    /// Default temperature.
    pub temperature: Option<f64>,
    /// Default nucleus threshold.
    pub top_p: Option<f64>,
    /// Default top-k.
    pub top_k: Option<usize>,
    /// Default min-p.
    pub min_p: Option<f64>,
    /// Default repetition penalty.
    pub repetition_penalty: Option<f64>,
    /// Default cap on new tokens.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads a `generation_config.json`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the bad field.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(path, &read(path)?)
    }

    /// Parses the text of a `generation_config.json`; `path` is used in messages only.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the bad field.
    pub fn from_json(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let map = RawConfig::parse(path, text)?;
        let f = RawConfig::new(path, &map);
        Ok(Self {
            eos_token_ids: f.ids("eos_token_id")?,
            bos_token_id: f.ids("bos_token_id")?.first().copied(),
            pad_token_id: f.ids("pad_token_id")?.first().copied(),
            do_sample: f.opt_bool("do_sample")?,
            temperature: f.opt_f64("temperature")?,
            top_p: f.opt_f64("top_p")?,
            top_k: f.opt_usize("top_k")?,
            min_p: f.opt_f64("min_p")?,
            repetition_penalty: f.opt_f64("repetition_penalty")?,
            max_new_tokens: f.opt_usize("max_new_tokens")?,
        })
    }
}
