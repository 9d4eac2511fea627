//! Zone emulation over any block device (CSAL's "CSAL-BLK" mode): a conventional
//! drive presented as a ZNS device, with every ZNS rule enforced.
//!
//! Zone `i` occupies `data_offset + i * zone_size ..` on the inner device, after a
//! small metadata area (format in `zone_meta.rs` and docs/devices.md). Rules are
//! checked at submission and write pointers advance there, as on ZNS.
//!
//! Invariants:
//! - `open_count` / `active_count` always equal the number of zones in open /
//!   active states, and never exceed the configured limits.
//! - Zone writes are issued to the inner device in increasing offset order per
//!   zone; `Zone::inflight` is therefore sorted, and the persisted write pointer of
//!   a zone (its "safe" write pointer) never covers a write that has not completed.
//! - Every table persist is `inner flush; write what changed; inner flush`, so the
//!   persisted table never claims data that the inner device has not made durable,
//!   and is itself durable before the operation that wrote it returns. What changed
//!   is the table blocks whose zones changed (the whole table on a pool formatted
//!   with the version-1 metadata); a torn persist leaves each zone old or new.
//! - With a limit on active zones, no subset of a persist's block writes may
//!   exceed it at open: blocks that lower their active count are written and
//!   flushed before blocks that raise it.
//! - A reset waits for the zone's in-flight writes and is persisted before its range
//!   is discarded, so a stale write can never land in a reused zone and a crash
//!   cannot resurrect the zone's old contents above the write pointer.
//! - The discard is asynchronous (a hole punch or a drive's TRIM can take
//!   milliseconds, and the caller's thread should not wait for it): writes to the
//!   zone submitted before it completes are held in `Zone::held` and go to the inner
//!   device when it does, so the discard can never overtake and erase them. A
//!   synchronous write, a reset of the same zone and a synchronous flush wait for it.
//!
//! Durability: write pointers survive a reopen as of the last persisted table
//! (flush or zone management command). Data written after that may be lost, as on
//! a real device with a volatile write cache; the zone then reopens with the older
//! write pointer. After reopen, open zones are Closed (or Empty if nothing durable
//! was written), as after a ZNS controller reset.

use std::collections::VecDeque;

use crate::tags::{mark_done, Tags};
use crate::zone_meta::{
    block_zones, data_offset_for, decode_geometry, decode_table, decode_table_block,
    encode_geometry, encode_table, encode_table_block, table_blocks, table_slot_bytes,
    MetaGeometry, TableEntry, ENTRIES_PER_BLOCK, META_BLOCK_BYTES, META_VERSION_BLOCKS,
    META_VERSION_WHOLE, TABLE_SLOT0_OFFSET,
};
use crate::zone_rules::{is_active, is_open, Counts, Rules};
use crate::{
    BlockDevice, DeviceError, IoBuf, IoCompletion, IoOp, IoOpKind, IoRequest, ZoneAction,
    ZoneCompletion, ZoneError, ZoneGeometry, ZoneInfo, ZoneOp, ZoneRequest, ZoneState, ZonedDevice,
};

/// A problem [`ZoneEmu::verify_metadata`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaProblem {
    /// The device does not open (no valid copy of something it needs).
    pub fatal: bool,
    pub message: String,
}

impl MetaProblem {
    fn fatal(message: String) -> MetaProblem {
        MetaProblem {
            fatal: true,
            message,
        }
    }

    fn survivable(message: String) -> MetaProblem {
        MetaProblem {
            fatal: false,
            message,
        }
    }
}

/// How to lay zones over the inner device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZoneEmuConfig {
    pub zone_size: u64,
    /// Writable bytes per zone, `<= zone_size`.
    pub zone_capacity: u64,
    /// 0 means no limit.
    pub max_open_zones: u32,
    /// 0 means no limit. Must be `>= max_open_zones` when both are set.
    pub max_active_zones: u32,
    /// Use at most this many zones; 0 means as many as fit.
    pub zone_count_max: u32,
}

impl ZoneEmuConfig {
    /// Size an inner device needs for exactly `zone_count` zones of this config (with
    /// `zone_count_max` set to `zone_count`): the zone metadata, whose end is aligned
    /// (see `zone_meta`), plus the zones.
    pub fn device_bytes_for(&self, zone_count: u32) -> Option<u64> {
        let slot = table_slot_bytes(u64::from(zone_count));
        data_offset_for(slot, self.zone_size)?
            .checked_add(self.zone_size.checked_mul(u64::from(zone_count))?)
    }

    /// Zones of `zone_size` bytes, fully writable, no limits.
    pub fn new(zone_size: u64) -> ZoneEmuConfig {
        ZoneEmuConfig {
            zone_size,
            zone_capacity: zone_size,
            max_open_zones: 0,
            max_active_zones: 0,
            zone_count_max: 0,
        }
    }
}

/// The faults [`ZoneEmu::set_zone_state`] can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ZoneFault {
    ReadOnly,
    Offline,
}

#[derive(Debug)]
struct Zone {
    state: ZoneState,
    /// Write pointer relative to the zone start.
    wp: u64,
    /// Relative starts of this zone's writes submitted to the inner device and not
    /// yet completed, in submission (= offset) order, with a done flag.
    inflight: VecDeque<(u64, bool)>,
    /// A reset's discard of this zone is in flight on the inner device.
    discarding: bool,
    /// Writes to this zone waiting for that discard (inner requests, tags allocated).
    held: Vec<IoRequest>,
}

impl Zone {
    /// The write pointer below which every write has completed.
    fn safe_wp(&self) -> u64 {
        self.inflight.front().map_or(self.wp, |&(start, _)| start)
    }
}

#[derive(Debug)]
enum InnerKind {
    Read,
    Write {
        zone: u32,
        rel: u64,
    },
    /// A reset's discard: internal, no user completion.
    Discard {
        zone: u32,
    },
}

#[derive(Debug)]
struct InnerSlot {
    user_tag: u64,
    seq: u64,
    kind: InnerKind,
    landed_at: Option<u64>,
}

/// A ZNS device emulated over a block device.
#[derive(Debug)]
pub struct ZoneEmu<D: BlockDevice> {
    inner: D,
    geo: ZoneGeometry,
    meta: MetaGeometry,
    zones: Vec<Zone>,
    open_count: u32,
    active_count: u32,
    /// The highest table generation on media.
    generation: u64,
    /// Version 2: each table block's newest version on media, what a persist
    /// compares with to find the blocks to write.
    persisted: Vec<TableEntry>,
    /// Version 2: the copy (0 or 1) holding each block's newest version.
    newest_copy: Vec<u8>,
    /// Version 2: blocks a failed persist may have left in an unknown state, written
    /// by the next persist whether or not they changed.
    must_write: Vec<bool>,
    /// Version 2: blocks with a zone changed since the last persist (state, write
    /// pointer, a write completed), listed once; a persist looks at these only, so
    /// its cost follows what changed, not the drive's zone count.
    touched: Vec<u64>,
    touched_flag: Vec<bool>,
    /// Discards in flight, so waiting for all of them need not scan every zone.
    discards_in_flight: usize,
    /// Inner requests in flight, indexed by the internal tag.
    slots: Tags<InnerSlot>,
    /// Every inner request in submission order, with a done flag, so a flush can
    /// wait for exactly the requests submitted before it.
    order: VecDeque<(u64, bool)>,
    next_seq: u64,
    /// User flushes waiting for `order` to drain below their barrier.
    flushes: VecDeque<(u64, u64)>,
    done: VecDeque<ZoneCompletion>,
    user_in_flight: usize,
    inner_out: Vec<IoCompletion>,
    /// Encoding space: a whole table slot (version 1) or one block (version 2).
    slot_buf: Vec<u8>,
    /// The first failed asynchronous discard, reported by the next zone management
    /// command or flush.
    discard_error: Option<DeviceError>,
    /// Resets discard the zone's range (see [`ZoneEmu::set_discard_on_reset`]).
    discard_on_reset: bool,
}

fn config_error(reason: String) -> DeviceError {
    DeviceError::InvalidGeometry { reason }
}

impl<D: BlockDevice> ZoneEmu<D> {
    /// Lays out zones over `inner`, writes fresh metadata (all zones Empty), discards
    /// the zone area and makes it all durable.
    pub fn format(mut inner: D, config: &ZoneEmuConfig) -> Result<ZoneEmu<D>, DeviceError> {
        let lbs = inner.info().logical_block_size;
        let lbs64 = u64::from(lbs);
        let size = inner.info().size_bytes;
        let c = config;
        if c.zone_size == 0 || !c.zone_size.is_multiple_of(lbs64) {
            return Err(config_error(format!(
                "zone size {} is not a non-zero multiple of the logical block size {lbs}",
                c.zone_size
            )));
        }
        if c.zone_capacity == 0
            || c.zone_capacity > c.zone_size
            || !c.zone_capacity.is_multiple_of(lbs64)
        {
            return Err(config_error(format!(
                "zone capacity {} must be a non-zero multiple of {lbs} no larger than the zone size {}",
                c.zone_capacity, c.zone_size
            )));
        }
        if c.max_open_zones != 0 && c.max_active_zones != 0 && c.max_open_zones > c.max_active_zones
        {
            return Err(config_error(format!(
                "max open zones {} exceeds max active zones {}",
                c.max_open_zones, c.max_active_zones
            )));
        }
        // The table is sized for every zone that could fit, then zones are counted in
        // what remains; the table is then at most slightly larger than needed.
        let mut fit = size / c.zone_size;
        if c.zone_count_max != 0 {
            fit = fit.min(u64::from(c.zone_count_max));
        }
        let fit = fit.min(u64::from(u32::MAX));
        let slot_bytes = table_slot_bytes(fit);
        let data_offset = data_offset_for(slot_bytes, c.zone_size).ok_or_else(|| {
            DeviceError::InvalidGeometry {
                reason: format!("zone table of {slot_bytes} bytes does not fit"),
            }
        })?;
        let zone_count = (size.saturating_sub(data_offset) / c.zone_size).min(fit);
        if zone_count == 0 {
            return Err(DeviceError::TooSmall {
                size,
                min: data_offset + c.zone_size,
            });
        }
        // Consecutive formats get distinct ids so no table of an older format is
        // ever taken for this one.
        let mut block = vec![0u8; META_BLOCK_BYTES as usize];
        let previous_id = [0u64, META_BLOCK_BYTES]
            .iter()
            .filter_map(|&off| {
                inner.read_at(off, &mut block).ok()?;
                decode_geometry(&block).ok().map(|g| g.format_id)
            })
            .max()
            .unwrap_or(0);
        let meta = MetaGeometry {
            version: META_VERSION_BLOCKS,
            logical_block_size: lbs,
            zone_size: c.zone_size,
            zone_capacity: c.zone_capacity,
            zone_count: zone_count as u32,
            max_open_zones: c.max_open_zones,
            max_active_zones: c.max_active_zones,
            table_slot_bytes: slot_bytes,
            data_offset,
            format_id: previous_id.wrapping_add(1),
        };
        let entries = vec![
            TableEntry {
                state: ZoneState::Empty,
                wp: 0,
            };
            zone_count as usize
        ];
        let blocks = table_blocks(zone_count) as usize;
        let mut emu = ZoneEmu::assemble(inner, meta, &entries, 1, vec![1; blocks])?;
        // Tables first (generations 0 and 1), geometry last: a format torn before the
        // geometry is written leaves either the old format or no format, never a
        // geometry pointing at tables of another format.
        let mut slot = vec![0u8; emu.meta.table_slot_bytes as usize];
        for generation in 0..2u64 {
            emu.encode_whole_slot(generation, &mut slot);
            emu.inner.write_at(emu.slot_offset(generation), &slot)?;
        }
        encode_geometry(&emu.meta, &mut block);
        emu.inner.write_at(0, &block)?;
        emu.inner.write_at(META_BLOCK_BYTES, &block)?;
        emu.inner.discard(data_offset, zone_count * c.zone_size)?;
        emu.inner.flush()?;
        tracing::debug!(
            device = %emu.geo.name,
            zones = zone_count,
            zone_size = c.zone_size,
            "zone emulation formatted"
        );
        Ok(emu)
    }

    /// Opens a formatted device: validates the geometry against the device and
    /// loads the newest valid zone table. Open zones come back Closed (or Empty).
    pub fn open(mut inner: D) -> Result<ZoneEmu<D>, DeviceError> {
        let size = inner.info().size_bytes;
        let lbs = inner.info().logical_block_size;
        if size < TABLE_SLOT0_OFFSET {
            return Err(DeviceError::TooSmall {
                size,
                min: TABLE_SLOT0_OFFSET,
            });
        }
        let mut block = vec![0u8; META_BLOCK_BYTES as usize];
        let mut errors = Vec::new();
        let mut meta = None;
        for off in [0u64, META_BLOCK_BYTES] {
            inner.read_at(off, &mut block)?;
            match decode_geometry(&block) {
                Ok(g) => {
                    meta = Some(g);
                    break;
                }
                Err(e) => errors.push(format!("geometry copy at {off}: {e}")),
            }
        }
        let Some(meta) = meta else {
            return Err(DeviceError::CorruptMetadata {
                reason: errors.join("; "),
            });
        };
        if meta.logical_block_size != lbs {
            return Err(config_error(format!(
                "formatted with logical block size {}, device has {lbs}",
                meta.logical_block_size
            )));
        }
        let end = u64::from(meta.zone_count)
            .checked_mul(meta.zone_size)
            .and_then(|z| z.checked_add(meta.data_offset));
        if end.is_none_or(|e| e > size) {
            return Err(config_error(format!(
                "formatted for {} zones of {} bytes after {} bytes of metadata, device has only {size} bytes",
                meta.zone_count, meta.zone_size, meta.data_offset
            )));
        }
        let slots = read_slots(&mut inner, &meta)?;
        let loaded = if meta.version == META_VERSION_WHOLE {
            newest_whole_table(&meta, &slots, &mut errors)
        } else {
            newest_blocks(&meta, &slots, &mut errors)
        };
        let Some((generation, mut entries, newest_copy)) = loaded else {
            return Err(DeviceError::CorruptMetadata {
                reason: errors.join("; "),
            });
        };
        let persisted = entries.clone();
        if !errors.is_empty() {
            tracing::warn!(problems = %errors.join("; "), "zone emulation: using the older valid metadata copy");
        }
        for e in &mut entries {
            if is_open(e.state) {
                e.state = if e.wp == 0 {
                    ZoneState::Empty
                } else {
                    ZoneState::Closed
                };
            }
        }
        let mut emu = ZoneEmu::assemble(inner, meta, &entries, generation, newest_copy)?;
        if emu.meta.version == META_VERSION_BLOCKS {
            // Zones that came back Closed or Empty from open differ from the media.
            for (i, (now, was)) in entries.iter().zip(&persisted).enumerate() {
                if now != was {
                    emu.touch(i as u32);
                }
            }
            emu.persisted = persisted;
        }
        if emu.meta.max_active_zones != 0 && emu.active_count > emu.meta.max_active_zones {
            return Err(DeviceError::CorruptMetadata {
                reason: format!(
                    "{} active zones exceed the limit of {}",
                    emu.active_count, emu.meta.max_active_zones
                ),
            });
        }
        Ok(emu)
    }

    /// The bytes of `inner` the zone emulation formatted there spans (metadata and
    /// zones), read from a valid geometry copy without opening it; `None` when
    /// neither copy decodes. Devices cut into several emulations (the shards of a
    /// pool) find where the next one starts from the first.
    pub fn recorded_extent(inner: &mut D) -> Result<Option<u64>, DeviceError> {
        Ok(Self::recorded_geometry(inner)?.and_then(|g| {
            let zones = g.zone_size.checked_mul(u64::from(g.zone_count));
            zones.and_then(|z| g.data_offset.checked_add(z))
        }))
    }

    /// Where zone 0 starts on `inner`, as the zone emulation formatted there recorded
    /// it (read from a valid geometry copy without opening it); `None` when neither
    /// copy decodes.
    pub fn recorded_data_offset(inner: &mut D) -> Result<Option<u64>, DeviceError> {
        Ok(Self::recorded_geometry(inner)?.map(|g| g.data_offset))
    }

    /// The first geometry copy at the start of `inner` that decodes.
    fn recorded_geometry(inner: &mut D) -> Result<Option<MetaGeometry>, DeviceError> {
        let mut block = vec![0u8; META_BLOCK_BYTES as usize];
        for i in 0..2 {
            if inner.info().size_bytes < (i + 1) * META_BLOCK_BYTES {
                break;
            }
            inner.read_at(i * META_BLOCK_BYTES, &mut block)?;
            if let Ok(g) = decode_geometry(&block) {
                return Ok(Some(g));
            }
        }
        Ok(None)
    }

    /// Checks the zone emulation metadata at the start of `inner` without opening
    /// it or writing anything: both geometry copies, both zone table slots and their
    /// unused bytes. Returns every problem found; the device opens unless one of them
    /// is fatal (a damaged copy is survivable while the other one is valid).
    pub fn verify_metadata(inner: &mut D) -> Result<Vec<MetaProblem>, DeviceError> {
        let mut problems = Vec::new();
        let size = inner.info().size_bytes;
        if size < TABLE_SLOT0_OFFSET {
            problems.push(MetaProblem::fatal(format!(
                "device of {size} bytes is too small for zone emulation metadata"
            )));
            return Ok(problems);
        }
        let mut copies = [
            vec![0u8; META_BLOCK_BYTES as usize],
            vec![0u8; META_BLOCK_BYTES as usize],
        ];
        let mut meta = None;
        for (i, block) in copies.iter_mut().enumerate() {
            inner.read_at(i as u64 * META_BLOCK_BYTES, block)?;
            match decode_geometry(block) {
                Ok(g) => meta = meta.or(Some(g)),
                Err(e) => problems.push(MetaProblem::survivable(format!("geometry copy {i}: {e}"))),
            }
        }
        let Some(meta) = meta else {
            problems.push(MetaProblem::fatal("no valid geometry copy".into()));
            return Ok(problems);
        };
        if problems.is_empty() && copies[0] != copies[1] {
            problems.push(MetaProblem::fatal(
                "the two valid geometry copies differ".into(),
            ));
        }
        let slot_bytes = usize::try_from(meta.table_slot_bytes).unwrap_or(usize::MAX);
        if TABLE_SLOT0_OFFSET
            .checked_add(2 * meta.table_slot_bytes)
            .is_none_or(|end| end > size)
        {
            problems.push(MetaProblem::fatal(format!(
                "zone table slots of {slot_bytes} bytes do not fit in the device"
            )));
            return Ok(problems);
        }
        let slots = read_slots(inner, &meta)?;
        if meta.version == META_VERSION_WHOLE {
            let mut valid = 0;
            for (i, slot) in slots.iter().enumerate() {
                match decode_table(&meta, slot) {
                    Ok(_) => valid += 1,
                    Err(e) => {
                        problems.push(MetaProblem::survivable(format!("zone table slot {i}: {e}")))
                    }
                }
            }
            if valid == 0 {
                problems.push(MetaProblem::fatal("no valid zone table slot".into()));
            }
            return Ok(problems);
        }
        for b in 0..table_blocks(u64::from(meta.zone_count)) {
            let mut valid = 0;
            for (i, slot) in slots.iter().enumerate() {
                match decode_table_block(&meta, b, table_block(slot, b)) {
                    Ok(_) => valid += 1,
                    Err(e) => problems.push(MetaProblem::survivable(format!(
                        "zone table block {b}, copy {i}: {e}"
                    ))),
                }
            }
            if valid == 0 {
                problems.push(MetaProblem::fatal(format!(
                    "zone table block {b}: no valid copy"
                )));
            }
        }
        Ok(problems)
    }

    fn assemble(
        inner: D,
        meta: MetaGeometry,
        entries: &[TableEntry],
        generation: u64,
        newest_copy: Vec<u8>,
    ) -> Result<ZoneEmu<D>, DeviceError> {
        let geo = ZoneGeometry {
            name: format!("zone-emu({})", inner.info().name),
            logical_block_size: meta.logical_block_size,
            zone_size: meta.zone_size,
            zone_capacity: meta.zone_capacity,
            zone_count: meta.zone_count,
            max_open_zones: meta.max_open_zones,
            max_active_zones: meta.max_active_zones,
            max_io_bytes: inner.info().max_io_bytes,
            write_unit: meta.logical_block_size,
        };
        let zones: Vec<Zone> = entries
            .iter()
            .map(|e| Zone {
                state: e.state,
                wp: e.wp,
                inflight: VecDeque::new(),
                discarding: false,
                held: Vec::new(),
            })
            .collect();
        let open_count = zones.iter().filter(|z| is_open(z.state)).count() as u32;
        let active_count = zones.iter().filter(|z| is_active(z.state)).count() as u32;
        let (slot_buf, persisted) = if meta.version == META_VERSION_WHOLE {
            (vec![0u8; meta.table_slot_bytes as usize], Vec::new())
        } else {
            (vec![0u8; META_BLOCK_BYTES as usize], entries.to_vec())
        };
        let must_write = vec![false; newest_copy.len()];
        let touched_flag = vec![false; newest_copy.len()];
        Ok(ZoneEmu {
            inner,
            geo,
            meta,
            zones,
            open_count,
            active_count,
            generation,
            persisted,
            newest_copy,
            must_write,
            touched: Vec::new(),
            touched_flag,
            discards_in_flight: 0,
            slots: Tags::new(),
            order: VecDeque::new(),
            next_seq: 0,
            flushes: VecDeque::new(),
            done: VecDeque::new(),
            user_in_flight: 0,
            inner_out: Vec::new(),
            slot_buf,
            discard_error: None,
            discard_on_reset: true,
        })
    }

    /// Whether a zone reset discards the zone's range on the inner device (on by
    /// default). A drive needs the discard: it is what lets a conventional SSD erase
    /// the zone's blocks instead of copying them in its own GC. Over a file, all the
    /// discard does is return the space (a hole punch), and refilling the hole costs
    /// the kernel a page allocation per 4 KiB written; turned off, a reset only moves
    /// the write pointer. Either way the old bytes are never read again: reads stop
    /// at the write pointer, which the reset persisted before returning.
    pub fn set_discard_on_reset(&mut self, on: bool) {
        self.discard_on_reset = on;
    }

    /// The wrapped device.
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// The wrapped device, to change its bytes behind the emulation's back (tests
    /// that play silent corruption). Zone state is not touched.
    pub fn inner_mut(&mut self) -> &mut D {
        &mut self.inner
    }

    /// Gives back the wrapped device. User requests still in flight are forgotten
    /// (their completions are never delivered) and nothing is persisted: call `flush`
    /// first for a clean hand-over. Discards of reset zones are waited for, so the
    /// device carries none of this emulator's own completions (a failed one is
    /// dropped: its zone is Empty and its old bytes are never read).
    pub fn into_inner(mut self) -> D {
        let _ = self.wait_discards(None);
        self.inner
    }

    /// Where zone 0 starts on the inner device.
    pub fn data_offset(&self) -> u64 {
        self.meta.data_offset
    }

    /// Generation of the zone table last persisted.
    pub fn table_generation(&self) -> u64 {
        self.generation
    }

    /// Fault injection: marks a zone ReadOnly or Offline (persisted). Offline is
    /// final; a ReadOnly zone can still go Offline.
    pub fn set_zone_state(&mut self, zone: u32, fault: ZoneFault) -> Result<(), ZoneError> {
        let z = self.zone(zone)?;
        let old = (z.state, z.wp);
        let new = match fault {
            ZoneFault::ReadOnly => ZoneState::ReadOnly,
            ZoneFault::Offline => ZoneState::Offline,
        };
        if old.0 == ZoneState::Offline && new != ZoneState::Offline {
            return Err(ZoneError::Offline { zone });
        }
        self.set_state(zone, new);
        if let Err(e) = self.persist() {
            self.restore(zone, old);
            return Err(e.into());
        }
        Ok(())
    }

    fn zone(&self, zone: u32) -> Result<&Zone, ZoneError> {
        self.zones.get(zone as usize).ok_or(ZoneError::NoSuchZone {
            zone,
            count: self.meta.zone_count,
        })
    }

    /// Moves `zone` to `state`, keeping the open/active counts exact and the write
    /// pointer consistent with the state.
    fn set_state(&mut self, zone: u32, state: ZoneState) {
        self.touch(zone);
        let cap = self.meta.zone_capacity;
        let z = &mut self.zones[zone as usize];
        let old = z.state;
        z.state = state;
        match state {
            ZoneState::Empty => z.wp = 0,
            ZoneState::Full => z.wp = cap,
            _ => {}
        }
        let mut c = self.counts();
        c.moved(old, state);
        self.open_count = c.open;
        self.active_count = c.active;
    }

    /// Notes that `zone`'s persisted entry may have changed.
    fn touch(&mut self, zone: u32) {
        let b = zone as usize / ENTRIES_PER_BLOCK;
        if let Some(flag) = self.touched_flag.get_mut(b) {
            if !*flag {
                *flag = true;
                self.touched.push(b as u64);
            }
        }
    }

    fn restore(&mut self, zone: u32, old: (ZoneState, u64)) {
        self.set_state(zone, old.0);
        self.zones[zone as usize].wp = old.1;
    }

    fn rules(&self) -> Rules {
        Rules {
            zone_size: self.meta.zone_size,
            zone_capacity: self.meta.zone_capacity,
            zone_count: self.meta.zone_count,
            logical_block_size: u64::from(self.meta.logical_block_size),
            max_open: self.meta.max_open_zones,
            max_active: self.meta.max_active_zones,
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            open: self.open_count,
            active: self.active_count,
        }
    }

    fn check_range(&self, op: IoOpKind, offset: u64, len: u64) -> Result<u32, ZoneError> {
        self.rules().range(op, offset, len)
    }

    fn check_read(&self, offset: u64, len: u64) -> Result<(), ZoneError> {
        let zone = self.check_range(IoOpKind::Read, offset, len)?;
        let z = &self.zones[zone as usize];
        self.rules().read(zone, z.state, z.wp, offset, len)
    }

    /// See [`Rules::plan_write`].
    fn plan_write(&self, zone: u32, offset: Option<u64>, len: u64) -> Result<u64, ZoneError> {
        let z = self.zone(zone)?;
        self.rules()
            .plan_write(zone, z.state, z.wp, offset, len, self.counts())
    }

    /// Applies a write accepted by `plan_write`: the zone opens implicitly (from
    /// Empty or Closed), the write pointer advances, and the zone fills at capacity.
    fn apply_write(&mut self, zone: u32, len: u64) {
        let z = &self.zones[zone as usize];
        let (state, wp) = self.rules().after_write(z.state, z.wp, len);
        self.touch(zone);
        self.zones[zone as usize].wp = wp;
        if state != self.zones[zone as usize].state {
            self.set_state(zone, state);
        }
    }

    fn write_checks(
        &self,
        op: IoOpKind,
        offset: Option<u64>,
        zone: Option<u32>,
        len: u64,
        async_io: bool,
    ) -> Result<u32, ZoneError> {
        let zone = match (offset, zone) {
            (Some(off), _) => self.check_range(op, off, len)?,
            (None, Some(z)) => {
                self.zone(z)?;
                let start = self.geo.zone_start(z);
                if len == 0 {
                    return Err(DeviceError::ZeroLength { op, offset: start }.into());
                }
                let align = u64::from(self.meta.logical_block_size);
                if !len.is_multiple_of(align) {
                    return Err(DeviceError::Misaligned {
                        op,
                        offset: start,
                        len,
                        align,
                    }
                    .into());
                }
                z
            }
            (None, None) => unreachable!("a write names an offset or a zone"),
        };
        if async_io {
            self.geo
                .check_io_size(op, offset.unwrap_or(self.geo.zone_start(zone)), len)?;
        }
        Ok(zone)
    }

    fn table_entries(&self) -> impl ExactSizeIterator<Item = TableEntry> + '_ {
        self.zones.iter().map(|z| self.entry_of(z))
    }

    /// What the table says of `z`: only what has completed.
    fn entry_of(&self, z: &Zone) -> TableEntry {
        let cap = self.meta.zone_capacity;
        {
            // Persist only what has completed; an open or closed zone whose writes
            // are all still in flight is Empty as far as the media knows.
            let safe = z.safe_wp();
            let state = match z.state {
                s if is_active(s) && safe == 0 => ZoneState::Empty,
                ZoneState::Full => ZoneState::Full,
                s => s,
            };
            let wp = match state {
                ZoneState::Empty => 0,
                ZoneState::Full => cap,
                _ => safe,
            };
            TableEntry { state, wp }
        }
    }

    /// The entries of block `b`'s zones.
    fn block_entries(&self, b: u64) -> Vec<TableEntry> {
        self.zones[block_zones(self.meta.zone_count, b)]
            .iter()
            .map(|z| self.entry_of(z))
            .collect()
    }

    fn slot_offset(&self, generation: u64) -> u64 {
        TABLE_SLOT0_OFFSET + (generation % 2) * self.meta.table_slot_bytes
    }

    /// The whole table at `generation` into `slot` (a table slot's bytes): one
    /// table (version 1) or every block (version 2).
    fn encode_whole_slot(&self, generation: u64, slot: &mut [u8]) {
        let fmt = self.meta.format_id;
        if self.meta.version == META_VERSION_WHOLE {
            encode_table(fmt, generation, self.table_entries(), slot);
            return;
        }
        let entries: Vec<TableEntry> = self.table_entries().collect();
        slot.fill(0);
        let bs = META_BLOCK_BYTES as usize;
        for b in 0..table_blocks(u64::from(self.meta.zone_count)) {
            let at = b as usize * bs;
            let zones = block_zones(self.meta.zone_count, b);
            encode_table_block(fmt, generation, b, &entries[zones], &mut slot[at..at + bs]);
        }
    }

    /// Makes completed data durable, then writes the next table generation (what
    /// changed of it) and makes it durable.
    fn persist(&mut self) -> Result<(), DeviceError> {
        if self.meta.version == META_VERSION_BLOCKS {
            return self.persist_blocks();
        }
        self.inner.flush()?;
        let generation = self.generation + 1;
        let mut buf = std::mem::take(&mut self.slot_buf);
        encode_table(
            self.meta.format_id,
            generation,
            self.table_entries(),
            &mut buf,
        );
        self.slot_buf = buf;
        self.inner
            .write_at(self.slot_offset(generation), &self.slot_buf)?;
        self.inner.flush()?;
        self.generation = generation;
        Ok(())
    }

    /// Version 2: writes each table block whose zones changed since its newest
    /// version on media to its other copy. Nothing changed: one flush.
    fn persist_blocks(&mut self) -> Result<(), DeviceError> {
        self.inner.flush()?;
        let count = self.meta.zone_count;
        let mut dirty: Vec<(u64, Vec<TableEntry>)> = Vec::new();
        for b in std::mem::take(&mut self.touched) {
            self.touched_flag[b as usize] = false;
            let entries = self.block_entries(b);
            if self.must_write[b as usize] || entries[..] != self.persisted[block_zones(count, b)] {
                dirty.push((b, entries));
            }
        }
        if dirty.is_empty() {
            #[cfg(test)]
            assert!(
                self.table_entries().eq(self.persisted.iter().copied()),
                "a changed zone was not persisted"
            );
            return Ok(());
        }
        for (b, _) in &dirty {
            // Until this persist is done: a failure leaves the block unknown.
            self.must_write[*b as usize] = true;
            if !self.touched_flag[*b as usize] {
                self.touched_flag[*b as usize] = true;
                self.touched.push(*b);
            }
        }
        // Under an active-zone limit, blocks whose active count falls go first and
        // are made durable before those whose count rises: whichever writes a crash
        // keeps, the table read at open stays within the limit.
        let rises = |(b, e): &(u64, Vec<TableEntry>)| {
            active_in(e) > active_in(&self.persisted[block_zones(count, *b)])
        };
        let (then, first): (Vec<_>, Vec<_>) = if self.meta.max_active_zones == 0 {
            (Vec::new(), dirty)
        } else {
            dirty.into_iter().partition(rises)
        };
        let generation = self.generation + 1;
        self.write_blocks(&first, generation)?;
        if !first.is_empty() && !then.is_empty() {
            self.inner.flush()?;
        }
        self.write_blocks(&then, generation)?;
        self.inner.flush()?;
        for (b, entries) in first.into_iter().chain(then) {
            self.persisted[block_zones(count, b)].copy_from_slice(&entries);
            self.newest_copy[b as usize] ^= 1;
            self.must_write[b as usize] = false;
        }
        self.generation = generation;
        // Tests check what the touched list saves scanning: nothing was missed.
        #[cfg(test)]
        assert!(
            self.table_entries().eq(self.persisted.iter().copied()),
            "a changed zone was not persisted"
        );
        Ok(())
    }

    /// Writes `blocks` (index, entries) at `generation`, each to the copy not
    /// holding its newest version.
    fn write_blocks(
        &mut self,
        blocks: &[(u64, Vec<TableEntry>)],
        generation: u64,
    ) -> Result<(), DeviceError> {
        let mut buf = std::mem::take(&mut self.slot_buf);
        let mut r = Ok(());
        for (b, entries) in blocks {
            let b = *b;
            encode_table_block(self.meta.format_id, generation, b, entries, &mut buf);
            let copy = u64::from(self.newest_copy[b as usize] ^ 1);
            let off = TABLE_SLOT0_OFFSET + copy * self.meta.table_slot_bytes + b * META_BLOCK_BYTES;
            r = self.inner.write_at(off, &buf);
            if r.is_err() {
                break;
            }
        }
        self.slot_buf = buf;
        r
    }

    fn submit_inner(&mut self, user_tag: u64, kind: InnerKind, landed_at: Option<u64>, op: IoOp) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.order.push_back((seq, false));
        let mut hold_for = None;
        match kind {
            InnerKind::Write { zone, rel } => {
                let z = &mut self.zones[zone as usize];
                z.inflight.push_back((rel, false));
                if z.discarding {
                    hold_for = Some(zone);
                }
            }
            InnerKind::Discard { zone } => {
                self.zones[zone as usize].discarding = true;
                self.discards_in_flight += 1;
            }
            InnerKind::Read => {}
        }
        let tag = self.slots.insert(InnerSlot {
            user_tag,
            seq,
            kind,
            landed_at,
        });
        match hold_for {
            Some(zone) => self.zones[zone as usize].held.push(IoRequest { tag, op }),
            None => self.inner.submit(IoRequest { tag, op }),
        }
    }

    fn on_inner_completion(&mut self, c: IoCompletion) {
        let Some(slot) = self.slots.take(c.tag) else {
            // Only this wrapper submits to the inner device asynchronously, so an
            // unknown tag is a bug in the inner device.
            panic!(
                "zone emulation: inner device completed unknown tag {}",
                c.tag
            );
        };
        mark_done(&mut self.order, slot.seq);
        match slot.kind {
            InnerKind::Write { zone, rel } => {
                mark_done(&mut self.zones[zone as usize].inflight, rel);
                // The zone's safe write pointer may have moved.
                self.touch(zone);
            }
            InnerKind::Discard { zone } => {
                let z = &mut self.zones[zone as usize];
                z.discarding = false;
                self.discards_in_flight -= 1;
                // Still in submission (= offset) order.
                for req in std::mem::take(&mut z.held) {
                    self.inner.submit(req);
                }
                if let Err(e) = c.result {
                    self.discard_error.get_or_insert(e);
                }
                return;
            }
            InnerKind::Read => {}
        }
        let result = match c.result {
            Ok(()) => Ok(slot.landed_at),
            Err(e) => Err(ZoneError::Device(e)),
        };
        self.done.push_back(ZoneCompletion {
            tag: slot.user_tag,
            buf: c.buf,
            result,
        });
    }

    /// Reaps whatever the inner device has finished, waiting for at least one if
    /// `wait` and anything is in flight.
    fn reap(&mut self, wait: bool) -> Result<(), DeviceError> {
        let min = usize::from(wait && self.inner.in_flight() > 0);
        let mut out = std::mem::take(&mut self.inner_out);
        let r = self.inner.poll(&mut out, min);
        for c in out.drain(..) {
            self.on_inner_completion(c);
        }
        self.inner_out = out;
        r.map(|_| ())
    }

    /// A discard of `zone` (or of any zone, for `None`) is in flight.
    fn discard_pending(&self, zone: Option<u32>) -> bool {
        match zone {
            Some(z) => self.zones[z as usize].discarding,
            None => self.discards_in_flight > 0,
        }
    }

    /// Waits until no discard of `zone` (or of any zone, for `None`) is in flight.
    fn wait_discards(&mut self, zone: Option<u32>) -> Result<(), DeviceError> {
        while self.discard_pending(zone) {
            // With nothing in flight below (a device that lost power reports nothing
            // and fails the poll), one last look, then an error rather than a spin.
            let waiting = self.inner.in_flight() > 0;
            self.reap(waiting)?;
            if !waiting && self.discard_pending(zone) {
                return Err(DeviceError::Io {
                    op: IoOpKind::Discard,
                    offset: 0,
                    source: std::io::Error::other("the inner device dropped a discard"),
                });
            }
        }
        Ok(())
    }

    /// The error of a failed asynchronous discard, once.
    fn take_discard_error(&mut self) -> Result<(), DeviceError> {
        self.discard_error.take().map_or(Ok(()), Err)
    }

    /// Completes user flushes whose barrier has drained: every inner request
    /// submitted before the flush has completed, so a persist now covers them.
    fn complete_ready_flushes(&mut self) {
        while let Some(&(tag, barrier)) = self.flushes.front() {
            if self.order.front().is_some_and(|&(seq, _)| seq < barrier) {
                break;
            }
            self.flushes.pop_front();
            let result = self
                .take_discard_error()
                .and_then(|()| self.persist())
                .map(|()| None)
                .map_err(ZoneError::Device);
            self.done.push_back(ZoneCompletion {
                tag,
                buf: None,
                result,
            });
        }
    }

    fn fail(&mut self, tag: u64, buf: Option<IoBuf>, e: ZoneError) {
        self.done.push_back(ZoneCompletion {
            tag,
            buf,
            result: Err(e),
        });
    }
}

fn active_in(entries: &[TableEntry]) -> usize {
    entries.iter().filter(|e| is_active(e.state)).count()
}

/// Both table slots, as read.
fn read_slots<D: BlockDevice>(
    inner: &mut D,
    meta: &MetaGeometry,
) -> Result<[Vec<u8>; 2], DeviceError> {
    let mut slots = [
        vec![0u8; meta.table_slot_bytes as usize],
        vec![0u8; meta.table_slot_bytes as usize],
    ];
    for (i, slot) in slots.iter_mut().enumerate() {
        inner.read_at(TABLE_SLOT0_OFFSET + i as u64 * meta.table_slot_bytes, slot)?;
    }
    Ok(slots)
}

/// Block `b`'s bytes in a version-2 slot.
fn table_block(slot: &[u8], b: u64) -> &[u8] {
    let bs = META_BLOCK_BYTES as usize;
    &slot[b as usize * bs..(b as usize + 1) * bs]
}

/// What a table and its copies hold: the highest generation, every zone's entry
/// and (version 2) the copy of each block holding its newest version.
type Loaded = (u64, Vec<TableEntry>, Vec<u8>);

/// Version 1: the valid slot with the higher generation.
fn newest_whole_table(
    meta: &MetaGeometry,
    slots: &[Vec<u8>; 2],
    errors: &mut Vec<String>,
) -> Option<Loaded> {
    let mut best: Option<(u64, Vec<TableEntry>)> = None;
    for (i, slot) in slots.iter().enumerate() {
        match decode_table(meta, slot) {
            Ok((generation, entries)) => {
                if best.as_ref().is_none_or(|(g, _)| generation > *g) {
                    best = Some((generation, entries));
                }
            }
            Err(e) => errors.push(format!("table slot {i}: {e}")),
        }
    }
    best.map(|(g, e)| (g, e, Vec::new()))
}

/// Version 2: block by block, the valid copy with the higher generation; `None`
/// if some block has no valid copy (the errors say which).
fn newest_blocks(
    meta: &MetaGeometry,
    slots: &[Vec<u8>; 2],
    errors: &mut Vec<String>,
) -> Option<Loaded> {
    let blocks = table_blocks(u64::from(meta.zone_count));
    let mut entries = Vec::with_capacity(meta.zone_count as usize);
    let mut newest_copy = Vec::with_capacity(blocks as usize);
    let mut generation = 0;
    let mut complete = true;
    for b in 0..blocks {
        let mut best: Option<(u64, Vec<TableEntry>, u8)> = None;
        for (i, slot) in slots.iter().enumerate() {
            match decode_table_block(meta, b, table_block(slot, b)) {
                Ok((g, e)) => {
                    if best.as_ref().is_none_or(|(bg, _, _)| g > *bg) {
                        best = Some((g, e, i as u8));
                    }
                }
                Err(e) => errors.push(format!("table block {b}, copy {i}: {e}")),
            }
        }
        match best {
            Some((g, e, copy)) => {
                generation = generation.max(g);
                entries.extend(e);
                newest_copy.push(copy);
            }
            None => complete = false,
        }
    }
    complete.then_some((generation, entries, newest_copy))
}

impl<D: BlockDevice> ZonedDevice for ZoneEmu<D> {
    fn geometry(&self) -> &ZoneGeometry {
        &self.geo
    }

    fn zone_info(&self, zone: u32) -> Result<ZoneInfo, ZoneError> {
        let z = self.zone(zone)?;
        let start = self.geo.zone_start(zone);
        Ok(ZoneInfo {
            index: zone,
            start,
            capacity: self.meta.zone_capacity,
            write_pointer: start + z.wp,
            state: z.state,
        })
    }

    fn submit(&mut self, req: ZoneRequest) {
        self.user_in_flight += 1;
        let tag = req.tag;
        let data_offset = self.meta.data_offset;
        match req.op {
            ZoneOp::Read { offset, buf } => {
                let len = buf.len() as u64;
                if let Err(e) = self
                    .check_read(offset, len)
                    .and_then(|()| self.geo.check_io_size(IoOpKind::Read, offset, len))
                {
                    return self.fail(tag, Some(buf), e);
                }
                self.submit_inner(
                    tag,
                    InnerKind::Read,
                    None,
                    IoOp::Read {
                        offset: data_offset + offset,
                        buf,
                    },
                );
            }
            ZoneOp::Write { offset, buf, fua } => {
                let len = buf.len() as u64;
                let landed = self
                    .write_checks(IoOpKind::Write, Some(offset), None, len, true)
                    .and_then(|zone| self.plan_write(zone, Some(offset), len).map(|a| (zone, a)));
                match landed {
                    Err(e) => self.fail(tag, Some(buf), e),
                    Ok((zone, at)) => {
                        self.apply_write(zone, len);
                        self.submit_inner(
                            tag,
                            InnerKind::Write {
                                zone,
                                rel: at - self.geo.zone_start(zone),
                            },
                            Some(at),
                            IoOp::Write {
                                offset: data_offset + at,
                                buf,
                                fua,
                            },
                        )
                    }
                }
            }
            ZoneOp::Append { zone, buf, fua } => {
                let len = buf.len() as u64;
                let landed = self
                    .write_checks(IoOpKind::Append, None, Some(zone), len, true)
                    .and_then(|zone| self.plan_write(zone, None, len));
                match landed {
                    Err(e) => self.fail(tag, Some(buf), e),
                    Ok(at) => {
                        self.apply_write(zone, len);
                        self.submit_inner(
                            tag,
                            InnerKind::Write {
                                zone,
                                rel: at - self.geo.zone_start(zone),
                            },
                            Some(at),
                            IoOp::Write {
                                offset: data_offset + at,
                                buf,
                                fua,
                            },
                        )
                    }
                }
            }
            ZoneOp::Flush => {
                self.flushes.push_back((tag, self.next_seq));
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
            self.complete_ready_flushes();
            added += self.done.len();
            self.user_in_flight -= self.done.len();
            out.extend(self.done.drain(..));
            if added >= target || self.inner.in_flight() == 0 {
                // With nothing in flight below, every flush has been completed above,
                // so nothing more can arrive by waiting.
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
        self.inner.read_at(self.meta.data_offset + offset, buf)?;
        Ok(())
    }

    fn write_at(&mut self, offset: u64, buf: &[u8]) -> Result<u64, ZoneError> {
        let len = buf.len() as u64;
        let zone = self.write_checks(IoOpKind::Write, Some(offset), None, len, false)?;
        let at = self.plan_write(zone, Some(offset), len)?;
        self.wait_discards(Some(zone))?;
        self.inner.write_at(self.meta.data_offset + at, buf)?;
        self.apply_write(zone, len);
        Ok(at)
    }

    fn append(&mut self, zone: u32, buf: &[u8]) -> Result<u64, ZoneError> {
        let len = buf.len() as u64;
        self.write_checks(IoOpKind::Append, None, Some(zone), len, false)?;
        let at = self.plan_write(zone, None, len)?;
        self.wait_discards(Some(zone))?;
        self.inner.write_at(self.meta.data_offset + at, buf)?;
        self.apply_write(zone, len);
        Ok(at)
    }

    fn manage(&mut self, zone: u32, action: ZoneAction) -> Result<(), ZoneError> {
        self.take_discard_error()?;
        let z = self.zone(zone)?;
        let state = z.state;
        let old = (state, z.wp);
        let next = self
            .rules()
            .transition(zone, state, old.1, action, self.counts())?;
        if action == ZoneAction::Reset {
            // No stale write may land after the reset; wait for this zone's writes
            // (their completions are kept for `poll`) and an earlier reset's discard.
            self.wait_discards(Some(zone))?;
            while !self.zones[zone as usize].inflight.is_empty() {
                assert!(
                    self.inner.in_flight() > 0,
                    "zone {zone} tracks writes the inner device does not have"
                );
                self.reap(true)?;
            }
        }
        self.set_state(zone, next);
        if let Err(e) = self.persist() {
            self.restore(zone, old);
            return Err(e.into());
        }
        if action == ZoneAction::Reset && self.discard_on_reset {
            // Persisted first (above): a crash before the discard leaves an Empty
            // zone whose old bytes are never read.
            let offset = self.meta.data_offset + self.geo.zone_start(zone);
            let len = self.meta.zone_size;
            self.submit_inner(
                u64::MAX,
                InnerKind::Discard { zone },
                None,
                IoOp::Discard { offset, len },
            );
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ZoneError> {
        self.wait_discards(None)?;
        self.take_discard_error()?;
        self.persist()?;
        Ok(())
    }
}

#[cfg(test)]
#[path = "zone_emu_tests.rs"]
mod tests;
