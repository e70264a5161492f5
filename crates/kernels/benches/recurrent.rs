//! CPU benchmarks of the Gated DeltaNet ops at a Qwen3.5-like layer's shapes: 16 key heads
//! and 32 value heads of 128 dims, a convolution of width 4 over the 8,192 channels of
//! `q, k, v` (`2·16·128 + 32·128`).
//!
//! - `decode_64`: one row for each of 64 sequences, each with its own state slot (the
//!   delta rule's pool is 128 MiB, so a step streams every state from memory once).
//! - `prefill_2048`: one sequence of 2,048 rows (the delta rule runs them one by one, as it
//!   runs every row, so that a prompt gives the bits its decode steps would).
//!
//! Throughput is rows per second. Every timed call ends with `synchronize`, as a device
//! backend will need; states carry from one iteration to the next, as in serving.

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use met_kernels::{CpuBackend, DType, DeltaRule, GpuBackend, HostTensor, RecurrentBatch, Tensor};

const KEY_HEADS: usize = 16;
const VALUE_HEADS: usize = 32;
const HEAD_DIM: usize = 128;
const CHANNELS: usize = 2 * KEY_HEADS * HEAD_DIM + VALUE_HEADS * HEAD_DIM;
const WIDTH: usize = 4;

/// Deterministic values in `[lo, hi)`, so runs are comparable.
fn values(n: usize, seed: u64, (lo, hi): (f32, f32)) -> Vec<f32> {
    (0..n).map(|i| lo + (hi - lo) * (met_kernels::rng::weight_uniform(seed, i as u64) + 1.0) / 2.0).collect()
}

fn upload(b: &CpuBackend, data: &[f32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_f32(data, dims), DType::F32).expect("upload")
}

fn upload_u32(b: &CpuBackend, data: &[u32]) -> Tensor {
    b.upload(&HostTensor::from_u32(data, &[data.len()]), DType::U32).expect("upload")
}

/// One step's shape: `seqs` sequences of `rows` rows each.
struct Step {
    name: &'static str,
    seqs: usize,
    rows: usize,
}

const STEPS: [Step; 2] =
    [Step { name: "decode_64", seqs: 64, rows: 1 }, Step { name: "prefill_2048", seqs: 1, rows: 2048 }];

/// `cu_seqlens` and `slots` of a step.
fn batch_tensors(b: &CpuBackend, step: &Step) -> (Tensor, Tensor) {
    let cu: Vec<u32> = (0..=step.seqs).map(|s| (s * step.rows) as u32).collect();
    let slots: Vec<u32> = (0..step.seqs as u32).collect();
    (upload_u32(b, &cu), upload_u32(b, &slots))
}

fn causal_conv1d(c: &mut Criterion) {
    let b = CpuBackend::new();
    let weight = upload(&b, &values(CHANNELS * WIDTH, 1, (-0.5, 0.5)), &[CHANNELS, WIDTH]);
    let mut group = c.benchmark_group("causal_conv1d");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for step in &STEPS {
        let t = step.seqs * step.rows;
        let x = upload(&b, &values(t * CHANNELS, 2, (-1.0, 1.0)), &[t, CHANNELS]);
        let state = b.zeros(&[step.seqs, CHANNELS, WIDTH - 1], DType::F32).expect("pool");
        let (cu, slots) = batch_tensors(&b, step);
        let batch = RecurrentBatch { cu_seqlens: &cu, slots: &slots, snapshots: &[] };
        group.throughput(Throughput::Elements(t as u64));
        group.bench_function(step.name, |bench| {
            bench.iter(|| {
                black_box(b.causal_conv1d(&x, &weight, &state, &batch).expect("conv"));
                b.synchronize().expect("sync");
            });
        });
    }
    group.finish();
}

fn gated_delta_rule(c: &mut Criterion) {
    let b = CpuBackend::new();
    let a_log: Vec<f32> = values(VALUE_HEADS, 3, (0.02, 0.5)).iter().map(|v| v.ln()).collect();
    let (a_log, dt_bias) =
        (upload(&b, &a_log, &[VALUE_HEADS]), upload(&b, &values(VALUE_HEADS, 4, (-1.0, 1.0)), &[VALUE_HEADS]));
    let rule = DeltaRule {
        num_key_heads: KEY_HEADS,
        num_value_heads: VALUE_HEADS,
        key_dim: HEAD_DIM,
        value_dim: HEAD_DIM,
        a_log: &a_log,
        dt_bias: &dt_bias,
    };
    let mut group = c.benchmark_group("gated_delta_rule");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(5));
    for step in &STEPS {
        let t = step.seqs * step.rows;
        let qkv = upload(&b, &values(t * CHANNELS, 5, (-1.0, 1.0)), &[t, CHANNELS]);
        let (a, gate_b) = (values(t * VALUE_HEADS, 6, (-3.0, 3.0)), values(t * VALUE_HEADS, 7, (-3.0, 3.0)));
        let (a, gate_b) = (upload(&b, &a, &[t, VALUE_HEADS]), upload(&b, &gate_b, &[t, VALUE_HEADS]));
        let state = b.zeros(&[step.seqs, VALUE_HEADS, HEAD_DIM, HEAD_DIM], DType::F32).expect("pool");
        let (cu, slots) = batch_tensors(&b, step);
        let batch = RecurrentBatch { cu_seqlens: &cu, slots: &slots, snapshots: &[] };
        group.throughput(Throughput::Elements(t as u64));
        group.bench_function(step.name, |bench| {
            bench.iter(|| {
                black_box(b.gated_delta_rule(&qkv, &a, &gate_b, &rule, &state, &batch).expect("delta rule"));
                b.synchronize().expect("sync");
            });
        });
    }
    group.finish();
}

criterion_group!(benches, causal_conv1d, gated_delta_rule);
criterion_main!(benches);
