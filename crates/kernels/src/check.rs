//! Operand checks shared by every backend, so that each rejects exactly the same shapes
//! with the same messages. Each returns the sizes the op needs; dtype checks stay with the
//! backend, which knows what it stores.

use crate::backend::{AttentionParams, DeltaRule, NO_STATE_SLOT, RecurrentBatch, Routing, StateSnapshot, UniformRun};
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

// --- recurrent layers ----------------------------------------------------------------------

/// The step tensors of a [`RecurrentBatch`]: `cu_seqlens u32 [s + 1]` and `slots u32 [s]`.
fn recurrent_batch(op: &'static str, batch: &RecurrentBatch<'_>) -> Result<()> {
    for t in [batch.cu_seqlens, batch.slots] {
        if t.dtype() != DType::U32 {
            return Err(Error::DType { op, expected: DType::U32, got: t.dtype() });
        }
    }
    let (cu, slots) = (batch.cu_seqlens.dims(), batch.slots.dims());
    ensure(cu.len() == 1 && slots.len() == 1 && cu[0] == slots[0] + 1, op, || {
        format!("cu_seqlens {cu:?} / slots {slots:?} are not [s + 1] / [s]")
    })
}

/// Refuses an operand that is the state pool itself: the op writes the pool while it reads
/// its operands.
fn not_the_pool(op: &'static str, state: &Tensor, operands: &[&Tensor]) -> Result<()> {
    if operands.iter().any(|x| x.same_storage(state)) {
        return Err(Error::InvalidArgument(format!("{op}: an operand is the state pool itself")));
    }
    Ok(())
}

/// The sizes of a `causal_conv1d` call.
pub(crate) struct Conv {
    /// Rows of the step.
    pub(crate) t: usize,
    /// Channels.
    pub(crate) c: usize,
    /// Kernel width (taps).
    pub(crate) w: usize,
    /// Slots in the state pool.
    pub(crate) capacity: usize,
}

/// `causal_conv1d`: `x [t, c]`, `weight [c, w]` with `w >= 1`, `state [slots, c, w - 1]`.
pub(crate) fn causal_conv1d(x: &Tensor, weight: &Tensor, state: &Tensor, batch: &RecurrentBatch<'_>) -> Result<Conv> {
    const OP: &str = "causal_conv1d";
    let (xd, wd, sd) = (x.dims(), weight.dims(), state.dims());
    ensure(xd.len() == 2 && wd.len() == 2 && wd[0] == xd[1] && wd[1] >= 1, OP, || {
        format!("x {xd:?} and weight {wd:?} are not [t, c] and [c, w >= 1]")
    })?;
    let (t, c, w) = (xd[0], xd[1], wd[1]);
    ensure(sd.len() == 3 && sd[1..] == [c, w - 1], OP, || format!("state {sd:?} is not [slots, {c}, {}]", w - 1))?;
    recurrent_batch(OP, batch)?;
    not_the_pool(OP, state, &[x, weight])?;
    Ok(Conv { t, c, w, capacity: sd[0] })
}

/// `gated_delta_rule`: `h_v` a positive multiple of `h_k`, `qkv [t, 2·h_k·d_k + h_v·d_v]`,
/// `a, b [t, h_v]`, `a_log, dt_bias [h_v]`, `state [slots, h_v, d_k, d_v]`. Returns
/// `(t, slots)`.
pub(crate) fn gated_delta_rule(
    (qkv, a, b): (&Tensor, &Tensor, &Tensor),
    rule: &DeltaRule<'_>,
    state: &Tensor,
    batch: &RecurrentBatch<'_>,
) -> Result<(usize, usize)> {
    const OP: &str = "gated_delta_rule";
    let (hk, hv, dk, dv) = (rule.num_key_heads, rule.num_value_heads, rule.key_dim, rule.value_dim);
    ensure(hk > 0 && hv % hk == 0 && hv > 0 && dk > 0 && dv > 0, OP, || {
        format!("{hv} value heads of {dv} cannot share {hk} key heads of {dk}")
    })?;
    let t = qkv.dims().first().copied().unwrap_or(0);
    let width = 2 * hk * dk + hv * dv;
    ensure(qkv.dims() == [t, width], OP, || format!("qkv {:?} is not [t, {width}]", qkv.dims()))?;
    for (name, x) in [("a", a), ("b", b)] {
        ensure(x.dims() == [t, hv], OP, || format!("{name} {:?} is not [{t}, {hv}]", x.dims()))?;
    }
    for (name, x) in [("a_log", rule.a_log), ("dt_bias", rule.dt_bias)] {
        ensure(x.dims() == [hv], OP, || format!("{name} {:?} is not [{hv}]", x.dims()))?;
    }
    let sd = state.dims();
    ensure(sd.len() == 4 && sd[1..] == [hv, dk, dv], OP, || format!("state {sd:?} is not [slots, {hv}, {dk}, {dv}]"))?;
    recurrent_batch(OP, batch)?;
    not_the_pool(OP, state, &[qkv, a, b, rule.a_log, rule.dt_bias])?;
    Ok((t, sd[0]))
}

/// One sequence of a recurrent step, checked against the step and its state pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SeqRun {
    /// Its flat rows `start..end`.
    pub(crate) start: usize,
    pub(crate) end: usize,
    /// Its state slot; `None` for [`NO_STATE_SLOT`]: it starts from a zero state and
    /// keeps nothing.
    pub(crate) slot: Option<usize>,
    /// `(rows consumed, slot)`: after its first `rows` rows, its state is copied to `slot`
    /// (rows ascending, each in `1..=end - start`).
    pub(crate) snapshots: Vec<(usize, usize)>,
}

/// The host contents of a [`RecurrentBatch`] over `t` rows and a pool of `capacity`
/// slots: prefix sums from 0 to `t`, slots inside the pool, each snapshot's row inside the
/// step and ascending within its sequence, and every slot the step writes (those of the
/// sequences with rows, and the snapshots') distinct, so no two writes meet. A sequence
/// may have [`NO_STATE_SLOT`] (a graph's padding row) but then no snapshots. Returns the
/// sequences with at least one row; the others leave their state as it is.
pub(crate) fn recurrent_runs(
    op: &'static str,
    (cu, slots): (&[u32], &[u32]),
    snapshots: &[StateSnapshot],
    t: usize,
    capacity: usize,
) -> Result<Vec<SeqRun>> {
    let bad = |msg: String| Err(Error::InvalidArgument(format!("{op}: {msg}")));
    if cu.first() != Some(&0) || cu.last().map(|&e| e as usize) != Some(t) || cu.windows(2).any(|w| w[0] > w[1]) {
        return bad(format!("cu_seqlens {cu:?} are not prefix sums from 0 to {t} rows"));
    }
    let past = |s: u32| (s as usize >= capacity).then(|| format!("slot {s} is past the pool of {capacity} slots"));
    let named = slots.iter().filter(|&&s| s != NO_STATE_SLOT);
    if let Some(msg) = named.chain(snapshots.iter().map(|s| &s.slot)).find_map(|&s| past(s)) {
        return bad(msg);
    }
    let mut runs: Vec<SeqRun> = cu
        .windows(2)
        .zip(slots)
        .map(|(w, &slot)| SeqRun {
            start: w[0] as usize,
            end: w[1] as usize,
            slot: (slot != NO_STATE_SLOT).then_some(slot as usize),
            snapshots: vec![],
        })
        .collect();
    for snap in snapshots {
        let row = snap.row as usize;
        let Some(run) = runs.iter_mut().find(|r| (r.start..r.end).contains(&row)) else {
            return bad(format!("snapshot row {row} is past the {t} rows of the step"));
        };
        if run.slot.is_none() {
            return bad(format!("snapshot row {row} belongs to a sequence without a state slot"));
        }
        if run.snapshots.last().is_some_and(|&(rows, _)| rows > row + 1 - run.start) {
            return bad(format!("snapshot row {row} comes after a later row of its sequence"));
        }
        run.snapshots.push((row + 1 - run.start, snap.slot as usize));
    }
    runs.retain(|r| r.end > r.start);
    let mut written: Vec<usize> = runs.iter().flat_map(|r| r.snapshots.iter().map(|s| s.1).chain(r.slot)).collect();
    written.sort_unstable();
    if let Some(w) = written.windows(2).find(|w| w[0] == w[1]) {
        return bad(format!("slot {} is written twice in one step (by two sequences or snapshots)", w[0]));
    }
    Ok(runs)
}

/// `zero_state_slots`, `copy_state_slots`: every slot inside every pool (each `[slots, ..]`).
pub(crate) fn state_slots(op: &'static str, pools: &[&Tensor], slots: impl Iterator<Item = u32> + Clone) -> Result<()> {
    for pool in pools {
        let capacity = pool.dims().first().copied().unwrap_or(0);
        if let Some(bad) = slots.clone().find(|&s| s as usize >= capacity) {
            return Err(Error::InvalidArgument(format!(
                "{op}: slot {bad} is past a pool {:?} of {capacity} slots",
                pool.dims()
            )));
        }
    }
    Ok(())
}

/// `rms_norm_gated`: `x, z [.., d]` of one shape, `weight [d]`, `d > 0`; returns `d`.
pub(crate) fn rms_norm_gated(x: &Tensor, z: &Tensor, weight: &Tensor) -> Result<usize> {
    let d = x.shape().last();
    ensure(x.dims() == z.dims() && !x.dims().is_empty() && d > 0 && weight.dims() == [d], "rms_norm_gated", || {
        format!("x {:?}, z {:?} and weight {:?} are not [n, d], [n, d] and [d]", x.dims(), z.dims(), weight.dims())
    })?;
    Ok(d)
}

/// `sigmoid_mul`: `x` and `gate` of one shape, or `x [t, n]` and `gate [t, 1]`. Returns
/// the elements each gate value covers (1, or `n`).
pub(crate) fn sigmoid_mul(x: &Tensor, gate: &Tensor) -> Result<usize> {
    let (xd, gd) = (x.dims(), gate.dims());
    if xd == gd {
        return Ok(1);
    }
    let per_row = matches!((xd, gd), ([t, _], [g, 1]) if t == g);
    ensure(per_row, "sigmoid_mul", || format!("x {xd:?} and gate {gd:?} are neither equal nor [t, n] and [t, 1]"))?;
    Ok(xd[1])
}
