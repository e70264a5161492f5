//! The flags every command that runs the engine shares: which model and how to load it
//! ([`ModelArgs`], into a [`LoadConfig`]) and how to build the engine around it
//! ([`EngineArgs`], into an [`EngineSetup`]). Each is converted once, here; a flag that
//! needs another (`--num-speculative-tokens` without `--speculative`) is an error naming it.

use anyhow::{Result, bail};
use clap::Args;
use met_config::{
    AsyncScheduling, AttentionBackendKind, DeviceKind, EngineConfig, EngineSetup, KvCacheDtype, LoadConfig, LoadFormat,
    Policy, QuantDots, SpeculativeConfig, SpeculativeMethod,
};

/// Tokens proposed per step when `--speculative` is given without `--num-speculative-tokens`.
pub const DEFAULT_SPECULATIVE_TOKENS: usize = 4;

/// Which model to load and how.
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// The model: a Hugging Face directory, a `.gguf` file, or a hub id in the local
    /// Hugging Face cache. Default: the embedded SmolLM2-135M-Instruct.
    #[arg(long)]
    pub model: Option<String>,
    /// Where the weights come from.
    #[arg(long, value_enum, default_value_t = LoadFormat::Auto)]
    pub load_format: LoadFormat,
    /// Seed of `--load-format dummy` weights.
    #[arg(long, default_value_t = 0)]
    pub dummy_seed: u64,
    /// JSON object whose fields replace those of `config.json`, e.g. '{"num_hidden_layers": 2}'.
    #[arg(long)]
    pub hf_overrides: Option<String>,
    /// Device to run on: auto (CUDA when compiled in and a GPU opens, else the CPU), cpu or
    /// cuda.
    #[arg(long, default_value_t = DeviceKind::Auto, value_parser = parse_device)]
    pub device: DeviceKind,
    /// Products with quantised weights: int8 rounds the activations to 8 bits a block of 32
    /// for integer dots (the CPU's GGUF blocks: about 15 % faster decode on the default
    /// model; CUDA's Q4_K and Q6_K GEMV: Q4_K alone 1.7x on a Q4_K_M 8B shape), exact keeps
    /// them in floats.
    /// `--cpu-dots` is the older name.
    #[arg(long, visible_alias = "cpu-dots", value_enum, default_value_t = QuantDots::CLI_DEFAULT)]
    pub quant_dots: QuantDots,
    /// Attention backend.
    #[arg(long, value_enum, default_value_t = AttentionBackendKind::Flash)]
    pub attention_backend: AttentionBackendKind,
    /// The KV cache's element type: fp8 (e4m3) stores each key and value in one byte under
    /// the checkpoint's per-layer scales (1.0 where it has none), so about twice the
    /// tokens of bf16 fit (four times the CPU's f32). On the CPU and on CUDA GPUs from Hopper
    /// (sm_90) on.
    #[arg(long, value_enum, default_value_t = KvCacheDtype::Auto)]
    pub kv_cache_dtype: KvCacheDtype,
    /// Devices to split the model across (tensor parallelism): GPUs 0..N over NCCL with
    /// CUDA, N ranks sharing the cores on the CPU. N must divide the attention heads.
    #[arg(long, default_value_t = 1, value_parser = parse_world)]
    pub tensor_parallel_size: usize,
    /// A request's tokens and logprobs never depend on the requests batched with it (their
    /// number, chunked prefill, preemption, prefix hits). The CPU's kernels always behave
    /// so; on CUDA this picks slower kernels (one GPU, attention models: not hybrids).
    #[arg(long)]
    pub batch_invariant: bool,
}

impl ModelArgs {
    /// The load settings these flags say.
    pub fn load_config(&self) -> LoadConfig {
        LoadConfig {
            model: self.model.clone(),
            format: self.load_format,
            dummy_seed: self.dummy_seed,
            hf_overrides: self.hf_overrides.clone(),
            device: self.device,
            quant_dots: self.quant_dots,
            attention: self.attention_backend,
            kv_cache_dtype: self.kv_cache_dtype,
            tensor_parallel_size: self.tensor_parallel_size,
            batch_invariant: self.batch_invariant,
        }
    }
}

/// Scheduling budgets, the KV cache, CUDA graphs and speculative decoding.
#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// Most sequences per step.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// Most tokens per step.
    #[arg(long, default_value_t = 8192)]
    pub max_batch_tokens: usize,
    /// Most prompt tokens of one sequence per step (chunked prefill); default: the budget.
    #[arg(long)]
    pub max_prefill_chunk: Option<usize>,
    /// KV cache blocks (default for `generate`: enough for every request at once; for
    /// `serve`: what `--gpu-memory-utilization` of the device memory holds, or 1 GiB on the
    /// CPU).
    #[arg(long)]
    pub kv_blocks: Option<usize>,
    /// Tokens per KV cache block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Share of the device memory left free after a warm-up step at the largest batch that
    /// the KV cache may take (devices with memory of their own, i.e. GPUs).
    #[arg(long, default_value_t = 0.9)]
    pub gpu_memory_utilization: f64,
    /// Turn automatic prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Hybrid (linear-attention) models: snapshot the recurrent state every this many full
    /// KV blocks, so that a request sharing a cached prefix resumes at the last snapshot
    /// (0: no snapshots, no prefix hits on such models).
    #[arg(long, default_value_t = EngineConfig::default().state_snapshot_interval)]
    pub state_snapshot_interval: usize,
    /// Scheduling policy.
    #[arg(long, value_enum, default_value_t = Policy::Fcfs)]
    pub policy: Policy,
    /// Run every step eagerly: no CUDA graphs of decode steps.
    #[arg(long)]
    pub enforce_eager: bool,
    /// Queue each decode step before reading the tokens of the step before, so that
    /// scheduling and bookkeeping on the host overlap the device's work. The same batches
    /// run either way, except that a step may carry the discarded row of a sequence that
    /// just ended (on a GPU, a batch of another size can round differently).
    #[arg(long, value_enum, default_value_t = AsyncScheduling::Auto)]
    pub async_scheduling: AsyncScheduling,
    /// Longest context a decode step replayed from a CUDA graph may hold (it sizes the
    /// graphs' block tables); steps with longer contexts run eagerly.
    #[arg(long, default_value_t = met_model_layers::graphs::DEFAULT_MAX_CONTEXT)]
    pub max_seq_len_to_capture: usize,
    /// Speculative decoding: the model verifies a proposal of its next tokens in the same
    /// step. Greedy output is unchanged, and so is a seeded sampled request's. Off by default.
    #[arg(long, value_enum, value_name = "METHOD")]
    pub speculative: Option<SpeculativeMethod>,
    /// Most tokens proposed and verified per sequence and step, 1 to 16 (with
    /// `--speculative`; default 4).
    #[arg(long, value_name = "K")]
    pub num_speculative_tokens: Option<usize>,
    /// Shortest suffix `--speculative ngram` looks up (default 2).
    #[arg(long, value_name = "N")]
    pub speculative_ngram_min: Option<usize>,
    /// Longest suffix `--speculative ngram` looks up, tried first (default 4).
    #[arg(long, value_name = "N")]
    pub speculative_ngram_max: Option<usize>,
    /// Layers of the model `--speculative self` drafts with, then its final norm and head;
    /// fewer than the model has (default a quarter of them).
    #[arg(long, value_name = "L")]
    pub self_spec_layers: Option<usize>,
    /// The draft model of `--speculative draft` (a directory, `.gguf` or hub id, as
    /// `--model` takes), with the model's vocabulary, on the same kind of device.
    #[arg(long, value_name = "MODEL")]
    pub draft_model: Option<String>,
    /// Speculate only while at most N sequences run (default on the CPU: 1, where
    /// verifying two sequences' drafts already costs more than it saves; elsewhere no limit).
    #[arg(long, value_name = "N")]
    pub speculative_max_batch: Option<usize>,
    /// Always propose `--num-speculative-tokens` tokens, instead of adapting each
    /// sequence's draft length to its acceptance.
    #[arg(long)]
    pub speculative_fixed_k: bool,
}

impl EngineArgs {
    /// The engine settings these flags say, validated.
    ///
    /// # Errors
    /// A zero budget, a bad speculative setting, or a speculative flag without
    /// `--speculative`, naming its flag.
    pub fn setup(&self) -> Result<EngineSetup> {
        let engine = EngineConfig {
            max_num_seqs: self.max_num_seqs,
            max_batch_tokens: self.max_batch_tokens,
            max_prefill_chunk: self.max_prefill_chunk,
            block_size: self.block_size,
            prefix_caching: !self.no_prefix_caching,
            state_snapshot_interval: self.state_snapshot_interval,
            async_scheduling: self.async_scheduling,
            policy: self.policy,
            ..EngineConfig::default()
        };
        let setup = EngineSetup {
            kv_blocks: self.kv_blocks,
            gpu_memory_utilization: self.gpu_memory_utilization,
            cuda_graph_max_context: (!self.enforce_eager).then_some(self.max_seq_len_to_capture),
            speculative: self.speculative()?,
            ..EngineSetup::new(engine, self.max_seq_len_to_capture)
        };
        setup.validate()?;
        Ok(setup)
    }

    /// The speculative settings; `None` without `--speculative`.
    fn speculative(&self) -> Result<Option<SpeculativeConfig>> {
        let Some(method) = self.speculative else {
            self.refuse_speculative_flags()?;
            return Ok(None);
        };
        let defaults = SpeculativeConfig::ngram(self.num_speculative_tokens.unwrap_or(DEFAULT_SPECULATIVE_TOKENS));
        let ngram_min = self.speculative_ngram_min.unwrap_or(defaults.ngram_min);
        Ok(Some(SpeculativeConfig {
            method,
            ngram_min,
            ngram_max: self.speculative_ngram_max.unwrap_or(defaults.ngram_max.max(ngram_min)),
            self_spec_layers: self.self_spec_layers,
            max_batch: self.speculative_max_batch,
            adaptive: !self.speculative_fixed_k,
            draft_model: self.draft_model.clone(),
            ..defaults
        }))
    }

    /// Refuses a speculative flag given without `--speculative`.
    fn refuse_speculative_flags(&self) -> Result<()> {
        if self.draft_model.is_some() {
            bail!("--draft-model: needs --speculative draft");
        }
        let given = [
            ("num-speculative-tokens", self.num_speculative_tokens),
            ("speculative-ngram-min", self.speculative_ngram_min),
            ("speculative-ngram-max", self.speculative_ngram_max),
            ("self-spec-layers", self.self_spec_layers),
            ("speculative-max-batch", self.speculative_max_batch),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, v)| v.is_some()) {
            bail!("--{flag}: needs --speculative");
        }
        if self.speculative_fixed_k {
            bail!("--speculative-fixed-k: needs --speculative");
        }
        Ok(())
    }
}

/// The load and engine settings of `model` and `engine`, each checked, and checked together.
///
/// # Errors
/// A bad setting, or settings that contradict each other (`--speculative self` with
/// `--tensor-parallel-size 2`), naming the flags.
pub fn settings(model: &ModelArgs, engine: &EngineArgs) -> Result<(LoadConfig, EngineSetup)> {
    let load = model.load_config();
    load.validate()?;
    let setup = engine.setup()?;
    setup.check_world(load.tensor_parallel_size)?;
    Ok((load, setup))
}

fn parse_device(s: &str) -> Result<DeviceKind, String> {
    s.parse().map_err(|e: met_config::UnknownName| e.to_string())
}

fn parse_world(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}` is not a number of devices (1 or more)")),
    }
}
