//! A tiny broadcast pool whose workers spin briefly between jobs.
//!
//! A decode step runs a few hundred matrix-vector products of a few dozen microseconds
//! each. Rayon parks idle workers on a futex, and waking them for every product cost a
//! quarter of the step in system calls. Here each job is broadcast to every worker (the
//! caller takes part 0), and a worker that finishes keeps polling for the next job for
//! [`SPIN`] before it parks, so back-to-back jobs never touch the kernel.
//!
//! Invariant: `run` returns only after every worker finished the job, so the job closure
//! (borrowed from the caller's stack) is never used after `run` returns.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker polls before parking.
const SPIN: Duration = Duration::from_micros(200);

type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// Incremented once per job.
    epoch: AtomicU64,
    /// The current job: a `*const Job<'_>` that lives on the caller's stack during `run`.
    job: AtomicUsize,
    /// Workers still running the current job.
    pending: AtomicUsize,
    /// Workers parked (or about to park) on `wake`.
    sleeping: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

/// The pool: `parts()` participants, the caller included.
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
            pending: AtomicUsize::new(0),
            sleeping: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 0..workers {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("met-spin-{}", i + 1))
                .spawn(move || work(&shared, i + 1))
                .expect("spawning a pool worker");
        }
        Self { shared, workers, running: Mutex::new(()) }
    }

    /// Participants in every job.
    pub(crate) fn parts(&self) -> usize {
        self.workers + 1
    }

    /// Runs `f(part)` for every part `0..parts()` concurrently; the caller runs part 0.
    pub(crate) fn run(&self, f: Job<'_>) {
        if self.workers == 0 {
            return f(0);
        }
        let _one_job = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let s = &*self.shared;
        s.pending.store(self.workers, Ordering::SeqCst);
        s.job.store(std::ptr::from_ref(&f) as usize, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleeping.load(Ordering::SeqCst) > 0 {
            let _g = s.lock.lock().unwrap_or_else(|e| e.into_inner());
            s.wake.notify_all();
        }
        f(0);
        while s.pending.load(Ordering::Acquire) > 0 {
            std::hint::spin_loop();
        }
    }
}

fn work(s: &Shared, part: usize) {
    let mut seen = 0;
    loop {
        let start = Instant::now();
        let mut epoch = s.epoch.load(Ordering::Acquire);
        let mut polls = 0u32;
        // Reading the clock costs more than a poll: look at it every 256 polls.
        while epoch == seen && (!polls.is_multiple_of(256) || start.elapsed() < SPIN) {
            std::hint::spin_loop();
            polls = polls.wrapping_add(1);
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
        // SAFETY: `run` stored a pointer to a `Job` on its stack before publishing the
        // epoch, and does not return (so the job stays alive) until `pending` reaches 0,
        // which happens only after this call finishes.
        let job = unsafe { *(s.job.load(Ordering::SeqCst) as *const Job<'_>) };
        job(part);
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU32;

    use super::*;

    #[test]
    fn every_part_runs_once_per_job_across_many_jobs() {
        let pool = SpinPool::new(3);
        let counts: Vec<AtomicU32> = (0..pool.parts()).map(|_| AtomicU32::new(0)).collect();
        for round in 0..2000 {
            if round % 500 == 0 {
                // Let the workers park, so waking them is exercised too.
                std::thread::sleep(SPIN * 3);
            }
            pool.run(&|part| {
                counts[part].fetch_add(1, Ordering::Relaxed);
            });
        }
        assert!(counts.iter().all(|c| c.load(Ordering::Relaxed) == 2000));
    }
}
