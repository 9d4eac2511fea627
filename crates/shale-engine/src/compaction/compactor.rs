//! The Mover: reads live blocks of a victim region (one group per step), stages them
//! per stream in DRAM, and appends full 126-block groups to the stream's zone in one
//! sequential write (data, md A, md B). Compaction (chunk victims, compaction zones)
//! and GC (zone victims, GC zones) are two Movers with different roles.
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
//! - compaction never takes a zone while free zones <= the GC reserve (a zone per GC
//!   stream holding staged blocks without a zone, plus one), so GC can always finish
//!   what it holds and free zones again.

use shale_device::{
    BlockDevice, IoBuf, IoOp, IoRequest, ZoneAction, ZoneOp, ZoneRequest, ZonedDevice,
};
use shale_format::{
    decode_md_entry, decode_md_header, encode_md, EntryKind, JournalRecord, MdEntry, MdHeader,
    MdRegionKind, Pba, RegionId, RegionRole, RegionState, BLOCK_SIZE, GROUP_DATA_SLOTS,
};

use crate::compaction::policy::{RegionSnapshot, VictimPolicy};
pub(crate) use crate::compaction::stream::{RelocEntry, Stream};
use crate::engine::InflightIo;
use crate::layout::{Groups, BS};
use crate::{Clock, Engine, EngineError};

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
}

/// One victim group being read: its pieces (first slot, buffer once arrived).
#[derive(Debug)]
pub(crate) struct GroupRead {
    victim: RegionId,
    group: u32,
    parts: Vec<(usize, Option<IoBuf>)>,
    left: u32,
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
        }
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

    pub fn role(&self) -> RegionRole {
        self.role
    }
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

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Zones compaction leaves to GC: one for each GC stream that holds staged blocks
    /// but no open zone (padding those out releases every victim they hold hostage),
    /// plus one for the victim in progress, whose stream's zone may fill part way.
    /// GC needs no more than that to free zones again, whatever compaction took, so
    /// the reserve follows what GC holds instead of one zone per stream.
    pub(crate) fn gc_reserve(&self) -> usize {
        self.cleaner
            .streams
            .iter()
            .filter(|s| s.zone.is_none() && !s.is_empty())
            .count()
            + 1
    }

    fn open_zone(&mut self, role: RegionRole, stream: usize) -> Option<RegionId> {
        if role == RegionRole::Compaction && self.regions.free_zones.len() <= self.gc_reserve() {
            self.compaction_zone_blocked = true;
            return None;
        }
        let z = self.regions.free_zones.pop_front()?;
        let sid = self.next_sid();
        self.regions.open(z, sid, role, stream as u16);
        self.journal
            .append(JournalRecord::RegionOpened { region: z, sid });
        self.md_cache
            .invalidate_range(self.geo.region_base(z).0, self.geo.zone_size_blocks);
        self.mover(role).streams[stream].zone = Some(z);
        Some(z)
    }

    /// Writes one group of a stream's staged blocks if a full group is staged (or any,
    /// padded, when `force`). Returns true if a write was submitted. Staged blocks
    /// whose source is no longer valid (overwritten or trimmed while they waited) are
    /// dropped instead of written: their copies would be born invalid.
    pub(crate) fn write_stream_group(
        &mut self,
        role: RegionRole,
        s: usize,
        force: bool,
    ) -> Result<bool, EngineError> {
        let n = self.mover(role).streams[s].len();
        if n == 0 || (!force && n < GROUP_DATA_SLOTS && self.mover(role).streams[s].zone.is_none())
        {
            return Ok(false);
        }
        let zone = match self.mover(role).streams[s].zone {
            Some(z) => z,
            None => match self.open_zone(role, s) {
                Some(z) => z,
                None => return Ok(false),
            },
        };
        let groups = Groups {
            blocks: self.geo.zone_cap_blocks,
        };
        let wp = self.regions.get(zone).wp;
        let (g, _) = groups.locate(wp);
        let k = groups.data_slots(g) as usize;
        let len = groups.len(g) as usize;
        if n < k && !force {
            return Ok(false);
        }
        self.drop_superseded(role, s);
        let n = self.mover(role).streams[s].len();
        if n == 0 || (n < k && !force) {
            return Ok(false);
        }
        let m = n.min(k);
        let sid = self.regions.get(zone).sid;
        let full = if m == GROUP_DATA_SLOTS && len == shale_format::GROUP_BLOCKS as usize {
            let st = match role {
                RegionRole::Gc => &mut self.cleaner.streams[s],
                _ => &mut self.compactor.streams[s],
            };
            st.take_full_group()
        } else {
            None
        };
        let (mut buf, entries) = match full {
            // The common case: the group leaves in the buffer it was staged in.
            Some(taken) => taken,
            None => {
                let mut buf = self.bufs.take(len);
                buf[m * BLOCK_SIZE..k * BLOCK_SIZE].fill(0);
                let st = match role {
                    RegionRole::Gc => &mut self.cleaner.streams[s],
                    _ => &mut self.compactor.streams[s],
                };
                for j in 0..m {
                    buf[j * BLOCK_SIZE..(j + 1) * BLOCK_SIZE].copy_from_slice(st.block(j));
                }
                let entries: Vec<RelocEntry> = st.entries.iter().take(m).copied().collect();
                st.consume(m, &mut self.bufs);
                (buf, entries)
            }
        };
        let mut md_entries = Vec::with_capacity(k);
        md_entries.extend(entries.iter().map(|e| MdEntry {
            kind: EntryKind::Relocated,
            volume: e.volume,
            lba: e.lba,
            sid: e.sid,
            data_crc: e.crc,
            source: e.source,
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
        buf[k * BLOCK_SIZE..(k + 1) * BLOCK_SIZE].copy_from_slice(&md[..]);
        buf[(k + 1) * BLOCK_SIZE..(k + 2) * BLOCK_SIZE].copy_from_slice(&md[..]);

        let max_io =
            (self.capacity.geometry().max_io_bytes as usize / BLOCK_SIZE).max(1) * BLOCK_SIZE;
        let parts = (len * BLOCK_SIZE).div_ceil(max_io);
        let first_slot = groups.start(g);
        let zw = ZoneWrite {
            zone,
            group: g,
            first_slot,
            entries,
            md,
            parts_left: parts as u32,
        };
        let w = match self.zone_writes.iter().position(Option::is_none) {
            Some(i) => {
                self.zone_writes[i] = Some(zw);
                i
            }
            None => {
                self.zone_writes.push(Some(zw));
                self.zone_writes.len() - 1
            }
        } as u32;
        let base = self.geo.zone_offset(zone, first_slot);
        if parts == 1 {
            let tag = self.io.insert(InflightIo::ZonePart { write: w });
            self.capacity.submit(ZoneRequest {
                tag,
                op: ZoneOp::Write {
                    offset: base,
                    buf,
                    fua: false,
                },
            });
        } else {
            for p in 0..parts {
                let lo = p * max_io;
                let hi = (lo + max_io).min(len * BLOCK_SIZE);
                let mut part = self.bufs.take((hi - lo) / BLOCK_SIZE);
                part.copy_from_slice(&buf[lo..hi]);
                let tag = self.io.insert(InflightIo::ZonePart { write: w });
                self.capacity.submit(ZoneRequest {
                    tag,
                    op: ZoneOp::Write {
                        offset: base + lo as u64,
                        buf: part,
                        fua: false,
                    },
                });
            }
            self.bufs.give(buf);
        }
        let reg = self.regions.get_mut(zone);
        reg.inflight_writes += 1;
        reg.wp = if g + 1 < groups.count() {
            groups.start(g + 1)
        } else {
            groups.end()
        };
        if reg.wp >= groups.end() {
            self.mover(role).streams[s].zone = None;
        }
        let bytes = (len * BLOCK_SIZE) as u64;
        if role == RegionRole::Gc {
            self.stats.capacity_gc_write_bytes += bytes;
        } else {
            self.stats.capacity_compaction_write_bytes += bytes;
        }
        self.stats.capacity_pad_bytes += ((k - m) * BLOCK_SIZE) as u64;
        self.capacity_dirty = true;
        Ok(true)
    }

    pub(crate) fn on_zone_part_done(&mut self, w: u32) -> Result<(), EngineError> {
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
        let gc = self.regions.get(zw.zone).role == RegionRole::Gc;
        for (i, e) in zw.entries.iter().enumerate() {
            let new = self.geo.pba(zw.zone, zw.first_slot + i as u32);
            let Some((src, _)) = self.geo.region_slot(e.source) else {
                panic!("relocation source {} outside the data regions", e.source);
            };
            self.regions.get_mut(src).relocations -= 1;
            // The source's validity bit says whether the entry still points at it
            // (a PBA is valid exactly when one L2P entry maps it), so the switch needs
            // no page: it is deferred if the page is not cached.
            if self.regions.validity.get(e.source) {
                self.regions.mark_valid(&self.geo, new);
                self.l2p.relocate(&mut self.cache, e.volume, e.lba, new)?;
                self.regions.mark_invalid(&self.geo, e.source);
                self.stats.relocated_blocks += 1;
                let c = self.volume_counters(e.volume);
                if gc {
                    c.capacity_gc_write_bytes += BS;
                } else {
                    c.capacity_compaction_write_bytes += BS;
                }
            } else {
                self.stats.relocations_superseded += 1;
                self.regions.maybe_pending_free(src);
            }
        }
        let groups = Groups {
            blocks: self.geo.zone_cap_blocks,
        };
        let md_a = self.geo.pba(zw.zone, groups.md_slot(zw.group));
        self.md_cache.insert(md_a.0, &zw.md[..]);
        self.regions.get_mut(zw.zone).inflight_writes -= 1;
        let now = self.now();
        if self.regions.try_close(&self.geo, zw.zone, false, now) {
            self.journal
                .append(JournalRecord::RegionClosed { region: zw.zone });
            if groups.end() < self.geo.zone_cap_blocks {
                let z = self.geo.zone_of(zw.zone).0;
                self.capacity
                    .manage(z, ZoneAction::Finish)
                    .map_err(EngineError::capacity(
                        "zone finish",
                        self.geo.zone_offset(zw.zone, 0),
                    ))?;
            }
        }
        Ok(())
    }

    /// Candidates for a mover: closed, not already being drained.
    fn snapshot(&mut self, role: RegionRole) -> Vec<RegionSnapshot> {
        let mut snap = std::mem::take(&mut self.mover(role).snapshot);
        snap.clear();
        let range = if role == RegionRole::Gc {
            self.geo.chunk_count + 1..self.geo.region_count()
        } else {
            0..self.geo.chunk_count
        };
        for r in range.map(RegionId) {
            let reg = self.regions.get(r);
            if reg.state == RegionState::Closed && !reg.draining {
                snap.push(RegionSnapshot {
                    region: r,
                    valid: reg.valid,
                    capacity: Groups {
                        blocks: self.geo.region_blocks(r),
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
    pub(crate) fn mover_step(&mut self, role: RegionRole) -> Result<bool, EngineError> {
        let mut progress = false;
        let streams = self.streams as usize;
        for s in 0..streams {
            progress |= self.write_stream_group(role, s, false)?;
        }
        if self
            .mover(role)
            .streams
            .iter()
            .any(|s| s.len() > GROUP_DATA_SLOTS)
        {
            return Ok(progress);
        }
        // Bounded read-ahead: a few victim groups in flight per mover.
        if self.mover(role).reads_in_flight() >= self.config.background_steps_per_poll_max as usize
        {
            return Ok(progress);
        }
        if self.mover(role).victim.is_none() {
            let snap = self.snapshot(role);
            let now = self.now();
            let choice = self.mover(role).policy.choose(&snap, now);
            self.mover(role).snapshot = snap;
            let Some(v) = choice else { return Ok(progress) };
            self.regions.get_mut(v).draining = true;
            let m = self.mover(role);
            m.victim = Some(v);
            m.cursor = 0;
        }
        let Some(victim) = self.mover(role).victim else {
            return Ok(progress);
        };
        // Overwrites and trims may have emptied the victim before the mover reached its
        // end: it is then PendingFree (or already reused) and must not be read again.
        let v = self.regions.get(victim);
        if v.state != RegionState::Closed || !v.draining {
            self.mover(role).victim = None;
            return Ok(true);
        }
        let groups = Groups {
            blocks: self.geo.region_blocks(victim),
        };
        loop {
            let g = self.mover(role).cursor;
            if g >= groups.count() {
                // The victim is done once its last group reads have been staged.
                if self.mover(role).reads_in_flight_for(victim) {
                    return Ok(progress);
                }
                self.mover(role).victim = None;
                if role == RegionRole::Gc {
                    self.stats.gc_victims += 1;
                } else {
                    self.stats.compaction_victims += 1;
                }
                self.regions.maybe_pending_free(victim);
                self.release_hostages(role)?;
                return Ok(true);
            }
            self.mover(role).cursor += 1;
            let start = self.geo.pba(victim, groups.start(g));
            let k = groups.data_slots(g);
            if self.regions.validity.count_range(start, k) == 0 {
                continue;
            }
            self.read_victim_group(role, victim, g)?;
            break;
        }
        for s in 0..streams {
            self.write_stream_group(role, s, false)?;
        }
        Ok(true)
    }

    /// Submits the reads of one victim group: whole when mostly valid, else md + valid
    /// runs. The mover waits for them (one group in flight per mover).
    fn read_victim_group(
        &mut self,
        role: RegionRole,
        victim: RegionId,
        g: u32,
    ) -> Result<(), EngineError> {
        let groups = Groups {
            blocks: self.geo.region_blocks(victim),
        };
        let len = groups.len(g) as usize;
        let k = groups.data_slots(g) as usize;
        let slot0 = groups.start(g);
        let base = self.geo.pba(victim, slot0);
        let valid = self.regions.validity.count_range(base, k as u32) as usize;
        let mut ranges: Vec<(usize, usize)> = Vec::new();
        if valid * 2 >= k {
            ranges.push((0, len));
        } else {
            // Valid runs, merged across gaps of up to READ_GAP_BLOCKS (one larger read
            // beats several small ones), cut into power-of-two pieces so the buffer pool
            // needs only a few sizes.
            let mut runs: Vec<(usize, usize)> = Vec::new();
            for i in 0..k {
                if self.regions.validity.get(Pba(base.0 + i as u32)) {
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
        let gc = role == RegionRole::Gc;
        let is_chunk = self.geo.is_chunk(victim);
        let read = GroupRead {
            victim,
            group: g,
            parts: ranges.iter().map(|&(lo, _)| (lo, None)).collect(),
            left: ranges.len() as u32,
        };
        let m = self.mover(role);
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
            let buf = self.bufs.take(hi - lo);
            let bytes = buf.len() as u64;
            let first = slot0 + lo as u32;
            let tag = self.io.insert(InflightIo::MoverRead {
                gc,
                read: slot,
                part: part as u16,
            });
            if is_chunk {
                let offset = self.geo.chunk_offset(victim, first);
                self.stats.cache_read_bytes += bytes;
                self.cache.submit(IoRequest {
                    tag,
                    op: IoOp::Read { offset, buf },
                });
            } else {
                let offset = self.geo.zone_offset(victim, first);
                self.stats.capacity_read_bytes += bytes;
                self.capacity.submit(ZoneRequest {
                    tag,
                    op: ZoneOp::Read { offset, buf },
                });
            }
        }
        Ok(())
    }

    /// One piece of a victim group read arrived; the last one stages the group.
    pub(crate) fn on_mover_read_done(
        &mut self,
        gc: bool,
        read: u16,
        part: u16,
        buf: Option<IoBuf>,
    ) -> Result<(), EngineError> {
        let role = if gc {
            RegionRole::Gc
        } else {
            RegionRole::Compaction
        };
        let Some(buf) = buf else {
            panic!("mover read completed without its buffer")
        };
        let m = self.mover(role);
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
        let v = self.regions.get(r.victim);
        if v.state == RegionState::Closed && v.draining && self.mover(role).victim == Some(r.victim)
        {
            self.stage_victim_group(role, r.victim, r.group, &r.parts)?;
        }
        for (_, b) in r.parts {
            if let Some(b) = b {
                self.bufs.give(b);
            }
        }
        for s in 0..self.streams as usize {
            self.write_stream_group(role, s, false)?;
        }
        Ok(())
    }

    fn stage_victim_group(
        &mut self,
        role: RegionRole,
        victim: RegionId,
        g: u32,
        parts: &[(usize, Option<IoBuf>)],
    ) -> Result<(), EngineError> {
        let groups = Groups {
            blocks: self.geo.region_blocks(victim),
        };
        let len = groups.len(g) as usize;
        let k = groups.data_slots(g) as usize;
        let slot0 = groups.start(g);
        debug_assert!(len >= k + 2);
        let md_at = |c: usize| (slot0 as usize + k + c) as u64 * BS;
        let sid = self.regions.get(victim).sid;
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
                self.stats.crc_errors += 1;
                None
            }
        };
        if let Some(c) = pick {
            let md = if c == 0 { md_a } else { md_b };
            let streams = self.streams;
            let verify = role == RegionRole::Gc || self.config.verify_compaction_reads;
            let mut reread = [0u8; BLOCK_SIZE];
            for i in 0..k {
                let pba = self.geo.pba(victim, slot0 + i as u32);
                if !self.regions.validity.get(pba) {
                    continue;
                }
                let Ok(e) = decode_md_entry(md, i, 0) else {
                    continue;
                };
                if !matches!(e.kind, EntryKind::Data | EntryKind::Relocated) {
                    self.stats.crc_errors += 1;
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
                    if self.reread_block(victim, slot0 + i as u32, &mut reread)
                        && shale_format::block_crc(&reread[..]) == e.data_crc
                    {
                        self.stats.crc_reread_fixes += 1;
                        tracing::warn!(%pba, "victim block read back corrupt; a second read was good");
                        data = &reread[..];
                    } else {
                        self.stats.crc_errors += 1;
                        tracing::warn!(%pba, "relocating a block whose data CRC does not match its md (it stays detectable: the copy keeps the original CRC)");
                    }
                }
                let s = (e.volume.0 % streams) as usize;
                let entry = RelocEntry {
                    volume: e.volume,
                    lba: e.lba,
                    sid: e.sid,
                    crc: e.data_crc,
                    source: pba,
                };
                let st = match role {
                    RegionRole::Gc => &mut self.cleaner.streams[s],
                    _ => &mut self.compactor.streams[s],
                };
                st.push(entry, data, &mut self.bufs);
                self.regions.get_mut(victim).relocations += 1;
            }
        }
        Ok(())
    }

    /// Reads one block of a victim again, synchronously. False on a read error.
    fn reread_block(&mut self, region: RegionId, slot: u32, out: &mut [u8; BLOCK_SIZE]) -> bool {
        if self.geo.is_chunk(region) {
            let off = self.geo.chunk_offset(region, slot);
            self.stats.cache_read_bytes += BS;
            self.cache.read_at(off, &mut out[..]).is_ok()
        } else {
            let off = self.geo.zone_offset(region, slot);
            self.stats.capacity_read_bytes += BS;
            self.capacity.read_at(off, &mut out[..]).is_ok()
        }
    }

    /// Drops staged blocks whose source was overwritten or trimmed since they were
    /// read: written, they would only be born invalid. Their sources may now be
    /// freed (after a durability point, as always).
    fn drop_superseded(&mut self, role: RegionRole, s: usize) {
        let st = match role {
            RegionRole::Gc => &mut self.cleaner.streams[s],
            _ => &mut self.compactor.streams[s],
        };
        let validity = &self.regions.validity;
        if st.entries.iter().all(|e| validity.get(e.source)) {
            return;
        }
        let dropped = st.retain(&mut self.bufs, |e| validity.get(e.source));
        for e in dropped {
            if let Some((src, _)) = self.geo.region_slot(e.source) {
                self.regions.get_mut(src).relocations -= 1;
                self.regions.maybe_pending_free(src);
            }
            self.stats.relocations_superseded += 1;
        }
    }

    /// Pads out partial batches when the space they hold hostage is needed now and no
    /// other victim could fill them instead (padding costs capacity writes).
    fn release_hostages(&mut self, role: RegionRole) -> Result<(), EngineError> {
        let short = if role == RegionRole::Gc {
            self.regions.free_zones.len() <= 1
        } else {
            self.regions.free_chunks.is_empty()
        };
        if !short {
            return Ok(());
        }
        let snap = self.snapshot(role);
        let now = self.now();
        let other = self.mover(role).policy.choose(&snap, now);
        self.mover(role).snapshot = snap;
        if other.is_none() {
            self.pad_streams(role)?;
        }
        Ok(())
    }

    pub(crate) fn pad_streams(&mut self, role: RegionRole) -> Result<bool, EngineError> {
        let mut any = false;
        for s in 0..self.streams as usize {
            while !self.mover(role).streams[s].is_empty() {
                if !self.write_stream_group(role, s, true)? {
                    break;
                }
                any = true;
            }
        }
        Ok(any)
    }
}
