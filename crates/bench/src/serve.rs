//! The load generator's run: every ladder point of one [`ServeArgs`] in order, each a
//! warm-up and then the measured requests under its arrival pattern, into one
//! [`BenchResult`].

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::args::{DatasetKind, Endpoint, ServeArgs};
use crate::client::{BaseUrl, CHAT_NEEDS_TEXT, Client, endpoint_path, request_body};
use crate::dataset::{BenchRequest, DEFAULT_OUTPUT_LEN, Dataset, DatasetSpec};
use crate::metrics::{ErrorKind, Figures, Slo};
use crate::plot;
use crate::report::{self, BenchResult, DatasetInfo, Machine, RunResult, SpeculativeFigures};
use crate::runner::{Load, Prepared, Target, run_point};

/// Runs `met bench serve`: every ladder point in order, printing a table row after each
/// (unless `--quiet`), then writes `--output` and `--plot`. Returns the result it wrote.
///
/// # Errors
/// Bad flags or dataset, no model id (none given and `GET /v1/models` failed), every
/// warm-up request failing to connect, or an output file that cannot be written. Failed
/// measured requests are figures, not errors.
pub async fn serve(args: &ServeArgs) -> Result<BenchResult> {
    let plan = Plan::from_args(args)?;
    let dataset = Dataset::load(dataset_spec(args))?;
    if args.endpoint == Endpoint::Chat && dataset.has_id_prompts() {
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
    fn from_args(args: &ServeArgs) -> Result<Self> {
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

fn dataset_spec(args: &ServeArgs) -> DatasetSpec {
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
    args: &'a ServeArgs,
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
        let random = spec.kind == DatasetKind::Random;
        BenchResult {
            label: args.label.clone(),
            command_line: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
            base_url: args.base_url.clone(),
            endpoint: args.endpoint.name().to_owned(),
            model: self.model.clone(),
            dataset: DatasetInfo {
                name: spec.kind.name().to_owned(),
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
