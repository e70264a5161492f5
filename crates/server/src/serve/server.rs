//! [`Server`]: `met serve` from the moment its socket is bound to its exit, and the three
//! ways it ends. Each is the same drain: stop accepting (idle connections close), turn
//! `/health` 503, let in-flight requests finish for at most the drain timeout (a second
//! signal cuts it short), then end the rest with an error and give them [`CUT_GRACE`] to
//! send it.
//!
//! - **A signal** (SIGINT, SIGTERM): an orderly stop; `Ok`, exit 0.
//! - **An engine fault** (a panic inside a step, a device error): the engine has already
//!   ended what it ran with an error and refuses new work, so the drain is short; then
//!   `Err`, so the process exits non-zero and a supervisor restarts it. A fault during a
//!   signal's drain is an `Err` too: the engine that stopped is not the one that was asked to.
//! - **The accept task ending by itself**: `Err`.
//!
//! **Invariant:** every wait after the trigger is bounded (the drain timeout, then
//! [`CUT_GRACE`], then the accept task is aborted), so the server never hangs on its way out.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::listen::{self, ConnectionLimits};
use super::openai::DrainCut;
use super::state::AppState;

/// After the drain timeout cut the remaining responses, how long they get to send their
/// final error and close.
const CUT_GRACE: Duration = Duration::from_secs(2);

/// The HTTP server: its accept task and the two switches of a drain.
#[derive(Debug)]
pub struct Server {
    accept: JoinHandle<std::io::Result<()>>,
    /// Stops accepting and closes idle connections.
    stop: watch::Sender<bool>,
    /// Ends the responses still running with an error of their own.
    cut: watch::Sender<bool>,
    addr: SocketAddr,
}

impl Server {
    /// Starts accepting connections on `listener` and serving `app` on them, under `limits`.
    ///
    /// # Errors
    /// The listener has no local address.
    pub fn start(listener: TcpListener, app: Router, limits: ConnectionLimits) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (stop, stop_rx) = watch::channel(false);
        let (cut, drain_cut) = DrainCut::new();
        let accept = tokio::spawn(listen::serve(listener, app, limits, stop_rx, drain_cut));
        Ok(Self { accept, stop, cut, addr })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until a signal arrives on `signals` (by name) or `state`'s engine faults, then
    /// drains, giving in-flight requests at most `drain_timeout`.
    ///
    /// # Errors
    /// The engine faulted (before or during the drain), or the accept task stopped by itself.
    pub async fn run(
        mut self,
        state: &AppState,
        drain_timeout: Duration,
        mut signals: mpsc::Receiver<&'static str>,
    ) -> Result<()> {
        let engine = state.engine();
        tokio::select! {
            Some(signal) = signals.recv() => {
                tracing::info!("{signal}: no longer accepting connections; draining in-flight requests \
                                (at most {drain_timeout:?})");
            }
            fault = engine.wait_for_fault() => {
                tracing::error!("engine fault: {fault}; no longer accepting connections; draining in-flight \
                                 requests (at most {drain_timeout:?}), then exiting with an error so that a \
                                 supervisor can restart the server");
            }
            result = &mut self.accept => {
                result.context("the server task failed")??;
                bail!("the server on {} stopped by itself", self.addr);
            }
        }
        state.set_ready(false);
        self.drain(drain_timeout, &mut signals).await?;
        match engine.fault() {
            Some(fault) => Err(anyhow!("the engine faulted: {fault}")),
            None => Ok(()),
        }
    }

    /// Stops accepting, waits for the connections to close for at most `timeout` (or until
    /// the next signal), then cuts the remaining responses.
    async fn drain(&mut self, timeout: Duration, signals: &mut mpsc::Receiver<&'static str>) -> Result<()> {
        let _ = self.stop.send(true);
        tokio::select! {
            result = &mut self.accept => {
                result.context("the server task failed")??;
                tracing::info!("drained; exiting");
                return Ok(());
            }
            () = tokio::time::sleep(timeout) => {
                tracing::warn!("drain timed out after {timeout:?}; cancelling the remaining requests");
            }
            Some(signal) = signals.recv() => {
                tracing::warn!("{signal}: cancelling the remaining requests");
            }
        }
        let _ = self.cut.send(true);
        if tokio::time::timeout(CUT_GRACE, &mut self.accept).await.is_err() {
            self.accept.abort();
        }
        Ok(())
    }
}

/// The names of SIGINT and SIGTERM (Ctrl-C elsewhere) as they arrive, for [`Server::run`].
///
/// # Errors
/// The signal handlers cannot be installed.
pub(super) fn os_signals() -> Result<mpsc::Receiver<&'static str>> {
    let (tx, rx) = mpsc::channel(4);
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        tokio::spawn(async move {
            loop {
                let name = tokio::select! {
                    Some(()) = interrupt.recv() => "SIGINT",
                    Some(()) = terminate.recv() => "SIGTERM",
                    else => return,
                };
                if tx.send(name).await.is_err() {
                    return;
                }
            }
        });
    }
    #[cfg(not(unix))]
    tokio::spawn(async move {
        while tokio::signal::ctrl_c().await.is_ok() {
            if tx.send("Ctrl-C").await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
