//! Paged attention on the CPU: the reference for every device implementation.
//!
//! One task per (query token, KV head) walks its visible keys once for the group's query
//! heads with an online softmax over short runs of keys, so no score matrix is
//! materialised. Keys are found through the block table:
//! position `j` of sequence `s` lives in block `tables[s][j / block_size]` at offset
//! `j % block_size`.

use parking_lot::MappedRwLockReadGuard;

use crate::backend::{AttentionMeta, AttentionParams, KvScales};
use crate::error::{Error, Result, ensure};
use crate::fp8::{e4m3_from_f32, widen_e4m3_simd};
use crate::{DType, Tensor};

use super::pool::SpinPool;
use super::{f32_tensor, read_f8, read_f32, read_u32, write_f8, write_f32};

/// Copies the rows into f32 pools, or stores them divided by their scale as e4m3 bytes in
/// FP8 pools.
pub(super) fn write_kv(
    k: &Tensor,
    v: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    slots: &Tensor,
    scales: KvScales,
) -> Result<()> {
    let crate::check::WriteKv { row, capacity } = crate::check::write_kv(k, v, k_cache, v_cache, slots)?;
    let slots = read_u32("write_kv", slots)?;
    crate::check::slots_in_pool(&slots, capacity)?;
    for (src, dst, scale) in [(k, k_cache, scales.k), (v, v_cache, scales.v)] {
        let src = read_f32("write_kv", src)?;
        if dst.dtype() == DType::F8E4M3 {
            let mut dst = write_f8("write_kv", dst)?;
            for (i, &s) in slots.iter().enumerate() {
                let s = s as usize;
                for (d, &x) in dst[s * row..(s + 1) * row].iter_mut().zip(&src[i * row..(i + 1) * row]) {
                    *d = e4m3_from_f32(x / scale);
                }
            }
            continue;
        }
        let mut dst = write_f32("write_kv", dst)?;
        for (i, &s) in slots.iter().enumerate() {
            let s = s as usize;
            dst[s * row..(s + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
        }
    }
    Ok(())
}

/// Key elements seen by a step (keys × heads × head dim, summed over its rows) below which
/// it is computed on the calling thread: too little work to be worth handing out.
const SERIAL_KEY_ELEMS: usize = 1 << 14;

/// Query rows of one sequence in a step from which, over FP8 pools, its visible keys and
/// values are widened to f32 once for all of them (a prompt's chunk) rather than run by
/// run for each row (decode rows).
const WIDEN_FROM_ROWS: usize = 8;

/// Keys scored together: each head's running maximum and sum are updated once per run of
/// this many keys, and their weights are exponentiated as one slice.
const KEY_RUN: usize = 16;

/// Per-query facts shared by the heads of one token.
#[derive(Clone, Copy)]
pub(crate) struct QueryRow {
    pub seq: usize,
    pub pos: usize,
}

pub(super) fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    Ok(attend_rows(&Step::read("paged_attention", q, (k_cache, v_cache), meta, p)?, p))
}

/// A step's attention operands, checked and read on the host.
pub(super) struct Step<'a> {
    /// Query rows.
    pub t: usize,
    /// Each query row's sequence and position.
    pub rows: Vec<QueryRow>,
    /// `q [t, h, d]`.
    pub qs: Guard<'a, f32>,
    tables: Guard<'a, u32>,
    max_blocks: usize,
    block_size: usize,
    pools: PoolGuards<'a>,
}

type Guard<'a, T> = MappedRwLockReadGuard<'a, [T]>;

/// The key and value pools, as read.
enum PoolGuards<'a> {
    F32(Guard<'a, f32>, Guard<'a, f32>),
    F8(Guard<'a, u8>, Guard<'a, u8>),
}

impl<'a> Step<'a> {
    /// Checks the shapes and the metadata (every backend's rules) and reads the operands.
    pub fn read(
        op: &'static str,
        q: &'a Tensor,
        (k_cache, v_cache): (&'a Tensor, &'a Tensor),
        meta: &'a AttentionMeta,
        p: &AttentionParams,
    ) -> Result<Self> {
        let (t, block_size, blocks) = crate::check::attention(q, k_cache, v_cache, p)?;
        let cu = read_u32(op, &meta.cu_seqlens_q)?;
        let lens = read_u32(op, &meta.seq_lens)?;
        let tables = read_u32(op, &meta.block_tables)?;
        let max_blocks = meta.block_tables.dims().get(1).copied().unwrap_or(0);
        let rows = check_meta(MetaView { cu: &cu, lens: &lens, tables: &tables, max_blocks }, t, block_size, blocks)?;
        let pools = if k_cache.dtype() == DType::F8E4M3 {
            PoolGuards::F8(read_f8(op, k_cache)?, read_f8(op, v_cache)?)
        } else {
            PoolGuards::F32(read_f32(op, k_cache)?, read_f32(op, v_cache)?)
        };
        Ok(Self { t, rows, qs: read_f32(op, q)?, tables, max_blocks, block_size, pools })
    }

    /// The step's pools, read through its block tables.
    pub fn cache(&self, p: &AttentionParams) -> PagedKv<'_> {
        PagedKv {
            pools: match &self.pools {
                PoolGuards::F32(ks, vs) => Pools::F32(ks, vs),
                PoolGuards::F8(ks, vs) => Pools::F8(ks, vs, p.kv_scales),
            },
            tables: &self.tables,
            max_blocks: self.max_blocks,
            block_size: self.block_size,
            num_kv_heads: p.num_kv_heads,
            head_dim: p.head_dim,
        }
    }
}

/// The reference kernel over a read step: `[t, h, d]`.
pub(super) fn attend_rows(step: &Step<'_>, p: &AttentionParams) -> Tensor {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let (t, rows, qs, cache) = (step.t, &step.rows, &step.qs, step.cache(p));
    let group = h / hkv;
    let mut out = vec![0f32; t * h * d];
    let visible: usize = rows.iter().map(|r| r.pos + 1).sum::<usize>() * h * d;
    // From FP8 pools, the sequences with many rows here, widened once: a row reads the
    // same values either way and adds them in the same order, so its bits do not depend on
    // which path it took.
    let widened = cache.widen_sequences(rows, WIDEN_FROM_ROWS);
    // One task per (query row, KV head): the group's query heads (consecutive in `q` and
    // `out`) walk the row's keys together, so each key and value is read once for them.
    let task = |i: usize, o: &mut [f32]| {
        let (row, kv_head, queries) = (rows[i / hkv], i % hkv, &qs[i * group * d..(i + 1) * group * d]);
        match widened.get(row.seq).and_then(Option::as_ref) {
            Some((ks, vs)) => {
                let key_at = |j: usize| (j * hkv + kv_head) * d;
                attend_group(queries, o, (first_key(row.pos, p), row.pos + 1), &key_at, Pools::F32(ks, vs), p);
            }
            None => cache.attend_row(row, kv_head, queries, o, p),
        }
    };
    // A step whose rows see few keys in all runs on this thread; larger ones share the
    // tasks out over the spinning pool (a decode step's attention is one of its serial
    // parts otherwise, with the pool's other threads waiting).
    if visible < SERIAL_KEY_ELEMS || t * hkv < 2 {
        out.chunks_mut(group * d).enumerate().for_each(|(i, o)| task(i, o));
    } else {
        SpinPool::global().run_pieces(&mut out, group * d, &task);
    }
    f32_tensor(out, &[t, h, d])
}

/// A layer's key and value pools: f32, or e4m3 bytes read under their scales.
#[derive(Clone, Copy)]
pub(super) enum Pools<'a> {
    F32(&'a [f32], &'a [f32]),
    F8(&'a [u8], &'a [u8], KvScales),
}

/// The key and value pools of a step, read through its block tables.
pub(super) struct PagedKv<'a> {
    pub pools: Pools<'a>,
    /// Row-major `[seqs, max_blocks]`.
    pub tables: &'a [u32],
    pub max_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl PagedKv<'_> {
    /// Where KV head `kv_head` of position `j` of sequence `seq` starts in the pools.
    pub fn offset(&self, seq: usize, kv_head: usize, j: usize) -> usize {
        let block = self.tables[seq * self.max_blocks + j / self.block_size] as usize;
        ((block * self.block_size + j % self.block_size) * self.num_kv_heads + kv_head) * self.head_dim
    }

    /// For each sequence of `rows`: from FP8 pools, when it has `from` rows or more, its
    /// keys and values up to its last row's position widened to f32 rows `[position, h_kv,
    /// d]`, otherwise `None`; from f32 pools, nothing (an empty list).
    pub fn widen_sequences(&self, rows: &[QueryRow], from: usize) -> Vec<Option<(Vec<f32>, Vec<f32>)>> {
        let Pools::F8(kb, vb, scales) = self.pools else { return Vec::new() };
        let seqs = rows.iter().map(|r| r.seq + 1).max().unwrap_or(0);
        let (mut count, mut len) = (vec![0usize; seqs], vec![0usize; seqs]);
        for r in rows {
            count[r.seq] += 1;
            len[r.seq] = len[r.seq].max(r.pos + 1);
        }
        let width = self.num_kv_heads * self.head_dim;
        (0..seqs)
            .map(|seq| {
                (count[seq] >= from).then(|| {
                    let (mut ks, mut vs) = (vec![0f32; len[seq] * width], vec![0f32; len[seq] * width]);
                    for j in 0..len[seq] {
                        let (src, dst) = (self.offset(seq, 0, j), j * width);
                        widen_e4m3_simd(&mut ks[dst..dst + width], &kb[src..src + width], scales.k);
                        widen_e4m3_simd(&mut vs[dst..dst + width], &vb[src..src + width], scales.v);
                    }
                    (ks, vs)
                })
            })
            .collect()
    }

    /// Attention of one query row's heads of KV head `kv_head` (`queries [g, d]`, the
    /// group's heads) over the keys the row sees, into `out [g, d]`.
    pub fn attend_row(&self, row: QueryRow, kv_head: usize, queries: &[f32], out: &mut [f32], p: &AttentionParams) {
        let first = first_key(row.pos, p);
        let key_at = |j: usize| self.offset(row.seq, kv_head, j);
        attend_group(queries, out, (first, row.pos + 1), &key_at, self.pools, p);
    }
}

/// The first key a query at position `pos` sees: 0, or the start of its sliding window.
pub(super) fn first_key(pos: usize, p: &AttentionParams) -> usize {
    p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w))
}

/// Attention of the query heads `queries [g, d]` over keys `keys.0 .. keys.1` (found by
/// `key_at` in the pools `kv`) into `out [g, d]`, with an online softmax over runs of
/// [`KEY_RUN`] keys: scores of a run for every head, then each head's maximum, the
/// rescale of its sum and output, and the run's weights. Where the CPU has AVX2 (and
/// `MET_CPU_SIMD` allows it) the same loops are compiled for it: they only widen the
/// vectors, with no fused multiply-adds and no reordered sums, so the result is the same
/// bit for bit. From FP8 pools each run's keys and values are first widened (byte value
/// times scale) into f32 rows that the group's heads then share.
fn attend_group(
    queries: &[f32],
    out: &mut [f32],
    keys: (usize, usize),
    key_at: &dyn Fn(usize) -> usize,
    kv: Pools<'_>,
    p: &AttentionParams,
) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx2 {
        // SAFETY: the level is at least AVX2, so the CPU has AVX2.
        return unsafe { attend_group_avx2(queries, out, keys, key_at, kv, p) };
    }
    attend_group_body(queries, out, keys, key_at, kv, p);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn attend_group_avx2(
    queries: &[f32],
    out: &mut [f32],
    keys: (usize, usize),
    key_at: &dyn Fn(usize) -> usize,
    kv: Pools<'_>,
    p: &AttentionParams,
) {
    attend_group_body(queries, out, keys, key_at, kv, p);
}

#[inline(always)]
fn attend_group_body(
    queries: &[f32],
    out: &mut [f32],
    keys: (usize, usize),
    key_at: &dyn Fn(usize) -> usize,
    kv: Pools<'_>,
    p: &AttentionParams,
) {
    let d = p.head_dim;
    let g = queries.len() / d.max(1);
    let mut max = vec![f32::NEG_INFINITY; g];
    let mut sum = vec![0f32; g];
    let mut run = [0f32; KEY_RUN];
    let mut at = [0usize; KEY_RUN];
    // A run's keys and values widened from FP8 pools, at offsets `j · d`.
    let mut wide = match kv {
        Pools::F32(..) => (Vec::new(), Vec::new()),
        Pools::F8(..) => (vec![0f32; KEY_RUN * d], vec![0f32; KEY_RUN * d]),
    };
    let mut start = keys.0;
    while start < keys.1 {
        let n = KEY_RUN.min(keys.1 - start);
        for (j, a) in at[..n].iter_mut().enumerate() {
            *a = key_at(start + j);
        }
        let (ks, vs): (&[f32], &[f32]) = match kv {
            Pools::F32(ks, vs) => (ks, vs),
            Pools::F8(kb, vb, scales) => {
                let (wk, wv) = &mut wide;
                for (j, a) in at[..n].iter_mut().enumerate() {
                    let (src, dst) = (*a..*a + d, j * d..(j + 1) * d);
                    widen_e4m3_simd(&mut wk[dst.clone()], &kb[src.clone()], scales.k);
                    widen_e4m3_simd(&mut wv[dst], &vb[src], scales.v);
                    *a = j * d;
                }
                (&wide.0, &wide.1)
            }
        };
        for head in 0..g {
            let query = &queries[head * d..(head + 1) * d];
            let scores = &mut run[..n];
            for (s, &a) in scores.iter_mut().zip(&at[..n]) {
                let x = p.scale * dot(query, &ks[a..a + d]);
                *s = p.softcap.map_or(x, |cap| cap * (x / cap).tanh());
            }
            let run_max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let o = &mut out[head * d..(head + 1) * d];
            if run_max > max[head] {
                if max[head] > f32::NEG_INFINITY {
                    let rescale = (max[head] - run_max).exp();
                    sum[head] *= rescale;
                    o.iter_mut().for_each(|x| *x *= rescale);
                }
                max[head] = run_max;
            }
            scores.iter_mut().for_each(|s| *s -= max[head]);
            exp_in_place(scores);
            sum[head] += scores.iter().sum::<f32>();
            // Each output element adds the run's weighted values key by key, as a loop over
            // keys around one over elements would; taken 32 elements at a time, they stay
            // in registers for the whole run (four independent chains of adds).
            let mut c = 0;
            while c + 32 <= d {
                let mut acc: [f32; 32] = o[c..c + 32].try_into().expect("32 elements");
                for (&weight, &a) in scores.iter().zip(&at[..n]) {
                    let v = &vs[a + c..a + c + 32];
                    for i in 0..32 {
                        acc[i] += weight * v[i];
                    }
                }
                o[c..c + 32].copy_from_slice(&acc);
                c += 32;
            }
            for (&weight, &a) in scores.iter().zip(&at[..n]) {
                for (x, v) in o[c..].iter_mut().zip(&vs[a + c..a + d]) {
                    *x += weight * v;
                }
            }
        }
        start += n;
    }
    for (o, s) in out.chunks_mut(d.max(1)).zip(&sum) {
        let inv = 1.0 / s;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}

/// `e^x` for every `x <= 0` of `xs` (softmax weights after the maximum is subtracted),
/// within 2 ulp, in plain arithmetic the compiler vectorises: `x = n ln 2 + r` with `n` an
/// integer and `|r| <= ln 2 / 2`, `e^r` by its Taylor polynomial to degree 7, scaled by `2^n`
/// through the exponent bits. Arguments below -87 give 0.
#[inline(always)]
pub(super) fn exp_in_place(xs: &mut [f32]) {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 · 2^23 rounds to an integer in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    for x in xs.iter_mut() {
        let v = x.max(-87.0);
        let t = v * LOG2E + ROUND;
        let n = t - ROUND;
        let r = (v - n * LN2_HI) - n * LN2_LO;
        let poly = 1.0
            + r * (1.0
                + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
        let scale = f32::from_bits(((t.to_bits() as i32 - ROUND.to_bits() as i32 + 127) << 23) as u32);
        *x = if *x < -87.0 { 0.0 } else { poly * scale };
    }
}

/// The varlen metadata of a step, read on the host.
pub(crate) struct MetaView<'a> {
    /// `cu_seqlens_q`.
    pub cu: &'a [u32],
    /// `seq_lens`.
    pub lens: &'a [u32],
    /// `block_tables`, row-major `[seqs, max_blocks]`.
    pub tables: &'a [u32],
    /// Width of the block tables.
    pub max_blocks: usize,
}

/// Checks the metadata of `t` query rows against a pool of `num_blocks` blocks of
/// `block_size` (every backend applies these rules), returning each query row's sequence and
/// position.
pub(crate) fn check_meta(m: MetaView<'_>, t: usize, block_size: usize, num_blocks: usize) -> Result<Vec<QueryRow>> {
    let rows = query_rows(m.cu, m.lens, t)?;
    let needed = m.lens.iter().map(|&l| (l as usize).div_ceil(block_size)).max().unwrap_or(0);
    ensure(needed <= m.max_blocks && m.tables.len() == m.lens.len() * m.max_blocks, "paged_attention", || {
        format!("block tables of width {} cannot hold contexts of {:?} tokens", m.max_blocks, m.lens)
    })?;
    if let Some(bad) = m.tables.iter().find(|&&b| b as usize >= num_blocks) {
        return Err(Error::InvalidArgument(format!("paged_attention: block {bad} is past the pool of {num_blocks}")));
    }
    Ok(rows)
}

/// Sequence and absolute position of every query row, from the varlen metadata.
fn query_rows(cu: &[u32], lens: &[u32], t: usize) -> Result<Vec<QueryRow>> {
    let bad = |msg: String| Error::Shape { op: "paged_attention", msg };
    if cu.len() != lens.len() + 1 || cu.first() != Some(&0) || cu.last().map(|&c| c as usize) != Some(t) {
        return Err(bad(format!("cu_seqlens_q {cu:?} does not cover {t} query rows of {} sequences", lens.len())));
    }
    let mut rows = Vec::with_capacity(t);
    for (seq, (w, &len)) in cu.windows(2).zip(lens).enumerate() {
        let q_len = w[1].checked_sub(w[0]).ok_or_else(|| bad(format!("cu_seqlens_q {cu:?} decreases")))? as usize;
        let len = len as usize;
        if q_len > len {
            return Err(bad(format!("sequence {seq} has {q_len} queries but a context of {len}")));
        }
        rows.extend((len - q_len..len).map(|pos| QueryRow { seq, pos }));
    }
    Ok(rows)
}

/// Eight independent partial sums, so the compiler vectorises the reduction.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::exp_in_place;
    use crate::backend::AttentionParams;

    /// The AVX2 build of the attention loop gives the portable one's result bit for bit,
    /// with and without a soft-cap, over runs of keys that end mid-run.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn attention_loops_agree_bit_for_bit_across_simd_levels() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let (g, d, keys) = (3, 64, 101);
        let mut state = 12345u64;
        let mut next = || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        };
        let queries: Vec<f32> = (0..g * d).map(|_| next()).collect();
        let ks: Vec<f32> = (0..keys * d).map(|_| next()).collect();
        let vs: Vec<f32> = (0..keys * d).map(|_| next()).collect();
        for softcap in [None, Some(5.0)] {
            let p = AttentionParams {
                num_heads: g,
                num_kv_heads: 1,
                head_dim: d,
                scale: 0.7,
                sliding_window: None,
                softcap,
                kv_scales: crate::KvScales::UNIT,
            };
            let key_at = |j: usize| j * d;
            let (mut portable, mut wide) = (vec![0f32; g * d], vec![0f32; g * d]);
            let pools = super::Pools::F32(&ks, &vs);
            super::attend_group_body(&queries, &mut portable, (3, keys), &key_at, pools, &p);
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { super::attend_group_avx2(&queries, &mut wide, (3, keys), &key_at, pools, &p) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&portable), bits(&wide), "softcap {softcap:?}");
            assert!(portable.iter().all(|x| x.is_finite()) && portable.iter().any(|&x| x != 0.0));
        }
    }

    /// The softmax weights' exponential is within 2 ulp of libm's over every argument a
    /// weight takes (scores minus their maximum: 0 down to -87), and 0 below.
    #[test]
    fn exp_in_place_matches_libm_within_two_ulp() {
        let xs: Vec<f32> = (0..=2_000_000).map(|i| -87.0 * i as f32 / 2_000_000.0).collect();
        let mut got = xs.clone();
        exp_in_place(&mut got);
        for (&x, &g) in xs.iter().zip(&got) {
            let want = x.exp();
            let ulp = f32::from_bits(want.to_bits() + 1) - want;
            assert!((g - want).abs() <= 2.0 * ulp, "e^{x}: {g} against {want}");
        }
        let mut low = [-87.5f32, -100.0, -1e30, f32::NEG_INFINITY];
        exp_in_place(&mut low);
        assert_eq!(low, [0.0; 4]);
    }
}
