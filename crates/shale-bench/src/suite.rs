//! `shale bench suite quick|paper`: the seeds' experiments over every system, on the
//! same workloads and the same simulated drives.
//!
//! The unit of work is a *session*: one system (with one set of options, a *variant*),
//! preconditioned once, then a list of workloads (*points*) in a fixed order, each with
//! its own ramp and measured phase (`runner::measure`). Experiments are tables that pick
//! results out of the sessions, so a workload several figures share (4 KiB uniform
//! random writes appear in Figures 10, 11, 15, 16 and seed 004's Figure 6) is measured
//! once per system. Sessions are independent and run on `jobs` threads; every figure
//! depends only on the seed, never on the thread count or the order they finish in.

use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use shale_workload::Distribution;

use crate::config::{BenchConfig, Scale, SetupError};
use crate::report::BenchReport;
use crate::runner::{measure, precondition, GroupSpec, MixSpec, Progress, Sample};
use crate::system::RunError;
use crate::{build_system, SystemKind, SystemOptions};

/// One system as the suites show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SuiteSystem {
    /// Name in tables and plots.
    pub label: &'static str,
    pub kind: SystemKind,
    /// Capacity drive preset (`raw`, `opencas-model`).
    pub drive: &'static str,
}

/// Every system of the suites, in table order.
pub const SUITE_SYSTEMS: [SuiteSystem; 6] = [
    SuiteSystem {
        label: "raw-qlc",
        kind: SystemKind::Raw,
        drive: "qlc-p5316",
    },
    SuiteSystem {
        label: "raw-tlc",
        kind: SystemKind::Raw,
        drive: "tlc",
    },
    SuiteSystem {
        label: "opencas-model",
        kind: SystemKind::OpenCasModel,
        drive: "qlc-p5316",
    },
    SuiteSystem {
        label: "dmzoned-model",
        kind: SystemKind::DmZonedModel,
        drive: "zns-qlc",
    },
    SuiteSystem {
        label: "shale-blk",
        kind: SystemKind::ShaleBlk,
        drive: "qlc-p5316",
    },
    SuiteSystem {
        label: "shale-zns",
        kind: SystemKind::ShaleZns,
        drive: "zns-qlc",
    },
];

/// Options of a Shale session that differ from the standard configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The standard configuration.
    Standard,
    /// One placement stream for every tenant: no user isolation (Figure 18).
    IsolationOff,
    /// The smallest L2P page cache the engine accepts (Figure 19's "non-cache").
    L2pMin,
    /// An L2P page cache holding the whole table (Figure 19's "full-cache").
    L2pFull,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::Standard => "standard",
            Variant::IsolationOff => "isolation-off",
            Variant::L2pMin => "l2p-min",
            Variant::L2pFull => "l2p-full",
        }
    }
}

/// A named measured workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub id: String,
    pub groups: Vec<GroupSpec>,
}

const KIB: u64 = 1024;
const TENANTS: u32 = 8;

fn dist(s: &str) -> Distribution {
    // Only called with the suite's own literal specs, which parse.
    s.parse().unwrap_or(Distribution::Uniform)
}

fn all(workload: &str, bs_kib: u64) -> Point {
    let name = match workload {
        "zipf:0.8" => "zipf0.8".to_string(),
        "zipf:0.9" => "zipf0.9".to_string(),
        "zipf:1.1" => "zipf1.1".to_string(),
        "zipf:1.2" => "zipf1.2".to_string(),
        other => other.to_string(),
    };
    Point {
        id: format!("{name}-{bs_kib}k"),
        groups: vec![GroupSpec {
            tenants: TENANTS,
            workload: dist(workload).into(),
            block_bytes: bs_kib * KIB,
            read_pct: 0,
            background: false,
        }],
    }
}

fn group(tenants: u32, workload: &str, bs_kib: u64, read_pct: u8) -> GroupSpec {
    GroupSpec {
        tenants,
        workload: dist(workload).into(),
        block_bytes: bs_kib * KIB,
        read_pct,
        background: false,
    }
}

/// Figure 14 / seed 004 Figure 9: 7 tenants writing 4 KiB, 1 reading 64 KiB.
fn mix_w4k_r64k() -> Point {
    Point {
        id: "mix-w4k-r64k".into(),
        groups: vec![group(7, "uniform", 4, 0), group(1, "uniform", 64, 100)],
    }
}

/// Figure 14: 4 tenants writing 64 KiB, 4 reading 64 KiB.
fn mix_w64k_r64k() -> Point {
    Point {
        id: "mix-w64k-r64k".into(),
        groups: vec![group(4, "uniform", 64, 0), group(4, "uniform", 64, 100)],
    }
}

/// Figure 18's mixed workload: 4 tenants sequential, 4 uniform random.
fn mix_seq_rand(bs_kib: u64) -> Point {
    Point {
        id: format!("mix-seq-rand-{bs_kib}k"),
        groups: vec![group(4, "seq", bs_kib, 0), group(4, "uniform", bs_kib, 0)],
    }
}

/// One session of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionPlan {
    pub system: SuiteSystem,
    pub variant: Variant,
    pub points: Vec<Point>,
}

/// Block sizes of the Figure 10 sweep.
pub fn sweep_kib(scale: Scale) -> Vec<u64> {
    match scale {
        Scale::Paper => vec![4, 8, 16, 32, 64, 128],
        Scale::Quick | Scale::Tiny => vec![4, 16, 64, 128],
    }
}

/// Zipf θ of seed 004's Figure 8 (64 KiB).
pub fn fig8_thetas(scale: Scale) -> Vec<&'static str> {
    match scale {
        Scale::Paper => vec!["zipf:0.8", "zipf:0.9", "zipf:1.1", "zipf:1.2"],
        Scale::Quick | Scale::Tiny => vec!["zipf:0.8", "zipf:1.2"],
    }
}

/// The sessions of a suite, longest first.
pub fn plan(scale: Scale) -> Vec<SessionPlan> {
    let sweep = sweep_kib(scale);
    let fig10: Vec<Point> = sweep
        .iter()
        .map(|&k| all("seq", k))
        .chain(sweep.iter().map(|&k| all("uniform", k)))
        .collect();
    let mut skew = vec![all("zipf:0.8", 4), all("zipf:1.2", 4)];
    skew.extend(fig8_thetas(scale).into_iter().map(|t| all(t, 64)));
    let mixes = vec![
        mix_w4k_r64k(),
        mix_w64k_r64k(),
        mix_seq_rand(4),
        mix_seq_rand(64),
    ];
    let full: Vec<Point> = fig10.iter().chain(&skew).chain(&mixes).cloned().collect();
    let mut isolation = vec![mix_seq_rand(4), mix_seq_rand(64)];
    if scale == Scale::Paper {
        isolation.extend([all("uniform", 4), all("zipf:1.2", 4)]);
    }
    let l2p = vec![all("uniform", 4), all("zipf:1.2", 4)];
    let sys = |label: &str| {
        SUITE_SYSTEMS
            .iter()
            .copied()
            .find(|s| s.label == label)
            .unwrap_or(SUITE_SYSTEMS[0])
    };
    let session = |label: &str, variant: Variant, points: Vec<Point>| SessionPlan {
        system: sys(label),
        variant,
        points,
    };
    vec![
        session("shale-blk", Variant::Standard, full.clone()),
        session("shale-zns", Variant::Standard, full.clone()),
        session("shale-zns", Variant::IsolationOff, isolation),
        session("shale-zns", Variant::L2pMin, l2p.clone()),
        session("shale-zns", Variant::L2pFull, l2p),
        // The seeds left dm-zoned out of everything but Figures 10, 16 and 17 ("its
        // negligible performance"); its 4 KiB points are also the slowest to simulate.
        session("dmzoned-model", Variant::Standard, fig10),
        session("opencas-model", Variant::Standard, full.clone()),
        session("raw-qlc", Variant::Standard, full.clone()),
        session("raw-tlc", Variant::Standard, full),
    ]
}

/// What the suite runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct SuiteOptions {
    pub scale: Scale,
    pub seed: u64,
    /// Sessions run at once.
    pub jobs: usize,
    /// Only these systems (labels); empty means all.
    pub only: Vec<String>,
}

/// One measured point of one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointResult {
    /// System label (`raw-qlc`, `shale-zns`...).
    pub system: String,
    pub variant: &'static str,
    pub point: String,
    pub report: BenchReport,
    /// Counter samples over the measured phase (kept for the time-series figures).
    pub series: Vec<Sample>,
}

/// Wall time of one session.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionLine {
    pub system: String,
    pub variant: &'static str,
    pub points: usize,
    pub precondition_wall_s: f64,
    pub wall_s: f64,
}

/// Everything a suite measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SuiteRun {
    pub suite: &'static str,
    pub seed: u64,
    pub capacity_bytes: u64,
    pub tenants: u32,
    pub queue_depth: u32,
    pub sessions: Vec<SessionLine>,
    pub results: Vec<PointResult>,
    pub wall_s: f64,
    /// SALSA's two-controller experiment (`controllers.rs`), when the suite ran it.
    pub controllers: Option<crate::controllers::ControllersReport>,
    /// SALSA's video server on a hybrid pool (`hybrid.rs`), when the suite ran it.
    pub hybrid: Option<crate::hybrid::HybridReport>,
}

impl SuiteRun {
    /// The result of `point` for `system` in `variant`.
    pub fn get(&self, system: &str, variant: Variant, point: &str) -> Option<&PointResult> {
        self.results
            .iter()
            .find(|r| r.system == system && r.variant == variant.name() && r.point == point)
    }
}

/// Why a suite failed.
#[derive(Debug, thiserror::Error)]
pub enum SuiteError {
    #[error("setting up {system} ({variant})")]
    Setup {
        system: String,
        variant: &'static str,
        #[source]
        source: SetupError,
    },
    #[error("running {point} on {system} ({variant})")]
    Run {
        system: String,
        variant: &'static str,
        point: String,
        #[source]
        source: Box<RunError>,
    },
    #[error("unknown system {name:?} in --only (expected one of: {valid})")]
    UnknownSystem { name: String, valid: String },
    #[error("a worker thread panicked")]
    WorkerPanicked,
    #[error("a SALSA experiment (two controllers, hybrid pool) failed")]
    Controllers(#[source] Box<crate::setups::ExperimentError>),
}

/// Where a suite reports progress: one [`Progress`] per session, from its thread.
pub trait SuiteProgress: Sync {
    fn session(&self, name: &str) -> Box<dyn Progress + Send>;
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoSuiteProgress;

impl SuiteProgress for NoSuiteProgress {
    fn session(&self, _name: &str) -> Box<dyn Progress + Send> {
        Box::new(crate::runner::NoProgress)
    }
}

/// Samples per measured phase for the time-series figures.
const SAMPLES_PER_RUN: u64 = 64;
/// Points whose time series are kept (Figures 16 and 17).
pub const SERIES_POINTS: [&str; 2] = ["uniform-4k", "uniform-64k"];

fn options_for(s: &SuiteSystem, variant: Variant, cfg: &BenchConfig) -> SystemOptions {
    let mut o = SystemOptions {
        drive: Some(s.drive.to_string()),
        ..SystemOptions::default()
    };
    match variant {
        Variant::Standard => {}
        Variant::IsolationOff => o.streams = 1,
        // A few pages: 64 KiB (16 pages), twice the floor the engine accepts with 1 MiB
        // requests (8 pages; fewer cannot make progress).
        Variant::L2pMin => o.l2p_cache_bytes = Some(64 * KIB),
        Variant::L2pFull => {
            o.l2p_cache_bytes = Some(crate::ShaleConfig::l2p_table_bytes(cfg.capacity_bytes))
        }
    }
    o
}

type SessionOut = (usize, SessionLine, Vec<PointResult>);

fn run_session(
    index: usize,
    plan: &SessionPlan,
    cfg: &BenchConfig,
    seed: u64,
    progress: &dyn SuiteProgress,
) -> Result<SessionOut, SuiteError> {
    let label = plan.system.label;
    let variant = plan.variant.name();
    let started = Instant::now();
    let opts = options_for(&plan.system, plan.variant, cfg);
    let mut sut =
        build_system(plan.system.kind, cfg, &opts).map_err(|source| SuiteError::Setup {
            system: label.into(),
            variant,
            source,
        })?;
    let mut bar = progress.session(&format!("{label} ({variant})"));
    let run_err = |point: &str| {
        let point = point.to_string();
        move |source| SuiteError::Run {
            system: label.into(),
            variant,
            point,
            source: Box::new(source),
        }
    };
    let pre =
        precondition(sut.as_mut(), cfg, seed, bar.as_mut()).map_err(run_err("precondition"))?;
    let every = (cfg.capacity_bytes * cfg.measure_capacity_multiple / SAMPLES_PER_RUN).max(1);
    let mut results = Vec::with_capacity(plan.points.len());
    for p in &plan.points {
        let keep_series = SERIES_POINTS.contains(&p.id.as_str());
        let mix = MixSpec {
            name: p.id.clone(),
            groups: p.groups.clone(),
            seed,
        };
        let o = measure(
            sut.as_mut(),
            cfg,
            &mix,
            keep_series.then_some(every),
            bar.as_mut(),
        )
        .map_err(run_err(&p.id))?;
        let mut report = BenchReport::from_outcome(&o);
        report.system = label.into();
        results.push(PointResult {
            system: label.into(),
            variant,
            point: p.id.clone(),
            report,
            series: o.series,
        });
    }
    Ok((
        index,
        SessionLine {
            system: label.into(),
            variant,
            points: plan.points.len(),
            precondition_wall_s: pre.as_secs_f64(),
            wall_s: started.elapsed().as_secs_f64(),
        },
        results,
    ))
}

/// Runs the suite's sessions on `opts.jobs` threads.
pub fn run_suite(
    opts: &SuiteOptions,
    progress: &dyn SuiteProgress,
) -> Result<SuiteRun, SuiteError> {
    let cfg = BenchConfig::standard(opts.scale);
    let mut run = run_suite_with(opts, &cfg, plan(opts.scale), progress)?;
    if opts.only.is_empty() || opts.only.iter().any(|o| o == "shale-zns") {
        let started = Instant::now();
        let c = crate::controllers::run_controllers(&crate::controllers::ControllersOptions {
            scale: opts.scale,
            seed: opts.seed,
            capacity_bytes: None,
            jobs: opts.jobs.clamp(1, 3),
            objects: shale_workload::Distribution::Seq,
        })
        .map_err(|e| SuiteError::Controllers(Box::new(e)))?;
        run.controllers = Some(c);
        let h = crate::hybrid::run_hybrid(&crate::hybrid::HybridOptions {
            scale: opts.scale,
            seed: opts.seed,
            cold_pct: 50,
            capacity_bytes: None,
            jobs: opts.jobs.clamp(1, 3),
        })
        .map_err(|e| SuiteError::Controllers(Box::new(e)))?;
        run.hybrid = Some(h);
        run.wall_s += started.elapsed().as_secs_f64();
    }
    Ok(run)
}

/// Runs `sessions` with configuration `cfg` (tests use smaller ones).
pub fn run_suite_with(
    opts: &SuiteOptions,
    cfg: &BenchConfig,
    sessions: Vec<SessionPlan>,
    progress: &dyn SuiteProgress,
) -> Result<SuiteRun, SuiteError> {
    for name in &opts.only {
        if !SUITE_SYSTEMS.iter().any(|s| s.label == name) {
            return Err(SuiteError::UnknownSystem {
                name: name.clone(),
                valid: SUITE_SYSTEMS.map(|s| s.label).join(", "),
            });
        }
    }
    let started = Instant::now();
    let sessions: Vec<(usize, SessionPlan)> = sessions
        .into_iter()
        .filter(|s| opts.only.is_empty() || opts.only.iter().any(|o| o == s.system.label))
        .enumerate()
        .collect();
    let queue = Mutex::new(sessions.clone());
    let done: Mutex<Vec<Result<SessionOut, SuiteError>>> = Mutex::new(Vec::new());
    let jobs = opts.jobs.clamp(1, sessions.len().max(1));
    let worker = || loop {
        // Sessions are taken in plan order: the longest first.
        let next = queue.lock().ok().and_then(|mut q| {
            if q.is_empty() {
                None
            } else {
                Some(q.remove(0))
            }
        });
        let Some((index, plan)) = next else {
            break;
        };
        let r = run_session(index, &plan, cfg, opts.seed, progress);
        let failed = r.is_err();
        if let Ok(mut d) = done.lock() {
            d.push(r);
        }
        if failed {
            // Stop handing out work; the error is reported once everyone stops.
            if let Ok(mut q) = queue.lock() {
                q.clear();
            }
        }
    };
    let panicked = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..jobs).map(|_| scope.spawn(worker)).collect();
        handles.into_iter().any(|h| h.join().is_err())
    });
    if panicked {
        return Err(SuiteError::WorkerPanicked);
    }
    let mut outs = Vec::new();
    for r in done.into_inner().map_err(|_| SuiteError::WorkerPanicked)? {
        outs.push(r?);
    }
    outs.sort_by_key(|(i, _, _)| *i);
    let mut run = SuiteRun {
        suite: match opts.scale {
            Scale::Paper => "paper",
            Scale::Quick => "quick",
            Scale::Tiny => "tiny",
        },
        seed: opts.seed,
        capacity_bytes: cfg.capacity_bytes,
        tenants: cfg.tenants,
        queue_depth: cfg.queue_depth,
        sessions: Vec::new(),
        results: Vec::new(),
        wall_s: 0.0,
        controllers: None,
        hybrid: None,
    };
    for (_, line, results) in outs {
        run.sessions.push(line);
        run.results.extend(results);
    }
    run.wall_s = started.elapsed().as_secs_f64();
    Ok(run)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small_plan() -> Vec<SessionPlan> {
        let points = vec![all("uniform", 4), mix_w4k_r64k(), mix_seq_rand(4)];
        ["raw-qlc", "opencas-model", "dmzoned-model", "shale-zns"]
            .iter()
            .map(|label| SessionPlan {
                system: SUITE_SYSTEMS
                    .iter()
                    .copied()
                    .find(|s| s.label == *label)
                    .expect("listed"),
                variant: Variant::Standard,
                points: points.clone(),
            })
            .collect()
    }

    fn run(jobs: usize) -> SuiteRun {
        let opts = SuiteOptions {
            scale: Scale::Tiny,
            seed: 5,
            jobs,
            only: Vec::new(),
        };
        // 128 MiB: the smallest capacity whose 5% cache holds enough chunks.
        let mut cfg = BenchConfig::standard(Scale::Tiny)
            .with_capacity(128 << 20)
            .expect("in range");
        cfg.precondition = Some(crate::Precondition {
            random_capacity_multiple: 1,
            ..crate::Precondition::default()
        });
        run_suite_with(&opts, &cfg, small_plan(), &NoSuiteProgress).expect("suite")
    }

    #[test]
    fn counts_depend_on_the_seed_only_not_on_threads() {
        let (a, b) = (run(1), run(3));
        assert_eq!(a.results.len(), 12);
        for (x, y) in a.results.iter().zip(&b.results) {
            assert_eq!((&x.system, &x.point), (&y.system, &y.point));
            assert_eq!(x.report.bytes, y.report.bytes, "{} {}", x.system, x.point);
            assert_eq!(x.report.traffic, y.report.traffic);
            assert_eq!(x.series.len(), y.series.len());
        }
        // Series are kept for the time-series figures only.
        let u = a
            .get("shale-zns", Variant::Standard, "uniform-4k")
            .expect("point");
        assert!(u.series.len() > 10);
        assert!(a
            .get("shale-zns", Variant::Standard, "mix-w4k-r64k")
            .expect("point")
            .series
            .is_empty());
        // The mixed workload read while it wrote.
        let m = a
            .get("raw-qlc", Variant::Standard, "mix-w4k-r64k")
            .expect("point");
        assert!(m.report.bytes.user_read > 0 && m.report.bytes.user_written > 0);
    }

    #[test]
    fn reports_and_charts_render() {
        let run = run(2);
        let mut report = crate::experiments::build(run);
        let dir = tempfile::tempdir().expect("tempdir");
        let files = report.draw_plots(dir.path()).expect("plots");
        assert!(
            files.iter().any(|f| f.ends_with("fig16-shale-zns.png")),
            "{files:?}"
        );
        let md = report.to_markdown();
        assert!(md.contains("| shale-zns | uniform-4k |"), "{md}");
        assert!(md.contains("fig16-shale-zns.png"));
        assert!(report.to_text().contains("Orderings"));
        let v: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
        assert!(v.pointer("/run/results/0/report/waf/total").is_some());
        assert!(v.pointer("/experiments/0/rows").is_some());
    }

    #[test]
    fn unknown_systems_are_refused() {
        let opts = SuiteOptions {
            scale: Scale::Tiny,
            seed: 0,
            jobs: 1,
            only: vec!["floppy".into()],
        };
        assert!(matches!(
            run_suite(&opts, &NoSuiteProgress),
            Err(SuiteError::UnknownSystem { .. })
        ));
    }
}
