//! Wire request → validated engine requests (parse, don't validate). Two stages:
//!
//! 1. [`parse`], on the reactor: every field checked against its wire domain and turned
//!    into typed settings: `SamplingParams` with a pinned seed (a random one when the
//!    request has none, so its draws never depend on what shares the batch),
//!    `StopCriteria` with the model's EOS ids, stop strings, and the text options the
//!    response needs.
//! 2. [`tokenize`], on a blocking worker (chat rendering and tokenization are CPU work):
//!    the prompt becomes token ids and each prompt one [`EngineRequest`], made by
//!    `EngineRequest::new`, the one place a request is checked against the engine's
//!    limits: the vocabulary, the context (prompt + `max_tokens` must fit: a
//!    `context_length_exceeded` error otherwise), the sampling values, `min_tokens`, and
//!    end tokens that would leave nothing to sample. The default `max_tokens` is
//!    `--max-tokens-default`, or what the context leaves when that is less.
//!
//! Limits count work, not HTTP requests: a request runs prompts × `n` sequences, at most
//! `--max-sequences-per-request`, each of at most `--max-tokens-default` tokens (the default
//! `max_tokens` is also its cap). Each limit is checked in one place: the server's own
//! (those two, `n` at most [`MAX_N`], the stop strings) here, everything about the model and
//! the sampler in `EngineRequest::new`. Every failure is a 400 naming the field as the
//! request's [`Dialect`] calls it (`messages`, `max_completion_tokens`, `input`); nothing
//! reaches the engine unchecked.

use met_config::{Policy, ReasoningParser, SamplingParams};
use met_scheduler::{EngineRequest, RequestError, StopCriteria};

use super::dialect::{Dialect, Endpoint};
use super::error::ApiError;
use super::options::{LogprobsShape, OutputOptions, TextOptions};
use super::state::{AppState, MAX_N};
use super::structured::{self, GrammarRequest};
use super::tool_parser::ToolMode;
use super::tools::{self, ToolChoice, ToolSetup};
use super::wire::{GenerationRequest, Logprobs, Prompt, Stop};
use crate::startup::engine::random_seed;
use met_text::{ChatMessage, MessageContent, RenderOptions, encode_chat};

/// Most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP_STRINGS: usize = 4;

/// The prompt, before tokenization.
#[derive(Debug)]
enum PromptInput {
    Chat { messages: Vec<ChatMessage>, options: RenderOptions },
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// A request whose fields are all valid; its prompt is not tokenized yet.
#[derive(Debug)]
pub struct Parsed {
    prompt: PromptInput,
    sampling: SamplingParams,
    stop: StopCriteria,
    max_tokens: Option<usize>,
    /// What the request calls its fields.
    dialect: Dialect,
    /// The name its token limit goes by.
    max_tokens_param: &'static str,
    priority: i32,
    grammar: Option<GrammarRequest>,
    text: TextOptions,
}

/// A request ready for the engine: one [`EngineRequest`] per prompt.
#[derive(Debug)]
pub struct Validated {
    /// The engine requests, in prompt order.
    pub requests: Vec<EngineRequest>,
    /// What to do with their tokens.
    pub text: TextOptions,
}

/// Checks every field of `req`, which came in as `dialect` (stage 1).
///
/// # Errors
/// A 400 naming the first field out of range.
pub fn parse(mut req: GenerationRequest, dialect: Dialect, state: &AppState) -> Result<Parsed, ApiError> {
    let endpoint = dialect.endpoint();
    let n = match req.n.map_or(Ok(1), usize::try_from) {
        Ok(n) if n <= MAX_N => n,
        _ => return Err(ApiError::invalid("n", format!("must be at most {MAX_N}; got {}", req.n.unwrap_or(0)))),
    };
    let (max_tokens, max_tokens_param) = max_tokens(&req, dialect, state.config().max_tokens_default)?;
    let (logprobs, shape) = logprobs(&req, endpoint)?;
    let sampling = sampling(&mut req, logprobs)?;
    let stop = stop_criteria(&mut req, state);
    let setup = match endpoint {
        Endpoint::Chat => tools::parse(req.tools.take(), req.tool_choice.take(), req.parallel_tool_calls)?,
        Endpoint::Completions => None,
    };
    let format = structured::parse(req.response_format.take(), req.structured_outputs.take(), dialect)?;
    let grammar = grammar(format, setup.as_ref(), dialect)?;
    let output = match endpoint {
        Endpoint::Chat => output_options(state, setup.as_ref(), grammar.is_some()),
        Endpoint::Completions => OutputOptions::default(),
    };
    let text = TextOptions {
        endpoint,
        stop: stop_strings(req.stop.take(), dialect)?,
        skip_special_tokens: req.skip_special_tokens.unwrap_or(true),
        logprobs: shape,
        stream: req.stream.unwrap_or(false),
        include_usage: req.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
        n,
        output,
    };
    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(&mut req, dialect, state, setup.as_ref())?,
        Endpoint::Completions => prompts(req.prompt.take())?,
    };
    check_sequences(&prompt, n, dialect, state.config().max_sequences_per_request)?;
    let priority = priority(req.priority, state.config().policy)?;
    Ok(Parsed { prompt, sampling, stop, max_tokens, dialect, max_tokens_param, priority, grammar, text })
}

/// The request's sampling settings, its seed pinned (a random one when it gives none, so its
/// draws never depend on what shares the batch). Their ranges are the engine's to check
/// (`EngineRequest::new`, in [`tokenize`]).
fn sampling(req: &mut GenerationRequest, logprobs: Option<usize>) -> Result<SamplingParams, ApiError> {
    Ok(SamplingParams {
        temperature: req.temperature.unwrap_or(1.0),
        top_k: top_k(req.top_k)?,
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p.unwrap_or(0.0),
        repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        logit_bias: logit_bias(req.logit_bias.take())?,
        seed: seed(req.seed.as_ref())?.unwrap_or_else(random_seed),
        logprobs,
    })
}

/// When the request's sequences stop, but for `max_new_tokens`, which depends on each
/// prompt's length ([`tokenize`]); `min_tokens` is checked with it by the engine.
fn stop_criteria(req: &mut GenerationRequest, state: &AppState) -> StopCriteria {
    StopCriteria {
        max_new_tokens: 0,
        min_new_tokens: usize::try_from(req.min_tokens.unwrap_or(0)).unwrap_or(usize::MAX),
        stop_token_ids: req.stop_token_ids.take().unwrap_or_default(),
        eos_token_ids: state.config().eos_token_ids.clone(),
        ignore_eos: req.ignore_eos.unwrap_or(false),
    }
}

/// A chat request's conversation and how the template renders it: the tools shown to it
/// (through the template's own `tools`, or a system message for a template that never reads
/// them) and the request's template options.
fn chat_prompt(
    req: &mut GenerationRequest,
    dialect: Dialect,
    state: &AppState,
    setup: Option<&ToolSetup>,
) -> Result<PromptInput, ApiError> {
    let Some(template) = state.template() else {
        let msg = "this model has no chat template; use /v1/completions";
        return Err(ApiError::invalid(dialect.prompt(), msg));
    };
    let shown = setup.filter(|s| s.choice != ToolChoice::None);
    let reads_tools = tools::template_reads_tools(template.source());
    let options = RenderOptions {
        add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
        continue_final_message: req.continue_final_message.unwrap_or(false),
        kwargs: req.chat_template_kwargs.take().unwrap_or_default(),
        tools: shown.filter(|_| reads_tools).map(|s| s.tools.clone()),
        ..RenderOptions::default()
    };
    let messages = tools::prepare_messages(messages(req.messages.take(), dialect)?, shown, reads_tools);
    Ok(PromptInput::Chat { messages, options })
}

/// The grammar a request's output is held to: its `response_format` or
/// `structured_outputs`, or the one its tool choice enforces (never both).
fn grammar(
    format: Option<GrammarRequest>,
    setup: Option<&ToolSetup>,
    dialect: Dialect,
) -> Result<Option<GrammarRequest>, ApiError> {
    match (format, setup.and_then(ToolSetup::grammar)) {
        (Some(_), Some(_)) => {
            let msg = format!(
                "a `required` or named tool choice already fixes the output; drop {}",
                dialect.response_format("")
            );
            Err(ApiError::invalid("tool_choice", msg))
        }
        (format, tools) => Ok(format.or(tools)),
    }
}

/// How chat choices split: reasoning by `--reasoning-parser` (not DeepSeek-R1's under a
/// grammar, which would take the whole constrained answer for reasoning; Qwen3's only
/// reads an opening `<think>`), tool calls by the request's choice, parsed in
/// `--tool-call-parser`'s format or the template's.
fn output_options(state: &AppState, setup: Option<&ToolSetup>, constrained: bool) -> OutputOptions {
    let config = state.config();
    let parser = || {
        let source = state.template().map(|t| t.source()).unwrap_or_default();
        config.tool_call_parser.unwrap_or_else(|| tools::parser_for_template(source))
    };
    let tools = match setup.map(|s| &s.choice) {
        None | Some(ToolChoice::None) => ToolMode::Off,
        Some(ToolChoice::Auto) => ToolMode::Auto(parser()),
        Some(ToolChoice::Required) => ToolMode::Required,
        Some(ToolChoice::Named(name)) => ToolMode::Named(name.clone()),
    };
    let reasoning = config.reasoning_parser.filter(|&k| !constrained || k == ReasoningParser::Qwen3);
    OutputOptions { reasoning, tools }
}

/// `priority`: 0 unless given; another value only where the engine schedules by it (as
/// vLLM answers such a request to a server without priority scheduling: an error).
fn priority(given: Option<i64>, policy: Policy) -> Result<i32, ApiError> {
    match given {
        None | Some(0) => Ok(0),
        Some(p) if policy != Policy::Priority => Err(ApiError::invalid(
            "priority",
            format!("{p}: this server does not schedule by priority (start it with --policy priority)"),
        )),
        Some(p) => i32::try_from(p).map_err(|_| ApiError::invalid("priority", format!("{p} is out of range"))),
    }
}

/// Prompts × `n` within `limit`; the field named is `n` unless the prompts alone exceed it.
fn check_sequences(prompt: &PromptInput, n: usize, dialect: Dialect, limit: usize) -> Result<(), ApiError> {
    let prompts = match prompt {
        PromptInput::Texts(t) => t.len(),
        PromptInput::Ids(i) => i.len(),
        PromptInput::Chat { .. } => 1,
    };
    let sequences = prompts.saturating_mul(n);
    if sequences <= limit {
        return Ok(());
    }
    let param = if prompts > limit && n <= limit { dialect.prompt() } else { "n" };
    let msg = format!(
        "{prompts} prompt(s) × n = {n} is {sequences} sequences; this server runs at most {limit} per request \
         (--max-sequences-per-request)"
    );
    Err(ApiError::invalid(param, msg))
}

/// Renders and tokenizes the prompt and makes the engine requests, which checks them
/// against the engine's limits (stage 2). Blocking: call it on a blocking worker.
///
/// # Errors
/// 400 for a template that rejects the conversation, an empty prompt, ids outside the
/// vocabulary, or a prompt (plus `max_tokens`) longer than the context.
pub fn tokenize(parsed: Parsed, state: &AppState) -> Result<Validated, ApiError> {
    let tokenizer = state.tokenizer();
    let encode = |text: &str, special| tokenizer.encode(text, special).map_err(ApiError::from_text);
    let prompts = match &parsed.prompt {
        PromptInput::Chat { messages, options } => vec![chat_ids(state, messages, options)?],
        PromptInput::Texts(texts) => texts.iter().map(|t| encode(t, true)).collect::<Result<_, _>>()?,
        PromptInput::Ids(ids) => ids.clone(),
    };
    let constraint = parsed.grammar.as_ref().map(|g| structured::compile(state, g)).transpose()?;
    let limits = state.engine().limits();
    let mut requests = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.into_iter().enumerate() {
        // Without `max_tokens`, what the context leaves, up to `--max-tokens-default` (an
        // over-long prompt is refused for itself below).
        let max_new_tokens = match parsed.max_tokens {
            Some(max) => max,
            None => limits.max_context.saturating_sub(prompt.len()).min(state.config().max_tokens_default).max(1),
        };
        let mut sampling = parsed.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(i as u64);
        let stop = StopCriteria { max_new_tokens, ..parsed.stop.clone() };
        let request = EngineRequest::new(prompt, sampling, stop, parsed.text.n, &limits)
            .map_err(|e| api_error(e, parsed.dialect, parsed.max_tokens_param))?;
        let request = request.with_priority(parsed.priority);
        requests.push(match &constraint {
            Some(c) => request.with_constraint(c.clone()),
            None => request,
        });
    }
    Ok(Validated { requests, text: parsed.text })
}

/// The token ids of a conversation rendered by the model's chat template (which writes its
/// own special tokens), for generation and for `/tokenize` alike.
///
/// # Errors
/// 400 when the model has no chat template or the template rejects the conversation.
pub fn chat_ids(state: &AppState, messages: &[ChatMessage], options: &RenderOptions) -> Result<Vec<u32>, ApiError> {
    let template = state.template().ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
    let plain = state.config().no_special_tokens_in_user_content;
    encode_chat(state.tokenizer(), template, messages, options, plain).map_err(ApiError::from_text)
}

/// A request the engine's limits refuse, with its field as `dialect` names it, the token
/// limit going by `max_tokens`.
fn api_error(e: RequestError, dialect: Dialect, max_tokens: &'static str) -> ApiError {
    ApiError::refused(e.kind, dialect.field(e.field, max_tokens), e.msg)
}

/// The token limit (`max_completion_tokens` in chat, else `max_tokens`, as `dialect` calls
/// it), at most `cap` (`--max-tokens-default`), with the name it goes by. Zero is the
/// engine's to refuse.
fn max_tokens(
    req: &GenerationRequest,
    dialect: Dialect,
    cap: usize,
) -> Result<(Option<usize>, &'static str), ApiError> {
    let completion_tokens = dialect == Dialect::Chat && req.max_completion_tokens.is_some();
    let param = dialect.max_tokens(completion_tokens);
    let given = if completion_tokens { req.max_completion_tokens } else { req.max_tokens };
    let Some(given) = given else { return Ok((None, param)) };
    match usize::try_from(given) {
        Ok(max) if max <= cap => Ok((Some(max), param)),
        _ => {
            let msg =
                format!("must be at most {cap}, this server's limit per choice (--max-tokens-default); got {given}");
            Err(ApiError::invalid(param, msg))
        }
    }
}

/// The engine's `logprobs` setting and the response shape (how many alternatives the
/// sampler can report is the engine's to check).
fn logprobs(req: &GenerationRequest, endpoint: Endpoint) -> Result<(Option<usize>, LogprobsShape), ApiError> {
    let count = |k: u64| usize::try_from(k).unwrap_or(usize::MAX);
    match endpoint {
        Endpoint::Chat => match (req.logprobs, req.top_logprobs) {
            (Some(Logprobs::Count(_)), _) => Err(ApiError::invalid("logprobs", "must be a boolean for chat")),
            (Some(Logprobs::Bool(true)), k) => Ok((Some(count(k.unwrap_or(0))), LogprobsShape::Chat)),
            (_, Some(_)) => Err(ApiError::invalid("top_logprobs", "requires `logprobs: true`")),
            _ => Ok((None, LogprobsShape::Off)),
        },
        Endpoint::Completions => match req.logprobs {
            Some(Logprobs::Count(k)) => Ok((Some(count(k)), LogprobsShape::Legacy)),
            Some(Logprobs::Bool(true)) => Err(ApiError::invalid("logprobs", "must be an integer for completions")),
            Some(Logprobs::Bool(false)) | None => Ok((None, LogprobsShape::Off)),
        },
    }
}

fn top_k(k: Option<i64>) -> Result<usize, ApiError> {
    match k {
        None | Some(-1 | 0) => Ok(0),
        Some(k) => {
            usize::try_from(k).map_err(|_| ApiError::invalid("top_k", format!("must be -1, 0 or positive; got {k}")))
        }
    }
}

fn logit_bias(bias: Option<std::collections::BTreeMap<String, f32>>) -> Result<Vec<(u32, f32)>, ApiError> {
    let pairs = bias.unwrap_or_default().into_iter().map(|(token, bias)| match token.trim().parse::<u32>() {
        Ok(id) => Ok((id, bias)),
        Err(_) => Err(ApiError::invalid("logit_bias", format!("`{token}` is not a token id"))),
    });
    pairs.collect()
}

/// Any JSON integer; a negative one keeps its bits.
fn seed(seed: Option<&serde_json::Number>) -> Result<Option<u64>, ApiError> {
    let Some(n) = seed else { return Ok(None) };
    match (n.as_u64(), n.as_i64()) {
        (Some(s), _) => Ok(Some(s)),
        (None, Some(s)) => Ok(Some(s as u64)),
        _ => Err(ApiError::invalid("seed", format!("must be an integer; got {n}"))),
    }
}

fn stop_strings(stop: Option<Stop>, dialect: Dialect) -> Result<Vec<String>, ApiError> {
    let (param, what) = dialect.stop();
    let stop = match stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(list)) => list,
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(param, format!("at most {MAX_STOP_STRINGS} {what}; got {}", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(param, format!("{what} must not be empty")));
    }
    Ok(stop)
}

/// The conversation, with text parts joined into strings (other parts are refused).
fn messages(messages: Option<Vec<ChatMessage>>, dialect: Dialect) -> Result<Vec<ChatMessage>, ApiError> {
    let param = dialect.prompt();
    let messages = messages.ok_or_else(|| ApiError::invalid(param, "is required"))?;
    if messages.is_empty() {
        return Err(ApiError::invalid(param, "must hold at least one message"));
    }
    for (i, m) in messages.iter().enumerate() {
        let Some(MessageContent::Parts(parts)) = &m.content else { continue };
        for part in parts {
            let kind = part.get("type").and_then(serde_json::Value::as_str);
            if kind != Some("text") || !part.get("text").is_some_and(serde_json::Value::is_string) {
                let msg = format!("only text parts are supported; got {}", serde_json::Value::Object(part.clone()));
                return Err(ApiError::invalid(format!("{param}[{i}].content"), msg));
            }
        }
    }
    Ok(messages.into_iter().map(ChatMessage::flatten_text_parts).collect())
}

fn prompts(prompt: Option<Prompt>) -> Result<PromptInput, ApiError> {
    let input = match prompt.ok_or_else(|| ApiError::invalid("prompt", "is required"))? {
        Prompt::Text(t) => PromptInput::Texts(vec![t]),
        Prompt::Texts(ts) => PromptInput::Texts(ts),
        Prompt::Ids(ids) => PromptInput::Ids(vec![ids]),
        Prompt::IdLists(lists) => PromptInput::Ids(lists),
    };
    let count = match &input {
        PromptInput::Texts(t) => t.len(),
        PromptInput::Ids(i) => i.len(),
        PromptInput::Chat { .. } => 1,
    };
    match count {
        0 => Err(ApiError::invalid("prompt", "must hold at least one prompt")),
        1..=MAX_N => Ok(input),
        _ => Err(ApiError::invalid("prompt", format!("at most {MAX_N} prompts per request; got {count}"))),
    }
}
