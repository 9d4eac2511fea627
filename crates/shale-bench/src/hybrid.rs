//! SALSA's video server on a hybrid pool (seed 002 §V-E, Table IV) over Shale: videos
//! written in order while readers fetch them with a skew, on a host-managed SMR disk
//! alone and on a pool whose cold tier is that disk behind a ZNS QLC drive
//! (docs/engine.md, "Tiers"). SALSA: 6.2 MiB/s of reads on the SMR disk, 118.5 with an
//! SSD holding the hot files (19.1×), writes 10 MiB/s in both. Here the disk's time is
//! the bottleneck model's (seeks and transfer), the same workload and seed in every
//! setup; a third setup keeps the tier but never brings blocks back, which tells what
//! promotion adds to where new data lands.

use std::fmt::Write as _;

use serde::Serialize;
use shale_workload::{format_size, Distribution};

use crate::report::BenchReport;
use crate::runner::{measure, precondition, GroupSpec, MixSpec, NoProgress};
use crate::setups::{experiment_config, run_all, volume_bytes_of, ExperimentError};
use crate::shale::{build_shale, ColdTier, ShaleConfig, ShaleMode};
use crate::{BenchConfig, Precondition, Scale};

/// A video's read and write size.
pub const VIDEO_BYTES: u64 = 1 << 20;
/// Readers beside the one writer.
pub const READERS: u32 = 7;
/// The readers' skew over the videos.
pub const READ_SKEW: &str = "zipf:1.2";

/// How a setup stores the videos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// The SMR disk alone.
    Smr,
    /// The SMR disk as the cold tier behind a ZNS QLC drive, blocks never promoted.
    TierOnly,
    /// The same, hot blocks promoted back to the fast tier.
    Hybrid,
}

impl Setup {
    pub const ALL: [Setup; 3] = [Setup::Smr, Setup::TierOnly, Setup::Hybrid];

    pub fn name(self) -> &'static str {
        match self {
            Setup::Smr => "smr",
            Setup::TierOnly => "tier-only",
            Setup::Hybrid => "hybrid",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridOptions {
    pub scale: Scale,
    pub seed: u64,
    /// Percent of the zones on the SMR disk in the tiered setups (the rest on QLC).
    pub cold_pct: u8,
    /// Override the configuration's capacity (tests).
    pub capacity_bytes: Option<u64>,
    /// Setups run at once.
    pub jobs: usize,
}

/// One setup's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SetupResult {
    pub setup: Setup,
    /// Read and write MiB/s of the bottleneck model (the busiest drive's time).
    pub read_mib_s: Option<f64>,
    pub write_mib_s: Option<f64>,
    /// Bytes the SMR disk served to reads, and its head moves (seeks).
    pub smr_read_bytes: u64,
    pub smr_head_moves: u64,
    /// Bytes staged back to the fast tier.
    pub promoted_bytes: u64,
    pub report: BenchReport,
}

/// Every setup, and the hybrid one against the disk alone.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HybridReport {
    pub config: String,
    pub seed: u64,
    pub cold_pct: u8,
    pub volume_bytes: u64,
    pub setups: Vec<SetupResult>,
    /// Read MiB/s, hybrid / SMR alone (SALSA: 19.1).
    pub read_speedup: Option<f64>,
}

fn bench_config(opts: &HybridOptions) -> Result<BenchConfig, ExperimentError> {
    let mut cfg = experiment_config(opts.scale, opts.capacity_bytes, READERS + 1)?;
    // Videos are written once, in order.
    cfg.precondition = Some(Precondition {
        seq_passes: 1,
        random_capacity_multiple: 0,
        ..Precondition::default()
    });
    Ok(cfg)
}

fn shale_config(cfg: &BenchConfig, setup: Setup, opts: &HybridOptions) -> ShaleConfig {
    let base = ShaleConfig {
        queue_depth: cfg.queue_depth,
        ..ShaleConfig::standard(ShaleMode::Zns, cfg.capacity_bytes, cfg.tenants)
    };
    let cold = Some(ColdTier {
        preset: "smr-hm".into(),
        pct: opts.cold_pct,
    });
    match setup {
        Setup::Smr => ShaleConfig {
            capacity_preset: Some("smr-hm".into()),
            ..base
        },
        Setup::TierOnly => ShaleConfig {
            cold,
            promote_reads: 0,
            ..base
        },
        Setup::Hybrid => ShaleConfig { cold, ..base },
    }
}

fn mix(seed: u64) -> MixSpec {
    let skew: Distribution = READ_SKEW.parse().unwrap_or(Distribution::Uniform);
    MixSpec {
        name: "video server".into(),
        groups: vec![
            GroupSpec {
                tenants: 1,
                workload: Distribution::Seq.into(),
                block_bytes: VIDEO_BYTES,
                read_pct: 0,
                // A new video a turn beside the readers' requests: the readers end
                // the phase.
                background: true,
            },
            GroupSpec {
                tenants: READERS,
                workload: skew.into(),
                block_bytes: VIDEO_BYTES,
                read_pct: 100,
                background: false,
            },
        ],
        seed,
    }
}

fn run_setup(
    cfg: &BenchConfig,
    setup: Setup,
    volume_bytes: Option<u64>,
    opts: &HybridOptions,
) -> Result<SetupResult, ExperimentError> {
    let name = setup.name();
    let sc = ShaleConfig {
        volume_bytes,
        ..shale_config(cfg, setup, opts)
    };
    let mut sut = build_shale(&sc).map_err(|source| ExperimentError::Setup {
        setup: name,
        source,
    })?;
    let run_err = |source| ExperimentError::Run {
        setup: name,
        source: Box::new(source),
    };
    precondition(sut.as_mut(), cfg, opts.seed, &mut NoProgress).map_err(run_err)?;
    let o = measure(sut.as_mut(), cfg, &mix(opts.seed), None, &mut NoProgress).map_err(run_err)?;
    let report = BenchReport::from_outcome(&o);
    let smr = report.devices.iter().filter(|d| d.preset == "smr-hm");
    let (smr_read_bytes, smr_head_moves) =
        smr.fold((0, 0), |(r, h), d| (r + d.host_read, h + d.head_moves));
    let promoted_bytes = o
        .traffic
        .iter()
        .find(|t| t.name == "promoted")
        .map_or(0, |t| t.bytes);
    Ok(SetupResult {
        setup,
        read_mib_s: report.emulated_read_mib_s,
        write_mib_s: report.emulated_write_mib_s,
        smr_read_bytes,
        smr_head_moves,
        promoted_bytes,
        report,
    })
}

/// Runs every setup (up to `opts.jobs` at once) and compares them.
pub fn run_hybrid(opts: &HybridOptions) -> Result<HybridReport, ExperimentError> {
    let cfg = bench_config(opts)?;
    // The SMR disk alone sets the volumes' size; the tiered pools (as many zones,
    // with a second reserve) take the same.
    let size = |s: Setup| volume_bytes_of(s.name(), &shale_config(&cfg, s, opts));
    let volume_bytes = size(Setup::Smr)?.min(size(Setup::Hybrid)?);
    let results = run_all(&Setup::ALL, opts.jobs, Setup::name, |setup| {
        run_setup(&cfg, setup, Some(volume_bytes), opts)
    })?;
    let read = |s: Setup| {
        results
            .iter()
            .find(|r| r.setup == s)
            .and_then(|r| r.read_mib_s)
    };
    let read_speedup = match (read(Setup::Hybrid), read(Setup::Smr)) {
        (Some(h), Some(s)) if s > 0.0 => Some(h / s),
        _ => None,
    };
    Ok(HybridReport {
        config: cfg.name.clone(),
        seed: opts.seed,
        cold_pct: opts.cold_pct,
        volume_bytes,
        setups: results,
        read_speedup,
    })
}

impl HybridReport {
    /// The terminal table.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "SALSA's video server (seed 002 §V-E) on Shale: config {}, seed {}, {} volumes of {}",
            self.config,
            self.seed,
            READERS + 1,
            format_size(self.volume_bytes)
        );
        let _ = writeln!(
            s,
            "  1 writer of {} videos in order (a request per turn), {READERS} readers {READ_SKEW}; tiered: {}% of the zones on the SMR disk, the rest on ZNS QLC\n",
            format_size(VIDEO_BYTES),
            self.cold_pct
        );
        let _ = writeln!(
            s,
            "{:<10} {:>12} {:>12} {:>14} {:>12} {:>14}",
            "setup", "read MiB/s", "write MiB/s", "SMR read MiB", "SMR seeks", "promoted MiB"
        );
        let f = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
        for r in &self.setups {
            let _ = writeln!(
                s,
                "{:<10} {:>12} {:>12} {:>14} {:>12} {:>14}",
                r.setup.name(),
                f(r.read_mib_s),
                f(r.write_mib_s),
                r.smr_read_bytes >> 20,
                r.smr_head_moves,
                r.promoted_bytes >> 20
            );
        }
        let _ = writeln!(
            s,
            "\nreads, hybrid against the SMR disk alone: {}× (SALSA 19.1×)",
            self.read_speedup.map_or("-".into(), |x| format!("{x:.1}"))
        );
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At a small capacity: every setup reads the same bytes, the tiered ones serve
    /// some from the fast drive, and the hybrid one brings blocks back.
    #[test]
    fn the_hybrid_pool_reads_less_from_the_disk() {
        let opts = HybridOptions {
            scale: Scale::Tiny,
            seed: 1,
            cold_pct: 50,
            capacity_bytes: Some(256 << 20),
            jobs: 3,
        };
        let r = run_hybrid(&opts).expect("runs");
        assert_eq!(r.setups.len(), 3);
        let [smr, tier_only, hybrid] = [&r.setups[0], &r.setups[1], &r.setups[2]];
        assert_eq!(
            smr.report.bytes.user_read, hybrid.report.bytes.user_read,
            "the same reads"
        );
        assert!(smr.report.bytes.user_read > 0);
        assert!(hybrid.promoted_bytes > 0, "{:?}", hybrid.promoted_bytes);
        assert_eq!(tier_only.promoted_bytes, 0);
        assert!(
            hybrid.smr_read_bytes < smr.smr_read_bytes,
            "hybrid {} smr {}",
            hybrid.smr_read_bytes,
            smr.smr_read_bytes
        );
        assert!(r.render().contains("SALSA 19.1"));
    }
}
