//! A sequence's undelivered token events: what its client's bounded stream had no room for.
//!
//! **Invariant:** events reach the stream in the order they were sent. Once one waits, every
//! later one queues behind it, and the sequence pauses (it schedules nothing) until the
//! queue is empty, so a slow client holds back only its own sequences. A closed stream
//! drops its events: the client is gone, and cancellation reaps the sequence.

use std::collections::VecDeque;

use tokio::sync::mpsc::Sender;
use tokio::sync::mpsc::error::TrySendError;

use crate::request::TokenEvent;

/// Events waiting for room in a stream, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    queued: VecDeque<TokenEvent>,
}

impl Outbox {
    /// Whether every event sent so far was delivered.
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }

    /// Sends `event` to `stream`, queueing it when the stream is full or older events wait.
    pub(crate) fn send(&mut self, stream: &Sender<TokenEvent>, event: TokenEvent) {
        if !self.queued.is_empty() {
            self.queued.push_back(event);
            return self.flush(stream);
        }
        match stream.try_send(event) {
            Ok(()) | Err(TrySendError::Closed(_)) => {}
            Err(TrySendError::Full(event)) => self.queued.push_back(event),
        }
    }

    /// Delivers queued events while `stream` has room.
    pub(crate) fn flush(&mut self, stream: &Sender<TokenEvent>) {
        while let Some(event) = self.queued.pop_front() {
            match stream.try_send(event) {
                Ok(()) => {}
                Err(TrySendError::Full(event)) => {
                    self.queued.push_front(event);
                    return;
                }
                Err(TrySendError::Closed(_)) => {
                    self.queued.clear();
                    return;
                }
            }
        }
    }
}
