//! The socket side of `met serve`: accepting connections and serving each with hyper's
//! HTTP/1, under limits that keep stalled or hostile clients cheap.
//!
//! - **Connection cap.** A connection is accepted only with a permit of a semaphore of
//!   `--max-connections`; past it, new clients wait in the kernel's listen queue, costing the
//!   server nothing, while every open connection costs at most hyper's bounded read buffer.
//! - **Read timeouts.** hyper's header-read timeout (`--http-read-timeout-secs`) starts when
//!   a connection begins waiting for a request, so it bounds both a slowly sent head
//!   (slowloris) and an idle keep-alive connection; the body's own timeout is the router's.
//! - **Drain.** When `stop` fires, the listener closes and every connection is told to shut
//!   down gracefully: idle ones and ones still sending a head close at once, ones with a
//!   request in flight finish it first. The serve future ends when the last one has.
//! - **Lingering close.** A connection ends by sending FIN and then reading and dropping what
//!   the client still sends for a moment (as nginx does), so a client still uploading a body
//!   the server answered 413 to reads that answer instead of a connection reset.
//!
//! Every request carries the [`DrainCut`] as an extension, so the responses still running at
//! the drain timeout can end with an error of their own.

use std::convert::Infallible;
use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;

use super::openai::DrainCut;
use super::router::{MAX_HEADER_BYTES, MAX_HEADERS, MAX_URI_BYTES};

/// Longest lingering close, and the longest pause in the client's data during one.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_IDLE: Duration = Duration::from_millis(500);

/// hyper's own head limits, above the router's so that the router answers with JSON: only
/// heads past these get hyper's bodiless 431.
const HYPER_MAX_HEADERS: usize = 2 * MAX_HEADERS;
const HYPER_MAX_BUF: usize = 256 << 10;
// hyper's URI limit is fixed at 64 KiB; the whole head must fit its buffer.
const _: () = assert!(MAX_URI_BYTES < u16::MAX as usize && MAX_URI_BYTES + MAX_HEADER_BYTES < HYPER_MAX_BUF);

/// How connections are accepted and served.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// hyper's header-read (and keep-alive idle) timeout.
    pub read_timeout: Duration,
}

/// Serves `app` on `listener` until `stop` fires and every connection has closed.
///
/// # Errors
/// None today: failed accepts (out of file descriptors) are logged and retried.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
    cut: DrainCut,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut connections = JoinSet::new();
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => permit.expect("the semaphore is never closed"),
            () = stopped(&mut stop) => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of file descriptors, or a connection reset before it was accepted.
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        connections.spawn(serve_connection(tcp, app.clone(), limits, stop.clone(), cut.clone(), permit));
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// One connection, from accept to close; `_permit` is its place under the cap.
async fn serve_connection(
    tcp: TcpStream,
    app: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
    cut: DrainCut,
    _permit: OwnedSemaphorePermit,
) {
    // Stream chunks are small and latency-bound: no Nagle delay.
    let _ = tcp.set_nodelay(true);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(cut.clone());
        let app = app.clone();
        Box::pin(
            async move { Ok::<_, Infallible>(app.oneshot(req.map(Body::new)).await.unwrap_or_else(|e| match e {})) },
        )
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .max_headers(HYPER_MAX_HEADERS)
        .max_buf_size(HYPER_MAX_BUF);
    let mut conn = builder.serve_connection(TokioIo::new(tcp), service);
    let result = tokio::select! {
        result = poll_fn(|cx| conn.poll_without_shutdown(cx)) => result,
        () = stopped(&mut stop) => {
            std::pin::Pin::new(&mut conn).graceful_shutdown();
            poll_fn(|cx| conn.poll_without_shutdown(cx)).await
        }
    };
    if let Err(e) = result {
        tracing::debug!("connection closed: {e}");
    }
    linger_close(conn.into_parts().io.into_inner()).await;
}

/// Resolves once `stop` is set (or its sender is gone: the server is going away).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Sends FIN, then drops what the client still sends until it closes, pauses for
/// [`LINGER_IDLE`] or [`LINGER`] has passed; then the socket closes with nothing unread, so
/// the kernel sends no reset that would destroy the response in the client's buffer.
async fn linger_close(mut tcp: TcpStream) {
    if tcp.shutdown().await.is_err() {
        return;
    }
    let mut scratch = vec![0; 16 << 10];
    let drain = async {
        while let Ok(Ok(read)) = tokio::time::timeout(LINGER_IDLE, tcp.read(&mut scratch)).await {
            if read == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}
