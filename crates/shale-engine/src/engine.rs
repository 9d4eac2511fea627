//! The engine: a single-threaded state machine over a cache device, a capacity device
//! and a clock. `submit` queues a request; `poll` reaps device completions, processes
//! queued requests, submits batched device writes and runs a bounded background step.
//! No threads, no locks, no system clock inside.
//!
//! Invariants:
//! - requests are taken from the queue in order; a write that cannot get space waits
//!   at the head (user writes never fail for lack of cache space);
//! - every device I/O in flight has exactly one entry in the I/O slab, keyed by tag;
//! - after a fatal device error every queued and later request fails with `Failed`.

use std::collections::VecDeque;

use shale_device::{BlockDevice, IoCompletion, ZoneCompletion, ZonedDevice};
use shale_format::{Pba, RegionRole};

use crate::checkpoint::Checkpointer;
use crate::core::Core;
use crate::flush::Durability;
use crate::mover::Mover;
use crate::prefetch::Prefetch;
use crate::read::reader::Reader;
use crate::request::Answer;
use crate::scrub::Scrubber;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, Completion, Config, EngineError, Reply, Request, VolumeLayout};

/// How many times its usual batch the census walks a loop iteration once space runs
/// short (256 pages a batch: 16 MiB of L2P pages, some milliseconds).
const CENSUS_RUSH: usize = 16;
/// L2P pages with waiting switches faulted in per loop iteration once the switches
/// near their bound (`L2p::drain_step`).
const DRAIN_PAGES_PER_POLL: usize = 16;

/// What a device I/O in flight is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InflightIo {
    CacheRun {
        group_id: u32,
        run_seq: u64,
        bytes: u32,
    },
    CacheMd {
        group_id: u32,
    },
    ZonePart {
        gc: bool,
        write: u32,
    },
    /// Both md copies of a group a user read needs (`key`: PBA of copy A).
    MdRead {
        key: u64,
    },
    /// Piece `part` of a mover's victim group read `read`.
    MoverRead {
        gc: bool,
        read: u16,
        part: u16,
    },
    /// `blocks` consecutive blocks of user read `op` from `block` on, at `pba` on.
    Read {
        op: u32,
        block: u32,
        blocks: u16,
        pba: Pba,
    },
    /// An L2P page loaded ahead of the queued request that needs it.
    L2pLoad {
        volume: u32,
        page: u32,
    },
    /// A dirty L2P page written back before an eviction needs its frame.
    L2pWriteBack {
        frame: u32,
        target: crate::l2p::WriteBackTarget,
    },
}

/// The translation layer: the event loop over the shared core and the roles that own
/// their state. See the crate docs for the data path.
pub struct Engine<C: BlockDevice, Z: ZonedDevice, K: Clock> {
    pub(crate) core: Core<C, Z, K>,
    pub(crate) queue: VecDeque<(Request, Answer)>,
    /// Requests of rate-limited volumes waiting for their turn.
    pub(crate) throttle: crate::throttle::Throttle,
    pub(crate) writer: ChunkWriter,
    pub(crate) reader: Reader,
    pub(crate) compaction: Mover,
    pub(crate) gc: Mover,
    pub(crate) durability: Durability,
    pub(crate) checkpointer: Checkpointer,
    pub(crate) prefetch: Prefetch,
    pub(crate) scrubber: Scrubber,
    pub(crate) health: Health,
    /// Scratch for the completions one reap takes from each device.
    pub(crate) completions: Completions,
    /// The hand-off store, when attached: acknowledgements wait for an image that
    /// covers them (`handoff.rs`).
    pub(crate) handoff: Option<crate::handoff::HandoffState>,
}

/// Device completions taken by one reap (kept to reuse their allocations).
#[derive(Debug, Default)]
pub(crate) struct Completions {
    pub cache: Vec<IoCompletion>,
    pub zone: Vec<ZoneCompletion>,
}

/// Whether the engine runs, and how long it has gone without progress.
#[derive(Debug, Default)]
pub(crate) struct Health {
    /// Why the engine stopped for good, once it has.
    pub fatal: Option<String>,
    /// Set when the head request waits for cache space.
    pub user_blocked: bool,
    pub stalled_polls: u32,
    pub blocked_polls: u64,
    /// Engine-clock time the current stall (no progress) and the current wait of
    /// the head write for space began: what `Config::stuck_after_ms` measures.
    pub stalled_since: Option<u64>,
    pub blocked_since: Option<u64>,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> std::fmt::Debug for Engine<C, Z, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("chunks", &self.core.geo.chunk_count)
            .field("zones", &self.core.geo.zone_count)
            .field("queued", &self.queue.len())
            .field("inflight_io", &self.core.io.count)
            .finish_non_exhaustive()
    }
}

/// Polls without progress (with work waiting) before padding is forced. Whether the
/// engine is stuck is decided by time (`Config::stuck_after_ms`).
const STALL_FORCE_POLLS: u32 = 8;
/// Polls a write may wait at the head of the queue between forced paddings; a wait
/// longer than `Config::stuck_after_ms` is a livelock (a bug, reported as `Failed`).
const BLOCKED_FORCE_POLLS: u64 = 64;

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Queues a request; `done` is called exactly once, from a later `poll` (or at once
    /// if the engine has failed).
    pub fn submit(&mut self, req: Request, done: Completion) {
        let done = Answer::new(done);
        if let Some(reason) = &self.health.fatal {
            done.send(Err(EngineError::Failed {
                reason: reason.clone(),
            }));
            return;
        }
        if self.throttle.is_empty() {
            self.queue.push_back((req, done));
            return;
        }
        let now = self.core.now();
        if let Request::ResizeVolume { volume, .. } | Request::DeleteVolume { volume } = &req {
            // Requests of the volume sent before the change go first, limits or not.
            let before = self.throttle.release_volume(*volume, now);
            self.queue.extend(before);
        }
        if let Some(item) = self.throttle.hold(req, done, now) {
            self.queue.push_back(item);
        }
    }

    /// Why the engine stopped, once a fatal error has stopped it.
    pub fn failure(&self) -> Option<&str> {
        self.health.fatal.as_deref()
    }

    /// Requests queued and not yet started.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// True when nothing is queued, in flight, or waiting for completion.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
            && self.core.io.count == 0
            && self.writer.pending.is_empty()
            && self.writer.ready.is_empty()
            && self.durability.waiters.is_empty()
            && !self.durability.requested
            && self.core.directs.is_empty()
    }

    /// One engine loop iteration. Returns true if anything moved.
    pub fn poll(&mut self) -> bool {
        let progress = match self.poll_inner() {
            Ok(p) => p,
            Err(e) => {
                self.fail(e);
                true
            }
        };
        self.deliver();
        progress
    }

    /// Sends the acknowledgements held back for the hand-off image once an image
    /// covering them is stored, or a durability point made them durable.
    fn deliver(&mut self) {
        if self.writer.ready.is_empty() {
            return;
        }
        if let Some(h) = self.handoff.as_mut() {
            let durable = match h.publish(&mut self.core, &self.writer) {
                Ok(crate::handoff::Published::Stored) => false,
                Ok(crate::handoff::Published::NeedsDurability) => true,
                Err(e) => {
                    // A store that fails once (tmpfs full, the file removed) is not
                    // trusted again: without it a kill loses the writes since the
                    // last flush, as it would with none attached.
                    tracing::error!(error = %e, "storing the hand-off image failed; going on without the store: a kill now loses writes acknowledged since the last flush");
                    self.handoff = None;
                    self.writer.hold_acks = false;
                    true
                }
            };
            if durable {
                if let Err(e) = self.durability_point() {
                    // fail() answers the held acknowledgements with the error.
                    self.fail(e);
                    return;
                }
            }
        }
        for a in self.writer.ready.drain(..) {
            a.send(Ok(Reply::Done));
        }
    }

    /// Attaches a hand-off store (`handoff.rs`): from now on a write is acknowledged
    /// only once an image that recovers it after a kill of the process is stored.
    /// Clears what the store held (everything it could claim is durable now).
    pub fn attach_handoff(&mut self, mut store: Box<dyn crate::Handoff>) -> std::io::Result<()> {
        store.clear()?;
        self.handoff = Some(crate::handoff::HandoffState::new(store));
        self.writer.hold_acks = true;
        Ok(())
    }

    fn poll_inner(&mut self) -> Result<bool, EngineError> {
        if self.health.fatal.is_some() {
            self.fail_queued();
            return Ok(false);
        }
        let mut progress = self.reap(0)?;
        if !self.throttle.is_empty() {
            self.throttle.release(self.core.now(), &mut self.queue);
        }
        let dispatched = self.process_requests()?;
        progress |= dispatched;
        if self.health.fatal.is_some() {
            // A request failed the engine (e.g. a volume change that could not be
            // persisted): nothing more may reach the devices.
            self.fail_queued();
            return Ok(true);
        }
        let now = self.core.now();
        let stuck_after_ns = self.core.config.stuck_after_ms.saturating_mul(1_000_000);
        if dispatched || !self.health.user_blocked {
            self.health.blocked_polls = 0;
            self.health.blocked_since = None;
        } else {
            self.health.blocked_polls += 1;
            let since = *self.health.blocked_since.get_or_insert(now);
            if self
                .health
                .blocked_polls
                .is_multiple_of(BLOCKED_FORCE_POLLS)
            {
                // A write has waited long: release whatever partial batches hold.
                progress |= self.force_background()?;
            }
            if now.saturating_sub(since) >= stuck_after_ns {
                return Err(EngineError::Failed {
                    reason: format!(
                        "a write waited {:.1} s ({} polls) for cache space: free chunks {}, free zones {}, pending free {}, staged {}",
                        now.saturating_sub(since) as f64 / 1e9,
                        self.health.blocked_polls,
                        self.core.regions.free_chunks.len(),
                        self.core.regions.free_zones.len(),
                        self.core.regions.pending_free.len(),
                        self.compaction.staged_blocks() + self.gc.staged_blocks()
                    ),
                });
            }
        }
        progress |= self.linger_directs()?;
        self.writer.submit_runs(&mut self.core)?;
        self.settle_directs();
        if self.durability.requested {
            self.durability_point()?;
            progress = true;
        }
        // Acknowledgements leave before the background work, which can take a while.
        self.deliver();
        if self.health.fatal.is_some() {
            return Ok(true);
        }
        progress |= self.background()?;
        self.writer.submit_runs(&mut self.core)?;
        // The devices' own work (an array's rebuild, an operator's command).
        let cache_wake = self.core.cache.maintain();
        self.core.device_wake_ns = cache_wake.min(self.core.capacity.maintain());
        if !progress && !self.queue.is_empty() && self.core.io.count == 0 {
            self.health.stalled_polls += 1;
            let since = *self.health.stalled_since.get_or_insert(now);
            if self.health.stalled_polls >= STALL_FORCE_POLLS {
                // Victims held hostage by partial batches: pad them out, then make the
                // freed space reusable.
                progress |= self.force_background()?;
            }
            if now.saturating_sub(since) >= stuck_after_ns {
                return Err(EngineError::Failed {
                    reason: format!(
                        "no progress for {:.1} s ({} polls): free chunks {}, free zones {}, pending free {}",
                        now.saturating_sub(since) as f64 / 1e9,
                        self.health.stalled_polls,
                        self.core.regions.free_chunks.len(),
                        self.core.regions.free_zones.len(),
                        self.core.regions.pending_free.len()
                    ),
                });
            }
        } else if progress {
            self.health.stalled_polls = 0;
            self.health.stalled_since = None;
        }
        Ok(progress)
    }

    /// Blocks until at least one device completion arrives (if any I/O is in flight).
    /// How soon the devices want [`Self::poll`] again for their own work, in
    /// nanoseconds ([`shale_device::MAINTAIN_IDLE`]: only with other work).
    pub fn device_wake_ns(&self) -> u64 {
        self.core.device_wake_ns.min(self.throttle.wake_ns())
    }

    pub fn wait_io(&mut self) {
        if let Err(e) = self.reap(1) {
            self.fail(e);
        }
    }

    /// Polls until idle. For tests, tools and shutdown.
    pub fn run_until_idle(&mut self) -> Result<(), EngineError> {
        // Rate limits do not hold here: everything waiting is served.
        self.queue.extend(self.throttle.take_all());
        loop {
            let progress = self.poll();
            if let Some(r) = &self.health.fatal {
                return Err(EngineError::Failed { reason: r.clone() });
            }
            if self.is_idle() {
                return Ok(());
            }
            if !progress {
                self.wait_io();
            }
        }
    }

    /// Stops the engine for good: logged once, with the first cause; every request
    /// held and every later one is answered `Failed`, and nothing more reaches the
    /// devices (so what recovery will find is what was durable).
    pub(crate) fn fail(&mut self, e: EngineError) {
        if self.health.fatal.is_none() {
            tracing::error!(error = %e, "engine failed; every request fails from now on");
            self.health.fatal = Some(e.to_string());
        }
        self.fail_queued();
    }

    fn fail_queued(&mut self) {
        // Its waiters are answered below: no durability point is owed any more.
        self.durability.requested = false;
        let reason = self.health.fatal.clone().unwrap_or_default();
        for done in self.take_answers() {
            done.send(Err(EngineError::Failed {
                reason: reason.clone(),
            }));
        }
    }

    /// Every request the engine holds, unanswered, in the order they are answered on
    /// failure: queued, writes waiting for their blocks, flush waiters, reads.
    fn take_answers(&mut self) -> Vec<Answer> {
        let mut out: Vec<Answer> = self.queue.drain(..).map(|(_, d)| d).collect();
        out.extend(self.throttle.take_all().into_iter().map(|(_, d)| d));
        self.prefetch.looked = 0;
        out.extend(self.writer.pending.drain(..).map(|w| w.done));
        out.append(&mut self.writer.ready);
        out.append(&mut self.durability.waiters);
        out.extend(self.core.directs.take_all());
        out.extend(
            self.reader
                .ops
                .iter_mut()
                .filter_map(|r| r.take().and_then(|op| op.done)),
        );
        out
    }

    /// Reaps device completions, waiting for `min` if I/O is in flight.
    pub(crate) fn reap(&mut self, min: usize) -> Result<bool, EngineError> {
        let mut any = false;
        let mut cache_done = std::mem::take(&mut self.completions.cache);
        let mut zone_done = std::mem::take(&mut self.completions.zone);
        let cache_min = if min > 0 && self.core.cache.in_flight() > 0 {
            min
        } else {
            0
        };
        self.core
            .cache
            .poll(&mut cache_done, cache_min)
            .map_err(EngineError::cache("poll", 0))?;
        let zone_min = if min > 0 && cache_done.is_empty() && self.core.capacity.in_flight() > 0 {
            min
        } else {
            0
        };
        self.core
            .capacity
            .poll(&mut zone_done, zone_min)
            .map_err(EngineError::cache("capacity poll", 0))?;
        if self.health.fatal.is_some() {
            // A failed engine answered every request it held (`take_answers`): what
            // the devices still complete is only released, never acted on (a read's
            // reply, a write's acknowledgement are gone).
            any = !cache_done.is_empty() || !zone_done.is_empty();
            for (tag, buf) in cache_done
                .drain(..)
                .map(|c| (c.tag, c.buf))
                .chain(zone_done.drain(..).map(|c| (c.tag, c.buf)))
            {
                self.release(tag, buf);
            }
            self.completions.cache = cache_done;
            self.completions.zone = zone_done;
            return Ok(any);
        }
        // After an error (which fails the engine) the rest are only released.
        let mut result = Ok(());
        for c in cache_done.drain(..) {
            any = true;
            if result.is_ok() {
                result = self.on_cache_completion(c);
            } else {
                self.release(c.tag, c.buf);
            }
        }
        for c in zone_done.drain(..) {
            any = true;
            if result.is_ok() {
                result = self.on_zone_completion(c);
            } else {
                self.release(c.tag, c.buf);
            }
        }
        self.completions.cache = cache_done;
        self.completions.zone = zone_done;
        result?;
        if any {
            self.writer.complete_writes(&mut self.durability);
        }
        Ok(any)
    }

    fn on_cache_completion(&mut self, c: IoCompletion) -> Result<(), EngineError> {
        let Some(io) = self.core.io.take(c.tag) else {
            panic!("cache completion with unknown tag {}", c.tag);
        };
        match io {
            InflightIo::CacheRun {
                group_id,
                run_seq,
                bytes,
            } => {
                c.result.map_err(EngineError::cache("user data write", 0))?;
                if let Some(b) = c.buf {
                    self.core.bufs.give(b);
                }
                self.writer
                    .on_run_done(&mut self.core, group_id, run_seq, bytes)
            }
            InflightIo::CacheMd { group_id } => {
                c.result.map_err(EngineError::cache("md write", 0))?;
                if let Some(b) = c.buf {
                    self.core.bufs.give(b);
                }
                self.writer.on_md_done(&mut self.core, group_id)
            }
            InflightIo::Read {
                op,
                block,
                blocks,
                pba,
            } => {
                let r = c.result.map_err(EngineError::cache("user data read", 0));
                self.reader.on_read_done(
                    &mut self.core,
                    &self.writer,
                    (op, block, blocks),
                    pba,
                    r.map(|_| c.buf),
                )
            }
            InflightIo::MoverRead { gc, read, part } => {
                c.result
                    .map_err(EngineError::cache("victim group read", 0))?;
                {
                    let (mover, core, floor) = self.mover_with_core(gc);
                    mover.on_read_done(core, floor, read, part, c.buf)
                }
            }
            InflightIo::MdRead { key } => {
                let r = c.result.map_err(EngineError::cache("md read", 0));
                self.reader
                    .on_md_read_done(&mut self.core, &self.writer, key, r.map(|_| c.buf));
                Ok(())
            }
            InflightIo::L2pLoad { volume, page } => {
                let data = c.result.is_ok().then_some(c.buf.as_deref()).flatten();
                self.core
                    .l2p
                    .finish_load(shale_format::VolumeId(volume), page as usize, data);
                if let Some(b) = c.buf {
                    self.core.bufs.give(b);
                }
                self.core
                    .l2p
                    .install_arrived(&mut self.core.cache)
                    .map(|_| ())
            }
            InflightIo::L2pWriteBack { frame, target } => {
                let ok = c.result.is_ok();
                self.core.l2p.finish_write_back(frame, target, ok);
                if let Some(b) = c.buf {
                    self.core.bufs.give(b);
                }
                let off = self.core.l2p.target_offset(&target);
                c.result
                    .map_err(EngineError::cache("L2P page write", off))?;
                self.core
                    .l2p
                    .install_arrived(&mut self.core.cache)
                    .map(|_| ())
            }
            InflightIo::ZonePart { .. } => panic!("zone write completed on the cache device"),
        }
    }

    /// A completion nothing waits for any more: its I/O slot and buffer are freed.
    fn release(&mut self, tag: u64, buf: Option<shale_device::IoBuf>) {
        self.core.io.take(tag);
        if let Some(b) = buf {
            self.core.bufs.give(b);
        }
    }

    fn on_zone_completion(&mut self, c: ZoneCompletion) -> Result<(), EngineError> {
        let Some(io) = self.core.io.take(c.tag) else {
            panic!("capacity completion with unknown tag {}", c.tag);
        };
        match io {
            InflightIo::ZonePart { gc, write } => {
                let at = self.mover_of(gc).zone_writes[write as usize]
                    .as_ref()
                    .map_or(0, |w| self.core.geo.zone_offset(w.zone, w.first_slot));
                c.result
                    .map_err(EngineError::capacity("zone group write", at))?;
                if let Some(b) = c.buf {
                    self.core.bufs.give(b);
                }
                let (mover, core, _) = self.mover_with_core(gc);
                mover.on_zone_part_done(core, write)
            }
            InflightIo::Read {
                op,
                block,
                blocks,
                pba,
            } => {
                let r = c
                    .result
                    .map(|_| c.buf)
                    .map_err(EngineError::capacity("user data read", 0));
                self.reader
                    .on_read_done(&mut self.core, &self.writer, (op, block, blocks), pba, r)
            }
            InflightIo::MoverRead { gc, read, part } => {
                c.result
                    .map_err(EngineError::capacity("victim group read", 0))?;
                {
                    let (mover, core, floor) = self.mover_with_core(gc);
                    mover.on_read_done(core, floor, read, part, c.buf)
                }
            }
            InflightIo::MdRead { key } => {
                let r = c
                    .result
                    .map(|_| c.buf)
                    .map_err(EngineError::capacity("md read", 0));
                self.reader
                    .on_md_read_done(&mut self.core, &self.writer, key, r);
                Ok(())
            }
            _ => panic!("cache I/O completed on the capacity device"),
        }
    }

    fn process_requests(&mut self) -> Result<bool, EngineError> {
        let mut progress = false;
        self.health.user_blocked = false;
        if self.prefetch.run(&mut self.core, &self.queue)? {
            // Hands the loads to the devices now (and takes those already done: a
            // memory device completes them at once) rather than a loop iteration later.
            self.reap(0)?;
        }
        for _ in 0..self.core.config.requests_per_poll_max {
            if self
                .queue
                .front()
                .is_some_and(|(req, _)| self.prefetch.waits_for_l2p(&self.core, req))
            {
                // Its L2P pages are on their way: dispatch it (and what follows, in
                // order) when they arrive.
                break;
            }
            let Some((req, done)) = self.queue.pop_front() else {
                break;
            };
            self.prefetch.looked = self.prefetch.looked.saturating_sub(1);
            match self.dispatch(req, done)? {
                None => progress = true,
                Some((req, done)) => {
                    self.queue.push_front((req, done));
                    self.prefetch.looked += 1;
                    self.health.user_blocked = true;
                    break;
                }
            }
        }
        Ok(progress)
    }

    /// Hands blocks the read path rebuilt from redundancy to compaction, which
    /// writes each anew with its next group (until then, reads rebuild it again).
    fn stage_repairs(&mut self) -> Result<(), EngineError> {
        for (pba, data) in std::mem::take(&mut self.core.repairs) {
            if self.stage_rewrite(pba, &data[..])? {
                self.core.stats.repairs_staged += 1;
            }
        }
        Ok(())
    }

    /// Stages the block at `pba` (its data `data`) to be written anew by compaction,
    /// as a relocation of that copy, with the entry its md names. False when it was
    /// not (its md unreadable as an entry, or `Mover::stage_rewrite` declined).
    fn stage_rewrite(&mut self, pba: Pba, data: &[u8]) -> Result<bool, EngineError> {
        let Some((_, slot)) = self.core.geo.region_slot(pba) else {
            return Ok(false);
        };
        let md = crate::read::reader::md_block(&mut self.core, &self.writer, pba)?;
        let idx = (slot % shale_format::GROUP_BLOCKS) as usize;
        let Ok(e) = shale_format::decode_md_entry(&md[..], idx, 0) else {
            return Ok(false);
        };
        let entry = crate::mover::RelocEntry::moving(&e, pba);
        Ok(self.compaction.stage_rewrite(&mut self.core, entry, data))
    }

    /// Hands blocks read often from the cold tier to compaction, which writes them to
    /// a fast zone with its next group, or pads the group once they have waited
    /// `promote_linger_us` (`tier.rs`).
    fn stage_promotions(&mut self) -> Result<(), EngineError> {
        let now = self.core.now();
        for (pba, data) in std::mem::take(&mut self.core.tier.pending) {
            let Some((region, _)) = self.core.geo.region_slot(pba) else {
                continue;
            };
            // Overwritten, trimmed or moved since it was read: nothing to bring back.
            if !self.core.geo.is_cold(region) || !self.core.regions.validity.get(pba) {
                continue;
            }
            if self.stage_rewrite(pba, &data[..])? {
                self.core.stats.promotions_staged += 1;
                self.core.tier.staged_since.get_or_insert(now);
            }
        }
        if let Some(since) = self.core.tier.staged_since {
            let linger = now.saturating_sub(since) >= self.core.config.promote_linger_us * 1_000;
            let (mover, core, floor) = self.mover_with_core(false);
            // Full groups leave now, whether or not compaction is running.
            for s in 0..mover.streams.len() {
                mover.write_stream_group(core, floor, s, false)?;
            }
            if mover.staged_blocks() == 0 {
                self.core.tier.staged_since = None;
            } else if linger {
                mover.pad_streams(core, floor)?;
                self.core.tier.staged_since = None;
            }
        }
        Ok(())
    }

    /// Background work for one loop iteration (`background.rs` paces it): GC and
    /// compaction steps, freed space released, checkpoint work.
    fn background(&mut self) -> Result<bool, EngineError> {
        use crate::background::{
            compaction_threshold, gc_threshold, pending_counts, release_due, steps_for,
        };
        let mut progress = false;
        let blocked = self.compaction.zone_blocked;
        // Pacing counts PendingFree regions as free: the next durability point frees
        // them, and running the movers ahead for them would only cost spare space.
        let (pending_chunks, pending_zones) = pending_counts(&self.core.geo, &self.core.regions);
        let pending_cold = crate::background::pending_cold(&self.core.geo, &self.core.regions);
        let free_zones = self.core.regions.free_zones.len() + pending_zones - pending_cold;
        let threshold = gc_threshold(&self.core.config, self.gc.gc_reserve(&self.core));
        let mut gc_steps = steps_for(&self.core.config, free_zones, threshold, blocked);
        if self.core.geo.tiered() {
            // Fast GC moves into the cold tier, so the cold tier's own GC goes first
            // when it is short; the tier is chosen between victims.
            let cold_free = self.core.regions.free_cold_zones.len() + pending_cold;
            let threshold = gc_threshold(&self.core.config, self.gc.cold_reserve(&self.core));
            let cold_steps = steps_for(&self.core.config, cold_free, threshold, false);
            if self.gc.between_victims() {
                self.gc.cold = cold_steps > 0;
            }
            gc_steps = gc_steps.max(cold_steps);
        }
        let free_chunks = self.core.regions.free_chunks.len() + pending_chunks;
        let owned = self.core.regions.owned_chunks(&self.core.geo);
        let threshold = compaction_threshold(owned, &self.core.config);
        let mut steps = steps_for(
            &self.core.config,
            free_chunks,
            threshold,
            self.health.user_blocked,
        );
        // A volume past its cache share by more than the open chunk can hold, so some
        // of its blocks are in closed chunks: compaction trickles on (taking its
        // chunks first) however much is free. (Within that, a step would only scan
        // the chunks to find the open one holds them.)
        let open_chunk = self.writer.chunk_data_capacity;
        if steps == 0 && self.core.regions.shares.any_over(open_chunk) {
            steps = 1;
        }
        if self.core.census.is_some() {
            // The movers and the scrub read validity bits: until the census has
            // rebuilt them they wait. When space runs short the walk speeds up
            // (CENSUS_RUSH times its batch a loop iteration, so requests are still
            // served between batches), and a write waiting for space finishes it now.
            if self.health.user_blocked || (gc_steps > 0 && free_zones == 0) {
                crate::census::complete(&mut self.core)?;
                progress = true;
            } else {
                let rush = if gc_steps > 0 || steps > 0 {
                    CENSUS_RUSH
                } else {
                    1
                };
                progress |= crate::census::background_step(&mut self.core, rush)?;
            }
        }
        let census_pending = self.core.regions.census_pending;
        if !census_pending {
            self.scrubber.step(&mut self.core, &self.writer)?;
            self.stage_repairs()?;
            if self.core.geo.tiered() {
                self.stage_promotions()?;
            }
        }
        self.compaction.zone_blocked = false;
        self.gc.zone_blocked = false;
        let (gc_steps, steps) = if census_pending {
            (0, 0)
        } else {
            (gc_steps, steps)
        };
        for _ in 0..gc_steps {
            if !self.gc.step(&mut self.core, 0)? {
                break;
            }
            progress = true;
        }

        for _ in 0..steps {
            let (mover, core, floor) = self.mover_with_core(false);
            if !mover.step(core, floor)? {
                break;
            }
            progress = true;
        }

        let release = release_due(
            &self.core.geo,
            &self.core.config,
            &self.core.regions,
            (
                self.gc.gc_reserve(&self.core),
                self.gc.cold_reserve(&self.core),
            ),
            self.health.user_blocked,
            blocked || self.compaction.zone_blocked || self.gc.zone_blocked,
        );
        if release || self.core.journal.pending_large() {
            self.durability_point()?;
            progress = true;
        }
        if self.checkpointer.due(&self.core) {
            self.checkpoint_begin()?;
            progress = true;
        }
        progress |= self.checkpoint_step()?;
        progress |= self
            .core
            .l2p
            .drain_step(&mut self.core.cache, DRAIN_PAGES_PER_POLL)?;
        Ok(progress)
    }

    /// Breaks a stall: pads every partial batch and makes freed space reusable.
    fn force_background(&mut self) -> Result<bool, EngineError> {
        let mut progress = self.core.census.is_some();
        crate::census::complete(&mut self.core)?;
        // GC pads only between victims: a pad wastes room its victim's blocks count on.
        if self.gc.between_victims() {
            progress |= self.gc.pad_streams(&mut self.core, 0)?;
        }
        let (mover, core, floor) = self.mover_with_core(false);
        progress |= mover.pad_streams(core, floor)?;
        self.drain_io()?;
        if !self.core.regions.pending_free.is_empty() {
            self.durability_point()?;
            progress = true;
        }
        Ok(progress)
    }

    /// Persists a volume change made in memory: the volume table, a journal record and
    /// a checkpoint. If that fails, what is on media no longer matches the engine, so
    /// it stops rather than carry on from there.
    fn volume_changed(&mut self, change: &crate::volume::VolumeChange) -> Result<(), EngineError> {
        use crate::volume::shard_limits;
        let now = self.core.now();
        self.core.apply_volume_policies();
        let freed = self.throttle.sync(
            self.core
                .volumes
                .table
                .entries
                .iter()
                .map(|e| (e.uid, shard_limits(e.limits, self.core.sb.shard.count))),
            now,
        );
        self.queue.extend(freed);
        crate::volume::record_change(&mut self.core, change)
            .and_then(|()| self.checkpoint(false))
            .inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("persisting a volume change: {e}"),
                })
            })
    }

    /// Waits for every device I/O in flight.
    pub(crate) fn drain_io(&mut self) -> Result<(), EngineError> {
        while self.core.io.count > 0 {
            self.reap(1)?;
        }
        Ok(())
    }

    /// Durability steps 1-5 (`flush.rs`): every appended block submitted and all I/O
    /// drained, then sealed; with `journal == false` (checkpoints) no journal entry.
    pub(crate) fn make_durable(&mut self, journal: bool) -> Result<(), EngineError> {
        self.durability.requested = false;
        self.writer.submit_runs(&mut self.core)?;
        self.drain_io()?;
        self.durability
            .seal(&mut self.core, &mut self.writer, journal)
    }

    /// A full durability point (steps 1-6). When the journal cannot take its records
    /// without overwriting entries recovery needs, it is a checkpoint instead (which
    /// makes the same writes durable without the journal).
    pub(crate) fn durability_point(&mut self) -> Result<(), EngineError> {
        self.writer.submit_runs(&mut self.core)?;
        self.drain_io()?;
        if self
            .durability
            .nothing_to_make_durable(&self.core, &self.writer)
        {
            // An idle flush: everything is already durable; skip the journal block and
            // the device flushes.
            self.durability.requested = false;
            self.core.stats.idle_flushes += 1;
            self.durability.complete_waiters(&mut self.writer);
            return Ok(());
        }
        if !crate::flush::flush_point_fits(&self.core) {
            return self.checkpoint(false);
        }
        self.make_durable(true)?;
        self.durability.durable_asn = self.writer.asn_next;
        crate::flush::release_pending(&mut self.core)?;
        self.core.stats.durability_points += 1;
        self.durability.complete_waiters(&mut self.writer);
        Ok(())
    }

    /// Starts one request. Returns it back if it must wait for space. A failure the
    /// write path recorded stops the engine before anything else happens.
    #[allow(clippy::type_complexity)]
    fn dispatch(
        &mut self,
        req: Request,
        done: Answer,
    ) -> Result<Option<(Request, Answer)>, EngineError> {
        let r = self.dispatch_request(req, done);
        if let Some(e) = self.writer.failure.take() {
            self.fail(e);
        }
        r
    }

    /// A write: straight to a zone when large (`write/direct.rs`), else into the cache.
    /// Gives the data back if it must wait (for space, or for a direct write of a
    /// block it merges with).
    fn dispatch_write(
        &mut self,
        slot: shale_format::VolumeId,
        offset: u64,
        data: Vec<u8>,
        fua: bool,
        done: Answer,
    ) -> Result<Option<(Vec<u8>, Answer)>, EngineError> {
        let len = data.len() as u64;
        let back = if self.takes_direct(slot, offset, len) {
            self.start_direct(slot, offset, data, done)?
        } else if self.edges_wait_for_directs(slot, offset, len) {
            Some((data, done))
        } else {
            self.writer
                .start_write(&mut self.core, slot, offset, data, fua, done)?
        };
        if back.is_none() {
            self.note_write(slot, offset, len);
        }
        Ok(back)
    }

    #[allow(clippy::type_complexity)]
    fn dispatch_request(
        &mut self,
        req: Request,
        done: Answer,
    ) -> Result<Option<(Request, Answer)>, EngineError> {
        // Checked here, on the engine thread and in queue order with volume changes:
        // a request for a volume deleted before it was taken fails, whichever volume
        // holds the slot now.
        let slot = match &req {
            Request::Read { volume, .. }
            | Request::Write { volume, .. }
            | Request::Trim { volume, .. }
            | Request::WriteZeroes { volume, .. }
            | Request::Allocation { volume, .. } => match self.core.volumes.resolve(*volume) {
                Some(slot) => slot,
                None => {
                    done.send(Err(EngineError::NoSuchVolume { volume: *volume }));
                    return Ok(None);
                }
            },
            _ => shale_format::VolumeId::NONE,
        };
        // Requests are served in order: a read (or block status) of blocks a direct
        // write is still carrying waits until they are mapped.
        if let Request::Read { offset, len, .. } | Request::Allocation { offset, len, .. } = &req {
            if self.range_waits_for_directs(slot, *offset, *len) {
                return Ok(Some((req, done)));
            }
        }
        match req {
            Request::Read { offset, len, .. } => {
                self.reader
                    .start_read(&mut self.core, &self.writer, slot, offset, len, done)?
            }
            Request::Write {
                volume,
                offset,
                data,
                fua,
            } => {
                let back = self.dispatch_write(slot, offset, data, fua, done)?;
                return Ok(back.map(|(data, done)| {
                    (
                        Request::Write {
                            volume,
                            offset,
                            data,
                            fua,
                        },
                        done,
                    )
                }));
            }
            Request::Trim { offset, len, .. } => {
                let r = self.writer.trim(&mut self.core, slot, offset, len, false);
                self.writer.answer(done, r.map(|_| Reply::Done));
            }
            Request::WriteZeroes {
                volume,
                offset,
                len,
            } => {
                if !self.writer.can_write_zeroes(&self.core, slot, offset, len)
                    || self.edges_wait_for_directs(slot, offset, len)
                {
                    return Ok(Some((
                        Request::WriteZeroes {
                            volume,
                            offset,
                            len,
                        },
                        done,
                    )));
                }
                self.writer
                    .write_zeroes(&mut self.core, slot, offset, len, done);
            }
            Request::Flush => {
                self.durability.waiters.push(done);
                self.durability.requested = true;
            }
            req @ (Request::CreateVolume { .. }
            | Request::CreateVolumeWith { .. }
            | Request::CreateSlice { .. }
            | Request::ResizeVolume { .. }
            | Request::ResizeSlice { .. }
            | Request::DeleteVolume { .. }
            | Request::SetVolumeLimits { .. }) => self.volume_request(req, done),
            Request::ListVolumes => {
                done.send(Ok(Reply::Volumes(crate::volume::list(&self.core.volumes))))
            }
            Request::Allocation { offset, len, .. } => {
                let r = crate::read::block_status::block_status(&mut self.core, slot, offset, len);
                done.send(r.map(Reply::Allocation));
            }
            Request::Stats => done.send(Ok(Reply::Stats(Box::new(self.stats())))),
            Request::SelfCheck => {
                let r = self.self_check();
                done.send(r.map(|_| Reply::Done).map_err(EngineError::from));
            }
            Request::GiveZones { .. }
            | Request::ForeignZones
            | Request::TakeZones { .. }
            | Request::GiveChunks { .. }
            | Request::ForeignChunks
            | Request::TakeChunks { .. } => self.lending_request(req, done),
        }
        Ok(None)
    }

    /// Volume changes: each is made in memory, then persisted (`volume_changed`).
    fn create_volume(&mut self, name: &str, size_bytes: u64, layout: VolumeLayout, done: Answer) {
        let r = crate::volume::create(&mut self.core, &self.writer, name, size_bytes, None, layout)
            .and_then(|(info, change)| self.volume_changed(&change).map(|_| info));
        done.send(r.map(Reply::Volume));
    }

    fn volume_request(&mut self, req: Request, done: Answer) {
        match req {
            Request::CreateVolume { name, size_bytes } => {
                self.create_volume(&name, size_bytes, VolumeLayout::default(), done)
            }
            Request::CreateVolumeWith {
                name,
                size_bytes,
                layout,
            } => self.create_volume(&name, size_bytes, layout, done),
            Request::CreateSlice {
                name,
                uid,
                size_bytes,
                whole_size_bytes,
                layout,
            } => {
                let slice = crate::volume::Slice {
                    uid,
                    whole_size_bytes,
                };
                let r = self.shard_request().and_then(|()| {
                    crate::volume::create(
                        &mut self.core,
                        &self.writer,
                        &name,
                        size_bytes,
                        Some(slice),
                        layout,
                    )
                });
                let r = r.and_then(|(info, change)| self.volume_changed(&change).map(|_| info));
                done.send(r.map(Reply::Volume));
            }
            Request::ResizeVolume { volume, size_bytes } => {
                let r = crate::volume::resize(
                    &mut self.core,
                    &mut self.writer,
                    volume,
                    size_bytes,
                    None,
                )
                .and_then(|(info, change)| self.volume_changed(&change).map(|_| info));
                done.send(r.map(Reply::Volume));
            }
            Request::ResizeSlice {
                volume,
                size_bytes,
                whole_size_bytes,
            } => {
                let r = self.shard_request().and_then(|()| {
                    crate::volume::resize(
                        &mut self.core,
                        &mut self.writer,
                        volume,
                        size_bytes,
                        Some(whole_size_bytes),
                    )
                });
                let r = r.and_then(|(info, change)| self.volume_changed(&change).map(|_| info));
                done.send(r.map(Reply::Volume));
            }
            Request::DeleteVolume { volume } => {
                let r = crate::volume::delete(&mut self.core, &mut self.writer, volume)
                    .and_then(|change| self.volume_changed(&change));
                done.send(r.map(|_| Reply::Done));
            }
            Request::SetVolumeLimits { volume, limits } => {
                let r = crate::volume::set_limits(&mut self.core, volume, limits)
                    .and_then(|(info, change)| self.volume_changed(&change).map(|_| info));
                done.send(r.map(Reply::Volume));
            }
            _ => unreachable!("only volume changes are sent here"),
        }
    }

    /// Free zones given to the space manager: this engine keeps one more than its GC
    /// threshold (so giving never starts GC), and a checkpoint records them as another
    /// shard's before the answer (`space/lend.rs`).
    /// The space manager's requests (`space/lend.rs`).
    fn lending_request(&mut self, req: Request, done: Answer) {
        match req {
            Request::GiveZones { count } => done.send(self.give_zones(count).map(Reply::Zones)),
            Request::ForeignZones => done.send(Ok(Reply::Zones(crate::space::lend::foreign_list(
                &self.core,
            )))),
            Request::TakeZones { zones } => {
                let r = crate::space::lend::take(&mut self.core, &zones);
                done.send(r.map(|()| Reply::Done));
            }
            Request::GiveChunks { count } => done.send(self.give_chunks(count).map(Reply::Chunks)),
            Request::ForeignChunks => done.send(Ok(Reply::Chunks(
                crate::space::lend::foreign_chunk_list(&self.core),
            ))),
            Request::TakeChunks { chunks } => {
                let r = crate::space::lend::take_chunks(&mut self.core, &chunks);
                done.send(r.map(|()| Reply::Done));
            }
            other => done.send(Err(EngineError::Failed {
                reason: format!("{other:?} is not the space manager's"),
            })),
        }
    }

    fn give_zones(&mut self, count: u32) -> Result<Vec<u32>, EngineError> {
        let keep =
            crate::background::gc_threshold(&self.core.config, self.gc.gc_reserve(&self.core)) + 1;
        let given = crate::space::lend::give(&mut self.core, count, keep)?;
        if !given.is_empty() {
            self.checkpoint(false).inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("recording zones given away: {e}"),
                })
            })?;
        }
        Ok(given)
    }

    fn give_chunks(&mut self, count: u32) -> Result<Vec<u32>, EngineError> {
        let given = crate::space::lend::give_chunks(&mut self.core, count)?;
        if !given.is_empty() {
            self.checkpoint(false).inspect_err(|e| {
                self.fail(EngineError::Failed {
                    reason: format!("recording chunks given away: {e}"),
                })
            })?;
        }
        Ok(given)
    }

    fn mover_of(&self, gc: bool) -> &Mover {
        if gc {
            &self.gc
        } else {
            &self.compaction
        }
    }

    /// A mover with the core, and the free zones it must leave alone: compaction
    /// leaves GC its reserve, so GC can always finish what it holds.
    pub(crate) fn mover_with_core(&mut self, gc: bool) -> (&mut Mover, &mut Core<C, Z, K>, usize) {
        if gc {
            (&mut self.gc, &mut self.core, 0)
        } else {
            let floor = self.gc.gc_reserve(&self.core);
            (&mut self.compaction, &mut self.core, floor)
        }
    }

    pub(crate) fn mover(&mut self, role: RegionRole) -> &mut Mover {
        if role == RegionRole::Gc {
            &mut self.gc
        } else {
            &mut self.compaction
        }
    }

    /// Checks every space invariant; the first violation is returned.
    pub fn self_check(&mut self) -> Result<(), crate::SelfCheckError> {
        // The bits must be whole before they are checked.
        if let Err(e) = crate::census::complete(&mut self.core) {
            let reason = e.to_string();
            if matches!(e, EngineError::Failed { .. }) {
                self.fail(e);
            }
            return Err(crate::SelfCheckError::RegionState {
                region: shale_format::RegionId(u32::MAX),
                reason,
            });
        }
        crate::selfcheck::self_check(
            &mut self.core,
            &self.writer,
            &mut crate::recovery::Meter::off(),
        )?;
        // GC can always write out what it holds (and so free its victims again).
        let free = self
            .core
            .regions
            .free_zones_of(self.core.geo.tiered())
            .len();
        let needed = self.gc.zones_to_finish(&self.core, None);
        if free < needed {
            return Err(crate::SelfCheckError::FreeList {
                reason: format!(
                    "GC holds {} staged blocks needing {needed} free zones, {free} free",
                    self.gc.staged_blocks()
                ),
            });
        }
        Ok(())
    }

    /// Slices are for the shards of a pool of several; a pool of one keeps whole
    /// volumes (its table may have no room for whole sizes).
    fn shard_request(&self) -> Result<(), EngineError> {
        if self.core.sb.shard.count > 1 {
            Ok(())
        } else {
            Err(EngineError::InvalidVolume {
                reason: "volume slices are for the shards of a pool of several".into(),
            })
        }
    }

    /// Which shard of which pool this engine serves (recorded at format).
    pub fn shard(&self) -> shale_format::ShardTag {
        self.core.sb.shard
    }

    /// A snapshot of the counters, with gauges filled in.
    pub fn stats(&self) -> crate::Stats {
        debug_assert_eq!(self.gc.role(), RegionRole::Gc);
        let mut s = crate::metrics::snapshot(
            &self.core,
            self.compaction.staged_blocks() + self.gc.staged_blocks(),
        );
        s.throttle_waiting = self.throttle.waiting() as u64;
        s.throttle_waits = self.throttle.delayed;
        let fmt = self.core.l2p.format();
        for v in &mut s.volumes {
            v.cache_valid_bytes = self.core.regions.shares.blocks(v.id) * crate::layout::BS;
            v.l2p_table_bytes = self
                .core
                .l2p
                .volume_size(v.id)
                .map_or(0, |n| fmt.pages_for(n) * crate::layout::BS);
            if self.core.volumes.is_dual(v.id) {
                // The sparse map's pages in use (written or cached) count too.
                let fine = self.core.volumes.fine_map(v.id);
                v.l2p_sparse_bytes = self.core.l2p.pages_in_use(fine) * crate::layout::BS;
                v.l2p_table_bytes += v.l2p_sparse_bytes;
            }
        }
        for (uid, waiting, waited) in self.throttle.per_volume() {
            if let Some(v) = s.volumes.iter_mut().find(|v| v.uid == uid) {
                v.throttle_waiting = waiting as u64;
                v.throttle_delayed = waited.requests;
                v.throttle_wait_ns = waited.ns;
            }
        }
        s
    }

    /// User capacity in bytes (the most all volumes together may hold).
    pub fn user_capacity_bytes(&self) -> u64 {
        self.core.volumes.user_capacity_blocks * crate::layout::BS
    }

    /// The cache's data bytes (every chunk's data slots): what a volume's cache share
    /// is a percentage of.
    pub fn cache_data_bytes(&self) -> u64 {
        self.core.regions.shares.data_blocks() * crate::layout::BS
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// Placement streams in use.
    pub fn streams(&self) -> u32 {
        self.core.streams
    }
}

/// Which device a block lives on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    Cache,
    Capacity,
}

/// Where a mapped block is, for tools and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub pba: Pba,
    pub tier: Tier,
    /// Byte offset on that device.
    pub offset: u64,
    /// Still only in an in-memory group buffer (not yet settled on the device).
    pub in_memory: bool,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Where (volume, lba) is mapped, if anywhere.
    pub fn locate(
        &mut self,
        volume: shale_format::VolumeUid,
        lba: shale_format::Lba,
    ) -> Result<Option<Location>, EngineError> {
        let Some(volume) = self.core.volumes.resolve(volume) else {
            return Ok(None);
        };
        let pba = self.core.lookup(volume, lba)?;
        if pba.is_none() {
            return Ok(None);
        }
        let Some((on_cache, offset)) = self.core.geo.device_offset(pba) else {
            return Ok(None);
        };
        let (r, s) = self
            .core
            .geo
            .region_slot(pba)
            .unwrap_or((shale_format::RegionId(0), 0));
        Ok(Some(Location {
            pba,
            tier: if on_cache {
                Tier::Cache
            } else {
                Tier::Capacity
            },
            offset,
            in_memory: self.writer.find(r, s).is_some(),
        }))
    }

    /// Stops without any further I/O and returns the devices as they are: what a crash
    /// leaves behind (for tests and simulators). Queued requests are dropped uncompleted.
    pub fn abandon(mut self) -> (C, Z) {
        // Requests in flight stay unanswered, as a process that died would leave them
        // (dropped, they would answer `Failed`).
        for d in self.take_answers() {
            d.disarm();
        }
        (self.core.cache, self.core.capacity)
    }
}
