//! Where Shale's bytes live, and how they move.
//!
//! Two small capability traits describe storage: [`BlockDevice`] (a conventional
//! LBA-addressed device) and [`ZonedDevice`] (the NVMe ZNS model). Everything the
//! engine can be pointed at implements one of them: memory, files and raw block
//! devices (io_uring or pread/pwrite), zone emulation over any block device, the
//! flash simulator (crate `shale-flashsim`) and the fault injector. Wrappers are
//! indistinguishable from the devices they wrap.
//!
//! Invariants every implementation keeps:
//! - I/O offsets and lengths are multiples of the device's logical block size and lie
//!   inside the device; anything else is a typed error, never a truncation.
//! - `submit` never blocks on I/O and never fails synchronously: every submitted
//!   request produces exactly one completion carrying its tag (and its buffer back).
//! - The synchronous helpers (`read_at`, `write_at`, ...) never consume the
//!   completion of a submitted request.
//! - A write is durable only after a completed `flush` (or a FUA write completes).
//!
//! docs/devices.md describes each implementation, the ZNS rules zone emulation
//! enforces, its on-media metadata byte by byte, and what a simulated crash does.

mod blkzoned;
mod block;
mod buf;
mod check;
mod concat;
mod engine_psync;
mod engine_uring;
mod error;
mod fault;
mod file;
pub mod fuzzing;
mod mem;
mod null;
mod shared_cache;
mod shared_zones;
mod sparse;
mod stats;
mod tags;
mod window;
mod zone_emu;
mod zone_meta;
mod zone_range;
mod zone_rules;
mod zoned;

pub use blkzoned::{
    is_zoned_block_device, open_zoned_drive, open_zoned_drive_shard, BlkZoned, DriveOpen,
};
pub use block::{BlockDevice, DeviceInfo, IoCompletion, IoOp, IoRequest, MAINTAIN_IDLE};
pub use buf::IoBuf;
pub use concat::ZonedConcat;
pub use error::{DeviceError, IoOpKind, ZoneError};
pub use fault::{
    CrashError, CrashMode, CrashReport, ErrorRule, FaultController, FaultCounters, FaultDevice,
    Latency, PendingWriteInfo, TearUnit, WriteId,
};
pub use file::{DirectIo, EngineChoice, EngineKind, FileDevice, FileOptions, FILE_MAX_IO_BYTES};
pub use mem::{MemDevice, MEM_MAX_IO_BYTES, MEM_QUEUE_DEPTH};
pub use null::NullDevice;
pub use shared_cache::{CacheSplit, SharedCache};
pub use shared_zones::SharedZones;
pub use sparse::{SparseImage, SPARSE_PAGE_BYTES};
pub use stats::{DeviceStats, StatsDevice, StatsHandle};
pub use window::Window;
pub use zone_emu::{MetaProblem, ZoneEmu, ZoneEmuConfig, ZoneFault};
pub use zone_range::ZoneRange;
pub use zoned::{
    ZoneAction, ZoneCompletion, ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};

/// The unit of mapping in Shale and the alignment of every I/O the engine issues.
pub const BLOCK_SIZE: usize = 4096;

/// Smallest logical block size a device may report.
pub const SECTOR_SIZE: usize = 512;

#[cfg(test)]
mod tests {
    use super::*;

    /// Engines move devices to their own threads: every device must be `Send`.
    #[test]
    fn devices_are_send() {
        fn send<T: Send>() {}
        send::<MemDevice>();
        send::<NullDevice>();
        send::<FileDevice>();
        send::<FaultDevice>();
        send::<FaultController>();
        send::<ZoneEmu<MemDevice>>();
        send::<ZoneEmu<FileDevice>>();
        send::<StatsDevice<ZoneEmu<FaultDevice>>>();
        send::<StatsHandle>();
    }
}
