//! The recipe of hybrid linear-attention models (Qwen3-Next, Qwen3.5/3.6): which layers
//! mix tokens with a Gated DeltaNet instead of attention, and that layer's shape.
//!
//! Read from `layer_types` (`linear_attention` / `full_attention`) or, where a config lacks
//! it, `full_attention_interval` (every `n`-th layer attends, the rest are linear), and the
//! `linear_*` dimensions. The delta-rule state is kept in f32 whatever `mamba_ssm_dtype`
//! says, so a config asking for less precision is refused rather than half-served.

use crate::{ConfigError, RawConfig};

/// How a checkpoint stores a Gated DeltaNet layer's input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GdnProjections {
    /// Qwen3-Next: `in_proj_qkvz` and `in_proj_ba`, rows grouped per key head
    /// (`[q, k, v…, z…]` and `[b…, a…]` for each).
    Grouped,
    /// Qwen3.5: `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a`, head-major.
    Separate,
}

/// Gated DeltaNet layers of a hybrid model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinearAttentionConfig {
    /// Per layer: whether it is a Gated DeltaNet layer (else gated full attention).
    pub layers: Vec<bool>,
    /// Query/key heads `h_k`.
    pub num_key_heads: usize,
    /// Value heads `h_v` (a multiple of `h_k`).
    pub num_value_heads: usize,
    /// Elements per key head.
    pub key_head_dim: usize,
    /// Elements per value head.
    pub value_head_dim: usize,
    /// Width of the causal depthwise convolution.
    pub conv_kernel: usize,
    /// How the checkpoint stores the input projections.
    pub projections: GdnProjections,
}

impl LinearAttentionConfig {
    /// Reads the linear-attention fields of a config with `layers` layers.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the first bad field.
    pub fn read(f: &RawConfig<'_>, layers: usize, projections: GdnProjections) -> Result<Self, ConfigError> {
        let kinds = match f.str_list("layer_types")? {
            Some(types) => {
                if types.len() != layers {
                    return Err(f.invalid("layer_types", format!("has {} entries for {layers} layers", types.len())));
                }
                types
                    .iter()
                    .map(|t| match *t {
                        "linear_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        other => Err(f.invalid("layer_types", format!("unknown layer type `{other}`"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?
            }
            None => {
                let every = f.positive("full_attention_interval")?;
                (0..layers).map(|i| (i + 1) % every != 0).collect()
            }
        };
        let num_key_heads = f.positive("linear_num_key_heads")?;
        let num_value_heads = f.positive("linear_num_value_heads")?;
        if num_value_heads % num_key_heads != 0 {
            let msg = format!("{num_value_heads} is not a multiple of linear_num_key_heads = {num_key_heads}");
            return Err(f.invalid("linear_num_value_heads", msg));
        }
        let conv_kernel = f.positive("linear_conv_kernel_dim")?;
        if conv_kernel < 2 {
            return Err(f.invalid("linear_conv_kernel_dim", format!("{conv_kernel} must be at least 2")));
        }
        if let Some(dtype) = f.opt_str("mamba_ssm_dtype")?
            && dtype != "float32"
        {
            let msg = format!("`{dtype}`: met keeps the recurrent state in float32 only");
            return Err(f.invalid("mamba_ssm_dtype", msg));
        }
        Ok(Self {
            layers: kinds,
            num_key_heads,
            num_value_heads,
            key_head_dim: f.positive("linear_key_head_dim")?,
            value_head_dim: f.positive("linear_value_head_dim")?,
            conv_kernel,
            projections,
        })
    }

    /// Whether layer `i` is a Gated DeltaNet layer.
    pub fn is_linear(&self, i: usize) -> bool {
        self.layers.get(i).copied().unwrap_or(false)
    }

    /// Channels of the convolution: queries, keys and values.
    pub fn conv_dim(&self) -> usize {
        2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim
    }

    /// Width of all value heads together (the output gate `z`, the output projection's
    /// input).
    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }
}
