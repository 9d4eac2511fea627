//! `arraysim`: long runs of the array simulator (device loss as a fault).
//!
//! Runs `ceil(cycles / generations)` runs with seeds `seed, seed+1, ...`, each of
//! `generations` generations (each ends in a power cut or a clean stop, with members
//! lost, failing, missing, given garbage, replaced and rebuilt around them). A
//! violation prints its seed; `arraysim --seed <it> --cycles <generations>` replays it.

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use clap::Parser;
use shale_sim::array_sim::{self, ArrayCounts};

#[derive(Debug, Parser)]
#[command(
    about = "Simulate device loss under the Shale engine: arrays, crashes, rebuilds, an oracle"
)]
struct Args {
    /// Seed of the first run; run k uses seed + k.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Generations in total (over all runs).
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Generations per run.
    #[arg(long, default_value_t = 40)]
    generations: u32,
    /// Runs in parallel.
    #[arg(long, default_value_t = 1)]
    jobs: usize,
}

/// A progress line on stderr every this many runs.
const PROGRESS_RUNS: u64 = 25;

fn main() -> ExitCode {
    let a = Args::parse();
    let runs = a.cycles.div_ceil(u64::from(a.generations.max(1)));
    let next = AtomicU64::new(0);
    let done = AtomicU64::new(0);
    let total = Mutex::new(ArrayCounts::default());
    let failures = Mutex::new(Vec::new());
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..a.jobs.max(1) {
            s.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                if k >= runs {
                    return;
                }
                match array_sim::run(a.seed + k, a.generations) {
                    Ok(c) => total.lock().unwrap_or_else(|p| p.into_inner()).add(&c),
                    Err(e) => {
                        // Said at once: a long run's first violation is worth
                        // replaying before the run ends.
                        eprintln!("violation: {e}");
                        failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                    }
                }
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if d.is_multiple_of(PROGRESS_RUNS) {
                    let c = *total.lock().unwrap_or_else(|p| p.into_inner());
                    eprintln!(
                        "{d} of {runs} runs, {} violations, {:.0}s: {} generations passed, {} power cuts, {} members failed live, {} missing, {} garbage, {} cache garbage, {} rebuilds, {} cuts mid-rebuild, {} blocks verified",
                        failures.lock().map_or(0, |f| f.len()),
                        start.elapsed().as_secs_f64(),
                        c.generations,
                        c.crashes,
                        c.members_failed_live,
                        c.members_missing,
                        c.members_garbage,
                        c.cache_garbage,
                        c.rebuilds_completed,
                        c.crashes_mid_rebuild,
                        c.blocks_verified
                    );
                }
            });
        }
    });
    let c = *total.lock().unwrap_or_else(|p| p.into_inner());
    let secs = start.elapsed().as_secs_f64();
    println!(
        "array runs: {runs} (seeds {}..={}), {} generations each, {secs:.1}s, {:.0} generations/s",
        a.seed,
        a.seed + runs.saturating_sub(1),
        a.generations,
        c.generations as f64 / secs.max(1e-9)
    );
    println!(
        "generations {}  power cuts {}  clean stops {}  members failed live {}  missing {}  garbage {}  cache mirrors lost {}  cache mirrors given garbage {}",
        c.generations, c.crashes, c.clean_stops, c.members_failed_live, c.members_missing, c.members_garbage, c.cache_mirrors_lost, c.cache_garbage
    );
    println!(
        "replaced {}  rebuilds completed {}  cuts during a rebuild {}  blocks verified {}  blocks rebuilt after a checksum failure {}",
        c.replaced, c.rebuilds_completed, c.crashes_mid_rebuild, c.blocks_verified, c.rebuilt_reads
    );
    let f = failures.lock().unwrap_or_else(|p| p.into_inner());
    println!("violations: {}", f.len());
    for e in f.iter().take(20) {
        println!("  {e}");
    }
    if f.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
