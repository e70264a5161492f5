//! `met bench`: the instrument speed claims are measured with.
//!
//! `met bench throughput` and `met bench latency` ([`offline`]) drive the engine alone,
//! without HTTP, on any model or dummy weights.
//!
//! `met bench serve --base-url URL` is a load generator for any OpenAI-compatible server
//! (met, vLLM, SGLang, llama.cpp's `llama-server`), after vLLM's `bench serve`: it streams
//! every request, times each chunk, and reports TTFT, TPOT, ITL and end-to-end latency
//! (mean, p50, p90, p99), request and token throughput, goodput under SLOs and errors by
//! kind, one table row and one JSON entry per ladder point (`--concurrency 1,4,16` or
//! `--request-rate 1,2,4`). `met bench plot` draws result files side by side.
//!
//! It is bounded: `--num-prompts` (plus `--num-warmup`) requests per point, `--timeout-s`
//! per request, `--max-duration-s` for everything; and it only ever connects to the host
//! of `--base-url`. Bad flags and files are errors before the first request.
//!
//! Modules: `dataset` (prompts), `rng` (seeded streams, gamma arrivals), `sse` (the event
//! decoder), `client` (HTTP and per-chunk timing), `runner` (one ladder point under its
//! arrival pattern), [`metrics`] (records to figures), [`report`] (the JSON result and the
//! table) and [`plot`] (the SVG).

mod client;
mod dataset;
pub mod metrics;
pub mod offline;
pub mod plot;
pub mod report;
mod rng;
mod runner;
mod sse;

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use self::client::{BaseUrl, CHAT_NEEDS_TEXT, Client, endpoint_path, request_body};
use self::dataset::{BenchRequest, DEFAULT_OUTPUT_LEN, Dataset, DatasetSpec};
use self::metrics::{ErrorKind, Figures, Slo};
use self::report::{BenchResult, DatasetInfo, Machine, RunResult, SpeculativeFigures};
use self::runner::{Load, Prepared, Target, run_point};
use crate::cli::{BenchArgs, BenchCommand, BenchDataset, BenchEndpoint, BenchServeArgs};

/// Runs `met bench serve` or `met bench plot`.
///
/// # Errors
/// Bad flags or files, a server that cannot be reached, a result that cannot be written.
pub fn run(args: BenchArgs) -> Result<()> {
    match args.command {
        BenchCommand::Serve(args) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("met-bench")
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(serve(&args)).map(drop)
        }
        BenchCommand::Plot(args) => plot::plot_files(&args.results, &args.output),
        BenchCommand::Throughput(args) => offline::throughput(&args),
        BenchCommand::Latency(args) => offline::latency(&args),
    }
}

/// Runs `met bench serve`: every ladder point in order, printing a table row after each
/// (unless `--quiet`), then writes `--output` and `--plot`. Returns the result it wrote.
///
/// # Errors
/// Bad flags or dataset, no model id (none given and `GET /v1/models` failed), every
/// warm-up request failing to connect, or an output file that cannot be written. Failed
/// measured requests are figures, not errors.
pub async fn serve(args: &BenchServeArgs) -> Result<BenchResult> {
    let plan = Plan::from_args(args)?;
    let dataset = Dataset::load(dataset_spec(args))?;
    if args.endpoint == BenchEndpoint::Chat && dataset.has_id_prompts() {
        bail!(CHAT_NEEDS_TEXT);
    }
    let client = Client::new(plan.base, args.api_key.clone(), plan.timeout);
    let model = match &args.model {
        Some(model) => model.clone(),
        None => discover_model(&client, &args.base_url).await?,
    };
    let date = jiff::Timestamp::now().to_string();
    let bench =
        Bench { args, dataset, model, slo: plan.slo, target: Target { client, path: endpoint_path(args.endpoint) } };
    let deadline = Instant::now() + plan.max_duration;
    if !args.quiet {
        println!("{}", report::table_header());
    }
    let mut runs = Vec::new();
    for (point, &load) in plan.loads.iter().enumerate() {
        let run = bench.run_point(point, load, deadline).await?;
        if !args.quiet {
            println!("{}", report::table_row(&run));
        }
        let stopped = run.stopped_early;
        runs.push(run);
        if stopped {
            if point + 1 < plan.loads.len() {
                tracing::warn!("--max-duration-s reached: {} ladder points not run", plan.loads.len() - point - 1);
            }
            break;
        }
    }
    let result = bench.result(date, runs);
    if let Some(path) = &args.output {
        result.write_json(path)?;
    }
    if let Some(path) = &args.plot {
        let label = result.label.clone().unwrap_or_else(|| result.model.clone());
        plot::write_svg(&[(label, result.clone())], path).context("--plot")?;
    }
    Ok(result)
}

/// The flags, checked; errors name the flag.
struct Plan {
    base: BaseUrl,
    loads: Vec<Load>,
    slo: Slo,
    timeout: Duration,
    max_duration: Duration,
}

impl Plan {
    fn from_args(args: &BenchServeArgs) -> Result<Self> {
        let base = BaseUrl::parse(&args.base_url)?;
        let loads = if args.request_rate.is_empty() {
            let ladder = if args.concurrency.is_empty() { vec![1] } else { args.concurrency.clone() };
            if ladder.contains(&0) {
                bail!("--concurrency: every value must be at least 1");
            }
            ladder.into_iter().map(Load::Concurrency).collect()
        } else {
            if let Some(bad) = args.request_rate.iter().find(|r| !(r.is_finite() && **r > 0.0)) {
                bail!("--request-rate: `{bad}` is not a positive, finite number of requests per second");
            }
            positive("--burstiness", args.burstiness)?;
            args.request_rate.iter().map(|&rate| Load::Rate { rate, burstiness: args.burstiness }).collect()
        };
        if args.num_prompts == 0 {
            bail!("--num-prompts must be at least 1");
        }
        let slo = Slo {
            ttft_ms: args.slo_ttft_ms.map(|v| positive("--slo-ttft-ms", v)).transpose()?,
            tpot_ms: args.slo_tpot_ms.map(|v| positive("--slo-tpot-ms", v)).transpose()?,
        };
        let timeout = Duration::from_secs_f64(positive("--timeout-s", args.timeout_s)?);
        let max_duration = Duration::from_secs_f64(positive("--max-duration-s", args.max_duration_s)?);
        Ok(Self { base, loads, slo, timeout, max_duration })
    }
}

fn positive(flag: &str, value: f64) -> Result<f64> {
    if value.is_finite() && value > 0.0 { Ok(value) } else { bail!("{flag}: `{value}` must be a positive number") }
}

fn dataset_spec(args: &BenchServeArgs) -> DatasetSpec {
    DatasetSpec {
        kind: args.dataset,
        path: args.dataset_path.clone(),
        input_len: args.input_len,
        output_len: args.output_len,
        prefix_len: args.prefix_len,
        ids: args.random_ids,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
    }
}

/// The first model `GET /v1/models` lists.
async fn discover_model(client: &Client, base_url: &str) -> Result<String> {
    let models = client.models().await.context("--model was not given, so the server was asked for its models")?;
    models.into_iter().next().with_context(|| format!("{base_url} lists no model in /v1/models; pass --model"))
}

/// One benchmark's fixed parts.
struct Bench<'a> {
    args: &'a BenchServeArgs,
    dataset: Dataset,
    model: String,
    slo: Slo,
    target: Target,
}

impl Bench<'_> {
    /// Warm-up, then the measured requests of ladder point `point`.
    async fn run_point(&self, point: usize, load: Load, deadline: Instant) -> Result<RunResult> {
        let warmup = self.prepare(self.dataset.requests(point, self.args.num_warmup, true))?;
        let measured = self.prepare(self.dataset.requests(point, self.args.num_prompts, false))?;
        let seed = self.args.seed.wrapping_add(point as u64);
        let mut warmup_failed = 0;
        let mut stopped = false;
        if !warmup.is_empty() {
            // Warm-ups go out at the point's concurrency (all at once for a rate ladder).
            let concurrency = match load {
                Load::Concurrency(c) => c.min(warmup.len()),
                Load::Rate { .. } => warmup.len(),
            };
            let run =
                run_point(&self.target, warmup, Load::Concurrency(concurrency), seed, deadline, &ProgressBar::hidden())
                    .await;
            let failures: Vec<ErrorKind> = run.records.iter().filter_map(|r| r.as_ref().err().copied()).collect();
            if !failures.is_empty()
                && failures.len() == run.records.len()
                && failures.iter().all(|k| *k == ErrorKind::Connect)
            {
                bail!("cannot connect to {}: every warm-up request failed to connect", self.args.base_url);
            }
            warmup_failed = failures.len();
            stopped = run.stopped;
        }
        let bar = progress_bar(measured.len(), &load_name(load), self.args.quiet);
        let metrics_before = self.target.client.server_metrics().await;
        let run = run_point(&self.target, measured, load, seed, deadline, &bar).await;
        let metrics_after = self.target.client.server_metrics().await;
        bar.finish_and_clear();
        let speculative = metrics_before.zip(metrics_after).and_then(|(b, a)| SpeculativeFigures::between(&b, &a));
        let (concurrency, request_rate, burstiness) = match load {
            Load::Concurrency(c) => (Some(c), None, None),
            Load::Rate { rate, burstiness } => (None, Some(rate), Some(burstiness)),
        };
        Ok(RunResult {
            concurrency,
            request_rate,
            burstiness,
            stopped_early: stopped || run.stopped,
            warmup_failed,
            figures: Figures::compute(&run.records, run.cancelled, run.duration_s, &self.slo),
            speculative,
        })
    }

    fn prepare(&self, requests: Vec<BenchRequest>) -> Result<Arc<[Prepared]>> {
        requests
            .iter()
            .map(|r| {
                Ok(Prepared { body: request_body(self.args.endpoint, &self.model, r)?, prompt_tokens: r.prompt_tokens })
            })
            .collect()
    }

    fn result(&self, date: String, runs: Vec<RunResult>) -> BenchResult {
        let args = self.args;
        let spec = self.dataset.spec();
        let random = spec.kind == BenchDataset::Random;
        BenchResult {
            label: args.label.clone(),
            command_line: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            base_url: args.base_url.clone(),
            endpoint: value_name(args.endpoint),
            model: self.model.clone(),
            dataset: DatasetInfo {
                name: value_name(spec.kind),
                path: spec.path.as_ref().map(|p| p.display().to_string()),
                input_len: random.then_some(spec.input_len),
                output_len: if random { Some(spec.output_len.unwrap_or(DEFAULT_OUTPUT_LEN)) } else { spec.output_len },
                prefix_len: random.then_some(spec.prefix_len),
                random_ids: random.then_some([spec.ids.lo, spec.ids.hi]),
                num_prompts: args.num_prompts,
                seed: spec.seed,
                ignore_eos: random || spec.ignore_eos,
            },
            slo: self.slo,
            num_warmup: args.num_warmup,
            timeout_s: args.timeout_s,
            max_duration_s: args.max_duration_s,
            met_version: env!("CARGO_PKG_VERSION").to_owned(),
            git_commit: report::git_commit(),
            date,
            machine: Machine::detect(),
            runs,
        }
    }
}

/// A clap value's name (`random`, `chat`).
fn value_name(value: impl ValueEnum) -> String {
    value.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned())
}

fn load_name(load: Load) -> String {
    match load {
        Load::Concurrency(c) => format!("c={c}"),
        Load::Rate { rate, .. } => format!("r={rate}"),
    }
}

/// A bar of `len` requests on stderr when it is a terminal; hidden otherwise.
fn progress_bar(len: usize, name: &str, quiet: bool) -> ProgressBar {
    if quiet || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len as u64), ProgressDrawTarget::stderr());
    let style = ProgressStyle::with_template("{prefix:>8} {bar:40} {pos}/{len} requests {elapsed}")
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_prefix(name.to_owned());
    bar
}
