//! Sizing the KV cache from device memory (startup phase 6): run one forward pass at the
//! largest batch the engine can schedule, then give the KV pools a share of the memory
//! still free.
//!
//! The warm-up step has `min(max_num_seqs, max_batch_tokens)` sequences sharing
//! `max_batch_tokens` prompt tokens, each wanting logits, and samples every row with
//! truncation and logprobs, so the activations, the logits and the sampler's scratch of the
//! largest step have all been allocated once. Their memory stays in the device's pool
//! (counted as in use by [`GpuBackend::memory_info`]) and is reused by every later step, so
//! what is free afterwards can go to the cache:
//!
//! `blocks = (free_after_warmup × utilization − reserve) / bytes_per_block`.
//!
//! A hybrid model's recurrent state comes out of the same memory first: a slot per
//! sequence, then the prefix cache's snapshots within a share of the rest
//! ([`split_budget`]).
//!
//! The warm-up's own small KV cache also stays in the pool as reusable activation memory,
//! which makes the estimate conservative by that much. Devices without memory of their own
//! (the CPU) report no memory and get no budget: their caller keeps its own default.
//!
//! Under tensor parallelism every rank's device holds its share of every block
//! (`bytes_per_block` is one rank's), so the rank with the least free memory sets the
//! count; on the CPU the ranks share the host, whose default budget covers them all.

use anyhow::{Context, Result};
use met_cache::KvCache;
use met_config::{EngineConfig, EngineSetup, SamplingParams};
use met_kernels::SampleRow;
use met_model_layers::{ForwardBatch, LogitRows, Model};

use crate::startup::topology::{Topology, state_bytes};

/// The KV cache on a device that reports no memory of its own (the CPU), all ranks'
/// shares together, when no `--kv-blocks` says otherwise.
pub const CPU_KV_BYTES: usize = 1 << 30;

/// The most of the memory left after the sequences' state slots that prefix-cache
/// snapshots of a hybrid model's recurrent state may take; the KV blocks keep the rest. A
/// policy, not a measurement. Without a bound, snapshots could crowd out the cache they
/// index: a Qwen3.6-35B-A3B snapshot is 60 MiB, against 5 MiB of K/V in the 16 blocks it
/// covers at the default interval.
pub const SNAPSHOT_SHARE: f64 = 0.25;

/// What startup phase 6 allocates: KV blocks and, for a hybrid model with prefix caching,
/// the snapshots of its recurrent state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheSize {
    /// KV blocks (at least one).
    pub blocks: usize,
    /// Snapshot slots of the recurrent state (0 for other models).
    pub snapshots: usize,
}

/// The KV cache of startup phase 6, one rule for `met serve`, `met generate` and the
/// benches: `--kv-blocks` when given; else the `demand` blocks the expected work can use
/// (every sequence at full context for a server, exactly the requests for a batch job), at
/// most what `--gpu-memory-utilization` of the memory free after a warm-up step holds
/// ([`CPU_KV_BYTES`] on the CPU). A hybrid model's state slots come out of that memory
/// first ([`split_budget`]). Never less than one block.
///
/// # Errors
/// When the warm-up forward fails, or the state slots of `--max-num-seqs` sequences do not
/// fit the memory.
pub fn cache_size(setup: &EngineSetup, model: &dyn Model, devices: &Topology, demand: usize) -> Result<CacheSize> {
    let config = &setup.engine;
    let layout = model.kv_layout();
    let interval = config.state_snapshot_interval;
    let per_snapshot = match layout.state {
        Some(s) if config.prefix_caching && interval > 0 => s.bytes_per_slot(),
        _ => 0,
    };
    if let Some(blocks) = setup.kv_blocks {
        // The user sized the cache: snapshots to cover all of it.
        let snapshots = if per_snapshot > 0 { blocks.div_ceil(interval) } else { 0 };
        return Ok(CacheSize { blocks, snapshots });
    }
    let rollback = setup.speculative.as_ref().map_or(0, |s| s.num_tokens);
    let budget = Budget {
        bytes: match usable_after_warmup(model, devices, config, setup.gpu_memory_utilization)? {
            Some(bytes) => bytes,
            None => CPU_KV_BYTES,
        },
        sequences: state_bytes(&layout, config, 0, rollback),
        per_snapshot,
        // On the CPU the one budget covers every rank's share of a block.
        per_block: layout.bytes_per_block(config.block_size)
            * if devices.free_memory().is_some() { 1 } else { devices.world_size() },
    };
    split_budget(&budget, demand, interval).with_context(|| {
        format!("sizing the KV cache and the recurrent state of --max-num-seqs {}", config.max_num_seqs)
    })
}

/// The memory of phase 6 and what each thing in it costs, in bytes.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Everything the cache may take.
    pub bytes: usize,
    /// The state slots of the running sequences (0 for a model without recurrent state).
    pub sequences: usize,
    /// One snapshot of a sequence's recurrent state (0: no snapshots).
    pub per_snapshot: usize,
    /// One KV block.
    pub per_block: usize,
}

/// Splits `budget`: the sequences' state slots first; then snapshots, at most
/// [`SNAPSHOT_SHARE`] of what is left and no more than one per `interval` blocks of
/// `demand`; then KV blocks, at most `demand` and at least one.
///
/// # Errors
/// When the sequences' state slots alone do not fit.
pub fn split_budget(budget: &Budget, demand: usize, interval: usize) -> Result<CacheSize> {
    let gib = |b: usize| b as f64 / f64::from(1 << 30);
    if budget.sequences > 0 && budget.sequences >= budget.bytes {
        anyhow::bail!(
            "the recurrent state of the running sequences needs {:.1} GiB, more than the {:.1} GiB the cache may \
             take: lower --max-num-seqs",
            gib(budget.sequences),
            gib(budget.bytes)
        );
    }
    let left = budget.bytes - budget.sequences;
    let snapshots = match budget.per_snapshot {
        0 => 0,
        per => ((left as f64 * SNAPSHOT_SHARE) as usize / per).min(demand.div_ceil(interval.max(1))),
    };
    let blocks = (left - snapshots * budget.per_snapshot) / budget.per_block.max(1);
    Ok(CacheSize { blocks: blocks.min(demand).max(1), snapshots })
}

/// Bytes kept free beyond the utilisation share, for what the warm-up cannot foresee
/// (allocator fragmentation across other batch shapes, library workspaces).
pub const DEFAULT_RESERVE: usize = 256 << 20;

/// How many KV blocks of `bytes_per_block` fit in `free` bytes at `utilization`, less
/// `reserve`.
pub fn blocks_for(free: usize, utilization: f64, reserve: usize, bytes_per_block: usize) -> usize {
    usable(free, utilization, reserve) / bytes_per_block.max(1)
}

/// `free` bytes at `utilization`, less `reserve`.
fn usable(free: usize, utilization: f64, reserve: usize) -> usize {
    let usable = (free as f64 * utilization.clamp(0.0, 1.0)) as usize;
    usable.saturating_sub(reserve)
}

/// The bytes the cache may take on each device after a warm-up forward at the largest
/// batch of `config`: the smallest free memory of any rank scaled by `utilization`
/// (`--gpu-memory-utilization`), less [`DEFAULT_RESERVE`]; `None` on devices that report
/// no memory of their own. The warm-up's own state slots count as free: they went back to
/// the device's pool, where the cache's slots will find them.
///
/// # Errors
/// When the warm-up forward or sampling fails (out of memory at the largest batch, say).
pub fn usable_after_warmup(
    model: &dyn Model,
    devices: &Topology,
    config: &EngineConfig,
    utilization: f64,
) -> Result<Option<usize>> {
    if devices.free_memory().is_none() {
        return Ok(None);
    }
    let reclaimed = warm_up(model, devices, config).context("warm-up forward at the largest batch")?;
    let free = devices.free_memory().unwrap_or(0) + reclaimed;
    let bytes = usable(free, utilization, DEFAULT_RESERVE);
    tracing::info!(
        "KV budget: {:.1} GiB free after a warm-up step of {} tokens (the least of {} ranks); {utilization} of it, \
         {:.1} GiB, goes to the cache",
        free as f64 / f64::from(1 << 30),
        config.max_batch_tokens,
        devices.world_size(),
        bytes as f64 / f64::from(1 << 30),
    );
    Ok(Some(bytes))
}

/// One step of the largest batch `config` allows, sampled, then everything it made freed.
/// Returns the bytes of the state slots its cache held (0 for a model without recurrent
/// state).
fn warm_up(model: &dyn Model, devices: &Topology, config: &EngineConfig) -> Result<usize> {
    let seqs = config.max_num_seqs.min(config.max_batch_tokens).max(1);
    let per_seq = (config.max_batch_tokens / seqs).clamp(1, model.max_context().max(1));
    let extra = if per_seq < model.max_context() { config.max_batch_tokens % seqs } else { 0 };
    let lens: Vec<usize> = (0..seqs).map(|i| per_seq + usize::from(i < extra)).collect();
    let blocks: usize = lens.iter().map(|l| l.div_ceil(config.block_size)).sum();
    let mut kv = devices.kv_cache(model.kv_layout(), config, CacheSize { blocks, snapshots: 0 }, false, 0)?;
    let tokens = vec![0u32; per_seq + 1];
    let mut held = Vec::with_capacity(seqs);
    let mut batch = ForwardBatch::new();
    for &len in &lens {
        let mut blocks = kv.new_sequence();
        kv.reserve(&mut blocks, len).context("warm-up blocks")?;
        batch.push(&tokens[..len], 0, &blocks, LogitRows::Last);
        held.push(blocks);
    }
    let logits = model.forward(&batch, &mut kv)?;
    let params = SamplingParams { temperature: 1.0, top_p: 0.9, logprobs: Some(5), ..SamplingParams::default() };
    let rows: Vec<SampleRow<'_>> = (0..seqs)
        .map(|row| SampleRow {
            logits_row: row,
            params: &params,
            prompt: &[],
            output: &[],
            seed: 0,
            step: 0,
            banned: &[],
            draft: None,
        })
        .collect();
    devices.lead().sample(&logits, &rows)?;
    devices.synchronize()?;
    Ok(state_bytes(&model.kv_layout(), config, 0, 0))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use met_kernels::{Collective, CpuBackend, GpuBackend, LocalCollective};
    use met_model_layers::parallel::load_tensor_parallel;
    use met_model_layers::{LoadOptions, load_model, tensor_specs};
    use met_model_weights::DummyStore;

    use super::*;

    #[test]
    fn blocks_take_the_utilised_share_less_the_reserve() {
        assert_eq!(blocks_for(1000, 0.9, 100, 10), 80);
        assert_eq!(blocks_for(1000, 1.5, 0, 10), 100, "utilisation is capped at 1");
        assert_eq!(blocks_for(50, 0.9, 100, 10), 0, "the reserve can take everything");
        assert_eq!(blocks_for(1000, 0.5, 0, 0), 500, "a zero block size does not divide by zero");
    }

    #[test]
    fn a_device_without_memory_of_its_own_gets_no_budget() {
        let json = r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "max_position_embeddings": 64, "rms_norm_eps": 1e-6}"#;
        let cfg = met_model_layers::models::config_from_json(std::path::Path::new("config.json"), json).unwrap();
        let backend: Arc<dyn GpuBackend> = Arc::new(CpuBackend::new());
        let store = DummyStore::new(tensor_specs(&cfg).unwrap(), 0, backend.float_dtype());
        let model = load_model(&cfg, &store, Arc::clone(&backend), &LoadOptions::default()).unwrap();
        let devices = Topology::single(backend);
        let config = EngineConfig { max_num_seqs: 3, max_batch_tokens: 100, ..EngineConfig::default() };
        assert_eq!(usable_after_warmup(&*model, &devices, &config, 0.9).unwrap(), None);
        // The warm-up itself runs on any device: three sequences capped at the context of 64.
        warm_up(&*model, &devices, &config).unwrap();

        // The one sizing rule: the demand, within the CPU's budget, unless --kv-blocks.
        let sized = |kv_blocks| EngineSetup { kv_blocks, ..EngineSetup::new(config.clone(), 0) };
        let blocks = |setup: &EngineSetup, demand| cache_size(setup, &*model, &devices, demand).unwrap().blocks;
        let cpu_budget = CPU_KV_BYTES / model.kv_layout().bytes_per_block(config.block_size);
        assert_eq!(blocks(&sized(None), 10), 10);
        assert_eq!(blocks(&sized(None), usize::MAX), cpu_budget);
        assert_eq!(blocks(&sized(None), 0), 1, "never an empty cache");
        assert_eq!(blocks(&sized(Some(7)), 10), 7);

        // Split over two ranks, each holds the one KV head (replicated): the CPU's budget
        // covers both shares, so half as many blocks fit.
        let ranks: Vec<Arc<dyn GpuBackend>> = (0..2).map(|_| Arc::new(CpuBackend::new()) as _).collect();
        let group: Vec<Arc<dyn Collective>> =
            LocalCollective::group(&ranks).into_iter().map(|c| Arc::new(c) as _).collect();
        let split = load_tensor_parallel(&cfg, &store, &ranks, &group, &LoadOptions::default()).unwrap();
        assert_eq!(split.kv_layout(), model.kv_layout(), "one KV head per rank, as on one device");
        let devices = Topology::ranks(ranks);
        let split_blocks = cache_size(&sized(None), &*split, &devices, usize::MAX).unwrap().blocks;
        assert_eq!(split_blocks, cpu_budget / 2);
    }

    const GIB: usize = 1 << 30;

    fn budget(bytes: usize, sequences: usize, per_snapshot: usize) -> Budget {
        Budget { bytes, sequences, per_snapshot, per_block: 1 << 20 }
    }

    /// Sequences first, snapshots within their share and never more than the demand's
    /// boundaries, KV blocks from the rest.
    #[test]
    fn the_state_of_hybrids_comes_first_and_snapshots_take_a_share() {
        // 80 GiB, 36 GiB of sequence slots, 144 MiB snapshots (the Qwen3.5-27B shape at 256
        // sequences): a quarter of the 44 GiB left is 78 snapshots; KV gets the rest.
        let b = budget(80 * GIB, 36 * GIB, 144 << 20);
        let size = split_budget(&b, usize::MAX, 16).unwrap();
        assert_eq!(size.snapshots, (44 * GIB / 4) / (144 << 20));
        assert_eq!(size.blocks, (44 * GIB - size.snapshots * (144 << 20)) / (1 << 20));
        // A small demand: one snapshot per 16 of its blocks, all the blocks it wants.
        assert_eq!(split_budget(&b, 100, 16).unwrap(), CacheSize { blocks: 100, snapshots: 7 });
        // No recurrent state: every byte to blocks.
        assert_eq!(split_budget(&budget(GIB, 0, 0), usize::MAX, 16).unwrap().blocks, 1024);
        assert_eq!(split_budget(&budget(GIB, 0, 0), usize::MAX, 16).unwrap().snapshots, 0);
    }

    #[test]
    fn sequence_slots_past_the_memory_are_refused_with_the_flag_to_lower() {
        let err = split_budget(&budget(40 * GIB, 73 * GIB, 144 << 20), 10, 16).unwrap_err().to_string();
        assert!(err.contains("--max-num-seqs") && err.contains("73.0 GiB"), "{err}");
    }
}
