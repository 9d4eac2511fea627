//! The mover: reads live blocks of a victim region (one group per step), stages them
//! per stream in DRAM, and appends full 126-block groups to the stream's zone in one
//! sequential write (data, md A, md B). Compaction (chunk victims, compaction zones)
//! and GC (zone victims, GC zones) are two instances with different roles; what each
//! picks as its victim is its policy (`compaction/policy.rs`, `gc/policy.rs`).
//!
//! The mover owns its victim, staged blocks, reads and zone writes; everything shared
//! (devices, regions, L2P, journal, buffers, the I/O table) comes in as the `Core`.
//!
//! Invariants:
//! - a staged or in-flight block counts in its source region's `relocations`, so the
//!   source cannot be freed (or reused) before the block settles;
//! - on a group write's completion an L2P entry is switched only if it still points at
//!   the source PBA (a newer user write, trim or delete wins; the copy is born invalid);
//!   the source's validity bit answers that, and the switch waits for the page's next
//!   fault when the page is not cached (l2p/deferred.rs);
//! - relocated blocks keep their SID and their original data CRC (a corrupt source
//!   block stays detectably corrupt);
//! - GC takes a victim only while the free zones can take all it would then hold
//!   (`zones_to_finish`; the victim's blocks go only to the streams counted for them),
//!   and compaction never takes a zone while free zones <= the GC reserve (what GC's
//!   staged blocks need, plus a zone per stream the rest of its victim may go to), so
//!   GC can always write out what it holds and free its victims.
//! - the blocks of a mapping unit (a volume mapped in units, `Volumes::shift`) are
//!   staged together, in order, once all have been read (`units_partial`), so they
//!   take consecutive data slots of one zone: a group write may end inside a unit
//!   only where the zone goes on (never in its last group); the unit switches as one
//!   once every block is written (`units_moving`), if its first block's source is
//!   still valid (a unit's blocks are valid or not together).

use shale_device::{
    BlockDevice, IoBuf, IoOp, IoRequest, ZoneAction, ZoneOp, ZoneRequest, ZonedDevice,
};
use std::collections::HashMap;

use shale_format::{
    decode_md_entry, decode_md_header, encode_md, EntryKind, JournalRecord, Lba, MdEntry, MdHeader,
    MdRegionKind, Pba, RegionId, RegionRole, RegionState, VolumeId, BLOCK_SIZE, GROUP_DATA_SLOTS,
};

use crate::compaction::policy::{RegionSnapshot, VictimPolicy};
mod stream;

use crate::core::Core;
use crate::engine::InflightIo;
use crate::layout::{Groups, BS};
use crate::{Clock, EngineError};
pub(crate) use stream::{RelocEntry, Stream, RELOCATED_POS};

#[derive(Debug)]
pub(crate) struct Mover {
    role: RegionRole,
    pub policy: Box<dyn VictimPolicy>,
    pub victim: Option<RegionId>,
    pub cursor: u32,
    pub streams: Vec<Stream>,
    snapshot: Vec<RegionSnapshot>,
    /// Victim group reads in flight (a slab; the index travels in the I/O tag).
    reads: Vec<Option<GroupRead>>,
    /// Zone group writes in flight (a slab; the index travels in the I/O tag).
    pub zone_writes: Vec<Option<ZoneWrite>>,
    /// Set when this mover wanted a zone but the GC reserve forbade it.
    pub zone_blocked: bool,
    /// The streams the victim's blocks are staged into.
    victim_dests: Dests,
    /// Blocks of mapping units read before the rest of their unit (a unit may span
    /// two victim groups, whose reads complete in any order), by (volume, unit).
    units_partial: HashMap<(VolumeId, u64), PartialUnit>,
    /// Units with blocks written or dropped but not all of them, by (volume, unit,
    /// first block's source).
    units_moving: HashMap<(VolumeId, u64, Pba), UnitMove>,
    /// The map pages `whole_unit_at` last peeked: a victim group's blocks mostly
    /// share them (forgotten at each group: the maps change between groups).
    peek: crate::read::peek::MapPeek,
    /// GC over a pool with a cold tier: its next victim is a cold zone (else a fast
    /// one). The engine sets it between victims, by which tier is short.
    pub cold: bool,
}

/// A mapping unit being staged: the stream it goes to and the blocks read so far.
#[derive(Debug)]
struct PartialUnit {
    stream: usize,
    blocks: Vec<Option<(RelocEntry, Box<[u8; BLOCK_SIZE]>)>>,
    have: u64,
}

/// A mapping unit whose blocks are being written: how many settled (written or
/// dropped), and where its first block landed.
#[derive(Debug)]
struct UnitMove {
    settled: u64,
    new_base: Option<Pba>,
    /// Every written block is where the first one's unit needs it.
    contiguous: bool,
    /// A dual volume's unit: each settled block's index, source and new place (it
    /// may switch block by block, to the sparse map, when it cannot switch whole).
    blocks: Vec<(u64, Pba, Option<Pba>)>,
}

/// One victim group being read: its pieces (first slot, buffer once arrived).
#[derive(Debug)]
pub(crate) struct GroupRead {
    victim: RegionId,
    group: u32,
    parts: Vec<(usize, Option<IoBuf>)>,
    left: u32,
    /// Valid blocks when the read was submitted: at most this many get staged.
    valid: u32,
    /// The streams its blocks may be staged into.
    dests: Dests,
}

/// The streams a victim's blocks may be staged into: `first..first + count`. GC takes
/// a victim only once the free zones can take its blocks in these streams; a block
/// whose placement names another stream goes to `first` instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dests {
    first: usize,
    count: usize,
}

impl Dests {
    fn all(streams: u32) -> Dests {
        Dests {
            first: 0,
            count: streams as usize,
        }
    }

    fn one(s: usize) -> Dests {
        Dests { first: s, count: 1 }
    }

    fn contains(self, s: usize) -> bool {
        s >= self.first && s < self.first + self.count
    }

    fn range(self) -> std::ops::Range<usize> {
        self.first..self.first + self.count
    }
}

/// The block at slot `i` of a group read, if it was read.
fn slot_data(parts: &[(usize, Option<IoBuf>)], i: usize) -> Option<&[u8]> {
    parts.iter().find_map(|(lo, b)| {
        let b = b.as_ref()?;
        let n = b.len() / BLOCK_SIZE;
        (i >= *lo && i < lo + n).then(|| &b[(i - lo) * BLOCK_SIZE..(i - lo + 1) * BLOCK_SIZE])
    })
}

/// A zone group write in flight.
#[derive(Debug)]
pub(crate) struct ZoneWrite {
    pub zone: RegionId,
    pub group: u32,
    pub first_slot: u32,
    pub entries: Vec<RelocEntry>,
    pub md: Box<[u8; BLOCK_SIZE]>,
    pub parts_left: u32,
}

impl Mover {
    pub fn new(role: RegionRole, policy: Box<dyn VictimPolicy>, streams: u32) -> Mover {
        Mover {
            role,
            policy,
            victim: None,
            cursor: 0,
            streams: (0..streams).map(|_| Stream::default()).collect(),
            snapshot: Vec::new(),
            reads: Vec::new(),
            zone_writes: Vec::new(),
            zone_blocked: false,
            victim_dests: Dests::all(streams),
            units_partial: HashMap::new(),
            units_moving: HashMap::new(),
            peek: crate::read::peek::MapPeek::default(),
            cold: false,
        }
    }

    /// GC's cold stream (past the placement streams), with a cold tier.
    fn cold_stream(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> Dests {
        Dests::one(core.streams as usize)
    }

    pub fn staged_blocks(&self) -> usize {
        self.streams.iter().map(Stream::len).sum()
    }

    pub fn reads_in_flight(&self) -> usize {
        self.reads.iter().filter(|r| r.is_some()).count()
    }

    fn reads_in_flight_for(&self, victim: RegionId) -> bool {
        self.reads.iter().flatten().any(|r| r.victim == victim)
    }

    /// No victim in progress and no victim read in flight.
    pub fn between_victims(&self) -> bool {
        self.victim.is_none() && self.reads_in_flight() == 0
    }

    pub fn role(&self) -> RegionRole {
        self.role
    }
}

/// The md block of zone group `g` holding `entries` in its first slots and padding
/// in the rest of its `k` data slots.
fn zone_group_md(
    zone: RegionId,
    g: u32,
    sid: shale_format::Sid,
    k: usize,
    entries: &[RelocEntry],
) -> Box<[u8; BLOCK_SIZE]> {
    let mut md_entries = Vec::with_capacity(k);
    md_entries.extend(entries.iter().map(|e| {
        let direct = e.pos != RELOCATED_POS;
        MdEntry {
            kind: if direct {
                EntryKind::Direct
            } else {
                EntryKind::Relocated
            },
            volume: e.volume,
            lba: e.lba,
            sid: e.sid,
            data_crc: e.crc,
            source: if direct { Pba::NONE } else { e.source },
            pos: if direct { e.pos } else { 0 },
        }
    }));
    md_entries.resize(
        k,
        MdEntry {
            kind: EntryKind::Pad,
            ..MdEntry::EMPTY
        },
    );
    let mut md = Box::new([0u8; BLOCK_SIZE]);
    let h = MdHeader {
        region_kind: MdRegionKind::Zone,
        region: zone,
        group: g,
        entry_count: k as u16,
        region_sid: sid,
        generation: 1,
    };
    encode_md(&mut md[..], &h, &md_entries);
    md
}

/// Invalid blocks a sparse victim read reads through rather than split the read.
const READ_GAP_BLOCKS: usize = 8;

fn stale_md(at: u64) -> shale_format::FormatError {
    shale_format::FormatError::InvalidField {
        structure: shale_format::Structure::MdBlock,
        at,
        field: "region_sid",
        reason: "copy from an earlier use of the region".into(),
    }
}

impl Mover {
    /// Free zones this mover needs to write out what it has staged, is reading and has
    /// yet to read of its victim, plus `add` (`n` more blocks that may land in any of
    /// the streams named): each stream's blocks beyond the room left in its open zone,
    /// in whole zones (every group full but the last, which is padded). Blocks that
    /// may go to several streams count in each.
    pub fn zones_to_finish(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        add: Option<(Dests, usize)>,
    ) -> usize {
        self.zones_needed(core, add, true)
    }

    /// `zones_to_finish`, with or without the victim's blocks being read and unread.
    fn zones_needed(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        add: Option<(Dests, usize)>,
        with_victim: bool,
    ) -> usize {
        let groups = Groups {
            blocks: core.geo.zone_cap_blocks,
        };
        // A zone may end with fewer pads than a unit (never a unit split over zones).
        let slack = core.volumes.max_unit_blocks() as usize - 1;
        let per_zone = (groups.data_capacity() as usize)
            .saturating_sub(slack)
            .max(1);
        // Every read in flight is of the victim (a victim is done once its reads are
        // staged), so both count as the victim's blocks.
        let reads = self.reads.iter().flatten().filter(|_| with_victim);
        let unread = self.victim.filter(|_| with_victim).map_or(0, |v| {
            let vg = Groups {
                blocks: core.geo.region_blocks(v),
            };
            let from = vg.start(self.cursor.min(vg.count()));
            let start = core.geo.pba(v, from);
            core.regions.validity.count_range(start, vg.end() - from) as usize
        });
        self.streams
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let room = s.zone.map_or(0, |z| {
                    let (g, _) = groups.locate(core.regions.get(z).wp);
                    ((groups.data_capacity() - groups.data_before(g)) as usize)
                        .saturating_sub(slack)
                });
                let reading: usize = reads
                    .clone()
                    .filter(|r| r.dests.contains(i))
                    .map(|r| r.valid as usize)
                    .sum();
                let more = add.filter(|(d, _)| d.contains(i)).map_or(0, |(_, n)| n);
                let victim = if self.victim_dests.contains(i) {
                    unread
                } else {
                    0
                };
                (s.len() + reading + victim + more)
                    .saturating_sub(room)
                    .div_ceil(per_zone)
            })
            .sum()
    }

    /// Zones compaction leaves to GC: what GC needs to write out what it has staged,
    /// plus one zone for each stream the rest of its victim may go to (a zone's valid
    /// blocks fit in one zone), or one for the next victim. So GC can always finish its
    /// victim and take another (staged into one stream if need be). The reserve
    /// follows what GC holds instead of one zone per stream.
    pub fn gc_reserve(&self, core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> usize {
        // With a cold tier GC writes only cold zones: it needs no fast one.
        if core.geo.tiered() {
            0
        } else {
            self.gc_need(core)
        }
    }

    /// The cold zones GC keeps for itself (`gc_reserve`'s count, in the cold tier):
    /// none without a cold tier.
    pub fn cold_reserve(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> usize {
        if core.geo.tiered() {
            self.gc_need(core)
        } else {
            0
        }
    }

    /// Zones of the tier GC writes that it needs to finish what it holds and take
    /// the next victim.
    fn gc_need(&self, core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> usize {
        let victim = if self.victim.is_some() {
            self.victim_dests.count
        } else {
            1
        };
        // With mapping units a zone's valid blocks may need a second zone: the first
        // can end in pads before a unit that does not fit.
        let per_victim = if core.volumes.max_unit_blocks() > 1 {
            2
        } else {
            1
        };
        self.zones_needed(core, None, false) + victim * per_victim
    }

    /// The streams GC stages a victim of `n` valid blocks into, if the free zones can
    /// take them: those its placement may name for the victim's blocks, or, when the
    /// free zones cannot take the blocks spread over those, the one of them that needs
    /// the fewest zones, or failing that any one stream that fits them (an open zone
    /// with the room: placement gives way to progress). `None`: GC must wait for zones.
    fn gc_dests(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        victim: RegionId,
        n: usize,
    ) -> Option<Dests> {
        if core.geo.tiered() {
            // Every block GC moves goes to the cold tier, the coldest class there is:
            // it outlived its fast zone. A fast victim leaves the cold tier room for a
            // victim of its own, so cold GC (which fast GC waits for) always can run.
            let cold = Self::cold_stream(core);
            let keep = if core.geo.is_cold(victim) {
                0
            } else if core.volumes.max_unit_blocks() > 1 {
                2
            } else {
                1
            };
            let free = core.regions.free_cold_zones.len();
            return (free >= self.zones_to_finish(core, Some((cold, n))) + keep).then_some(cold);
        }
        let free = core.regions.free_zones.len();
        let (first, count) = core
            .placement
            .gc_dests(core.regions.get(victim).stream, core.streams);
        let natural = Dests { first, count };
        if free >= self.zones_to_finish(core, Some((natural, n))) {
            return Some(natural);
        }
        let best = |streams: std::ops::Range<usize>| {
            streams
                .map(|s| (self.zones_to_finish(core, Some((Dests::one(s), n))), s))
                .min()
                .filter(|&(need, _)| need <= free)
                .map(|(_, s)| Dests::one(s))
        };
        best(natural.range()).or_else(|| best(0..core.streams as usize))
    }

    fn open_zone(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
        stream: usize,
    ) -> Option<RegionId> {
        if self.role == RegionRole::Compaction && core.regions.free_zones.len() <= zone_floor {
            self.zone_blocked = true;
            return None;
        }
        let cold = core.geo.tiered() && stream == core.streams as usize;
        let z = if cold {
            core.regions.free_cold_zones.pop_front()?
        } else {
            core.regions.free_zones.pop_front()?
        };
        let sid = core.next_sid();
        core.regions.open(z, sid, self.role, stream as u16);
        core.placement.zone_opened(&core.geo, z);
        core.journal
            .append(JournalRecord::RegionOpened { region: z, sid });
        core.md_cache
            .invalidate_range(core.geo.region_base(z).0, core.geo.zone_size_blocks);
        self.streams[stream].zone = Some(z);
        Some(z)
    }

    /// Writes one group of a stream's staged blocks if a full group is staged (or any,
    /// padded, when `force`). Returns true if a write was submitted. Staged blocks
    /// whose source is no longer valid (overwritten or trimmed while they waited) are
    /// dropped instead of written: their copies would be born invalid.
    pub fn write_stream_group(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
        s: usize,
        force: bool,
    ) -> Result<bool, EngineError> {
        let n = self.streams[s].len();
        if n == 0 || (!force && n < GROUP_DATA_SLOTS && self.streams[s].zone.is_none()) {
            return Ok(false);
        }
        let zone = match self.streams[s].zone {
            Some(z) => z,
            None => match self.open_zone(core, zone_floor, s) {
                Some(z) => z,
                None => return Ok(false),
            },
        };
        let groups = Groups {
            blocks: core.geo.zone_cap_blocks,
        };
        let wp = core.regions.get(zone).wp;
        let (g, _) = groups.locate(wp);
        let k = groups.data_slots(g) as usize;
        let len = groups.len(g) as usize;
        if n < k && !force {
            return Ok(false);
        }
        self.drop_superseded(core, s);
        let n = self.streams[s].len();
        if n == 0 || (n < k && !force) {
            return Ok(false);
        }
        let mut m = n.min(k);
        if m < n && g + 1 == groups.count() {
            // The zone's last group: a unit it cannot hold whole waits for the next
            // zone, and pads take its place.
            let next = &self.streams[s].entries[m];
            if next.shift > 0 {
                m -= next.unit_index() as usize;
                core.stats.unit_pad_blocks += (k - m) as u64;
            }
        }
        let sid = core.regions.get(zone).sid;
        let (mut buf, entries) = self.take_group(core, s, m, k, len);
        let direct = entries.iter().filter(|e| e.is_fresh_direct()).count();
        core.placement
            .staged(&core.geo, zone, entries.iter().map(|e| e.sid));
        let md = zone_group_md(zone, g, sid, k, &entries);
        buf[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE].copy_from_slice(&md[..]);
        buf[(k + 1) * BLOCK_SIZE..(k + 2) * BLOCK_SIZE].copy_from_slice(&md[..]);
        let zw = ZoneWrite {
            zone,
            group: g,
            first_slot: groups.start(g),
            entries,
            md,
            parts_left: 0,
        };
        self.submit_zone_write(core, zw, buf);
        let reg = core.regions.get_mut(zone);
        reg.inflight_writes += 1;
        reg.wp = if g + 1 < groups.count() {
            groups.start(g + 1)
        } else {
            groups.end()
        };
        if reg.wp >= groups.end() {
            self.streams[s].zone = None;
        }
        let bytes = (len * BLOCK_SIZE) as u64;
        if self.role == RegionRole::Gc {
            core.stats.capacity_gc_write_bytes += bytes;
        } else {
            core.stats.capacity_compaction_write_bytes += bytes;
        }
        core.stats.capacity_pad_bytes += ((k - m) * BLOCK_SIZE) as u64;
        core.stats.capacity_direct_write_bytes += direct as u64 * BS;
        core.capacity_dirty = true;
        Ok(true)
    }

    /// The first `m` staged blocks of stream `s` in a group buffer of `len` blocks
    /// (`k` data slots; slots past `m` zeroed), with their entries.
    fn take_group(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
        m: usize,
        k: usize,
        len: usize,
    ) -> (IoBuf, Vec<RelocEntry>) {
        let st = &mut self.streams[s];
        if m == GROUP_DATA_SLOTS && len == shale_format::GROUP_BLOCKS as usize {
            // The common case: the group leaves in the buffer it was staged in.
            if let Some(taken) = st.take_full_group() {
                return taken;
            }
        }
        let mut buf = core.bufs.take(len);
        buf[m * BLOCK_SIZE..k * BLOCK_SIZE].fill(0);
        for j in 0..m {
            buf[j * BLOCK_SIZE..(j + 1) * BLOCK_SIZE].copy_from_slice(st.block(j));
        }
        let entries: Vec<RelocEntry> = st.entries.iter().take(m).copied().collect();
        st.consume(m, &mut core.bufs);
        (buf, entries)
    }

    /// Writes a zone group (data and both md copies in `buf`) in pieces of at most the
    /// device's largest I/O; `zw` waits for them in the zone write slab.
    fn submit_zone_write(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        mut zw: ZoneWrite,
        buf: IoBuf,
    ) {
        let len = buf.len();
        let max_io =
            (core.capacity.geometry().max_io_bytes as usize / BLOCK_SIZE).max(1) * BLOCK_SIZE;
        let parts = len.div_ceil(max_io);
        zw.parts_left = parts as u32;
        let base = core.geo.zone_offset(zw.zone, zw.first_slot);
        let gc = self.role == RegionRole::Gc;
        let writes = &mut self.zone_writes;
        let w = match writes.iter().position(Option::is_none) {
            Some(i) => {
                writes[i] = Some(zw);
                i
            }
            None => {
                writes.push(Some(zw));
                writes.len() - 1
            }
        } as u32;
        if parts == 1 {
            let tag = core.io.insert(InflightIo::ZonePart { gc, write: w });
            core.capacity.submit(ZoneRequest {
                tag,
                op: ZoneOp::Write {
                    offset: base,
                    buf,
                    fua: false,
                },
            });
            return;
        }
        for p in 0..parts {
            let lo = p * max_io;
            let hi = (lo + max_io).min(len);
            let mut part = core.bufs.take((hi - lo) / BLOCK_SIZE);
            part.copy_from_slice(&buf[lo..hi]);
            let tag = core.io.insert(InflightIo::ZonePart { gc, write: w });
            core.capacity.submit(ZoneRequest {
                tag,
                op: ZoneOp::Write {
                    offset: base + lo as u64,
                    buf: part,
                    fua: false,
                },
            });
        }
        core.bufs.give(buf);
    }

    pub fn on_zone_part_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        w: u32,
    ) -> Result<(), EngineError> {
        let gc = self.role == RegionRole::Gc;
        let Some(zw) = self
            .zone_writes
            .get_mut(w as usize)
            .and_then(Option::as_mut)
        else {
            panic!("completion for unknown zone write {w}");
        };
        zw.parts_left -= 1;
        if zw.parts_left > 0 {
            return Ok(());
        }
        let Some(zw) = self.zone_writes[w as usize].take() else {
            unreachable!("checked above")
        };
        for (i, e) in zw.entries.iter().enumerate() {
            let new = core.geo.pba(zw.zone, zw.first_slot + i as u32);
            if e.is_fresh_direct() {
                Self::map_direct(core, e, new)?;
                continue;
            }
            let Some((src, _)) = core.geo.region_slot(e.source) else {
                panic!("relocation source {} outside the data regions", e.source);
            };
            core.regions.get_mut(src).relocations -= 1;
            if e.shift > 0 {
                self.unit_block_settled(core, e, Some(new))?;
                continue;
            }
            // The source's validity bit says whether the entry still points at it
            // (a PBA is valid exactly when one L2P entry maps it), so the switch needs
            // no page: it is deferred if the page is not cached. A dual volume's block
            // moved alone is mapped by its sparse map from now on.
            if core.regions.validity.get(e.source) {
                core.regions.mark_valid(&core.geo, new, e.volume);
                let map = if core.volumes.is_dual(e.volume) {
                    core.volumes.fine_map(e.volume)
                } else {
                    e.volume
                };
                core.l2p.relocate(&mut core.cache, map, e.lba, new)?;
                core.regions.mark_invalid(&core.geo, e.source, e.volume);
                core.stats.relocated_blocks += 1;
                let c = core.volume_counters(e.volume);
                if gc {
                    c.capacity_gc_write_bytes += BS;
                } else {
                    c.capacity_compaction_write_bytes += BS;
                }
            } else {
                core.stats.relocations_superseded += 1;
                core.regions.maybe_pending_free(src);
            }
        }
        let groups = Groups {
            blocks: core.geo.zone_cap_blocks,
        };
        let md_a = core.geo.pba(zw.zone, groups.md_slot(zw.group));
        core.md_cache.insert(md_a.0, &zw.md[..]);
        core.regions.get_mut(zw.zone).inflight_writes -= 1;
        let now = core.now();
        if core.regions.try_close(&core.geo, zw.zone, false, now) {
            core.journal
                .append(JournalRecord::RegionClosed { region: zw.zone });
            if groups.end() < core.geo.zone_cap_blocks {
                let z = core.geo.zone_of(zw.zone).0;
                core.capacity
                    .manage(z, ZoneAction::Finish)
                    .map_err(EngineError::capacity(
                        "zone finish",
                        core.geo.zone_offset(zw.zone, 0),
                    ))?;
            }
        }
        Ok(())
    }

    /// Block `e` of a mapping unit was written at `new` (or dropped: `None`, its
    /// source no longer valid). Once all the unit's blocks have settled, the unit
    /// switches to its new place if its source is still the mapped copy and every
    /// block landed where the unit needs it.
    fn unit_block_settled(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        e: &RelocEntry,
        new: Option<Pba>,
    ) -> Result<(), EngineError> {
        let k = 1u64 << e.shift;
        let j = e.unit_index();
        let Some(src_base) = core.geo.data_retreat(e.source, j) else {
            panic!("unit block {j} at {} starts before its region", e.source);
        };
        let unit = e.lba.0 >> e.shift;
        let key = (e.volume, unit, src_base);
        let dual = core.volumes.is_dual(e.volume);
        let mv = self.units_moving.entry(key).or_insert(UnitMove {
            settled: 0,
            new_base: None,
            contiguous: true,
            blocks: Vec::new(),
        });
        mv.settled += 1;
        if dual {
            mv.blocks.push((j, e.source, new));
        }
        if let Some(new) = new {
            let base = core.geo.data_retreat(new, j);
            match (mv.new_base, base) {
                (_, None) => mv.contiguous = false,
                (None, Some(b)) => mv.new_base = Some(b),
                (Some(a), Some(b)) => mv.contiguous &= a == b,
            }
        }
        if mv.settled < k {
            return Ok(());
        }
        let Some(mv) = self.units_moving.remove(&key) else {
            unreachable!("inserted above")
        };
        let Some((src, _)) = core.geo.region_slot(src_base) else {
            unreachable!("a block's region")
        };
        if dual {
            return self.dual_unit_settled(core, e, unit, src_base, mv);
        }
        match mv.new_base {
            Some(new_base) if mv.contiguous && core.regions.validity.get(src_base) => {
                Self::switch_unit(core, e.volume, unit, k, src_base, new_base)?;
                core.stats.relocated_blocks += k;
                let c = core.volume_counters(e.volume);
                if self.role == RegionRole::Gc {
                    c.capacity_gc_write_bytes += k * BS;
                } else {
                    c.capacity_compaction_write_bytes += k * BS;
                }
            }
            _ => {
                if !mv.contiguous && core.regions.validity.get(src_base) {
                    // Never meant to happen (units are staged whole and cut only where
                    // their zone goes on); the unit stays where it is, and its region
                    // may be taken as a victim again.
                    tracing::error!(volume = %e.volume, unit, "a moved unit's blocks are not consecutive; left in place");
                    core.regions.get_mut(src).draining = false;
                }
                core.stats.relocations_superseded += k;
                core.regions.maybe_pending_free(src);
            }
        }
        Ok(())
    }

    /// Unit `unit` of `volume` (`k` blocks) moves from `src_base` to `new_base`: the
    /// new blocks valid, the unit map's entry switched, the old blocks invalid.
    fn switch_unit(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        unit: u64,
        k: u64,
        src_base: Pba,
        new_base: Pba,
    ) -> Result<(), EngineError> {
        for j in 0..k {
            core.regions
                .mark_valid(&core.geo, core.unit_block(new_base, j), volume);
        }
        core.l2p
            .relocate(&mut core.cache, volume, Lba(unit), new_base)?;
        for j in 0..k {
            core.regions
                .mark_invalid(&core.geo, core.unit_block(src_base, j), volume);
        }
        Ok(())
    }

    /// A dual volume's unit has settled: it switches whole if every block was written
    /// where the unit needs it and every source is still valid (a valid block of a
    /// unit staged whole is mapped by the unit map); else each block still valid
    /// switches alone, to the sparse map.
    fn dual_unit_settled(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        e: &RelocEntry,
        unit: u64,
        src_base: Pba,
        mv: UnitMove,
    ) -> Result<(), EngineError> {
        let k = 1u64 << e.shift;
        let Some((src, _)) = core.geo.region_slot(src_base) else {
            unreachable!("a block's region")
        };
        let whole = mv.contiguous
            && mv
                .blocks
                .iter()
                .all(|&(_, from, to)| to.is_some() && core.regions.validity.get(from));
        let mut moved = 0;
        match mv.new_base {
            Some(new_base) if whole => {
                Self::switch_unit(core, e.volume, unit, k, src_base, new_base)?;
                moved = k;
            }
            _ => {
                let fine = core.volumes.fine_map(e.volume);
                for &(j, from, to) in &mv.blocks {
                    let Some(to) = to else { continue };
                    if !core.regions.validity.get(from) {
                        continue;
                    }
                    core.regions.mark_valid(&core.geo, to, e.volume);
                    core.l2p
                        .relocate(&mut core.cache, fine, Lba((unit << e.shift) + j), to)?;
                    core.regions.mark_invalid(&core.geo, from, e.volume);
                    moved += 1;
                }
            }
        }
        core.stats.relocated_blocks += moved;
        core.stats.relocations_superseded += k - moved;
        let c = core.volume_counters(e.volume);
        if self.role == RegionRole::Gc {
            c.capacity_gc_write_bytes += moved * BS;
        } else {
            c.capacity_compaction_write_bytes += moved * BS;
        }
        core.regions.maybe_pending_free(src);
        Ok(())
    }

    /// A dual volume's units left partial when the victim changes (a block of theirs
    /// was overwritten before it was read, so the rest will never come): their blocks
    /// move alone, to the sparse map. Units of other volumes left partial belonged to
    /// a victim emptied while it was read.
    fn flush_partial_units(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) {
        let partial: Vec<PartialUnit> = self.units_partial.drain().map(|(_, p)| p).collect();
        for p in partial {
            for (e, b) in p.blocks.into_iter().flatten() {
                // Counted as a relocation when it was staged, so its region was not
                // reused meanwhile: the validity bit is still this block's.
                if !core.volumes.is_dual(e.volume) || !core.regions.validity.get(e.source) {
                    Self::forget_relocation(core, &e);
                    continue;
                }
                let e = RelocEntry { shift: 0, ..e };
                self.streams[p.stream].push(e, &b[..], &mut core.bufs);
            }
        }
    }

    /// The unit shift a valid block moves with: mapped by the volume now in its slot,
    /// that one's unit (on a dual volume, only a unit its unit map holds whole), else 0.
    fn moving_shift(
        peek: &mut crate::read::peek::MapPeek,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
    ) -> u8 {
        let shift = core.volumes.shift(volume) as u8;
        if shift > 0
            && core.volumes.is_dual(volume)
            && !Self::whole_unit_at(peek, core, volume, lba, pba, shift)
        {
            return 0;
        }
        shift
    }

    /// Whether the valid block `lba` of dual volume `volume` at `pba` is one of a unit
    /// the unit map holds whole (all its blocks valid), which moves as one; else the
    /// block moves alone.
    fn whole_unit_at(
        peek: &mut crate::read::peek::MapPeek,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        volume: VolumeId,
        lba: Lba,
        pba: Pba,
        shift: u8,
    ) -> bool {
        let k = 1u64 << shift;
        let Some(base) = core.geo.data_retreat(pba, lba.0 % k) else {
            return false;
        };
        let all_valid = (0..k).all(|j| {
            core.geo
                .data_advance(base, j)
                .is_some_and(|p| core.regions.validity.get(p))
        });
        if !all_valid {
            return false;
        }
        // The maps are peeked, not faulted in: the mover runs between a victim read's
        // completion and its staging, where evicting pages is not wanted. A page that
        // cannot be read: the block moves alone (which needs no page).
        let unit = lba.0 >> shift;
        if peek.unit_entry(core, volume, unit).ok().flatten() != Some(base) {
            return false;
        }
        // The unit map may still name a unit all of whose blocks the sparse map
        // overrides (it is then never read), and blocks written alone may have landed
        // in those very slots when the region was reused: the unit is whole only if
        // the sparse map holds none of its blocks.
        (0..k).all(|j| {
            matches!(
                peek.sparse_entry(core, volume, (unit << shift) + j),
                Ok(None)
            )
        })
    }

    /// Stages block `j` of a mapping unit read from a victim; the unit goes to stream
    /// `s` (its first block's) once all its blocks are read.
    fn stage_unit_block(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
        entry: RelocEntry,
        data: &[u8],
    ) {
        let k = 1u64 << entry.shift;
        let j = entry.unit_index() as usize;
        let key = (entry.volume, entry.lba.0 >> entry.shift);
        let p = self
            .units_partial
            .entry(key)
            .or_insert_with(|| PartialUnit {
                stream: s,
                blocks: (0..k).map(|_| None).collect(),
                have: 0,
            });
        let mut block = Box::new([0u8; BLOCK_SIZE]);
        block.copy_from_slice(data);
        // A block waiting for the rest of its unit counts as a relocation of its
        // region already: the region must not be freed and reused under it (a dual
        // volume's waiting blocks may still move, alone, after the victim changes).
        let Some((src, _)) = core.geo.region_slot(entry.source) else {
            unreachable!("a victim's block")
        };
        core.regions.get_mut(src).relocations += 1;
        match p.blocks[j].replace((entry, block)) {
            None => p.have += 1,
            Some((old, _)) => Self::forget_relocation(core, &old),
        }
        if p.have < k {
            return;
        }
        let Some(p) = self.units_partial.remove(&key) else {
            unreachable!("inserted above")
        };
        for (e, b) in p.blocks.into_iter().flatten() {
            self.streams[p.stream].push(e, &b[..], &mut core.bufs);
        }
    }

    /// A block counted as a relocation of its region will not move after all.
    fn forget_relocation(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        e: &RelocEntry,
    ) {
        let Some((src, _)) = core.geo.region_slot(e.source) else {
            unreachable!("a victim's block")
        };
        core.regions.get_mut(src).relocations -= 1;
        core.regions.maybe_pending_free(src);
    }

    /// A direct write's block reached its zone at `new`: it is mapped if it is still
    /// the newest version of its LBA (else it is born invalid).
    fn map_direct(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        e: &RelocEntry,
        new: Pba,
    ) -> Result<(), EngineError> {
        if core.directs.is_latest(e.direct, e.volume, e.lba) {
            // The page may have to be read in: the old mapping's region loses a block.
            let old = core.l2p.set(&mut core.cache, e.volume, e.lba, new)?;
            core.regions.mark_valid(&core.geo, new, e.volume);
            if !old.is_none() {
                core.regions.mark_invalid(&core.geo, old, e.volume);
            }
            core.stats.direct_blocks_mapped += 1;
        } else {
            core.stats.direct_blocks_superseded += 1;
        }
        core.directs.settle(e.direct, e.volume, e.lba);
        Ok(())
    }

    /// Stages block `data` of a direct write (`entry.direct`) in stream `s`.
    pub fn stage_direct(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
        entry: RelocEntry,
        data: &[u8],
    ) {
        debug_assert!(entry.is_fresh_direct());
        self.streams[s].push(entry, data, &mut core.bufs);
    }

    /// Whether stream `s` holds direct blocks that cannot leave in a full group now:
    /// fewer than a group staged, and one of them staged before `deadline`, or any
    /// when `deadline` is `None` (nothing else will come to fill the group).
    pub fn directs_lingering(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
        deadline: Option<u64>,
    ) -> bool {
        let st = &self.streams[s];
        st.len() < GROUP_DATA_SLOTS
            && st.entries.iter().any(|e| {
                e.is_fresh_direct()
                    && deadline.is_none_or(|d| core.directs.staged_before(e.direct, d))
            })
    }

    /// Takes stream `s`'s fresh direct blocks out (to be written to the cache instead):
    /// those still the newest version of their LBA go to `take` with their data; the
    /// others settle here.
    pub fn take_directs(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
        mut take: impl FnMut(RelocEntry, &[u8]),
    ) {
        let directs = &mut core.directs;
        let stats = &mut core.stats;
        self.streams[s].retain_with(
            &mut core.bufs,
            |e| !e.is_fresh_direct(),
            |e, data| {
                if directs.is_latest(e.direct, e.volume, e.lba) {
                    take(e, data);
                } else {
                    stats.direct_blocks_superseded += 1;
                    directs.settle(e.direct, e.volume, e.lba);
                }
            },
        );
    }

    /// Candidates for a mover: closed, not already being drained.
    fn snapshot(
        &mut self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> Vec<RegionSnapshot> {
        let mut snap = std::mem::take(&mut self.snapshot);
        snap.clear();
        let range = if self.role == RegionRole::Gc {
            core.geo.chunk_count + 1..core.geo.region_count()
        } else {
            0..core.geo.chunk_count
        };
        for r in range.map(RegionId) {
            let reg = core.regions.get(r);
            // A chunk holding a direct write's slot waits until the write's blocks
            // are mapped (write/direct.rs: a copy would outrank them).
            // With a cold tier GC takes victims from the tier that is short.
            let other_tier = self.role == RegionRole::Gc
                && core.geo.tiered()
                && core.geo.is_cold(r) != self.cold;
            let busy = self.role == RegionRole::Compaction && core.directs.chunk_busy(r);
            if reg.state == RegionState::Closed && !reg.draining && !other_tier && !busy {
                snap.push(RegionSnapshot {
                    region: r,
                    valid: reg.valid,
                    capacity: Groups {
                        blocks: core.geo.region_blocks(r),
                    }
                    .data_capacity(),
                    sid: reg.sid,
                    close_time: reg.close_time,
                });
            }
        }
        snap
    }

    /// One bounded step: write full staged groups, then read at most one victim group.
    pub fn step(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
    ) -> Result<bool, EngineError> {
        let mut progress = false;
        let streams = self.streams.len();
        for s in 0..streams {
            progress |= self.write_stream_group(core, zone_floor, s, false)?;
        }
        if self.streams.iter().any(|s| s.len() > GROUP_DATA_SLOTS) {
            return Ok(progress);
        }
        // Bounded read-ahead: a few victim groups in flight per mover.
        if self.reads_in_flight() >= core.config.background_steps_per_poll_max as usize {
            return Ok(progress);
        }
        if self.victim.is_none() && self.reads_in_flight() == 0 && !self.units_partial.is_empty() {
            // Every read of the last victim is in: its units left partial will not
            // complete, and hold their regions until they are settled.
            self.flush_partial_units(core);
        }
        if self.victim.is_none() {
            let snap = self.snapshot(core);
            let now = core.now();
            // A volume past its cache share has its chunks compacted first.
            // Zones of volumes with a GC policy of their own are judged by it.
            let choice = match self.role {
                RegionRole::Compaction => core
                    .regions
                    .shares
                    .victim(&snap)
                    .or_else(|| self.policy.choose(&snap, now)),
                _ if core.geo.tiered() && !self.cold => crate::tier::Demote.choose(&snap, now),
                _ if core.placement.has_gc_policies() => {
                    let (regions, placement) = (&core.regions, &core.placement);
                    crate::gc::policy::choose_per_policy(&snap, now, &*self.policy, |r| {
                        placement.stream_gc(regions.get(r).stream)
                    })
                }
                _ => self.policy.choose(&snap, now),
            };
            self.snapshot = snap;
            let Some(v) = choice else { return Ok(progress) };
            if self.role == RegionRole::Gc {
                let valid = core.regions.get(v).valid as usize;
                let Some(dests) = self.gc_dests(core, v, valid) else {
                    return self.gc_wait_for_zones(core, zone_floor, progress);
                };
                self.victim_dests = dests;
                core.placement.gc_took(&core.regions, v, core.sid_next);
            } else {
                self.victim_dests = Dests::all(core.streams);
            }
            core.regions.get_mut(v).draining = true;
            // Units left partial belonged to a victim emptied while it was read, or
            // are a dual volume's whose blocks then move alone.
            self.flush_partial_units(core);
            self.victim = Some(v);
            self.cursor = 0;
        }
        let Some(victim) = self.victim else {
            return Ok(progress);
        };
        // Overwrites and trims may have emptied the victim before the mover reached its
        // end: it is then PendingFree (or already reused) and must not be read again.
        let v = core.regions.get(victim);
        if v.state != RegionState::Closed || !v.draining {
            self.victim = None;
            return Ok(true);
        }
        let groups = Groups {
            blocks: core.geo.region_blocks(victim),
        };
        loop {
            let g = self.cursor;
            if g >= groups.count() {
                // The victim is done once its last group reads have been staged.
                if self.reads_in_flight_for(victim) {
                    return Ok(progress);
                }
                self.victim = None;
                if self.role == RegionRole::Gc {
                    core.stats.gc_victims += 1;
                } else {
                    core.stats.compaction_victims += 1;
                }
                core.regions.maybe_pending_free(victim);
                self.release_hostages(core, zone_floor)?;
                return Ok(true);
            }
            let start = core.geo.pba(victim, groups.start(g));
            let k = groups.data_slots(g);
            self.cursor += 1;
            if core.regions.validity.count_range(start, k) == 0 {
                continue;
            }
            self.read_victim_group(core, victim, g, self.victim_dests)?;
            break;
        }
        for s in 0..streams {
            self.write_stream_group(core, zone_floor, s, false)?;
        }
        Ok(true)
    }

    /// Submits the reads of one victim group: whole when mostly valid, else md + valid
    /// runs. The mover waits for them (one group in flight per mover).
    fn read_victim_group(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        victim: RegionId,
        g: u32,
        dests: Dests,
    ) -> Result<(), EngineError> {
        let groups = Groups {
            blocks: core.geo.region_blocks(victim),
        };
        let len = groups.len(g) as usize;
        let k = groups.data_slots(g) as usize;
        let slot0 = groups.start(g);
        let base = core.geo.pba(victim, slot0);
        let valid = core.regions.validity.count_range(base, k as u32) as usize;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        if valid * 2 >= k {
            ranges.push((0, len));
        } else {
            // Valid runs, merged across gaps of up to READ_GAP_BLOCKS (one larger read
            // beats several small ones), cut into power-of-two pieces so the buffer pool
            // needs only a few sizes.
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for i in 0..k {
                if core.regions.validity.get(Pba(base.0 + i as u64)) {
                    match runs.last_mut() {
                        Some(r) if i - r.1 <= READ_GAP_BLOCKS => r.1 = i + 1,
                        _ => runs.push((i, i + 1)),
                    }
                }
            }
            for (s, e) in runs {
                let mut at = s;
                while at < e {
                    let n = 1usize << (usize::BITS - 1 - (e - at).leading_zeros());
                    ranges.push((at, at + n));
                    at += n;
                }
            }
            ranges.push((k, len));
        }
        let gc = self.role == RegionRole::Gc;
        let is_chunk = core.geo.is_chunk(victim);
        let read = GroupRead {
            victim,
            group: g,
            parts: ranges.iter().map(|&(lo, _)| (lo, None)).collect(),
            left: ranges.len() as u32,
            valid: valid as u32,
            dests,
        };
        let m = &mut *self;
        let slot = match m.reads.iter().position(Option::is_none) {
            Some(i) => {
                m.reads[i] = Some(read);
                i
            }
            None => {
                m.reads.push(Some(read));
                m.reads.len() - 1
            }
        } as u16;
        for (part, &(lo, hi)) in ranges.iter().enumerate() {
            let buf = core.bufs.take(hi - lo);
            let bytes = buf.len() as u64;
            let first = slot0 + lo as u32;
            let tag = core.io.insert(InflightIo::MoverRead {
                gc,
                read: slot,
                part: part as u16,
            });
            if is_chunk {
                let offset = core.geo.chunk_offset(victim, first);
                core.stats.cache_read_bytes += bytes;
                core.cache.submit(IoRequest {
                    tag,
                    op: IoOp::Read { offset, buf },
                });
            } else {
                let offset = core.geo.zone_offset(victim, first);
                core.stats.capacity_read_bytes += bytes;
                core.capacity.submit(ZoneRequest {
                    tag,
                    op: ZoneOp::Read { offset, buf },
                });
            }
        }
        Ok(())
    }

    /// One piece of a victim group read arrived; the last one stages the group.
    pub fn on_read_done(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
        read: u16,
        part: u16,
        buf: Option<IoBuf>,
    ) -> Result<(), EngineError> {
        let Some(buf) = buf else {
            panic!("mover read completed without its buffer")
        };
        let m = &mut *self;
        let Some(r) = m.reads.get_mut(usize::from(read)).and_then(Option::as_mut) else {
            panic!("mover read completion for unknown read {read}");
        };
        r.parts[usize::from(part)].1 = Some(buf);
        r.left -= 1;
        if r.left > 0 {
            return Ok(());
        }
        let Some(r) = m.reads[usize::from(read)].take() else {
            unreachable!("checked above")
        };
        // The victim may have been emptied by overwrites while the read was in flight.
        let v = core.regions.get(r.victim);
        if v.state == RegionState::Closed && v.draining && self.victim == Some(r.victim) {
            self.stage_victim_group(core, r.victim, r.group, &r.parts, r.dests)?;
        }
        for (_, b) in r.parts {
            if let Some(b) = b {
                core.bufs.give(b);
            }
        }
        for s in 0..self.streams.len() {
            self.write_stream_group(core, zone_floor, s, false)?;
        }
        Ok(())
    }

    fn stage_victim_group(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        victim: RegionId,
        g: u32,
        parts: &[(usize, Option<IoBuf>)],
        dests: Dests,
    ) -> Result<(), EngineError> {
        // Switches since the last group may have changed the maps.
        self.peek.forget();
        let groups = Groups {
            blocks: core.geo.region_blocks(victim),
        };
        let len = groups.len(g) as usize;
        let k = groups.data_slots(g) as usize;
        let slot0 = groups.start(g);
        debug_assert!(len >= k + 2);
        let md_at = |c: usize| (slot0 as usize + k + c) as u64 * BS;
        let sid = core.regions.get(victim).sid;
        let (Some(md_a), Some(md_b)) = (slot_data(parts, k), slot_data(parts, k + 1)) else {
            panic!("victim group read without its md blocks");
        };
        let a = decode_md_header(md_a, md_at(0));
        let b = decode_md_header(md_b, md_at(1));
        // Copies from an earlier life of the region carry another SID.
        let a = a.and_then(|h| {
            if h.region_sid == sid {
                Ok(h)
            } else {
                Err(stale_md(md_at(0)))
            }
        });
        let b = b.and_then(|h| {
            if h.region_sid == sid {
                Ok(h)
            } else {
                Err(stale_md(md_at(1)))
            }
        });
        let pick = match (&a, &b) {
            (Ok(ha), Ok(hb)) => Some(usize::from(hb.generation > ha.generation)),
            (Ok(_), Err(_)) => Some(0),
            (Err(_), Ok(_)) => Some(1),
            (Err(e), Err(_)) => {
                // The group's live blocks cannot be attributed; they stay where they are
                // (readers get the same error), and the region is never freed.
                tracing::error!(region = %victim, group = g, error = %e, "both md copies unreadable");
                core.stats.crc_errors += 1;
                None
            }
        };
        if let Some(c) = pick {
            let md = if c == 0 { md_a } else { md_b };
            let verify = self.role == RegionRole::Gc || core.config.verify_compaction_reads;
            let mut reread = [0u8; BLOCK_SIZE];
            for i in 0..k {
                let pba = core.geo.pba(victim, slot0 + i as u32);
                if !core.regions.validity.get(pba) {
                    continue;
                }
                let Ok(e) = decode_md_entry(md, i, 0) else {
                    continue;
                };
                if !e.kind.holds_data() {
                    core.stats.crc_errors += 1;
                    continue;
                }
                let Some(data) = slot_data(parts, i) else {
                    panic!("valid slot {i} of {victim} group {g} was not read");
                };
                // The copy keeps the block's original CRC, so a corrupt block stays
                // detectably corrupt wherever it moves. What checking here adds is a
                // second read before the source is erased, which heals a transient
                // read error; see `Config::verify_compaction_reads` for why GC always
                // checks and compaction by default does not.
                let mut data = data;
                if verify && shale_format::block_crc(data) != e.data_crc {
                    if Self::reread_block(core, victim, slot0 + i as u32, &mut reread)
                        && shale_format::block_crc(&reread[..]) == e.data_crc
                    {
                        core.stats.crc_reread_fixes += 1;
                        tracing::warn!(%pba, "victim block read back corrupt; a second read was good");
                        data = &reread[..];
                    } else if Self::rebuilt_block(
                        core,
                        victim,
                        slot0 + i as u32,
                        &mut reread,
                        e.data_crc,
                    ) {
                        // The move itself is the repair: the corrupt copy is erased
                        // with its zone.
                        core.stats.crc_rebuilt_fixes += 1;
                        tracing::warn!(%pba, "victim block corrupt; rebuilt from redundancy");
                        data = &reread[..];
                    } else {
                        core.stats.crc_errors += 1;
                        tracing::warn!(%pba, "relocating a block whose data CRC does not match its md (it stays detectable: the copy keeps the original CRC)");
                    }
                }
                let s = self.stream_for(core, victim, &e, pba);
                let s = if dests.contains(s) { s } else { dests.first };
                let entry = RelocEntry {
                    shift: Self::moving_shift(&mut self.peek, core, e.volume, e.lba, pba),
                    ..RelocEntry::moving(&e, pba)
                };
                if entry.shift > 0 {
                    self.stage_unit_block(core, s, entry, data);
                    continue;
                }
                let st = &mut self.streams[s];
                st.push(entry, data, &mut core.bufs);
                core.regions.get_mut(victim).relocations += 1;
            }
        }
        Ok(())
    }

    /// The stream a live block of `victim` at `pba`, described by `e`, moves to.
    fn stream_for(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        victim: RegionId,
        e: &MdEntry,
        pba: Pba,
    ) -> usize {
        let p = &core.placement;
        if self.role == RegionRole::Gc {
            p.gc_stream(
                &core.regions,
                victim,
                e.volume,
                e.sid,
                core.sid_next,
                core.streams,
            )
        } else {
            p.compaction_stream(e.volume, pba, core.streams)
        }
    }

    /// Reads one block of a victim again, synchronously. False on a read error.
    fn reread_block(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        region: RegionId,
        slot: u32,
        out: &mut [u8; BLOCK_SIZE],
    ) -> bool {
        if core.geo.is_chunk(region) {
            let off = core.geo.chunk_offset(region, slot);
            core.stats.cache_read_bytes += BS;
            core.cache.read_at(off, &mut out[..]).is_ok()
        } else {
            let off = core.geo.zone_offset(region, slot);
            core.stats.capacity_read_bytes += BS;
            core.capacity.read_at(off, &mut out[..]).is_ok()
        }
    }

    /// Reads one block of a victim from the device's redundancy (an array's other
    /// members, a mirrored cache's other mirrors) until a copy matches `crc`. False
    /// where there is none (a single device).
    fn rebuilt_block(
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        region: RegionId,
        slot: u32,
        out: &mut [u8; BLOCK_SIZE],
        crc: u32,
    ) -> bool {
        let chunk = core.geo.is_chunk(region);
        let off = if chunk {
            core.geo.chunk_offset(region, slot)
        } else {
            core.geo.zone_offset(region, slot)
        };
        for attempt in 0..crate::read::reader::REBUILD_ATTEMPTS_MAX {
            if !crate::read::reader::read_copy(core, chunk, off, &mut out[..], attempt) {
                return false;
            }
            if shale_format::block_crc(&out[..]) == crc {
                return true;
            }
        }
        false
    }

    /// Stages a block to be written anew, as a relocation of its copy at
    /// `entry.source`: if the copy is still the mapped one, the move makes it garbage.
    /// A block rebuilt after a failed checksum (from `Core::repairs`), or one read
    /// often from the cold tier (`tier.rs`). `entry` comes from the block's md.
    pub fn stage_rewrite(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        entry: RelocEntry,
        data: &[u8],
    ) -> bool {
        let Some((region, _)) = core.geo.region_slot(entry.source) else {
            return false;
        };
        // A unit's block moves only with its unit: compaction or GC will, checking
        // (and, with redundancy, rebuilding) every block as it goes.
        if core.volumes.shift(entry.volume) > 0 {
            return false;
        }
        let staged = self
            .streams
            .iter()
            .any(|st| st.entries.iter().any(|e| e.source == entry.source));
        if staged || !core.regions.validity.get(entry.source) {
            return false;
        }
        let s = (entry.volume.0 % core.streams) as usize;
        self.streams[s].push(entry, data, &mut core.bufs);
        core.regions.get_mut(region).relocations += 1;
        true
    }

    /// Drops every stream's staged blocks whose source is no longer valid: once a
    /// checkpoint's L2P reflects the newer state they must not reach media after it
    /// (recovery ranks every replayed copy above the checkpoint's L2P).
    pub fn drop_all_superseded(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) {
        for s in 0..self.streams.len() {
            self.drop_superseded(core, s);
        }
    }

    /// Drops staged blocks whose source was overwritten or trimmed since they were
    /// read: written, they would only be born invalid. Their sources may now be
    /// freed (after a durability point, as always).
    fn drop_superseded(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        s: usize,
    ) {
        let st = &mut self.streams[s];
        let validity = &core.regions.validity;
        let directs = &core.directs;
        // A direct block is wanted while it is the newest version of its LBA, a
        // relocation while its source is still the mapped copy.
        let wanted = |e: &RelocEntry| {
            if e.is_fresh_direct() {
                directs.is_latest(e.direct, e.volume, e.lba)
            } else {
                validity.get(e.source)
            }
        };
        if st.entries.iter().all(wanted) {
            return;
        }
        let dropped = st.retain(&mut core.bufs, wanted);
        for e in dropped {
            if e.is_fresh_direct() {
                core.stats.direct_blocks_superseded += 1;
                core.directs.settle(e.direct, e.volume, e.lba);
                continue;
            }
            if let Some((src, _)) = core.geo.region_slot(e.source) {
                core.regions.get_mut(src).relocations -= 1;
                core.regions.maybe_pending_free(src);
            }
            if e.shift > 0 {
                // Its unit may be part written: the blocks settle together.
                if let Err(err) = self.unit_block_settled(core, &e, None) {
                    unreachable!("a superseded unit switches nothing: {err}")
                }
                continue;
            }
            core.stats.relocations_superseded += 1;
        }
    }

    /// Pads out partial batches when the space they hold hostage is needed now and no
    /// other victim could fill them instead (padding costs capacity writes).
    fn release_hostages(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
    ) -> Result<(), EngineError> {
        let short = if self.role == RegionRole::Gc {
            core.regions.free_zones_of(self.cold).len() <= 1
        } else {
            core.regions.free_chunks.is_empty()
        };
        if !short {
            return Ok(());
        }
        let snap = self.snapshot(core);
        let now = core.now();
        let other = self.policy.choose(&snap, now);
        self.snapshot = snap;
        if other.is_none() {
            self.pad_streams(core, zone_floor)?;
        }
        Ok(())
    }

    /// GC may not take another victim until zones come free. Its victims wait for the
    /// blocks it staged: the zone writes in flight and the next durability point free
    /// them; with neither (and between victims), the partial groups are padded out so
    /// they can.
    fn gc_wait_for_zones(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
        mut progress: bool,
    ) -> Result<bool, EngineError> {
        self.zone_blocked = true;
        let pending_zones = core
            .regions
            .pending_free
            .iter()
            .any(|&r| !core.geo.is_chunk(r));
        // A pad wastes the rest of its group, room a read may be counting on.
        if self.zone_writes.iter().all(Option::is_none) && self.between_victims() && !pending_zones
        {
            progress |= self.pad_streams(core, zone_floor)?;
        }
        Ok(progress)
    }

    pub fn pad_streams(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        zone_floor: usize,
    ) -> Result<bool, EngineError> {
        let mut any = false;
        for s in 0..self.streams.len() {
            while !self.streams[s].is_empty() {
                if !self.write_stream_group(core, zone_floor, s, true)? {
                    break;
                }
                any = true;
            }
        }
        Ok(any)
    }
}
