//! `cargo xtask`: the project's own automation, in Rust so it runs wherever cargo does.
//!
//! - `cargo xtask test [ARGS]`: the test command of README.md (every crate's tests).
//! - `cargo xtask fixtures [--python PY]`: regenerates the Hugging Face equivalence
//!   fixtures with `scripts/hf_fixtures.py` (needs torch and transformers in PY).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

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
        _ => {
            eprintln!("usage: cargo xtask <test [CARGO TEST ARGS] | fixtures [--python PY]>");
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

fn test(args: &[String]) -> Result<()> {
    run(cargo().args(["test", "--workspace"]).args(args))
}

fn fixtures(args: &[String]) -> Result<()> {
    let python = match args {
        [] => "python3".to_string(),
        [flag, py] if flag == "--python" => py.clone(),
        _ => bail!("usage: cargo xtask fixtures [--python PY]"),
    };
    run(Command::new(python).arg("scripts/hf_fixtures.py"))
}
