//! Direct writes: large writes that go straight to a zone instead of through the cache,
//! so each of their bytes is written once instead of three times (cache write, the
//! compaction's read, the zone write).
//!
//! A direct write takes one slot of the open user chunk (a pad block): its position in
//! the order of user writes. Its blocks are staged in the compaction stream placement
//! names for the volume, beside compaction's relocations, and leave with them in whole
//! zone groups whose md gives each block its `Direct` entry: volume, LBA, the chunk's
//! SID and the slot. Recovery ranks such a block at that `(SID, slot)`, as if it were
//! the user write in that slot, and a GC copy keeps the key (docs/recovery.md).
//!
//! Invariants:
//! - `latest` names, for each LBA with a direct block staged or being written, the
//!   direct write whose block is the newest version of it. A user write, trim or
//!   write-zeroes of the LBA, a volume delete or shrink, or a newer direct write
//!   replaces or removes the entry, so a block that is no longer the newest is never
//!   mapped: the mapping happens when its zone write completes, only if the entry
//!   still names its write.
//! - The user chunk holding a direct write's slot is not compacted while the write has
//!   blocks not yet mapped or superseded (`chunk_busy`): compaction's copies rank
//!   `(SID, MAX)`, above every slot of their chunk, so a copy of an older write of
//!   the same LBA made meanwhile would outrank the direct block in recovery.
//! - A staged direct block that is no longer the newest is dropped before a
//!   checkpoint (with relocations whose source went): recovery ranks every replayed
//!   version above the checkpoint's L2P.
//! - Requests are served in order: a read or block-status query of a block a direct
//!   write still carries waits until it is mapped (or moved to the cache), as does a
//!   write that would read it to merge a partial block.
//! - A direct write whose block a newer direct write superseded before it was mapped
//!   waits for that write to be done too: its own block never reached the media, and
//!   the newer one is still in DRAM, so answering it early could leave a crash with
//!   neither (a newer user write or trim needs no wait: the durability point that
//!   answers covers them).
//! - A direct write is answered after its blocks are mapped (or superseded) and then
//!   a durability point: its blocks are claimed by the journal only there, so until
//!   then a kill of the process would lose them (the hand-off image claims chunks
//!   only).
//! - Blocks staged longer than `Config::direct_linger_us` without filling a group (or
//!   when nothing else could fill it) are written to the cache instead, as user writes
//!   at the current position: every write of their LBAs since was seen by `latest`,
//!   so the newest data still wins. With no room in the cache, their group leaves
//!   padded: compaction, which would make room, may be waiting for them.

use std::collections::HashMap;

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Lba, Pba, RegionId, VolumeId, BLOCK_SIZE};

use crate::engine::Engine;
use crate::hash::{pack, unpack, U64Map};
use crate::layout::BS;
use crate::mover::{RelocEntry, RELOCATED_POS};
use crate::request::Answer;
use crate::write::sequential::SequentialStreams;
use crate::DirectWritePolicy;
use crate::{Clock, EngineError};

/// A staged entry that is no direct write's block.
pub(crate) const NO_DIRECT: u32 = u32::MAX;

/// Staged direct blocks at most (beyond it, large writes go through the cache): 16
/// groups, 8 MiB of buffers.
pub(crate) const DIRECT_STAGED_MAX: usize = 16 * shale_format::GROUP_DATA_SLOTS;

#[derive(Debug)]
struct DirectWrite {
    /// Blocks neither mapped nor superseded yet.
    left: u32,
    /// The user chunk whose slot the write took.
    chunk: RegionId,
    /// Cache appends of blocks moved to the cache: the write waits for the ASN
    /// watermark to pass this.
    asn_end: u64,
    /// Engine clock when it was staged.
    staged_at: u64,
    done: Option<Answer>,
    /// Newer direct writes that superseded a block of this one before it was
    /// written or mapped, and are not done yet: this one waits for them, since its
    /// own block never reached the media.
    blockers: u32,
    /// Older writes waiting for this one (see `blockers`).
    dependents: Vec<u32>,
}

#[derive(Debug, Default)]
pub(crate) struct Directs {
    writes: Vec<Option<DirectWrite>>,
    free: Vec<u32>,
    latest: U64Map<u32>,
    /// Direct blocks staged or being written (the entries of `latest` and the
    /// superseded ones still staged).
    pub blocks: usize,
    /// Writes whose blocks are all settled, waiting for their cache appends (moved
    /// blocks) before the durability point answers them.
    pub settled: Vec<u32>,
    /// Per user chunk, the writes with a slot in it and blocks not yet settled.
    busy: HashMap<u32, u32>,
    /// Where large writes ended (`DirectWritePolicy::Sequential`).
    pub sequential: SequentialStreams,
}

fn key(volume: VolumeId, lba: Lba) -> u64 {
    pack(volume, lba.0)
}

impl Directs {
    /// No direct write in progress.
    pub fn is_empty(&self) -> bool {
        self.writes.len() == self.free.len()
    }

    /// Starts a write of `n` blocks that took a slot of `chunk`; returns its id.
    pub fn begin(&mut self, chunk: RegionId, n: u32, now: u64, done: Answer) -> u32 {
        let w = DirectWrite {
            left: n,
            chunk,
            asn_end: 0,
            staged_at: now,
            done: Some(done),
            blockers: 0,
            dependents: Vec::new(),
        };
        self.blocks += n as usize;
        *self.busy.entry(chunk.0).or_default() += 1;
        match self.free.pop() {
            Some(i) => {
                self.writes[i as usize] = Some(w);
                i
            }
            None => {
                self.writes.push(Some(w));
                (self.writes.len() - 1) as u32
            }
        }
    }

    /// Block `lba` of write `id` is now the newest version of its LBA.
    pub fn claim(&mut self, id: u32, volume: VolumeId, lba: Lba) {
        let Some(old) = self.latest.insert(key(volume, lba), id) else {
            return;
        };
        // The older write's block of this LBA will not be mapped, and this one's is
        // still in DRAM: the older write is answered only once this one is done, so
        // an answered write never depends on data a crash can take.
        if old != id {
            if let Some(w) = self.writes.get_mut(old as usize).and_then(Option::as_mut) {
                w.blockers += 1;
            }
            if let Some(w) = self.writes.get_mut(id as usize).and_then(Option::as_mut) {
                w.dependents.push(old);
            }
        }
    }

    /// Whether a direct block of `lba` is staged or being written and the newest.
    pub fn pending(&self, volume: VolumeId, lba: Lba) -> bool {
        !self.latest.is_empty() && self.latest.contains_key(&key(volume, lba))
    }

    /// Whether write `id`'s block is still the newest version of `lba`.
    pub fn is_latest(&self, id: u32, volume: VolumeId, lba: Lba) -> bool {
        self.latest.get(&key(volume, lba)) == Some(&id)
    }

    /// A user write or trim of `lba` supersedes any direct block of it.
    pub fn supersede(&mut self, volume: VolumeId, lba: Lba) {
        if !self.latest.is_empty() {
            self.latest.remove(&key(volume, lba));
        }
    }

    /// A trim, volume delete or shrink of `first..end` supersedes its direct blocks.
    pub fn supersede_range(&mut self, volume: VolumeId, first: u64, end: u64) {
        if self.latest.is_empty() {
            return;
        }
        if end - first <= self.latest.len() as u64 {
            for l in first..end {
                self.latest.remove(&key(volume, Lba(l)));
            }
        } else {
            self.latest.retain(|&k, _| {
                let (v, lba) = unpack(k);
                !(v == volume && lba >= first && lba < end)
            });
        }
    }

    /// One block of write `id` settled (mapped, superseded or moved to the cache);
    /// its entry in `latest` is gone if it named this write. Returns true when it was
    /// the write's last.
    pub fn settle(&mut self, id: u32, volume: VolumeId, lba: Lba) -> bool {
        let k = key(volume, lba);
        if self.latest.get(&k) == Some(&id) {
            self.latest.remove(&k);
        }
        // After a failure took every write, late completions find none.
        let Some(w) = self.writes.get_mut(id as usize).and_then(Option::as_mut) else {
            return false;
        };
        self.blocks -= 1;
        w.left -= 1;
        if w.left > 0 {
            return false;
        }
        let chunk = w.chunk.0;
        if let Some(n) = self.busy.get_mut(&chunk) {
            *n -= 1;
            if *n == 0 {
                self.busy.remove(&chunk);
            }
        }
        self.maybe_ready(id);
        true
    }

    /// A write whose blocks all settled and that waits for no newer write is ready
    /// for the durability point that answers it; the writes waiting for it may then
    /// be too.
    fn maybe_ready(&mut self, id: u32) {
        let mut work = vec![id];
        while let Some(id) = work.pop() {
            let Some(w) = self.writes.get_mut(id as usize).and_then(Option::as_mut) else {
                continue;
            };
            if w.left > 0 || w.blockers > 0 {
                continue;
            }
            self.settled.push(id);
            for d in std::mem::take(&mut w.dependents) {
                if let Some(dw) = self.writes.get_mut(d as usize).and_then(Option::as_mut) {
                    dw.blockers -= 1;
                    if dw.blockers == 0 {
                        work.push(d);
                    }
                }
            }
        }
    }

    /// Write `id` waits for cache appends up to `asn_end`.
    pub fn wait_for_cache(&mut self, id: u32, asn_end: u64) {
        if let Some(w) = self.writes.get_mut(id as usize).and_then(Option::as_mut) {
            w.asn_end = w.asn_end.max(asn_end);
        }
    }

    /// Takes the answers of settled writes whose cache appends completed (`watermark`:
    /// every ASN below it is on the device).
    pub fn take_done(&mut self, watermark: u64) -> Vec<Answer> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.settled.len() {
            let id = self.settled[i];
            let ready = self.writes[id as usize]
                .as_ref()
                .is_some_and(|w| w.asn_end <= watermark);
            if !ready {
                i += 1;
                continue;
            }
            self.settled.swap_remove(i);
            if let Some(mut w) = self.writes[id as usize].take() {
                self.free.push(id);
                if let Some(d) = w.done.take() {
                    out.push(d);
                }
            }
        }
        out
    }

    /// Whether a write with blocks still staged or being written took a slot of
    /// `chunk` (which compaction must then leave alone).
    pub fn chunk_busy(&self, chunk: RegionId) -> bool {
        !self.busy.is_empty() && self.busy.contains_key(&chunk.0)
    }

    /// Whether write `id` was staged before `deadline` (engine clock).
    pub fn staged_before(&self, id: u32, deadline: u64) -> bool {
        self.writes
            .get(id as usize)
            .and_then(Option::as_ref)
            .is_some_and(|w| w.staged_at < deadline)
    }

    /// The answers of every write in progress (the engine failed: they get its error).
    pub fn take_all(&mut self) -> Vec<Answer> {
        self.latest.clear();
        self.settled.clear();
        self.busy.clear();
        self.blocks = 0;
        self.free.clear();
        let out = self
            .writes
            .drain(..)
            .flatten()
            .filter_map(|mut w| w.done.take())
            .collect();
        out
    }
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Whether a write of `len` bytes at `offset` goes straight to a zone: large
    /// enough, whole blocks, and room to stage it.
    pub(crate) fn takes_direct(&self, volume: VolumeId, offset: u64, len: u64) -> bool {
        let min = self.core.config.direct_write_min_bytes;
        // A volume mapped in units keeps each unit's blocks together, which the
        // direct path (a block per slot of any zone group) does not: its writes take
        // the cache.
        min != 0
            && len >= min
            && self.core.volumes.shift(volume) == 0
            && offset.is_multiple_of(BS)
            && len.is_multiple_of(BS)
            && self.core.directs.blocks + (len / BS) as usize <= DIRECT_STAGED_MAX
            && match self.core.config.direct_write_policy {
                DirectWritePolicy::Any => true,
                DirectWritePolicy::Sequential => self.core.directs.sequential.continues(
                    volume,
                    offset / BS,
                    self.core.config.direct_run_min_bytes.div_ceil(BS),
                ),
            }
    }

    /// A write of `offset..offset + len` was taken (into the cache or straight to a
    /// zone): a large one extends its volume's sequential stream.
    pub(crate) fn note_write(&mut self, volume: VolumeId, offset: u64, len: u64) {
        let min = self.core.config.direct_write_min_bytes;
        if min != 0
            && len >= min
            && self.core.config.direct_write_policy == DirectWritePolicy::Sequential
        {
            self.core
                .directs
                .sequential
                // Saturating: a write out of the volume's range was answered with
                // an error but is still noted, whatever its offset.
                .note(volume, offset / BS, offset.saturating_add(len).div_ceil(BS));
        }
    }

    /// A write whose partial edge blocks would be read and merged while a direct
    /// write of them is on its way waits for it: the merge must see its data.
    pub(crate) fn edges_wait_for_directs(&self, volume: VolumeId, offset: u64, len: u64) -> bool {
        if self.core.directs.is_empty() || len == 0 {
            return false;
        }
        let end = offset + len;
        (!offset.is_multiple_of(BS) && self.core.directs.pending(volume, Lba(offset / BS)))
            || (!end.is_multiple_of(BS) && self.core.directs.pending(volume, Lba(end / BS)))
    }

    /// Whether a block of `offset..offset + len` is carried by a direct write not yet
    /// mapped: a read of it waits, so it sees the write like any write before it.
    pub(crate) fn range_waits_for_directs(&self, volume: VolumeId, offset: u64, len: u64) -> bool {
        if self.core.directs.is_empty() || len == 0 {
            return false;
        }
        let end = offset.saturating_add(len).div_ceil(BS);
        (offset / BS..end).any(|l| self.core.directs.pending(volume, Lba(l)))
    }

    /// Starts a direct write (the caller checked `takes_direct`): a pad block takes its
    /// slot in the open chunk, and its blocks are staged in the volume's compaction
    /// stream. Gives the data back if the cache has no room for the pad yet.
    pub(crate) fn start_direct(
        &mut self,
        volume: VolumeId,
        offset: u64,
        data: Vec<u8>,
        done: Answer,
    ) -> Result<Option<(Vec<u8>, Answer)>, EngineError> {
        let core = &mut self.core;
        let len = data.len() as u64;
        if let Err(e) = core.validate_range(volume, offset, len, true) {
            done.send(Err(e));
            return Ok(None);
        }
        if !self.writer.can_append(1, core.regions.free_chunks.len()) {
            return Ok(Some((data, done)));
        }
        let pad = self.writer.append_pad(core);
        let Some((chunk, pos)) = core.geo.region_slot(pad) else {
            unreachable!("a pad lands in a chunk");
        };
        debug_assert_ne!(pos, RELOCATED_POS);
        let sid = core.regions.get(chunk).sid;
        let n = (len / BS) as u32;
        let now = core.now();
        let id = core.directs.begin(chunk, n, now, done);
        let s = core
            .placement
            .compaction_stream(volume, Pba::NONE, core.streams);
        for (i, b) in data.chunks_exact(BLOCK_SIZE).enumerate() {
            let lba = Lba(offset / BS + i as u64);
            core.directs.claim(id, volume, lba);
            let entry = RelocEntry {
                volume,
                lba,
                sid,
                crc: shale_format::block_crc(b),
                source: Pba::NONE,
                pos,
                direct: id,
                shift: 0,
            };
            self.compaction.stage_direct(core, s, entry, b);
        }
        core.stats.user_write_bytes += len;
        core.stats.direct_write_bytes += len;
        let c = core.volume_counters(volume);
        c.write_ops += 1;
        c.user_write_bytes += len;
        let (m, core, floor) = self.mover_with_core(false);
        m.write_stream_group(core, floor, s, false)?;
        Ok(None)
    }

    /// Direct writes whose blocks all settled (and whose blocks moved to the cache
    /// are on the device) wait for the next durability point, which answers them.
    pub(crate) fn settle_directs(&mut self) {
        if self.core.directs.settled.is_empty() {
            return;
        }
        let done = self.core.directs.take_done(self.writer.runs.watermark());
        if !done.is_empty() {
            self.durability.waiters.extend(done);
            self.durability.requested = true;
        }
    }

    /// Direct blocks that waited `Config::direct_linger_us` without filling a group,
    /// or any when nothing else is coming (no I/O in flight, nothing to take), go to
    /// the cache as user writes at the current position. Returns true if any did.
    pub(crate) fn linger_directs(&mut self) -> Result<bool, EngineError> {
        if self.core.directs.blocks == 0 {
            return Ok(false);
        }
        // Full groups whose zone was refused before (the GC reserve) try again.
        for s in 0..self.core.streams as usize {
            if self.compaction.streams[s].len() >= shale_format::GROUP_DATA_SLOTS {
                let (m, core, floor) = self.mover_with_core(false);
                m.write_stream_group(core, floor, s, false)?;
            }
        }
        let now = self.core.now();
        // Nothing is on its way to fill a group: no I/O in flight, and no request
        // waiting to be taken (or the next one waits, possibly for these blocks).
        let quiet = self.core.io.count == 0 && (self.queue.is_empty() || self.health.user_blocked);
        let deadline = now.saturating_sub(self.core.config.direct_linger_us.saturating_mul(1000));
        let mut moved = false;
        for s in 0..self.core.streams as usize {
            let due = self
                .compaction
                .directs_lingering(&self.core, s, Some(deadline))
                || (quiet && self.compaction.directs_lingering(&self.core, s, None));
            if !due {
                continue;
            }
            let directs = self.compaction.streams[s]
                .entries
                .iter()
                .filter(|e| e.is_fresh_direct())
                .count() as u64;
            if !self
                .writer
                .can_append(directs, self.core.regions.free_chunks.len())
            {
                // No room in the cache: the group leaves padded instead (compaction
                // may be waiting for these very blocks, whose chunk slots it leaves
                // alone until they are mapped).
                let (m, core, floor) = self.mover_with_core(false);
                moved |= m.write_stream_group(core, floor, s, true)?;
                continue;
            }
            let mut blocks: Vec<(RelocEntry, Box<[u8; BLOCK_SIZE]>)> = Vec::new();
            self.compaction.take_directs(&mut self.core, s, |e, data| {
                let mut b = Box::new([0u8; BLOCK_SIZE]);
                b.copy_from_slice(data);
                blocks.push((e, b));
            });
            for (e, b) in blocks {
                self.writer
                    .map_new_block(&mut self.core, e.volume, e.lba, &b[..])?;
                self.core.stats.direct_blocks_to_cache += 1;
                self.core.directs.settle(e.direct, e.volume, e.lba);
                self.core
                    .directs
                    .wait_for_cache(e.direct, self.writer.asn_next);
                moved = true;
            }
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer() -> (Answer, std::sync::mpsc::Receiver<()>) {
        let (tx, rx) = std::sync::mpsc::channel();
        (
            Answer::new(Box::new(move |_| {
                let _ = tx.send(());
            })),
            rx,
        )
    }

    #[test]
    fn a_write_is_done_once_every_block_settled_and_its_cache_part_landed() {
        let mut d = Directs::default();
        let (a, _rx) = answer();
        let id = d.begin(RegionId(3), 2, 0, a);
        d.claim(id, VolumeId(1), Lba(10));
        d.claim(id, VolumeId(1), Lba(11));
        assert!(d.chunk_busy(RegionId(3)) && !d.chunk_busy(RegionId(4)));
        assert!(!d.settle(id, VolumeId(1), Lba(10)));
        d.wait_for_cache(id, 7);
        assert!(d.settle(id, VolumeId(1), Lba(11)));
        assert!(!d.chunk_busy(RegionId(3)));
        assert!(d.take_done(6).is_empty());
        assert_eq!(d.take_done(7).len(), 1);
        assert!(d.is_empty() && d.blocks == 0);
    }

    /// A write whose block a newer direct write superseded before it reached a zone
    /// is answered only after the newer one is done: its own data never reached the
    /// media, so a crash before the newer write lands would leave neither.
    #[test]
    fn a_write_superseded_by_a_newer_direct_waits_for_it() {
        let mut d = Directs::default();
        let (a, _ra) = answer();
        let (b, _rb) = answer();
        let old = d.begin(RegionId(0), 2, 0, a);
        d.claim(old, VolumeId(1), Lba(5));
        d.claim(old, VolumeId(1), Lba(6));
        let new = d.begin(RegionId(0), 1, 0, b);
        d.claim(new, VolumeId(1), Lba(6));
        d.settle(old, VolumeId(1), Lba(5));
        d.settle(old, VolumeId(1), Lba(6));
        assert!(d.take_done(u64::MAX).is_empty(), "the older write waits");
        d.settle(new, VolumeId(1), Lba(6));
        assert_eq!(d.take_done(u64::MAX).len(), 2);
        assert!(d.is_empty());
    }

    #[test]
    fn newer_writes_and_volume_changes_supersede_blocks() {
        let mut d = Directs::default();
        let (a, _ra) = answer();
        let (b, _rb) = answer();
        let w1 = d.begin(RegionId(0), 3, 0, a);
        for l in 0..3 {
            d.claim(w1, VolumeId(2), Lba(l));
        }
        let w2 = d.begin(RegionId(0), 1, 0, b);
        d.claim(w2, VolumeId(2), Lba(1));
        assert!(d.is_latest(w1, VolumeId(2), Lba(0)));
        assert!(!d.is_latest(w1, VolumeId(2), Lba(1)));
        assert!(d.is_latest(w2, VolumeId(2), Lba(1)));
        d.supersede(VolumeId(2), Lba(0));
        assert!(!d.is_latest(w1, VolumeId(2), Lba(0)));
        d.supersede_range(VolumeId(2), 2, u64::MAX >> 6);
        assert!(!d.is_latest(w1, VolumeId(2), Lba(2)));
        assert!(d.is_latest(w2, VolumeId(2), Lba(1)));
        // Settling w1's superseded copy of LBA 1 leaves w2's entry alone.
        d.settle(w1, VolumeId(2), Lba(1));
        assert!(d.is_latest(w2, VolumeId(2), Lba(1)));
    }
}
