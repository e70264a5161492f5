//! Structured output for met: the token masks that hold a request's output to a JSON
//! Schema, a regular expression, a Lark grammar or a list of choices, computed by
//! [`llguidance`] (an Earley parser over derivative-based lexers, walking a trie of the
//! vocabulary's token bytes, incrementally, one token at a time).
//!
//! [`Grammars`] is built once per tokenizer (the token trie costs tens of milliseconds on a
//! 50k vocabulary); [`Grammars::compile`] turns a [`GrammarSpec`] into a
//! [`met_scheduler::SharedConstraint`] for an engine request, or a [`GrammarError`] that
//! names what is wrong with it (the server's 400). Each continuation of the request then
//! walks its own copy of the compiled parser ([`met_scheduler::ConstraintState`]).
//!
//! JSON is generated compact (no whitespace between tokens, `,` and `:` separators), as
//! OpenAI's structured outputs are: a small model cannot then spend its budget on
//! whitespace the schema allows, and the output still parses with any JSON parser. A
//! schema may say otherwise with llguidance's own `x-guidance` options.
//!
//! **Invariant:** a constraint's mask allows only tokens that keep the output a prefix of
//! something the grammar accepts, and the end-of-sequence tokens only where the output is
//! complete, so a sequence that ends by its constraint or by end-of-sequence holds a whole
//! match.

mod vocab;

use std::sync::{Arc, Mutex};

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::{Matcher, ParserFactory};
use met_scheduler::{Constraint, ConstraintState, SharedConstraint};
use serde_json::Value;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// A value valid under this JSON Schema.
    JsonSchema(Value),
    /// A match of this regular expression (Rust `regex` syntax), whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// A sentence of this grammar, in llguidance's Lark syntax (`start: ...`).
    Lark(String),
}

/// Why a grammar cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The tokenizer cannot be described to the grammar engine (no end-of-sequence token,
    /// a decoder it does not know).
    #[error("structured output is not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// The schema, expression or grammar is invalid or unsupported; the message says where.
    #[error("{0}")]
    Invalid(String),
}

/// The grammar engine of one tokenizer: compiles requests' grammars into constraints.
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.factory.tok_env().tok_trie().vocab_size()).finish()
    }
}

impl Grammars {
    /// The grammar engine of `tokenizer`, for a model of `vocab_size` logits (ids the
    /// tokenizer does not have are never allowed).
    ///
    /// # Errors
    /// [`GrammarError::Tokenizer`] when the tokenizer has no end-of-sequence token, or its
    /// token bytes cannot be recovered.
    pub fn new(tokenizer: &met_text::Tokenizer, vocab_size: usize) -> Result<Self, GrammarError> {
        let env = vocab::token_env(tokenizer, vocab_size)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| GrammarError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory) })
    }

    /// Compiles `spec` into a constraint for engine requests.
    ///
    /// # Errors
    /// [`GrammarError::Invalid`] naming what the grammar engine refuses: invalid JSON
    /// Schema, an unsupported keyword, a bad regular expression, Lark syntax errors, an
    /// empty list of choices.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<SharedConstraint, GrammarError> {
        let grammar = top_level(spec)?;
        let parser = self.factory.create_parser(grammar).map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(SharedConstraint(Arc::new(Compiled { fresh: Mutex::new(matcher) })))
    }
}

/// llguidance's form of `spec`.
fn top_level(spec: &GrammarSpec) -> Result<TopLevelGrammar, GrammarError> {
    let grammar = match spec {
        GrammarSpec::JsonObject => GrammarWithLexer::from_json_schema(compact(serde_json::json!({"type": "object"}))),
        GrammarSpec::JsonSchema(schema) => GrammarWithLexer::from_json_schema(compact(schema.clone())),
        GrammarSpec::Regex(rx) => GrammarWithLexer::from_regex(rx),
        GrammarSpec::Choice(choices) => {
            if choices.is_empty() {
                return Err(GrammarError::Invalid("the list of choices is empty".into()));
            }
            let alternatives: Vec<String> = choices.iter().map(|c| Value::from(c.as_str()).to_string()).collect();
            GrammarWithLexer::from_lark(format!("start: {}", alternatives.join(" | ")))
        }
        GrammarSpec::Lark(lark) => GrammarWithLexer::from_lark(lark.clone()),
    };
    Ok(TopLevelGrammar::from_grammar(grammar))
}

/// `schema` generated without whitespace, unless it sets llguidance's options itself.
fn compact(mut schema: Value) -> Value {
    if let Some(object) = schema.as_object_mut() {
        object.entry("x-guidance").or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
    }
    schema
}

/// A compiled grammar: the parser before the first token, copied for each sequence.
struct Compiled {
    fresh: Mutex<Matcher>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Compiled")
    }
}

impl Constraint for Compiled {
    fn start(&self) -> Box<dyn ConstraintState> {
        let fresh = self.fresh.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        Box::new(State { matcher: fresh.deep_clone() })
    }
}

/// One sequence's parser.
struct State {
    matcher: Matcher,
}

impl ConstraintState for State {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<(), String> {
        let allowed = self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?;
        let words = allowed.as_slice();
        let n = words.len().min(mask.len());
        mask[..n].copy_from_slice(&words[..n]);
        Ok(())
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    fn is_complete(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests;
