//! Row-wise ops of the CPU backend: norms, rotary, activations, gathers.

use crate::Tensor;
use crate::error::{Error, Result, ensure};

use super::{f32_tensor, read_f32, read_u32, read_weight};

/// Rows below this many elements are processed in groups, so each task stays worthwhile.
const MIN_TASK_ELEMS: usize = 1 << 12;

/// Outputs below this many elements are computed on the calling thread: handing a decode
/// step's norms, activations and rotations (a few thousand elements each, ~200 a token)
/// to other threads costs more than computing them.
pub(super) const SERIAL_ELEMS: usize = 1 << 16;

fn rows_per_task(cols: usize) -> usize {
    (MIN_TASK_ELEMS / cols.max(1)).max(1)
}

/// `f(i, row i of out)` for the rows of `n` elements of `out`: shared over the spinning
/// pool (which the matmuls and attention use, so its workers are awake) when the output
/// is large, else on this thread ([`SERIAL_ELEMS`]).
pub(super) fn for_each_row(out: &mut [f32], n: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let n = n.max(1);
    if out.len() < SERIAL_ELEMS {
        out.chunks_mut(n).enumerate().for_each(|(i, o)| f(i, o));
    } else {
        let rows = rows_per_task(n);
        super::pool::SpinPool::global().run_pieces(out, rows * n, &|piece, o| {
            o.chunks_mut(n).enumerate().for_each(|(i, o)| f(piece * rows + i, o));
        });
    }
}

pub(super) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    let (_, n) = x.shape().rows_cols();
    ensure(n > 0 && weight.dims() == [n], "rms_norm", || {
        format!("weight {:?} does not match x {:?}", weight.dims(), x.dims())
    })?;
    let (xs, ws) = (read_f32("rms_norm", x)?, read_f32("rms_norm", weight)?);
    let mut out = vec![0f32; xs.len()];
    for_each_row(&mut out, n, |i, o| {
        let r = &xs[i * n..(i + 1) * n];
        let mean_sq = r.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for ((o, v), w) in o.iter_mut().zip(r).zip(ws.iter()) {
            *o = v * inv * w;
        }
    });
    Ok(f32_tensor(out, x.dims()))
}

pub(super) fn add(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    ensure(a.dims() == b.dims(), "add", || format!("{:?} + {:?}", a.dims(), b.dims()))?;
    let (xa, xb) = (read_f32("add", a)?, read_f32("add", b)?);
    let mut out = vec![0f32; xa.len()];
    for_each_row(&mut out, MIN_TASK_ELEMS, |i, o| {
        let at = i * MIN_TASK_ELEMS;
        for ((o, a), b) in o.iter_mut().zip(&xa[at..]).zip(&xb[at..]) {
            *o = a + b;
        }
    });
    Ok(f32_tensor(out, a.dims()))
}

pub(super) fn rotary(x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<Tensor> {
    let dims = x.dims();
    let (_, h, d, half) = crate::check::rotary(x, positions, inv_freq)?;
    let (xs, pos, freq) = (read_f32("rotary", x)?, read_u32("rotary", positions)?, read_f32("rotary", inv_freq)?);
    let mut out = xs.to_vec();
    for_each_row(&mut out, h * d, |i, row| {
        let p = pos[i];
        let (cos, sin): (Vec<f32>, Vec<f32>) =
            freq.iter().map(|f| (p as f32 * f).sin_cos()).map(|(s, c)| (c, s)).unzip();
        for head in row.chunks_mut(d) {
            for i in 0..half {
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos[i] - b * sin[i];
                head[i + half] = b * cos[i] + a * sin[i];
            }
        }
    });
    Ok(f32_tensor(out, dims))
}

pub(super) fn silu_mul(x: &Tensor) -> Result<Tensor> {
    gated(x, "silu_mul", silu_mul_row)
}

pub(super) fn gelu_tanh_mul(x: &Tensor) -> Result<Tensor> {
    gated(x, "gelu_tanh_mul", |gate, up, out| {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = gelu_tanh(g) * u;
        }
    })
}

/// `out = silu(gate) · up`, with `silu(g) = g / (1 + e^-g)` written over `e = e^-|g|` (at
/// most 1, so nothing overflows): `g / (1 + e)` for `g >= 0`, `g e / (1 + e)` below. The
/// exponential is the softmax's vectorised one (within 2 ulp of libm's), compiled for AVX2
/// where the CPU has it; both builds give the same bits (no fused multiply-adds).
fn silu_mul_row(gate: &[f32], up: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::SimdLevel::current() >= crate::quant::SimdLevel::Avx2 {
        // SAFETY: the level is at least AVX2, so the CPU has AVX2.
        return unsafe { silu_mul_row_avx2(gate, up, out) };
    }
    silu_mul_row_body(gate, up, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn silu_mul_row_avx2(gate: &[f32], up: &[f32], out: &mut [f32]) {
    silu_mul_row_body(gate, up, out);
}

#[inline(always)]
fn silu_mul_row_body(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for (o, g) in out.iter_mut().zip(gate) {
        *o = -g.abs();
    }
    super::attention::exp_in_place(out);
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let e = *o;
        *o = if g >= 0.0 { g } else { g * e } / (1.0 + e) * u;
    }
}

/// PyTorch's `gelu(approximate="tanh")`.
fn gelu_tanh(g: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
}

/// `act(x[:, :n]) * x[:, n:]` for `x [t, 2n]`, a row at a time by `act_mul(gate, up, out)`.
fn gated(x: &Tensor, op: &'static str, act_mul: impl Fn(&[f32], &[f32], &mut [f32]) + Sync + Send) -> Result<Tensor> {
    let (rows, n2) = x.shape().rows_cols();
    ensure(n2 % 2 == 0, op, || format!("last dim of {:?} is odd", x.dims()))?;
    let n = n2 / 2;
    let xs = read_f32(op, x)?;
    let mut out = vec![0f32; rows * n];
    for_each_row(&mut out, n, |i, o| {
        let (gate, up) = xs[i * n2..(i + 1) * n2].split_at(n);
        act_mul(gate, up, o);
    });
    let mut dims = x.dims().to_vec();
    *dims.last_mut().expect("rank >= 1 checked by rows_cols") = n;
    Ok(f32_tensor(out, &dims))
}

/// `f(x)` elementwise, in f32.
pub(super) fn map(x: &Tensor, op: &'static str, f: impl Fn(f32) -> f32 + Sync) -> Result<Tensor> {
    let xs = read_f32(op, x)?;
    let mut out = vec![0f32; xs.len()];
    for_each_row(&mut out, MIN_TASK_ELEMS, |i, o| {
        for (o, &v) in o.iter_mut().zip(&xs[i * MIN_TASK_ELEMS..]) {
            *o = f(v);
        }
    });
    Ok(f32_tensor(out, x.dims()))
}

pub(super) fn embedding(ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    let td = table.dims();
    ensure(td.len() == 2 && ids.dims().len() == 1, "embedding", || {
        format!("ids {:?} / table {td:?} are not [t] / [v, h]", ids.dims())
    })?;
    gather(ids, table, "embedding")
}

pub(super) fn gather_rows(x: &Tensor, rows: &Tensor) -> Result<Tensor> {
    ensure(x.dims().len() == 2 && rows.dims().len() == 1, "gather_rows", || {
        format!("x {:?} / rows {:?} are not [m, n] / [r]", x.dims(), rows.dims())
    })?;
    gather(rows, x, "gather_rows")
}

fn gather(idx: &Tensor, table: &Tensor, op: &'static str) -> Result<Tensor> {
    let (v, h) = (table.dims()[0], table.dims()[1]);
    let (ids, tab) = (read_u32(op, idx)?, read_weight(op, table)?);
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
        return Err(Error::InvalidArgument(format!("{op}: index {bad} is out of range for {v} rows")));
    }
    let mut out = vec![0f32; ids.len() * h];
    for_each_row(&mut out, h, |r, o| {
        let i = ids[r] as usize;
        o.copy_from_slice(&tab.rows_f32(i..i + 1, h));
    });
    Ok(f32_tensor(out, &[ids.len(), h]))
}

pub(super) fn split_columns(x: &Tensor, widths: &[usize]) -> Result<Vec<Tensor>> {
    let d = x.dims();
    ensure(d.len() == 2 && widths.iter().sum::<usize>() == d[1], "split_columns", || {
        format!("widths {widths:?} do not partition {d:?}")
    })?;
    let (m, n) = (d[0], d[1]);
    if n == 0 {
        return Ok(widths.iter().map(|_| f32_tensor(Vec::new(), &[m, 0])).collect());
    }
    let xs = read_f32("split_columns", x)?;
    let mut start = 0;
    let mut parts = Vec::with_capacity(widths.len());
    for &w in widths {
        let mut out = Vec::with_capacity(m * w);
        for row in xs.chunks_exact(n) {
            out.extend_from_slice(&row[start..start + w]);
        }
        parts.push(f32_tensor(out, &[m, w]));
        start += w;
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::{silu_mul_row, silu_mul_row_body};

    /// SiLU is within 4 ulp of its f64 value from -100 to 100 (the exponential's 2 ulp and
    /// three roundings; below -87, where it is under 2e-36, it is 0), saturates
    /// at the infinities and keeps NaN.
    #[test]
    fn silu_matches_f64_within_four_ulp() {
        let gate: Vec<f32> = (-1_000_000..=1_000_000).map(|i| i as f32 * 1e-4).collect();
        let up = vec![1f32; gate.len()];
        let mut got = vec![0f32; gate.len()];
        silu_mul_row(&gate, &up, &mut got);
        for (&g, &s) in gate.iter().zip(&got) {
            let want = f64::from(g) / (1.0 + (-f64::from(g)).exp());
            let ulp = f64::from(f32::from_bits((want as f32).abs().to_bits() + 1) - (want as f32).abs());
            // Below -87 the exponential is flushed to 0, and so is SiLU (|SiLU| < 2e-36 there).
            let bound = if g < -87.0 { 2e-36 } else { 4.0 * ulp };
            assert!((f64::from(s) - want).abs() <= bound, "silu({g}) = {s}, want {want}");
        }
        let mut edges = [0f32; 4];
        silu_mul_row(&[f32::INFINITY, -200.0, f32::NAN, 0.0], &[2.0; 4], &mut edges);
        assert_eq!(edges[..2], [f32::INFINITY, -0.0]);
        assert!(edges[2].is_nan());
        assert_eq!(edges[3], 0.0);
    }

    /// The AVX2 build of the SiLU row gives the portable one's bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn silu_builds_agree_bit_for_bit() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let gate: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.731).sin() * 30.0).collect();
        let up: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.377).cos()).collect();
        let (mut portable, mut wide) = (vec![0f32; gate.len()], vec![0f32; gate.len()]);
        silu_mul_row_body(&gate, &up, &mut portable);
        // SAFETY: the CPU has AVX2 (checked above).
        unsafe { super::silu_mul_row_avx2(&gate, &up, &mut wide) };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&portable), bits(&wide));
    }
}
