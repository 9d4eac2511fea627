//! Turning a run's counts into the figures Shale reports, as a table or one JSON object.
//!
//! - layer WAF = bytes written to the capacity device / bytes the tenants wrote
//! - device WAF = NAND bytes programmed on the capacity device / bytes it received
//! - total WAF = NAND bytes programmed on the capacity device / bytes the tenants wrote
//!   (= layer × device; what the seeds' raw-QLC figures are)
//! - emulated MiB/s = bytes the tenants moved / the busiest device's busy time
//!   (bottleneck model, docs/flash-model.md)
//!
//! Cache-device writes are reported on their own and are not part of any WAF.

use std::fmt::Write as _;

use serde::Serialize;

use crate::runner::RunOutcome;
use crate::system::DeviceRole;

const MIB: f64 = 1024.0 * 1024.0;

/// Write amplification factors; `None` where the denominator is zero.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Waf {
    pub layer: Option<f64>,
    pub device: Option<f64>,
    pub total: Option<f64>,
}

/// Byte counts of the measured workload.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bytes {
    /// Bytes the tenants wrote.
    pub user_written: u64,
    /// Bytes the tenants read.
    pub user_read: u64,
    /// Bytes written to the capacity device(s).
    pub capacity_written: u64,
    /// NAND bytes programmed on the capacity device(s), all causes.
    pub capacity_nand: u64,
    /// ... of which GC copies.
    pub capacity_nand_gc: u64,
    /// ... of which read-modify-write of partly written indirection units.
    pub capacity_nand_rmw: u64,
    /// Erase operations on the capacity device(s).
    pub capacity_erases: u64,
    /// Bytes written to cache devices (`None` for systems without one).
    pub cache_written: Option<u64>,
}

/// I/O amplification: bytes the devices moved (reads and writes) per byte the
/// tenants moved; `None` where the tenants moved nothing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IoAmp {
    /// Capacity devices only.
    pub capacity: Option<f64>,
    /// Every device, caches included.
    pub all: Option<f64>,
    /// Bytes read from the capacity devices per byte the tenants wrote (md's
    /// read-modify-write, raid5f's stripe fills, Shale's compaction and GC reads).
    pub capacity_read_per_write: Option<f64>,
}

/// One device in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceLine {
    pub role: &'static str,
    /// Position among the devices of its role (array member, cache mirror).
    pub index: u32,
    pub preset: String,
    pub host_written: u64,
    pub host_read: u64,
    pub nand_written: u64,
    /// This device's own WAF: NAND bytes / bytes it received.
    pub waf: Option<f64>,
    pub busy_s: f64,
    /// Commands that did not continue the one before (a disk's seeks).
    pub head_moves: u64,
}

/// One group of tenants of the measured workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupLine {
    pub tenants: u32,
    pub workload: String,
    pub bs: u64,
    pub read_pct: u8,
}

/// One cause of background traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrafficLine {
    pub name: &'static str,
    pub bytes: u64,
}

/// L2P page-cache figures (systems with a paged L2P).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct L2pLine {
    pub hits: u64,
    pub misses: u64,
    /// hits / (hits + misses); `None` without lookups.
    pub hit_rate: Option<f64>,
    pub page_reads: u64,
    pub page_writes: u64,
    pub cache_pages_max: u64,
    /// Bytes of the volumes' L2P tables.
    pub table_bytes: u64,
}

/// Everything `shale bench run` reports. Field names are the JSON keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    pub system: String,
    /// Preset of the capacity device.
    pub drive: String,
    pub config: String,
    pub workload: String,
    /// Block size of the measured workload, bytes.
    pub bs: u64,
    pub read_pct: u8,
    pub seed: u64,
    pub tenants: u32,
    pub queue_depth: u32,
    pub capacity_bytes: u64,
    pub volume_bytes: u64,
    pub waf: Waf,
    pub io_amp: IoAmp,
    pub bytes: Bytes,
    /// Bytes the tenants moved per second of the busiest device's busy time, in MiB/s.
    pub emulated_mib_s: Option<f64>,
    /// `emulated_mib_s` divided over the jobs (the seeds quote per-job figures).
    pub emulated_mib_s_per_job: Option<f64>,
    /// The written and the read share of `emulated_mib_s`.
    pub emulated_write_mib_s: Option<f64>,
    pub emulated_read_mib_s: Option<f64>,
    /// The tenant groups of the workload (one for a uniform workload).
    pub groups: Vec<GroupLine>,
    /// The system's background traffic by cause.
    pub traffic: Vec<TrafficLine>,
    pub l2p: Option<L2pLine>,
    pub devices: Vec<DeviceLine>,
    pub precondition_wall_s: f64,
    pub wall_s: f64,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// Device bytes moved per user byte moved (docs/benchmarks.md).
fn io_amp(o: &RunOutcome) -> IoAmp {
    let moved = |role: Option<DeviceRole>| -> u64 {
        o.devices
            .iter()
            .filter(|d| role.is_none_or(|r| d.role == r))
            .map(|d| d.stats.host_bytes_read + d.stats.host_bytes_written)
            .sum()
    };
    let capacity_read: u64 = o
        .devices
        .iter()
        .filter(|d| d.role == DeviceRole::Capacity)
        .map(|d| d.stats.host_bytes_read)
        .sum();
    let user_moved = o.user.write_bytes + o.user.read_bytes;
    IoAmp {
        capacity: ratio(moved(Some(DeviceRole::Capacity)), user_moved),
        all: ratio(moved(None), user_moved),
        capacity_read_per_write: ratio(capacity_read, o.user.write_bytes),
    }
}

/// Every device, numbered within its role.
fn device_lines(o: &RunOutcome) -> Vec<DeviceLine> {
    let mut index = [0u32; 2];
    o.devices
        .iter()
        .map(|d| {
            let slot = &mut index[usize::from(d.role == DeviceRole::Cache)];
            *slot += 1;
            DeviceLine {
                role: d.role.name(),
                index: *slot - 1,
                preset: d.preset.clone(),
                host_written: d.stats.host_bytes_written,
                host_read: d.stats.host_bytes_read,
                nand_written: d.stats.nand_bytes_written,
                waf: ratio(d.stats.nand_bytes_written, d.stats.host_bytes_written),
                busy_s: d.stats.busy_secs(),
                head_moves: d.stats.head_moves,
            }
        })
        .collect()
}

impl BenchReport {
    pub fn from_outcome(o: &RunOutcome) -> BenchReport {
        let capacity = o.devices.iter().filter(|d| d.role == DeviceRole::Capacity);
        let sum = |f: fn(&shale_flashsim::FlashStats) -> u64| -> u64 {
            capacity.clone().map(|d| f(&d.stats)).sum()
        };
        let capacity_written = sum(|s| s.host_bytes_written);
        let capacity_nand = sum(|s| s.nand_bytes_written);
        let cache: Vec<u64> = o
            .devices
            .iter()
            .filter(|d| d.role == DeviceRole::Cache)
            .map(|d| d.stats.host_bytes_written)
            .collect();
        let user_written = o.user.write_bytes;
        let user_moved = o.user.write_bytes + o.user.read_bytes;
        let busy_ns_max = o.devices.iter().map(|d| d.stats.busy_ns).max().unwrap_or(0);
        let emulated_s = (busy_ns_max > 0).then_some(busy_ns_max as f64 * 1e-9);
        let emulated_mib_s = emulated_s.map(|t| user_moved as f64 / MIB / t);
        let primary = o.mix.primary();
        let io_amp = io_amp(o);
        let devices = device_lines(o);
        BenchReport {
            system: o.system.clone(),
            drive: o
                .devices
                .iter()
                .find(|d| d.role == DeviceRole::Capacity)
                .map(|d| d.preset.clone())
                .unwrap_or_default(),
            config: o.config.name.clone(),
            workload: o.mix.name.clone(),
            bs: primary.map_or(0, |g| g.block_bytes),
            read_pct: primary.map_or(0, |g| g.read_pct),
            seed: o.mix.seed,
            tenants: o.volume_count,
            queue_depth: o.config.queue_depth,
            capacity_bytes: o.config.capacity_bytes,
            volume_bytes: o.volume_bytes,
            waf: Waf {
                layer: ratio(capacity_written, user_written),
                device: ratio(capacity_nand, capacity_written),
                total: ratio(capacity_nand, user_written),
            },
            io_amp,
            bytes: Bytes {
                user_written,
                user_read: o.user.read_bytes,
                capacity_written,
                capacity_nand,
                capacity_nand_gc: sum(|s| s.nand_bytes_written_gc),
                capacity_nand_rmw: sum(|s| s.nand_bytes_written_rmw),
                capacity_erases: sum(|s| s.erases),
                cache_written: (!cache.is_empty()).then(|| cache.iter().sum()),
            },
            emulated_mib_s,
            emulated_mib_s_per_job: emulated_mib_s.map(|v| v / f64::from(o.volume_count.max(1))),
            emulated_write_mib_s: emulated_s.map(|t| user_written as f64 / MIB / t),
            emulated_read_mib_s: emulated_s.map(|t| o.user.read_bytes as f64 / MIB / t),
            groups: o
                .mix
                .groups
                .iter()
                .map(|g| GroupLine {
                    tenants: g.tenants,
                    workload: g.workload.to_string(),
                    bs: g.block_bytes,
                    read_pct: g.read_pct,
                })
                .collect(),
            traffic: o
                .traffic
                .iter()
                .map(|t| TrafficLine {
                    name: t.name,
                    bytes: t.bytes,
                })
                .collect(),
            l2p: o.l2p.map(|l| L2pLine {
                hits: l.hits,
                misses: l.misses,
                hit_rate: ratio(l.hits, l.hits + l.misses),
                page_reads: l.page_reads,
                page_writes: l.page_writes,
                cache_pages_max: l.cache_pages_max,
                table_bytes: l.table_bytes,
            }),
            devices,
            precondition_wall_s: o.precondition_wall.as_secs_f64(),
            wall_s: o.measure_wall.as_secs_f64(),
        }
    }

    /// One JSON object on one line.
    pub fn to_json(&self) -> String {
        // Serialising plain structs of numbers and strings cannot fail.
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A human-readable table.
    pub fn to_table(&self) -> String {
        let opt = |v: Option<f64>, prec: usize| match v {
            Some(x) => format!("{x:.prec$}"),
            None => "-".into(),
        };
        let gib = |b: u64| format!("{:.3} GiB", b as f64 / (1u64 << 30) as f64);
        let mut s = String::new();
        let _ = writeln!(
            s,
            "system {}  drive {}  config {}  workload {}  bs {}  read {}%  seed {}",
            self.system,
            self.drive,
            self.config,
            self.workload,
            shale_workload::format_size(self.bs),
            self.read_pct,
            self.seed
        );
        let _ = writeln!(
            s,
            "{} tenants x {} volumes, queue depth {}, capacity {}",
            self.tenants,
            shale_workload::format_size(self.volume_bytes),
            self.queue_depth,
            shale_workload::format_size(self.capacity_bytes)
        );
        let rows: Vec<(&str, String)> = vec![
            ("user bytes written", gib(self.bytes.user_written)),
            ("user bytes read", gib(self.bytes.user_read)),
            ("capacity host bytes", gib(self.bytes.capacity_written)),
            ("capacity NAND bytes", gib(self.bytes.capacity_nand)),
            ("  of which GC", gib(self.bytes.capacity_nand_gc)),
            (
                "  of which IU read-modify-write",
                gib(self.bytes.capacity_nand_rmw),
            ),
            (
                "cache bytes written",
                self.bytes
                    .cache_written
                    .map(gib)
                    .unwrap_or_else(|| "-".into()),
            ),
            ("layer WAF", opt(self.waf.layer, 3)),
            ("device WAF", opt(self.waf.device, 3)),
            ("total WAF", opt(self.waf.total, 3)),
            ("I/O amplification, capacity", opt(self.io_amp.capacity, 3)),
            ("I/O amplification, all devices", opt(self.io_amp.all, 3)),
            (
                "capacity reads per user write",
                opt(self.io_amp.capacity_read_per_write, 3),
            ),
            ("L2P hit rate", opt(self.l2p.and_then(|l| l.hit_rate), 4)),
            ("emulated MiB/s", opt(self.emulated_mib_s, 1)),
            (
                "emulated MiB/s per job",
                opt(self.emulated_mib_s_per_job, 2),
            ),
            (
                "precondition wall time",
                format!("{:.2} s", self.precondition_wall_s),
            ),
            ("measure wall time", format!("{:.2} s", self.wall_s)),
        ];
        for (k, v) in rows {
            let _ = writeln!(s, "  {k:<32} {v:>14}");
        }
        for t in &self.traffic {
            let _ = writeln!(s, "  background: {:<20} {:>14}", t.name, gib(t.bytes));
        }
        for d in &self.devices {
            let _ = writeln!(
                s,
                "  device {:<8} {:>2} {:<10} written {}  read {}  NAND {}  WAF {}  busy {:.3} s",
                d.role,
                d.index,
                d.preset,
                gib(d.host_written),
                gib(d.host_read),
                gib(d.nand_written),
                opt(d.waf, 3),
                d.busy_s
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{BenchConfig, Scale};
    use crate::runner::{MixSpec, RunSpec};
    use crate::system::DeviceReport;
    use shale_flashsim::FlashStats;
    use shale_workload::{Distribution, StreamProgress};
    use std::time::Duration;

    fn outcome() -> RunOutcome {
        RunOutcome {
            system: "test".into(),
            config: BenchConfig::standard(Scale::Quick),
            mix: MixSpec::single(
                &RunSpec {
                    workload: Distribution::Uniform.into(),
                    block_bytes: 4096,
                    read_pct: 0,
                    seed: 1,
                },
                2,
            ),
            volume_count: 2,
            volume_bytes: 1 << 20,
            user: StreamProgress {
                ops: 100,
                bytes: 1000,
                read_bytes: 0,
                write_bytes: 1000,
                trim_bytes: 0,
            },
            devices: vec![
                DeviceReport {
                    role: DeviceRole::Capacity,
                    preset: "qlc".into(),
                    stats: FlashStats {
                        host_bytes_written: 500,
                        nand_bytes_written: 2000,
                        busy_ns: 1_000_000_000,
                        ..FlashStats::default()
                    },
                },
                DeviceReport {
                    role: DeviceRole::Cache,
                    preset: "optane".into(),
                    stats: FlashStats {
                        host_bytes_written: 1000,
                        nand_bytes_written: 1000,
                        busy_ns: 2_000_000_000,
                        ..FlashStats::default()
                    },
                },
            ],
            traffic: Vec::new(),
            l2p: None,
            series: Vec::new(),
            precondition_wall: Duration::from_secs(1),
            measure_wall: Duration::from_secs(2),
        }
    }

    #[test]
    fn waf_is_layer_times_device_and_cache_is_apart() {
        let r = BenchReport::from_outcome(&outcome());
        assert_eq!(r.waf.layer, Some(0.5));
        assert_eq!(r.waf.device, Some(4.0));
        assert_eq!(r.waf.total, Some(2.0));
        assert_eq!(r.bytes.cache_written, Some(1000));
        assert_eq!(r.drive, "qlc");
        // Bottleneck: the cache was busier (2 s).
        let want = 1000.0 / MIB / 2.0;
        assert_eq!(r.emulated_mib_s, Some(want));
        assert_eq!(r.emulated_mib_s_per_job, Some(want / 2.0));
    }

    #[test]
    fn json_has_the_documented_nested_keys() {
        let r = BenchReport::from_outcome(&outcome());
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).expect("valid JSON");
        for path in [
            "/system",
            "/workload",
            "/bs",
            "/waf/layer",
            "/waf/device",
            "/waf/total",
            "/io_amp/capacity",
            "/io_amp/all",
            "/devices/0/waf",
            "/devices/0/index",
            "/bytes/user_written",
            "/bytes/capacity_written",
            "/bytes/capacity_nand",
            "/emulated_mib_s",
        ] {
            assert!(v.pointer(path).is_some(), "missing {path}");
        }
        assert!(r.to_table().contains("total WAF"));
    }

    #[test]
    fn zero_denominators_are_absent_not_nan() {
        let mut o = outcome();
        o.user = StreamProgress::default();
        o.devices.clear();
        let r = BenchReport::from_outcome(&o);
        assert_eq!(r.waf.total, None);
        assert_eq!(r.emulated_mib_s, None);
        assert!(r.to_json().contains("\"total\":null"));
    }
}
