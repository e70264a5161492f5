//! The device slots adapters live in while they are loaded: `--max-loras` of them, each
//! holding one adapter's weights for every projection the model lets adapters touch.
//!
//! Per layer and module, the slots' shrinks are one stack `A [slots, r_max, in]` and their
//! expansions one stack `B [slots, out, r_max]`, with `r_max` = `--max-lora-rank`; an
//! adapter of lower rank is zero past its rank, and a module it does not adapt is zero in
//! its slot, so both add exact zeros. One f32 scale per slot sits beside them. The stacks
//! are allocated once, so their addresses never change and a decode step recorded in a
//! graph reads whichever adapters occupy the slots when it is replayed; a step says which
//! by the slot of each row ([`met_kernels::LoraSlots::rows`]).
//!
//! Adapters on routed experts are too large to keep a stack for in every slot (each
//! expert its own `A` and `B`): an adapter that has them uploads its own ([`LayerExperts`])
//! into its slot's entry of the pool's expert table when it loads, dropped with the slot.
//! Where the backend keeps device tables of them ([`GpuBackend::expert_lora_table`]), the
//! pool holds one per routed layer and stack, written with the slot, so decode graphs
//! follow them as they follow the stacks; elsewhere steps read the host table, eagerly.
//!
//! **Invariant:** a slot is written only while free, and is free only when no [`SlotLease`]
//! holds it. A loaded adapter owns its lease, and every request running through the
//! adapter holds the adapter (an `Arc`), so an unloaded adapter's slot is taken again only
//! after its last request finishes; the write is queued behind every step already issued
//! on the device, so no step in flight sees it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use met_config::ModelConfig;
use met_kernels::{DType, GpuBackend, HostTensor, Tensor};

use super::experts::{HostExperts, LayerExperts};
use super::module::{LoraModule, MODULES};
use crate::Result;

/// One module's stacks in one layer.
#[derive(Debug)]
pub(crate) struct Stack {
    /// `[slots, r_max, in]`.
    pub a: Tensor,
    /// `[slots, out, r_max]`.
    pub b: Tensor,
}

/// One module's weights on the host: `A [rank, in]` and `B [out, rank]`, row-major.
pub(crate) struct HostPair {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub rank: usize,
}

/// An adapter's weights on the host, by layer and module ([`LoraModule::ALL`] order), and
/// by layer on its routed experts.
pub(crate) struct HostWeights {
    /// `r`, as the adapter reports it.
    pub rank: usize,
    pub layers: Vec<[Option<HostPair>; MODULES]>,
    pub experts: Vec<Option<HostExperts>>,
}

/// One slot's adapter on the routed experts, by layer.
pub(crate) type SlotExperts = Vec<Option<LayerExperts>>;

/// Limits an adapter is checked against when it loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraLimits {
    /// The highest rank accepted (`--max-lora-rank`).
    pub max_rank: usize,
}

/// The slots of one model's adapters on its device.
pub struct LoraPool {
    backend: Arc<dyn GpuBackend>,
    max_rank: usize,
    /// Per layer, per module: `None` where the layer has no such projection (experts).
    layers: Vec<[Option<Stack>; MODULES]>,
    /// `f32 [slots]`.
    scales: Tensor,
    /// Slots no adapter holds.
    free: Mutex<Vec<u32>>,
    slots: usize,
    /// By slot, its adapter's deltas on routed experts, where it has any.
    experts: Mutex<Vec<Option<Arc<SlotExperts>>>>,
    /// Per layer, `(experts, hidden, intermediate)` where it routes experts.
    expert_dims: Vec<Option<(usize, usize, usize)>>,
    /// Per routed layer, the backend's device tables of the slots' deltas on its gate/up
    /// and down stacks, where it keeps them.
    expert_tables: Vec<Option<[Tensor; 2]>>,
}

impl std::fmt::Debug for LoraPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraPool").field("slots", &self.slots).field("max_rank", &self.max_rank).finish()
    }
}

impl LoraPool {
    /// `max_loras` empty slots of rank `limits.max_rank` for a model of `cfg` on `backend`.
    ///
    /// # Errors
    /// [`crate::ModelError::Unsupported`] for zero slots; device failures allocating the
    /// stacks.
    pub fn new(
        cfg: &ModelConfig,
        backend: Arc<dyn GpuBackend>,
        limits: LoraLimits,
        max_loras: usize,
    ) -> Result<Arc<Self>> {
        if max_loras == 0 || limits.max_rank == 0 {
            return Err(crate::ModelError::Unsupported("LoRA slots need --max-loras and a rank of at least 1".into()));
        }
        let (dtype, r) = (backend.float_dtype(), limits.max_rank);
        let layers = (0..cfg.num_layers)
            .map(|layer| {
                let stack = |m: LoraModule| -> Result<Option<Stack>> {
                    let Ok((inputs, outputs)) = m.shape(cfg, layer) else { return Ok(None) };
                    let a = backend.zeros(&[max_loras, r, inputs], dtype)?;
                    Ok(Some(Stack { a, b: backend.zeros(&[max_loras, outputs, r], dtype)? }))
                };
                let mut stacks: [Option<Stack>; MODULES] = Default::default();
                for (slot, m) in stacks.iter_mut().zip(LoraModule::ALL) {
                    *slot = stack(m)?;
                }
                Ok(stacks)
            })
            .collect::<Result<Vec<_>>>()?;
        let scales = backend.zeros(&[max_loras], DType::F32)?;
        let free = Mutex::new((0..max_loras as u32).rev().collect());
        let experts = Mutex::new(vec![None; max_loras]);
        let expert_dims: Vec<Option<(usize, usize, usize)>> = (0..cfg.num_layers)
            .map(|layer| {
                let moe = cfg.moe.as_ref()?;
                moe.sparse_layers.get(layer).copied().unwrap_or(false).then_some((
                    moe.num_experts,
                    cfg.hidden_size,
                    moe.expert_intermediate_size,
                ))
            })
            .collect();
        let expert_tables = expert_dims
            .iter()
            .map(|dims| {
                if dims.is_none() || !backend.supports_expert_lora() {
                    return Ok(None);
                }
                match (backend.expert_lora_table(max_loras)?, backend.expert_lora_table(max_loras)?) {
                    (Some(gate_up), Some(down)) => Ok(Some([gate_up, down])),
                    _ => Ok(None),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(Self {
            backend,
            max_rank: r,
            layers,
            scales,
            free,
            slots: max_loras,
            experts,
            expert_dims,
            expert_tables,
        }))
    }

    /// How many adapters the slots hold at most.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// The highest rank a slot holds.
    pub fn max_rank(&self) -> usize {
        self.max_rank
    }

    /// Slots no adapter holds now.
    pub fn free_slots(&self) -> usize {
        self.free().len()
    }

    /// Checks that a model of `world_size` ranks on `backend`, its graphs `captured` or
    /// not yet, can serve adapters from these slots.
    ///
    /// # Errors
    /// [`crate::ModelError::Unsupported`] naming why not: a backend without the LoRA ops,
    /// tensor parallelism, or graphs already recorded without the slots.
    pub(crate) fn check_attach(&self, backend: &dyn GpuBackend, world_size: usize, captured: bool) -> Result<()> {
        let why = if !backend.supports_lora() {
            format!("the {} backend has no LoRA ops", backend.name())
        } else if world_size > 1 {
            "LoRA adapters are not split over tensor-parallel ranks".to_owned()
        } else if captured {
            "LoRA slots must be attached before graphs are captured".to_owned()
        } else {
            return Ok(());
        };
        Err(crate::ModelError::Unsupported(why))
    }

    /// Whether adapters on routed experts can load: the backend runs their op.
    pub(crate) fn takes_expert_adapters(&self) -> bool {
        self.backend.supports_expert_lora()
    }

    /// Layer `layer`'s device tables of the slots' expert deltas, with the highest rank
    /// each holds (gate/up fuses two projections, so twice the pool's), where the backend
    /// keeps them.
    pub(crate) fn expert_tables(&self, layer: usize) -> Option<met_kernels::ExpertTables<'_>> {
        let [gate_up, down] = self.expert_tables.get(layer)?.as_ref()?;
        Some(met_kernels::ExpertTables { gate_up, down, max_ranks: (2 * self.max_rank, self.max_rank) })
    }

    /// Whether decode graphs follow the adapters on routed experts: the backend keeps
    /// device tables of them (or the model routes none).
    pub(crate) fn graphs_follow_experts(&self) -> bool {
        self.expert_dims.iter().zip(&self.expert_tables).all(|(dims, tables)| dims.is_none() || tables.is_some())
    }

    /// By slot, the deltas on routed experts of the adapter there.
    pub(crate) fn slot_experts(&self) -> Vec<Option<Arc<SlotExperts>>> {
        self.experts.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The free list; a panic elsewhere while it was held leaves it whole (a push or a pop).
    fn free(&self) -> MutexGuard<'_, Vec<u32>> {
        self.free.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stacks of `module` in `layer`, where the layer has that projection.
    pub(crate) fn stack(&self, layer: usize, module: LoraModule) -> Option<&Stack> {
        self.layers.get(layer)?[module.index()].as_ref()
    }

    /// `f32 [slots]`: each slot's scale.
    pub(crate) fn scales(&self) -> &Tensor {
        &self.scales
    }

    /// Takes a free slot, if any.
    pub(crate) fn take(self: &Arc<Self>) -> Option<SlotLease> {
        let slot = self.free().pop()?;
        Some(SlotLease { pool: Arc::clone(self), slot })
    }

    /// Writes `weights` and `scale` into `lease`'s slot: every module of every layer, zero
    /// past the adapter's rank and where it adapts nothing.
    ///
    /// # Errors
    /// On device failure.
    pub(crate) fn write(&self, lease: &SlotLease, weights: &HostWeights, scale: f32) -> Result<()> {
        let (b, r_max, slot) = (&*self.backend, self.max_rank, lease.slot as usize);
        for (layer, modules) in self.layers.iter().enumerate() {
            for (m, stack) in modules.iter().enumerate() {
                let Some(stack) = stack else { continue };
                let (inputs, outputs) = (stack.a.dims()[2], stack.b.dims()[1]);
                let (mut a, mut bb) = (vec![0f32; r_max * inputs], vec![0f32; outputs * r_max]);
                if let Some(pair) = weights.layers.get(layer).and_then(|l| l[m].as_ref()) {
                    let r = pair.rank;
                    a[..r * inputs].copy_from_slice(&pair.a);
                    for (row, src) in bb.chunks_exact_mut(r_max).zip(pair.b.chunks_exact(r)) {
                        row[..r].copy_from_slice(src);
                    }
                }
                let upload = |v: &[f32], dims: &[usize]| b.upload(&HostTensor::from_f32(v, dims), b.float_dtype());
                b.lora_write_slot(&stack.a, slot, &upload(&a, &[r_max, inputs])?)?;
                b.lora_write_slot(&stack.b, slot, &upload(&bb, &[outputs, r_max])?)?;
            }
        }
        let scale = b.upload(&HostTensor::from_f32(&[scale], &[1]), DType::F32)?;
        b.lora_write_slot(&self.scales, slot, &scale)?;
        let experts = if weights.experts.iter().any(Option::is_some) {
            let layers = weights
                .experts
                .iter()
                .zip(&self.expert_dims)
                .map(|(host, dims)| match (host, dims) {
                    (Some(host), Some(dims)) => LayerExperts::upload(b, host, *dims).map(Some),
                    _ => Ok(None),
                })
                .collect::<Result<Vec<_>>>()?;
            Some(Arc::new(layers))
        } else {
            None
        };
        // Every routed layer's table entries of the slot, emptied where the new adapter
        // has no deltas: the slot's last adapter's weights are gone.
        for (layer, tables) in self.expert_tables.iter().enumerate() {
            let Some([gate_up, down]) = tables else { continue };
            let adapter = experts.as_ref().and_then(|e| e.get(layer)?.as_ref()).map(LayerExperts::adapter);
            b.write_expert_lora_table(gate_up, slot, adapter.and_then(|a| a.gate_up).as_ref())?;
            b.write_expert_lora_table(down, slot, adapter.and_then(|a| a.down).as_ref())?;
        }
        self.experts.lock().unwrap_or_else(PoisonError::into_inner)[slot] = experts;
        Ok(())
    }
}

/// One slot held by one loaded adapter; dropping it frees the slot.
pub(crate) struct SlotLease {
    pool: Arc<LoraPool>,
    slot: u32,
}

impl SlotLease {
    /// The slot's index, as row slots name it.
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// The pool the slot belongs to.
    pub fn pool(&self) -> &Arc<LoraPool> {
        &self.pool
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.pool.experts.lock().unwrap_or_else(PoisonError::into_inner)[self.slot as usize] = None;
        self.pool.free().push(self.slot);
    }
}

#[cfg(test)]
mod tests {
    use met_kernels::CpuBackend;

    use super::*;
    use crate::lora::LoraAdapter;

    fn llama() -> ModelConfig {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/llama");
        crate::models::read_config(&dir.join("config.json")).unwrap()
    }

    /// A slot is held while its adapter lives (in any handle) and taken again after; with
    /// every slot held, a load is refused naming the limit.
    #[test]
    fn a_slot_is_free_again_only_when_its_adapter_is_gone() {
        let cfg = llama();
        let pool = LoraPool::new(&cfg, Arc::new(CpuBackend::new()), LoraLimits { max_rank: 8 }, 2).unwrap();
        let first = Arc::new(LoraAdapter::random("a", &cfg, &pool, 8, 1).unwrap());
        let second = LoraAdapter::random("b", &cfg, &pool, 4, 2).unwrap();
        assert_ne!(first.slot(), second.slot());
        assert_eq!(pool.free_slots(), 0);
        let err = LoraAdapter::random("c", &cfg, &pool, 8, 3).unwrap_err().to_string();
        assert!(err.contains("all 2 LoRA slots"), "{err}");
        let running = Arc::clone(&first);
        drop(first);
        assert_eq!(pool.free_slots(), 0, "a running request still holds the adapter");
        let slot = running.slot();
        drop(running);
        assert_eq!(pool.free_slots(), 1);
        assert_eq!(LoraAdapter::random("c", &cfg, &pool, 8, 3).unwrap().slot(), slot);
        assert!(LoraAdapter::random("d", &cfg, &pool, 16, 4).unwrap_err().to_string().contains("rank 16"));
    }

    /// A random adapter (`--lora-dummy`) adapts a mixture's routed experts where the
    /// backend applies adapters to them, and its slot's expert entry lives and dies with it.
    #[test]
    fn random_adapters_adapt_routed_experts() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/qwen3_moe");
        let cfg = crate::models::read_config(&dir.join("config.json")).unwrap();
        let pool = LoraPool::new(&cfg, Arc::new(CpuBackend::new()), LoraLimits { max_rank: 8 }, 2).unwrap();
        let adapter = LoraAdapter::random("r", &cfg, &pool, 4, 7).unwrap();
        assert!(adapter.adapts_experts());
        let slot = adapter.slot() as usize;
        let layers = pool.slot_experts()[slot].clone().expect("the slot holds expert deltas");
        let routed = cfg.moe.as_ref().unwrap().sparse_layers.iter().filter(|&&s| s).count();
        assert_eq!(layers.iter().filter(|l| l.is_some()).count(), routed, "every routed layer, no other");
        drop(adapter);
        assert!(pool.slot_experts()[slot].is_none(), "a freed slot forgets its expert deltas");
    }

    /// A slot holds its adapter's weights zero-padded to the pool's rank, and zeros where
    /// the adapter adapts nothing; the scale sits at the slot.
    #[test]
    fn a_slot_holds_the_padded_weights_and_the_scale() {
        let cfg = llama();
        let b: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
        let pool = LoraPool::new(&cfg, Arc::clone(&b), LoraLimits { max_rank: 4 }, 2).unwrap();
        let (inputs, outputs) = LoraModule::O.shape(&cfg, 0).unwrap();
        let mut layers: Vec<[Option<HostPair>; MODULES]> = (0..cfg.num_layers).map(|_| Default::default()).collect();
        let (a, bb) = (vec![1.5; 2 * inputs], vec![2.5; outputs * 2]);
        layers[0][LoraModule::O.index()] = Some(HostPair { a, b: bb, rank: 2 });
        let lease = pool.take().unwrap();
        pool.write(&lease, &HostWeights { rank: 2, layers, experts: Vec::new() }, 0.75).unwrap();
        let slot = lease.slot() as usize;
        let o = pool.stack(0, LoraModule::O).unwrap();
        let (sa, sb) = (b.download_f32(&o.a).unwrap(), b.download_f32(&o.b).unwrap());
        let a_slot = &sa[slot * 4 * inputs..(slot + 1) * 4 * inputs];
        assert!(a_slot[..2 * inputs].iter().all(|&v| v == 1.5) && a_slot[2 * inputs..].iter().all(|&v| v == 0.0));
        let b_row = &sb[slot * outputs * 4..slot * outputs * 4 + 4];
        assert_eq!(b_row, [2.5, 2.5, 0.0, 0.0]);
        let q = pool.stack(0, LoraModule::Q).unwrap();
        assert!(b.download_f32(&q.a).unwrap().iter().all(|&v| v == 0.0), "an unadapted module is zero");
        assert_eq!(b.download_f32(pool.scales()).unwrap()[slot], 0.75);
    }
}
