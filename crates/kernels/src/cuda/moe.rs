//! Mixture of experts on the GPU: top-k routing in a kernel, then the expert MLPs as
//! grouped GEMMs over the tokens routed to each expert.
//!
//! Nothing is read back on the host: `moe_align` groups the `t · k` (token, choice) slots
//! by expert on the device, one grouped GEMM (`moe_gemm`) runs the gate/up projection of
//! every expert's rows (reading each row's token of `x` in place), SiLU·mul follows, a
//! second grouped GEMM the down projection, and a combine kernel sums each token's k
//! outputs weighted by the router. A decode step of a few tokens skips the grouping: each
//! (token, choice) slot streams its expert's weights in two GEMVs. Launch shapes depend
//! only on `t`, `k` and the weight shapes, so a CUDA graph can hold MoE layers. Adapters on
//! the experts add their deltas to the two products' grouped rows (`moe_lora_delta`), from
//! a table of the slots' weights written for the step: eager steps only.

use super::{CudaBackend, expect_dtype, launch, ptr};
use crate::backend::lora::check_moe_lora;
use crate::backend::{ExpertAdapter, ExpertDelta, GpuBackend, MoeLora, Routing};
use crate::error::{Error, Result, ensure};
use crate::host::HostTensor;
use crate::{DType, Tensor};

pub(super) fn topk_routing(b: &CudaBackend, logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing> {
    let d = logits.dims();
    ensure(d.len() == 2 && k > 0 && k <= d[1], "topk_routing", || format!("cannot pick {k} of logits {d:?}"))?;
    expect_dtype("topk_routing", logits, &[DType::BF16, DType::F32])?;
    let (t, e) = (d[0], d[1]);
    let (weights, experts) = (b.alloc(&[t, k], DType::F32)?, b.alloc(&[t, k], DType::U32)?);
    if t > 0 {
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (t as u32, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: (e * 4) as u32,
        };
        let op = "topk_routing";
        let args =
            (ptr(op, logits)?, ptr(op, &weights)?, ptr(op, &experts)?, e as u32, k as u32, u32::from(renormalize));
        match logits.dtype() {
            DType::F32 => launch!(b, "topk_routing_f32", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
            _ => launch!(b, "topk_routing_bf16", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
        }
    }
    Ok(Routing { weights, experts })
}

/// A shared expert's per-token gates: their values `[t, 1]`, or the gate's weight `[1, h]`,
/// whose product with the tokens the combining kernel takes itself (`moe_gate_dot`: a
/// decode batch's, with the bits of the GEMV that [`super::ops::matmul`] runs there).
#[derive(Clone, Copy)]
pub(super) enum Gate<'a> {
    Values(&'a Tensor),
    Weight(&'a Tensor),
}

/// Whether the combining kernel can take the product of `x [t, h]` with a shared expert's
/// gate `weight` itself ([`Gate::Weight`]) with the bits [`super::ops::matmul`] gives it: a
/// bf16 `[1, h]` weight at the GEMV's batches, outside `--batch-invariant`.
pub(super) fn gate_in_combine(b: &CudaBackend, x: &Tensor, weight: &Tensor) -> bool {
    let (t, h) = (x.dims()[0], x.dims()[1]);
    weight.dims() == [1, h] && weight.dtype() == DType::BF16 && !b.batch_invariant && super::gemv::applies(t, 1, h)
}

/// The routed experts' output, plus `shared · sigmoid(gate)` where `shared` is given (added
/// in the combining kernel, as `sigmoid_mul_add` would add it).
pub(super) fn moe_experts(
    b: &CudaBackend,
    x: &Tensor,
    routing: &Routing,
    (gate_up, down): (&Tensor, &Tensor),
    lora: Option<&MoeLora<'_>>,
    shared: Option<(&Tensor, Gate<'_>)>,
) -> Result<Tensor> {
    let crate::check::Moe { t, h, e, i, k } = crate::check::moe(x, routing, gate_up, down)?;
    expect_dtype("moe_experts", x, &[DType::BF16])?;
    if let Some((out, gate)) = shared {
        ensure(out.dims() == [t, h], "moe_experts_shared", || format!("shared {:?} is not [{t}, {h}]", out.dims()))?;
        expect_dtype("moe_experts_shared", out, &[DType::BF16])?;
        match gate {
            Gate::Values(gate) => {
                ensure(crate::check::sigmoid_mul(out, gate)? == h, "moe_experts_shared", || {
                    format!("gate {:?} is not [{t}, 1]", gate.dims())
                })?;
                expect_dtype("moe_experts_shared", gate, &[DType::BF16])?;
            }
            Gate::Weight(w) => {
                ensure(w.dims() == [1, h] && h % 8 == 0 && t <= super::gemv::MAX_M, "moe_experts_shared", || {
                    format!("a gate weight {:?} for {t} tokens of {h}", w.dims())
                })?;
                expect_dtype("moe_experts_shared", w, &[DType::BF16])?;
            }
        }
    }
    if let Some(lora) = lora {
        check_moe_lora("moe_experts_lora", lora, (t, e, h, i), DType::BF16)?;
        // The token slots against the adapters, where their host copy is at hand (the
        // kernels take a slot past them as no adapter, as the dense deltas do).
        if let Some(rows) = super::storage::storage("moe_experts_lora", lora.rows)?.host_u32.lock().as_ref() {
            crate::backend::lora::check_rows("moe_experts_lora", rows, lora.slots.len())?;
        }
    }
    // A stack kept in GGUF blocks (experts joined from matrices of one format) is widened
    // for the call: the grouped GEMM reads bf16 or e4m3.
    let widened = |w: &Tensor| -> Result<Option<Tensor>> {
        let Some(blocks) = super::gguf::of("moe_experts", w)? else { return Ok(None) };
        Ok(Some(super::gguf::widen(b, &blocks, super::gguf::row_len(w), None)?.reshape(w.dims())?))
    };
    let (g, d) = (widened(gate_up)?, widened(down)?);
    if g.is_some() || d.is_some() {
        let (g, d) = (g.unwrap_or_else(|| gate_up.clone()), d.unwrap_or_else(|| down.clone()));
        return moe_experts(b, x, routing, (&g, &d), lora, shared);
    }
    for w in [gate_up, down] {
        expect_dtype("moe_experts", w, &[DType::BF16, super::fp8::FP8])?;
    }
    expect_dtype("moe_experts", &routing.weights, &[DType::F32, DType::BF16])?;
    expect_dtype("moe_experts", &routing.experts, &[DType::U32])?;
    // Indices uploaded from the host are checked here; indices made on the device (by
    // `topk_routing`) are in range by construction, and `moe_align` gives any that is not no
    // row rather than read past the weights, so nothing waits for the device.
    if let Some(ids) = b.host_copy_u32("moe_experts", &routing.experts)?
        && let Some(bad) = ids.iter().find(|&&id| id as usize >= e)
    {
        return Err(Error::InvalidArgument(format!("moe_experts: expert {bad} is past the {e} experts")));
    }
    if t == 0 || h == 0 || i == 0 || k == 0 {
        let routed = b.zeros(&[t, h], DType::BF16)?;
        return match shared {
            Some((out, Gate::Values(gate))) => super::recurrent::sigmoid_mul(b, out, gate, Some(&routed)),
            Some((out, Gate::Weight(w))) => {
                super::recurrent::sigmoid_mul(b, out, &super::ops::matmul(b, x, w, None)?, Some(&routed))
            }
            None => Ok(routed),
        };
    }
    let op = "moe_experts";
    let tk = t * k;
    let aligned = h % 8 == 0 && i % 8 == 0;
    if tk <= GEMV_MAX_SLOTS && aligned && lora.is_none() && !b.batch_invariant {
        let y = experts_gemv(b, x, &routing.experts, (gate_up, down), (k, e, h, i))?;
        return combine(b, &y, None, routing, (x, shared), (t, k, h));
    }
    ensure(2 * e * 4 <= MAX_ALIGN_SHARED, "moe_experts", || format!("{e} experts are more than the grouping holds"))?;
    let bm = if aligned { tile_rows(tk, e) } else { 16 };
    let max_tiles = tk.div_ceil(bm) + e.min(tk);
    ensure(max_tiles <= 65_535, op, || format!("{t} tokens x {k} experts are more rows than one launch covers"))?;

    let grouping = Grouping {
        offsets: b.alloc(&[e + 1], DType::U32)?,
        tiles: b.alloc(&[e + 1], DType::U32)?,
        token_of_row: b.alloc(&[tk], DType::U32)?,
        row_of_slot: b.alloc(&[tk], DType::U32)?,
        bm,
        max_tiles,
        aligned,
        e,
        rows: tk,
    };
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: (2 * e * 4) as u32,
    };
    launch!(
        b,
        "moe_align",
        cfg,
        [
            ptr(op, &routing.experts)?,
            ptr(op, &grouping.offsets)?,
            ptr(op, &grouping.tiles)?,
            ptr(op, &grouping.token_of_row)?,
            ptr(op, &grouping.row_of_slot)?,
            tk as u32,
            k as u32,
            e as u32,
            bm as u32,
        ]
    )?;
    // [t·k, 2i]: gate and up of every grouped row, its token's row of x read in place.
    let hidden = b.alloc(&[tk, 2 * i], DType::BF16)?;
    grouping.gemm(b, x, Some(&grouping.token_of_row), gate_up, &hidden, 2 * i, h)?;
    if let Some(lora) = lora {
        let table = lora.tables.map(|t| (t.gate_up, t.max_ranks.0));
        grouping.lora_delta(b, lora, (|a| a.gate_up, table), (&hidden, x, Some(&grouping.token_of_row)), (h, 2 * i))?;
    }
    let act = super::ops::silu_mul(b, &hidden)?;
    let y = b.alloc(&[tk, h], DType::BF16)?;
    grouping.gemm(b, &act, None, down, &y, h, i)?;
    if let Some(lora) = lora {
        let table = lora.tables.map(|t| (t.down, t.max_ranks.1));
        grouping.lora_delta(b, lora, (|a| a.down, table), (&y, &act, None), (i, h))?;
    }

    combine(b, &y, Some(&grouping.row_of_slot), routing, (x, shared), (t, k, h))
}

/// At most this many (token, choice) slots run their experts as GEMVs (`moe_gemv_*` of
/// `moe.cu` and `fp8.cu`: decode batches of up to 4 tokens at top-8), past it as grouped
/// GEMMs.
const GEMV_MAX_SLOTS: usize = 32;

/// `moe_gemv_*`: `y [t·k, h]`, each slot's expert MLP in slot order, for experts whose
/// inner sizes are whole 16-byte vectors, each product on its stack's format (bf16, or
/// e4m3 under its scales).
fn experts_gemv(
    b: &CudaBackend,
    x: &Tensor,
    experts: &Tensor,
    (gate_up, down): (&Tensor, &Tensor),
    (k, e, h, i): (usize, usize, usize, usize),
) -> Result<Tensor> {
    const OP: &str = "moe_experts";
    const WARPS: usize = 4;
    const DOWN_ROWS: usize = 4;
    let slots = experts.elem_count();
    let (act, y) = (b.alloc(&[slots, i], DType::BF16)?, b.alloc(&[slots, h], DType::BF16)?);
    let cfg = |blocks: usize| cudarc::driver::LaunchConfig {
        grid_dim: (blocks as u32, slots as u32, 1),
        block_dim: (32 * WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (xp, ep, ap, yp) = (ptr(OP, x)?, ptr(OP, experts)?, ptr(OP, &act)?, ptr(OP, &y)?);
    let (gp, dp) = (ptr(OP, gate_up)?, ptr(OP, down)?);
    let (e, h, i, k) = (e as u32, h as u32, i as u32, k as u32);
    let (silu, down_cfg) = (cfg((i as usize).div_ceil(WARPS)), cfg((h as usize).div_ceil(WARPS * DOWN_ROWS)));
    if gate_up.dtype() == super::fp8::FP8 {
        let (s, rows, stride, step) = super::fp8::scale_args(OP, gate_up)?;
        launch!(b, "moe_gemv_silu_e4m3", silu, [xp, ep, gp, s, rows, stride, step, ap, k, e, i, h])?;
    } else {
        launch!(b, "moe_gemv_silu_bf16", silu, [xp, ep, gp, ap, k, e, i, h])?;
    }
    if down.dtype() == super::fp8::FP8 {
        let (s, rows, stride, step) = super::fp8::scale_args(OP, down)?;
        launch!(b, "moe_gemv_e4m3", down_cfg, [ap, ep, dp, s, rows, stride, step, yp, e, h, i])?;
    } else {
        launch!(b, "moe_gemv_bf16", down_cfg, [ap, ep, dp, yp, e, h, i])?;
    }
    Ok(y)
}

/// `out [t, h]`: each token's expert rows of `y` weighted by the router, in choice order
/// (`rows` maps a slot to its row of y; none: y is in slot order), plus the shared
/// expert's gated output where given (its gate weight's product with the tokens `x` taken
/// in the kernel).
fn combine(
    b: &CudaBackend,
    y: &Tensor,
    rows: Option<&Tensor>,
    routing: &Routing,
    (x, shared): (&Tensor, Option<(&Tensor, Gate<'_>)>),
    (t, k, h): (usize, usize, usize),
) -> Result<Tensor> {
    const OP: &str = "moe_experts";
    let out = b.alloc(&[t, h], DType::BF16)?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (t as u32, h.div_ceil(256) as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let (sp, gp, wp, xp) = match shared {
        Some((s, Gate::Values(g))) => (ptr(OP, s)?, ptr(OP, g)?, 0, 0),
        Some((s, Gate::Weight(w))) => (ptr(OP, s)?, 0, ptr(OP, w)?, ptr(OP, x)?),
        None => (0, 0, 0, 0),
    };
    let rows = rows.map_or(Ok(0), |r| ptr(OP, r))?;
    let args = (ptr(OP, y)?, ptr(OP, &routing.weights)?, ptr(OP, &out)?, k as u32, h as u32);
    let name = if routing.weights.dtype() == DType::F32 { "moe_combine_f32" } else { "moe_combine_bf16" };
    launch!(b, name, cfg, [args.0, rows, args.1, sp, gp, wp, xp, args.2, args.3, args.4])?;
    Ok(out)
}

/// `MOE_LORA_THREADS` of `moe.cu`: threads of a `moe_lora_delta` block.
const MOE_LORA_THREADS: u32 = 128;

/// `u32` words of one slot's entry of an expert table (`MoeLoraEntry` of `moe.cu`).
pub(super) const TABLE_WORDS: usize = 6;

/// A table entry: the delta's `a` and `b` addresses, its rank and its scale's bits; all
/// zero for no delta.
pub(super) fn table_entry(delta: Option<&ExpertDelta<'_>>) -> Result<[u32; TABLE_WORDS]> {
    const OP: &str = "moe_experts_lora";
    let Some(d) = delta else { return Ok([0; TABLE_WORDS]) };
    let (a, b, rank) = (ptr(OP, d.a)?, ptr(OP, d.b)?, d.a.dims()[1]);
    Ok([a as u32, (a >> 32) as u32, b as u32, (b >> 32) as u32, rank as u32, d.scale.to_bits()])
}

/// The most shared memory `moe_align` may take (two `u32` per expert).
const MAX_ALIGN_SHARED: usize = 48 << 10;

/// Rows per GEMM tile for `tk` grouped rows over `e` experts: about the rows an expert
/// has, so that each expert's weights are read by as few row tiles as possible while small
/// batches do not pay for empty rows.
fn tile_rows(tk: usize, e: usize) -> usize {
    match tk / e.min(tk).max(1) {
        0..=16 => 16,
        17..=48 => 32,
        _ => 64,
    }
}

/// `MOE_BN` and `MOE_BK` of `moe.cu`: the grouped GEMM's column tile and depth step (bf16
/// experts; e4m3 experts step one 128-column scale chunk, `MOE_BK8` of `fp8.cu`).
const GEMM_BN: usize = 64;
const GEMM_BK: usize = 64;
const GEMM_BK8: usize = 128;

/// A grouped GEMM kernel of `moe.cu` (bf16 experts) or `fp8.cu` (e4m3 experts): rows per
/// tile, pipeline depth (`STAGES`) and bytes a weight.
struct GemmKernel {
    name: &'static str,
    bm: usize,
    stages: usize,
    weight_bytes: usize,
}

impl GemmKernel {
    /// Dynamic shared memory: the stages of a row tile (bf16) and a column tile of
    /// weights one depth step deep, with the weight rows' scales for e4m3.
    fn shared_bytes(&self) -> u32 {
        let stage = match self.weight_bytes {
            1 => (self.bm * 2 + GEMM_BN) * GEMM_BK8 + GEMM_BN * 4,
            _ => (self.bm * 2 + GEMM_BN * self.weight_bytes) * GEMM_BK,
        };
        (self.stages * stage) as u32
    }
}

/// Tiles with a few real rows each (`deep`) stream weights and keep more of them in flight;
/// full tiles do arithmetic, and the shallower pipeline fits more blocks per SM.
const GEMM_KERNELS: [GemmKernel; 9] = [
    GemmKernel { name: "moe_gemm_bf16_m16_deep", bm: 16, stages: 6, weight_bytes: 2 },
    GemmKernel { name: "moe_gemm_bf16_m16", bm: 16, stages: 3, weight_bytes: 2 },
    GemmKernel { name: "moe_gemm_bf16_m32", bm: 32, stages: 3, weight_bytes: 2 },
    GemmKernel { name: "moe_gemm_bf16_m64", bm: 64, stages: 3, weight_bytes: 2 },
    GemmKernel { name: "moe_gemm_bf16_m16_unaligned", bm: 16, stages: 3, weight_bytes: 2 },
    GemmKernel { name: "moe_gemm_e4m3_m16_deep", bm: 16, stages: 6, weight_bytes: 1 },
    GemmKernel { name: "moe_gemm_e4m3_m16", bm: 16, stages: 3, weight_bytes: 1 },
    GemmKernel { name: "moe_gemm_e4m3_m32", bm: 32, stages: 3, weight_bytes: 1 },
    GemmKernel { name: "moe_gemm_e4m3_m64", bm: 64, stages: 3, weight_bytes: 1 },
];

/// Below this many grouped rows per expert on average, 16-row tiles take the deep pipeline.
/// On the H200 (Qwen3-30B-A3B, one token: 8 slots over 128 experts) six stages took the
/// gate/up and down GEMMs from 21.0 to 19.0 µs a launch on average; fuller tiles keep three,
/// which let more blocks share an SM (a block's stages are its shared memory).
const DEEP_ROWS_PER_EXPERT: usize = 8;

/// The kernel for tiles of `bm` rows (16, 32 or 64; always 16 unaligned) over `tk` grouped
/// rows of `e` experts, for bf16 or (`e4m3`, whose inner size is a multiple of 128) e4m3
/// weights.
fn gemm_kernel(aligned: bool, e4m3: bool, bm: usize, tk: usize, e: usize) -> &'static GemmKernel {
    let deep = tk < DEEP_ROWS_PER_EXPERT * e;
    let name = match (e4m3, aligned, bm) {
        (true, _, 16) if deep => "moe_gemm_e4m3_m16_deep",
        (true, _, 16) => "moe_gemm_e4m3_m16",
        (true, _, 32) => "moe_gemm_e4m3_m32",
        (true, _, _) => "moe_gemm_e4m3_m64",
        (false, false, _) => "moe_gemm_bf16_m16_unaligned",
        (false, true, 16) if deep => "moe_gemm_bf16_m16_deep",
        (false, true, 16) => "moe_gemm_bf16_m16",
        (false, true, 32) => "moe_gemm_bf16_m32",
        _ => "moe_gemm_bf16_m64",
    };
    GEMM_KERNELS.iter().find(|k| k.name == name).expect("every name is in the table")
}

/// `out [m, n] = x [m, k] · w [n, k]ᵀ` (bf16) on the grouped GEMM's tiles as one expert of
/// `m` rows, for `--batch-invariant`: the family writes a row's bits alike at any `m`
/// (`moe_gemm` in `moe.cu`), so the kernel is picked for speed alone: the deep 16-row
/// pipeline (weights streamed) for a few rows, 64-row tiles past them.
pub(super) fn dense_gemm(b: &CudaBackend, (x, w, out): (u64, u64, u64), m: usize, n: usize, k: usize) -> Result<()> {
    let op = "matmul";
    let name = match (k.is_multiple_of(8), m) {
        (false, _) => "moe_gemm_bf16_m16_unaligned",
        (true, 0..=32) => "moe_gemm_bf16_m16_deep",
        (true, 33..=128) => "moe_gemm_bf16_m32",
        _ => "moe_gemm_bf16_m64",
    };
    let kernel = GEMM_KERNELS.iter().find(|g| g.name == name).expect("every name is in the table");
    let rows = u32::try_from(m).map_err(|_| Error::InvalidArgument(format!("{op}: {m} rows")))?;
    let tiles = m.div_ceil(kernel.bm);
    ensure(tiles <= 65_535, op, || format!("{m} rows are more tiles of {} than a grid holds", kernel.bm))?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: (n.div_ceil(GEMM_BN) as u32, tiles as u32, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: kernel.shared_bytes(),
    };
    launch!(b, kernel.name, cfg, [x, 0u64, w, out, 0u64, 0u64, rows, n as u32, k as u32])
}

/// Lets the grouped GEMMs use more than the default 48 KiB of dynamic shared memory.
pub(super) fn raise_shared_memory(
    kernels: &std::collections::HashMap<&'static str, cudarc::driver::CudaFunction>,
) -> Result<()> {
    use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
    for k in &GEMM_KERNELS {
        let func = kernels.get(k.name).ok_or_else(|| Error::Device(format!("kernel `{}` was not loaded", k.name)))?;
        func.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k.shared_bytes() as i32)
            .map_err(|e| Error::Device(format!("{}: shared memory: {e:?}", k.name)))?;
    }
    Ok(())
}

/// The `t · k` (token, choice) slots grouped by expert on the device (`moe_align`).
struct Grouping {
    /// Start of each expert's rows, then the total: `[e + 1]`.
    offsets: Tensor,
    /// Start of each expert's row tiles of `bm` rows, then the total: `[e + 1]`.
    tiles: Tensor,
    /// Token of each grouped row.
    token_of_row: Tensor,
    /// Grouped row of each slot `token · k + choice`.
    row_of_slot: Tensor,
    /// Rows per GEMM tile.
    bm: usize,
    /// An upper bound on the row tiles, known on the host: the GEMMs' grid height.
    max_tiles: usize,
    /// Whether the GEMMs' inner sizes are multiples of 8 (16-byte rows of bf16).
    aligned: bool,
    e: usize,
    /// Grouped rows, `t · k`.
    rows: usize,
}

impl Grouping {
    /// Adds to `out [rows, n]` (grouped rows) the delta `which` picks of each row's
    /// adapter, from inputs `input` (`[.., k]`, row `in_row[r]`, or row `r` without
    /// `in_row`), one block per row: from `table` (`which`'s device table, of deltas up to
    /// `max_rank`) when the step carries tables, a launch that a recording holds whatever
    /// the slots hold; else from a table of the slots' weights uploaded for the step.
    fn lora_delta<'l>(
        &self,
        b: &CudaBackend,
        lora: &MoeLora<'l>,
        (which, table): (impl Fn(&ExpertAdapter<'l>) -> Option<ExpertDelta<'l>>, Option<(&Tensor, usize)>),
        (out, input, in_row): (&Tensor, &Tensor, Option<&Tensor>),
        (k, n): (usize, usize),
    ) -> Result<()> {
        const OP: &str = "moe_experts_lora";
        let uploaded;
        let (table, max_rank) = match table {
            Some(kept) => kept,
            None => {
                let mut words = vec![0u32; TABLE_WORDS * lora.slots.len()];
                let mut max_rank = 0;
                for (entry, adapter) in words.chunks_exact_mut(TABLE_WORDS).zip(lora.slots) {
                    let Some(d) = adapter.as_ref().and_then(&which) else { continue };
                    entry.copy_from_slice(&table_entry(Some(&d))?);
                    max_rank = max_rank.max(d.a.dims()[1]);
                }
                if max_rank == 0 {
                    return Ok(());
                }
                uploaded = b.upload(&HostTensor::from_u32(&words, &[words.len()]), DType::U32)?;
                (&uploaded, max_rank)
            }
        };
        if self.rows == 0 || max_rank == 0 {
            return Ok(());
        }
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (self.rows as u32, 1, 1),
            block_dim: (MOE_LORA_THREADS, 1, 1),
            shared_mem_bytes: (max_rank * 4) as u32,
        };
        let in_row = match in_row {
            Some(t) => ptr(OP, t)?,
            None => 0,
        };
        launch!(
            b,
            "moe_lora_delta",
            cfg,
            [
                ptr(OP, out)?,
                ptr(OP, input)?,
                in_row,
                ptr(OP, &self.token_of_row)?,
                ptr(OP, &self.offsets)?,
                ptr(OP, lora.rows)?,
                ptr(OP, table)?,
                (table.elem_count() / TABLE_WORDS) as u32,
                self.rows as u32,
                self.e as u32,
                k as u32,
                n as u32
            ]
        )
    }

    /// `out [rows, n] = a[a_rows[r] or r] · w[expert]ᵀ` for every grouped row, for expert
    /// weights `w [e, n, kd]`, in one launch.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        b: &CudaBackend,
        a: &Tensor,
        a_rows: Option<&Tensor>,
        w: &Tensor,
        out: &Tensor,
        n: usize,
        kd: usize,
    ) -> Result<()> {
        let op = "moe_experts";
        let e4m3 = w.dtype() == super::fp8::FP8;
        let kernel = gemm_kernel(self.aligned, e4m3, self.bm, self.rows, self.e);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (n.div_ceil(GEMM_BN) as u32, self.max_tiles as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: kernel.shared_bytes(),
        };
        let rows = a_rows.map_or(Ok(0), |r| ptr(op, r))?;
        if e4m3 {
            let (scales, scale_rows, scale_stride, chunk_step) = super::fp8::scale_args(op, w)?;
            let (ap, wp, op_) = (ptr(op, a)?, ptr(op, w)?, ptr(op, out)?);
            let (offsets, tiles) = (ptr(op, &self.offsets)?, ptr(op, &self.tiles)?);
            let dims = (self.e as u32, n as u32, kd as u32);
            return launch!(
                b,
                kernel.name,
                cfg,
                [
                    ap,
                    rows,
                    wp,
                    scales,
                    scale_rows,
                    scale_stride,
                    chunk_step,
                    op_,
                    offsets,
                    tiles,
                    dims.0,
                    dims.1,
                    dims.2
                ]
            );
        }
        launch!(
            b,
            kernel.name,
            cfg,
            [
                ptr(op, a)?,
                rows,
                ptr(op, w)?,
                ptr(op, out)?,
                ptr(op, &self.offsets)?,
                ptr(op, &self.tiles)?,
                self.e as u32,
                n as u32,
                kd as u32,
            ]
        )
    }
}

#[cfg(test)]
mod tests {
    use super::tile_rows;

    #[test]
    fn tiles_follow_the_rows_per_expert() {
        assert_eq!(tile_rows(8, 128), 16, "batch 1, top-8 of 128");
        assert_eq!(tile_rows(256 * 8, 128), 16, "16 rows per expert");
        assert_eq!(tile_rows(512 * 8, 128), 32);
        assert_eq!(tile_rows(8192 * 8, 128), 64);
        assert_eq!(tile_rows(3, 0), 16, "no experts does not divide by zero");
    }
}
