//! Request latency as clients see it (submit to completion), per volume and kind, in
//! a fixed log-linear histogram of atomic counters: recorded from the engine thread's
//! completions without a lock, read by stats and metrics at any time.
//!
//! Buckets: one per µs below 4 µs, then four per power of two up to about 67 s (a
//! bucket's largest value at most 25% above its smallest), plus one for anything
//! longer. Quantiles are reported as the largest value of the bucket they fall in, so
//! they never understate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Sub-buckets per power of two.
const SUB: u32 = 4;
/// Powers of two covered: below 2^2 µs one bucket per µs, then 2^2 .. 2^26 µs (about
/// 67 s) in `SUB` buckets each.
const POWERS: u32 = 26;
const BUCKETS: usize = (SUB + (POWERS - 2) * SUB) as usize + 1;

/// One histogram (e.g. a volume's reads).
#[derive(Debug)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS],
    max_us: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            max_us: AtomicU64::new(0),
        }
    }
}

/// The largest µs value bucket `i` holds (the last one is open-ended: `u64::MAX`).
fn upper_us(i: usize) -> u64 {
    let i = i as u32;
    if i < SUB {
        return u64::from(i);
    }
    if i as usize >= BUCKETS - 1 {
        return u64::MAX;
    }
    let power = (i - SUB) / SUB + 2;
    let sub = u64::from((i - SUB) % SUB);
    // Sub-bucket k of [2^p, 2^(p+1)) holds 2^p + k * 2^(p-2) ..= 2^p + (k+1) * 2^(p-2) - 1.
    (1u64 << power) + (sub + 1) * (1u64 << (power - 2)) - 1
}

fn bucket(us: u64) -> usize {
    if us < u64::from(SUB) {
        return us as usize;
    }
    let power = 63 - us.leading_zeros();
    if power >= POWERS {
        return BUCKETS - 1;
    }
    let sub = ((us - (1u64 << power)) >> (power - 2)) as u32;
    (SUB + (power - 2) * SUB + sub) as usize
}

impl Histogram {
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.counts[bucket(us)].fetch_add(1, Ordering::Relaxed);
        self.max_us.fetch_max(us, Ordering::Relaxed);
    }

    /// A copy of the counts.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            counts: self
                .counts
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect(),
            max_us: self.max_us.load(Ordering::Relaxed),
        }
    }
}

/// Counts at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    counts: Vec<u64>,
    pub max_us: u64,
}

impl Snapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The upper bound (µs) of the bucket holding quantile `q` (0..=1); `None` when
    /// empty. The open-ended last bucket reports the maximum seen.
    pub fn quantile_us(&self, q: f64) -> Option<u64> {
        let n = self.count();
        if n == 0 {
            return None;
        }
        let want = ((q.clamp(0.0, 1.0) * n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= want {
                return Some(upper_us(i).min(self.max_us.max(1)));
            }
        }
        Some(self.max_us)
    }

    /// Non-empty buckets as (upper bound µs, count), for clients that compute their
    /// own quantiles over an interval from two snapshots.
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| (upper_us(i), *c))
            .collect()
    }

    /// Cumulative counts at every bucket bound (Prometheus `le` buckets).
    pub fn cumulative(&self) -> Vec<(u64, u64)> {
        let mut seen = 0;
        self.counts
            .iter()
            .enumerate()
            .map(|(i, c)| {
                seen += c;
                (upper_us(i), seen)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_duration_in_order() {
        let mut last = 0;
        for i in 0..BUCKETS - 1 {
            let u = upper_us(i);
            assert!(i == 0 || u > last, "bucket {i}: {u} after {last}");
            last = u;
        }
        for us in [
            0u64,
            1,
            2,
            3,
            5,
            7,
            100,
            999,
            1000,
            1024,
            65_535,
            1 << 25,
            1 << 30,
        ] {
            let b = bucket(us);
            assert!(
                us <= upper_us(b),
                "{us} above bucket {b}'s bound {}",
                upper_us(b)
            );
            if b > 0 {
                assert!(
                    us > upper_us(b - 1) || us == 0,
                    "{us} belongs lower than {b}"
                );
            }
        }
    }

    #[test]
    fn quantiles_are_bucket_bounds_never_below_the_truth() {
        let h = Histogram::default();
        assert_eq!(h.snapshot().quantile_us(0.5), None);
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 1000);
        let p50 = s.quantile_us(0.5).expect("p50");
        let p99 = s.quantile_us(0.99).expect("p99");
        assert!((500..=600).contains(&p50), "p50 {p50}");
        assert!((990..=1000).contains(&p99), "p99 {p99}");
        assert_eq!(s.max_us, 1000);
        assert_eq!(s.quantile_us(1.0), Some(1000));
        assert_eq!(s.buckets().iter().map(|b| b.1).sum::<u64>(), 1000);
        assert_eq!(s.cumulative().last().map(|c| c.1), Some(1000));
    }
}
