//! Tool calls out of a model's text: the parsers for the three formats models are trained
//! on, and [`ToolStream`], which turns one choice's text deltas into content deltas and
//! OpenAI-shaped `tool_calls` deltas.
//!
//! - Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks, text
//!   around them is content.
//! - Llama 3 JSON: the answer is `{"name": ..., "parameters": {...}}` (several joined by
//!   `;`), optionally after `<|python_tag|>`.
//! - Mistral: `[TOOL_CALLS]` then a JSON array of `{"name", "arguments"}`.
//!
//! Streaming releases content until a call may be starting (text that could be the start of
//! the marker is held back, as stop strings are), then holds the rest and emits each call
//! whole (id, name and arguments in one delta) when the choice ends. A named choice streams
//! its arguments as they are generated. Text that looked like a call but does not parse is
//! content: nothing the model wrote is lost.

use serde_json::Value;

use super::wire::{FunctionDelta, ToolCallDelta};

use met_config::ToolCallParser;

/// The text that opens a call in format `kind`.
fn marker(kind: ToolCallParser) -> &'static str {
    match kind {
        ToolCallParser::Hermes => "<tool_call>",
        ToolCallParser::Llama3Json => "<|python_tag|>",
        ToolCallParser::Mistral => "[TOOL_CALLS]",
    }
}

/// One call found in text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    /// The function.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

/// The content and the calls of a whole answer in format `kind`; no calls (and the text as
/// content) when what looks like a call does not parse.
pub fn parse_calls(kind: ToolCallParser, text: &str) -> (String, Vec<ParsedCall>) {
    let parsed = match kind {
        ToolCallParser::Hermes => hermes(text),
        ToolCallParser::Llama3Json => llama3(text),
        ToolCallParser::Mistral => mistral(text),
    };
    match parsed {
        Some((content, calls)) if !calls.is_empty() => (content, calls),
        _ => (text.to_owned(), Vec::new()),
    }
}

fn hermes(text: &str) -> Option<(String, Vec<ParsedCall>)> {
    let (open, close) = ("<tool_call>", "</tool_call>");
    let (mut content, mut calls, mut rest) = (String::new(), Vec::new(), text);
    while let Some(start) = rest.find(open) {
        content.push_str(&rest[..start]);
        let body = &rest[start + open.len()..];
        let (inner, after) = body.find(close).map_or((body, ""), |end| (&body[..end], &body[end + close.len()..]));
        calls.push(call(&serde_json::from_str(inner.trim()).ok()?, "arguments")?);
        rest = after;
    }
    content.push_str(rest);
    Some((content.trim().to_owned(), calls))
}

fn llama3(text: &str) -> Option<(String, Vec<ParsedCall>)> {
    let body = text.trim_start();
    let mut rest = body.strip_prefix("<|python_tag|>").unwrap_or(body);
    let mut calls = Vec::new();
    loop {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
        let v = values.next()?.ok()?;
        let args = if v.get("parameters").is_some() { "parameters" } else { "arguments" };
        calls.push(call(&v, args)?);
        // Calls are joined by `;`.
        rest = rest[values.byte_offset()..].trim_start();
        match rest.strip_prefix(';') {
            Some(more) => rest = more,
            None if rest.is_empty() => break,
            None => return None,
        }
    }
    Some((String::new(), calls))
}

fn mistral(text: &str) -> Option<(String, Vec<ParsedCall>)> {
    let at = text.find("[TOOL_CALLS]")?;
    let list: Value = serde_json::from_str(text[at + "[TOOL_CALLS]".len()..].trim()).ok()?;
    let calls = list.as_array()?.iter().map(|v| call(v, "arguments")).collect::<Option<Vec<_>>>()?;
    Some((text[..at].trim().to_owned(), calls))
}

/// `{"name": ..., <args>: ...}` as a call; string arguments are taken as JSON text.
fn call(v: &Value, args: &str) -> Option<ParsedCall> {
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get(args) {
        None => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ParsedCall { name, arguments })
}

/// How a choice's tool calls come out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolMode {
    /// No tools: all text is content.
    Off,
    /// Calls parsed from free text in this format.
    Auto(ToolCallParser),
    /// The whole output is the arguments of this function (grammar-enforced).
    Named(String),
    /// The whole output is a JSON array of `{"name", "parameters"}` (grammar-enforced).
    Required,
}

/// What one push or the finish of a [`ToolStream`] releases.
#[derive(Debug, Default, PartialEq)]
pub struct ToolPiece {
    /// Content text.
    pub content: String,
    /// Tool-call deltas.
    pub calls: Vec<ToolCallDelta>,
}

/// One choice's text, split into content and tool calls as it streams.
#[derive(Debug)]
pub struct ToolStream {
    mode: ToolMode,
    held: String,
    capturing: bool,
    /// Content released so far (a Llama 3 call must open the answer).
    released: bool,
    calls: usize,
}

impl ToolStream {
    /// A stream in `mode`.
    pub fn new(mode: ToolMode) -> Self {
        Self { mode, held: String::new(), capturing: false, released: false, calls: 0 }
    }

    /// Whether any call came out.
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    /// The mode.
    pub fn mode(&self) -> &ToolMode {
        &self.mode
    }

    /// Takes new text of the choice.
    pub fn push(&mut self, text: &str) -> ToolPiece {
        match self.mode.clone() {
            ToolMode::Off => ToolPiece { content: text.to_owned(), calls: Vec::new() },
            ToolMode::Required => {
                self.held.push_str(text);
                ToolPiece::default()
            }
            ToolMode::Named(name) => {
                let mut calls = Vec::new();
                if self.calls == 0 {
                    self.calls = 1;
                    calls.push(whole_call(0, &name, String::new()));
                }
                if !text.is_empty() {
                    calls.push(ToolCallDelta {
                        index: 0,
                        id: None,
                        kind: None,
                        function: FunctionDelta { name: None, arguments: Some(text.to_owned()) },
                    });
                }
                ToolPiece { content: String::new(), calls }
            }
            ToolMode::Auto(kind) => self.push_auto(kind, text),
        }
    }

    fn push_auto(&mut self, kind: ToolCallParser, text: &str) -> ToolPiece {
        self.held.push_str(text);
        if self.capturing {
            return ToolPiece::default();
        }
        if kind == ToolCallParser::Llama3Json && !self.released {
            let t = self.held.trim_start();
            if t.starts_with('{') || t.starts_with(marker(kind)) {
                self.capturing = true;
                return ToolPiece::default();
            }
            if t.is_empty() || marker(kind).starts_with(t) {
                return ToolPiece::default();
            }
        }
        let marker = marker(kind);
        let release = match self.held.find(marker) {
            Some(at) => {
                self.capturing = true;
                at
            }
            None => self.held.len() - partial_suffix(&self.held, marker),
        };
        // Whitespace before a call is no content: hold it until what follows shows.
        let release = self.held[..release].trim_end().len();
        let content: String = self.held.drain(..release).collect();
        self.released |= !content.is_empty();
        ToolPiece { content, calls: Vec::new() }
    }

    /// Ends the choice: what was held, as content or calls.
    pub fn finish(&mut self) -> ToolPiece {
        let held = std::mem::take(&mut self.held);
        let (content, calls) = match &self.mode {
            ToolMode::Off | ToolMode::Named(_) => (held, Vec::new()),
            ToolMode::Auto(kind) if self.capturing => parse_calls(*kind, &held),
            ToolMode::Auto(_) => (held, Vec::new()),
            ToolMode::Required => required_calls(&held).map_or((held, Vec::new()), |calls| (String::new(), calls)),
        };
        let calls: Vec<ToolCallDelta> =
            calls.into_iter().enumerate().map(|(i, c)| whole_call(self.calls + i, &c.name, c.arguments)).collect();
        self.calls += calls.len();
        ToolPiece { content, calls }
    }
}

/// The calls of a `required` answer: `[{"name": ..., "parameters": {...}}, ...]`.
fn required_calls(text: &str) -> Option<Vec<ParsedCall>> {
    let list: Value = serde_json::from_str(text).ok()?;
    list.as_array()?.iter().map(|v| call(v, "parameters")).collect()
}

/// A call in one delta: its id, type, name and all its arguments.
fn whole_call(index: usize, name: &str, arguments: String) -> ToolCallDelta {
    ToolCallDelta {
        index,
        id: Some(format!(
            "call_{:016x}{:08x}",
            crate::startup::engine::random_seed(),
            crate::startup::engine::random_seed() as u32
        )),
        kind: Some("function"),
        function: FunctionDelta { name: Some(name.to_owned()), arguments: Some(arguments) },
    }
}

/// Bytes at the end of `text` that could begin `marker`.
pub(crate) fn partial_suffix(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(calls: &[ParsedCall]) -> Vec<(&str, Value)> {
        calls.iter().map(|c| (c.name.as_str(), serde_json::from_str(&c.arguments).unwrap())).collect()
    }

    #[test]
    fn hermes_blocks_are_calls_and_the_rest_is_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"time\", \"arguments\": {}}</tool_call>";
        let (content, calls) = parse_calls(ToolCallParser::Hermes, text);
        assert_eq!(content, "Let me check.");
        assert_eq!(
            names(&calls),
            vec![("get_weather", serde_json::json!({"city": "Paris"})), ("time", serde_json::json!({}))]
        );
        // An unclosed block at the end still counts; a broken one leaves the text alone.
        let (_, calls) = parse_calls(ToolCallParser::Hermes, "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}");
        assert_eq!(calls.len(), 1);
        let broken = "<tool_call>{\"name\": \"a\", \"argu</tool_call>";
        assert_eq!(parse_calls(ToolCallParser::Hermes, broken), (broken.to_owned(), Vec::new()));
    }

    #[test]
    fn llama3_and_mistral_calls_parse() {
        let (content, calls) = parse_calls(
            ToolCallParser::Llama3Json,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": 1}}; {\"name\": \"g\", \"parameters\": {}}",
        );
        assert_eq!(content, "");
        assert_eq!(names(&calls), vec![("f", serde_json::json!({"a": 1})), ("g", serde_json::json!({}))]);
        let plain = "The answer is 4.";
        assert_eq!(parse_calls(ToolCallParser::Llama3Json, plain), (plain.to_owned(), Vec::new()));
        let (content, calls) =
            parse_calls(ToolCallParser::Mistral, "ok [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"q\": \"x\"}}]");
        assert_eq!(content, "ok");
        assert_eq!(names(&calls), vec![("f", serde_json::json!({"q": "x"}))]);
    }

    fn run(mode: ToolMode, deltas: &[&str]) -> (String, Vec<ToolCallDelta>) {
        let mut s = ToolStream::new(mode);
        let (mut content, mut calls) = (String::new(), Vec::new());
        for d in deltas {
            let p = s.push(d);
            content.push_str(&p.content);
            calls.extend(p.calls);
        }
        let p = s.finish();
        content.push_str(&p.content);
        calls.extend(p.calls);
        (content, calls)
    }

    #[test]
    fn streams_hold_back_what_may_open_a_call() {
        let mut s = ToolStream::new(ToolMode::Auto(ToolCallParser::Hermes));
        assert_eq!(s.push("Hi <tool").content, "Hi", "the space before a call is held too");
        assert_eq!(s.push("_ca").content, "");
        assert_eq!(s.push("ll>{\"name\": \"f\", \"arguments\": {\"a\": 2}}</tool_call>").content, "");
        let end = s.finish();
        assert_eq!(end.content, "");
        assert_eq!(end.calls.len(), 1);
        assert_eq!(end.calls[0].function.name.as_deref(), Some("f"));
        assert!(end.calls[0].id.as_deref().unwrap().starts_with("call_"));
        assert!(s.called());
        // Text that only looked like a marker is released in full.
        assert_eq!(run(ToolMode::Auto(ToolCallParser::Hermes), &["a <to", "y> b"]), ("a <toy> b".into(), Vec::new()));
    }

    #[test]
    fn named_calls_stream_their_arguments_and_required_ones_come_whole() {
        let (content, calls) = run(ToolMode::Named("f".into()), &["{\"a\"", ": 1}"]);
        assert_eq!(content, "");
        assert_eq!(calls[0].function.name.as_deref(), Some("f"));
        let args: String = calls.iter().filter_map(|c| c.function.arguments.clone()).collect();
        assert_eq!(args, "{\"a\": 1}");
        assert!(calls[1..].iter().all(|c| c.index == 0 && c.id.is_none()));
        let (_, calls) = run(
            ToolMode::Required,
            &["[{\"name\":\"f\",\"parameters\":{\"a\":1}},", "{\"name\":\"g\",\"parameters\":{}}]"],
        );
        assert_eq!(
            calls.iter().map(|c| (c.index, c.function.name.clone().unwrap())).collect::<Vec<_>>(),
            vec![(0, "f".into()), (1, "g".into())]
        );
    }
}
