//! One chat choice's text as the client sees it: reasoning (`--reasoning-parser`) split off
//! first, then tool calls found in what is left, the rest content. The same
//! [`ChoiceOutput`] serves JSON answers (its pieces concatenated) and streams (each piece
//! one delta), so both always agree.

use super::options::OutputOptions;
use super::reasoning::{ReasoningSplit, Split};
use super::stream::{ChoiceDelta, Finish};
use super::tool_parser::{ToolMode, ToolStream};
use super::wire::{FunctionCallOut, ToolCallDelta, ToolCallOut};

/// What a choice releases at once.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Piece {
    /// Reasoning text.
    pub reasoning: String,
    /// Content text.
    pub content: String,
    /// Tool-call deltas.
    pub calls: Vec<ToolCallDelta>,
}

impl Piece {
    /// Whether it releases nothing.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty() && self.calls.is_empty()
    }

    /// Adds `other` after this piece.
    pub fn append(&mut self, other: Piece) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
    }
}

/// One choice's splitter.
#[derive(Debug)]
pub struct ChoiceOutput {
    reasoning: Option<ReasoningSplit>,
    tools: ToolStream,
}

impl ChoiceOutput {
    /// A splitter for `options`.
    pub fn new(options: &OutputOptions) -> Self {
        Self { reasoning: options.reasoning.map(ReasoningSplit::new), tools: ToolStream::new(options.tools.clone()) }
    }

    /// Takes new text.
    pub fn push(&mut self, text: &str) -> Piece {
        let split = match &mut self.reasoning {
            Some(r) => r.push(text),
            None => Split { reasoning: String::new(), content: text.to_owned() },
        };
        let tools = self.tools.push(&split.content);
        Piece { reasoning: split.reasoning, content: tools.content, calls: tools.calls }
    }

    /// Ends the choice: everything held back.
    pub fn finish(&mut self) -> Piece {
        let split = self.reasoning.as_mut().map(ReasoningSplit::finish).unwrap_or_default();
        let tools = self.tools.push(&split.content);
        let mut piece = Piece { reasoning: split.reasoning, content: tools.content, calls: tools.calls };
        let end = self.tools.finish();
        piece.append(Piece { reasoning: String::new(), content: end.content, calls: end.calls });
        piece
    }

    /// OpenAI's `finish_reason`: `tool_calls` when the model chose to call (a forced named
    /// call ends with `stop`, as OpenAI's does).
    pub fn finish_reason(&self, finish: Finish) -> &'static str {
        let chose = !matches!(self.tools.mode(), ToolMode::Named(_));
        if self.tools.called() && finish == Finish::Stop && chose { "tool_calls" } else { finish.as_str() }
    }
}

/// One choice collected whole, for the wire formats that also answer in items or blocks
/// once it ends (the Responses API, Anthropic Messages): every piece so far, and how it
/// ended.
#[derive(Debug)]
pub struct Answer {
    pub output: ChoiceOutput,
    /// Everything released so far.
    pub piece: Piece,
    pub finish: Option<Finish>,
    /// The stop string that ended it, if one did.
    pub stop_sequence: Option<String>,
}

impl Answer {
    /// An empty answer split by `output`.
    pub fn new(output: ChoiceOutput) -> Self {
        Self { output, piece: Piece::default(), finish: None, stop_sequence: None }
    }

    /// Takes a delta's text (and, on the last delta, how the choice ended); returns what it
    /// released, which is also kept.
    pub fn push(&mut self, delta: &ChoiceDelta) -> Piece {
        let mut piece = self.output.push(&delta.text);
        if delta.finish.is_some() {
            piece.append(self.output.finish());
            self.finish = delta.finish;
            self.stop_sequence.clone_from(&delta.stop_sequence);
        }
        self.piece.append(piece.clone());
        piece
    }

    /// The whole tool calls released so far.
    pub fn calls(&self) -> Vec<ToolCallOut> {
        merge_calls(self.piece.calls.clone())
    }
}

/// Whole calls from their deltas (the first piece of each carries id and name).
pub fn merge_calls(deltas: Vec<ToolCallDelta>) -> Vec<ToolCallOut> {
    let mut calls: Vec<ToolCallOut> = Vec::new();
    for d in deltas {
        if d.index >= calls.len() {
            let function = FunctionCallOut { name: d.function.name.unwrap_or_default(), arguments: String::new() };
            calls.push(ToolCallOut { id: d.id.unwrap_or_default(), kind: "function", function });
        }
        let last = calls.len() - 1;
        if let Some(args) = d.function.arguments {
            calls[d.index.min(last)].function.arguments.push_str(&args);
        }
    }
    calls
}
