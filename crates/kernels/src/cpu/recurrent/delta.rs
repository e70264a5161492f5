//! The gated delta rule on the CPU, row by row for every row of every step, so that a
//! sequence's outputs and states are the same bits however its rows were cut into steps
//! (a whole prompt, prefill chunks, a recompute after preemption, the tail after a prefix
//! hit, a speculative verify, or decode steps of one row): issue 36.
//!
//! The step runs in two phases. First each row's normalised queries and keys (per key head)
//! and its gates (per value head) are computed once, a row at a time. Then tasks of one
//! sequence, one value head and a run of value columns walk the sequence's rows through
//! `columns.rs`: a value column of a head's state evolves by itself, so how the columns are
//! shared out among tasks changes no bit. The state pool holds `[slots, h_v, d_k, d_v]` and
//! is updated in place, with snapshots copied out as their rows pass.

use std::ops::Range;

use crate::Tensor;
use crate::backend::{DeltaRule, RecurrentBatch};
use crate::check::SeqRun;
use crate::cpu::Disjoint;
use crate::cpu::ops::for_each_row;
use crate::cpu::pool::SpinPool;
use crate::error::Result;
use crate::quant::SimdLevel;

use super::columns;
use super::{f32_tensor, read_f32, read_runs, sigmoid, write_f32};

const OP: &str = "gated_delta_rule";

/// Tasks a step aims at per thread of the pool, so that sequences of uneven length still
/// share out evenly; a step with fewer (sequence, head) pairs cuts heads into column runs.
const TASKS_PER_THREAD: usize = 8;

/// The operands of one step, read on the host.
struct Operands<'a> {
    qkv: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    a_log: &'a [f32],
    dt_bias: &'a [f32],
    /// `h_k, h_v, d_k, d_v`.
    dims: (usize, usize, usize, usize),
}

impl Operands<'_> {
    /// Row `row` of `qkv`: `q [h_k, d_k] | k [h_k, d_k] | v [h_v, d_v]`.
    fn row(&self, row: usize) -> &[f32] {
        let (hk, hv, dk, dv) = self.dims;
        &self.qkv[row * (2 * hk * dk + hv * dv)..][..2 * hk * dk + hv * dv]
    }

    /// Row `row`'s prepared values (see [`Prepared`]) into `out`.
    fn prepare(&self, row: usize, out: &mut [f32]) {
        let (hk, hv, dk, _) = self.dims;
        let r = self.row(row);
        let (q, rest) = out.split_at_mut(hk * dk);
        let (k, rest) = rest.split_at_mut(hk * dk);
        let (decay, beta) = rest.split_at_mut(hv);
        let scale = 1.0 / (dk as f32).sqrt();
        for (i, (q, k)) in q.chunks_exact_mut(dk).zip(k.chunks_exact_mut(dk)).enumerate() {
            l2_normalize(&r[i * dk..][..dk], scale, q);
            l2_normalize(&r[(hk + i) * dk..][..dk], 1.0, k);
        }
        for (j, (decay, beta)) in decay.iter_mut().zip(beta).enumerate() {
            let at = row * hv + j;
            *decay = (-self.a_log[j].exp() * softplus(self.a[at] + self.dt_bias[j])).exp();
            *beta = sigmoid(self.b[at]);
        }
    }
}

/// `ln(1 + e^x)`, and `x` itself above 20 as torch's `softplus` (threshold 20) does.
fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `x · scale / √(Σx² + 1e-6)` into `out`.
fn l2_normalize(x: &[f32], scale: f32, out: &mut [f32]) {
    let inv = scale / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * inv;
    }
}

/// Every row's query (scaled by `d_k^-½`) and key, L2-normalised, per key head, then its
/// decay `e^g` and write strength `β` per value head: `[t, 2 h_k d_k + 2 h_v]`.
pub(super) struct Prepared<'a> {
    data: Vec<f32>,
    width: usize,
    ops: &'a Operands<'a>,
}

impl<'a> Prepared<'a> {
    fn new(ops: &'a Operands<'a>, t: usize) -> Self {
        let (hk, hv, dk, _) = ops.dims;
        let width = 2 * hk * dk + 2 * hv;
        let mut data = vec![0f32; t * width];
        for_each_row(&mut data, width, |row, out| ops.prepare(row, out));
        Self { data, width, ops }
    }

    /// `h_k, h_v, d_k, d_v`.
    pub(super) fn dims(&self) -> (usize, usize, usize, usize) {
        self.ops.dims
    }

    /// The normalised query and key of row `row` that value head `j` reads.
    pub(super) fn qk(&self, row: usize, j: usize) -> (&[f32], &[f32]) {
        let (hk, hv, dk, _) = self.ops.dims;
        let (r, i) = (&self.data[row * self.width..], j / (hv / hk));
        (&r[i * dk..][..dk], &r[(hk + i) * dk..][..dk])
    }

    /// Row `row`'s decay and `β` for value head `j`.
    pub(super) fn gates(&self, row: usize, j: usize) -> (f32, f32) {
        let (hk, hv, dk, _) = self.ops.dims;
        let r = &self.data[row * self.width + 2 * hk * dk..];
        (r[j], r[hv + j])
    }

    /// Row `row`'s value for head `j`, `d_v` wide.
    pub(super) fn v(&self, row: usize, j: usize) -> &[f32] {
        let (hk, _, dk, dv) = self.ops.dims;
        &self.ops.row(row)[2 * hk * dk + j * dv..][..dv]
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
    let plan = Plan { columns_per_task: None, level: SimdLevel::current() };
    gated_delta_rule_by((qkv, a, b), rule, state, batch, plan)
}

/// How a step is shared out and built: what no output bit may depend on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    /// Value columns per task; `None` lets the step choose.
    pub(super) columns_per_task: Option<usize>,
    /// The SIMD level of the column kernels (at most the CPU's).
    pub(super) level: SimdLevel,
}

/// [`gated_delta_rule`] as `plan` says (tests force each way of sharing out the work).
pub(super) fn gated_delta_rule_by(
    (qkv, a, b): (&Tensor, &Tensor, &Tensor),
    rule: &DeltaRule<'_>,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
    plan: Plan,
) -> Result<Tensor> {
    let (t, capacity) = crate::check::gated_delta_rule((qkv, a, b), rule, state, batch)?;
    let runs = read_runs(OP, batch, t, capacity)?;
    let (xs, as_, bs) = (read_f32(OP, qkv)?, read_f32(OP, a)?, read_f32(OP, b)?);
    let (a_log, dt_bias) = (read_f32(OP, rule.a_log)?, read_f32(OP, rule.dt_bias)?);
    let dims = (rule.num_key_heads, rule.num_value_heads, rule.key_dim, rule.value_dim);
    let ops = Operands { qkv: &xs, a: &as_, b: &bs, a_log: &a_log, dt_bias: &dt_bias, dims };
    let prep = Prepared::new(&ops, t);
    let mut pool = write_f32(OP, state)?;
    let mut out = vec![0f32; t * dims.1 * dims.3];
    let tasks = tasks(&runs, dims, plan.columns_per_task);
    let sink = Sink { out: Disjoint(out.as_mut_ptr()), pool: Disjoint(pool.as_mut_ptr()), dims };
    SpinPool::global().run(tasks.len(), &|i| {
        let task = &tasks[i];
        // SAFETY: `out` is `[t, h_v, d_v]` and the pool `[capacity, h_v, d_k, d_v]`, both
        // outliving the job; `check::recurrent_runs` made every slot this step writes
        // distinct and inside the pool, and the tasks cut each (sequence, head) into
        // disjoint column runs, so this task alone touches its columns of head `j` of its
        // sequence's rows, slot and snapshot slots.
        unsafe { columns::run(&prep, &runs[task.seq], task.head, task.cols.clone(), &sink, plan.level) };
    });
    Ok(f32_tensor(out, &[t, dims.1, dims.3]))
}

/// One task: value columns `cols` of head `head` of sequence `seq`, over all its rows.
struct Task {
    seq: usize,
    head: usize,
    cols: Range<usize>,
}

/// The step's tasks: each (sequence, head) cut into runs of `per_task` columns, or, when
/// not given, into as few whole blocks as give every thread [`TASKS_PER_THREAD`] tasks.
fn tasks(runs: &[SeqRun], (_, hv, _, dv): (usize, usize, usize, usize), per_task: Option<usize>) -> Vec<Task> {
    let per_task = per_task.unwrap_or_else(|| {
        let blocks = dv.div_ceil(columns::WIDEST);
        let want = TASKS_PER_THREAD * SpinPool::global().parts();
        let pieces = (want / (runs.len() * hv).max(1)).clamp(1, blocks);
        blocks.div_ceil(pieces) * columns::WIDEST
    });
    let per_task = per_task.clamp(1, dv.max(1));
    let mut tasks = Vec::with_capacity(runs.len() * hv * dv.div_ceil(per_task));
    for seq in 0..runs.len() {
        for head in 0..hv {
            for c in (0..dv).step_by(per_task) {
                tasks.push(Task { seq, head, cols: c..(c + per_task).min(dv) });
            }
        }
    }
    tasks
}

/// The output `[t, h_v, d_v]` and the state pool, shared by the tasks of one step.
pub(super) struct Sink {
    out: Disjoint,
    pool: Disjoint,
    /// `h_k, h_v, d_k, d_v`.
    dims: (usize, usize, usize, usize),
}

impl Sink {
    /// Head `j`'s output at row `row`, `d_v` floats.
    pub(super) fn out(&self, row: usize, j: usize) -> *mut f32 {
        let (_, hv, _, dv) = self.dims;
        self.out.0.wrapping_add((row * hv + j) * dv)
    }

    /// Head `j`'s state `[d_k, d_v]` at `slot`.
    pub(super) fn state(&self, slot: usize, j: usize) -> *mut f32 {
        let (_, hv, dk, dv) = self.dims;
        self.pool.0.wrapping_add((slot * hv + j) * dk * dv)
    }
}
