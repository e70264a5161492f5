//! Causal attention for prompts on the CPU: the `flash` backend's CPU op.
//!
//! A sequence with many query rows in a step (a prompt, or a chunk of one) is attended a
//! tile of rows at a time for each KV head. The keys and values the tile sees are gathered
//! out of the paged pools once into contiguous rows; each query head's scores come out of
//! one GEMM, the mask and softmax run over whole rows of scores, and a second GEMM weights
//! the values. The reference walks every (row, key) pair with vector loads and adds; here
//! the `gemm` crate's register-blocked kernels do the arithmetic, at the cost of scoring the
//! keys past each row's position inside a tile (masked to zero weight).
//!
//! Rows of sequences with few queries in the step (decode, speculative verification) take
//! the reference's per-row path, so their results are the reference's bit for bit: a
//! verification step must see the logits decode would.

use std::cell::RefCell;

use crate::Tensor;
use crate::backend::{AttentionMeta, AttentionParams};
use crate::error::Result;

use super::attention::{PagedKv, QueryRow, Step, attend_rows, exp_in_place, first_key};
use super::f32_tensor;
use super::pool::SpinPool;

/// A sequence with at least this many query rows in a step is attended in tiles (as the
/// quantised matmuls switch to GEMMs at 32 rows, and for the same reason: fewer rows are
/// decode or verification, which must match decode).
const MIN_TILED_ROWS: usize = 32;

/// Query rows per tile: their scores take `TILE_ROWS × keys` floats of scratch.
const TILE_ROWS: usize = 64;

/// One task: the group of KV head `kv_head` for query rows `rows`, in tiles when the rows
/// are a tile of one sequence, one row otherwise.
#[derive(Clone, Copy)]
struct Task {
    rows: (usize, usize),
    kv_head: usize,
    tiled: bool,
}

thread_local! {
    /// Gathered keys, gathered values and a tile's scores, reused across tasks.
    static SCRATCH: RefCell<[Vec<f32>; 3]> = const { RefCell::new([Vec::new(), Vec::new(), Vec::new()]) };
}

pub(super) fn flash_attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    meta: &AttentionMeta,
    p: &AttentionParams,
) -> Result<Tensor> {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    let step = Step::read("flash_attention", q, (k_cache, v_cache), meta, p)?;
    if step.cu.windows(2).all(|w| ((w[1] - w[0]) as usize) < MIN_TILED_ROWS) {
        return Ok(attend_rows(&step, p));
    }
    let (t, cu, rows, qs, cache) = (step.t, &step.cu, &step.rows, &step.qs, step.cache(p));
    let mut tasks = Vec::new();
    for w in cu.windows(2) {
        let (start, end) = (w[0] as usize, w[1] as usize);
        let tiled = end - start >= MIN_TILED_ROWS;
        let stride = if tiled { TILE_ROWS } else { 1 };
        for first in (start..end).step_by(stride) {
            let rows = (first, (first + stride).min(end));
            tasks.extend((0..hkv).map(|kv_head| Task { rows, kv_head, tiled }));
        }
    }
    let group = h / hkv;
    let mut out = vec![0f32; t * h * d];
    let dst = super::Disjoint(out.as_mut_ptr());
    SpinPool::global().run(tasks.len(), &|i| {
        let task = tasks[i];
        let dst = &dst;
        if task.tiled {
            // SAFETY: `out` holds `t · h · d` floats and outlives the job; this task alone
            // writes the heads of its KV head for its rows.
            unsafe { attend_tile(&cache, &rows[task.rows.0..task.rows.1], task, qs, dst.0, p) };
        } else {
            let at = (task.rows.0 * hkv + task.kv_head) * group * d;
            // SAFETY: as above; the group's heads of one row are contiguous.
            let o = unsafe { std::slice::from_raw_parts_mut(dst.0.add(at), group * d) };
            cache.attend_row(rows[task.rows.0], task.kv_head, &qs[at..at + group * d], o, p);
        }
    });
    Ok(f32_tensor(out, &[t, h, d]))
}

/// The heads of `task.kv_head` for the consecutive query rows `rows` of one sequence.
///
/// # Safety
/// `out` must address the step's `[t, h, d]` output, of which no other thread touches these
/// rows' heads of this KV head during the call.
unsafe fn attend_tile(
    cache: &PagedKv<'_>,
    rows: &[QueryRow],
    task: Task,
    qs: &[f32],
    out: *mut f32,
    p: &AttentionParams,
) {
    let (h, d) = (p.num_heads, p.head_dim);
    let group = h / p.num_kv_heads;
    let (seq, first_pos, last_pos) = (rows[0].seq, rows[0].pos, rows[rows.len() - 1].pos);
    let first = first_key(first_pos, p);
    let n = last_pos + 1 - first;
    SCRATCH.with_borrow_mut(|[keys, values, scores]| {
        keys.resize(n * d, 0.0);
        values.resize(n * d, 0.0);
        scores.resize(rows.len() * n, 0.0);
        for j in 0..n {
            let at = cache.offset(seq, task.kv_head, first + j);
            keys[j * d..(j + 1) * d].copy_from_slice(&cache.ks[at..at + d]);
            values[j * d..(j + 1) * d].copy_from_slice(&cache.vs[at..at + d]);
        }
        let mut sums = [0f32; TILE_ROWS];
        for head in task.kv_head * group..(task.kv_head + 1) * group {
            let q0 = (task.rows.0 * h + head) * d;
            // scores = scale · Q Kᵀ: Q's rows are `h · d` apart, Kᵀ is read column-major
            // from the gathered key rows.
            // SAFETY: every operand lies inside its buffer: `rows.len()` query rows of `d`
            // from `q0`, `n` key rows, `rows.len() × n` scores.
            unsafe {
                gemm::gemm(
                    rows.len(),
                    n,
                    d,
                    scores.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    qs[q0..].as_ptr(),
                    1,
                    (h * d) as isize,
                    keys.as_ptr(),
                    d as isize,
                    1,
                    0.0,
                    p.scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            for ((row, s), sum) in rows.iter().zip(scores.chunks_exact_mut(n)).zip(&mut sums) {
                let (lo, hi) = (first_key(row.pos, p) - first, row.pos + 1 - first);
                s[..lo].fill(0.0);
                s[hi..].fill(0.0);
                *sum = softmax_weights(&mut s[lo..hi], p.softcap);
            }
            // out = weights · V into the head's rows, then each row over its sum.
            let o = out.wrapping_add(q0);
            // SAFETY: the caller owns these rows' vectors of `head`; `rows.len() × n`
            // weights and `n` value rows of `d`.
            unsafe {
                gemm::gemm(
                    rows.len(),
                    d,
                    n,
                    o,
                    1,
                    (h * d) as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    n as isize,
                    values.as_ptr(),
                    1,
                    d as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
                for (i, sum) in sums[..rows.len()].iter().enumerate() {
                    let row = std::slice::from_raw_parts_mut(o.add(i * h * d), d);
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|x| *x *= inv);
                }
            }
        }
    });
}

/// Turns one row's visible scores into unnormalised softmax weights (after the soft-cap,
/// if any), returning their sum.
fn softmax_weights(scores: &mut [f32], softcap: Option<f32>) -> f32 {
    if let Some(cap) = softcap {
        scores.iter_mut().for_each(|x| *x = cap * (*x / cap).tanh());
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    scores.iter_mut().for_each(|x| *x -= max);
    exp_in_place(scores);
    scores.iter().sum()
}
