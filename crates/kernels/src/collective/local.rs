//! `LocalCollective`: the ranks of a group are threads of this process, each with its own
//! backend, and every collective is a rendezvous in host memory.
//!
//! Each rank downloads its tensor, deposits it and waits; the last rank to arrive combines
//! every deposit in rank order (so the sum is the same, bit for bit, whichever rank arrives
//! last) and wakes the others, and each rank uploads the shared result to its own backend.
//! That is the whole protocol: one mutex, one condition variable and a round counter. It
//! runs on any backend but stages through the host, so it is meant for the CPU, where a
//! download and an upload are copies; GPUs use NCCL.
//!
//! Invariant: a round completes only when every rank has deposited, and a rank leaves a
//! round only after reading its result, so a fast rank that enters the next round cannot
//! overwrite a result a slow rank has yet to read. An aborted group wakes every waiting rank
//! with an error and refuses later rounds.

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use crate::collective::Collective;
use crate::{DType, Error, GpuBackend, HostTensor, Result, Tensor};

/// One rank of an in-process group. Build a group with [`LocalCollective::group`].
pub struct LocalCollective {
    rank: usize,
    backend: Arc<dyn GpuBackend>,
    shared: Arc<Rendezvous>,
}

/// What a round combines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Sum,
    Gather,
}

/// One rank's deposit.
struct Deposit {
    op: Op,
    dims: Vec<usize>,
    dtype: DType,
    data: Vec<f32>,
}

/// A round's result, shared by every rank: the combined values and their dims, or why the
/// deposits could not be combined.
type Outcome = std::result::Result<(Vec<f32>, Vec<usize>), String>;

struct Rendezvous {
    world: usize,
    round: Mutex<Round>,
    done: Condvar,
}

struct Round {
    deposits: Vec<Option<Deposit>>,
    arrived: usize,
    /// Rounds completed so far; a waiting rank leaves once this moves past its own round.
    completed: u64,
    /// The result of the last completed round.
    outcome: Arc<Outcome>,
    aborted: bool,
}

impl LocalCollective {
    /// One collective per backend, in rank order, joined to each other.
    pub fn group(backends: &[Arc<dyn GpuBackend>]) -> Vec<Self> {
        let shared = Arc::new(Rendezvous {
            world: backends.len(),
            round: Mutex::new(Round {
                deposits: backends.iter().map(|_| None).collect(),
                arrived: 0,
                completed: 0,
                outcome: Arc::new(Err("no round has completed".into())),
                aborted: false,
            }),
            done: Condvar::new(),
        });
        let join = |(rank, backend): (usize, &Arc<dyn GpuBackend>)| Self {
            rank,
            backend: Arc::clone(backend),
            shared: Arc::clone(&shared),
        };
        backends.iter().enumerate().map(join).collect()
    }

    /// Deposits `x` for `op`, waits for the round and uploads its result.
    fn collect(&self, op: Op, x: &Tensor) -> Result<Tensor> {
        if !x.dtype().is_float() {
            return Err(Error::DType { op: "collective", expected: self.backend.float_dtype(), got: x.dtype() });
        }
        let data = self.backend.download_f32(x)?;
        let deposit = Deposit { op, dims: x.dims().to_vec(), dtype: x.dtype(), data };
        let outcome = self.shared.meet(self.rank, deposit)?;
        let (values, dims) = (*outcome).as_ref().map_err(|msg| Error::InvalidArgument(msg.clone()))?;
        self.backend.upload(&HostTensor::from_f32(values, dims), x.dtype())
    }
}

impl Rendezvous {
    /// Adds `rank`'s deposit to the current round and returns the round's outcome once every
    /// rank has deposited.
    fn meet(&self, rank: usize, deposit: Deposit) -> Result<Arc<Outcome>> {
        let mut round = self.round.lock();
        if round.aborted {
            return Err(aborted());
        }
        let mine = round.completed;
        round.deposits[rank] = Some(deposit);
        round.arrived += 1;
        if round.arrived == self.world {
            let deposits: Vec<Deposit> = round.deposits.iter_mut().map(|d| d.take().expect("every rank")).collect();
            round.outcome = Arc::new(combine(deposits));
            round.arrived = 0;
            round.completed += 1;
            self.done.notify_all();
        } else {
            while round.completed == mine && !round.aborted {
                self.done.wait(&mut round);
            }
            if round.completed == mine {
                return Err(aborted());
            }
        }
        Ok(Arc::clone(&round.outcome))
    }

    fn abort(&self) {
        self.round.lock().aborted = true;
        self.done.notify_all();
    }
}

fn aborted() -> Error {
    Error::Device("the tensor-parallel group was aborted: another rank failed".into())
}

/// Every rank's deposit combined in rank order, or why they disagree.
fn combine(mut deposits: Vec<Deposit>) -> Outcome {
    let first = &deposits[0];
    if let Some((rank, d)) =
        deposits.iter().enumerate().find(|(_, d)| d.op != first.op || d.dims != first.dims || d.dtype != first.dtype)
    {
        return Err(format!(
            "collective mismatch: rank 0 sent {:?} {:?} {}, rank {rank} sent {:?} {:?} {}",
            first.op, first.dims, first.dtype, d.op, d.dims, d.dtype
        ));
    }
    let (op, mut dims) = (first.op, first.dims.clone());
    let mut values = std::mem::take(&mut deposits[0].data);
    match op {
        Op::Sum => {
            for d in &deposits[1..] {
                values.iter_mut().zip(&d.data).for_each(|(a, b)| *a += b);
            }
        }
        Op::Gather => {
            values.reserve(values.len() * (deposits.len() - 1));
            for d in &deposits[1..] {
                values.extend_from_slice(&d.data);
            }
            match dims.first_mut() {
                Some(rows) => *rows *= deposits.len(),
                None => dims = vec![deposits.len()],
            }
        }
    }
    Ok((values, dims))
}

impl Collective for LocalCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.shared.world
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        // Alone, the sum is the tensor itself; tensors are immutable, so it can be shared.
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        self.collect(Op::Sum, x)
    }

    fn all_gather(&self, x: &Tensor) -> Result<Tensor> {
        if self.shared.world == 1 {
            return Ok(x.clone());
        }
        self.collect(Op::Gather, x)
    }

    fn abort(&self) {
        self.shared.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::thread;

    use super::*;
    use crate::CpuBackend;

    fn group(world: usize) -> Vec<LocalCollective> {
        let backends: Vec<Arc<dyn GpuBackend>> =
            (0..world).map(|_| Arc::new(CpuBackend::new()) as Arc<dyn GpuBackend>).collect();
        LocalCollective::group(&backends)
    }

    /// Runs `f` on every rank of a group of `world`, each on its own thread.
    fn on_ranks<T: Send>(world: usize, f: impl Fn(&LocalCollective) -> T + Sync) -> Vec<T> {
        let ranks = group(world);
        thread::scope(|s| {
            let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| f(c))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn tensor(c: &LocalCollective, values: &[f32], dims: &[usize]) -> Tensor {
        c.backend.upload(&HostTensor::from_f32(values, dims), DType::F32).unwrap()
    }

    #[test]
    fn all_reduce_sums_every_rank_and_all_gather_stacks_them_in_rank_order() {
        let results = on_ranks(3, |c| {
            let r = c.rank() as f32;
            let x = tensor(c, &[r, 10.0 * r], &[1, 2]);
            let mut out = Vec::new();
            // Several rounds back to back: a fast rank must not disturb a slow one's result.
            for _ in 0..50 {
                let sum = c.backend.download_f32(&c.all_reduce_sum(&x).unwrap()).unwrap();
                let gathered = c.all_gather(&x).unwrap();
                out.push((sum, gathered.dims().to_vec(), c.backend.download_f32(&gathered).unwrap()));
            }
            out
        });
        for rank in results {
            for (sum, dims, gathered) in rank {
                assert_eq!(sum, [3.0, 30.0]);
                assert_eq!(dims, [3, 2]);
                assert_eq!(gathered, [0.0, 0.0, 1.0, 10.0, 2.0, 20.0]);
            }
        }
    }

    #[test]
    fn mismatched_shapes_fail_on_every_rank() {
        let errors = on_ranks(2, |c| {
            let x = tensor(c, &vec![1.0; c.rank() + 1], &[c.rank() + 1]);
            c.all_reduce_sum(&x).unwrap_err().to_string()
        });
        for e in errors {
            assert!(e.contains("collective mismatch"), "{e}");
        }
    }

    #[test]
    fn an_abort_wakes_the_waiting_ranks_and_ends_the_group() {
        let errors = on_ranks(3, |c| {
            if c.rank() == 1 {
                // This rank failed before the collective: the others must not hang.
                c.abort();
                return "aborted itself".to_string();
            }
            let x = tensor(c, &[1.0], &[1]);
            c.all_reduce_sum(&x).unwrap_err().to_string()
        });
        assert!(errors[0].contains("aborted") && errors[2].contains("aborted"), "{errors:?}");
        let c = group(2).remove(0);
        c.abort();
        assert!(c.all_gather(&tensor(&c, &[1.0], &[1])).is_err(), "an aborted group refuses later rounds");
    }

    #[test]
    fn one_rank_returns_its_own_tensor() {
        let c = group(1).remove(0);
        let x = tensor(&c, &[1.0, 2.0], &[2]);
        assert!(c.all_reduce_sum(&x).unwrap().same_storage(&x));
        assert!(c.all_gather(&x).unwrap().same_storage(&x));
    }

    #[test]
    fn index_tensors_are_refused_before_the_rendezvous() {
        // The other rank never arrives: the refusal must come without waiting for it.
        let c = group(2).remove(0);
        let ids = c.backend.upload(&HostTensor::from_u32(&[1, 2], &[2]), DType::U32).unwrap();
        assert!(matches!(c.all_reduce_sum(&ids), Err(Error::DType { .. })));
    }
}
