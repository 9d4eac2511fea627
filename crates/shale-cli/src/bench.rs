//! `shale bench`: benchmarks on simulated drives (docs/benchmarks.md).

use std::io::IsTerminal;

use anyhow::Context;
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use shale_bench::suite::{run_suite, NoSuiteProgress, SuiteOptions, SuiteProgress};
use shale_bench::{
    build_system, check_spec, BenchConfig, BenchReport, NoProgress, Progress, RunSpec, Scale,
    SystemKind, SystemOptions, DEFAULT_HOST_SPARE_PCT,
};
use shale_workload::parse_size;

#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Precondition a system, then measure one workload: write amplification and
    /// emulated throughput.
    Run(RunArgs),
    /// Rerun the seeds' experiments over every system: tables with the published
    /// figures beside ours, JSON, PNG charts and a markdown report.
    Suite(SuiteArgs),
    /// SALSA's video server on a hybrid pool: videos written in order, read with a
    /// skew, from an SMR disk alone and with the disk as the cold tier behind a ZNS
    /// QLC drive; read MiB/s side by side.
    Hybrid(HybridArgs),
    /// SALSA's two-controller experiment: a database volume and an object-store
    /// volume under one mapping and stream, and under one per workload (8 KiB units,
    /// dual 64 KiB units, a stream each): map bytes and GC traffic side by side.
    Controllers(ControllersArgs),
}

#[derive(Debug, Args)]
struct HybridArgs {
    /// Standard configuration: paper (4 GiB) or quick (1/8 of it).
    #[arg(long, default_value = "quick", value_parser = parse_suite_scale)]
    config: Scale,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Percent of the zones on the SMR disk in the tiered setups (the rest on QLC).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=90))]
    cold_pct: u8,
    /// Setups run at once (default: the number of CPUs, at most 3).
    #[arg(long)]
    jobs: Option<usize>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Override the configuration's capacity (same shape, other size; for tests).
    #[arg(long, value_parser = parse_capacity, hide = true)]
    capacity: Option<u64>,
}

#[derive(Debug, Args)]
struct ControllersArgs {
    /// Standard configuration: paper (4 GiB) or quick (1/8 of it).
    #[arg(long, default_value = "quick", value_parser = parse_suite_scale)]
    config: Scale,
    /// Seed of every random stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Setups run at once (default: the number of CPUs, at most 3).
    #[arg(long)]
    jobs: Option<usize>,
    /// The object store's writes: seq (objects written in order, each pass over the
    /// volume replacing the last; the default), uniform or zipf:THETA (objects
    /// replaced at random).
    #[arg(long, default_value = "seq")]
    objects: shale_workload::Distribution,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Override the configuration's capacity (same shape, other size; for tests).
    #[arg(long, value_parser = parse_capacity, hide = true)]
    capacity: Option<u64>,
}

#[derive(Debug, Args)]
struct SuiteArgs {
    /// quick (512 MiB capacity, CI) or paper (4 GiB).
    #[arg(value_parser = parse_suite_scale)]
    scale: Scale,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Write report.md, suite.json and the PNG charts into this directory.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Seed of every random stream; equal seeds give equal counts.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Sessions run at once (default: the number of CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Only these systems (comma-separated labels, e.g. raw-qlc,shale-zns).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn parse_suite_scale(s: &str) -> Result<Scale, String> {
    match s.parse::<Scale>() {
        Ok(Scale::Tiny) => Err("suites are quick or paper".into()),
        Ok(scale) => Ok(scale),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    /// System under test: raw (tenants on partitions of the bare drive), opencas-model,
    /// dmzoned-model, shale-zns, shale-blk, raid-model (in-place RAID-5/6, md-like),
    /// raid5f-model (full-stripe-only array under a write-back cache).
    #[arg(long, value_parser = parse_system)]
    system: SystemKind,
    /// Preset of the capacity drive: qlc-p5316 (the default, but for shale-zns), tlc,
    /// optane or the disk hdd; for shale-zns a zoned one: zns-qlc (its default) or the
    /// host-managed SMR disk smr-hm.
    #[arg(long)]
    drive: Option<String>,
    /// Standard configuration: paper (4 GiB, 8 tenants) or quick (1/8 of it).
    #[arg(long, default_value = "quick", value_parser = parse_scale)]
    config: Scale,
    /// Workload: seq, uniform, random, zipf:THETA or zoned:A/R:A/R... (fio semantics),
    /// drift:THETA (zipf over a hot set that moves every 1/8 of the volume written), or
    /// trace:FILE (a block trace replayed by every tenant: MSR Cambridge, Alibaba or
    /// op,offset,len CSV, told apart by their fields; trace:msr:FILE,
    /// trace:alibaba:DEVICE:FILE... to name it).
    #[arg(long, value_parser = parse_access)]
    workload: shale_bench::Access,
    /// Block size of the measured workload (4k, 64KiB, 1m...).
    #[arg(long, value_parser = parse_block_size)]
    bs: u64,
    /// Percentage of operations that are reads.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=100))]
    read_pct: u8,
    /// Seed of every random stream; equal seeds give equal results.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Raw only: percentage of the drive left unpartitioned (the seeds used 10).
    #[arg(long, default_value_t = DEFAULT_HOST_SPARE_PCT, value_parser = clap::value_parser!(u8).range(0..=90))]
    host_spare_pct: u8,
    /// shale-zns and the raid models: capacity drives (more than 1 make an array with
    /// the single drive's data capacity).
    #[arg(long, default_value_t = 1)]
    capacity_devices: u32,
    /// How the capacity array keeps its data: none (striped), mirror, or K+M
    /// (Reed–Solomon on shale-zns, RAID-5/6 on the models; N must be K+M).
    #[arg(long, default_value = "none", value_parser = parse_redundancy)]
    capacity_redundancy: shale_array::Redundancy,
    /// shale-zns: cache drives; 2 or more are mirrors of one another.
    #[arg(long, default_value_t = 1)]
    cache_devices: u32,
    /// Shale: how GC chooses its victim zones: greedy (fewest valid blocks),
    /// cost-benefit (free space gained weighed by the zone's age), fifo (the zone
    /// opened first: erase units of a conventional drive empty whole), or auto (fifo
    /// on shale-blk, greedy on shale-zns).
    #[arg(long, default_value = "auto", value_parser = parse_gc)]
    gc: GcChoice,
    /// Shale: how compaction chooses its victim chunks: fifo (the oldest closed),
    /// fewest-valid, or cost-benefit (space freed weighed by the chunk's age).
    #[arg(long, default_value = "fifo", value_parser = parse_compaction)]
    compaction: shale_engine::CompactionPolicyKind,
    /// Shale: where compaction and GC put the blocks they move: volume (one stream per
    /// volume) or lifetime (per volume group, a stream per lifetime class).
    #[arg(long, default_value = "volume", value_parser = parse_placement)]
    placement: shale_engine::PlacementKind,
    /// Shale: placement streams (each holds a compaction and a GC zone open).
    #[arg(long, default_value_t = 8)]
    streams: u32,
    /// Shale: engine shards (1-64), each with drives of its own holding 1/N of the
    /// zones (plus its reserve, so the volumes are one shard's) and of the cache.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    shards: u32,
    /// Shale: writes of at least this size (e.g. 256k) go straight to a zone instead
    /// of through the cache; 0 sends every write through the cache.
    #[arg(long, default_value = "0", value_parser = parse_capacity)]
    direct_write_min: u64,
    /// Shale: which of those writes go to a zone: sequential (those that start where
    /// a large write of their volume ended) or any.
    #[arg(long, default_value = "sequential")]
    direct_write_policy: shale_engine::DirectWritePolicy,
    /// Shale: the tenants' volumes' mapping unit, 4k (the default) to 64k: their L2P
    /// is that many times smaller, and smaller writes rewrite a whole unit.
    /// [default: 4k, or 64k with --dual-map]
    #[arg(long, value_parser = parse_map_unit)]
    map_unit: Option<shale_engine::VolumeLayout>,
    /// Shale: the tenants' volumes are dual mapped: units (64k unless --map-unit
    /// says) with a sparse map of 4 KiB blocks over them. Their volumes are a
    /// seventeenth smaller (the maps may take a sixteenth more of the L2P pool).
    #[arg(long)]
    dual_map: bool,
    /// Shale: a cold tier behind the capacity drive, on this preset: the SMR disk
    /// smr-hm (zoned) or a conventional drive (hdd, qlc-p5316) under zone emulation.
    #[arg(long)]
    cold: Option<String>,
    /// Shale: percent of the capacity's zones on the cold drive (the pool keeps its
    /// size).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(1..=90))]
    cold_pct: u8,
    /// The workload's writes before measuring, in capacities of the drive (fio's
    /// ramp): the configuration's 1 unless set. Longer ramps show the steady state
    /// after the preconditioned one.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=64))]
    ramp: Option<u64>,
    /// The measured writes, in capacities of the drive: the configuration's 2 unless
    /// set.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=64))]
    measure: Option<u64>,
    /// Override the configuration's capacity (same shape, other size; for tests).
    #[arg(long, value_parser = parse_capacity, hide = true)]
    capacity: Option<u64>,
}

fn parse_map_unit(s: &str) -> Result<shale_engine::VolumeLayout, String> {
    let bytes = parse_capacity(s)?;
    shale_engine::VolumeLayout::with_map_unit(bytes)
}

fn parse_placement(s: &str) -> Result<shale_engine::PlacementKind, String> {
    match s {
        "volume" => Ok(shale_engine::PlacementKind::Volume),
        "lifetime" => Ok(shale_engine::PlacementKind::Lifetime),
        other => Err(format!(
            "unknown placement {other:?} (expected volume or lifetime)"
        )),
    }
}

/// `--gc`: a policy, or the one that suits the capacity drive.
#[derive(Debug, Clone, Copy)]
struct GcChoice(Option<shale_engine::GcPolicyKind>);

fn parse_gc(s: &str) -> Result<GcChoice, String> {
    let p = |k| Ok(GcChoice(Some(k)));
    match s {
        "auto" => Ok(GcChoice(None)),
        "greedy" => p(shale_engine::GcPolicyKind::Greedy),
        "cost-benefit" => p(shale_engine::GcPolicyKind::CostBenefit),
        "fifo" => p(shale_engine::GcPolicyKind::Fifo),
        other => Err(format!(
            "unknown GC policy {other:?} (expected auto, greedy, cost-benefit or fifo)"
        )),
    }
}

fn parse_compaction(s: &str) -> Result<shale_engine::CompactionPolicyKind, String> {
    match s {
        "fifo" => Ok(shale_engine::CompactionPolicyKind::FifoOldestClosed),
        "fewest-valid" => Ok(shale_engine::CompactionPolicyKind::FewestValid),
        "cost-benefit" => Ok(shale_engine::CompactionPolicyKind::CostBenefit),
        other => Err(format!(
            "unknown compaction policy {other:?} (expected fifo, fewest-valid or cost-benefit)"
        )),
    }
}

fn parse_system(s: &str) -> Result<SystemKind, String> {
    s.parse()
        .map_err(|e: shale_bench::SetupError| e.to_string())
}

fn parse_redundancy(s: &str) -> Result<shale_array::Redundancy, String> {
    s.parse()
        .map_err(|e: shale_array::LayoutError| e.to_string())
}

fn parse_scale(s: &str) -> Result<Scale, String> {
    s.parse()
        .map_err(|e: shale_bench::SetupError| e.to_string())
}

fn parse_access(s: &str) -> Result<shale_bench::Access, String> {
    s.parse()
        .map_err(|e: shale_bench::AccessError| e.to_string())
}

fn parse_block_size(s: &str) -> Result<u64, String> {
    match parse_size(s) {
        Ok(0) => Err("block size must be positive".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_capacity(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

pub fn main(args: BenchArgs) -> anyhow::Result<()> {
    match args.command {
        BenchCommand::Run(run) => run_cmd(run),
        BenchCommand::Suite(suite) => suite_cmd(suite),
        BenchCommand::Controllers(c) => controllers_cmd(c),
        BenchCommand::Hybrid(h) => hybrid_cmd(h),
    }
}

/// `--jobs`, or the CPUs, at most 3 (an experiment's setups).
fn setup_jobs(jobs: Option<usize>) -> usize {
    jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(std::num::NonZeroUsize::get)
            .unwrap_or(1)
            .min(3)
    })
}

fn hybrid_cmd(args: HybridArgs) -> anyhow::Result<()> {
    let jobs = setup_jobs(args.jobs);
    let opts = shale_bench::hybrid::HybridOptions {
        scale: args.config,
        seed: args.seed,
        cold_pct: args.cold_pct,
        capacity_bytes: args.capacity,
        jobs,
    };
    if !args.json {
        eprintln!("running 3 setups, {jobs} at a time ...");
    }
    let report =
        shale_bench::hybrid::run_hybrid(&opts).context("the hybrid-pool experiment failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

fn controllers_cmd(args: ControllersArgs) -> anyhow::Result<()> {
    let jobs = setup_jobs(args.jobs);
    let opts = shale_bench::controllers::ControllersOptions {
        scale: args.config,
        seed: args.seed,
        capacity_bytes: args.capacity,
        jobs,
        objects: args.objects,
    };
    if !args.json {
        eprintln!("running 3 setups, {jobs} at a time ...");
    }
    let report = shale_bench::controllers::run_controllers(&opts)
        .context("the two-controller experiment failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

/// An indicatif bar on stderr, one phase at a time.
struct Bar {
    bar: Option<ProgressBar>,
}

impl Progress for Bar {
    fn phase(&mut self, name: &str, total_bytes: u64) {
        let bar = ProgressBar::new(total_bytes);
        let style = ProgressStyle::with_template(
            "{msg:28} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_message(name.to_string());
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }

    fn finish_phase(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

/// One bar per running session, under an overall line.
struct SuiteBars {
    multi: indicatif::MultiProgress,
}

impl SuiteProgress for SuiteBars {
    fn session(&self, name: &str) -> Box<dyn Progress + Send> {
        Box::new(SessionBar {
            multi: self.multi.clone(),
            name: name.to_string(),
            bar: None,
        })
    }
}

struct SessionBar {
    multi: indicatif::MultiProgress,
    name: String,
    bar: Option<ProgressBar>,
}

impl Progress for SessionBar {
    fn phase(&mut self, name: &str, total_bytes: u64) {
        let bar = self.multi.add(ProgressBar::new(total_bytes));
        let style = ProgressStyle::with_template(
            "{prefix:28} {msg:36} [{bar:30}] {bytes}/{total_bytes} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(self.name.clone());
        bar.set_message(name.to_string());
        self.bar = Some(bar);
    }

    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }

    fn finish_phase(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
            self.multi.remove(&b);
        }
    }
}

fn suite_cmd(args: SuiteArgs) -> anyhow::Result<()> {
    let jobs = args.jobs.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(std::num::NonZeroUsize::get)
            .unwrap_or(1)
    });
    let opts = SuiteOptions {
        scale: args.scale,
        seed: args.seed,
        jobs,
        only: args.only.clone(),
    };
    let interactive = !args.json && std::io::stderr().is_terminal();
    let run = if interactive {
        let bars = SuiteBars {
            multi: indicatif::MultiProgress::new(),
        };
        run_suite(&opts, &bars)
    } else {
        run_suite(&opts, &NoSuiteProgress)
    }
    .context("running the suite")?;
    let mut report = shale_bench::experiments::build(run);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        report
            .draw_plots(dir)
            .with_context(|| format!("drawing charts into {}", dir.display()))?;
        let md = dir.join("report.md");
        std::fs::write(&md, report.to_markdown())
            .with_context(|| format!("writing {}", md.display()))?;
        let js = dir.join("suite.json");
        std::fs::write(&js, report.to_json() + "\n")
            .with_context(|| format!("writing {}", js.display()))?;
    }
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

fn run_cmd(args: RunArgs) -> anyhow::Result<()> {
    let mut cfg = BenchConfig::standard(args.config);
    if let Some(c) = args.capacity {
        cfg = cfg.with_capacity(c).context("--capacity")?;
    }
    cfg = cfg.with_phases(args.ramp, args.measure);
    let opts = SystemOptions {
        drive: args.drive.clone(),
        host_spare_pct: args.host_spare_pct,
        capacity_devices: args.capacity_devices,
        capacity_redundancy: args.capacity_redundancy,
        cache_devices: args.cache_devices,
        gc_policy: args.gc.0,
        compaction_policy: args.compaction,
        placement: args.placement,
        streams: args.streams,
        shards: args.shards,
        direct_write_min_bytes: args.direct_write_min,
        direct_write_policy: args.direct_write_policy,
        volume_layout: shale_daemon::serve::dual_layout(
            args.map_unit.unwrap_or_default(),
            args.dual_map,
            args.map_unit.is_some(),
        )
        .map_err(anyhow::Error::msg)?,
        cold: args.cold.clone().map(|preset| shale_bench::ColdTier {
            preset,
            pct: args.cold_pct,
        }),
        ..SystemOptions::default()
    };
    let mut sut = build_system(args.system, &cfg, &opts).with_context(|| {
        format!(
            "setting up system {} on drive {} ({} configuration)",
            args.system,
            args.drive.as_deref().unwrap_or("(its default)"),
            cfg.name
        )
    })?;
    let spec = RunSpec {
        workload: args.workload,
        block_bytes: args.bs,
        read_pct: args.read_pct,
        seed: args.seed,
    };
    check_spec(sut.as_ref(), &spec).context("checking the workload against the system")?;

    let interactive =
        !args.json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
    let outcome = if interactive {
        shale_bench::run(sut.as_mut(), &cfg, &spec, &mut Bar { bar: None })
    } else {
        shale_bench::run(sut.as_mut(), &cfg, &spec, &mut NoProgress)
    }
    .context("running the benchmark")?;
    let report = BenchReport::from_outcome(&outcome);
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}
