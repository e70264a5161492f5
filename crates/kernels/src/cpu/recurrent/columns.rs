//! The delta rule's recurrence over a run of value columns of one head, row by row:
//!
//! `S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k ⊗ δ;  o = Sᵀq`
//!
//! Column `c` of `S [d_k, d_v]` needs only `δ_c`, `v_c` and the row's `q`, `k`, `e^g` and
//! `β`, so columns are independent and a task can take any run of them. It walks them in
//! blocks of [`WIDEST`] columns (AVX-512) or 16, and walks every row of its sequence over
//! one block before the next, in a contiguous copy of the block's `d_k × 32` slice of the
//! state (16 KiB at `d_k` = 128) that stays in L1 from row to row. A step of one row (a
//! decode step) instead runs whole rows of the task's columns in the pool's order
//! (`run_row`), so that states streamed from memory are read in order.
//!
//! **Invariant (bitwise):** every element is the result of the same operations in the same
//! order whatever the batch, the step the row arrives in, the columns of the task, the block
//! width (a block of 16 or a lone column) or the SIMD level: `Sᵀk` and `Sᵀq` are sums over
//! `d_k` from first to last by fused multiply-adds from zero, and each state element is
//! `k_r · δ_c + e^g · S_rc`, fused. (Without hardware FMA the portable build calls libm's
//! `fmaf`: slower, the same bits.)
//!
//! One pass over the state per row: the pass that updates `S` with row `i` (reading `Sᵀq_i`)
//! also sums `Sᵀk_{i+1}` over the new `S` for the row after it, with the operations a pass of
//! its own would use; only the first row of a step reads `Sᵀk` in a pass of its own.

use std::ops::Range;

use crate::check::SeqRun;
use crate::quant::SimdLevel;

use super::delta::{Prepared, Sink};

/// Columns per block of the AVX-512 build: two vectors per row, so that each of the two
/// sums a row pass carries has two independent chains to hide the multiply-add latency.
pub(super) const WIDEST: usize = 32;

/// Columns per block of the AVX2 and portable builds (two AVX2 vectors), and of the
/// AVX-512 build's last block of a head that is not a multiple of [`WIDEST`].
const NARROW: usize = 16;

/// Runs columns `cols` of head `j` of sequence `run` over all its rows at SIMD `level`.
///
/// # Safety
/// This task alone touches columns `cols` of head `j` of `run`'s output rows, of its slot and
/// of its snapshot slots, all inside `sink`'s buffers; `level` is at most the CPU's.
pub(super) unsafe fn run(
    prep: &Prepared<'_>,
    run: &SeqRun,
    j: usize,
    cols: Range<usize>,
    sink: &Sink,
    level: SimdLevel,
) {
    #[cfg(target_arch = "x86_64")]
    match level {
        // SAFETY: the CPU has the level's features (the caller guarantees); the rest as ours.
        SimdLevel::Avx512 => return unsafe { run_512(prep, run, j, cols, sink) },
        // SAFETY: as above.
        SimdLevel::Avx2 => return unsafe { run_256(prep, run, j, cols, sink) },
        SimdLevel::None => {}
    }
    let _ = level;
    // SAFETY: as our caller guarantees.
    unsafe { run_body::<NARROW>(prep, run, j, cols, sink) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run_512(prep: &Prepared<'_>, run: &SeqRun, j: usize, cols: Range<usize>, sink: &Sink) {
    // SAFETY: as our caller guarantees.
    unsafe { run_body::<WIDEST>(prep, run, j, cols, sink) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_256(prep: &Prepared<'_>, run: &SeqRun, j: usize, cols: Range<usize>, sink: &Sink) {
    // SAFETY: as our caller guarantees.
    unsafe { run_body::<NARROW>(prep, run, j, cols, sink) }
}

/// The task: one row by [`run_row`]; more, its columns cut into blocks of `W`, then of
/// [`NARROW`], then single columns, each block run over every row in a copy of its own.
#[inline(always)]
unsafe fn run_body<const W: usize>(prep: &Prepared<'_>, run: &SeqRun, j: usize, cols: Range<usize>, sink: &Sink) {
    let (_, _, dk, dv) = prep.dims();
    // A sequence without a slot starts from zero and keeps nothing.
    let mut own = Vec::new();
    let state = match run.slot {
        Some(slot) => sink.state(slot, j),
        None => {
            own.resize(dk * dv, 0.0);
            own.as_mut_ptr()
        }
    };
    if run.end - run.start == 1 {
        // SAFETY: as our caller guarantees, `state` being head `j`'s.
        return unsafe { run_row(prep, run, (j, cols), state, sink) };
    }
    // A block works in a contiguous copy over its rows: `d_k` rows `d_v` apart in the pool
    // fall in a few cache sets (at 128 × 128, 8 of L1's 64) and would not stay in L1.
    let mut tile = vec![0f32; dk * W];
    for (c, n) in blocks::<W>(cols.len()) {
        let home = Block { ptr: state.wrapping_add(cols.start + c), stride: dv, rows: dk };
        let s = Block { ptr: tile.as_mut_ptr(), stride: n, rows: dk };
        let at = (j, cols.start + c);
        // SAFETY: the block's columns of head `j` are this task's alone (our caller) and
        // `state` addresses head `j`'s `d_k × d_v` floats; the tile is the task's own and
        // holds `d_k × n` floats.
        unsafe {
            if n == W {
                run_block::<W>(prep, run, at, (home, s), sink);
            } else if n == NARROW {
                run_block::<NARROW>(prep, run, at, (home, s), sink);
            } else {
                run_block::<1>(prep, run, at, (home, s), sink);
            }
        }
    }
}

/// A run of one row (a decode step) over the task's columns in the pool's own order: a pass
/// over `S` reading `Sᵀk`, then one updating `S` and reading `Sᵀq`, each over whole rows of
/// the task's columns, so that states streamed from memory are read in order. Each element
/// takes the operations [`run_block`] gives it, so a row decoded gives the bits it gives in
/// a prompt.
///
/// # Safety
/// As [`run`]; `state` addresses head `j`'s `d_k × d_v` floats.
#[inline(always)]
unsafe fn run_row(prep: &Prepared<'_>, run: &SeqRun, (j, cols): (usize, Range<usize>), state: *mut f32, sink: &Sink) {
    let (_, _, dk, dv) = prep.dims();
    let (row, n) = (run.start, cols.len());
    // SAFETY: row `r < d_k` of head `j`'s state, the task's columns of it (our caller).
    let s_row = |r: usize| unsafe { std::slice::from_raw_parts_mut(state.add(r * dv + cols.start), n) };
    let (decay, beta) = prep.gates(row, j);
    let (q, k) = prep.qk(row, j);
    let mut sk = vec![0f32; n];
    for (r, &kr) in k.iter().enumerate().take(dk) {
        for (a, &x) in sk.iter_mut().zip(s_row(r).iter()) {
            *a = kr.mul_add(x, *a);
        }
    }
    let v = &prep.v(row, j)[cols.clone()];
    let delta: Vec<f32> = sk.iter().zip(v).map(|(&sk, &v)| beta * (-decay).mul_add(sk, v)).collect();
    // SAFETY: head `j`'s output of the row, the task's columns of it (our caller).
    let o = unsafe { std::slice::from_raw_parts_mut(sink.out(row, j).add(cols.start), n) };
    o.fill(0.0);
    for (r, (&qr, &kr)) in q.iter().zip(k).enumerate().take(dk) {
        for ((x, &d), o) in s_row(r).iter_mut().zip(&delta).zip(o.iter_mut()) {
            *x = kr.mul_add(d, decay * *x);
            *o = qr.mul_add(*x, *o);
        }
    }
    for &(_, slot) in &run.snapshots {
        let to = sink.state(slot, j);
        for r in 0..dk {
            // SAFETY: the snapshot slot's head `j`, the task's columns of it (our caller).
            unsafe { std::slice::from_raw_parts_mut(to.add(r * dv + cols.start), n) }.copy_from_slice(s_row(r));
        }
    }
}

/// `(first column, width)` of each block of `cols` columns: widths `W`, then [`NARROW`],
/// then 1.
fn blocks<const W: usize>(cols: usize) -> Vec<(usize, usize)> {
    let (wide, narrow) = (cols / W * W, (cols % W) / NARROW * NARROW);
    let by = |range: Range<usize>, n: usize| range.step_by(n).map(move |c| (c, n));
    by(0..wide, W).chain(by(wide..wide + narrow, NARROW)).chain(by(wide + narrow..cols, 1)).collect()
}

/// Every row of `run` over the `N` columns from `c` of head `j`, whose values lie in `home`,
/// worked on in the copy `s`: outputs written, snapshots copied to the pool after their
/// rows, the state copied back at the end.
///
/// # Safety
/// As [`run`], for these columns; `home` is `d_k × N` floats of head `j`'s state, `s` as
/// many of the task's own.
#[inline(always)]
unsafe fn run_block<const N: usize>(
    prep: &Prepared<'_>,
    run: &SeqRun,
    (j, c): (usize, usize),
    (home, s): (Block, Block),
    sink: &Sink,
) {
    // SAFETY: `home` and `s` as our caller guarantees.
    unsafe { home.copy_to::<N>(&s) };
    // SAFETY: (every block access here) `s` is the task's own; the snapshot blocks are
    // `d_k` rows of `N` columns of head `j`'s snapshot slots, this task's alone (our
    // caller), and the output is head `j` of a row of the sequence.
    let mut sk = unsafe { s.dot::<N>(prep.qk(run.start, j).1) };
    let mut snapshots = run.snapshots.iter().peekable();
    for row in run.start..run.end {
        let (decay, beta) = prep.gates(row, j);
        let v = &prep.v(row, j)[c..c + N];
        let delta: [f32; N] = std::array::from_fn(|i| beta * (-decay).mul_add(sk[i], v[i]));
        let (q, k) = prep.qk(row, j);
        let o = if row + 1 < run.end {
            // SAFETY: as above.
            let (o, next) = unsafe { s.update::<N, true>((q, k, prep.qk(row + 1, j).1), decay, &delta) };
            sk = next;
            o
        } else {
            // SAFETY: as above.
            unsafe { s.update::<N, false>((q, k, k), decay, &delta) }.0
        };
        // SAFETY: as above.
        unsafe { sink.out(row, j).add(c).cast::<[f32; N]>().write_unaligned(o) };
        while let Some(&(_, slot)) = snapshots.next_if(|&&(rows, _)| run.start + rows == row + 1) {
            let to = Block { ptr: sink.state(slot, j).wrapping_add(c), ..home };
            // SAFETY: as above; a snapshot slot is none of the step's other slots.
            unsafe { s.copy_to::<N>(&to) };
        }
    }
    // SAFETY: as above.
    unsafe { s.copy_to::<N>(&home) };
}

/// `rows` rows of a block of columns, `stride` floats apart, from `ptr`.
#[derive(Clone, Copy)]
struct Block {
    ptr: *mut f32,
    stride: usize,
    rows: usize,
}

impl Block {
    /// Row `r`'s `N` columns.
    #[inline(always)]
    fn at<const N: usize>(&self, r: usize) -> *mut [f32; N] {
        self.ptr.wrapping_add(r * self.stride).cast()
    }

    /// `Sᵀk` over these columns.
    ///
    /// # Safety
    /// The block's `rows × N` floats are readable; `k` has `rows` values.
    #[inline(always)]
    unsafe fn dot<const N: usize>(&self, k: &[f32]) -> [f32; N] {
        let mut acc = [0f32; N];
        for (r, &kr) in k.iter().enumerate().take(self.rows) {
            // SAFETY: row `r < rows` of the block (the caller).
            let x = unsafe { self.at::<N>(r).read_unaligned() };
            for (a, &x) in acc.iter_mut().zip(&x) {
                *a = kr.mul_add(x, *a);
            }
        }
        acc
    }

    /// One row's pass: `S ← e^g S + k ⊗ δ` over these columns, returning `Sᵀq` and (with
    /// `NEXT`) `Sᵀk_next` of the new `S`.
    ///
    /// # Safety
    /// The block's `rows × N` floats are readable and writable by this task alone; `q`, `k`
    /// and `k_next` have `rows` values.
    #[inline(always)]
    unsafe fn update<const N: usize, const NEXT: bool>(
        &self,
        (q, k, k_next): (&[f32], &[f32], &[f32]),
        decay: f32,
        delta: &[f32; N],
    ) -> ([f32; N], [f32; N]) {
        let (mut o, mut sk) = ([0f32; N], [0f32; N]);
        for (r, ((&qr, &kr), &nr)) in q.iter().zip(k).zip(k_next).enumerate().take(self.rows) {
            let at = self.at::<N>(r);
            // SAFETY: row `r < rows` of the block (the caller).
            let mut x = unsafe { at.read_unaligned() };
            for i in 0..N {
                x[i] = kr.mul_add(delta[i], decay * x[i]);
                o[i] = qr.mul_add(x[i], o[i]);
                if NEXT {
                    sk[i] = nr.mul_add(x[i], sk[i]);
                }
            }
            // SAFETY: as above.
            unsafe { at.write_unaligned(x) };
        }
        (o, sk)
    }

    /// Copies these columns into `to`'s.
    ///
    /// # Safety
    /// Both blocks' `rows × N` floats are valid, `to`'s writable and distinct from ours.
    #[inline(always)]
    unsafe fn copy_to<const N: usize>(&self, to: &Block) {
        for r in 0..self.rows {
            // SAFETY: as the caller guarantees.
            unsafe { to.at::<N>(r).write_unaligned(self.at::<N>(r).read_unaligned()) };
        }
    }
}
