//! The bottleneck timing model: counts become busy time.
//!
//! A device has two resources working in parallel. The front end (host interface and
//! command processing) spends `max(bytes / interface bandwidth, 1 / command IOPS)` on
//! every host command. The back end (NAND) spends `programmed / program bandwidth +
//! read / read bandwidth + erased / erase bandwidth` on everything it does, GC and
//! read-modify-write included. The device is busy for the larger of the two, and a
//! system of devices moves user bytes no faster than its busiest device allows. Queue
//! depth, latency and parallelism inside the drive are not modelled (docs/flash-model.md).
//!
//! A disk's back end is its head: besides moving bytes at the media rate, every command
//! that does not start where the one before it ended costs a repositioning (seek and
//! rotation), `positioning_secs`, which solid-state presets leave at zero.

use crate::preset::Datasheet;
use crate::FlashSimError;

/// Rates in bytes (or commands) per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimingModel {
    /// Host transfer bandwidth of the interface.
    pub interface_bytes_per_sec: f64,
    /// Commands the controller can process per second, whatever their size.
    pub command_iops_max: f64,
    /// NAND program bandwidth (all programs: host, GC, read-modify-write).
    pub program_bytes_per_sec: f64,
    /// NAND read bandwidth (host reads, GC reads, read-modify-write reads).
    pub read_bytes_per_sec: f64,
    /// Erase cost expressed as bytes erased per second.
    pub erase_bytes_per_sec: f64,
    /// A disk's average repositioning time (seek plus rotation) for a command that
    /// does not continue the one before it; 0 for solid-state devices.
    pub positioning_secs: f64,
}

/// Where a disk's head will be: the byte after the last command's. Solid-state
/// models keep one too; with `positioning_secs` at 0 it costs nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Head {
    next: Option<u64>,
}

impl Head {
    /// A command over `offset..offset + len`: whether the head had to move to it.
    pub fn moves_to(&mut self, offset: u64, len: u64) -> bool {
        let moved = self.next != Some(offset);
        self.next = Some(offset.saturating_add(len));
        moved
    }
}

/// A disk controller parses commands far faster than its head moves: what bounds a
/// disk's commands is positioning, charged on its own, so the command rate only needs
/// to be out of the way.
const DISK_COMMAND_IOPS: f64 = 1e6;

/// A disk's zone reset or trim rewrites no media: its cost is metadata, so "erased"
/// bytes go at this rate (100 TB/s, nothing next to a single seek).
const DISK_ERASE_BYTES_PER_SEC: f64 = 1e14;

/// Erase time as a fraction of the time to program the same bytes. Block erase takes
/// a few ms (QLC/TLC tBERS) for a block that takes tens to hundreds of ms to program,
/// and superblock erases run on all dies at once; 1% is the right order of magnitude
/// and keeps erases a minor term, as they are on real drives.
const ERASE_TIME_PER_PROGRAM_TIME: f64 = 0.01;

impl TimingModel {
    /// Rates taken straight from a datasheet: the interface moves data at the faster
    /// of the sequential figures, the controller processes commands at the random
    /// read IOPS figure (the highest command rate a datasheet shows, and one not
    /// limited by NAND programs), NAND programs at the sequential write figure
    /// (sequential writes have device WAF 1) and reads at the sequential read figure.
    pub fn from_datasheet(d: &Datasheet) -> TimingModel {
        let mb = 1e6;
        TimingModel {
            interface_bytes_per_sec: d.seq_read_mb_s.max(d.seq_write_mb_s) * mb,
            command_iops_max: d.rand_read_4k_iops.max(d.rand_write_4k_iops),
            program_bytes_per_sec: d.seq_write_mb_s * mb,
            read_bytes_per_sec: d.seq_read_mb_s * mb,
            erase_bytes_per_sec: d.seq_write_mb_s * mb / ERASE_TIME_PER_PROGRAM_TIME,
            positioning_secs: 0.0,
        }
    }

    /// A disk's rates from its datasheet: the media moves data at the sequential
    /// figures, and a random 4 KiB read is all positioning, so the average
    /// repositioning time is one over the random read IOPS (at the queue depth the
    /// datasheet states it, where the drive reorders commands).
    pub fn from_disk_datasheet(d: &Datasheet) -> TimingModel {
        let mb = 1e6;
        TimingModel {
            interface_bytes_per_sec: d.seq_read_mb_s.max(d.seq_write_mb_s) * mb,
            command_iops_max: DISK_COMMAND_IOPS,
            program_bytes_per_sec: d.seq_write_mb_s * mb,
            read_bytes_per_sec: d.seq_read_mb_s * mb,
            erase_bytes_per_sec: DISK_ERASE_BYTES_PER_SEC,
            positioning_secs: 1.0 / d.rand_read_4k_iops,
        }
    }

    /// Whether moving the head costs anything (a disk).
    pub fn positions(&self) -> bool {
        self.positioning_secs > 0.0
    }

    pub fn validate(&self) -> Result<(), FlashSimError> {
        for (name, value) in [
            ("interface_bytes_per_sec", self.interface_bytes_per_sec),
            ("command_iops_max", self.command_iops_max),
            ("program_bytes_per_sec", self.program_bytes_per_sec),
            ("read_bytes_per_sec", self.read_bytes_per_sec),
            ("erase_bytes_per_sec", self.erase_bytes_per_sec),
        ] {
            if !(value.is_finite() && value > 0.0) {
                return Err(FlashSimError::Timing { name, value });
            }
        }
        let p = self.positioning_secs;
        if !(p.is_finite() && p >= 0.0) {
            return Err(FlashSimError::Timing {
                name: "positioning_secs",
                value: p,
            });
        }
        Ok(())
    }

    /// Front-end time of one host command moving `bytes`, in picoseconds.
    pub fn command_ps(&self, bytes: u64) -> u64 {
        let transfer = bytes as f64 / self.interface_bytes_per_sec;
        let command = 1.0 / self.command_iops_max;
        (transfer.max(command) * 1e12).round() as u64
    }

    /// Back-end busy time for the given NAND (or a disk's media) work, `moves` head
    /// repositionings included, in nanoseconds.
    pub fn nand_busy_ns(&self, programmed: u64, read: u64, erased: u64, moves: u64) -> u64 {
        let secs = programmed as f64 / self.program_bytes_per_sec
            + read as f64 / self.read_bytes_per_sec
            + erased as f64 / self.erase_bytes_per_sec
            + moves as f64 * self.positioning_secs;
        (secs * 1e9).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_cost_is_the_larger_of_transfer_and_command_time() {
        let t = TimingModel {
            interface_bytes_per_sec: 4e9,
            command_iops_max: 1e6,
            program_bytes_per_sec: 1e9,
            read_bytes_per_sec: 1e9,
            erase_bytes_per_sec: 1e11,
            positioning_secs: 0.0,
        };
        // 4 KiB at 4 GB/s = 1.024 us > 1 us per command.
        assert_eq!(t.command_ps(4096), 1_024_000);
        // 512 B is command-bound.
        assert_eq!(t.command_ps(512), 1_000_000);
        assert_eq!(t.command_ps(0), 1_000_000);
        // 1000 B programmed, 2000 B read, 100 kB erased at 100 GB/s: 1 + 2 + 1 us.
        assert_eq!(t.nand_busy_ns(1000, 2000, 100_000, 0), 4000);
        // Repositionings cost nothing on a solid-state device...
        assert_eq!(t.nand_busy_ns(1000, 2000, 100_000, 7), 4000);
        // ... and 5 ms each on a disk.
        let disk = TimingModel {
            positioning_secs: 0.005,
            ..t
        };
        assert_eq!(disk.nand_busy_ns(1000, 2000, 100_000, 2), 10_004_000);
    }

    #[test]
    fn the_head_moves_unless_a_command_continues_the_last() {
        let mut h = Head::default();
        assert!(h.moves_to(4096, 4096), "first command");
        assert!(!h.moves_to(8192, 4096));
        assert!(!h.moves_to(12288, 0));
        assert!(h.moves_to(4096, 4096), "backwards");
        assert!(h.moves_to(1 << 30, 4096), "forwards past a gap");
        assert!(!h.moves_to((1 << 30) + 4096, 65536));
    }

    #[test]
    fn a_disk_datasheet_charges_positioning_not_commands() {
        let d = Datasheet {
            seq_read_mb_s: 250.0,
            seq_write_mb_s: 250.0,
            rand_read_4k_iops: 200.0,
            rand_write_4k_iops: 400.0,
            rand_write_64k_iops: None,
            read_latency_us: None,
            write_latency_us: None,
        };
        let t = TimingModel::from_disk_datasheet(&d);
        t.validate().expect("valid");
        assert!(t.positions());
        assert!((t.positioning_secs - 0.005).abs() < 1e-12);
        // 200 random 4 KiB reads take a second of head time, the bytes nothing more.
        let busy = t.nand_busy_ns(0, 200 * 4096, 0, 200);
        assert!((busy as f64 - 1.003e9).abs() < 1e6, "{busy}");
        // A sequential 250 MB costs a second.
        assert_eq!(t.nand_busy_ns(250_000_000, 0, 0, 1), 1_005_000_000);
        assert!(!TimingModel::from_datasheet(&d).positions());
    }

    #[test]
    fn invalid_rates_are_rejected() {
        let good = TimingModel {
            interface_bytes_per_sec: 1.0,
            command_iops_max: 1.0,
            program_bytes_per_sec: 1.0,
            read_bytes_per_sec: 1.0,
            erase_bytes_per_sec: 1.0,
            positioning_secs: 0.0,
        };
        assert!(good.validate().is_ok());
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let t = TimingModel {
                read_bytes_per_sec: bad,
                ..good
            };
            assert!(matches!(
                t.validate(),
                Err(FlashSimError::Timing {
                    name: "read_bytes_per_sec",
                    ..
                })
            ));
        }
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            let t = TimingModel {
                positioning_secs: bad,
                ..good
            };
            assert!(
                matches!(
                    t.validate(),
                    Err(FlashSimError::Timing {
                        name: "positioning_secs",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }
}
