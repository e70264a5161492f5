//! `quantization_config`: how a checkpoint's weights are quantized, read into the few
//! schemes met loads, and refused by name otherwise.
//!
//! Two spellings of the same thing are read: transformers' `fp8` (Qwen's block-wise
//! checkpoints with `weight_block_size`, and per-tensor ones without it) and
//! `compressed-tensors` with float 8-bit weights (per tensor, per output channel or per
//! block). Both store `float8_e4m3fn` weights next to f32 scales. Anything else (GPTQ, AWQ,
//! int4 packs, bitsandbytes, ...) is an error naming the method or the scheme, so a
//! checkpoint met cannot serve is refused before any weight is read.

use crate::ConfigError;
use crate::fields::RawConfig;

/// How a quantized weight's scales cover it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleLayout {
    /// One scale for the whole weight.
    Tensor,
    /// One scale per output row.
    Channel,
    /// One scale per `(rows, columns)` block, the last blocks cut short at the edges.
    Block(usize, usize),
}

/// A checkpoint's weight quantization, as met loads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantConfig {
    /// The `quant_method`, for messages.
    pub method: String,
    /// How the scales cover a weight. `None` for transformers' `fp8` without a block size,
    /// whose scale's shape tells per-tensor from per-channel.
    pub scales: Option<ScaleLayout>,
    /// Whether activations use static scales from the checkpoint (`input_scale`) rather
    /// than scales computed per token.
    pub static_activations: bool,
    /// Modules left unquantized (`modules_to_not_convert`, or compressed-tensors' `ignore`).
    pub unquantized: Vec<String>,
}

impl QuantConfig {
    /// The `quantization_config` of `f`, if any.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`] naming the field for a method or scheme met cannot load.
    pub fn read(f: &RawConfig<'_>) -> Result<Option<Self>, ConfigError> {
        let Some(q) = f.object("quantization_config")? else { return Ok(None) };
        match q.str("quant_method")? {
            "fp8" => Self::read_fp8(&q).map(Some),
            "compressed-tensors" => Self::read_compressed(&q).map(Some),
            other => Err(q.invalid(
                "quant_method",
                format!("`{other}` is not a quantization met loads (it loads `fp8` and float8 `compressed-tensors`)"),
            )),
        }
    }

    /// transformers' `fp8`: e4m3 weights, `weight_block_size` for block scales.
    fn read_fp8(q: &RawConfig<'_>) -> Result<Self, ConfigError> {
        if let Some(fmt) = q.opt_str("fmt")?
            && fmt != "e4m3"
        {
            return Err(q.invalid("fmt", format!("`{fmt}`: met loads e4m3 weights")));
        }
        let scales = match q.usize_list("weight_block_size")?.as_slice() {
            [] => None,
            &[rows, cols] if rows > 0 && cols > 0 => Some(ScaleLayout::Block(rows, cols)),
            other => return Err(q.invalid("weight_block_size", format!("{other:?} is not two positive sizes"))),
        };
        let static_activations = match q.opt_str("activation_scheme")?.unwrap_or("dynamic") {
            "dynamic" => false,
            "static" => true,
            other => return Err(q.invalid("activation_scheme", format!("`{other}` is neither dynamic nor static"))),
        };
        let unquantized = q.str_list("modules_to_not_convert")?.unwrap_or_default();
        Ok(Self {
            method: "fp8".into(),
            scales,
            static_activations,
            unquantized: unquantized.into_iter().map(str::to_owned).collect(),
        })
    }

    /// compressed-tensors: every config group must quantize weights to 8-bit floats the
    /// same way.
    fn read_compressed(q: &RawConfig<'_>) -> Result<Self, ConfigError> {
        let Some(groups) = q.object("config_groups")? else { return Err(q.missing("config_groups")) };
        let mut found: Option<(ScaleLayout, bool)> = None;
        for name in groups.keys() {
            let group = groups.object(&name)?.ok_or_else(|| groups.missing(&name))?;
            let w = group.object("weights")?.ok_or_else(|| group.missing("weights"))?;
            let (bits, kind) = (w.usize("num_bits")?, w.str("type")?);
            if bits != 8 || kind != "float" {
                return Err(w.invalid("type", format!("{bits}-bit {kind} weights: met loads 8-bit float ones")));
            }
            let layout = match w.str("strategy")? {
                "tensor" => ScaleLayout::Tensor,
                "channel" => ScaleLayout::Channel,
                "block" => match w.usize_list("block_structure")?.as_slice() {
                    &[rows, cols] if rows > 0 && cols > 0 => ScaleLayout::Block(rows, cols),
                    other => return Err(w.invalid("block_structure", format!("{other:?} is not two positive sizes"))),
                },
                other => return Err(w.invalid("strategy", format!("`{other}`: met loads tensor, channel and block"))),
            };
            let static_acts = match group.object("input_activations")? {
                Some(a) => !a.opt_bool("dynamic")?.unwrap_or(true),
                None => false,
            };
            match found {
                Some(seen) if seen != (layout, static_acts) => {
                    return Err(groups.invalid(&name, "groups quantize weights differently; met loads one scheme"));
                }
                _ => found = Some((layout, static_acts)),
            }
        }
        let Some((layout, static_acts)) = found else { return Err(q.invalid("config_groups", "is empty")) };
        let ignore = q.str_list("ignore")?.unwrap_or_default();
        Ok(Self {
            method: "compressed-tensors".into(),
            scales: Some(layout),
            static_activations: static_acts,
            unquantized: ignore.into_iter().map(str::to_owned).collect(),
        })
    }
}

#[cfg(test)]
mod tests;
