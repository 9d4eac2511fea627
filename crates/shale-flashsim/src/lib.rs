//! A drive's own flash translation layer as a device wrapper, so the seeds' write
//! amplification and throughput results can be reproduced without the drives.
//!
//! - [`FlashSim`] wraps any [`shale_device::BlockDevice`]: data goes to the inner device
//!   unchanged, and a model of the drive's FTL ([`Ftl`]: IU mapping with
//!   read-modify-write, superblocks, spare space, greedy/FIFO/cost-benefit GC, TRIM)
//!   counts what the NAND would do.
//! - [`ZnsSim`] wraps any [`shale_device::ZonedDevice`]: zones map to their own erase
//!   units, so NAND bytes equal host bytes and a reset erases.
//! - [`TimingModel`] turns the counts into busy time (a bottleneck model), and
//!   [`preset`] gives the seeds' drives with their datasheet figures.
//!
//! The model, its calibration and its limits are written down in docs/flash-model.md.
//!
//! Invariants:
//! - The wrappers never change data: every byte read through them is what the inner
//!   device returns.
//! - The model only counts requests the inner device completed successfully.
//! - `nand_bytes_written == nand_bytes_written_host + _gc + _rmw`, and the same for
//!   reads; on a conventional drive NAND programs are never fewer than host bytes.
#![forbid(unsafe_code)]

mod analytic;
mod block;
mod config;
mod drive;
mod error;
mod ftl;
mod preset;
mod stats;
mod timing;
mod zoned;

pub use analytic::{lambert_w0, spare_factor_from_rho, uniform_random_waf};
pub use block::{DriveModel, FlashSim, InPlace};
pub use config::{FtlConfig, GcPolicy, Geometry, Spare, Superblock, IU_BYTES_MAX, IU_COUNT_MAX};
pub use drive::{
    simulated_block_device, simulated_zoned_device, Backing, SimBacking, SIM_LOGICAL_BLOCK_BYTES,
};
pub use error::{FlashSimError, ModelOp};
pub use ftl::Ftl;
pub use preset::{preset, Datasheet, Preset, PresetKind, PRESET_NAMES};
pub use stats::{emulated_bytes_per_sec, Counters, FlashStats, StatsHandle};
pub use timing::TimingModel;
pub use zoned::ZnsSim;

#[cfg(test)]
mod testutil;
#[cfg(test)]
mod validation;
