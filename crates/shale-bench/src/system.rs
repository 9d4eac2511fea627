//! What a benchmark runs against.
//!
//! A system under test exposes `volume_count()` volumes of `volume_bytes()` each (one per
//! tenant), executes the operations the runner hands it, and reports what each of its
//! simulated devices did. Adding a system to `shale bench run` is adding an impl of
//! [`SystemUnderTest`] and a [`SystemKind`](crate::SystemKind) variant; the runner, the
//! WAF arithmetic and the report are shared.

use shale_flashsim::FlashStats;
use shale_workload::IoOp;

/// What a device is for in the system (DESIGN.md: WAF is counted on the capacity device;
/// cache writes are reported separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceRole {
    Capacity,
    Cache,
}

impl DeviceRole {
    pub fn name(self) -> &'static str {
        match self {
            DeviceRole::Capacity => "capacity",
            DeviceRole::Cache => "cache",
        }
    }
}

/// One simulated device's figures since the last counter reset.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceReport {
    pub role: DeviceRole,
    /// The flash preset it simulates (`qlc-p5316`, `optane`, ...).
    pub preset: String,
    pub stats: FlashStats,
}

/// A system the benchmark can drive.
///
/// Operations arrive interleaved across tenants (round-robin, one operation at a time).
/// A system with queues may keep up to the configured queue depth per tenant in flight;
/// [`drain`](SystemUnderTest::drain) returns once everything submitted has completed.
pub trait SystemUnderTest {
    /// Name as it appears in reports (`raw`, ...).
    fn name(&self) -> &str;

    /// Number of volumes; the runner runs one tenant per volume.
    fn volume_count(&self) -> u32;

    /// Size of each volume.
    fn volume_bytes(&self) -> u64;

    /// Smallest I/O granularity the volumes accept.
    fn sector_bytes(&self) -> u64;

    /// Executes (or queues) one operation; `op.offset` is relative to volume `op.tenant`.
    fn submit(&mut self, op: &IoOp) -> Result<(), RunError>;

    /// Waits for every submitted operation to complete.
    fn drain(&mut self) -> Result<(), RunError>;

    /// Starts every device counter from zero (after preconditioning).
    fn reset_counters(&mut self);

    /// Every simulated device, capacity device(s) first.
    fn devices(&self) -> Vec<DeviceReport>;

    /// The system's own background traffic since the last counter reset, in bytes,
    /// by cause (`compaction`, `gc`, `flush`, `rc1`, ...): what the seeds' Figure 16
    /// plots beside the user traffic. Systems without background work report none.
    fn traffic(&self) -> Vec<Traffic> {
        Vec::new()
    }

    /// L2P statistics since the last counter reset, for systems with an L2P table.
    fn l2p(&self) -> Option<L2pStats> {
        None
    }
}

/// One named background traffic counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traffic {
    /// Short name of the cause, used as a JSON key and a plot legend.
    pub name: &'static str,
    /// Bytes written by that cause.
    pub bytes: u64,
}

/// L2P page-cache figures of a system with a paged L2P table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct L2pStats {
    pub hits: u64,
    pub misses: u64,
    /// Pages read from the cache device on misses.
    pub page_reads: u64,
    /// Pages written back to the cache device.
    pub page_writes: u64,
    /// Pages the DRAM budget holds.
    pub cache_pages_max: u64,
    /// Bytes of the volumes' L2P tables (smaller with mapping units).
    pub table_bytes: u64,
}

/// A failure while running a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("tenant {tenant}: {kind:?} at volume offset {offset} length {len} failed")]
    Device {
        tenant: u32,
        kind: shale_workload::IoKind,
        offset: u64,
        len: u64,
        #[source]
        source: shale_device::DeviceError,
    },
    #[error(
        "tenant {tenant}: {kind:?} at volume offset {offset} length {len} is outside the \
         {volume_bytes}-byte volume or not aligned to {sector_bytes} bytes"
    )]
    BadRange {
        tenant: u32,
        kind: shale_workload::IoKind,
        offset: u64,
        len: u64,
        volume_bytes: u64,
        sector_bytes: u64,
    },
    #[error("{step} on zone {zone} failed")]
    Zone {
        step: &'static str,
        zone: u32,
        #[source]
        source: shale_device::ZoneError,
    },
    #[error("{step} failed: {reason}")]
    Model { step: &'static str, reason: String },
    #[error(
        "tenant {tenant}: {kind:?} at volume offset {offset} length {len} failed in the engine"
    )]
    Engine {
        tenant: u32,
        kind: shale_workload::IoKind,
        offset: u64,
        len: u64,
        #[source]
        source: shale_engine::EngineError,
    },
    #[error("tenant {tenant} does not exist (system has {volumes} volumes)")]
    NoSuchVolume { tenant: u32, volumes: u32 },
    #[error(transparent)]
    Workload(#[from] shale_workload::ConfigError),
}
