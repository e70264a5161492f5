//! Conformance checks of the recurrent (Gated DeltaNet) ops other than the delta rule
//! (`recurrent_delta.rs`): the causal convolution and its state windows, the gated norm,
//! the sigmoid gate, the state-slot ops, and the operand errors of all of them; plus the
//! step machinery both files share.
//!
//! Inputs are drawn in f32 and stored as the backend stores floats (`stored`), and the f64
//! references of `recurrent_reference.rs` compute from exactly those values, so a bound
//! covers only the backend's own arithmetic and the rounding of its results:
//! - convolution outputs: f32 sums of `w` products and a SiLU, rounded once to the float
//!   dtype: the harness tolerance (bf16: 1e-2 of `|want| + rms`, 2.5 half-ulps of bf16).
//! - convolution windows and snapshots: copies of stored inputs, so exact.
//! - `rms_norm_gated` on bf16 rounds three times as transformers does (the normalised
//!   value, its product with the weight, the result): twice the harness tolerance.
//! - `sigmoid_mul` on bf16 rounds the sigmoid and the product: the harness tolerance.

use met_kernels::{
    DType, DeltaRule, GpuBackend, HostTensor, NO_STATE_SLOT, RecurrentBatch, Result, StateSnapshot, Tensor,
};

use crate::harness::{Rng, Tol, compare, expect_err, stored, tolerance, upload_f32, upload_u32};
use crate::recurrent_reference::{self as reference, Step};

/// The sequences of one step: their lengths and slots, and the snapshots.
#[derive(Debug, Clone)]
pub struct Seqs {
    pub lens: Vec<usize>,
    pub slots: Vec<u32>,
    pub snapshots: Vec<StateSnapshot>,
}

impl Seqs {
    pub fn new(lens: &[usize], slots: &[u32]) -> Self {
        Self { lens: lens.to_vec(), slots: slots.to_vec(), snapshots: Vec::new() }
    }

    /// Snapshots of `(flat row, slot)`.
    pub fn snap(mut self, snaps: &[(u32, u32)]) -> Self {
        self.snapshots = snaps.iter().map(|&(row, slot)| StateSnapshot { row, slot }).collect();
        self
    }

    pub fn cu(&self) -> Vec<u32> {
        let mut cu = vec![0u32];
        for &l in &self.lens {
            cu.push(cu[cu.len() - 1] + l as u32);
        }
        cu
    }

    pub fn rows(&self) -> usize {
        self.lens.iter().sum()
    }

    /// Calls `f` with the step's batch on `b`.
    pub fn with_batch<T>(&self, b: &dyn GpuBackend, f: impl FnOnce(&RecurrentBatch<'_>) -> Result<T>) -> Result<T> {
        let cu = self.cu();
        let (cu, slots) = (upload_u32(b, &cu, &[cu.len()])?, upload_u32(b, &self.slots, &[self.slots.len()])?);
        f(&RecurrentBatch { cu_seqlens: &cu, slots: &slots, snapshots: &self.snapshots })
    }

    /// Runs `f` (an f64 reference) on the same step.
    pub(super) fn reference<T>(&self, f: impl FnOnce(&Step<'_>) -> T) -> T {
        let cu = self.cu();
        let snapshots: Vec<(u32, u32)> = self.snapshots.iter().map(|s| (s.row, s.slot)).collect();
        f(&Step { cu: &cu, slots: &self.slots, snapshots: &snapshots })
    }
}

/// `n` stored values uniform in `[-scale, scale)`.
pub fn draw(b: &dyn GpuBackend, rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    stored(b, rng.vec(n).into_iter().map(|v| v * scale).collect())
}

/// Panics unless `got` is within `tol` of `want`, naming the worst element's place (by
/// `locate`) and the largest absolute error, so a failure on the GPU machine says where.
pub fn assert_within(
    b: &dyn GpuBackend,
    got: &[f32],
    want: &[f64],
    tol: Tol,
    what: &str,
    locate: &dyn Fn(usize) -> String,
) {
    let Err(msg) = compare(got, want, tol) else { return };
    let rms = (want.iter().map(|w| w * w).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let excess = |i: usize| (f64::from(got[i]) - want[i]).abs() / (want[i].abs() + rms);
    let worst = (0..got.len().min(want.len())).max_by(|&i, &j| excess(i).total_cmp(&excess(j))).unwrap_or(0);
    let abs = |i: usize| (f64::from(got[i]) - want[i]).abs();
    let largest = (0..got.len().min(want.len())).max_by(|&i, &j| abs(i).total_cmp(&abs(j))).unwrap_or(0);
    panic!(
        "{what} on {}: {msg}; worst at {}; largest absolute error {:.3e} at {} (got {}, want {})",
        b.name(),
        locate(worst),
        abs(largest),
        locate(largest),
        got[largest],
        want[largest]
    );
}

/// A convolution layer of `c` channels and width `w`, with a pool of random windows.
struct Conv {
    c: usize,
    w: usize,
    weight: Vec<f32>,
    state: Vec<f32>,
    slots: usize,
}

impl Conv {
    fn new(b: &dyn GpuBackend, seed: u64, (c, w): (usize, usize), slots: usize) -> Self {
        let mut rng = Rng::new(seed);
        let weight = draw(b, &mut rng, c * w, 1.0);
        let state = draw(b, &mut rng, slots * c * (w - 1), 2.0);
        Self { c, w, weight, state, slots }
    }

    /// The pool of windows, in the backend's float dtype.
    fn pool(&self, b: &dyn GpuBackend) -> Result<Tensor> {
        upload_f32(b, &self.state, &[self.slots, self.c, self.w - 1])
    }

    fn run(&self, b: &dyn GpuBackend, x: &[f32], seqs: &Seqs, pool: &Tensor) -> Result<Vec<f32>> {
        let (xt, wt) = (upload_f32(b, x, &[seqs.rows(), self.c])?, upload_f32(b, &self.weight, &[self.c, self.w])?);
        let out = seqs.with_batch(b, |batch| b.causal_conv1d(&xt, &wt, pool, batch))?;
        assert_eq!(out.dims(), [seqs.rows(), self.c], "causal_conv1d: shape");
        b.download_f32(&out)
    }

    /// The reference's outputs and pool after.
    fn reference(&self, x: &[f32], seqs: &Seqs) -> (Vec<f64>, Vec<f64>) {
        let mut pool: Vec<f64> = self.state.iter().map(|&v| f64::from(v)).collect();
        let out = seqs.reference(|step| reference::conv(x, &self.weight, (self.c, self.w), &mut pool, step));
        (out, pool)
    }

    /// Asserts outputs within the tolerance and the pool exactly.
    fn assert_matches(&self, b: &dyn GpuBackend, (out, pool): (&[f32], &Tensor), want: (&[f64], &[f64]), what: &str) {
        let c = self.c;
        let at_row = |i: usize| format!("row {} channel {}", i / c, i % c);
        assert_within(b, out, want.0, tolerance(b.float_dtype()), &format!("{what}: outputs"), &at_row);
        let got = b.download_f32(pool).expect("download the pool");
        let kept = (self.w - 1).max(1);
        let bad = got.iter().zip(want.1).position(|(&g, &w)| f64::from(g) != w);
        if let Some(i) = bad {
            let at = format!("slot {} channel {} entry {}", i / (c * kept), i / kept % c, i % kept);
            panic!("{what} on {}: window {at} holds {}, want {} (windows are copies)", b.name(), got[i], want.1[i]);
        }
    }
}

/// Several sequences (one empty, one of a single row, some shorter than the kernel, one
/// without a slot) with snapshots, at widths 1, 2 and 4 and an odd channel count: outputs
/// match the reference and every slot holds exactly the inputs it should (the slotless
/// sequence starts from zeros and writes none). Then a step of short runs only (at most 8
/// rows: CUDA's one-launch form at width 4), with the same kinds of sequences and
/// snapshots, from windows an earlier step left.
pub fn conv_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    for w in [1, 2, 4] {
        let conv = Conv::new(b, w as u64, (37, w), 9);
        let seqs =
            Seqs::new(&[1, 5, 0, 17, 3, 2, 4], &[3, 0, 8, 1, 2, 4, NO_STATE_SLOT]).snap(&[(1, 5), (4, 6), (6, 7)]);
        let x = draw(b, &mut Rng::new(100 + w as u64), seqs.rows() * conv.c, 2.0);
        let (want, want_pool) = conv.reference(&x, &seqs);
        let pool = conv.pool(b)?;
        let out = conv.run(b, &x, &seqs, &pool)?;
        conv.assert_matches(b, (&out, &pool), (&want, &want_pool), &format!("conv width {w}"));
        let short = Seqs::new(&[1, 0, 8, 1, 3, 2], &[3, 0, 8, 1, NO_STATE_SLOT, 2]).snap(&[(2, 5), (2, 6), (5, 7)]);
        let x = draw(b, &mut Rng::new(200 + w as u64), short.rows() * conv.c, 2.0);
        let state = want_pool.iter().map(|&v| v as f32).collect();
        let after = Conv { c: conv.c, w: conv.w, weight: conv.weight.clone(), state, slots: conv.slots };
        let (want, want_pool) = after.reference(&x, &short);
        let out = conv.run(b, &x, &short, &pool)?;
        conv.assert_matches(b, (&out, &pool), (&want, &want_pool), &format!("conv width {w}, short runs"));
    }
    Ok(())
}

/// Per-step row counts of several sequences fed together: `steps[k][s]` rows of sequence
/// `s` in step `k`.
pub const STEP_PLANS: [&[[usize; 2]]; 3] = [
    &[[1, 130], [5, 64], [17, 17], [64, 5], [130, 1]],
    &[[17, 1], [1, 1], [130, 5], [5, 130], [64, 80]],
    &[[217, 217]],
];

/// The rows of sequence `s` (of `lens`) that step `k` of `plan` feeds, as flat ranges of
/// the whole run where sequence `s` owns rows `s · total ..`.
pub fn step_ranges(plan: &[[usize; 2]], k: usize, total: usize) -> [std::ops::Range<usize>; 2] {
    std::array::from_fn(|s| {
        let done: usize = plan[..k].iter().map(|step| step[s]).sum();
        s * total + done..s * total + done + plan[k][s]
    })
}

/// Two sequences of 217 rows fed as steps of 1, 5, 17, 64 and 130 rows in several plans
/// (both in every step, in their own slots) give the outputs and windows of one step over
/// all of them: each step starts from the inputs the last one left.
pub fn conv_carries_state_across_steps(b: &dyn GpuBackend) -> Result<()> {
    const TOTAL: usize = 217;
    let conv = Conv::new(b, 7, (24, 4), 3);
    let c = conv.c;
    let x = draw(b, &mut Rng::new(8), 2 * TOTAL * c, 2.0);
    let (want, want_pool) = conv.reference(&x, &Seqs::new(&[TOTAL, TOTAL], &[2, 0]));
    for plan in STEP_PLANS {
        let pool = conv.pool(b)?;
        let mut out = vec![0f32; 2 * TOTAL * c];
        for k in 0..plan.len() {
            let ranges = step_ranges(plan, k, TOTAL);
            let xs: Vec<f32> = ranges.iter().flat_map(|r| x[r.start * c..r.end * c].iter().copied()).collect();
            let got = conv.run(b, &xs, &Seqs::new(&plan[k], &[2, 0]), &pool)?;
            let mut at = 0;
            for r in ranges {
                out[r.start * c..r.end * c].copy_from_slice(&got[at..at + r.len() * c]);
                at += r.len() * c;
            }
        }
        conv.assert_matches(b, (&out, &pool), (&want, &want_pool), &format!("conv in steps {plan:?}"));
    }
    Ok(())
}

pub fn rms_norm_gated_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(21);
    for (n, d) in [(3, 8), (70, 128), (5, 4096)] {
        let (x, z, w) = (draw(b, &mut rng, n * d, 3.0), draw(b, &mut rng, n * d, 8.0), draw(b, &mut rng, d, 2.0));
        let up = |v: &[f32], dims: &[usize]| upload_f32(b, v, dims);
        let out = b.rms_norm_gated(&up(&x, &[n, d])?, &up(&z, &[n, d])?, &up(&w, &[d])?, 1e-6)?;
        assert_eq!(out.dims(), [n, d]);
        let want = reference::rms_norm_gated(&x, &z, &w, f64::from(1e-6f32));
        let tol = tolerance(b.float_dtype()).chained(2);
        let at = |i: usize| format!("row {} column {}", i / d, i % d);
        assert_within(b, &b.download_f32(&out)?, &want, tol, &format!("rms_norm_gated [{n}, {d}]"), &at);
    }
    Ok(())
}

/// Equal shapes, and a `[t, 1]` gate scaling each row of `x [t, n]`; other shapes refused.
pub fn sigmoid_mul_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(22);
    for dims in [&[5, 7][..], &[9, 4, 4096]] {
        let n = dims.iter().product();
        let (x, g) = (draw(b, &mut rng, n, 3.0), draw(b, &mut rng, n, 100.0));
        let out = b.sigmoid_mul(&upload_f32(b, &x, dims)?, &upload_f32(b, &g, dims)?)?;
        assert_eq!(out.dims(), dims);
        let at = |i: usize| format!("element {i}");
        let what = format!("sigmoid_mul {dims:?}");
        assert_within(
            b,
            &b.download_f32(&out)?,
            &reference::sigmoid_mul(&x, &g),
            tolerance(b.float_dtype()),
            &what,
            &at,
        );
    }
    let (x, g) = (draw(b, &mut rng, 3 * 5000, 3.0), draw(b, &mut rng, 3, 4.0));
    let out = b.sigmoid_mul(&upload_f32(b, &x, &[3, 5000])?, &upload_f32(b, &g, &[3, 1])?)?;
    assert_eq!(out.dims(), [3, 5000]);
    let wide: Vec<f32> = g.iter().flat_map(|&v| std::iter::repeat_n(v, 5000)).collect();
    let at = |i: usize| format!("row {} column {}", i / 5000, i % 5000);
    let tol = tolerance(b.float_dtype());
    assert_within(b, &b.download_f32(&out)?, &reference::sigmoid_mul(&x, &wide), tol, "sigmoid_mul per row", &at);
    expect_err(b.sigmoid_mul(&upload_f32(b, &x, &[3, 5000])?, &upload_f32(b, &g, &[1, 3])?), "a [1, 3] gate");
    // Plus a tensor (a shared expert's gated output added to the routed experts'): the bits
    // of the two ops one after the other, however a backend fuses them.
    let (xs, gs, y) = (upload_f32(b, &x, &[3, 5000])?, upload_f32(b, &g, &[3, 1])?, draw(b, &mut rng, 3 * 5000, 2.0));
    let ys = upload_f32(b, &y, &[3, 5000])?;
    let fused = b.download_f32(&b.sigmoid_mul_add(&xs, &gs, &ys)?)?;
    let apart = b.download_f32(&b.add(&ys, &b.sigmoid_mul(&xs, &gs)?)?)?;
    for (i, (f, a)) in fused.iter().zip(&apart).enumerate() {
        assert_eq!(f.to_bits(), a.to_bits(), "sigmoid_mul_add at {}: {f} against {a} apart", at(i));
    }
    expect_err(b.sigmoid_mul_add(&xs, &gs, &upload_f32(b, &y[..5000], &[1, 5000])?), "a [1, 5000] y");
    Ok(())
}

/// Zeroing and copying touch exactly the slots named, in every pool given (a window pool
/// in the float dtype and an f32 matrix pool); a slot past a pool is an error that
/// changes nothing.
pub fn state_slots_are_zeroed_and_copied(b: &dyn GpuBackend) -> Result<()> {
    let mut rng = Rng::new(23);
    let (conv, delta) = (draw(b, &mut rng, 4 * 6 * 3, 2.0), rng.vec(4 * 2 * 3 * 5));
    let conv_pool = upload_f32(b, &conv, &[4, 6, 3])?;
    let delta_pool = b.upload(&HostTensor::from_f32(&delta, &[4, 2, 3, 5]), DType::F32)?;
    let pools = [&conv_pool, &delta_pool];
    b.copy_state_slots(&pools, &[(1, 3), (0, 1)])?;
    b.zero_state_slots(&pools, &[2])?;
    expect_err(b.zero_state_slots(&pools, &[4]), "zero past the pools");
    expect_err(b.copy_state_slots(&pools, &[(0, 4)]), "copy past the pools");
    expect_err(b.copy_state_slots(&pools, &[(5, 0)]), "copy from past the pools");
    for (pool, host) in pools.iter().zip([conv, delta]) {
        let per = host.len() / 4;
        let slot = |s: usize| host[s * per..(s + 1) * per].to_vec();
        let want = [slot(0), slot(0), vec![0.0; per], slot(1)].concat();
        assert_eq!(b.download_f32(pool)?, want, "pool {:?} on {}", pool.dims(), b.name());
    }
    // Slots of 160 KB (several blocks of a batched copy each, in 16-byte words), a chain
    // whose second copy reads what the first wrote, and a zeroing after.
    let per = 2 * 20_000;
    let wide = rng.vec(3 * per);
    let pool = b.upload(&HostTensor::from_f32(&wide, &[3, 2, 20_000]), DType::F32)?;
    b.copy_state_slots(&[&pool], &[(0, 2), (2, 1)])?;
    b.zero_state_slots(&[&pool], &[0])?;
    let want = [vec![0.0; per], wide[..per].to_vec(), wide[..per].to_vec()].concat();
    assert!(b.download_f32(&pool)? == want, "a chain of copies of 160 KB slots on {}", b.name());
    Ok(())
}

/// Every operand check of the convolution answers `Err`, never a panic, and leaves the
/// pool as it was.
pub fn conv_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let conv = Conv::new(b, 13, (6, 3), 4);
    let pool = conv.pool(b)?;
    let x = upload_f32(b, &draw(b, &mut Rng::new(14), 5 * 6, 1.0), &[5, 6])?;
    let weight = upload_f32(b, &conv.weight, &[6, 3])?;
    let run =
        |x: &Tensor, weight: &Tensor, seqs: &Seqs| seqs.with_batch(b, |batch| b.causal_conv1d(x, weight, &pool, batch));
    let good = Seqs::new(&[2, 3], &[0, 1]);
    let bad = [
        ("rows that do not add up to t", Seqs::new(&[2, 2], &[0, 1])),
        ("a slot past the pool", Seqs::new(&[2, 3], &[0, 4])),
        ("two sequences in one slot", Seqs::new(&[2, 3], &[1, 1])),
        ("a snapshot past the step", good.clone().snap(&[(5, 2)])),
        ("a snapshot into a sequence's slot", good.clone().snap(&[(1, 0)])),
        ("one slot snapshot twice", good.clone().snap(&[(1, 2), (1, 2)])),
        ("snapshot rows descending", good.clone().snap(&[(4, 2), (3, 3)])),
        ("a snapshot slot past the pool", good.clone().snap(&[(1, 9)])),
        ("a snapshot of a sequence without a slot", Seqs::new(&[2, 3], &[0, NO_STATE_SLOT]).snap(&[(3, 2)])),
    ];
    for (what, seqs) in &bad {
        expect_err(run(&x, &weight, seqs), &format!("conv with {what}"));
    }
    let wide = upload_f32(b, &draw(b, &mut Rng::new(15), 6 * 4, 1.0), &[6, 4])?;
    expect_err(run(&x, &wide, &good), "conv with a weight wider than the windows");
    expect_err(run(&pool, &weight, &good), "conv reading the pool itself");
    let z = upload_f32(b, &[0.0; 6], &[1, 6])?;
    expect_err(b.rms_norm_gated(&x, &z, &upload_f32(b, &[1.0; 6], &[6])?, 1e-6), "rms_norm_gated z rows");
    expect_err(b.rms_norm_gated(&x, &x, &upload_f32(b, &[1.0; 5], &[5])?, 1e-6), "rms_norm_gated weight width");
    expect_err(b.sigmoid_mul(&x, &z), "sigmoid_mul gate shape");
    assert_eq!(b.download_f32(&pool)?, conv.state, "a refused step wrote the pool on {}", b.name());
    run(&x, &weight, &good).map(drop)
}

/// A decode step of the convolution and the delta rule (four sequences of one row, no
/// snapshots) recorded as a graph and replayed twice, with new inputs written in between,
/// gives bit for bit the outputs and states of the same steps run eagerly; a step with
/// snapshots refuses to be recorded. Only for backends with graphs.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn recurrent_decode_replays_in_a_graph(b: &dyn GpuBackend) -> Result<()> {
    if !b.supports_graphs() {
        return Ok(());
    }
    let (hk, hv, dk, dv, c, w) = (2, 4, 128, 128, 96, 4);
    let mut rng = Rng::new(31);
    let seqs = Seqs::new(&[1; 4], &[3, 0, 2, 1]);
    let f32s = |v: &[f32], dims: &[usize]| b.upload(&HostTensor::from_f32(v, dims), DType::F32);
    let weight = upload_f32(b, &draw(b, &mut rng, c * w, 1.0), &[c, w])?;
    let (a_log, dt_bias) = (f32s(&[-1.0, -0.5, -2.0, 0.1], &[hv])?, f32s(&rng.vec(hv), &[hv])?);
    let rule = DeltaRule {
        num_key_heads: hk,
        num_value_heads: hv,
        key_dim: dk,
        value_dim: dv,
        a_log: &a_log,
        dt_bias: &dt_bias,
    };
    let width = 2 * hk * dk + hv * dv;
    let conv_init = draw(b, &mut rng, 4 * c * (w - 1), 2.0);
    let delta_init = rng.vec(4 * hv * dk * dv);
    let pools = || -> Result<(Tensor, Tensor)> {
        Ok((upload_f32(b, &conv_init, &[4, c, w - 1])?, f32s(&delta_init, &[4, hv, dk, dv])?))
    };
    let steps: Vec<[Tensor; 4]> = (0..2)
        .map(|_| {
            Ok([
                upload_f32(b, &draw(b, &mut rng, 4 * c, 2.0), &[4, c])?,
                upload_f32(b, &draw(b, &mut rng, 4 * width, 1.0), &[4, width])?,
                upload_f32(b, &draw(b, &mut rng, 4 * hv, 3.0), &[4, hv])?,
                upload_f32(b, &draw(b, &mut rng, 4 * hv, 3.0), &[4, hv])?,
            ])
        })
        .collect::<Result<_>>()?;
    let run = |[x, qkv, a, gb]: &[Tensor; 4], (conv, delta): &(Tensor, Tensor), batch: &RecurrentBatch<'_>| {
        Ok::<_, met_kernels::Error>((
            b.causal_conv1d(x, &weight, conv, batch)?,
            b.gated_delta_rule(qkv, a, gb, &rule, delta, batch)?,
        ))
    };
    let eager_pools = pools()?;
    let eager: Vec<(Vec<f32>, Vec<f32>)> = steps
        .iter()
        .map(|step| {
            let (y, o) = seqs.with_batch(b, |batch| run(step, &eager_pools, batch))?;
            Ok((b.download_f32(&y)?, b.download_f32(&o)?))
        })
        .collect::<Result<_>>()?;
    let graph_pools = pools()?;
    let inputs: [Tensor; 4] = std::array::from_fn(|i| b.zeros(steps[0][i].dims(), steps[0][i].dtype()).expect("zeros"));
    let (y_out, o_out) = (b.zeros(&[4, c], b.float_dtype())?, b.zeros(&[4, hv, dv], b.float_dtype())?);
    let graph = seqs.with_batch(b, |batch| {
        b.capture(&mut || {
            let (y, o) = run(&inputs, &graph_pools, batch)?;
            b.copy_into(&y, &y_out)?;
            b.copy_into(&o, &o_out)
        })
    })?;
    for (step, (want_y, want_o)) in steps.iter().zip(&eager) {
        for (src, dst) in step.iter().zip(&inputs) {
            b.copy_into(src, dst)?;
        }
        graph.replay()?;
        assert_eq!(&b.download_f32(&y_out)?, want_y, "replayed convolution on {}", b.name());
        assert_eq!(&b.download_f32(&o_out)?, want_o, "replayed delta rule on {}", b.name());
    }
    assert_eq!(b.download_f32(&graph_pools.0)?, b.download_f32(&eager_pools.0)?, "replayed windows");
    assert_eq!(b.download_f32(&graph_pools.1)?, b.download_f32(&eager_pools.1)?, "replayed states");
    let snapped = seqs.clone().snap(&[(0, 2)]);
    let refused = snapped.with_batch(b, |batch| b.capture(&mut || run(&inputs, &graph_pools, batch).map(drop)));
    expect_err(refused.map(drop), "recording a step with snapshots");
    Ok(())
}
