//! The command line, as clap types. Values are validated here into typed settings;
//! contradictions are errors before any work starts.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use met_kernels::DeviceKind;

/// met: an LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "met", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate continuations of token-id prompts, all in one batch.
    Generate(GenerateArgs),
}

/// Where weights come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadFormat {
    /// The checkpoint's safetensors files.
    Auto,
    /// Seeded random weights shaped by `config.json` alone (for benchmarks).
    Dummy,
}

/// Which model to load and how.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// A Hugging Face model directory (`config.json` + safetensors).
    #[arg(long)]
    pub model: PathBuf,
    /// Where the weights come from.
    #[arg(long, value_enum, default_value = "auto")]
    pub load_format: LoadFormat,
    /// Seed of `--load-format dummy` weights.
    #[arg(long, default_value_t = 0)]
    pub dummy_seed: u64,
    /// JSON object whose fields replace those of `config.json`, e.g. '{"num_hidden_layers": 2}'.
    #[arg(long)]
    pub hf_overrides: Option<String>,
    /// Device to run on: cpu, cuda or auto.
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceKind,
    /// Attention backend.
    #[arg(long, default_value = "paged")]
    pub attention_backend: String,
}

/// `met generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// A prompt as comma-separated token ids; repeat for more prompts.
    #[arg(long = "prompt-ids", value_name = "IDS", required = true, value_parser = parse_ids)]
    pub prompt_ids: Vec<Vec<u32>>,
    /// Tokens to generate per prompt.
    #[arg(long, default_value_t = 16)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Report the K most likely tokens and their logprobs at each step.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub top_logprobs: usize,
    /// Print one JSON object per prompt per line.
    #[arg(long)]
    pub json: bool,
}

fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Err("a prompt needs at least one token id".into());
    }
    s.split(',').map(|t| t.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", t.trim()))).collect()
}

fn parse_device(s: &str) -> Result<DeviceKind, String> {
    s.parse().map_err(|e: met_kernels::Error| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_and_reject_garbage() {
        assert_eq!(parse_ids("1, 2,3").unwrap(), [1, 2, 3]);
        assert!(parse_ids("1,x").unwrap_err().contains("`x`"));
        assert!(parse_ids("").is_err());
        assert!(parse_ids("-1").is_err());
        assert!(parse_ids("4294967296").is_err());
    }
}
