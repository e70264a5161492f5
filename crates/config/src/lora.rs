//! `LoraConfig`: the LoRA adapters `met serve` loads at startup and the limits every
//! adapter, loaded then or at run time, is held to (`--enable-lora`, `--lora-modules`,
//! `--max-loras`, `--max-lora-rank`).
//!
//! **Invariant:** a checked config names each adapter once, with a non-empty name and
//! path, and no more of them than `--max-loras` lets be resident at once.

use std::collections::HashSet;
use std::path::PathBuf;
use std::str::FromStr;

use crate::engine::{InvalidSetting, positive};

/// The highest adapter rank accepted unless `--max-lora-rank` says otherwise (vLLM's
/// default).
pub const DEFAULT_MAX_LORA_RANK: usize = 16;
/// Adapters resident at once unless `--max-loras` says otherwise.
pub const DEFAULT_MAX_LORAS: usize = 4;

/// One `--lora-modules NAME=PATH` (or vLLM's JSON form of it): the name requests use as
/// their `model`, and the PEFT directory the adapter is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModulePath {
    /// The model id requests name the adapter by.
    pub name: String,
    /// The directory holding `adapter_config.json` and `adapter_model.safetensors`.
    pub path: PathBuf,
}

impl FromStr for LoraModulePath {
    type Err = InvalidSetting;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim_start().starts_with('{') {
            return Self::from_json(s);
        }
        match s.split_once('=') {
            Some((name, path)) if !name.trim().is_empty() && !path.is_empty() => {
                Ok(Self { name: name.trim().to_owned(), path: PathBuf::from(path) })
            }
            _ => Err(InvalidSetting::new("lora-modules", format!("`{s}` is not NAME=PATH"))),
        }
    }
}

impl LoraModulePath {
    /// vLLM's JSON form, `{"name": NAME, "path": PATH, "base_model_name": BASE}`: the base
    /// model is optional (met serves one), any other key is refused.
    fn from_json(s: &str) -> Result<Self, InvalidSetting> {
        let bad = |msg: String| InvalidSetting::new("lora-modules", msg);
        let value: serde_json::Value = serde_json::from_str(s).map_err(|e| bad(format!("`{s}` is not JSON: {e}")))?;
        let object = value.as_object().ok_or_else(|| bad(format!("`{s}` is not a JSON object")))?;
        if let Some(key) = object.keys().find(|k| !["name", "path", "base_model_name"].contains(&k.as_str())) {
            return Err(bad(format!("`{s}` has `{key}`; an adapter takes `name`, `path` and `base_model_name`")));
        }
        let field = |key: &str| object.get(key).and_then(serde_json::Value::as_str).filter(|v| !v.trim().is_empty());
        match (field("name"), field("path")) {
            (Some(name), Some(path)) => Ok(Self { name: name.trim().to_owned(), path: PathBuf::from(path) }),
            _ => Err(bad(format!("`{s}` needs a non-empty `name` and `path`"))),
        }
    }
}

/// LoRA serving, when `--enable-lora` turns it on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraConfig {
    /// Adapters loaded at startup, in the order given.
    pub modules: Vec<LoraModulePath>,
    /// Adapters resident at once; loading one more is refused.
    pub max_loras: usize,
    /// The highest rank an adapter may have.
    pub max_rank: usize,
}

impl Default for LoraConfig {
    fn default() -> Self {
        Self { modules: Vec::new(), max_loras: DEFAULT_MAX_LORAS, max_rank: DEFAULT_MAX_LORA_RANK }
    }
}

impl LoraConfig {
    /// Checks the limits are positive and the startup adapters fit them, each named once.
    ///
    /// # Errors
    /// The first bad setting, naming its flag.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        positive(&[("max-loras", self.max_loras), ("max-lora-rank", self.max_rank)])?;
        if self.modules.len() > self.max_loras {
            let msg = format!("{} adapters given, but --max-loras is {}", self.modules.len(), self.max_loras);
            return Err(InvalidSetting::new("lora-modules", msg));
        }
        let mut seen = HashSet::new();
        if let Some(dup) = self.modules.iter().find(|m| !seen.insert(m.name.as_str())) {
            return Err(InvalidSetting::new("lora-modules", format!("the name `{}` is given twice", dup.name)));
        }
        Ok(())
    }

    /// Checks LoRA can run on `tensor_parallel_size` devices: adapters are not split
    /// across ranks yet, so only on one.
    ///
    /// # Errors
    /// A tensor-parallel size above 1.
    pub fn check_world(&self, tensor_parallel_size: usize) -> Result<(), InvalidSetting> {
        if tensor_parallel_size > 1 {
            let msg =
                format!("not available with --tensor-parallel-size {tensor_parallel_size}: adapters run on one device");
            return Err(InvalidSetting::new("enable-lora", msg));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(s: &str) -> LoraModulePath {
        s.parse().unwrap()
    }

    #[test]
    fn modules_parse_as_name_equals_path() {
        assert_eq!(module("sql=/a/b=c"), LoraModulePath { name: "sql".into(), path: "/a/b=c".into() });
        for bad in ["sql", "=/a", "sql=", ""] {
            let err = bad.parse::<LoraModulePath>().unwrap_err();
            assert_eq!(err.flag, "lora-modules", "{bad}");
            assert!(err.msg.contains("NAME=PATH"), "{err:?}");
        }
    }

    /// vLLM's JSON form reads as NAME=PATH does; a missing field or an unknown key is an
    /// error naming the flag.
    #[test]
    fn modules_parse_as_vllm_json() {
        let want = LoraModulePath { name: "sql".into(), path: "/a/b".into() };
        assert_eq!(module(r#"{"name": "sql", "path": "/a/b"}"#), want);
        assert_eq!(module(r#"{"name": "sql", "path": "/a/b", "base_model_name": "meta-llama/x"}"#), want);
        for bad in
            [r#"{"name": "sql"}"#, r#"{"name": "", "path": "/a"}"#, r#"{"name": "a", "path": "/a", "rank": 8}"#, "{"]
        {
            let err = bad.parse::<LoraModulePath>().unwrap_err();
            assert_eq!(err.flag, "lora-modules", "{bad}");
            assert!(err.msg.contains(bad), "{err:?}");
        }
    }

    #[test]
    fn bad_settings_name_their_flag() {
        let flag = |c: LoraConfig| c.validate().unwrap_err().flag;
        assert_eq!(flag(LoraConfig { max_loras: 0, ..LoraConfig::default() }), "max-loras");
        assert_eq!(flag(LoraConfig { max_rank: 0, ..LoraConfig::default() }), "max-lora-rank");
        let two = vec![module("a=/x"), module("b=/y")];
        let err = LoraConfig { modules: two.clone(), max_loras: 1, ..LoraConfig::default() }.validate().unwrap_err();
        assert_eq!(err.flag, "lora-modules");
        assert!(err.msg.contains("--max-loras is 1"), "{err:?}");
        let twice = vec![module("a=/x"), module("a=/y")];
        let err = LoraConfig { modules: twice, ..LoraConfig::default() }.validate().unwrap_err();
        assert!(err.msg.contains("`a` is given twice"), "{err:?}");
        assert!(LoraConfig { modules: two, ..LoraConfig::default() }.validate().is_ok());
        assert_eq!(LoraConfig::default().check_world(2).unwrap_err().flag, "enable-lora");
        assert!(LoraConfig::default().check_world(1).is_ok());
    }
}
