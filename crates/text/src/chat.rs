//! [`ChatTemplate`]: messages to a prompt string, as transformers' `apply_chat_template`.
//!
//! Hub templates are Jinja2 run by transformers in an `ImmutableSandboxedEnvironment` with
//! `trim_blocks` and `lstrip_blocks` on (and `keep_trailing_newline` off, Jinja's default),
//! the `loopcontrols` extension, and four helpers: `raise_exception(msg)`, `strftime_now(fmt)`,
//! a `tojson` that is `json.dumps` (no HTML escaping, insertion key order, `indent`), and a
//! `{% generation %}` block tag. This module reproduces that in minijinja, with Python's
//! string methods (minijinja-contrib `pycompat`) and Python's spelling of printed values
//! (`pyfmt`). The template sees what transformers passes: `messages`, `tools`, `documents`,
//! `add_generation_prompt`, the named special tokens (`bos_token`, `eos_token`, `unk_token`,
//! `pad_token`) and any extra keyword arguments, which win over the special tokens.
//!
//! Content given as a list of parts (`[{"type": "text", "text": ...}]`) is passed through as
//! transformers does; a template that only handles strings should be fed
//! [`ChatMessage::flatten_text_parts`] messages instead.
//!
//! **Invariant:** a template that fails to compile or render is an error naming the template
//! line; a `raise_exception` call is [`TextError::Raised`] carrying the template's message.

use std::collections::BTreeMap;
use std::sync::Arc;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, Serde};
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::error::RaisedException;
use super::pyfmt::{self, JsonStyle};
use super::{TextError, Tokenizer};

/// The template's name inside the engine.
const NAME: &str = "chat_template";
/// What transformers appends to the final message to find where it ends in the prompt.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";
/// The names a message's reasoning goes by; templates read the first.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// The time `strftime_now` formats: local time, or a fixed one in tests.
pub type Clock = Arc<dyn Fn() -> jiff::Zoned + Send + Sync>;

/// One chat message as the template sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, or whatever the template accepts.
    pub role: String,
    /// The text; absent (undefined in the template) for an assistant turn that only calls tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    /// Every other field, passed through: `tool_calls`, `tool_call_id`, `name`,
    /// `reasoning_content`, ...
    #[serde(flatten)]
    pub extra: serde_json::Map<String, Json>,
}

/// A message's content: a string, or a list of typed parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Parts such as `{"type": "text", "text": "..."}`, passed to the template unchanged.
    Parts(Vec<serde_json::Map<String, Json>>),
}

impl ChatMessage {
    /// A message with string content.
    #[must_use]
    pub fn text(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: Some(MessageContent::Text(content.into())), extra: serde_json::Map::new() }
    }

    /// This message with list content replaced by its text parts joined with newlines (what
    /// OpenAI-compatible servers do for templates that expect a string).
    #[must_use]
    pub fn flatten_text_parts(mut self) -> Self {
        if let Some(MessageContent::Parts(parts)) = &self.content {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Json::as_str) == Some("text"))
                .filter_map(|p| p.get("text").and_then(Json::as_str))
                .collect();
            self.content = Some(MessageContent::Text(texts.join("\n")));
        }
        self
    }
}

/// How to render a conversation.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header that starts an assistant turn.
    pub add_generation_prompt: bool,
    /// Leave the final (assistant) message open so the model continues it ("prefill"), as
    /// transformers' `continue_final_message`. Excludes `add_generation_prompt`.
    pub continue_final_message: bool,
    /// Tool schemas (`{"type": "function", "function": {...}}`), `None` when the request has none.
    pub tools: Option<Vec<Json>>,
    /// Retrieval documents, for templates that take them.
    pub documents: Option<Vec<Json>>,
    /// Extra template variables (`chat_template_kwargs` such as `enable_thinking`).
    pub kwargs: serde_json::Map<String, Json>,
}

/// A compiled chat template with the special tokens it may print.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    specials: Vec<(&'static str, String)>,
    clock: Clock,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("specials", &self.specials).finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; `bos`/`eos` are what `bos_token`/`eos_token` print.
    ///
    /// # Errors
    /// [`TextError::Template`] with the line of the syntax error.
    pub fn new(source: &str, bos: Option<&str>, eos: Option<&str>) -> Result<Self, TextError> {
        let specials = [("bos_token", bos), ("eos_token", eos)];
        Self::compile(source, specials.into_iter().filter_map(|(k, v)| Some((k, v?.to_owned()))).collect())
    }

    /// The tokenizer's own template with all its named special tokens, or `None` if it
    /// ships no template.
    ///
    /// # Errors
    /// As [`ChatTemplate::new`].
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<Option<Self>, TextError> {
        let Some(source) = tokenizer.chat_template() else { return Ok(None) };
        let named = tokenizer.special_tokens();
        let specials = [
            ("bos_token", &named.bos),
            ("eos_token", &named.eos),
            ("unk_token", &named.unk),
            ("pad_token", &named.pad),
        ];
        let specials = specials.into_iter().filter_map(|(k, t)| Some((k, t.as_ref()?.text.clone()))).collect();
        Self::compile(source, specials).map(Some)
    }

    fn compile(source: &str, specials: Vec<(&'static str, String)>) -> Result<Self, TextError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder().trim_blocks(true).lstrip_blocks(true).build()?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let mut text = String::new();
            pyfmt::write_python_str(&mut text, value);
            out.write_str(&text).map_err(Error::from)
        });
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, rewrite_generation_tags(source))?;
        let clock: Clock = Arc::new(jiff::Zoned::now);
        Ok(Self { env, source: source.to_owned(), specials, clock })
    }

    /// Makes `strftime_now` format the time `clock` returns instead of the local time.
    #[must_use]
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The template source.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` into a prompt.
    ///
    /// # Errors
    /// [`TextError::Raised`] when the template calls `raise_exception`,
    /// [`TextError::Template`] (with the line) when rendering fails, and
    /// [`TextError::Render`] when `continue_final_message` cannot be honoured or a keyword
    /// argument shadows `messages`, `tools`, `documents` or `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String, TextError> {
        // Python would reject these as keyword arguments given twice.
        let fixed = ["messages", "tools", "documents", "add_generation_prompt"];
        if let Some(name) = fixed.iter().find(|name| options.kwargs.contains_key(**name)) {
            return Err(TextError::Render(format!("template keyword argument `{name}` is set by the request itself")));
        }
        let mut messages: Vec<Json> = messages.iter().map(|m| alias_reasoning(to_json(m))).collect();
        let continued = if options.continue_final_message {
            if options.add_generation_prompt {
                return Err(TextError::Render(
                    "continue_final_message and add_generation_prompt are not compatible".into(),
                ));
            }
            Some(self.tag_final_message(&mut messages)?)
        } else {
            None
        };
        let rendered = self.env.get_template(NAME)?.render(self.context(messages, options))?;
        match continued {
            Some(final_text) => cut_at_tag(rendered, &final_text),
            None => Ok(rendered),
        }
    }

    /// The variables the template sees, in transformers' precedence: keyword arguments win
    /// over the special tokens and the helpers.
    fn context(&self, messages: Vec<Json>, options: &RenderOptions) -> Value {
        let clock = Arc::clone(&self.clock);
        let strftime_now = Value::from_function(move |format: &str| -> Result<String, Error> {
            jiff::fmt::strtime::format(format, &clock())
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now({format:?}): {e}")))
        });
        let json = |v: &Option<Vec<Json>>| v.as_ref().map_or(Value::from(()), json_value);
        let mut vars = BTreeMap::from([
            ("messages".to_owned(), json_value(&messages)),
            ("tools".to_owned(), json(&options.tools)),
            ("documents".to_owned(), json(&options.documents)),
            ("add_generation_prompt".to_owned(), Value::from(options.add_generation_prompt)),
            ("strftime_now".to_owned(), strftime_now),
        ]);
        vars.extend(self.specials.iter().map(|(k, v)| ((*k).to_owned(), Value::from(v.as_str()))));
        vars.extend(options.kwargs.iter().map(|(k, v)| (k.clone(), json_value(v))));
        Value::from(vars)
    }

    /// Appends [`CONTINUE_TAG`] to the text the final message ends with and returns that
    /// text (before the tag), as transformers does.
    fn tag_final_message(&self, messages: &mut [Json]) -> Result<String, TextError> {
        let last = messages
            .last_mut()
            .ok_or_else(|| TextError::Render("continue_final_message is set but the conversation is empty".into()))?;
        if !self.source.contains("content") {
            return Err(TextError::Render(
                "continue_final_message is set but the template never reads `content`".into(),
            ));
        }
        let no_text = || TextError::Render("continue_final_message is set but the final message has no text".into());
        match last.get_mut("content") {
            Some(Json::String(text)) => {
                let final_text = text.clone();
                text.push_str(CONTINUE_TAG);
                Ok(final_text)
            }
            Some(Json::Array(parts)) => {
                let part = parts.iter_mut().rev().find_map(|p| p.get_mut("text")).ok_or_else(no_text)?;
                let final_text = part.as_str().ok_or_else(no_text)?.to_owned();
                *part = Json::String(format!("{final_text}{CONTINUE_TAG}"));
                Ok(final_text)
            }
            _ => Err(no_text()),
        }
    }
}

/// Cuts a prompt rendered with [`CONTINUE_TAG`] right where the final message's text ends
/// (or before the whitespace the template trimmed there).
fn cut_at_tag(rendered: String, final_text: &str) -> Result<String, TextError> {
    let tag = CONTINUE_TAG.trim();
    let Some(at) = rendered.rfind(tag).filter(|_| rendered.contains(final_text.trim())) else {
        return Err(TextError::Render(
            "continue_final_message is set but the final message does not appear in the rendered prompt \
             (the template changes or drops it)"
                .into(),
        ));
    };
    let mut prompt = rendered;
    if prompt[at..].starts_with(CONTINUE_TAG) {
        prompt.truncate(at);
    } else {
        prompt.truncate(prompt[..at].trim_end().len());
    }
    Ok(prompt)
}

/// A serde value (JSON, a message) as a template value; maps keep their key order.
fn json_value<T: Serialize>(value: T) -> Value {
    Value::from(Serde(value))
}

fn to_json(message: &ChatMessage) -> Json {
    serde_json::to_value(message).unwrap_or(Json::Null)
}

/// Copies a message's reasoning under `thinking` and `reasoning_content`, as transformers
/// does (`{"thinking": r, **message, "reasoning_content": r}`), so templates reading either
/// name find it.
fn alias_reasoning(message: Json) -> Json {
    let Json::Object(fields) = message else { return message };
    let reasoning = REASONING_FIELDS.iter().find_map(|k| fields.get(*k).filter(|v| !v.is_null())).cloned();
    let Some(reasoning) = reasoning else { return Json::Object(fields) };
    let mut aliased = serde_json::Map::with_capacity(fields.len() + 2);
    aliased.insert("thinking".into(), reasoning.clone());
    // An existing `thinking` keeps the first position but its own value, as in the dict literal.
    aliased.extend(fields);
    aliased.insert("reasoning_content".into(), reasoning);
    Json::Object(aliased)
}

/// HF's `tojson`: `json.dumps(value, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, each keyword overridable.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let mut style = JsonStyle {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
        ..JsonStyle::default()
    };
    let indent: Option<Value> = kwargs.get("indent")?;
    style.indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == minijinja::value::ValueKind::String => v.as_str().map(str::to_owned),
        Some(v) => Some(" ".repeat(v.as_i64().ok_or_else(|| bad_kwarg("indent"))?.max(0) as usize)),
    };
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    style.separators = match separators.as_deref() {
        None => None,
        Some([item, key]) => Some((item.clone(), key.clone())),
        Some(_) => return Err(bad_kwarg("separators")),
    };
    kwargs.assert_all_used()?;
    pyfmt::to_json(value, &style)
}

fn bad_kwarg(name: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: invalid `{name}`"))
}

/// `raise_exception(msg)`: fails the render with the template's message.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message).with_source(RaisedException))
}

/// Turns HF's `{% generation %}` / `{% endgeneration %}` (which mark assistant text for
/// training masks and render their body unchanged) into `{% if true %}` / `{% endif %}`,
/// keeping the whitespace-control markers so the output is the same.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else { break };
        let inner = &tag[2..end];
        let open = inner.strip_prefix(['-', '+']).map_or("", |_| &inner[..1]);
        let close = inner.strip_suffix(['-', '+']).map_or("", |_| &inner[inner.len() - 1..]);
        let word = inner[open.len()..inner.len() - close.len()].trim();
        match word {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        let src = "a{%- generation -%}b{% endgeneration %}c{{ x }}{% if y %}{% endif %}";
        assert_eq!(rewrite_generation_tags(src), "a{%- if true -%}b{% endif %}c{{ x }}{% if y %}{% endif %}");
        let template = ChatTemplate::new("{% generation %}\nhi\n{% endgeneration %}\n", None, None).unwrap();
        assert_eq!(template.render(&[], &RenderOptions::default()).unwrap(), "hi\n");
    }

    #[test]
    fn reasoning_is_aliased_like_transformers() {
        let message: Json = serde_json::json!({"role": "assistant", "reasoning": "r", "content": "c"});
        let aliased = alias_reasoning(message);
        let keys: Vec<&str> = aliased.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["thinking", "role", "reasoning", "content", "reasoning_content"]);
        assert_eq!(aliased["thinking"], "r");
        assert_eq!(aliased["reasoning_content"], "r");
    }

    #[test]
    fn printed_values_are_spelled_as_python() {
        let template = ChatTemplate::new("{{ none }} {{ true }} {{ [1, 'a'] }} {{ 1.0 }} {{ x }}", None, None).unwrap();
        let mut options = RenderOptions::default();
        options.kwargs.insert("x".into(), serde_json::json!({"k": null}));
        assert_eq!(template.render(&[], &options).unwrap(), "None True [1, 'a'] 1.0 {'k': None}");
    }

    #[test]
    fn flattening_joins_text_parts() {
        let message: ChatMessage = serde_json::from_value(serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}, {"type": "text", "text": "b"}]
        }))
        .unwrap();
        assert_eq!(message.flatten_text_parts().content, Some(MessageContent::Text("a\nb".into())));
    }
}
