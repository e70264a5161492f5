//! The `met` binary's library: the command line ([`cli`], the only module that sees a flag),
//! startup ([`startup`], from settings to a running engine), model resolution, the commands
//! (`generate`, `tokenize`, the engine's offline benchmarks) and the OpenAI- and
//! Anthropic-compatible HTTP server ([`serve`]). The load generator that measures it and its
//! peers is the `met-bench` crate; text (tokenizers, chat templates, the detokenizer) is
//! `met-text`. A library so that tests and other front ends can reach the same pieces the
//! binary uses.
//!
//! Imports run one way: `cli` above the commands and `serve`, those above `startup`, which
//! is above `resolve`.
//!
//! **Boundary:** the only crate that knows CLI flags, JSON output formats or HTTP.

pub mod batch;
pub mod cli;
pub mod generate;
pub mod offline;
pub mod resolve;
pub mod serve;
pub mod startup;
pub mod tokenize;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;

/// Parses the command line, installs logging and runs the subcommand. Every failure ends
/// here as one `error:` message and a non-zero exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    met_telemetry::init_tracing();
    let result = cli.command.run();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
