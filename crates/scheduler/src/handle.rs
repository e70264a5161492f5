//! The engine thread and the cloneable handle that reaches it.
//!
//! A request is checked against the engine's limits when it is made
//! ([`crate::EngineRequest::new`]); the handle re-checks one made against other limits, and
//! sends it over a channel; the engine
//! thread blocks on that channel while idle and drains it between steps while busy.
//!
//! A panic inside a step is caught here: it is an engine-level fault like a device error.
//! Every request then ends with an error, the fault is recorded where every handle sees it
//! ([`EngineHandle::fault`]), and the thread ends, so new requests are refused at once
//! instead of waiting on an engine whose state can no longer be trusted.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::mpsc as events;

use crate::EngineLimits;
use crate::engine::Engine;
use crate::health::Health;
use crate::request::{EngineRequest, RequestStream, TokenEvent};
use crate::{RequestId, SubmitError};

enum Command {
    Submit(RequestId, EngineRequest, events::Sender<TokenEvent>),
}

/// A cloneable handle to a running engine. The engine thread ends once every handle is
/// dropped and every request has finished.
#[derive(Clone)]
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    limits: EngineLimits,
    next_id: Arc<AtomicU64>,
    health: Arc<Health>,
}

/// Starts `engine` on its own thread.
///
/// # Panics
/// If the OS cannot start a thread.
pub fn spawn(engine: Engine) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let limits = engine.limits();
    let health = engine.health();
    let thread = std::thread::Builder::new()
        .name("met-engine".into())
        // The loop runs as a job of the rayon pool, so the CPU backend's parallel ops are
        // forked from a worker (work stealing) instead of being injected from outside and
        // waited for, which costs two context switches per op.
        .spawn(move || rayon::scope(move |_| run(engine, &rx)))
        .expect("spawning the engine thread");
    (EngineHandle { commands: tx, limits, next_id: Arc::new(AtomicU64::new(0)), health }, thread)
}

/// Serves commands until every handle is gone and the work is done, or a fault.
fn run(mut engine: Engine, commands: &mpsc::Receiver<Command>) {
    let health = engine.health();
    while health.fault().is_none() {
        if !engine.has_work() {
            match commands.recv() {
                Ok(cmd) => apply(&mut engine, cmd),
                Err(mpsc::RecvError) => return,
            }
        }
        while let Ok(cmd) = commands.try_recv() {
            apply(&mut engine, cmd);
        }
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| engine.step())) {
            let fault = format!("the engine panicked: {}", panic_message(&*panic));
            // Recorded first: ending the requests touches state the panic may have left
            // inconsistent, and may panic again.
            health.fail(fault.clone());
            let _ = catch_unwind(AssertUnwindSafe(|| engine.fail(&fault)));
        }
    }
}

/// The text a panic was raised with.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    match (payload.downcast_ref::<&str>(), payload.downcast_ref::<String>()) {
        (Some(s), _) => s,
        (_, Some(s)) => s.as_str(),
        _ => "(no message)",
    }
}

fn apply(engine: &mut Engine, cmd: Command) {
    match cmd {
        Command::Submit(id, req, tx) => engine.add(id, req, tx),
    }
}

impl EngineHandle {
    /// The limits requests are checked against.
    pub fn limits(&self) -> EngineLimits {
        self.limits
    }

    /// The engine-level fault (a panic inside a step, a device error) that stopped the
    /// engine, if one did. Every request it was serving ended with an error; new ones are
    /// refused with [`SubmitError::EngineStopped`]. A server reports it as unhealthy.
    pub fn fault(&self) -> Option<String> {
        self.health.fault().map(str::to_owned)
    }

    /// Waits until the engine faults (never, for a healthy one) and returns the fault, for
    /// a server that should exit so that its supervisor restarts it.
    pub async fn wait_for_fault(&self) -> String {
        self.health.wait().await
    }

    /// Queues `req`; its events arrive on the returned stream.
    ///
    /// # Errors
    /// [`SubmitError::Invalid`] for a request made against another engine's limits that
    /// does not fit this one's;
    /// [`SubmitError::EngineStopped`] when the engine thread is gone.
    pub fn submit(&self, req: EngineRequest) -> Result<RequestStream, SubmitError> {
        if self.health.fault().is_some() {
            return Err(SubmitError::EngineStopped);
        }
        req.fits(&self.limits)?;
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = events::channel(self.limits.stream_capacity);
        self.commands.send(Command::Submit(id, req, tx)).map_err(|_| SubmitError::EngineStopped)?;
        Ok(RequestStream::new(id, rx))
    }
}
