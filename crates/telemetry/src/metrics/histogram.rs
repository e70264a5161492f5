//! A classic Prometheus histogram whose `observe` is a few relaxed atomic operations.
//!
//! prometheus-client's own `Histogram` (0.26) takes a mutex on every observation; the engine
//! thread observes several histograms per step and one per generated token, and should never
//! wait on a scrape. This type keeps one atomic counter per bucket and the sum as `f64` bits,
//! and hands prometheus-client's encoder the same `(sum, count, buckets)` triple its own
//! histogram would, so the exposition text is still the library's.
//!
//! **Invariant:** the rendered `_count` equals the `+Inf` bucket, because the count is summed
//! from the buckets when encoding rather than kept separately. `_sum` may lag a concurrent
//! observation by one, as in other lock-free clients.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

/// A histogram with fixed bucket bounds and lock-free recording. Clones share the same
/// counts, so a registered clone renders what the original observes.
#[derive(Debug, Clone)]
pub struct AtomicHistogram {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Finite upper bounds, strictly increasing.
    bounds: Box<[f64]>,
    /// Non-cumulative count per bucket; one more than `bounds`, the last being `+Inf`.
    counts: Box<[AtomicU64]>,
    /// The sum of all observations, as `f64::to_bits`.
    sum_bits: AtomicU64,
}

impl AtomicHistogram {
    /// A histogram with the given finite upper bounds; a `+Inf` bucket is always added.
    ///
    /// # Panics
    /// If the bounds are not finite and strictly increasing.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> Self {
        let bounds: Box<[f64]> = bounds.into_iter().collect();
        assert!(bounds.iter().all(|b| b.is_finite()), "histogram bounds must be finite: {bounds:?}");
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "histogram bounds must increase: {bounds:?}");
        let counts = (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect();
        Self { inner: Arc::new(Inner { bounds, counts, sum_bits: AtomicU64::new(0.0_f64.to_bits()) }) }
    }

    /// Records one observation. `NaN` is counted in the `+Inf` bucket, as Prometheus' Go
    /// client does.
    pub fn observe(&self, value: f64) {
        let inner = &*self.inner;
        let bucket = if value.is_nan() { inner.bounds.len() } else { inner.bounds.partition_point(|&b| b < value) };
        inner.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // The engine thread is the only frequent writer, so this loop almost never retries.
        let _ = inner
            .sum_bits
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| Some((f64::from_bits(bits) + value).to_bits()));
    }

    /// The number of observations so far.
    pub fn count(&self) -> u64 {
        self.inner.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// The sum of the observations so far.
    pub fn sum(&self) -> f64 {
        f64::from_bits(self.inner.sum_bits.load(Ordering::Relaxed))
    }
}

impl TypedMetric for AtomicHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let inner = &*self.inner;
        let bounds = inner.bounds.iter().copied().chain(std::iter::once(f64::INFINITY));
        let buckets: Vec<(f64, u64)> = bounds.zip(inner.counts.iter().map(|c| c.load(Ordering::Relaxed))).collect();
        let count = buckets.iter().map(|&(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(self.sum(), count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_at_or_above_them() {
        let h = AtomicHistogram::new([1.0, 2.0, 4.0]);
        for v in [0.5, 1.0, 1.5, 4.0, 9.0, f64::NAN] {
            h.observe(v);
        }
        let counts: Vec<u64> = h.inner.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        // 0.5 and 1.0 in le=1; 1.5 in le=2; 4.0 in le=4; 9.0 and NaN in +Inf.
        assert_eq!(counts, [2, 1, 1, 2]);
        assert_eq!(h.count(), 6);
    }

    #[test]
    fn sum_adds_up_and_clones_share_state() {
        let h = AtomicHistogram::new([1.0]);
        let clone = h.clone();
        clone.observe(0.25);
        clone.observe(2.5);
        assert_eq!(h.sum(), 2.75);
        assert_eq!(h.count(), 2);
    }

    #[test]
    #[should_panic(expected = "must increase")]
    fn unsorted_bounds_are_rejected() {
        let _ = AtomicHistogram::new([2.0, 1.0]);
    }
}
