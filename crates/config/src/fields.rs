//! Typed reads of JSON object fields, with errors that name the file and the dotted field.
//!
//! [`RawConfig`] is the raw, typed parse every architecture reads its `config.json` through
//! (`met-model-layers`' `models/<arch>.rs`): each read says what it expected and, on failure,
//! names the file and the field as `rope_scaling.factor`. [`ConfigJson`] owns the parsed
//! object a `RawConfig` borrows.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::ConfigError;

/// A parsed `config.json` (or GGUF-derived config): the JSON object and the file it came from.
#[derive(Debug, Clone)]
pub struct ConfigJson {
    path: PathBuf,
    map: Map<String, Value>,
}

impl ConfigJson {
    /// Reads and parses `path`.
    ///
    /// # Errors
    /// [`ConfigError::Io`] or [`ConfigError::Json`], naming the file.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &read(path)?)
    }

    /// Parses `text`; `path` names it in messages.
    ///
    /// # Errors
    /// [`ConfigError::Json`] when it is not a JSON object.
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        Ok(Self { path: path.into(), map: RawConfig::parse(path, text)? })
    }

    /// Replaces top-level fields with those of the JSON object `overrides` (as vLLM's
    /// `--hf-overrides`), e.g. `{"num_hidden_layers": 2}`.
    ///
    /// # Errors
    /// [`ConfigError::Json`] naming `--hf-overrides` when it is not a JSON object.
    pub fn with_overrides(mut self, overrides: &str) -> Result<Self, ConfigError> {
        self.map.extend(RawConfig::parse(Path::new("--hf-overrides"), overrides)?);
        Ok(self)
    }

    /// The typed view for reading fields.
    #[must_use]
    pub fn raw(&self) -> RawConfig<'_> {
        RawConfig::new(&self.path, &self.map)
    }
}

/// A JSON object being read field by field. `prefix` names nested objects in errors.
#[derive(Debug, Clone)]
pub struct RawConfig<'a> {
    path: &'a Path,
    prefix: String,
    map: &'a Map<String, Value>,
}

impl<'a> RawConfig<'a> {
    /// Parses `text` as a JSON object.
    pub(crate) fn parse(path: &Path, text: &str) -> Result<Map<String, Value>, ConfigError> {
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(other) => Err(ConfigError::Json { path: path.into(), msg: format!("found {}", kind(&other)) }),
            Err(e) => Err(ConfigError::Json { path: path.into(), msg: e.to_string() }),
        }
    }

    /// Reads the object `map` of the file `path`.
    pub fn new(path: &'a Path, map: &'a Map<String, Value>) -> Self {
        Self { path, prefix: String::new(), map }
    }

    /// The file, for messages.
    pub fn path(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    /// The dotted name of `key` in this object.
    pub fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The error for a bad value of `key`.
    pub fn invalid(&self, key: &str, msg: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: self.path(), field: self.name(key), msg: msg.into() }
    }

    /// The error for an absent `key`.
    pub fn missing(&self, key: &str) -> ConfigError {
        ConfigError::Missing { path: self.path(), field: self.name(key) }
    }

    /// The value of `key`, treating JSON null as absent.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// The object's keys, in the file's order.
    pub fn keys(&self) -> Vec<String> {
        self.map.keys().cloned().collect()
    }

    /// Whether `key` is present at all, even as null.
    pub fn has_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// A nested object, if present.
    pub fn object(&self, key: &str) -> Result<Option<RawConfig<'a>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => {
                Ok(Some(RawConfig { path: self.path, prefix: format!("{}.", self.name(key)), map }))
            }
            Some(v) => Err(self.invalid(key, format!("expected an object, found {}", kind(v)))),
        }
    }

    /// A string, if present.
    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        self.get(key)
            .map(|v| v.as_str().ok_or_else(|| self.invalid(key, format!("expected a string, found {}", kind(v)))))
            .transpose()
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&'a str, ConfigError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    /// A non-negative integer, if present.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.get(key).map(|v| self.as_usize(key, v)).transpose()
    }

    /// A required non-negative integer.
    pub fn usize(&self, key: &str) -> Result<usize, ConfigError> {
        self.opt_usize(key)?.ok_or_else(|| self.missing(key))
    }

    /// A strictly positive integer.
    pub fn positive(&self, key: &str) -> Result<usize, ConfigError> {
        match self.usize(key)? {
            0 => Err(self.invalid(key, "must be positive, found 0")),
            n => Ok(n),
        }
    }

    /// A number, if present.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        self.get(key)
            .map(|v| v.as_f64().ok_or_else(|| self.invalid(key, format!("expected a number, found {}", kind(v)))))
            .transpose()
    }

    /// A boolean, if present.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        self.get(key)
            .map(|v| v.as_bool().ok_or_else(|| self.invalid(key, format!("expected true or false, found {}", kind(v)))))
            .transpose()
    }

    /// An integer or a list of integers (as HF writes `eos_token_id`), as a list.
    pub fn ids(&self, key: &str) -> Result<Vec<u32>, ConfigError> {
        let Some(v) = self.get(key) else { return Ok(Vec::new()) };
        let one = |v: &Value| {
            self.as_usize(key, v)
                .and_then(|n| u32::try_from(n).map_err(|_| self.invalid(key, format!("{n} does not fit a token id"))))
        };
        match v {
            Value::Array(items) => items.iter().map(one).collect(),
            v => Ok(vec![one(v)?]),
        }
    }

    /// A list of integers.
    pub fn usize_list(&self, key: &str) -> Result<Vec<usize>, ConfigError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(|v| self.as_usize(key, v)).collect(),
            Some(v) => Err(self.invalid(key, format!("expected a list of integers, found {}", kind(v)))),
        }
    }

    /// A list of strings.
    pub fn str_list(&self, key: &str) -> Result<Option<Vec<&'a str>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().ok_or_else(|| self.invalid(key, format!("expected strings, found {}", kind(v)))))
                .collect::<Result<_, _>>()
                .map(Some),
            Some(v) => Err(self.invalid(key, format!("expected a list of strings, found {}", kind(v)))),
        }
    }

    fn as_usize(&self, key: &str, v: &Value) -> Result<usize, ConfigError> {
        // Some exporters write integral values as floats (`1e6`, `8192.0`); accept those.
        let n = match v {
            Value::Number(n) => {
                n.as_u64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && *f >= 0.0).map(|f| f as u64))
            }
            _ => None,
        };
        n.and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.invalid(key, format!("expected a non-negative integer, found {}", kind(v))))
    }
}

/// A short description of a JSON value for error messages.
pub(crate) fn kind(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) if s.len() <= 40 => format!("string {s:?}"),
        Value::String(_) => "a string".into(),
        Value::Array(_) => "a list".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Reads a file to a string, naming it on failure.
pub(crate) fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Io { path: path.into(), source })
}
