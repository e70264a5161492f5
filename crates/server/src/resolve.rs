//! Model resolution: what `--model` (or its absence) names, as a directory or GGUF file.
//!
//! One function answers for every command, in this order: an existing local path (a
//! Hugging Face directory with `config.json`, a `.gguf` file, or a directory holding
//! exactly one `.gguf`), then a hub id found in the local Hugging Face cache (never
//! downloading), and with no `--model` the default model under the met home. Anything else
//! is one error listing every place looked at.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// Where a model's files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face directory: `config.json`, safetensors, tokenizer files.
    HfDir(PathBuf),
    /// A single GGUF file with weights, config and tokenizer.
    Gguf(PathBuf),
}

impl ModelSource {
    /// The path, for messages.
    pub fn path(&self) -> &Path {
        match self {
            Self::HfDir(p) | Self::Gguf(p) => p,
        }
    }
}

/// The places resolution searches, read from the environment by [`SearchPaths::from_env`].
#[derive(Debug, Clone, Default)]
pub struct SearchPaths {
    /// Hugging Face hub caches, in order of preference.
    pub hf_caches: Vec<PathBuf>,
    /// The default model file.
    pub default_model: Option<PathBuf>,
}

impl SearchPaths {
    /// `HF_HUB_CACHE`, `HF_HOME/hub`, `XDG_CACHE_HOME/huggingface/hub` and
    /// `~/.cache/huggingface/hub` (those that are set), and the met home's default model.
    pub fn from_env() -> Self {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let mut hf_caches = Vec::new();
        hf_caches.extend(var("HF_HUB_CACHE"));
        hf_caches.extend(var("HF_HOME").map(|h| h.join("hub")));
        hf_caches.extend(var("XDG_CACHE_HOME").map(|h| h.join("huggingface/hub")));
        hf_caches.extend(var("HOME").map(|h| h.join(".cache/huggingface/hub")));
        hf_caches.dedup();
        Self { hf_caches, default_model: met_config::default_model_path() }
    }
}

/// Resolves `spec` (the `--model` value, if any).
///
/// # Errors
/// When nothing matches, listing where it looked.
pub fn resolve(spec: Option<&str>, paths: &SearchPaths) -> Result<ModelSource> {
    let Some(spec) = spec else {
        return match &paths.default_model {
            Some(p) if p.is_file() => Ok(ModelSource::Gguf(p.clone())),
            Some(p) => bail!(
                "the default model is not installed (expected {}); run `cargo xtask fetch-default-model`",
                p.display()
            ),
            None => bail!("no --model given and no met home (set MET_HOME or HOME) for the default model"),
        };
    };
    let mut looked = Vec::new();
    let local = Path::new(spec);
    if let Some(found) = local_model(local, &mut looked)? {
        return Ok(found);
    }
    if let Some((org, name)) = hub_id(spec) {
        for cache in &paths.hf_caches {
            let repo = cache.join(format!("models--{org}--{name}"));
            if let Some(snapshot) = snapshot(&repo) {
                if let Some(found) = local_model(&snapshot, &mut looked)? {
                    return Ok(found);
                }
            } else {
                looked.push(repo);
            }
        }
    }
    let mut msg =
        format!("cannot find model `{spec}`: not a local model and not in the Hugging Face cache. Looked at:");
    for p in &looked {
        let _ = write!(msg, "\n  {}", p.display());
    }
    if paths.hf_caches.is_empty() {
        msg.push_str("\n  (no Hugging Face cache: set HF_HUB_CACHE or HF_HOME)");
    }
    bail!(msg)
}

/// A model at a local path, if there is one.
fn local_model(path: &Path, looked: &mut Vec<PathBuf>) -> Result<Option<ModelSource>> {
    looked.push(path.to_path_buf());
    if path.is_file() {
        if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            return Ok(Some(ModelSource::Gguf(path.to_path_buf())));
        }
        bail!("`{}` is a file but not a .gguf model", path.display());
    }
    if !path.is_dir() {
        return Ok(None);
    }
    if path.join("config.json").is_file() {
        return Ok(Some(ModelSource::HfDir(path.to_path_buf())));
    }
    let ggufs: Vec<PathBuf> = std::fs::read_dir(path)?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")))
        .collect();
    match ggufs.as_slice() {
        [one] => Ok(Some(ModelSource::Gguf(one.clone()))),
        [] => bail!("`{}` has neither config.json nor a .gguf file", path.display()),
        many => bail!("`{}` holds {} .gguf files; name one of them", path.display(), many.len()),
    }
}

/// `org/name` split, for strings shaped like a hub id.
fn hub_id(spec: &str) -> Option<(&str, &str)> {
    let (org, name) = spec.split_once('/')?;
    let ok = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    (ok(org) && ok(name) && !name.contains('/')).then_some((org, name))
}

/// The snapshot a cached repo's `refs/main` points at, or its only snapshot.
fn snapshot(repo: &Path) -> Option<PathBuf> {
    let snapshots = repo.join("snapshots");
    if let Ok(rev) = std::fs::read_to_string(repo.join("refs/main")) {
        let dir = snapshots.join(rev.trim());
        if dir.is_dir() {
            return Some(dir);
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&snapshots).ok()?.filter_map(Result::ok).map(|e| e.path()).collect();
    (dirs.len() == 1).then(|| dirs.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(cache: &Path, default: Option<PathBuf>) -> SearchPaths {
        SearchPaths { hf_caches: vec![cache.to_path_buf()], default_model: default }
    }

    #[test]
    fn local_dirs_and_gguf_files() {
        let tmp = tempfile::tempdir().unwrap();
        let hf = tmp.path().join("hf");
        std::fs::create_dir(&hf).unwrap();
        std::fs::write(hf.join("config.json"), "{}").unwrap();
        let gguf = tmp.path().join("m.gguf");
        std::fs::write(&gguf, "GGUF").unwrap();
        let p = paths(tmp.path(), None);
        assert_eq!(resolve(Some(hf.to_str().unwrap()), &p).unwrap(), ModelSource::HfDir(hf));
        assert_eq!(resolve(Some(gguf.to_str().unwrap()), &p).unwrap(), ModelSource::Gguf(gguf.clone()));
        assert_eq!(resolve(Some(tmp.path().to_str().unwrap()), &p).unwrap(), ModelSource::Gguf(gguf));
        let text = tmp.path().join("notes.txt");
        std::fs::write(&text, "x").unwrap();
        assert!(resolve(Some(text.to_str().unwrap()), &p).unwrap_err().to_string().contains("not a .gguf"));
    }

    #[test]
    fn hub_ids_come_from_the_cache_snapshot_main_points_at() {
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--HuggingFaceTB--SmolLM2-135M");
        for rev in ["aaa", "bbb"] {
            std::fs::create_dir_all(repo.join("snapshots").join(rev)).unwrap();
            std::fs::write(repo.join("snapshots").join(rev).join("config.json"), "{}").unwrap();
        }
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), "bbb\n").unwrap();
        let got = resolve(Some("HuggingFaceTB/SmolLM2-135M"), &paths(cache.path(), None)).unwrap();
        assert_eq!(got, ModelSource::HfDir(repo.join("snapshots/bbb")));
    }

    #[test]
    fn misses_list_where_they_looked() {
        let cache = tempfile::tempdir().unwrap();
        let err = resolve(Some("someone/absent-model"), &paths(cache.path(), None)).unwrap_err().to_string();
        assert!(err.contains("someone/absent-model"), "{err}");
        assert!(err.contains("models--someone--absent-model"), "{err}");
    }

    #[test]
    fn the_default_model_or_how_to_get_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("default.gguf");
        let err = resolve(None, &paths(tmp.path(), Some(file.clone()))).unwrap_err().to_string();
        assert!(err.contains("cargo xtask fetch-default-model"), "{err}");
        std::fs::write(&file, "GGUF").unwrap();
        assert_eq!(resolve(None, &paths(tmp.path(), Some(file.clone()))).unwrap(), ModelSource::Gguf(file));
    }
}
