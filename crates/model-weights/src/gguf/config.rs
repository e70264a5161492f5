//! A Hugging Face `config.json` rebuilt from GGUF metadata.
//!
//! llama.cpp's converter copies the architecture facts of `config.json` into
//! `{arch}.*` keys (`gguf-py`'s `Keys.LLM`, `Keys.Attention`, `Keys.Rope`). This module
//! writes the keys every architecture shares back under the HF names, and the
//! architecture's [`GgufArch::config`] hook its own (MoE routing, Gemma's soft-caps), so
//! that the architecture's config reader (`met_model_layers::models::gguf_config`)
//! applies the same defaults and checks to a GGUF as to a checkpoint directory, and a
//! bad value is reported by the one validator met has. What the metadata does not say is
//! read off the tensors: tied embeddings (no `output.weight`), q/k/v biases, and Llama 3
//! rotary scaling (`rope_freqs.weight`); the hooks read MLP biases and dense MoE layers.
//!
//! Float metadata is stored as f32; it is written back as the shortest decimal that
//! rounds to that f32 (`1e-5`, not `9.999999747378752e-6`), which is the value the
//! original config held.

use serde_json::{Map, Value, json};

use super::arch::{GgufArch, GgufMeta, decimal, insert_opt};
use super::{GgmlType, GgufFile};
use crate::WeightError;

const ARCH_KEY: &str = "general.architecture";
/// The tensor in which llama.cpp stores Llama 3 rotary scaling factors.
const ROPE_FREQS: &str = "rope_freqs.weight";
/// Llama 3 scaling parameters llama.cpp's converter assumes when it writes `rope_freqs`.
const LLAMA3_LOW_FREQ_FACTOR: f64 = 1.0;
const LLAMA3_HIGH_FREQ_FACTOR: f64 = 4.0;
const LLAMA3_ORIGINAL_CONTEXT: u64 = 8192;

/// The architecture of `archs` that `general.architecture` names.
pub(crate) fn arch_of<'a>(file: &GgufFile, archs: &'a [GgufArch]) -> Result<&'a GgufArch, WeightError> {
    let name = file.architecture()?;
    archs.iter().find(|a| a.name == name).ok_or_else(|| {
        let supported = archs.iter().map(|a| a.name).collect::<Vec<_>>().join(", ");
        file.metadata_error(
            ARCH_KEY,
            format!("unsupported architecture `{name}` (met reads {supported}; Mistral GGUFs say llama)"),
        )
    })
}

/// Builds the `config.json` object of the model in `file` (see the module docs).
pub(crate) fn config_json(file: &GgufFile, arch: &GgufArch) -> Result<Value, WeightError> {
    let m = GgufMeta { file, arch };
    let hidden = m.req_u64("embedding_length")?;
    let heads = m.req_u64("attention.head_count")?;
    let layers = layer_count(&m)?;
    let head_dim = match m.opt_u64("attention.key_length")? {
        Some(d) => Some(d),
        None => m.opt_u64("rope.dimension_count")?.or(hidden.checked_div(heads)),
    };
    let mut c = Map::new();
    c.insert("architectures".into(), json!([arch.class]));
    c.insert("model_type".into(), json!(arch.model_type));
    c.insert("hidden_act".into(), json!(arch.hidden_act));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(heads));
    c.insert("num_key_value_heads".into(), json!(m.opt_u64("attention.head_count_kv")?.unwrap_or(heads)));
    insert_opt(&mut c, "head_dim", head_dim);
    let intermediate = match arch.optional_feed_forward {
        true => m.opt_u64("feed_forward_length")?,
        false => Some(m.req_u64("feed_forward_length")?),
    };
    insert_opt(&mut c, "intermediate_size", intermediate);
    insert_opt(&mut c, "max_position_embeddings", m.opt_u64("context_length")?);
    let theta = m.opt_decimal("rope.freq_base")?;
    insert_opt(&mut c, "rope_theta", theta);
    insert_opt(&mut c, "rms_norm_eps", m.opt_decimal("attention.layer_norm_rms_epsilon")?);
    insert_opt(&mut c, "rope_scaling", rope_scaling(&m, theta.unwrap_or(10_000.0), head_dim)?);
    c.insert("vocab_size".into(), json!(vocab_size(&m)?));
    c.insert("tie_word_embeddings".into(), json!(file.tensor("output.weight").is_none()));
    c.insert("attention_bias".into(), json!(file.tensor("blk.0.attn_q.bias").is_some()));
    insert_opt(&mut c, "bos_token_id", file.opt_u64("tokenizer.ggml.bos_token_id")?);
    insert_opt(&mut c, "eos_token_id", file.opt_u64("tokenizer.ggml.eos_token_id")?);
    if let Some(hook) = arch.config {
        hook(&m, &mut c)?;
    }
    Ok(Value::Object(c))
}

/// The decoder layers: `block_count` less the `nextn_predict_layers` blocks that
/// llama.cpp appends after them for multi-token prediction (met does not read those),
/// bounded by the tensors present so that a corrupt count cannot make later per-layer
/// tables huge (every layer has at least one tensor).
pub(crate) fn layer_count(m: &GgufMeta<'_>) -> Result<u64, WeightError> {
    let blocks = m.req_u64("block_count")?;
    let tensors = m.file.tensors().len() as u64;
    if blocks > tensors {
        let msg = format!("{blocks} layers, but the file holds only {tensors} tensors");
        return Err(m.file.metadata_error(&m.key("block_count"), msg));
    }
    let nextn = m.opt_u64("nextn_predict_layers")?.unwrap_or(0);
    if nextn >= blocks && nextn > 0 {
        let msg = format!("{nextn} of the {blocks} blocks would be prediction heads, leaving no decoder layer");
        return Err(m.file.metadata_error(&m.key("nextn_predict_layers"), msg));
    }
    Ok(blocks - nextn)
}

/// The first block past the decoder layers when the file appends multi-token-prediction
/// blocks (`nextn_predict_layers`), whose tensors met leaves unread.
pub(crate) fn first_prediction_block(file: &GgufFile, arch: &GgufArch) -> Result<Option<usize>, WeightError> {
    let m = GgufMeta { file, arch };
    match m.opt_u64("nextn_predict_layers")? {
        Some(n) if n > 0 => Ok(Some(layer_count(&m)? as usize)),
        _ => Ok(None),
    }
}

/// `{arch}.vocab_size`, else the tokenizer's token count, else the embedding rows.
fn vocab_size(m: &GgufMeta<'_>) -> Result<u64, WeightError> {
    if let Some(n) = m.opt_u64("vocab_size")? {
        return Ok(n);
    }
    if m.file.get("tokenizer.ggml.tokens").is_some() {
        return Ok(m.file.get_array("tokenizer.ggml.tokens")?.len() as u64);
    }
    match m.file.tensor("token_embd.weight").and_then(|t| t.dims.get(1)) {
        Some(&rows) => Ok(rows as u64),
        None => Err(m.file.metadata_error(&m.key("vocab_size"), "missing, and no tokenizer.ggml.tokens either")),
    }
}

/// `rope_scaling` from `rope.scaling.*` keys, or inferred from `rope_freqs.weight`.
fn rope_scaling(m: &GgufMeta<'_>, theta: f64, head_dim: Option<u64>) -> Result<Option<Value>, WeightError> {
    let original = m.opt_u64("rope.scaling.original_context_length")?;
    match m.file.opt_str(&m.key("rope.scaling.type"))? {
        None | Some("none") => llama3_from_rope_freqs(m, theta, head_dim, original),
        Some(kind) => {
            let mut s = Map::new();
            s.insert("rope_type".into(), json!(kind));
            insert_opt(&mut s, "factor", m.opt_decimal("rope.scaling.factor")?);
            insert_opt(&mut s, "original_max_position_embeddings", original);
            Ok(Some(Value::Object(s)))
        }
    }
}

/// Llama 3 scaling from the per-frequency factors llama.cpp stores in `rope_freqs.weight`.
///
/// The converter writes the factors and none of the parameters. The factor is their
/// maximum; the others are the converter's defaults, and the factors they imply are
/// checked against the stored ones, so other parameters fail loudly instead of
/// producing wrong positions.
fn llama3_from_rope_freqs(
    m: &GgufMeta<'_>,
    theta: f64,
    head_dim: Option<u64>,
    original: Option<u64>,
) -> Result<Option<Value>, WeightError> {
    let Some(info) = m.file.tensor(ROPE_FREQS) else { return Ok(None) };
    let bad = |msg: String| WeightError::Format { path: m.file.path().into(), msg: format!("`{ROPE_FREQS}`: {msg}") };
    let data = m.file.tensor_data(ROPE_FREQS).unwrap_or_default();
    if info.ggml_type != GgmlType::F32 {
        return Err(bad(format!("stored as {}, expected F32", info.ggml_type)));
    }
    let stored: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let dim = head_dim.unwrap_or(0);
    if stored.len() as u64 * 2 != dim {
        return Err(bad(format!("{} factors for a head dim of {dim}", stored.len())));
    }
    let factor = decimal(stored.iter().copied().fold(f32::MIN, f32::max));
    let original = original.unwrap_or(LLAMA3_ORIGINAL_CONTEXT);
    let expected = llama3_factors(theta, stored.len(), factor, original as f64);
    let matches = stored.iter().zip(&expected).all(|(&s, &e)| (f64::from(s) - e).abs() <= 1e-4 * e.abs().max(1.0));
    if !matches {
        return Err(bad(format!(
            "the factors are not Llama 3 scaling with factor {factor}, low_freq_factor {LLAMA3_LOW_FREQ_FACTOR}, \
             high_freq_factor {LLAMA3_HIGH_FREQ_FACTOR} and original context {original}; \
             met cannot recover the rotary scaling they encode"
        )));
    }
    Ok(Some(json!({
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
        "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": original,
    })))
}

/// The divisor of each of `n` rotary frequencies under Llama 3 scaling, as llama.cpp's
/// converter computes them: 1 for short wavelengths, `factor` for long ones, and a
/// smooth blend between.
fn llama3_factors(theta: f64, n: usize, factor: f64, original: f64) -> Vec<f64> {
    let low_wavelen = original / LLAMA3_LOW_FREQ_FACTOR;
    let high_wavelen = original / LLAMA3_HIGH_FREQ_FACTOR;
    (0..n)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f64 / (2 * n) as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth =
                    (original / wavelen - LLAMA3_LOW_FREQ_FACTOR) / (LLAMA3_HIGH_FREQ_FACTOR - LLAMA3_LOW_FREQ_FACTOR);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimal_recovers_the_config_value() {
        assert_eq!(decimal(1e-5), 1e-5);
        assert_eq!(decimal(1e-6), 1e-6);
        assert_eq!(decimal(100_000.0), 100_000.0);
        assert_eq!(decimal(0.1), 0.1);
    }

    #[test]
    fn llama3_factors_cover_the_three_bands() {
        // Llama 3.1: theta 500000, head dim 128, factor 8.
        let f = llama3_factors(500_000.0, 64, 8.0, 8192.0);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0));
        assert!(f.windows(2).all(|w| w[0] <= w[1]), "factors grow with wavelength");
    }
}
