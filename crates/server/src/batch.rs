//! Batch jobs (`met generate`, `met bench throughput` and `latency`): their requests are
//! gathered as [`Draft`]s before the engine exists, because the KV cache is sized from them
//! ([`sized_engine`]), and made into engine requests once it does.

use std::sync::Arc;

use anyhow::{Context, Result};
use met_bench::report::SpeculativeFigures;
use met_config::{EngineSetup, SamplingParams};
use met_model_layers::Model;
use met_scheduler::{Engine, EngineLimits, EngineRequest, StopCriteria};
use met_telemetry::Metrics;

use crate::startup::engine::{build_engine, random_seed};
use crate::startup::kv_budget::cache_size;
use crate::startup::topology::Topology;

/// The parts of an engine request, gathered before there is an engine to check them
/// against (the KV cache is sized from them): [`Draft::make_all`] makes the requests.
#[derive(Debug, Clone, Default)]
pub struct Draft {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// How tokens are drawn; its `seed` is not read: [`Self::seed`] is the stream's.
    pub sampling: SamplingParams,
    /// When each continuation stops.
    pub stop: StopCriteria,
    /// Continuations of the prompt.
    pub n: usize,
    /// Scheduling priority (lower first, under `--policy priority`).
    pub priority: i32,
    /// The seed of its random stream; `None` draws a random one when the request is made.
    pub seed: Option<u64>,
}

impl Draft {
    /// This request with `prompt` as its prompt.
    pub fn with_prompt(&self, prompt: Vec<u32>) -> Self {
        Self { prompt, ..self.clone() }
    }

    /// The engine requests, checked against `limits`; an error names the `what` (prompt,
    /// request) by its index and the field that cannot work.
    pub fn make_all(drafts: Vec<Self>, limits: &EngineLimits, what: &str) -> Result<Vec<EngineRequest>> {
        drafts
            .into_iter()
            .enumerate()
            .map(|(i, d)| {
                let sampling = SamplingParams { seed: d.seed.unwrap_or_else(random_seed), ..d.sampling };
                let request = EngineRequest::new(d.prompt, sampling, d.stop, d.n, limits);
                Ok(request.with_context(|| format!("{what} {i}"))?.with_priority(d.priority))
            })
            .collect()
    }
}

/// The engine, with a KV cache large enough for every request at once, within the device's
/// budget ([`cache_size`], the rule `met serve` uses too; startup phase 6). A job never runs
/// more sequences at once than it has, so no more are planned for (a hybrid model's state
/// slots are per sequence).
pub fn sized_engine(
    setup: &EngineSetup,
    model: Box<dyn Model>,
    devices: &Topology,
    requests: &[Draft],
    metrics: Arc<Metrics>,
) -> Result<Engine> {
    let sequences: usize = requests.iter().map(|r| r.n).sum();
    let mut setup = setup.clone();
    setup.engine.max_num_seqs = setup.engine.max_num_seqs.min(sequences.max(1));
    let setup = &setup;
    let block_size = setup.engine.block_size;
    let needed: usize =
        requests.iter().map(|r| (r.prompt.len() + r.stop.max_new_tokens).div_ceil(block_size) * r.n).sum();
    let size = cache_size(setup, &*model, devices, needed)?;
    build_engine(setup, model, devices, size, metrics)
}

/// The speculative figures an engine's `metrics` counted since it started.
pub fn speculative_figures(metrics: &Metrics) -> SpeculativeFigures {
    let m = metrics;
    SpeculativeFigures::from_counts(m.spec_drafts.get(), m.spec_draft_tokens.get(), m.spec_accepted_tokens.get())
}
