//! The serving engine of met: continuous batching over the `Model` and `KvCache` seams.
//!
//! An [`Engine`] runs on its own thread ([`spawn`]) and is reached through a cloneable
//! [`EngineHandle`]. Each request becomes one or more sequences (its `n` continuations);
//! every step the [`scheduler`](crate::Engine::step) builds one mixed batch of decode rows
//! and prompt chunks under a token and a sequence budget, the model runs it, the backend
//! samples on the device, and each request's bounded [`RequestStream`] receives its token
//! events. Dropping a stream cancels its request and frees its KV blocks.
//!
//! The engine sees token ids, never text; stop strings and detokenisation belong to the
//! server. Which request is admitted or preempted is a [`SchedulingPolicy`].
//!
//! Faults stay where they belong: a sequence the model or sampler fails on ends its own
//! request with [`FinishReason::Error`] while the rest of its batch goes on unchanged; an
//! engine-level fault (a device error, a panic inside a step) ends every request and stops
//! the engine, which its handles report ([`EngineHandle::fault`]).

mod constraint;
mod draft;
mod engine;
mod handle;
mod health;
pub mod mock;
mod outbox;
mod policy;
mod request;
mod scheduler;
mod sequence;
mod speculate;

pub use constraint::{Constraint, ConstraintState, SharedConstraint};
pub use engine::Engine;
pub use handle::{EngineHandle, spawn};
pub use policy::{Fcfs, Priority, SchedulingPolicy, SeqInfo, policy};
pub use request::{
    EngineLimits, EngineRequest, FinishReason, GeneratedToken, RequestError, RequestErrorKind, RequestId,
    RequestStream, StopCriteria, TokenEvent,
};

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The request was made against another engine's limits ([`EngineRequest::new`]) and
    /// does not fit this one's.
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// The engine thread has stopped, or an engine-level fault stopped the engine.
    #[error("the engine has stopped")]
    EngineStopped,
}

/// Errors building or stepping the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Settings that cannot work.
    #[error("engine configuration: {0}")]
    Config(String),
    /// The forward pass failed.
    #[error(transparent)]
    Model(#[from] met_model_layers::ModelError),
    /// Sampling failed.
    #[error(transparent)]
    Kernels(#[from] met_kernels::Error),
}
