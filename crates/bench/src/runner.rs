//! One ladder point: send every request under its arrival pattern, collect one record per
//! request, stop at the global deadline.
//!
//! At a fixed concurrency `c`, `c` workers take the next request as soon as their last one
//! ends, so exactly `c` are in flight until the queue drains. At a request rate, a
//! dispatcher sends request `i` at the sum of `i` gamma-distributed gaps (an absolute
//! schedule, so a slow spawn does not shift every later arrival), however many are in
//! flight. Records come back over a channel as requests end; when the deadline passes the
//! producer is aborted, which drops its task set and so cancels every request in flight
//! (their connections close). Nothing here retries: a failure is a record.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper::body::Bytes;
use indicatif::ProgressBar;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::client::Client;
use crate::metrics::Record;
use crate::rng::{Rng, interarrival};

/// How requests arrive at one ladder point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    /// This many in flight at all times.
    Concurrency(usize),
    /// Gamma-distributed arrivals: `rate` per second on average, shape `burstiness`.
    Rate {
        /// Mean requests per second.
        rate: f64,
        /// Shape of the gaps; 1 is Poisson.
        burstiness: f64,
    },
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The JSON body.
    pub body: Bytes,
    /// The prompt's length when the dataset knows it.
    pub prompt_tokens: Option<usize>,
}

/// What one ladder point produced.
#[derive(Debug)]
pub struct PointRun {
    /// One per request that ended, in the order they ended.
    pub records: Vec<Record>,
    /// Requests cancelled or never sent because the deadline passed.
    pub cancelled: usize,
    /// First send to the last record (or to the deadline).
    pub duration_s: f64,
    /// Whether the deadline cut the point short.
    pub stopped: bool,
}

/// The arrival stream's salt, apart from the dataset's streams.
const ARRIVAL_STREAM: u64 = 0xA441_7A15;

/// What every request of a point shares.
#[derive(Debug, Clone)]
pub struct Target {
    /// The client.
    pub client: Client,
    /// The endpoint's path under `/v1`.
    pub path: &'static str,
}

/// Runs `requests` under `load` until they all ended or `deadline` passed; `bar` ticks per
/// ended request. `seed` fixes the arrival times.
pub async fn run_point(
    target: &Target,
    requests: Arc<[Prepared]>,
    load: Load,
    seed: u64,
    deadline: Instant,
    bar: &ProgressBar,
) -> PointRun {
    let total = requests.len();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let start = Instant::now();
    let producer = tokio::spawn(produce(target.clone(), requests, load, seed, tx));
    let mut records = Vec::with_capacity(total);
    let mut last = start;
    let stopped = loop {
        tokio::select! {
            record = rx.recv() => match record {
                Some(record) => {
                    records.push(record);
                    last = Instant::now();
                    bar.inc(1);
                }
                None => break false,
            },
            () = tokio::time::sleep_until(deadline.into()) => break true,
        }
    };
    producer.abort();
    // Requests that ended as the deadline passed still count.
    while let Ok(record) = rx.try_recv() {
        records.push(record);
    }
    let end = if stopped { Instant::now() } else { last };
    PointRun { cancelled: total - records.len(), records, duration_s: end.duration_since(start).as_secs_f64(), stopped }
}

/// Sends every request under `load`; returns when all have ended. Dropping it (abort)
/// cancels those in flight.
async fn produce(target: Target, requests: Arc<[Prepared]>, load: Load, seed: u64, tx: mpsc::UnboundedSender<Record>) {
    let mut tasks = JoinSet::new();
    match load {
        Load::Concurrency(concurrency) => {
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..concurrency.min(requests.len()) {
                let (target, requests, next, tx) =
                    (target.clone(), Arc::clone(&requests), Arc::clone(&next), tx.clone());
                tasks.spawn(async move {
                    while let Some(request) = requests.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let record = send(&target, request).await;
                        if tx.send(record).is_err() {
                            break;
                        }
                    }
                });
            }
        }
        Load::Rate { rate, burstiness } => {
            let mut rng = Rng::derived(seed, ARRIVAL_STREAM);
            let start = tokio::time::Instant::now();
            let mut at = 0.0;
            for (i, request) in requests.iter().enumerate() {
                if i > 0 {
                    at += interarrival(&mut rng, rate, burstiness);
                    tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
                }
                let (target, request, tx) = (target.clone(), request.clone(), tx.clone());
                tasks.spawn(async move {
                    let _ = tx.send(send(&target, &request).await);
                });
            }
        }
    }
    drop(tx);
    while tasks.join_next().await.is_some() {}
}

async fn send(target: &Target, request: &Prepared) -> Record {
    target.client.stream(target.path, request.body.clone(), request.prompt_tokens).await
}
