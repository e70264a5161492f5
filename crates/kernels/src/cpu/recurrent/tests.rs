//! The recurrent ops against the f64 references of `reference.rs`, through the
//! `GpuBackend` methods (and the delta rule's ways of sharing out its work forced one at a
//! time), and the delta rule's bitwise invariance to how a sequence's rows are batched.
//!
//! Bounds: an element passes when `|got − want| ≤ rel · (|want| + rms(want))`, as the op
//! conformance suite measures (the convolution and the norms, in `op_tests.rs`, use its
//! f32 tolerance). The delta rule carries its state through hundreds of rows of f32
//! rounding (normalisation, gates, a pass over `S` per row); against the f64 recurrence the
//! worst element of these cases measured 1.0e-6 for outputs and 5.9e-7 for states with the
//! earlier row-by-row and chunked forms (17 and 10 units of f32 rounding, u = 2⁻²⁴ ≈ 6e-8),
//! so `DELTA_REL` = 5e-6 (84 u) leaves room for other accumulation orders and still fails a
//! wrong decay or a state not carried.

use crate::backend::{DeltaRule, RecurrentBatch, StateSnapshot};
use crate::{CpuBackend, DType, GpuBackend, HostTensor, Result, Tensor};

use super::delta::{Plan, gated_delta_rule_by};
use super::reference::{self, DeltaInputs, Step};
use crate::quant::SimdLevel;

/// The bound of the delta rule's outputs and states (module doc).
const DELTA_REL: f64 = 5e-6;

pub(super) fn upload(b: &dyn GpuBackend, data: &[f32], dims: &[usize]) -> Tensor {
    b.upload(&HostTensor::from_f32(data, dims), DType::F32).expect("f32 upload")
}

pub(super) fn upload_u32(b: &dyn GpuBackend, data: &[u32]) -> Tensor {
    b.upload(&HostTensor::from_u32(data, &[data.len()]), DType::U32).expect("u32 upload")
}

/// `n` values uniform in `[lo, hi)` from stream `key`.
pub(super) fn uniform(key: u64, n: usize, (lo, hi): (f32, f32)) -> Vec<f32> {
    (0..n).map(|i| lo + (hi - lo) * (crate::rng::weight_uniform(key, i as u64) + 1.0) / 2.0).collect()
}

/// `Err` describing the worst element unless every one is within `rel · (|want| + rms)`.
pub(super) fn compare(got: &[f32], want: &[f64], rel: f64) -> std::result::Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{} elements, expected {}", got.len(), want.len()));
    }
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let worst = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / (w.abs() + rms))
        .enumerate()
        .fold((0, 0f64), |(wi, we), (i, e)| if e > we || e.is_nan() { (i, e) } else { (wi, we) });
    if worst.1 <= rel {
        Ok(())
    } else {
        let i = worst.0;
        Err(format!("element {i}: {} vs {} (error {:.3e} of |want| + rms, bound {rel:.0e})", got[i], want[i], worst.1))
    }
}

pub(super) fn assert_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    if let Err(e) = compare(got, want, rel) {
        panic!("{what}: {e}");
    }
}

/// The sequences of one step: their lengths and slots, and the snapshots.
#[derive(Clone)]
pub(super) struct Seqs {
    pub(super) lens: Vec<usize>,
    pub(super) slots: Vec<u32>,
    pub(super) snapshots: Vec<StateSnapshot>,
}

impl Seqs {
    pub(super) fn new(lens: &[usize], slots: &[u32]) -> Self {
        Self { lens: lens.to_vec(), slots: slots.to_vec(), snapshots: Vec::new() }
    }

    /// Snapshots of `(flat row, slot)`.
    pub(super) fn snap(mut self, snaps: &[(u32, u32)]) -> Self {
        self.snapshots = snaps.iter().map(|&(row, slot)| StateSnapshot { row, slot }).collect();
        self
    }

    pub(super) fn cu(&self) -> Vec<u32> {
        std::iter::once(0)
            .chain(self.lens.iter().scan(0u32, |acc, &l| Some(*acc + l as u32).inspect(|&v| *acc = v)))
            .collect()
    }

    pub(super) fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Calls `f` with the step's batch on `b`.
    pub(super) fn with_batch<T>(&self, b: &dyn GpuBackend, f: impl FnOnce(&RecurrentBatch<'_>) -> T) -> T {
        let (cu, slots) = (upload_u32(b, &self.cu()), upload_u32(b, &self.slots));
        f(&RecurrentBatch { cu_seqlens: &cu, slots: &slots, snapshots: &self.snapshots })
    }

    /// Checks `f` against the f64 reference on the same step.
    pub(super) fn reference<T>(&self, f: impl FnOnce(&Step<'_>) -> T) -> T {
        let cu = self.cu();
        let snapshots: Vec<(u32, u32)> = self.snapshots.iter().map(|s| (s.row, s.slot)).collect();
        f(&Step { cu: &cu, slots: &self.slots, snapshots: &snapshots })
    }
}

/// A Gated DeltaNet layer's delta rule with random parameters and a pool of random states.
pub(super) struct Layer {
    pub(super) dims: (usize, usize, usize, usize),
    pub(super) a_log: Vec<f32>,
    pub(super) dt_bias: Vec<f32>,
    /// The pool's initial contents, `[slots, h_v, d_k, d_v]`.
    pub(super) state: Vec<f32>,
    pub(super) slots: usize,
}

/// One step's inputs: `qkv [t, width]`, `a, b [t, h_v]`.
#[derive(Clone)]
pub(super) struct Rows {
    pub(super) qkv: Vec<f32>,
    pub(super) a: Vec<f32>,
    pub(super) b: Vec<f32>,
}

impl Layer {
    /// Moderate decays (`e^g` from about 0.1 to 1), so a state remembers rows far back.
    pub(super) fn new(seed: u64, dims: (usize, usize, usize, usize), slots: usize) -> Self {
        let (_, hv, dk, dv) = dims;
        let a_log = uniform(seed, hv, (0.02, 0.5)).iter().map(|v| v.ln()).collect();
        let dt_bias = uniform(seed + 1, hv, (-1.0, 1.0));
        Self { dims, a_log, dt_bias, state: uniform(seed + 2, slots * hv * dk * dv, (-1.0, 1.0)), slots }
    }

    pub(super) fn width(&self) -> usize {
        let (hk, hv, dk, dv) = self.dims;
        2 * hk * dk + hv * dv
    }

    /// `t` rows of inputs, gate projections in `gate_range`.
    pub(super) fn rows(&self, seed: u64, t: usize, gate_range: (f32, f32)) -> Rows {
        let hv = self.dims.1;
        Rows {
            qkv: uniform(seed, t * self.width(), (-1.0, 1.0)),
            a: uniform(seed + 1, t * hv, gate_range),
            b: uniform(seed + 2, t * hv, gate_range),
        }
    }

    pub(super) fn pool(&self, b: &dyn GpuBackend) -> Tensor {
        let (_, hv, dk, dv) = self.dims;
        upload(b, &self.state, &[self.slots, hv, dk, dv])
    }

    /// Runs the op on `b` over `rows` (restricted to `range`) into `pool`; returns `o`.
    pub(super) fn run(
        &self,
        b: &dyn GpuBackend,
        rows: &Rows,
        seqs: &Seqs,
        pool: &Tensor,
        path: Path,
    ) -> Result<Vec<f32>> {
        let (_, hv, _, _) = self.dims;
        let t = seqs.rows();
        let (qkv, a, bb) =
            (upload(b, &rows.qkv, &[t, self.width()]), upload(b, &rows.a, &[t, hv]), upload(b, &rows.b, &[t, hv]));
        let (a_log, dt_bias) = (upload(b, &self.a_log, &[hv]), upload(b, &self.dt_bias, &[hv]));
        let rule = self.rule(&a_log, &dt_bias);
        let o = seqs.with_batch(b, |batch| match path {
            Path::Auto => b.gated_delta_rule(&qkv, &a, &bb, &rule, pool, batch),
            path => gated_delta_rule_by((&qkv, &a, &bb), &rule, pool, batch, path.plan()),
        })?;
        b.download_f32(&o)
    }

    pub(super) fn rule<'a>(&self, a_log: &'a Tensor, dt_bias: &'a Tensor) -> DeltaRule<'a> {
        let (hk, hv, dk, dv) = self.dims;
        DeltaRule { num_key_heads: hk, num_value_heads: hv, key_dim: dk, value_dim: dv, a_log, dt_bias }
    }

    /// The f64 reference of [`Self::run`]: outputs, and the pool's contents after.
    pub(super) fn reference(&self, rows: &Rows, seqs: &Seqs, state: &[f32]) -> (Vec<f64>, Vec<f64>) {
        let mut pool: Vec<f64> = state.iter().map(|&v| f64::from(v)).collect();
        let inputs = DeltaInputs {
            qkv: &rows.qkv,
            a: &rows.a,
            b: &rows.b,
            a_log: &self.a_log,
            dt_bias: &self.dt_bias,
            dims: self.dims,
        };
        let o = seqs.reference(|step| reference::delta_rule(&inputs, &mut pool, step));
        (o, pool)
    }
}

/// Rows `range` of `rows`.
pub(super) fn take_rows(layer: &Layer, rows: &Rows, range: std::ops::Range<usize>) -> Rows {
    let (w, hv) = (layer.width(), layer.dims.1);
    Rows {
        qkv: rows.qkv[range.start * w..range.end * w].to_vec(),
        a: rows.a[range.start * hv..range.end * hv].to_vec(),
        b: rows.b[range.start * hv..range.end * hv].to_vec(),
    }
}

/// How the delta rule shares out a step's work, none of which may change a bit.
#[derive(Debug, Clone, Copy)]
pub(super) enum Path {
    /// One value column per task, through the one-column kernel.
    Columns,
    /// A whole head per task.
    Heads,
    /// The op's own sharing, with the portable (no SIMD) build of the kernel.
    Portable,
    /// The op as `GpuBackend::gated_delta_rule` runs it.
    Auto,
}

impl Path {
    fn plan(self) -> Plan {
        let level = SimdLevel::current();
        match self {
            Self::Columns => Plan { columns_per_task: Some(1), level },
            Self::Heads => Plan { columns_per_task: Some(usize::MAX), level },
            Self::Portable => Plan { columns_per_task: None, level: SimdLevel::None },
            Self::Auto => Plan { columns_per_task: None, level },
        }
    }
}

const PATHS: [Path; 4] = [Path::Columns, Path::Heads, Path::Portable, Path::Auto];

/// One step of `seqs` over `rows` from the layer's states gives, on every path, the f64
/// recurrence's outputs and slots.
fn assert_every_path_matches(b: &CpuBackend, layer: &Layer, rows: &Rows, seqs: &Seqs) {
    let (want_o, want_state) = layer.reference(rows, seqs, &layer.state);
    for path in PATHS {
        let pool = layer.pool(b);
        let o = layer.run(b, rows, seqs, &pool, path).unwrap();
        assert_close(&o, &want_o, DELTA_REL, &format!("{path:?}: outputs"));
        assert_close(&b.download_f32(&pool).unwrap(), &want_state, DELTA_REL, &format!("{path:?}: states"));
    }
}

/// Several sequences of different lengths (one empty, some past a chunk) in one step,
/// `h_v = 2·h_k` and `d_k ≠ d_v`, from random states: outputs and every slot after
/// match the f64 recurrence on each path.
#[test]
fn delta_rule_matches_reference_on_every_path() {
    let b = CpuBackend::new();
    let layer = Layer::new(10, (2, 4, 16, 8), 7);
    let seqs = Seqs::new(&[1, 3, 64, 0, 70, 130, 17], &[6, 0, 2, 5, 1, 4, 3]);
    let rows = layer.rows(20, seqs.rows(), (-3.0, 3.0));
    assert_every_path_matches(&b, &layer, &rows, &seqs);
}

/// Gates at their extremes: `a + dt_bias` past softplus's threshold of 20, decays whose
/// exponentials underflow within a row or a chunk, and `β` at 0 and 1.
#[test]
fn delta_rule_matches_reference_at_extreme_gates() {
    let b = CpuBackend::new();
    let mut layer = Layer::new(30, (1, 2, 8, 8), 2);
    layer.a_log = vec![16f32.ln(), 0.001f32.ln()];
    let seqs = Seqs::new(&[100, 3], &[1, 0]);
    let rows = layer.rows(40, seqs.rows(), (-30.0, 30.0));
    assert_every_path_matches(&b, &layer, &rows, &seqs);
}

/// One sequence of 217 rows fed as steps of 1, 5, 17, 64 and 130 rows in several orders
/// gives the outputs and final state of the f64 recurrence over all of it, as one step does.
#[test]
fn delta_rule_carries_state_across_steps() {
    let b = CpuBackend::new();
    let layer = Layer::new(50, (2, 4, 16, 16), 3);
    let rows = layer.rows(60, 217, (-3.0, 3.0));
    let whole = Seqs::new(&[217], &[2]);
    let (want_o, want_state) = layer.reference(&rows, &whole, &layer.state);
    for order in [&[217][..], &[1, 5, 17, 64, 130], &[130, 64, 17, 5, 1], &[17, 1, 130, 5, 64]] {
        for path in PATHS {
            let (pool, mut o, mut at) = (layer.pool(&b), Vec::new(), 0);
            for &len in order {
                let step = take_rows(&layer, &rows, at..at + len);
                o.extend(layer.run(&b, &step, &Seqs::new(&[len], &[2]), &pool, path).unwrap());
                at += len;
            }
            let what = format!("steps {order:?}, {path:?}");
            assert_close(&o, &want_o, DELTA_REL, &format!("{what}: outputs"));
            assert_close(&b.download_f32(&pool).unwrap(), &want_state, DELTA_REL, &format!("{what}: state"));
        }
    }
}

/// Each sequence of a batch gets exactly (bit for bit) what it gets alone in a step: the
/// tasks of different sequences share nothing.
#[test]
fn delta_rule_batches_sequences_independently() {
    let b = CpuBackend::new();
    let layer = Layer::new(70, (2, 4, 8, 16), 6);
    let seqs = Seqs::new(&[1, 130, 0, 17, 64, 5], &[5, 0, 2, 1, 4, 3]);
    let rows = layer.rows(80, seqs.rows(), (-3.0, 3.0));
    let pool = layer.pool(&b);
    let o = layer.run(&b, &rows, &seqs, &pool, Path::Auto).unwrap();
    let together = b.download_f32(&pool).unwrap();
    let (per_slot, row) = (layer.state.len() / layer.slots, layer.dims.1 * layer.dims.3);
    let cu = seqs.cu();
    for (s, (&len, &slot)) in seqs.lens.iter().zip(&seqs.slots).enumerate() {
        let alone_pool = layer.pool(&b);
        let range = cu[s] as usize..cu[s + 1] as usize;
        let alone = layer.run(
            &b,
            &take_rows(&layer, &rows, range.clone()),
            &Seqs::new(&[len], &[slot]),
            &alone_pool,
            Path::Auto,
        );
        assert_eq!(alone.unwrap(), o[range.start * row..range.end * row], "sequence {s}: outputs");
        let slot = slot as usize * per_slot..(slot as usize + 1) * per_slot;
        assert_eq!(b.download_f32(&alone_pool).unwrap()[slot.clone()], together[slot], "sequence {s}: state");
    }
}

/// Snapshots at rows anywhere in a sequence (its first, either side of a chunk boundary,
/// its last) and in a second sequence hold the state of a run stopped at that row, on
/// each path, and match the reference.
#[test]
fn delta_rule_snapshots_equal_stopped_runs() {
    let b = CpuBackend::new();
    let layer = Layer::new(90, (1, 2, 16, 8), 12);
    let snaps = [(0, 4), (9, 5), (63, 6), (64, 7), (100, 8), (149, 9), (157, 10)];
    let seqs = Seqs::new(&[150, 20], &[0, 1]).snap(&snaps);
    let rows = layer.rows(100, seqs.rows(), (-3.0, 3.0));
    let (_, want_state) = layer.reference(&rows, &seqs, &layer.state);
    let per_slot = layer.state.len() / layer.slots;
    for path in PATHS {
        let pool = layer.pool(&b);
        layer.run(&b, &rows, &seqs, &pool, path).unwrap();
        let got = b.download_f32(&pool).unwrap();
        assert_close(&got, &want_state, DELTA_REL, &format!("{path:?}: every slot"));
        for &(row, slot) in &snaps {
            let (seq, start) = if row < 150 { (0, 0) } else { (1, 150) };
            let stopped = Seqs::new(&[(row - start + 1) as usize], &[seqs.slots[seq]]);
            let stopped_pool = layer.pool(&b);
            let part = take_rows(&layer, &rows, start as usize..row as usize + 1);
            layer.run(&b, &part, &stopped, &stopped_pool, path).unwrap();
            let (from, to) = (seqs.slots[seq] as usize * per_slot, slot as usize * per_slot);
            let want: Vec<f64> =
                b.download_f32(&stopped_pool).unwrap()[from..from + per_slot].iter().map(|&v| f64::from(v)).collect();
            assert_close(&got[to..to + per_slot], &want, DELTA_REL, &format!("{path:?}: snapshot after row {row}"));
        }
    }
}

/// `v` as bits, so that a comparison tells `-0.0` from `0.0` and sees equal NaNs.
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `total` rows cut into steps of `len` (the last one shorter).
fn cut(total: usize, len: usize) -> Vec<usize> {
    (0..total).step_by(len).map(|at| len.min(total - at)).collect()
}

/// Runs the layer's sequence in slot 2 over `rows` in steps of `steps` rows, each step
/// behind a batch-mate of a few rows in slot 0, with snapshots after the sequence's rows
/// `snap_after` (consumed rows) into slots 3, 4, ... when a step passes them. Returns the
/// sequence's outputs, its slot and the snapshot slots.
fn run_in_steps(
    b: &CpuBackend,
    layer: &Layer,
    rows: &Rows,
    steps: &[usize],
    snap_after: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let (pool, mut o, mut at) = (layer.pool(b), Vec::new(), 0);
    let per_slot = layer.state.len() / layer.slots;
    let row = layer.dims.1 * layer.dims.3;
    for (i, &len) in steps.iter().enumerate() {
        let mate = 1 + i % 4;
        let step = take_rows(layer, rows, at..at + len);
        let both = Rows {
            qkv: [layer.rows(1000 + i as u64, mate, (-3.0, 3.0)).qkv, step.qkv].concat(),
            a: [layer.rows(2000 + i as u64, mate, (-3.0, 3.0)).a, step.a].concat(),
            b: [layer.rows(3000 + i as u64, mate, (-3.0, 3.0)).b, step.b].concat(),
        };
        let snaps: Vec<(u32, u32)> = (snap_after.iter().enumerate())
            .filter(|&(_, &n)| n > at && n <= at + len)
            .map(|(s, &n)| ((mate + n - at - 1) as u32, 3 + s as u32))
            .collect();
        let seqs = Seqs::new(&[mate, len], &[0, 2]).snap(&snaps);
        o.extend_from_slice(&layer.run(b, &both, &seqs, &pool, Path::Auto).unwrap()[mate * row..]);
        at += len;
    }
    let state = b.download_f32(&pool).unwrap();
    (o, state[2 * per_slot..(3 + snap_after.len()) * per_slot].to_vec())
}

/// A sequence's outputs, final state and snapshots are the same bits whether its 150 rows
/// arrive in one step (a prompt alone), in prefill chunks of 5 or 7, one row a step
/// (decode), or cut as a prefix hit's tail and speculative verifies of 5 would cut them,
/// each step batched with another sequence: the delta rule's arithmetic for a row never
/// depends on the step it is in. Heads of 40 value columns take the 16-column kernel and
/// the one-column one.
#[test]
fn delta_rule_gives_the_same_bits_however_a_sequence_is_cut_into_steps() {
    let b = CpuBackend::new();
    let layer = Layer::new(110, (2, 4, 16, 40), 6);
    let rows = layer.rows(120, 150, (-3.0, 3.0));
    let snap_after = [8, 64, 101];
    let (want_o, want_state) = run_in_steps(&b, &layer, &rows, &[150], &snap_after);
    let (ref_o, ref_state) = layer.reference(&rows, &Seqs::new(&[150], &[2]), &layer.state);
    assert_close(&want_o, &ref_o, DELTA_REL, "one step: outputs");
    let per_slot = layer.state.len() / layer.slots;
    assert_close(&want_state[..per_slot], &ref_state[2 * per_slot..3 * per_slot], DELTA_REL, "one step: state");
    let cuts = [cut(150, 5), cut(150, 7), cut(150, 1), vec![3, 61, 5, 1, 5, 5, 2, 68]];
    for steps in cuts {
        let (o, state) = run_in_steps(&b, &layer, &rows, &steps, &snap_after);
        assert!(bits(&o) == bits(&want_o), "steps {steps:?}: outputs differ from one step's");
        for (s, (got, want)) in state.chunks(per_slot).zip(want_state.chunks(per_slot)).enumerate() {
            assert!(bits(got) == bits(want), "steps {steps:?}: slot {s} of the states differs from one step's");
        }
    }
}

/// Every way of sharing out a step (a column per task, a head per task, the op's choice)
/// and the portable build give the same bits as the op, outputs, slots and snapshots.
#[test]
fn delta_rule_gives_the_same_bits_on_every_path() {
    let b = CpuBackend::new();
    let layer = Layer::new(130, (2, 4, 8, 40), 9);
    let seqs = Seqs::new(&[1, 37, 0, 5, 70], &[4, 0, 2, 1, 3]).snap(&[(3, 5), (20, 6), (43, 7), (112, 8)]);
    let rows = layer.rows(140, seqs.rows(), (-3.0, 3.0));
    let pool = layer.pool(&b);
    let want_o = bits(&layer.run(&b, &rows, &seqs, &pool, Path::Auto).unwrap());
    let want_pool = bits(&b.download_f32(&pool).unwrap());
    for path in PATHS {
        let pool = layer.pool(&b);
        assert!(bits(&layer.run(&b, &rows, &seqs, &pool, path).unwrap()) == want_o, "{path:?}: outputs");
        assert!(bits(&b.download_f32(&pool).unwrap()) == want_pool, "{path:?}: slots");
    }
}
