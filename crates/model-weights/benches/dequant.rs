//! GGUF dequantisation of a 4096 × 4096 matrix (an 8B model's attention projection) in
//! every block format met reads: what loading a quantised checkpoint to f32 costs.
//!
//! - `gguf_dequantize`: `met_model_weights::gguf::dequantize`, the loader's path: runs of
//!   whole blocks decoded in parallel on the rayon pool.
//! - `dequantize_row`: `met_kernels::quant::dequantize_row` over the same blocks on the
//!   calling thread: the block decoders alone.
//!
//! The blocks are built here from a fixed seed: random quants, and finite f16 scales (and
//! minimums) of a realistic size written where each format keeps them, so no value is
//! NaN or infinite. Throughput is `Throughput::Bytes` of blocks read (the bytes a load
//! takes from the file), so formats compare as GB/s of checkpoint. A sample takes tens of
//! milliseconds, so samples are few and flat.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use half::f16;
use met_model_weights::GgmlType;
use met_model_weights::gguf::dequantize;

/// Rows and columns of the matrix.
const ROWS: usize = 4096;
const COLS: usize = 4096;

/// The block formats, each with the byte offsets of its f16 fields (scale, then minimum
/// where the format has one), from ggml's block layouts.
const FORMATS: [(GgmlType, &[usize]); 8] = [
    (GgmlType::Q4_0, &[0]),
    (GgmlType::Q4_1, &[0, 2]),
    (GgmlType::Q5_0, &[0]),
    (GgmlType::Q5_1, &[0, 2]),
    (GgmlType::Q8_0, &[0]),
    (GgmlType::Q4_K, &[0, 2]),
    (GgmlType::Q5_K, &[0, 2]),
    (GgmlType::Q6_K, &[208]),
];

/// A xorshift stream of bytes from `seed`, so every run decodes the same blocks.
fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 32) as u8
        })
        .collect()
}

/// `ROWS × COLS` elements of `ggml_type` as blocks: random quants, and f16 fields at
/// `halves` holding scales of 0.001 to 0.017 (a trained layer's range) with either sign.
fn blocks(ggml_type: GgmlType, halves: &[usize]) -> Vec<u8> {
    let len = ggml_type.bytes_for(ROWS * COLS).expect("whole blocks");
    let mut bytes = random_bytes(len, ggml_type.id().into());
    let block_bytes = ggml_type.type_size();
    let mut scales = random_bytes(len / block_bytes * halves.len(), 7).into_iter();
    for block in bytes.chunks_exact_mut(block_bytes) {
        for &at in halves {
            let r = scales.next().expect("one random byte per field");
            let magnitude = f32::from(r & 0x7F).mul_add(2f32.powi(-13), 2f32.powi(-10));
            let scale = if r & 0x80 == 0 { magnitude } else { -magnitude };
            block[at..at + 2].copy_from_slice(&f16::from_f32(scale).to_le_bytes());
        }
    }
    bytes
}

fn bench_format(
    group: &mut BenchmarkGroup<'_, WallTime>,
    (ggml_type, halves): (GgmlType, &[usize]),
    out: &mut [f32],
    parallel: bool,
) {
    let bytes = blocks(ggml_type, halves);
    group.throughput(Throughput::Bytes(bytes.len() as u64));
    group.bench_function(format!("{ggml_type}/{ROWS}x{COLS}"), |b| {
        b.iter(|| {
            if parallel {
                dequantize(ggml_type, black_box(&bytes), black_box(&mut *out));
            } else {
                let format = ggml_type.quant_format().expect("a block format");
                met_kernels::quant::dequantize_row(format, black_box(&bytes), black_box(&mut *out));
            }
        });
    });
    assert!(out.iter().all(|x| x.is_finite()), "{ggml_type}: the blocks decode to finite values");
}

fn dequant(c: &mut Criterion, name: &str, parallel: bool) {
    let mut out = vec![0f32; ROWS * COLS];
    let mut group = c.benchmark_group(name);
    group.sampling_mode(SamplingMode::Flat);
    for format in FORMATS {
        bench_format(&mut group, format, &mut out, parallel);
    }
    group.finish();
}

/// The loader's parallel dequantiser.
fn gguf_dequantize(c: &mut Criterion) {
    dequant(c, "gguf_dequantize", true);
}

/// The block decoders on one thread.
fn dequantize_row(c: &mut Criterion) {
    dequant(c, "dequantize_row", false);
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = gguf_dequantize, dequantize_row
}
criterion_main!(benches);
