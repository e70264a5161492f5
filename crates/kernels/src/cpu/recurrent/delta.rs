//! The gated delta rule on the CPU, one task per (sequence, value head).
//!
//! A task walks its sequence's rows in segments that end at the sequence's snapshot rows
//! (and its last row), so that the state after each snapshot row exists to be copied out.
//! A segment of at least [`CHUNKED_MIN_ROWS`] rows runs in the chunked (WY) form of
//! `chunked.rs`, 64 rows at a time; a shorter one (a decode step, a draft of two or three) runs
//! the plain recurrence row by row. Either way the state is updated in place in the pool,
//! which holds `[slots, h_v, d_k, d_v]`, so a decode step reads and writes each state once.

use crate::Tensor;
use crate::backend::{DeltaRule, RecurrentBatch};
use crate::check::SeqRun;
use crate::cpu::Disjoint;
use crate::cpu::pool::SpinPool;
use crate::error::Result;

use super::chunked::{self, ChunkScratch};
use super::{f32_tensor, read_f32, read_runs, sigmoid, write_f32};

const OP: &str = "gated_delta_rule";

/// Segments at least this long run in the chunked form. The recurrence passes over `S`
/// twice a row, a chunk three times whatever its length (and its products are GEMMs): at a
/// Qwen3.5-like layer (32 heads of 128²) 128 rows as 32 sequences of 4 took 27-29 ms
/// chunked against 39-44 ms row by row, 16 sequences of 8 took 18-20 ms against 37-49 ms
/// (`benches/recurrent.rs` with these step shapes, two alternating runs on two cores).
pub(super) const CHUNKED_MIN_ROWS: usize = 4;

/// The operands of one step, read on the host.
pub(super) struct Operands<'a> {
    qkv: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    a_log: &'a [f32],
    dt_bias: &'a [f32],
    /// `h_k, h_v, d_k, d_v`.
    pub(super) dims: (usize, usize, usize, usize),
}

impl Operands<'_> {
    /// Row `row`'s query, key and value as value head `j` reads them.
    pub(super) fn qkv(&self, row: usize, j: usize) -> (&[f32], &[f32], &[f32]) {
        let (hk, hv, dk, dv) = self.dims;
        let r = &self.qkv[row * (2 * hk * dk + hv * dv)..][..2 * hk * dk + hv * dv];
        let i = j / (hv / hk);
        (&r[i * dk..][..dk], &r[(hk + i) * dk..][..dk], &r[2 * hk * dk + j * dv..][..dv])
    }

    /// Row `row`'s log-decay `g` and write strength `β` for value head `j`.
    pub(super) fn gates(&self, row: usize, j: usize) -> (f32, f32) {
        let at = row * self.dims.1 + j;
        (-self.a_log[j].exp() * softplus(self.a[at] + self.dt_bias[j]), sigmoid(self.b[at]))
    }

    /// The query (scaled by `d_k^-½`) and key of row `row`, L2-normalised into `q` and `k`.
    pub(super) fn normalized_qk(&self, row: usize, j: usize, q: &mut [f32], k: &mut [f32]) {
        let (qr, kr, _) = self.qkv(row, j);
        l2_normalize(qr, 1.0 / (self.dims.2 as f32).sqrt(), q);
        l2_normalize(kr, 1.0, k);
    }
}

/// `ln(1 + e^x)`, and `x` itself above 20 as torch's `softplus` (threshold 20) does.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `x · scale / √(Σx² + 1e-6)` into `out`.
#[inline(always)]
fn l2_normalize(x: &[f32], scale: f32, out: &mut [f32]) {
    let inv = scale / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

pub(crate) fn gated_delta_rule(
    qkv: &Tensor,
    a: &Tensor,
    b: &Tensor,
    rule: &DeltaRule<'_>,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
) -> Result<Tensor> {
    gated_delta_rule_by((qkv, a, b), rule, state, batch, CHUNKED_MIN_ROWS)
}

/// [`gated_delta_rule`] with segments of at least `chunked_from` rows in the chunked form
/// (tests force either path with 1 and `usize::MAX`).
pub(super) fn gated_delta_rule_by(
    (qkv, a, b): (&Tensor, &Tensor, &Tensor),
    rule: &DeltaRule<'_>,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
    chunked_from: usize,
) -> Result<Tensor> {
    let (t, capacity) = crate::check::gated_delta_rule((qkv, a, b), rule, state, batch)?;
    let runs = read_runs(OP, batch, t, capacity)?;
    let (xs, as_, bs) = (read_f32(OP, qkv)?, read_f32(OP, a)?, read_f32(OP, b)?);
    let (a_log, dt_bias) = (read_f32(OP, rule.a_log)?, read_f32(OP, rule.dt_bias)?);
    let dims = (rule.num_key_heads, rule.num_value_heads, rule.key_dim, rule.value_dim);
    let ops = Operands { qkv: &xs, a: &as_, b: &bs, a_log: &a_log, dt_bias: &dt_bias, dims };
    let mut pool = write_f32(OP, state)?;
    let mut out = vec![0f32; t * dims.1 * dims.3];
    let tasks: Vec<(usize, usize)> = (0..runs.len()).flat_map(|s| (0..dims.1).map(move |j| (s, j))).collect();
    let sink = Sink { out: Disjoint(out.as_mut_ptr()), pool: Disjoint(pool.as_mut_ptr()) };
    SpinPool::global().run(tasks.len(), &|i| {
        let (seq, j) = tasks[i];
        // SAFETY: `out` is `[t, h_v, d_v]` and the pool `[capacity, h_v, d_k, d_v]`, both
        // outliving the job; `check::recurrent_runs` made every slot this step writes
        // distinct and inside the pool, so the task for (sequence, head j) alone touches
        // head j of its sequence's rows and of its slot and snapshot slots.
        unsafe { run_head(&ops, &runs[seq], j, &sink, chunked_from) };
    });
    Ok(f32_tensor(out, &[t, dims.1, dims.3]))
}

/// The output `[t, h_v, d_v]` and the state pool, shared by the tasks of one step.
pub(super) struct Sink {
    out: Disjoint,
    pool: Disjoint,
}

impl Sink {
    /// Head `j`'s output at row `row` and the stride between its rows.
    pub(super) fn out_at(&self, ops: &Operands<'_>, row: usize, j: usize) -> (*mut f32, usize) {
        let (_, hv, _, dv) = ops.dims;
        (self.out.0.wrapping_add((row * hv + j) * dv), hv * dv)
    }

    /// Head `j`'s state `[d_k, d_v]` at `slot`.
    ///
    /// # Safety
    /// `slot` is inside the pool and no other live slice covers head `j` of `slot`.
    #[allow(clippy::mut_from_ref)]
    unsafe fn state(&self, ops: &Operands<'_>, slot: usize, j: usize) -> &mut [f32] {
        let (_, hv, dk, dv) = ops.dims;
        // SAFETY: as the caller guarantees.
        unsafe { std::slice::from_raw_parts_mut(self.pool.0.add((slot * hv + j) * dk * dv), dk * dv) }
    }
}

/// Runs head `j` of sequence `run` over its segments, copying snapshots out between them.
///
/// # Safety
/// As in `gated_delta_rule_by`: this task alone touches head `j` of `run`'s rows and slots.
unsafe fn run_head(ops: &Operands<'_>, run: &SeqRun, j: usize, sink: &Sink, chunked_from: usize) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx2 {
        // SAFETY: the level is at least AVX2, so the CPU has AVX2; the rest as our caller.
        return unsafe { run_head_avx2(ops, run, j, sink, chunked_from) };
    }
    // SAFETY: as our caller guarantees.
    unsafe { run_head_body(ops, run, j, sink, chunked_from) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn run_head_avx2(ops: &Operands<'_>, run: &SeqRun, j: usize, sink: &Sink, chunked_from: usize) {
    // SAFETY: as our caller guarantees.
    unsafe { run_head_body(ops, run, j, sink, chunked_from) }
}

#[inline(always)]
unsafe fn run_head_body(ops: &Operands<'_>, run: &SeqRun, j: usize, sink: &Sink, chunked_from: usize) {
    let (_, _, dk, dv) = ops.dims;
    let mut no_slot = Vec::new();
    let s = match run.slot {
        // SAFETY: this task alone touches head `j` of the sequence's slot.
        Some(slot) => unsafe { sink.state(ops, slot, j) },
        // A sequence without a slot starts from zero and keeps nothing.
        None => {
            no_slot.resize(dk * dv, 0.0);
            &mut no_slot[..]
        }
    };
    let mut scratch = None;
    let mut done = 0;
    let ends = run.snapshots.iter().map(|&(rows, slot)| (rows, Some(slot))).chain([(run.end - run.start, None)]);
    for (end, snapshot) in ends {
        let rows = run.start + done..run.start + end;
        if rows.len() >= chunked_from {
            let scratch = scratch.get_or_insert_with(|| ChunkScratch::new(ops.dims));
            for first in rows.clone().step_by(chunked::CHUNK) {
                let chunk = first..(first + chunked::CHUNK).min(rows.end);
                // SAFETY: this task alone writes head `j` of these rows.
                unsafe { chunked::run_chunk(ops, (chunk, j), s, sink, scratch) };
            }
        } else {
            // SAFETY: as above.
            unsafe { run_rows(ops, (rows, j), s, sink) };
        }
        if let Some(slot) = snapshot {
            // SAFETY: snapshot slots are distinct from every slot the step reads or writes.
            unsafe { sink.state(ops, slot, j) }.copy_from_slice(s);
        }
        done = end;
    }
}

/// The plain recurrence over `rows` for head `j`, state `s [d_k, d_v]` updated in place.
///
/// # Safety
/// This task alone writes head `j` of `rows` of the output.
#[inline(always)]
unsafe fn run_rows(ops: &Operands<'_>, (rows, j): (std::ops::Range<usize>, usize), s: &mut [f32], sink: &Sink) {
    let (_, _, dk, dv) = ops.dims;
    let (mut q, mut k, mut delta) = (vec![0f32; dk], vec![0f32; dk], vec![0f32; dv]);
    for row in rows {
        ops.normalized_qk(row, j, &mut q, &mut k);
        let (g, beta) = ops.gates(row, j);
        // SAFETY: head `j` of `row` is `d_v` floats of the output that this task alone writes.
        let o = unsafe { std::slice::from_raw_parts_mut(sink.out_at(ops, row, j).0, dv) };
        recurrent_row(s, (&q, &k, ops.qkv(row, j).2), (g.exp(), beta), o, &mut delta);
    }
}

/// One row of the recurrence: `S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k ⊗ δ;  o = Sᵀq`,
/// with the decay folded into the two passes over `S` (one reads `Sᵀk`, one updates `S`
/// and reads `Sᵀq`). `delta` is scratch of `d_v`.
#[inline(always)]
fn recurrent_row(
    s: &mut [f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    (decay, beta): (f32, f32),
    o: &mut [f32],
    delta: &mut [f32],
) {
    let dv = v.len();
    delta.fill(0.0);
    for (row, &kr) in s.chunks_exact(dv).zip(k) {
        for (d, &x) in delta.iter_mut().zip(row) {
            *d += kr * x;
        }
    }
    for (d, &x) in delta.iter_mut().zip(v) {
        *d = beta * (x - decay * *d);
    }
    o.fill(0.0);
    for ((row, &kr), &qr) in s.chunks_exact_mut(dv).zip(k).zip(q) {
        for ((x, &d), o) in row.iter_mut().zip(delta.iter()).zip(o.iter_mut()) {
            *x = decay * *x + kr * d;
            *o += qr * *x;
        }
    }
}
