//! Operands of the LoRA op: low-rank adapter deltas added into a projection's output for
//! the rows of a mixed batch that run through an adapter.
//!
//! An adapter replaces a projection `W` by `W + scale · B·A` for its rows only. Rather
//! than merging weights (one copy of `W` per adapter), the delta is computed beside the
//! base product: each row's input is shrunk to rank `r` by its adapter's `A`, expanded
//! back by `B`, scaled and added into the output columns the projection gives that module
//! (a fused q/k/v or gate/up projection holds several).
//!
//! Adapters live in slots: per module, every resident adapter's `A` stacked as
//! `[slots, r_max, in]` and `B` as `[slots, n, r_max]`, zero past the adapter's own rank,
//! with one scale per slot. A step names each row's slot in a `u32 [t]` tensor, base rows
//! [`NO_LORA_SLOT`]. Nothing about a step but that tensor's contents depends on which
//! adapters its rows use, so a decode step can be recorded once in a graph and replayed
//! with other adapters by rewriting it.
//!
//! **Invariant:** rows at [`NO_LORA_SLOT`] (or past the stacks) keep the base product bit
//! for bit; zero-padded ranks add exact zeros, so a rank-8 adapter in a rank-16 slot
//! computes as the rank-8 adapter alone.

use crate::error::{Result, ensure};
use crate::{DType, Tensor};

/// The slot of a row that runs through no adapter (the base model's rows, padding).
pub const NO_LORA_SLOT: u32 = u32::MAX;

/// The most modules one projection fuses (q, k and v).
pub const LORA_MAX_PARTS: usize = 3;

/// One module's resident adapters and where its output columns start.
#[derive(Debug, Clone, Copy)]
pub struct LoraStack<'a> {
    /// `[slots, r_max, in]`: each slot's shrink (PEFT's `lora_A.weight`), zero-padded.
    pub a: &'a Tensor,
    /// `[slots, n, r_max]`: each slot's expansion (PEFT's `lora_B.weight`), zero-padded.
    pub b: &'a Tensor,
    /// The first of the `n` output columns the delta is added into.
    pub column: usize,
}

/// The adapters of one projection over one step ([`GpuBackend::lora_shrink_expand`]).
///
/// [`GpuBackend::lora_shrink_expand`]: crate::GpuBackend::lora_shrink_expand
#[derive(Debug, Clone, Copy)]
pub struct LoraSlots<'a> {
    /// `u32 [t]`: each row's slot, or [`NO_LORA_SLOT`].
    pub rows: &'a Tensor,
    /// `f32 [slots]`: each slot's `lora_alpha / r` (or `/ √r` for rank-stabilised ones).
    pub scales: &'a Tensor,
    /// The modules fused in the projection, at most [`LORA_MAX_PARTS`].
    pub stacks: &'a [LoraStack<'a>],
    /// `u32 [slots + 1 + t]`: the rows grouped by slot, as [`lora_row_groups`] lays them out
    /// from `rows`, or `None`. A backend may use it to multiply the rows of one adapter
    /// together; one that does not ignores it. It must agree with `rows`.
    pub groups: Option<&'a Tensor>,
}

/// The rows of a step grouped by slot, as [`LoraSlots::groups`] takes them: for each of
/// `slots` slots where its rows begin in the order (the total last, `slots + 1` entries),
/// then the order itself, `rows.len()` entries: the rows of slot 0 ascending, those of
/// slot 1, ..., zeros after them. Base rows ([`NO_LORA_SLOT`], or any slot past `slots`)
/// are in no group.
pub fn lora_row_groups(rows: &[u32], slots: usize) -> Vec<u32> {
    let mut counts = vec![0u32; slots + 1];
    for &s in rows.iter().filter(|&&s| (s as usize) < slots) {
        counts[s as usize + 1] += 1;
    }
    for s in 0..slots {
        counts[s + 1] += counts[s];
    }
    let mut out = counts.clone();
    out.resize(slots + 1 + rows.len(), 0);
    let (starts, order) = out.split_at_mut(slots + 1);
    let mut next = counts;
    for (i, &s) in rows.iter().enumerate().filter(|&(_, &s)| (s as usize) < slots) {
        order[next[s as usize] as usize] = i as u32;
        next[s as usize] += 1;
    }
    debug_assert_eq!(starts[slots] as usize, rows.iter().filter(|&&s| (s as usize) < slots).count());
    out
}

/// One adapter's low-rank delta on one stacked expert weight `w [e, out, in]`: expert
/// `x` runs `w[x] + scale · b[x]·a[x]`, with `a [e, r, in]` and `b [e, out, r]` (PEFT's
/// per-expert `lora_A` and `lora_B`) in the weights' float dtype.
#[derive(Debug, Clone, Copy)]
pub struct ExpertDelta<'a> {
    /// `[e, r, in]`.
    pub a: &'a Tensor,
    /// `[e, out, r]`.
    pub b: &'a Tensor,
    /// PEFT's `scaling` of this weight.
    pub scale: f32,
}

/// One adapter's deltas on one layer's routed experts: on the gate/up stack (its `2i`
/// output columns gate first, as the stack's) and on the down stack; `None` where it
/// leaves that stack as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExpertAdapter<'a> {
    /// On `gate_up [e, 2i, h]`.
    pub gate_up: Option<ExpertDelta<'a>>,
    /// On `down [e, h, i]`.
    pub down: Option<ExpertDelta<'a>>,
}

/// A layer's device tables of the slots' expert deltas ([`GpuBackend::expert_lora_table`]),
/// which a backend reads in place of [`MoeLora::slots`] so that a recorded step follows the
/// adapters the slots hold when it replays.
///
/// [`GpuBackend::expert_lora_table`]: crate::GpuBackend::expert_lora_table
#[derive(Debug, Clone, Copy)]
pub struct ExpertTables<'a> {
    /// The table of the deltas on the gate/up stack.
    pub gate_up: &'a Tensor,
    /// The table of the deltas on the down stack.
    pub down: &'a Tensor,
    /// The highest rank each table's deltas may have.
    pub max_ranks: (usize, usize),
}

/// The adapters of one mixture-of-experts layer over one step
/// ([`GpuBackend::moe_experts_lora`]): each token's slot, and by slot what its adapter
/// does to these experts. A (token, choice) row runs its expert's delta of its token's
/// adapter; tokens at [`NO_LORA_SLOT`], and slots whose adapter adapts no expert of the
/// layer, keep the base experts' result bit for bit.
///
/// [`GpuBackend::moe_experts_lora`]: crate::GpuBackend::moe_experts_lora
#[derive(Debug, Clone, Copy)]
pub struct MoeLora<'a> {
    /// `u32 [t]`: each token's slot, or [`NO_LORA_SLOT`].
    pub rows: &'a Tensor,
    /// By slot: its adapter's deltas on this layer, `None` where it has none.
    pub slots: &'a [Option<ExpertAdapter<'a>>],
    /// The same as device tables, where the backend keeps them (and then reads them).
    pub tables: Option<ExpertTables<'a>>,
}

/// Checks `lora` against a mixture of `e` experts of hidden size `h` and intermediate
/// size `i` over `t` tokens in `dtype`.
pub(crate) fn check_moe_lora(
    op: &'static str,
    lora: &MoeLora<'_>,
    (t, e, h, i): (usize, usize, usize, usize),
    dtype: DType,
) -> Result<()> {
    ensure(lora.rows.dtype() == DType::U32 && lora.rows.dims() == [t], op, || {
        format!("token slots {:?} {:?} for {t} tokens", lora.rows.dtype(), lora.rows.dims())
    })?;
    let check = |what: &str, d: &ExpertDelta<'_>, inputs: usize, outputs: usize| {
        let (ad, bd) = (d.a.dims(), d.b.dims());
        let r = ad.get(1).copied().unwrap_or(0);
        ensure(ad == [e, r, inputs] && bd == [e, outputs, r], op, || {
            format!("{what} deltas a {ad:?} and b {bd:?} for {e} experts of [{outputs}, {inputs}]")
        })?;
        ensure(d.a.dtype() == dtype && d.b.dtype() == dtype, op, || {
            format!("{what} deltas are {:?} and {:?}, the experts {dtype:?}", d.a.dtype(), d.b.dtype())
        })
    };
    for adapter in lora.slots.iter().flatten() {
        if let Some(d) = &adapter.gate_up {
            check("gate/up", d, h, 2 * i)?;
        }
        if let Some(d) = &adapter.down {
            check("down", d, i, h)?;
        }
    }
    Ok(())
}

/// The sizes of one checked LoRA op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoraDims {
    /// Rows.
    pub t: usize,
    /// Input columns.
    pub k: usize,
    /// Output columns of the whole projection (an expansion's; 0 for a shrink, which has no
    /// output columns).
    pub width: usize,
    /// Slots.
    pub slots: usize,
    /// Padded rank.
    pub rank: usize,
}

/// Checks a shrink's `x [t, in]` against `lora`'s operands: one float dtype for `x` and the
/// stacks, equal slot counts and ranks.
pub(crate) fn check_shrink(op: &'static str, x: &Tensor, lora: &LoraSlots<'_>) -> Result<LoraDims> {
    let xd = x.dims();
    ensure(xd.len() == 2, op, || format!("x {xd:?} must be [t, in]"))?;
    check_operands(op, xd[0], xd[1], None, x.dtype(), lora)
}

/// Checks an expansion's `shrunk [t, parts, rank]` (f32, as [`GpuBackend::lora_shrink`]
/// made it) and `out [t, N]` against `lora`'s operands: `out` in the stacks' float dtype,
/// disjoint module columns inside `out` (a backend may add the modules' deltas at once).
///
/// [`GpuBackend::lora_shrink`]: crate::GpuBackend::lora_shrink
pub(crate) fn check_expand(op: &'static str, shrunk: &Tensor, out: &Tensor, lora: &LoraSlots<'_>) -> Result<LoraDims> {
    let od = out.dims();
    ensure(od.len() == 2, op, || format!("out {od:?} must be [t, N]"))?;
    let k = lora.stacks.first().and_then(|s| s.a.dims().get(2).copied()).unwrap_or(0);
    let d = check_operands(op, od[0], k, Some(od[1]), out.dtype(), lora)?;
    let want = [d.t, lora.stacks.len(), d.rank];
    ensure(shrunk.dtype() == DType::F32 && shrunk.dims() == want, op, || {
        format!("shrunk {:?} {:?}, expected F32 {want:?}", shrunk.dtype(), shrunk.dims())
    })?;
    Ok(d)
}

/// The checks both halves share, for `t` rows of `k` inputs in `dtype` and, for an
/// expansion, `width` output columns.
fn check_operands(
    op: &'static str,
    t: usize,
    k: usize,
    width: Option<usize>,
    dtype: DType,
    lora: &LoraSlots<'_>,
) -> Result<LoraDims> {
    ensure(lora.rows.dtype() == DType::U32 && lora.rows.dims() == [t], op, || {
        format!("row slots {:?} {:?} for {t} rows", lora.rows.dtype(), lora.rows.dims())
    })?;
    ensure(lora.scales.dtype() == DType::F32 && lora.scales.dims().len() == 1, op, || {
        format!("scales {:?} {:?} must be f32 [slots]", lora.scales.dtype(), lora.scales.dims())
    })?;
    let slots = lora.scales.dims()[0];
    ensure(!lora.stacks.is_empty() && lora.stacks.len() <= LORA_MAX_PARTS, op, || {
        format!("{} modules in one projection (1 to {LORA_MAX_PARTS})", lora.stacks.len())
    })?;
    if let Some(g) = lora.groups {
        ensure(g.dtype() == DType::U32 && g.dims() == [slots + 1 + t], op, || {
            format!("row groups {:?} {:?} for {slots} slots and {t} rows", g.dtype(), g.dims())
        })?;
    }
    let rank = lora.stacks[0].a.dims().get(1).copied().unwrap_or(0);
    for s in lora.stacks {
        check_stack(op, s, [slots, rank, k], width)?;
        ensure(s.a.dtype() == dtype && s.b.dtype() == dtype, op, || format!("stacks in the rows' dtype {dtype:?}"))?;
    }
    let mut spans: Vec<(usize, usize)> = lora.stacks.iter().map(|s| (s.column, s.column + s.b.dims()[1])).collect();
    spans.sort_unstable();
    ensure(spans.windows(2).all(|w| w[0].1 <= w[1].0), op, || format!("overlapping module columns {spans:?}"))?;
    ensure(dtype.is_float(), op, || format!("rows in {dtype:?}, not a float dtype"))?;
    Ok(LoraDims { t, k, width: width.unwrap_or(0), slots, rank })
}

/// One stack: `a [slots, rank, k]`, `b [slots, n, rank]`, columns `column..column + n`
/// inside `width` where there is one.
fn check_stack(op: &'static str, s: &LoraStack<'_>, [slots, rank, k]: [usize; 3], width: Option<usize>) -> Result<()> {
    let (ad, bd) = (s.a.dims(), s.b.dims());
    ensure(ad == [slots, rank, k], op, || format!("a {ad:?}, expected [{slots}, {rank}, {k}]"))?;
    ensure(bd.len() == 3 && bd[0] == slots && bd[2] == rank, op, || {
        format!("b {bd:?}, expected [{slots}, n, {rank}]")
    })?;
    let Some(width) = width else { return Ok(()) };
    ensure(s.column + bd[1] <= width, op, || format!("columns {}..{} of {width}", s.column, s.column + bd[1]))
}

/// Checks row slots read on the host: each is a slot of the stacks or [`NO_LORA_SLOT`].
pub(crate) fn check_rows(op: &'static str, rows: &[u32], slots: usize) -> Result<()> {
    match rows.iter().find(|&&s| s != NO_LORA_SLOT && s as usize >= slots) {
        Some(s) => Err(crate::Error::InvalidArgument(format!("{op}: row slot {s} of {slots} slots"))),
        None => Ok(()),
    }
}

/// Checks row groups read on the host against the row slots they group.
pub(crate) fn check_groups(op: &'static str, rows: &[u32], groups: &[u32], slots: usize) -> Result<()> {
    ensure(groups == lora_row_groups(rows, slots).as_slice(), op, || {
        "row groups that do not group the row slots".into()
    })
}

/// Checks that `src` fills one slot of `stack [slots, ..]`, in its dtype.
pub(crate) fn check_slot_write(op: &'static str, stack: &Tensor, slot: usize, src: &Tensor) -> Result<usize> {
    let d = stack.dims();
    ensure(!d.is_empty() && slot < d[0], op, || format!("slot {slot} of {d:?}"))?;
    let per_slot: usize = d[1..].iter().product();
    ensure(src.elem_count() == per_slot && src.dtype() == stack.dtype(), op, || {
        format!("{:?} {:?} into one slot of {:?} {d:?}", src.dtype(), src.dims(), stack.dtype())
    })?;
    Ok(per_slot)
}
