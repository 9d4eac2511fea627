//! SALSA's mixed-workload experiment (seed 002 §V-D, Table III) over Shale: a database
//! volume (8 KiB writes, skewed) and an object-store volume (128 KiB objects written in
//! order) on one pool. SALSA ran them under one controller (4 KiB pages, one allocator)
//! and under two (8 KiB pages for the database, dual mapping for the objects, separate
//! allocators) and reported 60% less DRAM for the maps and 28% less relocation traffic.
//! Here a controller's page size is a volume's mapping unit, dual mapping is
//! `VolumeLayout::dual`, and an allocator is a placement stream. A third setup separates
//! the streams only, which tells the two effects apart. Every setup has the same volumes,
//! workload and seed; only the layouts and streams differ.

use std::fmt::Write as _;

use serde::Serialize;
use shale_engine::VolumeLayout;
use shale_workload::{format_size, Distribution};

use crate::report::BenchReport;
use crate::runner::{measure, precondition, GroupSpec, MixSpec, NoProgress};
use crate::setups::{experiment_config, run_all, volume_bytes_of, ExperimentError};
use crate::shale::{build_shale, ShaleConfig, ShaleMode};
use crate::{BenchConfig, Scale, SetupError};

/// The database's write size (SALSA's MySQL page).
pub const DB_BLOCK_BYTES: u64 = 8 << 10;
/// The object store's write size (SALSA's Swift PUTs of 128 KiB objects).
pub const OBJECT_BLOCK_BYTES: u64 = 128 << 10;
/// The database's skew.
pub const DB_WORKLOAD: &str = "zipf:0.8";

/// How a setup maps and places the two volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// One controller: both volumes in 4 KiB maps, their data in one stream.
    Single,
    /// Both volumes in 4 KiB maps, each in a stream of its own.
    Streams,
    /// A controller per workload: the database in 8 KiB units, the objects dual mapped
    /// in 64 KiB units, each volume in a stream of its own.
    Dual,
}

impl Setup {
    pub const ALL: [Setup; 3] = [Setup::Single, Setup::Streams, Setup::Dual];

    pub fn name(self) -> &'static str {
        match self {
            Setup::Single => "single",
            Setup::Streams => "streams",
            Setup::Dual => "dual",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Setup::Single => "4 KiB maps, one stream",
            Setup::Streams => "4 KiB maps, a stream each",
            Setup::Dual => "db 8 KiB units, objects dual 64 KiB, a stream each",
        }
    }

    fn streams(self) -> u32 {
        match self {
            Setup::Single => 1,
            Setup::Streams | Setup::Dual => 2,
        }
    }

    fn layouts(self) -> Result<Vec<VolumeLayout>, SetupError> {
        let bad = |reason: String| SetupError::EngineAdmin {
            step: "layout",
            reason,
        };
        Ok(match self {
            Setup::Single | Setup::Streams => vec![VolumeLayout::default(); 2],
            Setup::Dual => vec![
                VolumeLayout::with_map_unit(DB_BLOCK_BYTES).map_err(bad)?,
                VolumeLayout {
                    dual: true,
                    ..VolumeLayout::with_map_unit(64 << 10).map_err(bad)?
                },
            ],
        })
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllersOptions {
    pub scale: Scale,
    pub seed: u64,
    /// Override the configuration's capacity (tests).
    pub capacity_bytes: Option<u64>,
    /// Setups run at once.
    pub jobs: usize,
    /// The object store's write pattern: `seq` (objects written in order, each pass
    /// over the volume replacing the last) or another distribution (objects replaced
    /// at random).
    pub objects: Distribution,
}

/// One setup's figures for the measured workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetupResult {
    pub setup: Setup,
    pub description: &'static str,
    /// Bytes of the two volumes' maps (SALSA's "DRAM overhead": its maps live in DRAM).
    pub l2p_table_bytes: u64,
    /// L2P pages read from the cache device (page-cache misses).
    pub l2p_page_reads: u64,
    /// Bytes GC rewrote (SALSA's relocation traffic).
    pub gc_bytes: u64,
    /// Bytes compaction wrote to the capacity tier.
    pub compaction_bytes: u64,
    pub user_written: u64,
    /// GC bytes per user byte.
    pub relocation_per_user: Option<f64>,
    pub layer_waf: Option<f64>,
    pub report: BenchReport,
}

/// Every setup, and the dual setup against the single one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ControllersReport {
    pub config: String,
    pub seed: u64,
    pub volume_bytes: u64,
    pub db: String,
    pub objects: String,
    pub setups: Vec<SetupResult>,
    /// 1 − dual / single, of the maps' bytes (SALSA: 0.60).
    pub dram_cut: Option<f64>,
    /// 1 − dual / single, of GC's bytes (SALSA: 0.28).
    pub relocation_cut: Option<f64>,
    /// 1 − streams / single, of GC's bytes: what separating the data alone gives.
    pub relocation_cut_streams: Option<f64>,
}

fn shale_config(
    cfg: &BenchConfig,
    setup: Setup,
    volume_bytes: Option<u64>,
) -> Result<ShaleConfig, SetupError> {
    Ok(ShaleConfig {
        queue_depth: cfg.queue_depth,
        streams: setup.streams(),
        tenant_layouts: setup.layouts()?,
        volume_bytes,
        ..ShaleConfig::standard(ShaleMode::Zns, cfg.capacity_bytes, cfg.tenants)
    })
}

fn mix(seed: u64, objects: &Distribution) -> MixSpec {
    let db: Distribution = DB_WORKLOAD.parse().unwrap_or(Distribution::Uniform);
    MixSpec {
        name: "db + objects".into(),
        groups: vec![
            GroupSpec {
                tenants: 1,
                workload: db.into(),
                block_bytes: DB_BLOCK_BYTES,
                read_pct: 0,
                // A request per turn beside the objects': a sixteenth of their bytes.
                background: true,
            },
            GroupSpec {
                tenants: 1,
                workload: objects.clone().into(),
                block_bytes: OBJECT_BLOCK_BYTES,
                read_pct: 0,
                background: false,
            },
        ],
        seed,
    }
}

fn run_setup(
    cfg: &BenchConfig,
    setup: Setup,
    volume_bytes: u64,
    opts: &ControllersOptions,
) -> Result<SetupResult, ExperimentError> {
    let seed = opts.seed;
    let name = setup.name();
    let sc =
        shale_config(cfg, setup, Some(volume_bytes)).map_err(|source| ExperimentError::Setup {
            setup: name,
            source,
        })?;
    let mut sut = build_shale(&sc).map_err(|source| ExperimentError::Setup {
        setup: name,
        source,
    })?;
    let run_err = |source| ExperimentError::Run {
        setup: name,
        source: Box::new(source),
    };
    precondition(sut.as_mut(), cfg, seed, &mut NoProgress).map_err(run_err)?;
    let o = measure(
        sut.as_mut(),
        cfg,
        &mix(seed, &opts.objects),
        None,
        &mut NoProgress,
    )
    .map_err(run_err)?;
    let report = BenchReport::from_outcome(&o);
    let traffic = |n: &str| {
        o.traffic
            .iter()
            .find(|t| t.name == n)
            .map_or(0, |t| t.bytes)
    };
    let gc_bytes = traffic("gc");
    let user_written = o.user.write_bytes;
    let l2p = o.l2p.unwrap_or_default();
    Ok(SetupResult {
        setup,
        description: setup.describe(),
        l2p_table_bytes: l2p.table_bytes,
        l2p_page_reads: l2p.page_reads,
        gc_bytes,
        compaction_bytes: traffic("compaction"),
        user_written,
        relocation_per_user: (user_written > 0).then(|| gc_bytes as f64 / user_written as f64),
        layer_waf: report.waf.layer,
        report,
    })
}

fn cut(
    of: impl Fn(&SetupResult) -> u64,
    setups: &[SetupResult],
    a: Setup,
    b: Setup,
) -> Option<f64> {
    let get = |s| setups.iter().find(|r| r.setup == s).map(&of);
    match (get(a), get(b)) {
        (Some(x), Some(base)) if base > 0 => Some(1.0 - x as f64 / base as f64),
        _ => None,
    }
}

/// Runs every setup (up to `opts.jobs` at once) and compares them.
pub fn run_controllers(opts: &ControllersOptions) -> Result<ControllersReport, ExperimentError> {
    let cfg = experiment_config(opts.scale, opts.capacity_bytes, 2)?;
    // The volumes' size: what the dual setup makes (a seventeenth smaller than an
    // even split, for its maps' room), for every setup alike.
    let dual = Setup::Dual.name();
    let dual_config =
        shale_config(&cfg, Setup::Dual, None).map_err(|source| ExperimentError::Setup {
            setup: dual,
            source,
        })?;
    let volume_bytes = volume_bytes_of(dual, &dual_config)?;
    let jobs = opts.jobs.max(1);
    let results = run_all(&Setup::ALL, jobs, Setup::name, |setup| {
        run_setup(&cfg, setup, volume_bytes, opts)
    })?;
    let table = |r: &SetupResult| r.l2p_table_bytes;
    let gc = |r: &SetupResult| r.gc_bytes;
    Ok(ControllersReport {
        config: cfg.name.clone(),
        seed: opts.seed,
        volume_bytes,
        db: format!("{DB_WORKLOAD} {}", format_size(DB_BLOCK_BYTES)),
        objects: format!("{} {}", opts.objects, format_size(OBJECT_BLOCK_BYTES)),
        dram_cut: cut(table, &results, Setup::Dual, Setup::Single),
        relocation_cut: cut(gc, &results, Setup::Dual, Setup::Single),
        relocation_cut_streams: cut(gc, &results, Setup::Streams, Setup::Single),
        setups: results,
    })
}

impl ControllersReport {
    /// The terminal table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "SALSA's two controllers (seed 002 §V-D) on Shale: config {}, seed {}, two volumes of {}",
            self.config,
            self.seed,
            format_size(self.volume_bytes)
        );
        let _ = writeln!(
            s,
            "  db: {} writes; objects: {} writes\n",
            self.db, self.objects
        );
        let _ = writeln!(
            s,
            "{:<8} {:<50} {:>12} {:>12} {:>12} {:>8} {:>8}",
            "setup", "maps and streams", "L2P bytes", "page reads", "GC bytes", "GC/user", "WAF"
        );
        for r in &self.setups {
            let _ = writeln!(
                s,
                "{:<8} {:<50} {:>12} {:>12} {:>12} {:>8} {:>8}",
                r.setup.name(),
                r.description,
                r.l2p_table_bytes,
                r.l2p_page_reads,
                r.gc_bytes,
                r.relocation_per_user
                    .map_or("-".into(), |x| format!("{x:.3}")),
                r.layer_waf.map_or("-".into(), |x| format!("{x:.3}")),
            );
        }
        let pct = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.1}%", x * 100.0));
        let _ = writeln!(
            s,
            "\ndual against single: maps −{} (SALSA −60%), GC traffic −{} (SALSA −28%); streams alone: GC −{}",
            pct(self.dram_cut),
            pct(self.relocation_cut),
            pct(self.relocation_cut_streams)
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At the `tiny` scale's shape (256 MiB): the dual setup's maps are smaller than the single one's by
    /// at least what its units give (the objects' map at a sixteenth, the database's
    /// at half, before page rounding), and every setup wrote the same user bytes.
    #[test]
    fn the_dual_setup_maps_in_less_and_writes_the_same() {
        let opts = ControllersOptions {
            scale: Scale::Tiny,
            seed: 3,
            // Zones of 2 MiB: a 64 KiB unit needs more than one group per zone.
            capacity_bytes: Some(256 << 20),
            jobs: 3,
            objects: Distribution::Seq,
        };
        let r = run_controllers(&opts).expect("runs");
        assert_eq!(r.setups.len(), 3);
        let single = &r.setups[0];
        for s in &r.setups {
            assert_eq!(s.user_written, single.user_written, "{:?}", s.setup);
            assert!(s.user_written > 0);
        }
        let dual = &r.setups[2];
        assert!(
            dual.l2p_table_bytes * 10 <= single.l2p_table_bytes * 6,
            "dual {} single {}",
            dual.l2p_table_bytes,
            single.l2p_table_bytes
        );
        assert_eq!(r.setups[1].l2p_table_bytes, single.l2p_table_bytes);
        let text = r.render();
        assert!(text.contains("dual against single"), "{text}");
    }
}
