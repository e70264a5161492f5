//! `cargo xtask serve [-- ARGS]`: the README's first command. Installs the default model
//! when no `--model` is given, builds `met` in release mode and replaces this process with
//! `met serve ARGS`, so signals reach the server directly and its exit code is ours.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use crate::{cargo, default_model, root};

/// A cargo build profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `dev`: what `cargo test` builds.
    Debug,
    /// `release`.
    Release,
}

/// Runs `cargo xtask serve`.
pub fn serve(args: &[String]) -> Result<()> {
    let args = match args {
        [dashes, rest @ ..] if dashes == "--" => rest,
        _ => args,
    };
    if !args.iter().any(|a| a == "--model" || a.starts_with("--model=")) {
        default_model::fetch()?;
    }
    let met = build_met(Profile::Release)?;
    let mut cmd = Command::new(&met);
    cmd.arg("serve").args(args);
    eprintln!("xtask: {cmd:?}");
    exec(cmd)
}

/// Builds the `met` binary and returns its path, wherever the target directory is
/// (`CARGO_TARGET_DIR`, cargo config): cargo's JSON messages name the executable.
pub fn build_met(profile: Profile) -> Result<PathBuf> {
    let mut cmd = cargo();
    cmd.args(["build", "-p", "met-server", "--bin", "met", "--message-format=json-render-diagnostics"]);
    if profile == Profile::Release {
        cmd.arg("--release");
    }
    eprintln!("xtask: {cmd:?}");
    let out = cmd
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed with {}", out.status);
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "met")
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
        .context("cargo built met-server but reported no `met` executable")
}

/// Replaces this process with `cmd` (Unix), so the terminal's signals and the exit code
/// are the server's own.
#[cfg(unix)]
fn exec(mut cmd: Command) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let err = cmd.exec();
    Err(err).with_context(|| format!("executing {cmd:?}"))
}

/// Runs `cmd` to completion and exits with its code (no `exec` outside Unix).
#[cfg(not(unix))]
fn exec(mut cmd: Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    std::process::exit(status.code().unwrap_or(1))
}
