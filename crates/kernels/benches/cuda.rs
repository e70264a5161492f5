//! CUDA backend benchmarks at Llama-3.1-8B's shapes (feature `cuda`, on a GPU machine).
//!
//! - `gemv`: the decode-batch products (1 to 16 rows: met's own kernels up to 4, cuBLAS
//!   beyond) of every Llama-3.1-8B projection and the fused gate/up + SiLU·mul, as weight
//!   bytes read per second, beside `copy`, a 1 GiB
//!   device-to-device copy (bytes read + written): the bandwidth a weight stream can reach.
//!   Four copies of each matrix take turns, so no run reads a matrix the L2 still holds.
//! - `matmul`: `CudaBackend::matmul` (cuBLAS, bf16 in and out, f32 accumulation) on
//!   `x [m, 4096] · W[14336, 4096]ᵀ`, the MLP gate/up projection, for a decode batch of 64
//!   rows and a 2,048-token prefill chunk.
//! - `rms_norm`: `[t, 4096]` bf16 rows for the same two batches.
//! - `attention`: decode steps of 1 and 64 sequences over 4,096-token contexts, of 256
//!   over 136 and 384, and a 4,096-token causal prefill, 32 query heads on 8 KV heads of 128 dims in blocks of 16,
//!   each sequence's blocks interleaved with the others' in the pool; the `flash` op, and
//!   the reference op beside the decode of 64; the prefill also on the `mma.sync` tiles
//!   that GPUs before Hopper run (`flash_mma`).
//! - `attention_fp8`: `attention`'s steps over e4m3 pools (`--kv-cache-dtype fp8`), through
//!   the e4m3 forms of the same kernels (K/V bytes one a value).
//! - `attention_d256`: head dim 256's prefill (Qwen3.5/3.6, Gemma), 16 query heads on 2: a
//!   4,096-token causal prefill and 64 sequences of 32 queries over 16,384 cached keys.
//! - `delta_rule`: the Gated DeltaNet delta rule at Qwen3.6-35B-A3B's shape (16 key heads,
//!   32 value heads, 128 by 128): prefill steps of one 8,192-row prompt, of 256 prompts of
//!   128 rows, of 64 prompts of 128, 64, 32 and 16 rows (the chunked form from 64 rows, the
//!   fused one below), and a decode step of 256 sequences (fused), as rows per second.
//! - `delta_rule_forms`: the same rule with every sequence fused and with every one chunked,
//!   from bursts of 64 short tails to one 8,192-row prompt: where the default crossover
//!   belongs.
//! - `gguf`: Llama-3.1-8B's projections kept in Q4_K and Q6_K blocks (random blocks) at decode
//!   batches of 1 and 4, over int8 activations (`--quant-dots int8`, the default: the x
//!   quantisation included) and exact f32 dots, and the int8 SwiGLU; throughput in packed
//!   bytes, beside `cuda_gemv/copy_1GiB`.
//! - `sample`: 64 rows of 128,256 f32 logits, greedy and with temperature, top-k and top-p,
//!   tokens back on the host; greedy also from bf16 logits, as the model's head writes them.
//!
//! Every measurement is `iter_custom`: the device is synchronised before the clock starts
//! and again before it stops, so the time is the device's, not the launch queue's.
//! Throughput: `Elements(FLOPs)` for matmul (criterion's "elements/s" reads as FLOP/s),
//! `Bytes` of memory read and written for RMSNorm and of K/V read for decode attention
//! (both are bandwidth-bound), `Elements(FLOPs)` for prefill attention, `Elements(rows)` for sampling. Without a usable GPU every
//! group is skipped with a printed note. Build anywhere with
//! `cargo bench -p met-kernels --features cuda --no-run`; run on the GPU machine with
//! `cargo bench -p met-kernels --features cuda --bench cuda`.

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime};
use met_config::SamplingParams;
use met_kernels::{
    AttentionMeta, AttentionParams, CudaBackend, DType, DeltaRule, GpuBackend, HostTensor, KvScales, RecurrentBatch,
    SampleRow, Tensor, UniformRun,
};

/// Llama-3.1-8B's hidden size, MLP intermediate size, attention and vocabulary.
const HIDDEN: usize = 4096;
const INTERMEDIATE: usize = 14336;
const HEADS: usize = 32;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const VOCAB: usize = 128_256;
/// Tokens per KV block.
const BLOCK: usize = 16;
/// Decode rows and prefill chunk tokens.
const DECODE_BATCH: usize = 64;
const PREFILL: usize = 2048;

/// The GPU, opened once, or `None` (with a note) where there is none.
fn backend() -> Option<&'static CudaBackend> {
    static BACKEND: OnceLock<Option<CudaBackend>> = OnceLock::new();
    BACKEND
        .get_or_init(|| match CudaBackend::new() {
            Ok(b) => {
                eprintln!("cuda benches on {}", b.describe());
                Some(b)
            }
            Err(e) => {
                eprintln!("note: skipped the CUDA benches: {e}");
                None
            }
        })
        .as_ref()
}

/// A second backend on the same GPU whose `flash` op runs prefill steps on the `mma.sync`
/// tiles (`CudaBackend::with_mma_sync_prefill`).
fn mma_backend() -> Option<&'static CudaBackend> {
    static BACKEND: OnceLock<Option<CudaBackend>> = OnceLock::new();
    BACKEND.get_or_init(|| CudaBackend::new().ok().map(CudaBackend::with_mma_sync_prefill)).as_ref()
}

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

/// `data` on the device in the backend's float dtype (bf16).
fn upload(b: &CudaBackend, data: &[f32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_f32(data, dims), b.float_dtype()).expect("upload")
}

fn upload_u32(b: &CudaBackend, data: &[u32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_u32(data, dims), DType::U32).expect("upload")
}

/// Times `iters` calls of `op` between two device synchronisations.
fn bench_synced<T>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, b: &CudaBackend, op: impl Fn() -> T) {
    group.bench_function(name, |bench| {
        bench.iter_custom(|iters| {
            b.synchronize().expect("synchronize");
            let start = Instant::now();
            for _ in 0..iters {
                black_box(op());
            }
            b.synchronize().expect("synchronize");
            start.elapsed()
        });
    });
}

/// Random bf16 weights made on the device.
fn random(b: &CudaBackend, dims: &[usize], key: u64) -> Tensor {
    let len = dims.iter().product();
    b.random_uniform(dims, &[UniformRun { len, key, bound: 0.02 }]).expect("random_uniform")
}

/// A Llama-3.1-8B layer's projections as `(name, rows, columns)`: the fused q/k/v, o, the
/// fused gate/up and down.
const LAYER_PROJECTIONS: [(&str, usize, usize); 4] = [
    ("qkv", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
    ("o", HIDDEN, HEADS * HEAD_DIM),
    ("gate_up", 2 * INTERMEDIATE, HIDDEN),
    ("down", HIDDEN, INTERMEDIATE),
];

/// Copies of each weight that take turns (more bytes than the 50 MB L2 per matrix set).
const WEIGHT_COPIES: usize = 4;

/// The next of `weights` at each call, round and round, so no run reads a matrix the L2
/// still holds.
fn taking_turns<'a>(weights: &'a [Tensor]) -> impl Fn() -> &'a Tensor {
    let turn = std::cell::Cell::new(0);
    move || {
        turn.set((turn.get() + 1) % weights.len());
        &weights[turn.get()]
    }
}

/// Every projection of a Llama-3.1-8B layer and the head, at decode batches.
fn gemv(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let mut group = c.benchmark_group("cuda_gemv");
    group.measurement_time(Duration::from_millis(1500));
    let gib = 1usize << 30;
    let (src, dst) = (random(b, &[gib / 2], 1), random(b, &[gib / 2], 2));
    group.throughput(Throughput::Bytes((2 * gib) as u64));
    bench_synced(&mut group, "copy_1GiB", b, || b.copy_into(&src, &dst).expect("copy"));
    drop((src, dst));
    let shapes = [
        ("qkv", (HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN),
        ("o", HIDDEN, HEADS * HEAD_DIM),
        ("gate_up", 2 * INTERMEDIATE, HIDDEN),
        ("down", HIDDEN, INTERMEDIATE),
        ("lm_head", VOCAB, HIDDEN),
    ];
    for (name, n, k) in shapes {
        let weights: Vec<Tensor> = (0..WEIGHT_COPIES).map(|i| random(b, &[n, k], 10 + i as u64)).collect();
        group.throughput(Throughput::Bytes((n * k * 2) as u64));
        for m in [1, 4, 8, 16] {
            let x = random(b, &[m, k], 3);
            let next = taking_turns(&weights);
            bench_products(&mut group, b, &x, "", (name, &format!("m{m}_n{n}_k{k}")), &next);
        }
    }
    group.finish();
}

/// `x` times the next weight, named `{prefix}{name}/{shape}`, and for the gate/up matrix the
/// fused SwiGLU too (`{prefix}gate_up_silu/{shape}`).
fn bench_products<'a>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    b: &CudaBackend,
    x: &Tensor,
    prefix: &str,
    (name, shape): (&str, &str),
    next: &impl Fn() -> &'a Tensor,
) {
    bench_synced(group, &format!("{prefix}{name}/{shape}"), b, || b.matmul(x, next(), None).expect("matmul"));
    if name == "gate_up" {
        bench_synced(group, &format!("{prefix}gate_up_silu/{shape}"), b, || {
            b.matmul_silu_mul(x, next()).expect("matmul_silu_mul")
        });
    }
}

/// An e4m3 matrix (random bytes without NaN codes) under one scale a 128 x 128 block
/// (`block`) or a row, as an FP8 checkpoint's weight reaches the backend.
fn fp8_weight(b: &CudaBackend, n: usize, k: usize, block: bool, seed: u64) -> Tensor {
    use met_kernels::quant::QuantFormat;
    let mut state = seed;
    let mut next = move || {
        state = met_kernels::rng::mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
        state
    };
    let mut bytes = Vec::with_capacity(n * k / 32 * 36);
    for i in 0..n {
        for g in 0..k / 32 {
            let key = if block { (i / 128) * k + g * 32 / 128 } else { i };
            let scale = 2e-5 + (met_kernels::rng::mix64(key as u64 ^ seed) >> 44) as f32 * 1e-11;
            bytes.extend(scale.to_le_bytes());
            for _ in 0..4 {
                let r = next().to_le_bytes();
                bytes.extend(r.iter().map(|&q| if q & 0x7f == 0x7f { q ^ 1 } else { q }));
            }
        }
    }
    let host = HostTensor::from_bytes(DType::Quant(QuantFormat::F8_E4M3), &[n, k], std::borrow::Cow::Owned(bytes))
        .expect("blocks");
    let w = b.upload(&host, DType::BF16).expect("upload");
    assert_eq!(w.dtype(), DType::Quant(QuantFormat::F8_E4M3), "the bench matrix was widened");
    w
}

/// Llama-3.1-8B's projections with e4m3 weights (128 x 128 block scales): decode batches
/// (throughput: weight bytes) and prefill-sized batches (FLOPs) beside bf16 weights.
fn fp8(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let mut group = c.benchmark_group("cuda_fp8");
    group.measurement_time(Duration::from_millis(1500));
    for (name, n, k) in LAYER_PROJECTIONS {
        let weights: Vec<Tensor> = (0..WEIGHT_COPIES).map(|i| fp8_weight(b, n, k, true, 20 + i as u64)).collect();
        let next = taking_turns(&weights);
        group.throughput(Throughput::Bytes((n * k) as u64));
        for m in [1, 4, 8, 16] {
            let x = random(b, &[m, k], 3);
            bench_products(&mut group, b, &x, "", (name, &format!("m{m}_n{n}_k{k}")), &next);
        }
        if name == "gate_up" || name == "down" {
            let row = fp8_weight(b, n, k, false, 30);
            let bf16 = random(b, &[n, k], 31);
            for m in [64, 252, 256, 2048] {
                let x = random(b, &[m, k], 4);
                group.throughput(Throughput::Elements((2 * m * k * n) as u64));
                bench_synced(&mut group, &format!("{name}_gemm_block/m{m}_n{n}_k{k}"), b, || {
                    b.matmul(&x, next(), None).expect("matmul")
                });
                bench_synced(&mut group, &format!("{name}_gemm_row/m{m}_n{n}_k{k}"), b, || {
                    b.matmul(&x, &row, None).expect("matmul")
                });
                bench_synced(&mut group, &format!("{name}_gemm_bf16/m{m}_n{n}_k{k}"), b, || {
                    b.matmul(&x, &bf16, None).expect("matmul")
                });
            }
        }
    }
    group.finish();
}

/// A `[n, k]` matrix of random `format` blocks (K-quants: f16 scales kept small and finite)
/// as a GGUF file's weight reaches the backend, which keeps it in its blocks.
fn gguf_weight(b: &CudaBackend, format: met_kernels::quant::QuantFormat, n: usize, k: usize, seed: u64) -> Tensor {
    use met_kernels::quant::QuantFormat;
    let (block, d_at): (usize, &[usize]) = match format {
        QuantFormat::Q4_K => (144, &[0, 2]),
        QuantFormat::Q6_K => (210, &[208]),
        other => panic!("no bench blocks for {other}"),
    };
    let mut state = seed;
    let mut bytes = Vec::with_capacity(n * k / 256 * block);
    for _ in 0..n * k / 256 {
        let at = bytes.len();
        for _ in 0..block.div_ceil(8) {
            state = met_kernels::rng::mix64(state.wrapping_add(0x9E37_79B9_7F4A_7C15));
            bytes.extend(state.to_le_bytes());
        }
        bytes.truncate(at + block);
        for &d in d_at {
            bytes[at + d..at + d + 2].copy_from_slice(&half::f16::from_f32(1e-3).to_le_bytes());
        }
    }
    let host = HostTensor::from_bytes(DType::Quant(format), &[n, k], std::borrow::Cow::Owned(bytes)).expect("blocks");
    let w = b.upload(&host, DType::BF16).expect("upload");
    assert_eq!(w.dtype(), DType::Quant(format), "the bench matrix was widened");
    w
}

/// Llama-3.1-8B's projections in Q4_K and Q6_K blocks at decode batches, over int8 and exact
/// activations (two backends on the GPU), as packed bytes a second.
fn gguf(c: &mut Criterion) {
    use met_kernels::QuantDots;
    use met_kernels::quant::QuantFormat;
    let Some(exact) = backend() else { return };
    let Ok(int8) = CudaBackend::new().map(|b| b.with_quant_dots(QuantDots::Int8)) else { return };
    let mut group = c.benchmark_group("cuda_gguf");
    group.measurement_time(Duration::from_millis(1500));
    for format in [QuantFormat::Q4_K, QuantFormat::Q6_K] {
        let bytes_per_256 = if format == QuantFormat::Q4_K { 144 } else { 210 };
        for (name, n, k) in LAYER_PROJECTIONS {
            for (dots, b) in [("int8", &int8), ("exact", exact)] {
                let weights: Vec<Tensor> =
                    (0..WEIGHT_COPIES).map(|i| gguf_weight(b, format, n, k, 40 + i as u64)).collect();
                let next = taking_turns(&weights);
                group.throughput(Throughput::Bytes((n * k / 256 * bytes_per_256) as u64));
                for m in [1, 4] {
                    let x = random(b, &[m, k], 3);
                    let shape = format!("m{m}_n{n}_k{k}");
                    bench_products(&mut group, b, &x, &format!("{format}/{dots}/"), (name, &shape), &next);
                }
            }
        }
    }
    group.finish();
}

/// Qwen3-30B-A3B's routed experts (128 of them, top 8, hidden 2,048, 768 wide) in e4m3 (128 x
/// 128 blocks) and in bf16, at decode batches of 1, 16 and 64 tokens and a 256-token one:
/// the whole `moe_experts` op (grouping, both grouped GEMMs, SwiGLU, combine); throughput in
/// tokens, so the two formats compare by time.
fn fp8_moe(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let mut group = c.benchmark_group("cuda_fp8_moe");
    group.measurement_time(Duration::from_millis(1500));
    let (e, h, i, k) = (128, 2048, 768, 8);
    let e4m3 = (
        fp8_weight(b, e * 2 * i, h, true, 40).reshape(&[e, 2 * i, h]).expect("reshape"),
        fp8_weight(b, e * h, i, true, 41).reshape(&[e, h, i]).expect("reshape"),
    );
    let bf16 = (
        random(b, &[e * 2 * i, h], 42).reshape(&[e, 2 * i, h]).expect("reshape"),
        random(b, &[e * h, i], 43).reshape(&[e, h, i]).expect("reshape"),
    );
    for t in [1, 16, 64, 256] {
        let x = random(b, &[t, h], 44);
        let logits = upload(b, &values(t * e, 45), &[t, e]);
        let routing = b.topk_routing(&logits, k, true).expect("routing");
        group.throughput(Throughput::Elements(t as u64));
        for (name, (gate_up, down)) in [("e4m3", &e4m3), ("bf16", &bf16)] {
            bench_synced(&mut group, &format!("{name}/t{t}_e{e}_h{h}_i{i}_k{k}"), b, || {
                b.moe_experts(&x, &routing, gate_up, down).expect("moe_experts")
            });
        }
    }
    group.finish();
}

/// The MLP projection for a decode batch and a prefill chunk.
fn matmul(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let (k, n) = (HIDDEN, INTERMEDIATE);
    let w = upload(b, &values(n * k, 1), &[n, k]);
    let mut group = c.benchmark_group("cuda_matmul");
    for m in [DECODE_BATCH, PREFILL] {
        let x = upload(b, &values(m * k, 2), &[m, k]);
        group.throughput(Throughput::Elements((2 * m * k * n) as u64));
        bench_synced(&mut group, &format!("bf16/m{m}_k{k}_n{n}"), b, || b.matmul(&x, &w, None).expect("matmul"));
    }
    group.finish();
}

/// RMSNorm over the hidden state of a decode batch and a prefill chunk.
fn rms_norm(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let weight = upload(b, &values(HIDDEN, 3), &[HIDDEN]);
    let mut group = c.benchmark_group("cuda_rms_norm");
    for t in [DECODE_BATCH, PREFILL] {
        let x = upload(b, &values(t * HIDDEN, 4), &[t, HIDDEN]);
        // Read once, written once, in bf16.
        group.throughput(Throughput::Bytes((2 * t * HIDDEN * 2) as u64));
        bench_synced(&mut group, &format!("bf16/t{t}_h{HIDDEN}"), b, || {
            b.rms_norm(&x, &weight, 1e-5).expect("rms_norm")
        });
    }
    group.finish();
}

/// Attention params of Llama-3.1-8B.
fn attention_params() -> AttentionParams {
    AttentionParams {
        num_heads: HEADS,
        num_kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        scale: (HEAD_DIM as f32).powf(-0.5),
        sliding_window: None,
        softcap: None,
        kv_scales: KvScales::UNIT,
    }
}

/// Pools and metadata for `seqs` sequences of `context` tokens of which the last `q_len`
/// are this step's queries, each sequence's blocks interleaved with the others' in the pool.
fn attention_step(b: &CudaBackend, seqs: usize, context: usize, q_len: usize) -> (Tensor, Tensor, AttentionMeta) {
    attention_step_of(b, (KV_HEADS, HEAD_DIM), seqs, context, q_len)
}

/// [`attention_step`] with `kv_heads` KV heads of `head_dim`.
fn attention_step_of(
    b: &CudaBackend,
    (kv_heads, head_dim): (usize, usize),
    seqs: usize,
    context: usize,
    q_len: usize,
) -> (Tensor, Tensor, AttentionMeta) {
    let per_seq = context.div_ceil(BLOCK);
    let pool = [seqs * per_seq, BLOCK, kv_heads, head_dim];
    let k_cache = upload(b, &values(pool.iter().product(), 7), &pool);
    let v_cache = upload(b, &values(pool.iter().product(), 8), &pool);
    let tables: Vec<u32> = (0..seqs).flat_map(|s| (0..per_seq).map(move |i| (i * seqs + s) as u32)).collect();
    let cu: Vec<u32> = (0..=seqs as u32).map(|s| s * q_len as u32).collect();
    let meta = AttentionMeta {
        cu_seqlens_q: upload_u32(b, &cu, &[seqs + 1]),
        seq_lens: upload_u32(b, &vec![context as u32; seqs], &[seqs]),
        block_tables: upload_u32(b, &tables, &[seqs, per_seq]),
        max_seqlen_q: q_len,
        max_seqlen_k: context,
    };
    (k_cache, v_cache, meta)
}

/// Decode steps of 1 and 64 sequences over 4,096-token contexts (K/V bytes read per
/// second), and a 4,096-token causal prefill of one sequence (FLOP/s), through the `flash`
/// backend's op; the reference op beside the decode of 64, for scale.
fn attention(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let params = attention_params();
    let context = 4096;
    let mut group = c.benchmark_group("cuda_attention");
    // Long contexts at batches 1 and 64; a throughput run's batch of 256 short ones (128
    // prompt tokens, 8 and 256 generated).
    for (seqs, context) in [(1, context), (DECODE_BATCH, context), (256, 136), (256, 384)] {
        let (kc, vc, meta) = attention_step(b, seqs, context, 1);
        let q = upload(b, &values(seqs * HEADS * HEAD_DIM, 5), &[seqs, HEADS, HEAD_DIM]);
        // Every sequence reads its whole context of K and V once, in bf16.
        group.throughput(Throughput::Bytes((2 * seqs * context * KV_HEADS * HEAD_DIM * 2) as u64));
        let name = format!("decode_{seqs}x{context}_h{HEADS}_kv{KV_HEADS}_d{HEAD_DIM}_b{BLOCK}");
        bench_synced(&mut group, &format!("flash/{name}"), b, || {
            b.flash_attention(&q, &kc, &vc, &meta, &params).expect("flash_attention")
        });
        if seqs == DECODE_BATCH && context == 4096 {
            bench_synced(&mut group, &format!("paged/{name}"), b, || {
                b.paged_attention(&q, &kc, &vc, &meta, &params).expect("paged_attention")
            });
        }
    }
    // Q·Kᵀ and P·V over the visible (causal) pairs: 2 · 2 · d FLOPs per pair and head.
    let pairs = context * (context + 1) / 2;
    group.throughput(Throughput::Elements((4 * pairs * HEAD_DIM * HEADS) as u64));
    for (label, b) in [("flash", Some(b)), ("flash_mma", mma_backend())] {
        let Some(b) = b else { continue };
        let (kc, vc, meta) = attention_step(b, 1, context, context);
        let q = upload(b, &values(context * HEADS * HEAD_DIM, 6), &[context, HEADS, HEAD_DIM]);
        let name = format!("{label}/prefill_{context}_h{HEADS}_kv{KV_HEADS}_d{HEAD_DIM}_causal");
        bench_synced(&mut group, &name, b, || {
            b.flash_attention(&q, &kc, &vc, &meta, &params).expect("flash_attention")
        });
    }
    group.finish();
}

/// [`attention`]'s steps over e4m3 pools (`--kv-cache-dtype fp8`): the decode kernels' e4m3
/// forms (K/V bytes read per second, one a value) and the prefill tiles' (FLOP/s).
/// Zero pools: the kernels' work does not depend on the values.
fn attention_fp8(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    if !b.supports_kv_dtype(DType::F8E4M3) {
        eprintln!("note: no e4m3 KV pools on this GPU");
        return;
    }
    let params = attention_params();
    let context = 4096;
    let mut group = c.benchmark_group("cuda_attention_fp8");
    let pools = |seqs: usize, context: usize, q_len: usize| {
        let (kc, _, meta) = attention_step(b, seqs, context, q_len);
        let zeros = || b.zeros(kc.dims(), DType::F8E4M3).expect("e4m3 pool");
        (zeros(), zeros(), meta)
    };
    for (seqs, context) in [(1, context), (DECODE_BATCH, context), (256, 136), (256, 384)] {
        let (kc, vc, meta) = pools(seqs, context, 1);
        let q = upload(b, &values(seqs * HEADS * HEAD_DIM, 5), &[seqs, HEADS, HEAD_DIM]);
        group.throughput(Throughput::Bytes((2 * seqs * context * KV_HEADS * HEAD_DIM) as u64));
        let name = format!("decode_{seqs}x{context}_h{HEADS}_kv{KV_HEADS}_d{HEAD_DIM}_b{BLOCK}");
        bench_synced(&mut group, &format!("flash/{name}"), b, || {
            b.flash_attention(&q, &kc, &vc, &meta, &params).expect("flash_attention")
        });
    }
    let pairs = context * (context + 1) / 2;
    group.throughput(Throughput::Elements((4 * pairs * HEAD_DIM * HEADS) as u64));
    let (kc, vc, meta) = pools(1, context, context);
    let q = upload(b, &values(context * HEADS * HEAD_DIM, 6), &[context, HEADS, HEAD_DIM]);
    bench_synced(&mut group, &format!("flash/prefill_{context}_h{HEADS}_kv{KV_HEADS}_d{HEAD_DIM}_causal"), b, || {
        b.flash_attention(&q, &kc, &vc, &meta, &params).expect("flash_attention")
    });
    group.finish();
}

/// One token for each of 64 rows of a 128k vocabulary.
fn sample(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let rows = DECODE_BATCH;
    let host = HostTensor::from_f32(&values(rows * VOCAB, 6), &[rows, VOCAB]);
    let logits = b.upload(&host, DType::F32).expect("upload");
    let logits_bf16 = b.upload(&host, DType::BF16).expect("upload");
    let greedy = SamplingParams::greedy();
    let nucleus = SamplingParams { temperature: 0.8, top_k: 50, top_p: 0.95, ..SamplingParams::default() };
    let mut group = c.benchmark_group("cuda_sample");
    group.throughput(Throughput::Elements(rows as u64));
    for (name, params) in [("greedy", &greedy), ("top_k50_top_p0.95", &nucleus)] {
        let batch: Vec<SampleRow<'_>> = (0..rows)
            .map(|row| SampleRow {
                logits_row: row,
                params,
                prompt: &[],
                output: &[],
                seed: row as u64,
                step: 0,
                banned: &[],
                draft: None,
            })
            .collect();
        bench_synced(&mut group, &format!("{name}/rows{rows}_vocab{VOCAB}"), b, || {
            b.sample(&logits, &batch).expect("sample")
        });
        if name == "greedy" {
            bench_synced(&mut group, &format!("{name}_bf16/rows{rows}_vocab{VOCAB}"), b, || {
                b.sample(&logits_bf16, &batch).expect("sample")
            });
        }
    }
    group.finish();
}

/// Qwen3.6-35B-A3B's delta-rule heads: key heads, value heads, key and value dims.
const GDN: (usize, usize, usize, usize) = (16, 32, 128, 128);

/// One step of the delta rule on `b`: `seqs` sequences of `rows` rows, each in its own state
/// slot (states from zero, rewritten by every run: the time does not depend on their
/// values), at [`GDN`]'s heads.
struct DeltaStep {
    qkv: Tensor,
    ga: Tensor,
    gb: Tensor,
    state: Tensor,
    cu: Tensor,
    slots: Tensor,
    a_log: Tensor,
    dt_bias: Tensor,
}

impl DeltaStep {
    fn new(b: &CudaBackend, seqs: usize, rows: usize) -> Self {
        let (hk, hv, dk, dv) = GDN;
        let t = seqs * rows;
        let f32s = |v: f32| b.upload(&HostTensor::from_f32(&vec![v; hv], &[hv]), DType::F32).expect("upload");
        let cu: Vec<u32> = (0..=seqs as u32).map(|s| s * rows as u32).collect();
        let slots: Vec<u32> = (0..seqs as u32).collect();
        Self {
            qkv: random(b, &[t, 2 * hk * dk + hv * dv], 11),
            ga: random(b, &[t, hv], 12),
            gb: random(b, &[t, hv], 13),
            state: b.zeros(&[seqs, hv, dk, dv], DType::F32).expect("state pool"),
            cu: upload_u32(b, &cu, &[seqs + 1]),
            slots: upload_u32(b, &slots, &[seqs]),
            a_log: f32s(-0.5),
            dt_bias: f32s(0.5),
        }
    }

    fn run(&self, b: &CudaBackend) -> Tensor {
        let (hk, hv, dk, dv) = GDN;
        let rule = DeltaRule {
            num_key_heads: hk,
            num_value_heads: hv,
            key_dim: dk,
            value_dim: dv,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
        };
        let batch = RecurrentBatch { cu_seqlens: &self.cu, slots: &self.slots, snapshots: &[] };
        b.gated_delta_rule(&self.qkv, &self.ga, &self.gb, &rule, &self.state, &batch).expect("gated_delta_rule")
    }
}

/// Steps of the delta rule through `gated_delta_rule` ([`DeltaStep`]).
fn delta_rule(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let (hk, hv, dk, _) = GDN;
    let mut group = c.benchmark_group("cuda_delta_rule");
    for (seqs, rows) in [(1, 8192), (256, 128), (64, 128), (64, 64), (64, 32), (64, 16), (256, 1)] {
        let step = DeltaStep::new(b, seqs, rows);
        group.throughput(Throughput::Elements((seqs * rows) as u64));
        bench_synced(&mut group, &format!("{seqs}x{rows}_hk{hk}_hv{hv}_d{dk}"), b, || step.run(b));
    }
    group.finish();
}

/// Backends on the same GPU with every sequence on the delta rule's fused kernel, and with
/// every one on the chunked form (`CudaBackend::with_chunked_delta_from`).
fn delta_form_backends() -> Option<&'static [CudaBackend; 2]> {
    static BACKENDS: OnceLock<Option<[CudaBackend; 2]>> = OnceLock::new();
    BACKENDS
        .get_or_init(|| {
            let fused = CudaBackend::new().ok()?.with_chunked_delta_from(usize::MAX);
            Some([fused, CudaBackend::new().ok()?.with_chunked_delta_from(1)])
        })
        .as_ref()
}

/// The delta rule's two forms on the same steps, to place the default crossover
/// (`CHUNKED_FROM`): 64 sequences (a burst of prefix-hit tails) of 32 to 256 rows, 16 of
/// 128 and 512, 4 of 512 and 2,048, one of 32 to 8,192 (a lone prompt, where the fused
/// kernel's rows are its latency).
fn delta_rule_forms(c: &mut Criterion) {
    let Some(backends) = delta_form_backends() else { return };
    let mut group = c.benchmark_group("cuda_delta_rule_forms");
    for (form, b) in ["fused", "chunked"].into_iter().zip(backends) {
        let shapes = [
            (64, 32),
            (64, 64),
            (64, 128),
            (64, 256),
            (16, 128),
            (16, 512),
            (4, 512),
            (4, 2048),
            (1, 32),
            (1, 64),
            (1, 128),
            (1, 256),
            (1, 512),
            (1, 2048),
            (1, 8192),
        ];
        for (seqs, rows) in shapes {
            let step = DeltaStep::new(b, seqs, rows);
            group.throughput(Throughput::Elements((seqs * rows) as u64));
            bench_synced(&mut group, &format!("{form}/{seqs}x{rows}"), b, || step.run(b));
        }
    }
    group.finish();
}

/// Head dim 256's prefill at Qwen3.6-35B-A3B's attention (16 query heads on 2 KV heads): a
/// 4,096-token causal prefill, and 64 sequences of 32 queries over 16,384 cached keys each
/// (a burst of prefix hits), FLOP/s over the visible pairs.
fn attention_d256(c: &mut Criterion) {
    let Some(b) = backend() else { return };
    let (heads, kv_heads, d) = (16, 2, 256);
    let params = AttentionParams {
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: d,
        scale: (d as f32).powf(-0.5),
        ..attention_params()
    };
    let mut group = c.benchmark_group("cuda_attention_d256");
    for (seqs, context, q_len) in [(1, 4096, 4096), (64, 16_384, 32)] {
        let (kc, vc, meta) = attention_step_of(b, (kv_heads, d), seqs, context, q_len);
        let q = upload(b, &values(seqs * q_len * heads * d, 6), &[seqs * q_len, heads, d]);
        // Query i of a sequence sees the keys up to its position, context - q_len + i.
        let pairs: usize = (0..q_len).map(|i| context - q_len + i + 1).sum::<usize>() * seqs;
        group.throughput(Throughput::Elements((4 * pairs * d * heads) as u64));
        let name = format!("prefill_{seqs}x{q_len}_over_{context}_h{heads}_kv{kv_heads}_d{d}");
        bench_synced(&mut group, &name, b, || {
            b.flash_attention(&q, &kc, &vc, &meta, &params).expect("flash_attention")
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = gemv, fp8, fp8_moe, gguf, matmul, rms_norm, attention, attention_fp8, attention_d256, delta_rule, delta_rule_forms, sample
}
criterion_main!(benches);
