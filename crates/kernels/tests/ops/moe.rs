//! Conformance checks of the mixture-of-experts ops: top-k routing (order, ties,
//! renormalisation) and the routed expert MLPs against a naive per-token loop, with and
//! without adapters on the experts.

use met_kernels::{ExpertAdapter, ExpertDelta, ExpertTables, GpuBackend, MoeLora, NO_LORA_SLOT, Result, Routing};

use crate::harness::{
    Rng, assert_close, assert_close_within, assert_values, expect_err, stored, tolerance, upload_f32, upload_u32,
};

/// Router logits as multiples of 1/8 in `[-2, 2)`: exact in every float dtype, so all
/// backends see the same ties and the same order.
fn router_logits(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| (rng.below(32) as f32 - 16.0) / 8.0).collect()
}

/// Softmax of one row, then its `k` best experts (ties to the lower index) with their
/// weights, renormalised over the chosen ones when asked.
fn topk_reference(row: &[f32], k: usize, renormalize: bool) -> (Vec<u32>, Vec<f64>) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let probs: Vec<f64> = row.iter().map(|&x| f64::from(x - max).exp()).collect();
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(k);
    let norm: f64 = if renormalize { order.iter().map(|&i| probs[i]).sum() } else { probs.iter().sum() };
    (order.iter().map(|&i| i as u32).collect(), order.iter().map(|&i| probs[i] / norm).collect())
}

/// [`topk_reference`] of every row of `e` logits, back to back.
fn topk_reference_rows(logits: &[f32], e: usize, k: usize, renormalize: bool) -> (Vec<u32>, Vec<f64>) {
    let (mut ids, mut weights) = (Vec::new(), Vec::new());
    for row in logits.chunks(e) {
        let (i, w) = topk_reference(row, k, renormalize);
        ids.extend(i);
        weights.extend(w);
    }
    (ids, weights)
}

/// Top-k routing for k = 1, 3 and e, with and without renormalisation, on rows that include
/// a three-way tie: experts come best first with ties to the lower index, weights are the
/// softmax probabilities, and renormalised weights sum to 1.
pub fn topk_routing_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let (t, e) = (5, 8);
    let mut logits = router_logits(&mut Rng::new(20), t * e);
    let tie_row = [1.0, 3.0, 3.0, 0.0, 3.0, -1.0, 2.0, 2.0].map(|v: f32| v / 4.0);
    logits[4 * e..].copy_from_slice(&tie_row);
    let logits_t = upload_f32(b, &logits, &[t, e])?;
    for k in [1, 3, e] {
        for renormalize in [false, true] {
            let what = format!("topk_routing k={k} renormalize={renormalize}");
            let Routing { weights, experts } = b.topk_routing(&logits_t, k, renormalize)?;
            let (want_ids, want_w) = topk_reference_rows(&logits, e, k, renormalize);
            assert_eq!(experts.dims(), [t, k], "{what}: experts shape");
            assert_eq!(b.download_u32(&experts)?, want_ids, "{what}: experts");
            assert_close(b, &weights, &[t, k], &want_w, &what)?;
            if renormalize {
                let sums: Vec<f32> = b.download_f32(&weights)?.chunks(k).map(|r| r.iter().sum()).collect();
                assert_values(b, &sums, &vec![1.0; t], &format!("{what}: weight sums"));
            }
        }
    }
    let tie = b.topk_routing(&logits_t, 4, true)?.experts;
    assert_eq!(b.download_u32(&tie)?[4 * 4..], [1, 2, 4, 6], "ties go to the lower index");
    wide_topk_routing_matches_reference(b)
}

/// Qwen3-MoE's shape, top 8 of 128 experts: more experts than a warp has lanes, with ties
/// planted between experts one lane apart (97, 66) and on one lane (5, 37, 69), so a pick
/// that compared only within a lane or only across lanes would take the wrong one.
fn wide_topk_routing_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    let (t, e, k) = (4, 128, 8);
    let mut logits = router_logits(&mut Rng::new(21), t * e);
    for j in [5, 37, 69] {
        logits[j] = 9.0;
    }
    for j in [97, 66] {
        logits[e + j] = 7.5;
    }
    let logits_t = upload_f32(b, &logits, &[t, e])?;
    for renormalize in [false, true] {
        let what = format!("topk_routing 8 of 128, renormalize={renormalize}");
        let Routing { weights, experts } = b.topk_routing(&logits_t, k, renormalize)?;
        let (want_ids, want_w) = topk_reference_rows(&logits, e, k, renormalize);
        let got = b.download_u32(&experts)?;
        assert_eq!(got[..3], [5, 37, 69], "{what}: a tie on one lane goes to the lower index");
        assert_eq!(got[k..k + 2], [66, 97], "{what}: a tie across lanes goes to the lower index");
        assert_eq!(got, want_ids, "{what}: experts");
        assert_close(b, &weights, &[t, k], &want_w, &what)?;
    }
    Ok(())
}

/// `k = 0` and `k > e` are errors.
pub fn topk_routing_rejects_bad_k(b: &dyn GpuBackend) -> Result<()> {
    let logits = upload_f32(b, &[0.0; 8], &[2, 4])?;
    expect_err(b.topk_routing(&logits, 0, true), "topk_routing k = 0");
    expect_err(b.topk_routing(&logits, 5, false), "topk_routing k = 5 of 4 experts");
    Ok(())
}

/// Expert weights: `gate_up [e, 2i, h]` (gate rows first) and `down [e, h, i]`.
pub struct Experts {
    pub h: usize,
    pub i: usize,
    pub gate_up: Vec<f32>,
    pub down: Vec<f32>,
}

/// One expert's MLP on one token: `down · (silu(gate · x) * (up · x))`, in f64.
fn expert_reference(ex: &Experts, expert: usize, x: &[f32]) -> Vec<f64> {
    let (h, i) = (ex.h, ex.i);
    let gu = &ex.gate_up[expert * 2 * i * h..(expert + 1) * 2 * i * h];
    let proj = |r: usize| (0..h).map(|c| f64::from(gu[r * h + c]) * f64::from(x[c])).sum::<f64>();
    let act: Vec<f64> = (0..i).map(|r| proj(r) / (1.0 + (-proj(r)).exp()) * proj(i + r)).collect();
    let dn = &ex.down[expert * h * i..(expert + 1) * h * i];
    (0..h).map(|r| (0..i).map(|c| f64::from(dn[r * i + c]) * act[c]).sum()).collect()
}

/// Routed expert MLPs against a naive loop over each token's chosen experts, with the
/// routing taken from the backend's own `topk_routing` (downloaded for the reference).
pub fn moe_experts_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    check_moe(b, Case { t: 7, e: 4, h: 8, i: 5, k: 2, seed: 21, starved: None })
}

/// The same at sizes where a device groups rows into tiles: 1,200 (token, choice) slots
/// over 8 experts (several row tiles each), one expert that no token picks, inner sizes
/// that end part-way through a 64-wide tile (h = 128, i = 88 so 2i = 176), a decode-like
/// case of one token taking 8 of 16 experts, and batches of about 10 and 30 rows per expert
/// (on CUDA: tiles of 64 rows, 16 with the deep pipeline, 16 and 32 with the shallow one);
/// then steps of 3, 4 and 5 tokens sharing experts, with inner sizes that end part-way
/// through a tile.
pub fn moe_experts_grouped_tiles_match_reference(b: &dyn GpuBackend) -> Result<()> {
    check_moe(b, Case { t: 600, e: 8, h: 128, i: 88, k: 2, seed: 22, starved: Some(5) })?;
    check_moe(b, Case { t: 1, e: 16, h: 128, i: 64, k: 8, seed: 23, starved: None })?;
    check_moe(b, Case { t: 3, e: 8, h: 256, i: 40, k: 4, seed: 26, starved: Some(2) })?;
    check_moe(b, Case { t: 4, e: 8, h: 1032, i: 72, k: 3, seed: 27, starved: None })?;
    check_moe(b, Case { t: 5, e: 8, h: 256, i: 40, k: 4, seed: 28, starved: None })?;
    check_moe(b, Case { t: 40, e: 16, h: 64, i: 96, k: 4, seed: 24, starved: None })?;
    check_moe(b, Case { t: 120, e: 16, h: 64, i: 64, k: 4, seed: 25, starved: None })
}

/// One `moe_experts` check: sizes, the rng seed, and an expert whose router logit is below
/// every other's for every token (so no token picks it when `k < e`).
struct Case {
    t: usize,
    e: usize,
    h: usize,
    i: usize,
    k: usize,
    seed: u64,
    starved: Option<usize>,
}

/// The routed expert MLPs of tokens `x [t, h]` in f64: each token's `k` chosen experts
/// (`ids`) weighted by the routing's `weights`.
pub fn moe_reference(ex: &Experts, x: &[f32], ids: &[u32], weights: &[f32], k: usize) -> Vec<f64> {
    let h = ex.h;
    let mut want = vec![0f64; x.len()];
    for (tok, out) in want.chunks_mut(h).enumerate() {
        for j in 0..k {
            let y = expert_reference(ex, ids[tok * k + j] as usize, &x[tok * h..(tok + 1) * h]);
            for (o, v) in out.iter_mut().zip(y) {
                *o += f64::from(weights[tok * k + j]) * v;
            }
        }
    }
    want
}

fn check_moe(b: &dyn GpuBackend, c: Case) -> Result<()> {
    let Case { t, e, h, i, k, seed, starved } = c;
    let mut rng = Rng::new(seed);
    let ex = Experts { h, i, gate_up: stored(b, rng.vec(e * 2 * i * h)), down: stored(b, rng.vec(e * h * i)) };
    let x = stored(b, rng.vec(t * h));
    let mut logits = router_logits(&mut rng, t * e);
    if let Some(s) = starved {
        logits.chunks_mut(e).for_each(|row| row[s] = -4.0);
    }
    let routing = b.topk_routing(&upload_f32(b, &logits, &[t, e])?, k, true)?;
    let xt = upload_f32(b, &x, &[t, h])?;
    let (gate_up, down) = (upload_f32(b, &ex.gate_up, &[e, 2 * i, h])?, upload_f32(b, &ex.down, &[e, h, i])?);
    let out = b.moe_experts(&xt, &routing, &gate_up, &down)?;
    // With a shared expert's gated output added in: the bits of `sigmoid_mul_add` after the
    // routed experts, however a backend joins them.
    let shared = upload_f32(b, &stored(b, rng.vec(t * h)), &[t, h])?;
    let gate = upload_f32(b, &stored(b, rng.vec(t)), &[t, 1])?;
    let fused = b.download_f32(&b.moe_experts_shared(&xt, &routing, (&gate_up, &down), None, (&shared, &gate))?)?;
    let apart = b.download_f32(&b.sigmoid_mul_add(&shared, &gate, &out)?)?;
    for (j, (f, a)) in fused.iter().zip(&apart).enumerate() {
        assert_eq!(f.to_bits(), a.to_bits(), "moe_experts_shared t={t} e={e} h={h} at {j}: {f} against {a} apart");
    }
    // The gate as its weight (CUDA takes the product in the combining kernel for decode
    // batches): the bits of the product, then the ops apart.
    let gate_w = upload_f32(b, &stored(b, rng.vec(h)), &[1, h])?;
    let by_weight = (&shared, &gate_w);
    let fused =
        b.download_f32(&b.moe_experts_shared_gate_weight(&xt, &routing, (&gate_up, &down), None, by_weight)?)?;
    let gate = b.matmul(&xt, &gate_w, None)?;
    let apart = b.download_f32(&b.sigmoid_mul_add(&shared, &gate, &out)?)?;
    for (j, (f, a)) in fused.iter().zip(&apart).enumerate() {
        let what = format!("moe_experts_shared_gate_weight t={t} e={e} h={h} at {j}");
        assert_eq!(f.to_bits(), a.to_bits(), "{what}: {f} against {a} apart");
    }
    let (ids, weights) = (b.download_u32(&routing.experts)?, b.download_f32(&routing.weights)?);
    if let Some(s) = starved {
        assert!(!ids.contains(&(s as u32)), "expert {s} was meant to get no tokens");
    }
    let want = moe_reference(&ex, &x, &ids, &weights, k);
    // The gate/up projection, the SiLU, its product with up, and the down projection are
    // each rounded to the float dtype before the weighted sum: four chained roundings.
    let what = format!("moe_experts t={t} e={e} h={h} i={i} k={k}");
    assert_close_within(b, &out, &[t, h], &want, tolerance(b.float_dtype()).chained(4), &what)
}

/// An expert index past `e`, routing for the wrong number of tokens, and expert weights of
/// the wrong shape are errors.
pub fn moe_experts_rejects_bad_operands(b: &dyn GpuBackend) -> Result<()> {
    let (t, e, h, i) = (2, 4, 8, 5);
    let f = |dims: &[usize]| upload_f32(b, &vec![0.1; dims.iter().product()], dims);
    let routing = |ids: &[u32], rows: usize| -> Result<Routing> {
        let k = ids.len() / rows;
        Ok(Routing { weights: f(&[rows, k])?, experts: upload_u32(b, ids, &[rows, k])? })
    };
    let (x, gate_up, down) = (f(&[t, h])?, f(&[e, 2 * i, h])?, f(&[e, h, i])?);
    expect_err(b.moe_experts(&x, &routing(&[0, 1, 2, 4], t)?, &gate_up, &down), "expert 4 of 4");
    expect_err(b.moe_experts(&x, &routing(&[0, 1, 2, 3, 0, 1], 3)?, &gate_up, &down), "routing for 3 of 2 tokens");
    let ok = routing(&[0, 1, 2, 3], t)?;
    expect_err(b.moe_experts(&x, &ok, &f(&[e, 2 * i, h + 1])?, &down), "gate_up hidden size");
    expect_err(b.moe_experts(&x, &ok, &gate_up, &f(&[e, h, i + 1])?), "down intermediate size");
    let weights = (&gate_up, &down);
    let shared = |dims: &[usize], gate: &[usize]| b.moe_experts_shared(&x, &ok, weights, None, (&f(dims)?, &f(gate)?));
    expect_err(shared(&[t, h + 1], &[t, 1]), "a shared expert output one column wide");
    expect_err(shared(&[t, h], &[t, 2]), "shared expert gates [t, 2]");
    Ok(())
}

/// A zero intermediate size (`gate_up [e, 0, h]`, `down [e, h, 0]`) is a degenerate but
/// well-formed MLP: the op must return zeros or an error, never panic.
pub fn moe_experts_zero_intermediate_does_not_panic(b: &dyn GpuBackend) -> Result<()> {
    let (t, e, h) = (2, 2, 4);
    let routing = Routing { weights: upload_f32(b, &[1.0, 1.0], &[t, 1])?, experts: upload_u32(b, &[0, 1], &[t, 1])? };
    let x = upload_f32(b, &[0.5; 8], &[t, h])?;
    let (gate_up, down) = (b.zeros(&[e, 0, h], b.float_dtype())?, b.zeros(&[e, h, 0], b.float_dtype())?);
    let result = b.moe_experts(&x, &routing, &gate_up, &down);
    if let Ok(out) = result {
        assert_close(b, &out, &[t, h], &[0.0; 8], "moe_experts with no intermediate")?;
    }
    Ok(())
}

/// One adapter's delta on one expert stack, for the reference: `a [e, r, in]`,
/// `b [e, out, r]`, as stored.
struct Delta {
    a: Vec<f32>,
    b: Vec<f32>,
    r: usize,
    scale: f32,
}

impl Delta {
    fn random(
        b: &dyn GpuBackend,
        rng: &mut Rng,
        (e, r, inputs, outputs): (usize, usize, usize, usize),
        scale: f32,
    ) -> Self {
        Self { a: stored(b, rng.vec(e * r * inputs)), b: stored(b, rng.vec(e * outputs * r)), r, scale }
    }

    /// `y += scale · b[x] · (a[x] · v)` in f64, for expert `x`.
    fn add(&self, x: usize, v: &[f64], y: &mut [f64]) {
        let (k, n, r) = (v.len(), y.len(), self.r);
        let a = &self.a[x * r * k..(x + 1) * r * k];
        let b = &self.b[x * n * r..(x + 1) * n * r];
        let s: Vec<f64> = (0..r).map(|j| (0..k).map(|c| f64::from(a[j * k + c]) * v[c]).sum()).collect();
        for (o, out) in y.iter_mut().enumerate() {
            *out += f64::from(self.scale) * (0..r).map(|j| f64::from(b[o * r + j]) * s[j]).sum::<f64>();
        }
    }
}

/// Routed experts with adapters on them against the f64 loop: tokens of the base model
/// (bit for bit `moe_experts`), of an adapter on gate/up and down (rank 3), of one on down
/// only (rank 2), and of a slot whose adapter leaves these experts alone.
pub fn moe_experts_lora_matches_reference(b: &dyn GpuBackend) -> Result<()> {
    if !b.supports_expert_lora() {
        return Ok(());
    }
    let (t, e, h, i, k) = (9, 4, 24, 10, 2);
    let mut rng = Rng::new(31);
    let ex = Experts { h, i, gate_up: stored(b, rng.vec(e * 2 * i * h)), down: stored(b, rng.vec(e * h * i)) };
    let x = stored(b, rng.vec(t * h));
    let routing = b.topk_routing(&upload_f32(b, &router_logits(&mut rng, t * e), &[t, e])?, k, true)?;
    let gu0 = Delta::random(b, &mut rng, (e, 3, h, 2 * i), 0.75);
    let dn0 = Delta::random(b, &mut rng, (e, 3, i, h), 0.75);
    let dn1 = Delta::random(b, &mut rng, (e, 2, i, h), 2.0);
    let n = NO_LORA_SLOT;
    let slots = [n, 0, 1, 0, n, 2, 1, 0, n];
    let up = |v: &[f32], dims: &[usize]| upload_f32(b, v, dims);
    let (gu0a, gu0b) = (up(&gu0.a, &[e, 3, h])?, up(&gu0.b, &[e, 2 * i, 3])?);
    let (dn0a, dn0b) = (up(&dn0.a, &[e, 3, i])?, up(&dn0.b, &[e, h, 3])?);
    let (dn1a, dn1b) = (up(&dn1.a, &[e, 2, i])?, up(&dn1.b, &[e, h, 2])?);
    let delta = |a, b, scale| Some(ExpertDelta { a, b, scale });
    let adapters = [
        Some(ExpertAdapter { gate_up: delta(&gu0a, &gu0b, gu0.scale), down: delta(&dn0a, &dn0b, dn0.scale) }),
        Some(ExpertAdapter { gate_up: None, down: delta(&dn1a, &dn1b, dn1.scale) }),
        None,
    ];
    let (xt, gate_up, down) = (up(&x, &[t, h])?, up(&ex.gate_up, &[e, 2 * i, h])?, up(&ex.down, &[e, h, i])?);
    let rows = upload_u32(b, &slots, &[t])?;
    let lora = MoeLora { rows: &rows, slots: &adapters, tables: None };
    let out = b.moe_experts_lora(&xt, &routing, &gate_up, &down, &lora)?;
    // A backend that keeps device tables of the deltas computes the same from them.
    if let (Some(gu_table), Some(dn_table)) = (b.expert_lora_table(3)?, b.expert_lora_table(3)?) {
        for (slot, adapter) in adapters.iter().enumerate() {
            b.write_expert_lora_table(&gu_table, slot, adapter.and_then(|a| a.gate_up).as_ref())?;
            b.write_expert_lora_table(&dn_table, slot, adapter.and_then(|a| a.down).as_ref())?;
        }
        let tables = ExpertTables { gate_up: &gu_table, down: &dn_table, max_ranks: (4, 4) };
        let from_tables =
            b.moe_experts_lora(&xt, &routing, &gate_up, &down, &MoeLora { tables: Some(tables), ..lora })?;
        assert!(b.download_f32(&from_tables)? == b.download_f32(&out)?, "expert deltas from device tables differ");
    }
    let base = b.download_f32(&b.moe_experts(&xt, &routing, &gate_up, &down)?)?;
    let got = b.download_f32(&out)?;
    for (tok, &s) in slots.iter().enumerate() {
        let same = got[tok * h..(tok + 1) * h] == base[tok * h..(tok + 1) * h];
        assert_eq!(same, s == n || s == 2, "token {tok} (slot {s}): adapted rows differ from the base, others not");
    }

    let (ids, weights) = (b.download_u32(&routing.experts)?, b.download_f32(&routing.weights)?);
    let mut want = vec![0f64; t * h];
    for (tok, out) in want.chunks_mut(h).enumerate() {
        let xs: Vec<f64> = x[tok * h..(tok + 1) * h].iter().map(|&v| f64::from(v)).collect();
        for j in 0..k {
            let x_ = ids[tok * k + j] as usize;
            let gu = &ex.gate_up[x_ * 2 * i * h..(x_ + 1) * 2 * i * h];
            let mut hidden: Vec<f64> =
                (0..2 * i).map(|r| (0..h).map(|c| f64::from(gu[r * h + c]) * xs[c]).sum()).collect();
            if slots[tok] == 0 {
                gu0.add(x_, &xs, &mut hidden);
            }
            let act: Vec<f64> = (0..i).map(|r| hidden[r] / (1.0 + (-hidden[r]).exp()) * hidden[i + r]).collect();
            let dn = &ex.down[x_ * h * i..(x_ + 1) * h * i];
            let mut y: Vec<f64> = (0..h).map(|r| (0..i).map(|c| f64::from(dn[r * i + c]) * act[c]).sum()).collect();
            match slots[tok] {
                0 => dn0.add(x_, &act, &mut y),
                1 => dn1.add(x_, &act, &mut y),
                _ => {}
            }
            for (o, v) in out.iter_mut().zip(y) {
                *o += f64::from(weights[tok * k + j]) * v;
            }
        }
    }
    // As `moe_experts`, with each delta's product and addition rounded too.
    let what = format!("moe_experts_lora t={t} e={e} h={h} i={i} k={k}");
    assert_close_within(b, &out, &[t, h], &want, tolerance(b.float_dtype()).chained(6), &what)?;

    let bad = upload_u32(b, &[3; 9], &[t])?;
    expect_err(
        b.moe_experts_lora(&xt, &routing, &gate_up, &down, &MoeLora { rows: &bad, slots: &adapters, tables: None }),
        "a token slot past the adapters",
    );
    let wrong = [Some(ExpertAdapter { gate_up: delta(&dn0a, &dn0b, 1.0), down: None })];
    let rows0 = upload_u32(b, &[0; 9], &[t])?;
    expect_err(
        b.moe_experts_lora(&xt, &routing, &gate_up, &down, &MoeLora { rows: &rows0, slots: &wrong, tables: None }),
        "down-shaped deltas on gate/up",
    );
    Ok(())
}
