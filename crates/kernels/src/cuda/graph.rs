//! CUDA graphs: the ops a closure issues are captured from the compute stream into a graph,
//! instantiated once, and replayed with one launch.
//!
//! Capture runs in thread-local mode, so only this thread's calls are recorded and checked.
//! Memory the captured ops allocate comes from the graph arena shared by all graphs
//! ([`super::arena`]), at addresses fixed across replays, so the graph holds kernels and
//! copies only and consecutive kernels overlap (programmatic dependent launch). A tensor
//! that must outlive the recording is made before it and written inside it. The first
//! recording (the largest step) sizes the arena: it runs once to measure, once for real.

use std::sync::Arc;

use cudarc::driver::CudaGraph;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use parking_lot::Mutex;

use super::device::{ArenaFit, Device};
use super::{CudaBackend, drv};
use crate::backend::Graph;
use crate::error::{Error, Result};

/// A captured, instantiated graph of the compute stream.
struct StreamGraph {
    /// cudarc's graph is not thread safe; replays are serialised here.
    graph: Mutex<CudaGraph>,
    device: Arc<Device>,
}

// SAFETY: the graph's driver handles may be used from any thread as long as calls on them are
// serialised, which the mutex does.
unsafe impl Send for StreamGraph {}
// SAFETY: as above.
unsafe impl Sync for StreamGraph {}

impl Graph for StreamGraph {
    fn replay(&self) -> Result<()> {
        self.device.bind()?;
        self.graph.lock().launch().map_err(drv)
    }
}

pub(super) fn capture(b: &CudaBackend, record: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Graph>> {
    let (graph, fit) = record_once(b, record)?;
    let graph = match fit {
        ArenaFit::Fits => graph,
        ArenaFit::Needs(bytes) => {
            drop(graph);
            b.dev.grow_graph_memory(bytes)?;
            // The same ops allocate the same sizes in the same order, so this one fits; if
            // it did not, the graph would still be right, with allocation nodes.
            record_once(b, record)?.0
        }
    };
    graph.upload().map_err(drv)?;
    Ok(Box::new(StreamGraph { graph: Mutex::new(graph), device: Arc::clone(&b.dev) }))
}

/// One recording of `record`'s ops, and how their memory fitted the arena.
fn record_once(b: &CudaBackend, record: &mut dyn FnMut() -> Result<()>) -> Result<(CudaGraph, ArenaFit)> {
    // Work queued before the capture is not part of it; let it finish first.
    b.dev.synchronize()?;
    let stream = b.dev.stream();
    b.dev.begin_graph_memory()?;
    let began = stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(drv);
    let recorded = began.and_then(|()| record());
    // Every side branch rejoins the compute stream before the capture ends (one that
    // failed between a fork and its join left it open).
    let joined = b.dev.join();
    let recorded = recorded.and(joined);
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    let fit = b.dev.end_graph_memory();
    recorded.map_err(|e| Error::Device(format!("while capturing a graph: {e}")))?;
    let graph = ended.map_err(drv)?.ok_or_else(|| Error::Device("the graph capture recorded nothing".into()))?;
    Ok((graph, fit?))
}
