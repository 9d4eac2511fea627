//! Benchmarks of Shale and its baselines.
//!
//! `shale bench run` = a [`SystemUnderTest`] built by [`build_system`], a [`BenchConfig`]
//! (the `paper` / `quick` configurations of DESIGN.md), and a measured workload
//! ([`RunSpec`]); [`run`] preconditions, resets the counters, measures, and returns a
//! [`RunOutcome`] that [`BenchReport`] turns into WAF figures and emulated throughput.
//! What each figure means is in docs/benchmarks.md.
#![forbid(unsafe_code)]

mod access;
mod config;
pub mod controllers;
mod dmzoned;
pub mod experiments;
pub mod hybrid;
mod opencas;
pub mod plot;
mod raid;
mod raw;
mod report;
mod runner;
mod setups;
mod shale;
mod shale_arrays;
pub mod suite;
mod system;

use std::fmt;
use std::str::FromStr;

pub use access::{Access, AccessError};
pub use config::{
    BenchConfig, Precondition, Scale, SetupError, CAPACITY_BYTES_MAX, CAPACITY_BYTES_MIN,
    PAPER_CAPACITY_BYTES,
};
pub use dmzoned::{zone_bytes_for, DmZonedConfig, DmZonedModel, DMZONED_ZONES_PER_CAPACITY};
pub use opencas::{OpenCasConfig, OpenCasModel, OPENCAS_LINE_BYTES, OPENCAS_WAYS};
pub use raid::{Raid5fModel, RaidConfig, RaidModel, STRIPE_CACHE_HEADS, STRIP_BYTES};
pub use raw::{RawConfig, RawSystem, DEFAULT_HOST_SPARE_PCT, PARTITION_ALIGN_BYTES};
pub use report::{BenchReport, Bytes, DeviceLine, GroupLine, IoAmp, L2pLine, TrafficLine, Waf};
pub use runner::{
    measure, precondition, run, GroupSpec, MixSpec, NoProgress, Progress, RunOutcome, RunSpec,
    Sample,
};
pub use setups::ExperimentError;
pub use shale::{build_shale, ColdTier, ShaleConfig, ShaleMode, ShaleSystem, SHALE_ZONE_BYTES};
pub use shale_arrays::check_array_options;
pub use system::{DeviceReport, DeviceRole, L2pStats, RunError, SystemUnderTest, Traffic};

/// The systems `shale bench run --system` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SystemKind {
    /// Tenants on partitions of the raw capacity drive.
    Raw,
    /// A model of an Open-CAS write-back cache (64 KiB lines, LRU) over the QLC drive.
    OpenCasModel,
    /// A model of dm-zoned over a ZNS QLC drive, random zones on the cache drive.
    DmZonedModel,
    /// Shale over an Optane cache and a ZNS QLC drive (CSAL-ZNS).
    ShaleZns,
    /// Shale over an Optane cache and zones emulated on a conventional QLC drive
    /// (CSAL-BLK).
    ShaleBlk,
    /// A model of in-place RAID-5/6 (md) over `K+M` QLC drives: read-modify-write of
    /// data and parity, a stripe cache.
    RaidModel,
    /// A model of a full-stripe-only array (SPDK raid5f) under a write-back cache.
    Raid5fModel,
}

impl SystemKind {
    pub const ALL: [SystemKind; 7] = [
        SystemKind::Raw,
        SystemKind::OpenCasModel,
        SystemKind::DmZonedModel,
        SystemKind::ShaleZns,
        SystemKind::ShaleBlk,
        SystemKind::RaidModel,
        SystemKind::Raid5fModel,
    ];
    pub const NAMES: [&'static str; 7] = [
        "raw",
        "opencas-model",
        "dmzoned-model",
        "shale-zns",
        "shale-blk",
        "raid-model",
        "raid5f-model",
    ];

    /// Every system's name, as `--system` accepts it.
    pub fn names() -> String {
        SystemKind::NAMES.join(", ")
    }

    pub fn name(self) -> &'static str {
        match self {
            SystemKind::Raw => "raw",
            SystemKind::OpenCasModel => "opencas-model",
            SystemKind::DmZonedModel => "dmzoned-model",
            SystemKind::ShaleZns => "shale-zns",
            SystemKind::ShaleBlk => "shale-blk",
            SystemKind::RaidModel => "raid-model",
            SystemKind::Raid5fModel => "raid5f-model",
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
        let lower = s.to_ascii_lowercase();
        SystemKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == lower)
            .ok_or_else(|| SetupError::UnknownSystem {
                name: s.into(),
                valid: SystemKind::names(),
            })
    }
}

/// What a system needs to be built, beyond the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemOptions {
    /// Preset of the capacity drive; `None` is the system's own (`qlc-p5316` for the
    /// baselines and `shale-blk`, `zns-qlc` for `shale-zns`).
    pub drive: Option<String>,
    /// Baselines: percentage of the drive left out of the volumes.
    pub host_spare_pct: u8,
    /// Shale: placement streams (8 isolates tenants, 1 mixes them).
    pub streams: u32,
    /// Shale: L2P page-cache budget; `None` is 12.5% of the table.
    pub l2p_cache_bytes: Option<u64>,
    /// `shale-zns` and the raid models: capacity drives (1: one drive, no array).
    pub capacity_devices: u32,
    /// How the capacity array keeps its data (`none`, `mirror`, `K+M`).
    pub capacity_redundancy: shale_array::Redundancy,
    /// `shale-zns`: cache drives (2 or more are mirrors).
    pub cache_devices: u32,
    /// Shale: how GC chooses its victim zones; `None` chooses by the capacity drive:
    /// `fifo` on a conventional drive (its erase units then empty whole), `greedy` on
    /// a zoned one.
    pub gc_policy: Option<shale_engine::GcPolicyKind>,
    /// Shale: how compaction chooses its victim chunks.
    pub compaction_policy: shale_engine::CompactionPolicyKind,
    /// Shale: how relocations are spread over the streams.
    pub placement: shale_engine::PlacementKind,
    /// Shale: engine shards, each with drives of its own (`ShaleConfig::shards`).
    pub shards: u32,
    /// Shale: writes this large go straight to a zone (0: none)...
    pub direct_write_min_bytes: u64,
    /// ... all of them, or those that continue a sequential run.
    pub direct_write_policy: shale_engine::DirectWritePolicy,
    /// Shale: how the tenants' volumes are mapped (their mapping unit).
    pub volume_layout: shale_engine::VolumeLayout,
    /// Shale: a cold tier behind the capacity drive (`ShaleConfig::cold`).
    pub cold: Option<ColdTier>,
}

impl Default for SystemOptions {
    fn default() -> SystemOptions {
        SystemOptions {
            drive: None,
            host_spare_pct: DEFAULT_HOST_SPARE_PCT,
            streams: 8,
            l2p_cache_bytes: None,
            capacity_devices: 1,
            capacity_redundancy: shale_array::Redundancy::None,
            cache_devices: 1,
            gc_policy: None,
            compaction_policy: shale_engine::CompactionPolicyKind::default(),
            placement: shale_engine::PlacementKind::default(),
            shards: 1,
            direct_write_min_bytes: 0,
            direct_write_policy: shale_engine::DirectWritePolicy::default(),
            volume_layout: shale_engine::VolumeLayout::default(),
            cold: None,
        }
    }
}

/// Builds the system `kind` for configuration `cfg`.
pub fn build_system(
    kind: SystemKind,
    cfg: &BenchConfig,
    opts: &SystemOptions,
) -> Result<Box<dyn SystemUnderTest + Send>, SetupError> {
    let arrayed = opts.capacity_devices != 1
        || opts.cache_devices != 1
        || opts.capacity_redundancy != shale_array::Redundancy::None;
    let raid = RaidConfig {
        capacity_bytes: cfg.capacity_bytes,
        tenants: cfg.tenants,
        host_spare_pct: opts.host_spare_pct,
        devices: opts.capacity_devices,
        redundancy: opts.capacity_redundancy,
        cache_pct: 5,
    };
    if opts.cold.is_some() && !matches!(kind, SystemKind::ShaleZns | SystemKind::ShaleBlk) {
        return Err(SetupError::EngineAdmin {
            step: "setup",
            reason: format!("{kind} has no tiers: a cold tier goes behind shale-zns or shale-blk"),
        });
    }
    match kind {
        SystemKind::RaidModel => return Ok(Box::new(RaidModel::new(&raid)?)),
        SystemKind::Raid5fModel => return Ok(Box::new(Raid5fModel::new(&raid)?)),
        SystemKind::Raw | SystemKind::OpenCasModel | SystemKind::DmZonedModel if arrayed => {
            return Err(SetupError::ArrayNeedsZns)
        }
        _ => {}
    }
    match kind {
        SystemKind::RaidModel | SystemKind::Raid5fModel => Err(SetupError::ArrayNeedsZns),
        SystemKind::Raw => Ok(Box::new(RawSystem::new(&RawConfig {
            preset: baseline_drive(opts),
            capacity_bytes: cfg.capacity_bytes,
            tenants: cfg.tenants,
            host_spare_pct: opts.host_spare_pct,
        })?)),
        SystemKind::OpenCasModel => Ok(Box::new(OpenCasModel::new(&OpenCasConfig {
            core_preset: baseline_drive(opts),
            host_spare_pct: opts.host_spare_pct,
            ..OpenCasConfig::standard(cfg.capacity_bytes, cfg.tenants)
        })?)),
        SystemKind::DmZonedModel => Ok(Box::new(DmZonedModel::new(&DmZonedConfig {
            host_spare_pct: opts.host_spare_pct,
            ..DmZonedConfig::standard(cfg.capacity_bytes, cfg.tenants)
        })?)),
        SystemKind::ShaleZns | SystemKind::ShaleBlk => {
            let mode = if kind == SystemKind::ShaleZns {
                ShaleMode::Zns
            } else {
                ShaleMode::Blk
            };
            build_shale(&ShaleConfig {
                queue_depth: cfg.queue_depth,
                streams: opts.streams,
                l2p_cache_bytes: opts.l2p_cache_bytes,
                capacity_devices: opts.capacity_devices,
                capacity_preset: opts.drive.clone(),
                capacity_redundancy: opts.capacity_redundancy,
                cache_devices: opts.cache_devices,
                gc_policy: opts.gc_policy.unwrap_or_else(|| {
                    shale_engine::GcPolicyKind::for_capacity(mode == ShaleMode::Zns)
                }),
                compaction_policy: opts.compaction_policy,
                placement: opts.placement,
                shards: opts.shards.max(1),
                direct_write_min_bytes: opts.direct_write_min_bytes,
                direct_write_policy: opts.direct_write_policy,
                volume_layout: opts.volume_layout,
                cold: opts.cold.clone(),
                ..ShaleConfig::standard(mode, cfg.capacity_bytes, cfg.tenants)
            })
        }
    }
}

/// The baselines' capacity drive: the one asked for, or the P5316.
fn baseline_drive(opts: &SystemOptions) -> String {
    opts.drive.clone().unwrap_or_else(|| "qlc-p5316".into())
}

/// Size of a block device that holds `zone_count` zones of `zone_bytes` under
/// [`shale_device::ZoneEmu`]: the zones, and the emulation's zone table before them,
/// which it aligns to 1 MiB.
pub(crate) fn zone_emu_inner_bytes(zone_bytes: u64, zone_count: u32) -> u64 {
    const ALIGN: u64 = 1 << 20;
    let table = (64 * 1024 + 64 * u64::from(zone_count)).div_ceil(ALIGN) * ALIGN;
    zone_bytes * u64::from(zone_count) + table + ALIGN
}

/// Zone emulation of exactly `zone_count` zones of `zone_bytes` over `inner`.
pub(crate) fn zoned_over<D: shale_device::BlockDevice>(
    inner: D,
    zone_bytes: u64,
    zone_count: u32,
) -> Result<shale_device::ZoneEmu<D>, SetupError> {
    let emu = shale_device::ZoneEmu::format(
        inner,
        &shale_device::ZoneEmuConfig {
            zone_count_max: zone_count,
            ..shale_device::ZoneEmuConfig::new(zone_bytes)
        },
    )?;
    let got = shale_device::ZonedDevice::geometry(&emu).zone_count;
    if got != zone_count {
        return Err(SetupError::Device(
            shale_device::DeviceError::InvalidGeometry {
                reason: format!("zone emulation fitted {got} zones, wanted {zone_count}"),
            },
        ));
    }
    Ok(emu)
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
    let mut w = spec
        .workload
        .workload_config(spec.block_bytes, sut.volume_bytes());
    w.read_pct = spec.read_pct;
    w.tenants = sut.volume_count();
    w.validate()?;
    Ok(())
}
