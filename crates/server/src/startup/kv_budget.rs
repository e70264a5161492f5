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

/// The KV cache of startup phase 6, one rule for `met serve`, `met generate` and the
/// benches: `--kv-blocks` when given; else the `demand` blocks the expected work can use
/// (every sequence at full context for a server, exactly the requests for a batch job), at
/// most what `--gpu-memory-utilization` of the memory free after a warm-up step holds
/// ([`CPU_KV_BYTES`] on the CPU). Never less than one block.
///
/// # Errors
/// When the warm-up forward fails.
pub fn kv_blocks(setup: &EngineSetup, model: &dyn Model, devices: &Topology, demand: usize) -> Result<usize> {
    if let Some(blocks) = setup.kv_blocks {
        return Ok(blocks);
    }
    let config = &setup.engine;
    let layout = model.kv_layout();
    let rollback = setup.speculative.as_ref().map_or(0, |s| s.num_tokens);
    let states = state_bytes(&layout, config, config.prefix_caching, rollback);
    let budget = match kv_blocks_after_warmup(model, devices, config, setup.gpu_memory_utilization, states)? {
        Some(blocks) => blocks,
        None => {
            if states >= CPU_KV_BYTES {
                anyhow::bail!(
                    "the recurrent state of {} sequences (and its prefix-cache snapshots) needs {:.1} GiB, more than \
                     the CPU's KV budget of {} GiB: lower --max-num-seqs or --state-snapshot-interval 0",
                    config.max_num_seqs,
                    states as f64 / f64::from(1 << 30),
                    CPU_KV_BYTES >> 30
                );
            }
            let all_ranks = layout.bytes_per_block(config.block_size) * devices.world_size();
            (CPU_KV_BYTES - states) / all_ranks.max(1)
        }
    };
    Ok(budget.min(demand).max(1))
}

/// Bytes kept free beyond the utilisation share, for what the warm-up cannot foresee
/// (allocator fragmentation across other batch shapes, library workspaces).
pub const DEFAULT_RESERVE: usize = 256 << 20;

/// How many KV blocks of `bytes_per_block` fit in `free` bytes at `utilization`, less
/// `reserve`.
pub fn blocks_for(free: usize, utilization: f64, reserve: usize, bytes_per_block: usize) -> usize {
    let usable = (free as f64 * utilization.clamp(0.0, 1.0)) as usize;
    usable.saturating_sub(reserve) / bytes_per_block.max(1)
}

/// The KV blocks the devices can hold after a warm-up forward at the largest batch of
/// `config`, with the smallest free memory of any rank scaled by `utilization`
/// (`--gpu-memory-utilization`), less `state_bytes` for a hybrid model's state slots;
/// `None` on devices that report no memory of their own.
///
/// # Errors
/// When the warm-up forward or sampling fails (out of memory at the largest batch, say).
pub fn kv_blocks_after_warmup(
    model: &dyn Model,
    devices: &Topology,
    config: &EngineConfig,
    utilization: f64,
    state_bytes: usize,
) -> Result<Option<usize>> {
    if devices.free_memory().is_none() {
        return Ok(None);
    }
    warm_up(model, devices, config).context("warm-up forward at the largest batch")?;
    let free = devices.free_memory().unwrap_or(0);
    let layout = model.kv_layout();
    let bytes_per_block = layout.bytes_per_block(config.block_size);
    // The recurrent-state slots of a hybrid model come out of the same memory.
    let reserve = DEFAULT_RESERVE + state_bytes;
    let blocks = blocks_for(free, utilization, reserve, bytes_per_block);
    tracing::info!(
        "KV budget: {:.1} GiB free after a warm-up step of {} tokens (the least of {} ranks); {utilization} of it \
         holds {blocks} blocks",
        free as f64 / f64::from(1 << 30),
        config.max_batch_tokens,
        devices.world_size()
    );
    Ok(Some(blocks))
}

/// One step of the largest batch `config` allows, sampled, then everything it made freed.
fn warm_up(model: &dyn Model, devices: &Topology, config: &EngineConfig) -> Result<()> {
    let seqs = config.max_num_seqs.min(config.max_batch_tokens).max(1);
    let per_seq = (config.max_batch_tokens / seqs).clamp(1, model.max_context().max(1));
    let extra = if per_seq < model.max_context() { config.max_batch_tokens % seqs } else { 0 };
    let lens: Vec<usize> = (0..seqs).map(|i| per_seq + usize::from(i < extra)).collect();
    let blocks: usize = lens.iter().map(|l| l.div_ceil(config.block_size)).sum();
    let mut kv = devices.kv_cache(model.kv_layout(), config, blocks, false, 0)?;
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
    devices.synchronize()
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
        assert_eq!(kv_blocks_after_warmup(&*model, &devices, &config, 0.9, 0).unwrap(), None);
        // The warm-up itself runs on any device: three sequences capped at the context of 64.
        warm_up(&*model, &devices, &config).unwrap();

        // The one sizing rule: the demand, within the CPU's budget, unless --kv-blocks.
        let sized = |kv_blocks| EngineSetup { kv_blocks, ..EngineSetup::new(config.clone(), 0) };
        let blocks = |setup: &EngineSetup, demand| kv_blocks(setup, &*model, &devices, demand).unwrap();
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
        let split_blocks = kv_blocks(&sized(None), &*split, &devices, usize::MAX).unwrap();
        assert_eq!(split_blocks, cpu_budget / 2);
    }
}
