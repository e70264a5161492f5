//! LoRA adapters: PEFT's low-rank deltas on a model's projections, loaded beside the base
//! weights and applied per row, so one batch mixes sequences of several adapters and of
//! the base model.
//!
//! An adapter is read from a PEFT directory (`adapter_config.json` and
//! `adapter_model.safetensors`) and checked against the model's recipe before it exists:
//! every tensor must name a linear layer this model has ([`LoraModule`]: attention, MLP,
//! shared expert and router, a hybrid's Gated DeltaNet projections; a PEFT module met
//! splits into several projections, such as gated attention's doubled `q_proj`, has its
//! rows split as the checkpoint's are) or its routed experts' weights, in either of PEFT's
//! layouts (`experts.rs`), with the shapes that projection and the adapter's rank give.
//! Its weights are written once into a free slot of the model's [`LoraPool`]; a loaded
//! [`Adapter`] is immutable and shared (`Arc`) and holds its slot, so a request that holds
//! one keeps it resident and unchanged until it finishes, whatever is unloaded meanwhile.
//!
//! A batch names its adapters as runs of rows ([`AdapterRun`]); a step turns them into
//! the slot of each row, and each projection adds the deltas through two backend ops
//! around its base product (`GpuBackend::lora_shrink`, `GpuBackend::lora_expand`) that
//! read those slots on the device, so the same step runs eagerly or replayed from a
//! decode graph.
//!
//! Follows PEFT's `LoraLayer.forward`: `base(x) + lora_B(lora_A(x)) · scaling`.

mod apply;
mod config;
mod experts;
mod module;
mod pool;
mod random;

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use met_config::ModelConfig;
use met_model_weights::{SafetensorsStore, WeightStore};

use crate::models::checkpoint_view::split_rows;
pub(crate) use apply::StepLora;
pub use apply::{AdapterRun, LayerLora};
use config::AdapterConfig;
use experts::{ExpertName, ExpertTensors};
pub use module::LoraModule;
pub(crate) use module::MODULES;
use pool::{HostPair, HostWeights, SlotLease};
pub use pool::{LoraLimits, LoraPool};

use crate::{ModelError, Result};

/// Identifies one load of an adapter: a name loaded again gets a new id, so nothing keyed
/// by the id (the prefix cache) mixes the two loads' outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AdapterId(pub u64);

/// A loaded adapter, shared by the requests that use it.
pub type Adapter = Arc<LoraAdapter>;

/// A PEFT LoRA adapter, resident in a slot of its model's [`LoraPool`].
pub struct LoraAdapter {
    id: AdapterId,
    name: String,
    rank: usize,
    /// Per layer, which modules ([`LoraModule::ALL`] order) it adapts.
    adapted: Vec<[bool; MODULES]>,
    /// Whether it adapts routed experts.
    experts: bool,
    lease: SlotLease,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter").field("id", &self.id).field("name", &self.name).field("rank", &self.rank).finish()
    }
}

/// Two handles are equal when they hold the same load.
impl PartialEq for LoraAdapter {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for LoraAdapter {}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// Loads the PEFT adapter in `dir` as `name` for a model of `cfg` into a free slot of
    /// `pool` (the model's, [`crate::Model::attach_lora`]).
    ///
    /// # Errors
    /// [`ModelError::Adapter`] naming what is wrong: a missing or unreadable file, a
    /// setting met does not implement, a rank over the pool's, a tensor of a module this
    /// model lacks or of the wrong shape, a backend that cannot apply one of its deltas, or
    /// no free slot (every one held by a loaded adapter, or by an unloaded one whose requests are
    /// still running).
    pub fn load(name: &str, dir: &Path, cfg: &ModelConfig, pool: &Arc<LoraPool>) -> Result<Self> {
        let fail = |msg: String| ModelError::Adapter { name: name.to_owned(), msg };
        let config = AdapterConfig::read(dir).map_err(fail)?;
        if config.rank > pool.max_rank() {
            return Err(fail(format!("rank {} is over --max-lora-rank {}", config.rank, pool.max_rank())));
        }
        let file = dir.join("adapter_model.safetensors");
        if !file.is_file() {
            return Err(fail(format!("{} does not exist", file.display())));
        }
        let store = SafetensorsStore::open(&file).map_err(|e| fail(e.to_string()))?;
        let weights = read_layers(&store, &config, cfg, pool.max_rank()).map_err(fail)?;
        if weights.experts.iter().any(Option::is_some) && !pool.takes_expert_adapters() {
            return Err(fail("it adapts routed experts, which this backend does not apply adapters to yet".into()));
        }
        Self::install(name, weights, config.scale, pool)
    }

    /// Writes `weights` into a free slot of `pool` as an adapter named `name`.
    fn install(name: &str, weights: HostWeights, scale: f32, pool: &Arc<LoraPool>) -> Result<Self> {
        let lease = pool.take().ok_or_else(|| ModelError::Adapter {
            name: name.to_owned(),
            msg: format!(
                "all {} LoRA slots (--max-loras) are held, by loaded adapters or by unloaded ones whose requests \
                 are still running",
                pool.slots()
            ),
        })?;
        pool.write(&lease, &weights, scale)?;
        let adapted = weights.layers.iter().map(|l| l.each_ref().map(Option::is_some)).collect();
        let experts = weights.experts.iter().any(Option::is_some);
        let id = AdapterId(NEXT_ID.fetch_add(1, Ordering::Relaxed));
        Ok(Self { id, name: name.to_owned(), rank: weights.rank, adapted, experts, lease })
    }

    /// This load's id.
    pub fn id(&self) -> AdapterId {
        self.id
    }

    /// The name it was loaded as.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its rank `r`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Whether it adapts `module` in layer `layer`.
    pub fn adapts(&self, layer: usize, module: LoraModule) -> bool {
        self.adapted.get(layer).is_some_and(|l| l[module.index()])
    }

    /// Whether it adapts routed experts, whose deltas run in eager steps only.
    pub fn adapts_experts(&self) -> bool {
        self.experts
    }

    /// Its slot in [`Self::pool`].
    pub(crate) fn slot(&self) -> u32 {
        self.lease.slot()
    }

    /// The slots it lives in.
    pub(crate) fn pool(&self) -> &Arc<LoraPool> {
        self.lease.pool()
    }
}

/// Every tensor of `store` read to the host and placed in its layer and module, after
/// checking its name and shape.
fn read_layers(
    store: &SafetensorsStore,
    config: &AdapterConfig,
    cfg: &ModelConfig,
    max_rank: usize,
) -> std::result::Result<HostWeights, String> {
    let mut layers: Vec<[Option<HostPair>; MODULES]> = (0..cfg.num_layers).map(|_| Default::default()).collect();
    let mut experts = ExpertTensors::default();
    let mut found = 0;
    for a_name in store.names().iter().filter(|n| n.ends_with(".lora_A.weight")) {
        let (layer, block, module) = match place(a_name, cfg)? {
            Place::Dense { layer, block, module } => (layer, block, module),
            Place::Experts(layer, name) => {
                experts.insert(layer, name, a_name);
                continue;
            }
        };
        if !config.targets(&module) {
            return Err(format!("`{a_name}` adapts {module}, which `target_modules` does not list"));
        }
        let peft_name = format!("model.layers.{layer}.{block}.{module}");
        let rank = config.rank_of(&peft_name)?;
        if rank > max_rank {
            return Err(format!("`{a_name}` has rank {rank}, over --max-lora-rank {max_rank}"));
        }
        let b_name = a_name.replace(".lora_A.weight", ".lora_B.weight");
        let parts = projections(cfg, layer, &block, &module, rank)
            .map_err(|why| format!("`{a_name}` adapts a projection this model lacks: {why}"))?;
        let (inputs, outputs) = (parts[0].shape.0, parts.iter().map(|p| p.shape.1).sum());
        check_shape(store, a_name, [rank, inputs])?;
        check_shape(store, &b_name, [outputs, rank])?;
        let read = |n: &str| store.host(n).and_then(|h| Ok(h.to_f32_vec()?)).map_err(|e| format!("`{n}`: {e}"));
        // The slot holds one scale, the adapter's; a module's own (`alpha_pattern`,
        // `rank_pattern`) is folded into its B where it differs.
        let ratio = config.scale_of(&peft_name)? / config.scale;
        let mut b = read(&b_name)?;
        if ratio != 1.0 {
            b.iter_mut().for_each(|v| *v *= ratio);
        }
        let a = read(a_name)?;
        for part in parts {
            let b: Vec<f32> = part.rows.iter().flat_map(|r| &b[r.start * rank..r.end * rank]).copied().collect();
            layers[layer][part.module.index()] = Some(HostPair { a: a.clone(), b, rank });
        }
        found += 2;
    }
    found += experts.tensors();
    let experts = experts.assemble(store, config, cfg, max_rank)?;
    if let Some(extra) =
        store.names().into_iter().find(|n| !n.ends_with(".lora_A.weight") && !n.ends_with(".lora_B.weight"))
    {
        return Err(format!("`{extra}` is not a LoRA weight met knows"));
    }
    if found != store.names().len() {
        return Err("a `lora_B` weight has no `lora_A` beside it".into());
    }
    Ok(HostWeights { rank: config.rank, layers, experts })
}

/// One projection of met a PEFT module's delta goes to.
struct Projection {
    module: LoraModule,
    /// `(in, out)`.
    shape: (usize, usize),
    /// Its rows among the PEFT module's output rows.
    rows: Vec<Range<usize>>,
}

/// The projections of met that PEFT's module `module` of layer `layer` (in `block`) is:
/// one for most modules, several where met splits the module's rows as it splits the
/// checkpoint's (gated attention's `q_proj`, Qwen3-Next's grouped `in_proj_qkvz` and
/// `in_proj_ba`: [`split_rows`]).
fn projections(
    cfg: &ModelConfig,
    layer: usize,
    block: &str,
    module: &str,
    rank: usize,
) -> std::result::Result<Vec<Projection>, String> {
    let part = |name: &str| -> std::result::Result<(LoraModule, (usize, usize)), String> {
        let m = LoraModule::from_name(name)
            .filter(|m| m.block(cfg, layer) == block)
            .ok_or_else(|| format!("layer {layer} has no {block}.{name}"))?;
        Ok((m, m.shape(cfg, layer)?))
    };
    // The split needs the module's whole row count: its projections' together.
    let rows = match module {
        "in_proj_qkvz" => part("in_proj_qkv")?.1.1 + part("in_proj_z")?.1.1,
        "in_proj_ba" => part("in_proj_b")?.1.1 + part("in_proj_a")?.1.1,
        "q_proj" if cfg.attn_output_gate => 2 * part(module)?.1.1,
        _ => part(module)?.1.1,
    };
    let pieces = split_rows(cfg, &format!("model.layers.{layer}.{block}.{module}.weight"), &[rows, rank]);
    if pieces.is_empty() {
        let (module, shape) = part(module)?;
        return Ok(vec![Projection { module, shape, rows: std::iter::once(0..shape.1).collect() }]);
    }
    pieces
        .into_iter()
        .map(|(name, rows, _)| {
            let last = name.strip_suffix(".weight").and_then(|n| n.rsplit('.').next()).unwrap_or_default();
            let (module, shape) = part(last)?;
            Ok(Projection { module, shape, rows })
        })
        .collect()
}

/// Where a PEFT tensor belongs.
enum Place {
    /// A projection of a layer: PEFT's module `module` in `block` (`self_attn`).
    Dense { layer: usize, block: String, module: String },
    /// The routed experts of a layer.
    Experts(usize, ExpertName),
}

/// The place of a PEFT tensor name such as
/// `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` or
/// `base_model.model.model.layers.3.mlp.experts.7.up_proj.lora_A.weight`.
fn place(name: &str, cfg: &ModelConfig) -> std::result::Result<Place, String> {
    let unknown = || format!("`{name}` is not a LoRA weight of a decoder layer's projection or experts");
    let rest = name.strip_prefix("base_model.model.model.layers.").ok_or_else(unknown)?;
    let rest = rest.strip_suffix(".lora_A.weight").ok_or_else(unknown)?;
    let parts: Vec<&str> = rest.split('.').collect();
    let layer: usize = parts[0].parse().map_err(|_| unknown())?;
    if layer >= cfg.num_layers {
        return Err(format!("`{name}`: the model has {} layers", cfg.num_layers));
    }
    if let Some(experts) = ExpertName::parse(&parts[1..]) {
        return Ok(Place::Experts(layer, experts));
    }
    let [_, block @ .., module] = &parts[..] else { return Err(unknown()) };
    if block.is_empty() {
        return Err(unknown());
    }
    Ok(Place::Dense { layer, block: block.join("."), module: (*module).to_owned() })
}

fn check_shape(store: &SafetensorsStore, name: &str, want: [usize; 2]) -> std::result::Result<(), String> {
    match store.info(name) {
        None => Err(format!("`{name}` is missing")),
        Some(info) if info.shape != want => {
            Err(format!("`{name}` has shape {:?}, this model needs {want:?}", info.shape))
        }
        Some(_) => Ok(()),
    }
}
