//! `ModelConfig`: the architecture facts of a checkpoint, from its `config.json`.
//!
//! Defaults follow the transformers configuration class of each model type, so a
//! `config.json` that omits a field means what it means to transformers. Fields whose
//! meaning is spread over several keys (sliding windows, rotary scaling, biases) are
//! resolved here once, per layer where that matters.

use std::fmt;
use std::path::Path;

use crate::ConfigError;
use crate::fields::{Fields, read};

/// The architectures met implements, by Hugging Face `model_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelType {
    /// `llama` (Llama 2 and 3, SmolLM, TinyLlama, ...).
    Llama,
    /// `mistral`: Llama with a sliding window on every layer.
    Mistral,
    /// `qwen2`: Llama with q/k/v biases.
    Qwen2,
    /// `qwen3`: Llama with per-head RMSNorm on queries and keys.
    Qwen3,
    /// `qwen3_moe`: Qwen3 with routed mixture-of-experts MLPs.
    Qwen3Moe,
}

impl ModelType {
    /// Every supported type.
    pub const ALL: [Self; 5] = [Self::Llama, Self::Mistral, Self::Qwen2, Self::Qwen3, Self::Qwen3Moe];

    /// The Hugging Face `model_type` string.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Mistral => "mistral",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3_moe",
        }
    }

    /// Parses a `model_type` string.
    pub fn from_hf(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The supported types as a comma-separated list, for messages.
    pub fn supported_list() -> String {
        Self::ALL.map(Self::as_str).join(", ")
    }
}

impl fmt::Display for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How rotary frequencies are rescaled for long contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Plain rotary embedding.
    None,
    /// Positions divided by `factor` (every frequency divided by it).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// Llama 3.1's banded scaling: low frequencies divided by `factor`, high ones kept,
    /// the band between them interpolated.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pre-trained with.
        original_max_position_embeddings: usize,
    },
}

/// Rotary position embedding settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    /// Base of the geometric frequency sequence (`rope_theta`).
    pub theta: f64,
    /// Long-context rescaling.
    pub scaling: RopeScaling,
}

/// Mixture-of-experts settings (`qwen3_moe`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// Experts per MoE layer.
    pub num_experts: usize,
    /// Experts each token is routed to.
    pub experts_per_token: usize,
    /// Intermediate size of one expert's MLP.
    pub expert_intermediate_size: usize,
    /// Whether the chosen experts' weights are renormalised to sum to one.
    pub norm_topk_prob: bool,
    /// Per layer: routed experts (`true`) or a dense MLP (`false`).
    pub sparse_layers: Vec<bool>,
}

/// The architecture of a checkpoint, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub model_type: ModelType,
    /// Rows of the embedding table and of the output head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Intermediate size of dense MLPs.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (divides `num_heads`).
    pub num_kv_heads: usize,
    /// Elements per head (not always `hidden_size / num_heads`).
    pub head_dim: usize,
    /// The longest context the model supports.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary embedding settings.
    pub rope: RopeConfig,
    /// Whether the output head reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether the attention output projection has a bias.
    pub o_bias: bool,
    /// Whether the MLP projections have biases.
    pub mlp_bias: bool,
    /// Whether queries and keys get a per-head RMSNorm before rotary (Qwen3).
    pub qk_norm: bool,
    /// Per layer: the sliding attention window, or `None` for full attention.
    pub layer_windows: Vec<Option<usize>>,
    /// Mixture-of-experts settings, for MoE architectures.
    pub moe: Option<MoeConfig>,
    /// Beginning-of-sequence token, when the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens named by the config.
    pub eos_token_ids: Vec<u32>,
    /// The dtype the checkpoint was saved in (`torch_dtype` or `dtype`), if stated.
    pub dtype: Option<String>,
}

impl ModelConfig {
    /// Reads and validates a `config.json`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the first bad field.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_json(path, &read(path)?)
    }

    /// Validates the text of a `config.json`; `path` is used in messages only.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the first bad field.
    pub fn from_json(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let map = Fields::parse(path, text)?;
        parse(&Fields::new(path, &map))
    }

    /// Reads a `config.json` with top-level fields replaced by those of the JSON object
    /// `overrides` (as vLLM's `--hf-overrides`), e.g. `{"num_hidden_layers": 2}`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file (or `--hf-overrides`) and the bad field.
    pub fn from_file_with_overrides(path: &Path, overrides: &str) -> Result<Self, ConfigError> {
        let mut map = Fields::parse(path, &read(path)?)?;
        map.extend(Fields::parse(Path::new("--hf-overrides"), overrides)?);
        parse(&Fields::new(path, &map))
    }

    /// Sliding window of layer `i`, if any.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }
}

fn parse(f: &Fields<'_>) -> Result<ModelConfig, ConfigError> {
    let found = f.str("model_type")?;
    let model_type = ModelType::from_hf(found).ok_or_else(|| ConfigError::UnsupportedModelType {
        path: f.path(),
        found: found.into(),
        supported: ModelType::supported_list(),
    })?;
    if let Some(act) = f.opt_str("hidden_act")?.filter(|a| *a != "silu") {
        return Err(f.invalid("hidden_act", format!("`{act}` is not supported (only silu)")));
    }

    let hidden_size = f.positive("hidden_size")?;
    let num_layers = f.positive("num_hidden_layers")?;
    let num_heads = f.positive("num_attention_heads")?;
    let num_kv_heads = f.opt_usize("num_key_value_heads")?.unwrap_or(num_heads);
    if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(f.invalid(
            "num_key_value_heads",
            format!("{num_kv_heads} does not divide num_attention_heads = {num_heads}"),
        ));
    }
    let head_dim = match (f.opt_usize("head_dim")?, model_type) {
        (Some(d), _) => d,
        // Qwen3's configuration class defaults head_dim to 128 rather than deriving it.
        (None, ModelType::Qwen3) => 128,
        (None, _) => hidden_size / num_heads,
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(f.invalid("head_dim", format!("{head_dim} must be positive and even")));
    }

    let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
    let (qkv_bias, o_bias) = match model_type {
        ModelType::Qwen2 => (true, false),
        ModelType::Mistral => (false, false),
        _ => (attention_bias, attention_bias),
    };
    let moe = parse_moe(f, model_type, num_layers)?;
    let intermediate_size = match (&moe, f.opt_usize("intermediate_size")?) {
        (_, Some(n)) => n,
        (Some(_), None) => 0,
        (None, None) => return Err(ConfigError::Missing { path: f.path(), field: "intermediate_size".into() }),
    };

    Ok(ModelConfig {
        model_type,
        vocab_size: f.positive("vocab_size")?,
        hidden_size,
        intermediate_size,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        max_position_embeddings: f.opt_usize("max_position_embeddings")?.unwrap_or(default_max_positions(model_type)),
        rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(1e-6),
        rope: parse_rope(f)?,
        tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias,
        o_bias,
        mlp_bias: model_type == ModelType::Llama && f.opt_bool("mlp_bias")?.unwrap_or(false),
        qk_norm: matches!(model_type, ModelType::Qwen3 | ModelType::Qwen3Moe),
        layer_windows: parse_windows(f, model_type, num_layers)?,
        moe,
        bos_token_id: token_ids(f, model_type, "bos_token_id", 1)?.first().copied(),
        eos_token_ids: token_ids(f, model_type, "eos_token_id", 2)?,
        dtype: f.opt_str("torch_dtype")?.or(f.opt_str("dtype")?).map(str::to_owned),
    })
}

/// A special-token id field. Llama and Mistral configuration classes default bos to 1
/// and eos to 2 when the key is absent; Qwen's default to none.
fn token_ids(f: &Fields<'_>, t: ModelType, key: &str, llama_default: u32) -> Result<Vec<u32>, ConfigError> {
    match t {
        ModelType::Llama | ModelType::Mistral if !f.has_key(key) => Ok(vec![llama_default]),
        _ => f.ids(key),
    }
}

fn default_max_positions(t: ModelType) -> usize {
    match t {
        ModelType::Llama => 2048,
        ModelType::Mistral => 131_072,
        ModelType::Qwen2 | ModelType::Qwen3 | ModelType::Qwen3Moe => 32_768,
    }
}

/// Rotary settings from either layout: transformers 5's `rope_parameters` object (which
/// carries `rope_theta`), or the classic top-level `rope_theta` plus `rope_scaling`.
fn parse_rope(f: &Fields<'_>) -> Result<RopeConfig, ConfigError> {
    let params = match f.object("rope_parameters")? {
        Some(p) => Some(p),
        None => f.object("rope_scaling")?,
    };
    let theta = match params.as_ref().map(|p| p.opt_f64("rope_theta")).transpose()?.flatten() {
        Some(t) => t,
        None => f.opt_f64("rope_theta")?.unwrap_or(10_000.0),
    };
    if theta.is_nan() || theta <= 0.0 {
        return Err(f.invalid("rope_theta", format!("{theta} must be positive")));
    }
    let Some(p) = params else { return Ok(RopeConfig { theta, scaling: RopeScaling::None }) };
    let kind = match p.opt_str("rope_type")? {
        Some(k) => k,
        None => p.opt_str("type")?.unwrap_or("default"),
    };
    let factor = |p: &Fields<'_>| -> Result<f64, ConfigError> {
        let v = p.opt_f64("factor")?.ok_or_else(|| ConfigError::Missing { path: p.path(), field: p.name("factor") })?;
        if v > 0.0 { Ok(v) } else { Err(p.invalid("factor", format!("{v} must be positive"))) }
    };
    let scaling = match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: factor(&p)? },
        "llama3" => {
            let low = p.opt_f64("low_freq_factor")?.unwrap_or(1.0);
            let high = p.opt_f64("high_freq_factor")?.unwrap_or(4.0);
            if high.is_nan() || low.is_nan() || high <= low || low <= 0.0 {
                return Err(p.invalid(
                    "high_freq_factor",
                    format!("needs high_freq_factor ({high}) > low_freq_factor ({low}) > 0"),
                ));
            }
            let original = match p.opt_usize("original_max_position_embeddings")? {
                Some(n) => n,
                None => f.opt_usize("max_position_embeddings")?.unwrap_or(8192),
            };
            RopeScaling::Llama3 {
                factor: factor(&p)?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            }
        }
        other => {
            let key = if p.get("rope_type").is_some() { "rope_type" } else { "type" };
            return Err(p.invalid(key, format!("rope type `{other}` is not supported (default, linear, llama3)")));
        }
    };
    Ok(RopeConfig { theta, scaling })
}

/// The sliding window of every layer, following each architecture's rule.
fn parse_windows(f: &Fields<'_>, t: ModelType, layers: usize) -> Result<Vec<Option<usize>>, ConfigError> {
    let window = match t {
        ModelType::Llama => None,
        // Mistral's configuration class defaults the window to 4096; only an explicit
        // null means full attention.
        ModelType::Mistral if !f.has_key("sliding_window") => Some(4096),
        ModelType::Mistral => f.opt_usize("sliding_window")?,
        // Qwen configurations null the window unless use_sliding_window is set.
        _ if f.opt_bool("use_sliding_window")?.unwrap_or(false) => f.opt_usize("sliding_window")?,
        _ => None,
    };
    if window == Some(0) {
        return Err(f.invalid("sliding_window", "must be positive, found 0"));
    }
    let Some(w) = window else { return Ok(vec![None; layers]) };
    match t {
        ModelType::Qwen2 | ModelType::Qwen3 => {
            if let Some(types) = f.str_list("layer_types")? {
                if types.len() != layers {
                    return Err(f.invalid("layer_types", format!("has {} entries for {layers} layers", types.len())));
                }
                return Ok(types.iter().map(|k| (*k == "sliding_attention").then_some(w)).collect());
            }
            let first = f.opt_usize("max_window_layers")?.unwrap_or(28);
            Ok((0..layers).map(|i| (i >= first).then_some(w)).collect())
        }
        _ => Ok(vec![Some(w); layers]),
    }
}

fn parse_moe(f: &Fields<'_>, t: ModelType, layers: usize) -> Result<Option<MoeConfig>, ConfigError> {
    if t != ModelType::Qwen3Moe {
        return Ok(None);
    }
    // transformers 5 writes `num_local_experts`; hub checkpoints say `num_experts`.
    let num_experts = match f.get("num_experts") {
        Some(_) => f.positive("num_experts")?,
        None if f.get("num_local_experts").is_some() => f.positive("num_local_experts")?,
        None => f.positive("num_experts")?,
    };
    let experts_per_token = f.positive("num_experts_per_tok")?;
    if experts_per_token > num_experts {
        return Err(
            f.invalid("num_experts_per_tok", format!("{experts_per_token} exceeds num_experts = {num_experts}"))
        );
    }
    let step = f.opt_usize("decoder_sparse_step")?.unwrap_or(1);
    if step == 0 {
        return Err(f.invalid("decoder_sparse_step", "must be positive, found 0"));
    }
    let dense = f.usize_list("mlp_only_layers")?;
    Ok(Some(MoeConfig {
        num_experts,
        experts_per_token,
        expert_intermediate_size: f.positive("moe_intermediate_size")?,
        norm_topk_prob: f.opt_bool("norm_topk_prob")?.unwrap_or(false),
        sparse_layers: (0..layers).map(|i| !dense.contains(&i) && (i + 1) % step == 0).collect(),
    }))
}
