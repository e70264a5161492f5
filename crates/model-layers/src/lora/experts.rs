//! Adapters on routed experts: PEFT's two ways of writing them, read into one form per
//! layer, a delta on the stacked gate/up weight and one on the stacked down weight.
//!
//! - Per-expert modules (adapters trained on transformers 4, whose experts were
//!   `nn.Linear`s): `mlp.experts.{e}.{gate,up,down}_proj.lora_{A,B}.weight`, each expert
//!   its own `A [r, in]` and `B [out, r]`. Gate and up become one delta on the fused
//!   weight: their `A`s stacked, their `B`s side by side in a block-diagonal `B`, which
//!   computes each exactly (the zero blocks add exact zeros).
//! - Expert parameters (transformers 5's fused experts, PEFT's `target_parameters`):
//!   `mlp.experts.lora_{A,B}.weight` wrapping one of `gate_up_proj [e, 2i, h]` and
//!   `down_proj [e, h, i]`, `mlp.experts.base_layer.lora_{A,B}.weight` the other. `A` is
//!   `[e·r, in]`, expert `x`'s rows `x·r ..`; `B` is `[out, r·e]`, expert `x`'s column `j`
//!   at `j·e + x` (PEFT's `ParamWrapper`). Which weight each wraps is read from the shapes,
//!   which differ for every mixture.
//!
//! A step hands a layer's experts the deltas of every slot ([`LayerExperts::adapter`]);
//! the backend adds them per (token, choice) row ([`GpuBackend::moe_experts_lora`]).
//!
//! [`GpuBackend::moe_experts_lora`]: met_kernels::GpuBackend::moe_experts_lora

use std::collections::BTreeMap;

use met_config::ModelConfig;
use met_kernels::{ExpertAdapter, ExpertDelta, GpuBackend, HostTensor, Tensor};
use met_model_weights::{SafetensorsStore, WeightStore};

use super::config::{AdapterConfig, ExpertParam};
use super::module::LoraModule;
use crate::Result;

/// One delta on one expert stack, on the host: `a [e, r, in]`, `b [e, out, r]`.
pub(crate) struct HostDelta {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub rank: usize,
    pub scale: f32,
}

/// An adapter's deltas on one layer's experts, on the host.
#[derive(Default)]
pub(crate) struct HostExperts {
    pub gate_up: Option<HostDelta>,
    pub down: Option<HostDelta>,
}

/// One delta on one expert stack, on the device.
pub(crate) struct DeviceDelta {
    a: Tensor,
    b: Tensor,
    scale: f32,
}

/// An adapter's deltas on one layer's experts, on the device.
pub(crate) struct LayerExperts {
    gate_up: Option<DeviceDelta>,
    down: Option<DeviceDelta>,
}

impl LayerExperts {
    /// Uploads `host` for experts of `e` experts, hidden size `h`, intermediate size `i`.
    pub fn upload(b: &dyn GpuBackend, host: &HostExperts, (e, h, i): (usize, usize, usize)) -> Result<Self> {
        let up = |d: &Option<HostDelta>, inputs: usize, outputs: usize| -> Result<Option<DeviceDelta>> {
            let Some(d) = d else { return Ok(None) };
            let load = |v: &[f32], dims: &[usize]| b.upload(&HostTensor::from_f32(v, dims), b.float_dtype());
            Ok(Some(DeviceDelta {
                a: load(&d.a, &[e, d.rank, inputs])?,
                b: load(&d.b, &[e, outputs, d.rank])?,
                scale: d.scale,
            }))
        };
        Ok(Self { gate_up: up(&host.gate_up, h, 2 * i)?, down: up(&host.down, i, h)? })
    }

    /// These deltas as the backend op takes them.
    pub fn adapter(&self) -> ExpertAdapter<'_> {
        fn view(d: &Option<DeviceDelta>) -> Option<ExpertDelta<'_>> {
            d.as_ref().map(|d| ExpertDelta { a: &d.a, b: &d.b, scale: d.scale })
        }
        ExpertAdapter { gate_up: view(&self.gate_up), down: view(&self.down) }
    }
}

/// Where an expert tensor of an adapter file belongs in its layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum ExpertName {
    /// `mlp.experts.{expert}.{module}`.
    Module { expert: usize, module: LoraModule },
    /// `mlp.experts[.base_layer]`: a wrapped expert parameter, inner or outer.
    Param { inner: bool },
}

impl ExpertName {
    /// The name's parts after `layers.{l}.`, up to `lora_A.weight`: `["mlp", "experts", ...]`.
    pub fn parse(parts: &[&str]) -> Option<Self> {
        match parts {
            ["mlp", "experts"] => Some(Self::Param { inner: false }),
            ["mlp", "experts", "base_layer"] => Some(Self::Param { inner: true }),
            ["mlp", "experts", expert, module] => {
                let module = LoraModule::from_name(module)
                    .filter(|m| matches!(m, LoraModule::Gate | LoraModule::Up | LoraModule::Down))?;
                Some(Self::Module { expert: expert.parse().ok()?, module })
            }
            _ => None,
        }
    }
}

/// The expert tensors of one adapter file by layer (their `lora_A` names), gathered while
/// the file's names are read and assembled once all are known.
#[derive(Default)]
pub(super) struct ExpertTensors {
    layers: BTreeMap<usize, BTreeMap<ExpertName, String>>,
}

impl ExpertTensors {
    /// Records `a_name` at `name` of `layer`.
    pub fn insert(&mut self, layer: usize, name: ExpertName, a_name: &str) {
        self.layers.entry(layer).or_default().insert(name, a_name.to_owned());
    }

    /// The number of tensors recorded (each `lora_A` with its `lora_B`).
    pub fn tensors(&self) -> usize {
        2 * self.layers.values().map(BTreeMap::len).sum::<usize>()
    }

    /// Every layer's deltas, read from `store` and checked against `cfg` and `config`, with
    /// ranks up to `max_rank` (twice that for gate/up, which fuses two projections).
    pub fn assemble(
        &self,
        store: &SafetensorsStore,
        config: &AdapterConfig,
        cfg: &ModelConfig,
        max_rank: usize,
    ) -> std::result::Result<Vec<Option<HostExperts>>, String> {
        let mut layers: Vec<Option<HostExperts>> = (0..cfg.num_layers).map(|_| None).collect();
        for (&layer, names) in &self.layers {
            let moe = cfg.moe.as_ref().filter(|m| m.sparse_layers.get(layer).copied().unwrap_or(false));
            let Some(moe) = moe else {
                return Err(format!("layer {layer} has no routed experts, but the adapter names some"));
            };
            let dims = Dims { e: moe.num_experts, h: cfg.hidden_size, i: moe.expert_intermediate_size, layer };
            let mut host = HostExperts::default();
            let mut modules: BTreeMap<LoraModule, Vec<(usize, &str)>> = BTreeMap::new();
            for (name, a_name) in names {
                match *name {
                    ExpertName::Param { .. } => {
                        let (param, delta) = read_param(store, config, a_name, &dims)?;
                        let slot = match param {
                            ExpertParam::GateUp => &mut host.gate_up,
                            ExpertParam::Down => &mut host.down,
                        };
                        if slot.replace(delta).is_some() {
                            return Err(format!("layer {layer}: two tensors adapt the experts' {}", param.name()));
                        }
                    }
                    ExpertName::Module { expert, module } => modules.entry(module).or_default().push((expert, a_name)),
                }
            }
            let per_expert = |m: LoraModule| -> std::result::Result<Option<HostDelta>, String> {
                modules.get(&m).map(|found| read_modules(store, config, m, found, &dims)).transpose()
            };
            let (gate, up, down) =
                (per_expert(LoraModule::Gate)?, per_expert(LoraModule::Up)?, per_expert(LoraModule::Down)?);
            if gate.is_some() || up.is_some() {
                if host.gate_up.is_some() {
                    return Err(format!(
                        "layer {layer}: gate_up_proj and per-expert gate/up adapters both adapt the experts"
                    ));
                }
                host.gate_up = Some(fuse_gate_up(gate, up, &dims));
            }
            if let Some(d) = down
                && host.down.replace(d).is_some()
            {
                return Err(format!("layer {layer}: down_proj and per-expert down adapters both adapt the experts"));
            }
            for (what, d, limit) in [("gate/up", &host.gate_up, 2 * max_rank), ("down", &host.down, max_rank)] {
                if let Some(d) = d.as_ref().filter(|d| d.rank > limit) {
                    return Err(format!(
                        "layer {layer}: the experts' {what} delta has rank {}, over the {limit} --max-lora-rank allows",
                        d.rank
                    ));
                }
            }
            layers[layer] = Some(host);
        }
        Ok(layers)
    }
}

/// The sizes of one layer's experts.
struct Dims {
    e: usize,
    h: usize,
    i: usize,
    layer: usize,
}

fn read(store: &SafetensorsStore, name: &str) -> std::result::Result<(Vec<usize>, Vec<f32>), String> {
    let info = store.info(name).ok_or_else(|| format!("`{name}` is missing"))?;
    let values = store.host(name).and_then(|h| Ok(h.to_f32_vec()?)).map_err(|e| format!("`{name}`: {e}"))?;
    Ok((info.shape.clone(), values))
}

/// A wrapped expert parameter: which one its shapes say it is, and its delta in the
/// per-expert layout.
fn read_param(
    store: &SafetensorsStore,
    config: &AdapterConfig,
    a_name: &str,
    d: &Dims,
) -> std::result::Result<(ExpertParam, HostDelta), String> {
    let b_name = a_name.replace(".lora_A.weight", ".lora_B.weight");
    let ((ad, a), (bd, b)) = (read(store, a_name)?, read(store, &b_name)?);
    let [rows, inputs] = ad[..] else { return Err(format!("`{a_name}` has shape {ad:?}, not [rank · experts, in]")) };
    let [outputs, cols] = bd[..] else {
        return Err(format!("`{b_name}` has shape {bd:?}, not [out, rank · experts]"));
    };
    let param = match (inputs, outputs) {
        (i, o) if (i, o) == (d.h, 2 * d.i) => ExpertParam::GateUp,
        (i, o) if (i, o) == (d.i, d.h) => ExpertParam::Down,
        _ => {
            return Err(format!(
                "`{a_name}` {ad:?} and `{b_name}` {bd:?} fit neither the experts' gate_up_proj ({} in, {} out) nor \
                 down_proj ({} in, {} out)",
                d.h,
                2 * d.i,
                d.i,
                d.h
            ));
        }
    };
    if !config.expert_targets.contains(&param) {
        return Err(format!(
            "`{a_name}` adapts the experts' {}, which `target_parameters` does not list",
            param.name()
        ));
    }
    let peft_name = format!("model.layers.{}.mlp.experts.{}", d.layer, param.name());
    let rank = config.rank_of(&peft_name)?;
    if rows != rank * d.e || cols != rows {
        return Err(format!(
            "`{a_name}` {ad:?} and `{b_name}` {bd:?}: {} experts at rank {rank} need {} rows of A and columns of B",
            d.e,
            rank * d.e
        ));
    }
    // B's column j of expert x is at j·e + x; the per-expert layout wants [e, out, r].
    let mut per_expert = vec![0f32; d.e * outputs * rank];
    for x in 0..d.e {
        for o in 0..outputs {
            for j in 0..rank {
                per_expert[(x * outputs + o) * rank + j] = b[o * cols + j * d.e + x];
            }
        }
    }
    Ok((param, HostDelta { a, b: per_expert, rank, scale: config.scale_of(&peft_name)? }))
}

/// One module of every expert written per expert: `A`s stacked `[e, r, in]`, `B`s
/// `[e, out, r]`.
fn read_modules(
    store: &SafetensorsStore,
    config: &AdapterConfig,
    module: LoraModule,
    found: &[(usize, &str)],
    d: &Dims,
) -> std::result::Result<HostDelta, String> {
    if !config.targets(module.name()) {
        return Err(format!("`{}` adapts {}, which `target_modules` does not list", found[0].1, module.name()));
    }
    let (inputs, outputs) = if module == LoraModule::Down { (d.i, d.h) } else { (d.h, d.i) };
    let name = |x: usize| format!("model.layers.{}.mlp.experts.{x}.{}", d.layer, module.name());
    let (rank, scale) = (config.rank_of(&name(0))?, config.scale_of(&name(0))?);
    let by_expert: BTreeMap<usize, &str> = found.iter().copied().collect();
    let (mut a, mut b) = (Vec::with_capacity(d.e * rank * inputs), Vec::with_capacity(d.e * outputs * rank));
    for x in 0..d.e {
        let a_name = by_expert
            .get(&x)
            .ok_or_else(|| format!("layer {}: expert {x} has no {} adapter", d.layer, module.name()))?;
        if (config.rank_of(&name(x))?, config.scale_of(&name(x))?) != (rank, scale) {
            return Err(format!(
                "`rank_pattern` or `alpha_pattern` gives the experts' {} different ranks",
                module.name()
            ));
        }
        let b_name = a_name.replace(".lora_A.weight", ".lora_B.weight");
        let ((ad, va), (bd, vb)) = (read(store, a_name)?, read(store, &b_name)?);
        if ad != [rank, inputs] || bd != [outputs, rank] {
            return Err(format!(
                "`{a_name}` {ad:?} and `{b_name}` {bd:?}: this model needs [{rank}, {inputs}] and [{outputs}, {rank}]"
            ));
        }
        a.extend(va);
        b.extend(vb);
    }
    if let Some(&(x, _)) = found.iter().find(|(x, _)| *x >= d.e) {
        return Err(format!("layer {}: expert {x} is past the model's {}", d.layer, d.e));
    }
    Ok(HostDelta { a, b, rank, scale })
}

/// Per-expert gate and up deltas as one delta on the fused gate/up weight: `A` the two
/// stacked, `B` block-diagonal (gate's rows of output from gate's ranks, up's from up's),
/// up's scale folded into its block where the two differ.
fn fuse_gate_up(gate: Option<HostDelta>, up: Option<HostDelta>, d: &Dims) -> HostDelta {
    let (rg, ru) = (gate.as_ref().map_or(0, |g| g.rank), up.as_ref().map_or(0, |u| u.rank));
    let rank = rg + ru;
    let scale = gate.as_ref().or(up.as_ref()).map_or(1.0, |g| g.scale);
    let (h, i) = (d.h, d.i);
    let mut a = Vec::with_capacity(d.e * rank * h);
    let mut b = vec![0f32; d.e * 2 * i * rank];
    for x in 0..d.e {
        // (delta, its first rank column, its first output row)
        for (part, offset, row0) in [(&gate, 0, 0), (&up, rg, i)] {
            let Some(p) = part else { continue };
            a.extend_from_slice(&p.a[x * p.rank * h..(x + 1) * p.rank * h]);
            let ratio = p.scale / scale;
            for o in 0..i {
                let src = &p.b[(x * i + o) * p.rank..][..p.rank];
                let dst = &mut b[(x * 2 * i + row0 + o) * rank + offset..][..p.rank];
                for (t, s) in dst.iter_mut().zip(src) {
                    *t = if ratio == 1.0 { *s } else { s * ratio };
                }
            }
        }
    }
    HostDelta { a, b, rank, scale }
}
