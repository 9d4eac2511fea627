//! The L2P page cache: an intrusive LRU of frames, no hashing on the lookup path
//! (volume map -> frame index).

use shale_device::{BlockDevice, IoBuf, IoOp, IoRequest};
use shale_format::{L2pFormat, L2pSwitch, Lba, PageDesc, Pba, VolumeId, L2P_SLOT_NONE};

use super::deferred::{Deferred, LINK_NONE};
use super::directory::{VolumeMap, DEFERRED_BIT, FRAME_NONE};
use super::pool::PagePool;
use crate::layout::BS;
use crate::recovery::Meter;
use crate::EngineError;

/// Dirty pages `write_back_all` has in flight at once.
const WRITE_BACK_BATCH: usize = 64;
/// Marks `write_back_all`'s tags, apart from every engine I/O tag (slab indices), so
/// a write left in flight by a failed poll can never be taken for one of them.
const WRITE_BACK_TAG: u64 = 1 << 63;

/// Where one dirty page is being written back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WriteBackTarget {
    /// L2P area slot (two per pool page).
    pub(super) slot: u32,
    /// The slot's pool page was taken from the free pool for this write.
    pub(super) new_pool_page: bool,
    pub(super) crc32c: u32,
}

impl WriteBackTarget {
    pub(super) fn offset(&self, area_start: u64) -> u64 {
        (area_start + u64::from(self.slot)) * BS
    }
}

/// (volume, page): an L2P page of a volume.
type PageKey = (u32, u32);

/// Decoded-page buffers hold this many entries (the most a page has at any width).
pub(crate) const MAX_EPP: usize = L2pFormat::MAX_ENTRIES_PER_PAGE;

#[derive(Debug)]
pub(super) struct Frame {
    pub(super) volume: u32,
    pub(super) page: u32,
    /// Dirty when the checkpoint in progress began: must be written before it commits.
    pub(super) ckpt_pending: bool,
    /// An asynchronous write-back of this frame is in flight (inflight.rs): the frame
    /// is neither evicted nor written again until it completes.
    pub(super) wb_inflight: bool,
    /// Installed by a prefetch whose miss was counted then: its first use is no hit.
    pub(super) prefetched: bool,
    pub(super) prev: u32,
    pub(super) next: u32,
    /// The page as stored on media (little-endian PBAs), so faults and write-backs
    /// move it without converting.
    pub(super) data: Box<[u8; PAGE_BYTES]>,
    /// Entries changed since the stored copy: the first `dirty_n` of `dirty_log`
    /// (none: the frame is clean), or `DIRTY_UNKNOWN` when there are more (or which
    /// is not known). A dirty frame whose changes are all listed can be evicted as
    /// deferred switches instead of written back (`evict_as_switches`).
    pub(super) dirty_log: [u16; DIRTY_LOG],
    pub(super) dirty_n: u8,
}

/// Changed entries a frame lists; a frame with more is written back when evicted.
/// Under uniform random writes with the default budget a page takes one or two
/// changes per stay in the cache, so this many make most evictions write nothing.
const DIRTY_LOG: usize = 6;
const DIRTY_UNKNOWN: u8 = u8::MAX;
/// Deferred switches evictions may leave waiting (128 KiB of slab): enough for the
/// pages a budget of a few hundred frames leaves out, and a fixed cost at any scale
/// (at 1 TiB the frames alone are 103 MiB).
const EVICT_SWITCHES_MAX: usize = 16384;

impl Frame {
    /// The frame differs from the stored copy.
    pub(super) fn is_dirty(&self) -> bool {
        self.dirty_n != 0
    }

    /// Entry `i` differs from the stored copy.
    pub(super) fn mark_dirty(&mut self, i: usize) {
        let n = self.dirty_n as usize;
        if self.dirty_n == DIRTY_UNKNOWN || self.dirty_log[..n].contains(&(i as u16)) {
            return;
        }
        if n < DIRTY_LOG {
            self.dirty_log[n] = i as u16;
            self.dirty_n += 1;
        } else {
            self.dirty_n = DIRTY_UNKNOWN;
        }
    }

    /// The frame may differ from the stored copy anywhere.
    pub(super) fn mark_all_dirty(&mut self) {
        self.dirty_n = DIRTY_UNKNOWN;
    }

    /// The frame equals the stored copy (or nothing needs storing).
    pub(super) fn mark_clean(&mut self) {
        self.dirty_n = 0;
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct L2pCounters {
    pub hits: u64,
    pub misses: u64,
    pub page_reads: u64,
    pub page_writes: u64,
    /// Asynchronous page reads and writes (inflight.rs), included in the two above.
    pub reads_ahead: u64,
    pub writes_ahead: u64,
    /// Relocation switches deferred (their page was not cached).
    pub deferred: u64,
    /// Faults made only to apply deferred switches (too many waiting).
    pub deferred_faults: u64,
    /// Dirty frames evicted as deferred switches instead of written back.
    pub evicted_as_switches: u64,
}

/// What a `VolumeMap::frame` value holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Empty,
    Frame(u32),
    /// The head of the page's deferred switches.
    Deferred(u32),
}

pub(super) fn slot_of(v: u32) -> Slot {
    if v == FRAME_NONE {
        Slot::Empty
    } else if v & DEFERRED_BIT != 0 {
        Slot::Deferred(v & !DEFERRED_BIT)
    } else {
        Slot::Frame(v)
    }
}

#[derive(Debug)]
pub(crate) struct L2p {
    /// The pool's entry width (and so LBAs per page).
    pub(super) fmt: L2pFormat,
    pub vols: Vec<Option<VolumeMap>>,
    pub(super) frames: Vec<Frame>,
    /// Most recently used at head.
    head: u32,
    pub(super) tail: u32,
    frames_max: usize,
    pool: PagePool,
    /// Pool pages to return to `pool` after the next checkpoint.
    pub(super) pool_deferred: Vec<u32>,
    pub(super) area_start: u64,
    /// Asynchronous page loads and write-backs in flight (inflight.rs).
    pub(super) io: super::inflight::InflightPages,
    /// A page read for a caller that does not want it cached.
    scratch: Box<[u8; PAGE_BYTES]>,
    /// The runs of pages a map walk reads (kept: a background census walks a few
    /// hundred pages a poll, and a fresh 1 MiB buffer each time costs its page
    /// faults and an munmap).
    walk_buf: Vec<u8>,
    pub counters: L2pCounters,
    /// Frames marked `ckpt_pending`, and where the next search for one starts.
    pending: usize,
    pending_cursor: usize,
    /// Relocation switches waiting for their page (deferred.rs).
    deferred: Deferred,
    switch_scratch: Vec<(u32, Pba)>,
    /// An incremental checkpoint is in progress: a frame that takes deferred switches
    /// is marked for it (they may predate its start).
    ckpt_active: bool,
    /// Pages that had deferred switches when the checkpoint in progress began: each is
    /// faulted in, updated and written before it commits.
    ckpt_deferred: Vec<(u32, u32)>,
    /// Faulting pages in to drain deferred switches: evictions write back, so the
    /// drain cannot refill what it empties.
    draining: bool,
    /// Where `drain_step` looks next (volume, page).
    drain_cursor: (usize, usize),
}

pub(super) const PAGE_BYTES: usize = shale_format::BLOCK_SIZE;

/// Frames from the LRU tail an eviction looks through for a clean one before it
/// writes a dirty one back synchronously.
const EVICT_SCAN: usize = 16;
/// Map slots one `drain_step` looks through at most.
const DRAIN_SCAN_SLOTS: usize = 8192;
/// Pages one `for_each_mapped` read covers at most (1 MiB).
const FOR_EACH_RUN_PAGES: usize = 256;
/// Unwanted slots `for_each_mapped` reads through rather than start a new read.
const FOR_EACH_GAP_SLOTS: u32 = 8;
const BLOCK_BYTES: usize = 4096;

/// Calls `f` for the mapped entries of page `p`, decoded in `page` (entries past the
/// volume's size are ignored).
fn emit(v: VolumeId, p: usize, size: u64, page: &[Pba], f: &mut impl FnMut(VolumeId, Lba, Pba)) {
    let first = p as u64 * page.len() as u64;
    for (i, &e) in page.iter().enumerate() {
        let lba = first + i as u64;
        if !e.is_none() && lba < size {
            f(v, Lba(lba), e);
        }
    }
}

/// Reads and verifies one L2P page (a page never written is all unmapped).
fn read_page_into<C: BlockDevice>(
    dev: &mut C,
    area_start: u64,
    v: VolumeId,
    p: usize,
    d: PageDesc,
    out: &mut [u8; PAGE_BYTES],
    counters: &mut L2pCounters,
) -> Result<(), EngineError> {
    if d.slot == L2P_SLOT_NONE {
        L2pFormat::fill_unmapped(&mut out[..]);
        return Ok(());
    }
    let off = (area_start + u64::from(d.slot)) * BS;
    dev.read_at(off, &mut out[..])
        .map_err(EngineError::cache("L2P page read", off))?;
    counters.page_reads += 1;
    let mut got = shale_format::crc32c(&out[..]);
    // Damaged on this cache mirror: another mirror's copy (not written back: a
    // write-back of this page may be on its way to the other slot).
    if got != d.crc32c
        && crate::copies::reread(dev, "L2P page", off, &mut out[..], false, |x| {
            shale_format::crc32c(x) == d.crc32c
        })
    {
        got = d.crc32c;
    }
    if got != d.crc32c {
        return Err(EngineError::L2pPageCorrupt {
            volume: v,
            page: p as u64,
            slot: d.slot,
            expected: d.crc32c,
            got,
        });
    }
    Ok(())
}

impl L2p {
    pub fn new(
        fmt: L2pFormat,
        volumes_max: u32,
        pool_pages: u32,
        frames_max: u64,
        area_start: u64,
    ) -> L2p {
        L2p {
            fmt,
            vols: vec![None; volumes_max as usize],
            frames: Vec::new(),
            head: FRAME_NONE,
            tail: FRAME_NONE,
            frames_max: frames_max as usize,
            pool: PagePool::new(pool_pages),
            pool_deferred: Vec::new(),
            area_start,
            scratch: Box::new([0; PAGE_BYTES]),
            walk_buf: Vec::new(),
            counters: L2pCounters::default(),
            pending: 0,
            pending_cursor: 0,
            // About one waiting switch per page of the table (8 bytes each, 1/512 of
            // the table), at least 128 KiB: enough that user faults, which apply them
            // for free, drain nearly all of them under uniform writes.
            deferred: Deferred::new((pool_pages as usize).max(16384)),
            switch_scratch: Vec::new(),
            ckpt_active: false,
            ckpt_deferred: Vec::new(),
            draining: false,
            drain_cursor: (0, 0),
            io: Default::default(),
        }
    }

    /// After loading directories: pool pages referenced by any directory are taken.
    pub fn rebuild_pool(&mut self, pool_pages: u32) -> Result<(), String> {
        let mut pool = PagePool::new(pool_pages);
        for (v, m) in self.vols.iter().enumerate() {
            let Some(m) = m else { continue };
            for (p, d) in m.dir.iter().enumerate() {
                if d.slot == L2P_SLOT_NONE {
                    continue;
                }
                let pp = d.slot / 2;
                if pp >= pool_pages {
                    return Err(format!("slot {} beyond pool of {pool_pages} pages", d.slot));
                }
                if !pool.mark_used(pp) {
                    return Err(format!("pool page {pp} used twice (vol:{v} page {p})"));
                }
            }
        }
        self.pool = pool;
        Ok(())
    }

    pub fn add_volume(&mut self, v: VolumeId, entries: u64) {
        self.vols[v.0 as usize] = Some(VolumeMap::new(self.fmt, entries));
    }

    /// The pool's L2P entry width.
    pub fn format(&self) -> L2pFormat {
        self.fmt
    }

    /// Volume `v`'s entries: its blocks, or its mapping units where a unit is
    /// larger than a block.
    pub fn volume_size(&self, v: VolumeId) -> Option<u64> {
        self.vols.get(v.0 as usize)?.as_ref().map(|m| m.entries)
    }

    fn unlink(&mut self, f: u32) {
        let (prev, next) = {
            let fr = &self.frames[f as usize];
            (fr.prev, fr.next)
        };
        if prev != FRAME_NONE {
            self.frames[prev as usize].next = next;
        } else {
            self.head = next;
        }
        if next != FRAME_NONE {
            self.frames[next as usize].prev = prev;
        } else {
            self.tail = prev;
        }
    }

    fn push_front(&mut self, f: u32) {
        self.frames[f as usize].prev = FRAME_NONE;
        self.frames[f as usize].next = self.head;
        if self.head != FRAME_NONE {
            self.frames[self.head as usize].prev = f;
        }
        self.head = f;
        if self.tail == FRAME_NONE {
            self.tail = f;
        }
    }

    /// Writes a dirty frame back to the slot the checkpoint does not reference.
    fn write_back<C: BlockDevice>(&mut self, dev: &mut C, f: u32) -> Result<u64, EngineError> {
        let Some(t) = self.write_back_target(f) else {
            return Ok(0);
        };
        if let Err(e) = dev.write_at(t.offset(self.area_start), &self.frames[f as usize].data[..]) {
            self.write_back_failed(&t);
            return Err(EngineError::cache(
                "L2P page write",
                t.offset(self.area_start),
            )(e));
        }
        self.write_back_done(f, &t);
        Ok(BS)
    }

    /// Where dirty frame `f` is written back: the slot the checkpoint does not
    /// reference (a new pool page if it has none). `None` for a page of a deleted
    /// volume, which is cleaned without a write.
    pub(super) fn write_back_target(&mut self, f: u32) -> Option<WriteBackTarget> {
        let (v, p) = {
            let fr = &self.frames[f as usize];
            (fr.volume as usize, fr.page as usize)
        };
        let Some(Some(m)) = self.vols.get(v) else {
            // A page of a deleted volume: nothing to keep.
            self.frames[f as usize].mark_clean();
            self.unmark(f);
            return None;
        };
        let ck = m.ckpt_slot[p];
        let cur = m.dir[p].slot;
        let (slot, new_pool_page) = if ck != L2P_SLOT_NONE {
            (ck ^ 1, false)
        } else if cur != L2P_SLOT_NONE {
            (cur, false)
        } else {
            let Some(pp) = self.pool.take() else {
                panic!("L2P page pool exhausted: the pool is sized for the user capacity");
            };
            (pp * 2, true)
        };
        Some(WriteBackTarget {
            slot,
            new_pool_page,
            crc32c: shale_format::crc32c(&self.frames[f as usize].data[..]),
        })
    }

    /// The write to `t` did not happen: a pool page taken for it goes back.
    pub(super) fn write_back_failed(&mut self, t: &WriteBackTarget) {
        if t.new_pool_page {
            self.pool.give(t.slot / 2);
        }
    }

    /// Frame `f` is on the device at `t`: its directory entry points there and it is
    /// clean.
    fn write_back_done(&mut self, f: u32, t: &WriteBackTarget) {
        let (v, p) = {
            let fr = &self.frames[f as usize];
            (fr.volume as usize, fr.page as usize)
        };
        self.counters.page_writes += 1;
        if let Some(Some(m)) = self.vols.get_mut(v) {
            m.dir[p] = PageDesc {
                slot: t.slot,
                crc32c: t.crc32c,
            };
        }
        self.frames[f as usize].mark_clean();
        self.unmark(f);
    }

    /// With a checkpoint in progress, frame `f` must be written before it commits.
    pub(super) fn mark_for_checkpoint(&mut self, f: u32) {
        let fr = &mut self.frames[f as usize];
        if self.ckpt_active && !fr.ckpt_pending {
            fr.ckpt_pending = true;
            self.pending += 1;
            self.pending_cursor = self.pending_cursor.min(f as usize);
        }
    }

    pub(super) fn unmark(&mut self, f: u32) {
        let fr = &mut self.frames[f as usize];
        if fr.ckpt_pending {
            fr.ckpt_pending = false;
            self.pending -= 1;
        }
    }

    fn read_page<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        p: usize,
        out: &mut [Pba],
    ) -> Result<(), EngineError> {
        let d = self.vols[v.0 as usize]
            .as_ref()
            .map_or(PageDesc::NONE, |m| m.dir[p]);
        read_page_into(
            dev,
            self.area_start,
            v,
            p,
            d,
            &mut self.scratch,
            &mut self.counters,
        )?;
        self.fmt.decode(&self.scratch[..], out);
        Ok(())
    }

    /// Returns the frame holding page `p` of volume `v`, faulting it in (synchronous
    /// read; may write back an evicted dirty page). Returns bytes written to the cache
    /// device for metadata.
    fn frame<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        p: usize,
    ) -> Result<(u32, u64), EngineError> {
        let cur = self.vols[v.0 as usize]
            .as_ref()
            .map_or(FRAME_NONE, |m| m.frame[p]);
        if let Slot::Frame(f) = slot_of(cur) {
            let fr = &mut self.frames[f as usize];
            if fr.prefetched {
                // Its miss was counted when the load started.
                fr.prefetched = false;
            } else {
                self.counters.hits += 1;
            }
            if self.head != f {
                self.unlink(f);
                self.push_front(f);
            }
            return Ok((f, 0));
        }
        self.counters.misses += 1;
        // A load in flight for the page is now stale: this read supersedes it.
        self.forget_load(v.0, p as u32);
        let (f, written) = self.take_frame(dev)?;
        let d = self.vols[v.0 as usize]
            .as_ref()
            .map_or(PageDesc::NONE, |m| m.dir[p]);
        let r = read_page_into(
            dev,
            self.area_start,
            v,
            p,
            d,
            &mut self.frames[f as usize].data,
            &mut self.counters,
        );
        if let Err(e) = r {
            // Leave the frame holding an unrelated page id so it is simply reused
            // (the page's deferred switches stay where they are).
            let fr = &mut self.frames[f as usize];
            fr.volume = u32::MAX;
            fr.mark_clean();
            self.push_front(f);
            return Err(e);
        }
        self.install(f, v, p, cur);
        Ok((f, written))
    }

    /// A frame for a page about to be cached, unlinked from the LRU and from its old
    /// page: a new one while under the budget, else the least recently used clean
    /// frame among the last few, else the least recently used one not being written,
    /// written back synchronously. Returns bytes written.
    pub(super) fn take_frame<C: BlockDevice>(
        &mut self,
        dev: &mut C,
    ) -> Result<(u32, u64), EngineError> {
        if let Some(f) = self.take_clean_frame() {
            return Ok((f, 0));
        }
        // None clean near the tail: the least recently used frame not being written
        // (written back first if dirty).
        let mut f = self.tail;
        while f != FRAME_NONE && self.frames[f as usize].wb_inflight {
            f = self.frames[f as usize].prev;
        }
        if f == FRAME_NONE {
            // Write-backs in flight are capped well below the budget (prefetch.rs).
            panic!("every L2P frame is being written back");
        }
        let mut written = 0;
        if self.frames[f as usize].is_dirty() && !self.evict_as_switches(f) {
            written += self.write_back(dev, f)?;
        }
        self.detach(f);
        Ok((f, written))
    }

    /// A clean frame, not being written, among the last few of the LRU (or a new one
    /// while under the budget), detached from its page. No I/O.
    pub(super) fn take_clean_frame(&mut self) -> Option<u32> {
        if self.frames.len() < self.frames_max {
            self.frames.push(Frame {
                volume: u32::MAX,
                page: 0,
                dirty_log: [0; DIRTY_LOG],
                dirty_n: 0,
                ckpt_pending: false,
                wb_inflight: false,
                prefetched: false,
                prev: FRAME_NONE,
                next: FRAME_NONE,
                data: Box::new([0xFF; PAGE_BYTES]),
            });
            return Some((self.frames.len() - 1) as u32);
        }
        let mut f = self.tail;
        for _ in 0..EVICT_SCAN {
            if f == FRAME_NONE {
                return None;
            }
            let fr = &self.frames[f as usize];
            if !fr.wb_inflight && (!fr.is_dirty() || self.evict_as_switches(f)) {
                self.detach(f);
                return Some(f);
            }
            f = self.frames[f as usize].prev;
        }
        None
    }

    /// Unlinks frame `f` from the LRU and from the page it held.
    fn detach(&mut self, f: u32) {
        self.unlink(f);
        let (ov, op) = (self.frames[f as usize].volume, self.frames[f as usize].page);
        if let Some(Some(m)) = self.vols.get_mut(ov as usize) {
            if let Some(slot) = m.frame.get_mut(op as usize) {
                if *slot == f {
                    *slot = FRAME_NONE;
                }
            }
        }
        self.unmark(f);
        let fr = &mut self.frames[f as usize];
        fr.volume = u32::MAX;
        fr.mark_clean();
        fr.prefetched = false;
    }

    /// Whether dirty frame `f` could leave the cache as deferred switches now.
    pub(super) fn can_evict_as_switches(&self, f: u32) -> bool {
        let fr = &self.frames[f as usize];
        // A frame the checkpoint in progress needs is written; so is one whose changes
        // are not all listed. The switches may fill half the slab (at most
        // `EVICT_SWITCHES_MAX`): the rest is the relocations' (their overflow drains
        // down to half).
        fr.is_dirty()
            && !fr.wb_inflight
            && !fr.ckpt_pending
            && !self.draining
            && fr.dirty_n != DIRTY_UNKNOWN
            && self.deferred.live() + usize::from(fr.dirty_n)
                <= (self.deferred.max / 2).min(EVICT_SWITCHES_MAX)
            && matches!(self.vols.get(fr.volume as usize), Some(Some(_)))
    }

    /// Evicts dirty frame `f` without I/O when it can (`can_evict_as_switches`): its
    /// changed entries become the page's deferred switches, which its next fault, a
    /// map walk or the next checkpoint applies exactly like a relocation's. The
    /// frame is left clean and still attached; the caller detaches it. Under uniform
    /// random writes this turns most evictions' 4 KiB write (and CRC) into a few
    /// 8-byte switches; the entries it saves are in the data's md anyway, which is
    /// what recovery replays.
    fn evict_as_switches(&mut self, f: u32) -> bool {
        if !self.can_evict_as_switches(f) {
            return false;
        }
        let (v, p, n) = {
            let fr = &self.frames[f as usize];
            (fr.volume as usize, fr.page as usize, fr.dirty_n as usize)
        };
        let mut head = LINK_NONE;
        for k in 0..n {
            let fr = &self.frames[f as usize];
            let i = usize::from(fr.dirty_log[k]);
            let pba = self.fmt.get(&fr.data[..], i);
            head = self.deferred.push(head, i as u32, pba);
        }
        let Some(Some(m)) = self.vols.get_mut(v) else {
            unreachable!("checked by can_evict_as_switches")
        };
        debug_assert_eq!(m.frame[p], f, "a cached page's slot names its frame");
        debug_assert_ne!(head, LINK_NONE, "a dirty frame lists at least one change");
        m.frame[p] = DEFERRED_BIT | head;
        self.frames[f as usize].mark_clean();
        self.counters.evicted_as_switches += 1;
        true
    }

    /// Makes frame `f` (taken, holding page `p` of `v` as stored) the page's cached
    /// copy: most recently used, with the page's deferred switches applied. `cur` is
    /// the page's map slot before (empty or a deferred chain).
    pub(super) fn install(&mut self, f: u32, v: VolumeId, p: usize, cur: u32) {
        {
            let fr = &mut self.frames[f as usize];
            fr.volume = v.0;
            fr.page = p as u32;
            fr.mark_clean();
        }
        self.push_front(f);
        if let Slot::Deferred(head) = slot_of(cur) {
            let mut sw = std::mem::take(&mut self.switch_scratch);
            sw.clear();
            self.deferred.take(head, &mut sw);
            let fr = &mut self.frames[f as usize];
            for &(i, pba) in &sw {
                self.fmt.set(&mut fr.data[..], i as usize, pba);
                fr.mark_dirty(i as usize);
            }
            if !sw.is_empty() {
                // Some of these switches may predate the checkpoint in progress.
                self.mark_for_checkpoint(f);
            }
            self.switch_scratch = sw;
        }
        if let Some(m) = self.vols[v.0 as usize].as_mut() {
            m.frame[p] = f;
        }
    }

    /// Looks up `lba`; `None` if the volume does not exist or the LBA is past its end.
    pub fn get<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        lba: Lba,
    ) -> Result<Option<Pba>, EngineError> {
        let Some(size) = self.volume_size(v) else {
            return Ok(None);
        };
        if lba.0 >= size {
            return Ok(None);
        }
        let (p, i) = self.fmt.locate(lba.0);
        let (f, _) = self.frame(dev, v, p as usize)?;
        Ok(Some(self.fmt.get(&self.frames[f as usize].data[..], i)))
    }

    /// Sets `lba` to `pba`; returns the previous PBA. The volume must exist and the LBA
    /// be in range (callers check first).
    pub fn set<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        lba: Lba,
        pba: Pba,
    ) -> Result<Pba, EngineError> {
        let (p, i) = self.fmt.locate(lba.0);
        let (f, _) = self.frame(dev, v, p as usize)?;
        let fr = &mut self.frames[f as usize];
        let old = self.fmt.get(&fr.data[..], i);
        if old != pba {
            self.fmt.set(&mut fr.data[..], i, pba);
            fr.mark_dirty(i);
        }
        Ok(old)
    }

    /// True if page `p` of `v` was never written and is not cached (all unmapped):
    /// range operations skip such pages without faulting them in.
    pub fn page_is_empty(&self, v: VolumeId, p: usize) -> bool {
        self.vols[v.0 as usize].as_ref().is_none_or(|m| {
            m.dir.get(p).is_none_or(|d| d.slot == L2P_SLOT_NONE)
                && m.frame.get(p).is_none_or(|&f| f == FRAME_NONE)
        })
    }

    /// Copies page `p` of `v` into `out` (its first `entries_per_page` entries) without
    /// touching the LRU order or the hit counters: from its frame if cached, else read
    /// from the device (CRC-checked). Returns false, with no I/O, when the page was
    /// never written (all unmapped). For queries that scan wide ranges, which must not
    /// evict the working set.
    pub fn peek_page<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        p: usize,
        out: &mut [Pba; MAX_EPP],
    ) -> Result<bool, EngineError> {
        let out = &mut out[..self.fmt.entries_per_page() as usize];
        if self.page_is_empty(v, p) {
            return Ok(false);
        }
        let cur = self.vols[v.0 as usize]
            .as_ref()
            .map_or(FRAME_NONE, |m| m.frame[p]);
        match slot_of(cur) {
            Slot::Frame(f) => self.fmt.decode(&self.frames[f as usize].data[..], out),
            Slot::Empty => self.read_page(dev, v, p, out)?,
            Slot::Deferred(head) => {
                self.read_page(dev, v, p, out)?;
                self.deferred.for_each(head, |i, pba| out[i as usize] = pba);
            }
        }
        Ok(true)
    }

    /// [`Self::write_back_all_metered`] without a meter.
    #[cfg(test)]
    pub fn write_back_all<C: BlockDevice>(&mut self, dev: &mut C) -> Result<u64, EngineError> {
        self.write_back_all_metered(dev, &mut Meter::off())
    }

    /// Writes back every dirty page. Returns bytes written.
    ///
    /// With nothing else in flight on the device (a synchronous checkpoint drains it
    /// first), the pages go out as asynchronous writes, `WRITE_BACK_BATCH` at a time:
    /// a recovery or shutdown after many scattered writes has tens of thousands of
    /// them, and one synchronous write each would wait a device round trip apiece.
    ///
    /// `meter` counts the dirty pages as their writes complete.
    pub fn write_back_all_metered<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        meter: &mut Meter<'_>,
    ) -> Result<u64, EngineError> {
        // Callers drain the engine's I/O first: no asynchronous write-back is in flight
        // (a frame being written must not be written again).
        debug_assert_eq!(
            self.io.writes, 0,
            "write_back_all with write-backs in flight"
        );
        let dirty: Vec<u32> = (0..self.frames.len() as u32)
            .filter(|&f| self.frames[f as usize].is_dirty() && !self.frames[f as usize].wb_inflight)
            .collect();
        let mut n = 0;
        meter.start(dirty.len() as u64);
        if dev.in_flight() != 0 {
            // Our completions would mix with the caller's: one at a time.
            for f in dirty {
                n += self.write_back(dev, f)?;
                meter.add(1);
            }
            return Ok(n);
        }
        let mut out = Vec::new();
        for batch in dirty.chunks(WRITE_BACK_BATCH) {
            let mut planned = Vec::with_capacity(batch.len());
            for &f in batch {
                let Some(t) = self.write_back_target(f) else {
                    continue;
                };
                dev.submit(IoRequest {
                    tag: WRITE_BACK_TAG | planned.len() as u64,
                    op: IoOp::Write {
                        offset: t.offset(self.area_start),
                        buf: IoBuf::from_slice(&self.frames[f as usize].data[..]),
                        fua: false,
                    },
                });
                planned.push((f, t, None));
            }
            let mut left = planned.len();
            while left > 0 {
                out.clear();
                if let Err(e) = dev.poll(&mut out, left) {
                    for (_, t, _) in &planned {
                        self.write_back_failed(t);
                    }
                    return Err(EngineError::cache("L2P page write poll", 0)(e));
                }
                for c in out.drain(..) {
                    let Some(entry) = planned.get_mut((c.tag & !WRITE_BACK_TAG) as usize) else {
                        panic!("L2P write-back: completion for unknown tag {}", c.tag);
                    };
                    entry.2 = Some(c.result);
                    left -= 1;
                }
            }
            let mut first_error = None;
            for (f, t, result) in planned {
                match result {
                    Some(Ok(())) => {
                        self.write_back_done(f, &t);
                        n += BS;
                    }
                    Some(Err(e)) => {
                        self.write_back_failed(&t);
                        first_error.get_or_insert((t.offset(self.area_start), e));
                    }
                    None => unreachable!("every planned write completed"),
                }
            }
            if let Some((off, e)) = first_error {
                return Err(EngineError::cache("L2P page write", off)(e));
            }
            meter.add(batch.len() as u64);
        }
        Ok(n)
    }

    /// An incremental checkpoint begins: every page dirty now must be written before it
    /// commits. Returns the deferred switches the checkpoint records (what the pages
    /// would hold now, at most `room` of them, sorted); pages whose switches do not fit
    /// are faulted in, updated and written a few at a time like the dirty ones (longest
    /// chains first), so the start of a checkpoint costs no burst of faults.
    pub fn mark_checkpoint_pending(&mut self, room: usize) -> Vec<L2pSwitch> {
        self.clear_checkpoint_pending();
        for fr in self.frames.iter_mut() {
            if fr.is_dirty() && fr.volume != u32::MAX {
                fr.ckpt_pending = true;
                self.pending += 1;
            }
        }
        self.pending_cursor = 0;
        let mut fault = self.pages_past_room(room);
        let switches = self.switches_except(&fault);
        // Popped from the end: longest chains first.
        fault.reverse();
        self.ckpt_deferred = fault;
        self.ckpt_active = true;
        switches
    }

    /// When more switches wait than `room`, the pages whose chains must leave for the
    /// rest to fit, longest chains first (none otherwise: the common case allocates
    /// nothing per page).
    fn pages_past_room(&self, room: usize) -> Vec<PageKey> {
        let mut live = self.deferred.live();
        if live <= room {
            return Vec::new();
        }
        let mut pages: Vec<(usize, u32, u32)> = Vec::new();
        for (v, m) in self.vols.iter().enumerate() {
            let Some(m) = m else { continue };
            for (p, &fr) in m.frame.iter().enumerate() {
                if let Slot::Deferred(head) = slot_of(fr) {
                    pages.push((self.deferred.chain_len(head), v as u32, p as u32));
                }
            }
        }
        pages.sort_by_key(|x| std::cmp::Reverse(x.0));
        let mut n = 0;
        while live > room {
            live -= pages[n].0;
            n += 1;
        }
        pages.truncate(n);
        pages.into_iter().map(|(_, v, p)| (v, p)).collect()
    }

    /// The switches of every page with a chain but those in `except`, the newest of
    /// each entry, as checkpoint records in (volume, LBA) order.
    fn switches_except(&self, except: &[PageKey]) -> Vec<L2pSwitch> {
        let mut skip = except.to_vec();
        skip.sort_unstable();
        let epp = self.fmt.entries_per_page();
        let mut out = Vec::with_capacity(self.deferred.live().saturating_sub(except.len()));
        let mut chain: Vec<(u32, Pba)> = Vec::new();
        for (v, m) in self.vols.iter().enumerate() {
            let Some(m) = m else { continue };
            for (p, &fr) in m.frame.iter().enumerate() {
                let Slot::Deferred(head) = slot_of(fr) else {
                    continue;
                };
                if !skip.is_empty() && skip.binary_search(&(v as u32, p as u32)).is_ok() {
                    continue;
                }
                chain.clear();
                self.deferred.collect(head, &mut chain);
                // Oldest first: after a stable sort by entry the last of each is newest.
                chain.sort_by_key(|x| x.0);
                for (k, &(i, pba)) in chain.iter().enumerate() {
                    if chain.get(k + 1).is_some_and(|n| n.0 == i) {
                        continue;
                    }
                    let lba = p as u64 * epp + u64::from(i);
                    out.push(
                        L2pSwitch::new(VolumeId(v as u32), Lba(lba), pba)
                            .expect("volume ids and LBAs fit a switch record"),
                    );
                }
            }
        }
        out
    }

    /// For a synchronous checkpoint: faults in pages with deferred switches until at
    /// most `room` wait, and returns those as the checkpoint's records.
    pub fn checkpoint_switches<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        room: usize,
    ) -> Result<Vec<L2pSwitch>, EngineError> {
        self.drain_deferred(dev, room)?;
        debug_assert!(self.deferred.live() <= room);
        Ok(self.switches_except(&[]))
    }

    /// Loads a checkpoint's switches (at open, volumes known, nothing cached yet):
    /// each waits in its page's chain like a relocation's.
    pub fn load_switches(&mut self, switches: &[L2pSwitch]) {
        self.deferred.reserve(switches.len());
        for s in switches {
            self.set_lazily(s.volume(), s.lba(), s.pba);
        }
    }

    /// The checkpoint in progress was abandoned.
    pub fn clear_checkpoint_pending(&mut self) {
        for fr in self.frames.iter_mut() {
            fr.ckpt_pending = false;
        }
        self.pending = 0;
        self.ckpt_deferred.clear();
        self.ckpt_active = false;
    }

    /// Pages still to write for the checkpoint in progress.
    pub fn pending_pages(&self) -> usize {
        self.pending + self.ckpt_deferred.len()
    }

    fn has_deferred(&self, v: u32, p: u32) -> bool {
        self.vols
            .get(v as usize)
            .and_then(Option::as_ref)
            .and_then(|m| m.frame.get(p as usize))
            .is_some_and(|&fr| matches!(slot_of(fr), Slot::Deferred(_)))
    }

    /// Writes back up to `max` pages marked for the checkpoint in progress. Returns
    /// bytes written.
    pub fn write_back_pending<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        max: usize,
    ) -> Result<u64, EngineError> {
        let mut n = 0;
        let mut bytes = 0;
        while n < max {
            let Some((v, p)) = self.ckpt_deferred.pop() else {
                break;
            };
            // Gone already if a fault applied them (that frame is marked) or the
            // volume shrank or went away.
            if self.has_deferred(v, p) {
                let (f, w) = self.frame(dev, VolumeId(v), p as usize)?;
                bytes += w;
                if self.frames[f as usize].is_dirty() {
                    bytes += self.write_back(dev, f)?;
                }
                n += 1;
            }
        }
        while n < max && self.pending > 0 && self.pending_cursor < self.frames.len() {
            let f = self.pending_cursor as u32;
            if self.frames[f as usize].wb_inflight {
                // Dirtied again while an earlier copy is being written: this copy goes
                // out once that write completes (a later step), never beside it.
                break;
            }
            if self.frames[f as usize].ckpt_pending {
                bytes += self.write_back(dev, f)?;
                n += 1;
            }
            self.pending_cursor += 1;
        }
        if self.pending_cursor >= self.frames.len() && self.pending > 0 {
            // Marks only clear (write-back) and frames only grow, so a full pass
            // cannot leave one behind.
            panic!(
                "{} L2P pages marked for the checkpoint were not found",
                self.pending
            );
        }
        Ok(bytes)
    }

    /// After a durable checkpoint: its directories are now the reference copies.
    pub fn checkpoint_committed(&mut self) {
        debug_assert!(self.ckpt_deferred.is_empty());
        self.ckpt_active = false;
        for m in self.vols.iter_mut().flatten() {
            for (c, d) in m.ckpt_slot.iter_mut().zip(&m.dir) {
                *c = d.slot;
            }
        }
        for p in self.pool_deferred.drain(..) {
            self.pool.give(p);
        }
    }

    /// Drops a volume's map; its pool pages return after the next checkpoint.
    pub fn remove_volume(&mut self, v: VolumeId) {
        if let Some(m) = self.vols[v.0 as usize].take() {
            self.release_pages(v.0, 0, &m.dir, &m.ckpt_slot, &m.frame);
        }
    }

    fn release_pages(
        &mut self,
        v: u32,
        first: usize,
        dir: &[PageDesc],
        ckpt: &[u32],
        frames: &[u32],
    ) {
        for (i, ((d, &c), &f)) in dir.iter().zip(ckpt).zip(frames).enumerate() {
            self.forget_load(v, (first + i) as u32);
            let slot = if d.slot != L2P_SLOT_NONE { d.slot } else { c };
            if slot != L2P_SLOT_NONE {
                self.pool_deferred.push(slot / 2);
            }
            match slot_of(f) {
                Slot::Frame(f) => {
                    self.frames[f as usize].volume = u32::MAX;
                    self.frames[f as usize].mark_clean();
                    self.unmark(f);
                }
                Slot::Deferred(head) => {
                    self.switch_scratch.clear();
                    self.deferred.take(head, &mut self.switch_scratch);
                }
                Slot::Empty => {}
            }
        }
    }

    /// Changes a volume's size (entries past a shrink must already be unmapped).
    pub fn resize_volume(&mut self, v: VolumeId, entries: u64) {
        let Some(mut m) = self.vols[v.0 as usize].take() else {
            return;
        };
        let pages = self.fmt.pages_for(entries) as usize;
        if pages < m.dir.len() {
            let dir = m.dir.split_off(pages);
            let ck = m.ckpt_slot.split_off(pages);
            let fr = m.frame.split_off(pages);
            self.release_pages(v.0, pages, &dir, &ck, &fr);
        } else {
            m.dir.resize(pages, PageDesc::NONE);
            m.ckpt_slot.resize(pages, L2P_SLOT_NONE);
            m.frame.resize(pages, FRAME_NONE);
        }
        m.entries = entries;
        self.vols[v.0 as usize] = Some(m);
    }

    /// Calls `f` for every mapped entry of every volume (cached pages first, then
    /// the others in slot order). Pages never written back and not cached are
    /// skipped, and the others are read in runs of nearby slots with one large read
    /// each, so a whole-map walk (census, self-check) costs a sequential pass over the
    /// mapped pages rather than a synchronous 4 KiB read per page. Pages read here do
    /// not enter the cache.
    #[cfg(test)]
    pub fn for_each_mapped<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        f: impl FnMut(VolumeId, Lba, Pba),
    ) -> Result<(), EngineError> {
        self.for_each_mapped_metered(dev, &mut Meter::off(), f)
    }

    /// [`Self::for_each_mapped`], counting the pages walked on `meter`.
    #[cfg(test)]
    pub fn for_each_mapped_metered<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        meter: &mut Meter<'_>,
        f: impl FnMut(VolumeId, Lba, Pba),
    ) -> Result<(), EngineError> {
        meter.start(self.walked_pages() as u64);
        self.for_each_mapped_from((0, 0), usize::MAX, dev, meter, f)?;
        Ok(())
    }

    /// Pages of map `v` in use: written back, cached, or with deferred switches.
    pub fn pages_in_use(&self, v: VolumeId) -> u64 {
        self.vols
            .get(v.0 as usize)
            .and_then(Option::as_ref)
            .map_or(0, |m| {
                (0..m.dir.len())
                    .filter(|&p| m.frame[p] != FRAME_NONE || m.dir[p].slot != L2P_SLOT_NONE)
                    .count() as u64
            })
    }

    /// The pages a walk visits: cached, with deferred switches, or written back.
    pub fn walked_pages(&self) -> usize {
        (0..self.vols.len())
            .map(|v| self.pages_in_use(VolumeId(v as u32)) as usize)
            .sum()
    }

    /// The walk of [`for_each_mapped_metered`](Self::for_each_mapped_metered) from page
    /// `from` (volume, page) on, over at most `max_pages` mapped pages (cached, with
    /// deferred switches, or written back), each in its current state. Returns where
    /// the next part of the walk starts, `None` once every volume is walked.
    pub fn for_each_mapped_from<C: BlockDevice>(
        &mut self,
        from: (usize, usize),
        max_pages: usize,
        dev: &mut C,
        meter: &mut Meter<'_>,
        mut f: impl FnMut(VolumeId, Lba, Pba),
    ) -> Result<Option<(usize, usize)>, EngineError> {
        let epp = self.fmt.entries_per_page() as usize;
        let mut buf = vec![Pba::NONE; epp];
        // (slot, volume, page, descriptor) of the pages to read.
        let mut to_read: Vec<(u32, usize, usize, PageDesc)> = Vec::new();
        let mut taken = 0usize;
        let mut next = None;
        'walk: for v in from.0..self.vols.len() {
            let Some(m) = &self.vols[v] else {
                continue;
            };
            let first = if v == from.0 { from.1 } else { 0 };
            for p in first..m.dir.len() {
                let mapped = m.frame[p] != FRAME_NONE || m.dir[p].slot != L2P_SLOT_NONE;
                if mapped && taken == max_pages {
                    next = Some((v, p));
                    break 'walk;
                }
                taken += usize::from(mapped);
                match slot_of(m.frame[p]) {
                    Slot::Frame(fr) => {
                        self.fmt
                            .decode(&self.frames[fr as usize].data[..], &mut buf);
                        emit(VolumeId(v as u32), p, m.entries, &buf, &mut f);
                        meter.add(1);
                    }
                    _ if m.dir[p].slot != L2P_SLOT_NONE => {
                        to_read.push((m.dir[p].slot, v, p, m.dir[p]));
                    }
                    Slot::Deferred(head) => {
                        // Switches for a page never written back (not expected: a
                        // relocated entry was mapped, so its page was written).
                        buf.fill(Pba::NONE);
                        self.deferred.for_each(head, |i, pba| buf[i as usize] = pba);
                        emit(VolumeId(v as u32), p, m.entries, &buf, &mut f);
                        meter.add(1);
                    }
                    Slot::Empty => {}
                }
            }
        }
        to_read.sort_unstable_by_key(|t| t.0);
        let mut run_buf = std::mem::take(&mut self.walk_buf);
        if !to_read.is_empty() {
            run_buf.resize(FOR_EACH_RUN_PAGES * BLOCK_BYTES, 0);
        }
        let mut i = 0;
        while i < to_read.len() {
            // A run of nearby slots spanning at most FOR_EACH_RUN_PAGES. A page's two
            // slots are adjacent, so the pages of a run are usually two slots apart:
            // reading through small gaps (the other copies) is cheaper than an I/O
            // per page.
            let first = to_read[i].0;
            let mut j = i + 1;
            while j < to_read.len()
                && to_read[j].0 - to_read[j - 1].0 <= FOR_EACH_GAP_SLOTS
                && ((to_read[j].0 - first) as usize) < FOR_EACH_RUN_PAGES
            {
                j += 1;
            }
            let pages = (to_read[j - 1].0 - first + 1) as usize;
            let off = (self.area_start + u64::from(first)) * BS;
            let bytes = &mut run_buf[..pages * BLOCK_BYTES];
            dev.read_at(off, bytes)
                .map_err(EngineError::cache("L2P page read", off))?;
            self.counters.page_reads += pages as u64;
            for &(slot, v, p, d) in &to_read[i..j] {
                let at = (slot - first) as usize * BLOCK_BYTES;
                let page = &mut bytes[at..at + BLOCK_BYTES];
                let mut got = shale_format::crc32c(page);
                let page_off = (self.area_start + u64::from(slot)) * BS;
                if got != d.crc32c
                    && crate::copies::reread(dev, "L2P page", page_off, page, false, |x| {
                        shale_format::crc32c(x) == d.crc32c
                    })
                {
                    got = d.crc32c;
                }
                let page = &bytes[at..at + BLOCK_BYTES];
                if got != d.crc32c {
                    return Err(EngineError::L2pPageCorrupt {
                        volume: VolumeId(v as u32),
                        page: p as u64,
                        slot,
                        expected: d.crc32c,
                        got,
                    });
                }
                self.emit_stored(v, p, page, &mut buf, &mut f);
                meter.add(1);
            }
            i = j;
        }
        self.walk_buf = run_buf;
        Ok(next)
    }

    /// Calls `f` for the mapped entries of stored page `p` of volume `v` (read and
    /// verified), with its deferred switches applied; `buf` is scratch.
    fn emit_stored(
        &self,
        v: usize,
        p: usize,
        page: &[u8],
        buf: &mut [Pba],
        f: &mut impl FnMut(VolumeId, Lba, Pba),
    ) {
        let size = self.vols[v].as_ref().map_or(0, |m| m.entries);
        if let Some(Slot::Deferred(head)) = self.vols[v].as_ref().map(|m| slot_of(m.frame[p])) {
            self.fmt.decode(page, buf);
            self.deferred.for_each(head, |i, pba| buf[i as usize] = pba);
            emit(VolumeId(v as u32), p, size, buf, f);
        } else {
            // Only the mapped entries (most of a sparse pool's pages are nearly empty).
            let first = p as u64 * self.fmt.entries_per_page();
            self.fmt.for_each_mapped(page, |i, pba| {
                let lba = first + i as u64;
                if lba < size {
                    f(VolumeId(v as u32), Lba(lba), pba);
                }
            });
        }
    }

    /// Switches `lba` of `v` from a relocation's source to `pba`. The caller has checked
    /// that the entry still points at the source (the source's validity bit is set). A
    /// cached page is updated at once; otherwise the switch waits for the page's next
    /// fault, so a relocation costs no page I/O. When too many wait, the pages with the
    /// most are faulted in. Returns bytes written to the cache device.
    pub fn relocate<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        v: VolumeId,
        lba: Lba,
        pba: Pba,
    ) -> Result<(), EngineError> {
        if self.set_lazily(v, lba, pba) {
            self.counters.deferred += 1;
        }
        self.bound_deferred(dev)
    }

    /// Sets `lba` of `v` to `pba` (the volume exists, the LBA is in range): in its
    /// frame if the page is cached, else as a deferred switch applied when the page is
    /// next faulted in. Returns true if deferred. No I/O: callers bound the switches
    /// waiting with `bound_deferred`.
    pub fn set_lazily(&mut self, v: VolumeId, lba: Lba, pba: Pba) -> bool {
        let (p, i) = self.fmt.locate(lba.0);
        let p = p as usize;
        let Some(Some(m)) = self.vols.get_mut(v.0 as usize) else {
            panic!("L2P switch for {v}, which has no map");
        };
        match slot_of(m.frame[p]) {
            Slot::Frame(f) => {
                let fr = &mut self.frames[f as usize];
                if self.fmt.get(&fr.data[..], i) != pba {
                    self.fmt.set(&mut fr.data[..], i, pba);
                    fr.mark_dirty(i);
                }
                return false;
            }
            Slot::Empty => m.frame[p] = DEFERRED_BIT | self.deferred.push(LINK_NONE, i as u32, pba),
            Slot::Deferred(head) => {
                m.frame[p] = DEFERRED_BIT | self.deferred.push(head, i as u32, pba)
            }
        }
        true
    }

    /// When more switches wait than the bound, faults in the pages with the most
    /// until half do.
    pub fn bound_deferred<C: BlockDevice>(&mut self, dev: &mut C) -> Result<(), EngineError> {
        if self.deferred.live() > self.deferred.max {
            return self.drain_deferred(dev, self.deferred.max / 2);
        }
        Ok(())
    }

    /// Above three quarters of the bound on waiting switches, faults in up to `pages`
    /// pages with switches (found by a cursor sweeping the maps, at most
    /// `DRAIN_SCAN_SLOTS` slots a call), so the switches are applied a few pages per
    /// loop iteration rather than in one burst at the bound. Checkpoints record the
    /// switches instead of applying them, so without this, relocations under GC would
    /// only ever be applied by user faults or by that burst. Returns true if it
    /// faulted any page in.
    pub fn drain_step<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        pages: usize,
    ) -> Result<bool, EngineError> {
        if self.deferred.live() <= self.deferred.max / 4 * 3 {
            return Ok(false);
        }
        let mut keys: Vec<PageKey> = Vec::with_capacity(pages);
        let (mut v, mut p) = self.drain_cursor;
        for _ in 0..DRAIN_SCAN_SLOTS {
            if keys.len() == pages {
                break;
            }
            match self.vols.get(v) {
                None => (v, p) = (0, 0),
                Some(None) => (v, p) = (v + 1, 0),
                Some(Some(m)) => {
                    if p >= m.frame.len() {
                        (v, p) = (v + 1, 0);
                    } else {
                        if let Slot::Deferred(_) = slot_of(m.frame[p]) {
                            keys.push((v as u32, p as u32));
                        }
                        p += 1;
                    }
                }
            }
        }
        self.drain_cursor = (v, p);
        if keys.is_empty() {
            return Ok(false);
        }
        self.fault_pages(dev, &keys).map(|()| true)
    }

    /// The replay's bound: twice the usual before any page is faulted in, down to
    /// the usual then. A crash may come with the switches near their bound (loaded
    /// back from the checkpoint), and faulting pages in to make room for the replay's
    /// would cost a page read per switch; the checkpoint ending the recovery records
    /// what fits its room and applies the rest.
    pub fn bound_deferred_for_replay<C: BlockDevice>(
        &mut self,
        dev: &mut C,
    ) -> Result<(), EngineError> {
        let max = self.deferred.max;
        if self.deferred.live() > max.saturating_mul(2) {
            return self.drain_deferred(dev, max);
        }
        Ok(())
    }

    /// Faults in pages with deferred switches, longest chains first, until at most
    /// `keep` switches wait.
    fn drain_deferred<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        keep: usize,
    ) -> Result<(), EngineError> {
        let pages = self.pages_past_room(keep);
        self.fault_pages(dev, &pages)
    }

    /// Faults in `pages` (volume, page) to apply their switches, loading them a batch
    /// at a time ahead of the faults. Evictions meanwhile write back, so the faults
    /// cannot refill the switches they empty.
    fn fault_pages<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        pages: &[PageKey],
    ) -> Result<(), EngineError> {
        self.draining = true;
        let batch = self.load_batch();
        let mut result = Ok(());
        'all: for chunk in pages.chunks(batch) {
            let keys: Vec<(VolumeId, usize)> = chunk
                .iter()
                .map(|&(v, p)| (VolumeId(v), p as usize))
                .collect();
            if let Err(e) = self.load_pages(dev, &keys) {
                result = Err(e);
                break;
            }
            for &(v, p) in &keys {
                self.counters.deferred_faults += 1;
                if let Err(e) = self.frame(dev, v, p) {
                    result = Err(e);
                    break 'all;
                }
            }
        }
        self.draining = false;
        result
    }

    /// Pages `load_pages` is given at once: what a drive serves in parallel, and few
    /// enough beside the budget that the batch is still cached when it is used.
    pub fn load_batch(&self) -> usize {
        (self.frames_max / 4).clamp(1, 64)
    }

    /// Applies every deferred switch (a checkpoint's pages must reflect every
    /// relocation before it begins). Returns bytes written to the cache device.
    #[cfg(test)]
    pub fn apply_deferred<C: BlockDevice>(&mut self, dev: &mut C) -> Result<(), EngineError> {
        self.drain_deferred(dev, 0)
    }

    /// Relocation switches waiting for their page, and the DRAM they hold.
    pub fn deferred_switches(&self) -> (usize, usize) {
        (self.deferred.live(), self.deferred.bytes())
    }

    /// The most switches left waiting before the pages with the most are faulted in.
    pub fn deferred_max(&self) -> usize {
        self.deferred.max
    }

    pub fn cached_pages(&self) -> usize {
        self.frames.len()
    }

    pub fn frames_max(&self) -> usize {
        self.frames_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shale_device::MemDevice;
    use std::collections::HashMap;

    #[derive(Debug, Clone)]
    enum Op {
        Set(u8, u64, u32),
        Get(u8, u64),
        /// A relocation switch of an LBA that is mapped (callers check the source).
        Relocate(u64, u32),
        Peek(u8, u64),
        WriteBackAll,
        /// A synchronous checkpoint with room for this many switches, then an open of
        /// what it recorded.
        Checkpoint(u8),
        /// An incremental checkpoint: begin (its area with room for this many
        /// switches), then steps of a few pages.
        CkptBegin(u8),
        CkptStep,
        Resize(u8, u64),
        /// Starts a load of the page of (volume, LBA); the device is read at once
        /// (`true`) or when it completes.
        StartLoad(u8, u64, bool),
        /// Completes a load in flight (chosen by the selector), failed or not, then
        /// installs what arrived.
        FinishLoad(u64, bool),
        /// Starts write-backs to keep this many frames clean.
        StartWriteBacks(u8),
        /// Completes a write-back in flight, failed or not.
        FinishWriteBack(u64, bool),
        /// The background's gradual drain of waiting switches.
        DrainStep(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0u8..2, 0u64..6000, 0u32..1_000_000).prop_map(|(v, l, p)| Op::Set(v, l, p)),
            6 => (0u8..2, 0u64..6000).prop_map(|(v, l)| Op::Get(v, l)),
            6 => (any::<u64>(), 0u32..1_000_000).prop_map(|(sel, p)| Op::Relocate(sel, p)),
            2 => (0u8..2, 0u64..6000).prop_map(|(v, l)| Op::Peek(v, l)),
            1 => Just(Op::WriteBackAll),
            1 => (0u8..10).prop_map(Op::Checkpoint),
            1 => (0u8..10).prop_map(Op::CkptBegin),
            3 => Just(Op::CkptStep),
            1 => (0u8..2, 1u64..6000).prop_map(|(v, s)| Op::Resize(v, s)),
            4 => (0u8..2, 0u64..6000, any::<bool>()).prop_map(|(v, l, b)| Op::StartLoad(v, l, b)),
            4 => (any::<u64>(), prop::bool::weighted(0.1)).prop_map(|(s, f)| Op::FinishLoad(s, f)),
            3 => (1u8..4).prop_map(Op::StartWriteBacks),
            4 => (any::<u64>(), prop::bool::weighted(0.1)).prop_map(|(s, f)| Op::FinishWriteBack(s, f)),
            2 => (1u8..4).prop_map(Op::DrainStep),
        ]
    }

    proptest! {
        /// The page cache under a 3-page budget behaves like a map, across evictions,
        /// write-backs, deferred relocation switches (a few allowed to wait, so forced
        /// drains happen), checkpoints and resizes, and never reuses a pool page twice.
        #[test]
        fn behaves_like_a_map(ops in proptest::collection::vec(op(), 1..400), wide in any::<bool>()) {
            let mut dev = MemDevice::new(64 * 4096, 4096).unwrap();
            let fmt = if wide { L2pFormat::WIDE } else { L2pFormat::NARROW };
            let epp = fmt.entries_per_page();
            // Wide pools get PBAs past 32 bits.
            let val = |p: u32| if wide { u64::from(p) * 1_000_003 } else { u64::from(p) };
            let mut l2p = L2p::new(fmt, 2, 30, 3, 0);
            l2p.deferred.max = 6;
            let mut sizes = [6000u64, 3000];
            l2p.add_volume(VolumeId(0), sizes[0]);
            l2p.add_volume(VolumeId(1), sizes[1]);
            let mut model: HashMap<(u8, u64), u64> = HashMap::new();
            // Values each entry held at or after the start of the incremental checkpoint
            // in progress (absent: unmapped throughout).
            let mut since_t0: Option<HashMap<(u8, u64), std::collections::HashSet<u64>>> = None;
            // The switches the checkpoint in progress records.
            let mut t0_switches: Vec<L2pSwitch> = Vec::new();
            // Asynchronous I/O in flight: loads (volume, page, offset, data if read at
            // the start) and write-backs (frame, target, data).
            let mut loads: Vec<(u8, usize, u64, Option<Vec<u8>>)> = Vec::new();
            let mut writes: Vec<(u32, WriteBackTarget, Vec<u8>)> = Vec::new();
            // Completes every I/O in flight, as the engine's drain does.
            fn drain(
                l2p: &mut L2p,
                dev: &mut MemDevice,
                loads: &mut Vec<(u8, usize, u64, Option<Vec<u8>>)>,
                writes: &mut Vec<(u32, WriteBackTarget, Vec<u8>)>,
            ) {
                for (f, t, data) in writes.drain(..) {
                    dev.write_at(l2p.target_offset(&t), &data).unwrap();
                    l2p.finish_write_back(f, t, true);
                }
                for (v, p, off, data) in loads.drain(..) {
                    let data = data.unwrap_or_else(|| {
                        let mut b = vec![0u8; PAGE_BYTES];
                        dev.read_at(off, &mut b).unwrap();
                        b
                    });
                    l2p.finish_load(VolumeId(v.into()), p, Some(&data));
                }
                l2p.install_arrived(dev).unwrap();
            }
            for op in ops {
                if let (Some(h), Op::Set(v, l, p)) = (since_t0.as_mut(), &op) {
                    // Unmapped at the start unless recorded.
                    h.entry((*v, *l)).or_insert_with(|| [Pba::NONE.0].into()).insert(val(*p));
                }
                match op {
                    Op::Set(v, l, p) => {
                        if l < sizes[v as usize] {
                            let old = l2p.set(&mut dev, VolumeId(v.into()), Lba(l), Pba(val(p))).unwrap();
                            let want = model.insert((v, l), val(p)).unwrap_or(Pba::NONE.0);
                            prop_assert_eq!(old, Pba(want));
                        }
                    }
                    Op::Get(v, l) => {
                        let got = l2p.get(&mut dev, VolumeId(v.into()), Lba(l)).unwrap();
                        let want = (l < sizes[v as usize]).then(|| Pba(*model.get(&(v, l)).unwrap_or(&Pba::NONE.0)));
                        prop_assert_eq!(got, want);
                    }
                    Op::Relocate(sel, p) => {
                        // Pick a mapped entry, as a relocation only moves valid blocks.
                        let mut mapped: Vec<_> = model.iter().filter(|e| *e.1 != Pba::NONE.0).map(|e| *e.0).collect();
                        mapped.sort_unstable();
                        if !mapped.is_empty() {
                            let (v, l) = mapped[sel as usize % mapped.len()];
                            l2p.relocate(&mut dev, VolumeId(v.into()), Lba(l), Pba(val(p))).unwrap();
                            model.insert((v, l), val(p));
                            if let Some(h) = since_t0.as_mut() {
                                h.entry((v, l)).or_default().insert(val(p));
                            }
                        }
                    }
                    Op::Peek(v, l) => {
                        if l < sizes[v as usize] {
                            let mut page = Box::new([Pba(0); MAX_EPP]);
                            let p = (l / epp) as usize;
                            let got = if l2p.peek_page(&mut dev, VolumeId(v.into()), p, &mut page).unwrap() {
                                page[(l % epp) as usize].0
                            } else {
                                Pba::NONE.0
                            };
                            prop_assert_eq!(got, *model.get(&(v, l)).unwrap_or(&Pba::NONE.0));
                        }
                    }
                    Op::WriteBackAll => {
                        drain(&mut l2p, &mut dev, &mut loads, &mut writes);
                        l2p.write_back_all(&mut dev).unwrap();
                    }
                    Op::StartLoad(v, l, read_now) => {
                        let p = (l / epp) as usize;
                        if let Some(off) = l2p.start_load(VolumeId(v.into()), p) {
                            let data = read_now.then(|| {
                                let mut b = vec![0u8; PAGE_BYTES];
                                dev.read_at(off, &mut b).unwrap();
                                b
                            });
                            loads.push((v, p, off, data));
                        }
                    }
                    Op::FinishLoad(sel, fail) => {
                        if !loads.is_empty() {
                            let (v, p, off, data) = loads.remove(sel as usize % loads.len());
                            let data = data.unwrap_or_else(|| {
                                let mut b = vec![0u8; PAGE_BYTES];
                                dev.read_at(off, &mut b).unwrap();
                                b
                            });
                            l2p.finish_load(VolumeId(v.into()), p, (!fail).then_some(&data[..]));
                            l2p.install_arrived(&mut dev).unwrap();
                        }
                    }
                    Op::StartWriteBacks(n) => {
                        let mut out = Vec::new();
                        l2p.start_write_backs(n.into(), 2, &mut out);
                        for (f, t) in out {
                            writes.push((f, t, l2p.page_bytes(f).to_vec()));
                        }
                    }
                    Op::FinishWriteBack(sel, fail) => {
                        if !writes.is_empty() {
                            let (f, t, data) = writes.remove(sel as usize % writes.len());
                            if !fail {
                                dev.write_at(l2p.target_offset(&t), &data).unwrap();
                            }
                            l2p.finish_write_back(f, t, !fail);
                            l2p.install_arrived(&mut dev).unwrap();
                        }
                    }
                    Op::CkptBegin(room) => {
                        t0_switches = l2p.mark_checkpoint_pending(room.into());
                        prop_assert!(t0_switches.len() <= room.into());
                        let mut h: HashMap<_, std::collections::HashSet<u64>> = HashMap::new();
                        for (&k, &p) in &model {
                            h.entry(k).or_default().insert(p);
                        }
                        since_t0 = Some(h);
                    }
                    Op::CkptStep => {
                        if since_t0.is_some() {
                            l2p.write_back_pending(&mut dev, 2).unwrap();
                        }
                        if since_t0.is_some() && l2p.pending_pages() == 0 {
                            // The commit drains the engine's I/O first.
                            drain(&mut l2p, &mut dev, &mut loads, &mut writes);
                            // What the checkpoint would reference, its switches over the
                            // pages: every entry holds its value at the start or a later one.
                            let h = since_t0.take().unwrap();
                            let recorded: HashMap<(u8, u64), u64> = t0_switches
                                .iter()
                                .map(|s| ((s.volume().0 as u8, s.lba().0), s.pba.0))
                                .collect();
                            for v in 0..2u8 {
                                let pages = sizes[v as usize].div_ceil(epp) as usize;
                                for p in 0..pages {
                                    let mut page = vec![Pba(0); epp as usize];
                                    l2p.read_page(&mut dev, VolumeId(v.into()), p, &mut page).unwrap();
                                    for (i, &e) in page.iter().enumerate() {
                                        let l = p as u64 * epp + i as u64;
                                        let e = recorded.get(&(v, l)).copied().unwrap_or(e.0);
                                        if l >= sizes[v as usize] {
                                            continue;
                                        }
                                        let ok = match h.get(&(v, l)) {
                                            Some(vals) => vals.contains(&e),
                                            None => e == Pba::NONE.0,
                                        };
                                        prop_assert!(ok, "vol {} lba {} on media {:#x}, held {:?} since the start", v, l, e, h.get(&(v, l)));
                                    }
                                }
                            }
                            l2p.checkpoint_committed();
                        }
                    }
                    Op::Checkpoint(room) => {
                        if since_t0.take().is_some() {
                            l2p.clear_checkpoint_pending();
                        }
                        drain(&mut l2p, &mut dev, &mut loads, &mut writes);
                        let switches = l2p.checkpoint_switches(&mut dev, room.into()).unwrap();
                        prop_assert!(switches.len() <= room.into());
                        prop_assert!(switches.windows(2).all(|w| w[0] < w[1]));
                        l2p.write_back_all(&mut dev).unwrap();
                        l2p.checkpoint_committed();
                        // An open of the checkpoint (directories, then its switches)
                        // maps exactly what the model does.
                        let mut opened = L2p::new(fmt, 2, 30, 3, 0);
                        for (v, m) in l2p.vols.iter().enumerate() {
                            let m = m.as_ref().unwrap();
                            opened.vols[v] = Some(VolumeMap::from_dir(m.dir.clone(), m.entries));
                        }
                        opened.rebuild_pool(30).unwrap();
                        opened.load_switches(&switches);
                        let mut seen = 0;
                        opened.for_each_mapped(&mut dev, |v, l, p| {
                            assert_eq!(model.get(&(v.0 as u8, l.0)), Some(&p.0), "vol {} lba {} after an open", v.0, l.0);
                            seen += 1;
                        }).unwrap();
                        prop_assert_eq!(seen, model.values().filter(|&&p| p != Pba::NONE.0).count());
                    }
                    Op::DrainStep(n) => {
                        let before = l2p.deferred_switches().0;
                        let faulted = l2p.drain_step(&mut dev, n.into()).unwrap();
                        prop_assert!(!faulted || l2p.deferred_switches().0 < before);
                    }
                    Op::Resize(v, s) => {
                        // Volume changes take a synchronous checkpoint, abandoning an
                        // incremental one.
                        if since_t0.take().is_some() {
                            l2p.clear_checkpoint_pending();
                        }
                        // Callers unmap past a shrink first.
                        for l in s..sizes[v as usize] {
                            if model.remove(&(v, l)).is_some() {
                                l2p.set(&mut dev, VolumeId(v.into()), Lba(l), Pba::NONE).unwrap();
                            }
                        }
                        l2p.resize_volume(VolumeId(v.into()), s);
                        sizes[v as usize] = s;
                    }
                }
                prop_assert!(l2p.cached_pages() <= 3);
                prop_assert!(l2p.deferred_switches().0 <= 6);
                let mut used = std::collections::HashSet::new();
                for m in l2p.vols.iter().flatten() {
                    for d in &m.dir {
                        if d.slot != L2P_SLOT_NONE {
                            prop_assert!(used.insert(d.slot / 2), "pool page {} owned twice", d.slot / 2);
                        }
                    }
                }
            }
            drain(&mut l2p, &mut dev, &mut loads, &mut writes);
            let mut seen = 0;
            l2p.for_each_mapped(&mut dev, |v, l, p| {
                assert_eq!(model.get(&(v.0 as u8, l.0)), Some(&p.0));
                seen += 1;
            }).unwrap();
            prop_assert_eq!(seen, model.values().filter(|&&p| p != Pba::NONE.0).count());
        }
    }

    /// A loaded page waits for a write-back to clean a frame, but not forever: after
    /// `INSTALL_TRIES_MAX` tries it writes a dirty page back itself.
    #[test]
    fn an_arrived_page_gets_a_frame_even_while_write_backs_lag() {
        let mut dev = MemDevice::new(64 * 4096, 4096).unwrap();
        let mut l2p = L2p::new(L2pFormat::NARROW, 1, 30, 3, 0);
        l2p.add_volume(VolumeId(0), 8 * 1024);
        // Page 3 is stored; pages 0..3 fill the three frames, all dirty.
        l2p.set(&mut dev, VolumeId(0), Lba(3 * 1024), Pba(33))
            .unwrap();
        l2p.write_back_all(&mut dev).unwrap();
        for p in 0..3u64 {
            // More changed entries than a frame lists: these must be written back.
            for i in 0..=DIRTY_LOG as u64 {
                l2p.set(&mut dev, VolumeId(0), Lba(p * 1024 + 1 + i), Pba(100 + i))
                    .unwrap();
            }
            l2p.set(&mut dev, VolumeId(0), Lba(p * 1024), Pba(p))
                .unwrap();
        }
        let mut out = Vec::new();
        l2p.start_write_backs(1, 1, &mut out);
        assert_eq!(out.len(), 1);
        let off = l2p.start_load(VolumeId(0), 3).unwrap();
        let mut b = vec![0u8; PAGE_BYTES];
        dev.read_at(off, &mut b).unwrap();
        l2p.finish_load(VolumeId(0), 3, Some(&b));
        assert!(l2p.is_loading(VolumeId(0), 3), "no clean frame: it waits");
        let mut calls = 1;
        while l2p.is_loading(VolumeId(0), 3) {
            l2p.install_arrived(&mut dev).unwrap();
            calls += 1;
            assert!(calls < 100, "never installed");
        }
        assert!(calls > 60, "installed after {calls} calls");
        assert_eq!(
            l2p.get(&mut dev, VolumeId(0), Lba(3 * 1024)).unwrap(),
            Some(Pba(33))
        );
        let (f, t) = out[0];
        let page = l2p.page_bytes(f).to_vec();
        dev.write_at(l2p.target_offset(&t), &page).unwrap();
        l2p.finish_write_back(f, t, true);
        for p in 0..3u64 {
            assert_eq!(
                l2p.get(&mut dev, VolumeId(0), Lba(p * 1024)).unwrap(),
                Some(Pba(p))
            );
        }
    }

    /// A dirty page with few changes leaves the cache as deferred switches (no page
    /// write), and a peek, its next fault and a checkpoint's drain all see them; one
    /// with more changes than a frame lists is written back.
    #[test]
    fn few_changes_evict_as_switches_and_come_back() {
        let mut dev = MemDevice::new(64 * 4096, 4096).unwrap();
        let mut l2p = L2p::new(L2pFormat::NARROW, 1, 30, 1, 0);
        let v = VolumeId(0);
        l2p.add_volume(v, 8 * 1024);
        l2p.set(&mut dev, v, Lba(5), Pba(50)).unwrap();
        l2p.set(&mut dev, v, Lba(7), Pba(70)).unwrap();
        l2p.set(&mut dev, v, Lba(5), Pba(51)).unwrap();
        // Page 1 pushes page 0 out (two changes: switches), page 2 pushes page 1 out
        // (seven changes: written back).
        for i in 0..=DIRTY_LOG as u64 {
            l2p.set(&mut dev, v, Lba(1024 + i), Pba(200 + i)).unwrap();
        }
        l2p.set(&mut dev, v, Lba(2048), Pba(1)).unwrap();
        assert_eq!(l2p.counters.evicted_as_switches, 1);
        assert_eq!(l2p.counters.page_writes, 1);
        assert_eq!(l2p.deferred_switches().0, 2);
        let mut out = [Pba(0); MAX_EPP];
        assert!(l2p.peek_page(&mut dev, v, 0, &mut out).unwrap());
        assert_eq!((out[5], out[7]), (Pba(51), Pba(70)));
        assert_eq!(out[6], Pba::NONE);
        // Faulting page 0 back applies its two and evicts page 2's one change.
        assert_eq!(l2p.get(&mut dev, v, Lba(5)).unwrap(), Some(Pba(51)));
        assert_eq!(l2p.get(&mut dev, v, Lba(7)).unwrap(), Some(Pba(70)));
        assert_eq!(l2p.counters.evicted_as_switches, 2);
        assert_eq!(l2p.deferred_switches().0, 1);
        for i in 0..=DIRTY_LOG as u64 {
            assert_eq!(
                l2p.get(&mut dev, v, Lba(1024 + i)).unwrap(),
                Some(Pba(200 + i))
            );
        }
        // A checkpoint's drain writes back what it faults in instead of making new
        // switches.
        l2p.apply_deferred(&mut dev).unwrap();
        assert_eq!(l2p.deferred_switches().0, 0);
        l2p.write_back_all(&mut dev).unwrap();
        let mut fresh = L2p::new(L2pFormat::NARROW, 1, 30, 1, 0);
        fresh.add_volume(v, 8 * 1024);
        fresh.vols[0].as_mut().unwrap().dir = l2p.vols[0].as_ref().unwrap().dir.clone();
        for (lba, pba) in [(5, 51), (7, 70), (1030, 206), (2048, 1)] {
            assert_eq!(fresh.get(&mut dev, v, Lba(lba)).unwrap(), Some(Pba(pba)));
        }
    }

    /// A write-back whose device write fails leaves that page dirty (and its new
    /// pool page free again); the next write-back writes it, and every page faults
    /// back in with its values.
    #[test]
    fn a_failed_write_back_leaves_the_page_dirty() {
        use shale_device::{ErrorRule, FaultDevice};
        let mut dev = FaultDevice::new(64 * 4096, 4096, 1).unwrap();
        let ctl = dev.controller();
        let mut l2p = L2p::new(L2pFormat::NARROW, 2, 30, 3, 0);
        l2p.add_volume(VolumeId(0), 6000);
        l2p.add_volume(VolumeId(1), 6000);
        for (i, l) in [0u64, 1024, 2048].into_iter().enumerate() {
            l2p.set(&mut dev, VolumeId(0), Lba(l), Pba(100 + i as u64))
                .unwrap();
        }
        let free_before = l2p.pool.free();
        ctl.add_error_rule(ErrorRule {
            reads: false,
            writes: true,
            offset: 0,
            len: 64 * 4096,
            remaining: Some(1),
        });
        assert!(l2p.write_back_all(&mut dev).is_err());
        // Two pages written (two pool pages taken), one failed and gave its back.
        assert_eq!(l2p.pool.free(), free_before - 2);
        assert_eq!(l2p.write_back_all(&mut dev).unwrap(), BS);
        assert_eq!(l2p.write_back_all(&mut dev).unwrap(), 0);
        // Evict all three (other pages take the frames), then fault them back.
        for l in [0u64, 1024, 2048] {
            l2p.set(&mut dev, VolumeId(1), Lba(l), Pba(7)).unwrap();
        }
        for (i, l) in [0u64, 1024, 2048].into_iter().enumerate() {
            let got = l2p.get(&mut dev, VolumeId(0), Lba(l)).unwrap();
            assert_eq!(got, Some(Pba(100 + i as u64)), "lba {l}");
        }
    }

    /// A batch of pages is read at once and cached; a page whose read fails is left to
    /// its fault, which reports the error; cached and never-written pages are skipped.
    #[test]
    fn load_pages_reads_a_batch_and_leaves_failures_to_the_fault() {
        use shale_device::{ErrorRule, FaultDevice};
        let mut dev = FaultDevice::new(64 * 4096, 4096, 1).unwrap();
        let ctl = dev.controller();
        let mut l2p = L2p::new(L2pFormat::NARROW, 2, 30, 8, 0);
        l2p.add_volume(VolumeId(0), 8 * 1024);
        for p in 0..4u64 {
            l2p.set(&mut dev, VolumeId(0), Lba(p * 1024 + 5), Pba(50 + p))
                .unwrap();
        }
        l2p.write_back_all(&mut dev).unwrap();
        // Evict them: other pages of another volume take every frame.
        l2p.add_volume(VolumeId(1), 8 * 1024);
        for p in 0..8u64 {
            l2p.set(&mut dev, VolumeId(1), Lba(p * 1024), Pba(7))
                .unwrap();
        }
        l2p.write_back_all(&mut dev).unwrap();
        // Page 3's stored copy fails to read.
        let slot3 = l2p.vols[0].as_ref().unwrap().dir[3].slot;
        ctl.add_error_rule(ErrorRule {
            reads: true,
            writes: false,
            offset: u64::from(slot3) * 4096,
            len: 4096,
            remaining: Some(2),
        });
        let reads = l2p.counters.page_reads;
        let keys: Vec<(VolumeId, usize)> = (0..6).map(|p| (VolumeId(0), p)).collect();
        l2p.load_pages(&mut dev, &keys).unwrap();
        // Pages 0..3 read; 3 failed; 4 and 5 were never written.
        assert_eq!(l2p.counters.page_reads - reads, 3);
        assert_eq!(l2p.loads_in_flight(), 0);
        for p in 0..3u64 {
            let got = l2p.get(&mut dev, VolumeId(0), Lba(p * 1024 + 5)).unwrap();
            assert_eq!(got, Some(Pba(50 + p)));
        }
        assert_eq!(l2p.counters.page_reads - reads, 3, "the batch was cached");
        assert!(l2p.get(&mut dev, VolumeId(0), Lba(3 * 1024 + 5)).is_err());
        assert_eq!(
            l2p.get(&mut dev, VolumeId(0), Lba(3 * 1024 + 5)).unwrap(),
            Some(Pba(53))
        );
    }
}
