//! One engine step with 256 running sequences over a nearly free mock model: the CPU cost
//! of scheduling, batch building, greedy sampling over a tiny vocabulary and bookkeeping.
//! Target: well under 100 µs, so the scheduler never limits a GPU whose decode step takes
//! milliseconds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use met_cache::PagedKvCache;
use met_config::{EngineConfig, SamplingParams};
use met_kernels::CpuBackend;
use met_scheduler::mock::MockModel;
use met_scheduler::{Engine, EngineRequest, RequestStream, StopCriteria};
use met_telemetry::Metrics;

const SEQS: usize = 256;
/// Decode steps timed per engine before it is rebuilt (sequences must not finish).
const STEPS_PER_ENGINE: u64 = 400;

fn engine_in_decode() -> (Engine, Vec<RequestStream>) {
    let config = EngineConfig { max_num_seqs: SEQS, ..EngineConfig::default() };
    let backend = Arc::new(CpuBackend::new());
    let kv = PagedKvCache::new(&*backend, MockModel::layout(), config.block_size, SEQS * 40, true).unwrap();
    let model = Box::new(MockModel::last_token_only(32, 1 << 16));
    let mut engine = Engine::new(model, backend, Box::new(kv), config, Arc::new(Metrics::new())).unwrap();
    let streams = (0..SEQS as u32)
        .map(|i| {
            let prompt = (0..8).map(|j| (i + j) % 32).collect();
            let stop = StopCriteria { max_new_tokens: 10_000, ..StopCriteria::default() };
            let req = EngineRequest::new(prompt, SamplingParams::greedy(), stop, 1, &engine.limits()).unwrap();
            engine.submit(req).unwrap()
        })
        .collect();
    engine.step(); // prefill every prompt
    (engine, streams)
}

fn drain(streams: &mut [RequestStream]) {
    for s in streams {
        while s.try_next().is_some() {}
    }
}

fn step(c: &mut Criterion) {
    c.bench_function("engine_step_256_decoding", |b| {
        // Inside the rayon pool, as the engine thread runs (`met_scheduler::spawn`).
        b.iter_custom(|iters| {
            rayon::scope(|_| {
                let mut total = Duration::ZERO;
                let mut done = 0;
                while done < iters {
                    let (mut engine, mut streams) = engine_in_decode();
                    for _ in 0..STEPS_PER_ENGINE.min(iters - done) {
                        let start = Instant::now();
                        engine.step();
                        total += start.elapsed();
                        drain(&mut streams);
                        done += 1;
                    }
                }
                total
            })
        });
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(5));
    targets = step
}
criterion_main!(benches);
