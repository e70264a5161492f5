//! What the server does with a validated request's tokens, which the engine never sees: the
//! shape of the answer, stop strings, logprobs, and how each chat choice splits into
//! reasoning, content and tool calls. `validate` fills them in; `stream`, `choice_output` and
//! the endpoints read them.

use met_config::ReasoningParser;

use super::dialect::Endpoint;
use super::tool_parser::ToolMode;

/// The shape logprobs are reported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogprobsShape {
    /// Not requested.
    Off,
    /// Chat's `choices[].logprobs.content[]`.
    Chat,
    /// Completions' parallel lists.
    Legacy,
}

/// What the server does with generated tokens (the engine never sees these).
#[derive(Debug, Clone)]
pub struct TextOptions {
    /// Which endpoint answers.
    pub endpoint: Endpoint,
    /// Stop strings, matched on the text across token boundaries.
    pub stop: Vec<String>,
    /// Leave special tokens out of the text.
    pub skip_special_tokens: bool,
    /// Logprobs reporting.
    pub logprobs: LogprobsShape,
    /// Answer with server-sent events.
    pub stream: bool,
    /// Streaming: end with a usage chunk.
    pub include_usage: bool,
    /// Choices per prompt.
    pub n: usize,
    /// Chat: how each choice's text splits into reasoning, content and tool calls.
    pub output: OutputOptions,
}

/// How a request's choices are split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputOptions {
    /// Split off `<think>` reasoning in this format.
    pub reasoning: Option<ReasoningParser>,
    /// How tool calls come out.
    pub tools: ToolMode,
}

impl Default for OutputOptions {
    fn default() -> Self {
        Self { reasoning: None, tools: ToolMode::Off }
    }
}
