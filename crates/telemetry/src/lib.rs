//! Observability for met: tracing setup, the numbered startup phases, and the Prometheus
//! metrics the engine records and the server exposes ([`metrics`]).
//!
//! Logs go to stderr so that commands whose stdout is data (`met generate --json`) stay
//! machine-readable. The filter comes from `MET_LOG` (tracing's env-filter syntax),
//! defaulting to `info` for met's own crates and `warn` elsewhere.

pub mod metrics;
mod phase;

pub use metrics::{FinishLabel, Metrics, RequestStats, StepPhases, StepStats};
pub use phase::{Phase, PhaseTimer};

/// Installs the global tracing subscriber (stderr, `MET_LOG` filter). Safe to call twice:
/// later calls do nothing.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("MET_LOG").unwrap_or_else(|_| EnvFilter::new("warn,met=info,met_server=info"));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_target(false).try_init();
}
