//! The power rail: both simulated devices hang off one switch, so a crash can happen
//! at any device operation, including in the middle of a synchronous checkpoint or
//! durability point inside a single `Engine::poll`.
//!
//! [`Powered`] wraps a [`FaultDevice`] and asks the shared [`PowerRail`] before every
//! operation. While the power is on, operations pass through unchanged. A [`Trigger`]
//! names an operation (by what it touches, see [`Place`]) and cuts the power just
//! before it or just after it reaches the device. From then on every operation on
//! either device fails with `DeviceError::Crashed` without touching the device, and
//! `poll` releases nothing: the fault devices hold exactly the state of the instant
//! of the cut, so the simulator can crash them (keep, drop or tear their pending
//! writes) with full knowledge of what was in flight.
//!
//! Invariants:
//! - with the power off, nothing reaches a fault device (no write, no flush, no poll
//!   that could make a write durable);
//! - a trigger fires at most once; an observe-only trigger records the moment and
//!   leaves the power on (the live-check mode).

use std::sync::{Arc, Mutex, MutexGuard};

use shale_device::{
    BlockDevice, DeviceError, DeviceInfo, FaultController, FaultDevice, IoCompletion, IoOp,
    IoOpKind, IoRequest, WriteId,
};
use shale_format::{CacheLayout, GROUP_BLOCKS};

const BS: u64 = 4096;

/// Which device an operation went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Cache,
    /// The block device under the zone emulation.
    Capacity,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DevOpKind {
    Read,
    Write,
    Flush,
    Discard,
}

/// One operation as the rail sees it (byte offsets on the fault device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevOp {
    pub side: Side,
    /// Which device of its side (a pool of shards hangs a cache and a capacity
    /// device per shard off one rail); 0 for the only one.
    pub device: usize,
    pub kind: DevOpKind,
    pub offset: u64,
    pub len: u64,
}

/// What an operation touches, from the cache layout (superblock) and the zone
/// emulation's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Place {
    Superblock,
    VolumeTable,
    Checkpoint,
    Journal,
    L2p,
    ChunkData,
    /// An md block of a chunk; `closes_chunk` for the md of its last group (the
    /// write that completes the chunk's P2L map).
    ChunkMd {
        closes_chunk: bool,
    },
    CacheOther,
    /// The zone emulation's geometry or zone table (persisted on flush, reset,
    /// finish).
    ZoneTable,
    /// A group written into a zone; `closes_zone` when it ends at the zone capacity.
    ZoneData {
        closes_zone: bool,
    },
    /// The discard that follows a zone reset.
    ZoneDiscard,
    CapacityOther,
    /// A device flush.
    Flush(Side),
}

/// Where things are on each device; filled in once the devices are formatted. Every
/// device of a side shares its side's layout (the shards of a pool are formatted
/// alike), so an operation is classified by its offset alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct Layouts {
    pub cache: Option<CacheLayout>,
    pub capacity: Option<CapacityLayout>,
    /// A cache the shards share (`shale_device::SharedCache`): `cache` is each
    /// shard's layout in its view, and this says where the views lie on the device.
    pub cache_shared: Option<SharedCacheLayout>,
}

/// How a cache the shards share is divided (blocks): each shard's metadata window
/// (`shards` of `meta_blocks`), then the chunks, one area for all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedCacheLayout {
    pub shards: u64,
    pub meta_blocks: u64,
}

/// The zone emulation's placement of zones on its inner device (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityLayout {
    pub data_offset: u64,
    pub zone_size: u64,
    pub zone_capacity: u64,
}

impl Layouts {
    /// Classifies an operation.
    pub fn place(&self, op: &DevOp) -> Place {
        if op.kind == DevOpKind::Flush {
            return Place::Flush(op.side);
        }
        match op.side {
            Side::Cache => self
                .cache
                .map_or(Place::CacheOther, |l| match self.cache_shared {
                    Some(s) => shared_cache_place(&l, &s, op),
                    None => cache_place(&l, op),
                }),
            Side::Capacity => self
                .capacity
                .map_or(Place::CapacityOther, |l| capacity_place(&l, op)),
        }
    }
}

fn cache_place(l: &CacheLayout, op: &DevOp) -> Place {
    let first = op.offset / BS;
    let end = (op.offset + op.len).div_ceil(BS).max(first + 1);
    let within = |start: u64, len: u64| first >= start && first < start + len;
    if first < 2 {
        Place::Superblock
    } else if within(l.volume_table_start, 2 * l.volume_table_copy_blocks()) {
        Place::VolumeTable
    } else if within(l.checkpoint_a_start, u64::from(l.checkpoint_blocks))
        || within(l.checkpoint_b_start, u64::from(l.checkpoint_blocks))
    {
        Place::Checkpoint
    } else if within(l.journal_start, u64::from(l.journal_blocks)) {
        Place::Journal
    } else if within(l.l2p_area_start, 2 * u64::from(l.l2p_pool_pages)) {
        Place::L2p
    } else if first >= l.data_start && first < l.end() && l.chunk_blocks > 0 {
        let chunk = u64::from(l.chunk_blocks);
        let group = u64::from(GROUP_BLOCKS);
        // Chunks are whole groups (chunk_blocks is a multiple of 128): md in slots 126, 127.
        let md = (first..end).find(|b| (b - l.data_start) % group >= group - 2);
        match md {
            Some(b) => Place::ChunkMd {
                closes_chunk: (b - l.data_start) % chunk >= chunk - 2,
            },
            None => Place::ChunkData,
        }
    } else {
        Place::CacheOther
    }
}

/// As `cache_place`, for an operation on a cache the shards share: a metadata
/// window is classified by its shard's layout, and the chunk area as the chunks of
/// one layout whose data begins where the area does.
fn shared_cache_place(l: &CacheLayout, s: &SharedCacheLayout, op: &DevOp) -> Place {
    let first = op.offset / BS;
    let area = s.shards * s.meta_blocks;
    if s.meta_blocks == 0 {
        return Place::CacheOther;
    }
    if first < area {
        let rebased = DevOp {
            offset: op.offset - (first / s.meta_blocks) * s.meta_blocks * BS,
            ..*op
        };
        return cache_place(l, &rebased);
    }
    let chunks = CacheLayout {
        data_start: area,
        ..*l
    };
    cache_place(&chunks, op)
}

fn capacity_place(l: &CapacityLayout, op: &DevOp) -> Place {
    if op.offset < l.data_offset {
        return Place::ZoneTable;
    }
    if l.zone_size == 0 {
        return Place::CapacityOther;
    }
    let rel = (op.offset - l.data_offset) % l.zone_size;
    match op.kind {
        DevOpKind::Discard => Place::ZoneDiscard,
        DevOpKind::Write => Place::ZoneData {
            closes_zone: rel + op.len >= l.zone_capacity,
        },
        _ => Place::CapacityOther,
    }
}

/// Which operations a trigger counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Writes to the cache's metadata areas: superblock, volume table, checkpoint
    /// areas, journal, L2P pages.
    Metadata,
    Superblock,
    Checkpoint,
    Journal,
    L2p,
    VolumeTable,
    /// md blocks of chunks (group seals and partial md rewrites at durability points).
    ChunkMd,
    /// The md of a chunk's last group.
    ChunkClose,
    /// Zone group writes (compaction and GC).
    ZoneWrite,
    /// The group write that fills a zone.
    ZoneClose,
    /// Zone table persists of the zone emulation (flush, reset, finish).
    ZoneTable,
    /// The discard of a zone reset.
    ZoneReset,
    CacheFlush,
    CapacityFlush,
    /// Any write, discard or flush on either device.
    AnyUpdate,
    /// Writes and discards on `side` overlapping the byte range `lo..hi` (a test that
    /// knows exactly which structure it wants to cut).
    Bytes {
        side: Side,
        lo: u64,
        hi: u64,
    },
}

impl Target {
    pub const ALL: [Target; 15] = [
        Target::Metadata,
        Target::Superblock,
        Target::Checkpoint,
        Target::Journal,
        Target::L2p,
        Target::VolumeTable,
        Target::ChunkMd,
        Target::ChunkClose,
        Target::ZoneWrite,
        Target::ZoneClose,
        Target::ZoneTable,
        Target::ZoneReset,
        Target::CacheFlush,
        Target::CapacityFlush,
        Target::AnyUpdate,
    ];

    /// Whether `op` (classified as `place`) counts toward this target.
    pub fn matches(self, op: &DevOp, place: Place) -> bool {
        if op.kind == DevOpKind::Read {
            return false;
        }
        match self {
            Target::Metadata => matches!(
                place,
                Place::Superblock
                    | Place::VolumeTable
                    | Place::Checkpoint
                    | Place::Journal
                    | Place::L2p
            ),
            Target::Superblock => place == Place::Superblock,
            Target::Checkpoint => place == Place::Checkpoint,
            Target::Journal => place == Place::Journal,
            Target::L2p => place == Place::L2p,
            Target::VolumeTable => place == Place::VolumeTable,
            Target::ChunkMd => matches!(place, Place::ChunkMd { .. }),
            Target::ChunkClose => place == Place::ChunkMd { closes_chunk: true },
            Target::ZoneWrite => matches!(place, Place::ZoneData { .. }),
            Target::ZoneClose => place == Place::ZoneData { closes_zone: true },
            Target::ZoneTable => place == Place::ZoneTable && op.kind == DevOpKind::Write,
            Target::ZoneReset => place == Place::ZoneDiscard,
            Target::CacheFlush => place == Place::Flush(Side::Cache),
            Target::CapacityFlush => place == Place::Flush(Side::Capacity),
            Target::AnyUpdate => true,
            Target::Bytes { side, lo, hi } => {
                op.side == side
                    && matches!(op.kind, DevOpKind::Write | DevOpKind::Discard)
                    && op.offset < hi
                    && op.offset + op.len > lo
            }
        }
    }
}

/// Cut the power just before the operation reaches the device, or just after (then
/// the operation is pending on the fault device and a crash may keep, drop or tear
/// it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    Before,
    After,
}

/// Fires at the `nth` (1-based) operation matching `target`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trigger {
    pub target: Target,
    pub nth: u32,
    pub phase: Phase,
    /// Record the moment but keep the power on.
    pub observe_only: bool,
}

/// The operation a trigger fired at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fired {
    pub op: DevOp,
    pub place: Place,
    pub phase: Phase,
    /// For a write that reached the device (phase After): its pending id and length,
    /// so a crash can tear exactly this write.
    pub write: Option<(WriteId, u64)>,
}

#[derive(Debug, Default)]
struct RailState {
    on: bool,
    layouts: Layouts,
    trigger: Option<Trigger>,
    seen: u32,
    fired: Option<Fired>,
    /// Operations that went through since the rail was made.
    ops: u64,
    /// Flushes on this device succeed without reaching it (a harness self-test: a
    /// device that lies about durability must be caught by the oracle).
    lying: Option<Side>,
    /// Device calls since the last [`PowerRail::mark`], and the most allowed: an
    /// engine that spins inside one `poll` (waiting for a completion that will never
    /// come) is stopped by cutting the power instead of hanging the simulation.
    calls: u64,
    calls_max: Option<u64>,
    spun: bool,
    /// Print every update (write, discard, flush) to stderr, for diagnosing a replay.
    log_updates: bool,
}

/// The shared switch both devices hang off. Cloning shares it.
#[derive(Debug, Clone)]
pub struct PowerRail {
    state: Arc<Mutex<RailState>>,
}

impl Default for PowerRail {
    fn default() -> Self {
        Self::new()
    }
}

enum Gate {
    Off,
    Pass,
    /// Forward, then cut (phase After).
    PassThenFire(Trigger),
}

impl PowerRail {
    /// A rail with the power on and no trigger.
    pub fn new() -> PowerRail {
        PowerRail {
            state: Arc::new(Mutex::new(RailState {
                on: true,
                ..RailState::default()
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, RailState> {
        // Nothing panics while holding this lock; a poisoned state is still whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn is_on(&self) -> bool {
        self.lock().on
    }

    pub fn cut(&self) {
        self.lock().on = false;
    }

    /// Power back on; any trigger and fired record are cleared.
    pub fn restore(&self) {
        let mut s = self.lock();
        s.on = true;
        s.trigger = None;
        s.seen = 0;
        s.fired = None;
        s.calls = 0;
        s.spun = false;
    }

    pub fn set_layouts(&self, layouts: Layouts) {
        self.lock().layouts = layouts;
    }

    pub fn layouts(&self) -> Layouts {
        self.lock().layouts
    }

    /// Arms a trigger (replacing any other); clears the previous fired record.
    pub fn arm(&self, trigger: Trigger) {
        let mut s = self.lock();
        s.trigger = Some(trigger);
        s.seen = 0;
        s.fired = None;
    }

    /// Disarms the trigger; returns how many matching operations it had seen.
    pub fn disarm(&self) -> u32 {
        let mut s = self.lock();
        s.trigger = None;
        s.seen
    }

    /// The moment the trigger fired, if it did.
    pub fn fired(&self) -> Option<Fired> {
        self.lock().fired.clone()
    }

    pub fn take_fired(&self) -> Option<Fired> {
        self.lock().fired.take()
    }

    /// Operations that passed the rail so far.
    pub fn ops(&self) -> u64 {
        self.lock().ops
    }

    /// Makes synchronous flushes on `side` report success without reaching the
    /// device (`None`: honest devices).
    pub fn set_lying_flushes(&self, side: Option<Side>) {
        self.lock().lying = side;
    }

    fn lies(&self, side: Side) -> bool {
        self.lock().lying == Some(side)
    }

    /// Prints every update to stderr while on (diagnosing a replay).
    pub fn set_log_updates(&self, on: bool) {
        self.lock().log_updates = on;
    }

    /// Limits device calls between two marks (`None`: no limit).
    pub fn set_calls_max(&self, max: Option<u64>) {
        self.lock().calls_max = max;
    }

    /// Starts a new count of device calls (the harness marks before each engine poll).
    pub fn mark(&self) {
        self.lock().calls = 0;
    }

    /// Whether the call limit cut the power (the engine spun in one poll).
    pub fn spun(&self) -> bool {
        self.lock().spun
    }

    /// Counts a device call; false if the power is (now) off.
    fn call(s: &mut RailState) -> bool {
        if !s.on {
            return false;
        }
        s.calls += 1;
        if s.calls_max.is_some_and(|m| s.calls > m) {
            s.on = false;
            s.spun = true;
            return false;
        }
        true
    }

    fn poll_allowed(&self) -> bool {
        Self::call(&mut self.lock())
    }

    fn gate(&self, op: &DevOp) -> Gate {
        let mut s = self.lock();
        if !Self::call(&mut s) {
            return Gate::Off;
        }
        s.ops += 1;
        if s.log_updates && op.kind != DevOpKind::Read {
            eprintln!(
                "    {:?} {:?} {}+{} {:?}",
                op.side,
                op.kind,
                op.offset,
                op.len,
                s.layouts.place(op)
            );
        }
        let Some(t) = s.trigger else {
            return Gate::Pass;
        };
        let place = s.layouts.place(op);
        if !t.target.matches(op, place) {
            return Gate::Pass;
        }
        s.seen += 1;
        if s.seen < t.nth {
            return Gate::Pass;
        }
        s.trigger = None;
        match t.phase {
            Phase::Before => {
                s.fired = Some(Fired {
                    op: *op,
                    place,
                    phase: Phase::Before,
                    write: None,
                });
                if t.observe_only {
                    Gate::Pass
                } else {
                    s.on = false;
                    Gate::Off
                }
            }
            Phase::After => Gate::PassThenFire(t),
        }
    }

    fn fire_after(&self, t: Trigger, op: &DevOp, write: Option<(WriteId, u64)>) {
        let mut s = self.lock();
        let place = s.layouts.place(op);
        s.fired = Some(Fired {
            op: *op,
            place,
            phase: Phase::After,
            write,
        });
        if !t.observe_only {
            s.on = false;
        }
    }
}

/// A fault device on the power rail.
#[derive(Debug)]
pub struct Powered {
    inner: FaultDevice,
    ctl: FaultController,
    side: Side,
    device: usize,
    rail: PowerRail,
}

impl Powered {
    /// The only device of its side.
    pub fn new(inner: FaultDevice, side: Side, rail: PowerRail) -> Powered {
        Self::numbered(inner, side, 0, rail)
    }

    /// Device `device` of its side (its operations carry the number).
    pub fn numbered(inner: FaultDevice, side: Side, device: usize, rail: PowerRail) -> Powered {
        let ctl = inner.controller();
        Powered {
            inner,
            ctl,
            side,
            device,
            rail,
        }
    }

    pub fn controller(&self) -> FaultController {
        self.ctl.clone()
    }

    /// The fault device, off the rail.
    pub fn into_inner(self) -> FaultDevice {
        self.inner
    }

    fn op(&self, kind: DevOpKind, offset: u64, len: u64) -> DevOp {
        DevOp {
            side: self.side,
            device: self.device,
            kind,
            offset,
            len,
        }
    }

    /// The pending id of the write just recorded at `offset`, for tearing it.
    fn last_write(&self, op: &DevOp) -> Option<(WriteId, u64)> {
        if op.kind != DevOpKind::Write {
            return None;
        }
        self.ctl
            .pending_writes()
            .iter()
            .rev()
            .find(|p| p.offset == op.offset && p.len == op.len && !p.discard)
            .filter(|p| !p.durable)
            .map(|p| (p.id, p.len))
    }

    fn crashed(op: IoOpKind) -> DeviceError {
        DeviceError::Crashed { op }
    }
}

impl BlockDevice for Powered {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }

    fn submit(&mut self, req: IoRequest) {
        let op = match &req.op {
            IoOp::Read { offset, buf } => self.op(DevOpKind::Read, *offset, buf.len() as u64),
            IoOp::Write { offset, buf, .. } => self.op(DevOpKind::Write, *offset, buf.len() as u64),
            IoOp::Flush => self.op(DevOpKind::Flush, 0, 0),
            IoOp::Discard { offset, len } => self.op(DevOpKind::Discard, *offset, *len),
        };
        match self.rail.gate(&op) {
            // A machine without power: the request goes nowhere; `poll` reports it.
            Gate::Off => {}
            Gate::Pass => self.inner.submit(req),
            Gate::PassThenFire(t) => {
                self.inner.submit(req);
                let w = self.last_write(&op);
                self.rail.fire_after(t, &op, w);
            }
        }
    }

    fn poll(
        &mut self,
        out: &mut Vec<IoCompletion>,
        min_complete: usize,
    ) -> Result<usize, DeviceError> {
        if !self.rail.poll_allowed() {
            return Err(Self::crashed(IoOpKind::Submit));
        }
        self.inner.poll(out, min_complete)
    }

    fn in_flight(&self) -> usize {
        if self.rail.is_on() {
            self.inner.in_flight()
        } else {
            0
        }
    }

    fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), DeviceError> {
        let op = self.op(DevOpKind::Read, offset, buf.len() as u64);
        match self.rail.gate(&op) {
            Gate::Off => Err(Self::crashed(IoOpKind::Read)),
            Gate::Pass => self.inner.read_at(offset, buf),
            Gate::PassThenFire(t) => {
                let r = self.inner.read_at(offset, buf);
                self.rail.fire_after(t, &op, None);
                r
            }
        }
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<(), DeviceError> {
        let op = self.op(DevOpKind::Write, offset, buf.len() as u64);
        match self.rail.gate(&op) {
            Gate::Off => Err(Self::crashed(IoOpKind::Write)),
            Gate::Pass => self.inner.write_at(offset, buf),
            Gate::PassThenFire(t) => {
                let r = self.inner.write_at(offset, buf);
                let w = if r.is_ok() {
                    self.last_write(&op)
                } else {
                    None
                };
                self.rail.fire_after(t, &op, w);
                r
            }
        }
    }

    fn flush(&mut self) -> Result<(), DeviceError> {
        let op = self.op(DevOpKind::Flush, 0, 0);
        match self.rail.gate(&op) {
            Gate::Off => Err(Self::crashed(IoOpKind::Flush)),
            Gate::Pass if self.rail.lies(self.side) => Ok(()),
            Gate::Pass => self.inner.flush(),
            Gate::PassThenFire(t) => {
                let r = self.inner.flush();
                self.rail.fire_after(t, &op, None);
                r
            }
        }
    }

    fn discard(&mut self, offset: u64, len: u64) -> Result<(), DeviceError> {
        let op = self.op(DevOpKind::Discard, offset, len);
        match self.rail.gate(&op) {
            Gate::Off => Err(Self::crashed(IoOpKind::Discard)),
            Gate::Pass => self.inner.discard(offset, len),
            Gate::PassThenFire(t) => {
                let r = self.inner.discard(offset, len);
                self.rail.fire_after(t, &op, None);
                r
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shale_device::{CrashMode, IoBuf};

    fn dev(rail: &PowerRail) -> Powered {
        let d = FaultDevice::new(1 << 20, 4096, 1).expect("device");
        Powered::new(d, Side::Cache, rail.clone())
    }

    fn layout() -> CacheLayout {
        CacheLayout {
            volume_table_start: 2,
            volume_table_blocks: 1,
            checkpoint_a_start: 4,
            checkpoint_b_start: 8,
            checkpoint_blocks: 4,
            journal_blocks: 8,
            journal_start: 12,
            l2p_area_start: 20,
            l2p_pool_pages: 4,
            data_start: 28,
            chunk_blocks: 256,
            chunk_count: 2,
        }
    }

    #[test]
    fn places_follow_the_layout() {
        let l = Layouts {
            cache: Some(layout()),
            capacity: Some(CapacityLayout {
                data_offset: 1 << 20,
                zone_size: 128 * BS,
                zone_capacity: 128 * BS,
            }),
            cache_shared: None,
        };
        let w = |side, block: u64, blocks: u64| DevOp {
            side,
            device: 0,
            kind: DevOpKind::Write,
            offset: block * BS,
            len: blocks * BS,
        };
        assert_eq!(l.place(&w(Side::Cache, 1, 1)), Place::Superblock);
        assert_eq!(l.place(&w(Side::Cache, 3, 1)), Place::VolumeTable);
        assert_eq!(l.place(&w(Side::Cache, 9, 3)), Place::Checkpoint);
        assert_eq!(l.place(&w(Side::Cache, 19, 1)), Place::Journal);
        assert_eq!(l.place(&w(Side::Cache, 27, 1)), Place::L2p);
        assert_eq!(l.place(&w(Side::Cache, 28, 126)), Place::ChunkData);
        assert_eq!(
            l.place(&w(Side::Cache, 28 + 126, 2)),
            Place::ChunkMd {
                closes_chunk: false
            }
        );
        assert_eq!(
            l.place(&w(Side::Cache, 28 + 256 + 254, 1)),
            Place::ChunkMd { closes_chunk: true }
        );
        let zone = |rel: u64, blocks: u64| DevOp {
            side: Side::Capacity,
            device: 0,
            kind: DevOpKind::Write,
            offset: (1 << 20) + 3 * 128 * BS + rel * BS,
            len: blocks * BS,
        };
        assert_eq!(
            l.place(&zone(0, 64)),
            Place::ZoneData { closes_zone: false }
        );
        assert_eq!(
            l.place(&zone(64, 64)),
            Place::ZoneData { closes_zone: true }
        );
        assert_eq!(l.place(&w(Side::Capacity, 8, 1)), Place::ZoneTable);
    }

    #[test]
    fn places_on_a_shared_cache_follow_each_shards_window_and_the_shared_chunks() {
        // Three windows of 32 blocks (each shard's layout ends its metadata at 28),
        // then the chunks from block 96.
        let l = Layouts {
            cache: Some(CacheLayout {
                data_start: 32,
                ..layout()
            }),
            capacity: None,
            cache_shared: Some(SharedCacheLayout {
                shards: 3,
                meta_blocks: 32,
            }),
        };
        let w = |block: u64, blocks: u64| DevOp {
            side: Side::Cache,
            device: 0,
            kind: DevOpKind::Write,
            offset: block * BS,
            len: blocks * BS,
        };
        for window in 0..3 {
            let base = window * 32;
            assert_eq!(l.place(&w(base + 1, 1)), Place::Superblock);
            assert_eq!(l.place(&w(base + 9, 3)), Place::Checkpoint);
            assert_eq!(l.place(&w(base + 19, 1)), Place::Journal);
            assert_eq!(l.place(&w(base + 27, 1)), Place::L2p);
        }
        assert_eq!(l.place(&w(96, 126)), Place::ChunkData);
        assert_eq!(
            l.place(&w(96 + 126, 2)),
            Place::ChunkMd {
                closes_chunk: false
            }
        );
        assert_eq!(
            l.place(&w(96 + 256 + 254, 1)),
            Place::ChunkMd { closes_chunk: true }
        );
    }

    #[test]
    fn a_trigger_cuts_the_power_at_its_nth_operation() {
        let rail = PowerRail::new();
        rail.set_layouts(Layouts {
            cache: Some(layout()),
            capacity: None,
            cache_shared: None,
        });
        let mut d = dev(&rail);
        let ctl = d.controller();
        rail.arm(Trigger {
            target: Target::Journal,
            nth: 2,
            phase: Phase::After,
            observe_only: false,
        });
        d.write_at(12 * BS, &[1u8; 4096]).expect("journal 1");
        d.write_at(40 * BS, &[2u8; 4096]).expect("data");
        d.write_at(13 * BS, &[3u8; 8192])
            .expect("journal 2 reaches the device");
        let fired = rail.fired().expect("fired");
        assert_eq!(fired.place, Place::Journal);
        let (id, len) = fired.write.expect("the write is pending");
        assert_eq!(len, 8192);
        assert!(!rail.is_on());
        // Nothing more reaches the device, not even a flush.
        assert!(matches!(
            d.flush(),
            Err(DeviceError::Crashed {
                op: IoOpKind::Flush
            })
        ));
        d.submit(IoRequest {
            tag: 1,
            op: IoOp::Write {
                offset: 0,
                buf: IoBuf::zeroed(4096),
                fua: true,
            },
        });
        let mut out = Vec::new();
        assert!(d.poll(&mut out, 1).is_err());
        assert!(out.is_empty());
        // The torn write can be cut exactly.
        let (report, mut fresh) = ctl
            .crash(&CrashMode::TearWrite {
                keep: vec![],
                id,
                keep_bytes: 4096,
            })
            .expect("crash");
        assert_eq!(report.torn, Some((id, 4096)));
        let mut b = vec![0u8; 8192];
        fresh.read_at(13 * BS, &mut b).expect("read");
        assert!(b[..4096].iter().all(|&x| x == 3));
        assert!(b[4096..].iter().all(|&x| x == 0));
        assert_eq!(report.dropped.len(), 2, "{report:?}");
    }

    #[test]
    fn before_phase_keeps_the_operation_off_the_device() {
        let rail = PowerRail::new();
        let mut d = dev(&rail);
        let ctl = d.controller();
        rail.arm(Trigger {
            target: Target::CacheFlush,
            nth: 1,
            phase: Phase::Before,
            observe_only: false,
        });
        d.write_at(0, &[9u8; 4096]).expect("write");
        assert!(d.flush().is_err());
        assert_eq!(ctl.counters().flushes, 0);
        rail.restore();
        assert!(rail.is_on() && rail.fired().is_none());
    }

    #[test]
    fn a_spinning_caller_is_stopped() {
        let rail = PowerRail::new();
        rail.set_calls_max(Some(100));
        let mut d = dev(&rail);
        let mut out = Vec::new();
        let mut n = 0;
        while d.poll(&mut out, 0).is_ok() {
            n += 1;
            assert!(n <= 100, "not stopped");
        }
        assert!(rail.spun() && !rail.is_on());
        rail.restore();
        rail.mark();
        assert!(d.poll(&mut out, 0).is_ok() && !rail.spun());
    }

    #[test]
    fn a_bytes_trigger_counts_updates_overlapping_its_range() {
        let rail = PowerRail::new();
        let mut d = dev(&rail);
        rail.arm(Trigger {
            target: Target::Bytes {
                side: Side::Cache,
                lo: 2 * BS,
                hi: 3 * BS,
            },
            nth: 2,
            phase: Phase::After,
            observe_only: false,
        });
        d.write_at(0, &[1u8; 8192]).expect("below the range");
        d.write_at(BS, &[2u8; 8192]).expect("overlapping: first");
        let mut b = vec![0u8; 4096];
        d.read_at(2 * BS, &mut b).expect("reads do not count");
        d.flush().expect("flushes do not count");
        assert!(rail.is_on() && rail.fired().is_none());
        d.discard(2 * BS, BS)
            .expect("overlapping: second, reaches the device");
        assert_eq!(rail.fired().map(|f| f.op.kind), Some(DevOpKind::Discard));
        assert!(!rail.is_on());
    }

    #[test]
    fn observe_only_keeps_the_power_on() {
        let rail = PowerRail::new();
        let mut d = dev(&rail);
        rail.arm(Trigger {
            target: Target::AnyUpdate,
            nth: 1,
            phase: Phase::Before,
            observe_only: true,
        });
        d.write_at(0, &[9u8; 4096]).expect("write");
        assert!(rail.fired().is_some() && rail.is_on());
        d.flush().expect("flush");
    }
}
