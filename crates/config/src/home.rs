//! The met home: where met keeps the default model and its caches.

use std::path::PathBuf;

/// File name of the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) under
/// `<met home>/models/`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `MET_HOME`, else `$HOME/.cache/met`; `None` when neither variable is set.
pub fn met_home() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("MET_HOME").filter(|h| !h.is_empty()) {
        return Some(PathBuf::from(home));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/met"))
}

/// Where the default model lives (whether or not it is installed).
pub fn default_model_path() -> Option<PathBuf> {
    met_home().map(|h| h.join("models").join(DEFAULT_MODEL_FILE))
}

/// For tests that need the default model: its path when installed, else `None` after
/// printing that the test is skipped.
///
/// # Panics
/// When the model is missing and `MET_REQUIRE_DEFAULT_MODEL=1` (set by `cargo xtask test`,
/// which installs it first), so CI can never pass by skipping.
pub fn default_model_for_test() -> Option<PathBuf> {
    let path = default_model_path().filter(|p| p.is_file());
    if path.is_none() {
        let expected =
            default_model_path().map(|p| p.display().to_string()).unwrap_or_else(|| "(no MET_HOME or HOME)".into());
        if std::env::var_os("MET_REQUIRE_DEFAULT_MODEL").is_some_and(|v| v == "1") {
            panic!(
                "the default model is required but not installed at {expected}; run `cargo xtask fetch-default-model`"
            );
        }
        eprintln!("note: skipped: the default model is not installed at {expected}; `cargo xtask fetch-default-model`");
    }
    path
}
