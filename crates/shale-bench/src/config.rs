//! The standard benchmark configurations (DESIGN.md "Standard configurations").
//!
//! `paper` is CSAL's artifact setup scaled 1:4096 by capacity: a 4 GiB capacity device,
//! 8 tenants with one job each at queue depth 128. Preconditioning follows the artifact:
//! two sequential 1 MiB passes over every volume, then 64 KiB random writes (fio
//! `randwrite` defaults, i.e. [`Distribution::Uniform`]) of 4× capacity; the counters are
//! reset, then the workload runs for 2× capacity of writes. `quick` is the same shape at
//! 1/8 the size; `tiny` (1/64) exists for tests.

use std::fmt;
use std::str::FromStr;

use shale_workload::{format_size, Distribution};

/// Capacity of the `paper` configuration's capacity device.
pub const PAPER_CAPACITY_BYTES: u64 = 4 << 30;
/// Smallest capacity a configuration may have (a few superblocks of any preset).
pub const CAPACITY_BYTES_MIN: u64 = 16 << 20;
/// Largest capacity a configuration may have (the flash model's tables live in memory).
pub const CAPACITY_BYTES_MAX: u64 = 64 << 30;

/// A named configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Paper,
    Quick,
    Tiny,
}

impl Scale {
    pub const NAMES: [&'static str; 3] = ["paper", "quick", "tiny"];

    pub fn name(self) -> &'static str {
        match self {
            Scale::Paper => "paper",
            Scale::Quick => "quick",
            Scale::Tiny => "tiny",
        }
    }

    pub fn capacity_bytes(self) -> u64 {
        match self {
            Scale::Paper => PAPER_CAPACITY_BYTES,
            Scale::Quick => PAPER_CAPACITY_BYTES / 8,
            Scale::Tiny => PAPER_CAPACITY_BYTES / 64,
        }
    }
}

impl fmt::Display for Scale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Scale {
    type Err = SetupError;
    fn from_str(s: &str) -> Result<Scale, SetupError> {
        match s.to_ascii_lowercase().as_str() {
            "paper" => Ok(Scale::Paper),
            "quick" => Ok(Scale::Quick),
            "tiny" => Ok(Scale::Tiny),
            _ => Err(SetupError::UnknownConfig { name: s.into() }),
        }
    }
}

/// How the drive is brought to steady state before measuring.
#[derive(Debug, Clone, PartialEq)]
pub struct Precondition {
    /// Sequential passes over every volume.
    pub seq_passes: u64,
    pub seq_block_bytes: u64,
    /// Random writes of this many times the capacity, in total over all volumes.
    pub random_capacity_multiple: u64,
    pub random_block_bytes: u64,
    pub random_distribution: Distribution,
}

impl Default for Precondition {
    fn default() -> Precondition {
        Precondition {
            seq_passes: 2,
            seq_block_bytes: 1 << 20,
            random_capacity_multiple: 4,
            random_block_bytes: 64 << 10,
            random_distribution: Distribution::Uniform,
        }
    }
}

/// Everything about a benchmark run that is not the system or the workload.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchConfig {
    /// Name for reports (`paper`, `quick`, `tiny`, or `custom` after an override).
    pub name: String,
    /// Logical capacity of the capacity device.
    pub capacity_bytes: u64,
    /// Tenants, one volume and one job each.
    pub tenants: u32,
    /// Operations each job keeps in flight (systems with queues use it).
    pub queue_depth: u32,
    /// `None` measures a fresh drive.
    pub precondition: Option<Precondition>,
    /// Before measuring, the workload itself runs unmeasured for this many times the
    /// capacity (fio's `ramp_time`), so the figures are the workload's steady state and
    /// not the transition from the preconditioned state.
    pub ramp_capacity_multiple: u64,
    /// The measured workload writes this many times the capacity, in total.
    pub measure_capacity_multiple: u64,
}

impl BenchConfig {
    pub fn standard(scale: Scale) -> BenchConfig {
        BenchConfig {
            name: scale.name().into(),
            capacity_bytes: scale.capacity_bytes(),
            tenants: 8,
            queue_depth: 128,
            precondition: Some(Precondition::default()),
            ramp_capacity_multiple: 1,
            measure_capacity_multiple: 2,
        }
    }

    /// Other lengths of the ramp and the measured phase, in capacities (`None` keeps
    /// the configuration's); the name says so when they change.
    pub fn with_phases(mut self, ramp: Option<u64>, measure: Option<u64>) -> BenchConfig {
        let ramp = ramp.unwrap_or(self.ramp_capacity_multiple);
        let measure = measure.unwrap_or(self.measure_capacity_multiple).max(1);
        if (ramp, measure) != (self.ramp_capacity_multiple, self.measure_capacity_multiple) {
            self.name = format!("{}+ramp{ramp}x,measure{measure}x", self.name);
        }
        self.ramp_capacity_multiple = ramp;
        self.measure_capacity_multiple = measure;
        self
    }

    /// The same shape at another capacity.
    pub fn with_capacity(mut self, capacity_bytes: u64) -> Result<BenchConfig, SetupError> {
        if !(CAPACITY_BYTES_MIN..=CAPACITY_BYTES_MAX).contains(&capacity_bytes) {
            return Err(SetupError::CapacityOutOfRange {
                capacity_bytes,
                min: CAPACITY_BYTES_MIN,
                max: CAPACITY_BYTES_MAX,
            });
        }
        if capacity_bytes != self.capacity_bytes {
            self.name = format!("{}@{}", self.name, format_size(capacity_bytes));
        }
        self.capacity_bytes = capacity_bytes;
        Ok(self)
    }
}

/// Why a benchmark could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("unknown configuration {name:?} (expected paper or quick)")]
    UnknownConfig { name: String },
    #[error("unknown system {name:?} (expected one of: {valid})")]
    UnknownSystem { name: String, valid: String },
    #[error("capacity {capacity_bytes} bytes out of range ({min}..={max})")]
    CapacityOutOfRange {
        capacity_bytes: u64,
        min: u64,
        max: u64,
    },
    #[error("block size {block_bytes} bytes is larger than a volume ({volume_bytes} bytes)")]
    BlockLargerThanVolume { block_bytes: u64, volume_bytes: u64 },
    #[error("block size {block_bytes} is not a multiple of the device's {sector_bytes}-byte logical block")]
    BlockUnaligned { block_bytes: u64, sector_bytes: u64 },
    #[error(
        "{tenants} volumes of at least {align_bytes} bytes do not fit in {usable_bytes} bytes"
    )]
    VolumesDoNotFit {
        tenants: u32,
        usable_bytes: u64,
        align_bytes: u64,
    },
    #[error("host over-provisioning {pct}% out of range (0..=90)")]
    HostSpareOutOfRange { pct: u8 },
    #[error(transparent)]
    Workload(#[from] shale_workload::ConfigError),
    #[error(transparent)]
    Flash(#[from] shale_flashsim::FlashSimError),
    #[error(transparent)]
    Device(#[from] shale_device::DeviceError),
    #[error("formatting Shale's devices failed")]
    EngineFormat(#[from] shale_engine::FormatDeviceError),
    #[error("{step} failed: {reason}")]
    EngineAdmin { step: &'static str, reason: String },
    #[error("{got} capacity devices: expected 1 to {max}")]
    CapacityDevices { got: u32, max: u32 },
    #[error("{got} cache devices: expected 1 to {max} (2 or more are mirrors)")]
    CacheDevices { got: u32, max: u32 },
    #[error("capacity redundancy {redundancy} needs more than one capacity device")]
    RedundancyNeedsDevices { redundancy: String },
    #[error("{system} takes {wanted} as its capacity drive, not {preset}")]
    CapacityDrive {
        system: &'static str,
        preset: &'static str,
        wanted: &'static str,
    },
    #[error("arrays of capacity devices and mirrored caches run with --system shale-zns (or the raid models)")]
    ArrayNeedsZns,
    #[error("capacity redundancy {redundancy}: {reason}")]
    Stripe { redundancy: String, reason: String },
    #[error("capacity redundancy {redundancy} is not one the {system} model runs: {reason}")]
    ModelRedundancy {
        system: &'static str,
        redundancy: String,
        reason: String,
    },
    #[error(transparent)]
    ArrayLayout(#[from] shale_array::LayoutError),
    #[error(transparent)]
    Array(#[from] shale_array::ArrayError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_is_an_eighth_of_paper() {
        let p = BenchConfig::standard(Scale::Paper);
        let q = BenchConfig::standard(Scale::Quick);
        assert_eq!(p.capacity_bytes, 8 * q.capacity_bytes);
        assert_eq!((p.tenants, p.queue_depth), (q.tenants, q.queue_depth));
        assert_eq!(p.precondition, q.precondition);
    }

    #[test]
    fn scale_names_parse() {
        for n in Scale::NAMES {
            assert_eq!(n.parse::<Scale>().map(Scale::name).ok(), Some(n));
        }
        assert!(matches!(
            "huge".parse::<Scale>(),
            Err(SetupError::UnknownConfig { .. })
        ));
    }

    #[test]
    fn capacity_override_is_bounded() {
        let c = BenchConfig::standard(Scale::Quick);
        assert!(c.clone().with_capacity(1 << 20).is_err());
        assert!(c.clone().with_capacity(1 << 40).is_err());
        let c = c.with_capacity(32 << 20).expect("valid");
        assert_eq!(c.name, "quick@32MiB");
    }

    #[test]
    fn phases_keep_the_name_unless_they_change() {
        let c = BenchConfig::standard(Scale::Paper);
        assert_eq!(c.clone().with_phases(None, None), c);
        assert_eq!(c.clone().with_phases(Some(1), Some(2)), c);
        let l = c.with_phases(Some(5), None);
        assert_eq!(l.name, "paper+ramp5x,measure2x");
        assert_eq!(
            (l.ramp_capacity_multiple, l.measure_capacity_multiple),
            (5, 2)
        );
    }
}
