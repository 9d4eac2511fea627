//! The seeds' figures as tables over a [`SuiteRun`], with the published numbers beside
//! ours, the orderings the seeds report checked, and the outputs: JSON, terminal
//! tables, a markdown report and PNG charts.
//!
//! Published numbers come from the seeds' text (the figures themselves are not in the
//! extractions): seed 004 §4.1 gives WAF and per-job bandwidth of CSAL on a regular
//! P5316 (our `shale-blk`), raw QLC and raw TLC; seed 000 §6 gives ratios ("up to
//! 61.6× raw QLC") and a few absolute rates. Every published number is quoted with
//! its place in the seed.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::plot::{self, Chart, Line, PlotError};
use crate::report::BenchReport;
use crate::suite::{fig8_thetas, sweep_kib, PointResult, SuiteRun, Variant, SUITE_SYSTEMS};
use crate::Scale;

const MIB: f64 = 1024.0 * 1024.0;
/// 10^6 bytes in MiB (the seeds quote MB/s in seed 000 and MiB/s in seed 004).
const MB_IN_MIB: f64 = 1e6 / MIB;

/// A figure the seeds published for one system and workload.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Published {
    system: &'static str,
    point: &'static str,
    total_waf: Option<f64>,
    /// Per-job write bandwidth (the writers' for mixed workloads), MiB/s.
    write_mib_s_per_job: Option<f64>,
    /// Per-job read bandwidth of the readers, MiB/s.
    read_mib_s_per_job: Option<f64>,
    source: &'static str,
}

const fn published(
    system: &'static str,
    point: &'static str,
    total_waf: Option<f64>,
    write: Option<f64>,
    read: Option<f64>,
    source: &'static str,
) -> Published {
    Published {
        system,
        point,
        total_waf,
        write_mib_s_per_job: write,
        read_mib_s_per_job: read,
        source,
    }
}

/// Seed 004 §4.1 (O+Q = CSAL over a P5316 = `shale-blk`).
const PUBLISHED: [Published; 13] = [
    published(
        "raw-qlc",
        "uniform-4k",
        Some(43.3),
        Some(5.02),
        None,
        "004 §4.1.1 Fig. 6",
    ),
    published(
        "shale-blk",
        "uniform-4k",
        Some(3.57),
        Some(70.4),
        None,
        "004 §4.1.1 Fig. 6",
    ),
    published(
        "raw-qlc",
        "zipf1.2-4k",
        Some(20.4),
        Some(3.4),
        None,
        "004 §4.1.2 Fig. 7",
    ),
    published(
        "raw-tlc",
        "zipf1.2-4k",
        Some(0.735),
        Some(201.0),
        None,
        "004 §4.1.2 Fig. 7",
    ),
    published(
        "shale-blk",
        "zipf1.2-4k",
        Some(0.17),
        Some(496.0),
        None,
        "004 §4.1.2 Fig. 7",
    ),
    published(
        "raw-qlc",
        "zipf0.8-64k",
        Some(2.82),
        Some(52.0),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "raw-tlc",
        "zipf0.8-64k",
        Some(2.57),
        Some(149.0),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "shale-blk",
        "zipf0.8-64k",
        Some(2.87),
        Some(125.0),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "raw-qlc",
        "zipf1.2-64k",
        Some(1.42),
        Some(51.2),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "raw-tlc",
        "zipf1.2-64k",
        Some(1.12),
        Some(259.0),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "shale-blk",
        "zipf1.2-64k",
        Some(0.41),
        Some(544.0),
        None,
        "004 §4.1.3 Fig. 8",
    ),
    published(
        "raw-qlc",
        "mix-w4k-r64k",
        Some(40.8),
        Some(9.05),
        Some(142.0),
        "004 §4.1.4 Fig. 9",
    ),
    published(
        "shale-blk",
        "mix-w4k-r64k",
        Some(3.54),
        Some(163.0),
        None,
        "004 §4.1.4 Fig. 9",
    ),
];

fn published_for(system: &str, point: &str) -> Option<&'static Published> {
    PUBLISHED
        .iter()
        .find(|p| p.system == system && p.point == point)
}

/// One row of an experiment's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub system: String,
    pub variant: &'static str,
    pub point: String,
    pub waf_layer: Option<f64>,
    pub waf_device: Option<f64>,
    pub waf_total: Option<f64>,
    pub seed_waf_total: Option<f64>,
    /// Per-job bandwidth of the writing tenants (of all tenants if none write).
    pub mib_s_per_job: Option<f64>,
    pub seed_mib_s_per_job: Option<f64>,
    /// Per-job read bandwidth of the reading tenants (mixed workloads).
    pub read_mib_s_per_job: Option<f64>,
    pub seed_read_mib_s_per_job: Option<f64>,
    pub emulated_mib_s: Option<f64>,
    pub l2p_hit_rate: Option<f64>,
    pub cache_written_gib: Option<f64>,
    pub wall_s: f64,
    pub seed_source: Option<&'static str>,
}

fn row(r: &PointResult) -> Row {
    let rep = &r.report;
    let writers: u32 = rep
        .groups
        .iter()
        .filter(|g| g.read_pct < 100)
        .map(|g| g.tenants)
        .sum();
    let readers: u32 = rep
        .groups
        .iter()
        .filter(|g| g.read_pct > 0)
        .map(|g| g.tenants)
        .sum();
    let mib_s_per_job = if writers > 0 {
        rep.emulated_write_mib_s.map(|v| v / f64::from(writers))
    } else {
        rep.emulated_mib_s_per_job
    };
    let read_mib_s_per_job = (readers > 0 && writers > 0)
        .then(|| rep.emulated_read_mib_s.map(|v| v / f64::from(readers)))
        .flatten();
    let p = published_for(&r.system, &r.point).filter(|_| r.variant == "standard");
    Row {
        system: r.system.clone(),
        variant: r.variant,
        point: r.point.clone(),
        waf_layer: rep.waf.layer,
        waf_device: rep.waf.device,
        waf_total: rep.waf.total,
        seed_waf_total: p.and_then(|p| p.total_waf),
        mib_s_per_job,
        seed_mib_s_per_job: p.and_then(|p| p.write_mib_s_per_job),
        read_mib_s_per_job,
        seed_read_mib_s_per_job: p.and_then(|p| p.read_mib_s_per_job),
        emulated_mib_s: rep.emulated_mib_s,
        l2p_hit_rate: rep.l2p.and_then(|l| l.hit_rate),
        cache_written_gib: rep
            .bytes
            .cache_written
            .map(|b| b as f64 / (1u64 << 30) as f64),
        wall_s: rep.wall_s,
        seed_source: p.map(|p| p.source),
    }
}

/// A figure the seeds state as a ratio or rate, beside ours.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub what: String,
    pub ours: Option<f64>,
    pub seed: f64,
    pub source: &'static str,
}

/// One experiment: a table, comparisons and charts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Experiment {
    pub id: &'static str,
    pub title: &'static str,
    /// What the seed ran and how we run it.
    pub setup: &'static str,
    pub rows: Vec<Row>,
    pub comparisons: Vec<Comparison>,
    /// PNG files (relative to the output directory).
    pub plots: Vec<String>,
    /// Time series (Figures 16 and 17): per system, MiB/s by cause over emulated time.
    pub series: Vec<SeriesLine>,
}

/// A system's time series in one experiment.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SeriesLine {
    pub system: String,
    /// Emulated seconds at the end of each interval.
    pub t_s: Vec<f64>,
    /// Per cause (`user`, then the system's own: `compaction`, `gc`, `flush`, `rc1`...),
    /// MiB/s written in each interval.
    pub mib_s: Vec<(String, Vec<f64>)>,
    /// Averages over the whole phase.
    pub mean_mib_s: Vec<(String, f64)>,
}

/// An ordering the seeds report, checked on our numbers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    pub name: String,
    pub holds: bool,
    pub detail: String,
}

/// Everything `shale bench suite` outputs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteReport {
    pub run: SuiteRun,
    pub experiments: Vec<Experiment>,
    pub checks: Vec<Check>,
}

fn rows_for(run: &SuiteRun, systems: &[&str], variant: Variant, points: &[String]) -> Vec<Row> {
    let mut out = Vec::new();
    for p in points {
        for s in systems {
            if let Some(r) = run.get(s, variant, p) {
                out.push(row(r));
            }
        }
    }
    out
}

fn labels() -> Vec<&'static str> {
    SUITE_SYSTEMS.iter().map(|s| s.label).collect()
}

fn mibs(run: &SuiteRun, system: &str, point: &str) -> Option<f64> {
    run.get(system, Variant::Standard, point)
        .and_then(|r| r.report.emulated_mib_s)
}

fn best_ratio(run: &SuiteRun, num: &str, den: &str, points: &[String]) -> Option<f64> {
    points
        .iter()
        .filter_map(|p| Some(mibs(run, num, p)? / mibs(run, den, p)?))
        .fold(None, |acc: Option<f64>, v| {
            Some(acc.map_or(v, |a| a.max(v)))
        })
}

fn series_line(r: &PointResult) -> SeriesLine {
    let mut t_s = Vec::new();
    let mut causes: Vec<(String, Vec<f64>)> = vec![("user".into(), Vec::new())];
    for (name, _) in r
        .series
        .first()
        .map(|s| s.traffic.as_slice())
        .unwrap_or(&[])
    {
        causes.push((name.clone(), Vec::new()));
    }
    for w in r.series.windows(2) {
        let dt = w[1].emulated_s - w[0].emulated_s;
        if dt <= 0.0 {
            continue;
        }
        t_s.push(w[1].emulated_s);
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / MIB / dt;
        causes[0].1.push(rate(w[0].user_written, w[1].user_written));
        for (i, (_, b)) in w[1].traffic.iter().enumerate() {
            let a = w[0].traffic.get(i).map_or(0, |t| t.1);
            if let Some(c) = causes.get_mut(i + 1) {
                c.1.push(rate(a, *b));
            }
        }
    }
    let (first, last) = (r.series.first(), r.series.last());
    let span = match (first, last) {
        (Some(a), Some(b)) if b.emulated_s > a.emulated_s => b.emulated_s - a.emulated_s,
        _ => 0.0,
    };
    let mut mean = Vec::new();
    if let (Some(a), Some(b), true) = (first, last, span > 0.0) {
        mean.push((
            "user".to_string(),
            b.user_written.saturating_sub(a.user_written) as f64 / MIB / span,
        ));
        for (i, (name, bytes)) in b.traffic.iter().enumerate() {
            let start = a.traffic.get(i).map_or(0, |t| t.1);
            mean.push((
                name.clone(),
                bytes.saturating_sub(start) as f64 / MIB / span,
            ));
        }
    }
    SeriesLine {
        system: r.system.clone(),
        t_s,
        mib_s: causes,
        mean_mib_s: mean,
    }
}

fn mean_of(s: &SeriesLine, cause: &str) -> Option<f64> {
    s.mean_mib_s
        .iter()
        .find(|(n, _)| n == cause)
        .map(|(_, v)| *v)
}

fn total_waf(run: &SuiteRun, system: &str, variant: Variant, point: &str) -> Option<f64> {
    run.get(system, variant, point)
        .and_then(|r| r.report.waf.total)
}

/// Builds the experiments and checks of a finished run.
// One push per experiment, in report order, reads better than one long literal.
#[allow(clippy::vec_init_then_push)]
#[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
pub fn build(run: SuiteRun) -> SuiteReport {
    let scale = match run.suite {
        "paper" => Scale::Paper,
        "quick" => Scale::Quick,
        _ => Scale::Tiny,
    };
    let sys = labels();
    let sweep = sweep_kib(scale);
    let uni: Vec<String> = sweep.iter().map(|k| format!("uniform-{k}k")).collect();
    let seq: Vec<String> = sweep.iter().map(|k| format!("seq-{k}k")).collect();
    let skew: Vec<String> = ["uniform", "zipf0.8", "zipf1.2"]
        .iter()
        .flat_map(|w| [format!("{w}-4k"), format!("{w}-64k")])
        .collect();
    let no_dmz: Vec<&str> = sys
        .iter()
        .copied()
        .filter(|s| *s != "dmzoned-model")
        .collect();
    let mut ex = Vec::new();

    ex.push(Experiment {
        id: "fig10-random",
        title: "Seed 000 Figure 10(a): uniform random writes, block size sweep",
        setup: "8 tenants, one job each at QD 128, fio randwrite (`uniform`) over each \
                volume. The seed plots bandwidth; its text gives only the ratios below.",
        rows: rows_for(&run, &sys, Variant::Standard, &uni),
        comparisons: vec![
            Comparison {
                what: "shale-zns / raw-qlc bandwidth, best over block sizes".into(),
                ours: best_ratio(&run, "shale-zns", "raw-qlc", &uni),
                seed: 61.6,
                source: "000 §6.2 (CSAL vs raw QLC, up to 61.6×)",
            },
            Comparison {
                what: "shale-zns / opencas-model bandwidth, best over block sizes".into(),
                ours: best_ratio(&run, "shale-zns", "opencas-model", &uni),
                seed: 8.28,
                source: "000 §6.2 (CSAL vs Open-CAS, up to 8.28×)",
            },
            Comparison {
                what: "dmzoned-model user MiB/s, best over block sizes (seed: under 10 MB/s)"
                    .into(),
                ours: uni
                    .iter()
                    .filter_map(|p| mibs(&run, "dmzoned-model", p))
                    .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v)))),
                seed: 10.0 * MB_IN_MIB,
                source: "000 §3, §6.2 (dm-zoned random writes under 10 MB/s)",
            },
        ],
        plots: Vec::new(),
        series: Vec::new(),
    });
    ex.push(Experiment {
        id: "fig10-seq",
        title: "Seed 000 Figure 10(b): sequential writes, block size sweep",
        setup: "8 tenants, fio write (`seq`), each from the start of its volume.",
        rows: rows_for(&run, &sys, Variant::Standard, &seq),
        comparisons: vec![
            Comparison {
                what: "shale-zns / raw-qlc bandwidth, best over block sizes".into(),
                ours: best_ratio(&run, "shale-zns", "raw-qlc", &seq),
                seed: 81.45,
                source: "000 §6.2 (up to 81.45×)",
            },
            Comparison {
                what: "shale-zns / opencas-model bandwidth, best over block sizes".into(),
                ours: best_ratio(&run, "shale-zns", "opencas-model", &seq),
                seed: 2.22,
                source: "000 §6.2 (up to 2.22×)",
            },
            Comparison {
                what: "shale-zns / dmzoned-model bandwidth, best over block sizes".into(),
                ours: best_ratio(&run, "shale-zns", "dmzoned-model", &seq),
                seed: 5.24,
                source: "000 §6.2 (up to 5.24×)",
            },
            Comparison {
                what: "shale-zns MiB/s at 128 KiB (seed: about 2 GB/s)".into(),
                ours: mibs(&run, "shale-zns", "seq-128k"),
                seed: 2000.0 * MB_IN_MIB,
                source: "000 §6.2 (CSAL-BLK/ZNS constantly deliver 2GB/s)",
            },
        ],
        plots: Vec::new(),
        series: Vec::new(),
    });
    ex.push(Experiment {
        id: "fig11-15",
        title: "Seed 000 Figures 11 and 15: skewed random writes (bandwidth and WAF)",
        setup: "4 KiB and 64 KiB random writes, uniform, zipf 0.8 and zipf 1.2 (fio's \
                zipf). dm-zoned is left out, as in the seed. Seed 004's figures for the \
                same workloads are beside ours.",
        rows: rows_for(&run, &no_dmz, Variant::Standard, &skew),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    ex.push(Experiment {
        id: "fig14",
        title: "Seed 000 Figure 14 / seed 004 Figure 9: mixed reads and writes",
        setup: "7 tenants writing 4 KiB uniform random beside 1 reading 64 KiB uniform \
                random; and 4 writing 64 KiB beside 4 reading 64 KiB. The seeds limited \
                each job to 700 MB/s; here tenants take turns one operation at a time, so \
                a reader issues as many operations as a writer, and the bottleneck model \
                splits the devices' time between the bytes read and written.",
        rows: rows_for(
            &run,
            &no_dmz,
            Variant::Standard,
            &["mix-w4k-r64k".into(), "mix-w64k-r64k".into()],
        ),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    for (id, point, title, setup) in [
        (
            "fig16",
            "uniform-4k",
            "Seed 000 Figure 16: backend traffic under 4 KiB random writes",
            "The measured phase of 4 KiB uniform random writes, sampled every 1/64 of \
             it: user writes and each system's background writes (Shale: compaction and \
             GC; opencas-model: flush; dmzoned-model: RC-1 random to sequential, RC-2 \
             sequential to random), in MiB/s over the bottleneck model's time.",
        ),
        (
            "fig17",
            "uniform-64k",
            "Seed 000 Figure 17: backend traffic under 64 KiB random writes",
            "As Figure 16, with 64 KiB writes.",
        ),
    ] {
        let series: Vec<SeriesLine> = sys
            .iter()
            .filter_map(|s| run.get(s, Variant::Standard, point))
            .map(series_line)
            .collect();
        let mean = |system: &str, causes: &[&str]| -> Option<f64> {
            let s = series.iter().find(|s| s.system == system)?;
            causes.iter().map(|c| mean_of(s, c)).sum()
        };
        let comparisons = if id == "fig16" {
            vec![
                Comparison {
                    what: "opencas-model user MiB/s (seed: around 50 MB/s)".into(),
                    ours: mean("opencas-model", &["user"]),
                    seed: 50.0 * MB_IN_MIB,
                    source: "000 §6.4",
                },
                Comparison {
                    what: "dmzoned-model user MiB/s (seed: less than 10 MB/s)".into(),
                    ours: mean("dmzoned-model", &["user"]),
                    seed: 10.0 * MB_IN_MIB,
                    source: "000 §6.4",
                },
                Comparison {
                    what: "dmzoned-model reclaim (RC-1 + RC-2) MiB/s (seed: around 700 MB/s)"
                        .into(),
                    ours: mean("dmzoned-model", &["rc1", "rc2"]),
                    seed: 700.0 * MB_IN_MIB,
                    source: "000 §6.4",
                },
            ]
        } else {
            vec![
                Comparison {
                    what: "opencas-model flush MiB/s (seed: around 430 MB/s)".into(),
                    ours: mean("opencas-model", &["flush"]),
                    seed: 430.0 * MB_IN_MIB,
                    source: "000 §6.4",
                },
                Comparison {
                    what: "dmzoned-model reclaim (RC-1 + RC-2) MiB/s (seed: around 700 MB/s)"
                        .into(),
                    ours: mean("dmzoned-model", &["rc1", "rc2"]),
                    seed: 700.0 * MB_IN_MIB,
                    source: "000 §6.4",
                },
            ]
        };
        ex.push(Experiment {
            id,
            title,
            setup,
            rows: rows_for(&run, &sys, Variant::Standard, &[point.to_string()]),
            comparisons,
            plots: Vec::new(),
            series,
        });
    }
    let mut fig18_points = vec![
        "mix-seq-rand-4k".to_string(),
        "mix-seq-rand-64k".to_string(),
    ];
    if scale == Scale::Paper {
        fig18_points.extend(["uniform-4k".to_string(), "zipf1.2-4k".to_string()]);
    }
    let mut rows18 = Vec::new();
    for p in &fig18_points {
        for v in [Variant::IsolationOff, Variant::Standard] {
            if let Some(r) = run.get("shale-zns", v, p) {
                rows18.push(row(r));
            }
        }
    }
    ex.push(Experiment {
        id: "fig18",
        title: "Seed 000 Figure 18: user isolation (shale-zns)",
        setup: "The seed's mixed workload (4 tenants sequential, 4 uniform random) with \
                every tenant's data in its own zones (`standard`: one placement stream per \
                tenant) and with all tenants sharing one stream (`isolation-off`). The \
                engine always keeps GC writes apart from compaction writes, so the seed's \
                third bar (no GC isolation) is not reproduced. The seed gives no numbers, \
                only the ordering: isolation lowers WAF on the mixed workload.",
        rows: rows18,
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    let mut rows19 = Vec::new();
    for p in ["uniform-4k", "zipf1.2-4k"] {
        for v in [Variant::L2pMin, Variant::Standard, Variant::L2pFull] {
            if let Some(r) = run.get("shale-zns", v, p) {
                rows19.push(row(r));
            }
        }
    }
    let gain = |p: &str, a: Variant, b: Variant| -> Option<f64> {
        let x = run.get("shale-zns", a, p)?.report.emulated_mib_s?;
        let y = run.get("shale-zns", b, p)?.report.emulated_mib_s?;
        Some((x / y - 1.0) * 100.0)
    };
    ex.push(Experiment {
        id: "fig19",
        title: "Seed 000 Figure 19: L2P page-cache budget (shale-zns)",
        setup: "The L2P page cache at 16 pages (64 KiB; the engine refuses fewer than 8 \
                with 1 MiB requests; the seed's \"non-cache\" used 10 KB), at the standard \
                12.5% of the table (the seed's 2 GB of a 16 TB table's 16 GB; 10 pages in \
                `quick`, so there 16 pages is the larger budget), and holding the whole \
                table (\"full-cache\").",
        rows: rows19,
        comparisons: vec![
            Comparison {
                what: "uniform 4 KiB: full vs smallest cache, bandwidth gain %".into(),
                ours: gain("uniform-4k", Variant::L2pFull, Variant::L2pMin),
                seed: 23.0,
                source: "000 §6.4 (23% over non-cache)",
            },
            Comparison {
                what: "uniform 4 KiB: full vs standard cache, bandwidth gain %".into(),
                ours: gain("uniform-4k", Variant::L2pFull, Variant::Standard),
                seed: 20.0,
                source: "000 §6.4 (20% over the 2 GB cache)",
            },
            Comparison {
                what: "zipf 1.2 4 KiB: standard vs full cache, bandwidth change %".into(),
                ours: gain("zipf1.2-4k", Variant::Standard, Variant::L2pFull),
                seed: -3.0,
                source: "000 §6.4 (2 GB cache 3% below full)",
            },
        ],
        plots: Vec::new(),
        series: Vec::new(),
    });
    let std_rows = |points: &[&str]| {
        rows_for(
            &run,
            &[
                "raw-qlc",
                "raw-tlc",
                "opencas-model",
                "shale-blk",
                "shale-zns",
            ],
            Variant::Standard,
            &points.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        )
    };
    ex.push(Experiment {
        id: "004-fig6",
        title: "Seed 004 Figure 6: 4 KiB uniform random writes",
        setup: "8 jobs on 8 partitions; O+Q (CSAL on an Optane P5800X and a P5316) is \
                `shale-blk` here.",
        rows: std_rows(&["uniform-4k"]),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    ex.push(Experiment {
        id: "004-fig7",
        title: "Seed 004 Figure 7: 4 KiB zipf 1.2 random writes",
        setup: "As Figure 6 with fio's zipf 1.2.",
        rows: std_rows(&["zipf1.2-4k"]),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    let fig8: Vec<String> = fig8_thetas(scale)
        .iter()
        .map(|t| format!("{}-64k", t.replace(':', "")))
        .collect();
    ex.push(Experiment {
        id: "004-fig8",
        title: "Seed 004 Figure 8: 64 KiB zipf random writes",
        setup: "64 KiB writes, zipf θ from 0.8 to 1.2 (the seed's text gives 0.8 and 1.2).",
        rows: rows_for(
            &run,
            &[
                "raw-qlc",
                "raw-tlc",
                "opencas-model",
                "shale-blk",
                "shale-zns",
            ],
            Variant::Standard,
            &fig8,
        ),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    ex.push(Experiment {
        id: "004-fig9",
        title: "Seed 004 Figure 9: 4 KiB random writes beside 64 KiB random reads",
        setup: "7 writers, 1 reader, as in Figure 14.",
        rows: std_rows(&["mix-w4k-r64k"]),
        comparisons: Vec::new(),
        plots: Vec::new(),
        series: Vec::new(),
    });
    if let Some(c) = &run.controllers {
        ex.push(controllers_experiment(c));
    }
    if let Some(h) = &run.hybrid {
        ex.push(hybrid_experiment(h));
    }
    let checks = checks(&run);
    SuiteReport {
        run,
        experiments: ex,
        checks,
    }
}

/// SALSA Table III (seed 002 §V-D): one controller for a database and an object store
/// against one each, as ratios of the dual setup to the single one.
fn controllers_experiment(c: &crate::controllers::ControllersReport) -> Experiment {
    use crate::controllers::Setup;
    let get = |s: Setup| c.setups.iter().find(|r| r.setup == s);
    let ratio = |f: fn(&crate::controllers::SetupResult) -> u64| match (
        get(Setup::Dual),
        get(Setup::Single),
    ) {
        (Some(d), Some(s)) if f(s) > 0 => Some(f(d) as f64 / f(s) as f64),
        _ => None,
    };
    const SRC: &str = "002 §V-D Table III";
    Experiment {
        id: "002-table3",
        title: "Seed 002 Table III: two controllers for a database and an object store",
        setup: "A database volume (8 KiB zipf:0.8 writes, a sixteenth of the bytes) beside an \
                object volume (128 KiB objects written in order), shale-zns. Single: both \
                mapped at 4 KiB, their data in one stream. Dual: the database in 8 KiB units, \
                the objects dual mapped in 64 KiB units, a stream each (`shale bench \
                controllers`, docs/benchmarks.md). SALSA's figures: DRAM 1.66 → 0.68 GiB, \
                relocations 2.48 → 1.78 MiB/s, 7% of the writes under one controller.",
        rows: Vec::new(),
        comparisons: vec![
            Comparison {
                what: "maps (DRAM), dual / single".into(),
                ours: ratio(|r| r.l2p_table_bytes),
                seed: 0.68 / 1.66,
                source: SRC,
            },
            Comparison {
                what: "relocation traffic, dual / single".into(),
                ours: ratio(|r| r.gc_bytes),
                seed: 1.78 / 2.48,
                source: SRC,
            },
            Comparison {
                what: "relocations per user byte, single".into(),
                ours: get(Setup::Single).and_then(|r| r.relocation_per_user),
                seed: 0.07,
                source: SRC,
            },
        ],
        plots: Vec::new(),
        series: Vec::new(),
    }
}

/// SALSA Table IV (seed 002 §V-E): the video server on an SMR disk alone and as the
/// cold tier behind a ZNS QLC drive.
fn hybrid_experiment(h: &crate::hybrid::HybridReport) -> Experiment {
    use crate::hybrid::Setup;
    let read = |s: Setup| {
        h.setups
            .iter()
            .find(|r| r.setup == s)
            .and_then(|r| r.read_mib_s)
    };
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    const SRC: &str = "002 §V-E Table IV";
    Experiment {
        id: "002-table4",
        title: "Seed 002 Table IV: a video server on an SMR disk, alone and behind flash",
        setup: "8 volumes written once in order; 1 writer of 1 MiB videos in order (a request \
                per turn) beside 7 readers of 1 MiB at zipf:1.2. smr: shale-zns on the SMR \
                disk alone; hybrid: half the zones on ZNS QLC, the SMR disk as the cold tier, \
                blocks read often promoted (`shale bench hybrid`, docs/benchmarks.md). \
                SALSA's figures: reads 4.8 (raw SMR), 6.2 (SALSA on SMR), 118.5 MiB/s \
                (hybrid, the SSD holding the active videos).",
        rows: Vec::new(),
        comparisons: vec![
            Comparison {
                what: "read MiB/s, hybrid / SMR alone".into(),
                ours: h.read_speedup,
                seed: 118.5 / 6.2,
                source: SRC,
            },
            Comparison {
                what: "read MiB/s, tier without promotion / SMR alone".into(),
                ours: ratio(read(Setup::TierOnly), read(Setup::Smr)),
                seed: 118.5 / 6.2,
                source: SRC,
            },
        ],
        plots: Vec::new(),
        series: Vec::new(),
    }
}

/// The orderings the seeds report (issue: "Done when").
pub fn checks(run: &SuiteRun) -> Vec<Check> {
    let mut out = Vec::new();
    let shale = ["shale-zns", "shale-blk"];
    let random_points: Vec<String> = ["uniform", "zipf0.8", "zipf1.2"]
        .iter()
        .flat_map(|w| [format!("{w}-4k"), format!("{w}-64k")])
        .collect();
    for s in shale {
        let mut bad = Vec::new();
        let mut seen = 0;
        for p in &random_points {
            let (Some(a), Some(b)) = (
                total_waf(run, s, Variant::Standard, p),
                total_waf(run, "raw-qlc", Variant::Standard, p),
            ) else {
                continue;
            };
            seen += 1;
            if a >= b {
                bad.push(format!("{p}: {a:.3} >= {b:.3}"));
            }
        }
        out.push(Check {
            name: format!("{s}: total WAF below raw-qlc in every random-write case"),
            holds: seen > 0 && bad.is_empty(),
            detail: if bad.is_empty() {
                format!("{seen} cases")
            } else {
                bad.join("; ")
            },
        });
        for bs in ["4k", "64k"] {
            let w: Vec<Option<f64>> = ["uniform", "zipf0.8", "zipf1.2"]
                .iter()
                .map(|d| total_waf(run, s, Variant::Standard, &format!("{d}-{bs}")))
                .collect();
            let detail = format!("uniform, zipf 0.8, zipf 1.2: {w:.3?}");
            let heavy = matches!(w.as_slice(), [Some(u), Some(l), Some(h)] if h < l && h < u);
            out.push(Check {
                name: format!(
                    "{s}: more skew, lower total WAF: zipf 1.2 below zipf 0.8 and uniform ({bs})"
                ),
                holds: heavy,
                detail: detail.clone(),
            });
            let light = matches!(w.as_slice(), [Some(u), Some(l), _] if l < u);
            out.push(Check {
                name: format!("{s}: light skew, lower total WAF: zipf 0.8 below uniform ({bs})"),
                holds: light,
                detail,
            });
        }
        let (a, b) = (
            run.get(s, Variant::Standard, "uniform-4k"),
            run.get("opencas-model", Variant::Standard, "uniform-4k"),
        );
        let holds = match (a, b) {
            (Some(a), Some(b)) => {
                a.report.waf.total < b.report.waf.total
                    && a.report.emulated_mib_s > b.report.emulated_mib_s
            }
            _ => false,
        };
        out.push(Check {
            name: format!("{s}: beats opencas-model on 4 KiB random writes (WAF and MiB/s)"),
            holds,
            detail: format!(
                "total WAF {:?} vs {:?}, MiB/s {:?} vs {:?}",
                a.and_then(|r| r.report.waf.total),
                b.and_then(|r| r.report.waf.total),
                a.and_then(|r| r.report.emulated_mib_s),
                b.and_then(|r| r.report.emulated_mib_s),
            ),
        });
    }
    out.extend(salsa_checks(run));
    for p in ["mix-seq-rand-4k", "mix-seq-rand-64k"] {
        let on = total_waf(run, "shale-zns", Variant::Standard, p);
        let off = total_waf(run, "shale-zns", Variant::IsolationOff, p);
        out.push(Check {
            name: format!("shale-zns: isolation lowers total WAF on {p}"),
            holds: matches!((on, off), (Some(a), Some(b)) if a < b),
            detail: format!("isolation on {on:?}, off {off:?}"),
        });
    }
    out
}

/// The SALSA experiments' checks (two controllers, the hybrid pool), when they ran.
fn salsa_checks(run: &SuiteRun) -> Vec<Check> {
    let mut out = Vec::new();
    if let Some(c) = &run.controllers {
        let pct = |x: Option<f64>| x.map_or("–".into(), |x| format!("{:.1}%", x * 100.0));
        out.push(Check {
            name: "two controllers: maps at least 40% smaller than one controller's (SALSA −60%)"
                .into(),
            holds: c.dram_cut.is_some_and(|x| x >= 0.4),
            detail: format!("maps −{}", pct(c.dram_cut)),
        });
        out.push(Check {
            name: "two controllers: less relocation traffic than one (SALSA −28%)".into(),
            holds: c.relocation_cut.is_some_and(|x| x > 0.0),
            detail: format!("GC bytes −{}", pct(c.relocation_cut)),
        });
    }
    if let Some(h) = &run.hybrid {
        out.push(Check {
            name: "hybrid pool: reads faster than the SMR disk alone (SALSA 19.1×)".into(),
            holds: h.read_speedup.is_some_and(|x| x > 1.0),
            detail: format!(
                "{}×",
                h.read_speedup.map_or("–".into(), |x| format!("{x:.1}"))
            ),
        });
    }
    out
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    match v {
        Some(x) => format!("{x:.prec$}"),
        None => "–".into(),
    }
}

/// Column headers and cells of a row.
fn table_cells(r: &Row, with_variant: bool, with_reads: bool) -> Vec<String> {
    let mut c = vec![r.system.clone()];
    if with_variant {
        c.push(r.variant.to_string());
    }
    c.extend([
        r.point.clone(),
        fmt_opt(r.waf_layer, 3),
        fmt_opt(r.waf_device, 3),
        fmt_opt(r.waf_total, 3),
        fmt_opt(r.seed_waf_total, 3),
        fmt_opt(r.mib_s_per_job, 2),
        fmt_opt(r.seed_mib_s_per_job, 2),
    ]);
    if with_reads {
        c.push(fmt_opt(r.read_mib_s_per_job, 2));
        c.push(fmt_opt(r.seed_read_mib_s_per_job, 2));
    }
    c.extend([
        fmt_opt(r.l2p_hit_rate, 4),
        fmt_opt(r.cache_written_gib, 2),
        format!("{:.2}", r.wall_s),
    ]);
    c
}

fn table_header(with_variant: bool, with_reads: bool) -> Vec<&'static str> {
    let mut h = vec!["system"];
    if with_variant {
        h.push("variant");
    }
    h.extend([
        "workload",
        "layer WAF",
        "device WAF",
        "total WAF",
        "seed WAF",
        "MiB/s/job",
        "seed MiB/s/job",
    ]);
    if with_reads {
        h.extend(["read MiB/s/job", "seed read"]);
    }
    h.extend(["L2P hit", "cache GiB", "wall s"]);
    h
}

fn shape(e: &Experiment) -> (bool, bool) {
    let with_variant = e.rows.iter().any(|r| r.variant != "standard");
    let with_reads = e.rows.iter().any(|r| r.read_mib_s_per_job.is_some());
    (with_variant, with_reads)
}

impl SuiteReport {
    /// One JSON object.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// Tables for a terminal.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "shale bench suite {}: seed {}, capacity {}, {} tenants, QD {}, wall {:.1} s",
            self.run.suite,
            self.run.seed,
            shale_workload::format_size(self.run.capacity_bytes),
            self.run.tenants,
            self.run.queue_depth,
            self.run.wall_s
        );
        for e in &self.experiments {
            let _ = writeln!(s, "\n== {} ({})", e.title, e.id);
            let (v, r) = shape(e);
            let header = table_header(v, r);
            let rows: Vec<Vec<String>> = e.rows.iter().map(|x| table_cells(x, v, r)).collect();
            let widths: Vec<usize> = (0..header.len())
                .map(|i| {
                    rows.iter()
                        .map(|row| row[i].chars().count())
                        .chain([header[i].len()])
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            let line = |cells: &[String]| -> String {
                cells
                    .iter()
                    .zip(&widths)
                    .map(|(c, w)| format!("{c:>w$}"))
                    .collect::<Vec<_>>()
                    .join("  ")
            };
            if !rows.is_empty() {
                let head: Vec<String> = header.iter().map(|h| h.to_string()).collect();
                let _ = writeln!(s, "{}", line(&head));
                for row in &rows {
                    let _ = writeln!(s, "{}", line(row));
                }
            }
            for c in &e.comparisons {
                let _ = writeln!(
                    s,
                    "  {}: ours {}, seed {:.2} ({})",
                    c.what,
                    fmt_opt(c.ours, 2),
                    c.seed,
                    c.source
                );
            }
            for l in &e.series {
                let means: Vec<String> = l
                    .mean_mib_s
                    .iter()
                    .map(|(n, v)| format!("{n} {v:.1}"))
                    .collect();
                let _ = writeln!(s, "  {} mean MiB/s: {}", l.system, means.join(", "));
            }
        }
        let _ = writeln!(s, "\n== Orderings the seeds report");
        for c in &self.checks {
            let _ = writeln!(
                s,
                "  [{}] {} ({})",
                if c.holds { "ok" } else { "NO" },
                c.name,
                c.detail
            );
        }
        s
    }

    /// The markdown report.
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        let r = &self.run;
        let _ = writeln!(s, "# `shale bench suite {}` (seed {})\n", r.suite, r.seed);
        let _ = writeln!(
            s,
            "Generated by `shale bench suite {} --seed {} --out DIR`. Capacity drive {}, \
             8 tenants with one job each at queue depth {}, cache 5% of the capacity. \
             Every figure comes from the simulated drives (docs/flash-model.md) and the \
             bottleneck model (docs/benchmarks.md); wall times are this machine's. Total \
             wall time {:.0} s.\n",
            r.suite,
            r.seed,
            shale_workload::format_size(r.capacity_bytes),
            r.queue_depth,
            r.wall_s
        );
        let _ = writeln!(
            s,
            "Columns: WAF per level (layer = capacity-drive writes / user writes, device = \
             NAND programs / drive writes, total = their product), the seed's published \
             total WAF where it gives one, emulated MiB/s per job (of the writing jobs in \
             mixed workloads) and the seed's, the L2P page-cache hit rate (Shale), GiB \
             written to the cache drive, and the measured phase's wall time. `–`: not \
             applicable or not published. `opencas-model` and `dmzoned-model` are models \
             of Open-CAS and dm-zoned (docs/benchmarks.md), not the real systems.\n"
        );
        let _ = writeln!(s, "## Orderings the seeds report\n");
        for c in &self.checks {
            let _ = writeln!(
                s,
                "- {} {} — {}",
                if c.holds { "✅" } else { "❌" },
                c.name,
                c.detail
            );
        }
        for e in &self.experiments {
            let _ = writeln!(s, "\n## {}\n\n{}\n", e.title, e.setup);
            let (v, rd) = shape(e);
            let header = table_header(v, rd);
            if !e.rows.is_empty() {
                let _ = writeln!(s, "| {} |", header.join(" | "));
                let _ = writeln!(s, "|{}", " --- |".repeat(header.len()));
            }
            for row in &e.rows {
                let _ = writeln!(s, "| {} |", table_cells(row, v, rd).join(" | "));
            }
            let sources: Vec<&str> = {
                let mut v: Vec<&str> = e.rows.iter().filter_map(|r| r.seed_source).collect();
                v.dedup();
                v
            };
            if !sources.is_empty() {
                let _ = writeln!(s, "\nSeed figures: {}.", sources.join(", "));
            }
            if !e.comparisons.is_empty() {
                let _ = writeln!(
                    s,
                    "\n| figure | ours | seed | where |\n| --- | --- | --- | --- |"
                );
                for c in &e.comparisons {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:.2} | {} |",
                        c.what,
                        fmt_opt(c.ours, 2),
                        c.seed,
                        c.source
                    );
                }
            }
            if !e.series.is_empty() {
                let _ = writeln!(s, "\n| system | mean MiB/s by cause |\n| --- | --- |");
                for l in &e.series {
                    let means: Vec<String> = l
                        .mean_mib_s
                        .iter()
                        .map(|(n, v)| format!("{n} {v:.1}"))
                        .collect();
                    let _ = writeln!(s, "| {} | {} |", l.system, means.join(", "));
                }
            }
            for p in &e.plots {
                let _ = writeln!(s, "\n![{}]({})", e.id, p);
            }
        }
        let _ = writeln!(s, "\n## Sessions\n\n| system | variant | points | precondition s | wall s |\n| --- | --- | --- | --- | --- |");
        for l in &r.sessions {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.1} | {:.1} |",
                l.system, l.variant, l.points, l.precondition_wall_s, l.wall_s
            );
        }
        s
    }

    /// Draws the charts into `dir` and records their names in the experiments.
    pub fn draw_plots(&mut self, dir: &Path) -> Result<Vec<PathBuf>, PlotError> {
        let mut written = Vec::new();
        let charts = self.charts();
        for (id, file, chart) in charts {
            let path = dir.join(&file);
            plot::draw(&chart, &path)?;
            written.push(path);
            if let Some(e) = self.experiments.iter_mut().find(|e| e.id == id) {
                e.plots.push(file);
            }
        }
        Ok(written)
    }

    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn charts(&self) -> Vec<(&'static str, String, Chart)> {
        let mut out = Vec::new();
        let by_system = |e: &Experiment,
                         x: &dyn Fn(&Row) -> Option<f64>,
                         y: &dyn Fn(&Row) -> Option<f64>|
         -> Vec<Line> {
            let mut lines: Vec<Line> = Vec::new();
            for r in &e.rows {
                let (Some(xv), Some(yv)) = (x(r), y(r)) else {
                    continue;
                };
                let label = if r.variant == "standard" {
                    r.system.clone()
                } else {
                    format!("{} ({})", r.system, r.variant)
                };
                match lines.iter_mut().find(|l| l.label == label) {
                    Some(l) => l.points.push((xv, yv)),
                    None => lines.push(Line {
                        label,
                        points: vec![(xv, yv)],
                    }),
                }
            }
            lines
        };
        let bs_of = |r: &Row| -> Option<f64> {
            let k = r.point.rsplit('-').next()?.trim_end_matches('k');
            k.parse::<f64>().ok()
        };
        for id in ["fig10-random", "fig10-seq"] {
            if let Some(e) = self.experiments.iter().find(|e| e.id == id) {
                out.push((
                    e.id,
                    format!("{id}.png"),
                    Chart {
                        title: e.title.to_string(),
                        x_label: "block size (KiB)".into(),
                        y_label: "emulated MiB/s per job".into(),
                        x_log: true,
                        y_log: true,
                        x_names: Vec::new(),
                        lines: by_system(e, &bs_of, &|r| r.mib_s_per_job),
                    },
                ));
                out.push((
                    e.id,
                    format!("{id}-waf.png"),
                    Chart {
                        title: format!("{} — total WAF", e.id),
                        x_label: "block size (KiB)".into(),
                        y_label: "total WAF".into(),
                        x_log: true,
                        y_log: true,
                        x_names: Vec::new(),
                        lines: by_system(e, &bs_of, &|r| r.waf_total),
                    },
                ));
            }
        }
        if let Some(e) = self.experiments.iter().find(|e| e.id == "fig11-15") {
            let names = ["uniform", "zipf0.8", "zipf1.2"];
            for bs in ["4k", "64k"] {
                let x = |r: &Row| -> Option<f64> {
                    let (d, b) = r.point.split_once('-')?;
                    (b == bs).then(|| names.iter().position(|n| *n == d).map(|i| i as f64))?
                };
                for (what, y, log) in [
                    (
                        "total WAF",
                        (|r: &Row| r.waf_total) as fn(&Row) -> Option<f64>,
                        true,
                    ),
                    ("emulated MiB/s per job", |r: &Row| r.mib_s_per_job, true),
                ] {
                    out.push((
                        e.id,
                        format!(
                            "fig11-15-{bs}-{}.png",
                            if what.contains("WAF") { "waf" } else { "mibs" }
                        ),
                        Chart {
                            title: format!("Figures 11/15, {bs} random writes: {what}"),
                            x_label: "skew".into(),
                            y_label: what.into(),
                            x_log: false,
                            y_log: log,
                            x_names: names.iter().map(|n| n.to_string()).collect(),
                            lines: by_system(e, &x, &y),
                        },
                    ));
                }
            }
        }
        for id in ["fig16", "fig17"] {
            if let Some(e) = self.experiments.iter().find(|e| e.id == id) {
                for l in &e.series {
                    let lines = l
                        .mib_s
                        .iter()
                        .map(|(name, v)| Line {
                            label: name.clone(),
                            points: l.t_s.iter().copied().zip(v.iter().copied()).collect(),
                        })
                        .collect();
                    out.push((
                        e.id,
                        format!("{id}-{}.png", l.system),
                        Chart {
                            title: format!("{}: {}", e.id, l.system),
                            x_label: "emulated time (s)".into(),
                            y_label: "MiB/s written".into(),
                            x_log: false,
                            y_log: false,
                            x_names: Vec::new(),
                            lines,
                        },
                    ));
                }
            }
        }
        if let Some(e) = self.experiments.iter().find(|e| e.id == "fig19") {
            let mut lines: Vec<Line> = Vec::new();
            for r in &e.rows {
                let pages = self
                    .run
                    .get(&r.system, variant_of(r.variant), &r.point)
                    .and_then(|p| p.report.l2p.map(|l| l.cache_pages_max as f64));
                let (Some(x), Some(y)) = (pages, r.mib_s_per_job) else {
                    continue;
                };
                match lines.iter_mut().find(|l| l.label == r.point) {
                    Some(l) => l.points.push((x, y)),
                    None => lines.push(Line {
                        label: r.point.clone(),
                        points: vec![(x, y)],
                    }),
                }
            }
            out.push((
                e.id,
                "fig19.png".into(),
                Chart {
                    title: e.title.to_string(),
                    x_label: "L2P page-cache budget (pages)".into(),
                    y_label: "emulated MiB/s per job".into(),
                    x_log: true,
                    y_log: false,
                    x_names: Vec::new(),
                    lines,
                },
            ));
        }
        if let Some(e) = self.experiments.iter().find(|e| e.id == "004-fig8") {
            let theta = |r: &Row| -> Option<f64> {
                r.point
                    .strip_prefix("zipf")?
                    .split_once('-')?
                    .0
                    .parse::<f64>()
                    .ok()
            };
            out.push((
                e.id,
                "004-fig8.png".into(),
                Chart {
                    title: e.title.to_string(),
                    x_label: "zipf theta".into(),
                    y_label: "emulated MiB/s per job".into(),
                    x_log: false,
                    y_log: true,
                    x_names: Vec::new(),
                    lines: by_system(e, &theta, &|r| r.mib_s_per_job),
                },
            ));
        }
        out
    }
}

fn variant_of(name: &str) -> Variant {
    match name {
        "isolation-off" => Variant::IsolationOff,
        "l2p-min" => Variant::L2pMin,
        "l2p-full" => Variant::L2pFull,
        _ => Variant::Standard,
    }
}

/// The bench report of a point (for tools that want every figure).
pub fn report_of<'a>(run: &'a SuiteRun, system: &str, point: &str) -> Option<&'a BenchReport> {
    run.get(system, Variant::Standard, point).map(|r| &r.report)
}
