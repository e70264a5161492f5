//! The engine's Prometheus metrics: every metric name, the registry that holds them, and the
//! text exposition the server returns from `GET /metrics`.
//!
//! Names live here, once, as `pub const`s so that the scheduler records, the server exposes
//! and dashboards query the same strings. They follow Prometheus conventions: a `met_`
//! prefix, base units in the name (`_seconds`, `_tokens`), and `_total` on counters only.
//!
//! [`Metrics`] owns a prometheus-client [`Registry`] and public handles to every metric in it;
//! share it as `Arc<Metrics>`. **Invariant:** recording never takes a lock the scrape can hold:
//! gauges and counters are atomics, histograms are [`AtomicHistogram`]s, and the per-reason
//! finish counters are resolved once at construction. Only [`Metrics::http_request`] goes
//! through a family's read lock, and it runs on server tasks, not the engine thread.
//! **Boundary:** the exposition text comes from prometheus-client's encoder; nothing here
//! writes the format by hand.

mod histogram;

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::encoding::{EncodeLabel, EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::{Metric, Registry};

pub use histogram::AtomicHistogram;

/// The `Content-Type` the server must send with [`Metrics::render`]'s output: the Prometheus
/// text exposition format, version 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// Gauge: requests admitted to the engine but not yet scheduled, preempted ones included
/// (requests).
pub const REQUESTS_WAITING: &str = "met_requests_waiting";
/// Gauge: requests in the running batch, prefilling or decoding (requests).
pub const REQUESTS_RUNNING: &str = "met_requests_running";
/// Gauge: KV-cache blocks held by sequences or the prefix cache (blocks).
pub const KV_BLOCKS_USED: &str = "met_kv_blocks_used";
/// Gauge: KV-cache blocks allocated at startup; `used / capacity` is cache occupancy
/// (blocks). Not `_total`, which Prometheus reserves for counters.
pub const KV_BLOCKS_CAPACITY: &str = "met_kv_blocks_capacity";
/// Gauge: recurrent-state slots held by running sequences, for hybrid models (slots).
pub const STATE_SLOTS_USED: &str = "met_state_slots_used";
/// Gauge: recurrent-state slots for running sequences allocated at startup (slots).
pub const STATE_SLOTS_CAPACITY: &str = "met_state_slots_capacity";
/// Gauge: recurrent-state snapshots held by the prefix cache (snapshots).
pub const STATE_SNAPSHOTS_CACHED: &str = "met_state_snapshots_cached";
/// Gauge: recurrent-state snapshot slots allocated at startup (snapshots).
pub const STATE_SNAPSHOTS_CAPACITY: &str = "met_state_snapshots_capacity";
/// Gauge: device memory of all recurrent-state slots, on one device (bytes).
pub const STATE_BYTES: &str = "met_state_bytes";
/// Gauge: LoRA adapters loaded and servable, whether or not a request uses them (adapters).
pub const LORA_ADAPTERS_LOADED: &str = "met_lora_adapters_loaded";
/// Gauge: 1 when a request's output never depends on the requests batched with it (the
/// CPU's kernels; CUDA's under `--batch-invariant`), else 0.
pub const BATCH_INVARIANT: &str = "met_batch_invariant";

/// Counter: prompt tokens whose KV entries came from the prefix cache instead of being
/// computed (tokens).
pub const PREFIX_CACHE_HIT_TOKENS: &str = "met_prefix_cache_hit_tokens_total";
/// Counter: prompt tokens run through a forward pass, recomputation after preemption
/// included (tokens).
pub const PROMPT_TOKENS_COMPUTED: &str = "met_prompt_tokens_computed_total";
/// Counter: tokens sampled for all requests (tokens).
pub const GENERATED_TOKENS: &str = "met_generated_tokens_total";
/// Counter: running requests evicted to free KV blocks (preemptions).
pub const PREEMPTIONS: &str = "met_preemptions_total";
/// Counter: speculative verifications, one per sequence and step that checked proposed
/// tokens (drafts).
pub const SPEC_DRAFTS: &str = "met_spec_decode_drafts_total";
/// Counter: proposed tokens the target model checked (tokens).
pub const SPEC_DRAFT_TOKENS: &str = "met_spec_decode_draft_tokens_total";
/// Counter: proposed tokens the target model agreed with and kept (tokens).
pub const SPEC_ACCEPTED_TOKENS: &str = "met_spec_decode_accepted_tokens_total";
/// Gauge: accepted / checked proposed tokens since startup (ratio; 0 before any draft).
pub const SPEC_ACCEPTANCE_RATE: &str = "met_spec_decode_acceptance_rate";
/// Gauge: tokens a sequence gains per verifying step since startup, the target's own token
/// included: 1 + accepted / drafts (tokens; 0 before any draft).
pub const SPEC_TOKENS_PER_STEP: &str = "met_spec_decode_tokens_per_step";
/// Counter: requests that left the engine, by label `reason` = `stop` | `length` |
/// `cancelled` | `error` (requests).
pub const REQUESTS_FINISHED: &str = "met_requests_finished_total";
/// Counter: HTTP responses sent, by labels `endpoint` (the route, e.g. `/v1/completions`) and
/// `status` (the numeric code) (requests).
pub const HTTP_REQUESTS: &str = "met_http_requests_total";

/// Histogram: wall time of one engine step: schedule, forward pass, sampling (seconds).
pub const STEP_DURATION: &str = "met_engine_step_duration_seconds";
/// Histogram: tokens in one step's forward batch: prefill chunks plus one per decoding
/// sequence (tokens).
pub const STEP_TOKENS: &str = "met_engine_step_tokens";
/// Histogram: time from a request's arrival to its first generated token (seconds).
pub const TIME_TO_FIRST_TOKEN: &str = "met_time_to_first_token_seconds";
/// Histogram: time between consecutive generated tokens of one request (seconds).
pub const INTER_TOKEN_LATENCY: &str = "met_inter_token_latency_seconds";
/// Histogram: end-to-end time from a request's arrival to its finish, whatever the reason
/// (seconds).
pub const REQUEST_DURATION: &str = "met_request_duration_seconds";
/// Histogram: prompt length of finished requests (tokens).
pub const REQUEST_PROMPT_TOKENS: &str = "met_request_prompt_tokens";
/// Histogram: generated length of finished requests (tokens).
pub const REQUEST_GENERATION_TOKENS: &str = "met_request_generation_tokens";

/// 50 µs to 10 s in 1-2.5-5 steps: a decode step of a small model up to a long prefill.
const STEP_SECONDS_BUCKETS: [f64; 17] =
    [5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// 1 ms to 100 s: first tokens wait for queueing and the whole prefill.
const TTFT_SECONDS_BUCKETS: [f64; 16] =
    [1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0];
/// 10 ms to 2500 s: a 128k-token generation at 20 ms a token takes about 2600 s.
const REQUEST_SECONDS_BUCKETS: [f64; 17] =
    [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0];

/// Powers of two from 1 to `2^max_exp`.
fn powers_of_two(max_exp: u32) -> impl Iterator<Item = f64> {
    (0..=max_exp).map(|e| f64::from(1_u32 << e))
}

/// Why a request left the engine: the `reason` label of [`REQUESTS_FINISHED`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishLabel {
    /// A stop token or stop string ended generation.
    Stop,
    /// `max_tokens` or the context length ended generation.
    Length,
    /// The client went away or cancelled.
    Cancelled,
    /// The engine failed the request.
    Error,
}

impl FinishLabel {
    /// Every reason, in declaration order.
    pub const ALL: [Self; 4] = [Self::Stop, Self::Length, Self::Cancelled, Self::Error];

    /// The label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
        }
    }
}

impl EncodeLabelSet for FinishLabel {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("reason", self.as_str()).encode(encoder.encode_label())
    }
}

/// The labels of [`HTTP_REQUESTS`]. `endpoint` is `'static` so that it can only be a route
/// template, never a raw path, which keeps the number of series bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HttpLabels {
    /// The route, e.g. `/v1/chat/completions`.
    pub endpoint: &'static str,
    /// The response's status code.
    pub status: u16,
}

impl EncodeLabelSet for HttpLabels {
    fn encode(&self, encoder: &mut LabelSetEncoder<'_>) -> Result<(), std::fmt::Error> {
        ("endpoint", self.endpoint).encode(encoder.encode_label())?;
        ("status", self.status).encode(encoder.encode_label())
    }
}

/// What one engine step did, recorded at its end with [`Metrics::step`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Wall time of the step.
    pub duration: Duration,
    /// Tokens in the forward batch.
    pub batch_tokens: usize,
    /// Prompt tokens the forward pass computed.
    pub prompt_tokens: usize,
    /// Prompt tokens of requests admitted this step that the prefix cache already held.
    pub prefix_cache_hit_tokens: usize,
    /// Tokens sampled.
    pub generated_tokens: usize,
    /// Requests preempted while scheduling the step.
    pub preemptions: usize,
    /// Sequences that verified proposed tokens.
    pub drafts: usize,
    /// Proposed tokens verified.
    pub draft_tokens: usize,
    /// Proposed tokens accepted.
    pub accepted_tokens: usize,
    /// Requests waiting once the step is done.
    pub waiting: usize,
    /// Requests running once the step is done.
    pub running: usize,
    /// KV blocks in use once the step is done.
    pub kv_blocks_used: usize,
    /// Recurrent-state slots held and snapshots cached once the step is done (hybrid
    /// models).
    pub state: Option<(usize, usize)>,
    /// Where the step's wall time went, on the engine thread.
    pub phases: StepPhases,
    /// Whether the step was queued before the tokens of the step before were read (the
    /// engine's asynchronous scheduling); its generated tokens are that step's.
    pub ahead: bool,
}

/// The engine thread's wall time in each phase of a step. The forward pass's time is its
/// host work (a device backend only queues its kernels); the sampler's includes waiting
/// for the device to finish the step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepPhases {
    /// Choosing the batch.
    pub schedule: Duration,
    /// The forward pass (and the logit masks of constrained rows).
    pub forward: Duration,
    /// Sampling, the device wait included.
    pub sample: Duration,
    /// Appending the tokens, stop checks and events.
    pub postprocess: Duration,
}

/// A finished request's totals, recorded with [`Metrics::finished`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestStats {
    /// From arrival at the engine to finish.
    pub duration: Duration,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub generated_tokens: usize,
}

/// Every metric of the engine and server, registered in one registry.
///
/// The handles are public for recordings the helpers do not cover; each is a cheap clone of
/// the one the registry renders.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Handles into `requests_finished`, indexed by `FinishLabel as usize`, so that
    /// [`Metrics::finished`] never touches the family's lock.
    finished_by_reason: [Counter; 4],
    /// [`REQUESTS_WAITING`].
    pub requests_waiting: Gauge,
    /// [`REQUESTS_RUNNING`].
    pub requests_running: Gauge,
    /// [`KV_BLOCKS_USED`].
    pub kv_blocks_used: Gauge,
    /// [`KV_BLOCKS_CAPACITY`].
    pub kv_blocks_capacity: Gauge,
    /// [`STATE_SLOTS_USED`], [`STATE_SLOTS_CAPACITY`], [`STATE_SNAPSHOTS_CACHED`],
    /// [`STATE_SNAPSHOTS_CAPACITY`] and [`STATE_BYTES`]: all 0 for a model without
    /// recurrent layers.
    pub state: [Gauge; 5],
    /// [`LORA_ADAPTERS_LOADED`].
    pub lora_adapters_loaded: Gauge,
    /// [`BATCH_INVARIANT`].
    pub batch_invariant: Gauge,
    /// [`PREFIX_CACHE_HIT_TOKENS`].
    pub prefix_cache_hit_tokens: Counter,
    /// [`PROMPT_TOKENS_COMPUTED`].
    pub prompt_tokens_computed: Counter,
    /// [`GENERATED_TOKENS`].
    pub generated_tokens: Counter,
    /// [`PREEMPTIONS`].
    pub preemptions: Counter,
    /// [`SPEC_DRAFTS`].
    pub spec_drafts: Counter,
    /// [`SPEC_DRAFT_TOKENS`].
    pub spec_draft_tokens: Counter,
    /// [`SPEC_ACCEPTED_TOKENS`].
    pub spec_accepted_tokens: Counter,
    /// [`SPEC_ACCEPTANCE_RATE`].
    pub spec_acceptance_rate: Gauge<f64, AtomicU64>,
    /// [`SPEC_TOKENS_PER_STEP`].
    pub spec_tokens_per_step: Gauge<f64, AtomicU64>,
    /// [`REQUESTS_FINISHED`]; every reason is present (at zero) from the start.
    pub requests_finished: Family<FinishLabel, Counter>,
    /// [`HTTP_REQUESTS`].
    pub http_requests: Family<HttpLabels, Counter>,
    /// [`STEP_DURATION`].
    pub step_duration: AtomicHistogram,
    /// [`STEP_TOKENS`].
    pub step_tokens: AtomicHistogram,
    /// [`TIME_TO_FIRST_TOKEN`].
    pub time_to_first_token: AtomicHistogram,
    /// [`INTER_TOKEN_LATENCY`].
    pub inter_token_latency: AtomicHistogram,
    /// [`REQUEST_DURATION`].
    pub request_duration: AtomicHistogram,
    /// [`REQUEST_PROMPT_TOKENS`].
    pub request_prompt_tokens: AtomicHistogram,
    /// [`REQUEST_GENERATION_TOKENS`].
    pub request_generation_tokens: AtomicHistogram,
}

impl Metrics {
    /// Creates every metric at zero and registers it.
    pub fn new() -> Self {
        let requests_finished = Family::<FinishLabel, Counter>::default();
        let finished_by_reason = FinishLabel::ALL.map(|reason| requests_finished.get_or_create_owned(&reason));
        let metrics = Self {
            registry: Registry::default(),
            finished_by_reason,
            requests_waiting: Gauge::default(),
            requests_running: Gauge::default(),
            kv_blocks_used: Gauge::default(),
            state: Default::default(),
            kv_blocks_capacity: Gauge::default(),
            lora_adapters_loaded: Gauge::default(),
            batch_invariant: Gauge::default(),
            prefix_cache_hit_tokens: Counter::default(),
            prompt_tokens_computed: Counter::default(),
            generated_tokens: Counter::default(),
            preemptions: Counter::default(),
            spec_drafts: Counter::default(),
            spec_draft_tokens: Counter::default(),
            spec_accepted_tokens: Counter::default(),
            spec_acceptance_rate: Gauge::default(),
            spec_tokens_per_step: Gauge::default(),
            requests_finished,
            http_requests: Family::default(),
            step_duration: AtomicHistogram::new(STEP_SECONDS_BUCKETS),
            step_tokens: AtomicHistogram::new(powers_of_two(14)),
            time_to_first_token: AtomicHistogram::new(TTFT_SECONDS_BUCKETS),
            // A decoding request gets one token per step, so its gaps have the step's range.
            inter_token_latency: AtomicHistogram::new(STEP_SECONDS_BUCKETS),
            request_duration: AtomicHistogram::new(REQUEST_SECONDS_BUCKETS),
            request_prompt_tokens: AtomicHistogram::new(powers_of_two(17)),
            request_generation_tokens: AtomicHistogram::new(powers_of_two(17)),
        };
        metrics.registered()
    }

    /// Registers a clone of every handle in `self.registry`.
    fn registered(mut self) -> Self {
        let r = &mut self.registry;
        r.register(REQUESTS_WAITING, "Requests waiting to be scheduled", self.requests_waiting.clone());
        r.register(REQUESTS_RUNNING, "Requests in the running batch", self.requests_running.clone());
        r.register(KV_BLOCKS_USED, "KV-cache blocks in use", self.kv_blocks_used.clone());
        r.register(KV_BLOCKS_CAPACITY, "KV-cache blocks allocated", self.kv_blocks_capacity.clone());
        let state = [
            (STATE_SLOTS_USED, "Recurrent-state slots held by sequences"),
            (STATE_SLOTS_CAPACITY, "Recurrent-state slots for sequences allocated"),
            (STATE_SNAPSHOTS_CACHED, "Recurrent-state snapshots in the prefix cache"),
            (STATE_SNAPSHOTS_CAPACITY, "Recurrent-state snapshot slots allocated"),
            (STATE_BYTES, "Device memory of the recurrent-state slots"),
        ];
        for ((name, help), gauge) in state.into_iter().zip(&self.state) {
            r.register(name, help, gauge.clone());
        }
        r.register(LORA_ADAPTERS_LOADED, "LoRA adapters loaded", self.lora_adapters_loaded.clone());
        r.register(
            BATCH_INVARIANT,
            "1 when a request's output does not depend on the requests batched with it",
            self.batch_invariant.clone(),
        );
        register_counter(
            r,
            PREFIX_CACHE_HIT_TOKENS,
            "Prompt tokens served from the prefix cache",
            self.prefix_cache_hit_tokens.clone(),
        );
        register_counter(r, PROMPT_TOKENS_COMPUTED, "Prompt tokens computed", self.prompt_tokens_computed.clone());
        register_counter(r, GENERATED_TOKENS, "Tokens generated", self.generated_tokens.clone());
        register_counter(r, PREEMPTIONS, "Requests preempted", self.preemptions.clone());
        register_counter(r, SPEC_DRAFTS, "Speculative verifications", self.spec_drafts.clone());
        register_counter(r, SPEC_DRAFT_TOKENS, "Proposed tokens verified", self.spec_draft_tokens.clone());
        register_counter(r, SPEC_ACCEPTED_TOKENS, "Proposed tokens accepted", self.spec_accepted_tokens.clone());
        r.register(SPEC_ACCEPTANCE_RATE, "Accepted over verified proposed tokens", self.spec_acceptance_rate.clone());
        r.register(SPEC_TOKENS_PER_STEP, "Tokens per verifying step of a sequence", self.spec_tokens_per_step.clone());
        register_counter(r, REQUESTS_FINISHED, "Requests finished, by reason", self.requests_finished.clone());
        // An empty family renders nothing at all; keep the HELP and TYPE lines visible
        // before the first request so that scrapers and dashboards see the metric exists.
        register_counter(
            r,
            HTTP_REQUESTS,
            "HTTP responses, by endpoint and status",
            AlwaysDescribed(self.http_requests.clone()),
        );
        r.register(STEP_DURATION, "Engine step wall time", self.step_duration.clone());
        r.register(STEP_TOKENS, "Tokens in an engine step's forward batch", self.step_tokens.clone());
        r.register(TIME_TO_FIRST_TOKEN, "Arrival to first generated token", self.time_to_first_token.clone());
        r.register(INTER_TOKEN_LATENCY, "Time between a request's generated tokens", self.inter_token_latency.clone());
        r.register(REQUEST_DURATION, "Arrival to finish, end to end", self.request_duration.clone());
        r.register(REQUEST_PROMPT_TOKENS, "Prompt length of finished requests", self.request_prompt_tokens.clone());
        r.register(
            REQUEST_GENERATION_TOKENS,
            "Generated length of finished requests",
            self.request_generation_tokens.clone(),
        );
        self
    }

    /// Records one engine step: its duration and batch size, the token and preemption
    /// counters, and the queue and KV gauges as they stand after it.
    pub fn step(&self, stats: &StepStats) {
        self.step_duration.observe(stats.duration.as_secs_f64());
        self.step_tokens.observe(stats.batch_tokens as f64);
        self.prompt_tokens_computed.inc_by(as_u64(stats.prompt_tokens));
        self.prefix_cache_hit_tokens.inc_by(as_u64(stats.prefix_cache_hit_tokens));
        self.generated_tokens.inc_by(as_u64(stats.generated_tokens));
        self.preemptions.inc_by(as_u64(stats.preemptions));
        if stats.drafts > 0 {
            self.spec_drafts.inc_by(as_u64(stats.drafts));
            self.spec_draft_tokens.inc_by(as_u64(stats.draft_tokens));
            self.spec_accepted_tokens.inc_by(as_u64(stats.accepted_tokens));
            let (drafts, accepted) = (self.spec_drafts.get() as f64, self.spec_accepted_tokens.get() as f64);
            self.spec_acceptance_rate.set(accepted / (self.spec_draft_tokens.get() as f64).max(1.0));
            self.spec_tokens_per_step.set(1.0 + accepted / drafts);
        }
        self.requests_waiting.set(as_i64(stats.waiting));
        self.requests_running.set(as_i64(stats.running));
        self.kv_blocks_used.set(as_i64(stats.kv_blocks_used));
        if let Some((held, cached)) = stats.state {
            self.state[0].set(as_i64(held));
            self.state[2].set(as_i64(cached));
        }
    }

    /// Records the KV cache's size, once it is allocated.
    pub fn set_kv_capacity(&self, blocks: usize) {
        self.kv_blocks_capacity.set(as_i64(blocks));
    }

    /// Records the recurrent-state slots allocated (hybrid models): for sequences, for
    /// snapshots, and their bytes on one device.
    pub fn set_state_capacity(&self, sequences: usize, snapshots: usize, bytes: usize) {
        self.state[1].set(as_i64(sequences));
        self.state[3].set(as_i64(snapshots));
        self.state[4].set(as_i64(bytes));
    }

    /// Records whether the backend's kernels are batch-invariant.
    pub fn set_batch_invariant(&self, invariant: bool) {
        self.batch_invariant.set(i64::from(invariant));
    }

    /// Records how many LoRA adapters are loaded, after one loads or unloads.
    pub fn set_lora_adapters(&self, loaded: usize) {
        self.lora_adapters_loaded.set(as_i64(loaded));
    }

    /// Records the time from a request's arrival to its first generated token.
    pub fn first_token(&self, latency: Duration) {
        self.time_to_first_token.observe(latency.as_secs_f64());
    }

    /// Records the gap between two consecutive tokens of one request.
    pub fn inter_token(&self, gap: Duration) {
        self.inter_token_latency.observe(gap.as_secs_f64());
    }

    /// Records a request leaving the engine: the finish counter for `reason`, and its
    /// duration, prompt and generated lengths, whatever the reason.
    pub fn finished(&self, reason: FinishLabel, request: RequestStats) {
        self.finished_by_reason[reason as usize].inc();
        self.request_duration.observe(request.duration.as_secs_f64());
        self.request_prompt_tokens.observe(request.prompt_tokens as f64);
        self.request_generation_tokens.observe(request.generated_tokens as f64);
    }

    /// Records one HTTP response. Takes the family's read lock (its write lock the first
    /// time a pair is seen); meant for server tasks, not the engine thread.
    pub fn http_request(&self, endpoint: &'static str, status: u16) {
        self.http_requests.get_or_create(&HttpLabels { endpoint, status }).inc();
    }

    /// The Prometheus text exposition of every metric; send it as [`CONTENT_TYPE`].
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a `String` cannot fail, and every registered metric has a text encoding.
        prometheus_text::encode(&mut out, &self.registry).expect("metrics encode to text");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers a counter under its exposed name less `_total`, which the encoder appends.
fn register_counter(registry: &mut Registry, name: &'static str, help: &str, counter: impl Metric) {
    let base = name.strip_suffix("_total").expect("counter names end in _total");
    registry.register(base, help, counter);
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

fn as_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A metric that renders its HELP and TYPE lines even while it has no samples.
#[derive(Debug)]
struct AlwaysDescribed<M>(M);

impl<M: TypedMetric> TypedMetric for AlwaysDescribed<M> {
    const TYPE: MetricType = M::TYPE;
}

impl<M: EncodeMetric> EncodeMetric for AlwaysDescribed<M> {
    fn encode(&self, encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }

    fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
