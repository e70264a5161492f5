//! Scheduling policies: which waiting sequence to admit first and which running one to
//! preempt when KV blocks run out. The engine loop is the same for every policy.

use std::cmp::Ordering;

use met_config::Policy;

use crate::RequestId;

/// What a policy may look at to order sequences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqInfo {
    /// The request.
    pub request: RequestId,
    /// The request's priority (lower first).
    pub priority: i32,
    /// Arrival order of the request (smaller is older).
    pub arrival: u64,
    /// When the sequence was last admitted to the running set (smaller is earlier).
    pub admitted: u64,
}

/// A scheduling policy.
pub trait SchedulingPolicy: Send {
    /// Its name, for logs.
    fn name(&self) -> &'static str;

    /// `Less` when waiting sequence `a` should be admitted before `b`.
    fn admission_order(&self, a: &SeqInfo, b: &SeqInfo) -> Ordering;

    /// Index into `candidates` (running sequences, non-empty) of the one to preempt.
    fn victim(&self, candidates: &[SeqInfo]) -> usize;
}

/// First come, first served; preempts the most recently admitted sequence.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fcfs;

impl SchedulingPolicy for Fcfs {
    fn name(&self) -> &'static str {
        "fcfs"
    }

    fn admission_order(&self, a: &SeqInfo, b: &SeqInfo) -> Ordering {
        a.arrival.cmp(&b.arrival)
    }

    fn victim(&self, candidates: &[SeqInfo]) -> usize {
        latest(candidates, |s| (s.admitted, s.arrival))
    }
}

/// Lowest priority value first, then arrival; preempts the lowest-priority sequence, the
/// most recently admitted among equals.
#[derive(Debug, Default, Clone, Copy)]
pub struct Priority;

impl SchedulingPolicy for Priority {
    fn name(&self) -> &'static str {
        "priority"
    }

    fn admission_order(&self, a: &SeqInfo, b: &SeqInfo) -> Ordering {
        (a.priority, a.arrival).cmp(&(b.priority, b.arrival))
    }

    fn victim(&self, candidates: &[SeqInfo]) -> usize {
        latest(candidates, |s| (i64::from(s.priority), s.admitted))
    }
}

/// Index of the candidate with the largest key (the last one on ties).
fn latest<K: Ord>(candidates: &[SeqInfo], key: impl Fn(&SeqInfo) -> K) -> usize {
    let mut best = 0;
    for (i, c) in candidates.iter().enumerate() {
        if key(c) >= key(&candidates[best]) {
            best = i;
        }
    }
    best
}

/// The built-in policy `kind` (the setting a front end chooses by name).
pub fn policy(kind: Policy) -> Box<dyn SchedulingPolicy> {
    match kind {
        Policy::Fcfs => Box::new(Fcfs),
        Policy::Priority => Box::new(Priority),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_is_a_policy_and_nothing_else_is() {
        for &kind in Policy::ALL {
            assert_eq!(policy(kind.name().parse().unwrap()).name(), kind.name());
        }
        assert!("lifo".parse::<Policy>().is_err());
    }

    fn info(priority: i32, arrival: u64, admitted: u64) -> SeqInfo {
        SeqInfo { request: RequestId(arrival), priority, arrival, admitted }
    }

    #[test]
    fn fcfs_admits_oldest_and_preempts_newest() {
        assert_eq!(Fcfs.admission_order(&info(5, 1, 0), &info(0, 2, 0)), Ordering::Less);
        assert_eq!(Fcfs.victim(&[info(0, 1, 3), info(0, 2, 9), info(0, 3, 4)]), 1);
    }

    #[test]
    fn priority_admits_lowest_value_and_preempts_highest() {
        assert_eq!(Priority.admission_order(&info(0, 9, 0), &info(1, 1, 0)), Ordering::Less);
        assert_eq!(Priority.victim(&[info(2, 1, 1), info(0, 2, 9), info(2, 3, 5)]), 2);
        assert_eq!(policy(Policy::Priority).name(), "priority");
    }
}
