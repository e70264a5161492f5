//! Loading a model for a command: resolve, config, device, topology, weights and tokenizer
//! (startup phases 1-5 and 8), from a Hugging Face directory or a GGUF file. Weight loading
//! reports each tensor to a [`WeightProgress`] (a progress bar on a terminal for `met serve`).
//! [`load_weights`] stops before the tokenizer, so `met serve` can size its KV cache and
//! capture graphs (phases 6 and 7) first and the phases run in their numbered order;
//! `met generate`, which needs the tokenizer to size its cache, takes [`load`].

use std::borrow::Cow;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use met_config::{DeviceKind, GenerationConfig, LoadConfig, LoadFormat, ModelConfig};
use met_kernels::{DType, HostTensor};
use met_model_layers::parallel::load_tensor_parallel;
use met_model_layers::{LoadOptions, Model, kv_pool_dtype, load_model, models, tensor_specs};
use met_model_weights::{DummyStore, GgufRecipe, GgufStore, SafetensorsStore, TensorInfo, WeightError, WeightStore};
use met_telemetry::{Phase, PhaseTimer};

use crate::resolve::{ModelSource, SearchPaths, resolve};
use crate::startup::topology::{self, Topology};
use met_text::Tokenizer;

/// A model ready to run, with the facts commands need about it.
pub struct LoadedModel {
    /// Its tokenizer (with the chat template), when the model ships one.
    pub tokenizer: Option<Tokenizer>,
    /// The device it runs on, or its tensor-parallel ranks' devices.
    pub topology: Topology,
    /// The model.
    pub model: Box<dyn Model>,
    /// End-of-sequence tokens from the model's configuration.
    pub eos_token_ids: Vec<u32>,
    /// Where the model was found.
    pub source: ModelSource,
}

/// Hears about weight loading tensor by tensor (startup phase 5).
pub trait WeightProgress: Sync {
    /// Loading starts; about `tensors` tensors will be read.
    fn start(&self, tensors: usize);
    /// One tensor's bytes were read.
    fn tensor(&self, name: &str);
    /// Loading ended, successfully or not; called before the phase is logged.
    fn finish(&self);
}

/// A [`WeightProgress`] that reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl WeightProgress for NoProgress {
    fn start(&self, _: usize) {}
    fn tensor(&self, _: &str) {}
    fn finish(&self) {}
}

/// Runs startup phases 1 to 5 and 8 for `config`.
///
/// # Errors
/// A model that cannot be found, read or loaded, or devices that do not open.
pub fn load(config: &LoadConfig) -> Result<LoadedModel> {
    let (Weights { topology, model, .. }, text) = load_weights(config, &NoProgress)?;
    let Text { tokenizer, eos_token_ids, source } = text.load()?;
    Ok(LoadedModel { tokenizer, topology, model, eos_token_ids, source })
}

/// A model loaded without its tokenizer yet (phases 1-5 done).
pub struct Weights {
    /// The device it runs on, or its tensor-parallel ranks' devices.
    pub topology: Topology,
    /// The model.
    pub model: Box<dyn Model>,
    /// Its configuration (LoRA adapters are checked against it).
    pub config: ModelConfig,
}

/// What phase 8 gives: the model's tokenizer and end-of-sequence tokens.
pub struct Text {
    /// Its tokenizer (with the chat template), when the model ships one.
    pub tokenizer: Option<Tokenizer>,
    /// End-of-sequence tokens of the configuration and the tokenizer.
    pub eos_token_ids: Vec<u32>,
    /// Where the model was found.
    pub source: ModelSource,
}

/// What phase 8 reads the tokenizer from: the model's source (and its GGUF file) and the
/// end-of-sequence tokens of its configuration.
pub struct TextSource {
    source: ModelSource,
    gguf: Option<GgufStore>,
    eos_token_ids: Vec<u32>,
}

impl TextSource {
    /// Where the model was found.
    pub fn source(&self) -> &ModelSource {
        &self.source
    }

    /// Whether the model ships a tokenizer (a GGUF file, or `tokenizer.json`), to refuse
    /// early what needs one.
    pub fn has_tokenizer(&self) -> bool {
        match &self.source {
            ModelSource::Gguf(_) => self.gguf.is_some(),
            ModelSource::HfDir(dir) => dir.join("tokenizer.json").is_file(),
        }
    }

    /// Phase 8: the tokenizer and chat template, and the end-of-sequence tokens of the
    /// configuration and the tokenizer together.
    ///
    /// # Errors
    /// A tokenizer that does not parse.
    pub fn load(self) -> Result<Text> {
        let Self { source, gguf, mut eos_token_ids } = self;
        let timer = PhaseTimer::start(Phase::Tokenizer);
        let tokenizer = tokenizer_for(&source, gguf.as_ref())?;
        if let Some(t) = &tokenizer {
            eos_token_ids.extend(t.eos_ids());
            eos_token_ids.sort_unstable();
            eos_token_ids.dedup();
        }
        timer.done(match &tokenizer {
            Some(t) => format!("{} tokens, chat template: {}", t.vocab_size(), t.chat_template().is_some()),
            None => "none (token ids only)".into(),
        });
        Ok(Text { tokenizer, eos_token_ids, source })
    }
}

/// Startup phases 1 to 5 for `args`, telling `progress` about every tensor read; phase 8
/// (the tokenizer) is [`TextSource::load`].
///
/// # Errors
/// A model that cannot be found, read or loaded, or devices that do not open.
pub fn load_weights(args: &LoadConfig, progress: &dyn WeightProgress) -> Result<(Weights, TextSource)> {
    let timer = PhaseTimer::start(Phase::Resolve);
    let source = resolve(args.model.as_deref(), &SearchPaths::from_env())?;
    timer.done(source.path().display());

    let timer = PhaseTimer::start(Phase::Config);
    let overrides = args.hf_overrides.as_deref();
    let (config, gguf, mut eos_token_ids) = match &source {
        ModelSource::HfDir(dir) => {
            let path = dir.join("config.json");
            let config = match overrides {
                Some(o) => models::read_config_with_overrides(&path, o),
                None => models::read_config(&path),
            }?;
            let mut eos = config.eos_token_ids.clone();
            let generation = dir.join("generation_config.json");
            if generation.is_file() {
                eos.extend(GenerationConfig::from_file(&generation)?.eos_token_ids);
            }
            (config, None, eos)
        }
        ModelSource::Gguf(path) => {
            let store = models::open_gguf(path)?;
            let config = match overrides {
                Some(o) => models::config_from(&store.config()?.with_overrides(o)?)?,
                None => models::gguf_config(&store)?,
            };
            let eos = config.eos_token_ids.clone();
            (config, Some(store), eos)
        }
    };
    eos_token_ids.sort_unstable();
    eos_token_ids.dedup();
    timer.done(format_args!("{} with {} layers", config.model_type, config.num_layers));

    let (topology, collectives) = topology::open(args, &config)?;
    let backend = topology.lead();
    // Refused before the weights load (the model checks it again, for library callers).
    kv_pool_dtype(&**backend, args.kv_cache_dtype)?;
    if args.batch_invariant && !backend.batch_invariant() {
        bail!("--batch-invariant: {} has no batch-invariant kernels", backend.name());
    }
    if args.batch_invariant && backend.device() == DeviceKind::Cuda && config.linear_attention.is_some() {
        bail!(
            "--batch-invariant on CUDA does not take hybrid models ({}): the chunked delta rule's \
             chunks follow how a prompt is split into steps",
            config.model_type
        );
    }

    let timer = PhaseTimer::start(Phase::Weights);
    let free_before = backend.memory_info().map(|m| m.free);
    let owned: Box<dyn WeightStore>;
    let store: &dyn WeightStore = match (args.format, &source, &gguf) {
        (LoadFormat::Dummy, ..) => {
            owned = Box::new(dummy_store(&config, args.dummy_seed, backend.float_dtype())?);
            &*owned
        }
        (format @ (LoadFormat::DummyQ4KM | LoadFormat::DummyQ80), ..) => {
            if let Some(q) = &config.quantization {
                bail!(
                    "--load-format {format} makes GGUF blocks, but the config's quantization_config is {}: \
                     use --load-format dummy for it, or a config without one",
                    q.method
                );
            }
            let recipe = if format == LoadFormat::DummyQ4KM { GgufRecipe::Q4KM } else { GgufRecipe::Q80 };
            let store = DummyStore::new(tensor_specs(&config)?, args.dummy_seed, backend.float_dtype());
            owned = Box::new(store.gguf_blocks(recipe));
            &*owned
        }
        (LoadFormat::Auto, _, Some(g)) => g,
        (LoadFormat::Auto, source, None) => {
            owned = Box::new(SafetensorsStore::open(source.path())?);
            &*owned
        }
    };
    let options = LoadOptions { attention_backend: args.attention, kv_cache_dtype: args.kv_cache_dtype };
    // Each rank reads its share of every tensor.
    progress.start(tensor_specs(&config).map_or(0, |specs| specs.len() * topology.world_size()));
    let counted = Counted { inner: store, progress };
    let model = match topology.world_size() {
        1 => load_model(&config, &counted, Arc::clone(backend), &options),
        _ => load_tensor_parallel(&config, &counted, topology.backends(), &collectives, &options),
    };
    progress.finish();
    let model = model.with_context(|| format!("loading {}", store.describe()))?;
    if let Some(q) = &config.quantization {
        // Said at every start. The CPU (the backend that computes in f32) keeps quantised
        // blocks; CUDA keeps e4m3 matrices whose scales and shape its FP8 kernels take.
        if backend.float_dtype() == DType::F32 {
            tracing::info!(
                "{} weights stay e4m3 blocks on the CPU (1.125 bytes a weight) where each 32 columns of a row \
                 share a scale; others are dequantized to f32",
                q.method
            );
        } else {
            tracing::info!(
                "{} weights stay e4m3 on the GPU (1 byte a weight) where their scales are per row, per tensor or \
                 per 128 x 128 block and their rows are a multiple of 16 and columns of 128 (on Hopper with \
                 cuBLASLt 12.9 or later); other matrices are dequantized to {:?}",
                q.method,
                backend.float_dtype()
            );
        }
    }
    let free_after = backend.memory_info().map(|m| m.free);
    timer.done(format!("{}{}", store.describe(), device_memory_taken(free_before, free_after)));

    Ok((Weights { topology, model, config }, TextSource { source, gguf, eos_token_ids }))
}

/// "; N GiB of device memory": what loading took of the first device's memory (its free
/// memory before less after, the pool's cached blocks counted as taken), or nothing on a
/// device without memory of its own.
fn device_memory_taken(free_before: Option<usize>, free_after: Option<usize>) -> String {
    match (free_before, free_after) {
        (Some(before), Some(after)) => {
            format!("; {:.2} GiB of device memory", before.saturating_sub(after) as f64 / f64::from(1u32 << 30))
        }
        _ => String::new(),
    }
}

/// `--load-format dummy`: random weights for every tensor of `config`, in the float
/// `dtype`; under a `quantization_config`, stored as a checkpoint of that format stores
/// them (float8 weights beside their scales), so they load as a real one's would.
fn dummy_store(config: &ModelConfig, seed: u64, dtype: DType) -> Result<DummyStore> {
    let store = DummyStore::new(tensor_specs(config)?, seed, dtype);
    Ok(match &config.quantization {
        Some(q) => store.quantized(q, config.text_prefix.as_deref()),
        None => store,
    })
}

/// A store that reports each tensor read to a [`WeightProgress`].
struct Counted<'a> {
    inner: &'a dyn WeightStore,
    progress: &'a dyn WeightProgress,
}

impl WeightStore for Counted<'_> {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.inner.info(name)
    }

    fn host(&self, name: &str) -> Result<HostTensor<'_>, WeightError> {
        let tensor = self.inner.host(name);
        self.progress.tensor(name);
        tensor
    }

    fn uniform_run(&self, name: &str) -> Option<met_kernels::UniformRun> {
        let run = self.inner.uniform_run(name);
        if run.is_some() {
            self.progress.tensor(name);
        }
        run
    }

    fn float8_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.inner.float8_shape(name)
    }

    fn float8(&self, name: &str) -> Option<Cow<'_, [u8]>> {
        self.inner.float8(name)
    }
}

/// The tokenizer a model ships: GGUF metadata, or `tokenizer.json` in an HF directory
/// (`None` when the directory has none, as for bare configs run with dummy weights).
fn tokenizer_for(source: &ModelSource, gguf: Option<&GgufStore>) -> Result<Option<Tokenizer>> {
    Ok(match (source, gguf) {
        (_, Some(g)) => Some(Tokenizer::from_gguf(g.file())?),
        (ModelSource::HfDir(dir), None) if dir.join("tokenizer.json").is_file() => Some(Tokenizer::from_hf_dir(dir)?),
        _ => None,
    })
}

/// Only the tokenizer of `--model` (for `met tokenize`): resolves, then reads the GGUF
/// metadata or the tokenizer files, without loading weights.
pub fn load_tokenizer(model: Option<&str>) -> Result<Tokenizer> {
    let source = resolve(model, &SearchPaths::from_env())?;
    let gguf = match &source {
        ModelSource::Gguf(path) => Some(models::open_gguf(path)?),
        ModelSource::HfDir(_) => None,
    };
    tokenizer_for(&source, gguf.as_ref())?
        .with_context(|| format!("{} has no tokenizer (tokenizer.json)", source.path().display()))
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn the_weights_phase_says_what_device_memory_loading_took() {
        let gib = 1usize << 30;
        assert_eq!(device_memory_taken(Some(20 * gib), Some(15 * gib + gib / 4)), "; 4.75 GiB of device memory");
        // Memory freed while loading (a cache trimmed) reads as none taken, not as a wrap.
        assert_eq!(device_memory_taken(Some(gib), Some(2 * gib)), "; 0.00 GiB of device memory");
        assert_eq!(device_memory_taken(None, None), "");
        assert_eq!(device_memory_taken(Some(gib), None), "");
    }

    /// A tiny Llama whose config declares Qwen's block-wise FP8 (blocks wider than its
    /// weights, so each weight has one block of scales, cut short at both edges).
    const FP8_LLAMA: &str = r#"{"model_type": "llama", "vocab_size": 64, "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
            "weight_block_size": [128, 128], "modules_to_not_convert": ["model.layers.1.mlp.down_proj"]}}"#;

    /// The names of the tensors read from the store.
    #[derive(Default)]
    struct Recorded(Mutex<Vec<String>>);

    impl WeightProgress for Recorded {
        fn start(&self, _: usize) {}
        fn tensor(&self, name: &str) {
            self.0.lock().unwrap().push(name.to_owned());
        }
        fn finish(&self) {}
    }

    /// `--load-format dummy` under a quantized config stores the weights the config
    /// quantizes as float8 beside their scales, and the model loads them on the CPU.
    #[test]
    fn dummy_weights_of_a_quantized_config_are_float8() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), FP8_LLAMA).unwrap();
        let config = models::read_config(&dir.path().join("config.json")).unwrap();
        let store = dummy_store(&config, 3, DType::F32).unwrap();
        assert_eq!(store.float8_shape("model.layers.0.mlp.down_proj.weight"), Some(vec![64, 96]));
        assert_eq!(store.info("model.layers.0.mlp.down_proj.weight_scale_inv").unwrap().shape, [1, 1]);
        for float in ["model.layers.1.mlp.down_proj.weight", "lm_head.weight", "model.embed_tokens.weight"] {
            assert_eq!(store.float8_shape(float), None, "{float}");
            assert_eq!(store.info(float).unwrap().dtype, DType::F32, "{float}");
        }

        let args = LoadConfig {
            format: LoadFormat::Dummy,
            device: DeviceKind::Cpu,
            dummy_seed: 3,
            ..LoadConfig::for_model(Some(dir.path().display().to_string()))
        };
        let progress = Recorded::default();
        load_weights(&args, &progress).unwrap();
        // A float8 weight is read as its codes and its scales, the scales through `host`.
        let read = progress.0.into_inner().unwrap();
        assert!(read.iter().any(|n| n == "model.layers.0.self_attn.q_proj.weight_scale_inv"), "{read:?}");
        assert!(!read.iter().any(|n| n == "model.layers.1.mlp.down_proj.weight_scale_inv"), "{read:?}");
    }
}
