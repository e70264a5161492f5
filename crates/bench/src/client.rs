//! The HTTP side of `met bench serve`: hyper's HTTP/1 client (the hyper axum already
//! brings), a fresh connection for every request, `TCP_NODELAY` so small chunks are
//! not held back, and every request streamed and timed chunk by chunk.
//!
//! Timing starts just before the request is handed to the connection pool and each event is
//! stamped when its bytes arrive. A content chunk is one whose first choice carries text
//! (`text` for completions; `delta.content`, or a reasoning model's
//! `delta.reasoning_content`, for chat). A stream has completed when `[DONE]` or a finish
//! reason arrived; anything short of that is an error of one [`ErrorKind`], never a panic.
//! The only host this talks to is the one in `--base-url`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Uri};
use hyper_util::client::legacy::Client as Pool;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::args::Endpoint;
use crate::dataset::{BenchRequest, Prompt};
use crate::metrics::{ErrorKind, Record, Timing};
use crate::sse::SseDecoder;

/// `--base-url`, checked: plain HTTP, a host, no query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    /// `http://host:port`.
    origin: String,
    /// The path before `/v1`, without a trailing slash (usually empty).
    prefix: String,
}

impl BaseUrl {
    /// Parses `--base-url`; a trailing `/` or `/v1` is dropped, so `http://h:8000`,
    /// `http://h:8000/` and `http://h:8000/v1` are the same server.
    ///
    /// # Errors
    /// Not a URL, a scheme other than `http`, no host, or a query.
    pub fn parse(url: &str) -> Result<Self> {
        let uri: Uri = url.parse().with_context(|| format!("--base-url: `{url}` is not a URL"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => bail!("--base-url: `{url}` is HTTPS; met bench speaks plain HTTP only"),
            Some(other) => bail!("--base-url: `{url}` has scheme `{other}`; expected http://HOST:PORT"),
            None => bail!("--base-url: `{url}` has no scheme; expected http://HOST:PORT"),
        }
        let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
            bail!("--base-url: `{url}` has no host");
        };
        if uri.query().is_some() {
            bail!("--base-url: `{url}` has a query; give the server's root");
        }
        let path = uri.path().trim_end_matches('/');
        let prefix = path.strip_suffix("/v1").unwrap_or(path).to_owned();
        Ok(Self { origin: format!("http://{authority}"), prefix })
    }

    /// The URI of an API path (`/models`, `/completions`) under `/v1`.
    fn join(&self, path: &str) -> Uri {
        self.root(&format!("/v1{path}"))
    }

    /// The URI of a path at the server's root (`/metrics`).
    fn root(&self, path: &str) -> Uri {
        // Both parts were validated at parse time, so this is a well-formed URI.
        format!("{}{}{path}", self.origin, self.prefix).parse().unwrap_or_default()
    }
}

/// The path under `/v1` of an endpoint.
pub fn endpoint_path(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Completions => "/completions",
        Endpoint::Chat => "/chat/completions",
    }
}

/// Why a token-id prompt cannot go to the chat endpoint.
pub const CHAT_NEEDS_TEXT: &str =
    "--endpoint chat: token-id prompts (--dataset random, or ids in a JSONL file) need --endpoint completions";

/// The JSON body of `request`: streamed with usage, greedy, exact lengths when asked.
///
/// # Errors
/// A token-id prompt for the chat endpoint, which takes messages of text only.
pub fn request_body(endpoint: Endpoint, model: &str, request: &BenchRequest) -> Result<Bytes> {
    let mut body = json!({
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    match (endpoint, &request.prompt) {
        (Endpoint::Completions, Prompt::Text(text)) => body["prompt"] = json!(text),
        (Endpoint::Completions, Prompt::Ids(ids)) => body["prompt"] = json!(ids),
        (Endpoint::Chat, Prompt::Text(text)) => body["messages"] = json!([{"role": "user", "content": text}]),
        (Endpoint::Chat, Prompt::Ids(_)) => bail!(CHAT_NEEDS_TEXT),
    }
    if request.exact_length {
        body["ignore_eos"] = json!(true);
        body["min_tokens"] = json!(request.max_tokens);
    }
    Ok(Bytes::from(body.to_string()))
}

/// A client for one server.
#[derive(Debug, Clone)]
pub struct Client {
    pool: Pool<HttpConnector, Full<Bytes>>,
    base: BaseUrl,
    api_key: Option<String>,
    timeout: Duration,
    /// Whether an error response's body was logged already: the first says why (a wrong
    /// model id, a missing chat template), the rest are only counted.
    logged_status: Arc<AtomicBool>,
}

/// How long the end of a body is waited for after `[DONE]`.
const DRAIN_AFTER_DONE: Duration = Duration::from_millis(50);

/// The most of an error response's body that is logged.
const LOGGED_BODY_BYTES: usize = 2048;

impl Client {
    /// A client for `base`; each request gives up after `timeout`.
    pub fn new(base: BaseUrl, api_key: Option<String>, timeout: Duration) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // A fresh connection per request, never an idle one reused: servers differ in when
        // they close a keep-alive connection after a stream (llama-server closes it), and a
        // request sent on a connection the server just closed fails for reasons that say
        // nothing about the server. On loopback a connect costs tens of microseconds.
        let pool = Pool::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
        let logged_status = Arc::new(AtomicBool::new(false));
        Self { pool, base, api_key: api_key.filter(|k| !k.is_empty()), timeout, logged_status }
    }

    fn request(&self, method: Method, path: &str, body: Bytes) -> Request<Full<Bytes>> {
        let mut builder = Request::builder().method(method).uri(self.base.join(path));
        if !body.is_empty() {
            builder = builder.header(CONTENT_TYPE, "application/json");
        }
        if let Some(key) = &self.api_key {
            builder = builder.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        // Method, URI and headers are all valid by construction.
        builder.body(Full::new(body)).unwrap_or_default()
    }

    /// The model ids of `GET /v1/models`, in the server's order.
    ///
    /// # Errors
    /// The server cannot be reached, answers other than 200, or not with OpenAI's list.
    pub async fn models(&self) -> Result<Vec<String>> {
        let uri = self.base.join("/models");
        let fetch = async {
            let response = self.pool.request(self.request(Method::GET, "/models", Bytes::new())).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(self.timeout, fetch)
            .await
            .with_context(|| format!("GET {uri}: no answer in {:?}", self.timeout))?
            .with_context(|| format!("GET {uri}"))?;
        if !status.is_success() {
            bail!("GET {uri}: {status}: {}", String::from_utf8_lossy(&body));
        }
        let list: Value = serde_json::from_slice(&body).with_context(|| format!("GET {uri}: not JSON"))?;
        let ids = list["data"].as_array().with_context(|| format!("GET {uri}: no `data` list"))?;
        Ok(ids.iter().filter_map(|m| m["id"].as_str().map(str::to_owned)).collect())
    }

    /// The text of `GET /metrics` (Prometheus), or `None` when the server has none to give
    /// (not met, no such route, an error): the figures that need it are left out then.
    pub async fn server_metrics(&self) -> Option<String> {
        let mut request = self.request(Method::GET, "", Bytes::new());
        *request.uri_mut() = self.base.root("/metrics");
        let fetch = async {
            let response = self.pool.request(request).await.ok()?;
            let ok = response.status().is_success();
            let body = response.into_body().collect().await.ok()?.to_bytes();
            ok.then(|| String::from_utf8_lossy(&body).into_owned())
        };
        tokio::time::timeout(self.timeout, fetch).await.ok().flatten()
    }

    /// Sends one streaming request to `path` and times it. `prompt_tokens` is the prompt's
    /// length when the dataset knows it, for servers that send no usage.
    pub async fn stream(&self, path: &str, body: Bytes, prompt_tokens: Option<usize>) -> Record {
        let start = Instant::now();
        let request = self.request(Method::POST, path, body);
        let mut state = match tokio::time::timeout(self.timeout, self.read_stream(request)).await {
            Ok(state) => state?,
            Err(_) => return Err(ErrorKind::Timeout),
        };
        let e2e = state.end.unwrap_or_else(Instant::now).duration_since(start).as_secs_f64();
        let ttft = state.first.map_or(e2e, |t| t.duration_since(start).as_secs_f64());
        Ok(Timing {
            ttft,
            e2e,
            itl: std::mem::take(&mut state.itl),
            prompt_tokens: state.usage_prompt.or(prompt_tokens).unwrap_or(0),
            output_tokens: state.usage_completion.unwrap_or(state.chunks),
        })
    }

    async fn read_stream(&self, request: Request<Full<Bytes>>) -> Result<StreamState, ErrorKind> {
        let response = self
            .pool
            .request(request)
            .await
            .map_err(|e| if e.is_connect() { ErrorKind::Connect } else { ErrorKind::NoResponse })?;
        let status = response.status();
        if !status.is_success() {
            if !self.logged_status.swap(true, Ordering::Relaxed) {
                let body = Limited::new(response.into_body(), LOGGED_BODY_BYTES).collect().await;
                let text = body.map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned()).unwrap_or_default();
                tracing::warn!("the server answered {status}: {text} (later errors are only counted)");
            }
            return Err(ErrorKind::Status(status.as_u16()));
        }
        let mut body = response.into_body();
        let mut decoder = SseDecoder::default();
        let mut state = StreamState::default();
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                // A dropped connection: fine after `[DONE]`, short otherwise.
                return if state.complete() { Ok(state) } else { Err(ErrorKind::EndedEarly) };
            };
            let now = Instant::now();
            let Ok(data) = frame.into_data() else { continue };
            for event in decoder.feed(&data).map_err(|_| ErrorKind::MalformedSse)? {
                state.on_event(&event, now)?;
            }
            if state.end.is_some() {
                // The body's end normally follows `[DONE]` at once; reading it returns the
                // connection to the pool. A server that keeps the stream open is not waited
                // for (the connection is closed instead).
                let drain = async { while let Some(Ok(_)) = body.frame().await {} };
                let _ = tokio::time::timeout(DRAIN_AFTER_DONE, drain).await;
                return Ok(state);
            }
        }
        if let Some(event) = decoder.finish().map_err(|_| ErrorKind::MalformedSse)? {
            state.on_event(&event, Instant::now())?;
        }
        if state.complete() { Ok(state) } else { Err(ErrorKind::EndedEarly) }
    }
}

/// What one stream has shown so far.
#[derive(Debug, Default)]
struct StreamState {
    /// Arrival of the first content chunk.
    first: Option<Instant>,
    /// Arrival of the latest content chunk.
    last: Option<Instant>,
    itl: Vec<f64>,
    chunks: usize,
    finished: bool,
    /// When `[DONE]` came; later bytes are drained for connection reuse, never timed.
    end: Option<Instant>,
    usage_prompt: Option<usize>,
    usage_completion: Option<usize>,
}

impl StreamState {
    fn complete(&self) -> bool {
        self.end.is_some() || self.finished
    }

    /// One event's data: `[DONE]`, or a chunk of either endpoint.
    fn on_event(&mut self, data: &str, now: Instant) -> Result<(), ErrorKind> {
        if self.end.is_some() {
            return Ok(());
        }
        if data.trim() == "[DONE]" {
            self.end = Some(now);
            return Ok(());
        }
        let chunk: Value = serde_json::from_str(data).map_err(|_| ErrorKind::MalformedSse)?;
        if !chunk.is_object() {
            return Err(ErrorKind::MalformedSse);
        }
        if !chunk["error"].is_null() {
            return Err(ErrorKind::ErrorEvent);
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage_prompt = usage["prompt_tokens"].as_u64().map(|n| n as usize).or(self.usage_prompt);
            self.usage_completion = usage["completion_tokens"].as_u64().map(|n| n as usize).or(self.usage_completion);
        }
        let choices = match &chunk["choices"] {
            Value::Null => return Ok(()),
            Value::Array(choices) => choices,
            _ => return Err(ErrorKind::MalformedSse),
        };
        let Some(choice) = choices.first() else { return Ok(()) };
        let delta = &choice["delta"];
        let text = [&choice["text"], &delta["content"], &delta["reasoning_content"]]
            .into_iter()
            .find_map(|t| t.as_str().filter(|t| !t.is_empty()));
        if text.is_some() {
            self.content_chunk(now);
        }
        self.finished |= !choice["finish_reason"].is_null();
        Ok(())
    }

    fn content_chunk(&mut self, now: Instant) {
        match self.first {
            None => self.first = Some(now),
            Some(_) => self.itl.extend(self.last.map(|last| now.duration_since(last).as_secs_f64())),
        }
        self.last = Some(now);
        self.chunks += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_are_plain_http_roots() {
        let url = |s| BaseUrl::parse(s).map(|b| b.join("/completions").to_string());
        assert_eq!(url("http://127.0.0.1:8000").unwrap(), "http://127.0.0.1:8000/v1/completions");
        assert_eq!(url("http://127.0.0.1:8000/v1/").unwrap(), "http://127.0.0.1:8000/v1/completions");
        assert_eq!(url("http://h:1/proxy/v1").unwrap(), "http://h:1/proxy/v1/completions");
        for (bad, says) in
            [("https://h", "HTTPS"), ("h:8000", "scheme"), ("ftp://h", "ftp"), ("http://h/?a=1", "query")]
        {
            let err = BaseUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains("--base-url") && err.contains(says), "{bad}: {err}");
        }
        assert!(BaseUrl::parse("not a url").unwrap_err().to_string().contains("--base-url"));
    }

    #[test]
    fn bodies_carry_the_prompt_and_exact_lengths() {
        let ids =
            BenchRequest { prompt: Prompt::Ids(vec![5, 6]), prompt_tokens: Some(2), max_tokens: 4, exact_length: true };
        let body: Value = serde_json::from_slice(&request_body(Endpoint::Completions, "m", &ids).unwrap()).unwrap();
        assert_eq!(body["prompt"], json!([5, 6]));
        assert_eq!(
            (body["max_tokens"].clone(), body["min_tokens"].clone(), body["ignore_eos"].clone()),
            (json!(4), json!(4), json!(true))
        );
        assert_eq!(
            (body["stream"].clone(), body["stream_options"]["include_usage"].clone()),
            (json!(true), json!(true))
        );
        assert!(request_body(Endpoint::Chat, "m", &ids).unwrap_err().to_string().contains("--endpoint"));
        let text =
            BenchRequest { prompt: Prompt::Text("hi".into()), prompt_tokens: None, max_tokens: 4, exact_length: false };
        let body: Value = serde_json::from_slice(&request_body(Endpoint::Chat, "m", &text).unwrap()).unwrap();
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
        assert!(body.get("ignore_eos").is_none() && body.get("prompt").is_none());
    }

    #[test]
    fn chunks_of_both_endpoints_are_counted() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut s = StreamState::default();
        s.on_event(r#"{"choices":[{"delta":{"role":"assistant"}}]}"#, at(1)).unwrap();
        s.on_event(r#"{"choices":[{"delta":{"content":"a"}}]}"#, at(5)).unwrap();
        s.on_event(r#"{"choices":[{"text":"b","finish_reason":null}]}"#, at(8)).unwrap();
        s.on_event(r#"{"choices":[{"delta":{"reasoning_content":"c"},"finish_reason":"length"}]}"#, at(12)).unwrap();
        s.on_event(r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":7}}"#, at(13)).unwrap();
        assert_eq!((s.first, s.chunks, s.finished), (Some(at(5)), 3, true));
        assert_eq!(s.itl.len(), 2);
        assert!((s.itl[0] - 0.003).abs() < 1e-9 && (s.itl[1] - 0.004).abs() < 1e-9);
        assert_eq!((s.usage_prompt, s.usage_completion), (Some(3), Some(7)));
        s.on_event("[DONE]", at(14)).unwrap();
        s.on_event("not json, but after [DONE]", at(15)).unwrap();
        assert_eq!(s.end, Some(at(14)));
        let mut s = StreamState::default();
        assert_eq!(s.on_event("{\"choices\": [", t0), Err(ErrorKind::MalformedSse));
        assert_eq!(s.on_event("[1]", t0), Err(ErrorKind::MalformedSse));
        assert_eq!(s.on_event(r#"{"error":{"message":"boom"}}"#, t0), Err(ErrorKind::ErrorEvent));
    }
}
