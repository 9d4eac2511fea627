//! `crashsim`: long crash-simulation runs.
//!
//! Runs `ceil(cycles / generations)` runs with seeds `seed, seed+1, ...`, each of
//! `generations` crash points, and prints what happened. A violation prints its seed;
//! `crashsim --seed <that seed> --cycles <generations> --generations <generations>
//! --mode <mode>` replays it exactly.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Result};
use clap::Parser;
use shale_sim::{run, Counts, Mode, RunReport, SimConfig};

#[derive(Debug, Parser)]
#[command(
    about = "Crash-simulate the Shale engine: seeded workloads, crashes, recoveries, an oracle"
)]
struct Args {
    /// Seed of the first run; run k uses seed + k.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Crash points in total (over all runs, per mode).
    #[arg(long, default_value_t = 2000)]
    cycles: u64,
    /// Crash points per run (generations of one engine, while it recovers).
    #[arg(long, default_value_t = 50)]
    generations: u32,
    /// crash, live, errors, kill, or all (each mode gets the full cycle count).
    #[arg(long, default_value = "crash")]
    mode: String,
    /// Runs in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Print a line per run.
    #[arg(long)]
    verbose: bool,
    /// Sequential passes over every volume after each format.
    #[arg(long)]
    prefill_passes: Option<u32>,
    /// Only this device geometry (tiny, wide).
    #[arg(long)]
    geometry: Option<String>,
    /// Percent of the user capacity given to the volumes made at format.
    #[arg(long)]
    fill_pct: Option<u32>,
    /// Workload iterations before a crash point is armed, at most.
    #[arg(long)]
    warmup_steps: Option<u32>,
    /// Only crash points whose name starts with this (e.g. `shutdown:`, `trip:l2p`,
    /// `when:gc`, `after-shutdown`).
    #[arg(long)]
    only: Option<String>,
    /// Print every crash point, crash and reopen (for diagnosing a replay).
    #[arg(long)]
    log: bool,
    /// Engine shards (1-64), each with devices of the run's geometry of its own.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    shards: u32,
    /// With several shards: one capacity device they share, free zones moved between
    /// them by the space manager at random moments.
    #[arg(long)]
    shared: bool,
    /// With several shards: one cache device too (each shard's metadata in a window
    /// of its own, the chunks shared and lent with the zones); implies --shared.
    #[arg(long)]
    shared_cache: bool,
    /// No direct writes (large writes straight to zones; by default in about a third
    /// of the runs).
    #[arg(long)]
    no_direct_writes: bool,
}

fn modes(s: &str) -> Result<Vec<Mode>> {
    if s == "all" {
        return Ok(vec![Mode::Crash, Mode::Live, Mode::Errors, Mode::Kill]);
    }
    match s.parse::<Mode>() {
        Ok(m) => Ok(vec![m]),
        Err(e) => bail!(e),
    }
}

fn run_mode(args: &Args, mode: Mode) -> (Counts, Vec<RunReport>, f64) {
    let mut cfg = SimConfig::fast(mode);
    cfg.generations = args.generations.max(1);
    if let Some(p) = args.prefill_passes {
        for g in cfg.geometries.iter_mut() {
            g.prefill_passes = p;
        }
    }
    if let Some(name) = &args.geometry {
        cfg.geometries.retain(|g| g.name == name);
    }
    if let Some(p) = args.fill_pct {
        for g in cfg.geometries.iter_mut() {
            g.volume_fill_pct = p.clamp(1, 100);
        }
    }
    cfg.only = args.only.clone();
    cfg.log = args.log;
    cfg.shards = args.shards;
    cfg.shared_capacity = args.shared;
    cfg.shared_cache = args.shared_cache;
    cfg.direct_writes = !args.no_direct_writes;
    if let Some(w) = args.warmup_steps {
        cfg.warmup_steps_max = w;
    }
    let runs = args.cycles.div_ceil(u64::from(cfg.generations)).max(1);
    let jobs = args.jobs.clamp(1, 64) as u64;
    let start = Instant::now();
    let mut reports: Vec<RunReport> = Vec::new();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..jobs)
            .map(|j| {
                let cfg = cfg.clone();
                let verbose = args.verbose;
                let base = args.seed;
                s.spawn(move || {
                    let mut out = Vec::new();
                    let mut k = j;
                    while k < runs {
                        let r = run(base.wrapping_add(k), &cfg);
                        if verbose {
                            eprintln!(
                                "seed {} {}: {} cycles, {} recovered, {} needs-recovery, {} clean, {} live, {:.2}s, trace {:016x}{}",
                                r.seed,
                                r.mode,
                                r.counts.cycles,
                                r.counts.recovered,
                                r.counts.needs_recovery,
                                r.counts.clean_reopens,
                                r.counts.live_checks,
                                r.elapsed.as_secs_f64(),
                                r.trace.0,
                                if r.violation.is_some() { "  VIOLATION" } else { "" }
                            );
                        }
                        if let Some(v) = &r.violation {
                            eprintln!("{v}");
                        }
                        out.push(r);
                        k += jobs;
                    }
                    out
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(mut v) => reports.append(&mut v),
                Err(_) => eprintln!("a worker thread panicked"),
            }
        }
    });
    reports.sort_by_key(|r| r.seed);
    let mut total = Counts::default();
    for r in &reports {
        total.add(&r.counts);
    }
    (total, reports, start.elapsed().as_secs_f64())
}

fn main() -> Result<ExitCode> {
    let args = Args::parse();
    let mut bad = 0usize;
    for mode in modes(&args.mode)? {
        let (total, reports, secs) = run_mode(&args, mode);
        let violations: Vec<_> = reports
            .iter()
            .filter_map(|r| r.violation.as_ref())
            .collect();
        println!(
            "mode {mode}: {} runs (seeds {}..={}), {} generations each, {:.1}s, {:.0} cycles/s",
            reports.len(),
            args.seed,
            args.seed + reports.len().saturating_sub(1) as u64,
            args.generations,
            secs,
            total.cycles as f64 / secs.max(1e-9)
        );
        println!("{total}");
        println!("violations: {}", violations.len());
        for v in &violations {
            println!("{v}");
        }
        bad += violations.len();
    }
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
