//! The `met` binary's library: command line, startup, model resolution, the commands, the
//! OpenAI-compatible HTTP server ([`serve`]) and the load generator that measures it and
//! its peers ([`bench`](mod@bench)). Text (tokenizers, chat templates, the detokenizer) is
//! the `met-text` crate.
//! A library so that tests and other front ends can reach the same pieces the binary uses.
//!
//! **Boundary:** the only crate that knows CLI flags, JSON output formats or HTTP.

pub mod bench;
pub mod cli;
pub mod generate;
pub mod resolve;
pub mod serve;
pub mod startup;
pub mod tokenize;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

/// Parses the command line, installs logging and runs the subcommand. Every failure ends
/// here as one `error:` message and a non-zero exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    met_telemetry::init_tracing();
    let result = match cli.command {
        Command::Generate(args) => generate::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
        Command::Serve(args) => serve::run(*args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
