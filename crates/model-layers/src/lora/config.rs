//! `adapter_config.json` as PEFT writes it, read into what met applies: the rank, the
//! scale and the target modules. Anything that would change the math met does not do
//! (DoRA, biases, per-module ranks, extra trained modules, transposed weights) is refused
//! by name rather than ignored, so an adapter either runs as PEFT runs it or not at all.

use std::path::Path;

use serde_json::Value;

use super::LoraModule;

/// The settings of one adapter that shape its computation.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AdapterConfig {
    /// `r`.
    pub rank: usize,
    /// `lora_alpha / r`, or `lora_alpha / √r` with `use_rslora` (PEFT's `scaling`).
    pub scale: f32,
    /// The modules it adapts.
    pub targets: Vec<LoraModule>,
}

impl AdapterConfig {
    /// Reads `dir/adapter_config.json`.
    ///
    /// # Errors
    /// A message naming the file, the field and what is wrong with it.
    pub fn read(dir: &Path) -> Result<Self, String> {
        let path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", path.display()))?;
        Self::parse(&json).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn parse(json: &Value) -> Result<Self, String> {
        if let Some(kind) = json.get("peft_type").and_then(Value::as_str).filter(|k| *k != "LORA") {
            return Err(format!("`peft_type` is {kind}; met serves LORA adapters only"));
        }
        refuse_unsupported(json)?;
        let rank = json.get("r").and_then(Value::as_u64).filter(|&r| r > 0).ok_or("`r` must be a positive integer")?;
        let alpha = json.get("lora_alpha").and_then(Value::as_f64).ok_or("`lora_alpha` must be a number")?;
        let rslora = json.get("use_rslora").and_then(Value::as_bool).unwrap_or(false);
        let rank = rank as usize;
        let scale = if rslora { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 } as f32;
        Ok(Self { rank, scale, targets: targets(json)? })
    }
}

/// The fields whose non-default values met does not implement.
fn refuse_unsupported(json: &Value) -> Result<(), String> {
    let set = |key: &str| match json.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => s != "none",
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    };
    let unsupported =
        ["use_dora", "fan_in_fan_out", "bias", "lora_bias", "rank_pattern", "alpha_pattern", "modules_to_save"];
    match unsupported.iter().find(|k| set(k)) {
        Some(key) => Err(format!("`{key}` is set, which met does not support for LoRA adapters")),
        None => Ok(()),
    }
}

/// `target_modules`: a list of module names, each one met adapts.
fn targets(json: &Value) -> Result<Vec<LoraModule>, String> {
    let list = json
        .get("target_modules")
        .and_then(Value::as_array)
        .ok_or("`target_modules` must be a list of module names")?;
    list.iter()
        .map(|v| {
            let name = v.as_str().unwrap_or_default();
            LoraModule::from_name(name).ok_or_else(|| {
                let known = LoraModule::ALL.map(LoraModule::name).join(", ");
                format!("target module `{name}` is not one met applies adapters to ({known})")
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AdapterConfig, String> {
        AdapterConfig::parse(&serde_json::from_str(text).unwrap())
    }

    #[test]
    fn reads_rank_scale_and_targets() {
        let c = parse(r#"{"r": 16, "lora_alpha": 8, "use_rslora": true, "target_modules": ["q_proj", "down_proj"], "bias": "none"}"#).unwrap();
        assert_eq!((c.rank, c.scale), (16, 2.0));
        assert_eq!(c.targets, [LoraModule::Q, LoraModule::Down]);
        assert_eq!(parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["v_proj"]}"#).unwrap().scale, 2.0);
    }

    #[test]
    fn refuses_what_met_does_not_compute() {
        let err = parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["lm_head"]}"#).unwrap_err();
        assert!(err.contains("`lm_head`"), "{err}");
        let err = parse(r#"{"r": 8, "lora_alpha": 16, "use_dora": true, "target_modules": ["q_proj"]}"#).unwrap_err();
        assert!(err.contains("use_dora"), "{err}");
        assert!(parse(r#"{"r": 0, "lora_alpha": 16, "target_modules": ["q_proj"]}"#).unwrap_err().contains("`r`"));
    }
}
