//! LoRA adapters in the server: the registry of loaded adapters by the name requests give
//! as their `model`, filled from `--lora-modules` at startup and changed at run time by
//! `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter` (vLLM's routes, bodies
//! and plain-text answers), and [`Served`], the model a request named.
//!
//! **Invariant:** at most `--max-loras` adapters are held, each under a name that is
//! neither the base model's nor another adapter's. Unloading only forgets the name: a
//! request already submitted holds its own [`Adapter`] (an `Arc`), so its stream runs to
//! the end through the weights it started with, which keep their device slot until the
//! last such request finishes. The model's [`LoraPool`] therefore has twice `--max-loras`
//! slots: every loaded adapter can be replaced while its requests drain; a load that finds
//! every slot held is refused (400) until some finish. The lock guards the map alone: an
//! adapter's files are read and uploaded outside it, on a blocking worker, and no `.await`
//! happens under it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use met_config::{LoraConfig, ModelConfig};
use met_kernels::GpuBackend;
use met_model_layers::lora::{Adapter, LoraAdapter, LoraLimits, LoraPool};
use met_scheduler::EngineRequest;
use met_telemetry::Metrics;

use super::error::ApiError;
use super::state::AppState;
use super::wire::{ApiJson, LoadLoraRequest, UnloadLoraRequest};

/// What an adapter is loaded for: the base model's configuration and device, and the
/// limits every adapter is checked against.
pub struct AdapterTarget {
    /// The base model's configuration, which an adapter's shapes must fit.
    pub model: ModelConfig,
    /// The device the adapter's weights are uploaded to (the model's).
    pub backend: Arc<dyn GpuBackend>,
    /// `--max-lora-rank`.
    pub limits: LoraLimits,
}

impl AdapterTarget {
    /// Checks adapters can run at all: on this backend and on this model.
    ///
    /// # Errors
    /// A backend without the LoRA ops, naming `--enable-lora`.
    pub fn check(&self) -> anyhow::Result<()> {
        if !self.backend.supports_lora() {
            let device = self.backend.device();
            anyhow::bail!("--enable-lora: the {device} backend does not run LoRA adapters");
        }
        Ok(())
    }

    /// The device slots of a server holding `max_loras` adapters: twice as many, so each
    /// loaded adapter can be replaced while the requests of the one it replaced drain.
    ///
    /// # Errors
    /// A device that cannot hold the slots.
    pub fn slots(&self, max_loras: usize) -> anyhow::Result<Arc<LoraPool>> {
        LoraPool::new(&self.model, Arc::clone(&self.backend), self.limits, 2 * max_loras)
            .map_err(|e| anyhow::anyhow!("--enable-lora: the adapters' device slots: {e}"))
    }
}

/// The loaded adapters, by name, in the order they were loaded.
pub struct LoraRegistry {
    target: AdapterTarget,
    pool: Arc<LoraPool>,
    max_loras: usize,
    base: String,
    adapters: Mutex<Vec<LoadedAdapter>>,
    metrics: Arc<Metrics>,
}

/// One loaded adapter and the directory it came from (`/v1/models` shows it as `root`).
#[derive(Clone)]
pub struct LoadedAdapter {
    /// The adapter, its name included.
    pub adapter: Adapter,
    /// Where it was read from.
    pub path: PathBuf,
}

impl LoraRegistry {
    /// An empty registry for adapters of the model served as `base`, holding at most
    /// `max_loras`, counted in `metrics`, in slots of its own ([`AdapterTarget::slots`]):
    /// for a model that runs adapters from whichever pool they name (the CPU's eager steps).
    ///
    /// # Errors
    /// As [`AdapterTarget::slots`].
    pub fn new(target: AdapterTarget, max_loras: usize, base: String, metrics: Arc<Metrics>) -> anyhow::Result<Self> {
        let pool = target.slots(max_loras)?;
        Ok(Self::in_slots(target, pool, max_loras, base, metrics))
    }

    /// [`Self::new`] over `pool`, the slots the served model was given
    /// ([`met_model_layers::Model::attach_lora`]).
    pub fn in_slots(
        target: AdapterTarget,
        pool: Arc<LoraPool>,
        max_loras: usize,
        base: String,
        metrics: Arc<Metrics>,
    ) -> Self {
        metrics.set_lora_adapters(0);
        Self { target, pool, max_loras, base, adapters: Mutex::new(Vec::new()), metrics }
    }

    /// The registry of `--enable-lora` over the model's `pool`, with the `--lora-modules`
    /// adapters of `config` loaded (startup).
    ///
    /// # Errors
    /// An adapter that does not load, naming its flag value and what is wrong with it.
    pub fn from_flags(
        config: &LoraConfig,
        target: AdapterTarget,
        pool: Arc<LoraPool>,
        base: String,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let registry = Self::in_slots(target, pool, config.max_loras, base, metrics);
        for m in &config.modules {
            registry
                .load(&m.name, &m.path, false)
                .map_err(|e| anyhow::anyhow!("--lora-modules {}={}: {}", m.name, m.path.display(), e.message))?;
        }
        Ok(registry)
    }

    /// The adapter loaded as `name`.
    pub fn get(&self, name: &str) -> Option<Adapter> {
        self.lock().iter().find(|l| l.adapter.name() == name).map(|l| Arc::clone(&l.adapter))
    }

    /// Every loaded adapter, oldest first.
    pub fn list(&self) -> Vec<LoadedAdapter> {
        self.lock().clone()
    }

    /// Loads the PEFT adapter in `path` as `name`; with `inplace`, in place of the adapter
    /// loaded under that name, if any (new requests get the new weights, running ones
    /// finish on the old, and the two loads share no prefix-cache blocks). Blocking: it
    /// reads and uploads weights.
    ///
    /// # Errors
    /// 400 naming what is wrong: an empty name or (without `inplace`) one already taken,
    /// the `--max-loras` limit reached, or an adapter that does not load (the file or field
    /// at fault).
    pub fn load(&self, name: &str, path: &Path, inplace: bool) -> Result<(), ApiError> {
        self.check_room(name, inplace)?;
        let adapter = LoraAdapter::load(name, path, &self.target.model, &self.pool)
            .map_err(|e| ApiError::invalid("lora_path", e.to_string()))?;
        let loaded = LoadedAdapter { adapter: Arc::new(adapter), path: path.to_path_buf() };
        let mut adapters = self.lock();
        // Another load of the same name, or one filling the last slot, may have finished
        // while this one read its files.
        match adapters.iter().position(|l| l.adapter.name() == name).filter(|_| inplace) {
            Some(at) => adapters[at] = loaded,
            None => {
                Self::refuse(&adapters, name, self.max_loras)?;
                adapters.push(loaded);
            }
        }
        self.metrics.set_lora_adapters(adapters.len());
        tracing::info!("loaded LoRA adapter `{name}` from {}", path.display());
        Ok(())
    }

    /// Forgets the adapter `name`; requests already running through it finish unchanged.
    ///
    /// # Errors
    /// 404 when no adapter has that name.
    pub fn unload(&self, name: &str) -> Result<(), ApiError> {
        let mut adapters = self.lock();
        let at = adapters
            .iter()
            .position(|l| l.adapter.name() == name)
            .ok_or_else(|| ApiError::not_found("lora_name", format!("no LoRA adapter named `{name}` is loaded")))?;
        adapters.remove(at);
        self.metrics.set_lora_adapters(adapters.len());
        tracing::info!("unloaded LoRA adapter `{name}`");
        Ok(())
    }

    /// Refuses `name` before any file is read, when it could not be added (or, `inplace`,
    /// replace the adapter of that name) anyway.
    fn check_room(&self, name: &str, inplace: bool) -> Result<(), ApiError> {
        if name.trim().is_empty() {
            return Err(ApiError::invalid("lora_name", "`lora_name` is empty"));
        }
        if name == self.base {
            return Err(ApiError::invalid("lora_name", format!("`{name}` is the base model's name")));
        }
        let adapters = self.lock();
        if inplace && adapters.iter().any(|l| l.adapter.name() == name) {
            return Ok(());
        }
        Self::refuse(&adapters, name, self.max_loras)
    }

    fn refuse(adapters: &[LoadedAdapter], name: &str, max_loras: usize) -> Result<(), ApiError> {
        if adapters.iter().any(|l| l.adapter.name() == name) {
            let msg = format!(
                "a LoRA adapter named `{name}` is already loaded; unload it first, or load with `load_inplace`"
            );
            return Err(ApiError::invalid("lora_name", msg));
        }
        if adapters.len() >= max_loras {
            let msg = format!("{max_loras} LoRA adapters are loaded, the most --max-loras allows; unload one first");
            return Err(ApiError::invalid("lora_name", msg));
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<LoadedAdapter>> {
        self.adapters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The model a request named: the base model, or one of its adapters.
#[derive(Debug, Clone)]
pub struct Served {
    /// The name to answer with (the request's own `model`, or the base model's).
    pub name: String,
    /// The adapter its sequences run through; `None` for the base model.
    pub adapter: Option<Adapter>,
}

impl Served {
    /// `request`, run through this model's adapter if it has one.
    pub fn attach(&self, request: EngineRequest) -> EngineRequest {
        match &self.adapter {
            Some(adapter) => request.with_adapter(Arc::clone(adapter)),
            None => request,
        }
    }
}

/// `POST /v1/load_lora_adapter`: 200 with vLLM's plain-text success line.
pub(super) async fn load_adapter(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<LoadLoraRequest>,
) -> Result<Response, ApiError> {
    let name = req.lora_name.clone();
    tokio::task::spawn_blocking(move || {
        registry(&state)?.load(&req.lora_name, Path::new(&req.lora_path), req.load_inplace)
    })
    .await
    .map_err(|e| ApiError::internal(format!("loading the adapter failed: {e}")))??;
    Ok(success(format!("Success: LoRA adapter '{name}' added successfully.")))
}

/// `POST /v1/unload_lora_adapter`: 200 with vLLM's plain-text success line.
pub(super) async fn unload_adapter(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<UnloadLoraRequest>,
) -> Result<Response, ApiError> {
    registry(&state)?.unload(&req.lora_name)?;
    Ok(success(format!("Success: LoRA adapter '{}' removed successfully.", req.lora_name)))
}

fn registry(state: &AppState) -> Result<&LoraRegistry, ApiError> {
    // The routes exist only with a registry; a router built otherwise still answers.
    state.lora().ok_or_else(|| ApiError::not_found("lora_name", "LoRA is off on this server (--enable-lora)"))
}

fn success(line: String) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], line).into_response()
}
