//! `met generate`: continuations of token-id prompts, all prompts in one batch.

use anyhow::{Result, bail};
use met_cache::{DEFAULT_BLOCK_SIZE, PagedKvCache};
use met_model_layers::runner::{GreedyOptions, generate_greedy};
use met_telemetry::{Phase, PhaseTimer};
use serde::Serialize;

use crate::cli::GenerateArgs;
use crate::load::load;

/// One line of `--json` output.
#[derive(Serialize)]
struct Output<'a> {
    prompt_ids: &'a [u32],
    generated_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<&'a [Vec<(u32, f32)>]>,
}

/// Runs `met generate`.
pub fn run(args: &GenerateArgs) -> Result<()> {
    if args.temperature != 0.0 {
        bail!("--temperature {}: only greedy decoding (0) is supported by this command yet", args.temperature);
    }
    let loaded = load(&args.model)?;
    let (vocab, max_context) = (loaded.model.vocab_size(), loaded.model.max_context());
    for (i, prompt) in args.prompt_ids.iter().enumerate() {
        if let Some(id) = prompt.iter().find(|&&id| id as usize >= vocab) {
            bail!("prompt {i}: token id {id} is outside the vocabulary of {vocab}");
        }
        if prompt.len() + args.max_tokens > max_context {
            bail!(
                "prompt {i}: {} tokens plus --max-tokens {} exceed the model's context of {max_context}",
                prompt.len(),
                args.max_tokens
            );
        }
    }

    let timer = PhaseTimer::start(Phase::KvCache);
    let blocks: usize = args.prompt_ids.iter().map(|p| (p.len() + args.max_tokens).div_ceil(DEFAULT_BLOCK_SIZE)).sum();
    let mut kv = PagedKvCache::new(&*loaded.backend, loaded.model.kv_layout(), DEFAULT_BLOCK_SIZE, blocks.max(1), true)?;
    timer.done(format_args!("{blocks} blocks of {DEFAULT_BLOCK_SIZE}"));

    let options = GreedyOptions {
        max_new_tokens: args.max_tokens,
        prefill_chunk: None,
        top_logprobs: args.top_logprobs,
        stop_tokens: Vec::new(),
    };
    let outputs = generate_greedy(&*loaded.model, &*loaded.backend, &mut kv, &args.prompt_ids, &options)?;
    for (prompt, out) in args.prompt_ids.iter().zip(&outputs) {
        if args.json {
            let line = Output {
                prompt_ids: prompt,
                generated_ids: &out.tokens,
                top_logprobs: (args.top_logprobs > 0).then_some(&out.top_logprobs[..]),
            };
            println!("{}", serde_json::to_string(&line)?);
        } else {
            println!("{prompt:?} -> {:?}", out.tokens);
        }
    }
    Ok(())
}
