//! Mixture of experts on the GPU: top-k routing in a kernel, then the expert MLPs as
//! per-expert GEMMs over the tokens routed to each expert.
//!
//! The expert choices are read on the host (a small `[t, k]` download, one synchronisation
//! per MoE layer) to group the `t · k` (token, expert) pairs by expert with a counting
//! sort; the grouped rows are gathered into one contiguous batch, each expert with tokens
//! runs its gate/up GEMM, SiLU·mul and down GEMM on its slice, and a combine kernel sums
//! each token's k outputs weighted by the router. *Planned:* device-side grouping and one
//! grouped GEMM, without the synchronisation.

use super::gemm::Gemm;
use super::{CudaBackend, expect_dtype, launch, ptr};
use crate::backend::{GpuBackend, Routing};
use crate::error::{Error, Result, ensure};
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

pub(super) fn moe_experts(
    b: &CudaBackend,
    x: &Tensor,
    routing: &Routing,
    gate_up: &Tensor,
    down: &Tensor,
) -> Result<Tensor> {
    let crate::check::Moe { t, h, e, i, k } = crate::check::moe(x, routing, gate_up, down)?;
    for w in [x, gate_up, down] {
        expect_dtype("moe_experts", w, &[DType::BF16])?;
    }
    expect_dtype("moe_experts", &routing.weights, &[DType::F32, DType::BF16])?;
    let ids = b.host_u32("moe_experts", &routing.experts)?;
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= e) {
        return Err(Error::InvalidArgument(format!("moe_experts: expert {bad} is past the {e} experts")));
    }
    if t == 0 || h == 0 || i == 0 || k == 0 {
        return b.zeros(&[t, h], DType::BF16);
    }
    let groups = Groups::new(&ids, e, k);
    let op = "moe_experts";
    let tk = t * k;
    // [t·k, h]: the rows of x in expert order.
    let xs = b.gather_rows_by(x, &groups.token_of_row)?;
    let hidden = b.alloc(&[tk, 2 * i], DType::BF16)?;
    let (xs_p, hidden_p, gu_p) = (ptr(op, &xs)?, ptr(op, &hidden)?, ptr(op, gate_up)?);
    for (expert, rows) in groups.ranges() {
        let g = Gemm {
            x: xs_p + (rows.start * h * 2) as u64,
            w: gu_p + (expert * 2 * i * h * 2) as u64,
            out: hidden_p + (rows.start * 2 * i * 2) as u64,
            m: rows.len(),
            n: 2 * i,
            k: h,
            accumulate: false,
        };
        b.blas.gemm(&b.dev, g)?;
    }
    let act = super::ops::silu_mul(b, &hidden)?;
    let y = b.alloc(&[tk, h], DType::BF16)?;
    let (act_p, y_p, dn_p) = (ptr(op, &act)?, ptr(op, &y)?, ptr(op, down)?);
    for (expert, rows) in groups.ranges() {
        let g = Gemm {
            x: act_p + (rows.start * i * 2) as u64,
            w: dn_p + (expert * h * i * 2) as u64,
            out: y_p + (rows.start * h * 2) as u64,
            m: rows.len(),
            n: h,
            k: i,
            accumulate: false,
        };
        b.blas.gemm(&b.dev, g)?;
    }
    let row_of_slot = b.upload_u32(&groups.row_of_slot, &[tk])?;
    let out = b.alloc(&[t, h], DType::BF16)?;
    let cfg = super::per_row(t, h, 256);
    let args = (y_p, ptr(op, &row_of_slot)?, ptr(op, &routing.weights)?, ptr(op, &out)?, k as u32, h as u32);
    match routing.weights.dtype() {
        DType::F32 => launch!(b, "moe_combine_f32", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
        _ => launch!(b, "moe_combine_bf16", cfg, [args.0, args.1, args.2, args.3, args.4, args.5])?,
    }
    Ok(out)
}

/// The `t · k` (token, choice) slots grouped by expert with a counting sort.
struct Groups {
    /// Start of each expert's rows, plus the total: `[e + 1]`.
    offsets: Vec<usize>,
    /// Token of each grouped row.
    token_of_row: Vec<u32>,
    /// Grouped row of each slot `token · k + choice`.
    row_of_slot: Vec<u32>,
}

impl Groups {
    fn new(ids: &[u32], e: usize, k: usize) -> Self {
        let mut offsets = vec![0usize; e + 1];
        for &id in ids {
            offsets[id as usize + 1] += 1;
        }
        for x in 1..=e {
            offsets[x] += offsets[x - 1];
        }
        let mut next = offsets.clone();
        let (mut token_of_row, mut row_of_slot) = (vec![0u32; ids.len()], vec![0u32; ids.len()]);
        for (slot, &id) in ids.iter().enumerate() {
            let row = next[id as usize];
            next[id as usize] += 1;
            token_of_row[row] = (slot / k) as u32;
            row_of_slot[slot] = row as u32;
        }
        Self { offsets, token_of_row, row_of_slot }
    }

    /// Each expert with tokens and its range of grouped rows.
    fn ranges(&self) -> impl Iterator<Item = (usize, std::ops::Range<usize>)> + '_ {
        self.offsets.windows(2).enumerate().filter(|(_, w)| w[1] > w[0]).map(|(x, w)| (x, w[0]..w[1]))
    }
}

impl CudaBackend {
    /// Rows of `x [m, n]` at host-known indices, uploaded for the gather.
    fn gather_rows_by(&self, x: &Tensor, rows: &[u32]) -> Result<Tensor> {
        let idx = self.upload_u32(rows, &[rows.len()])?;
        super::ops::gather_rows(self, x, &idx)
    }
}

#[cfg(test)]
mod tests {
    use super::Groups;

    #[test]
    fn groups_sort_slots_by_expert_stably() {
        // Tokens 0..3 with k = 2: experts (2, 0), (0, 1), (2, 2).
        let g = Groups::new(&[2, 0, 0, 1, 2, 2], 3, 2);
        assert_eq!(g.offsets, [0, 2, 3, 6]);
        assert_eq!(g.token_of_row, [0, 1, 1, 0, 2, 2]);
        assert_eq!(g.row_of_slot, [3, 0, 1, 2, 4, 5]);
        let ranges: Vec<_> = g.ranges().collect();
        assert_eq!(ranges, [(0, 0..2), (1, 2..3), (2, 3..6)]);
    }
}
