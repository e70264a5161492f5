//! Tool calling on chat completions: OpenAI's `tools`, `tool_choice` (`none`, `auto`,
//! `required`, a named function) and `parallel_tool_calls`, checked into a [`ToolSetup`].
//!
//! The tools reach the model through the chat template's own `tools` variable. A template
//! that never reads `tools` (SmolLM2's, for one) gets them in a system message instead, in
//! the Hermes format the default parser reads, and sees earlier calls and results as that
//! text, so a conversation with tool turns still renders.
//!
//! `auto` leaves the model free and a [`ToolCallParser`] finds the calls in its text. `required`
//! and a named function are enforced with the grammar engine, as vLLM does: a named choice
//! constrains the output to a JSON object valid under the function's `parameters` (the
//! call's arguments), `required` to a JSON array of `{"name", "parameters"}` objects, one of
//! the tools each (one element at most without `parallel_tool_calls`, [`MAX_CALLS`] with). Even a small model
//! then always produces a call that parses and matches its schema.

use met_grammar::GrammarSpec;
use met_text::{ChatMessage, MessageContent};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::structured::GrammarRequest;
use met_config::ToolCallParser;

/// Most calls a `required` answer may hold: a bound, so a model that keeps calling still
/// ends its answer.
pub const MAX_CALLS: usize = 8;

/// What a request's `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are only shown.
    None,
    /// The model decides; calls are parsed from its text.
    Auto,
    /// At least one call (grammar-enforced).
    Required,
    /// A call of this function (grammar-enforced).
    Named(String),
}

/// One function a request offers.
#[derive(Debug, Clone)]
pub struct Function {
    /// Its name.
    pub name: String,
    /// The JSON Schema of its arguments.
    pub parameters: Value,
}

/// A request's tools, checked.
#[derive(Debug, Clone)]
pub struct ToolSetup {
    /// The `tools` entries as sent (the chat template reads them).
    pub tools: Vec<Value>,
    /// The functions, in order.
    pub functions: Vec<Function>,
    /// What `tool_choice` asks for.
    pub choice: ToolChoice,
    /// Several calls in one answer are allowed.
    pub parallel: bool,
}

#[derive(Deserialize)]
struct ToolWire {
    #[serde(rename = "type")]
    kind: String,
    function: FunctionWire,
}

#[derive(Deserialize)]
struct FunctionWire {
    name: String,
    #[serde(default)]
    parameters: Option<Value>,
}

/// The tool setup of `tools` and `tool_choice`, if the request has tools.
///
/// # Errors
/// A 400 naming the field: a tool that is not a function, a bad or repeated name, parameters
/// that are not a schema object, a `tool_choice` of another shape, a named function that is
/// not among the tools, or a choice other than `none` without tools.
pub fn parse(
    tools: Option<Vec<Value>>,
    choice: Option<Value>,
    parallel: Option<bool>,
) -> Result<Option<ToolSetup>, ApiError> {
    let choice = tool_choice(choice)?;
    let Some(tools) = tools.filter(|t| !t.is_empty()) else {
        return match choice {
            None | Some(ToolChoice::None) => Ok(None),
            Some(_) => Err(ApiError::invalid("tool_choice", "a tool choice needs `tools`")),
        };
    };
    let mut functions: Vec<Function> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let f = function(i, tool)?;
        if functions.iter().any(|g| g.name == f.name) {
            return Err(ApiError::invalid(format!("tools[{i}].function.name"), format!("`{}` is given twice", f.name)));
        }
        functions.push(f);
    }
    let choice = choice.unwrap_or(ToolChoice::Auto);
    if let ToolChoice::Named(name) = &choice
        && !functions.iter().any(|f| &f.name == name)
    {
        return Err(ApiError::invalid("tool_choice", format!("`{name}` is not one of the tools")));
    }
    Ok(Some(ToolSetup { tools, functions, choice, parallel: parallel.unwrap_or(true) }))
}

fn function(i: usize, tool: &Value) -> Result<Function, ApiError> {
    let wire: ToolWire = serde_json::from_value(tool.clone()).map_err(|e| {
        ApiError::invalid(
            format!("tools[{i}]"),
            format!("a tool is `{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}`: {e}"),
        )
    })?;
    if wire.kind != "function" {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            format!("`{}`: only `function` tools exist", wire.kind),
        ));
    }
    let name = wire.function.name;
    let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.';
    if name.is_empty() || name.len() > 64 || !name.chars().all(valid) {
        let msg = format!("`{name}`: a function name is 1 to 64 letters, digits, `_`, `-` or `.`");
        return Err(ApiError::invalid(format!("tools[{i}].function.name"), msg));
    }
    let parameters = match wire.function.parameters {
        None => json!({"type": "object", "properties": {}}),
        Some(p) if p.is_object() => p,
        Some(_) => {
            let msg = "the parameters are a JSON Schema object";
            return Err(ApiError::invalid(format!("tools[{i}].function.parameters"), msg));
        }
    };
    Ok(Function { name, parameters })
}

fn tool_choice(choice: Option<Value>) -> Result<Option<ToolChoice>, ApiError> {
    let bad = || {
        let msg = "`none`, `auto`, `required` or `{\"type\": \"function\", \"function\": {\"name\": ...}}`";
        ApiError::invalid("tool_choice", msg)
    };
    let Some(choice) = choice else { return Ok(None) };
    let parsed = match &choice {
        Value::String(s) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            _ => return Err(bad()),
        },
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(bad)?;
            ToolChoice::Named(name.to_owned())
        }
        _ => return Err(bad()),
    };
    Ok(Some(parsed))
}

impl ToolSetup {
    /// The grammar that enforces `required` or a named choice; `None` for the others.
    pub fn grammar(&self) -> Option<GrammarRequest> {
        let schema = match &self.choice {
            ToolChoice::None | ToolChoice::Auto => return None,
            ToolChoice::Named(name) => self.functions.iter().find(|f| &f.name == name)?.parameters.clone(),
            ToolChoice::Required => {
                let calls: Vec<Value> = self
                    .functions
                    .iter()
                    .map(|f| {
                        json!({
                            "type": "object",
                            "properties": {"name": {"const": f.name}, "parameters": f.parameters},
                            "required": ["name", "parameters"],
                            "additionalProperties": false
                        })
                    })
                    .collect();
                let most = if self.parallel { MAX_CALLS } else { 1 };
                json!({"type": "array", "minItems": 1, "maxItems": most, "items": {"anyOf": calls}})
            }
        };
        Some(GrammarRequest { spec: GrammarSpec::JsonSchema(schema), param: "tools".into() })
    }
}

/// Whether a chat template renders `tools` itself.
pub fn template_reads_tools(source: &str) -> bool {
    source.contains("tools")
}

/// The parser for a template: the one its own tool format implies, else Hermes (also the
/// format of the system message for templates without tools).
pub fn parser_for_template(source: &str) -> ToolCallParser {
    if source.contains("[TOOL_CALLS]") {
        ToolCallParser::Mistral
    } else if source.contains("<|python_tag|>") || source.contains("ipython") {
        ToolCallParser::Llama3Json
    } else {
        ToolCallParser::Hermes
    }
}

/// Messages as templates expect them: each assistant call's `arguments` as a JSON value (the
/// wire sends a string; templates `tojson` it), and, for a template that does not read
/// `tools`, the tools in a first system message and the calls and results as Hermes text.
pub fn prepare_messages(
    messages: Vec<ChatMessage>,
    setup: Option<&ToolSetup>,
    template_tools: bool,
) -> Vec<ChatMessage> {
    let mut messages: Vec<ChatMessage> = messages.into_iter().map(arguments_as_values).collect();
    if template_tools {
        return messages;
    }
    let had_tool_turns = messages.iter().any(|m| m.role == "tool" || m.extra.contains_key("tool_calls"));
    if had_tool_turns {
        messages = messages.into_iter().map(tool_turn_as_text).collect();
    }
    if let Some(setup) = setup {
        let listed: Vec<String> = setup.tools.iter().map(Value::to_string).collect();
        let prompt = format!(
            "You may call functions to answer. They are described in JSON Schema inside <tools></tools>:\n\
             <tools>\n{}\n</tools>\nTo call one, answer with <tool_call>{{\"name\": NAME, \"arguments\": \
             ARGUMENTS}}</tool_call>, one such block per call.",
            listed.join("\n")
        );
        match messages.first_mut() {
            Some(first) if first.role == "system" => {
                let text = text_of(first);
                first.content = Some(MessageContent::Text(format!("{text}\n\n{prompt}")));
            }
            _ => messages.insert(0, ChatMessage::text("system", prompt)),
        }
    }
    messages
}

fn text_of(m: &ChatMessage) -> String {
    match m.clone().flatten_text_parts().content {
        Some(MessageContent::Text(t)) => t,
        _ => String::new(),
    }
}

fn arguments_as_values(mut m: ChatMessage) -> ChatMessage {
    if let Some(Value::Array(calls)) = m.extra.get_mut("tool_calls") {
        for call in calls {
            let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) else { continue };
            if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()) {
                *args = parsed;
            }
        }
    }
    m
}

/// An assistant turn with calls, or a tool result, as plain Hermes text.
fn tool_turn_as_text(m: ChatMessage) -> ChatMessage {
    if m.role == "tool" {
        return ChatMessage::text("tool", format!("<tool_response>\n{}\n</tool_response>", text_of(&m)));
    }
    let Some(Value::Array(calls)) = m.extra.get("tool_calls") else {
        let text = text_of(&m);
        return ChatMessage { content: Some(MessageContent::Text(text)), ..m };
    };
    let mut text = text_of(&m);
    for call in calls {
        let f = call.get("function").cloned().unwrap_or_default();
        let mut shown = Map::new();
        shown.insert("name".into(), f.get("name").cloned().unwrap_or_default());
        shown.insert("arguments".into(), f.get("arguments").cloned().unwrap_or_else(|| json!({})));
        text.push_str(&format!("\n<tool_call>\n{}\n</tool_call>", Value::Object(shown)));
    }
    ChatMessage::text(m.role, text.trim_start().to_owned())
}
