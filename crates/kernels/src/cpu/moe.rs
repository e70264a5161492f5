//! Mixture-of-experts routing and expert MLPs on the CPU.
//!
//! Tokens are grouped by expert so each expert runs one GEMM over all of its tokens, in
//! expert order, and its outputs are added back into their tokens weighted by the router.

use crate::Tensor;
use crate::backend::Routing;
use crate::error::{Error, Result, ensure};

use super::qmatmul::matmul_packed_rows;
use super::{CpuDots, WeightView, f32_tensor, matmul_xwt, read_f32, read_u32, read_weight, u32_tensor};

pub(super) fn topk_routing(logits: &Tensor, k: usize, renormalize: bool) -> Result<Routing> {
    let d = logits.dims();
    ensure(d.len() == 2 && k > 0 && k <= d[1], "topk_routing", || format!("cannot pick {k} of logits {d:?}"))?;
    let (t, e) = (d[0], d[1]);
    let xs = read_f32("topk_routing", logits)?;
    let mut weights = Vec::with_capacity(t * k);
    let mut experts = Vec::with_capacity(t * k);
    for row in xs.chunks_exact(e) {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let probs: Vec<f32> = row.iter().map(|x| (x - max).exp()).collect();
        let total: f32 = probs.iter().sum();
        let mut order: Vec<usize> = (0..e).collect();
        // Highest probability first; ties go to the lower expert index.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        let chosen = &order[..k];
        let norm = if renormalize { chosen.iter().map(|&i| probs[i]).sum::<f32>() } else { total };
        for &i in chosen {
            experts.push(i as u32);
            weights.push(probs[i] / norm);
        }
    }
    Ok(Routing { weights: f32_tensor(weights, &[t, k]), experts: u32_tensor(experts, &[t, k]) })
}

pub(super) fn moe_experts(
    x: &Tensor,
    routing: &Routing,
    gate_up: &Tensor,
    down: &Tensor,
    dots: CpuDots,
) -> Result<Tensor> {
    let crate::check::Moe { t, h, e, i, k } = crate::check::moe(x, routing, gate_up, down)?;
    if t == 0 || h == 0 || i == 0 {
        return Ok(f32_tensor(vec![0.0; t * h], &[t, h]));
    }
    let (xs, gu, dn) =
        (read_f32("moe_experts", x)?, read_weight("moe_experts", gate_up)?, read_weight("moe_experts", down)?);
    let (ids, ws) = (read_u32("moe_experts", &routing.experts)?, read_f32("moe_experts", &routing.weights)?);

    // Group (token, weight) pairs by expert.
    let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e];
    for (slot, (&id, &w)) in ids.iter().zip(ws.iter()).enumerate() {
        let group = groups
            .get_mut(id as usize)
            .ok_or_else(|| Error::InvalidArgument(format!("moe_experts: expert {id} is past the {e} experts")))?;
        group.push((slot / k.max(1), w));
    }

    let mut out = vec![0f32; t * h];
    for (expert, group) in groups.iter().enumerate().filter(|(_, g)| !g.is_empty()) {
        let n = group.len();
        let mut rows = Vec::with_capacity(n * h);
        for &(tok, _) in group {
            rows.extend_from_slice(&xs[tok * h..(tok + 1) * h]);
        }
        let hidden = expert_product(&gu, &rows, expert * 2 * i..(expert + 1) * 2 * i, n, h, dots);
        let act: Vec<f32> = hidden
            .chunks_exact(2 * i)
            .flat_map(|r| r[..i].iter().zip(&r[i..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u))
            .collect();
        let y = expert_product(&dn, &act, expert * h..(expert + 1) * h, n, i, dots);
        for (&(tok, w), yr) in group.iter().zip(y.chunks_exact(h)) {
            for (o, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(yr) {
                *o += w * v;
            }
        }
    }
    Ok(f32_tensor(out, &[t, h]))
}

/// `x [m, k] · w[rows]ᵀ` for an expert's rows of a stack: on the packed blocks' own
/// products where the stack is packed (as a dense projection's, with `dots`), else on the
/// rows as f32 (dequantised per use when stored as plain blocks).
fn expert_product(
    w: &WeightView<'_>,
    x: &[f32],
    rows: std::ops::Range<usize>,
    m: usize,
    k: usize,
    dots: CpuDots,
) -> Vec<f32> {
    match w {
        WeightView::Packed(parts) => matmul_packed_rows(x, parts, rows, m, dots),
        _ => {
            let n = rows.len();
            matmul_xwt(x, &w.rows_f32(rows, k), None, m, k, n)
        }
    }
}
