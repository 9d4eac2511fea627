//! The simulated drive's counters (`--drive PRESET`): what the capacity drive received
//! and what its NAND would have done, for `shale stats` and the metrics endpoint.
//!
//! The simulator keeps no state on disk (the data is the capacity file's), so every
//! figure here counts from the daemon's start, as the engine's own counters do; the
//! drive's model also starts empty, so until data is rewritten it sees no
//! read-modify-write of data from before the start.

use serde_json::{json, Value};
use shale_flashsim::{FlashStats, StatsHandle};

use crate::metrics::{Metric, MetricKind};

/// Where the counters start, stated in the JSON so no one reads them as lifetime figures.
pub const SINCE: &str = "daemon start";

/// The preset a daemon's capacity drive simulates, and a live view of its counters.
#[derive(Debug, Clone)]
pub struct DriveStats {
    pub preset: String,
    handle: StatsHandle,
}

impl DriveStats {
    pub fn new(preset: &str, handle: StatsHandle) -> Self {
        DriveStats {
            preset: preset.to_string(),
            handle,
        }
    }

    /// The counters as of the drive's last completed command.
    pub fn snapshot(&self) -> FlashStats {
        self.handle.stats()
    }

    /// The `drive` object of `shale stats --json`; `user_written` is the engine's
    /// `Stats::user_write_bytes`, taken from the same moment.
    pub fn json(&self, user_written: u64) -> Value {
        drive_json(&self.preset, &self.snapshot(), user_written)
    }

    /// The `shale_drive_*` samples, labelled with the preset.
    pub fn metrics(&self, user_written: u64) -> Vec<Metric> {
        drive_metrics(&self.preset, &self.snapshot(), user_written)
    }
}

/// `a / b`, 0 when nothing was written: the convention of the engine's own WAF
/// figures (JSON has no NaN, and `FlashStats::waf` is NaN before the first write).
fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// The `drive` object: byte counts under `bytes`, ratios under `waf`, as in the
/// top-level stats. `waf.total` is NAND programmed per byte the tenants wrote, so it
/// compounds the engine's layer WAF with the drive's own (the cache device is not
/// simulated, so its writes are not in it).
pub fn drive_json(preset: &str, f: &FlashStats, user_written: u64) -> Value {
    let host_programs = f.nand_bytes_written_host + f.nand_bytes_written_rmw;
    json!({
        "preset": preset,
        "since": SINCE,
        "bytes": {
            "host_written": f.host_bytes_written,
            "host_read": f.host_bytes_read,
            "host_discarded": f.host_bytes_discarded,
            "nand_written": f.nand_bytes_written,
            "nand_written_gc": f.nand_bytes_written_gc,
            "nand_written_rmw": f.nand_bytes_written_rmw,
            "nand_read": f.nand_bytes_read,
            "nand_erased": f.nand_bytes_erased,
        },
        "erases": f.erases,
        "head_moves": f.head_moves,
        "waf": {
            "device": ratio(f.nand_bytes_written, f.host_bytes_written),
            "gc": ratio(f.nand_bytes_written, host_programs),
            "total": ratio(f.nand_bytes_written, user_written),
        },
        "busy_s": f.busy_secs(),
    })
}

/// Prometheus samples of the drive, each labelled `preset`.
pub fn drive_metrics(preset: &str, f: &FlashStats, user_written: u64) -> Vec<Metric> {
    let sample = |name, help, kind, value| Metric {
        name,
        help,
        kind,
        labels: vec![("preset", preset.to_string())],
        value,
    };
    let c = |name, help, v: u64| sample(name, help, MetricKind::Counter, v as f64);
    let g = |name, help, v: f64| sample(name, help, MetricKind::Gauge, v);
    vec![
        c(
            "shale_drive_host_written_bytes_total",
            "Bytes the simulated capacity drive received, since the daemon started.",
            f.host_bytes_written,
        ),
        c(
            "shale_drive_host_read_bytes_total",
            "Bytes read from the simulated capacity drive, since the daemon started.",
            f.host_bytes_read,
        ),
        c(
            "shale_drive_nand_written_bytes_total",
            "NAND bytes the simulated drive programmed (host data, GC copies, read-modify-write).",
            f.nand_bytes_written,
        ),
        c(
            "shale_drive_nand_gc_written_bytes_total",
            "NAND bytes the simulated drive's GC copied.",
            f.nand_bytes_written_gc,
        ),
        c(
            "shale_drive_nand_rmw_written_bytes_total",
            "NAND bytes programmed again to fill partly written indirection units.",
            f.nand_bytes_written_rmw,
        ),
        c(
            "shale_drive_nand_read_bytes_total",
            "NAND bytes the simulated drive read.",
            f.nand_bytes_read,
        ),
        c(
            "shale_drive_erases_total",
            "Erase operations of the simulated drive.",
            f.erases,
        ),
        c(
            "shale_drive_head_moves_total",
            "Commands that did not continue the one before (a simulated disk seeks).",
            f.head_moves,
        ),
        sample(
            "shale_drive_busy_seconds_total",
            "Time the simulated drive would have been busy (timing model).",
            MetricKind::Counter,
            f.busy_secs(),
        ),
        g(
            "shale_drive_waf",
            "NAND bytes programmed per byte the simulated drive received.",
            ratio(f.nand_bytes_written, f.host_bytes_written),
        ),
        g(
            "shale_drive_total_waf",
            "NAND bytes programmed per byte written by clients.",
            ratio(f.nand_bytes_written, user_written),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_stats() -> FlashStats {
        FlashStats {
            host_bytes_written: 1 << 20,
            host_bytes_read: 4096,
            nand_bytes_written_host: 1 << 20,
            nand_bytes_written_gc: 1 << 20,
            nand_bytes_written_rmw: 2 << 20,
            nand_bytes_written: 4 << 20,
            nand_bytes_read: 8192,
            erases: 3,
            busy_ns: 1_500_000_000,
            ..FlashStats::default()
        }
    }

    #[test]
    fn json_has_bytes_waf_and_where_counting_started() {
        let v = drive_json("qlc-p5316", &sample_stats(), 2 << 20);
        assert_eq!(v["preset"], "qlc-p5316");
        assert_eq!(v["since"], SINCE);
        let b = &v["bytes"];
        assert_eq!(b["host_written"], 1 << 20);
        assert_eq!(b["host_read"], 4096);
        assert_eq!(b["nand_written"], 4 << 20);
        assert_eq!(b["nand_written_gc"], 1 << 20);
        assert_eq!(b["nand_written_rmw"], 2 << 20);
        assert_eq!(b["nand_read"], 8192);
        assert_eq!(v["erases"], 3);
        assert_eq!(v["waf"]["device"], 4.0);
        assert_eq!(v["waf"]["gc"], 4.0 / 3.0);
        assert_eq!(v["waf"]["total"], 2.0);
        assert_eq!(v["busy_s"], 1.5);
        // Exactly these sections: a new field is a documented choice (docs/daemon.md).
        let mut keys: Vec<&str> = v
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "busy_s",
                "bytes",
                "erases",
                "head_moves",
                "preset",
                "since",
                "waf"
            ],
            "{v}"
        );
    }

    #[test]
    fn ratios_are_zero_before_any_write() {
        let v = drive_json("tlc", &FlashStats::default(), 0);
        for k in ["device", "gc", "total"] {
            assert_eq!(v["waf"][k], 0.0, "waf.{k}: {v}");
        }
    }

    #[test]
    fn metrics_carry_the_preset_label() {
        let m = drive_metrics("qlc-p5316", &sample_stats(), 2 << 20);
        let get = |name: &str| {
            m.iter()
                .find(|s| s.name == name)
                .unwrap_or_else(|| panic!("no {name}"))
        };
        assert_eq!(get("shale_drive_host_written_bytes_total").value, 1048576.0);
        assert_eq!(get("shale_drive_nand_written_bytes_total").value, 4194304.0);
        assert_eq!(get("shale_drive_waf").value, 4.0);
        assert_eq!(get("shale_drive_total_waf").value, 2.0);
        assert!(m
            .iter()
            .all(|s| s.labels == [("preset", "qlc-p5316".to_string())]));
        let text = crate::metrics::render(&m);
        assert!(
            text.contains("shale_drive_waf{preset=\"qlc-p5316\"} 4\n"),
            "{text}"
        );
    }
}
