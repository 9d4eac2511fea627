//! A kernel zoned block device (NVMe ZNS, host-managed SMR, zoned null_blk) as a
//! [`ZonedDevice`]: the drive keeps the zone states and write pointers, so nothing
//! Shale writes to it is ever updated in place.
//!
//! Geometry and zone states come from the kernel's zoned ioctls (BLKGETZONESZ,
//! BLKGETNRZONES, BLKREPORTZONE) and the queue's limits in sysfs (max_open_zones,
//! max_active_zones, max_sectors_kb). Data moves through a [`FileDevice`] (O_DIRECT,
//! io_uring); zone management is BLKOPENZONE, BLKCLOSEZONE, BLKFINISHZONE and
//! BLKRESETZONE.
//!
//! Invariants:
//! - The ZNS rules are checked at submission (`zone_rules.rs`) against a mirror of
//!   the drive's zone table, read from the drive at open and moved by every accepted
//!   write and command, so the drive sees no request it would refuse.
//! - One ordered writer per zone: at most one write of a zone is in the kernel at a
//!   time; later writes of that zone wait in `Zone::queued`, in write-pointer order.
//!   The kernel may reorder requests (io_uring punts some to worker threads), and a
//!   zoned drive fails a write that is not at its write pointer.
//! - A failed write leaves the drive's write pointer unknown: the zone's queued
//!   writes fail too and the zone is read back from the drive.
//! - Zone management waits for the zone's writes, so a reset or finish never
//!   overtakes data submitted before it.
//! - A flush covers every request submitted before it: it is sent to the drive once
//!   they have all completed.
//!
//! Conventional zones (a host-managed SMR drive or zoned null_blk may start with
//! some) are not zones of a `BlkZoned`: its zones are the sequential ones,
//! renumbered from 0; [`open_zoned_drive`] puts zone emulation over the
//! conventional ones in front. Zones whose capacity exceeds the smallest capacity
//! among them are used up to that smallest capacity and then finished.
//!
//! At open, zones the drive reports open (a process killed mid-write leaves them
//! so) are closed, as after a controller reset, which is also what zone emulation
//! shows after a reopen.
#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::tags::{mark_done, Tags};
use crate::zone_rules::{is_active, is_open, Counts, Rules};
use crate::{
    BlockDevice, DeviceError, FileDevice, FileOptions, IoBuf, IoCompletion, IoOp, IoOpKind,
    IoRequest, ZoneAction, ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest,
    ZoneState, ZonedDevice,
};

/// `struct blk_zone` of `<linux/blkzoned.h>` (64 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BlkZone {
    pub start: u64,
    pub len: u64,
    pub wp: u64,
    pub kind: u8,
    pub cond: u8,
    pub non_seq: u8,
    pub reset: u8,
    pub resv: [u8; 4],
    pub capacity: u64,
    pub reserved: [u8; 24],
}

/// `struct blk_zone_report` without its flexible array of zones (16 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct BlkZoneReport {
    sector: u64,
    nr_zones: u32,
    flags: u32,
}

/// `struct blk_zone_range`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct BlkZoneRange {
    sector: u64,
    nr_sectors: u64,
}

const BLKREPORTZONE: libc::Ioctl = libc::_IOWR::<BlkZoneReport>(0x12, 130);
const BLKRESETZONE: libc::Ioctl = libc::_IOW::<BlkZoneRange>(0x12, 131);
const BLKGETZONESZ: libc::Ioctl = libc::_IOR::<u32>(0x12, 132);
const BLKGETNRZONES: libc::Ioctl = libc::_IOR::<u32>(0x12, 133);
const BLKOPENZONE: libc::Ioctl = libc::_IOW::<BlkZoneRange>(0x12, 134);
const BLKCLOSEZONE: libc::Ioctl = libc::_IOW::<BlkZoneRange>(0x12, 135);
const BLKFINISHZONE: libc::Ioctl = libc::_IOW::<BlkZoneRange>(0x12, 136);

/// `BLK_ZONE_REP_CAPACITY`: the report carries each zone's capacity.
const REP_CAPACITY: u32 = 1;
const ZONE_TYPE_CONVENTIONAL: u8 = 1;
const SECTOR: u64 = 512;
/// Zones asked for per BLKREPORTZONE call.
const REPORT_BATCH: usize = 4096;

/// Whether the kernel presents `path` as a zoned block device (host-managed or
/// host-aware), from `/sys/dev/block/MAJ:MIN/queue/zoned`. A regular file, or a
/// block device whose queue says `none`, is not.
pub fn is_zoned_block_device(path: &Path) -> io::Result<bool> {
    let meta = std::fs::metadata(path)?;
    if !meta.file_type().is_block_device() {
        return Ok(false);
    }
    match std::fs::read_to_string(queue_dir(meta.rdev()).join("zoned")) {
        Ok(s) => Ok(matches!(s.trim(), "host-managed" | "host-aware")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// `/sys/dev/block/MAJ:MIN/queue` of a device number.
fn queue_dir(rdev: u64) -> PathBuf {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    PathBuf::from(format!("/sys/dev/block/{major}:{minor}/queue"))
}

/// A number from a sysfs queue attribute; a missing attribute reads as 0 (no
/// limit), as on kernels older than the attribute.
fn queue_u64(dir: &Path, name: &str) -> io::Result<u64> {
    match std::fs::read_to_string(dir.join(name)) {
        Ok(s) => s.trim().parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}/{name}: not a number: {:?}", dir.display(), s.trim()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(e),
    }
}

fn ioctl_u32(file: &File, req: libc::Ioctl) -> io::Result<u32> {
    let mut v: u32 = 0;
    // SAFETY: BLKGETZONESZ and BLKGETNRZONES write one __u32 through the pointer,
    // which points at a live local u32.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut v as *mut u32) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(v)
}

fn ioctl_range(file: &File, req: libc::Ioctl, sector: u64, nr_sectors: u64) -> io::Result<()> {
    let mut r = BlkZoneRange { sector, nr_sectors };
    // SAFETY: the zone management ioctls read one struct blk_zone_range through the
    // pointer, which points at a live local of that layout (#[repr(C)]).
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), req, &mut r as *mut BlkZoneRange) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// One BLKREPORTZONE call: up to `max` zones from `sector` on, and whether the
/// report's capacities are valid.
fn report(file: &File, sector: u64, max: usize) -> io::Result<(Vec<BlkZone>, bool)> {
    let header = std::mem::size_of::<BlkZoneReport>();
    let zone = std::mem::size_of::<BlkZone>();
    // u64 words: the kernel's structs need 8-byte alignment.
    let mut buf = vec![0u64; (header + max * zone) / 8];
    let hdr = BlkZoneReport {
        sector,
        nr_zones: max as u32,
        flags: 0,
    };
    // SAFETY: the buffer is at least `header` bytes and 8-byte aligned, and
    // BlkZoneReport is plain data; write_unaligned needs no alignment anyway.
    unsafe { std::ptr::write_unaligned(buf.as_mut_ptr().cast::<BlkZoneReport>(), hdr) };
    // SAFETY: BLKREPORTZONE reads the header and writes at most `nr_zones` struct
    // blk_zone after it; the buffer holds exactly that many.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKREPORTZONE, buf.as_mut_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; the kernel has rewritten the header in place.
    let hdr = unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<BlkZoneReport>()) };
    let n = (hdr.nr_zones as usize).min(max);
    let bytes = buf.as_ptr().cast::<u8>();
    let zones = (0..n)
        .map(|i| {
            // SAFETY: zone `i` lies inside the buffer (i < max), and BlkZone is plain
            // data for which every bit pattern is valid.
            unsafe { std::ptr::read_unaligned(bytes.add(header + i * zone).cast::<BlkZone>()) }
        })
        .collect();
    Ok((zones, hdr.flags & REP_CAPACITY != 0))
}

/// How a [`BlkZoned`] asks the drive about and commands its zones: the kernel's
/// zoned ioctls on the device ([`KernelZones`]), or a model of a drive in tests.
pub(crate) trait ZoneControl: Send + std::fmt::Debug {
    /// Up to `max` zones from `sector` on, and whether their capacities are valid.
    fn report(&self, sector: u64, max: usize) -> io::Result<(Vec<BlkZone>, bool)>;
    /// Open, close, finish or reset the zones of `sectors` from `sector`.
    fn command(&self, action: ZoneAction, sector: u64, sectors: u64) -> io::Result<()>;
}

/// The zoned ioctls on an open block device.
#[derive(Debug)]
struct KernelZones {
    file: File,
}

impl ZoneControl for KernelZones {
    fn report(&self, sector: u64, max: usize) -> io::Result<(Vec<BlkZone>, bool)> {
        report(&self.file, sector, max)
    }

    fn command(&self, action: ZoneAction, sector: u64, sectors: u64) -> io::Result<()> {
        let req = match action {
            ZoneAction::Open => BLKOPENZONE,
            ZoneAction::Close => BLKCLOSEZONE,
            ZoneAction::Finish => BLKFINISHZONE,
            ZoneAction::Reset => BLKRESETZONE,
        };
        ioctl_range(&self.file, req, sector, sectors)
    }
}

/// A zone's state from the kernel's `cond` (BLK_ZONE_COND_*); `None` for a
/// conventional zone (no write pointer) or a condition this code does not know.
fn state_of(cond: u8) -> Option<ZoneState> {
    Some(match cond {
        0x1 => ZoneState::Empty,
        0x2 => ZoneState::ImplicitlyOpen,
        0x3 => ZoneState::ExplicitlyOpen,
        0x4 => ZoneState::Closed,
        0xD => ZoneState::ReadOnly,
        0xE => ZoneState::Full,
        0xF => ZoneState::Offline,
        _ => return None,
    })
}

/// The drive's zone layout as Shale uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    /// Device index of the first sequential zone (the conventional ones before it
    /// are not used).
    first: u32,
    /// Sequential zones from `first` on.
    count: u32,
    zone_size: u64,
    /// The smallest capacity among them.
    capacity: u64,
}

/// Works out the layout from every zone of a report (`zone_size` in bytes):
/// conventional zones only at the start, then sequential zones of one size.
fn layout(zones: &[BlkZone], with_capacity: bool, zone_size: u64) -> Result<Layout, String> {
    let first = zones
        .iter()
        .position(|z| z.kind != ZONE_TYPE_CONVENTIONAL)
        .ok_or("the device has no sequential zones")?;
    let mut capacity = u64::MAX;
    for (i, z) in zones.iter().enumerate().skip(first) {
        if z.kind == ZONE_TYPE_CONVENTIONAL {
            return Err(format!(
                "zone {i} is conventional after sequential zones; only a run at the start is supported"
            ));
        }
        if z.start * SECTOR != i as u64 * zone_size {
            return Err(format!(
                "zone {i} starts at sector {}, not at {} (zones must be laid out back to back)",
                z.start,
                i as u64 * zone_size / SECTOR
            ));
        }
        if z.len * SECTOR != zone_size && i + 1 != zones.len() {
            return Err(format!(
                "zone {i} is {} bytes, not the zone size {zone_size}",
                z.len * SECTOR
            ));
        }
        // A last zone smaller than the rest (the kernel allows one) is not used.
        if z.len * SECTOR == zone_size {
            let cap = if with_capacity { z.capacity } else { z.len } * SECTOR;
            capacity = capacity.min(cap);
        }
    }
    let mut count = zones.len() - first;
    if zones.last().is_some_and(|z| z.len * SECTOR != zone_size) {
        count -= 1;
    }
    if count == 0 || capacity == 0 {
        return Err("the device has no usable sequential zones".into());
    }
    Ok(Layout {
        first: first as u32,
        count: u32::try_from(count).map_err(|_| "too many zones")?,
        zone_size,
        capacity,
    })
}

#[derive(Debug)]
struct Zone {
    state: ZoneState,
    /// Write pointer relative to the zone start, including accepted writes not yet
    /// completed.
    wp: u64,
    /// A write of this zone is in the kernel.
    writing: bool,
    /// Writes accepted after it, in write-pointer order (tags are slot indices).
    queued: VecDeque<IoRequest>,
}

#[derive(Debug)]
enum SlotKind {
    Read,
    Write { zone: u32 },
    Flush,
}

#[derive(Debug)]
struct Slot {
    user_tag: u64,
    /// Place in `order` (reads and writes; a flush waits for those before it).
    seq: Option<u64>,
    kind: SlotKind,
    landed_at: Option<u64>,
}

/// How [`open_zoned_drive`] treats the drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriveOpen {
    /// Formats zone emulation on the conventional zones (the pool's format).
    Format,
    /// Opens it all, closing open zones.
    Open,
    /// Opens without changing anything on the drive (a check).
    AsIs,
}

/// A zoned drive as Shale uses it: its sequential zones ([`BlkZoned`]), after zone
/// emulation over its conventional zones if it starts with some (an SMR drive,
/// zoned null_blk): those are written in place, which conventional zones allow,
/// and hold the emulation's zone table. Emulated zones have the drive's zone size
/// and capacity; a conventional area too small for one is left unused.
pub fn open_zoned_drive(
    path: impl AsRef<Path>,
    how: DriveOpen,
) -> Result<Box<dyn ZonedDevice + Send>, DeviceError> {
    let path = path.as_ref();
    let seq = sequential(path, how)?;
    let conv_bytes = seq.conventional_zones().1;
    with_conventional(path, how, seq, conv_bytes)
}

/// The drive's sequential zones, opened as `how` says.
fn sequential(path: &Path, how: DriveOpen) -> Result<BlkZoned, DeviceError> {
    match how {
        DriveOpen::AsIs => BlkZoned::open_as_is(path),
        DriveOpen::Format | DriveOpen::Open => BlkZoned::open(path),
    }
}

/// Shard `shard`'s part of a zoned drive shared by `shards` engine shards, each on a
/// handle of its own: an equal run of the sequential zones (`shard` times the share
/// on), with an equal share of the drive's open and active zone limits; shard 0
/// also has the zone emulation over the conventional zones, if any (as
/// [`open_zoned_drive`]), before its run. The runs follow from the drive's zone
/// count alone, so every open finds the same ones.
pub fn open_zoned_drive_shard(
    path: impl AsRef<Path>,
    how: DriveOpen,
    shard: usize,
    shards: usize,
) -> Result<Box<dyn ZonedDevice + Send>, DeviceError> {
    let path = path.as_ref();
    let seq = sequential(path, how)?;
    let conv_bytes = seq.conventional_zones().1;
    let range = crate::ZoneRange::share_of(seq, shard, shards)
        .map_err(|e| setup_error(path, "too few zones for its shards", e))?;
    if shard > 0 {
        return Ok(Box::new(range));
    }
    with_conventional(path, how, range, conv_bytes)
}

/// `seq` after zone emulation over the drive's conventional zones (`conv_bytes` at
/// its start), if they hold a zone; or `seq` alone.
fn with_conventional<Z: ZonedDevice + Send + 'static>(
    path: &Path,
    how: DriveOpen,
    seq: Z,
    conv_bytes: u64,
) -> Result<Box<dyn ZonedDevice + Send>, DeviceError> {
    let g = seq.geometry().clone();
    let mut cfg = crate::ZoneEmuConfig::new(g.zone_size);
    cfg.zone_capacity = g.zone_capacity;
    if cfg.device_bytes_for(1).is_none_or(|need| need > conv_bytes) {
        return Ok(Box::new(seq));
    }
    let file = FileDevice::open_with(
        path,
        &FileOptions {
            direct: crate::DirectIo::Require,
            ..FileOptions::default()
        },
    )?;
    let conv = crate::Window::new(file, 0, conv_bytes)?.without_discard();
    let mut emu = match how {
        DriveOpen::Format => crate::ZoneEmu::format(conv, &cfg)?,
        DriveOpen::Open | DriveOpen::AsIs => crate::ZoneEmu::open(conv)?,
    };
    emu.set_discard_on_reset(false);
    Ok(Box::new(crate::ZonedConcat::new(emu, seq)?))
}

/// What the kernel says of a zoned device besides its zones.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub zone_sectors: u32,
    pub nr_zones: u32,
    /// 0: no limit.
    pub max_open: u32,
    pub max_active: u32,
    pub max_io_bytes: u32,
}

/// A kernel zoned block device. See the module documentation.
pub struct BlkZoned {
    /// The data path (a `FileDevice` with O_DIRECT and io_uring on a real drive).
    dev: Box<dyn BlockDevice + Send>,
    ctl: Box<dyn ZoneControl>,
    path: PathBuf,
    geo: ZoneGeometry,
    rules: Rules,
    layout: Layout,
    zones: Vec<Zone>,
    counts: Counts,
    slots: Tags<Slot>,
    /// Reads and writes in submission order with a done flag.
    order: VecDeque<(u64, bool)>,
    next_seq: u64,
    /// User flushes waiting for `order` to drain below their barrier.
    flushes: VecDeque<(u64, u64)>,
    done: VecDeque<ZoneCompletion>,
    user_in_flight: usize,
    inner_out: Vec<IoCompletion>,
}

impl std::fmt::Debug for BlkZoned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlkZoned")
            .field("path", &self.path)
            .field("geometry", &self.geo)
            .field("counts", &self.counts)
            .field("in_flight", &self.user_in_flight)
            .finish_non_exhaustive()
    }
}

fn setup_error(path: &Path, what: &str, e: impl std::fmt::Display) -> DeviceError {
    DeviceError::InvalidGeometry {
        reason: format!("{}: {what}: {e}", path.display()),
    }
}

impl BlkZoned {
    /// Opens a zoned block device: reads its zones, closes the open ones.
    pub fn open(path: impl AsRef<Path>) -> Result<BlkZoned, DeviceError> {
        let mut d = BlkZoned::open_as_is(path.as_ref())?;
        d.settle()?;
        Ok(d)
    }

    /// Opens without changing any zone's state, for a reader that must not (a check).
    pub fn open_as_is(path: impl AsRef<Path>) -> Result<BlkZoned, DeviceError> {
        let path = path.as_ref();
        let open_failed = |source| DeviceError::OpenFailed {
            path: path.display().to_string(),
            source,
        };
        if !is_zoned_block_device(path).map_err(open_failed)? {
            return Err(setup_error(
                path,
                "not a zoned block device",
                "queue/zoned is none",
            ));
        }
        let rdev = std::fs::metadata(path).map_err(open_failed)?.rdev();
        let dev = FileDevice::open_with(
            path,
            &FileOptions {
                direct: crate::DirectIo::Require,
                ..FileOptions::default()
            },
        )?;
        let file = dev.file();
        let zone_sectors = ioctl_u32(file, BLKGETZONESZ).map_err(open_failed)?;
        let nr_zones = ioctl_u32(file, BLKGETNRZONES).map_err(open_failed)?;
        let ctl = KernelZones {
            file: file.try_clone().map_err(open_failed)?,
        };
        let q = queue_dir(rdev);
        let limit = |name| -> Result<u32, DeviceError> {
            let v = queue_u64(&q, name).map_err(open_failed)?;
            Ok(u32::try_from(v).unwrap_or(u32::MAX))
        };
        let limits = Limits {
            zone_sectors,
            nr_zones,
            max_open: limit("max_open_zones")?,
            max_active: limit("max_active_zones")?,
            // The largest request the queue takes whole, so no write of a zone is split.
            max_io_bytes: match queue_u64(&q, "max_sectors_kb").map_err(open_failed)? {
                0 => u32::MAX,
                kb => u32::try_from(kb * 1024).unwrap_or(u32::MAX),
            },
        };
        BlkZoned::assemble(Box::new(dev), Box::new(ctl), path, &limits)
    }

    /// Puts the device together from its data path, its zone control and what the
    /// kernel said of it, reading every zone.
    pub(crate) fn assemble(
        dev: Box<dyn BlockDevice + Send>,
        ctl: Box<dyn ZoneControl>,
        path: &Path,
        limits: &Limits,
    ) -> Result<BlkZoned, DeviceError> {
        let open_failed = |source| DeviceError::OpenFailed {
            path: path.display().to_string(),
            source,
        };
        if limits.zone_sectors == 0 || limits.nr_zones == 0 {
            return Err(setup_error(
                path,
                "zone geometry",
                "the kernel reports no zones",
            ));
        }
        let zone_size = u64::from(limits.zone_sectors) * SECTOR;
        let all = report_all(ctl.as_ref(), limits.nr_zones).map_err(open_failed)?;
        let layout =
            layout(&all.0, all.1, zone_size).map_err(|e| setup_error(path, "zone layout", e))?;
        let (max_open, max_active) = (limits.max_open, limits.max_active);
        let info = dev.info().clone();
        let max_io = info.max_io_bytes.min(limits.max_io_bytes);
        let lbs = info.logical_block_size;
        let geo = ZoneGeometry {
            name: format!("zoned({})", path.display()),
            logical_block_size: lbs,
            zone_size,
            zone_capacity: layout.capacity,
            zone_count: layout.count,
            max_open_zones: max_open,
            max_active_zones: max_active,
            max_io_bytes: max_io,
            write_unit: lbs,
        };
        let rules = Rules {
            zone_size,
            zone_capacity: layout.capacity,
            zone_count: layout.count,
            logical_block_size: u64::from(lbs),
            max_open,
            max_active,
        };
        let mut d = BlkZoned {
            dev,
            ctl,
            path: path.to_path_buf(),
            geo,
            rules,
            zones: Vec::with_capacity(layout.count as usize),
            layout,
            counts: Counts::default(),
            slots: Tags::new(),
            order: VecDeque::new(),
            next_seq: 0,
            flushes: VecDeque::new(),
            done: VecDeque::new(),
            user_in_flight: 0,
            inner_out: Vec::new(),
        };
        let first = d.layout.first as usize;
        for z in &all.0[first..first + d.layout.count as usize] {
            let (state, wp) = d.mirror(z)?;
            d.counts.moved(ZoneState::Empty, state);
            d.zones.push(Zone {
                state,
                wp,
                writing: false,
                queued: VecDeque::new(),
            });
        }
        Ok(d)
    }

    /// Zones the drive reports open are closed, as after a controller reset, and
    /// zones written up to the capacity Shale uses (a larger zone) are finished, so
    /// they hold no active resource.
    pub(crate) fn settle(&mut self) -> Result<(), DeviceError> {
        let path = self.path.clone();
        for zone in 0..self.layout.count {
            let z = &self.zones[zone as usize];
            if is_active(z.state) && z.wp == self.layout.capacity {
                self.manage(zone, ZoneAction::Finish)
                    .map_err(|e| setup_error(&path, "finishing a zone written to capacity", e))?;
            } else if is_open(z.state) {
                self.manage(zone, ZoneAction::Close)
                    .map_err(|e| setup_error(&path, "closing an open zone", e))?;
            }
        }
        Ok(())
    }

    /// Conventional zones before the first zone used, and their bytes.
    pub fn conventional_zones(&self) -> (u32, u64) {
        (
            self.layout.first,
            u64::from(self.layout.first) * self.layout.zone_size,
        )
    }

    /// The device path this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mirror's state and relative write pointer of a reported zone.
    fn mirror(&self, z: &BlkZone) -> Result<(ZoneState, u64), DeviceError> {
        let state = state_of(z.cond).ok_or_else(|| {
            setup_error(
                &self.path,
                "zone report",
                format!(
                    "zone at sector {} has unknown condition {:#x}",
                    z.start, z.cond
                ),
            )
        })?;
        let wp = match state {
            ZoneState::Empty => 0,
            // A zone larger than the smallest capacity counts as full at it.
            ZoneState::Full => self.layout.capacity,
            _ => z.wp.saturating_sub(z.start) * SECTOR,
        };
        Ok((state, wp.min(self.layout.capacity)))
    }

    /// Reads one zone back from the drive after a failure left it unknown.
    fn resync(&mut self, zone: u32) {
        let sector = self.device_offset(u64::from(zone) * self.layout.zone_size) / SECTOR;
        let Ok((zs, _)) = self.ctl.report(sector, 1) else {
            return;
        };
        let Some(z) = zs.first() else { return };
        if let Ok((state, wp)) = self.mirror(z) {
            let old = self.zones[zone as usize].state;
            self.counts.moved(old, state);
            let zn = &mut self.zones[zone as usize];
            zn.state = state;
            zn.wp = wp;
        }
    }

    fn device_offset(&self, offset: u64) -> u64 {
        u64::from(self.layout.first) * self.layout.zone_size + offset
    }

    fn zone(&self, zone: u32) -> Result<&Zone, ZoneError> {
        self.zones.get(zone as usize).ok_or(ZoneError::NoSuchZone {
            zone,
            count: self.layout.count,
        })
    }

    fn set(&mut self, zone: u32, state: ZoneState, wp: u64) {
        let z = &mut self.zones[zone as usize];
        let old = z.state;
        z.state = state;
        z.wp = wp;
        self.counts.moved(old, state);
    }

    fn check_read(&self, offset: u64, len: u64) -> Result<(), ZoneError> {
        let zone = self.rules.range(IoOpKind::Read, offset, len)?;
        let z = &self.zones[zone as usize];
        self.rules.read(zone, z.state, z.wp, offset, len)
    }

    /// Checks a write (at `offset`, or an append to `zone`) and moves the mirror as
    /// the drive will. Returns the zone and where the data lands.
    fn accept_write(
        &mut self,
        op: IoOpKind,
        offset: Option<u64>,
        zone: Option<u32>,
        len: u64,
    ) -> Result<(u32, u64), ZoneError> {
        let zone = match (offset, zone) {
            (Some(off), _) => self.rules.range(op, off, len)?,
            (None, Some(z)) => {
                self.zone(z)?;
                let start = u64::from(z) * self.layout.zone_size;
                self.rules.range(op, start, len.max(1)).map(|_| z)?;
                if len == 0 || !len.is_multiple_of(self.rules.logical_block_size) {
                    return Err(DeviceError::Misaligned {
                        op,
                        offset: start,
                        len,
                        align: self.rules.logical_block_size,
                    }
                    .into());
                }
                z
            }
            (None, None) => unreachable!("a write names an offset or a zone"),
        };
        let z = &self.zones[zone as usize];
        let at = self
            .rules
            .plan_write(zone, z.state, z.wp, offset, len, self.counts)?;
        let (state, wp) = self.rules.after_write(z.state, z.wp, len);
        self.set(zone, state, wp);
        Ok((zone, at))
    }

    fn ordered_slot(&mut self, user_tag: u64, kind: SlotKind, landed_at: Option<u64>) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((seq, false));
        self.slots.insert(Slot {
            user_tag,
            seq: Some(seq),
            kind,
            landed_at,
        })
    }

    /// Sends a write to the kernel, or queues it behind the zone's write in flight.
    fn submit_write(&mut self, zone: u32, req: IoRequest) {
        let z = &mut self.zones[zone as usize];
        if z.writing {
            z.queued.push_back(req);
        } else {
            z.writing = true;
            self.dev.submit(req);
        }
    }

    fn on_completion(&mut self, c: IoCompletion) {
        let Some(slot) = self.slots.take(c.tag) else {
            panic!("zoned device: the kernel completed unknown tag {}", c.tag);
        };
        if let SlotKind::Write { zone } = slot.kind {
            let failed = c.result.is_err();
            let z = &mut self.zones[zone as usize];
            z.writing = false;
            if failed {
                // The drive's write pointer is unknown: what was queued behind
                // this write cannot land where it was planned.
                let queued: Vec<IoRequest> = z.queued.drain(..).collect();
                for req in queued {
                    let buf = match req.op {
                        IoOp::Write { buf, .. } => Some(buf),
                        _ => None,
                    };
                    if let Some(behind) = self.slots.take(req.tag) {
                        self.finish(
                            behind,
                            buf,
                            Err(ZoneError::Device(DeviceError::Io {
                                op: IoOpKind::Write,
                                offset: 0,
                                source: io::Error::other("an earlier write of the zone failed"),
                            })),
                        );
                    }
                }
                self.resync(zone);
            } else if let Some(next) = z.queued.pop_front() {
                z.writing = true;
                self.dev.submit(next);
            }
        }
        let result = c.result.map(|()| slot.landed_at).map_err(ZoneError::Device);
        self.finish(slot, c.buf, result);
    }

    /// Hands a request's outcome to the caller's next poll.
    fn finish(&mut self, slot: Slot, buf: Option<IoBuf>, result: Result<Option<u64>, ZoneError>) {
        if let Some(seq) = slot.seq {
            mark_done(&mut self.order, seq);
        }
        self.done.push_back(ZoneCompletion {
            tag: slot.user_tag,
            buf,
            result,
        });
    }

    fn reap(&mut self, wait: bool) -> Result<(), DeviceError> {
        let min = usize::from(wait && self.dev.in_flight() > 0);
        let mut out = std::mem::take(&mut self.inner_out);
        let r = self.dev.poll(&mut out, min);
        for c in out.drain(..) {
            self.on_completion(c);
        }
        self.inner_out = out;
        r.map(|_| ())
    }

    /// Sends the flushes whose barrier has drained.
    fn release_flushes(&mut self) {
        while let Some(&(tag, barrier)) = self.flushes.front() {
            if self.order.front().is_some_and(|&(seq, _)| seq < barrier) {
                break;
            }
            self.flushes.pop_front();
            let t = self.slots.insert(Slot {
                user_tag: tag,
                seq: None,
                kind: SlotKind::Flush,
                landed_at: None,
            });
            self.dev.submit(IoRequest {
                tag: t,
                op: IoOp::Flush,
            });
        }
    }

    /// Waits until no write of `zone` is in the kernel or queued.
    fn drain_zone(&mut self, zone: u32) -> Result<(), DeviceError> {
        while self.zones[zone as usize].writing {
            self.reap(true)?;
        }
        Ok(())
    }

    fn fail(&mut self, tag: u64, buf: Option<IoBuf>, e: ZoneError) {
        self.done.push_back(ZoneCompletion {
            tag,
            buf,
            result: Err(e),
        });
    }
}

/// Every zone of the device, in batches.
fn report_all(ctl: &dyn ZoneControl, nr_zones: u32) -> io::Result<(Vec<BlkZone>, bool)> {
    let mut all = Vec::with_capacity(nr_zones as usize);
    let mut with_capacity = true;
    let mut sector = 0u64;
    while all.len() < nr_zones as usize {
        let want = (nr_zones as usize - all.len()).min(REPORT_BATCH);
        let (zones, cap) = ctl.report(sector, want)?;
        let Some(last) = zones.last() else { break };
        sector = last.start + last.len;
        with_capacity &= cap;
        all.extend(zones);
    }
    Ok((all, with_capacity))
}

impl ZonedDevice for BlkZoned {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let z = self.zone(zone)?;
        let start = u64::from(zone) * self.layout.zone_size;
        Ok(ZoneInfo {
            index: zone,
            start,
            capacity: self.layout.capacity,
            write_pointer: start + z.wp,
            state: z.state,
        })
    }

    fn submit(&mut self, req: ZoneRequest) {
        self.user_in_flight += 1;
        let tag = req.tag;
        match req.op {
            ZoneOp::Read { offset, buf } => {
                let len = buf.len() as u64;
                if let Err(e) = self
                    .check_read(offset, len)
                    .and_then(|()| self.geo.check_io_size(IoOpKind::Read, offset, len))
                {
                    return self.fail(tag, Some(buf), e);
                }
                let t = self.ordered_slot(tag, SlotKind::Read, None);
                let offset = self.device_offset(offset);
                self.dev.submit(IoRequest {
                    tag: t,
                    op: IoOp::Read { offset, buf },
                });
            }
            ZoneOp::Write { offset, buf, fua } => {
                self.submit_zone_write(tag, Some(offset), None, buf, fua)
            }
            ZoneOp::Append { zone, buf, fua } => {
                self.submit_zone_write(tag, None, Some(zone), buf, fua)
            }
            ZoneOp::Flush => {
                self.flushes.push_back((tag, self.next_seq));
                self.release_flushes();
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<ZoneCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        let target = min_complete.min(self.user_in_flight);
        let mut added = 0;
        let mut wait = false;
        loop {
            self.reap(wait)?;
            self.release_flushes();
            added += self.done.len();
            self.user_in_flight -= self.done.len();
            out.extend(self.done.drain(..));
            if added >= target || self.dev.in_flight() == 0 {
                // Nothing in the kernel means nothing queued and no flush waiting
                // (release_flushes sent them all), so waiting brings nothing more.
                break;
            }
            wait = true;
        }
        Ok(added)
    }

    fn in_flight(&self) -> usize {
        self.user_in_flight
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), ZoneError> {
        self.check_read(offset, buf.len() as u64)?;
        let offset = self.device_offset(offset);
        self.dev.read_at(offset, buf)?;
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        self.sync_write(Some(offset), None, buf)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        self.sync_write(None, Some(zone), buf)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        let z = self.zone(zone)?;
        let next = self
            .rules
            .transition(zone, z.state, z.wp, action, self.counts)?;
        self.drain_zone(zone)?;
        let start = self.device_offset(u64::from(zone) * self.layout.zone_size);
        if let Err(source) =
            self.ctl
                .command(action, start / SECTOR, self.layout.zone_size / SECTOR)
        {
            self.resync(zone);
            return Err(DeviceError::Io {
                op: IoOpKind::ZoneManagement,
                offset: start,
                source,
            }
            .into());
        }
        let wp = match next {
            ZoneState::Empty => 0,
            ZoneState::Full => self.layout.capacity,
            _ => self.zones[zone as usize].wp,
        };
        self.set(zone, next, wp);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.dev.flush()?;
        Ok(())
    }
}

impl BlkZoned {
    fn submit_zone_write(
        &mut self,
        tag: u64,
        offset: Option<u64>,
        zone: Option<u32>,
        buf: IoBuf,
        fua: bool,
    ) {
        let len = buf.len() as u64;
        let op = if offset.is_some() {
            IoOpKind::Write
        } else {
            IoOpKind::Append
        };
        let checked = self
            .geo
            .check_io_size(op, offset.unwrap_or(0), len)
            .and_then(|()| self.accept_write(op, offset, zone, len));
        match checked {
            Err(e) => self.fail(tag, Some(buf), e),
            Ok((zone, at)) => {
                let t = self.ordered_slot(tag, SlotKind::Write { zone }, Some(at));
                let offset = self.device_offset(at);
                self.submit_write(
                    zone,
                    IoRequest {
                        tag: t,
                        op: IoOp::Write { offset, buf, fua },
                    },
                );
            }
        }
    }

    fn sync_write(
        &mut self,
        offset: Option<u64>,
        zone: Option<u32>,
        buf: &[u8],
    ) -> Result<u64, ZoneError> {
        let len = buf.len() as u64;
        let op = if offset.is_some() {
            IoOpKind::Write
        } else {
            IoOpKind::Append
        };
        // Checked first, without moving the mirror, then the zone's writes drain.
        let zone = match (offset, zone) {
            (Some(off), _) => self.rules.range(op, off, len)?,
            (_, Some(z)) => z,
            (None, None) => unreachable!("a write names an offset or a zone"),
        };
        self.zone(zone)?;
        self.drain_zone(zone)?;
        let (zone, at) = self.accept_write(op, offset, Some(zone), len)?;
        if let Err(e) = self.dev.write_at(self.device_offset(at), buf) {
            self.resync(zone);
            return Err(e.into());
        }
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(start: u64, len: u64, kind: u8, cond: u8, cap: u64) -> BlkZone {
        BlkZone {
            start,
            len,
            wp: start,
            kind,
            cond,
            capacity: cap,
            ..BlkZone::default()
        }
    }

    #[test]
    // `Ioctl` is c_ulong with glibc and c_int with musl.
    #[allow(clippy::unnecessary_cast)]
    fn structs_match_the_kernel_abi() {
        assert_eq!(std::mem::size_of::<BlkZone>(), 64);
        assert_eq!(std::mem::size_of::<BlkZoneReport>(), 16);
        assert_eq!(std::mem::size_of::<BlkZoneRange>(), 16);
        // The numbers <linux/blkzoned.h> gives on x86-64.
        assert_eq!(BLKREPORTZONE as u64, 0xC010_1282);
        assert_eq!(BLKRESETZONE as u64, 0x4010_1283);
        assert_eq!(BLKGETZONESZ as u64, 0x8004_1284);
        assert_eq!(BLKGETNRZONES as u64, 0x8004_1285);
        assert_eq!(BLKOPENZONE as u64, 0x4010_1286);
        assert_eq!(BLKCLOSEZONE as u64, 0x4010_1287);
        assert_eq!(BLKFINISHZONE as u64, 0x4010_1288);
    }

    #[test]
    fn layout_skips_leading_conventional_zones_and_takes_the_smallest_capacity() {
        let zs = 2048; // sectors: 1 MiB zones
        let zones = vec![
            zone(0, zs, 1, 0, zs),
            zone(zs, zs, 1, 0, zs),
            zone(2 * zs, zs, 2, 1, 1536),
            zone(3 * zs, zs, 2, 1, 1024),
            zone(4 * zs, zs, 2, 0xE, 2048),
        ];
        let l = layout(&zones, true, zs * SECTOR).expect("layout");
        assert_eq!(
            l,
            Layout {
                first: 2,
                count: 3,
                zone_size: 1 << 20,
                capacity: 1024 * SECTOR,
            }
        );
        // Without BLK_ZONE_REP_CAPACITY every zone is writable to its end.
        assert_eq!(
            layout(&zones, false, zs * SECTOR).expect("layout").capacity,
            1 << 20
        );
    }

    #[test]
    fn layouts_this_code_cannot_use_are_errors() {
        let zs = 2048;
        let conv_after = vec![zone(0, zs, 2, 1, zs), zone(zs, zs, 1, 0, zs)];
        assert!(matches!(layout(&conv_after, true, zs * SECTOR),
            Err(e) if e.contains("conventional after sequential")));
        let all_conv = vec![zone(0, zs, 1, 0, zs)];
        assert!(layout(&all_conv, true, zs * SECTOR).is_err());
        let gap = vec![zone(0, zs, 2, 1, zs), zone(2 * zs, zs, 2, 1, zs)];
        assert!(matches!(layout(&gap, true, zs * SECTOR),
            Err(e) if e.contains("back to back")));
        let small_last = vec![
            zone(0, zs, 2, 1, zs),
            zone(zs, zs, 2, 1, zs),
            zone(2 * zs, zs / 2, 2, 1, zs / 2),
        ];
        let l = layout(&small_last, true, zs * SECTOR).expect("layout");
        assert_eq!((l.count, l.capacity), (2, zs * SECTOR));
    }

    #[test]
    fn conditions_map_to_zns_states() {
        assert_eq!(state_of(0x1), Some(ZoneState::Empty));
        assert_eq!(state_of(0x2), Some(ZoneState::ImplicitlyOpen));
        assert_eq!(state_of(0x3), Some(ZoneState::ExplicitlyOpen));
        assert_eq!(state_of(0x4), Some(ZoneState::Closed));
        assert_eq!(state_of(0xD), Some(ZoneState::ReadOnly));
        assert_eq!(state_of(0xE), Some(ZoneState::Full));
        assert_eq!(state_of(0xF), Some(ZoneState::Offline));
        assert_eq!(state_of(0x0), None);
        assert_eq!(state_of(0x7), None);
    }

    #[test]
    fn regular_files_and_plain_devices_are_not_zoned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").expect("write");
        assert!(!is_zoned_block_device(&f).expect("stat"));
        assert!(matches!(
            BlkZoned::open(&f),
            Err(DeviceError::InvalidGeometry { .. })
        ));
        assert!(is_zoned_block_device(&dir.path().join("missing")).is_err());
    }
}

#[cfg(test)]
#[path = "blkzoned_tests.rs"]
mod drive_tests;
