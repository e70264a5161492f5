//! `met`: the command-line entry point.
//!
//! Parses the command line, installs logging, and dispatches to a subcommand. Every
//! failure ends here as one `error:` message and a non-zero exit code; no input panics.

mod cli;
mod generate;
mod load;
mod resolve;
mod text;
mod tokenize;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    met_telemetry::init_tracing();
    let result = match cli.command {
        Command::Generate(args) => generate::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
