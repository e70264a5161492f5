//! `met serve`: its flags, and the settings they become ([`Serve`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Result, bail};
use clap::Args;
use met_config::{DEFAULT_MAX_TOKENS, LoraConfig, LoraModulePath, ReasoningParser, ServeConfig, ToolCallParser};

use super::config_file;
use super::engine::{EngineArgs, ModelArgs, settings};
use crate::serve::Serve;

/// `met serve`. Every long flag can also come from `--config FILE.toml`, whose keys are
/// the flag names (`max-num-seqs = 64`); a flag given on the command line wins.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The model, as `--model` takes it (default: the embedded default model).
    #[arg(value_name = "MODEL", conflicts_with = "model")]
    pub model_path: Option<String>,
    /// The model.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Engine settings. Without `--kv-blocks` the KV cache takes `--gpu-memory-utilization`
    /// of the device memory left after a warm-up step, or 1 GiB on the CPU, but never more
    /// than `--max-num-seqs` full contexts need.
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8888)]
    pub port: u16,
    /// The model id clients use and `/v1/models` lists (default: the model's file or
    /// directory name, or the hub id it was given as).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on every route but `/health` (an empty key is an
    /// error).
    #[arg(long, env = "MET_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Generation requests served at once; more are answered 429.
    #[arg(long, default_value_t = 256)]
    pub max_concurrent_requests: usize,
    /// Largest request body accepted, in bytes; larger ones are answered 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// On SIGINT or SIGTERM, seconds to let in-flight requests finish before cancelling them.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout_secs: u64,
    /// Most sequences one request may run: its prompts times `n` (default: `--max-num-seqs`).
    /// More is answered 400, so one request cannot hold the whole engine.
    #[arg(long, value_name = "N")]
    pub max_sequences_per_request: Option<usize>,
    /// `max_tokens` of a request that gives none (nor `max_completion_tokens`), and the most
    /// one may ask for: at most this many tokens per choice, and never past the model's
    /// context. A request whose `max_tokens` or `min_tokens` is above it is answered 400.
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_MAX_TOKENS)]
    pub max_tokens_default: usize,
    /// Let `/metrics` answer without the API key (for a scraper on a trusted network).
    #[arg(long)]
    pub metrics_without_auth: bool,
    /// Origins browsers may call the API from, comma separated (`http://localhost:3000`;
    /// `*` for any); requests from other origins are answered 403. Default: none.
    #[arg(long, value_delimiter = ',', value_name = "ORIGINS")]
    pub allowed_origins: Vec<String>,
    /// Seconds a client has to send a request's headers, and again its body; an idle
    /// keep-alive connection is closed after the same time.
    #[arg(long, default_value_t = 30)]
    pub http_read_timeout_secs: u64,
    /// Open connections at most; more wait in the listen queue until one closes.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Keep special-token text in user messages (`<|im_start|>`) as text, so a user cannot
    /// write control tokens; by default it becomes those tokens, as in transformers.
    #[arg(long)]
    pub no_special_tokens_in_user_content: bool,
    /// How tool calls are found in chat answers with `tool_choice: auto` (default: the
    /// format the chat template uses, Hermes `<tool_call>` blocks when it shows none).
    #[arg(long, value_enum, value_name = "PARSER")]
    pub tool_call_parser: Option<ToolCallParser>,
    /// Split `<think>` reasoning off chat answers into `reasoning_content` (default: off).
    #[arg(long, value_enum, value_name = "PARSER")]
    pub reasoning_parser: Option<ReasoningParser>,
    /// Serve LoRA adapters: requests pick one by naming it as their `model`, and
    /// `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` change the set at run time.
    /// On the CPU and on CUDA (decode graphs included), on one device.
    #[arg(long)]
    pub enable_lora: bool,
    /// Adapters to load at startup, as NAME=PATH (a PEFT directory) or vLLM's JSON form
    /// `{"name": NAME, "path": PATH}`; needs --enable-lora.
    #[arg(long, value_name = "NAME=PATH", num_args = 1.., value_parser = parse_lora_module)]
    pub lora_modules: Vec<LoraModulePath>,
    /// Adapters resident at once; loading one more is answered 400 (default 4; needs
    /// --enable-lora).
    #[arg(long, value_name = "N")]
    pub max_loras: Option<usize>,
    /// The highest adapter rank accepted (default 16; needs --enable-lora).
    #[arg(long, value_name = "R")]
    pub max_lora_rank: Option<usize>,
    /// A TOML file of flags (`port = 9000`, `no-prefix-caching = true`); unknown keys are
    /// errors.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl ServeArgs {
    /// The settings of `met serve`: these flags, with `--config`'s file merged under the
    /// real command line when given, each checked and checked together (startup phase 0).
    ///
    /// # Errors
    /// A config file that cannot be merged, or a bad setting, naming its flag.
    pub fn settings(self) -> Result<Serve> {
        let args = match &self.config {
            Some(path) => config_file::merge(path, std::env::args_os().collect())?,
            None => self,
        };
        let mut model = args.model;
        if let Some(path) = args.model_path {
            model.model = Some(path);
        }
        let (load, setup) = settings(&model, &args.engine)?;
        let serve = ServeConfig {
            host: args.host,
            port: args.port,
            served_model_name: args.served_model_name,
            api_key: args.api_key,
            max_concurrent_requests: args.max_concurrent_requests,
            max_body_bytes: args.max_body_bytes,
            drain_timeout: Duration::from_secs(args.drain_timeout_secs),
            max_sequences_per_request: args.max_sequences_per_request,
            max_tokens_default: args.max_tokens_default,
            metrics_without_auth: args.metrics_without_auth,
            allowed_origins: args.allowed_origins,
            http_read_timeout: Duration::from_secs(args.http_read_timeout_secs),
            max_connections: args.max_connections,
            no_special_tokens_in_user_content: args.no_special_tokens_in_user_content,
            tool_call_parser: args.tool_call_parser,
            reasoning_parser: args.reasoning_parser,
            lora: lora_settings(args.enable_lora, args.lora_modules, args.max_loras, args.max_lora_rank)?,
        };
        serve.validate()?;
        if let Some(lora) = &serve.lora {
            lora.check_world(load.tensor_parallel_size)?;
        }
        Ok(Serve { load, setup, serve })
    }
}

/// The LoRA settings of `--enable-lora` and the flags that need it.
///
/// # Errors
/// A LoRA flag without `--enable-lora`, naming it.
fn lora_settings(
    enabled: bool,
    modules: Vec<LoraModulePath>,
    max_loras: Option<usize>,
    max_rank: Option<usize>,
) -> Result<Option<LoraConfig>> {
    if !enabled {
        let given = [
            ("lora-modules", !modules.is_empty()),
            ("max-loras", max_loras.is_some()),
            ("max-lora-rank", max_rank.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            bail!("--{flag}: needs --enable-lora");
        }
        return Ok(None);
    }
    let defaults = LoraConfig::default();
    Ok(Some(LoraConfig {
        modules,
        max_loras: max_loras.unwrap_or(defaults.max_loras),
        max_rank: max_rank.unwrap_or(defaults.max_rank),
    }))
}

fn parse_lora_module(s: &str) -> Result<LoraModulePath, String> {
    s.parse().map_err(|e: met_config::InvalidSetting| e.msg)
}
