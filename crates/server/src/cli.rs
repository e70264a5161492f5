//! The command line, as clap types. Values are validated here into typed settings;
//! contradictions are errors before any work starts.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use met_kernels::{CpuDots, DeviceKind};

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
    /// Generate continuations of prompts (text, chat messages or token ids), all in one batch.
    Generate(Box<GenerateArgs>),
    /// Print the token ids of TEXT as a JSON array (or, with --decode, the text of ids).
    Tokenize(TokenizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Measure speed: load-test a server (`bench serve`), the engine alone (`bench
    /// throughput`, `bench latency`), draw results (`bench plot`).
    Bench(BenchArgs),
}

/// `met bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks of `met bench`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Load-test any OpenAI-compatible server (met, vLLM, SGLang, llama-server): stream
    /// requests at a concurrency or request-rate ladder, report TTFT, TPOT, ITL, latency,
    /// throughput, goodput and errors.
    Serve(Box<BenchServeArgs>),
    /// Draw `met bench serve --output` files in one SVG, one line per file.
    Plot(BenchPlotArgs),
    /// Offline throughput: N random-prompt requests through the engine at once, no HTTP.
    Throughput(Box<crate::bench::offline::ThroughputArgs>),
    /// Offline latency: one batch, per-step decode latency and prefill time, no HTTP.
    Latency(Box<crate::bench::offline::LatencyArgs>),
}

/// Where `met bench serve` prompts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchDataset {
    /// Random token ids of exactly `--input-len` (after a shared `--prefix-len`), generating
    /// exactly `--output-len` tokens.
    Random,
    /// One JSON object per line: `{"prompt": "...", "max_tokens": N}` (`max_tokens` optional).
    Jsonl,
    /// ShareGPT conversations (vLLM's benchmark format): the first human turn is the prompt.
    Sharegpt,
}

/// The OpenAI endpoint `met bench serve` drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchEndpoint {
    /// `/v1/completions` with `prompt`.
    Completions,
    /// `/v1/chat/completions` with one user message.
    Chat,
}

/// `met bench serve`: a bounded load generator. It only talks to `--base-url`.
#[derive(Debug, Clone, Args)]
pub struct BenchServeArgs {
    /// The server, plain HTTP: `http://127.0.0.1:8888` (a trailing `/v1` is allowed).
    #[arg(long, value_name = "URL")]
    pub base_url: String,
    /// The endpoint to drive.
    #[arg(long, value_enum, default_value = "completions")]
    pub endpoint: BenchEndpoint,
    /// The model id sent with each request (default: the first id `GET /v1/models` lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Where prompts come from.
    #[arg(long, value_enum, default_value = "random")]
    pub dataset: BenchDataset,
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
    #[arg(long, value_name = "LO..HI", default_value = "1000..30000", value_parser = parse_id_range)]
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

/// `met bench plot`.
#[derive(Debug, Args)]
pub struct BenchPlotArgs {
    /// Result files of `met bench serve --output`.
    #[arg(required = true, value_name = "RESULT.json")]
    pub results: Vec<PathBuf>,
    /// The SVG to write.
    #[arg(short = 'o', long, value_name = "FILE.svg")]
    pub output: PathBuf,
}

/// A half-open range of token ids, `LO..HI`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// The smallest id drawn.
    pub lo: u32,
    /// One past the largest id drawn.
    pub hi: u32,
}

/// `met serve`. Every long flag can also come from `--config FILE.toml`, whose keys are
/// the flag names (`max-num-seqs = 64`); a flag given on the command line wins.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The model, as `--model` takes it (default: the embedded default model).
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub model_path: Option<String>,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine settings. Without `--kv-blocks` the KV cache takes `--gpu-memory-utilization`
    /// of the device memory left after a warm-up step, or 1 GiB on the CPU, but never more
    /// than `--max-num-seqs` full contexts need.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8888)]
    pub port: u16,
    /// The model id clients use and `/v1/models` lists (default: the model's file or
    /// directory name, or the hub id it was given as).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on every route but `/health` (an empty key is an
    /// error).
    #[arg(long, env = "MET_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Generation requests served at once; more are answered 429.
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_requests: usize,
    /// Largest request body accepted, in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// On SIGINT or SIGTERM, seconds to let in-flight requests finish before cancelling them.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_secs: u64,
    /// Most sequences one request may run: its prompts times `n` (default: `--max-num-seqs`).
    /// More is answered 400, so one request cannot hold the whole engine.
    #[arg(long, value_name = "N")]
    pub max_sequences_per_request: Option<usize>,
    /// `max_tokens` of a request that gives none (nor `max_completion_tokens`), and the most
    /// one may ask for: at most this many tokens per choice, and never past the model's
    /// context. A request whose `max_tokens` or `min_tokens` is above it is answered 400.
    #[arg(long, value_name = "TOKENS", default_value_t = crate::serve::DEFAULT_MAX_TOKENS)]
    pub max_tokens_default: usize,
    /// Let `/metrics` answer without the API key (for a scraper on a trusted network).
    #[arg(long)]
    pub metrics_without_auth: bool,
    /// Origins browsers may call the API from, comma separated (`http://localhost:3000`;
    /// `*` for any); requests from other origins are answered 403. Default: none.
    #[arg(long, value_delimiter = ',', value_name = "ORIGINS")]
    pub allowed_origins: Vec<String>,
    /// Seconds a client has to send a request's headers, and again its body; an idle
    /// keep-alive connection is closed after the same time.
    #[arg(long, default_value_t = 30)]
    pub http_read_timeout_secs: u64,
    /// Open connections at most; more wait in the listen queue until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Keep special-token text in user messages (`<|im_start|>`) as text, so a user cannot
    /// write control tokens; by default it becomes those tokens, as in transformers.
    #[arg(long)]
    pub no_special_tokens_in_user_content: bool,
    /// How tool calls are found in chat answers with `tool_choice: auto` (default: the
    /// format the chat template uses, Hermes `<tool_call>` blocks when it shows none).
    #[arg(long, value_name = "PARSER", value_parser = clap::builder::PossibleValuesParser::new(crate::serve::PARSER_NAMES))]
    pub tool_call_parser: Option<String>,
    /// Split `<think>` reasoning off chat answers into `reasoning_content` (default: off).
    #[arg(long, value_name = "PARSER", value_parser = clap::builder::PossibleValuesParser::new(crate::serve::REASONING_PARSER_NAMES))]
    pub reasoning_parser: Option<String>,
    /// A TOML file of flags (`port = 9000`, `no-prefix-caching = true`); unknown keys are
    /// errors.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

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
    /// The model: a Hugging Face directory, a `.gguf` file, or a hub id in the local
    /// Hugging Face cache. Default: the embedded SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<String>,
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
    /// CPU dot products with Q4_0/Q4_1/Q8_0 weights in decode: int8 (activations quantised
    /// to 8 bits per block, integer SIMD, as llama.cpp's q8 dots: about 15 % faster decode
    /// on the default model; a greedy pick can change where the top two tokens are within
    /// the quantisation noise, and a step of 32 rows or more computes exactly) or exact
    /// (f32, the reference the equivalence tests use).
    #[arg(long, default_value = "int8", value_parser = parse_cpu_dots)]
    pub cpu_dots: CpuDots,
    /// Attention backend: flash (the device's fastest kernels) or paged (the reference).
    #[arg(long, default_value = met_kernels::attention::ATTENTION_BACKENDS[0],
          value_parser = clap::builder::PossibleValuesParser::new(met_kernels::attention::ATTENTION_BACKENDS))]
    pub attention_backend: String,
    /// Devices to split the model across (tensor parallelism): GPUs 0..N over NCCL with
    /// CUDA, N ranks sharing the cores on the CPU. N must divide the attention heads.
    #[arg(long, default_value_t = 1, value_parser = parse_world)]
    pub tensor_parallel_size: usize,
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

/// Logit biases parsed from `ID:BIAS,...`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogitBias(pub Vec<(u32, f32)>);

/// Scheduling budgets and the KV cache.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Most sequences per step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens per step.
    #[arg(long, default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Most prompt tokens of one sequence per step (chunked prefill); default: the budget.
    #[arg(long)]
    pub max_prefill_chunk: Option<usize>,
    /// KV cache blocks (default for `generate`: enough for every request at once; for
    /// `serve`: what `--gpu-memory-utilization` of the device memory holds, or 1 GiB on the
    /// CPU).
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Share of the device memory left free after a warm-up step at the largest batch that
    /// the KV cache may take (devices with memory of their own, i.e. GPUs).
    #[arg(long, default_value_t = 0.9, value_parser = parse_utilization)]
    pub gpu_memory_utilization: f64,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Scheduling policy.
    #[arg(long, default_value = "fcfs", value_parser = clap::builder::PossibleValuesParser::new(met_scheduler::POLICY_NAMES))]
    pub policy: String,
    /// Run every step eagerly: no CUDA graphs of decode steps.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Queue each decode step before reading the tokens of the step before, so that
    /// scheduling and bookkeeping on the host overlap the device's work: `auto` (on where
    /// the backend queues work, i.e. CUDA, without speculative decoding), `on`, `off`.
    /// The same batches run either way, except that a step may carry the discarded row of a
    /// sequence that just ended (on a GPU, a batch of another size can round differently).
    #[arg(long, default_value = "auto", value_parser = clap::builder::PossibleValuesParser::new(["auto", "on", "off"]))]
    pub async_scheduling: String,
    /// Longest context a decode step replayed from a CUDA graph may hold (it sizes the
    /// graphs' block tables); steps with longer contexts run eagerly.
    #[arg(long, default_value_t = met_model_layers::graphs::DEFAULT_MAX_CONTEXT)]
    pub max_seq_len_to_capture: usize,
    /// Speculative decoding: `ngram` proposes what followed the last few tokens earlier in
    /// the prompt or output (prompt lookup), `self` what the model's own first layers
    /// predict (`--self-spec-layers`), `draft` what a smaller model predicts
    /// (`--draft-model`); the model verifies the proposal in the same step.
    /// Greedy output is unchanged, and so is a seeded sampled request's. Off by default.
    #[arg(long, value_name = "METHOD", value_parser = clap::builder::PossibleValuesParser::new(met_speculative::METHOD_NAMES))]
    pub speculative: Option<String>,
    /// Most tokens proposed and verified per sequence and step, 1 to 16 (with
    /// `--speculative`; default 4).
    #[arg(long, value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// Shortest suffix `--speculative ngram` looks up (default 2).
    #[arg(long, value_name = "N")]
    pub speculative_ngram_min: Option<usize>,
    /// Longest suffix `--speculative ngram` looks up, tried first (default 4).
    #[arg(long, value_name = "N")]
    pub speculative_ngram_max: Option<usize>,
    /// Layers of the model `--speculative self` drafts with, then its final norm and head;
    /// fewer than the model has (default a quarter of them).
    #[arg(long, value_name = "L")]
    pub self_spec_layers: Option<usize>,
    /// The draft model of `--speculative draft` (a directory, `.gguf` or hub id, as
    /// `--model` takes), with the model's vocabulary, on the same kind of device.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// Speculate only while at most N sequences run (default on the CPU: 1, where
    /// verifying two sequences' drafts already costs more than it saves; elsewhere no limit).
    #[arg(long, value_name = "N")]
    pub speculative_max_batch: Option<usize>,
    /// Always propose `--num-speculative-tokens` tokens, instead of adapting each
    /// sequence's draft length to its acceptance.
    #[arg(long)]
    pub speculative_fixed_k: bool,
}

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

/// Comma-separated token ids as one value (clap would read a bare `Vec` as many values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

fn parse_token_ids(s: &str) -> Result<TokenIds, String> {
    parse_ids(s).map(TokenIds)
}

fn parse_ids(s: &str) -> Result<Vec<u32>, String> {
    if s.trim().is_empty() {
        return Err("a prompt needs at least one token id".into());
    }
    s.split(',').map(|t| t.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", t.trim()))).collect()
}

fn parse_id_range(s: &str) -> Result<IdRange, String> {
    let (lo, hi) = s.split_once("..").ok_or_else(|| format!("`{s}` is not LO..HI"))?;
    let id = |t: &str| t.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", t.trim()));
    let (lo, hi) = (id(lo)?, id(hi)?);
    if lo >= hi {
        return Err(format!("`{s}` is empty"));
    }
    Ok(IdRange { lo, hi })
}

fn parse_bias(s: &str) -> Result<LogitBias, String> {
    let pairs = s.split(',').filter(|p| !p.trim().is_empty()).map(|p| {
        let (id, bias) = p.split_once(':').ok_or_else(|| format!("`{p}` is not ID:BIAS"))?;
        let id = id.trim().parse::<u32>().map_err(|_| format!("`{}` is not a token id", id.trim()))?;
        let bias = bias.trim().parse::<f32>().map_err(|_| format!("`{}` is not a number", bias.trim()))?;
        Ok((id, bias))
    });
    pairs.collect::<Result<_, String>>().map(LogitBias)
}

fn parse_utilization(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(u) if u > 0.0 && u <= 1.0 => Ok(u),
        _ => Err(format!("`{s}` is not a fraction in (0, 1]")),
    }
}

pub(crate) fn parse_device(s: &str) -> Result<DeviceKind, String> {
    s.parse().map_err(|e: met_kernels::Error| e.to_string())
}

fn parse_world(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a number of devices (1 or more)")),
    }
}

fn parse_cpu_dots(s: &str) -> Result<CpuDots, String> {
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

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli =
            Cli::try_parse_from(["met", "generate", "--model", "m", "--prompt-ids", "1", "--stop-token-ids", "3,4"])
                .unwrap();
        let Command::Generate(g) = cli.command else { panic!("generate") };
        assert_eq!(g.sampling.stop_token_ids, [3, 4]);
        let cli = Cli::try_parse_from(["met", "tokenize", "--decode", "5,6"]).unwrap();
        let Command::Tokenize(t) = cli.command else { panic!("tokenize") };
        assert_eq!(t.decode, Some(TokenIds(vec![5, 6])));
        assert!(Cli::try_parse_from(["met", "tokenize"]).is_err(), "text or --decode is required");
        let cli = Cli::try_parse_from(["met", "serve", "m.gguf", "--port", "9000", "--max-num-seqs", "8"]).unwrap();
        let Command::Serve(s) = cli.command else { panic!("serve") };
        assert_eq!((s.model_path.as_deref(), s.port, s.engine.max_num_seqs), (Some("m.gguf"), 9000, 8));
        assert_eq!((s.host.as_str(), s.max_body_bytes), ("127.0.0.1", 4 << 20));
        assert!(Cli::try_parse_from(["met", "serve", "a", "--model", "b"]).is_err(), "MODEL or --model");
    }

    #[test]
    fn bench_serve_takes_ladders_and_rejects_contradictions() {
        let bench = |extra: &[&str]| {
            let args = ["met", "bench", "serve", "--base-url", "http://127.0.0.1:1"].iter().chain(extra);
            Cli::try_parse_from(args).map(|cli| match cli.command {
                Command::Bench(BenchArgs { command: BenchCommand::Serve(s) }) => s,
                other => panic!("{other:?}"),
            })
        };
        let s = bench(&["--concurrency", "1,4,16"]).unwrap();
        assert_eq!(
            (s.concurrency.as_slice(), s.dataset, s.endpoint),
            (&[1, 4, 16][..], BenchDataset::Random, BenchEndpoint::Completions)
        );
        assert_eq!(s.random_ids, IdRange { lo: 1000, hi: 30000 });
        let s = bench(&["--request-rate", "0.5,2", "--burstiness", "0.5"]).unwrap();
        assert_eq!((s.request_rate.as_slice(), s.burstiness), (&[0.5, 2.0][..], 0.5));
        assert!(bench(&["--concurrency", "1", "--request-rate", "2"]).is_err(), "one kind of ladder");
        assert!(bench(&["--burstiness", "2"]).is_err(), "burstiness needs a rate");
        let err = bench(&["--concurrency", ""]).unwrap_err().to_string();
        assert!(err.contains("--concurrency"), "{err}");
        let err = bench(&["--dataset", "imagenet"]).unwrap_err().to_string();
        assert!(err.contains("--dataset"), "{err}");
        assert!(parse_id_range("5..5").is_err() && parse_id_range("9").is_err());
        let cli = Cli::try_parse_from(["met", "bench", "plot", "a.json", "b.json", "-o", "c.svg"]).unwrap();
        let Command::Bench(BenchArgs { command: BenchCommand::Plot(p) }) = cli.command else { panic!("plot") };
        assert_eq!((p.results.len(), p.output), (2, PathBuf::from("c.svg")));
    }

    #[test]
    fn logit_bias_parses_pairs() {
        assert_eq!(parse_bias("1:2.5, 7:-100").unwrap(), LogitBias(vec![(1, 2.5), (7, -100.0)]));
        assert_eq!(parse_bias("").unwrap(), LogitBias::default());
        assert!(parse_bias("1").unwrap_err().contains("ID:BIAS"));
        assert!(parse_bias("x:1").unwrap_err().contains("`x`"));
    }
}
