//! An engine-level fault, once one happened: shared by the engine and its handles.
//!
//! **Invariant:** the first fault recorded is the one kept; a fault is never cleared, so a
//! faulted engine refuses new work for good and every handle sees why.

use std::sync::OnceLock;

/// The engine's fault, if any, and a way to wait for one.
#[derive(Debug, Default)]
pub(crate) struct Health {
    fault: OnceLock<String>,
    changed: tokio::sync::Notify,
}

impl Health {
    /// Records `fault` (the first one wins) and wakes whoever waits for it.
    pub(crate) fn fail(&self, fault: String) {
        let _ = self.fault.set(fault);
        self.changed.notify_waiters();
    }

    /// The fault, if one happened.
    pub(crate) fn fault(&self) -> Option<&str> {
        self.fault.get().map(String::as_str)
    }

    /// Waits until a fault happens and returns it.
    pub(crate) async fn wait(&self) -> String {
        loop {
            // Registered before the check, so a fault recorded in between still wakes it.
            let changed = self.changed.notified();
            if let Some(fault) = self.fault() {
                return fault.to_owned();
            }
            changed.await;
        }
    }
}
