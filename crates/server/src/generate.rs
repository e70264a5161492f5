//! `met generate`: text, chat or token-id prompts through the serving engine, stepped on this thread
//! until every request is done, so batching, chunked prefill, prefix caching, preemption
//! and sampling all behave as they do when serving.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use met_config::{EngineSetup, LoadConfig};
use met_scheduler::{Engine, EngineRequest, FinishReason, RequestStream};
use met_telemetry::Metrics;
use met_text::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
use serde::{Deserialize, Serialize};

use crate::batch::{Draft, sized_engine, speculative_figures};
use crate::startup::engine::random_seed;
use crate::startup::load::{LoadedModel, load};

/// What `met generate` runs: its prompts, in the order they are printed, and what it prints.
#[derive(Debug, Clone)]
pub struct GenerateJob {
    /// Prompts as text, tokenized as the model's Hugging Face tokenizer does.
    pub texts: Vec<String>,
    /// User messages, each rendered with the model's chat template as a prompt.
    pub chats: Vec<String>,
    /// A system message for every chat prompt.
    pub system: Option<String>,
    /// Prompts as token ids.
    pub ids: Vec<Vec<u32>>,
    /// A JSONL file of prompts with per-prompt settings.
    pub prompts_file: Option<PathBuf>,
    /// The request every prompt starts from (a prompts file line may change some fields).
    pub defaults: Draft,
    /// Seed of the first prompt without one of its own (prompt `i` uses `seed + i`); random
    /// when `None`.
    pub seed: Option<u64>,
    /// Print one JSON object per continuation.
    pub json: bool,
    /// Print prefill and decode throughput on stderr.
    pub timing: bool,
}

/// One line of `--prompts-file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    prompt_ids: Vec<u32>,
    max_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<usize>,
    min_p: Option<f32>,
    seed: Option<u64>,
    n: Option<usize>,
    /// Scheduling priority under `--policy priority` (lower first).
    priority: Option<i32>,
}

/// One line of `--json` output: a continuation of a prompt.
#[derive(Serialize)]
struct Output<'a> {
    prompt: usize,
    index: usize,
    prompt_ids: &'a [u32],
    generated_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
    finish_reason: &'a str,
    cached_prompt_tokens: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<&'a [f32]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs: Option<&'a [Vec<(u32, f32)>]>,
}

/// What a continuation produced.
#[derive(Debug, Default, Clone)]
struct Continuation {
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    top_logprobs: Vec<Vec<(u32, f32)>>,
    finish: Option<FinishReason>,
    cached: usize,
}

/// Runs `met generate`: `job`'s prompts on the model `load` says, in an engine `setup` says.
///
/// # Errors
/// No prompts, a model that does not load, a prompt the engine refuses (naming it), or a
/// continuation that ended with an error.
pub fn run(load_config: &LoadConfig, setup: &EngineSetup, job: &GenerateJob) -> Result<()> {
    if job.texts.is_empty() && job.chats.is_empty() && job.ids.is_empty() && job.prompts_file.is_none() {
        bail!("no prompts: give --prompt, --chat, --prompt-ids or --prompts-file");
    }
    let LoadedModel { model, topology, tokenizer, eos_token_ids, .. } = load(load_config)?;
    let mut drafts = text_prompts(job, tokenizer.as_ref())?;
    drafts.extend(id_prompts(job)?);
    pin_seeds(&mut drafts, job.seed);
    for d in &mut drafts {
        d.stop.eos_token_ids.clone_from(&eos_token_ids);
    }
    let metrics = Arc::new(Metrics::new());
    let mut engine = sized_engine(setup, model, &topology, &drafts, Arc::clone(&metrics))?;
    let prompts: Vec<Vec<u32>> = drafts.iter().map(|d| d.prompt.clone()).collect();
    let requests = Draft::make_all(drafts, &engine.limits(), "prompt")?;
    // As the engine thread does (`met_scheduler::spawn`): step inside the rayon pool.
    let (outputs, timing) = rayon::scope(|_| run_to_completion(&mut engine, requests))?;
    print(&prompts, &outputs, job, tokenizer.as_ref())?;
    if job.timing {
        let prompt_tokens = prompts.iter().map(Vec::len).sum();
        let mut summary = timing.summary(prompt_tokens);
        if setup.speculative.is_some() {
            summary["speculative"] = serde_json::to_value(speculative_figures(&metrics))?;
        }
        eprintln!("{}", serde_json::to_string(&summary)?);
    }
    Ok(())
}

/// Submits every request and steps the engine until all are done.
fn run_to_completion(engine: &mut Engine, requests: Vec<EngineRequest>) -> Result<(Vec<Vec<Continuation>>, Timing)> {
    let mut outputs: Vec<Vec<Continuation>> = requests.iter().map(|r| vec![Continuation::default(); r.n()]).collect();
    let mut streams = requests
        .into_iter()
        .enumerate()
        .map(|(i, r)| engine.submit(r).with_context(|| format!("prompt {i}")))
        .collect::<Result<Vec<_>>>()?;
    let mut timing = Timing::default();
    while engine.has_work() {
        let start = std::time::Instant::now();
        engine.step();
        let before = outputs.iter().flatten().map(|c| c.tokens.len()).sum::<usize>();
        drain(&mut streams, &mut outputs);
        let after = outputs.iter().flatten().map(|c| c.tokens.len()).sum::<usize>();
        timing.record(start.elapsed().as_secs_f64(), before, after);
    }
    drain(&mut streams, &mut outputs);
    Ok((outputs, timing))
}

/// Wall time of the steps up to the first token (prefill) and after it (decode).
#[derive(Debug, Default)]
struct Timing {
    prefill_s: f64,
    decode_s: f64,
    decode_tokens: usize,
}

impl Timing {
    fn record(&mut self, seconds: f64, tokens_before: usize, tokens_after: usize) {
        if tokens_before == 0 {
            self.prefill_s += seconds;
        } else {
            self.decode_s += seconds;
            self.decode_tokens += tokens_after - tokens_before;
        }
    }

    fn summary(&self, prompt_tokens: usize) -> serde_json::Value {
        serde_json::json!({
            "prompt_tokens": prompt_tokens,
            "prefill_s": self.prefill_s,
            "prompt_tokens_per_s": prompt_tokens as f64 / self.prefill_s,
            "decode_tokens": self.decode_tokens,
            "decode_s": self.decode_s,
            "decode_tokens_per_s": self.decode_tokens as f64 / self.decode_s,
        })
    }
}

fn drain(streams: &mut [RequestStream], outputs: &mut [Vec<Continuation>]) {
    for (s, out) in streams.iter_mut().zip(outputs) {
        while let Some(e) = s.try_next() {
            let c = &mut out[e.index];
            if let Some(t) = e.token {
                c.tokens.push(t.id);
                c.logprobs.extend(t.logprob);
                c.top_logprobs.push(t.top_logprobs);
            }
            c.cached = e.cached_prompt_tokens;
            c.finish = e.finish;
        }
    }
}

fn print(
    prompts: &[Vec<u32>],
    outputs: &[Vec<Continuation>],
    job: &GenerateJob,
    tokenizer: Option<&Tokenizer>,
) -> Result<()> {
    let (json, logprobs) = (job.json, job.defaults.sampling.logprobs.is_some());
    let mut failed = None;
    for (i, (prompt, choices)) in prompts.iter().zip(outputs).enumerate() {
        for (index, c) in choices.iter().enumerate() {
            let reason = match &c.finish {
                Some(FinishReason::Stop) => "stop",
                Some(FinishReason::Length) => "length",
                Some(FinishReason::Cancelled) | None => "cancelled",
                Some(FinishReason::Error(e)) => {
                    failed = Some(format!("prompt {i}: {e}"));
                    "error"
                }
            };
            let text = tokenizer.map(|t| t.decode(&c.tokens, true)).transpose()?;
            if json {
                let line = Output {
                    prompt: i,
                    index,
                    prompt_ids: prompt,
                    generated_ids: &c.tokens,
                    text: text.as_deref(),
                    finish_reason: reason,
                    cached_prompt_tokens: c.cached,
                    logprobs: logprobs.then_some(&c.logprobs[..]),
                    top_logprobs: logprobs.then_some(&c.top_logprobs[..]),
                };
                println!("{}", serde_json::to_string(&line)?);
            } else if let Some(text) = text {
                println!("{text}");
            } else {
                println!("prompt {i}.{index} ({reason}): {prompt:?} -> {:?}", c.tokens);
            }
        }
    }
    match failed {
        Some(e) => bail!(e),
        None => Ok(()),
    }
}

/// The text and chat prompts, in that order, tokenized.
fn text_prompts(job: &GenerateJob, tokenizer: Option<&Tokenizer>) -> Result<Vec<Draft>> {
    if job.texts.is_empty() && job.chats.is_empty() {
        return Ok(Vec::new());
    }
    let tokenizer = tokenizer.context("--prompt and --chat need a tokenizer, and this model has none")?;
    let mut requests = Vec::new();
    for text in &job.texts {
        requests.push(job.defaults.with_prompt(tokenizer.encode(text, true)?));
    }
    if !job.chats.is_empty() {
        let template = ChatTemplate::from_tokenizer(tokenizer)?.context("--chat: this model has no chat template")?;
        for user in &job.chats {
            let mut messages: Vec<ChatMessage> = job.system.iter().map(|s| ChatMessage::text("system", s)).collect();
            messages.push(ChatMessage::text("user", user));
            let rendered = template
                .render(&messages, &RenderOptions { add_generation_prompt: true, ..RenderOptions::default() })?;
            // The template writes its own special tokens.
            requests.push(job.defaults.with_prompt(tokenizer.encode(&rendered, false)?));
        }
    }
    Ok(requests)
}

/// The token-id prompts and the prompts file's, in that order.
fn id_prompts(job: &GenerateJob) -> Result<Vec<Draft>> {
    let mut requests: Vec<Draft> = job.ids.iter().map(|p| job.defaults.with_prompt(p.clone())).collect();
    if let Some(path) = &job.prompts_file {
        requests.extend(read_file(&job.defaults, path)?);
    }
    Ok(requests)
}

/// Gives every request without a seed of its own `seed + i` (a random base without one).
fn pin_seeds(requests: &mut [Draft], seed: Option<u64>) {
    let base_seed = seed.unwrap_or_else(random_seed);
    for (i, r) in requests.iter_mut().enumerate() {
        let seed = r.seed.unwrap_or_else(|| base_seed.wrapping_add(i as u64));
        r.seed = Some(seed);
    }
}

fn read_file(defaults: &Draft, path: &Path) -> Result<Vec<Draft>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{} line {}", path.display(), n + 1);
        let line: PromptLine = serde_json::from_str(line).with_context(at)?;
        let mut r = defaults.with_prompt(line.prompt_ids);
        r.stop.max_new_tokens = line.max_tokens.unwrap_or(r.stop.max_new_tokens);
        r.sampling.temperature = line.temperature.unwrap_or(r.sampling.temperature);
        r.sampling.top_p = line.top_p.unwrap_or(r.sampling.top_p);
        r.sampling.top_k = line.top_k.unwrap_or(r.sampling.top_k);
        r.sampling.min_p = line.min_p.unwrap_or(r.sampling.min_p);
        r.seed = line.seed.or(r.seed);
        r.n = line.n.unwrap_or(r.n);
        r.priority = line.priority.unwrap_or(r.priority);
        out.push(r);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use met_scheduler::{EngineLimits, StopCriteria};

    use super::*;

    #[test]
    fn a_prompts_file_priority_reaches_the_engine_request() {
        let defaults =
            Draft { stop: StopCriteria { max_new_tokens: 4, ..StopCriteria::default() }, n: 1, ..Draft::default() };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prompts.jsonl");
        std::fs::write(&path, "{\"prompt_ids\": [1, 2], \"priority\": -3}\n{\"prompt_ids\": [3]}\n").unwrap();
        let limits = EngineLimits { vocab_size: 8, max_context: 64, kv_capacity: 64, stream_capacity: 4 };
        let requests = Draft::make_all(read_file(&defaults, &path).unwrap(), &limits, "prompt").unwrap();
        assert_eq!(requests.iter().map(EngineRequest::priority).collect::<Vec<_>>(), [-3, 0]);
    }
}
