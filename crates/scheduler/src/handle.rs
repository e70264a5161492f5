//! The engine thread and the cloneable handle that reaches it.
//!
//! The handle validates each request against the engine's limits (parse, don't
//! validate: the engine accepts nothing else) and sends it over a channel; the engine
//! thread blocks on that channel while idle and drains it between steps while busy.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;

use tokio::sync::mpsc as events;

use crate::engine::{Engine, EngineLimits, validate};
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
}

/// Starts `engine` on its own thread.
///
/// # Panics
/// If the OS cannot start a thread.
pub fn spawn(engine: Engine) -> (EngineHandle, JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let limits = engine.limits();
    let thread = std::thread::Builder::new()
        .name("met-engine".into())
        // The loop runs as a job of the rayon pool, so the CPU backend's parallel ops are
        // forked from a worker (work stealing) instead of being injected from outside and
        // waited for, which costs two context switches per op.
        .spawn(move || rayon::scope(move |_| run(engine, &rx)))
        .expect("spawning the engine thread");
    (EngineHandle { commands: tx, limits, next_id: Arc::new(AtomicU64::new(0)) }, thread)
}

fn run(mut engine: Engine, commands: &mpsc::Receiver<Command>) {
    loop {
        if !engine.has_work() {
            match commands.recv() {
                Ok(cmd) => apply(&mut engine, cmd),
                Err(mpsc::RecvError) => return,
            }
        }
        while let Ok(cmd) = commands.try_recv() {
            apply(&mut engine, cmd);
        }
        engine.step();
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

    /// Validates `req` and queues it; its events arrive on the returned stream.
    ///
    /// # Errors
    /// [`SubmitError::Invalid`] naming the field that cannot work;
    /// [`SubmitError::EngineStopped`] when the engine thread is gone.
    pub fn submit(&self, req: EngineRequest) -> Result<RequestStream, SubmitError> {
        validate(&req, &self.limits)?;
        let id = RequestId(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (tx, rx) = events::channel(self.limits.stream_capacity);
        self.commands.send(Command::Submit(id, req, tx)).map_err(|_| SubmitError::EngineStopped)?;
        Ok(RequestStream::new(id, rx))
    }
}
