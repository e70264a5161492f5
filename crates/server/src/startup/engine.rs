//! Building the serving engine from the engine flags (startup phases 6 and 7 and the
//! engine itself), shared by `met generate` and `met serve` so both schedule the same way.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use met_config::EngineConfig;
use met_kernels::GpuBackend;
use met_model_layers::{GraphSettings, Model};
use met_scheduler::{Engine, policy_by_name};
use met_speculative::{Method, SpeculativeConfig};
use met_telemetry::{Metrics, Phase, PhaseTimer};

use crate::cli::{EngineArgs, LoadFormat, ModelArgs, parse_device};
use crate::startup::load::{NoProgress, Weights, load_weights};
use crate::startup::topology::Topology;

/// The engine settings of `e`, validated.
///
/// # Errors
/// A zero budget or a bad speculative setting ([`speculative_config`]), naming its flag.
pub fn engine_config(e: &EngineArgs) -> Result<EngineConfig> {
    speculative_config(e)?;
    let config = EngineConfig {
        max_num_seqs: e.max_num_seqs,
        max_batch_tokens: e.max_batch_tokens,
        max_prefill_chunk: e.max_prefill_chunk,
        block_size: e.block_size,
        prefix_caching: !e.no_prefix_caching,
        async_scheduling: match e.async_scheduling.as_str() {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        ..EngineConfig::default()
    };
    config.validate()?;
    Ok(config)
}

/// Tokens proposed per step when `--speculative` is given without `--num-speculative-tokens`.
pub const DEFAULT_SPECULATIVE_TOKENS: usize = 4;

/// Running sequences above which the CPU stops speculating, unless
/// `--speculative-max-batch` says otherwise. Measured on the 2-core development CPU with
/// the default model and prompt lookup at `k` 4 (`bench/results/speculative-cpu-2026-12-01/
/// batch-sweep`): 1.5x decode alone, 0.7-1.0x with two sequences, whose 10 verification rows
/// leave the few-row quantised kernel (8 rows at most) for dequantise-and-GEMM.
pub const CPU_SPECULATIVE_MAX_BATCH: usize = 1;

/// The speculative decoding settings of `e`, validated; `None` without `--speculative`.
///
/// # Errors
/// A speculative flag without `--speculative`, or a value out of range, naming the flag.
pub fn speculative_config(e: &EngineArgs) -> Result<Option<SpeculativeConfig>> {
    let Some(method) = &e.speculative else {
        if e.draft_model.is_some() {
            bail!("--draft-model: needs --speculative draft");
        }
        let given = [
            ("num-speculative-tokens", e.num_speculative_tokens),
            ("speculative-ngram-min", e.speculative_ngram_min),
            ("speculative-ngram-max", e.speculative_ngram_max),
            ("self-spec-layers", e.self_spec_layers),
            ("speculative-max-batch", e.speculative_max_batch),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, v)| v.is_some()) {
            bail!("--{flag}: needs --speculative");
        }
        if e.speculative_fixed_k {
            bail!("--speculative-fixed-k: needs --speculative");
        }
        return Ok(None);
    };
    let mut config = SpeculativeConfig::ngram(e.num_speculative_tokens.unwrap_or(DEFAULT_SPECULATIVE_TOKENS));
    config.method = Method::from_name(method)?;
    config.ngram_min = e.speculative_ngram_min.unwrap_or(config.ngram_min);
    config.ngram_max = e.speculative_ngram_max.unwrap_or(config.ngram_max.max(config.ngram_min));
    config.self_spec_layers = e.self_spec_layers;
    config.max_batch = e.speculative_max_batch;
    config.adaptive = !e.speculative_fixed_k;
    config.validate()?;
    match (config.method, &e.draft_model) {
        (Method::Draft, None) => bail!("--draft-model: --speculative draft needs one"),
        (Method::Draft, Some(_)) | (_, None) => {}
        (_, Some(_)) => bail!("--draft-model: needs --speculative draft"),
    }
    Ok(Some(config))
}

/// Refuses engine flags that a model split over `tensor_parallel_size` ranks cannot serve:
/// self-speculation needs the model's first layers as a draft of its own, which a split
/// model does not offer.
///
/// # Errors
/// `--speculative self` with more than one rank, naming both flags.
pub fn check_parallel(tensor_parallel_size: usize, e: &EngineArgs) -> Result<()> {
    let self_spec = speculative_config(e)?.is_some_and(|s| s.method == Method::SelfSpec);
    if self_spec && tensor_parallel_size > 1 {
        bail!(
            "--speculative self: not available with --tensor-parallel-size {tensor_parallel_size} (a split model \
             cannot run its first layers as its own draft); use --speculative ngram or draft"
        );
    }
    Ok(())
}

/// An engine over `model` with a KV cache of `blocks` blocks on its devices (startup phase
/// 6; each tensor-parallel rank holds its share of every block), recording into `metrics`.
/// `config` is [`engine_config`] of `e`, checked once at startup.
///
/// # Errors
/// An unknown `--policy` (clap has already refused it on the command line), a failed graph
/// capture, or a cache the device cannot hold.
pub fn build_engine(
    e: &EngineArgs,
    config: EngineConfig,
    model: Box<dyn Model>,
    devices: &Topology,
    blocks: usize,
    metrics: Arc<Metrics>,
) -> Result<Engine> {
    check_parallel(devices.world_size(), e)?;
    let timer = PhaseTimer::start(Phase::KvCache);
    let blocks = blocks.max(1);
    let layout = model.kv_layout();
    let kv = devices.kv_cache(layout, config.block_size, blocks, config.prefix_caching)?;
    let mib = (blocks * layout.bytes_per_block(config.block_size)) as f64 / f64::from(1 << 20);
    let ranks = match devices.world_size() {
        1 => String::new(),
        n => format!(" on each of {n} ranks"),
    };
    timer.done(format_args!("{blocks} blocks of {} tokens ({mib:.0} MiB{ranks})", config.block_size));
    let timer = PhaseTimer::start(Phase::Warmup);
    if e.enforce_eager {
        timer.done("no graphs (--enforce-eager)");
    } else {
        let settings =
            GraphSettings { max_context: e.max_seq_len_to_capture, ..GraphSettings::up_to(config.max_num_seqs) };
        let capture = model.capture_graphs(&kv, &settings).context("capturing CUDA graphs of decode steps")?;
        timer.done(capture);
    }
    let policy = policy_by_name(&e.policy).with_context(|| {
        format!("--policy: unknown policy `{}` (one of {})", e.policy, met_scheduler::POLICY_NAMES.join(", "))
    })?;
    let backend = devices.lead();
    let engine = Engine::new(model, Arc::clone(backend), Box::new(kv), config, policy, metrics)?;
    let speculative = speculative_config(e)?.map(|mut s| {
        if s.max_batch.is_none() && backend.name() == "cpu" {
            s.max_batch = Some(CPU_SPECULATIVE_MAX_BATCH);
        }
        s
    });
    Ok(match (speculative, &e.draft_model) {
        (Some(speculative), Some(path)) if speculative.method == Method::Draft => {
            let Weights { topology: draft_devices, model: draft } = load_draft(path, &**backend)?;
            engine.with_draft_model(&speculative, draft, Arc::clone(draft_devices.lead()))?
        }
        (Some(speculative), _) => engine.with_speculative(&speculative)?,
        (None, _) => engine,
    })
}

/// The draft model at `path` for `--speculative draft`, on the kind of device `target`
/// is (startup phases 1 to 5 again, for the draft).
fn load_draft(path: &str, target: &dyn GpuBackend) -> Result<Weights> {
    let args = ModelArgs {
        model: Some(path.to_owned()),
        load_format: LoadFormat::Auto,
        dummy_seed: 0,
        hf_overrides: None,
        device: parse_device(target.name()).map_err(anyhow::Error::msg)?,
        // A draft only proposes tokens the target verifies, so its dots trade nothing
        // but acceptance: the fast ones.
        cpu_dots: met_kernels::CpuDots::Int8,
        attention_backend: met_model_layers::LoadOptions::default().attention_backend,
        // A draft is small: it runs on rank 0's device alone.
        tensor_parallel_size: 1,
    };
    tracing::info!("loading the draft model {path}");
    let (weights, _) = load_weights(&args, &NoProgress).with_context(|| format!("--draft-model {path}"))?;
    Ok(weights)
}

/// A seed for a request that did not pin one: different on every call.
pub fn random_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}
