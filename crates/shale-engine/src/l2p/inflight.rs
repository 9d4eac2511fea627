//! Asynchronous L2P page I/O: pages loaded ahead of the queued requests that need them,
//! and dirty pages near the LRU tail written back before an eviction needs their frame.
//! On a real cache device a miss then waits neither for the read nor for the evicted
//! page's write on the engine thread; the synchronous fault stays as the fallback.
//!
//! The engine submits the I/O (tags in its slab) and hands each completion back here.
//! What keeps this safe beside the synchronous paths:
//! - a page's directory entry changes only when a write-back of its cached frame
//!   completes, and a frame being written back is neither evicted nor written again:
//!   while a page is not cached its stored copy is stable, so a load needs no guard
//!   against writes, and no two writes to one slot are ever in flight;
//! - a page faulted synchronously while its load is in flight, or released by a volume
//!   change, makes that load stale: its data is dropped when it arrives;
//! - a load that fails (I/O error, CRC mismatch) is not retried in the background:
//!   the request that needs the page faults it synchronously and reports the error
//!   as it always did;
//! - a write-back captures the page when it is submitted (the frame stays usable and
//!   may be dirtied again); its completion points the directory at the new copy. A
//!   failed write-back fails the engine, as every failed metadata write does.

use std::collections::{HashMap, HashSet, VecDeque};

use shale_device::{BlockDevice, IoBuf, IoCompletion, IoOp, IoRequest};
use shale_format::{PageDesc, VolumeId, L2P_SLOT_NONE};

use super::directory::FRAME_NONE;
use super::page_cache::{slot_of, L2p, Slot, WriteBackTarget, PAGE_BYTES};
use crate::layout::BS;
use crate::EngineError;

/// (volume, page).
type PageKey = (u32, u32);

#[derive(Debug)]
struct Load {
    /// The stored copy being read (stable while the page is not cached).
    desc: PageDesc,
    stale: bool,
}

/// Page I/O in flight, keyed by (volume, page).
#[derive(Debug, Default)]
pub(crate) struct InflightPages {
    loads: HashMap<PageKey, Load>,
    /// Pages whose load failed: left to the synchronous fault, which reports why.
    failed: HashSet<PageKey>,
    /// Loaded pages waiting for a clean frame (still in `loads`, so their requests
    /// wait and a synchronous fault or volume change still makes them stale).
    arrived: VecDeque<(PageKey, Box<[u8; PAGE_BYTES]>)>,
    /// Write-backs in flight.
    pub(super) writes: usize,
    /// Calls of `install_arrived` in a row that found no clean frame.
    install_tries: u32,
}

/// Calls of `install_arrived` that may wait for a write-back to clean a frame before a
/// dirty one is written back synchronously instead.
const INSTALL_TRIES_MAX: u32 = 64;

/// Marks `load_pages`' tags, apart from every engine I/O tag (slab indices) and from
/// `write_back_all`'s.
const LOAD_TAG: u64 = 1 << 62;

impl L2p {
    /// Starts loading page `p` of `v` when that saves a synchronous fault: the page is
    /// stored (a page never written needs no read), not cached, not loading, and its
    /// last load did not fail. Returns the byte offset to read one page from.
    pub fn start_load(&mut self, v: VolumeId, p: usize) -> Option<u64> {
        let key = (v.0, p as u32);
        let m = self.vols.get(v.0 as usize)?.as_ref()?;
        let d = *m.dir.get(p)?;
        if d.slot == L2P_SLOT_NONE
            || matches!(slot_of(m.frame[p]), Slot::Frame(_))
            || self.io.loads.contains_key(&key)
            || self.io.failed.contains(&key)
        {
            return None;
        }
        self.io.loads.insert(
            key,
            Load {
                desc: d,
                stale: false,
            },
        );
        // The lookup this load serves is a miss; its first use will not count a hit.
        self.counters.misses += 1;
        Some((self.area_start + u64::from(d.slot)) * BS)
    }

    /// Loads the pages of `pages` that are stored and not cached as asynchronous reads,
    /// all in flight at once, and caches them: for the paths that would otherwise
    /// fault them one synchronous read at a time (recovery's replay, a drain of
    /// deferred switches). On a drive a read in flight costs little more than one
    /// alone, so a batch costs about one read's latency instead of one each.
    ///
    /// Only when nothing else is in flight on `dev` (our completions would mix with
    /// the caller's) and no other load is: otherwise nothing is done, and the faults
    /// that follow read the pages as they always did. A page whose read fails is left
    /// to its fault, which reports why. Returns bytes written (evicted dirty pages).
    pub fn load_pages<C: BlockDevice>(
        &mut self,
        dev: &mut C,
        pages: &[(VolumeId, usize)],
    ) -> Result<u64, EngineError> {
        if dev.in_flight() != 0 || !self.io.loads.is_empty() {
            return Ok(0);
        }
        let mut planned: Vec<(VolumeId, usize, Option<IoCompletion>)> = Vec::new();
        for &(v, p) in pages {
            if let Some(offset) = self.start_load(v, p) {
                dev.submit(IoRequest {
                    tag: LOAD_TAG | planned.len() as u64,
                    op: IoOp::Read {
                        offset,
                        buf: IoBuf::zeroed(PAGE_BYTES),
                    },
                });
                planned.push((v, p, None));
            }
        }
        let mut left = planned.len();
        let mut out = Vec::new();
        while left > 0 {
            out.clear();
            dev.poll(&mut out, left)
                .map_err(EngineError::cache("L2P page read poll", 0))?;
            for c in out.drain(..) {
                let Some(entry) = planned.get_mut((c.tag & !LOAD_TAG) as usize) else {
                    panic!("L2P page load: completion for unknown tag {}", c.tag);
                };
                entry.2 = Some(c);
                left -= 1;
            }
        }
        for (v, p, c) in planned {
            let data = c.and_then(|c| c.result.ok().and(c.buf));
            self.finish_load(v, p, data.as_deref());
        }
        self.install_arrived(dev)
    }

    /// True while a load of page `p` of `v` is in flight.
    pub fn is_loading(&self, v: VolumeId, p: usize) -> bool {
        self.io.loads.contains_key(&(v.0, p as u32))
    }

    pub fn loads_in_flight(&self) -> usize {
        self.io.loads.len()
    }

    pub fn writes_in_flight(&self) -> usize {
        self.io.writes
    }

    /// A synchronous fault or a volume change supersedes the page's load in flight (if
    /// any), and a failed load is forgotten.
    pub(super) fn forget_load(&mut self, v: u32, p: u32) {
        if let Some(l) = self.io.loads.get_mut(&(v, p)) {
            l.stale = true;
        }
        self.io.failed.remove(&(v, p));
    }

    /// The map slot of a page that exists and is not cached (empty or its deferred
    /// chain): where a loaded copy may be installed.
    fn uncached_slot(&self, (v, p): PageKey) -> Option<u32> {
        self.vols
            .get(v as usize)
            .and_then(Option::as_ref)
            .and_then(|m| m.frame.get(p as usize))
            .copied()
            .filter(|&c| !matches!(slot_of(c), Slot::Frame(_)))
    }

    /// The load of page `p` of `v` completed with `data` (`None`: the read failed).
    /// A current, intact page is cached in a clean frame, or waits in memory for one
    /// (`install_arrived`) rather than write a dirty page back on the spot.
    pub fn finish_load(&mut self, v: VolumeId, p: usize, data: Option<&[u8]>) {
        let key = (v.0, p as u32);
        let Some(load) = self.io.loads.get(&key) else {
            return;
        };
        let stale = load.stale;
        let intact =
            data.filter(|d| d.len() == PAGE_BYTES && shale_format::crc32c(d) == load.desc.crc32c);
        let Some(d) = intact.filter(|_| !stale) else {
            if !stale {
                self.io.failed.insert(key);
            }
            self.io.loads.remove(&key);
            return;
        };
        self.counters.page_reads += 1;
        self.counters.reads_ahead += 1;
        let Some(cur) = self.uncached_slot(key) else {
            self.io.loads.remove(&key);
            return;
        };
        if let Some(f) = self.take_clean_frame() {
            self.io.loads.remove(&key);
            self.frames[f as usize].data.copy_from_slice(d);
            self.install(f, v, p, cur);
            self.frames[f as usize].prefetched = true;
        } else {
            let mut page = Box::new([0u8; PAGE_BYTES]);
            page.copy_from_slice(d);
            self.io.arrived.push_back((key, page));
        }
    }

    /// Caches the pages that arrived, while clean frames last (with no write-back in
    /// flight to make one, a dirty page is written back synchronously, so the pages
    /// always get in). Returns bytes written to the cache device.
    pub fn install_arrived<C: shale_device::BlockDevice>(
        &mut self,
        dev: &mut C,
    ) -> Result<u64, EngineError> {
        let mut written = 0;
        while let Some((key, _)) = self.io.arrived.front() {
            let key = *key;
            let current = self.io.loads.get(&key).is_some_and(|l| !l.stale);
            let (Some(cur), true) = (self.uncached_slot(key), current) else {
                self.io.arrived.pop_front();
                self.io.loads.remove(&key);
                continue;
            };
            let f = match self.take_clean_frame() {
                Some(f) => f,
                // With no write-back in flight to make a clean frame, or after many
                // tries (background relocations may dirty the frames being cleaned
                // again), a dirty page is written back on the spot.
                None if self.io.writes == 0 || self.io.install_tries >= INSTALL_TRIES_MAX => {
                    let (f, w) = self.take_frame(dev)?;
                    written += w;
                    f
                }
                None => {
                    self.io.install_tries += 1;
                    break;
                }
            };
            self.io.install_tries = 0;
            let Some((_, page)) = self.io.arrived.pop_front() else {
                break;
            };
            self.io.loads.remove(&key);
            self.frames[f as usize].data.copy_from_slice(&page[..]);
            self.install(f, VolumeId(key.0), key.1 as usize, cur);
            self.frames[f as usize].prefetched = true;
        }
        Ok(written)
    }

    /// True when every frame of the budget is in use (evictions are under way).
    pub fn is_full(&self) -> bool {
        self.cached_pages() >= self.frames_max()
    }

    /// Starts write-backs of dirty frames from the LRU tail until `want_clean` frames
    /// there are clean or on their way to it, with at most `max_writes` in flight.
    /// Each started write is pushed to `out` as (frame, target); the caller submits
    /// `page_bytes(frame)` to `target` and reports back with `finish_write_back`.
    pub fn start_write_backs(
        &mut self,
        want_clean: usize,
        max_writes: usize,
        out: &mut Vec<(u32, WriteBackTarget)>,
    ) {
        let mut ready = self.io.writes;
        let mut f = self.tail;
        let mut seen = 0;
        while f != FRAME_NONE
            && ready < want_clean
            && self.io.writes < max_writes
            && seen < 4 * want_clean
        {
            let prev = self.frames[f as usize].prev;
            seen += 1;
            let fr = &self.frames[f as usize];
            if !fr.wb_inflight && (!fr.is_dirty() || self.can_evict_as_switches(f)) {
                // Clean, or it can leave as deferred switches: no write needed.
                ready += 1;
            } else if !fr.wb_inflight {
                if let Some(t) = self.write_back_target(f) {
                    let fr = &mut self.frames[f as usize];
                    fr.wb_inflight = true;
                    fr.mark_clean();
                    // The copy going out holds everything the checkpoint in progress
                    // needs of this page; its commit drains this write first.
                    self.unmark(f);
                    self.io.writes += 1;
                    out.push((f, t));
                }
                ready += 1;
            }
            f = prev;
        }
    }

    /// The bytes of frame `f` as stored.
    pub fn page_bytes(&self, f: u32) -> &[u8] {
        &self.frames[f as usize].data[..]
    }

    /// The device offset of a write-back target.
    pub fn target_offset(&self, t: &WriteBackTarget) -> u64 {
        t.offset(self.area_start)
    }

    /// A write-back started by `start_write_backs` completed (`ok`) or failed. On
    /// success the directory points at the new copy (the frame may be dirty again);
    /// on failure the frame is dirty again and a pool page taken for it goes back.
    pub fn finish_write_back(&mut self, f: u32, t: WriteBackTarget, ok: bool) {
        self.io.writes -= 1;
        let fr = &mut self.frames[f as usize];
        fr.wb_inflight = false;
        if !ok {
            if fr.volume != u32::MAX {
                // The copy did not get out: the page is dirty again, and a checkpoint
                // in progress still needs it (its mark went with the write).
                fr.mark_all_dirty();
                self.mark_for_checkpoint(f);
            }
            self.write_back_failed(&t);
            return;
        }
        let (v, p) = (fr.volume, fr.page);
        let Some(Some(m)) = self.vols.get_mut(v as usize) else {
            // Released by a volume change meanwhile: the slot holds nothing anyone
            // references. A pool page taken for it returns after the next checkpoint,
            // like the pages the change released.
            if t.new_pool_page {
                self.pool_deferred.push(t.slot / 2);
            }
            return;
        };
        m.dir[p as usize] = PageDesc {
            slot: t.slot,
            crc32c: t.crc32c,
        };
        self.counters.page_writes += 1;
        self.counters.writes_ahead += 1;
    }
}
