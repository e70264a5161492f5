//! The chunked (WY) form of the gated delta rule, after transformers'
//! `torch_chunk_gated_delta_rule`: up to [`CHUNK`] rows of one head at a time.
//!
//! With `γ_i` the running sum of the chunk's log-decays (kept in f64, so that the decay
//! between two close rows of a long, strongly decaying chunk keeps f32 precision),
//! `D_ij = e^(γ_i − γ_j)`, `Γ_i = e^(γ_i)` and `S` the state before the chunk, the
//! recurrence's corrections `δ_i = β_i (v_i − S_{i−1}ᵀ k_i)` solve the unit lower
//! triangular system `δ_i + Σ_{j<i} β_i D_ij (k_i·k_j) δ_j = β_i v_i − β_i Γ_i Sᵀk_i`,
//! so `δ = U − W S` with `U, W` the solutions for right-hand sides `β v` and `β Γ k`. Then
//! `o_i = Γ_i Sᵀq_i + Σ_{j≤i} D_ij (q_i·k_j) δ_j` and the state after the chunk is
//! `Γ_L S + Σ_j D_Lj k_j ⊗ δ_j`. Every decay factor is at most 1, so nothing overflows,
//! and the three products with `S` are GEMMs on the calling thread.

use std::ops::Range;

use super::delta::{Operands, Sink};
use crate::cpu::attention::exp_in_place;

/// Rows per chunk, as transformers and the fla kernels use.
pub(super) const CHUNK: usize = 64;

/// One task's buffers for its chunks.
pub(super) struct ChunkScratch {
    /// Normalised queries (scaled by `Γ_i` once the pairwise products are taken), `[CHUNK, d_k]`.
    q: Vec<f32>,
    /// Normalised keys, `[CHUNK, d_k]`, then scaled by `D_Lj` for the state update.
    k: Vec<f32>,
    /// Right-hand sides, solved in place: rows `[β v | β Γ k]` become `[U | W]`, and then
    /// `U` becomes `δ`. `[CHUNK, d_v + d_k]`.
    uw: Vec<f32>,
    /// `β_i D_ij (k_i·k_j)` below the diagonal (what lies on and above it is never read).
    /// `[CHUNK, CHUNK]`.
    kk: Vec<f32>,
    /// `D_ij (q_i·k_j)` on and below the diagonal, 0 above. `[CHUNK, CHUNK]`.
    qk: Vec<f32>,
    /// `γ_i`.
    gamma: Vec<f64>,
    /// `β_i`.
    beta: Vec<f32>,
    /// One row's `D_ij`.
    decay: Vec<f32>,
}

impl ChunkScratch {
    pub(super) fn new((_, _, dk, dv): (usize, usize, usize, usize)) -> Self {
        Self {
            q: vec![0.0; CHUNK * dk],
            k: vec![0.0; CHUNK * dk],
            uw: vec![0.0; CHUNK * (dv + dk)],
            kk: vec![0.0; CHUNK * CHUNK],
            qk: vec![0.0; CHUNK * CHUNK],
            gamma: vec![0.0; CHUNK],
            beta: vec![0.0; CHUNK],
            decay: vec![0.0; CHUNK],
        }
    }
}

/// Runs `rows` (at most [`CHUNK`]) of head `j` from state `s [d_k, d_v]`, which it leaves
/// as the state after the last of them.
///
/// # Safety
/// This task alone writes head `j` of `rows` of the output.
#[inline(always)]
pub(super) unsafe fn run_chunk(
    ops: &Operands<'_>,
    (rows, j): (Range<usize>, usize),
    s: &mut [f32],
    sink: &Sink,
    x: &mut ChunkScratch,
) {
    let (_, _, dk, dv) = ops.dims;
    let len = rows.len();
    debug_assert!(len > 0 && len <= CHUNK);
    load(ops, (rows.clone(), j), x);
    pairwise(x, len, dk);
    solve(x, len, dk + dv);
    let s_mat = Mat { ptr: s.as_ptr(), rs: dv, cs: 1 };
    let uw = x.uw.as_mut_ptr();
    // SAFETY: (all four products) every operand lies inside its buffer with the strides
    // given, `len ≤ CHUNK` rows; `δ` and `W` are disjoint columns of `uw`; the output rows
    // are head `j` of `rows`, this task's alone.
    unsafe {
        // δ = U − W S.
        let w = Mat { ptr: uw.add(dv), rs: dk + dv, cs: 1 };
        gemm(uw, dk + dv, (len, dv, dk), w, s_mat, Some(1.0), -1.0);
        // o = (Γ q) S + P δ.
        for (i, qi) in x.q.chunks_exact_mut(dk).take(len).enumerate() {
            let scale = x.gamma[i].exp() as f32;
            qi.iter_mut().for_each(|v| *v *= scale);
        }
        let (out, stride) = sink.out_at(ops, rows.start, j);
        let q = Mat { ptr: x.q.as_ptr(), rs: dk, cs: 1 };
        gemm(out, stride, (len, dv, dk), q, s_mat, None, 1.0);
        let (p, delta) = (Mat { ptr: x.qk.as_ptr(), rs: CHUNK, cs: 1 }, Mat { ptr: uw, rs: dk + dv, cs: 1 });
        gemm(out, stride, (len, dv, len), p, delta, Some(1.0), 1.0);
        // S ← Γ_L S + (D_L k)ᵀ δ.
        let last = x.gamma[len - 1];
        for (i, ki) in x.k.chunks_exact_mut(dk).take(len).enumerate() {
            let scale = ((last - x.gamma[i]) as f32).exp();
            ki.iter_mut().for_each(|v| *v *= scale);
        }
        let kt = Mat { ptr: x.k.as_ptr(), rs: 1, cs: dk };
        gemm(s.as_mut_ptr(), dv, (dk, dv, len), kt, delta, Some(last.exp() as f32), 1.0);
    }
}

/// Fills the normalised queries and keys, `γ`, `β` and the right-hand sides of `rows`.
#[inline(always)]
fn load(ops: &Operands<'_>, (rows, j): (Range<usize>, usize), x: &mut ChunkScratch) {
    let (_, _, dk, dv) = ops.dims;
    let mut gamma = 0f64;
    for (i, row) in rows.enumerate() {
        let (q, k) = (&mut x.q[i * dk..][..dk], &mut x.k[i * dk..][..dk]);
        ops.normalized_qk(row, j, q, k);
        let (g, beta) = ops.gates(row, j);
        gamma += f64::from(g);
        (x.gamma[i], x.beta[i]) = (gamma, beta);
        let (u, w) = x.uw[i * (dk + dv)..][..dk + dv].split_at_mut(dv);
        let bg = beta * gamma.exp() as f32;
        for (u, &v) in u.iter_mut().zip(ops.qkv(row, j).2) {
            *u = beta * v;
        }
        for (w, &k) in w.iter_mut().zip(k.iter()) {
            *w = bg * k;
        }
    }
}

/// `kk` and `qk` for the first `len` rows: the products of normalised keys and queries
/// with the keys (two GEMMs), decayed, `kk` below the diagonal (all that `solve` reads) and
/// `qk` on and below it, zero above.
#[inline(always)]
fn pairwise(x: &mut ChunkScratch, len: usize, dk: usize) {
    let kt = Mat { ptr: x.k.as_ptr(), rs: 1, cs: dk };
    // SAFETY: `q` and `k` hold `len ≤ CHUNK` rows of `d_k`, `kk` and `qk` are `[CHUNK, CHUNK]`
    // buffers of their own.
    unsafe {
        gemm(x.kk.as_mut_ptr(), CHUNK, (len, len, dk), Mat { ptr: x.k.as_ptr(), rs: dk, cs: 1 }, kt, None, 1.0);
        gemm(x.qk.as_mut_ptr(), CHUNK, (len, len, dk), Mat { ptr: x.q.as_ptr(), rs: dk, cs: 1 }, kt, None, 1.0);
    }
    for i in 0..len {
        let decay = &mut x.decay[..=i];
        for (d, &gj) in decay.iter_mut().zip(&x.gamma) {
            *d = (x.gamma[i] - gj) as f32;
        }
        exp_in_place(decay);
        let (kk, qk) = (&mut x.kk[i * CHUNK..][..i], &mut x.qk[i * CHUNK..][..len]);
        for (v, &d) in kk.iter_mut().zip(decay.iter()) {
            *v *= x.beta[i] * d;
        }
        for (v, &d) in qk.iter_mut().zip(decay.iter()) {
            *v *= d;
        }
        qk[i + 1..].fill(0.0);
    }
}

/// Forward substitution: row `i` of `uw` loses `Σ_{j<i} kk_ij · row j`, in row order.
#[inline(always)]
fn solve(x: &mut ChunkScratch, len: usize, width: usize) {
    for i in 1..len {
        let (done, rest) = x.uw.split_at_mut(i * width);
        let row = &mut rest[..width];
        for (jj, prev) in done.chunks_exact(width).enumerate() {
            let a = x.kk[i * CHUNK + jj];
            for (r, &p) in row.iter_mut().zip(prev) {
                *r -= a * p;
            }
        }
    }
}

/// A strided matrix operand of [`gemm`]: element `(r, c)` at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy)]
struct Mat {
    ptr: *const f32,
    rs: usize,
    cs: usize,
}

/// `dst [m, n] (rows dst_rs apart) = keep · dst + scale · lhs [m, k] · rhs [k, n]`, where
/// `keep = None` overwrites `dst`; on the calling thread.
///
/// # Safety
/// Every operand addresses valid f32s at its strides, `dst` writable and nothing else's
/// during the call, and `dst` overlaps neither input.
unsafe fn gemm(
    dst: *mut f32,
    dst_rs: usize,
    (m, n, k): (usize, usize, usize),
    lhs: Mat,
    rhs: Mat,
    keep: Option<f32>,
    scale: f32,
) {
    // SAFETY: as the caller guarantees; the strides are element strides of the operands.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            keep.is_some(),
            lhs.ptr,
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.ptr,
            rhs.cs as isize,
            rhs.rs as isize,
            keep.unwrap_or(0.0),
            scale,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}
