//! f64 references of the recurrent ops, written as their plain definitions (transformers'
//! `torch_recurrent_gated_delta_rule` row by row with the decay applied first, the
//! convolution over each sequence's padded inputs), from the f32 inputs the backend sees.
//!
//! Shared by the op conformance suite (`tests/ops/recurrent.rs`, every backend) and the CPU
//! backend's unit tests (`src/cpu/recurrent.rs` includes this file by path), so it names
//! nothing of either crate: snapshots are plain `(row, slot)` pairs.

/// The slot of a sequence that starts from a zero state and keeps none (the backend's
/// `NO_STATE_SLOT`).
pub(super) const NO_SLOT: u32 = u32::MAX;

/// A sequence's state at the start of a step: its slot's, or zeros without a slot.
fn initial(state: &[f64], slot: u32, per_slot: usize) -> Vec<f64> {
    if slot == NO_SLOT { vec![0.0; per_slot] } else { state[slot as usize * per_slot..][..per_slot].to_vec() }
}

/// Writes the sequences' states back to their slots (none without one) after the
/// snapshots.
fn store(state: &mut [f64], per_slot: usize, snaps: Vec<(usize, Vec<f64>)>, slots: &[u32], last: Vec<Vec<f64>>) {
    let own = slots.iter().zip(last).filter(|(s, _)| **s != NO_SLOT).map(|(&s, v)| (s as usize, v));
    for (slot, v) in snaps.into_iter().chain(own) {
        state[slot * per_slot..][..per_slot].copy_from_slice(&v);
    }
}

/// The sequences of a step as host data: `cu_seqlens`, `slots`, and the snapshots as
/// `(flat row, slot)` pairs.
pub(super) struct Step<'a> {
    pub(super) cu: &'a [u32],
    pub(super) slots: &'a [u32],
    pub(super) snapshots: &'a [(u32, u32)],
}

impl Step<'_> {
    /// Every row of every sequence in order, as `(sequence, flat row)`.
    fn rows(&self) -> Vec<(usize, usize)> {
        self.cu.windows(2).enumerate().flat_map(|(s, w)| (w[0] as usize..w[1] as usize).map(move |r| (s, r))).collect()
    }

    /// The slots that take a snapshot after flat row `row`.
    fn snapshots_after(&self, row: usize) -> Vec<usize> {
        self.snapshots.iter().filter(|&&(r, _)| r as usize == row).map(|&(_, slot)| slot as usize).collect()
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The convolution of `x [t, c]` by `weight [c, w]` with `state [slots, c, w - 1]`,
/// updated in place; returns `[t, c]`.
pub(super) fn conv(x: &[f32], weight: &[f32], (c, w): (usize, usize), state: &mut [f64], step: &Step<'_>) -> Vec<f64> {
    let kept = w - 1;
    let t = x.len() / c;
    // Each sequence's window of its last `w - 1` inputs, `[c, w - 1]` like a slot.
    let mut windows: Vec<Vec<f64>> = step.slots.iter().map(|&s| initial(state, s, c * kept)).collect();
    let mut out = vec![0f64; t * c];
    let mut snaps = Vec::new();
    for (s, row) in step.rows() {
        {
            let win = &mut windows[s];
            for ch in 0..c {
                let xv = f64::from(x[row * c + ch]);
                let past = &win[ch * kept..(ch + 1) * kept];
                let sum: f64 =
                    (0..w).map(|j| f64::from(weight[ch * w + j]) * if j < kept { past[j] } else { xv }).sum();
                out[row * c + ch] = silu(sum);
                if kept > 0 {
                    win.copy_within(ch * kept + 1..(ch + 1) * kept, ch * kept);
                    win[(ch + 1) * kept - 1] = xv;
                }
            }
        }
        snaps.extend(step.snapshots_after(row).into_iter().map(|slot| (slot, windows[s].clone())));
    }
    store(state, c * kept, snaps, step.slots, windows);
    out
}

/// The f32 inputs of a delta rule: `qkv [t, 2·h_k·d_k + h_v·d_v]`, `a, b [t, h_v]`,
/// `a_log, dt_bias [h_v]`, and the head shape `(h_k, h_v, d_k, d_v)`.
pub(super) struct DeltaInputs<'a> {
    pub(super) qkv: &'a [f32],
    pub(super) a: &'a [f32],
    pub(super) b: &'a [f32],
    pub(super) a_log: &'a [f32],
    pub(super) dt_bias: &'a [f32],
    pub(super) dims: (usize, usize, usize, usize),
}

fn l2_normalized(x: &[f32], scale: f64) -> Vec<f64> {
    let inv = 1.0 / (x.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() + 1e-6).sqrt();
    x.iter().map(|&v| f64::from(v) * inv * scale).collect()
}

/// The delta rule with `state [slots, h_v, d_k, d_v]` updated in place; returns
/// `o [t, h_v, d_v]`.
pub(super) fn delta_rule(inp: &DeltaInputs<'_>, state: &mut [f64], step: &Step<'_>) -> Vec<f64> {
    let (hk, hv, dk, dv) = inp.dims;
    let (width, per_slot) = (2 * hk * dk + hv * dv, hv * dk * dv);
    let mut states: Vec<Vec<f64>> = step.slots.iter().map(|&s| initial(state, s, per_slot)).collect();
    let mut out = vec![0f64; inp.qkv.len() / width * hv * dv];
    let mut snaps = Vec::new();
    for (s, row) in step.rows() {
        {
            let r = &inp.qkv[row * width..][..width];
            for j in 0..hv {
                let i = j / (hv / hk);
                let q = l2_normalized(&r[i * dk..][..dk], 1.0 / (dk as f64).sqrt());
                let k = l2_normalized(&r[(hk + i) * dk..][..dk], 1.0);
                let v: Vec<f64> = r[2 * hk * dk + j * dv..][..dv].iter().map(|&x| f64::from(x)).collect();
                let x = f64::from(inp.a[row * hv + j]) + f64::from(inp.dt_bias[j]);
                let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
                let g = -f64::from(inp.a_log[j]).exp() * softplus;
                let beta = 1.0 / (1.0 + (-f64::from(inp.b[row * hv + j])).exp());
                let st = &mut states[s][j * dk * dv..][..dk * dv];
                st.iter_mut().for_each(|e| *e *= g.exp());
                let kv: Vec<f64> = (0..dv).map(|c| (0..dk).map(|r| st[r * dv + c] * k[r]).sum()).collect();
                for r in 0..dk {
                    for c in 0..dv {
                        st[r * dv + c] += k[r] * beta * (v[c] - kv[c]);
                    }
                }
                for c in 0..dv {
                    out[(row * hv + j) * dv + c] = (0..dk).map(|r| st[r * dv + c] * q[r]).sum();
                }
            }
        }
        snaps.extend(step.snapshots_after(row).into_iter().map(|slot| (slot, states[s].clone())));
    }
    store(state, per_slot, snaps, step.slots, states);
    out
}

/// `w · x / √(mean(x²) + eps) · silu(z)` per row of `d`.
pub(super) fn rms_norm_gated(x: &[f32], z: &[f32], weight: &[f32], eps: f64) -> Vec<f64> {
    let d = weight.len();
    let mut out = Vec::with_capacity(x.len());
    for (xr, zr) in x.chunks_exact(d).zip(z.chunks_exact(d)) {
        let inv = 1.0 / (xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / d as f64 + eps).sqrt();
        out.extend((0..d).map(|i| f64::from(weight[i]) * f64::from(xr[i]) * inv * silu(f64::from(zr[i]))));
    }
    out
}

/// `x · sigmoid(gate)` elementwise.
pub(super) fn sigmoid_mul(x: &[f32], gate: &[f32]) -> Vec<f64> {
    x.iter().zip(gate).map(|(&x, &g)| f64::from(x) / (1.0 + (-f64::from(g)).exp())).collect()
}
