//! Counters of what the host asked for and what the NAND did, and the busy time the
//! timing model derives from them.
//!
//! The model increments plain `u64`s on its hot path; the device wrappers publish them
//! into shared atomics after every host command, so a [`StatsHandle`] taken before the
//! device moves into an engine keeps seeing current figures. Resets are baselines, not
//! stores into the model, so a reset can never race with the model's own increments.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::timing::TimingModel;

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Raw monotonic counters kept by a model.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl Counters {
            const LEN: usize = [$(stringify!($name)),*].len();

            fn to_array(self) -> [u64; Self::LEN] {
                [$(self.$name),*]
            }

            fn from_array(a: [u64; Self::LEN]) -> Counters {
                let mut it = a.into_iter();
                Counters { $($name: it.next().unwrap_or(0),)* }
            }
        }
    };
}

counters! {
    /// Bytes the host wrote (successful write commands).
    host_bytes_written,
    /// Bytes the host read.
    host_bytes_read,
    /// Bytes the host discarded (trim).
    host_bytes_discarded,
    host_write_ops,
    host_read_ops,
    host_discard_ops,
    host_flush_ops,
    /// Host data bytes inside NAND programs.
    nand_bytes_written_host,
    /// Bytes GC copied (programmed again) out of victim superblocks.
    nand_bytes_written_gc,
    /// The rest of partially written IUs, programmed again (read-modify-write), or
    /// zero padding where the rest was unmapped.
    nand_bytes_written_rmw,
    /// NAND bytes read to serve host reads.
    nand_bytes_read_host,
    /// NAND bytes GC read to copy live data.
    nand_bytes_read_gc,
    /// NAND bytes read for read-modify-write of partial IUs.
    nand_bytes_read_rmw,
    /// Erase operations (one per superblock, or per erase unit of a reset zone).
    erases,
    /// Bytes erased.
    nand_bytes_erased,
    /// Zone resets (zoned models).
    zone_resets,
    /// IUs a discard covered only partly (left mapped, see `ftl.rs`).
    discard_partial_ius,
    /// Interface busy time in picoseconds (per-command cost, see `timing.rs`).
    interface_busy_ps,
    /// Commands that did not start where the one before ended (a disk's seeks).
    head_moves,
}

impl Counters {
    fn saturating_sub(self, base: Counters) -> Counters {
        let (a, b) = (self.to_array(), base.to_array());
        let mut out = [0u64; Counters::LEN];
        for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b.iter())) {
            *o = x.saturating_sub(*y);
        }
        Counters::from_array(out)
    }
}

/// A snapshot of one simulated device: host traffic, NAND traffic, and busy time.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FlashStats {
    pub host_bytes_written: u64,
    pub host_bytes_read: u64,
    pub host_bytes_discarded: u64,
    pub host_write_ops: u64,
    pub host_read_ops: u64,
    pub host_discard_ops: u64,
    pub host_flush_ops: u64,
    /// All NAND programs: `nand_bytes_written_host + _gc + _rmw`.
    pub nand_bytes_written: u64,
    pub nand_bytes_written_host: u64,
    pub nand_bytes_written_gc: u64,
    pub nand_bytes_written_rmw: u64,
    /// All NAND reads: `nand_bytes_read_host + _gc + _rmw`.
    pub nand_bytes_read: u64,
    pub nand_bytes_read_host: u64,
    pub nand_bytes_read_gc: u64,
    pub nand_bytes_read_rmw: u64,
    pub erases: u64,
    pub nand_bytes_erased: u64,
    pub zone_resets: u64,
    pub discard_partial_ius: u64,
    /// Commands that did not continue the one before (on a disk, each costs a seek).
    pub head_moves: u64,
    /// Time the host interface / command processing was busy.
    pub interface_busy_ns: u64,
    /// Time the NAND was busy programming, reading and erasing (a disk's media:
    /// transfers and seeks).
    pub nand_busy_ns: u64,
    /// The device's busy time: the larger of the two (they work in parallel).
    pub busy_ns: u64,
}

impl FlashStats {
    pub fn from_counters(c: &Counters, timing: &TimingModel) -> FlashStats {
        let nand_bytes_written =
            c.nand_bytes_written_host + c.nand_bytes_written_gc + c.nand_bytes_written_rmw;
        let nand_bytes_read = c.nand_bytes_read_host + c.nand_bytes_read_gc + c.nand_bytes_read_rmw;
        let interface_busy_ns = c.interface_busy_ps / 1000;
        let nand_busy_ns = timing.nand_busy_ns(
            nand_bytes_written,
            nand_bytes_read,
            c.nand_bytes_erased,
            c.head_moves,
        );
        FlashStats {
            host_bytes_written: c.host_bytes_written,
            host_bytes_read: c.host_bytes_read,
            host_bytes_discarded: c.host_bytes_discarded,
            host_write_ops: c.host_write_ops,
            host_read_ops: c.host_read_ops,
            host_discard_ops: c.host_discard_ops,
            host_flush_ops: c.host_flush_ops,
            nand_bytes_written,
            nand_bytes_written_host: c.nand_bytes_written_host,
            nand_bytes_written_gc: c.nand_bytes_written_gc,
            nand_bytes_written_rmw: c.nand_bytes_written_rmw,
            nand_bytes_read,
            nand_bytes_read_host: c.nand_bytes_read_host,
            nand_bytes_read_gc: c.nand_bytes_read_gc,
            nand_bytes_read_rmw: c.nand_bytes_read_rmw,
            erases: c.erases,
            nand_bytes_erased: c.nand_bytes_erased,
            zone_resets: c.zone_resets,
            discard_partial_ius: c.discard_partial_ius,
            head_moves: c.head_moves,
            interface_busy_ns,
            nand_busy_ns,
            busy_ns: interface_busy_ns.max(nand_busy_ns),
        }
    }

    /// Device write amplification: NAND bytes programmed / host bytes written
    /// (`NaN` before any host write).
    pub fn waf(&self) -> f64 {
        self.nand_bytes_written as f64 / self.host_bytes_written as f64
    }

    /// Write amplification of GC alone: NAND programs / programs the host caused
    /// (host data plus read-modify-write). For IU-sized writes this is the NAND-level
    /// figure; `waf() / gc_waf()` is then the IU read-modify-write factor.
    pub fn gc_waf(&self) -> f64 {
        let host_programs = self.nand_bytes_written_host + self.nand_bytes_written_rmw;
        self.nand_bytes_written as f64 / host_programs as f64
    }

    pub fn busy_secs(&self) -> f64 {
        self.busy_ns as f64 * 1e-9
    }

    /// The difference of two snapshots of the same device (`self` later), with the
    /// busy time recomputed from the differences of its two components.
    pub fn since(&self, earlier: &FlashStats) -> FlashStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let interface_busy_ns = d(self.interface_busy_ns, earlier.interface_busy_ns);
        let nand_busy_ns = d(self.nand_busy_ns, earlier.nand_busy_ns);
        FlashStats {
            host_bytes_written: d(self.host_bytes_written, earlier.host_bytes_written),
            host_bytes_read: d(self.host_bytes_read, earlier.host_bytes_read),
            host_bytes_discarded: d(self.host_bytes_discarded, earlier.host_bytes_discarded),
            host_write_ops: d(self.host_write_ops, earlier.host_write_ops),
            host_read_ops: d(self.host_read_ops, earlier.host_read_ops),
            host_discard_ops: d(self.host_discard_ops, earlier.host_discard_ops),
            host_flush_ops: d(self.host_flush_ops, earlier.host_flush_ops),
            nand_bytes_written: d(self.nand_bytes_written, earlier.nand_bytes_written),
            nand_bytes_written_host: d(
                self.nand_bytes_written_host,
                earlier.nand_bytes_written_host,
            ),
            nand_bytes_written_gc: d(self.nand_bytes_written_gc, earlier.nand_bytes_written_gc),
            nand_bytes_written_rmw: d(self.nand_bytes_written_rmw, earlier.nand_bytes_written_rmw),
            nand_bytes_read: d(self.nand_bytes_read, earlier.nand_bytes_read),
            nand_bytes_read_host: d(self.nand_bytes_read_host, earlier.nand_bytes_read_host),
            nand_bytes_read_gc: d(self.nand_bytes_read_gc, earlier.nand_bytes_read_gc),
            nand_bytes_read_rmw: d(self.nand_bytes_read_rmw, earlier.nand_bytes_read_rmw),
            erases: d(self.erases, earlier.erases),
            nand_bytes_erased: d(self.nand_bytes_erased, earlier.nand_bytes_erased),
            zone_resets: d(self.zone_resets, earlier.zone_resets),
            discard_partial_ius: d(self.discard_partial_ius, earlier.discard_partial_ius),
            head_moves: d(self.head_moves, earlier.head_moves),
            interface_busy_ns,
            nand_busy_ns,
            busy_ns: interface_busy_ns.max(nand_busy_ns),
        }
    }
}

/// Emulated throughput in bytes per second of `user_bytes` moved by a system whose
/// devices were busy as `devices` say: the slowest device sets the pace (bottleneck
/// model). `None` if no device was busy.
pub fn emulated_bytes_per_sec(user_bytes: u64, devices: &[&FlashStats]) -> Option<f64> {
    let busy = devices.iter().map(|s| s.busy_ns).max()?;
    (busy > 0).then(|| user_bytes as f64 / (busy as f64 * 1e-9))
}

#[derive(Debug)]
struct Shared {
    current: [AtomicU64; Counters::LEN],
    baseline: [AtomicU64; Counters::LEN],
    timing: TimingModel,
}

impl Shared {
    fn load(slots: &[AtomicU64; Counters::LEN]) -> Counters {
        let mut a = [0u64; Counters::LEN];
        for (v, s) in a.iter_mut().zip(slots.iter()) {
            *v = s.load(Ordering::Relaxed);
        }
        Counters::from_array(a)
    }

    fn stats(&self) -> FlashStats {
        let c = Shared::load(&self.current).saturating_sub(Shared::load(&self.baseline));
        FlashStats::from_counters(&c, &self.timing)
    }

    fn reset(&self) {
        for (b, c) in self.baseline.iter().zip(self.current.iter()) {
            b.store(c.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// A cloneable, thread-safe view of a simulated device's statistics that outlives
/// moving the device into an engine.
#[derive(Debug, Clone)]
pub struct StatsHandle {
    shared: Arc<Shared>,
}

impl StatsHandle {
    /// Figures since creation or the last reset, as of the last completed command.
    pub fn stats(&self) -> FlashStats {
        self.shared.stats()
    }

    /// Starts counting from zero (e.g. after preconditioning).
    pub fn reset(&self) {
        self.shared.reset()
    }

    pub fn timing(&self) -> &TimingModel {
        &self.shared.timing
    }
}

/// The device side: the model's counters are copied into the shared slots after every
/// host command.
#[derive(Debug)]
pub(crate) struct Publisher {
    shared: Arc<Shared>,
}

impl Publisher {
    pub(crate) fn new(timing: TimingModel) -> Publisher {
        Publisher {
            shared: Arc::new(Shared {
                current: std::array::from_fn(|_| AtomicU64::new(0)),
                baseline: std::array::from_fn(|_| AtomicU64::new(0)),
                timing,
            }),
        }
    }

    pub(crate) fn publish(&self, c: &Counters) {
        for (slot, v) in self.shared.current.iter().zip(c.to_array()) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    pub(crate) fn handle(&self) -> StatsHandle {
        StatsHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> TimingModel {
        TimingModel {
            interface_bytes_per_sec: 1e9,
            command_iops_max: 1e6,
            program_bytes_per_sec: 1e9,
            read_bytes_per_sec: 2e9,
            erase_bytes_per_sec: 1e11,
            positioning_secs: 0.0,
        }
    }

    #[test]
    fn handle_sees_published_counters_and_resets_by_baseline() {
        let p = Publisher::new(timing());
        let h = p.handle();
        let h2 = h.clone();
        let mut c = Counters {
            host_bytes_written: 4096,
            nand_bytes_written_host: 4096,
            nand_bytes_written_rmw: 61440,
            ..Counters::default()
        };
        p.publish(&c);
        let s = h2.stats();
        assert_eq!(s.nand_bytes_written, 65536);
        assert_eq!(s.waf(), 16.0);
        h.reset();
        assert_eq!(h2.stats().nand_bytes_written, 0);
        c.host_bytes_written += 100;
        p.publish(&c);
        assert_eq!(h2.stats().host_bytes_written, 100);
    }

    #[test]
    fn busy_is_the_larger_component_and_since_recomputes_it() {
        let t = timing();
        let a = FlashStats::from_counters(
            &Counters {
                interface_busy_ps: 5_000_000,
                nand_bytes_written_host: 1000,
                ..Counters::default()
            },
            &t,
        );
        assert_eq!(a.interface_busy_ns, 5000);
        assert_eq!(a.nand_busy_ns, 1000);
        assert_eq!(a.busy_ns, 5000);
        let b = FlashStats::from_counters(
            &Counters {
                interface_busy_ps: 6_000_000,
                nand_bytes_written_host: 11_000,
                ..Counters::default()
            },
            &t,
        );
        let d = b.since(&a);
        assert_eq!(d.interface_busy_ns, 1000);
        assert_eq!(d.nand_busy_ns, 10_000);
        assert_eq!(d.busy_ns, 10_000);
        assert_eq!(
            emulated_bytes_per_sec(10_000, &[&d, &a]),
            Some(10_000.0 / 10e-6)
        );
        assert_eq!(emulated_bytes_per_sec(1, &[]), None);
    }
}
