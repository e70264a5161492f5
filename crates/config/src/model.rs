//! `ModelConfig`: the architecture facts of a checkpoint, and the shared reads that build it.
//!
//! Each architecture reads its own `config.json` (in `met-model-layers`' `models/<arch>.rs`,
//! the one file that knows the family): it starts from [`ModelConfig::read_common`], the
//! fields every decoder-only transformer shares, read with the defaults it passes
//! ([`ArchDefaults`]), then applies the family's own rules (biases, windows, norms,
//! soft-caps, experts). Defaults follow the transformers configuration class of each
//! model type, so a `config.json` that omits a field means what it means to transformers.
//! The result is the recipe the shared decoder is built from: nothing later re-reads the
//! JSON or asks which family it is.

use crate::ConfigError;
use crate::fields::RawConfig;

/// The gated MLP's activation (`hidden_act` / `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu` (SwiGLU).
    Silu,
    /// `gelu_pytorch_tanh`: GELU with PyTorch's tanh approximation (GeGLU, Gemma).
    GeluTanh,
}

impl Activation {
    /// The activation named by `key`, `default` when absent.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `key` for an activation met does not implement.
    pub fn read(f: &RawConfig<'_>, key: &str, default: Self) -> Result<Self, ConfigError> {
        match f.opt_str(key)? {
            None => Ok(default),
            Some("silu") => Ok(Self::Silu),
            Some("gelu_pytorch_tanh") => Ok(Self::GeluTanh),
            Some(other) => Err(f.invalid(key, format!("`{other}` is not supported (silu, gelu_pytorch_tanh)"))),
        }
    }
}

/// How an RMSNorm applies its weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormWeight {
    /// `w · x̂`, the normalised value cast to the model dtype first (`LlamaRMSNorm`).
    Plain,
    /// `(1 + w) · x̂` in f32, cast after (`GemmaRMSNorm`; weights are stored around 0).
    UnitOffset,
}

/// Where a layer's norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// Before attention and before the MLP (Llama).
    Pre,
    /// Also after each branch, before its residual add (Gemma 2 and 3: four norms).
    Sandwich,
}

/// What an architecture's configuration class assumes when `config.json` is silent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArchDefaults {
    /// `head_dim` when absent; `None` derives `hidden_size / num_attention_heads`.
    pub head_dim: Option<usize>,
    /// `max_position_embeddings` when absent.
    pub max_position_embeddings: usize,
    /// `(bos_token_id, eos_token_id)` when the keys are absent; `None` for no tokens.
    pub special_tokens: Option<(u32, u32)>,
    /// `rms_norm_eps` when absent.
    pub rms_norm_eps: f64,
    /// `intermediate_size` when absent; `None` makes it required (MoE models may omit it).
    pub intermediate_size: Option<usize>,
}

impl Default for ArchDefaults {
    fn default() -> Self {
        Self {
            head_dim: None,
            max_position_embeddings: 2048,
            special_tokens: None,
            rms_norm_eps: 1e-6,
            intermediate_size: None,
        }
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
    /// Intermediate size of the shared expert every token also runs, scaled by a sigmoid
    /// gate of its own (Qwen2-MoE, Qwen3-Next); `None` without one.
    pub shared_expert_intermediate_size: Option<usize>,
    /// Per layer: routed experts (`true`) or a dense MLP (`false`).
    pub sparse_layers: Vec<bool>,
}

/// The architecture of a checkpoint, validated: its dimensions and the recipe of its layers.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The Hugging Face `model_type` (the registry key of its architecture).
    pub model_type: String,
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
    /// Rotary embedding settings of full-attention layers (all layers, unless
    /// `layer_rope` says otherwise).
    pub rope: RopeConfig,
    /// Whether the output head reuses the embedding table.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases.
    pub qkv_bias: bool,
    /// Whether the attention output projection has a bias.
    pub o_bias: bool,
    /// Whether the MLP projections have biases.
    pub mlp_bias: bool,
    /// Whether queries and keys get a per-head RMSNorm before rotary (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// Per layer: the sliding attention window, or `None` for full attention.
    pub layer_windows: Vec<Option<usize>>,
    /// Per layer: the rotary settings (Gemma 3's local layers use another base).
    pub layer_rope: Vec<RopeConfig>,
    /// Mixture-of-experts settings, for MoE architectures.
    pub moe: Option<MoeConfig>,
    /// The gated MLP's activation.
    pub activation: Activation,
    /// How every RMSNorm (q/k norms included) applies its weight.
    pub norm_weight: NormWeight,
    /// Where each layer's norms sit.
    pub norm_placement: NormPlacement,
    /// Whether embeddings are multiplied by `√hidden_size` (Gemma), in the model dtype.
    pub scale_embeddings: bool,
    /// The multiplier of `q·k`; `None` for `head_dim^-0.5`.
    pub attention_scale: Option<f64>,
    /// Attention scores become `cap · tanh(score / cap)` (Gemma 2).
    pub attention_softcap: Option<f64>,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 2).
    pub final_softcap: Option<f64>,
    /// Beginning-of-sequence token, when the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens named by the config.
    pub eos_token_ids: Vec<u32>,
    /// The dtype the checkpoint was saved in (`torch_dtype` or `dtype`), if stated.
    pub dtype: Option<String>,
    /// Elements of each head that rotary rotates, from the front (`partial_rotary_factor`
    /// of `head_dim`); the rest pass through.
    pub rotary_dim: usize,
    /// Gated attention: the query projection also yields a per-element gate, and the
    /// attention output is multiplied by its sigmoid before `o_proj` (Qwen3-Next, 3.5).
    pub attn_output_gate: bool,
    /// Hybrid models: the Gated DeltaNet layers.
    pub linear_attention: Option<crate::LinearAttentionConfig>,
    /// Where a vision-language checkpoint keeps its text model (`model.language_model.`),
    /// read as if under `model.`; `None` for a text-only checkpoint.
    pub text_prefix: Option<String>,
    /// How the checkpoint's weights are quantized; `None` for plain float weights.
    pub quantization: Option<crate::QuantConfig>,
}

impl ModelConfig {
    /// The fields every decoder shares, read from `f` with `defaults`: dimensions, eps,
    /// rotary settings (both layouts, the same on every layer), tied embeddings, biases
    /// from `attention_bias` (q/k/v/o) and `mlp_bias`, a `hidden_act` that must be one met
    /// implements (SiLU when absent), special tokens and dtype. No windows, no q/k norm,
    /// no experts, Llama's norms: an architecture changes what differs.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the file and the first bad field.
    pub fn read_common(f: &RawConfig<'_>, defaults: &ArchDefaults) -> Result<Self, ConfigError> {
        let model_type = f.str("model_type")?.to_owned();
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
        let head_dim = match f.opt_usize("head_dim")? {
            Some(d) => d,
            None => defaults.head_dim.unwrap_or(hidden_size / num_heads),
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(f.invalid("head_dim", format!("{head_dim} must be positive and even")));
        }
        let attention_bias = f.opt_bool("attention_bias")?.unwrap_or(false);
        let rope = RopeConfig::read(f)?;
        let tokens = |key: &str, default: Option<u32>| -> Result<Vec<u32>, ConfigError> {
            match default {
                Some(id) if !f.has_key(key) => Ok(vec![id]),
                _ => f.ids(key),
            }
        };
        let (bos, eos) = defaults.special_tokens.unzip();
        Ok(Self {
            model_type,
            vocab_size: f.positive("vocab_size")?,
            hidden_size,
            intermediate_size: match (f.opt_usize("intermediate_size")?, defaults.intermediate_size) {
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => return Err(f.missing("intermediate_size")),
            },
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            max_position_embeddings: f
                .opt_usize("max_position_embeddings")?
                .unwrap_or(defaults.max_position_embeddings),
            rms_norm_eps: f.opt_f64("rms_norm_eps")?.unwrap_or(defaults.rms_norm_eps),
            rope,
            tie_word_embeddings: f.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            qkv_bias: attention_bias,
            o_bias: attention_bias,
            mlp_bias: f.opt_bool("mlp_bias")?.unwrap_or(false),
            qk_norm: false,
            layer_windows: vec![None; num_layers],
            layer_rope: vec![rope; num_layers],
            moe: None,
            activation: Activation::read(f, "hidden_act", Activation::Silu)?,
            norm_weight: NormWeight::Plain,
            norm_placement: NormPlacement::Pre,
            scale_embeddings: false,
            attention_scale: None,
            attention_softcap: None,
            final_softcap: None,
            bos_token_id: tokens("bos_token_id", bos)?.first().copied(),
            eos_token_ids: tokens("eos_token_id", eos)?,
            dtype: f.opt_str("torch_dtype")?.or(f.opt_str("dtype")?).map(str::to_owned),
            rotary_dim: head_dim,
            attn_output_gate: false,
            linear_attention: None,
            text_prefix: None,
            quantization: crate::QuantConfig::read(f)?,
        })
    }

    /// Sliding window of layer `i`, if any.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }

    /// Per-layer windows from `layer_types` (`sliding_attention` gets `window`), when the
    /// key is present.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `layer_types` when its length is not the layer count.
    pub fn windows_from_layer_types(
        f: &RawConfig<'_>,
        layers: usize,
        window: usize,
    ) -> Result<Option<Vec<Option<usize>>>, ConfigError> {
        let Some(types) = f.str_list("layer_types")? else { return Ok(None) };
        if types.len() != layers {
            return Err(f.invalid("layer_types", format!("has {} entries for {layers} layers", types.len())));
        }
        Ok(Some(types.iter().map(|k| (*k == "sliding_attention").then_some(window)).collect()))
    }

    /// A positive `sliding_window`, if set.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] for 0 or a non-integer.
    pub fn sliding_window(f: &RawConfig<'_>) -> Result<Option<usize>, ConfigError> {
        match f.opt_usize("sliding_window")? {
            Some(0) => Err(f.invalid("sliding_window", "must be positive, found 0")),
            w => Ok(w),
        }
    }

    /// An optional positive number (a soft-cap or a scalar).
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming `key` for zero, a negative or a non-number.
    pub fn positive_f64(f: &RawConfig<'_>, key: &str) -> Result<Option<f64>, ConfigError> {
        match f.opt_f64(key)? {
            Some(v) if v.is_nan() || v <= 0.0 => Err(f.invalid(key, format!("{v} must be positive"))),
            v => Ok(v),
        }
    }
}

impl RopeConfig {
    /// Rotary settings from either layout: transformers 5's `rope_parameters` object (which
    /// carries `rope_theta`), or the classic top-level `rope_theta` plus `rope_scaling`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the bad field (`rope_scaling.factor`).
    pub fn read(f: &RawConfig<'_>) -> Result<Self, ConfigError> {
        let params = match f.object("rope_parameters")? {
            Some(p) => Some(p),
            None => f.object("rope_scaling")?,
        };
        let theta = match params.as_ref().map(|p| p.opt_f64("rope_theta")).transpose()?.flatten() {
            Some(t) => t,
            None => f.opt_f64("rope_theta")?.unwrap_or(10_000.0),
        };
        Self::read_scaling(f, params.as_ref(), theta)
    }

    /// Rotary settings of base `theta`, scaled as the object `params` says (`rope_type` or
    /// `type`: default, linear, llama3); `f` is the top-level config, for
    /// `max_position_embeddings`.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the bad field.
    pub fn read_scaling(f: &RawConfig<'_>, params: Option<&RawConfig<'_>>, theta: f64) -> Result<Self, ConfigError> {
        if theta.is_nan() || theta <= 0.0 {
            return Err(f.invalid("rope_theta", format!("{theta} must be positive")));
        }
        let Some(p) = params else { return Ok(Self { theta, scaling: RopeScaling::None }) };
        let kind = match p.opt_str("rope_type")? {
            Some(k) => k,
            None => p.opt_str("type")?.unwrap_or("default"),
        };
        let factor = |p: &RawConfig<'_>| -> Result<f64, ConfigError> {
            let v =
                p.opt_f64("factor")?.ok_or_else(|| ConfigError::Missing { path: p.path(), field: p.name("factor") })?;
            if v > 0.0 { Ok(v) } else { Err(p.invalid("factor", format!("{v} must be positive"))) }
        };
        let scaling = match kind {
            "default" => RopeScaling::None,
            "linear" => RopeScaling::Linear { factor: factor(p)? },
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
                    factor: factor(p)?,
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
        Ok(Self { theta, scaling })
    }
}
