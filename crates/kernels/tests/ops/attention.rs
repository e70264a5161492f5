//! Conformance checks of the KV write and paged attention: a varlen batch mixing a prefill
//! sequence, a chunked prefill over tokens cached by an earlier step, and decode rows, with
//! GQA and MHA, small shuffled blocks, a sliding window and a logit soft-cap, against a
//! direct softmax over each query's visible keys.

use met_kernels::{AttentionMeta, AttentionParams, GpuBackend, Result, Tensor};

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
    b.write_kv(&k, &v, pools.0, pools.1, &upload_u32(b, &slots, &[slots.len()])?)
}

/// Runs one step the way the engine does: an earlier step already cached every token
/// before this step's queries; this step writes its own K/V, then attends.
pub fn run_paged(
    b: &dyn GpuBackend,
    layout: &Layout,
    seqs: &[Seq],
    c: &Contents,
    tables: &[Vec<u32>],
) -> Result<Tensor> {
    let (p, bs) = (&layout.params, layout.block_size);
    let pool_dims = [pool_blocks(seqs, bs), bs, p.num_kv_heads, p.head_dim];
    let (kc, vc) = (b.zeros(&pool_dims, b.float_dtype())?, b.zeros(&pool_dims, b.float_dtype())?);
    let batch = (layout, seqs, c, tables);
    write_positions(b, batch, (&kc, &vc), |s| 0..s.context - s.q_len)?;
    write_positions(b, batch, (&kc, &vc), |s| s.context - s.q_len..s.context)?;
    let t: usize = seqs.iter().map(|s| s.q_len).sum();
    let q = upload_f32(b, &c.q, &[t, p.num_heads, p.head_dim])?;
    b.paged_attention(&q, &kc, &vc, &upload_meta(b, seqs, tables)?, p)
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

/// Runs `seqs` under `layout` on shuffled tables and compares with the reference.
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
    let out = run_paged(b, layout, seqs, &contents, &tables)?;
    let p = &layout.params;
    let want = attention_reference(p, seqs, &contents);
    let t: usize = seqs.iter().map(|s| s.q_len).sum();
    assert_close(b, &out, &[t, p.num_heads, p.head_dim], &want, what)?;
    Ok(want)
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
    b.write_kv(&upload_f32(b, &k, &dims)?, &upload_f32(b, &v, &dims)?, kc, vc, &upload_u32(b, slots, &[slots.len()])?)?;
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
    expect_err(b.write_kv(&kv(1)?, &kv(1)?, &kc, &vc, &upload_u32(b, &[12], &[1])?), "write_kv slot 12 of 12");
    expect_err(b.write_kv(&kv(3)?, &kv(3)?, &kc, &vc, &upload_u32(b, &[0, 1], &[2])?), "write_kv 3 rows for 2 slots");
    let v_pool = b.zeros(&[3, 4, 2, 4], b.float_dtype())?;
    expect_err(b.write_kv(&kv(1)?, &kv(1)?, &kc, &v_pool, &upload_u32(b, &[0], &[1])?), "write_kv pools differ");

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
