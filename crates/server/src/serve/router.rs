//! [`app`]: the HTTP routes, as an axum `Router` that tests drive in-process
//! (`tower::ServiceExt::oneshot`) and `met serve` puts behind a socket.
//!
//! Cross-cutting rules live here, once: the API key on `/v1/*` (constant-time compare), the
//! body limit (413), OpenAI-shaped 404 and 405 answers, and the `met_http_requests_total`
//! count of every response by route template and status. The small endpoints (health,
//! models, metrics, tokenize, detokenize) are here too; generation is in `openai`.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use met_telemetry::metrics::CONTENT_TYPE;

use super::error::ApiError;
use super::openai;
use super::state::AppState;
use super::wire::{
    ApiJson, DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use crate::text::{ChatMessage, RenderOptions};

/// Every route, as the `endpoint` label of the HTTP metric (a fixed set keeps the number of
/// series bounded).
const ROUTES: [&str; 7] =
    ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/tokenize", "/detokenize"];

/// The router of the whole API over `state`.
pub fn app(state: AppState) -> Router {
    let v1 = Router::new()
        .route(ROUTES[0], post(openai::chat_completions))
        .route(ROUTES[1], post(openai::completions))
        .route(ROUTES[2], get(models))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .merge(v1)
        .route(ROUTES[3], get(health))
        .route(ROUTES[4], get(metrics))
        .route(ROUTES[5], post(tokenize))
        .route(ROUTES[6], post(detokenize))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(state.max_body_bytes()))
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

/// `/v1/*` needs `Authorization: Bearer <key>` when the server has a key.
async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let header = req.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if state.authorized(header) { next.run(req).await } else { ApiError::unauthorized().into_response() }
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

async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: state.config().model_name.clone(),
            object: "model",
            created: state.created(),
            owned_by: "met",
            max_model_len: state.max_context(),
        }],
    })
}

/// `POST /tokenize`: a text prompt, or messages rendered with the chat template.
async fn tokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
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
            let template =
                state.template().ok_or_else(|| ApiError::invalid("messages", "this model has no chat template"))?;
            let messages: Vec<ChatMessage> = messages.into_iter().map(ChatMessage::flatten_text_parts).collect();
            let options = RenderOptions {
                add_generation_prompt: req.add_generation_prompt.unwrap_or(true),
                ..Default::default()
            };
            let rendered = template.render(&messages, &options).map_err(ApiError::from_text)?;
            encode(&rendered, false)
        }
        _ => Err(ApiError::invalid("prompt", "give exactly one of `prompt` and `messages`")),
    }
}

/// `POST /detokenize`: ids to text, special tokens kept.
async fn detokenize(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    state.check_model(req.model.as_deref())?;
    let vocab = state.engine().limits().vocab_size;
    if let Some(id) = req.tokens.iter().find(|&&id| id as usize >= vocab) {
        return Err(ApiError::invalid("tokens", format!("token id {id} is outside the vocabulary of {vocab}")));
    }
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
