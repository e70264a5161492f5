//! `met bench throughput` and `met bench latency`: the engine alone, without HTTP.
//!
//! Both load a model as `met generate` does (any checkpoint, or `--load-format dummy` with a
//! bare `config.json`), on the CPU or a GPU, and drive the same engine the server runs
//! (continuous batching, chunked prefill, sampling on the device) with random token-id
//! prompts of exact length, greedy and `ignore_eos` so every request makes exactly
//! `--output-len` tokens.
//!
//! - `throughput`: `--num-prompts` requests submitted at once; output-token and total-token
//!   throughput over the whole run, and decode throughput over the steps after every request
//!   has its first token (the steady state a server reaches under load).
//! - `latency`: one batch of `--batch-size` requests, `--num-iters` times after
//!   `--num-warmup` uncounted ones, each with fresh prompts (so the prefix cache never
//!   hits): the prefill time (until every request has its first token), every decode step's
//!   latency (p50/p90/p99), and the whole batch's latency.
//!
//! Both take `--lora-dummy N:R`: random adapters spread over the requests ([`lora`]).
//!
//! They live here, beside the engine's startup, not in `met-bench`: they are callers of the
//! engine, while `met-bench` knows no met crate so that it measures any server alike; they
//! share its result header, figures and random streams.
//!
//! Each step's clock stops after the engine has the step's sampled tokens on the host, so
//! device work is included. Both print a summary and write one JSON result with
//! `--output`, with the same header as `met bench serve` (command line, met version,
//! commit, date, machine) plus the device and the model.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use met_bench::metrics::Summary;
use met_bench::report::{Machine, SpeculativeFigures, git_commit};
use met_bench::rng::Rng;
use met_config::{EngineSetup, LoadConfig, SamplingParams};
use met_kernels::GpuBackend;
use met_scheduler::{Engine, EngineRequest, FinishReason, RequestStream, StopCriteria};
use met_telemetry::{Metrics, StepPhases};
use serde::Serialize;

use crate::batch::{Draft, sized_engine, speculative_figures};

mod lora;

pub use lora::LoraDummy;

/// `met bench throughput`: requests submitted at once.
#[derive(Debug, Clone)]
pub struct Throughput {
    /// Requests, all submitted at once.
    pub num_prompts: usize,
    /// Prompt tokens of each request.
    pub input_len: usize,
    /// Generated tokens of each request.
    pub output_len: usize,
    /// Seed of the random prompts.
    pub seed: u64,
    /// Random adapters the requests run through, if any.
    pub lora_dummy: Option<LoraDummy>,
    /// Where the JSON result goes.
    pub output: Option<PathBuf>,
}

/// `met bench latency`: one batch, timed step by step.
#[derive(Debug, Clone)]
pub struct Latency {
    /// Requests in the batch.
    pub batch_size: usize,
    /// Prompt tokens of each request.
    pub input_len: usize,
    /// Generated tokens of each request.
    pub output_len: usize,
    /// Measured iterations.
    pub num_iters: usize,
    /// Uncounted iterations first.
    pub num_warmup: usize,
    /// Seed of the random prompts.
    pub seed: u64,
    /// Random adapters the requests run through, if any.
    pub lora_dummy: Option<LoraDummy>,
    /// Where the JSON result goes.
    pub output: Option<PathBuf>,
}

/// What every offline result starts with.
#[derive(Debug, Serialize)]
struct Header {
    /// `throughput` or `latency`.
    bench: &'static str,
    command_line: Vec<String>,
    met_version: &'static str,
    git_commit: Option<String>,
    date: String,
    machine: Machine,
    device: String,
    model: String,
    /// Seconds from the start of the command until the model and engine were ready.
    load_s: f64,
}

/// The result of `met bench throughput`.
#[derive(Debug, Serialize)]
struct ThroughputResult {
    #[serde(flatten)]
    header: Header,
    num_prompts: usize,
    input_len: usize,
    output_len: usize,
    elapsed_s: f64,
    steps: usize,
    prompt_tokens: usize,
    output_tokens: usize,
    requests_per_s: f64,
    output_tokens_per_s: f64,
    total_tokens_per_s: f64,
    /// Output tokens per second over the steps after every request had its first token.
    decode_tokens_per_s: Option<f64>,
    decode_steps: usize,
    /// Share of the decode phase the host spent outside waits for the device (`None` on a
    /// device that runs synchronously).
    decode_host_share: Option<f64>,
    /// Medians over decode steps of the engine thread's time per phase (ms).
    decode_phases_ms: Option<PhaseMedians>,
    /// With `--speculative`: drafts, acceptance and tokens per verifying step over the run.
    speculative: Option<SpeculativeFigures>,
}

/// The result of `met bench latency`.
#[derive(Debug, Serialize)]
struct LatencyResult {
    #[serde(flatten)]
    header: Header,
    batch_size: usize,
    input_len: usize,
    output_len: usize,
    num_iters: usize,
    num_warmup: usize,
    /// Time until every request of the batch had its first token, per iteration (ms).
    prefill_ms: Summary,
    /// Pure decode steps timed, over every measured iteration.
    decode_steps: usize,
    /// Every decode step of every iteration (ms); `None` with `--output-len 1`.
    decode_step_ms: Option<Summary>,
    /// Host time of each decode step (ms): the step's time less the time it waited for the
    /// device. `None` on a device that runs synchronously (the CPU).
    decode_host_ms: Option<Summary>,
    /// Medians over decode steps of the engine thread's time per phase (ms).
    decode_phases_ms: Option<PhaseMedians>,
    /// The whole batch, per iteration (ms).
    batch_ms: Summary,
    /// Output tokens per second of the batch during decode, from the median step: one
    /// token per sequence and step (with `--speculative` a step may give more; see
    /// `speculative`).
    decode_tokens_per_s: Option<f64>,
    /// With `--speculative`: drafts, acceptance and tokens per verifying step over every
    /// iteration, warm-ups included.
    speculative: Option<SpeculativeFigures>,
}

/// Medians over decode steps of where the engine thread's time went (ms).
#[derive(Debug, Clone, Copy, Serialize)]
struct PhaseMedians {
    schedule: f64,
    /// Host work of the forward pass (a device backend queues its kernels and returns).
    forward: f64,
    /// Sampling, including the wait for the device.
    sample: f64,
    /// Of `sample`, the wait for the device, where the device says.
    device_wait: Option<f64>,
    postprocess: f64,
    /// Steps queued before the tokens of the step before were read (asynchronous
    /// scheduling), of `steps`.
    ahead: usize,
    steps: usize,
}

impl PhaseMedians {
    fn of(steps: &[&Step]) -> Option<Self> {
        let p50 = |f: &dyn Fn(&Step) -> f64| {
            let xs: Vec<f64> = steps.iter().map(|s| f(s)).collect();
            Summary::of_seconds(&xs).map(|s| s.p50)
        };
        let waits: Vec<f64> = steps.iter().filter_map(|s| s.wait_seconds).collect();
        Some(Self {
            schedule: p50(&|s| s.phases.schedule.as_secs_f64())?,
            forward: p50(&|s| s.phases.forward.as_secs_f64())?,
            sample: p50(&|s| s.phases.sample.as_secs_f64())?,
            device_wait: Summary::of_seconds(&waits).map(|s| s.p50),
            postprocess: p50(&|s| s.phases.postprocess.as_secs_f64())?,
            ahead: steps.iter().filter(|s| s.ahead).count(),
            steps: steps.len(),
        })
    }
}

impl std::fmt::Display for PhaseMedians {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "schedule {:.3} ms, forward {:.3}, sample {:.3}", self.schedule, self.forward, self.sample)?;
        if let Some(w) = self.device_wait {
            write!(f, " (device wait {w:.3})")?;
        }
        write!(f, ", postprocess {:.3}; {} of {} queued ahead", self.postprocess, self.ahead, self.steps)
    }
}

/// Runs `met bench throughput` on the model `load_config` says, in an engine `setup` says.
///
/// # Errors
/// Bad flags, a model that does not load, or an engine failure.
pub fn throughput(load_config: &LoadConfig, setup: &EngineSetup, args: &Throughput) -> Result<()> {
    check_lengths(args.num_prompts, "--num-prompts", args.input_len, args.output_len)?;
    let start = Instant::now();
    let (model, topology, adapters) = lora::load(load_config, args.lora_dummy)?;
    let vocab = model.vocab_size();
    check_context(model.max_context(), args.input_len, args.output_len)?;
    let requests = random_requests(args.num_prompts, args.input_len, args.output_len, vocab, args.seed);
    let device = topology.describe();
    let waits = Arc::clone(topology.lead());
    let metrics = Arc::new(Metrics::new());
    let mut engine = sized_engine(setup, model, &topology, &requests, Arc::clone(&metrics))?;
    let header = header("throughput", device, load_config, start.elapsed().as_secs_f64());

    let requests = lora::spread(Draft::make_all(requests, &engine.limits(), "request")?, &adapters);
    let run = rayon::scope(|_| drive(&mut engine, requests, &*waits))?;
    let output_tokens = run.tokens;
    let prompt_tokens = args.num_prompts * args.input_len;
    let elapsed = run.steps.iter().map(|s| s.seconds).sum::<f64>();
    let decode: Vec<&Step> = run.steps.iter().filter(|s| s.all_started_before).collect();
    let decode_s = decode.iter().map(|s| s.seconds).sum::<f64>();
    let decode_tokens = decode.iter().map(|s| s.tokens).sum::<usize>();
    let decode_host = decode.iter().map(|s| s.host_seconds).sum::<Option<f64>>();
    let result = ThroughputResult {
        header,
        num_prompts: args.num_prompts,
        input_len: args.input_len,
        output_len: args.output_len,
        elapsed_s: elapsed,
        steps: run.steps.len(),
        prompt_tokens,
        output_tokens,
        requests_per_s: args.num_prompts as f64 / elapsed,
        output_tokens_per_s: output_tokens as f64 / elapsed,
        total_tokens_per_s: (prompt_tokens + output_tokens) as f64 / elapsed,
        decode_tokens_per_s: (decode_s > 0.0).then(|| decode_tokens as f64 / decode_s),
        decode_steps: decode.len(),
        decode_host_share: decode_host.filter(|_| decode_s > 0.0).map(|h| h / decode_s),
        decode_phases_ms: PhaseMedians::of(&decode),
        speculative: setup.speculative.is_some().then(|| speculative_figures(&metrics)),
    };
    let host = result.decode_host_share.map(|h| format!(", host {:.1}% of it", 100.0 * h)).unwrap_or_default();
    println!(
        "throughput: {} requests x ({} in + {} out) in {:.2} s: {:.2} req/s, {:.1} output tok/s, {:.1} total tok/s{}{host}",
        result.num_prompts,
        result.input_len,
        result.output_len,
        result.elapsed_s,
        result.requests_per_s,
        result.output_tokens_per_s,
        result.total_tokens_per_s,
        result.decode_tokens_per_s.map(|t| format!(", decode phase {t:.1} tok/s")).unwrap_or_default()
    );
    if let Some(p) = result.decode_phases_ms {
        println!("decode step phases (p50): {p}");
    }
    write(args.output.as_ref(), &result)
}

/// Runs `met bench latency` on the model `load_config` says, in an engine `setup` says.
///
/// # Errors
/// Bad flags, a model that does not load, or an engine failure.
pub fn latency(load_config: &LoadConfig, setup: &EngineSetup, args: &Latency) -> Result<()> {
    check_lengths(args.batch_size, "--batch-size", args.input_len, args.output_len)?;
    if args.num_iters == 0 {
        bail!("--num-iters must be at least 1");
    }
    let start = Instant::now();
    let (model, topology, adapters) = lora::load(load_config, args.lora_dummy)?;
    let vocab = model.vocab_size();
    check_context(model.max_context(), args.input_len, args.output_len)?;
    let batch =
        |i: usize| random_requests(args.batch_size, args.input_len, args.output_len, vocab, args.seed + i as u64);
    let device = topology.describe();
    let waits = Arc::clone(topology.lead());
    let metrics = Arc::new(Metrics::new());
    let mut engine = sized_engine(setup, model, &topology, &batch(0), Arc::clone(&metrics))?;
    let header = header("latency", device, load_config, start.elapsed().as_secs_f64());

    let (mut prefill, mut steps, mut whole, mut host) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut decode_steps: Vec<Step> = Vec::new();
    for i in 0..args.num_warmup + args.num_iters {
        let requests = lora::spread(Draft::make_all(batch(i), &engine.limits(), "request")?, &adapters);
        let run = rayon::scope(|_| drive(&mut engine, requests, &*waits))?;
        if i < args.num_warmup {
            continue;
        }
        prefill.push(run.steps.iter().filter(|s| !s.all_started_before).map(|s| s.seconds).sum::<f64>());
        steps.extend(run.steps.iter().filter(|s| s.all_started_before).map(|s| s.seconds));
        host.extend(run.steps.iter().filter(|s| s.all_started_before).filter_map(|s| s.host_seconds));
        decode_steps.extend(run.steps.iter().filter(|s| s.all_started_before).copied());
        whole.push(run.steps.iter().map(|s| s.seconds).sum::<f64>());
    }
    let summary = |xs: &[f64], what: &str| Summary::of_seconds(xs).with_context(|| format!("no {what} was timed"));
    let decode_step_ms = Summary::of_seconds(&steps);
    let result = LatencyResult {
        header,
        batch_size: args.batch_size,
        input_len: args.input_len,
        output_len: args.output_len,
        num_iters: args.num_iters,
        num_warmup: args.num_warmup,
        prefill_ms: summary(&prefill, "prefill")?,
        decode_steps: steps.len(),
        decode_step_ms,
        decode_host_ms: Summary::of_seconds(&host),
        decode_phases_ms: PhaseMedians::of(&decode_steps.iter().collect::<Vec<_>>()),
        batch_ms: summary(&whole, "batch")?,
        decode_tokens_per_s: decode_step_ms.map(|d| args.batch_size as f64 * 1e3 / d.p50),
        speculative: setup.speculative.is_some().then(|| speculative_figures(&metrics)),
    };
    let decode = match (result.decode_step_ms, result.decode_tokens_per_s) {
        (Some(d), Some(t)) => {
            let host = result
                .decode_host_ms
                .map(|h| format!(", host p50 {:.3} ms ({:.1}% of the step)", h.p50, 100.0 * h.p50 / d.p50))
                .unwrap_or_default();
            format!("decode step p50 {:.3} ms, p90 {:.3}, p99 {:.3} ({t:.1} tok/s){host}", d.p50, d.p90, d.p99)
        }
        _ => "no decode steps".into(),
    };
    println!(
        "latency: batch {} x ({} in + {} out), {} iterations: prefill p50 {:.2} ms; {decode}; batch p50 {:.1} ms",
        result.batch_size,
        result.input_len,
        result.output_len,
        result.num_iters,
        result.prefill_ms.p50,
        result.batch_ms.p50
    );
    if let Some(p) = result.decode_phases_ms {
        println!("decode step phases (p50): {p}");
    }
    write(args.output.as_ref(), &result)
}

fn check_lengths(count: usize, flag: &str, input_len: usize, output_len: usize) -> Result<()> {
    if count == 0 {
        bail!("{flag} must be at least 1");
    }
    if input_len == 0 {
        bail!("--input-len must be at least 1");
    }
    if output_len == 0 {
        bail!("--output-len must be at least 1");
    }
    Ok(())
}

fn check_context(max_context: usize, input_len: usize, output_len: usize) -> Result<()> {
    if input_len + output_len > max_context {
        bail!("--input-len {input_len} plus --output-len {output_len} exceed the model's context of {max_context}");
    }
    Ok(())
}

/// `count` greedy requests of `input_len` random ids below `vocab` that generate exactly
/// `output_len` tokens.
fn random_requests(count: usize, input_len: usize, output_len: usize, vocab: usize, seed: u64) -> Vec<Draft> {
    let mut rng = Rng::new(seed);
    let top = u32::try_from(vocab).unwrap_or(u32::MAX);
    (0..count)
        .map(|i| Draft {
            prompt: (0..input_len).map(|_| rng.range(0, top)).collect(),
            sampling: SamplingParams::greedy(),
            stop: StopCriteria {
                max_new_tokens: output_len,
                min_new_tokens: 0,
                stop_token_ids: Vec::new(),
                eos_token_ids: Vec::new(),
                ignore_eos: true,
            },
            n: 1,
            priority: 0,
            seed: Some(seed.wrapping_add(i as u64)),
        })
        .collect()
}

/// One engine step as the bench saw it.
#[derive(Debug, Clone, Copy)]
struct Step {
    seconds: f64,
    /// Tokens the step produced.
    tokens: usize,
    /// Whether every request already had its first token when the step began (a pure
    /// decode step).
    all_started_before: bool,
    /// The step's time less the time it waited for the device, where the device says.
    host_seconds: Option<f64>,
    /// The engine thread's time per phase.
    phases: StepPhases,
    /// The time the step waited for the device, where the device says.
    wait_seconds: Option<f64>,
    /// Whether it was queued before the tokens of the step before were read.
    ahead: bool,
}

/// Every step of one run.
struct Run {
    steps: Vec<Step>,
    tokens: usize,
}

/// Submits `requests`, steps the engine until they are all done, and times each step.
fn drive(engine: &mut Engine, requests: Vec<EngineRequest>, device: &dyn GpuBackend) -> Result<Run> {
    let total = requests.len();
    let expected: usize = requests.iter().map(|r| r.stop().max_new_tokens).sum();
    let mut streams: Vec<RequestStream> = requests
        .into_iter()
        .enumerate()
        .map(|(i, r)| engine.submit(r).with_context(|| format!("request {i}")))
        .collect::<Result<_>>()?;
    let mut started = vec![false; total];
    let (mut steps, mut tokens, mut started_count) = (Vec::new(), 0, 0);
    while engine.has_work() {
        let all_started_before = started_count == total;
        let (clock, waited) = (Instant::now(), device.device_wait());
        engine.step();
        let seconds = clock.elapsed().as_secs_f64();
        let wait_seconds = waited.zip(device.device_wait()).map(|(a, b)| (b - a).as_secs_f64());
        let host_seconds = wait_seconds.map(|w| seconds - w);
        let (phases, ahead) = (engine.last_step().phases, engine.last_step().ahead);
        let mut made = 0;
        for (s, stream) in streams.iter_mut().enumerate() {
            while let Some(event) = stream.try_next() {
                if event.token.is_some() {
                    made += 1;
                    if !started[s] {
                        started[s] = true;
                        started_count += 1;
                    }
                }
                if let Some(FinishReason::Error(e)) = &event.finish {
                    bail!("request {s} failed: {e}");
                }
            }
        }
        tokens += made;
        steps.push(Step { seconds, tokens: made, all_started_before, host_seconds, phases, wait_seconds, ahead });
    }
    if tokens != expected {
        bail!("the engine produced {tokens} tokens, {expected} expected (was the KV cache too small?)");
    }
    Ok(Run { steps, tokens })
}

fn header(bench: &'static str, device: String, load: &LoadConfig, load_s: f64) -> Header {
    Header {
        bench,
        command_line: std::env::args_os().map(|a| a.to_string_lossy().into_owned()).collect(),
        met_version: env!("CARGO_PKG_VERSION"),
        git_commit: git_commit(),
        date: jiff::Timestamp::now().to_string(),
        machine: Machine::detect(),
        device,
        model: load.model.clone().unwrap_or_else(|| "the default model".into()),
        load_s,
    }
}

fn write(path: Option<&PathBuf>, result: &impl Serialize) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let text = serde_json::to_string_pretty(result)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}
