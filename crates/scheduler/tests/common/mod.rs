//! Shared helpers: build an engine over the mock model and run requests to completion
//! while checking the cache invariants after every step. The speculative-decoding tests'
//! proposers and comparisons are in [`speculative`].

#![allow(dead_code)]

pub mod speculative;

use std::sync::Arc;

use met_cache::PagedKvCache;
use met_config::{AsyncScheduling, EngineConfig, SamplingParams};
use met_kernels::CpuBackend;
use met_scheduler::mock::{Faults, MockModel};
use met_scheduler::{
    Engine, EngineLimits, EngineRequest, FinishReason, Priority, RequestError, RequestStream, SchedulingPolicy,
    StopCriteria, TokenEvent,
};
use met_telemetry::Metrics;

pub const VOCAB: usize = 64;
pub const MAX_CONTEXT: usize = 512;

/// How to build the engine of a test.
#[derive(Debug, Clone)]
pub struct Setup {
    pub config: EngineConfig,
    pub kv_blocks: usize,
    pub priority: bool,
    /// Failures the mock injects.
    pub faults: Faults,
}

impl Setup {
    pub fn new(kv_blocks: usize) -> Self {
        Self {
            config: EngineConfig { block_size: 4, ..EngineConfig::default() },
            kv_blocks,
            priority: false,
            faults: Faults::default(),
        }
    }

    pub fn chunk(mut self, chunk: usize) -> Self {
        self.config.max_prefill_chunk = Some(chunk);
        self
    }

    /// Steps queued ahead of their tokens (on the CPU too, where it is off by default).
    pub fn async_scheduling(mut self, on: bool) -> Self {
        self.config.async_scheduling = if on { AsyncScheduling::On } else { AsyncScheduling::Off };
        self
    }

    pub fn prefix_caching(mut self, on: bool) -> Self {
        self.config.prefix_caching = on;
        self
    }

    pub fn engine(&self) -> (Engine, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let backend = Arc::new(CpuBackend::new());
        let kv = PagedKvCache::new(
            &*backend,
            MockModel::layout(),
            self.config.block_size,
            self.kv_blocks,
            self.config.prefix_caching,
        )
        .unwrap();
        let policy: Box<dyn SchedulingPolicy> =
            if self.priority { Box::new(Priority) } else { Box::new(met_scheduler::Fcfs) };
        let engine = Engine::new(
            Box::new(MockModel::new(VOCAB, MAX_CONTEXT).with_faults(self.faults)),
            backend,
            Box::new(kv),
            self.config.clone(),
            Arc::clone(&metrics),
        )
        .unwrap()
        .with_policy(policy);
        (engine, metrics)
    }
}

/// Limits test requests are made against: the mock's vocabulary and context, and a cache
/// no test engine exceeds. An engine re-checks such a request against its own.
pub const LIMITS: EngineLimits =
    EngineLimits { vocab_size: VOCAB, max_context: MAX_CONTEXT, kv_capacity: usize::MAX / 2, stream_capacity: 64 };

/// The parts of a test request, edited before it is made.
#[derive(Debug, Clone)]
pub struct Parts {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopCriteria,
    pub n: usize,
    pub priority: i32,
}

impl Parts {
    pub fn greedy(prompt: Vec<u32>, max_new_tokens: usize) -> Self {
        Self::with(prompt, max_new_tokens, SamplingParams::greedy())
    }

    pub fn sampled(prompt: Vec<u32>, max_new_tokens: usize, seed: u64) -> Self {
        Self::with(
            prompt,
            max_new_tokens,
            SamplingParams { temperature: 0.9, top_p: 0.95, seed, ..SamplingParams::default() },
        )
    }

    pub fn with(prompt: Vec<u32>, max_new_tokens: usize, sampling: SamplingParams) -> Self {
        Self { prompt, sampling, stop: StopCriteria { max_new_tokens, ..StopCriteria::default() }, n: 1, priority: 0 }
    }

    /// The request, made against `limits`.
    pub fn try_make(self, limits: &EngineLimits) -> Result<EngineRequest, RequestError> {
        Ok(EngineRequest::new(self.prompt, self.sampling, self.stop, self.n, limits)?.with_priority(self.priority))
    }

    /// The request, made against [`LIMITS`]; panics on parts that cannot work.
    pub fn make(self) -> EngineRequest {
        self.try_make(&LIMITS).unwrap()
    }
}

pub fn greedy(prompt: Vec<u32>, max_new_tokens: usize) -> EngineRequest {
    Parts::greedy(prompt, max_new_tokens).make()
}

pub fn sampled(prompt: Vec<u32>, max_new_tokens: usize, seed: u64) -> EngineRequest {
    Parts::sampled(prompt, max_new_tokens, seed).make()
}

/// Everything one request's stream delivered, per continuation.
#[derive(Debug, Default, Clone)]
pub struct Outcome {
    pub tokens: Vec<Vec<u32>>,
    pub finish: Vec<Option<FinishReason>>,
    pub cached: Vec<usize>,
    pub events: Vec<TokenEvent>,
}

/// Collects events from `stream` into `out` without waiting.
pub fn collect(stream: &mut RequestStream, out: &mut Outcome, n: usize) {
    out.tokens.resize(n, Vec::new());
    out.finish.resize(n, None);
    out.cached.resize(n, 0);
    while let Some(e) = stream.try_next() {
        assert!(out.finish[e.index].is_none(), "event after finish: {e:?}");
        if let Some(t) = &e.token {
            out.tokens[e.index].push(t.id);
        }
        out.cached[e.index] = e.cached_prompt_tokens;
        out.finish[e.index].clone_from(&e.finish);
        out.events.push(e);
    }
}

/// Steps `engine` until every stream is done, asserting after every step that held +
/// free blocks = total, and at the end that no block is held.
pub fn run_all(engine: &mut Engine, requests: Vec<EngineRequest>) -> Vec<Outcome> {
    let ns: Vec<usize> = requests.iter().map(EngineRequest::n).collect();
    let mut streams: Vec<RequestStream> = requests.into_iter().map(|r| engine.submit(r).unwrap()).collect();
    let mut outcomes = vec![Outcome::default(); streams.len()];
    let mut steps = 0;
    while engine.has_work() {
        engine.step();
        steps += 1;
        assert!(steps < 100_000, "the engine does not finish");
        assert_eq!(
            engine.held_blocks() + engine.free_blocks(),
            engine.total_blocks(),
            "blocks leaked or double-counted"
        );
        for ((s, o), &n) in streams.iter_mut().zip(&mut outcomes).zip(&ns) {
            collect(s, o, n);
        }
    }
    for ((s, o), &n) in streams.iter_mut().zip(&mut outcomes).zip(&ns) {
        collect(s, o, n);
    }
    assert_eq!(engine.free_blocks(), engine.total_blocks(), "blocks held after every request finished");
    outcomes
}
