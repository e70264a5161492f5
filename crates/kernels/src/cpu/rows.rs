//! How a CPU matmul's `[m, n]` products are shared out over the spinning pool: runs of
//! weight rows, each computed for every activation row by a product function.
//!
//! Every matmul of the CPU backend computes the result of an (activation row, weight row)
//! pair with a function of those two rows alone ([`crate::quant::dot_f32_rows`],
//! [`crate::quant::PackedQuant::dot_rows_many`], [`crate::quant::PackedQuant::dot_rows_q8`]).
//! This module only decides which pairs a task computes, so a row's output is the same bit
//! for bit whatever the number of rows in the step, the row's place among them and the
//! number of threads: a sequence's logits never depend on its batch-mates or on how its
//! prompt was chunked.
//!
//! Few activation rows (decode) take a few long runs per thread ([`fused`]), many rows
//! (prefill) tiles of [`TILE`] weight rows, so a tile stays in cache while every
//! activation row reads it ([`tiled`]).

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Mutex;

use super::Disjoint;
use super::pool::SpinPool;

/// At or above this many activation rows, products are computed in tiles of [`TILE`]
/// weight rows rather than in a few long runs per thread.
pub(super) const MANY_ROWS: usize = 32;

/// Weight rows of a tile of [`tiled`].
pub(super) const TILE: usize = 64;

/// Writes `[m, run.len()]` results: activation row `i` against weight row `run.start + j`
/// at `i · run.len() + j`.
pub(super) type Dot<'a> = dyn Fn(Range<usize>, &mut [f32]) + Sync + 'a;

/// The `[m, n]` products `dot` computes, scheduled as the row count suits.
pub(super) fn products(n: usize, m: usize, dot: &Dot<'_>) -> Vec<f32> {
    if m >= MANY_ROWS { tiled(n, m, dot) } else { fused(n, m, dot) }
}

/// Runs of output rows per pool thread in a fused product: enough that a thread which
/// stalls leaves most of its share to the others, few enough that claiming stays cheap.
const RUNS_PER_THREAD: usize = 2;

/// The fewest output rows in one run.
const MIN_RUN: usize = 64;

/// `[m, n]` products over runs of weight rows shared out by the spinning pool, a few per
/// thread: a decode step runs hundreds of these products back to back, too short to pay
/// for waking parked threads, and a thread that loses its core for a while leaves its runs
/// to the others.
pub(super) fn fused(n: usize, m: usize, dot: &Dot<'_>) -> Vec<f32> {
    let pool = SpinPool::global();
    let chunks = (pool.parts() * RUNS_PER_THREAD).min(n.div_ceil(MIN_RUN)).max(1);
    let per = n.div_ceil(chunks).max(1);
    let run_of = |chunk: usize| (chunk * per).min(n)..((chunk + 1) * per).min(n);
    if m == 1 {
        // One activation row: each run's results are a contiguous slice of the output, so
        // they are written in place.
        let mut out = vec![0f32; n];
        pool.run_pieces(&mut out, per, &|chunk, o| dot(run_of(chunk), o));
        return out;
    }
    let slots: Vec<Mutex<Vec<f32>>> = (0..chunks).map(|_| Mutex::new(Vec::new())).collect();
    pool.run(chunks, &|chunk| {
        let run = run_of(chunk);
        let mut out = vec![0f32; m * run.len()];
        if !run.is_empty() {
            dot(run.clone(), &mut out);
        }
        *slots[chunk].lock().unwrap_or_else(|e| e.into_inner()) = out;
    });
    let parts: Vec<(Range<usize>, Vec<f32>)> = slots
        .into_iter()
        .enumerate()
        .map(|(chunk, slot)| (run_of(chunk), slot.into_inner().unwrap_or_else(|e| e.into_inner())))
        .collect();
    assemble(parts, m, n)
}

/// Places per-run `[m, run]` results into a row-major `[m, n]` output.
fn assemble(parts: Vec<(Range<usize>, Vec<f32>)>, m: usize, n: usize) -> Vec<f32> {
    if let [(r, _)] = &parts[..]
        && (r.len() == n || m == 1)
    {
        return parts.into_iter().next().expect("one part").1;
    }
    let mut out = vec![0f32; m * n];
    for (run, part) in parts {
        for (i, row) in part.chunks_exact(run.len().max(1)).enumerate() {
            out[i * n + run.start..i * n + run.end].copy_from_slice(row);
        }
    }
    out
}

thread_local! {
    /// A tile's `[m, TILE]` results, kept per thread so prefill products do not allocate
    /// (and fault in) fresh ones per task.
    static TILE_OUT: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `[m, n]` products in tiles of [`TILE`] weight rows, one task each, written straight
/// into the output's columns.
pub(super) fn tiled(n: usize, m: usize, dot: &Dot<'_>) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    let dst = Disjoint(out.as_mut_ptr());
    SpinPool::global().run(n.div_ceil(TILE), &|t| {
        let run = t * TILE..((t + 1) * TILE).min(n);
        let dst = &dst;
        TILE_OUT.with_borrow_mut(|part| {
            part.resize(m * run.len(), 0.0);
            dot(run.clone(), part);
            for (i, row) in part.chunks_exact(run.len()).enumerate() {
                // SAFETY: `out` holds `m · n` floats and outlives the pool's job; this task
                // alone writes the columns `run` of every row.
                unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), dst.0.add(i * n + run.start), run.len()) };
            }
        });
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A product function whose every result names its pair.
    fn label(m: usize) -> impl Fn(Range<usize>, &mut [f32]) + Sync {
        move |run: Range<usize>, out: &mut [f32]| {
            for i in 0..m {
                for (j, r) in run.clone().enumerate() {
                    out[i * run.len() + j] = (i * 1000 + r) as f32;
                }
            }
        }
    }

    /// Both schedules put every pair's result at its place, with a last tile or run
    /// shorter than the others.
    #[test]
    fn both_schedules_place_every_pair() {
        for (m, n) in [(1, 70), (3, 130), (40, TILE + 6), (33, 5)] {
            for (name, got) in [("fused", fused(n, m, &label(m))), ("tiled", tiled(n, m, &label(m)))] {
                for i in 0..m {
                    for j in 0..n {
                        assert_eq!(got[i * n + j], (i * 1000 + j) as f32, "{name} m={m} n={n} ({i},{j})");
                    }
                }
            }
        }
    }
}
