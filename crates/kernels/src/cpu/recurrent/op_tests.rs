//! The convolution, the gated norm, the sigmoid gate and the state-slot ops against their
//! f64 references, and the operand checks of every recurrent op (errors, not panics).

use crate::backend::{DeltaRule, RecurrentBatch};
use crate::{CpuBackend, GpuBackend, Tensor};

use super::reference;
use super::tests::{Layer, Seqs, assert_close, uniform, upload, upload_u32};

/// The bound of the ops that round a few f32 operations per element (a sum of `w`
/// products and SiLU; a mean of `d` squares, a square root and three products): the op
/// conformance suite's f32 tolerance. A mean over 4,096 elements measured 1.1e-6.
const ELEMENTWISE_REL: f64 = 1e-5;

/// A convolution layer of `c` channels and width `w`, with a pool of random states.
struct Conv {
    c: usize,
    w: usize,
    weight: Vec<f32>,
    state: Vec<f32>,
    slots: usize,
}

impl Conv {
    fn new(seed: u64, c: usize, w: usize, slots: usize) -> Self {
        let (weight, state) = (uniform(seed, c * w, (-1.0, 1.0)), uniform(seed + 1, slots * c * (w - 1), (-2.0, 2.0)));
        Self { c, w, weight, state, slots }
    }

    fn pool(&self, b: &dyn GpuBackend) -> Tensor {
        upload(b, &self.state, &[self.slots, self.c, self.w - 1])
    }

    fn run(&self, b: &dyn GpuBackend, x: &[f32], seqs: &Seqs, pool: &Tensor) -> Vec<f32> {
        let (xt, wt) = (upload(b, x, &[seqs.rows(), self.c]), upload(b, &self.weight, &[self.c, self.w]));
        let out = seqs.with_batch(b, |batch| b.causal_conv1d(&xt, &wt, pool, batch)).expect("causal_conv1d");
        b.download_f32(&out).expect("download")
    }

    /// The reference's outputs and pool after.
    fn reference(&self, x: &[f32], seqs: &Seqs) -> (Vec<f64>, Vec<f64>) {
        let mut pool: Vec<f64> = self.state.iter().map(|&v| f64::from(v)).collect();
        let out = seqs.reference(|step| reference::conv(x, &self.weight, (self.c, self.w), &mut pool, step));
        (out, pool)
    }
}

fn exact(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

/// Several sequences (one empty, one of a single row, some shorter than the kernel) with
/// snapshots, at widths 1, 2 and 4: outputs match the reference, and every slot holds
/// exactly the inputs it should (states are copies of inputs, never rounded).
#[test]
fn conv_matches_reference() {
    let b = CpuBackend::new();
    for w in [1, 2, 4] {
        let conv = Conv::new(w as u64, 37, w, 9);
        let seqs = Seqs::new(&[1, 5, 0, 17, 3, 2], &[3, 0, 8, 1, 2, 4]).snap(&[(1, 5), (4, 6), (6, 7)]);
        let x = uniform(100 + w as u64, seqs.rows() * 37, (-2.0, 2.0));
        let (want, want_pool) = conv.reference(&x, &seqs);
        let pool = conv.pool(&b);
        assert_close(&conv.run(&b, &x, &seqs, &pool), &want, ELEMENTWISE_REL, &format!("width {w}: outputs"));
        assert_eq!(exact(&b.download_f32(&pool).unwrap()), want_pool, "width {w}: slots");
    }
}

/// A sequence fed as steps of 1, 5, 17, 64 and 130 rows, in several orders, gives one
/// step's outputs and state: each step starts from the inputs the last one left.
#[test]
fn conv_carries_state_across_steps() {
    let b = CpuBackend::new();
    let conv = Conv::new(7, 24, 4, 2);
    let c = conv.c;
    let x = uniform(8, 217 * c, (-2.0, 2.0));
    let (want, want_pool) = conv.reference(&x, &Seqs::new(&[217], &[1]));
    for order in [&[217][..], &[1, 5, 17, 64, 130], &[130, 64, 17, 5, 1], &[17, 1, 130, 5, 64]] {
        let (pool, mut out, mut at) = (conv.pool(&b), Vec::new(), 0);
        for &len in order {
            out.extend(conv.run(&b, &x[at * c..(at + len) * c], &Seqs::new(&[len], &[1]), &pool));
            at += len;
        }
        assert_close(&out, &want, ELEMENTWISE_REL, &format!("steps {order:?}: outputs"));
        assert_eq!(exact(&b.download_f32(&pool).unwrap()), want_pool, "steps {order:?}: state");
    }
}

/// A snapshot holds exactly the state of a run stopped at its row.
#[test]
fn conv_snapshots_equal_stopped_runs() {
    let b = CpuBackend::new();
    let conv = Conv::new(11, 16, 4, 8);
    let c = conv.c;
    let snaps = [(0, 2), (1, 3), (2, 4), (40, 5), (69, 6), (72, 7)];
    let seqs = Seqs::new(&[70, 5], &[0, 1]).snap(&snaps);
    let x = uniform(12, seqs.rows() * c, (-2.0, 2.0));
    let pool = conv.pool(&b);
    conv.run(&b, &x, &seqs, &pool);
    let got = b.download_f32(&pool).unwrap();
    let per_slot = c * (conv.w - 1);
    for (row, slot) in snaps {
        let (start, seq_slot) = if row < 70 { (0, 0) } else { (70, 1) };
        let stopped = conv.pool(&b);
        conv.run(
            &b,
            &x[start * c..(row as usize + 1) * c],
            &Seqs::new(&[row as usize + 1 - start], &[seq_slot]),
            &stopped,
        );
        let want = b.download_f32(&stopped).unwrap()[seq_slot as usize * per_slot..][..per_slot].to_vec();
        assert_eq!(got[slot as usize * per_slot..][..per_slot], want, "snapshot after row {row}");
    }
}

#[test]
fn rms_norm_gated_matches_reference() {
    let b = CpuBackend::new();
    // 70 rows of 4096 pass the threshold where rows are shared over the pool.
    for (n, d) in [(3, 8), (70, 4096)] {
        let (x, z, w) = (uniform(1, n * d, (-3.0, 3.0)), uniform(2, n * d, (-8.0, 8.0)), uniform(3, d, (-2.0, 2.0)));
        let out = b.rms_norm_gated(&upload(&b, &x, &[n, d]), &upload(&b, &z, &[n, d]), &upload(&b, &w, &[d]), 1e-6);
        let want = reference::rms_norm_gated(&x, &z, &w, f64::from(1e-6f32));
        assert_close(&b.download_f32(&out.unwrap()).unwrap(), &want, ELEMENTWISE_REL, &format!("[{n}, {d}]"));
    }
}

#[test]
fn sigmoid_mul_matches_reference() {
    let b = CpuBackend::new();
    for dims in [&[5, 7][..], &[9, 4, 4096]] {
        let n = dims.iter().product();
        let (x, g) = (uniform(4, n, (-3.0, 3.0)), uniform(5, n, (-100.0, 100.0)));
        let out = b.sigmoid_mul(&upload(&b, &x, dims), &upload(&b, &g, dims)).unwrap();
        assert_eq!(out.dims(), dims);
        let want = reference::sigmoid_mul(&x, &g);
        assert_close(&b.download_f32(&out).unwrap(), &want, ELEMENTWISE_REL, &format!("{dims:?}"));
    }
}

/// A `[t, 1]` gate scales each row of `x [t, n]` by its own sigmoid; other shapes are refused.
#[test]
fn sigmoid_mul_broadcasts_one_gate_per_row() {
    let b = CpuBackend::new();
    let (x, g) = (uniform(6, 3 * 5000, (-3.0, 3.0)), uniform(7, 3, (-4.0, 4.0)));
    let out = b.download_f32(&b.sigmoid_mul(&upload(&b, &x, &[3, 5000]), &upload(&b, &g, &[3, 1])).unwrap()).unwrap();
    let wide: Vec<f32> = g.iter().flat_map(|&v| std::iter::repeat_n(v, 5000)).collect();
    assert_close(&out, &reference::sigmoid_mul(&x, &wide), ELEMENTWISE_REL, "per-row gate");
    assert!(b.sigmoid_mul(&upload(&b, &x, &[3, 5000]), &upload(&b, &g, &[1, 3])).is_err());
}

/// Zeroing and copying touch exactly the slots named, in every pool given.
#[test]
fn state_slots_are_zeroed_and_copied_in_every_pool() {
    let b = CpuBackend::new();
    let (conv, delta) = (uniform(6, 4 * 6, (1.0, 2.0)), uniform(7, 4 * 2 * 3 * 5, (1.0, 2.0)));
    let pools = [upload(&b, &conv, &[4, 6, 1]), upload(&b, &delta, &[4, 2, 3, 5])];
    let refs = [&pools[0], &pools[1]];
    b.copy_state_slots(&refs, &[(1, 3), (0, 1)]).unwrap();
    b.zero_state_slots(&refs, &[2]).unwrap();
    for (pool, host) in pools.iter().zip([conv, delta]) {
        let per = host.len() / 4;
        let slot = |s: usize| host[s * per..(s + 1) * per].to_vec();
        let want = [slot(0), slot(0), vec![0.0; per], slot(1)].concat();
        assert_eq!(b.download_f32(pool).unwrap(), want, "pool {:?}", pool.dims());
    }
}

/// Every operand check of the recurrent ops answers `Err`, never a panic, and leaves the
/// pool as it was.
#[test]
fn bad_operands_are_errors() {
    let b = CpuBackend::new();
    let conv = Conv::new(13, 6, 3, 4);
    let pool = conv.pool(&b);
    let x = upload(&b, &uniform(14, 5 * 6, (-1.0, 1.0)), &[5, 6]);
    let weight = upload(&b, &conv.weight, &[6, 3]);
    let conv_with = |x: &Tensor, weight: &Tensor, pool: &Tensor, seqs: &Seqs| {
        seqs.with_batch(&b, |batch| b.causal_conv1d(x, weight, pool, batch))
    };
    let good = Seqs::new(&[2, 3], &[0, 1]);
    let bad_batches = [
        Seqs::new(&[2, 2], &[0, 1]),          // rows do not add up to t
        Seqs::new(&[2, 3], &[0, 4]),          // slot past the pool
        Seqs::new(&[2, 3], &[1, 1]),          // two sequences in one slot
        good.clone().snap(&[(5, 2)]),         // snapshot past the step
        good.clone().snap(&[(1, 0)]),         // snapshot into a sequence's slot
        good.clone().snap(&[(1, 2), (1, 2)]), // one slot written twice
        good.clone().snap(&[(4, 2), (3, 3)]), // snapshot rows descending
        good.clone().snap(&[(1, 9)]),         // snapshot slot past the pool
    ];
    for seqs in &bad_batches {
        assert!(conv_with(&x, &weight, &pool, seqs).is_err(), "conv accepted {:?}", seqs.snapshots);
    }
    let wrong_weight = upload(&b, &uniform(15, 6 * 4, (-1.0, 1.0)), &[6, 4]);
    assert!(conv_with(&x, &wrong_weight, &pool, &good).is_err(), "weight wider than the state");
    assert!(conv_with(&pool, &weight, &pool, &good).is_err(), "x is the pool");
    let (cu, slots) = (upload(&b, &[0.0, 2.0, 5.0], &[3]), upload_u32(&b, &[0, 1]));
    let f32_cu = RecurrentBatch { cu_seqlens: &cu, slots: &slots, snapshots: &[] };
    assert!(b.causal_conv1d(&x, &weight, &pool, &f32_cu).is_err(), "f32 cu_seqlens");
    assert_eq!(b.download_f32(&pool).unwrap(), conv.state, "a refused step wrote the pool");
    let z = upload(&b, &[0.0; 6], &[1, 6]);
    assert!(b.rms_norm_gated(&x, &z, &upload(&b, &[1.0; 6], &[6]), 1e-6).is_err(), "z rows");
    assert!(b.rms_norm_gated(&x, &x, &upload(&b, &[1.0; 5], &[5]), 1e-6).is_err(), "weight width");
    assert!(b.sigmoid_mul(&x, &z).is_err(), "gate shape");
    assert!(b.zero_state_slots(&[&pool], &[4]).is_err(), "zero past the pool");
    assert!(b.copy_state_slots(&[&pool], &[(0, 4)]).is_err(), "copy past the pool");
    bad_delta_operands_are_errors(&b);
}

fn bad_delta_operands_are_errors(b: &CpuBackend) {
    let layer = Layer::new(16, (2, 4, 4, 3), 3);
    let rows = layer.rows(17, 4, (-1.0, 1.0));
    let pool = layer.pool(b);
    let seqs = Seqs::new(&[4], &[0]);
    let (a_log, dt_bias) = (upload(b, &layer.a_log, &[4]), upload(b, &layer.dt_bias, &[4]));
    let qkv = upload(b, &rows.qkv, &[4, layer.width()]);
    let ab = upload(b, &rows.a, &[4, 4]);
    let short = upload(b, &rows.a[..12], &[3, 4]);
    let run = |qkv: &Tensor, a: &Tensor, rule: &DeltaRule<'_>, pool: &Tensor| {
        seqs.with_batch(b, |batch| b.gated_delta_rule(qkv, a, &ab, rule, pool, batch))
    };
    let rule = layer.rule(&a_log, &dt_bias);
    assert!(run(&qkv, &ab, &rule, &pool).is_ok(), "the good call");
    let uneven = DeltaRule { num_key_heads: 3, ..rule };
    let narrow = upload(b, &rows.qkv[..4 * 20], &[4, 20]);
    let cases: [(&str, &Tensor, &Tensor, DeltaRule<'_>, &Tensor); 5] = [
        ("h_v not a multiple of h_k", &qkv, &ab, uneven, &pool),
        ("qkv too narrow", &narrow, &ab, rule, &pool),
        ("a of 3 rows", &qkv, &short, rule, &pool),
        ("a_log of the wrong length", &qkv, &ab, DeltaRule { a_log: &short, ..rule }, &pool),
        ("state of the wrong head size", &qkv, &ab, rule, &upload(b, &layer.state, &[3, 4, 3, 4])),
    ];
    for (what, qkv, a, rule, pool) in cases {
        assert!(run(qkv, a, &rule, pool).is_err(), "{what}");
    }
    assert!(run(&pool, &ab, &rule, &pool).is_err(), "qkv is the pool");
}
