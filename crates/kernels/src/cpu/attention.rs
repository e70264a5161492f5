//! Paged attention on the CPU: the reference for every device implementation.
//!
//! One task per (query token, head) walks its visible keys once with an online softmax,
//! so no score matrix is materialised. Keys are found through the block table:
//! position `j` of sequence `s` lives in block `tables[s][j / block_size]` at offset
//! `j % block_size`.

use rayon::prelude::*;

use crate::Tensor;
use crate::backend::{AttentionMeta, AttentionParams};
use crate::error::{Error, Result, ensure};

use super::{f32_tensor, read_f32, read_u32, write_f32};

pub(super) fn write_kv(k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, slots: &Tensor) -> Result<()> {
    let crate::check::WriteKv { row, capacity } = crate::check::write_kv(k, v, k_cache, v_cache, slots)?;
    let slots = read_u32("write_kv", slots)?;
    crate::check::slots_in_pool(&slots, capacity)?;
    for (src, dst) in [(k, k_cache), (v, v_cache)] {
        let src = read_f32("write_kv", src)?;
        let mut dst = write_f32("write_kv", dst)?;
        for (i, &s) in slots.iter().enumerate() {
            let s = s as usize;
            dst[s * row..(s + 1) * row].copy_from_slice(&src[i * row..(i + 1) * row]);
        }
    }
    Ok(())
}

/// Key elements seen by a step (keys × heads × head dim, summed over its rows) below which
/// it is computed on the calling thread: half a million multiply-adds, about the cost of
/// handing the job to rayon's workers and waiting for them.
const SERIAL_KEY_ELEMS: usize = 1 << 19;

/// Per-query facts shared by the heads of one token.
#[derive(Clone, Copy)]
pub(crate) struct QueryRow {
    seq: usize,
    pos: usize,
}

pub(super) fn paged_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let (t, block_size, blocks) = crate::check::attention(q, k_cache, v_cache, p)?;
    let cu = read_u32("paged_attention", &meta.cu_seqlens_q)?;
    let lens = read_u32("paged_attention", &meta.seq_lens)?;
    let tables = read_u32("paged_attention", &meta.block_tables)?;
    let max_blocks = meta.block_tables.dims().get(1).copied().unwrap_or(0);
    let rows = check_meta(MetaView { cu: &cu, lens: &lens, tables: &tables, max_blocks }, t, block_size, blocks)?;

    let (qs, ks, vs) =
        (read_f32("paged_attention", q)?, read_f32("paged_attention", k_cache)?, read_f32("paged_attention", v_cache)?);
    let group = h / hkv;
    let mut out = vec![0f32; t * h * d];
    let visible: usize = rows.iter().map(|r| r.pos + 1).sum::<usize>() * h * d;
    let each = |(i, o): (usize, &mut [f32])| {
        let (row, head) = (rows[i / h], i % h);
        let kv_head = head / group;
        let table = &tables[row.seq * max_blocks..(row.seq + 1) * max_blocks];
        let first = p.sliding_window.map_or(0, |w| (row.pos + 1).saturating_sub(w));
        let query = &qs[i * d..(i + 1) * d];
        let key_at = |j: usize| {
            let slot = table[j / block_size] as usize * block_size + j % block_size;
            (slot * hkv + kv_head) * d
        };
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        for j in first..=row.pos {
            let at = key_at(j);
            let mut score = p.scale * dot(query, &ks[at..at + d]);
            if let Some(cap) = p.softcap {
                score = cap * (score / cap).tanh();
            }
            if score > max {
                let rescale = (max - score).exp();
                sum *= rescale;
                o.iter_mut().for_each(|x| *x *= rescale);
                max = score;
            }
            let w = (score - max).exp();
            sum += w;
            for (x, v) in o.iter_mut().zip(&vs[at..at + d]) {
                *x += w * v;
            }
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|x| *x *= inv);
    };
    // A step whose rows see few keys in all (a decode step of a few short sequences) runs
    // on this thread, for the reason `ops::for_each_row` gives; larger ones on rayon.
    if visible < SERIAL_KEY_ELEMS {
        out.chunks_mut(d).enumerate().for_each(each);
    } else {
        out.par_chunks_mut(d).enumerate().for_each(each);
    }
    Ok(f32_tensor(out, &[t, h, d]))
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
