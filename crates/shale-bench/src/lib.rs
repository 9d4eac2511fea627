//! Benchmarks of Shale and its baselines.
//!
//! `shale bench run` = a [`SystemUnderTest`] built by [`build_system`], a [`BenchConfig`]
//! (the `paper` / `quick` configurations of DESIGN.md), and a measured workload
//! ([`RunSpec`]); [`run`] preconditions, resets the counters, measures, and returns a
//! [`RunOutcome`] that [`BenchReport`] turns into WAF figures and emulated throughput.
//! What each figure means is in docs/benchmarks.md.
#![forbid(unsafe_code)]

mod config;
mod raw;
mod report;
mod runner;
mod system;

use std::fmt;
use std::str::FromStr;

pub use config::{
    BenchConfig, Precondition, Scale, SetupError, CAPACITY_BYTES_MAX, CAPACITY_BYTES_MIN,
    PAPER_CAPACITY_BYTES,
};
pub use raw::{RawConfig, RawSystem, DEFAULT_HOST_SPARE_PCT, PARTITION_ALIGN_BYTES};
pub use report::{BenchReport, Bytes, DeviceLine, Waf};
pub use runner::{run, NoProgress, Progress, RunOutcome, RunSpec};
pub use system::{DeviceReport, DeviceRole, RunError, SystemUnderTest};

/// The systems `shale bench run --system` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemKind {
    /// Tenants on partitions of the raw capacity drive.
    Raw,
}

impl SystemKind {
    pub const NAMES: [&'static str; 1] = ["raw"];

    pub fn name(self) -> &'static str {
        match self {
            SystemKind::Raw => "raw",
        }
    }
}

impl fmt::Display for SystemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SystemKind {
    type Err = SetupError;
    fn from_str(s: &str) -> Result<SystemKind, SetupError> {
        match s.to_ascii_lowercase().as_str() {
            "raw" => Ok(SystemKind::Raw),
            _ => Err(SetupError::UnknownSystem {
                name: s.into(),
                valid: SystemKind::NAMES.join(", "),
            }),
        }
    }
}

/// What a system needs to be built, beyond the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemOptions {
    /// Preset of the capacity drive.
    pub drive: String,
    /// Raw only: percentage of the drive left unpartitioned.
    pub host_spare_pct: u8,
}

impl Default for SystemOptions {
    fn default() -> SystemOptions {
        SystemOptions {
            drive: "qlc-p5316".into(),
            host_spare_pct: DEFAULT_HOST_SPARE_PCT,
        }
    }
}

/// Builds the system `kind` for configuration `cfg`.
pub fn build_system(
    kind: SystemKind,
    cfg: &BenchConfig,
    opts: &SystemOptions,
) -> Result<Box<dyn SystemUnderTest>, SetupError> {
    match kind {
        SystemKind::Raw => Ok(Box::new(RawSystem::new(&RawConfig {
            preset: opts.drive.clone(),
            capacity_bytes: cfg.capacity_bytes,
            tenants: cfg.tenants,
            host_spare_pct: opts.host_spare_pct,
        })?)),
    }
}

/// Checks a measured workload against a built system before anything runs, so bad
/// input fails fast with a clear error.
pub fn check_spec(sut: &dyn SystemUnderTest, spec: &RunSpec) -> Result<(), SetupError> {
    let sector = sut.sector_bytes();
    if spec.block_bytes > sut.volume_bytes() {
        return Err(SetupError::BlockLargerThanVolume {
            block_bytes: spec.block_bytes,
            volume_bytes: sut.volume_bytes(),
        });
    }
    if spec.block_bytes != 0 && !spec.block_bytes.is_multiple_of(sector) {
        return Err(SetupError::BlockUnaligned {
            block_bytes: spec.block_bytes,
            sector_bytes: sector,
        });
    }
    let mut w = shale_workload::WorkloadConfig::new(
        spec.workload.clone(),
        spec.block_bytes,
        sut.volume_bytes(),
    );
    w.read_pct = spec.read_pct;
    w.tenants = sut.volume_count();
    w.validate()?;
    Ok(())
}
