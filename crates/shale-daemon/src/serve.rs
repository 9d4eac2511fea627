//! Running the daemon: open (or create and format) the devices, start the engine
//! thread, export every volume over NBD, answer the admin socket, and on a stop
//! request drain, checkpoint and shut down cleanly.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use shale_device::{
    BlockDevice, DeviceError, FileDevice, Window, ZoneEmu, ZoneEmuConfig, ZonedDevice,
};
use shale_engine::{
    CompactionPolicyKind, Config as EngineConfig, EngineError, FormatDeviceError, GcPolicyKind,
    MonotonicClock, OpenError, PlacementKind, Reply, Request,
};
use shale_nbd::{Server, ServerConfig, ServerError, ServerLimits, TlsMode, TlsSettings};
use shale_shards::ShardsError;

use crate::admin::{AdminError, AdminServer};
use crate::backend::{CacheDevice, CapacityDevice, Engine, EngineBackend};
use crate::config::{
    CapacityMode, CompactionPolicy, Config, ConfigError, DirectWritePolicy, EngineKnobs, GcPolicy,
    Paths, Placement,
};
use crate::devices::{CacheMember, CapacityMember, Devices};
use crate::drive::DriveStats;

type CacheHandle = shale_array::ArrayHandle<CacheMember>;
type CapacityHandle = shale_array::ArrayHandle<CapacityMember>;
use crate::handler::DaemonAdmin;
use crate::notify::Notifier;
use shale_array::{MirrorDevice, Redundancy, ZoneArray};

/// Requests queued between the front-ends and the engine thread.
const ENGINE_QUEUE_DEPTH: usize = 1024;
/// Largest NBD read/write payload; the engine's request limit.
const PAYLOAD_BYTES_MAX: u32 = 4 << 20;
/// Name of the volume the embedded default creates.
pub const DEFAULT_VOLUME: &str = "default";
/// Open/active zone limits of the `zoned` capacity mode, as on a typical ZNS drive.
const ZNS_ACTIVE_ZONES_MAX: u32 = 14;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    // Like the four below, these say their cause in their message rather than as a
    // `source`, which an error chain printed whole would repeat.
    #[error("{what} {path}: {error}")]
    Device {
        what: &'static str,
        path: PathBuf,
        error: DeviceError,
    },
    #[error("{path}: {reason}")]
    Setup { path: PathBuf, reason: String },
    // These four say their cause in their own message and so do not also name it as
    // their `source`: an error chain printed whole would repeat it.
    #[error("formatting: {0}")]
    Format(FormatDeviceError),
    #[error("opening: {0}")]
    Open(OpenError),
    #[error("engine: {0}")]
    Engine(EngineError),
    #[error("NBD server: {0}")]
    Nbd(ServerError),
    #[error("shards: {0}")]
    Shards(ShardsError),
    #[error("vhost-user-blk: no volume named {volume:?} to serve on {}", socket.display())]
    VhostNoVolume { volume: String, socket: PathBuf },
    #[error("vhost-user-blk for volume {volume:?} on {}: {error}", socket.display())]
    Vhost {
        volume: String,
        socket: PathBuf,
        error: shale_vhost::ServeError,
    },
    #[error("ublk: no volume named {volume:?}")]
    UblkNoVolume { volume: String },
    #[error("ublk for volume {volume:?}: {reason}")]
    Ublk { volume: String, reason: String },
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("metrics endpoint {addr}: {error}")]
    Metrics { addr: String, error: std::io::Error },
    /// A device too small, with which flags set the sizes of the files format made.
    #[error("{error}; {hint}")]
    TooSmall {
        error: Box<DaemonError>,
        hint: String,
    },
    #[error("starting the engine thread: {0}")]
    Spawn(std::io::Error),
    #[error("starting the {what} thread: {error}")]
    Thread {
        what: &'static str,
        error: std::io::Error,
    },
    #[error("the engine failed and the daemon stopped serving: {reason}")]
    EngineFailed { reason: String },
}

impl From<FormatDeviceError> for DaemonError {
    fn from(e: FormatDeviceError) -> Self {
        DaemonError::Format(e)
    }
}

impl From<OpenError> for DaemonError {
    fn from(e: OpenError) -> Self {
        DaemonError::Open(e)
    }
}

impl From<EngineError> for DaemonError {
    fn from(e: EngineError) -> Self {
        DaemonError::Engine(e)
    }
}

impl From<ShardsError> for DaemonError {
    fn from(e: ShardsError) -> Self {
        // A single shard's format or open error reads as before.
        match e {
            // Shards are cut equal: what one says of its size, all would.
            ShardsError::Format { source, .. } => DaemonError::Format(source),
            ShardsError::Open { shard: 0, source } => DaemonError::Open(source),
            e => DaemonError::Shards(e),
        }
    }
}

impl From<ServerError> for DaemonError {
    fn from(e: ServerError) -> Self {
        DaemonError::Nbd(e)
    }
}

/// How long a daemon whose engine failed keeps answering (every request with an
/// error) before it exits: long enough for clients to get their error replies and
/// for a scraper or `shale stats` to see why, short enough for a supervisor to
/// restart it within seconds.
const FAILED_EXIT_GRACE: Duration = Duration::from_secs(2);

/// Device paths and format-time geometry taken from a [`Config`].
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// One cache device, or the members of a mirror.
    pub cache: Vec<PathBuf>,
    /// One capacity device, or the members of an array.
    pub capacity: Vec<PathBuf>,
    /// The capacity array's redundancy (`None`: one capacity device).
    pub redundancy: Option<Redundancy>,
    /// Pace of array rebuilds.
    pub rebuild_limits: shale_array::RebuildLimits,
    /// Pace of the background scrub, bytes per second (0: off).
    pub scrub_bytes_per_sec: u64,
    pub cache_size: u64,
    pub capacity_size: u64,
    pub mode: CapacityMode,
    pub chunk_bytes: u64,
    pub zone_bytes: u64,
    pub spare_factor: f64,
    /// Simulated-drive preset wrapped around the capacity file (counts NAND traffic
    /// since the daemon started; the data itself is the file's).
    pub drive: Option<String>,
    /// The cold tier's device, the size of a file format creates for it, and its
    /// simulated-drive preset.
    pub cold: Option<PathBuf>,
    pub cold_size: u64,
    pub cold_drive: Option<String>,
    /// `None`: the engine's default budgets.
    pub l2p_cache_bytes: Option<u64>,
    pub md_cache_bytes: Option<u64>,
    /// The engine's policies and thresholds (`[engine]`).
    pub engine: EngineKnobs,
}

impl DeviceSpec {
    pub fn from_config(c: &Config) -> Result<DeviceSpec, ConfigError> {
        c.validate()?;
        let d = &c.devices;
        let paths = |field: &'static str, p: &Paths| {
            p.list()
                .into_iter()
                .map(|p| {
                    c.expand(p).ok_or(ConfigError::Invalid {
                        field,
                        reason: "empty path".into(),
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(DeviceSpec {
            cache: paths("devices.cache", &d.cache)?,
            capacity: paths("devices.capacity", &d.capacity)?,
            redundancy: c.redundancy()?,
            scrub_bytes_per_sec: match &d.scrub_speed {
                Some(s) if s.0.trim() == "0" => 0,
                Some(s) => s.bytes("devices.scrub_speed")?,
                None => 8 << 20,
            },
            rebuild_limits: shale_array::RebuildLimits {
                min_bytes_per_sec: d.rebuild_speed_min.bytes("devices.rebuild_speed_min")?,
                max_bytes_per_sec: match &d.rebuild_speed_max {
                    Some(s) => s.bytes("devices.rebuild_speed_max")?,
                    None => 0,
                },
            },
            cache_size: d.cache_size.bytes("devices.cache_size")?,
            capacity_size: d.capacity_size.bytes("devices.capacity_size")?,
            mode: d.capacity_mode,
            chunk_bytes: d.chunk_size.bytes("devices.chunk_size")?,
            zone_bytes: d.zone_size.bytes("devices.zone_size")?,
            spare_factor: d.spare_factor,
            drive: d.drive.clone(),
            cold: match &d.cold {
                Some(p) => Some(paths("devices.cold", p)?.remove(0)),
                None => None,
            },
            cold_size: d.cold_size.bytes("devices.cold_size")?,
            cold_drive: d.cold_drive.clone(),
            l2p_cache_bytes: c
                .memory
                .l2p_cache_size
                .bytes_or_auto("memory.l2p_cache_size")?,
            md_cache_bytes: c
                .memory
                .md_cache_size
                .bytes_or_auto("memory.md_cache_size")?,
            engine: c.engine.clone(),
        })
    }

    pub(crate) fn engine_config(&self) -> Result<EngineConfig, ConfigError> {
        let chunk_blocks =
            u32::try_from(self.chunk_bytes / 4096).map_err(|_| ConfigError::Invalid {
                field: "devices.chunk_size",
                reason: "too large".into(),
            })?;
        let c = EngineConfig {
            chunk_blocks,
            spare_factor: self.spare_factor,
            request_bytes_max: u64::from(PAYLOAD_BYTES_MAX),
            // Enough group buffers (126 blocks each) for the largest request twice over.
            write_buffers_max: 2 * (PAYLOAD_BYTES_MAX / (126 * 4096) + 2),
            l2p_cache_bytes_max: self.l2p_cache_bytes,
            md_cache_bytes_max: self
                .md_cache_bytes
                .unwrap_or(EngineConfig::default().md_cache_bytes_max),
            scrub_bytes_per_sec: self.scrub_bytes_per_sec,
            // With mirrors a corrupt cache block has a good copy: compaction checks
            // what it moves and takes that copy, rather than carrying the corruption
            // into the capacity tier's parity.
            verify_compaction_reads: self.cache.len() > 1,
            gc_policy: match self.engine.gc_policy {
                GcPolicy::Auto => GcPolicyKind::for_capacity(self.zoned_capacity()),
                GcPolicy::Greedy => GcPolicyKind::Greedy,
                GcPolicy::CostBenefit => GcPolicyKind::CostBenefit,
                GcPolicy::Fifo => GcPolicyKind::Fifo,
            },
            compaction_policy: match self.engine.compaction_policy {
                CompactionPolicy::Fifo => CompactionPolicyKind::FifoOldestClosed,
                CompactionPolicy::FewestValid => CompactionPolicyKind::FewestValid,
                CompactionPolicy::CostBenefit => CompactionPolicyKind::CostBenefit,
            },
            placement: match self.engine.placement {
                Placement::Volume => PlacementKind::Volume,
                Placement::Lifetime => PlacementKind::Lifetime,
            },
            compaction_free_chunks_pct: self.engine.compaction_free_chunks_pct,
            gc_free_zones_min: self.engine.gc_free_zones_min,
            streams_max: self.engine.streams,
            checkpoint_interval_bytes: self.engine.validate()?,
            direct_write_min_bytes: self.engine.direct_write_min_bytes()?,
            direct_write_policy: match self.engine.direct_write_policy {
                DirectWritePolicy::Sequential => shale_engine::DirectWritePolicy::Sequential,
                DirectWritePolicy::Any => shale_engine::DirectWritePolicy::Any,
            },
            promote_reads: self.engine.promote_reads,
            ..EngineConfig::default()
        };
        c.validate().map_err(|e| ConfigError::Invalid {
            field: "devices",
            reason: e.to_string(),
        })?;
        Ok(c)
    }

    /// Whether the capacity's zones are a zoned drive's own (or simulated ZNS), rather
    /// than emulated on a conventional device. A path that cannot be looked at counts
    /// as conventional (opening it reports the error).
    fn zoned_capacity(&self) -> bool {
        self.mode == CapacityMode::Zoned
            || self
                .capacity
                .iter()
                .any(|p| shale_device::is_zoned_block_device(p).unwrap_or(false))
    }

    pub(crate) fn zone_config(&self) -> ZoneEmuConfig {
        let mut z = ZoneEmuConfig::new(self.zone_bytes);
        if self.mode == CapacityMode::Zoned {
            z.max_open_zones = ZNS_ACTIVE_ZONES_MAX;
            z.max_active_zones = ZNS_ACTIVE_ZONES_MAX;
        }
        z
    }
}

fn open_file(what: &'static str, path: &Path) -> Result<FileDevice, DaemonError> {
    FileDevice::open(path).map_err(|error| DaemonError::Device {
        what,
        path: path.to_path_buf(),
        error,
    })
}

/// The capacity file with zone emulation, and the simulated drive if one is named:
/// a conventional preset sits under the zone emulation (CSAL-BLK: a zone reset is a
/// TRIM the drive model sees); a zoned preset sits on top of it (ZNS). The drive's
/// counters come back with it, since the device itself moves into the engine.
fn capacity_file(
    spec: &DeviceSpec,
    path: &Path,
    format: bool,
    drive_preset: Option<&String>,
) -> Result<(CapacityDevice, Option<DriveStats>), DaemonError> {
    if is_zoned_drive(path)? {
        // The drive keeps its own zones: no emulation, and no simulated drive.
        if drive_preset.is_some() {
            return Err(DaemonError::Setup {
                path: path.to_path_buf(),
                reason: "is a zoned block device; a simulated drive (--drive) wraps a file".into(),
            });
        }
        let how = if format {
            shale_device::DriveOpen::Format
        } else {
            shale_device::DriveOpen::Open
        };
        let dev =
            shale_device::open_zoned_drive(path, how).map_err(|error| DaemonError::Device {
                what: "zoned block device",
                path: path.to_path_buf(),
                error,
            })?;
        tracing::info!(path = %path.display(), device = %dev.geometry().name,
            zones = dev.geometry().zone_count,
            zone_mib = dev.geometry().zone_size >> 20,
            capacity_mib = dev.geometry().zone_capacity >> 20,
            max_open = dev.geometry().max_open_zones,
            max_active = dev.geometry().max_active_zones, "capacity: a zoned block device");
        return Ok((Box::new(dev), None));
    }
    let file = open_file("capacity device", path)?;
    let preset = match drive_preset {
        Some(name) => Some(
            shale_flashsim::preset(name).map_err(|e| DaemonError::Setup {
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?,
        ),
        None => None,
    };
    let sim_err = |e: shale_flashsim::FlashSimError| DaemonError::Setup {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let zoned_preset = matches!(
        preset.as_ref().map(|p| &p.kind),
        Some(shale_flashsim::PresetKind::Zoned { .. })
    );
    let mut drive = None;
    let inner: Box<dyn BlockDevice + Send> = match &preset {
        Some(p) if !zoned_preset => {
            let sim = shale_flashsim::FlashSim::from_preset(file, p).map_err(sim_err)?;
            drive = Some(DriveStats::new(p.name, sim.stats_handle()));
            Box::new(sim)
        }
        _ => Box::new(file),
    };
    let emu = zone_emulation(spec, inner, format, path)?;
    match &preset {
        Some(p) if zoned_preset => {
            let sim = shale_flashsim::ZnsSim::from_preset(emu, p).map_err(sim_err)?;
            let stats = DriveStats::new(p.name, sim.stats_handle());
            Ok((Box::new(sim), Some(stats)))
        }
        _ => Ok((Box::new(emu), drive)),
    }
}

/// Zone emulation on `inner` (part of the device at `path`): formatted anew with the
/// spec's zones, or opened as recorded.
fn zone_emulation(
    spec: &DeviceSpec,
    inner: Box<dyn BlockDevice + Send>,
    format: bool,
    path: &Path,
) -> Result<ZoneEmu<Box<dyn BlockDevice + Send>>, DaemonError> {
    if format {
        ZoneEmu::format(inner, &spec.zone_config())
    } else {
        ZoneEmu::open(inner)
    }
    .map_err(|error| DaemonError::Device {
        what: "zone emulation on",
        path: path.to_path_buf(),
        error,
    })
}

/// A setup error about the whole set of devices (named by the first).
fn set_error(paths: &[PathBuf], reason: String) -> DaemonError {
    DaemonError::Setup {
        path: paths.first().cloned().unwrap_or_default(),
        reason,
    }
}

/// The capacity device: one file, or an array of files put together by their labels
/// (`format` labels them anew in `pool`). Members whose file is missing at open are
/// left out; the array decides whether the rest suffice.
fn capacity_device(
    spec: &DeviceSpec,
    format: bool,
    pool: [u8; 16],
) -> Result<(CapacityDevice, Option<DriveStats>, Option<CapacityHandle>), DaemonError> {
    let Some(r) = spec.redundancy else {
        let path = &spec.capacity[0];
        let (mut dev, drive) = capacity_file(spec, path, format, spec.drive.as_ref())?;
        let name = path.display().to_string();
        if !format && shale_array::label::read_zoned(&mut dev, &name).is_ok() {
            // One member of an array named alone: the array decides if it is enough.
            let mut array = ZoneArray::open(vec![(dev, name)])
                .map_err(|e| set_error(&spec.capacity, format!("capacity array: {e}")))?;
            array.set_rebuild_limits(spec.rebuild_limits);
            let h = array.handle();
            return Ok((Box::new(array), None, Some(h)));
        }
        return Ok((dev, drive, None));
    };
    if spec.drive.is_some() {
        return Err(set_error(
            &spec.capacity,
            "a simulated drive (--drive) wraps one capacity device, not an array".into(),
        ));
    }
    let mut members = Vec::new();
    for path in &spec.capacity {
        if !format && !path.exists() {
            tracing::warn!(path = %path.display(), "capacity array member missing");
            continue;
        }
        let (dev, _) = capacity_file(spec, path, format, spec.drive.as_ref())?;
        members.push((dev, path.display().to_string()));
    }
    let mut array = if format {
        let (k, _) = r
            .shards(members.len())
            .map_err(|e| set_error(&spec.capacity, e.to_string()))?;
        let unit = shale_array::StripeLayout::choose_unit(k, 4096)
            .map_err(|e| set_error(&spec.capacity, e.to_string()))?;
        ZoneArray::create(members, r, unit, pool)
    } else {
        ZoneArray::open(members)
    }
    .map_err(|e| set_error(&spec.capacity, format!("capacity array: {e}")))?;
    array.set_rebuild_limits(spec.rebuild_limits);
    let h = array.handle();
    Ok((Box::new(array), None, Some(h)))
}

/// The capacity device with the cold tier behind it, if the spec names one (the cold
/// device's zones last, `ZonedConcat::tiers`), the cold zones, and the pool the cold
/// device's label names (`cold.rs`). Format (`pool`: the new pool's UUID) labels the
/// device for it.
fn with_cold_tier(
    spec: &DeviceSpec,
    capacity: CapacityDevice,
    pool: Option<[u8; 16]>,
) -> Result<(CapacityDevice, u32, Option<[u8; 16]>), DaemonError> {
    let Some(path) = &spec.cold else {
        return Ok((capacity, 0, None));
    };
    let (cold, _) = capacity_file(spec, path, pool.is_some(), spec.cold_drive.as_ref())?;
    let cold = match pool {
        Some(pool) => crate::cold::format(cold, pool),
        None => crate::cold::open(cold),
    }
    .map_err(|reason| DaemonError::Setup {
        path: path.clone(),
        reason: format!("cold tier device: {reason}"),
    })?;
    let zones = cold.device.geometry().zone_count;
    let tiers = shale_device::ZonedConcat::tiers(capacity, cold.device).map_err(|error| {
        DaemonError::Device {
            what: "cold tier",
            path: path.clone(),
            error,
        }
    })?;
    tracing::info!(path = %path.display(), zones, "capacity: a cold tier behind it");
    Ok((Box::new(tiers), zones, cold.pool))
}

/// The cache device: one file, or a mirror of files put together by their labels.
fn cache_device(
    spec: &DeviceSpec,
    format: bool,
    pool: [u8; 16],
) -> Result<(CacheDevice, Option<CacheHandle>), DaemonError> {
    if let [path] = spec.cache.as_slice() {
        let mut dev = open_file("cache device", path)?;
        let name = path.display().to_string();
        if format || shale_array::label::read_block(&mut dev, &name).is_err() {
            return Ok((Box::new(dev), None));
        }
        // One mirror named alone.
        let members: Vec<(Box<dyn BlockDevice + Send>, String)> = vec![(Box::new(dev), name)];
        let mut mirror = MirrorDevice::open(members)
            .map_err(|e| set_error(&spec.cache, format!("cache mirror: {e}")))?;
        mirror.set_rebuild_limits(spec.rebuild_limits);
        let h = mirror.handle();
        return Ok((Box::new(mirror), Some(h)));
    }
    let mut members: Vec<(Box<dyn BlockDevice + Send>, String)> = Vec::new();
    for path in &spec.cache {
        if !format && !path.exists() {
            tracing::warn!(path = %path.display(), "cache mirror missing");
            continue;
        }
        members.push((
            Box::new(open_file("cache device", path)?),
            path.display().to_string(),
        ));
    }
    let mut mirror = if format {
        MirrorDevice::create(members, pool)
    } else {
        MirrorDevice::open(members)
    }
    .map_err(|e| set_error(&spec.cache, format!("cache mirror: {e}")))?;
    mirror.set_rebuild_limits(spec.rebuild_limits);
    let h = mirror.handle();
    Ok((Box::new(mirror), Some(h)))
}

/// Every device path of the spec, cache first.
fn all_paths(spec: &DeviceSpec) -> impl Iterator<Item = &PathBuf> {
    spec.cache
        .iter()
        .chain(spec.capacity.iter())
        .chain(spec.cold.iter())
}

/// Advisory exclusive locks (flock) on both device files, held while a daemon or a
/// format uses them. Without them a second `shale serve` on the same devices would
/// take the running engine's devices for a crashed one, recover them and write a
/// checkpoint underneath it.
#[derive(Debug)]
pub struct DeviceLock {
    _files: Vec<std::fs::File>,
}

impl DeviceLock {
    /// Locks every device of the spec that exists (a missing array member has no
    /// file to lock).
    pub fn acquire(spec: &DeviceSpec) -> Result<DeviceLock, DaemonError> {
        let paths: Vec<&Path> = all_paths(spec)
            .filter(|p| p.exists())
            .map(PathBuf::as_path)
            .collect();
        Self::lock(&paths, false)
    }

    /// Shared locks, for readers that must not run under a live engine (`shale
    /// check`): refused while a daemon or a format holds the devices.
    pub fn acquire_shared(paths: &[&Path]) -> Result<DeviceLock, DaemonError> {
        Self::lock(paths, true)
    }

    fn lock(paths: &[&Path], shared: bool) -> Result<DeviceLock, DaemonError> {
        let mut files = Vec::new();
        for &path in paths {
            let setup = |reason: String| DaemonError::Setup {
                path: path.to_path_buf(),
                reason,
            };
            let f = std::fs::File::open(path).map_err(|e| setup(e.to_string()))?;
            let locked = if shared {
                f.try_lock_shared()
            } else {
                f.try_lock()
            };
            match locked {
                Ok(()) => files.push(f),
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(setup(
                        "in use by another shale process (it holds the device lock)".into(),
                    ))
                }
                Err(std::fs::TryLockError::Error(e)) => return Err(setup(format!("locking: {e}"))),
            }
        }
        Ok(DeviceLock { _files: files })
    }
}

/// True if a cache device already carries a Shale superblock (either copy) or an
/// array label.
pub fn has_shale_superblock(path: &Path) -> Result<bool, DaemonError> {
    let mut dev = open_file("cache device", path)?;
    if dev.size_bytes() >= 8192 && shale_array::label::read_block(&mut dev, "").is_ok() {
        return Ok(true);
    }
    let mut b = vec![0u8; 8192];
    if dev.size_bytes() < 8192 {
        return Ok(false);
    }
    dev.read_at(0, &mut b)
        .map_err(|error| DaemonError::Device {
            what: "cache device",
            path: path.to_path_buf(),
            error,
        })?;
    Ok(shale_format::Superblock::decode(&b[..4096], 0).is_ok()
        || shale_format::Superblock::decode(&b[4096..], 4096).is_ok())
}

/// Watches the steps of a format: the CLI draws a progress bar on a terminal. Every
/// step is also logged (tracing) with its duration, bar or not.
pub trait FormatProgress {
    /// Step `index` (0-based) of `total` starts.
    fn begin(&mut self, index: usize, total: usize, step: &str);
    /// The step ended; `detail` says what it did.
    fn end(&mut self, step: &str, elapsed: Duration, detail: &str);
}

/// Progress that only logs.
#[derive(Debug, Default)]
pub struct LogOnly;

impl FormatProgress for LogOnly {
    fn begin(&mut self, _: usize, _: usize, _: &str) {}
    fn end(&mut self, _: &str, _: Duration, _: &str) {}
}

/// Runs the steps of a format in order, timing and logging each.
struct FormatSteps<'a> {
    progress: &'a mut dyn FormatProgress,
    index: usize,
    total: usize,
}

impl FormatSteps<'_> {
    fn step<T>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> Result<(T, String), DaemonError>,
    ) -> Result<T, DaemonError> {
        self.progress.begin(self.index, self.total, name);
        let started = std::time::Instant::now();
        let (value, detail) = f()?;
        let elapsed = started.elapsed();
        tracing::info!(
            step = name,
            duration_ms = elapsed.as_secs_f64() * 1e3,
            detail = %detail,
            "format step"
        );
        self.progress.end(name, elapsed, &detail);
        self.index += 1;
        Ok(value)
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Formats the devices named by `spec` (creating sparse files where they do not
/// exist) and creates the volumes planned, with their limits (a plan without a size
/// takes what the ones before it left).
///
/// Steps: create files (if any is missing), zone emulation on the capacity device
/// (which discards its whole data area: instant on a sparse file, slow on some
/// drives), cache metadata (superblock, journal, first checkpoint), volumes, and a
/// final checkpoint with the clean flag.
pub fn format(
    spec: &DeviceSpec,
    force: bool,
    volumes: &[VolumePlan],
    progress: &mut dyn FormatProgress,
) -> Result<Vec<shale_engine::VolumeInfo>, DaemonError> {
    let missing: Vec<(&PathBuf, u64)> = spec
        .cache
        .iter()
        .map(|p| (p, spec.cache_size))
        .chain(spec.capacity.iter().map(|p| (p, spec.capacity_size)))
        .chain(spec.cold.iter().map(|p| (p, spec.cold_size)))
        .filter(|(p, _)| !p.exists())
        .collect();
    let mut steps = FormatSteps {
        progress,
        index: 0,
        total: 4 + usize::from(!missing.is_empty()),
    };
    let made: Vec<PathBuf> = missing.iter().map(|(p, _)| (*p).clone()).collect();
    let r = format_steps(spec, force, volumes, &missing, &mut steps)
        .map_err(|e| size_hint(e, spec, &missing));
    if r.is_err() {
        // A failed format leaves no half-made files behind: the ones it created go
        // (files that were there before are left as they are), so it can be run again
        // with other sizes without --force.
        for p in made.iter().filter(|p| p.exists()) {
            if let Err(e) = std::fs::remove_file(p) {
                tracing::warn!(path = %p.display(), error = %e, "could not remove a file the failed format created");
            }
        }
    }
    r
}

/// A too-small error of a format that created files names the flags their sizes came
/// from (the defaults are what a user who gave none gets).
fn size_hint(e: DaemonError, spec: &DeviceSpec, made: &[(&PathBuf, u64)]) -> DaemonError {
    let too_small = matches!(
        e,
        DaemonError::Format(FormatDeviceError::TooSmall { .. })
            | DaemonError::Device {
                error: DeviceError::TooSmall { .. },
                ..
            }
    );
    if !too_small || made.is_empty() {
        return e;
    }
    // A device error names its file: only that one's flag.
    let made: Vec<&PathBuf> = match &e {
        DaemonError::Device { path, .. } => made
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| *p == path)
            .collect(),
        _ => made.iter().map(|(p, _)| *p).collect(),
    };
    if made.is_empty() {
        return e;
    }
    let mut flags = Vec::new();
    if made.iter().any(|p| spec.cache.contains(p)) {
        flags.push(format!(
            "--cache-size (now {})",
            human_bytes(spec.cache_size)
        ));
    }
    if made.iter().any(|p| spec.capacity.contains(p)) {
        flags.push(format!(
            "--capacity-size (now {})",
            human_bytes(spec.capacity_size)
        ));
    }
    if made.iter().any(|p| spec.cold.as_ref() == Some(*p)) {
        flags.push(format!("--cold-size (now {})", human_bytes(spec.cold_size)));
    }
    DaemonError::TooSmall {
        error: Box::new(e),
        hint: format!(
            "format created the files with sizes from {}: give larger ones",
            flags.join(" and ")
        ),
    }
}

/// Bytes as the size flags take them (`64MiB`, `1GiB`), or plain bytes.
fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}MiB", b >> 20),
        b => format!("{b} bytes"),
    }
}

/// A volume `shale format` creates: `NAME[:SIZE][,key=value…]` on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumePlan {
    pub name: String,
    /// `None`: what the volumes before it leave of the user capacity.
    pub size_bytes: Option<u64>,
    pub limits: shale_engine::VolumeLimits,
    /// How it is mapped (`map-unit`, `dual-map`), fixed at creation.
    pub layout: shale_engine::VolumeLayout,
}

/// Option keys `VolumePlan::parse` takes after the name and size.
pub const VOLUME_PLAN_KEYS: &[&str] = &[
    "iops-max",
    "mibps-max",
    "cache-share",
    "gc",
    "map-unit",
    "dual-map",
];

/// The unit map's unit of a dual-mapped volume when none is named: 64 KiB (SALSA's).
pub const DUAL_MAP_UNIT_DEFAULT: u64 = 64 << 10;

/// `layout` dual mapped (`dual`), its unit 64 KiB unless `unit_named`.
pub fn dual_layout(
    mut layout: shale_engine::VolumeLayout,
    dual: bool,
    unit_named: bool,
) -> Result<shale_engine::VolumeLayout, String> {
    if !dual {
        return Ok(layout);
    }
    if !unit_named {
        layout = shale_engine::VolumeLayout::with_map_unit(DUAL_MAP_UNIT_DEFAULT)?;
    }
    if layout.map_unit_shift == 0 {
        return Err("dual mapping needs a mapping unit above 4KiB (its coarse map)".into());
    }
    layout.dual = true;
    Ok(layout)
}

/// A mapping unit by size (`4KiB` to `64KiB`, a power of two).
pub fn parse_map_unit(s: &str) -> Result<shale_engine::VolumeLayout, String> {
    let bytes = shale_workload::parse_size(s).map_err(|e| format!("map unit {s:?}: {e}"))?;
    shale_engine::VolumeLayout::with_map_unit(bytes)
}

/// A volume's GC policy by name: `greedy`, `cost-benefit`, or `pool` (the pool's).
pub fn parse_volume_gc(s: &str) -> Result<shale_engine::VolumeGc, String> {
    match s {
        "pool" | "none" => Ok(shale_engine::VolumeGc::Pool),
        "greedy" => Ok(shale_engine::VolumeGc::Greedy),
        "cost-benefit" => Ok(shale_engine::VolumeGc::CostBenefit),
        other => Err(format!(
            "unknown GC policy {other:?} (expected greedy, cost-benefit or pool)"
        )),
    }
}

/// The name `parse_volume_gc` takes; `None` for the pool's.
pub fn volume_gc_name(gc: shale_engine::VolumeGc) -> Option<&'static str> {
    match gc {
        shale_engine::VolumeGc::Pool => None,
        shale_engine::VolumeGc::Greedy => Some("greedy"),
        shale_engine::VolumeGc::CostBenefit => Some("cost-benefit"),
    }
}

impl VolumePlan {
    /// A volume named `name`, sized by what is left, without limits.
    pub fn named(name: &str) -> VolumePlan {
        VolumePlan {
            name: name.to_string(),
            size_bytes: None,
            limits: shale_engine::VolumeLimits::NONE,
            layout: shale_engine::VolumeLayout::default(),
        }
    }

    /// Parses `NAME[:SIZE][,key=value…]` (keys: [`VOLUME_PLAN_KEYS`]; `none` or 0
    /// is no limit).
    pub fn parse(text: &str) -> Result<VolumePlan, String> {
        let mut parts = text.split(',');
        let head = parts.next().unwrap_or_default();
        let mut plan = match head.split_once(':') {
            Some((name, size)) => VolumePlan {
                size_bytes: Some(
                    shale_workload::parse_size(size)
                        .map_err(|e| format!("volume {name:?}: size {size:?}: {e}"))?,
                ),
                ..VolumePlan::named(name)
            },
            None => VolumePlan::named(head),
        };
        if plan.name.is_empty() {
            return Err(format!("volume {text:?}: no name"));
        }
        if plan.name.len() > shale_format::VOLUME_NAME_MAX {
            return Err(format!(
                "volume {:?}: names are at most {} bytes",
                plan.name,
                shale_format::VOLUME_NAME_MAX
            ));
        }
        if let Some(b) = plan.size_bytes {
            if b == 0 || b % 4096 != 0 {
                return Err(format!(
                    "volume {:?}: size {b} is not a positive multiple of 4 KiB",
                    plan.name
                ));
            }
        }
        let (mut dual, mut unit_named) = (false, false);
        for opt in parts {
            let Some((key, value)) = opt.split_once('=') else {
                return Err(format!(
                    "volume {:?}: option {opt:?} is not key=value",
                    plan.name
                ));
            };
            let name = plan.name.clone();
            let num = |value: &str| -> Result<u64, String> {
                if value == "none" {
                    return Ok(0);
                }
                value
                    .parse::<u64>()
                    .map_err(|e| format!("volume {name:?}: {key} = {value:?}: {e}"))
            };
            match key {
                "iops-max" => plan.limits.iops_max = num(value)?,
                "map-unit" => {
                    plan.layout =
                        parse_map_unit(value).map_err(|e| format!("volume {name:?}: {e}"))?;
                    unit_named = true;
                }
                "dual-map" => {
                    dual = match value {
                        "yes" | "on" | "true" => true,
                        "no" | "off" | "false" => false,
                        v => {
                            return Err(format!(
                                "volume {name:?}: dual-map = {v:?} (expected yes or no)"
                            ))
                        }
                    };
                }
                "gc" => {
                    plan.limits.gc =
                        parse_volume_gc(value).map_err(|e| format!("volume {name:?}: {e}"))?;
                }
                "cache-share" => {
                    plan.limits.cache_share_pct = match num(value.trim_end_matches('%'))? {
                        p @ 0..=100 => p as u8,
                        p => {
                            return Err(format!(
                                "volume {name:?}: cache-share {p} is past 100 (percent)"
                            ))
                        }
                    };
                }
                "mibps-max" => {
                    plan.limits.bytes_per_sec_max =
                        num(value)?.checked_mul(1 << 20).ok_or_else(|| {
                            format!("volume {name:?}: mibps-max {value} is too large")
                        })?;
                }
                _ => {
                    return Err(format!(
                        "volume {name:?}: unknown option {key:?} (known: {})",
                        VOLUME_PLAN_KEYS.join(", ")
                    ))
                }
            }
        }
        plan.layout = dual_layout(plan.layout, dual, unit_named)
            .map_err(|e| format!("volume {:?}: {e}", plan.name))?;
        Ok(plan)
    }
}

/// Creates `plan`'s volume at `bytes`. A dual volume sized by what is left takes what
/// its maps have room for: they may take a sixteenth more than a 4 KiB volume's.
fn create_planned(
    mut call: impl FnMut(Request) -> Result<Reply, EngineError>,
    plan: &VolumePlan,
    bytes: u64,
) -> Result<Reply, EngineError> {
    let unit = plan.layout.map_unit_bytes();
    let mut bytes = bytes;
    let mut tries = 0;
    loop {
        let r = create_volume(
            &mut call,
            plan.name.clone(),
            bytes,
            plan.limits,
            plan.layout,
        );
        match r {
            Err(e)
                if plan.size_bytes.is_none()
                    && plan.layout.dual
                    && tries < 4
                    && e.to_string().contains("no L2P room") =>
            {
                tries += 1;
                bytes = bytes / 17 * 16 / unit * unit;
            }
            r => return r,
        }
    }
}

/// Creates a volume laid out as `layout` with `limits` through `call`; if the limits
/// cannot be set the volume is deleted again (a volume without the limits asked for
/// is not what was asked for).
pub fn create_volume(
    mut call: impl FnMut(Request) -> Result<Reply, EngineError>,
    name: String,
    size_bytes: u64,
    limits: shale_engine::VolumeLimits,
    layout: shale_engine::VolumeLayout,
) -> Result<Reply, EngineError> {
    let create = if layout == shale_engine::VolumeLayout::default() {
        Request::CreateVolume { name, size_bytes }
    } else {
        Request::CreateVolumeWith {
            name,
            size_bytes,
            layout,
        }
    };
    let v = match call(create) {
        Ok(Reply::Volume(v)) if !limits.is_none() => v,
        other => return other,
    };
    let set = call(Request::SetVolumeLimits {
        volume: v.uid,
        limits,
    });
    if set.is_err() {
        let _ = call(Request::DeleteVolume { volume: v.uid });
    }
    set
}

/// Checks a list of volume plans as a whole: at most as many as a pool holds, names
/// unique, and only the last without a size (one without a size takes what is left).
pub fn check_volume_plans(plans: &[VolumePlan]) -> Result<(), String> {
    let max = shale_engine::Config::default().volumes_max as usize;
    if plans.len() > max {
        return Err(format!(
            "{} volumes; a pool holds at most {max}",
            plans.len()
        ));
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, p) in plans.iter().enumerate() {
        if !names.insert(p.name.as_str()) {
            return Err(format!("volume {:?} is named twice", p.name));
        }
        if p.size_bytes.is_none() && i + 1 < plans.len() {
            return Err(format!(
                "volume {:?} has no size, so it takes what is left and {:?} after it gets nothing; give it a size or list it last",
                p.name,
                plans[i + 1].name
            ));
        }
    }
    Ok(())
}

/// The volumes `[devices] volumes` plans (checked by `Config::validate`).
pub fn config_volume_plans(config: &Config) -> Result<Vec<VolumePlan>, ConfigError> {
    config
        .devices
        .volumes
        .iter()
        .map(|v| {
            VolumePlan::parse(v).map_err(|reason| ConfigError::Invalid {
                field: "devices.volumes",
                reason,
            })
        })
        .collect()
}

fn format_steps(
    spec: &DeviceSpec,
    force: bool,
    volumes: &[VolumePlan],
    missing: &[(&PathBuf, u64)],
    steps: &mut FormatSteps<'_>,
) -> Result<Vec<shale_engine::VolumeInfo>, DaemonError> {
    if !missing.is_empty() {
        steps.step("create sparse files", || {
            for &(path, size) in missing {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    create_private_dir(dir)?;
                }
                FileDevice::create_sparse(path, size).map_err(|error| DaemonError::Device {
                    what: "creating",
                    path: path.clone(),
                    error,
                })?;
            }
            let names: Vec<String> = missing
                .iter()
                .map(|(p, size)| format!("{} ({})", p.display(), gib(*size)))
                .collect();
            Ok(((), names.join(", ")))
        })?;
    }
    let _lock = DeviceLock::acquire(spec)?;
    for path in &spec.cache {
        if !force && has_shale_superblock(path)? {
            return Err(DaemonError::Setup {
                path: path.clone(),
                reason:
                    "already holds a Shale superblock or array label; pass --force to overwrite it"
                        .into(),
            });
        }
    }
    let mut engine_config = spec.engine_config()?;
    let pool = *uuid::Uuid::new_v4().as_bytes();
    let shards = spec.engine.shards as usize;
    let mut cold_zones = 0;
    let devices = steps.step("capacity: zone emulation, discard", || {
        if shards > 1 {
            return format_shard_devices(spec, shards, pool, &mut engine_config);
        }
        let (capacity, _, _) = capacity_device(spec, true, pool)?;
        let (capacity, cold, _) = with_cold_tier(spec, capacity, Some(pool))?;
        cold_zones = cold;
        let g = capacity.geometry();
        // A zoned drive keeps its own zones: the engine's format resets them.
        let mut detail = if g.name.contains("zoned(") {
            format!(
                "{} zones of {} MiB ({} MiB writable) on a zoned drive",
                g.zone_count,
                g.zone_size >> 20,
                g.zone_capacity >> 20
            )
        } else {
            format!(
                "{} zones of {} MiB, {} discarded",
                g.zone_count,
                g.zone_size >> 20,
                gib(u64::from(g.zone_count) * g.zone_size)
            )
        };
        if cold > 0 {
            detail.push_str(&format!(", the last {cold} on the cold device"));
        }
        let (cache, _) = cache_device(spec, true, pool)?;
        Ok((vec![(cache, capacity)], detail))
    })?;
    engine_config.cold_zones = cold_zones;
    // The superblock takes the UUID the cold device's label names.
    engine_config.pool_uuid = (cold_zones > 0).then_some(pool);
    let engine = steps.step("cache: superblock, journal, checkpoint", || {
        let engine = Engine::format(
            devices,
            MonotonicClock::new,
            &engine_config,
            shale_shards::GRANULE_BYTES_DEFAULT,
            ENGINE_QUEUE_DEPTH,
        )?;
        let detail = format!("{} of user capacity", gib(engine.user_capacity_bytes()));
        Ok((engine, detail))
    })?;
    let created = steps.step("volumes", || {
        let mut created = Vec::new();
        for plan in volumes {
            // Whole units (what is left may not be).
            let unit = plan.layout.map_unit_bytes();
            let bytes = match plan.size_bytes {
                Some(b) => b / 4096 * 4096,
                None => engine.available_bytes()? / unit * unit,
            };
            let reply = create_planned(|r| engine.call(r), plan, bytes)?;
            if let Reply::Volume(info) = reply {
                created.push(info);
            }
        }
        let detail = format!("{} created", created.len());
        Ok((created, detail))
    })?;
    steps.step("checkpoint, clean flag", || {
        engine.shutdown()?;
        Ok(((), "devices marked clean".to_string()))
    })?;
    Ok(created)
}

/// The newest valid superblock at the start of a cache device (`None` for an array
/// label, or none that decodes: opening it reports why).
fn recorded_superblock(path: &Path) -> Option<shale_format::Superblock> {
    let mut dev = FileDevice::open(path).ok()?;
    let mut b = vec![0u8; 8192];
    if dev.size_bytes() < 8192 || dev.read_at(0, &mut b).is_err() {
        return None;
    }
    [
        shale_format::Superblock::decode(&b[..4096], 0),
        shale_format::Superblock::decode(&b[4096..], 4096),
    ]
    .into_iter()
    .flatten()
    .max_by_key(|sb| sb.generation)
}

/// Where the shards of a pool on one cache device are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardWindows {
    pub shards: usize,
    /// The length of each shard's cache window (shard `i`'s at `i` times it).
    pub cache: u64,
    /// How the shards divide the capacity.
    pub capacity: CapacityCut,
    /// The shards share the cache, divided so (`cache` is then 0).
    pub cache_split: Option<shale_device::CacheSplit>,
}

/// How the shards of a pool divide its capacity device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapacityCut {
    /// One device, all its zones seen by every shard (`shale_device::SharedZones`),
    /// each zone held by one shard; the space manager moves free zones between them.
    Shared,
    /// Fixed windows of a file of this many bytes each (shard `i`'s at `i` times
    /// it), each with zone emulation of its own.
    Windows(u64),
    /// Fixed runs of a zoned drive's zones (`shale_device::open_zoned_drive_shard`).
    DriveRuns,
}

/// A pool of several shards on one cache device: how many, and where each is, as
/// shard 0 recorded them; `None` for a pool of one shard (or nothing recorded).
/// Shards over a capacity array (several `capacity` paths) share it.
pub fn recorded_shard_windows(
    cache: &Path,
    capacity: &[PathBuf],
) -> Result<Option<ShardWindows>, DaemonError> {
    let Some(sb) = recorded_superblock(cache).filter(|sb| sb.shard.count > 1) else {
        return Ok(None);
    };
    let n = usize::from(sb.shard.count);
    if let Some(split) = recorded_cache_split_of(cache)? {
        return Ok(Some(ShardWindows {
            shards: n,
            cache: 0,
            capacity: CapacityCut::Shared,
            cache_split: Some(split),
        }));
    }
    let (c, z) = match capacity {
        [one] => shard_strides(cache, one, n, Cut::Recorded(&sb))?,
        _ => (sb.cache_size_blocks * 4096, CapacityCut::Shared),
    };
    Ok(Some(ShardWindows {
        shards: n,
        cache: c,
        capacity: z,
        cache_split: None,
    }))
}

/// Whether `path` is a zoned block device (a drive whose zones the shards divide,
/// rather than a file cut into windows).
fn is_zoned_drive(path: &Path) -> Result<bool, DaemonError> {
    shale_device::is_zoned_block_device(path).map_err(|source| DaemonError::Device {
        what: "capacity device",
        path: path.to_path_buf(),
        error: DeviceError::OpenFailed {
            path: path.display().to_string(),
            source,
        },
    })
}

/// How a device pair is cut into shards' windows.
enum Cut<'a> {
    /// At format: zones of this emulation; `shared`: one capacity device for all.
    Format(&'a ZoneEmuConfig, bool),
    /// At open: as shard 0's superblock (and zone emulation) recorded.
    Recorded(&'a shale_format::Superblock),
}

/// How long each shard's window of the cache is (shard `i`'s starts at `i` times
/// it), and how the shards divide the capacity. At format: the cache cut into `n`
/// equal windows aligned to 1 MiB; the capacity shared, or cut into `n` windows of
/// as many whole zones (and their emulation's metadata) as fit. At open: what shard
/// 0 recorded (its superblock's cache size; the capacity as `recorded_capacity_cut`
/// finds it), so a changed `--zone-size` or a grown file does not move the windows.
/// A zoned drive's zones are divided in runs.
fn shard_strides(
    cache: &Path,
    capacity: &Path,
    n: usize,
    cut: Cut<'_>,
) -> Result<(u64, CapacityCut), DaemonError> {
    let setup = |path: &Path, reason: String| DaemonError::Setup {
        path: path.to_path_buf(),
        reason,
    };
    let cache_len = open_file("cache device", cache)?.size_bytes();
    let n64 = n as u64;
    let cache_stride = match cut {
        Cut::Format(..) => cache_len / n64 / (1 << 20) * (1 << 20),
        Cut::Recorded(sb) => sb.cache_size_blocks * 4096,
    };
    if cache_stride == 0 || cache_stride.saturating_mul(n64) > cache_len {
        return Err(setup(
            cache,
            format!(
                "{n} shards: {n} cache windows of {cache_stride} bytes do not fit the cache \
                 of {cache_len} bytes (too small, or shrunk since format?)"
            ),
        ));
    }
    if is_zoned_drive(capacity)? {
        return Ok((cache_stride, CapacityCut::DriveRuns));
    }
    let mut cap_dev = open_file("capacity device", capacity)?;
    let cap_len = cap_dev.size_bytes();
    let cap_stride = match cut {
        Cut::Format(_, true) => return Ok((cache_stride, CapacityCut::Shared)),
        Cut::Format(zc, false) => {
            let per = cap_len / n64;
            let mut zones = u32::try_from(per / zc.zone_size).unwrap_or(u32::MAX);
            while zones > 0 && zc.device_bytes_for(zones).is_none_or(|b| b > per) {
                zones -= 1;
            }
            if zones == 0 {
                0
            } else {
                zc.device_bytes_for(zones).unwrap_or(0)
            }
        }
        Cut::Recorded(_) => match recorded_capacity_cut(&mut cap_dev, capacity, n)? {
            CapacityCut::Windows(w) => w,
            other => return Ok((cache_stride, other)),
        },
    };
    if cap_stride == 0 {
        return Err(setup(
            capacity,
            format!("{n} shards: the capacity is too small to cut into {n} windows"),
        ));
    }
    if cap_stride.saturating_mul(n64) > cap_len {
        return Err(setup(
            capacity,
            format!(
                "{n} shards of {cap_stride} capacity bytes do not fit a device of {cap_len} \
                 bytes (shrunk since format?)"
            ),
        ));
    }
    Ok((cache_stride, CapacityCut::Windows(cap_stride)))
}

/// How a formatted pool of `n` shards divides the capacity file `dev`: the zone
/// emulation at its start spans `extent` bytes. Shards in windows have the next
/// window's emulation right after it; a shared device's emulation spans more than
/// one `n`th of the file and nothing follows it (its end is never written). An
/// array member has one emulation over the whole file too.
fn recorded_capacity_cut(
    dev: &mut FileDevice,
    path: &Path,
    n: usize,
) -> Result<CapacityCut, DaemonError> {
    let len = dev.size_bytes();
    let device_error = |error| DaemonError::Device {
        what: "zone emulation on",
        path: path.to_path_buf(),
        error,
    };
    let extent = ZoneEmu::recorded_extent(dev)
        .map_err(device_error)?
        .ok_or_else(|| DaemonError::Setup {
            path: path.to_path_buf(),
            reason: "no zone emulation metadata at its start to find the shards by".into(),
        })?;
    if extent.saturating_mul(n as u64) > len {
        return Ok(CapacityCut::Shared);
    }
    let next = open_file("capacity device", path)?;
    let mut next = Window::new(next, extent, len - extent).map_err(device_error)?;
    Ok(
        match ZoneEmu::recorded_extent(&mut next).map_err(device_error)? {
            Some(_) => CapacityCut::Windows(extent),
            None => CapacityCut::Shared,
        },
    )
}

/// The devices of `n` shards: the cache file cut into `n` windows (`shard_strides`),
/// each opened on its own (its own io_uring), and the capacity: one device the shards
/// share (any capacity `capacity_device` opens: a file, a simulated drive, an
/// array), or windows of a file each with zone emulation of its own, or runs of a
/// zoned drive's zones each on a handle of its own. `recorded` is shard 0's
/// superblock at open, `None` at format. Also returns the simulated drive's counters
/// and the capacity array's handle, for a shared device.
fn shard_devices(
    spec: &DeviceSpec,
    n: usize,
    recorded: Option<&shale_format::Superblock>,
    pool: [u8; 16],
    config: &shale_engine::Config,
) -> Result<ShardDevices, DaemonError> {
    let cache = match spec.cache.as_slice() {
        [c] => c,
        _ => {
            return Err(set_error(
                &spec.cache,
                format!("{n} shards take one cache device (file or block device), not a mirror"),
            ))
        }
    };
    // One cache for all shards: at format as configured, at open as shard 0's
    // superblock divides it.
    let one_cache = match recorded {
        Some(_) => recorded_cache_split_of(cache)?.map(OneCache::Recorded),
        None if spec.engine.shared_cache => Some(OneCache::Format),
        None => None,
    };
    let shared_spec = spec.redundancy.is_some()
        || spec.capacity.len() != 1
        || spec.drive.is_some()
        || one_cache.is_some();
    let zc = spec.zone_config();
    let cut = recorded.map_or(
        Cut::Format(&zc, spec.engine.shared_capacity || shared_spec),
        Cut::Recorded,
    );
    let (cache_window, cap_cut) = match one_cache {
        Some(_) if is_zoned_drive(&spec.capacity[0])? => {
            return Err(set_error(
                &spec.capacity,
                format!(
                    "{n} shards divide a zoned drive's zones in runs: they share a cache \
                     only over capacity files"
                ),
            ))
        }
        // The capacity is shared too; the cache is divided below.
        Some(_) => (0, CapacityCut::Shared),
        None => shard_strides(cache, &spec.capacity[0], n, cut)?,
    };
    if shared_spec && cap_cut != CapacityCut::Shared {
        return Err(set_error(
            &spec.capacity,
            format!(
                "{n} shards divide a zoned drive's zones in runs: arrays and simulated \
                 drives are shared by shards only on files"
            ),
        ));
    }
    let window = |what: &'static str, path: &PathBuf, i: usize, len: u64| {
        let dev = open_file(what, path)?;
        Window::new(dev, i as u64 * len, len).map_err(|error| DaemonError::Device {
            what,
            path: path.clone(),
            error,
        })
    };
    let mut caches: Vec<CacheDevice> = Vec::with_capacity(n);
    if one_cache.is_none() {
        for i in 0..n {
            caches.push(Box::new(window("cache device", cache, i, cache_window)?));
        }
    }
    let format = recorded.is_none();
    let mut out = ShardDevices {
        pairs: Vec::with_capacity(n),
        drive: None,
        capacity_handle: None,
        shared: cap_cut == CapacityCut::Shared,
        cache_split: None,
    };
    let capacity = &spec.capacity[0];
    match cap_cut {
        CapacityCut::Shared => {
            let (views, drive, handle) = shared_capacity_views(spec, n, format, pool)?;
            if let (Some(how), Some(view)) = (one_cache, views.first()) {
                let g = view.geometry().clone();
                let (c, split) = shared_cache_views(cache, n, how, &g, config)?;
                caches = c;
                out.cache_split = Some(split);
            }
            out.pairs = caches
                .into_iter()
                .zip(views)
                .map(|(c, v)| (c, Box::new(v) as CapacityDevice))
                .collect();
            out.drive = drive;
            out.capacity_handle = handle;
        }
        CapacityCut::DriveRuns => out.pairs = drive_run_pairs(capacity, caches, format)?,
        CapacityCut::Windows(w) => {
            for (i, c) in caches.into_iter().enumerate() {
                let inner: Box<dyn BlockDevice + Send> =
                    Box::new(window("capacity device", capacity, i, w)?);
                let emu = zone_emulation(spec, inner, format, capacity)?;
                out.pairs.push((c, Box::new(emu)));
            }
        }
    }
    Ok(out)
}

/// The views of `n` shards sharing the capacity device, the simulated drive's
/// counters and the array's handle, if any.
#[allow(clippy::type_complexity, reason = "a private helper's three results")]
fn shared_capacity_views(
    spec: &DeviceSpec,
    n: usize,
    format: bool,
    pool: [u8; 16],
) -> Result<
    (
        Vec<shale_device::SharedZones<CapacityDevice>>,
        Option<DriveStats>,
        Option<CapacityHandle>,
    ),
    DaemonError,
> {
    let (dev, drive, handle) = capacity_device(spec, format, pool)?;
    // (Not an array, even of one member named alone: its zones are striped.)
    let plain = if handle.is_none() && drive.is_none() {
        plain_readers(spec, n)?
    } else {
        None
    };
    let views = match plain {
        // A zone emulation over a plain file: each shard reads on a handle of its
        // own, without the lock its writes take.
        Some((readers, offset)) => {
            shale_device::SharedZones::split_with_readers(dev, readers, offset)
        }
        None => shale_device::SharedZones::split(dev, n),
    }
    .map_err(|reason| set_error(&spec.capacity, format!("{n} shards sharing it: {reason}")))?;
    tracing::info!(shards = n, "capacity: one device the shards share");
    Ok((views, drive, handle))
}

/// Read handles of a shared capacity file, one per shard.
type Readers = Vec<Box<dyn BlockDevice + Send>>;

/// For shards sharing a zone emulation over one plain capacity file (no array, no
/// simulated drive): a read handle per shard on the file, and where the emulation's
/// zone 0 begins on it. `None` otherwise.
fn plain_readers(spec: &DeviceSpec, n: usize) -> Result<Option<(Readers, u64)>, DaemonError> {
    let [path] = spec.capacity.as_slice() else {
        return Ok(None);
    };
    if spec.redundancy.is_some() || spec.drive.is_some() || is_zoned_drive(path)? {
        return Ok(None);
    }
    let mut first = open_file("capacity device", path)?;
    let offset =
        ZoneEmu::recorded_data_offset(&mut first).map_err(|error| DaemonError::Device {
            what: "zone emulation on",
            path: path.clone(),
            error,
        })?;
    let Some(offset) = offset else {
        return Ok(None);
    };
    let mut readers: Readers = vec![Box::new(first)];
    for _ in 1..n {
        readers.push(Box::new(open_file("capacity device", path)?));
    }
    Ok(Some((readers, offset)))
}

/// Each shard's cache with its run of a zoned drive's zones, on a handle of its own.
fn drive_run_pairs(
    capacity: &Path,
    caches: Vec<CacheDevice>,
    format: bool,
) -> Result<Vec<(CacheDevice, CapacityDevice)>, DaemonError> {
    let how = if format {
        shale_device::DriveOpen::Format
    } else {
        shale_device::DriveOpen::Open
    };
    let n = caches.len();
    let mut pairs = Vec::with_capacity(n);
    for (i, c) in caches.into_iter().enumerate() {
        let z = shale_device::open_zoned_drive_shard(capacity, how, i, n).map_err(|error| {
            DaemonError::Device {
                what: "zoned block device",
                path: capacity.to_path_buf(),
                error,
            }
        })?;
        let g = z.geometry();
        tracing::info!(
            shard = i,
            zones = g.zone_count,
            max_open = g.max_open_zones,
            max_active = g.max_active_zones,
            "capacity: the shard's zones of the zoned drive"
        );
        pairs.push((c, z));
    }
    Ok(pairs)
}

/// The cache `path` divided between `n` shards as shard 0's superblock says, or at
/// format as `shale_shards::cache::cache_split` divides it for shards formatted with
/// `config` over capacity views of geometry `g`: one view per shard.
fn shared_cache_views(
    path: &Path,
    n: usize,
    how: OneCache,
    g: &shale_device::ZoneGeometry,
    config: &shale_engine::Config,
) -> Result<(Vec<CacheDevice>, shale_device::CacheSplit), DaemonError> {
    let dev = open_file("cache device", path)?;
    let split = match how {
        OneCache::Recorded(s) => s,
        OneCache::Format => {
            let cfg = shale_engine::Config {
                zones_owned: Some(g.zone_count / n as u32),
                ..config.clone()
            };
            shale_shards::cache::cache_split(dev.info(), g, &cfg, n).map_err(|e| {
                set_error(&[path.to_path_buf()], format!("{n} shards sharing it: {e}"))
            })?
        }
    };
    // Each shard its own handle of the file (its own I/O ring): a cache has no
    // state to share, so nothing is locked.
    let mut handles = vec![dev];
    for _ in 1..n {
        handles.push(open_file("cache device", path)?);
    }
    let views = shale_device::SharedCache::own_handles(handles, split).map_err(|reason| {
        set_error(
            &[path.to_path_buf()],
            format!("{n} shards sharing it: {reason}"),
        )
    })?;
    tracing::info!(
        shards = n,
        window_bytes = split.meta_bytes,
        chunks = split.chunks,
        "cache: one device the shards share"
    );
    Ok((
        views
            .into_iter()
            .map(|v| Box::new(v) as CacheDevice)
            .collect(),
        split,
    ))
}

/// How shard 0's superblock divides the cache between shards that share it; `None`
/// when each shard has a window of its own.
fn recorded_cache_split_of(path: &Path) -> Result<Option<shale_device::CacheSplit>, DaemonError> {
    let mut dev = open_file("cache device", path)?;
    shale_shards::cache::recorded_cache_split(&mut dev)
        .map_err(|e| set_error(&[path.to_path_buf()], e.to_string()))
}

/// Shards sharing one cache: divided at this format, or as shard 0 recorded.
#[derive(Debug, Clone, Copy)]
enum OneCache {
    Format,
    Recorded(shale_device::CacheSplit),
}

/// The devices of `shards` shards at format and what the format did to the
/// capacity; sets in `config` the zones (and chunks, and where they begin) each
/// shard starts with on a shared device.
fn format_shard_devices(
    spec: &DeviceSpec,
    shards: usize,
    pool: [u8; 16],
    config: &mut shale_engine::Config,
) -> Result<(Vec<(CacheDevice, CapacityDevice)>, String), DaemonError> {
    let devices = shard_devices(spec, shards, None, pool, config)?;
    let detail = shard_zones_detail(spec, &devices)?;
    // Shard i starts with the run of zones from its view's zone 0.
    config.zones_owned = devices.shared.then(|| {
        let zones = devices
            .pairs
            .first()
            .map_or(0, |p| p.1.geometry().zone_count);
        zones / shards as u32
    });
    if let Some(split) = devices.cache_split {
        config.chunks_owned = Some(split.per());
        config.cache_data_start_min = Some(split.meta_bytes);
    }
    Ok((devices.pairs, detail))
}

/// What `shard_devices` opened.
struct ShardDevices {
    pairs: Vec<(CacheDevice, CapacityDevice)>,
    drive: Option<DriveStats>,
    capacity_handle: Option<CapacityHandle>,
    /// The shards share one capacity device (zones move between them).
    shared: bool,
    /// The shards share one cache too, divided so (chunks move between them).
    cache_split: Option<shale_device::CacheSplit>,
}

/// Opens formatted devices and starts the engine thread; also returns a one-line
/// summary of the open for the service manager's status, and the simulated drive's
/// counters (from this open on) if there is one. `progress` sees the open's steps as
/// they run (the CLI draws them on a terminal).
pub fn open(
    spec: &DeviceSpec,
    progress: &mut dyn shale_engine::OpenProgress,
) -> Result<(Engine, String, Option<DriveStats>, Devices), DaemonError> {
    let mut engine_config = spec.engine_config()?;
    let gc_policy = engine_config.gc_policy;
    // A pool of several shards on one cache device records them in its superblock.
    let recorded = match spec.cache.as_slice() {
        [path] => recorded_superblock(path).filter(|sb| sb.shard.count > 1),
        _ => None,
    };
    let shards = recorded
        .as_ref()
        .map_or(1, |sb| usize::from(sb.shard.count));
    if shards != spec.engine.shards as usize {
        tracing::info!(
            recorded = shards,
            configured = spec.engine.shards,
            "the pool was formatted with {shards} shards: the recorded count is used"
        );
    }
    let (pairs, drive, devices) = if shards > 1 {
        let d = shard_devices(spec, shards, recorded.as_ref(), [0; 16], &engine_config)?;
        let devices = Devices::new(spec.clone(), None, d.capacity_handle);
        (d.pairs, d.drive, devices)
    } else {
        let (cache, cache_handle) = cache_device(spec, false, [0; 16])?;
        let (capacity, drive, capacity_handle) = capacity_device(spec, false, [0; 16])?;
        let (capacity, _, cold_pool) = with_cold_tier(spec, capacity, None)?;
        engine_config.pool_uuid = cold_pool;
        let devices = Devices::new(spec.clone(), cache_handle, capacity_handle);
        (vec![(cache, capacity)], drive, devices)
    };
    let started = std::time::Instant::now();
    let handoffs = (0..shards)
        .map(|_| handoff_store(&spec.engine.handoff_dir))
        .collect();
    let (engine, reports) = Engine::open_with(
        pairs,
        MonotonicClock::new,
        &engine_config,
        ENGINE_QUEUE_DEPTH,
        handoffs,
        progress,
    )
    .map_err(|e| match (e, &spec.cold) {
        (
            ShardsError::Open {
                source: shale_engine::OpenError::ForeignDevice,
                ..
            },
            Some(cold),
        ) => DaemonError::Setup {
            path: cold.clone(),
            reason: "cold tier device belongs to another pool (its label's UUID is not the superblock's)".into(),
        },
        (e, _) => e.into(),
    })?;
    for (i, r) in reports.iter().enumerate() {
        if shards > 1 {
            tracing::info!(shard = i, "shard opened");
        }
        log_open(r, started.elapsed());
    }
    let k = &spec.engine;
    tracing::info!(
        gc_policy = ?gc_policy,
        compaction_policy = ?k.compaction_policy,
        placement = ?k.placement,
        compaction_free_chunks_pct = k.compaction_free_chunks_pct,
        gc_free_zones_min = k.gc_free_zones_min,
        streams = k.streams,
        shards,
        checkpoint_interval = %k.checkpoint_interval.0,
        "engine policies"
    );
    let status = crate::notify::open_status(&reports[0], started.elapsed());
    Ok((engine, status, drive, devices))
}

/// What the format of a pool of shards did to the capacity: the pool's zones, and
/// each shard's (or that they share them).
fn shard_zones_detail(spec: &DeviceSpec, devices: &ShardDevices) -> Result<String, DaemonError> {
    let pairs = &devices.pairs;
    let Some(g) = pairs.first().map(|d| d.1.geometry()) else {
        return Ok(String::new());
    };
    let n = pairs.len();
    if devices.shared {
        return Ok(format!(
            "{} zones of {} MiB, {} discarded, shared by {n} shards",
            g.zone_count,
            g.zone_size >> 20,
            gib(u64::from(g.zone_count) * g.zone_size),
        ));
    }
    let zones: Vec<u32> = pairs.iter().map(|d| d.1.geometry().zone_count).collect();
    let total: u32 = zones.iter().sum();
    let each: Vec<String> = zones.iter().map(u32::to_string).collect();
    let each = each.join(" + ");
    Ok(if is_zoned_drive(&spec.capacity[0])? {
        format!(
            "{total} zones of {} MiB ({} MiB writable) on a zoned drive, {n} shards of {each}",
            g.zone_size >> 20,
            g.zone_capacity >> 20,
        )
    } else {
        format!(
            "{total} zones of {} MiB, {} discarded, {n} shards of {each}",
            g.zone_size >> 20,
            gib(u64::from(total) * g.zone_size),
        )
    })
}

/// The hand-off store in `dir` (`off`: none). Without one, a kill of the daemon
/// loses the writes acknowledged since the last flush; that is logged, and the
/// daemon serves on.
fn handoff_store(dir: &str) -> Option<Box<dyn shale_engine::Handoff>> {
    if dir == "off" {
        tracing::info!(
            "hand-off off: a kill of the daemon loses writes acknowledged since the last flush"
        );
        return None;
    }
    match crate::handoff::ShmHandoff::new(Path::new(dir)) {
        Ok(s) => {
            tracing::info!(
                dir,
                "hand-off store: acknowledged writes survive a kill of the daemon"
            );
            Some(Box::new(s))
        }
        Err(e) => {
            tracing::warn!(dir, error = %e, "no hand-off store: a kill of the daemon loses writes acknowledged since the last flush");
            None
        }
    }
}

/// One line saying whether the open was clean or a recovery, and what it cost; the
/// engine has already logged each step.
fn log_open(r: &shale_engine::OpenReport, wall: Duration) {
    let wall_ms = wall.as_secs_f64() * 1e3;
    let steps_ms = r.duration_ns() as f64 / 1e6;
    if r.clean {
        tracing::info!(
            wall_ms,
            steps_ms,
            bytes_read = r.bytes_read(),
            warnings = r.warnings.len(),
            "opened after a clean shutdown"
        );
    } else {
        let c = &r.replay;
        tracing::warn!(
            wall_ms,
            steps_ms,
            bytes_read = r.bytes_read(),
            journal_entries = c.journal_entries,
            regions_scanned = c.regions_scanned,
            md_groups_read = c.md_groups_read,
            entries_applied = c.entries_applied,
            entries_superseded = c.entries_superseded,
            trims = c.trims,
            stray_zones_reset = c.stray_zones_reset,
            warnings = r.warnings.len(),
            "dirty recovery: the devices were not shut down cleanly; replayed the journal and open regions"
        );
    }
}

/// The running daemon's parts; [`Daemon::stop`] shuts them down in order.
#[derive(Debug)]
pub struct Daemon {
    backend: Arc<EngineBackend>,
    nbd: Option<Server>,
    /// One vhost-user-blk server per served volume.
    vhost: Vec<shale_vhost::ServeHandle>,
    /// One ublk device per served volume.
    #[cfg(feature = "ublk")]
    ublk: Vec<shale_ublk::UblkHandle>,
    admin: Option<AdminServer>,
    metrics: Option<crate::metrics::MetricsServer>,
    /// The space manager of shards sharing one capacity device.
    space: Option<shale_shards::SpaceManager>,
    /// What the open did, for `STATUS=` ([`crate::notify`]).
    open_status: String,
    /// Last, so it is released after everything else (fields drop in order).
    _lock: DeviceLock,
}

impl Daemon {
    /// Opens the configured devices — creating and formatting the embedded default
    /// the first time — and starts every listener. `progress` sees the open's steps.
    pub fn start(
        config: &Config,
        progress: &mut dyn shale_engine::OpenProgress,
    ) -> Result<Daemon, DaemonError> {
        let spec = DeviceSpec::from_config(config)?;
        create_private_dir(&config.data_dir)?;
        let cache_exists = spec.cache.iter().any(|p| p.exists());
        let capacity_exists = spec.capacity.iter().any(|p| p.exists());
        match (cache_exists, capacity_exists) {
            (false, false) => {
                tracing::info!(
                    cache = ?spec.cache,
                    capacity = ?spec.capacity,
                    "first start: creating and formatting sparse device files"
                );
                let vols = format(&spec, false, &first_start_plans(config)?, &mut LogOnly)?;
                for v in vols {
                    tracing::info!(volume = %v.name, size_bytes = v.size_bytes, "volume created");
                }
            }
            (true, true) => {}
            (c, _) => {
                let missing = if c { &spec.capacity } else { &spec.cache };
                return Err(set_error(
                    missing,
                    "missing, but its partner device exists; refusing to guess".into(),
                ));
            }
        }
        for path in all_paths(&spec).filter(|p| p.exists()) {
            warn_if_shared(path);
        }
        let lock = DeviceLock::acquire(&spec)?;
        let (engine, open_status, drive, devices) = open(&spec, progress)?;
        let devices = Arc::new(devices);
        let engine = Arc::new(engine);
        let space = start_space_manager(&engine)?;
        let backend = Arc::new(EngineBackend::new(Arc::clone(&engine), PAYLOAD_BYTES_MAX)?);
        let mut daemon = Daemon {
            space,
            backend: Arc::clone(&backend),
            nbd: None,
            vhost: Vec::new(),
            #[cfg(feature = "ublk")]
            ublk: Vec::new(),
            admin: None,
            metrics: None,
            open_status,
            _lock: lock,
        };
        let nbd_config = nbd_server_config(config)?;
        let nbd = Server::start(nbd_config, backend.clone())?;
        let nbd_handle = nbd.handle();
        daemon.nbd = Some(nbd);
        daemon.vhost = start_vhost(config, &backend)?;
        start_ublk(config, &backend, &mut daemon)?;
        if let Some(path) = config.expand(&config.admin.socket) {
            let handler = Arc::new(
                DaemonAdmin::new(Arc::clone(&backend), Some(nbd_handle))
                    .with_drive(drive.clone())
                    .with_devices(Arc::clone(&devices)),
            );
            daemon.admin = Some(AdminServer::start(&path, handler)?);
        }
        if !config.metrics.listen.is_empty() {
            let addr: SocketAddr =
                config
                    .metrics
                    .listen
                    .parse()
                    .map_err(|_| ConfigError::Invalid {
                        field: "metrics.listen",
                        reason: config.metrics.listen.clone(),
                    })?;
            let b = Arc::clone(&backend);
            let server = crate::metrics::MetricsServer::start(
                addr,
                Arc::new(move || crate::handler::metrics(&b, drive.as_ref())),
            )
            .map_err(|error| DaemonError::Metrics {
                addr: config.metrics.listen.clone(),
                error,
            })?;
            // The bound address, so port 0 is usable.
            tracing::info!(addr = %server.local_addr(), "serving Prometheus metrics");
            if !server.local_addr().ip().is_loopback() {
                tracing::warn!(
                    addr = %server.local_addr(),
                    "the metrics endpoint is reachable beyond this host: it shows volume names, sizes and traffic"
                );
            }
            daemon.metrics = Some(server);
        }
        Ok(daemon)
    }

    pub fn nbd(&self) -> Option<&Server> {
        self.nbd.as_ref()
    }

    /// Why the engine stopped serving, once it has (see `EngineThread::failure`).
    pub fn engine_failure(&self) -> Option<String> {
        self.backend.engine().failure()
    }

    /// One line on how the devices were opened: clean, or a recovery and what it did.
    pub fn open_status(&self) -> &str {
        &self.open_status
    }

    /// Drains in-flight I/O, checkpoints, marks the devices clean and stops.
    pub fn stop(mut self) -> Result<(), DaemonError> {
        // Stop taking new requests first; connections' in-flight requests complete.
        if let Some(nbd) = self.nbd.take() {
            nbd.shutdown();
        }
        #[cfg(feature = "ublk")]
        for u in self.ublk.drain(..) {
            u.stop();
        }
        for v in self.vhost.drain(..) {
            v.stop();
            if let Err(e) = v.join() {
                tracing::warn!(error = %e, "vhost-user-blk server ended with an error");
            }
        }
        self.admin.take();
        self.metrics.take();
        if let Some(space) = self.space.take() {
            space.stop();
        }
        let engine = Arc::clone(self.backend.engine());
        drop(self.backend);
        // Completions may still hold the engine handle briefly; wait for the last one.
        let mut engine = engine;
        let engine = loop {
            match Arc::try_unwrap(engine) {
                Ok(e) => break e,
                Err(e) => {
                    engine = e;
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        };
        engine.shutdown()?;
        Ok(())
    }
}

/// The volumes a first start makes: the configuration's, or one default volume.
fn first_start_plans(config: &Config) -> Result<Vec<VolumePlan>, DaemonError> {
    let size = match &config.devices.default_volume_size {
        Some(s) => Some(s.bytes("devices.default_volume_size")?),
        None => None,
    };
    let plans = config_volume_plans(config)?;
    Ok(if plans.is_empty() {
        vec![VolumePlan {
            size_bytes: size,
            ..VolumePlan::named(DEFAULT_VOLUME)
        }]
    } else {
        plans
    })
}

/// How often the space manager looks for a shard short of free zones.
const SPACE_INTERVAL: Duration = Duration::from_millis(200);

/// The space manager's thread, for shards that share one capacity device: it moves
/// free zones, a sixteenth of a shard's share at a time, to the shard with the
/// fewest (and free chunks of a cache they share, up to a quarter of a shard's
/// share at a time).
fn start_space_manager(
    engine: &Arc<Engine>,
) -> Result<Option<shale_shards::SpaceManager>, DaemonError> {
    let Some(l) = engine.lending() else {
        return Ok(None);
    };
    if let Some(c) = engine.chunk_lending() {
        tracing::info!(
            shards = c.shards(),
            chunks = c.zone_count(),
            "space manager: shards share the cache's chunks"
        );
    }
    let batch = (l.zone_count() / l.shards() / 16).max(1);
    tracing::info!(
        shards = l.shards(),
        zones = l.zone_count(),
        batch,
        interval_ms = SPACE_INTERVAL.as_millis() as u64,
        "space manager: shards share the capacity device's zones"
    );
    engine
        .spawn_space_manager(SPACE_INTERVAL, batch)
        .map_err(|e| DaemonError::Thread {
            what: "space manager",
            error: e,
        })
}

/// One vhost-user-blk server for each `vhost.user_blk` entry.
fn start_vhost(
    config: &Config,
    backend: &Arc<EngineBackend>,
) -> Result<Vec<shale_vhost::ServeHandle>, DaemonError> {
    let mut out = Vec::new();
    for x in config.vhost_exports()? {
        let Some(target) = crate::vhost::VolumeTarget::new(Arc::clone(backend), &x.volume) else {
            return Err(DaemonError::VhostNoVolume {
                volume: x.volume,
                socket: x.socket,
            });
        };
        let options = shale_vhost::VhostOptions {
            num_queues: config.vhost.queues,
            serial: x.volume.clone(),
            ..shale_vhost::VhostOptions::default()
        };
        let handle = shale_vhost::serve(Arc::new(target), &x.socket, options).map_err(|error| {
            DaemonError::Vhost {
                volume: x.volume.clone(),
                socket: x.socket.clone(),
                error,
            }
        })?;
        tracing::info!(volume = %x.volume, socket = %x.socket.display(), "serving vhost-user-blk");
        out.push(handle);
    }
    Ok(out)
}

/// One ublk device for each `ublk.volumes` entry.
#[cfg(feature = "ublk")]
fn start_ublk(
    config: &Config,
    backend: &Arc<EngineBackend>,
    daemon: &mut Daemon,
) -> Result<(), DaemonError> {
    for volume in config.ublk_volumes()? {
        let Some(target) = crate::vhost::VolumeTarget::new(Arc::clone(backend), &volume) else {
            return Err(DaemonError::UblkNoVolume { volume });
        };
        let options = shale_ublk::UblkOptions {
            name: format!("shale-{volume}"),
            queues: config.ublk.queues,
            depth: config.ublk.depth,
            ..shale_ublk::UblkOptions::default()
        };
        let handle =
            shale_ublk::serve(Arc::new(target), &options).map_err(|e| DaemonError::Ublk {
                volume: volume.clone(),
                reason: e.to_string(),
            })?;
        tracing::info!(volume = %volume, device = %handle.block_device(), "serving ublk");
        daemon.ublk.push(handle);
    }
    Ok(())
}

/// Without the `ublk` feature, asking for a ublk device is an error that says so.
#[cfg(not(feature = "ublk"))]
fn start_ublk(
    config: &Config,
    _backend: &Arc<EngineBackend>,
    _daemon: &mut Daemon,
) -> Result<(), DaemonError> {
    match config.ublk_volumes()?.into_iter().next() {
        Some(volume) => Err(DaemonError::Ublk {
            volume,
            reason: "this shale was built without ublk; build it with \
                     `cargo build --release -p shale-cli --features ublk` (needs libclang-dev)"
                .into(),
        }),
        None => Ok(()),
    }
}

fn nbd_server_config(config: &Config) -> Result<ServerConfig, DaemonError> {
    let tcp = if config.nbd.tcp.is_empty() {
        None
    } else {
        Some(
            config
                .nbd
                .tcp
                .parse::<SocketAddr>()
                .map_err(|_| ConfigError::Invalid {
                    field: "nbd.tcp",
                    reason: config.nbd.tcp.clone(),
                })?,
        )
    };
    let limits = ServerLimits {
        connections_max: config.nbd.connections_max as usize,
        inflight_requests_max: config.nbd.inflight_per_connection_max as usize,
        payload_bytes_max: PAYLOAD_BYTES_MAX,
        ..ServerLimits::default()
    };
    let mut sc = ServerConfig {
        unix_socket: config.expand(&config.nbd.unix_socket),
        tcp,
        limits,
        default_export: Some(DEFAULT_VOLUME.to_string()),
        ..ServerConfig::default()
    };
    if let Some(tls) = &config.nbd.tls {
        sc.tls = Some(TlsSettings {
            cert_chain_pem: tls.cert.clone(),
            private_key_pem: tls.key.clone(),
            client_ca_pem: tls.client_ca.clone(),
            // Required TLS with a client CA means authenticated clients only. Without
            // this a client offering no certificate would complete the handshake with
            // no identity and reach every export without an identity list.
            client_cert_required: tls.required && tls.client_ca.is_some(),
        });
        sc.tls_mode = if tls.required {
            TlsMode::Required
        } else {
            TlsMode::Optional
        };
        for acl in &tls.exports {
            sc.export_access.insert(
                acl.name.clone(),
                shale_nbd::ExportAccess {
                    tls_only: true,
                    allowed_identities: Some(acl.allowed_identities.clone()),
                },
            );
        }
    }
    Ok(sc)
}

/// Runs until `stop` is set (by a signal handler), then shuts down cleanly.
/// `progress` sees the steps of the open.
pub fn run(
    config: &Config,
    stop: &AtomicBool,
    progress: &mut dyn shale_engine::OpenProgress,
) -> Result<(), DaemonError> {
    let mut notify = Notifier::from_env();
    notify.status("opening the devices (a recovery after a crash can take a while)");
    let daemon = Daemon::start(config, progress)
        .inspect_err(|e| notify.status(&format!("failed to start: {e}")))?;
    if let Some(s) = daemon.nbd() {
        if let Some(p) = s.unix_path() {
            tracing::info!(socket = %p.display(), "serving NBD on unix socket");
        }
        if let Some(a) = s.tcp_addr() {
            tracing::info!(addr = %a, "serving NBD on TCP");
            if let Some(warning) = config.tcp_exposure()?.and_then(|e| e.warning()) {
                tracing::warn!(addr = %a, "{warning}");
            }
        }
    }
    tracing::info!("ready");
    notify.ready(daemon.open_status());
    let failure = loop {
        if stop.load(Ordering::Relaxed) {
            break None;
        }
        if let Some(reason) = daemon.engine_failure() {
            break Some(reason);
        }
        notify.watchdog();
        std::thread::sleep(Duration::from_millis(50));
    };
    if let Some(reason) = failure {
        // Loud and clean: the cause once, every request answered with an error, then
        // a non-zero exit so a supervisor restarts the daemon; the next start
        // recovers. Nothing more reached the devices after the failure, so every
        // flushed byte is where recovery will look for it.
        tracing::error!(
            %reason,
            grace_s = FAILED_EXIT_GRACE.as_secs(),
            "the engine failed: every request now fails; exiting without a checkpoint so the next start recovers"
        );
        notify.status(&format!("engine failed, exiting: {reason}"));
        let until = std::time::Instant::now() + FAILED_EXIT_GRACE;
        while std::time::Instant::now() < until && !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        notify.stopping(&format!("engine failed, exiting: {reason}"));
        // Closes every connection; the failed engine's shutdown writes nothing.
        let _ = daemon.stop();
        return Err(DaemonError::EngineFailed { reason });
    }
    tracing::info!("stopping: draining I/O and checkpointing");
    notify.stopping("stopping: draining I/O and checkpointing");
    daemon.stop()?;
    tracing::info!("clean shutdown");
    Ok(())
}

/// Creates a directory and its missing parents with mode 0700 (an existing one is
/// left as it is): it holds the device files and sockets, and every volume's data
/// is readable from the device files.
fn create_private_dir(dir: &Path) -> Result<(), DaemonError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| DaemonError::Setup {
            path: dir.to_path_buf(),
            reason: e.to_string(),
        })
}

/// Warns when a device file is open to other users: anyone who can read it can read
/// every volume, bypassing the 0600 sockets. Files created before device files were
/// made 0600 may still be. Block devices are left to the system's permissions.
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(path) {
        let mode = m.permissions().mode() & 0o777;
        if m.is_file() && mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "device file is accessible to other users, who can read every volume from it; \
                 chmod go-rwx it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_engine::VolumeLimits;

    /// A capacity file cut into windows is found as windows, one emulation over the
    /// whole file as shared, also once the file has grown far past it; a file with no
    /// emulation is refused with the reason.
    #[test]
    fn an_open_finds_how_the_shards_divide_the_capacity() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cap.img");
        let zc = ZoneEmuConfig::new(1 << 20);
        let emulate = |at: u64, len: u64| {
            let f = FileDevice::open(&path).expect("open");
            let w = Window::new(f, at, len).expect("window");
            ZoneEmu::format(w, &zc).expect("format");
        };
        let cut = || {
            let mut f = FileDevice::open(&path).expect("open");
            recorded_capacity_cut(&mut f, &path, 2).expect("recorded")
        };
        let len = 64u64 << 20;
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("file");
        let per = zc.device_bytes_for(20).expect("20 zones fit");
        emulate(0, per);
        emulate(per, per);
        assert_eq!(cut(), CapacityCut::Windows(per));
        // One emulation over the whole file.
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("file");
        emulate(0, len);
        assert_eq!(cut(), CapacityCut::Shared);
        // Grown to 8 times: its emulation spans less than half, nothing follows it.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(8 * len))
            .expect("grow");
        assert_eq!(cut(), CapacityCut::Shared);
        // No emulation at all: refused with the reason.
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(len))
            .expect("file");
        let mut f = FileDevice::open(&path).expect("open");
        let err = recorded_capacity_cut(&mut f, &path, 2).expect_err("nothing recorded");
        assert!(err.to_string().contains("no zone emulation"), "{err}");
    }

    #[test]
    fn volume_plans_take_a_size_and_limits() {
        let p = VolumePlan::parse("db:4GiB,iops-max=500,mibps-max=20,cache-share=30%,gc=greedy")
            .expect("parses");
        assert_eq!(p.name, "db");
        assert_eq!(p.size_bytes, Some(4 << 30));
        assert_eq!(
            p.limits,
            VolumeLimits {
                iops_max: 500,
                bytes_per_sec_max: 20 << 20,
                cache_share_pct: 30,
                gc: shale_engine::VolumeGc::Greedy,
            }
        );
        let p = VolumePlan::parse("rest,iops-max=none").expect("parses");
        assert_eq!((p.size_bytes, p.limits), (None, VolumeLimits::NONE));
        let p = VolumePlan::parse("media:8GiB,map-unit=64KiB").expect("parses");
        assert_eq!(p.layout.map_unit_bytes(), 64 << 10);
        assert_eq!(p.layout.map_unit_shift, 4);
        assert!(!p.layout.dual);
        // Dual mapping: 64 KiB units unless named, in either order.
        let p = VolumePlan::parse("objects:8GiB,dual-map=yes").expect("parses");
        assert_eq!((p.layout.map_unit_bytes(), p.layout.dual), (64 << 10, true));
        let p = VolumePlan::parse("objects,dual-map=yes,map-unit=32KiB").expect("parses");
        assert_eq!((p.layout.map_unit_bytes(), p.layout.dual), (32 << 10, true));
        let p = VolumePlan::parse("objects,map-unit=16KiB,dual-map=no").expect("parses");
        assert_eq!(
            (p.layout.map_unit_bytes(), p.layout.dual),
            (16 << 10, false)
        );
        assert_eq!(
            VolumePlan::parse("a").expect("parses"),
            VolumePlan::named("a")
        );
        for (bad, says) in [
            ("", "no name"),
            (":1GiB", "no name"),
            ("a:lots", "size"),
            ("a,iops-max", "key=value"),
            ("a,iops-max=fast", "iops-max"),
            (
                "a,fast=yes",
                "known: iops-max, mibps-max, cache-share, gc, map-unit, dual-map",
            ),
            ("a,dual-map=maybe", "expected yes or no"),
            (
                "a,dual-map=yes,map-unit=4KiB",
                "needs a mapping unit above 4KiB",
            ),
            ("a,gc=lru", "unknown GC policy"),
            ("a,map-unit=128KiB", "power of two from 4096 to 65536"),
            ("a,map-unit=12KiB", "power of two"),
            ("a,map-unit=big", "map unit"),
            ("a,cache-share=101", "past 100"),
            ("a,cache-share=half", "cache-share"),
            ("a,mibps-max=18446744073709551615", "too large"),
            ("db:1000", "multiple of 4 KiB"),
            ("db:0", "multiple of 4 KiB"),
            (
                "a-name-that-is-longer-than-thirty-two-bytes",
                "at most 32 bytes",
            ),
        ] {
            let e = VolumePlan::parse(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    proptest::proptest! {
        #[test]
        fn volume_plans_never_panic(text in ".{0,80}") {
            let _ = VolumePlan::parse(&text);
        }
    }
}
