//! A tiny pool whose workers spin briefly between jobs and share each job's chunks.
//!
//! A decode step runs a few hundred matrix-vector products of a few dozen microseconds
//! each. Rayon parks idle workers on a futex, and waking them for every product cost a
//! quarter of the step in system calls. Here a worker that finishes keeps polling for the
//! next job for [`SPIN`] before it parks, so back-to-back jobs never touch the kernel.
//!
//! A job is a number of chunks that the caller and the workers claim one at a time from a
//! shared counter. Nobody owns a fixed share, so a worker that the OS has descheduled
//! (another process, or the server's own threads, wanting the core) delays nothing: the
//! others take its chunks, and the caller waits only for chunks already being run. Waiting
//! threads yield the core after a short spin, so a descheduled thread gets it back.
//!
//! Invariant: `run` returns only after every chunk ran and no worker is inside the job, so
//! the job closure (borrowed from the caller's stack) is never used after `run` returns.
//! A worker enters a job by counting itself `active` and then checking that the job is
//! still `open`; the caller closes it and then waits for `active` to reach zero. Both sides
//! use sequentially consistent operations, so either the worker sees the job closed and
//! leaves it untouched, or the caller sees the worker and waits for it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker polls before parking.
const SPIN: Duration = Duration::from_micros(200);

/// Polls between yields of a waiting thread.
const POLLS_PER_YIELD: u32 = 1 << 10;

type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Incremented once per job.
    epoch: AtomicU64,
    /// The current job: a `*const Job<'_>` that lives on the caller's stack during `run`.
    job: AtomicUsize,
    /// Whether workers may enter the current job.
    open: AtomicBool,
    /// Workers inside the current job.
    active: AtomicUsize,
    /// Chunks of the current job, the next one to claim, and those finished.
    chunks: AtomicUsize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

impl Shared {
    /// Claims and runs chunks of `job` until none is left.
    fn take_chunks(&self, job: Job<'_>) {
        let chunks = self.chunks.load(Ordering::SeqCst);
        loop {
            let chunk = self.next.fetch_add(1, Ordering::SeqCst);
            if chunk >= chunks {
                return;
            }
            job(chunk);
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

/// Spins on `busy` with a CPU hint, yielding the core every [`POLLS_PER_YIELD`] polls.
fn wait_while(busy: impl Fn() -> bool) {
    let mut polls = 0u32;
    while busy() {
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(POLLS_PER_YIELD) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The pool: `parts()` threads, the caller included.
pub(crate) struct SpinPool {
    shared: Arc<Shared>,
    workers: usize,
    /// One job at a time.
    running: Mutex<()>,
}

impl SpinPool {
    /// The process-wide pool, sized like rayon's global pool.
    pub(crate) fn global() -> &'static SpinPool {
        static POOL: OnceLock<SpinPool> = OnceLock::new();
        POOL.get_or_init(|| SpinPool::new(rayon::current_num_threads().saturating_sub(1)))
    }

    fn new(workers: usize) -> Self {
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: AtomicUsize::new(0),
            open: AtomicBool::new(false),
            active: AtomicUsize::new(0),
            chunks: AtomicUsize::new(0),
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 0..workers {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("met-spin-{}", i + 1))
                .spawn(move || work(&shared))
                .expect("spawning a pool worker");
        }
        Self { shared, workers, running: Mutex::new(()) }
    }

    /// Threads that take part in a job, the caller included.
    pub(crate) fn parts(&self) -> usize {
        self.workers + 1
    }

    /// Runs `f(chunk)` once for every chunk `0..chunks`, spread over the caller and the
    /// workers as each becomes free.
    pub(crate) fn run(&self, chunks: usize, f: Job<'_>) {
        if self.workers == 0 || chunks <= 1 {
            return (0..chunks).for_each(f);
        }
        let _one_job = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.chunks.store(chunks, Ordering::SeqCst);
        s.next.store(0, Ordering::SeqCst);
        s.done.store(0, Ordering::SeqCst);
        s.job.store(std::ptr::from_ref(&f) as usize, Ordering::SeqCst);
        s.open.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        s.take_chunks(f);
        wait_while(|| s.done.load(Ordering::Acquire) < chunks);
        s.open.store(false, Ordering::SeqCst);
        wait_while(|| s.active.load(Ordering::SeqCst) > 0);
    }

    /// Runs `f(i, piece)` for every piece `i` of `out` cut into runs of `len` (the last one
    /// shorter), spread over the pool as [`Self::run`] does: each call writes its own piece.
    pub(crate) fn run_pieces(&self, out: &mut [f32], len: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
        let pieces: Vec<Mutex<&mut [f32]>> = out.chunks_mut(len.max(1)).map(Mutex::new).collect();
        self.run(pieces.len(), &|i| f(i, &mut pieces[i].lock().unwrap_or_else(|e| e.into_inner())));
    }
}

fn work(s: &Shared) {
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut epoch = s.epoch.load(Ordering::Acquire);
        let mut polls = 0u32;
        // Reading the clock costs more than a poll: look at it every 256 polls.
        while epoch == seen && (!polls.is_multiple_of(256) || start.elapsed() < SPIN) {
            polls = polls.wrapping_add(1);
            if polls.is_multiple_of(POLLS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            epoch = s.epoch.load(Ordering::Acquire);
        }
        if epoch == seen {
            let mut guard = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.sleeping.fetch_add(1, Ordering::SeqCst);
            while s.epoch.load(Ordering::SeqCst) == seen {
                guard = s.wake.wait(guard).unwrap_or_else(|e| e.into_inner());
            }
            s.sleeping.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
            epoch = s.epoch.load(Ordering::Acquire);
        }
        seen = epoch;
        s.active.fetch_add(1, Ordering::SeqCst);
        if s.open.load(Ordering::SeqCst) {
            // SAFETY: the job is open and this worker is counted active, so `run` has
            // stored a pointer to a `Job` on its stack and will not return (the job stays
            // alive) until `active` is back to 0 (see the module's invariant).
            let job = unsafe { *(s.job.load(Ordering::SeqCst) as *const Job<'_>) };
            s.take_chunks(job);
        }
        s.active.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn every_chunk_runs_once_per_job_across_many_jobs() {
        let pool = SpinPool::new(3);
        let counts: Vec<AtomicU32> = (0..13).map(|_| AtomicU32::new(0)).collect();
        for round in 0..2000 {
            if round % 500 == 0 {
                // Let the workers park, so waking them is exercised too.
                std::thread::sleep(SPIN * 3);
            }
            let chunks = 1 + round % counts.len();
            pool.run(chunks, &|chunk| {
                counts[chunk].fetch_add(1, Ordering::Relaxed);
            });
        }
        for (chunk, c) in counts.iter().enumerate() {
            let want = (0..2000).filter(|round| 1 + round % 13 > chunk).count() as u32;
            assert_eq!(c.load(Ordering::Relaxed), want, "chunk {chunk}");
        }
    }

    /// A worker that stalls inside a chunk leaves every other chunk to the caller and the
    /// other worker: it runs that one chunk only (a fixed share would be a third of them).
    #[test]
    fn a_stalled_thread_leaves_its_chunks_to_the_others() {
        let pool = SpinPool::new(2);
        let chunks = 64;
        let stalled: Mutex<Option<std::thread::ThreadId>> = Mutex::new(None);
        let by_stalled = AtomicU32::new(0);
        let ran: Vec<AtomicU32> = (0..chunks).map(|_| AtomicU32::new(0)).collect();
        pool.run(chunks, &|chunk| {
            let me = std::thread::current();
            let first = {
                let mut s = stalled.lock().unwrap();
                if s.is_none() && me.name().is_some_and(|n| n.starts_with("met-spin")) {
                    *s = Some(me.id());
                    true
                } else {
                    false
                }
            };
            if *stalled.lock().unwrap() == Some(me.id()) {
                by_stalled.fetch_add(1, Ordering::SeqCst);
            }
            // Every chunk takes a while, so the workers join in; the first worker's first
            // chunk takes far longer than all the others together.
            std::thread::sleep(Duration::from_millis(if first { 300 } else { 1 }));
            ran[chunk].fetch_add(1, Ordering::Relaxed);
        });
        assert!(ran.iter().all(|c| c.load(Ordering::Relaxed) == 1), "every chunk ran once");
        assert_eq!(by_stalled.load(Ordering::SeqCst), 1, "the stalled worker's chunks went to the others");
    }
}
