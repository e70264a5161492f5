//! `met generate` and `met tokenize`: their flags, and the job they become.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use met_config::SamplingParams;
use met_scheduler::StopCriteria;

use super::engine::{EngineArgs, ModelArgs, settings};
use crate::batch::Draft;
use crate::generate::GenerateJob;

/// `met generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A prompt as text, tokenized as the model's Hugging Face tokenizer does (special-token
    /// text such as `<|im_start|>` becomes that token); repeat for more prompts.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Vec<String>,
    /// A user message, rendered with the model's chat template; repeat for more prompts.
    #[arg(long, value_name = "TEXT")]
    pub chat: Vec<String>,
    /// A system message for every `--chat` prompt.
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub system: Option<String>,
    /// A prompt as comma-separated token ids; repeat for more prompts.
    #[arg(long = "prompt-ids", value_name = "IDS", value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<u32>>,
    /// A JSONL file of prompts: one object per line with `prompt_ids` and, optionally,
    /// per-prompt `max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `n` and
    /// `priority` (lower first, under `--policy priority`).
    #[arg(long, value_name = "FILE")]
    pub prompts_file: Option<PathBuf>,
    /// Sampling settings, the defaults of every prompt.
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Engine settings.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print one JSON object per prompt (and continuation) per line.
    #[arg(long)]
    pub json: bool,
    /// Print prefill and decode throughput (one JSON object on stderr): steps until the
    /// first token count as prefill, later steps as decode; with `--speculative`, the
    /// drafts' acceptance too (`speculative`).
    #[arg(long)]
    pub timing: bool,
}

impl GenerateArgs {
    /// Runs `met generate` with these flags.
    ///
    /// # Errors
    /// A bad flag, or any failure of the run.
    pub fn run(&self) -> Result<()> {
        let (load, setup) = settings(&self.model, &self.engine)?;
        let job = GenerateJob {
            texts: self.prompt.clone(),
            chats: self.chat.clone(),
            system: self.system.clone(),
            ids: self.prompt_ids.clone(),
            prompts_file: self.prompts_file.clone(),
            defaults: self.sampling.defaults(),
            seed: self.sampling.seed,
            json: self.json,
            timing: self.timing,
        };
        crate::generate::run(&load, &setup, &job)
    }
}

/// How tokens are drawn (the OpenAI request fields, as flags).
#[derive(Debug, Clone, Args)]
pub struct SamplingArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens less likely than this fraction of the best one.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Hugging Face repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// OpenAI presence penalty.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Logit biases as `ID:BIAS,ID:BIAS`.
    #[arg(long, value_parser = parse_bias, default_value = "")]
    pub logit_bias: LogitBias,
    /// Seed of the first prompt's random stream (prompt i uses seed + i); random when
    /// absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// End tokens are banned until this many tokens were generated.
    #[arg(long, default_value_t = 0)]
    pub min_tokens: usize,
    /// Extra token ids that end generation, comma separated.
    #[arg(long, value_delimiter = ',')]
    pub stop_token_ids: Vec<u32>,
    /// Generate through end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Continuations per prompt.
    #[arg(short = 'n', long = "n", default_value_t = 1)]
    pub n: usize,
    /// Report the K most likely tokens and their logprobs at each step.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_logprobs: usize,
}

impl SamplingArgs {
    /// The request every prompt starts from: these settings, no prompt, no seed yet.
    pub fn defaults(&self) -> Draft {
        Draft {
            prompt: Vec::new(),
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                repetition_penalty: self.repetition_penalty,
                presence_penalty: self.presence_penalty,
                frequency_penalty: self.frequency_penalty,
                logit_bias: self.logit_bias.0.clone(),
                seed: 0,
                logprobs: (self.top_logprobs > 0).then_some(self.top_logprobs),
            },
            stop: StopCriteria {
                max_new_tokens: self.max_tokens,
                min_new_tokens: self.min_tokens,
                stop_token_ids: self.stop_token_ids.clone(),
                eos_token_ids: Vec::new(),
                ignore_eos: self.ignore_eos,
            },
            n: self.n,
            priority: 0,
            seed: None,
        }
    }
}

/// Logit biases parsed from `ID:BIAS,...`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias(pub Vec<(u32, f32)>);

/// `met tokenize`.
#[derive(Debug, Args)]
pub struct TokenizeArgs {
    /// The model whose tokenizer to use (default: the embedded default model).
    #[arg(long)]
    pub model: Option<String>,
    /// Do not add the tokenizer's special tokens (bos) around the text.
    #[arg(long)]
    pub no_special_tokens: bool,
    /// Comma-separated ids to decode instead of text to encode.
    #[arg(long, value_name = "IDS", value_parser = parse_token_ids, conflicts_with = "text")]
    pub decode: Option<TokenIds>,
    /// The text to tokenize.
    #[arg(required_unless_present = "decode")]
    pub text: Option<String>,
}

impl TokenizeArgs {
    /// Runs `met tokenize` with these flags.
    ///
    /// # Errors
    /// A model without a tokenizer, or text or ids it cannot take.
    pub fn run(&self) -> Result<()> {
        let what = match (&self.decode, &self.text) {
            (Some(TokenIds(ids)), _) => crate::tokenize::Input::Ids(ids),
            (None, Some(text)) => crate::tokenize::Input::Text { text, special_tokens: !self.no_special_tokens },
            (None, None) => anyhow::bail!("give TEXT or --decode IDS"),
        };
        crate::tokenize::run(self.model.as_deref(), &what)
    }
}

/// Comma-separated token ids as one value (clap would read a bare `Vec` as many values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

fn parse_token_ids(s: &str) -> Result<TokenIds, String> {
    parse_ids(s).map(TokenIds)
}

pub(super) fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Err("a prompt needs at least one token id".into());
    }
    s.split(',').map(|t| t.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", t.trim()))).collect()
}

pub(super) fn parse_bias(s: &str) -> Result<LogitBias, String> {
    let pairs = s.split(',').filter(|p| !p.trim().is_empty()).map(|p| {
        let (id, bias) = p.split_once(':').ok_or_else(|| format!("`{p}` is not ID:BIAS"))?;
        let id = id.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", id.trim()))?;
        let bias = bias.trim().parse::<f32>().map_err(|_| format!("`{}` is not a number", bias.trim()))?;
        Ok((id, bias))
    });
    pairs.collect::<Result<_, String>>().map(LogitBias)
}
