//! Conformance checks of the KV write and paged attention: a varlen batch mixing a prefill
//! sequence, a chunked prefill over tokens cached by an earlier step, and decode rows, with
//! GQA and MHA, small shuffled blocks, a sliding window and a logit soft-cap, against a
//! direct softmax over each query's visible keys.

use met_kernels::fp8::{e4m3_from_f32, e4m3_to_f32};
use met_kernels::{AttentionMeta, AttentionParams, DType, GpuBackend, KvScales, Result, Tensor};

use crate::harness::{Rng, assert_close, expect_err, stored, upload_f32, upload_u32};

/// One sequence of a varlen batch: its context length after this step's KV write, and how
/// many of its last tokens are this step's queries.
#[derive(Debug, Clone, Copy)]
pub struct Seq {
    pub context: usize,
    pub q_len: usize,
}

/// A prefill (q_len = context), a chunked prefill (7 tokens cached earlier, 4 new), and
/// decode rows at a block boundary, past one, and at the very first token.
const MIXED: [Seq; 5] = [
    Seq { context: 7, q_len: 7 },
    Seq { context: 11, q_len: 4 },
    Seq { context: 9, q_len: 1 },
    Seq { context: 8, q_len: 1 },
    Seq { context: 1, q_len: 1 },
];

/// One attention layer over a paged pool.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub params: AttentionParams,
    pub block_size: usize,
}

impl Layout {
    /// `h` query heads over `h_kv` KV heads of `d` dims, scale `d^-0.5`, no window or cap.
    pub fn new(h: usize, h_kv: usize, d: usize, block_size: usize) -> Self {
        let params = AttentionParams {
            num_heads: h,
            num_kv_heads: h_kv,
            head_dim: d,
            scale: (d as f32).powf(-0.5),
            sliding_window: None,
            softcap: None,
            kv_scales: KvScales::UNIT,
        };
        Self { params, block_size }
    }

    /// Floats per token in each KV pool.
    fn kv_row(&self) -> usize {
        self.params.num_kv_heads * self.params.head_dim
    }
}

/// The logical contents of a batch: K and V of every context position of each sequence
/// (`[context, h_kv, d]`) and the queries of the flat batch (`[t, h, d]`).
pub struct Contents {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub q: Vec<f32>,
}

impl Contents {
    /// Uniform values as `b` stores them; queries are scaled by `q_gain` to make the
    /// softmax peakier.
    pub fn random(b: &dyn GpuBackend, rng: &mut Rng, layout: &Layout, seqs: &[Seq], q_gain: f32) -> Self {
        let row = layout.kv_row();
        let k = seqs.iter().map(|s| stored(b, rng.vec(s.context * row))).collect();
        let v = seqs.iter().map(|s| stored(b, rng.vec(s.context * row))).collect();
        let t: usize = seqs.iter().map(|s| s.q_len).sum();
        let p = &layout.params;
        let q = stored(b, rng.vec(t * p.num_heads * p.head_dim).iter().map(|x| x * q_gain).collect());
        Self { k, v, q }
    }
}

/// Disjoint physical blocks for each sequence, drawn from a shuffled pool of `pool`
/// blocks, so logical neighbours are physically scattered and out of order.
pub fn shuffled_tables(rng: &mut Rng, seqs: &[Seq], block_size: usize, pool: usize) -> Vec<Vec<u32>> {
    let mut free: Vec<u32> = (0..pool as u32).collect();
    rng.shuffle(&mut free);
    seqs.iter().map(|s| free.drain(..s.context.div_ceil(block_size)).collect()).collect()
}

/// Blocks a batch needs, plus spares so the pool holds unused blocks too.
pub fn pool_blocks(seqs: &[Seq], block_size: usize) -> usize {
    seqs.iter().map(|s| s.context.div_ceil(block_size)).sum::<usize>() + 3
}

/// Uploads the varlen metadata, padding block tables with block 0.
fn upload_meta(b: &dyn GpuBackend, seqs: &[Seq], tables: &[Vec<u32>]) -> Result<AttentionMeta> {
    let max_blocks = tables.iter().map(Vec::len).max().unwrap_or(0);
    let flat: Vec<u32> = tables.iter().flat_map(|t| (0..max_blocks).map(|i| t.get(i).copied().unwrap_or(0))).collect();
    let cu: Vec<u32> = std::iter::once(0)
        .chain(seqs.iter().scan(0, |acc, s| {
            *acc += s.q_len as u32;
            Some(*acc)
        }))
        .collect();
    let lens: Vec<u32> = seqs.iter().map(|s| s.context as u32).collect();
    Ok(AttentionMeta {
        cu_seqlens_q: upload_u32(b, &cu, &[cu.len()])?,
        seq_lens: upload_u32(b, &lens, &[lens.len()])?,
        block_tables: upload_u32(b, &flat, &[seqs.len(), max_blocks])?,
        max_seqlen_q: seqs.iter().map(|s| s.q_len).max().unwrap_or(0),
        max_seqlen_k: seqs.iter().map(|s| s.context).max().unwrap_or(0),
    })
}

/// Writes the K/V of `positions(seq)` of every sequence into the pools in one call.
fn write_positions(
    b: &dyn GpuBackend,
    (layout, seqs, c, tables): (&Layout, &[Seq], &Contents, &[Vec<u32>]),
    pools: (&Tensor, &Tensor),
    positions: impl Fn(&Seq) -> std::ops::Range<usize>,
) -> Result<()> {
    let (row, bs) = (layout.kv_row(), layout.block_size);
    let (mut k, mut v, mut slots) = (Vec::new(), Vec::new(), Vec::new());
    for (s, seq) in seqs.iter().enumerate() {
        for j in positions(seq) {
            k.extend_from_slice(&c.k[s][j * row..(j + 1) * row]);
            v.extend_from_slice(&c.v[s][j * row..(j + 1) * row]);
            slots.push(tables[s][j / bs] * bs as u32 + (j % bs) as u32);
        }
    }
    if slots.is_empty() {
        return Ok(());
    }
    let dims = [slots.len(), layout.params.num_kv_heads, layout.params.head_dim];
    let (k, v) = (upload_f32(b, &k, &dims)?, upload_f32(b, &v, &dims)?);
    b.write_kv(&k, &v, pools.0, pools.1, &upload_u32(b, &slots, &[slots.len()])?, layout.params.kv_scales)
}

/// The two attention ops: the reference kernel and the `flash` backend's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Paged,
    Flash,
}

impl Op {
    pub const ALL: [Op; 2] = [Op::Paged, Op::Flash];

    fn name(self) -> &'static str {
        match self {
            Op::Paged => "paged_attention",
            Op::Flash => "flash_attention",
        }
    }
}

/// [`run_step`] through the reference op.
pub fn run_paged(
    b: &dyn GpuBackend,
    layout: &Layout,
    seqs: &[Seq],
    c: &Contents,
    tables: &[Vec<u32>],
) -> Result<Tensor> {
    run_step(b, layout, seqs, c, tables, Op::Paged)
}

/// Runs one step the way the engine does: an earlier step already cached every token
/// before this step's queries; this step writes its own K/V, then attends through `op`.
pub fn run_step(
    b: &dyn GpuBackend,
    layout: &Layout,
    seqs: &[Seq],
    c: &Contents,
    tables: &[Vec<u32>],
    op: Op,
) -> Result<Tensor> {
    run_step_in(b, (layout, seqs, c, tables), op, b.float_dtype())
}

/// [`run_step`] with KV pools of `pools`.
fn run_step_in(
    b: &dyn GpuBackend,
    (layout, seqs, c, tables): (&Layout, &[Seq], &Contents, &[Vec<u32>]),
    op: Op,
    pools: DType,
) -> Result<Tensor> {
    let (p, bs) = (&layout.params, layout.block_size);
    let pool_dims = [pool_blocks(seqs, bs), bs, p.num_kv_heads, p.head_dim];
    let (kc, vc) = (b.zeros(&pool_dims, pools)?, b.zeros(&pool_dims, pools)?);
    let batch = (layout, seqs, c, tables);
    write_positions(b, batch, (&kc, &vc), |s| 0..s.context - s.q_len)?;
    write_positions(b, batch, (&kc, &vc), |s| s.context - s.q_len..s.context)?;
    let t: usize = seqs.iter().map(|s| s.q_len).sum();
    let q = upload_f32(b, &c.q, &[t, p.num_heads, p.head_dim])?;
    let meta = upload_meta(b, seqs, tables)?;
    match op {
        Op::Paged => b.paged_attention(&q, &kc, &vc, &meta, p),
        Op::Flash => b.flash_attention(&q, &kc, &vc, &meta, p),
    }
}

/// Direct attention in f64: query `i` of a sequence sits at `p = context - q_len + i` and
/// attends keys `max(0, p - W + 1) ..= p` through `softmax(cap · tanh(scale · q·k / cap))`;
/// query head `hq` reads KV head `hq / (h / h_kv)`.
pub fn attention_reference(p: &AttentionParams, seqs: &[Seq], c: &Contents) -> Vec<f64> {
    let (h, h_kv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let mut out = Vec::with_capacity(c.q.len());
    let mut q_rows = c.q.chunks(h * d);
    for (s, seq) in seqs.iter().enumerate() {
        for i in 0..seq.q_len {
            let pos = seq.context - seq.q_len + i;
            let first = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let q_row = q_rows.next().expect("one query row per token");
            for hq in 0..h {
                let at = |j: usize| (j * h_kv + hq / (h / h_kv)) * d;
                let q = &q_row[hq * d..(hq + 1) * d];
                let scores: Vec<f64> = (first..=pos)
                    .map(|j| {
                        let dot: f64 =
                            q.iter().zip(&c.k[s][at(j)..at(j) + d]).map(|(&a, &k)| f64::from(a) * f64::from(k)).sum();
                        let score = f64::from(p.scale) * dot;
                        p.softcap.map_or(score, |cap| f64::from(cap) * (score / f64::from(cap)).tanh())
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                out.extend((0..d).map(|e| {
                    (first..=pos).zip(&weights).map(|(j, w)| w * f64::from(c.v[s][at(j) + e])).sum::<f64>() / total
                }));
            }
        }
    }
    out
}

/// Runs `seqs` under `layout` on shuffled tables through both ops and compares each with
/// the f64 reference.
fn check_case(
    b: &dyn GpuBackend,
    layout: &Layout,
    seqs: &[Seq],
    q_gain: f32,
    seed: u64,
    what: &str,
) -> Result<Vec<f64>> {
    let mut rng = Rng::new(seed);
    let contents = Contents::random(b, &mut rng, layout, seqs, q_gain);
    let tables = shuffled_tables(&mut rng, seqs, layout.block_size, pool_blocks(seqs, layout.block_size));
    let p = &layout.params;
    let want = attention_reference(p, seqs, &contents);
    let t: usize = seqs.iter().map(|s| s.q_len).sum();
    for op in Op::ALL {
        let out = run_step(b, layout, seqs, &contents, &tables, op)?;
        assert_close(b, &out, &[t, p.num_heads, p.head_dim], &want, &format!("{what} ({})", op.name()))?;
    }
    Ok(want)
}

/// An FP8 cache, where the backend has one: keys and values are stored divided by their layer's
/// scales as e4m3 bytes and attended as their dequantized values (`e4m3(x / s) · s`), through
/// both ops, over prompts of many blocks and tiles, a chunk after a cached prefix and decode
/// rows, at head dims 64, 128 (CUDA's e4m3 tiles) and 256 (its e4m3 reference), and decode
/// steps of 4 and 40 sequences (both shapes of its tensor-core decode). An f32 backend attends
/// exactly as over f32 pools holding those values (bit for bit); a bf16 one reads the bytes
/// exactly and folds the scales into the scores and outputs, so it is held to its float dtype's
/// tolerance against the f64 reference over the dequantized values. Against the unquantized
/// reference the error is e4m3's rounding: a value's alone can reach 2^-4 of the largest |v| (1
/// here), so the bound is 8e-2 (measured 3.0e-2 to 6.1e-2 on the CPU); a read that dropped a
/// scale, or took the keys' for the values, is off by far more.
pub fn fp8_pools_attend_as_their_dequantized_values(b: &dyn GpuBackend) -> Result<()> {
    if !b.supports_kv_dtype(DType::F8E4M3) {
        eprintln!("note: {} has no fp8 KV cache", b.name());
        return Ok(());
    }
    let seqs = [
        Seq { context: 200, q_len: 200 },
        Seq { context: 150, q_len: 37 },
        Seq { context: 97, q_len: 1 },
        Seq { context: 33, q_len: 1 },
    ];
    let decode: Vec<Seq> = [1, 65, 300, 1_100].iter().map(|&context| Seq { context, q_len: 1 }).collect();
    // Past 32 sequences CUDA's tensor-core decode runs its two-warp shape.
    let many: Vec<Seq> = (0..40).map(|i| Seq { context: [3, 200, 700, 2_100][i % 4] + i, q_len: 1 }).collect();
    // Query gains: 3, and 6 for the 40 sequences, as the bf16 decode checks of the same
    // kernels. bf16's tolerance is stated against the output's rms, and there 3-key
    // sequences sit beside 2,100-key ones: at a gain of 3 the long ones average thousands of
    // values and the rms fell to 0.118, while bf16's rounding of a 3-key sequence's
    // probabilities moves its outputs (near 0.5) by up to 1.4e-3, 1.1x that tolerance on the
    // H200 (`bench/results/device-2026-12-05/`); at 6 the rms is 0.196. (At 6 everywhere,
    // head dim 256's e4m3 rounding alone reaches 0.12 against the unquantized reference.)
    let shapes: [(usize, usize, usize, &[Seq], f32); 6] = [
        (4, 2, 64, &seqs, 3.0),
        (8, 2, 128, &seqs, 3.0),
        (8, 2, 128, &decode, 3.0),
        (8, 2, 128, &many, 6.0),
        (16, 2, 256, &seqs, 3.0),
        (16, 2, 256, &decode, 3.0),
    ];
    for (seed, &(h, hkv, d, seqs, gain)) in shapes.iter().enumerate() {
        let mut layout = Layout::new(h, hkv, d, 16);
        layout.params.kv_scales = KvScales { k: 0.01, v: 0.03 };
        let mut rng = Rng::new(41 + seed as u64);
        let c = Contents::random(b, &mut rng, &layout, seqs, gain);
        let tables = shuffled_tables(&mut rng, seqs, layout.block_size, pool_blocks(seqs, layout.block_size));
        let scales = layout.params.kv_scales;
        let dequantized =
            |xs: &[f32], s: f32| -> Vec<f32> { xs.iter().map(|&x| e4m3_to_f32(e4m3_from_f32(x / s)) * s).collect() };
        let widened = Contents {
            k: c.k.iter().map(|k| dequantized(k, scales.k)).collect(),
            v: c.v.iter().map(|v| dequantized(v, scales.v)).collect(),
            q: c.q.clone(),
        };
        let p = &layout.params;
        let want = attention_reference(p, seqs, &c);
        let want_dequantized = attention_reference(p, seqs, &widened);
        let t: usize = seqs.iter().map(|s| s.q_len).sum();
        for op in Op::ALL {
            let what = format!("{} over fp8 pools, h={h} h_kv={hkv} d={d}, {} rows", op.name(), t);
            let out = run_step_in(b, (&layout, seqs, &c, &tables), op, DType::F8E4M3)?;
            let fp8 = b.download_f32(&out)?;
            if b.float_dtype() == DType::F32 {
                let f32s = b.download_f32(&run_step_in(b, (&layout, seqs, &widened, &tables), op, DType::F32)?)?;
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(bits(&fp8) == bits(&f32s), "{what}: differs from f32 pools of their values");
            } else {
                assert_close(b, &out, &[t, h, d], &want_dequantized, &what)?;
            }
            let worst = fp8.iter().zip(&want).map(|(&g, w)| (f64::from(g) - w).abs()).fold(0.0, f64::max);
            eprintln!("{what}: max |error| {worst:.2e} against the unquantized reference");
            assert!(worst < 8e-2, "{what}: max |error| {worst:.2e} against the unquantized reference");
        }
    }
    Ok(())
}

/// Asserts that a case's option changes the reference, so ignoring it would fail the check.
fn assert_option_matters(with: &[f64], without: &[f64], what: &str) {
    let max_diff = with.iter().zip(without).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(max_diff > 0.05, "{what} barely changes the reference ({max_diff:.3e}): the case is too weak");
}

/// GQA (4 query heads on 2 KV heads) over the mixed batch, blocks of 4.
pub fn paged_attention_gqa_mixed_batch(b: &dyn GpuBackend) -> Result<()> {
    check_case(b, &Layout::new(4, 2, 16, 4), &MIXED, 2.0, 30, "paged_attention GQA").map(drop)
}

/// MHA (3 heads each with its own KV head) over the mixed batch, blocks of 4.
pub fn paged_attention_mha_mixed_batch(b: &dyn GpuBackend) -> Result<()> {
    check_case(b, &Layout::new(3, 3, 32, 4), &MIXED, 2.0, 31, "paged_attention MHA").map(drop)
}

/// A sliding window of 4 over contexts up to 11: early keys drop out of view.
pub fn paged_attention_sliding_window(b: &dyn GpuBackend) -> Result<()> {
    let mut layout = Layout::new(4, 2, 16, 4);
    layout.params.sliding_window = Some(4);
    let with = check_case(b, &layout, &MIXED, 2.0, 32, "paged_attention sliding window")?;
    let without = check_case(b, &Layout::new(4, 2, 16, 4), &MIXED, 2.0, 32, "paged_attention no window")?;
    assert_option_matters(&with, &without, "the sliding window");
    Ok(())
}

/// A soft-cap of 2 on scores that reach well past it.
pub fn paged_attention_softcap(b: &dyn GpuBackend) -> Result<()> {
    let mut layout = Layout::new(4, 2, 16, 4);
    layout.params.softcap = Some(2.0);
    let with = check_case(b, &layout, &MIXED, 8.0, 33, "paged_attention softcap")?;
    let without = check_case(b, &Layout::new(4, 2, 16, 4), &MIXED, 8.0, 33, "paged_attention no softcap")?;
    assert_option_matters(&with, &without, "the soft-cap");
    Ok(())
}

/// The tiled prefill kernel's shapes (head dims 64, 128 and Qwen3.5's 256, groups of 1 to
/// 8 query heads)
/// over chunked prefills whose query tiles and key tiles both cross block and tile edges
/// (tiles of 64 rows and 64 keys; blocks of 16), beside decode rows of other sequences, with
/// sharp attention (scores of a few units, so a wrong mask or a dropped tile moves the rows).
pub fn attention_tiled_prefill_shapes(b: &dyn GpuBackend) -> Result<()> {
    let seqs = [
        Seq { context: 200, q_len: 200 },
        Seq { context: 1_000, q_len: 129 },
        Seq { context: 64, q_len: 1 },
        Seq { context: 65, q_len: 64 },
        Seq { context: 300, q_len: 63 },
        Seq { context: 1, q_len: 1 },
    ];
    for (seed, &(h, hkv, d)) in [(8, 2, 128), (8, 8, 64), (16, 2, 128), (4, 1, 64), (16, 2, 256)].iter().enumerate() {
        let what = format!("tiled prefill h={h} h_kv={hkv} d={d}");
        check_case(b, &Layout::new(h, hkv, d, 16), &seqs, 6.0, 80 + seed as u64, &what)?;
    }
    let plain = Layout::new(8, 2, 128, 16);
    let without = check_case(b, &plain, &seqs, 6.0, 90, "tiled prefill, no window")?;
    let mut windowed = plain;
    windowed.params.sliding_window = Some(70);
    let with = check_case(b, &windowed, &seqs, 6.0, 90, "tiled prefill, window 70")?;
    assert_option_matters(&with, &without, "the tiled window");
    let mut capped = plain;
    capped.params.softcap = Some(2.0);
    let with = check_case(b, &capped, &seqs, 6.0, 90, "tiled prefill, soft-cap 2")?;
    assert_option_matters(&with, &without, "the tiled soft-cap");
    Ok(())
}

/// SmolLM2-135M's attention (9 query heads on 3 KV heads, head dim 64, blocks of 16) over
/// a prefill, a chunked prefill and a long decode row.
pub fn paged_attention_smollm_shape(b: &dyn GpuBackend) -> Result<()> {
    let seqs = [Seq { context: 40, q_len: 40 }, Seq { context: 37, q_len: 5 }, Seq { context: 70, q_len: 1 }];
    check_case(b, &Layout::new(9, 3, 64, 16), &seqs, 1.0, 34, "paged_attention 9/3 heads d=64").map(drop)
}

/// Contexts up to 8k in one step, as long prompts reach them: a decode row over 8,192
/// cached tokens, a prefill chunk of 64 queries after 5,936 cached tokens, and a whole
/// prefill of 700, with head dim 128, GQA 8/2 and blocks of 16 shuffled over a pool of
/// ~900. Queries are scaled so the softmax is peaked (scores of std ~2.7): a key read from
/// the wrong block, a block dropped or a softmax that loses precision over thousands of
/// terms moves the output past the tolerance.
pub fn paged_attention_long_contexts(b: &dyn GpuBackend) -> Result<()> {
    let seqs = [
        Seq { context: 8_192, q_len: 1 },
        Seq { context: 6_000, q_len: 64 },
        Seq { context: 700, q_len: 700 },
        Seq { context: 4_097, q_len: 1 },
    ];
    check_case(b, &Layout::new(8, 2, 128, 16), &seqs, 6.0, 41, "paged_attention at 8k").map(drop)
}

/// Decode rows at positions 32,767 and 20,000 under a sliding window of 4,096 (Mistral's
/// shape of the problem): the block-table walk starts thousands of blocks in, and only the
/// window's keys count. Without the window the reference moves (checked), so a kernel that
/// ignored it, or walked the table from the start, fails.
pub fn paged_attention_window_at_32k(b: &dyn GpuBackend) -> Result<()> {
    let seqs = [Seq { context: 32_768, q_len: 1 }, Seq { context: 20_001, q_len: 3 }];
    let mut layout = Layout::new(4, 1, 64, 16);
    layout.params.sliding_window = Some(4_096);
    let with = check_case(b, &layout, &seqs, 6.0, 42, "paged_attention window 4096 at 32k")?;
    let without = attention_reference(&Layout::new(4, 1, 64, 16).params, &seqs, &{
        let mut rng = Rng::new(42);
        Contents::random(b, &mut rng, &layout, &seqs, 6.0)
    });
    assert_option_matters(&with, &without, "the window at 32k");
    Ok(())
}

/// Writes random K/V rows (as `b` stores them) at `slots` of the pools `[blocks, block_size,
/// h_kv, d]` and records them in the expected pool contents `want`.
fn write_random_rows(
    b: &dyn GpuBackend,
    rng: &mut Rng,
    (kc, vc): (&Tensor, &Tensor),
    slots: &[u32],
    want: (&mut [f64], &mut [f64]),
) -> Result<()> {
    let (h_kv, d) = (kc.dims()[2], kc.dims()[3]);
    let row = h_kv * d;
    let (k, v) = (stored(b, rng.vec(slots.len() * row)), stored(b, rng.vec(slots.len() * row)));
    let dims = [slots.len(), h_kv, d];
    let slot_ids = upload_u32(b, slots, &[slots.len()])?;
    b.write_kv(&upload_f32(b, &k, &dims)?, &upload_f32(b, &v, &dims)?, kc, vc, &slot_ids, KvScales::UNIT)?;
    for (want, rows) in [(want.0, &k), (want.1, &v)] {
        for (i, &s) in slots.iter().enumerate() {
            let s = s as usize * row;
            want[s..s + row].iter_mut().zip(&rows[i * row..(i + 1) * row]).for_each(|(w, &x)| *w = f64::from(x));
        }
    }
    Ok(())
}

/// `write_kv` into a pool of 16,384 slots: rows land at scattered slots up to the very last
/// one, and nothing else changes.
pub fn write_kv_at_long_contexts(b: &dyn GpuBackend) -> Result<()> {
    let (blocks, bs, h_kv, d) = (1_024, 16, 2, 64);
    let row = h_kv * d;
    let pool = [blocks, bs, h_kv, d];
    let (kc, vc) = (b.zeros(&pool, b.float_dtype())?, b.zeros(&pool, b.float_dtype())?);
    let mut rng = Rng::new(43);
    let mut slots: Vec<u32> = (0..(blocks * bs) as u32).collect();
    rng.shuffle(&mut slots);
    slots.truncate(300);
    slots.extend([(blocks * bs - 1) as u32, 8_191, 8_192]);
    slots.sort_unstable();
    slots.dedup();
    rng.shuffle(&mut slots);
    let (mut want_k, mut want_v) = (vec![0f64; blocks * bs * row], vec![0f64; blocks * bs * row]);
    write_random_rows(b, &mut rng, (&kc, &vc), &slots, (&mut want_k, &mut want_v))?;
    assert_close(b, &kc, &pool, &want_k, "write_kv k pool of 16k slots")?;
    assert_close(b, &vc, &pool, &want_v, "write_kv v pool of 16k slots")
}

/// `write_kv` puts each row at its flat slot, leaves every other slot alone, and a later
/// write to the same slot overwrites it.
pub fn write_kv_places_rows_at_slots(b: &dyn GpuBackend) -> Result<()> {
    let (blocks, bs, h_kv, d) = (6, 4, 2, 3);
    let row = h_kv * d;
    let pool = [blocks, bs, h_kv, d];
    let (kc, vc) = (b.zeros(&pool, b.float_dtype())?, b.zeros(&pool, b.float_dtype())?);
    let mut rng = Rng::new(35);
    let mut want_k = vec![0f64; blocks * bs * row];
    let mut want_v = want_k.clone();
    for slots in [&[23u32, 0, 9, 4, 17][..], &[9, 10]] {
        write_random_rows(b, &mut rng, (&kc, &vc), slots, (&mut want_k, &mut want_v))?;
    }
    assert_close(b, &kc, &pool, &want_k, "write_kv k pool")?;
    assert_close(b, &vc, &pool, &want_v, "write_kv v pool")
}

/// KV writes and attention return `Err` on slots or blocks past the pool and on metadata
/// that does not fit the batch.
pub fn attention_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let layout = Layout::new(4, 2, 8, 4);
    let p = layout.params;
    let pool = [3, 4, 2, 8];
    let (kc, vc) = (b.zeros(&pool, b.float_dtype())?, b.zeros(&pool, b.float_dtype())?);
    let kv = |t: usize| upload_f32(b, &vec![0.5; t * 16], &[t, 2, 8]);
    expect_err(
        b.write_kv(&kv(1)?, &kv(1)?, &kc, &vc, &upload_u32(b, &[12], &[1])?, KvScales::UNIT),
        "write_kv slot 12 of 12",
    );
    expect_err(
        b.write_kv(&kv(3)?, &kv(3)?, &kc, &vc, &upload_u32(b, &[0, 1], &[2])?, KvScales::UNIT),
        "write_kv 3 rows for 2 slots",
    );
    let v_pool = b.zeros(&[3, 4, 2, 4], b.float_dtype())?;
    expect_err(
        b.write_kv(&kv(1)?, &kv(1)?, &kc, &v_pool, &upload_u32(b, &[0], &[1])?, KvScales::UNIT),
        "write_kv pools differ",
    );

    let q = |t: usize, h: usize| upload_f32(b, &vec![0.5; t * h * 8], &[t, h, 8]);
    let one = |context: usize, q_len: usize| [Seq { context, q_len }];
    let attend = |q: &Tensor, seqs: &[Seq], tables: &[Vec<u32>], p: &AttentionParams| {
        b.paged_attention(q, &kc, &vc, &upload_meta(b, seqs, tables)?, p)
    };
    attend(&q(1, 4)?, &one(6, 1), &[vec![2, 0]], &p)?;
    expect_err(attend(&q(1, 4)?, &one(6, 1), &[vec![2, 7]], &p), "block 7 of a 3-block pool");
    expect_err(attend(&q(1, 4)?, &one(9, 1), &[vec![2, 0]], &p), "context 9 in a 2-block table");
    expect_err(attend(&q(2, 4)?, &one(6, 1), &[vec![2, 0]], &p), "2 query rows for q_len 1");
    expect_err(attend(&q(3, 4)?, &one(2, 3), &[vec![2]], &p), "q_len 3 past context 2");
    expect_err(attend(&q(1, 3)?, &one(6, 1), &[vec![2, 0]], &p), "q with 3 heads for 4");
    let uneven = AttentionParams { num_heads: 3, ..p };
    expect_err(attend(&q(1, 3)?, &one(6, 1), &[vec![2, 0]], &uneven), "3 heads over 2 kv heads");
    Ok(())
}

/// The fused attention prologue equals the separate ops (split, per-head RMSNorm, rotary,
/// KV write) it stands for: with and without q/k norm, grouped and plain heads, partial
/// rotary, scattered slots at long positions; a slot past the pool is refused. Queries and
/// both pools are compared.
pub fn qkv_rotary_write_matches_separate_ops(b: &dyn GpuBackend) -> Result<()> {
    use met_kernels::{DType, QkvPrologue};
    let mut rng = Rng::new(57);
    // The last case carries f32 norm weights (Gemma 3's folded `1 + w`).
    let cases = [
        (8, 2, 64, 32, false, false),
        (4, 4, 128, 64, true, false),
        (6, 2, 96, 16, true, false),
        (4, 2, 64, 32, true, true),
    ];
    for &(h, hkv, d, half, norm, norm_f32) in &cases {
        let (t, blocks, bs) = (9, 12, 4);
        let pool = [blocks, bs, hkv, d];
        let qkv_data = stored(b, rng.vec(t * (h + 2 * hkv) * d).into_iter().map(|x| 3.0 * x).collect());
        let qkv = upload_f32(b, &qkv_data, &[t, (h + 2 * hkv) * d])?;
        let positions: Vec<u32> = (0..t as u32).map(|i| 5 + i * 3_001).collect();
        let positions = upload_u32(b, &positions, &[t])?;
        let freq: Vec<f32> = (0..half).map(|i| 10_000f32.powf(-((2 * i) as f32) / (2 * half) as f32)).collect();
        let inv_freq = b.upload(&met_kernels::HostTensor::from_f32(&freq, &[half]), DType::F32)?;
        let mut norm_weight = || -> Result<Tensor> {
            let w: Vec<f32> = rng.vec(d).into_iter().map(|x| 1.0 + 0.5 * x).collect();
            if norm_f32 {
                b.upload(&met_kernels::HostTensor::from_f32(&w, &[d]), DType::F32)
            } else {
                upload_f32(b, &stored(b, w), &[d])
            }
        };
        let norms = (norm_weight()?, norm_weight()?);
        let mut slots: Vec<u32> = (0..(blocks * bs) as u32).collect();
        rng.shuffle(&mut slots);
        slots.truncate(t);
        let mut padded = slots.clone();
        padded[t - 1] = u32::MAX;
        let p = QkvPrologue {
            num_heads: h,
            num_kv_heads: hkv,
            head_dim: d,
            qk_norm: norm.then_some((&norms.0, &norms.1)),
            eps: 1e-6,
            positions: &positions,
            inv_freq: &inv_freq,
            kv_scales: KvScales::UNIT,
        };
        let fp8 = b.supports_kv_dtype(DType::F8E4M3).then_some(DType::F8E4M3);
        for pools in std::iter::once(b.float_dtype()).chain(fp8) {
            let scales = if pools == DType::F8E4M3 { KvScales { k: 0.05, v: 0.02 } } else { KvScales::UNIT };
            let p = QkvPrologue { kv_scales: scales, ..p };
            let case = format!("h={h} h_kv={hkv} d={d} half={half} norm={norm} f32 norm={norm_f32} {pools} pools");
            prologue_case(b, (&qkv, &p), (&pool, pools), (&slots, &padded), &case)?;
        }
    }
    Ok(())
}

/// One case of [`qkv_rotary_write_matches_separate_ops`]: pools of `dtype`, rows written at
/// `slots`; `padded` has a slot past the pool.
fn prologue_case(
    b: &dyn GpuBackend,
    (qkv, p): (&Tensor, &met_kernels::QkvPrologue<'_>),
    (pool, dtype): (&[usize], DType),
    (slots, padded): (&[u32], &[u32]),
    case: &str,
) -> Result<()> {
    let (h, hkv, d, t) = (p.num_heads, p.num_kv_heads, p.head_dim, slots.len());
    // The composition of the separate ops, as the trait's default computes it.
    let (kc0, vc0) = (b.zeros(pool, dtype)?, b.zeros(pool, dtype)?);
    let slots_t = upload_u32(b, slots, &[t])?;
    let [q, k, v]: [Tensor; 3] = b.split_columns(qkv, &[h * d, hkv * d, hkv * d])?.try_into().unwrap();
    let (mut q, mut k) = (q.reshape(&[t, h, d])?, k.reshape(&[t, hkv, d])?);
    if let Some((qn, kn)) = p.qk_norm {
        q = b.rms_norm(&q, qn, p.eps)?;
        k = b.rms_norm(&k, kn, p.eps)?;
    }
    let q = b.rotary(&q, p.positions, p.inv_freq)?;
    let k = b.rotary(&k, p.positions, p.inv_freq)?;
    b.write_kv(&k, &v.reshape(&[t, hkv, d])?, &kc0, &vc0, &slots_t, p.kv_scales)?;
    let (kc1, vc1) = (b.zeros(pool, dtype)?, b.zeros(pool, dtype)?);
    let fused_q = b.qkv_rotary_write(qkv, p, &kc1, &vc1, &slots_t)?;
    let widen = |t: &Tensor| -> Result<Vec<f64>> { Ok(b.download_f32(t)?.into_iter().map(f64::from).collect()) };
    // The norm's sum of squares may be reduced in another order: one bf16 step apart at most.
    let tol = crate::harness::tolerance(b.float_dtype());
    crate::harness::assert_close_within(b, &fused_q, &[t, h, d], &widen(&q)?, tol, &format!("{case}: q"))?;
    if dtype == DType::F8E4M3 {
        // The separate ops' pool holds each key over its scale, rounded to e4m3.
        let (stored, keys) = (b.download_f32(&kc0)?, b.download_f32(&k)?);
        let row = hkv * d;
        for (i, &slot) in slots.iter().enumerate() {
            for e in 0..row {
                let want = e4m3_to_f32(e4m3_from_f32(keys[i * row + e] / p.kv_scales.k));
                let got = stored[slot as usize * row + e];
                assert_eq!(got, want, "{case}: key {i}.{e} is not e4m3(k / scale)");
            }
        }
        // A norm step apart can move a key across an e4m3 rounding boundary: one e4m3 step
        // (an eighth of the value's binade) at most, in a few keys.
        assert_within_e4m3_step(&b.download_f32(&kc1)?, &stored, &format!("{case}: k pool"));
    } else {
        crate::harness::assert_close_within(b, &kc1, pool, &widen(&kc0)?, tol, &format!("{case}: k pool"))?;
    }
    assert!(b.download_f32(&vc1)? == b.download_f32(&vc0)?, "{case}: v pool differs");
    // A slot past the pool is refused up front, as `write_kv` refuses it (the padding rows
    // of a graph carry one, written after the checks ran, and the kernel skips them).
    let (kc2, vc2) = (b.zeros(pool, dtype)?, b.zeros(pool, dtype)?);
    expect_err(
        b.qkv_rotary_write(qkv, p, &kc2, &vc2, &upload_u32(b, padded, &[t])?),
        &format!("{case}: slot past the pool"),
    );
    Ok(())
}

/// Asserts `got` equals `want` (both e4m3 values) but for at most 2 % of elements, each
/// one e4m3 step away.
fn assert_within_e4m3_step(got: &[f32], want: &[f32], what: &str) {
    let mut moved = 0;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g == w {
            continue;
        }
        moved += 1;
        let step = (w.abs().max(g.abs()).log2().floor() - 3.0).exp2().max(2f32.powi(-9));
        assert!((g - w).abs() <= step, "{what}: element {i} is {g}, the separate ops' {w}");
    }
    assert!(moved * 50 <= got.len(), "{what}: {moved} of {} elements moved", got.len());
}

/// Decode steps (one query row per sequence, the batches a split-KV kernel may take):
/// Llama-3.1-8B's grouping (32 query heads on 8 KV heads, d = 128), Qwen3-0.6B's (16 on 8),
/// MHA at d = 64, a head dim of 96 and Qwen3.5-35B-A3B's (16 on 2, d = 256); contexts of 1, 63 to 65 keys (split boundaries),
/// 300, 1,500 and 5,000 (several splits, of more than the minimum length), peaked scores;
/// then a window of 200 and a soft-cap on the same rows, each shown to matter.
pub fn paged_attention_decode_steps(b: &dyn GpuBackend) -> Result<()> {
    let contexts = [1, 63, 64, 65, 300, 1_500, 5_000];
    let seqs: Vec<Seq> = contexts.iter().map(|&context| Seq { context, q_len: 1 }).collect();
    for (seed, &(h, hkv, d)) in [(32, 8, 128), (16, 8, 128), (4, 4, 64), (6, 2, 96), (16, 2, 256)].iter().enumerate() {
        let layout = Layout::new(h, hkv, d, 16);
        let what = format!("decode h={h} h_kv={hkv} d={d}");
        check_case(b, &layout, &seqs, 6.0, 60 + seed as u64, &what)?;
    }
    let plain = Layout::new(8, 2, 128, 16);
    let without = check_case(b, &plain, &seqs, 6.0, 70, "decode, no window")?;
    let mut windowed = plain;
    windowed.params.sliding_window = Some(200);
    let with = check_case(b, &windowed, &seqs, 6.0, 70, "decode, window 200")?;
    assert_option_matters(&with, &without, "the decode window");
    let mut capped = plain;
    capped.params.softcap = Some(2.0);
    let with = check_case(b, &capped, &seqs, 6.0, 70, "decode, soft-cap 2")?;
    assert_option_matters(&with, &without, "the decode soft-cap");
    // CUDA's flash op splits longer past 8 and past 32 sequences (its tensor-core kernel for
    // head dims 64 and 128, the scalar split kernel for others, whose blocks past 32
    // sequences take several splits each), and its tensor-core kernel narrows its blocks
    // past 32 and gives each (sequence, KV head) one block past 64: 20 sequences with
    // groups of 3 and 8 query heads, 40 and 80 with splits of 2,048 keys crossed.
    let some: Vec<Seq> = (0..20).map(|i| Seq { context: [1, 70, 513, 1_100, 3_000][i % 5] + i, q_len: 1 }).collect();
    check_case(b, &Layout::new(9, 3, 64, 16), &some, 6.0, 73, "decode, 20 sequences, 9/3 heads d=64").map(drop)?;
    check_case(b, &Layout::new(8, 1, 128, 16), &some, 6.0, 74, "decode, 20 sequences, 8/1 heads d=128").map(drop)?;
    let many: Vec<Seq> = (0..40).map(|i| Seq { context: [3, 200, 700, 2_100, 4_097][i % 5] + i, q_len: 1 }).collect();
    check_case(b, &Layout::new(8, 2, 128, 16), &many, 6.0, 71, "decode, 40 sequences, d=128").map(drop)?;
    check_case(b, &Layout::new(6, 2, 96, 16), &many, 6.0, 72, "decode, 40 sequences, d=96").map(drop)?;
    let more: Vec<Seq> = (0..80).map(|i| Seq { context: [2, 130, 900, 2_049, 4_500][i % 5] + i, q_len: 1 }).collect();
    check_case(b, &Layout::new(16, 8, 128, 16), &more, 6.0, 75, "decode, 80 sequences, 16/8 heads d=128").map(drop)?;
    check_case(b, &Layout::new(4, 4, 64, 16), &more, 6.0, 76, "decode, 80 sequences, MHA d=64").map(drop)?;
    check_case(b, &Layout::new(16, 2, 256, 16), &many, 6.0, 77, "decode, 40 sequences, 16/2 heads d=256").map(drop)
}

/// A batch-invariant backend's attention (`GpuBackend::batch_invariant`): each query row of
/// a 300-token sequence gives the same bits computed in one prefill, in chunks of the
/// prompt (each after the chunks before it are cached), as a decode row on its own, and as
/// a decode row beside other sequences (a prefill, a chunk, decode rows), at head dims 64,
/// 128 and 256 with GQA, sharp attention, and tiles, blocks and chunks whose edges differ.
pub fn attention_rows_are_batch_invariant(b: &dyn GpuBackend) -> Result<()> {
    assert!(b.batch_invariant(), "{} is not batch-invariant", b.name());
    let (differ, _) = attention_rows_differing_in_batches(b)?;
    assert!(differ.is_empty(), "{} rows differ from the prefill's: {differ:?}", differ.len());
    Ok(())
}

/// The rows of [`attention_rows_are_batch_invariant`]'s cases that differ from the
/// prefill's, each named: the census the GPU bundle prints for the default CUDA kernels.
pub fn attention_rows_differing_in_batches(b: &dyn GpuBackend) -> Result<(Vec<String>, usize)> {
    let (mut differ, mut compared) = (vec![], 0);
    for (seed, &(h, h_kv, d)) in [(8, 2, 128), (4, 4, 64), (16, 2, 256)].iter().enumerate() {
        let layout = Layout::new(h, h_kv, d, 16);
        let mut rng = Rng::new(300 + seed as u64);
        let len = 300;
        let whole = Seq { context: len, q_len: len };
        let c = Contents::random(b, &mut rng, &layout, &[whole], 6.0);
        let row = h * d;
        // Rows `start..end` of the sequence as the queries of a step over its first `end` tokens.
        let part = |start: usize, end: usize| Contents {
            k: vec![c.k[0][..end * layout.kv_row()].to_vec()],
            v: vec![c.v[0][..end * layout.kv_row()].to_vec()],
            q: c.q[start * row..end * row].to_vec(),
        };
        let step = |rng: &mut Rng, seqs: &[Seq], contents: &Contents| -> Result<Vec<f32>> {
            let tables = shuffled_tables(rng, seqs, layout.block_size, pool_blocks(seqs, layout.block_size));
            b.download_f32(&run_step(b, &layout, seqs, contents, &tables, Op::Flash)?)
        };
        let prefill = step(&mut rng, &[whole], &c)?;
        let what = |how: &str, i: usize| format!("h={h} h_kv={h_kv} d={d}: row {i} {how}");
        // Chunks of the prompt, each step after the chunks before it.
        let mut start = 0;
        for end in [37, 64, 65, 200, 300] {
            let got = step(&mut rng, &[Seq { context: end, q_len: end - start }], &part(start, end))?;
            for i in start..end {
                compared += 1;
                if got[(i - start) * row..(i - start + 1) * row] != prefill[i * row..(i + 1) * row] {
                    differ.push(what("in a chunk", i));
                }
            }
            start = end;
        }
        // Decode rows alone, and one beside other sequences.
        for i in [0, 15, 16, 63, 64, 127, 128, 255, 299] {
            let got = step(&mut rng, &[Seq { context: i + 1, q_len: 1 }], &part(i, i + 1))?;
            compared += 1;
            if got != prefill[i * row..(i + 1) * row] {
                differ.push(what("as a decode row", i));
            }
        }
        let others = [Seq { context: 90, q_len: 90 }, Seq { context: 140, q_len: 40 }, Seq { context: 33, q_len: 1 }];
        let mut batch = Contents::random(b, &mut rng, &layout, &others, 6.0);
        let i = 299;
        let mine = part(i, i + 1);
        batch.k.insert(1, mine.k[0].clone());
        batch.v.insert(1, mine.v[0].clone());
        let first: usize = others[0].q_len * row;
        batch.q.splice(first..first, mine.q.iter().copied());
        let seqs = [others[0], Seq { context: i + 1, q_len: 1 }, others[1], others[2]];
        let got = step(&mut rng, &seqs, &batch)?;
        compared += 1;
        if got[first..first + row] != prefill[i * row..(i + 1) * row] {
            differ.push(what("as a decode row in a batch", i));
        }
    }
    Ok((differ, compared))
}
