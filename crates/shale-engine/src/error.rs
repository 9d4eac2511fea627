//! Typed errors, one enum per area. Bad input and bad media are values; bugs are panics.

use shale_device::{DeviceError, ZoneError};
use shale_format::{FormatError, Lba, Pba, RegionId, VolumeId, VolumeUid};

/// Errors of data-path and admin requests.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{volume}: no such volume")]
    NoSuchVolume { volume: VolumeUid },
    #[error("{volume}: range {offset}+{len} is beyond the volume end {size_bytes}")]
    OutOfRange {
        volume: VolumeId,
        offset: u64,
        len: u64,
        size_bytes: u64,
    },
    #[error("{volume}: zero-length request at {offset}")]
    ZeroLength { volume: VolumeId, offset: u64 },
    #[error("{volume}: request of {len} bytes exceeds request_bytes_max {max}")]
    TooLarge {
        volume: VolumeId,
        len: u64,
        max: u64,
    },
    #[error("no space: {what} needs {needed} blocks, {available} available")]
    NoSpace {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    #[error("invalid volume request: {reason}")]
    InvalidVolume { reason: String },
    /// A zone given to or taken from the space manager that cannot be (`GiveZones`,
    /// `TakeZones`): the request changes nothing.
    #[error("zone lending refused: {reason}")]
    ZoneLending { reason: String },
    #[error("{volume} {lba} at {pba}: data CRC32C mismatch (md says {expected:#010x}, data has {got:#010x})")]
    ChecksumMismatch {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
        expected: u32,
        got: u32,
    },
    #[error(
        "{volume} {lba} at {pba}: md entry names {found_volume} {found_lba} (misdirected block)"
    )]
    Misdirected {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
        found_volume: VolumeId,
        found_lba: Lba,
    },
    #[error("md block for {pba}: {source}")]
    MdCorrupt {
        pba: Pba,
        #[source]
        source: FormatError,
    },
    #[error("{volume} L2P page {page} (slot {slot}): CRC32C mismatch (directory {expected:#010x}, page {got:#010x})")]
    L2pPageCorrupt {
        volume: VolumeId,
        page: u64,
        slot: u32,
        expected: u32,
        got: u32,
    },
    #[error("cache device {step} at byte {offset}: {source}")]
    CacheIo {
        step: &'static str,
        offset: u64,
        #[source]
        source: DeviceError,
    },
    #[error("capacity device {step} at byte {offset}: {source}")]
    CapacityIo {
        step: &'static str,
        offset: u64,
        #[source]
        source: ZoneError,
    },
    #[error("journal full: {blocks} blocks")]
    JournalFull { blocks: u32 },
    #[error("checkpoint of {needed} blocks does not fit its area of {area} blocks")]
    CheckpointTooLarge { needed: u64, area: u32 },
    #[error("engine stopped after an earlier fatal error: {reason}")]
    Failed { reason: String },
    #[error("engine is shutting down")]
    ShuttingDown,
    #[error("self-check failed: {0}")]
    SelfCheck(#[from] SelfCheckError),
}

impl EngineError {
    pub(crate) fn cache(
        step: &'static str,
        offset: u64,
    ) -> impl FnOnce(DeviceError) -> EngineError {
        move |source| EngineError::CacheIo {
            step,
            offset,
            source,
        }
    }
    pub(crate) fn capacity(
        step: &'static str,
        offset: u64,
    ) -> impl FnOnce(ZoneError) -> EngineError {
        move |source| EngineError::CapacityIo {
            step,
            offset,
            source,
        }
    }
}

/// Why `Config` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("l2p_cache_bytes_max {bytes} holds {pages} pages; at least {min_pages} are needed (largest request + {reserved} reserved + 2), or background work could livelock")]
    L2pBudgetTooSmall {
        bytes: u64,
        pages: u64,
        min_pages: u64,
        reserved: u32,
    },
}

/// Errors of `Engine::format`.
#[derive(Debug, thiserror::Error)]
pub enum FormatDeviceError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{device} device too small: {reason}")]
    TooSmall {
        device: &'static str,
        reason: String,
    },
    #[error("geometry not supported: {reason}")]
    Geometry { reason: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Errors of `Engine::open`.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("no valid superblock: copy A: {a}; copy B: {b}")]
    NoSuperblock { a: FormatError, b: FormatError },
    #[error("capacity label: {0}")]
    BadLabel(FormatError),
    #[error("capacity label unreadable (not a Shale capacity device?): {source}")]
    LabelUnreadable {
        #[source]
        source: ZoneError,
    },
    #[error("capacity device belongs to another cache (label UUID differs from the superblock's)")]
    ForeignCapacity,
    #[error("a device given with the pool belongs to another pool (its label's UUID differs from the superblock's)")]
    ForeignDevice,
    #[error("capacity device geometry changed: {reason}")]
    GeometryMismatch { reason: String },
    #[error("checkpoint area {area}: {source}")]
    BadCheckpoint {
        area: u8,
        #[source]
        source: FormatError,
    },
    #[error("checkpoint inconsistent: {reason}")]
    InconsistentCheckpoint { reason: String },
    #[error("not shut down cleanly: needs recovery, and the configuration says not to recover")]
    NeedsRecovery,
    #[error("recovery: {0}")]
    Recovery(#[from] RecoveryError),
    #[error("census after load: {region} records {recorded} valid blocks, the L2P maps {counted}")]
    CensusMismatch {
        region: RegionId,
        recorded: u32,
        counted: u32,
    },
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// Why recovery after a crash could not rebuild a consistent state. Each names the
/// step and the place; none is a crash artifact (those are handled), all mean damaged
/// or foreign metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecoveryError {
    #[error("md scan: {region} group {group}: the journal proves {need} entries durable, the md holds {have} ({reason})")]
    MdLost {
        region: RegionId,
        group: u32,
        have: u32,
        need: u32,
        reason: String,
    },
    #[error("census: {volume} {lba} maps to {pba} in {region}, which is {state}")]
    MappedIntoUnusedRegion {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
        region: RegionId,
        state: String,
    },
    #[error("census: {volume} {lba} maps to {pba} in {region} at or past the zone's write pointer (slot {wp})")]
    MappedPastWritePointer {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
        region: RegionId,
        wp: u32,
    },
}

/// A broken invariant found by the self-check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelfCheckError {
    #[error("{volume} {lba} -> {pba}: validity bit clear")]
    MappedButInvalid {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
    },
    #[error("{volume} {lba} -> {pba}: PBA mapped by another entry too")]
    DoubleMapped {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
    },
    #[error("{volume} {lba} -> {pba}: PBA outside any data region")]
    BadPba {
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
    },
    #[error("{pba}: validity bit set but no L2P entry points at it")]
    ValidButUnmapped { pba: Pba },
    #[error("{region}: valid count {recorded}, bitmap has {bits}, L2P maps {mapped}")]
    CountMismatch {
        region: RegionId,
        recorded: u32,
        bits: u32,
        mapped: u32,
    },
    #[error("{region}: {reason}")]
    RegionState { region: RegionId, reason: String },
    #[error("free list: {reason}")]
    FreeList { reason: String },
}
