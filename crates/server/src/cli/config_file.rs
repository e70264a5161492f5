//! `met serve --config FILE.toml`: a file of flags. Each key is a long flag of `met serve`
//! (`max-num-seqs = 64`; underscores work too), each value what the flag takes (a string,
//! number, boolean for a switch, or an array for a repeatable flag). A flag given on the
//! command line (or its environment variable) wins over the file; a key that names no flag is
//! an error naming it.
//!
//! The file is applied by turning it into command-line arguments placed before the real
//! ones and parsing again, so every flag keeps clap's own parsing and checks: a value of
//! the wrong kind fails exactly as it would on the command line.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, CommandFactory, Parser};

use super::{Cli, Command, ServeArgs};

/// `met serve`'s arguments with `path`'s flags merged in under `argv` (the real command
/// line, program name first).
///
/// # Errors
/// The file cannot be read or parsed, names an unknown flag, or gives a flag a value it
/// does not take.
pub fn merge(path: &Path, argv: Vec<OsString>) -> Result<ServeArgs> {
    let text = std::fs::read_to_string(path).with_context(|| format!("--config {}", path.display()))?;
    merge_text(&text, argv).with_context(|| format!("--config {}", path.display()))
}

/// [`merge`] with the file's text.
///
/// # Errors
/// As [`merge`].
pub fn merge_text(text: &str, argv: Vec<OsString>) -> Result<ServeArgs> {
    let table: toml::Table = text.parse()?;
    let command = Cli::command();
    let matches = command.clone().try_get_matches_from(&argv)?;
    let Some(("serve", serve_matches)) = matches.subcommand() else { bail!("--config belongs to `met serve`") };
    let serve = command.find_subcommand("serve").context("met has a serve command")?;
    let mut extra: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = serve
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && !["config", "help"].contains(&long.as_str()))
            .with_context(|| format!("unknown key `{key}`: not a flag of `met serve`"))?;
        if given_on_command_line(serve_matches, arg.get_id().as_str()) {
            continue;
        }
        let switch = matches!(arg.get_action(), ArgAction::SetTrue);
        extra.extend(flag_args(&long, value, switch).with_context(|| format!("key `{key}`"))?);
    }
    let at = argv.iter().position(|a| a == "serve").context("`serve` is on the command line")? + 1;
    let merged: Vec<OsString> = argv[..at].iter().cloned().chain(extra).chain(argv[at..].iter().cloned()).collect();
    match Cli::try_parse_from(merged)?.command {
        Command::Serve(args) => Ok(*args),
        _ => bail!("--config belongs to `met serve`"),
    }
}

/// Whether `id` (or, for `model`, the positional MODEL) came from the command line or the
/// environment rather than a default.
fn given_on_command_line(matches: &ArgMatches, id: &str) -> bool {
    let given =
        |id: &str| matches!(matches.value_source(id), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
    given(id) || (id == "model" && given("model_path"))
}

/// The command-line arguments that say what `value` says for `--long`.
fn flag_args(long: &str, value: &toml::Value, switch: bool) -> Result<Vec<OsString>> {
    let scalar = |v: &toml::Value| -> Result<String> {
        Ok(match v {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Float(f) => f.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => bail!("a {} is not a flag value", other.type_str()),
        })
    };
    match (value, switch) {
        (toml::Value::Boolean(true), true) => Ok(vec![format!("--{long}").into()]),
        (toml::Value::Boolean(false), true) => Ok(Vec::new()),
        (_, true) => bail!("`{long}` is a switch: give true or false"),
        (toml::Value::Array(items), false) => {
            items.iter().map(|v| Ok(format!("--{long}={}", scalar(v)?).into())).collect()
        }
        (v, false) => Ok(vec![format!("--{long}={}", scalar(v)?).into()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<OsString> {
        ["met", "serve"].iter().chain(args).map(OsString::from).collect()
    }

    #[test]
    fn the_file_fills_flags_the_command_line_leaves_out() {
        let file = "port = 9000\nhost = \"0.0.0.0\"\nmax_num_seqs = 8\nno-prefix-caching = true\nmodel = \"x.gguf\"\n";
        let args = merge_text(file, argv(&["--port", "9100"])).unwrap();
        assert_eq!(args.port, 9100, "the command line wins");
        assert_eq!(args.host, "0.0.0.0");
        assert_eq!(args.engine.max_num_seqs, 8);
        assert!(args.engine.no_prefix_caching);
        assert_eq!(args.model.model.as_deref(), Some("x.gguf"));
        let args = merge_text(file, argv(&["y.gguf"])).unwrap();
        assert_eq!((args.model_path.as_deref(), args.model.model.as_deref()), (Some("y.gguf"), None));
    }

    #[test]
    fn bad_files_are_errors_naming_the_key() {
        let err = merge_text("prot = 1\n", argv(&[])).unwrap_err();
        assert!(format!("{err:#}").contains("unknown key `prot`"), "{err:#}");
        let err = merge_text("port = \"high\"\n", argv(&[])).unwrap_err();
        assert!(format!("{err:#}").contains("port"), "{err:#}");
        let err = merge_text("no-prefix-caching = 1\n", argv(&[])).unwrap_err();
        assert!(format!("{err:#}").contains("switch"), "{err:#}");
        assert!(merge_text("config = \"a.toml\"\n", argv(&[])).is_err());
        assert!(merge_text("port = [\n", argv(&[])).is_err());
    }
}
