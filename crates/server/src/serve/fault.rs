//! A fault hook that exists only so that tests can check how the real `met serve` binary
//! handles an engine-level fault (issue 17): the running requests end with an error,
//! `/health` turns 503 and the process exits non-zero for its supervisor, never a hang.
//! In-process tests inject faults through the scheduler's mock model; the live suite has
//! only the binary and the default model, so it sets [`VAR`] instead.
//!
//! [`VAR`] is unset in every normal run, and then [`inject`] hands the loaded model back
//! untouched. Set, it names when the model faults:
//!
//! - `panic-after-steps=N`: the first `N` forward passes run; every later one panics, as a
//!   bug inside a step would. The engine thread catches the panic (`met_scheduler::spawn`).
//! - `error-after-steps=N`: every pass after the first `N` fails with a device error
//!   ([`met_kernels::Error::Device`]). No sequence owns a device error, so the engine does
//!   not take the per-sequence isolation path (rerunning each sequence alone, which a
//!   batch error gets) but faults at once.
//!
//! Every pass after the `N`-th faults, not only the first: a broken device stays broken.
//! Passes are counted from the first step the engine runs: the warm-up that sizes the KV
//! cache runs before the model is wrapped, and graph capture goes to the wrapped model
//! unseen. A value that is not one of these is a startup error naming the variable,
//! raised before the weights load.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail};
use met_cache::{KvCache, KvLayout};
use met_kernels::Tensor;
use met_model_layers::{ForwardBatch, GraphCapture, GraphSettings, Model};

/// The environment variable that turns the hook on.
pub const VAR: &str = "MET_TEST_ENGINE_FAULT";

/// How the model fails once its passes are spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Panic,
    DeviceError,
}

/// A fault asked for by [`VAR`]: `failure` on every forward pass after the first `after_steps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InjectedFault {
    failure: Failure,
    after_steps: u64,
}

/// The fault [`VAR`] asks for, or `None` when it is unset.
///
/// # Errors
/// [`VAR`] is set to anything but `panic-after-steps=N` or `error-after-steps=N`.
pub fn from_env() -> Result<Option<InjectedFault>> {
    let Some(value) = std::env::var_os(VAR) else { return Ok(None) };
    let Some(fault) = value.to_str().and_then(parse) else {
        bail!(
            "{VAR}={value:?}: expected `panic-after-steps=N` or `error-after-steps=N` \
             (a hook for tests of engine faults; unset it to serve normally)"
        );
    };
    tracing::warn!(
        "{VAR}={}: the model will fault after {} forward passes (a test hook)",
        value.to_string_lossy(),
        fault.after_steps
    );
    Ok(Some(fault))
}

/// `MODE=N`, for the two modes of the module's documentation.
fn parse(value: &str) -> Option<InjectedFault> {
    let (mode, steps) = value.split_once('=')?;
    let failure = match mode {
        "panic-after-steps" => Failure::Panic,
        "error-after-steps" => Failure::DeviceError,
        _ => return None,
    };
    Some(InjectedFault { failure, after_steps: steps.parse().ok()? })
}

/// `model`, made to fail as `fault` says; `model` itself without one.
pub fn inject(fault: Option<InjectedFault>, model: Box<dyn Model>) -> Box<dyn Model> {
    match fault {
        Some(fault) => Box::new(Faulting { inner: model, fault, passes: AtomicU64::new(0) }),
        None => model,
    }
}

/// A model that runs `inner` until its passes are spent, then fails every pass.
struct Faulting {
    inner: Box<dyn Model>,
    fault: InjectedFault,
    passes: AtomicU64,
}

impl Model for Faulting {
    fn forward(&self, batch: &ForwardBatch, kv: &mut dyn KvCache) -> met_model_layers::Result<Tensor> {
        let pass = self.passes.fetch_add(1, Ordering::Relaxed) + 1;
        if pass <= self.fault.after_steps {
            return self.inner.forward(batch, kv);
        }
        match self.fault.failure {
            Failure::Panic => panic!("{VAR}: injected panic in forward pass {pass}"),
            Failure::DeviceError => {
                Err(met_kernels::Error::Device(format!("{VAR}: injected device error in forward pass {pass}")).into())
            }
        }
    }

    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    fn kv_layout(&self) -> KvLayout {
        self.inner.kv_layout()
    }

    fn max_context(&self) -> usize {
        self.inner.max_context()
    }

    fn capture_graphs(&self, kv: &dyn KvCache, settings: &GraphSettings) -> met_model_layers::Result<GraphCapture> {
        self.inner.capture_graphs(kv, settings)
    }

    fn graph_replays(&self) -> u64 {
        self.inner.graph_replays()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use met_cache::PagedKvCache;
    use met_config::{EngineConfig, SamplingParams};
    use met_kernels::CpuBackend;
    use met_scheduler::mock::MockModel;
    use met_scheduler::{Engine, EngineRequest, FinishReason, StopCriteria};
    use met_telemetry::Metrics;

    use super::*;

    #[test]
    fn values_parse_and_anything_else_is_refused() {
        let fault = |failure, after_steps| Some(InjectedFault { failure, after_steps });
        assert_eq!(parse("panic-after-steps=3"), fault(Failure::Panic, 3));
        assert_eq!(parse("error-after-steps=0"), fault(Failure::DeviceError, 0));
        for bad in ["", "panic", "panic-after-steps", "panic-after-steps=", "panic-after-steps=-1", "oops=2"] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }

    /// Runs one greedy request of up to 64 tokens on an engine over a mock model with
    /// `fault`: the tokens it got, how it finished, and the engine's fault.
    fn serve_one(fault: InjectedFault) -> (usize, Option<FinishReason>, Option<String>) {
        const VOCAB: usize = 64;
        let backend = Arc::new(CpuBackend::new());
        let config = EngineConfig { block_size: 4, ..EngineConfig::default() };
        let kv = PagedKvCache::new(&*backend, MockModel::layout(), 4, 64, true).unwrap();
        let model = inject(Some(fault), Box::new(MockModel::new(VOCAB, 256)));
        assert_eq!((model.vocab_size(), model.max_context()), (VOCAB, 256), "forwarded to the model");
        let engine = Engine::new(model, backend, Box::new(kv), config, Arc::new(Metrics::new())).unwrap();
        let (handle, thread) = met_scheduler::spawn(engine);
        let stop = StopCriteria { max_new_tokens: 64, ignore_eos: true, ..StopCriteria::default() };
        let request = EngineRequest::new(vec![5, 6, 7], SamplingParams::greedy(), stop, 1, &handle.limits()).unwrap();
        let mut events = handle.submit(request).unwrap();
        let (mut tokens, mut finish) = (0, None);
        while let Some(event) = events.blocking_next() {
            tokens += usize::from(event.token.is_some());
            finish = finish.or(event.finish);
        }
        let fault = handle.fault();
        // Without its last handle the engine thread ends even when it did not fault.
        drop(handle);
        thread.join().expect("the engine thread does not panic");
        (tokens, finish, fault)
    }

    #[test]
    fn both_failures_are_engine_faults_after_the_passes_that_ran() {
        for (failure, says) in [(Failure::Panic, "injected panic"), (Failure::DeviceError, "injected device error")] {
            let (tokens, finish, fault) = serve_one(InjectedFault { failure, after_steps: 3 });
            // One prompt in one prefill: each of the three passes that ran gave one token.
            assert_eq!(tokens, 3, "{failure:?}");
            let fault = fault.unwrap_or_else(|| panic!("{failure:?} is an engine fault, not a sequence's"));
            assert!(fault.contains(VAR) && fault.contains(says) && fault.contains("pass 4"), "{fault}");
            assert_eq!(finish, Some(FinishReason::Error(fault)), "{failure:?}");
        }
    }

    #[test]
    fn without_a_fault_the_model_is_served_untouched() {
        let model: Box<dyn Model> = Box::new(MockModel::new(64, 256));
        let address = std::ptr::from_ref(&*model).cast::<u8>();
        assert_eq!(std::ptr::from_ref(&*inject(None, model)).cast::<u8>(), address);
    }
}
