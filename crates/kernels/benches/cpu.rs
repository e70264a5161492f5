//! CPU backend benchmarks at SmolLM2-135M's shapes, next to the `gemm` crate's own peak.
//!
//! - `matmul_f32`: `CpuBackend::matmul` on `x [m, 576] · W[1536, 576]ᵀ` (the MLP up/gate
//!   projection of SmolLM2-135M) for a decode step (m = 1), a 64-token batch and a
//!   256-token prompt.
//! - `gemm_peak`: `gemm::gemm` called directly, exactly as `cpu/matmul.rs` calls it, on a
//!   1024³ square problem (the ceiling this machine gives the GEMM crate) and on the two
//!   shapes above (so the gap to `matmul_f32` is our wrapper's overhead: output allocation,
//!   locks, shape checks).
//! - `matmul_quant` / `layer_q4_1`: packed Q4_1 and Q8_0 matmuls with exact and integer
//!   dots, one MLP projection for m = 1, 5 and 64, and the seven of one layer for m = 1, 5
//!   (decode) and 256 (a prompt).
//! - `matmul_kquant`: packed Q4_K, Q5_K and Q6_K at Qwen3-0.6B's MLP projection (K-quant
//!   rows are whole 256-element super-blocks, which SmolLM2's 576 is not).
//! - `paged_attention`: 9 query heads on 3 KV heads of 64 dims in blocks of 16 (SmolLM2-135M's
//!   attention), for 32 decode rows over 512-token contexts and for a 256-token prefill,
//!   and the `flash` op on that prefill.
//!
//! Throughput is `Throughput::Elements(FLOPs)`, so criterion's "elements/s" reads as FLOP/s:
//! `2·m·k·n` for a GEMM, `4·h·d` per visible (query, key) pair for attention (q·k and p·v).
//! Every timed call ends with `synchronize`, as a device backend will need. Samples are few
//! and short so the whole run stays within a couple of minutes on two cores.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};
use met_kernels::{AttentionMeta, AttentionParams, CpuBackend, DType, GpuBackend, HostTensor, KvScales, Tensor};

/// SmolLM2-135M's hidden and MLP intermediate sizes.
const HIDDEN: usize = 576;
const INTERMEDIATE: usize = 1536;

/// Deterministic values in `[-1, 1)`, so runs are comparable.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn upload(b: &CpuBackend, data: &[f32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_f32(data, dims), DType::F32).expect("upload")
}

fn upload_u32(b: &CpuBackend, data: &[u32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_u32(data, dims), DType::U32).expect("upload")
}

fn flops(n: usize) -> Throughput {
    Throughput::Elements(n as u64)
}

/// `CpuBackend::matmul` at the MLP projection for m = 1 and m = 64.
fn matmul_f32(c: &mut Criterion) {
    let backend = CpuBackend::new();
    let (k, n) = (HIDDEN, INTERMEDIATE);
    let w = upload(&backend, &values(n * k, 1), &[n, k]);
    let mut group = c.benchmark_group("matmul_f32");
    for m in [1, 64, 256] {
        let x = upload(&backend, &values(m * k, 2), &[m, k]);
        group.throughput(flops(2 * m * k * n));
        group.bench_function(format!("cpu_backend/m{m}_k{k}_n{n}"), |bench| {
            bench.iter(|| {
                let y = backend.matmul(black_box(&x), black_box(&w), None).expect("matmul");
                backend.synchronize().expect("synchronize");
                y
            });
        });
    }
    group.finish();
}

/// `out [m, n] = x [m, k] · wᵀ` with `w [n, k]`, through `gemm::gemm` with the strides
/// and parallelism `cpu/matmul.rs` uses.
fn gemm_xwt(out: &mut [f32], x: &[f32], w: &[f32], (m, k, n): (usize, usize, usize)) {
    assert!(out.len() == m * n && x.len() == m * k && w.len() == n * k, "operands do not match the shape");
    // SAFETY: the asserted lengths cover every element the strides reach: out and x are
    // row-major [m, n] and [m, k]; wᵀ [k, n] is read from w's rows (column stride k, row
    // stride 1). `out` is a distinct, exclusively borrowed buffer.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

fn bench_gemm(group: &mut BenchmarkGroup<'_, WallTime>, (m, k, n): (usize, usize, usize)) {
    let (x, w) = (values(m * k, 3), values(n * k, 4));
    let mut out = vec![0f32; m * n];
    group.throughput(flops(2 * m * k * n));
    group.bench_function(format!("direct/m{m}_k{k}_n{n}"), |bench| {
        bench.iter(|| gemm_xwt(black_box(&mut out), black_box(&x), black_box(&w), (m, k, n)));
    });
}

/// The `gemm` crate on its own: a 1024³ square problem, then our two MLP shapes.
fn gemm_peak(c: &mut Criterion) {
    let mut group = c.benchmark_group("gemm_peak");
    for shape in [(1024, 1024, 1024), (1, HIDDEN, INTERMEDIATE), (64, HIDDEN, INTERMEDIATE)] {
        bench_gemm(&mut group, shape);
    }
    group.finish();
}

/// A paged attention workload: filled pools, interleaved block tables and queries.
struct AttentionCase {
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    meta: AttentionMeta,
    params: AttentionParams,
    flops: usize,
}

/// `seqs` sequences of `context` tokens whose last `q_len` are queries, at SmolLM2-135M's
/// attention shape, with each sequence's blocks interleaved with the others' in the pool.
fn attention_case(b: &CpuBackend, seqs: usize, context: usize, q_len: usize) -> AttentionCase {
    let (h, h_kv, d, bs) = (9, 3, 64, 16);
    let per_seq = context.div_ceil(bs);
    let blocks = seqs * per_seq;
    let pool = [blocks, bs, h_kv, d];
    let k_cache = upload(b, &values(blocks * bs * h_kv * d, 5), &pool);
    let v_cache = upload(b, &values(blocks * bs * h_kv * d, 6), &pool);
    let tables: Vec<u32> = (0..seqs).flat_map(|s| (0..per_seq).map(move |i| (i * seqs + s) as u32)).collect();
    let cu: Vec<u32> = (0..=seqs).map(|s| (s * q_len) as u32).collect();
    let meta = AttentionMeta {
        cu_seqlens_q: upload_u32(b, &cu, &[seqs + 1]),
        seq_lens: upload_u32(b, &vec![context as u32; seqs], &[seqs]),
        block_tables: upload_u32(b, &tables, &[seqs, per_seq]),
        max_seqlen_q: q_len,
        max_seqlen_k: context,
    };
    let params = AttentionParams {
        num_heads: h,
        num_kv_heads: h_kv,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        sliding_window: None,
        softcap: None,
        kv_scales: KvScales::UNIT,
    };
    let t = seqs * q_len;
    // Query i of a sequence sees the context - q_len + i + 1 keys up to its own position.
    let pairs: usize = (0..q_len).map(|i| context - q_len + i + 1).sum::<usize>() * seqs;
    let q = upload(b, &values(t * h * d, 7), &[t, h, d]);
    AttentionCase { q, k_cache, v_cache, meta, params, flops: 4 * h * d * pairs }
}

/// Decode (32 rows over 512-token contexts) and prefill (one 256-token prompt).
fn paged_attention(c: &mut Criterion) {
    let backend = CpuBackend::new();
    let mut group = c.benchmark_group("paged_attention");
    for (name, seqs, context, q_len) in [("decode_32x512", 32, 512, 1), ("prefill_1x256", 1, 256, 256)] {
        let case = attention_case(&backend, seqs, context, q_len);
        group.throughput(flops(case.flops));
        group.bench_function(format!("{name}_h9_kv3_d64_b16"), |bench| {
            bench.iter(|| {
                let out = backend
                    .paged_attention(black_box(&case.q), &case.k_cache, &case.v_cache, &case.meta, &case.params)
                    .expect("paged_attention");
                backend.synchronize().expect("synchronize");
                out
            });
        });
    }
    // The flash op on the prompt: the same per-row kernel since prompts stopped being
    // attended in tiles through GEMMs (batch invariance), timed against the tiled one.
    let case = attention_case(&backend, 1, 256, 256);
    group.throughput(flops(case.flops));
    group.bench_function("flash_prefill_1x256_h9_kv3_d64_b16", |bench| {
        bench.iter(|| {
            let out = backend
                .flash_attention(black_box(&case.q), &case.k_cache, &case.v_cache, &case.meta, &case.params)
                .expect("flash_attention");
            backend.synchronize().expect("synchronize");
            out
        });
    });
    group.finish();
}

/// Random bytes with a small finite f16 scale (and minimum) in every block, packed.
fn packed_weights(
    format: met_kernels::quant::QuantFormat,
    n: usize,
    k: usize,
    seed: u64,
) -> met_kernels::quant::PackedQuant {
    use met_kernels::quant::QuantFormat;
    let row = format.bytes_for(k).expect("whole blocks");
    let mut w: Vec<u8> = values(n * row, seed).iter().map(|v| (v.to_bits() >> 7) as u8).collect();
    let scale_at = if format == QuantFormat::Q6_K { format.block_bytes() - 2 } else { 0 };
    for block in w.chunks_exact_mut(format.block_bytes()) {
        block[scale_at..scale_at + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        if matches!(format, QuantFormat::Q4_1 | QuantFormat::Q4_K | QuantFormat::Q5_K) {
            block[2..4].copy_from_slice(&half::f16::from_f32(-0.05).to_le_bytes());
        }
    }
    met_kernels::quant::PackedQuant::from_blocks(format, &w, k).expect("a packed format")
}

/// `cpu::matmul_packed` (the CPU's quantised matmul) at the MLP projection with Q4_1 and
/// Q8_0 weights (SmolLM2's GGUF formats), with exact and integer dots, for m = 1, 5 (a
/// decode row and four speculative tokens) and 64: the same FLOPs as `matmul_f32`, from
/// quantised blocks.
fn matmul_quant(c: &mut Criterion) {
    use met_kernels::QuantDots;
    use met_kernels::quant::QuantFormat;
    let (k, n) = (HIDDEN, INTERMEDIATE);
    let mut group = c.benchmark_group("matmul_quant");
    for format in [QuantFormat::Q4_1, QuantFormat::Q8_0] {
        let packed = packed_weights(format, n, k, 3);
        for dots in [QuantDots::Exact, QuantDots::Int8] {
            for m in [1, 5, 8, 64] {
                let x = values(m * k, 2);
                group.throughput(flops(2 * m * k * n));
                group.bench_function(format!("{format}/{dots}/m{m}_k{k}_n{n}"), |bench| {
                    bench.iter(|| met_kernels::cpu::matmul_packed(black_box(&x), black_box(&packed), None, m, dots));
                });
            }
        }
    }
    group.finish();
}

/// `cpu::matmul_packed` with the K-quants of a Q4_K_M file at Qwen3-0.6B's MLP up
/// projection (`k` = 1024, `n` = 3072), with exact and integer dots, for a decode step and
/// a 64-token chunk of a prompt.
fn matmul_kquant(c: &mut Criterion) {
    use met_kernels::QuantDots;
    use met_kernels::quant::QuantFormat;
    let (k, n) = (1024, 3072);
    let mut group = c.benchmark_group("matmul_kquant");
    for format in [QuantFormat::Q4_K, QuantFormat::Q5_K, QuantFormat::Q6_K] {
        let packed = packed_weights(format, n, k, 5);
        for dots in [QuantDots::Exact, QuantDots::Int8] {
            for m in [1, 64] {
                let x = values(m * k, 2);
                group.throughput(flops(2 * m * k * n));
                group.bench_function(format!("{format}/{dots}/m{m}_k{k}_n{n}"), |bench| {
                    bench.iter(|| met_kernels::cpu::matmul_packed(black_box(&x), black_box(&packed), None, m, dots));
                });
            }
        }
    }
    group.finish();
}

/// The matmuls of a Qwen3-0.6B Q4_K_M decode step but the head: 28 layers of fused q/k/v,
/// o, fused gate/up (Q4_K) and down (Q6_K), for one activation row and for 2 and 4 (a few
/// sequences decoding together, or a draft being verified), about 200 MB of weights
/// streamed from memory per step as in a real decode.
fn decode_kquant(c: &mut Criterion) {
    use met_kernels::QuantDots;
    use met_kernels::quant::QuantFormat;
    let shapes = [
        (4096, 1024, QuantFormat::Q4_K),
        (1024, 2048, QuantFormat::Q4_K),
        (6144, 1024, QuantFormat::Q4_K),
        (1024, 3072, QuantFormat::Q6_K),
    ];
    let layers: Vec<Vec<_>> =
        (0..28).map(|l| shapes.iter().map(|&(n, k, f)| packed_weights(f, n, k, 100 + l)).collect()).collect();
    let mut group = c.benchmark_group("decode_kquant");
    // One sequence, and a few decoding together (or a draft's tokens being verified).
    for m in [1, 2, 4] {
        let xs: Vec<Vec<f32>> = shapes.iter().map(|&(_, k, _)| values(m * k, 4)).collect();
        group.throughput(flops(28 * m * shapes.iter().map(|&(n, k, _)| 2 * k * n).sum::<usize>()));
        group.bench_function(format!("int8/m{m}"), |bench| {
            bench.iter(|| {
                for layer in &layers {
                    for (w, x) in layer.iter().zip(&xs) {
                        black_box(met_kernels::cpu::matmul_packed(black_box(x), w, None, m, QuantDots::Int8));
                    }
                }
            });
        });
    }
    group.finish();
}

/// The seven Q4_1 matmuls of one SmolLM2-135M layer (q, k, v, o, gate, up, down) for 1
/// and 5 activation rows, with exact and integer dots: what a few-row decode step costs
/// over a one-row step when every weight block is read once for all rows.
fn layer_q4_1(c: &mut Criterion) {
    use met_kernels::QuantDots;
    use met_kernels::quant::QuantFormat;
    let kv = 192;
    let shapes = [
        (HIDDEN, HIDDEN),
        (kv, HIDDEN),
        (kv, HIDDEN),
        (HIDDEN, HIDDEN),
        (INTERMEDIATE, HIDDEN),
        (INTERMEDIATE, HIDDEN),
        (HIDDEN, INTERMEDIATE),
    ];
    let weights: Vec<_> =
        shapes.iter().enumerate().map(|(i, &(n, k))| packed_weights(QuantFormat::Q4_1, n, k, 10 + i as u64)).collect();
    let mut group = c.benchmark_group("layer_q4_1");
    for dots in [QuantDots::Exact, QuantDots::Int8] {
        for m in [1, 5, 256] {
            let xs: Vec<Vec<f32>> = shapes.iter().map(|&(_, k)| values(m * k, 4)).collect();
            group.throughput(flops(shapes.iter().map(|&(n, k)| 2 * m * k * n).sum()));
            group.bench_function(format!("{dots}/m{m}"), |bench| {
                bench.iter(|| {
                    for (w, x) in weights.iter().zip(&xs) {
                        black_box(met_kernels::cpu::matmul_packed(black_box(x), w, None, m, dots));
                    }
                });
            });
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = matmul_f32, matmul_quant, matmul_kquant, decode_kquant, layer_q4_1, gemm_peak, paged_attention
}
criterion_main!(benches);
