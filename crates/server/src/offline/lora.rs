//! `--lora-dummy N:R` of `met bench throughput` and `met bench latency`: the same runs with
//! `N` random rank-`R` adapters on every projection that takes one (all seven of a dense
//! layer), the requests spread over them in turn (request `i` through adapter `i mod N`).
//!
//! The adapters' slots are the model's before the engine captures its decode graphs, as
//! `met serve --enable-lora` does, so the decode steps measured are the replayed ones a
//! server would run; measuring the same flags without `--lora-dummy` gives the base model
//! side by side.

use std::str::FromStr;
use std::sync::Arc;

use anyhow::{Context, Result};
use met_config::LoadConfig;
use met_model_layers::Model;
use met_model_layers::lora::{Adapter, LoraAdapter, LoraLimits, LoraPool};
use met_scheduler::EngineRequest;

use crate::startup::load::{NoProgress, Weights, load_weights};
use crate::startup::topology::Topology;

/// `N:R`: how many random adapters, and their rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoraDummy {
    /// Adapters.
    pub count: usize,
    /// Their rank.
    pub rank: usize,
}

impl FromStr for LoraDummy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not N:R (adapters:rank, both positive, e.g. 8:16)");
        let (count, rank) = s.split_once(':').ok_or_else(bad)?;
        let count: usize = count.trim().parse().map_err(|_| bad())?;
        let rank: usize = rank.trim().parse().map_err(|_| bad())?;
        if count == 0 || rank == 0 {
            return Err(bad());
        }
        Ok(Self { count, rank })
    }
}

/// The model `load_config` names on its devices, with `dummy`'s adapters loaded into slots
/// it serves from (none without `dummy`).
///
/// # Errors
/// A model that does not load; a device that cannot hold the slots.
pub(super) fn load(
    load_config: &LoadConfig,
    dummy: Option<LoraDummy>,
) -> Result<(Box<dyn Model>, Topology, Vec<Adapter>)> {
    let (Weights { topology, model, config }, _) = load_weights(load_config, &NoProgress)?;
    let Some(LoraDummy { count, rank }) = dummy else { return Ok((model, topology, Vec::new())) };
    let limits = LoraLimits { max_rank: rank };
    let pool = LoraPool::new(&config, Arc::clone(topology.lead()), limits, count).context("--lora-dummy")?;
    model.attach_lora(Arc::clone(&pool)).context("--lora-dummy")?;
    let adapters = (0..count)
        .map(|i| {
            let adapter = LoraAdapter::random(&format!("dummy-{i}"), &config, &pool, rank, i as u64 + 1)?;
            Ok(Arc::new(adapter))
        })
        .collect::<Result<Vec<_>, met_model_layers::ModelError>>()
        .context("--lora-dummy")?;
    tracing::info!("{count} random rank-{rank} LoRA adapters on every projection");
    Ok((model, topology, adapters))
}

/// `requests`, request `i` through adapter `i mod N` (all base without adapters).
pub(super) fn spread(requests: Vec<EngineRequest>, adapters: &[Adapter]) -> Vec<EngineRequest> {
    if adapters.is_empty() {
        return requests;
    }
    requests.into_iter().enumerate().map(|(i, r)| r.with_adapter(Arc::clone(&adapters[i % adapters.len()]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_adapters_and_rank() {
        assert_eq!("8:16".parse(), Ok(LoraDummy { count: 8, rank: 16 }));
        for bad in ["8", "0:16", "8:0", "a:b", "8:16:1"] {
            assert!(bad.parse::<LoraDummy>().is_err(), "{bad}");
        }
    }
}
