//! What one load test is: the server, the workload and the ladder ([`ServeArgs`]), as plain
//! values a library caller fills in and, through clap's derive, the flags of `met bench serve`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

/// Where prompts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DatasetKind {
    /// Random token ids of exactly `--input-len` (after a shared `--prefix-len`), generating
    /// exactly `--output-len` tokens.
    Random,
    /// One JSON object per line: `{"prompt": "...", "max_tokens": N}` (`max_tokens` optional).
    Jsonl,
    /// ShareGPT conversations (vLLM's benchmark format): the first human turn is the prompt.
    Sharegpt,
}

impl DatasetKind {
    /// The name the flag and the result use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::Jsonl => "jsonl",
            Self::Sharegpt => "sharegpt",
        }
    }
}

/// The OpenAI endpoint the load goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    /// `/v1/completions` with `prompt`.
    Completions,
    /// `/v1/chat/completions` with one user message.
    Chat,
}

impl Endpoint {
    /// The name the flag and the result use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Completions => "completions",
            Self::Chat => "chat",
        }
    }
}

/// A half-open range of token ids, `LO..HI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The smallest id drawn.
    pub lo: u32,
    /// One past the largest id drawn.
    pub hi: u32,
}

impl std::str::FromStr for IdRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (lo, hi) = s.split_once("..").ok_or_else(|| format!("`{s}` is not LO..HI"))?;
        let id = |t: &str| t.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", t.trim()));
        let (lo, hi) = (id(lo)?, id(hi)?);
        if lo >= hi {
            return Err(format!("`{s}` is empty"));
        }
        Ok(Self { lo, hi })
    }
}

/// One load test: a bounded load generator that only talks to `--base-url`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// The server, plain HTTP: `http://127.0.0.1:8888` (a trailing `/v1` is allowed).
    #[arg(long, value_name = "URL")]
    pub base_url: String,
    /// The endpoint to drive.
    #[arg(long, value_enum, default_value = "completions")]
    pub endpoint: Endpoint,
    /// The model id sent with each request (default: the first id `GET /v1/models` lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Where prompts come from.
    #[arg(long, value_enum, default_value = "random")]
    pub dataset: DatasetKind,
    /// The file of `--dataset jsonl` or `--dataset sharegpt`.
    #[arg(long, value_name = "FILE")]
    pub dataset_path: Option<PathBuf>,
    /// Prompt tokens of `--dataset random`, after the shared prefix.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens to generate per request (default: 128 for `random`; a JSONL line's
    /// `max_tokens`, or a ShareGPT reply's length in characters / 4).
    #[arg(long)]
    pub output_len: Option<usize>,
    /// Token ids every `--dataset random` prompt starts with (a prefix-cache workload).
    #[arg(long, default_value_t = 0)]
    pub prefix_len: usize,
    /// Random prompt ids are drawn uniformly from LO..HI (keep it inside the vocabulary and
    /// clear of special tokens).
    #[arg(long, value_name = "LO..HI", default_value = "1000..30000")]
    pub random_ids: IdRange,
    /// Measured requests per ladder point.
    #[arg(long, default_value_t = 100)]
    pub num_prompts: usize,
    /// Seed of random prompts, of the ShareGPT sample and of the arrival times.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Send `ignore_eos` for file datasets too (`random` always does).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Requests in flight at once, as a ladder: `1,4,16,64` runs once per value (default 1).
    #[arg(long, value_delimiter = ',', conflicts_with = "request_rate")]
    pub concurrency: Vec<usize>,
    /// Requests per second, arriving as a Poisson process (see `--burstiness`), as a ladder:
    /// `1,2,4` runs once per value.
    #[arg(long, value_delimiter = ',')]
    pub request_rate: Vec<f64>,
    /// Shape of the gamma-distributed gaps between arrivals (mean 1 / rate): 1 is Poisson,
    /// smaller is burstier, larger is more even.
    #[arg(long, default_value_t = 1.0, requires = "request_rate")]
    pub burstiness: f64,
    /// Warm-up requests before each ladder point; not counted.
    #[arg(long, default_value_t = 1)]
    pub num_warmup: usize,
    /// Goodput counts only requests whose time to first token is at most this.
    #[arg(long, value_name = "MS")]
    pub slo_ttft_ms: Option<f64>,
    /// Goodput counts only requests whose time per output token is at most this.
    #[arg(long, value_name = "MS")]
    pub slo_tpot_ms: Option<f64>,
    /// A request taking longer is abandoned and counted as a timeout.
    #[arg(long, value_name = "SECONDS", default_value_t = 300.0)]
    pub timeout_s: f64,
    /// The whole benchmark stops after this long: in-flight requests are cancelled and the
    /// ladder points not reached are skipped.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600.0)]
    pub max_duration_s: f64,
    /// Write the result (settings, machine, every figure per ladder point) as JSON.
    #[arg(long, value_name = "FILE.json")]
    pub output: Option<PathBuf>,
    /// Draw the result as an SVG (as `met bench plot` does).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The name of this result in plots (default: the model id).
    #[arg(long)]
    pub label: Option<String>,
    /// No progress bar and no table.
    #[arg(long)]
    pub quiet: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_ranges_parse_and_refuse_empty_ones() {
        assert_eq!("5..9".parse::<IdRange>(), Ok(IdRange { lo: 5, hi: 9 }));
        assert!("5..5".parse::<IdRange>().is_err() && "9".parse::<IdRange>().is_err());
        assert!("a..9".parse::<IdRange>().unwrap_err().contains("`a`"));
    }
}
