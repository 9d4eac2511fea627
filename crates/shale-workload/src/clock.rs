//! Clocks an executor can hold operations against (see [`TenantStream::poll`]).
//!
//! [`TenantStream::poll`]: crate::TenantStream::poll

use std::cell::Cell;
use std::time::Instant;

/// Nanoseconds since some fixed start.
pub trait Clock {
    fn now_ns(&self) -> u64;
}

/// A clock that moves only when told to: simulations and tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ns: Cell<u64>,
}

impl ManualClock {
    pub fn new(start_ns: u64) -> ManualClock {
        ManualClock {
            now_ns: Cell::new(start_ns),
        }
    }

    pub fn set(&self, now_ns: u64) {
        self.now_ns.set(now_ns);
    }

    pub fn advance(&self, by_ns: u64) {
        self.now_ns.set(self.now_ns.get().saturating_add(by_ns));
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.get()
    }
}

/// Wall time since the clock was created.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    start: Instant,
}

impl MonotonicClock {
    pub fn start() -> MonotonicClock {
        MonotonicClock {
            start: Instant::now(),
        }
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(5);
        assert_eq!(c.now_ns(), 5);
        c.advance(10);
        assert_eq!(c.now_ns(), 15);
        c.set(3);
        assert_eq!(c.now_ns(), 3);
    }

    #[test]
    fn monotonic_clock_does_not_go_backwards() {
        let c = MonotonicClock::start();
        let a = c.now_ns();
        let b = c.now_ns();
        assert!(b >= a);
    }
}
