//! `adapter_config.json` as PEFT writes it, read into what met applies: the rank, the
//! scale, the target modules and expert parameters, and the per-module ranks and alphas
//! of `rank_pattern` / `alpha_pattern`. Anything that would change the math met does not
//! do (DoRA, biases, extra trained modules, transposed weights) is refused by name rather
//! than ignored, so an adapter either runs as PEFT runs it or not at all.

use std::path::Path;

use regex::Regex;
use serde_json::Value;

use super::module::LoraModule;

/// A stacked expert weight an adapter can target as PEFT's `target_parameters` names it
/// (transformers' fused experts: `mlp.experts.gate_up_proj`, `mlp.experts.down_proj`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExpertParam {
    /// `gate_up_proj [e, 2i, h]`.
    GateUp,
    /// `down_proj [e, h, i]`.
    Down,
}

impl ExpertParam {
    /// PEFT's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::GateUp => "gate_up_proj",
            Self::Down => "down_proj",
        }
    }
}

/// The settings of one adapter that shape its computation.
#[derive(Debug, Clone)]
pub(crate) struct AdapterConfig {
    /// `r`.
    pub rank: usize,
    /// `lora_alpha / r`, or `lora_alpha / √r` with `use_rslora` (PEFT's `scaling`).
    pub scale: f32,
    /// The PEFT modules it adapts, by name (`target_modules`, and the router where
    /// `target_parameters` names `gate.weight`).
    targets: Vec<String>,
    /// The expert parameters it adapts (`target_parameters`).
    pub expert_targets: Vec<ExpertParam>,
    alpha: f64,
    rslora: bool,
    rank_pattern: Vec<(Regex, usize)>,
    alpha_pattern: Vec<(Regex, f64)>,
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
        let scale = scaling(alpha, rank, rslora);
        let rank_pattern = pattern(json, "rank_pattern", |v| v.as_u64().filter(|&r| r > 0).map(|r| r as usize))?;
        let alpha_pattern = pattern(json, "alpha_pattern", Value::as_f64)?;
        let (expert_targets, router) = expert_targets(json)?;
        let mut targets = targets(json)?;
        if router {
            targets.push(LoraModule::Router.name().to_owned());
        }
        if targets.is_empty() && expert_targets.is_empty() {
            return Err("neither `target_modules` nor `target_parameters` names anything to adapt".into());
        }
        Ok(Self { rank, scale, targets, expert_targets, alpha, rslora, rank_pattern, alpha_pattern })
    }

    /// Whether it adapts the PEFT module named `name` (its last name: `q_proj`).
    pub fn targets(&self, name: &str) -> bool {
        self.targets.iter().any(|t| t == name)
    }

    /// The rank of the module or parameter PEFT names `name` (`model.layers.0.self_attn.q_proj`,
    /// `model.layers.0.mlp.experts.gate_up_proj`): its `rank_pattern` entry, else `r`.
    ///
    /// # Errors
    /// When keys with different values match it.
    pub fn rank_of(&self, name: &str) -> Result<usize, String> {
        Ok(matching(&self.rank_pattern, name, "rank_pattern")?.unwrap_or(self.rank))
    }

    /// PEFT's `scaling` of the module or parameter `name`, from its rank and its
    /// `alpha_pattern` entry (else `lora_alpha`).
    ///
    /// # Errors
    /// As [`Self::rank_of`].
    pub fn scale_of(&self, name: &str) -> Result<f32, String> {
        let alpha = matching(&self.alpha_pattern, name, "alpha_pattern")?.unwrap_or(self.alpha);
        Ok(scaling(alpha, self.rank_of(name)?, self.rslora))
    }
}

/// PEFT's `scaling`: `alpha / r`, or `alpha / √r` for rank-stabilised adapters.
fn scaling(alpha: f64, rank: usize, rslora: bool) -> f32 {
    (if rslora { alpha / (rank as f64).sqrt() } else { alpha / rank as f64 }) as f32
}

/// The value of the one key of `patterns` that matches `name` as PEFT matches them (the key
/// a regular expression for a suffix of `name` after a dot, or all of it), if any.
fn matching<T: Copy + PartialEq>(patterns: &[(Regex, T)], name: &str, field: &str) -> Result<Option<T>, String> {
    let mut found: Option<T> = None;
    for (re, v) in patterns.iter().filter(|(re, _)| re.is_match(name)) {
        if found.is_some_and(|f| f != *v) {
            return Err(format!("`{field}` has keys with different values matching `{name}` (`{}`)", re.as_str()));
        }
        found = Some(*v);
    }
    Ok(found)
}

/// A `rank_pattern` or `alpha_pattern` object: each key compiled as PEFT matches it, each
/// value read by `value`.
fn pattern<T>(json: &Value, field: &str, value: impl Fn(&Value) -> Option<T>) -> Result<Vec<(Regex, T)>, String> {
    let Some(map) = json.get(field).and_then(Value::as_object) else { return Ok(Vec::new()) };
    map.iter()
        .map(|(key, v)| {
            let re = Regex::new(&format!("^(?:.*\\.)?(?:{key})$"))
                .map_err(|e| format!("`{field}` key `{key}` is not a regular expression met reads: {e}"))?;
            let v = value(v).ok_or_else(|| format!("`{field}` value of `{key}` is not a positive number"))?;
            Ok((re, v))
        })
        .collect()
}

/// `target_parameters`: the stacked expert weights it adapts, by their last name, and
/// whether it names the router's weight (`gate.weight`).
fn expert_targets(json: &Value) -> Result<(Vec<ExpertParam>, bool), String> {
    let Some(list) = json.get("target_parameters").filter(|v| !v.is_null()) else { return Ok((Vec::new(), false)) };
    let list = list.as_array().ok_or("`target_parameters` must be a list of parameter names")?;
    let (mut params, mut router) = (Vec::new(), false);
    for v in list {
        let name = v.as_str().unwrap_or_default();
        if name == "gate.weight" || name.ends_with(".gate.weight") {
            router = true;
            continue;
        }
        let last = name.rsplit('.').next().unwrap_or_default();
        let param =
            [ExpertParam::GateUp, ExpertParam::Down].into_iter().find(|p| p.name() == last).ok_or_else(|| {
                format!(
                    "target parameter `{name}` is not one met applies adapters to (the experts' gate_up_proj and \
                 down_proj, the router's gate.weight)"
                )
            })?;
        params.push(param);
    }
    Ok((params, router))
}

/// PEFT's names of the modules met adapts: each of its projections' (but the gate half of
/// gated attention's `q_proj`, which PEFT's `q_proj` holds), and Qwen3-Next's grouped
/// Gated DeltaNet projections.
fn peft_names() -> impl Iterator<Item = &'static str> {
    LoraModule::ALL
        .into_iter()
        .filter(|&m| m != LoraModule::QGate)
        .map(LoraModule::name)
        .chain(["in_proj_qkvz", "in_proj_ba"])
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
    let unsupported = ["use_dora", "fan_in_fan_out", "bias", "lora_bias", "modules_to_save", "layers_to_transform"];
    match unsupported.iter().find(|k| set(k)) {
        Some(key) => Err(format!("`{key}` is set, which met does not support for LoRA adapters")),
        None => Ok(()),
    }
}

/// `target_modules`: a list of module names, each one met adapts.
fn targets(json: &Value) -> Result<Vec<String>, String> {
    let list = match json.get("target_modules") {
        Some(Value::Array(list)) => list,
        None | Some(Value::Null) if json.get("target_parameters").is_some_and(Value::is_array) => return Ok(Vec::new()),
        _ => return Err("`target_modules` must be a list of module names".into()),
    };
    list.iter()
        .map(|v| {
            let name = v.as_str().unwrap_or_default();
            if peft_names().any(|n| n == name) {
                Ok(name.to_owned())
            } else {
                let known: Vec<&str> = peft_names().collect();
                Err(format!("target module `{name}` is not one met applies adapters to ({})", known.join(", ")))
            }
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
        assert!(c.targets("q_proj") && c.targets("down_proj") && !c.targets("k_proj"));
        assert_eq!(parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["v_proj"]}"#).unwrap().scale, 2.0);
    }

    #[test]
    fn refuses_what_met_does_not_compute() {
        let err = parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["lm_head"]}"#).unwrap_err();
        assert!(err.contains("`lm_head`"), "{err}");
        let err = parse(r#"{"r": 8, "lora_alpha": 16, "use_dora": true, "target_modules": ["q_proj"]}"#).unwrap_err();
        assert!(err.contains("use_dora"), "{err}");
        assert!(parse(r#"{"r": 0, "lora_alpha": 16, "target_modules": ["q_proj"]}"#).unwrap_err().contains("`r`"));
        let err =
            parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": [], "target_parameters": ["embed_tokens.weight"]}"#)
                .unwrap_err();
        assert!(err.contains("`embed_tokens.weight`"), "{err}");
        let err = parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": []}"#).unwrap_err();
        assert!(err.contains("names anything to adapt"), "{err}");
        let err =
            parse(r#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"], "rank_pattern": {"(": 4}}"#).unwrap_err();
        assert!(err.contains("rank_pattern"), "{err}");
    }

    /// PEFT's conversion of `target_modules` gate/up/down on fused experts: the fused
    /// gate/up parameter at twice the rank and alpha, so the same scale.
    #[test]
    fn reads_expert_parameters_and_patterns() {
        let c = parse(
            r#"{"r": 4, "lora_alpha": 8, "target_modules": [], "target_parameters": ["gate_up_proj", "down_proj"],
               "rank_pattern": {".*\\.gate_up_proj": 8}, "alpha_pattern": {".*\\.gate_up_proj": 16, "q_proj": 2}}"#,
        )
        .unwrap();
        assert_eq!(c.expert_targets, [ExpertParam::GateUp, ExpertParam::Down]);
        assert!(c.targets.is_empty());
        let router = parse(
            r#"{"r": 4, "lora_alpha": 8, "target_modules": ["in_proj_qkvz"], "target_parameters": ["gate.weight"]}"#,
        )
        .unwrap();
        assert!(router.targets("gate") && router.targets("in_proj_qkvz") && router.expert_targets.is_empty());
        assert!(parse(r#"{"r": 4, "lora_alpha": 8, "target_modules": ["q_gate"]}"#).unwrap_err().contains("`q_gate`"));
        let gate_up = "model.layers.3.mlp.experts.gate_up_proj";
        assert_eq!((c.rank_of(gate_up).unwrap(), c.scale_of(gate_up).unwrap()), (8, 2.0));
        let down = "model.layers.3.mlp.experts.down_proj";
        assert_eq!((c.rank_of(down).unwrap(), c.scale_of(down).unwrap()), (4, 2.0));
        // A key matches a whole name or a suffix after a dot, never part of a word.
        assert_eq!(c.scale_of("model.layers.0.self_attn.q_proj").unwrap(), 0.5);
        assert_eq!(c.scale_of("model.layers.0.self_attn.xq_proj").unwrap(), 2.0);
    }
}
