//! `met bench`: the load generator and the plotter of `met-bench`, and the engine's own
//! offline runs (`throughput`, `latency`), each flag set turned into the settings it names.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::engine::{EngineArgs, ModelArgs, settings};
use crate::offline::{self, Latency, LoraDummy, Throughput};

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
    Serve(Box<met_bench::ServeArgs>),
    /// Draw `met bench serve --output` files in one SVG, one line per file.
    Plot(BenchPlotArgs),
    /// Offline throughput: N random-prompt requests through the engine at once, no HTTP.
    Throughput(Box<ThroughputArgs>),
    /// Offline latency: one batch, per-step decode latency and prefill time, no HTTP.
    Latency(Box<LatencyArgs>),
}

impl BenchArgs {
    /// Runs the benchmark these flags name.
    ///
    /// # Errors
    /// Bad flags or files, a server that cannot be reached, a model that does not load, a
    /// result that cannot be written.
    pub fn run(self) -> Result<()> {
        match self.command {
            BenchCommand::Serve(args) => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .thread_name("met-bench")
                    .build()
                    .context("starting the async runtime")?;
                runtime.block_on(met_bench::serve(&args)).map(drop)
            }
            BenchCommand::Plot(args) => met_bench::plot::plot_files(&args.results, &args.output),
            BenchCommand::Throughput(args) => {
                let (load, setup) = settings(&args.model, &args.engine)?;
                let job = Throughput {
                    num_prompts: args.num_prompts,
                    input_len: args.input_len,
                    output_len: args.output_len,
                    seed: args.seed,
                    lora_dummy: args.lora_dummy,
                    output: args.output,
                };
                offline::throughput(&load, &setup, &job)
            }
            BenchCommand::Latency(args) => {
                let (load, setup) = settings(&args.model, &args.engine)?;
                let job = Latency {
                    batch_size: args.batch_size,
                    input_len: args.input_len,
                    output_len: args.output_len,
                    num_iters: args.num_iters,
                    num_warmup: args.num_warmup,
                    seed: args.seed,
                    lora_dummy: args.lora_dummy,
                    output: args.output,
                };
                offline::latency(&load, &setup, &job)
            }
        }
    }
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

/// `met bench throughput`.
#[derive(Debug, Args)]
pub struct ThroughputArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine settings (the KV cache holds every request at once unless `--kv-blocks`).
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests, all submitted at once.
    #[arg(long, default_value_t = 256)]
    pub num_prompts: usize,
    /// Prompt tokens of each request.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Generated tokens of each request.
    #[arg(long, default_value_t = 256)]
    pub output_len: usize,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run the requests through N random rank-R LoRA adapters on every projection, request
    /// i through adapter i mod N (as N:R, e.g. 8:16).
    #[arg(long, value_name = "N:R")]
    pub lora_dummy: Option<LoraDummy>,
    /// Write the JSON result here.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// `met bench latency`.
#[derive(Debug, Args)]
pub struct LatencyArgs {
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine settings.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Requests in the batch.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Prompt tokens of each request.
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Generated tokens of each request.
    #[arg(long, default_value_t = 256)]
    pub output_len: usize,
    /// Measured iterations.
    #[arg(long, default_value_t = 3)]
    pub num_iters: usize,
    /// Uncounted iterations first.
    #[arg(long, default_value_t = 1)]
    pub num_warmup: usize,
    /// Seed of the random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Run the requests through N random rank-R LoRA adapters on every projection, request
    /// i through adapter i mod N (as N:R, e.g. 8:16).
    #[arg(long, value_name = "N:R")]
    pub lora_dummy: Option<LoraDummy>,
    /// Write the JSON result here.
    #[arg(long)]
    pub output: Option<PathBuf>,
}
