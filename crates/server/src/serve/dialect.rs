//! [`Dialect`]: the API a generation request came in through. OpenAI's chat completions,
//! completions and Responses APIs and Anthropic's Messages API share one validation path
//! (`validate`), but call some fields by other names (the prompt is `messages`, `prompt` or
//! `input`; the token limit `max_tokens`, `max_completion_tokens` or `max_output_tokens`).
//! Every error is born with the name its client used: nothing is renamed afterwards.

use met_config::RequestField;

/// Which completion endpoint's semantics a request follows (and so the shape of its answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions` (and the APIs run as chat requests).
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// The API a request came in through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// OpenAI `/v1/chat/completions`.
    Chat,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`, run as a chat request.
    Responses,
    /// Anthropic `/v1/messages`, run as a chat request.
    Messages,
}

impl Dialect {
    /// The completion endpoint whose semantics the request follows.
    pub fn endpoint(self) -> Endpoint {
        match self {
            Self::Completions => Endpoint::Completions,
            Self::Chat | Self::Responses | Self::Messages => Endpoint::Chat,
        }
    }

    /// The field that holds the prompt.
    pub fn prompt(self) -> &'static str {
        match self {
            Self::Chat | Self::Messages => "messages",
            Self::Completions => "prompt",
            Self::Responses => "input",
        }
    }

    /// The field that bounds the tokens to generate; in chat, `max_completion_tokens` when
    /// the request used that name.
    pub fn max_tokens(self, completion_tokens_given: bool) -> &'static str {
        match self {
            Self::Chat if completion_tokens_given => "max_completion_tokens",
            Self::Responses => "max_output_tokens",
            Self::Chat | Self::Completions | Self::Messages => "max_tokens",
        }
    }

    /// The field of stop strings, and what a message calls them.
    pub fn stop(self) -> (&'static str, &'static str) {
        match self {
            Self::Messages => ("stop_sequences", "stop sequences"),
            _ => ("stop", "stop strings"),
        }
    }

    /// The field at `path` inside the response format (`""`, `".type"`,
    /// `".json_schema.schema"`); the Responses API keeps it in `text.format`, without the
    /// `json_schema` level.
    pub fn response_format(self, path: &str) -> String {
        match self {
            Self::Responses => format!("text.format{}", path.strip_prefix(".json_schema").unwrap_or(path)),
            _ => format!("response_format{path}"),
        }
    }

    /// The name of `field`, a field the engine's checks refuse, with `max_tokens` the name
    /// the request's token limit goes by.
    pub fn field(self, field: RequestField, max_tokens: &'static str) -> &'static str {
        match field {
            RequestField::Prompt => self.prompt(),
            RequestField::MaxTokens => max_tokens,
            RequestField::TopLogprobs if self == Self::Completions => "logprobs",
            other => other.name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_dialect_names_the_shared_fields_its_own_way() {
        let max = |d: Dialect| d.field(RequestField::MaxTokens, d.max_tokens(false));
        assert_eq!(max(Dialect::Responses), "max_output_tokens");
        assert_eq!(Dialect::Chat.max_tokens(true), "max_completion_tokens");
        assert_eq!(Dialect::Responses.field(RequestField::Prompt, "x"), "input");
        assert_eq!(Dialect::Completions.field(RequestField::TopLogprobs, "x"), "logprobs");
        assert_eq!(Dialect::Chat.field(RequestField::Temperature, "x"), "temperature");
        assert_eq!(Dialect::Messages.stop().0, "stop_sequences");
        assert_eq!(Dialect::Responses.response_format(".json_schema.schema"), "text.format.schema");
        assert_eq!(Dialect::Chat.response_format(".type"), "response_format.type");
    }
}
