//! Mixture-of-experts routing and expert MLPs on the CPU.
//!
//! Tokens are grouped by expert so each expert runs one GEMM over all of its tokens, in
//! expert order, and its outputs are added back into their tokens weighted by the router.
//! Adapters on the experts ([`MoeLora`]) add their deltas to an expert's two products, per
//! run of its rows through one adapter, in PEFT's order (`base + (x·Aᵀ·Bᵀ) · scale`).

use crate::Tensor;
use crate::backend::lora::check_moe_lora;
use crate::backend::{ExpertDelta, MoeLora, NO_LORA_SLOT, Routing};

/// An f32 tensor's values, read in place.
type MappedF32<'a> = parking_lot::MappedRwLockReadGuard<'a, [f32]>;
use crate::error::{Error, Result, ensure};

use super::qmatmul::matmul_packed_rows;
use super::{QuantDots, WeightView, f32_tensor, matmul_xwt, read_f32, read_u32, read_weight, u32_tensor};

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
    dots: QuantDots,
    lora: Option<&MoeLora<'_>>,
) -> Result<Tensor> {
    let crate::check::Moe { t, h, e, i, k } = crate::check::moe(x, routing, gate_up, down)?;
    let deltas = lora.map(|l| Deltas::read(l, (t, e, h, i), x)).transpose()?;
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
        let mut hidden = expert_product(&gu, &rows, expert * 2 * i..(expert + 1) * 2 * i, n, h, dots);
        if let Some(d) = &deltas {
            d.add(Stack::GateUp, expert, group, &rows, &mut hidden, h);
        }
        let act: Vec<f32> = hidden
            .chunks_exact(2 * i)
            .flat_map(|r| r[..i].iter().zip(&r[i..]).map(|(g, u)| g / (1.0 + (-g).exp()) * u))
            .collect();
        let mut y = expert_product(&dn, &act, expert * h..(expert + 1) * h, n, i, dots);
        if let Some(d) = &deltas {
            d.add(Stack::Down, expert, group, &act, &mut y, i);
        }
        for (&(tok, w), yr) in group.iter().zip(y.chunks_exact(h)) {
            for (o, v) in out[tok * h..(tok + 1) * h].iter_mut().zip(yr) {
                *o += w * v;
            }
        }
    }
    Ok(f32_tensor(out, &[t, h]))
}

/// One adapter's delta on one expert stack, read.
struct Delta<'a> {
    a: MappedF32<'a>,
    b: MappedF32<'a>,
    rank: usize,
    outputs: usize,
    scale: f32,
}

impl<'a> Delta<'a> {
    fn read(d: &ExpertDelta<'a>) -> Result<Self> {
        const OP: &str = "moe_experts_lora";
        let (rank, outputs) = (d.a.dims()[1], d.b.dims()[1]);
        Ok(Self { a: read_f32(OP, d.a)?, b: read_f32(OP, d.b)?, rank, outputs, scale: d.scale })
    }
}

/// Which of an expert's two products a delta adds to.
#[derive(Clone, Copy)]
enum Stack {
    GateUp,
    Down,
}

/// An adapter's deltas on one layer's experts, read.
#[derive(Default)]
struct AdapterDeltas<'a> {
    gate_up: Option<Delta<'a>>,
    down: Option<Delta<'a>>,
}

/// The adapters of one MoE call, read: each token's slot and each slot's deltas.
struct Deltas<'a> {
    tokens: Vec<u32>,
    slots: Vec<AdapterDeltas<'a>>,
}

impl<'a> Deltas<'a> {
    /// Reads and checks `lora` for `t` tokens of `x` over `e` experts of sizes `h`, `i`.
    fn read(lora: &MoeLora<'a>, dims: (usize, usize, usize, usize), x: &Tensor) -> Result<Self> {
        const OP: &str = "moe_experts_lora";
        check_moe_lora(OP, lora, dims, x.dtype())?;
        let tokens = read_u32(OP, lora.rows)?.to_vec();
        if let Some(bad) = tokens.iter().find(|&&s| s != NO_LORA_SLOT && s as usize >= lora.slots.len()) {
            return Err(Error::InvalidArgument(format!("{OP}: slot {bad} is past the {} slots", lora.slots.len())));
        }
        let slots = lora
            .slots
            .iter()
            .map(|s| {
                let Some(s) = s else { return Ok(AdapterDeltas::default()) };
                Ok(AdapterDeltas {
                    gate_up: s.gate_up.as_ref().map(Delta::read).transpose()?,
                    down: s.down.as_ref().map(Delta::read).transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self { tokens, slots })
    }

    /// Adds into `out [n, outputs]`, the product of `expert` for the `n` (token, weight)
    /// rows of `group` from inputs `x [n, k]`, each row's adapter's delta on stack `which`: per slot, the rows of that slot as one shrink and one expansion.
    fn add(&self, which: Stack, expert: usize, group: &[(usize, f32)], x: &[f32], out: &mut [f32], k: usize) {
        for (slot, adapter) in self.slots.iter().enumerate() {
            let d = match which {
                Stack::GateUp => &adapter.gate_up,
                Stack::Down => &adapter.down,
            };
            let Some(d) = d else { continue };
            let mine: Vec<usize> = (0..group.len()).filter(|&j| self.tokens[group[j].0] as usize == slot).collect();
            if mine.is_empty() {
                continue;
            }
            let (m, r, n) = (mine.len(), d.rank, d.outputs);
            let rows: Vec<f32> = mine.iter().flat_map(|&j| x[j * k..(j + 1) * k].iter().copied()).collect();
            let shrunk = matmul_xwt(&rows, &d.a[expert * r * k..(expert + 1) * r * k], None, m, k, r);
            let delta = matmul_xwt(&shrunk, &d.b[expert * n * r..(expert + 1) * n * r], None, m, r, n);
            for (&j, row) in mine.iter().zip(delta.chunks_exact(n.max(1))) {
                for (o, dv) in out[j * n..(j + 1) * n].iter_mut().zip(row) {
                    *o += dv * d.scale;
                }
            }
        }
    }
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
    dots: QuantDots,
) -> Vec<f32> {
    match w {
        WeightView::Packed(parts) => matmul_packed_rows(x, parts, rows, m, dots),
        _ => {
            let n = rows.len();
            matmul_xwt(x, &w.rows_f32(rows, k), None, m, k, n)
        }
    }
}
