//! Operand checks shared by every backend, so that each rejects exactly the same shapes
//! with the same messages. Each returns the sizes the op needs; dtype checks stay with the
//! backend, which knows what it stores.

use crate::backend::{AttentionParams, Routing, UniformRun};
use crate::error::{Error, Result, ensure};
use crate::{DType, Tensor};

/// `matmul`: `x [m, k]`, `w [n, k]`, `bias [n]`; returns `(m, k, n)`.
pub(crate) fn matmul(x: &Tensor, w: &Tensor, bias: Option<&Tensor>) -> Result<(usize, usize, usize)> {
    let (xd, wd) = (x.dims(), w.dims());
    ensure(xd.len() == 2 && wd.len() == 2 && xd[1] == wd[1], "matmul", || {
        format!("x {xd:?} and w {wd:?} are not [m, k] and [n, k]")
    })?;
    let (m, k, n) = (xd[0], xd[1], wd[0]);
    if let Some(b) = bias {
        ensure(b.dims() == [n], "matmul", || format!("bias {:?} does not match n = {n}", b.dims()))?;
    }
    Ok((m, k, n))
}

/// `rotary`: `x [t, h, d]`, `positions [t]`, `inv_freq [half]` with `2·half ≤ d`; returns
/// `(t, h, d, half)`.
pub(crate) fn rotary(x: &Tensor, positions: &Tensor, inv_freq: &Tensor) -> Result<(usize, usize, usize, usize)> {
    let dims = x.dims();
    ensure(dims.len() == 3, "rotary", || format!("x {dims:?} is not [t, h, d]"))?;
    let (t, h, d) = (dims[0], dims[1], dims[2]);
    let half = inv_freq.elem_count();
    ensure(positions.dims() == [t], "rotary", || format!("positions {:?} for {t} tokens", positions.dims()))?;
    ensure(2 * half <= d && half > 0, "rotary", || format!("{half} frequencies do not fit head dim {d}"))?;
    Ok((t, h, d, half))
}

/// `softcap`: the cap must be a positive number.
pub(crate) fn softcap(cap: f32) -> Result<()> {
    ensure(cap > 0.0 && cap.is_finite(), "softcap", || format!("cap {cap} is not a positive number"))
}

/// The sizes of a `write_kv` call.
pub(crate) struct WriteKv {
    /// Elements per row (`h_kv · d`).
    pub(crate) row: usize,
    /// Slots in the pool.
    pub(crate) capacity: usize,
}

/// `write_kv`: equal pools `[blocks, block_size, h_kv, d]`, `k, v [t, h_kv, d]` that are not
/// the pools themselves, `slots [t]`.
pub(crate) fn write_kv(k: &Tensor, v: &Tensor, k_cache: &Tensor, v_cache: &Tensor, slots: &Tensor) -> Result<WriteKv> {
    let cd = k_cache.dims();
    ensure(cd.len() == 4 && v_cache.dims() == cd, "write_kv", || {
        format!("caches {cd:?} / {:?} are not equal [blocks, block_size, h_kv, d]", v_cache.dims())
    })?;
    let row = cd[2] * cd[3];
    let t = slots.elem_count();
    for (name, x) in [("k", k), ("v", v)] {
        ensure(x.elem_count() == t * row && x.dims().first() == Some(&t), "write_kv", || {
            format!("{name} {:?} is not [{t}, {}, {}]", x.dims(), cd[2], cd[3])
        })?;
    }
    if [k, v].iter().any(|x| x.same_storage(k_cache) || x.same_storage(v_cache)) {
        return Err(Error::InvalidArgument("write_kv: k and v must not be the cache pools themselves".into()));
    }
    Ok(WriteKv { row, capacity: cd[0] * cd[1] })
}

/// `random_uniform`: the runs fill `dims` exactly and every bound is finite.
pub(crate) fn uniform_runs(dims: &[usize], runs: &[UniformRun]) -> Result<()> {
    let (n, total) = (dims.iter().product::<usize>(), runs.iter().map(|r| r.len).sum::<usize>());
    ensure(total == n, "random_uniform", || format!("runs of {total} elements for a tensor {dims:?} of {n}"))?;
    ensure(runs.iter().all(|r| r.bound.is_finite()), "random_uniform", || "a run's bound is not finite".into())
}

/// Every slot inside a pool of `capacity` slots.
pub(crate) fn slots_in_pool(slots: &[u32], capacity: usize) -> Result<()> {
    match slots.iter().find(|&&s| s as usize >= capacity) {
        Some(bad) => Err(Error::InvalidArgument(format!("write_kv: slot {bad} is past the pool of {capacity} slots"))),
        None => Ok(()),
    }
}

/// `paged_attention`: `q [t, h, d]`, pools `[blocks, block_size, h_kv, d]`, `h` a multiple of
/// `h_kv`, a non-empty window; returns `(t, block_size, blocks)`.
pub(crate) fn attention(
    q: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    p: &AttentionParams,
) -> Result<(usize, usize, usize)> {
    let (h, hkv, d) = (p.num_heads, p.num_kv_heads, p.head_dim);
    ensure(hkv > 0 && h % hkv == 0, "paged_attention", || format!("{h} heads cannot share {hkv} kv heads"))?;
    let t = q.dims().first().copied().unwrap_or(0);
    ensure(q.dims() == [t, h, d], "paged_attention", || format!("q {:?} is not [t, {h}, {d}]", q.dims()))?;
    let cd = k_cache.dims();
    ensure(cd.len() == 4 && cd[2] == hkv && cd[3] == d && v_cache.dims() == cd, "paged_attention", || {
        format!("caches {cd:?} are not [blocks, block_size, {hkv}, {d}]")
    })?;
    if p.sliding_window == Some(0) {
        return Err(Error::InvalidArgument("paged_attention: a sliding window of 0 sees nothing".into()));
    }
    Ok((t, cd[1], cd[0]))
}

/// The sizes of a `moe_experts` call.
pub(crate) struct Moe {
    pub(crate) t: usize,
    pub(crate) h: usize,
    pub(crate) e: usize,
    pub(crate) i: usize,
    pub(crate) k: usize,
}

/// `moe_experts`: `x [t, h]`, `gate_up [e, 2i, h]`, `down [e, h, i]`, routing `[t, k]`.
pub(crate) fn moe(x: &Tensor, routing: &Routing, gate_up: &Tensor, down: &Tensor) -> Result<Moe> {
    let (xd, gd, dd) = (x.dims(), gate_up.dims(), down.dims());
    ensure(xd.len() == 2 && gd.len() == 3 && dd.len() == 3, "moe_experts", || {
        format!("x {xd:?}, gate_up {gd:?}, down {dd:?} are not [t, h], [e, 2i, h], [e, h, i]")
    })?;
    let (t, h, e, i) = (xd[0], xd[1], gd[0], dd[2]);
    ensure(gd == [e, 2 * i, h] && dd == [e, h, i], "moe_experts", || {
        format!("gate_up {gd:?} and down {dd:?} do not match x {xd:?}")
    })?;
    let k = routing.experts.dims().get(1).copied().unwrap_or(0);
    ensure(routing.experts.dims() == [t, k] && routing.weights.dims() == [t, k], "moe_experts", || {
        format!("routing {:?} does not cover {t} tokens", routing.experts.dims())
    })?;
    Ok(Moe { t, h, e, i, k })
}

/// Checks the operands of `mask_logits`: `logits f32 or bf16 [n, v]`, `rows u32 [r]`,
/// `masks u32 [r, ceil(v / 32)]`. Returns `(n, v)`.
pub(crate) fn token_masks(logits: &Tensor, rows: &Tensor, masks: &Tensor) -> Result<(usize, usize)> {
    const OP: &str = "mask_logits";
    if !matches!(logits.dtype(), DType::F32 | DType::BF16) {
        return Err(Error::DType { op: OP, expected: DType::F32, got: logits.dtype() });
    }
    for (t, dtype) in [(rows, DType::U32), (masks, DType::U32)] {
        if t.dtype() != dtype {
            return Err(Error::DType { op: OP, expected: dtype, got: t.dtype() });
        }
    }
    let (l, r, m) = (logits.dims(), rows.dims(), masks.dims());
    ensure(l.len() == 2 && r.len() == 1 && m.len() == 2 && m[0] == r[0] && m[1] == l[1].div_ceil(32), OP, || {
        format!("logits {l:?} / rows {r:?} / masks {m:?} are not [n, v] / [r] / [r, ceil(v / 32)]")
    })?;
    Ok((l[0], l[1]))
}

/// The host definition of `mask_logits` over `xs [n, v]`: rows `rows`, each with the tokens
/// whose bit is clear in its mask row set to `-inf`.
pub(crate) fn masked_rows(xs: &[f32], n: usize, v: usize, rows: &[u32], masks: &[u32]) -> Result<Vec<f32>> {
    if let Some(bad) = rows.iter().find(|&&r| r as usize >= n) {
        return Err(Error::InvalidArgument(format!("mask_logits: row {bad} is past the {n} logits rows")));
    }
    let words = v.div_ceil(32);
    let mut out = Vec::with_capacity(rows.len() * v);
    for (i, &r) in rows.iter().enumerate() {
        let (row, mask) = (&xs[r as usize * v..][..v], &masks[i * words..][..words]);
        out.extend(
            row.iter().enumerate().map(|(t, &x)| if mask[t / 32] >> (t % 32) & 1 == 1 { x } else { f32::NEG_INFINITY }),
        );
    }
    Ok(out)
}

/// Checks the operands of `gather_u32`: `src u32 [m]` and indices below `m`. Returns `m`.
pub(crate) fn gather_u32(src: &Tensor, rows: &[u32]) -> Result<usize> {
    const OP: &str = "gather_u32";
    if src.dtype() != DType::U32 {
        return Err(Error::DType { op: OP, expected: DType::U32, got: src.dtype() });
    }
    let d = src.dims();
    ensure(d.len() == 1, OP, || format!("src {d:?} is not a vector"))?;
    if let Some(bad) = rows.iter().find(|&&r| r as usize >= d[0]) {
        return Err(Error::InvalidArgument(format!("{OP}: index {bad} is past the {} values", d[0])));
    }
    Ok(d[0])
}
