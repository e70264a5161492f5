//! [`app`]: the HTTP routes, as an axum `Router` that tests drive in-process
//! (`tower::ServiceExt::oneshot`) and `met serve` puts behind a socket.
//!
//! Cross-cutting rules live here, once, as layers:
//! - request heads: URI and header limits below hyper's own, so their 414 and 431 answers
//!   are OpenAI-shaped JSON like every other error;
//! - CORS: a request with an `Origin` that `--allowed-origins` does not list is a 403, an
//!   allowed one gets `Access-Control-Allow-Origin`, and a preflight (`OPTIONS` with
//!   `Access-Control-Request-Method`) is answered here with 204;
//! - the API key: every route but `/health` (and `/metrics` with
//!   `--metrics-without-auth`) needs it, compared in constant time, checked before a body is
//!   read;
//! - JSON bodies: another `Content-Type` is a 415, a `Content-Length` over the limit a 413
//!   before anything is read (so hyper sends no `100 Continue`), a body that stalls past the
//!   read timeout a 408; the handlers get the body already read;
//! - OpenAI-shaped 404 and 405 answers, and the `met_http_requests_total` count of every
//!   response by route template and status;
//! - on the Anthropic routes, every one of these errors in Anthropic's error shape instead
//!   (`anthropic::own_error_format`).
//!
//! The LoRA routes exist only on a server with adapters (`--enable-lora`); their handlers
//! are in `lora`.
//!
//! The small endpoints (health, models, metrics, tokenize, detokenize) are here too;
//! tokenize and detokenize take a slot of the concurrency limit like generation does.
//! Generation is in `openai`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use met_config::RequestField;
use met_telemetry::metrics::CONTENT_TYPE;

use super::error::ApiError;
use super::state::AppState;
use super::wire::{
    ApiJson, DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use super::{anthropic, lora, openai, responses};
use met_text::{ChatMessage, RenderOptions};

/// Every route, as the `endpoint` label of the HTTP metric (a fixed set keeps the number of
/// series bounded).
const ROUTES: [&str; 12] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/tokenize",
    "/detokenize",
    "/v1/responses",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
];

/// Longest request target, in bytes (hyper's own limit, answered without a body, is 64 KiB).
pub const MAX_URI_BYTES: usize = 8 << 10;
/// Most request headers (hyper's own limit is set above it by `met serve`).
pub const MAX_HEADERS: usize = 100;
/// Most bytes of request headers, names and values (hyper's buffer is larger).
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// The HTTP layer's settings, the `met serve` flags the handlers never see.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// `/metrics` answers without the API key (`--metrics-without-auth`).
    pub metrics_without_auth: bool,
    /// Origins browsers may call from (`--allowed-origins`); `*` allows any. Empty: none.
    pub allowed_origins: Vec<String>,
    /// Longest wait for a request body to arrive in full (`--http-read-timeout-secs`).
    pub body_read_timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self { metrics_without_auth: false, allowed_origins: Vec::new(), body_read_timeout: Duration::from_secs(30) }
    }
}

impl HttpOptions {
    fn allows_origin(&self, origin: &[u8]) -> bool {
        self.allowed_origins.iter().any(|o| o == "*" || o.as_bytes() == origin)
    }
}

/// What the layers share: the app state and the HTTP options.
#[derive(Clone)]
struct Layers {
    state: AppState,
    options: Arc<HttpOptions>,
}

/// The router of the whole API over `state`, with default [`HttpOptions`].
pub fn app(state: AppState) -> Router {
    app_with(state, HttpOptions::default())
}

/// The router of the whole API over `state`.
pub fn app_with(state: AppState, options: HttpOptions) -> Router {
    let layers = Layers { state: state.clone(), options: Arc::new(options) };
    let mut json = Router::new()
        .route(ROUTES[0], post(openai::chat_completions))
        .route(ROUTES[1], post(openai::completions))
        .route(ROUTES[5], post(tokenize))
        .route(ROUTES[6], post(detokenize))
        .route(ROUTES[7], post(responses::responses))
        .route(ROUTES[8], post(anthropic::messages))
        .route(ROUTES[9], post(anthropic::count_tokens));
    if state.lora().is_some() {
        json = json.route(ROUTES[10], post(lora::load_adapter)).route(ROUTES[11], post(lora::unload_adapter));
    }
    let json = json.route_layer(middleware::from_fn_with_state(layers.clone(), read_json_body));
    let mut open = Router::new().route(ROUTES[3], get(health));
    let mut keyed = json.route(ROUTES[2], get(models));
    if layers.options.metrics_without_auth {
        open = open.route(ROUTES[4], get(metrics));
    } else {
        keyed = keyed.route(ROUTES[4], get(metrics));
    }
    let keyed = keyed.route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(keyed)
        .merge(open)
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(state.max_body_bytes()))
        .layer(middleware::from_fn_with_state(layers.clone(), cors))
        .layer(middleware::from_fn(check_head))
        .layer(middleware::from_fn(anthropic::own_error_format))
        .layer(middleware::from_fn_with_state(state.clone(), count_response))
        .with_state(state)
}

/// Counts every response by route and status.
async fn count_response(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let matched = req.extensions().get::<MatchedPath>().map(MatchedPath::as_str);
    let endpoint = ROUTES.into_iter().find(|r| Some(*r) == matched).unwrap_or("unmatched");
    let response = next.run(req).await;
    state.metrics().http_request(endpoint, response.status().as_u16());
    response
}

/// 414 and 431, as JSON, for request heads over the limits.
async fn check_head(req: Request, next: Next) -> Response {
    if req.uri().path_and_query().map_or(0, |target| target.as_str().len()) > MAX_URI_BYTES {
        return ApiError::uri_too_long(MAX_URI_BYTES).into_response();
    }
    let bytes: usize = req.headers().iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if req.headers().len() > MAX_HEADERS || bytes > MAX_HEADER_BYTES {
        return ApiError::headers_too_large(MAX_HEADERS, MAX_HEADER_BYTES).into_response();
    }
    next.run(req).await
}

/// CORS: browsers may call only from the allowed origins; requests without an `Origin`
/// (every non-browser client) pass untouched.
async fn cors(State(layers): State<Layers>, req: Request, next: Next) -> Response {
    let Some(origin) = req.headers().get(header::ORIGIN).cloned() else { return next.run(req).await };
    if !layers.options.allows_origin(origin.as_bytes()) {
        return ApiError::origin_not_allowed(&String::from_utf8_lossy(origin.as_bytes())).into_response();
    }
    let preflight =
        req.method() == Method::OPTIONS && req.headers().contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let mut response = if preflight { preflight_response(req.headers()) } else { next.run(req).await };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    response
}

/// 204 allowing the routes' methods and whatever headers the browser asked for (the
/// `openai` JavaScript client sends its own `x-stainless-*` ones).
fn preflight_response(request: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static("GET, POST, OPTIONS"));
    if let Some(asked) = request.get(header::ACCESS_CONTROL_REQUEST_HEADERS) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
    }
    headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}

/// Every route but `/health` (and `/metrics` with `--metrics-without-auth`) needs
/// `Authorization: Bearer <key>` (or Anthropic's `x-api-key: <key>`) when the server has a key.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let header = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let x_api_key = req.headers().get("x-api-key").map(|v| v.as_bytes());
    if state.authorized(header) || x_api_key.is_some_and(|k| state.key_matches(k)) {
        next.run(req).await
    } else {
        ApiError::unauthorized().into_response()
    }
}

/// Reads a JSON endpoint's body before its handler runs: 415 for another content type
/// (browsers send `text/plain` cross-origin without a preflight), 413 as soon as the
/// declared length is over the limit, 408 when the body stalls.
async fn read_json_body(State(layers): State<Layers>, req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    if let Some(content_type) = req.headers().get(header::CONTENT_TYPE).filter(|v| !is_json(v)) {
        return ApiError::unsupported_media_type(&String::from_utf8_lossy(content_type.as_bytes())).into_response();
    }
    let limit = layers.state.max_body_bytes();
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        // Nothing of the body is read: hyper sends no `100 Continue` and closes the
        // connection after this answer.
        return ApiError::payload_too_large(limit).into_response();
    }
    let (parts, body) = req.into_parts();
    let timeout = layers.options.body_read_timeout;
    let bytes = match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return ApiError::payload_too_large(limit).into_response();
        }
        Ok(Err(e)) => return ApiError::malformed(format!("the body could not be read: {e}")).into_response(),
        Err(_) => return ApiError::body_timeout(timeout).into_response(),
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}

/// `application/json`, or any `+json` type, whatever its parameters (`; charset=utf-8`).
fn is_json(content_type: &HeaderValue) -> bool {
    let Ok(value) = content_type.to_str() else { return false };
    let essence = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    essence == "application/json" || (essence.starts_with("application/") && essence.ends_with("+json"))
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::route_not_found(uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// 200 once the server is ready (startup phase 11), 503 before and while draining.
async fn health(State(state): State<AppState>) -> Response {
    if state.is_ready() {
        Json(serde_json::json!({"status": "ok"})).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"status": "unavailable"}))).into_response()
    }
}

/// The Prometheus text exposition of every metric, engine and server.
async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], state.metrics().render()).into_response()
}

/// The base model, then each LoRA adapter with the base as its `parent`.
async fn models(State(state): State<AppState>) -> Json<ModelList> {
    let base = state.config().model_name.clone();
    let card = |id: String| ModelCard {
        id,
        object: "model",
        created: state.created(),
        owned_by: "met",
        max_model_len: state.max_context(),
        root: None,
        parent: None,
    };
    let adapters = state.lora().map(|l| l.list()).unwrap_or_default().into_iter().map(|loaded| ModelCard {
        root: Some(loaded.path.display().to_string()),
        parent: Some(base.clone()),
        ..card(loaded.adapter.name().to_owned())
    });
    Json(ModelList { object: "list", data: std::iter::once(card(base.clone())).chain(adapters).collect() })
}

/// `POST /tokenize`: a text prompt, or messages rendered with the chat template.
async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    // Tokenizing megabytes is CPU work like a prompt's: it takes a slot.
    let _permit = state.admit()?;
    state.check_model(req.model.as_deref())?;
    let worker = state.clone();
    let tokens = blocking(move || tokenize_blocking(&worker, req)).await?;
    Ok(Json(TokenizeResponse { count: tokens.len(), max_model_len: state.max_context(), tokens }))
}

fn tokenize_blocking(state: &AppState, req: TokenizeRequest) -> Result<Vec<u32>, ApiError> {
    let tokenizer = state.tokenizer();
    let encode = |text: &str, special| tokenizer.encode(text, special).map_err(ApiError::from_text);
    match (req.prompt, req.messages) {
        (Some(prompt), None) => encode(&prompt, req.add_special_tokens.unwrap_or(true)),
        (None, Some(messages)) => {
            let messages: Vec<ChatMessage> = messages.into_iter().map(ChatMessage::flatten_text_parts).collect();
            let options = RenderOptions {
                add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                ..Default::default()
            };
            super::validate::chat_ids(state, &messages, &options)
        }
        _ => Err(ApiError::invalid("prompt", "give exactly one of `prompt` and `messages`")),
    }
}

/// `POST /detokenize`: ids to text, special tokens kept.
async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let _permit = state.admit()?;
    state.check_model(req.model.as_deref())?;
    // The ids are checked as a prompt's are, and the error names this route's field.
    let limits = state.engine().limits();
    limits.check_token_ids(RequestField::Prompt, &req.tokens).map_err(|e| ApiError::invalid("tokens", e.msg))?;
    let worker = state.clone();
    let prompt =
        blocking(move || worker.tokenizer().decode(&req.tokens, false).map_err(|e| ApiError::internal(e.to_string())))
            .await?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// Runs CPU work (tokenization) on a blocking worker, off the reactor.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::internal(format!("worker failed: {e}")))?
}
