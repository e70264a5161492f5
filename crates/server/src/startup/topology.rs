//! Startup phases 3 and 4: the devices a model runs on and how they are joined. One device,
//! or under `--tensor-parallel-size N` one per rank (GPUs 0..N over NCCL, or N CPU ranks
//! meeting in process), which the KV cache and its sizing must both cover.
//!
//! Invariant: rank 0's backend is the one the engine samples with, and it holds the logits
//! a split model returns.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use met_cache::{KvLayout, PagedKvCache, StateSizing};
use met_config::{EngineConfig, LoadConfig, ModelConfig};
use met_kernels::{Collective, Devices, GpuBackend, open_backend};
use met_model_layers::parallel::check_world;
use met_telemetry::{Phase, PhaseTimer};

use crate::startup::kv_budget::CacheSize;

/// The devices of a loaded model, rank by rank (one without tensor parallelism).
#[derive(Clone)]
pub struct Topology {
    backends: Vec<Arc<dyn GpuBackend>>,
}

impl Topology {
    /// One device.
    pub fn single(backend: Arc<dyn GpuBackend>) -> Self {
        Self { backends: vec![backend] }
    }

    /// The devices of ranks `0..backends.len()`, in rank order.
    ///
    /// # Panics
    /// If `backends` is empty.
    pub fn ranks(backends: Vec<Arc<dyn GpuBackend>>) -> Self {
        assert!(!backends.is_empty(), "a topology has at least one device");
        Self { backends }
    }

    /// Rank 0's device: it samples, and holds the logits.
    pub fn lead(&self) -> &Arc<dyn GpuBackend> {
        &self.backends[0]
    }

    /// Every rank's device, in rank order.
    pub fn backends(&self) -> &[Arc<dyn GpuBackend>] {
        &self.backends
    }

    /// Ranks (1 without tensor parallelism).
    pub fn world_size(&self) -> usize {
        self.backends.len()
    }

    /// The devices, for logs and bench headers.
    pub fn describe(&self) -> String {
        match self.world_size() {
            1 => self.lead().describe(),
            n => format!("{} x {n} ranks", self.lead().describe()),
        }
    }

    /// A KV cache of `size`: `layout` (one rank's heads) on every rank's device, one block
    /// manager, and for a hybrid model the recurrent-state slots `config` needs, with
    /// `rollback` more per sequence for speculative steps and the snapshots `size` holds
    /// when `prefix` caching is on ([`state_sizing`]).
    ///
    /// # Errors
    /// When a device cannot hold its pools.
    pub fn kv_cache(
        &self,
        layout: KvLayout,
        config: &EngineConfig,
        size: CacheSize,
        prefix: bool,
        rollback: usize,
    ) -> Result<PagedKvCache> {
        let ranks: Vec<&dyn GpuBackend> = self.backends.iter().map(|b| &**b).collect();
        let snapshots = if prefix { size.snapshots } else { 0 };
        let states = state_sizing(&layout, config, snapshots, rollback);
        Ok(PagedKvCache::with_states(&ranks, layout, config.block_size, size.blocks, prefix, states)?)
    }

    /// The smallest free memory of any rank's device: each holds a share of every block,
    /// so the tightest bounds them all. `None` on devices without memory of their own.
    pub fn free_memory(&self) -> Option<usize> {
        self.backends.iter().map(|b| b.memory_info().map(|m| m.free)).collect::<Option<Vec<_>>>()?.into_iter().min()
    }

    /// Waits for every rank's device.
    ///
    /// # Errors
    /// When an earlier operation failed on a device.
    pub fn synchronize(&self) -> Result<()> {
        self.backends.iter().try_for_each(|b| b.synchronize()).map_err(Into::into)
    }
}

/// Phases 3 and 4 for `args` and the model `config`: opens the device (or one per rank) and
/// joins the ranks, returning their collectives (none for one device).
///
/// # Errors
/// `--tensor-parallel-size` that does not divide the model or cannot run on the devices
/// (too few GPUs, no NCCL, CUDA not compiled in), named with the flag; a device that fails
/// to open.
pub fn open(args: &LoadConfig, config: &ModelConfig) -> Result<(Topology, Vec<Arc<dyn Collective>>)> {
    let n = args.tensor_parallel_size;
    let flag = || format!("--tensor-parallel-size {n}");
    check_world(config, n).with_context(flag)?;
    let timer = PhaseTimer::start(Phase::Device);
    if n == 1 {
        let backend = open_backend(args.device, args.quant_dots, args.batch_invariant)?;
        timer.done(backend.describe());
        PhaseTimer::start(Phase::Topology).done("world size 1");
        return Ok((Topology::single(backend), Vec::new()));
    }
    let devices = Devices::open(args.device, args.quant_dots, n).with_context(flag)?;
    if args.batch_invariant && !devices.backends().iter().all(|b| b.batch_invariant()) {
        bail!(
            "--batch-invariant with {}: NCCL's all-reduce picks how it sums by the size of the \
             step, so a batch-invariant run takes one GPU",
            flag()
        );
    }
    let topology = Topology::ranks(devices.backends().to_vec());
    timer.done(topology.describe());
    let timer = PhaseTimer::start(Phase::Topology);
    let collectives = devices.connect().with_context(flag)?;
    timer.done(format_args!("world size {n}, ranks joined by {}", devices.transport()));
    Ok((topology, collectives))
}

/// The recurrent-state slots of a hybrid model's cache: one per sequence a step can hold
/// with `rollback` more each (the speculative tokens a step may verify), and `snapshots`
/// for the prefix cache, one every [`EngineConfig::state_snapshot_interval`] blocks (the
/// number phase 6 sized, [`crate::startup::kv_budget::CacheSize`]); `None` for a model
/// without recurrent state.
pub fn state_sizing(
    layout: &KvLayout,
    config: &EngineConfig,
    snapshots: usize,
    rollback: usize,
) -> Option<StateSizing> {
    layout.state?;
    let interval = config.state_snapshot_interval;
    let snapshots = if interval > 0 { snapshots } else { 0 };
    Some(StateSizing { sequences: config.max_num_seqs, snapshots, interval, rollback })
}

/// Bytes on one device of the state slots [`state_sizing`] asks for (0 without recurrent
/// state).
pub fn state_bytes(layout: &KvLayout, config: &EngineConfig, snapshots: usize, rollback: usize) -> usize {
    match (layout.state, state_sizing(layout, config, snapshots, rollback)) {
        (Some(s), Some(sizing)) => sizing.slots() * s.bytes_per_slot(),
        _ => 0,
    }
}
