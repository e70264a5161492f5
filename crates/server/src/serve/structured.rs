//! Structured output on the wire: OpenAI's `response_format` (`json_object`, `json_schema`)
//! and vLLM's `structured_outputs` extension (`json`, `regex`, `choice`, `grammar`,
//! `json_object`) become one [`GrammarSpec`] with the field it came from, compiled on the
//! blocking worker by the served tokenizer's [`met_grammar::Grammars`].
//!
//! Every way a request can get this wrong is a 400 naming the field: both fields at once,
//! several kinds in `structured_outputs`, an unknown `type`, a schema missing or not an
//! object, and whatever the grammar engine refuses (invalid or unsupported schemas, bad
//! regular expressions, Lark syntax errors, an empty choice list), with its message.

use met_grammar::{GrammarError, GrammarSpec};
use met_scheduler::SharedConstraint;
use serde::Deserialize;
use serde_json::Value;

use super::dialect::Dialect;
use super::error::ApiError;
use super::state::AppState;

/// OpenAI's `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// With `json_schema`: the schema and its name.
    #[serde(default)]
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct JsonSchemaFormat {
    /// The schema's name (reported back by OpenAI; unused here).
    pub name: Option<String>,
    /// What it is for (unused).
    pub description: Option<String>,
    /// The JSON Schema.
    pub schema: Option<Value>,
    /// OpenAI's strict mode; output always follows the schema here, so this changes nothing.
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs`: exactly one of its fields.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct StructuredOutputs {
    /// A JSON Schema, as an object or as JSON text.
    pub json: Option<Value>,
    /// A regular expression the whole output matches.
    pub regex: Option<String>,
    /// The output is one of these strings.
    pub choice: Option<Vec<String>>,
    /// A Lark grammar (llguidance's dialect).
    pub grammar: Option<String>,
    /// Any JSON object.
    pub json_object: Option<bool>,
}

/// What a request's output must match, and the request field that said so.
#[derive(Debug, Clone)]
pub struct GrammarRequest {
    /// The grammar.
    pub spec: GrammarSpec,
    /// The field, as the client wrote it (`response_format.json_schema.schema`).
    pub param: String,
}

/// The grammar of a request's `response_format` or `structured_outputs`, if any.
///
/// # Errors
/// A 400 naming the field for both fields at once, several kinds at once, an unknown
/// `type`, or a missing or malformed schema.
pub fn parse(
    format: Option<ResponseFormat>,
    outputs: Option<StructuredOutputs>,
    dialect: Dialect,
) -> Result<Option<GrammarRequest>, ApiError> {
    match (format, outputs) {
        (Some(_), Some(_)) => {
            let msg = format!("give either {} or structured_outputs, not both", dialect.response_format(""));
            Err(ApiError::invalid("structured_outputs", msg))
        }
        (Some(format), None) => response_format(format, dialect),
        (None, Some(outputs)) => structured_outputs(outputs).map(Some),
        (None, None) => Ok(None),
    }
}

fn response_format(format: ResponseFormat, dialect: Dialect) -> Result<Option<GrammarRequest>, ApiError> {
    let spec = match format.kind.as_str() {
        "text" => return Ok(None),
        "json_object" => GrammarSpec::JsonObject,
        "json_schema" => {
            let param = dialect.response_format(".json_schema.schema");
            let Some(schema) = format.json_schema.and_then(|f| f.schema) else {
                return Err(ApiError::invalid(param, "`json_schema` needs a `schema`"));
            };
            let spec = GrammarSpec::JsonSchema(schema_value(schema, &param)?);
            return Ok(Some(GrammarRequest { spec, param }));
        }
        other => {
            let msg = format!("`{other}` is not one of `text`, `json_object`, `json_schema`");
            return Err(ApiError::invalid(dialect.response_format(".type"), msg));
        }
    };
    Ok(Some(GrammarRequest { spec, param: dialect.response_format("") }))
}

fn structured_outputs(o: StructuredOutputs) -> Result<GrammarRequest, ApiError> {
    let given =
        [o.json.is_some(), o.regex.is_some(), o.choice.is_some(), o.grammar.is_some(), o.json_object == Some(true)];
    if given.iter().filter(|&&g| g).count() != 1 {
        let msg = "give exactly one of `json`, `regex`, `choice`, `grammar` and `json_object`";
        return Err(ApiError::invalid("structured_outputs", msg));
    }
    let (spec, param) = if let Some(json) = o.json {
        let param = "structured_outputs.json";
        (GrammarSpec::JsonSchema(schema_value(json, param)?), param)
    } else if let Some(rx) = o.regex {
        (GrammarSpec::Regex(rx), "structured_outputs.regex")
    } else if let Some(choice) = o.choice {
        (GrammarSpec::Choice(choice), "structured_outputs.choice")
    } else if let Some(lark) = o.grammar {
        (GrammarSpec::Lark(lark), "structured_outputs.grammar")
    } else {
        (GrammarSpec::JsonObject, "structured_outputs.json_object")
    };
    Ok(GrammarRequest { spec, param: param.to_owned() })
}

/// A schema given as an object or a boolean, or as JSON text holding one.
fn schema_value(schema: Value, param: &str) -> Result<Value, ApiError> {
    let schema = match schema {
        Value::String(text) => serde_json::from_str(&text)
            .map_err(|e| ApiError::invalid(param, format!("the schema is not valid JSON: {e}")))?,
        other => other,
    };
    if schema.is_object() || schema.is_boolean() {
        Ok(schema)
    } else {
        Err(ApiError::invalid(param, "a JSON Schema is an object (or a boolean)"))
    }
}

/// Compiles `grammar` with the served tokenizer's grammar engine. Blocking (a large
/// schema takes milliseconds): call it on a blocking worker.
///
/// # Errors
/// A 400 naming the field with the grammar engine's message.
pub fn compile(state: &AppState, grammar: &GrammarRequest) -> Result<SharedConstraint, ApiError> {
    let grammars = state.grammars().map_err(|e| ApiError::invalid(&grammar.param, e.to_string()))?;
    grammars.compile(&grammar.spec).map_err(|e| match e {
        GrammarError::Invalid(msg) => {
            ApiError::invalid(&grammar.param, format!("`{}` is invalid: {msg}", grammar.param))
        }
        GrammarError::Tokenizer(_) => ApiError::invalid(&grammar.param, e.to_string()),
    })
}
