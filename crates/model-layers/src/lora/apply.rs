//! Adapters inside a forward pass: the runs of rows a batch assigns to each adapter, the
//! slot of each row they become on the device, and the one call per projection that adds
//! the deltas.
//!
//! A step with adapters carries a [`StepLora`]: the pool the adapters live in and `u32 [t]`
//! row slots, [`NO_LORA_SLOT`] for the base model's rows. An eager step uploads its own
//! row slots; a decode graph owns its tensor and rewrites it before each replay, so one
//! recording serves any mix of adapters. Rows at [`NO_LORA_SLOT`] come out of a
//! projection bit for bit as its base product; a row's delta is computed from that row
//! alone, so its output does not depend on its batch-mates.
//!
//! Where a step carries a pool, the layers take their unfused paths (the gate/up product
//! apart from its activation, so the delta can be added between), for every row; a model
//! serving adapters therefore computes its base rows one way whether or not adapters share
//! the step, eagerly or replayed.

use std::ops::Range;
use std::sync::Arc;

use met_kernels::{
    DType, ExpertAdapter, GpuBackend, HostTensor, LoraSlots, LoraStack, NO_LORA_SLOT, Tensor, lora_row_groups,
};

use super::Adapter;
use super::module::LoraModule;
use super::pool::LoraPool;
use super::pool::SlotExperts;
use crate::{ForwardBatch, ModelError, Result};

/// Consecutive rows of a batch that run through one adapter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterRun {
    /// Rows of the flat batch.
    pub rows: Range<usize>,
    /// The adapter they run through.
    pub adapter: Adapter,
}

/// The adapters of one step on the device.
pub(crate) struct StepLora {
    pool: Arc<LoraPool>,
    /// `u32 [t]`: each row's slot, and `u32 [slots + 1 + t]`: the rows grouped by slot
    /// ([`lora_row_groups`]); `None` when no row has an adapter (nothing to add).
    rows: Option<(Tensor, Tensor)>,
    /// By slot, the deltas on routed experts of its adapter, as the step began; empty
    /// when no slot has any.
    experts: Vec<Option<Arc<SlotExperts>>>,
    /// Whether a graph is recorded from the step: its routed layers then always take the
    /// experts' deltas from the pool's device tables, whatever the slots hold now.
    graph: bool,
}

impl StepLora {
    /// An eager step's adapters: the pool of `attached` (the model's) or else of the
    /// batch's adapters, and the rows' slots uploaded when any row has an adapter. `None`
    /// when there is neither a pool nor an adapter.
    ///
    /// # Errors
    /// An adapter of another pool than the step's; device failures.
    pub fn eager(b: &dyn GpuBackend, batch: &ForwardBatch, attached: Option<&Arc<LoraPool>>) -> Result<Option<Self>> {
        let runs = &batch.adapter_runs;
        let Some(pool) = attached.or_else(|| runs.first().map(|r| r.adapter.pool())) else { return Ok(None) };
        let rows = if runs.is_empty() {
            None
        } else {
            let slots = row_slots(runs, batch.num_tokens(), pool)?;
            Some(upload_rows(b, &slots, pool)?)
        };
        let mut experts = if rows.is_some() { pool.slot_experts() } else { Vec::new() };
        if experts.iter().all(Option::is_none) {
            experts.clear();
        }
        Ok(Some(Self { pool: Arc::clone(pool), rows, experts, graph: false }))
    }

    /// A graph's adapters over `size` rows, every row at [`NO_LORA_SLOT`] until
    /// [`Self::write_rows`] names others.
    ///
    /// # Errors
    /// On device failure.
    pub fn for_graph(b: &dyn GpuBackend, pool: &Arc<LoraPool>, size: usize) -> Result<Self> {
        let rows = upload_rows(b, &vec![NO_LORA_SLOT; size], pool)?;
        // Expert deltas are read from the pool's device tables, where the backend keeps
        // them; elsewhere a graph holds none and such steps run eagerly.
        Ok(Self { pool: Arc::clone(pool), rows: Some(rows), experts: Vec::new(), graph: true })
    }

    /// Writes the slots of `batch`'s rows into a graph's row slots, padding rows at
    /// [`NO_LORA_SLOT`].
    ///
    /// # Errors
    /// An adapter of another pool; device failures.
    pub fn write_rows(&self, b: &dyn GpuBackend, batch: &ForwardBatch) -> Result<()> {
        let Some((rows, groups)) = &self.rows else { return Ok(()) };
        let slots = row_slots(&batch.adapter_runs, rows.elem_count(), &self.pool)?;
        b.write_u32(rows, &slots)?;
        Ok(b.write_u32(groups, &lora_row_groups(&slots, self.pool.slots()))?)
    }
}

/// Row slots and their groups, uploaded.
fn upload_rows(b: &dyn GpuBackend, slots: &[u32], pool: &LoraPool) -> Result<(Tensor, Tensor)> {
    let groups = lora_row_groups(slots, pool.slots());
    Ok((
        b.upload(&HostTensor::from_u32(slots, &[slots.len()]), DType::U32)?,
        b.upload(&HostTensor::from_u32(&groups, &[groups.len()]), DType::U32)?,
    ))
}

/// The slot of each of `t` rows: its run's adapter's, else [`NO_LORA_SLOT`].
fn row_slots(runs: &[AdapterRun], t: usize, pool: &Arc<LoraPool>) -> Result<Vec<u32>> {
    let mut slots = vec![NO_LORA_SLOT; t];
    for run in runs {
        if !Arc::ptr_eq(run.adapter.pool(), pool) {
            return Err(ModelError::Batch(format!(
                "adapter `{}` lives in the slots of another model",
                run.adapter.name()
            )));
        }
        let Some(rows) = slots.get_mut(run.rows.clone()) else {
            return Err(ModelError::Batch(format!("adapter rows {:?} past a batch of {t}", run.rows)));
        };
        rows.fill(run.adapter.slot());
    }
    Ok(slots)
}

/// A step's adapters on one layer's routed experts ([`LayerLora::experts`]).
pub struct StepExperts<'a> {
    /// `u32 [t]`: each token's slot.
    pub rows: &'a Tensor,
    /// By slot, its adapter's deltas on the layer.
    pub slots: Vec<Option<ExpertAdapter<'a>>>,
    /// The pool's device tables of them, where the backend keeps them.
    pub tables: Option<met_kernels::ExpertTables<'a>>,
}

impl StepExperts<'_> {
    /// These adapters as the backend op takes them.
    pub fn op(&self) -> met_kernels::MoeLora<'_> {
        met_kernels::MoeLora { rows: self.rows, slots: &self.slots, tables: self.tables }
    }
}

/// The adapters of one step as a layer sees them.
#[derive(Clone, Copy)]
pub struct LayerLora<'a> {
    step: Option<&'a StepLora>,
    layer: usize,
}

impl<'a> LayerLora<'a> {
    /// Layer `layer` of a step with `step`'s adapters.
    pub(crate) fn new(step: Option<&'a StepLora>, layer: usize) -> Self {
        Self { step, layer }
    }

    /// No adapter on any row.
    pub fn none() -> Self {
        Self { step: None, layer: 0 }
    }

    /// Whether the step's slots hold any of `modules` in this layer, so the projection
    /// must leave room to add deltas.
    pub fn adapts(&self, modules: &[LoraModule]) -> bool {
        self.step.is_some_and(|s| modules.iter().any(|&m| s.pool.stack(self.layer, m).is_some()))
    }

    /// The step's adapters on this layer's routed experts, where any slot has some (or a
    /// graph is recorded and the pool keeps device tables of them): each token's slot
    /// (`u32 [t]`), each slot's deltas, and the pool's tables where it keeps them.
    pub fn experts(&self) -> Option<StepExperts<'a>> {
        let step = self.step?;
        let (rows, _) = step.rows.as_ref()?;
        let slots: Vec<Option<ExpertAdapter<'a>>> = step
            .experts
            .iter()
            .map(|s| s.as_ref().and_then(|layers| layers.get(self.layer)?.as_ref()).map(|l| l.adapter()))
            .collect();
        let tables = step.pool.expert_tables(self.layer);
        let needed = slots.iter().any(Option::is_some) || (step.graph && tables.is_some());
        needed.then_some(StepExperts { rows, slots, tables })
    }

    /// The product `base` issues (`out [t, N]`, a projection of `x [t, in]` fused from
    /// `parts`: each module and its first output column), plus each adapted row's deltas
    /// of those modules. The shrink of `x` is issued before `base`, so a backend may run it
    /// beside the base product ([`GpuBackend::lora_shrink`]).
    ///
    /// # Errors
    /// On device failure, and `base`'s.
    pub fn project(
        &self,
        b: &dyn GpuBackend,
        x: &Tensor,
        parts: &[(LoraModule, usize)],
        base: impl FnOnce() -> Result<Tensor>,
    ) -> Result<Tensor> {
        let Some(step) = self.step else { return base() };
        let Some((rows, groups)) = &step.rows else { return base() };
        let stacks: Vec<LoraStack<'_>> = parts
            .iter()
            .filter_map(|&(module, column)| {
                let s = step.pool.stack(self.layer, module)?;
                Some(LoraStack { a: &s.a, b: &s.b, column })
            })
            .collect();
        if stacks.is_empty() {
            return base();
        }
        let lora = LoraSlots { rows, scales: step.pool.scales(), stacks: &stacks, groups: Some(groups) };
        let shrunk = b.lora_shrink(x, &lora)?;
        let out = base()?;
        Ok(b.lora_expand(&shrunk, out, &lora)?)
    }
}

impl std::fmt::Debug for LayerLora<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LayerLora").field("layer", &self.layer).field("adapters", &self.step.is_some()).finish()
    }
}

#[cfg(test)]
mod tests {
    use met_kernels::CpuBackend;

    use super::*;
    use crate::lora::{LoraAdapter, LoraLimits};

    fn pool() -> (met_config::ModelConfig, Arc<LoraPool>) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
        let cfg = crate::models::read_config(&dir.join("config.json")).unwrap();
        let pool = LoraPool::new(&cfg, Arc::new(CpuBackend::new()), LoraLimits { max_rank: 8 }, 3).unwrap();
        (cfg, pool)
    }

    /// Each run's rows get its adapter's slot, every other row (padding included) none; an
    /// adapter of another pool is refused.
    #[test]
    fn runs_become_row_slots() {
        let (cfg, pool) = pool();
        let a = Arc::new(LoraAdapter::random("a", &cfg, &pool, 8, 1).unwrap());
        let b = Arc::new(LoraAdapter::random("b", &cfg, &pool, 4, 2).unwrap());
        let runs = [
            AdapterRun { rows: 1..3, adapter: Arc::clone(&a) },
            AdapterRun { rows: 3..4, adapter: Arc::clone(&b) },
            AdapterRun { rows: 5..6, adapter: Arc::clone(&a) },
        ];
        let (sa, sb) = (a.slot(), b.slot());
        let n = NO_LORA_SLOT;
        assert_eq!(row_slots(&runs, 8, &pool).unwrap(), [n, sa, sa, sb, n, sa, n, n]);
        assert!(row_slots(&runs, 5, &pool).is_err(), "a run past the rows");
        let (_, other) = self::pool();
        assert!(row_slots(&runs, 8, &other).unwrap_err().to_string().contains("another model"));
    }
}
