//! Operation counters and latency histograms, sharded per thread (`shard.rs`): the thread
//! doing the I/O updates its own copy (`shard::add`: a plain load and store), a status request or metrics
//! scrape sums the copies (`OpCounters::sum`).
//!
//! Latency buckets are powers of two in microseconds, 8 µs to 8.4 s (`bucket_bounds`), plus
//! one for anything slower; Prometheus histograms are cumulative, so the encoder adds them up.

use crate::shard::add;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Finite latency buckets; index `BUCKETS` counts the rest (+Inf).
pub const BUCKETS: usize = 21;

/// Upper bound of each finite bucket in seconds: 2^(i+3) µs.
pub fn bucket_bounds() -> [f64; BUCKETS] {
    std::array::from_fn(|i| (1u64 << (i + 3)) as f64 * 1e-6)
}

/// The bucket a latency falls into.
pub fn bucket_of(d: Duration) -> usize {
    // Whole microseconds rounded up: a bucket's bound is an upper bound (Prometheus `le`).
    let us = d.as_nanos().div_ceil(1000).min(u64::MAX as u128) as u64;
    if us <= 8 {
        return 0;
    }
    // Smallest k with us <= 2^k, i.e. ceil(log2(us)); bucket k - 3.
    let k = 64 - (us - 1).leading_zeros() as usize;
    (k - 3).min(BUCKETS)
}

/// Counts, bytes, errors and latency of one kind of operation (one thread's copy).
#[derive(Default)]
pub struct OpCounters {
    pub count: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Timed operations (all, or a sample: see where it is used) and their total latency.
    pub timed: AtomicU64,
    pub latency_ns: AtomicU64,
    pub buckets: [AtomicU64; BUCKETS + 1],
}

impl OpCounters {
    /// One operation of `bytes`, failed or not.
    #[inline]
    pub fn record(&self, bytes: u64, ok: bool) {
        add(&self.count, 1);
        add(&self.bytes, bytes);
        if !ok {
            add(&self.errors, 1);
        }
    }

    /// One operation's latency.
    #[inline]
    pub fn observe(&self, d: Duration) {
        add(&self.timed, 1);
        add(&self.latency_ns, d.as_nanos().min(u64::MAX as u128) as u64);
        add(&self.buckets[bucket_of(d)], 1);
    }

    /// The sum of several copies (every thread's: `OpCounters::sum(sharded.iter())`).
    pub fn sum<'a>(copies: impl IntoIterator<Item = &'a OpCounters>) -> OpSnapshot {
        let mut t = OpSnapshot::default();
        for c in copies {
            t.count += c.count.load(Ordering::Relaxed);
            t.bytes += c.bytes.load(Ordering::Relaxed);
            t.errors += c.errors.load(Ordering::Relaxed);
            t.timed += c.timed.load(Ordering::Relaxed);
            t.latency_ns += c.latency_ns.load(Ordering::Relaxed);
            for (b, v) in t.buckets.iter_mut().zip(&c.buckets) {
                *b += v.load(Ordering::Relaxed);
            }
        }
        t
    }
}

/// A point-in-time sum of `OpCounters` (buckets not cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpSnapshot {
    pub count: u64,
    pub bytes: u64,
    pub errors: u64,
    pub timed: u64,
    pub latency_ns: u64,
    pub buckets: [u64; BUCKETS + 1],
}

impl OpSnapshot {
    /// Mean latency of the timed operations, in microseconds.
    pub fn mean_us(&self) -> Option<f64> {
        (self.timed > 0).then(|| self.latency_ns as f64 / self.timed as f64 / 1e3)
    }

    /// Upper bound (seconds) of the bucket holding quantile `q`; beyond the last finite
    /// bucket, that bucket's bound (the quantile is at least that). None: nothing timed.
    pub fn quantile_bound(&self, q: f64) -> Option<f64> {
        if self.timed == 0 {
            return None;
        }
        let want = (q * self.timed as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        let bounds = bucket_bounds();
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= want {
                return Some(bounds[i.min(BUCKETS - 1)]);
            }
        }
        Some(bounds[BUCKETS - 1])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::Sharded;

    #[test]
    fn buckets_are_upper_bounds_in_powers_of_two_microseconds() {
        let us = Duration::from_micros;
        assert_eq!(bucket_of(Duration::ZERO), 0);
        assert_eq!(bucket_of(us(8)), 0);
        assert_eq!(bucket_of(us(9)), 1);
        assert_eq!(
            bucket_of(Duration::from_nanos(8_001)),
            1,
            "rounded up, never under"
        );
        assert_eq!(bucket_of(us(16)), 1);
        assert_eq!(bucket_of(us(17)), 2);
        let b = bucket_bounds();
        for (i, bound) in b.iter().enumerate() {
            let d = Duration::from_secs_f64(*bound);
            assert_eq!(bucket_of(d), i, "bound {bound}");
        }
        assert_eq!(bucket_of(Duration::from_secs(9)), BUCKETS);
        assert_eq!(bucket_of(Duration::from_secs(1 << 40)), BUCKETS);
    }

    #[test]
    fn sums_and_quantiles() {
        let s: Sharded<OpCounters> = Default::default();
        for i in 0..100u64 {
            s.local().record(4096, i != 7);
            s.local()
                .observe(Duration::from_micros(if i < 90 { 10 } else { 1000 }));
        }
        let t = OpCounters::sum(s.iter());
        assert_eq!(
            (t.count, t.bytes, t.errors, t.timed),
            (100, 409_600, 1, 100)
        );
        assert_eq!(t.quantile_bound(0.5), Some(16e-6));
        assert_eq!(t.quantile_bound(0.99), Some(1024e-6));
        s.local().observe(Duration::from_secs(100));
        let t2 = OpCounters::sum(s.iter());
        assert_eq!(t2.quantile_bound(1.0), Some(bucket_bounds()[BUCKETS - 1]));
        let mean = t.mean_us().unwrap();
        assert!((mean - 109.0).abs() < 1e-9, "{mean}");
    }
}
