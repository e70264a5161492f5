//! [`Logs`]: the `tracing` events of the current thread, captured as lines of text, so a
//! test can check what the server logs. A `#[tokio::test]` runs the router on its own
//! thread, so its handlers log there.
//!
//! One global subscriber collects for every capturing thread: a per-thread default
//! subscriber (`tracing::subscriber::set_default`) races with the other tests' threads over
//! tracing's cached callsite interest and sometimes sees nothing.

use std::collections::HashMap;
use std::fmt::{Debug, Write};
use std::sync::{LazyLock, Mutex, Once};
use std::thread::ThreadId;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// The lines of each capturing thread.
static CAPTURED: LazyLock<Mutex<HashMap<ThreadId, Vec<String>>>> = LazyLock::new(Mutex::default);
static INSTALLED: Once = Once::new();

/// The events of the thread that made it, as `LEVEL message key=value ...`, until dropped.
#[derive(Debug)]
pub struct Logs {
    thread: ThreadId,
}

impl Logs {
    /// Starts capturing this thread's events.
    ///
    /// # Panics
    /// Another global subscriber is installed in this test binary.
    pub fn capture() -> Self {
        let thread = std::thread::current().id();
        captured().lock().unwrap().insert(thread, Vec::new());
        Self { thread }
    }

    /// The lines so far.
    pub fn lines(&self) -> Vec<String> {
        captured().lock().unwrap().get(&self.thread).cloned().unwrap_or_default()
    }
}

impl Drop for Logs {
    fn drop(&mut self) {
        captured().lock().unwrap().remove(&self.thread);
    }
}

fn captured() -> &'static Mutex<HashMap<ThreadId, Vec<String>>> {
    INSTALLED.call_once(|| tracing::subscriber::set_global_default(Collector).expect("no other global subscriber"));
    &CAPTURED
}

/// The global subscriber: keeps the events of capturing threads, drops the others.
struct Collector;

impl Subscriber for Collector {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut captured = CAPTURED.lock().unwrap();
        let Some(lines) = captured.get_mut(&std::thread::current().id()) else { return };
        let mut line = event.metadata().level().to_string();
        event.record(&mut Line(&mut line));
        lines.push(line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

struct Line<'a>(&'a mut String);

impl Visit for Line<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        let _ = match field.name() {
            "message" => write!(self.0, " {value:?}"),
            name => write!(self.0, " {name}={value:?}"),
        };
    }
}
