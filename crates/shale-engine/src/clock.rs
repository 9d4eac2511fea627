//! Time as the engine sees it. The engine never reads the system clock itself, so a
//! simulator can drive it deterministically.

/// A monotonic clock in nanoseconds from an arbitrary origin.
pub trait Clock {
    fn now_ns(&self) -> u64;
}

/// Wall-clock time for real runs.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    origin: std::time::Instant,
}

impl MonotonicClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the Clock real runs give the engine reads the system's monotonic clock"
    )]
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            origin: std::time::Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[allow(
        clippy::disallowed_methods,
        reason = "the Clock real runs give the engine reads the system's monotonic clock"
    )]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that moves only when told to; shared clones see the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    now: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl ManualClock {
    pub fn new() -> ManualClock {
        ManualClock::default()
    }
    pub fn advance_ns(&self, ns: u64) {
        self.now.fetch_add(ns, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(std::sync::atomic::Ordering::Relaxed)
    }
}
