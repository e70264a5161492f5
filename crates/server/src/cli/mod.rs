//! The command line: clap types, each turned once into the settings of `met-config` (or a
//! command's own job) before any work starts, so that startup, `serve`, `generate` and the
//! benches never see a flag. Contradictions are errors naming the flags.
//!
//! Modules: `engine` (the model and engine flags every command that runs the engine
//! shares), `generate` (`met generate`, `met tokenize`), `serve` (`met serve`, with
//! `config_file` for `--config FILE.toml`) and `bench` (`met bench`).

mod bench;
mod config_file;
mod engine;
mod generate;
mod serve;

use anyhow::Result;
use clap::{Parser, Subcommand};

pub use bench::{BenchArgs, BenchCommand, BenchPlotArgs, LatencyArgs, ThroughputArgs};
pub use config_file::{merge as merge_config_file, merge_text as merge_config_text};
pub use engine::{DEFAULT_SPECULATIVE_TOKENS, EngineArgs, ModelArgs, settings};
pub use generate::{GenerateArgs, LogitBias, SamplingArgs, TokenIds, TokenizeArgs};
pub use serve::ServeArgs;

/// met: an LLM inference engine.
#[derive(Debug, Parser)]
#[command(name = "met", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Generate continuations of prompts (text, chat messages or token ids), all in one batch.
    Generate(Box<GenerateArgs>),
    /// Print the token ids of TEXT as a JSON array (or, with --decode, the text of ids).
    Tokenize(TokenizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<ServeArgs>),
    /// Measure speed: load-test a server (`bench serve`), the engine alone (`bench
    /// throughput`, `bench latency`), draw results (`bench plot`).
    Bench(BenchArgs),
}

impl Command {
    /// Turns the flags into settings and runs the command.
    ///
    /// # Errors
    /// A bad flag, naming it, or whatever stopped the command.
    pub fn run(self) -> Result<()> {
        match self {
            Self::Generate(args) => args.run(),
            Self::Tokenize(args) => args.run(),
            Self::Serve(args) => crate::serve::run(args.settings()?),
            Self::Bench(args) => args.run(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use met_bench::{DatasetKind, Endpoint, IdRange};

    use super::generate::{parse_bias, parse_ids};
    use super::*;

    #[test]
    fn ids_parse_and_reject_garbage() {
        assert_eq!(parse_ids("1, 2,3").unwrap(), [1, 2, 3]);
        assert!(parse_ids("1,x").unwrap_err().contains("`x`"));
        assert!(parse_ids("").is_err());
        assert!(parse_ids("-1").is_err());
        assert!(parse_ids("4294967296").is_err());
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let cli =
            Cli::try_parse_from(["met", "generate", "--model", "m", "--prompt-ids", "1", "--stop-token-ids", "3,4"])
                .unwrap();
        let Command::Generate(g) = cli.command else { panic!("generate") };
        assert_eq!(g.sampling.stop_token_ids, [3, 4]);
        let cli = Cli::try_parse_from(["met", "tokenize", "--decode", "5,6"]).unwrap();
        let Command::Tokenize(t) = cli.command else { panic!("tokenize") };
        assert_eq!(t.decode, Some(TokenIds(vec![5, 6])));
        assert!(Cli::try_parse_from(["met", "tokenize"]).is_err(), "text or --decode is required");
        let cli = Cli::try_parse_from(["met", "serve", "m.gguf", "--port", "9000", "--max-num-seqs", "8"]).unwrap();
        let Command::Serve(s) = cli.command else { panic!("serve") };
        assert_eq!((s.model_path.as_deref(), s.port, s.engine.max_num_seqs), (Some("m.gguf"), 9000, 8));
        assert_eq!((s.host.as_str(), s.max_body_bytes), ("127.0.0.1", 4 << 20));
        assert!(Cli::try_parse_from(["met", "serve", "a", "--model", "b"]).is_err(), "MODEL or --model");
        // `--quant-dots`, and its older name `--cpu-dots`, which scripts still pass.
        for flag in ["--quant-dots", "--cpu-dots"] {
            let cli = Cli::try_parse_from(["met", "serve", "m.gguf", flag, "exact"]).unwrap();
            let Command::Serve(s) = cli.command else { panic!("serve") };
            assert_eq!(s.model.quant_dots, met_config::QuantDots::Exact, "{flag}");
        }
        let Command::Serve(s) = Cli::try_parse_from(["met", "serve", "m.gguf"]).unwrap().command else { panic!() };
        assert_eq!(s.model.quant_dots, met_config::QuantDots::CLI_DEFAULT);
    }

    #[test]
    fn bench_serve_takes_ladders_and_rejects_contradictions() {
        let bench = |extra: &[&str]| {
            let args = ["met", "bench", "serve", "--base-url", "http://127.0.0.1:1"].iter().chain(extra);
            Cli::try_parse_from(args).map(|cli| match cli.command {
                Command::Bench(BenchArgs { command: BenchCommand::Serve(s) }) => s,
                other => panic!("{other:?}"),
            })
        };
        let s = bench(&["--concurrency", "1,4,16"]).unwrap();
        assert_eq!(
            (s.concurrency.as_slice(), s.dataset, s.endpoint),
            (&[1, 4, 16][..], DatasetKind::Random, Endpoint::Completions)
        );
        assert_eq!(s.random_ids, IdRange { lo: 1000, hi: 30000 });
        let s = bench(&["--request-rate", "0.5,2", "--burstiness", "0.5"]).unwrap();
        assert_eq!((s.request_rate.as_slice(), s.burstiness), (&[0.5, 2.0][..], 0.5));
        assert!(bench(&["--concurrency", "1", "--request-rate", "2"]).is_err(), "one kind of ladder");
        assert!(bench(&["--burstiness", "2"]).is_err(), "burstiness needs a rate");
        let err = bench(&["--concurrency", ""]).unwrap_err().to_string();
        assert!(err.contains("--concurrency"), "{err}");
        let err = bench(&["--dataset", "imagenet"]).unwrap_err().to_string();
        assert!(err.contains("--dataset"), "{err}");
        assert!("5..5".parse::<IdRange>().is_err() && "9".parse::<IdRange>().is_err());
        let cli = Cli::try_parse_from(["met", "bench", "plot", "a.json", "b.json", "-o", "c.svg"]).unwrap();
        let Command::Bench(BenchArgs { command: BenchCommand::Plot(p) }) = cli.command else { panic!("plot") };
        assert_eq!((p.results.len(), p.output), (2, PathBuf::from("c.svg")));
    }

    #[test]
    fn logit_bias_parses_pairs() {
        assert_eq!(parse_bias("1:2.5, 7:-100").unwrap(), LogitBias(vec![(1, 2.5), (7, -100.0)]));
        assert_eq!(parse_bias("").unwrap(), LogitBias::default());
        assert!(parse_bias("1").unwrap_err().contains("ID:BIAS"));
        assert!(parse_bias("x:1").unwrap_err().contains("`x`"));
    }
}
