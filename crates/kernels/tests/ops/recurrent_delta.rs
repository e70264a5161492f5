//! Conformance checks of the gated delta rule against the f64 recurrence of
//! `recurrent_reference.rs`, from the same stored inputs (`qkv`, `a`, `b` in the float
//! dtype; `A_log`, `dt_bias` and the state pool f32 on every backend).
//!
//! Bounds, of `|want| + rms(want)` per element:
//! - outputs: the harness tolerance of the float dtype. The backends keep q, k, v, the
//!   gates and the state in f32 and round only `o`, once (bf16: 1e-2, 2.5 half-ulps; f32:
//!   1e-5, where the CPU measured 1.0e-6 over hundreds of rows).
//! - states: f32 on every backend, never rounded to the float dtype: [`STATE_REL`].

use met_kernels::{DType, DeltaRule, GpuBackend, HostTensor, NO_STATE_SLOT, Result, Tensor};

use crate::harness::{Rng, Tol, expect_err, tolerance, upload_f32};
use crate::recurrent::{STEP_PLANS, Seqs, assert_within, draw, step_ranges};
use crate::recurrent_reference::{self as reference, DeltaInputs};

/// The bound of the f32 states after a step: the CPU measured 5.9e-7 (10 f32 units of
/// 2⁻²⁴) against the f64 recurrence over hundreds of rows; 2e-5 leaves room for another
/// order of the sums and the GPU's `rsqrtf` and `expf` (2 ulp each), and still fails a
/// wrong decay, a lost row or a state not carried (errors of 1e-2 and more).
const STATE_REL: Tol = Tol { rel: 2e-5 };

/// A Gated DeltaNet layer's delta rule, `(h_k, h_v, d_k, d_v)`, with random parameters and a
/// pool of random f32 states.
struct Layer {
    dims: (usize, usize, usize, usize),
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    state: Vec<f32>,
    slots: usize,
}

/// One step's inputs, stored: `qkv [t, width]`, `a, b [t, h_v]`.
#[derive(Clone)]
struct Rows {
    qkv: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

impl Layer {
    /// Moderate decays (`e^g` from about 0.1 to 1), so a state remembers rows far back.
    fn new(seed: u64, dims: (usize, usize, usize, usize), slots: usize) -> Self {
        let (_, hv, dk, dv) = dims;
        let mut rng = Rng::new(seed);
        let a_log = rng.vec(hv).iter().map(|v| (0.26 + 0.24 * v).ln()).collect();
        let dt_bias = rng.vec(hv);
        Self { dims, a_log, dt_bias, state: rng.vec(slots * hv * dk * dv), slots }
    }

    fn width(&self) -> usize {
        let (hk, hv, dk, dv) = self.dims;
        2 * hk * dk + hv * dv
    }

    /// `t` rows of inputs, the gate projections in `[-gate, gate)`.
    fn rows(&self, b: &dyn GpuBackend, seed: u64, t: usize, gate: f32) -> Rows {
        let mut rng = Rng::new(seed);
        let hv = self.dims.1;
        Rows {
            qkv: draw(b, &mut rng, t * self.width(), 1.0),
            a: draw(b, &mut rng, t * hv, gate),
            b: draw(b, &mut rng, t * hv, gate),
        }
    }

    /// Rows `range` of `rows`.
    fn take(&self, rows: &Rows, range: std::ops::Range<usize>) -> Rows {
        let (w, hv) = (self.width(), self.dims.1);
        Rows {
            qkv: rows.qkv[range.start * w..range.end * w].to_vec(),
            a: rows.a[range.start * hv..range.end * hv].to_vec(),
            b: rows.b[range.start * hv..range.end * hv].to_vec(),
        }
    }

    fn pool(&self, b: &dyn GpuBackend) -> Result<Tensor> {
        let (_, hv, dk, dv) = self.dims;
        b.upload(&HostTensor::from_f32(&self.state, &[self.slots, hv, dk, dv]), DType::F32)
    }

    fn upload_f32_exact(b: &dyn GpuBackend, v: &[f32]) -> Result<Tensor> {
        b.upload(&HostTensor::from_f32(v, &[v.len()]), DType::F32)
    }

    /// Runs the op on `b` over `rows` into `pool`; returns `o`.
    fn run(&self, b: &dyn GpuBackend, rows: &Rows, seqs: &Seqs, pool: &Tensor) -> Result<Vec<f32>> {
        let (hk, hv, dk, dv) = self.dims;
        let t = seqs.rows();
        let qkv = upload_f32(b, &rows.qkv, &[t, self.width()])?;
        let (a, gb) = (upload_f32(b, &rows.a, &[t, hv])?, upload_f32(b, &rows.b, &[t, hv])?);
        let (a_log, dt_bias) = (Self::upload_f32_exact(b, &self.a_log)?, Self::upload_f32_exact(b, &self.dt_bias)?);
        let rule = DeltaRule {
            num_key_heads: hk,
            num_value_heads: hv,
            key_dim: dk,
            value_dim: dv,
            a_log: &a_log,
            dt_bias: &dt_bias,
        };
        let o = seqs.with_batch(b, |batch| b.gated_delta_rule(&qkv, &a, &gb, &rule, pool, batch))?;
        assert_eq!(o.dims(), [t, hv, dv], "gated_delta_rule: shape");
        b.download_f32(&o)
    }

    /// The f64 reference of [`Self::run`] from the initial pool: outputs, and the pool after.
    fn reference(&self, rows: &Rows, seqs: &Seqs) -> (Vec<f64>, Vec<f64>) {
        let mut pool: Vec<f64> = self.state.iter().map(|&v| f64::from(v)).collect();
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

    /// Asserts outputs and the whole pool (every slot: sequences', snapshots', untouched).
    fn assert_matches(&self, b: &dyn GpuBackend, (o, pool): (&[f32], &Tensor), want: (&[f64], &[f64]), what: &str) {
        let (_, hv, dk, dv) = self.dims;
        let at_out = |i: usize| format!("row {} head {} column {}", i / (hv * dv), i / dv % hv, i % dv);
        assert_within(b, o, want.0, tolerance(b.float_dtype()), &format!("{what}: outputs"), &at_out);
        let at_state = |i: usize| {
            let (slot, rest) = (i / (hv * dk * dv), i % (hv * dk * dv));
            format!("slot {slot} head {} entry [{}, {}]", rest / (dk * dv), rest / dv % dk, rest % dv)
        };
        let got = b.download_f32(pool).expect("download the pool");
        assert_within(b, &got, want.1, STATE_REL, &format!("{what}: states"), &at_state);
    }
}

/// Several sequences of different lengths (one empty, a decode row, some past 64 rows, one
/// without a slot) in one step with snapshots, `h_v = 2·h_k`, at head shapes that fill and
/// that do not fill the GPU's lanes and column tiles (d_k 16, 48, 128; d_v 8, 20, 128):
/// outputs and every slot after match the f64 recurrence (the slotless sequence starts
/// from zero and writes no slot).
pub fn delta_rule_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    for (n, dims) in [(2, 4, 16, 8), (2, 4, 48, 20), (1, 2, 128, 128)].into_iter().enumerate() {
        let layer = Layer::new(10 + n as u64, dims, 11);
        let seqs = Seqs::new(&[1, 3, 64, 0, 70, 130, 17, 9], &[6, 0, 2, 5, 1, 4, 3, NO_STATE_SLOT]).snap(&[
            (0, 7),
            (4, 8),
            (100, 9),
            (137, 10),
        ]);
        let rows = layer.rows(b, 20 + n as u64, seqs.rows(), 3.0);
        let (want_o, want_state) = layer.reference(&rows, &seqs);
        let pool = layer.pool(b)?;
        let o = layer.run(b, &rows, &seqs, &pool)?;
        layer.assert_matches(b, (&o, &pool), (&want_o, &want_state), &format!("delta rule {dims:?}"));
    }
    Ok(())
}

/// Gates at their extremes: `a + dt_bias` past softplus's threshold of 20, decays whose
/// exponentials underflow within a row, and `β` at 0 and 1.
pub fn delta_rule_matches_reference_at_extreme_gates(b: &dyn GpuBackend) -> Result<()> {
    let mut layer = Layer::new(30, (1, 2, 32, 32), 2);
    layer.a_log = vec![16f32.ln(), 0.001f32.ln()];
    let seqs = Seqs::new(&[100, 3], &[1, 0]);
    let rows = layer.rows(b, 40, seqs.rows(), 30.0);
    let (want_o, want_state) = layer.reference(&rows, &seqs);
    let pool = layer.pool(b)?;
    let o = layer.run(b, &rows, &seqs, &pool)?;
    layer.assert_matches(b, (&o, &pool), (&want_o, &want_state), "delta rule at extreme gates");
    Ok(())
}

/// Two sequences of 217 rows fed as steps of 1, 5, 17, 64 and 130 rows in several plans
/// (both in every step, in their own slots) give the outputs and states of the f64
/// recurrence over all of them in one step.
pub fn delta_rule_carries_state_across_steps(b: &dyn GpuBackend) -> Result<()> {
    const TOTAL: usize = 217;
    let layer = Layer::new(50, (2, 4, 32, 64), 3);
    let rows = layer.rows(b, 60, 2 * TOTAL, 3.0);
    let (want_o, want_state) = layer.reference(&rows, &Seqs::new(&[TOTAL, TOTAL], &[2, 0]));
    let per_row = layer.dims.1 * layer.dims.3;
    for plan in STEP_PLANS {
        let pool = layer.pool(b)?;
        let mut o = vec![0f32; 2 * TOTAL * per_row];
        for k in 0..plan.len() {
            let ranges = step_ranges(plan, k, TOTAL);
            let parts: Vec<Rows> = ranges.iter().map(|r| layer.take(&rows, r.clone())).collect();
            let step = Rows {
                qkv: [parts[0].qkv.clone(), parts[1].qkv.clone()].concat(),
                a: [parts[0].a.clone(), parts[1].a.clone()].concat(),
                b: [parts[0].b.clone(), parts[1].b.clone()].concat(),
            };
            let got = layer.run(b, &step, &Seqs::new(&plan[k], &[2, 0]), &pool)?;
            let mut at = 0;
            for r in ranges {
                o[r.start * per_row..r.end * per_row].copy_from_slice(&got[at..at + r.len() * per_row]);
                at += r.len() * per_row;
            }
        }
        layer.assert_matches(b, (&o, &pool), (&want_o, &want_state), &format!("delta rule in steps {plan:?}"));
    }
    Ok(())
}

/// A prompt of 8,300 rows (past the 8,192 of one wave of the CUDA backend's chunked
/// form, so its state crosses waves in its slot) beside a short one and a decode row, with
/// snapshots inside the first wave, at the wave's edge and twice after one row: outputs
/// and every slot equal the f64 recurrence.
pub fn delta_rule_long_prompt(b: &dyn GpuBackend) -> Result<()> {
    let layer = Layer::new(90, (1, 2, 32, 64), 8);
    let seqs = Seqs::new(&[8300, 40, 1], &[3, 0, 6]).snap(&[(100, 1), (8191, 2), (8320, 4), (8320, 5)]);
    let rows = layer.rows(b, 91, seqs.rows(), 3.0);
    let (want_o, want_state) = layer.reference(&rows, &seqs);
    let pool = layer.pool(b)?;
    let o = layer.run(b, &rows, &seqs, &pool)?;
    layer.assert_matches(b, (&o, &pool), (&want_o, &want_state), "delta rule over a long prompt");
    Ok(())
}

/// Decode steps of 8 and of 16 sequences, one row each, four steps in a row (the shape a
/// CUDA graph replays), equal the reference over the four rows of each.
pub fn delta_rule_decode_steps(b: &dyn GpuBackend) -> Result<()> {
    for seqs in [8, 16] {
        decode_steps(b, seqs)?;
    }
    Ok(())
}

fn decode_steps(b: &dyn GpuBackend, seqs: usize) -> Result<()> {
    const STEPS: usize = 4;
    let layer = Layer::new(70 + seqs as u64, (2, 4, 128, 128), seqs + 1);
    let slots: Vec<u32> = (0..seqs as u32).map(|s| (s * 5) % (seqs as u32 + 1)).collect();
    let rows = layer.rows(b, 80, seqs * STEPS, 3.0);
    let (want_o, want_state) = layer.reference(&rows, &Seqs::new(&vec![STEPS; seqs], &slots));
    let pool = layer.pool(b)?;
    let per_row = layer.dims.1 * layer.dims.3;
    let mut o = vec![0f32; seqs * STEPS * per_row];
    for k in 0..STEPS {
        let picks: Vec<Rows> = (0..seqs).map(|s| layer.take(&rows, s * STEPS + k..s * STEPS + k + 1)).collect();
        let step = Rows {
            qkv: picks.iter().flat_map(|r| r.qkv.iter().copied()).collect(),
            a: picks.iter().flat_map(|r| r.a.iter().copied()).collect(),
            b: picks.iter().flat_map(|r| r.b.iter().copied()).collect(),
        };
        let got = layer.run(b, &step, &Seqs::new(&vec![1; seqs], &slots), &pool)?;
        for s in 0..seqs {
            let row = s * STEPS + k;
            o[row * per_row..(row + 1) * per_row].copy_from_slice(&got[s * per_row..(s + 1) * per_row]);
        }
    }
    layer.assert_matches(b, (&o, &pool), (&want_o, &want_state), &format!("delta rule decode steps of {seqs}"));
    Ok(())
}

/// One step of 40 sequences at Qwen3.5/3.6's 128 x 128 heads (most one row, every seventh
/// five, two without a state slot, one with a snapshot) on two backends whose fused kernels
/// differ only in how they walk sequences (CUDA's `MET_GDR_SEQS`): outputs, states and the
/// snapshot equal bit for bit. A walk that mixed up two sequences' state tiles or rows
/// would change them.
#[cfg(feature = "cuda")]
pub fn delta_rule_walks_agree_bit_for_bit(one: &dyn GpuBackend, other: &dyn GpuBackend) -> Result<()> {
    let seqs = 40;
    let layer = Layer::new(91, (2, 4, 128, 128), seqs + 2);
    let lens: Vec<usize> = (0..seqs).map(|s| if s % 7 == 3 { 5 } else { 1 }).collect();
    let slots: Vec<u32> = (0..seqs as u32)
        .map(|s| if s == 11 || s == 30 { NO_STATE_SLOT } else { (s * 7) % (seqs as u32 + 1) })
        .collect();
    let step = Seqs::new(&lens, &slots).snap(&[(12, seqs as u32 + 1)]);
    let rows = layer.rows(one, 92, step.rows(), 3.0);
    let mut results = Vec::new();
    for b in [one, other] {
        let pool = layer.pool(b)?;
        let o = layer.run(b, &rows, &step, &pool)?;
        results.push((o, b.download_f32(&pool)?));
    }
    assert!(results[0].0.iter().any(|&v| v != 0.0), "the step computed nothing");
    assert_eq!(results[0].0, results[1].0, "delta rule outputs of the two walks");
    assert_eq!(results[0].1, results[1].1, "delta rule states (and the snapshot) of the two walks");
    Ok(())
}

/// Every operand check of the delta rule answers `Err`, never a panic, and leaves the
/// pool as it was.
pub fn delta_rule_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let layer = Layer::new(16, (2, 4, 4, 3), 3);
    let rows = layer.rows(b, 17, 4, 1.0);
    let pool = layer.pool(b)?;
    let (a_log, dt_bias) = (Layer::upload_f32_exact(b, &layer.a_log)?, Layer::upload_f32_exact(b, &layer.dt_bias)?);
    let qkv = upload_f32(b, &rows.qkv, &[4, layer.width()])?;
    let ab = upload_f32(b, &rows.a, &[4, 4])?;
    let short = upload_f32(b, &rows.a[..12], &[3, 4])?;
    let rule =
        DeltaRule { num_key_heads: 2, num_value_heads: 4, key_dim: 4, value_dim: 3, a_log: &a_log, dt_bias: &dt_bias };
    let run = |qkv: &Tensor, a: &Tensor, rule: &DeltaRule<'_>, pool: &Tensor, seqs: &Seqs| {
        seqs.with_batch(b, |batch| b.gated_delta_rule(qkv, a, &ab, rule, pool, batch))
    };
    let good = Seqs::new(&[4], &[0]);
    let narrow = upload_f32(b, &rows.qkv[..4 * 20], &[4, 20])?;
    let wrong_state = b.upload(&HostTensor::from_f32(&layer.state, &[3, 4, 3, 4]), DType::F32)?;
    let cases: [(&str, &Tensor, &Tensor, DeltaRule<'_>, &Tensor, Seqs); 8] = [
        ("h_v not a multiple of h_k", &qkv, &ab, DeltaRule { num_key_heads: 3, ..rule }, &pool, good.clone()),
        ("qkv too narrow", &narrow, &ab, rule, &pool, good.clone()),
        ("a of 3 rows", &qkv, &short, rule, &pool, good.clone()),
        ("a_log of the wrong length", &qkv, &ab, DeltaRule { a_log: &short, ..rule }, &pool, good.clone()),
        ("a state of the wrong head size", &qkv, &ab, rule, &wrong_state, good.clone()),
        ("a slot past the pool", &qkv, &ab, rule, &pool, Seqs::new(&[4], &[3])),
        ("a snapshot into the sequence's slot", &qkv, &ab, rule, &pool, good.clone().snap(&[(1, 0)])),
        ("rows that do not add up to t", &qkv, &ab, rule, &pool, Seqs::new(&[3], &[0])),
    ];
    for (what, qkv, a, rule, pool, seqs) in &cases {
        expect_err(run(qkv, a, rule, pool, seqs), &format!("delta rule with {what}"));
    }
    expect_err(run(&pool, &ab, &rule, &pool, &good), "delta rule reading the pool itself");
    assert_eq!(b.download_f32(&pool)?, layer.state, "a refused step wrote the pool on {}", b.name());
    run(&qkv, &ab, &rule, &pool, &good).map(drop)
}
