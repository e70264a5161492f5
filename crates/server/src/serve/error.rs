//! [`ApiError`]: the one error type of the HTTP API, and the one mapping from every failure
//! to an HTTP status plus OpenAI's error JSON:
//!
//! ```json
//! {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
//! ```
//!
//! Before a response has started, an error is that JSON with its status; once a stream has
//! started (the status is already 200), it is one SSE event carrying the same object
//! ([`ApiError::sse_event`]), followed by `data: [DONE]`. The headers some statuses need go
//! on here too, once: `Retry-After` on 429, `Connection: close` on 413 and 408 (the body
//! was not read to its end, so the connection cannot carry another request).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use met_scheduler::{RequestError, RequestErrorKind, SubmitError};
use serde::Serialize;

use met_text::TextError;

/// A request that failed, as OpenAI reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `rate_limit_error`, `server_error`.
    pub kind: &'static str,
    /// The request field at fault (`messages[1].content`), when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`), when there is one.
    pub code: Option<&'static str>,
}

const INVALID: &str = "invalid_request_error";

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), kind, param: None, code: None }
    }

    fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// 400: the request field `param` is out of range or contradicts another.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID, message).with_param(param)
    }

    /// 400: the body is not JSON.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, INVALID, message)
    }

    /// 400: the prompt (or prompt plus `max_tokens`, named by `param`) exceeds the context.
    pub fn context_length(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::invalid(param, message).with_code("context_length_exceeded")
    }

    /// 400: the engine refuses the field `param` (its name in the request's API):
    /// `context_length_exceeded` for a prompt (or prompt and `max_tokens`) longer than the
    /// context.
    pub fn refused(kind: RequestErrorKind, param: &str, message: impl Into<String>) -> Self {
        match kind {
            RequestErrorKind::ContextLength => Self::context_length(param, message),
            RequestErrorKind::Invalid => Self::invalid(param, message),
        }
    }

    /// 401: the API key is missing or wrong.
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, INVALID, "missing or incorrect API key; send `Authorization: Bearer KEY`")
            .with_code("invalid_api_key")
    }

    /// 404: a `model` this server does not serve.
    pub fn model_not_found(model: &str, served: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            INVALID,
            format!("the model `{model}` does not exist; this server serves `{served}`"),
        )
        .with_param("model")
        .with_code("model_not_found")
    }

    /// 404: the thing the request field `param` names does not exist (a LoRA adapter).
    pub fn not_found(param: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, INVALID, message).with_param(param).with_code("not_found")
    }

    /// 404: no such route.
    pub fn route_not_found(path: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, INVALID, format!("no route {path}")).with_code("not_found")
    }

    /// 405: the route exists but not for this method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        Self::new(StatusCode::METHOD_NOT_ALLOWED, INVALID, format!("{method} is not allowed on {path}"))
            .with_code("method_not_allowed")
    }

    /// 413: the body exceeds `limit` bytes.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            INVALID,
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with_code("payload_too_large")
    }

    /// 403: a browser request from an origin `--allowed-origins` does not list.
    pub fn origin_not_allowed(origin: &str) -> Self {
        let message = format!("requests from the origin {origin} are not allowed (see --allowed-origins)");
        Self::new(StatusCode::FORBIDDEN, INVALID, message).with_code("origin_not_allowed")
    }

    /// 408: the body did not arrive within `timeout`.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        let message = format!("the request body did not arrive within {timeout:?}");
        Self::new(StatusCode::REQUEST_TIMEOUT, INVALID, message).with_code("request_timeout")
    }

    /// 414: the request target is longer than `limit` bytes.
    pub fn uri_too_long(limit: usize) -> Self {
        let message = format!("the request URI exceeds the limit of {limit} bytes");
        Self::new(StatusCode::URI_TOO_LONG, INVALID, message).with_code("uri_too_long")
    }

    /// 415: a JSON endpoint got a body of another type.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        let message = format!("the body must be JSON (Content-Type: application/json), not `{content_type}`");
        Self::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, INVALID, message).with_code("unsupported_media_type")
    }

    /// 431: more than `count` headers, or more than `bytes` bytes of them.
    pub fn headers_too_large(count: usize, bytes: usize) -> Self {
        let message = format!("the request headers exceed the limit of {count} headers or {bytes} bytes");
        Self::new(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, INVALID, message).with_code("headers_too_large")
    }

    /// 429: `limit` generation requests are already in flight.
    pub fn too_many_requests(limit: usize) -> Self {
        let message = format!("the server is serving its limit of {limit} concurrent requests; retry later");
        Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message).with_code("rate_limit_exceeded")
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// 503 inside a stream: the drain timeout cut it before it finished.
    pub fn drain_cut() -> Self {
        Self::unavailable("the server is shutting down: the drain timeout ended this stream")
    }

    /// 503: the server is starting or shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message).with_code("service_unavailable")
    }

    /// A chat template or tokenizer failure: the template rejecting the conversation is the
    /// request's fault (400 on `messages`), the tokenizer failing is the server's.
    pub fn from_text(err: TextError) -> Self {
        match err {
            TextError::Raised { .. } | TextError::Render(_) | TextError::Template { .. } => {
                Self::invalid("messages", err.to_string())
            }
            other => Self::internal(other.to_string()),
        }
    }

    /// The SSE event that reports this error inside a stream that has already started.
    pub fn sse_event(&self) -> Event {
        Event::default().data(serde_json::to_string(&self.body()).unwrap_or_default())
    }

    fn body(&self) -> ErrorBody<'_> {
        ErrorBody {
            error: ErrorObject {
                message: &self.message,
                kind: self.kind,
                param: self.param.as_deref(),
                code: self.code,
            },
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(err: SubmitError) -> Self {
        match err {
            SubmitError::Invalid(e) => e.into(),
            SubmitError::EngineStopped => Self::unavailable("the engine has stopped"),
        }
    }
}

impl From<RequestError> for ApiError {
    /// [`ApiError::refused`], the field named as chat completions names it.
    fn from(e: RequestError) -> Self {
        Self::refused(e.kind, e.field.name(), e.msg)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status.as_u16(), self.message)
    }
}

impl std::error::Error for ApiError {}

/// Seconds a client told 429 should wait: the slots of the concurrency limit turn over
/// within a generation or two.
const RETRY_AFTER_SECS: &str = "1";

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body())).into_response();
        // Kept beside the OpenAI-shaped body, so that a route speaking another wire format
        // can answer the same error in its own (see `anthropic::own_error_format`).
        response.extensions_mut().insert(self.clone());
        let headers = response.headers_mut();
        match self.status {
            StatusCode::TOO_MANY_REQUESTS => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER_SECS));
            }
            StatusCode::PAYLOAD_TOO_LARGE | StatusCode::REQUEST_TIMEOUT => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        response
    }
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    param: Option<&'a str>,
    code: Option<&'static str>,
}
