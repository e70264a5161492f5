//! Building the serving engine from its settings (startup phases 6 and 7 and the engine
//! itself), shared by `met generate`, `met serve` and the benches so all schedule the same
//! way.

use std::sync::Arc;

use anyhow::{Context, Result};
use met_cache::KvCache as _;
use met_config::{DeviceKind, EngineSetup, LoadConfig, QuantDots, SpeculativeMethod};
use met_kernels::GpuBackend;
use met_model_layers::{GraphSettings, Model};
use met_scheduler::Engine;
use met_telemetry::{Metrics, Phase, PhaseTimer};

use crate::startup::kv_budget::CacheSize;
use crate::startup::load::{NoProgress, Weights, load_weights};
use crate::startup::topology::Topology;

/// Running sequences above which the CPU stops speculating, unless
/// `--speculative-max-batch` says otherwise. Measured on the 2-core development CPU with
/// the default model and prompt lookup at `k` 4 (`bench/results/speculative-cpu-2026-12-01/
/// batch-sweep`): 1.5x decode alone, 0.7-1.0x with two sequences, whose 10 verification rows
/// leave the few-row quantised kernel (8 rows at most) for dequantise-and-GEMM.
pub const CPU_SPECULATIVE_MAX_BATCH: usize = 1;

/// An engine over `model` with a KV cache of `size` on its devices (startup phase
/// 6; each tensor-parallel rank holds its share of every block), recording into `metrics`,
/// built as `setup` says (checked once, when the flags became settings).
///
/// # Errors
/// A failed graph capture, a cache the device cannot hold, or speculative settings the
/// model cannot serve.
pub fn build_engine(
    setup: &EngineSetup,
    model: Box<dyn Model>,
    devices: &Topology,
    size: CacheSize,
    metrics: Arc<Metrics>,
) -> Result<Engine> {
    let config = setup.engine.clone();
    let timer = PhaseTimer::start(Phase::KvCache);
    let blocks = size.blocks.max(1);
    let layout = model.kv_layout();
    let rollback = setup.speculative.as_ref().map_or(0, |s| s.num_tokens);
    let kv = devices.kv_cache(layout, &config, CacheSize { blocks, ..size }, config.prefix_caching, rollback)?;
    let mib = (blocks * layout.bytes_per_block(config.block_size)) as f64 / f64::from(1 << 20);
    let ranks = match devices.world_size() {
        1 => String::new(),
        n => format!(" on each of {n} ranks"),
    };
    let states = match kv.state_usage() {
        Some(u) => format!(
            "; recurrent state: {} sequence and {} snapshot slots ({:.0} MiB)",
            u.sequence_slots,
            u.snapshot_slots,
            u.bytes as f64 / f64::from(1 << 20)
        ),
        None => String::new(),
    };
    timer.done(format_args!(
        "{blocks} blocks of {} tokens in {} ({mib:.0} MiB{ranks}){states}",
        config.block_size, layout.dtype
    ));
    let timer = PhaseTimer::start(Phase::Warmup);
    match setup.cuda_graph_max_context {
        None => timer.done("no graphs (--enforce-eager)"),
        Some(max_context) => {
            let settings = GraphSettings { max_context, ..GraphSettings::up_to(config.max_num_seqs) };
            let capture = model.capture_graphs(&kv, &settings).context("capturing CUDA graphs of decode steps")?;
            timer.done(capture);
        }
    }
    let backend = devices.lead();
    let engine = Engine::new(model, Arc::clone(backend), Box::new(kv), config.clone(), metrics)?;
    let Some(mut speculative) = setup.speculative.clone() else { return Ok(engine) };
    if speculative.max_batch.is_none() && backend.device() == DeviceKind::Cpu {
        speculative.max_batch = Some(CPU_SPECULATIVE_MAX_BATCH);
    }
    Ok(match (speculative.method, &speculative.draft_model) {
        (SpeculativeMethod::Draft, Some(path)) => {
            let Weights { topology: draft_devices, model: draft, .. } = load_draft(path, &**backend)?;
            engine.with_draft_model(&speculative, draft, Arc::clone(draft_devices.lead()))?
        }
        _ => engine.with_speculative(&speculative)?,
    })
}

/// The draft model at `path` for `--speculative draft`, on the kind of device `target`
/// is (startup phases 1 to 5 again, for the draft).
fn load_draft(path: &str, target: &dyn GpuBackend) -> Result<Weights> {
    let load = LoadConfig {
        device: target.device(),
        // A draft only proposes tokens the target verifies, so its dots trade nothing
        // but acceptance: the fast ones.
        quant_dots: QuantDots::Int8,
        // A draft is small: it runs on rank 0's device alone.
        ..LoadConfig::for_model(Some(path.to_owned()))
    };
    tracing::info!("loading the draft model {path}");
    let (weights, _) = load_weights(&load, &NoProgress).with_context(|| format!("--draft-model {path}"))?;
    Ok(weights)
}

/// A seed for a request that did not pin one: different on every call.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
