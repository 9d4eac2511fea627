//! Checkpoints: the L2P pages, then the checkpoint area not holding the latest
//! checkpoint (region table, volume table, L2P directories, journal position, SID
//! counter), then the superblock naming it.
//!
//! Two ways to take one:
//! - **synchronous** (clean shutdown, volume changes, the admin socket's checkpoint, a journal
//!   about to overflow): make everything durable, write every dirty L2P page, write the
//!   area and the superblock. The checkpoint reflects one instant.
//! - **incremental** (periodic; bounded work per loop iteration): at its start `T0` a
//!   durability point makes everything durable, staged relocations whose source is no
//!   longer valid are dropped, the region table is snapshotted, the journal's epoch is
//!   bumped (entries from here on belong to the new checkpoint), every L2P page
//!   dirty at `T0` is marked and the deferred switches waiting at `T0` are copied for
//!   the checkpoint's switch table (past the room its area has for them, their pages
//!   are marked instead, faulted in and updated when their turn comes), so every
//!   L2P change before `T0` is in the pages the checkpoint references or in its
//!   switches. Marked pages are written back a few per loop iteration
//!   while user I/O goes on. When none is left, a second durability point (with a
//!   FlushPoint) makes every event the written pages reflect durable, and the area is
//!   written with the `T0` region table, the `T0` journal position and the current
//!   directories. Recovery replays the journal and md from `T0`: every page it loads
//!   holds the `T0` state or a later durable one, and everything after `T0` is replayed
//!   with the SID rules, which do not depend on what the page already reflects (see
//!   docs/recovery.md).
//!
//! Invariants: the superblock is written only after the checkpoint it names is
//! durable; L2P pages are written only to slots the committed checkpoint does not
//! reference; a region freed since the last durability point is reused only after the
//! superblock write (it is recorded as Free in the new checkpoint); no SID at or above
//! `committed sid_next + SID_LEASE` is ever handed out, so recovery can restart the
//! counter above every SID that could be on media.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{
    Checkpoint, CheckpointHeader, L2pDirectory, L2pSwitch, RegionEntry, RegionState, VolumeId,
};

use crate::core::Core;
use crate::layout::BS;
use crate::recovery::Meter;
use crate::{Clock, Engine, EngineError};

/// SIDs that may be handed out after the committed checkpoint's `sid_next` before the
/// next checkpoint: recovery restarts the counter this far above it.
pub(crate) const SID_LEASE: u64 = 1 << 32;
/// Bytes of a checkpoint image written per device write: few synchronous writes for
/// the tens of MiB a large pool's directories and switches take.
const CHECKPOINT_PIECE_BYTES: usize = 4 << 20;

/// An incremental checkpoint between its start and its commit.
#[derive(Debug)]
pub(crate) struct CheckpointInProgress {
    pub generation: u64,
    pub regions: Vec<RegionEntry>,
    pub sid_next: u64,
    pub journal_next: u32,
    pub journal_sequence: u64,
    pub time: u64,
    /// The deferred switches waiting at the start.
    pub switches: Vec<L2pSwitch>,
}

/// The checkpointer's state.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    /// The incremental checkpoint in progress, if any.
    pub current: Option<CheckpointInProgress>,
    /// `stats.user_write_bytes` when the latest checkpoint began.
    pub user_bytes_at_start: u64,
    /// `sid_next` recorded by the committed checkpoint (the SID lease base).
    pub sid_base: u64,
}

impl Checkpointer {
    /// Writes a bounded number of the pages the checkpoint in progress waits for.
    /// Returns true when none is left (the checkpoint can be committed).
    pub fn write_pages(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ) -> Result<bool, EngineError> {
        debug_assert!(self.current.is_some(), "no checkpoint in progress");
        let base = core.config.checkpoint_pages_per_poll as usize;
        let n = match core.journal.entries_before_full() {
            // Entries recovery needs are about to be overwritten: finish now.
            0 => usize::MAX,
            // Flush-heavy loads fill the journal fast: spread the rest over the entries
            // left (at most about one durability point per loop iteration).
            left => base.max(core.l2p.pending_pages().div_ceil(left as usize)),
        };
        let bytes = core.l2p.write_back_pending(&mut core.cache, n)?;
        core.stats.checkpoint_page_writes += bytes / BS;
        Ok(core.l2p.pending_pages() == 0)
    }

    /// True when the next checkpoint is due: bytes written, journal use or SIDs.
    pub fn due(&self, core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> bool {
        self.current.is_none()
            && (core.stats.user_write_bytes - self.user_bytes_at_start
                >= Self::interval_bytes(core)
                || core.journal.needs_checkpoint()
                || core.sid_next - self.sid_base >= SID_LEASE / 2)
    }

    fn interval_bytes(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> u64 {
        core.config
            .checkpoint_interval_bytes
            .unwrap_or(core.volumes.user_capacity_blocks * BS / 16)
            .max(BS)
    }
}

/// The region table as a checkpoint records it: regions waiting for reuse are
/// Free (nothing maps into them).
fn region_snapshot(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Vec<RegionEntry> {
    let mut regions = core.regions.entries();
    for e in regions.iter_mut() {
        if e.state == RegionState::PendingFree {
            *e = RegionEntry::default();
        }
    }
    regions
}

/// The most L2P switches a checkpoint of the engine's current regions, volumes and
/// directories fits in its area beside them, and never more than the L2P keeps
/// waiting (what an open accepts).
fn switch_room(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> usize {
    let maps = core.l2p.vols.iter().flatten();
    core.l2p.deferred_max().min(Checkpoint::switch_room(
        u64::from(core.sb.layout.checkpoint_blocks),
        core.regions.regions.len(),
        maps.clone().map(|m| m.dir.len()).sum(),
        maps.count(),
        core.volumes.table.blocks_needed(),
    ))
}

/// Every volume's L2P directory, moved out of the page cache's maps (no copy; at
/// TiB scale they are megabytes). `restore_directories` must put them back.
fn take_directories(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Vec<L2pDirectory> {
    core.l2p
        .vols
        .iter_mut()
        .enumerate()
        .filter_map(|(v, m)| {
            m.as_mut().map(|m| L2pDirectory {
                volume: VolumeId(v as u32),
                pages: std::mem::take(&mut m.dir),
            })
        })
        .collect()
}

fn restore_directories(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    dirs: Vec<L2pDirectory>,
) {
    for d in dirs {
        if let Some(Some(m)) = core.l2p.vols.get_mut(d.volume.0 as usize) {
            m.dir = d.pages;
        }
    }
}

/// Writes the area not holding the latest checkpoint, then the superblock naming
/// it.
fn commit_checkpoint(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    ck: Checkpoint,
    clean: bool,
) -> Result<(), EngineError> {
    let blocks = Checkpoint::encoded_blocks(
        ck.regions.len(),
        ck.directories.iter().map(|d| d.pages.len()).sum(),
        ck.directories.len(),
        ck.volumes.blocks_needed(),
        ck.switches.len(),
    );
    if blocks > u64::from(core.sb.layout.checkpoint_blocks) {
        restore_directories(core, ck.directories);
        return Err(EngineError::CheckpointTooLarge {
            needed: blocks,
            area: core.sb.layout.checkpoint_blocks,
        });
    }
    // The image is megabytes at TiB scale (every region, every L2P page's slot): it
    // is streamed through one aligned 4 MiB buffer rather than built, so the peak
    // is one piece and an O_DIRECT device needs no bounce copy.
    let switches = ck.switches.len() as u64;
    let area = 1 - core.sb.active_checkpoint;
    let off = core.sb.layout.checkpoint_start(area) * BS;
    let len = (blocks * BS) as usize;
    let mut piece = shale_device::IoBuf::zeroed(len.min(CHECKPOINT_PIECE_BYTES));
    let cache = &mut core.cache;
    let written = ck.encode_to(&mut piece, |at, b| {
        cache
            .write_at(off + at, b)
            .map_err(EngineError::cache("checkpoint write", off + at))
    });
    restore_directories(core, ck.directories);
    let bytes = written?;
    drop(piece);
    core.cache.flush().map_err(EngineError::cache("flush", 0))?;
    core.stats.cache_md_write_bytes += bytes;

    let mut sb = core.sb.clone();
    sb.active_checkpoint = area;
    sb.clean = clean;
    write_superblock_as(core, sb)?;
    core.l2p.checkpoint_committed();
    core.stats.checkpoints += 1;
    core.stats.checkpoint_switches += switches;
    Ok(())
}

/// Writes the superblock with generation + 1 to the copy that generation selects.
pub(crate) fn write_superblock(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Result<(), EngineError> {
    let sb = core.sb.clone();
    write_superblock_as(core, sb)
}

/// Writes `sb` (generation + 1) and makes it the engine's superblock once it is
/// durable: after a failed write the engine still describes what is on media.
fn write_superblock_as(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    mut sb: shale_format::Superblock,
) -> Result<(), EngineError> {
    sb.generation = core.sb.generation + 1;
    let copy = sb.generation % 2;
    let off = copy * BS;
    core.cache
        .write_at(off, &sb.encode())
        .map_err(EngineError::cache("superblock write", off))?;
    core.cache.flush().map_err(EngineError::cache("flush", 0))?;
    core.stats.cache_md_write_bytes += BS;
    core.sb = sb;
    Ok(())
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// A synchronous checkpoint (abandons an incremental one in progress).
    pub(crate) fn checkpoint(&mut self, clean: bool) -> Result<(), EngineError> {
        self.checkpoint_metered(clean, &mut Meter::off())
    }

    /// [`Self::checkpoint`], counting the dirty L2P pages written back on `meter`
    /// (after a recovery they are most of its time).
    pub(crate) fn checkpoint_metered(
        &mut self,
        clean: bool,
        meter: &mut Meter<'_>,
    ) -> Result<(), EngineError> {
        if self.checkpointer.current.take().is_some() {
            self.core.l2p.clear_checkpoint_pending();
        }
        self.make_durable(false)?;
        self.durability.durable_asn = self.writer.asn_next;
        self.compaction.drop_all_superseded(&mut self.core);
        self.gc.drop_all_superseded(&mut self.core);
        let room = switch_room(&self.core);
        let switches = self
            .core
            .l2p
            .checkpoint_switches(&mut self.core.cache, room)?;
        self.core
            .l2p
            .write_back_all_metered(&mut self.core.cache, meter)?;
        self.core.stats.l2p_page_writes_total = self.core.l2p.counters.page_writes;
        self.core
            .cache
            .flush()
            .map_err(EngineError::cache("flush", 0))?;

        let generation = self.core.journal.epoch + 1;
        let ck = Checkpoint {
            header: CheckpointHeader {
                generation,
                sid_next: self.core.sid_next,
                journal_next_block: self.core.journal.next,
                journal_sequence: self.core.journal.sequence,
                time: self.core.now(),
                ..Default::default()
            },
            regions: region_snapshot(&self.core),
            volumes: self.core.volumes.table.clone(),
            directories: take_directories(&mut self.core),
            switches,
        };
        // The checkpoint records freed zones as Free before their resets: the clean
        // flag goes down only once they are reset, so a clean image never has a Free
        // zone with data in it (open resets such zones anyway, after a crash here).
        let resets_pending = clean && !self.core.regions.pending_free.is_empty();
        commit_checkpoint(&mut self.core, ck, clean && !resets_pending)?;
        #[cfg(feature = "paranoid")]
        crate::selfcheck::paranoid_check(&mut self.core, &self.writer, "after a checkpoint");
        self.core.journal.after_checkpoint(generation);
        self.checkpointer.sid_base = self.core.sid_next;
        self.checkpointer.user_bytes_at_start = self.core.stats.user_write_bytes;
        crate::flush::release_pending(&mut self.core)?;
        if resets_pending {
            let mut sb = self.core.sb.clone();
            sb.clean = true;
            write_superblock_as(&mut self.core, sb)?;
        }
        self.durability.complete_waiters(&mut self.writer);
        Ok(())
    }

    /// Starts an incremental checkpoint (or takes a synchronous one when the pages
    /// per iteration are 0).
    pub(crate) fn checkpoint_begin(&mut self) -> Result<(), EngineError> {
        if self.core.config.checkpoint_pages_per_poll == 0 {
            return self.checkpoint(false);
        }
        let before = self.core.stats.checkpoints;
        self.durability_point()?;
        if self.core.stats.checkpoints != before {
            // The journal was too full: the durability point became a checkpoint.
            return Ok(());
        }
        self.compaction.drop_all_superseded(&mut self.core);
        self.gc.drop_all_superseded(&mut self.core);
        let generation = self.core.journal.epoch + 1;
        let regions = region_snapshot(&self.core);
        let (journal_next, journal_sequence) = self.core.journal.begin_epoch(generation);
        let room = switch_room(&self.core);
        let switches = self.core.l2p.mark_checkpoint_pending(room);
        self.checkpointer.current = Some(CheckpointInProgress {
            generation,
            regions,
            sid_next: self.core.sid_next,
            journal_next,
            journal_sequence,
            time: self.core.now(),
            switches,
        });
        self.checkpointer.user_bytes_at_start = self.core.stats.user_write_bytes;
        self.core.stats.checkpoints_started += 1;
        Ok(())
    }

    /// One bounded step of the checkpoint in progress; commits it when its pages are
    /// written. Returns true if it did anything.
    pub(crate) fn checkpoint_step(&mut self) -> Result<bool, EngineError> {
        if self.checkpointer.current.is_none() {
            return Ok(false);
        }
        if self.checkpointer.write_pages(&mut self.core)? {
            self.checkpoint_end()?;
        }
        Ok(true)
    }

    fn checkpoint_end(&mut self) -> Result<(), EngineError> {
        self.writer.submit_runs(&mut self.core)?;
        self.drain_io()?;
        if !crate::flush::flush_point_fits(&self.core) {
            return self.checkpoint(false);
        }
        // Every event a page written since the start reflects becomes durable.
        self.make_durable(true)?;
        self.durability.durable_asn = self.writer.asn_next;
        let Some(ip) = self.checkpointer.current.take() else {
            return Ok(());
        };
        self.core.stats.l2p_page_writes_total = self.core.l2p.counters.page_writes;
        let ck = Checkpoint {
            header: CheckpointHeader {
                generation: ip.generation,
                sid_next: ip.sid_next,
                journal_next_block: ip.journal_next,
                journal_sequence: ip.journal_sequence,
                time: ip.time,
                ..Default::default()
            },
            regions: ip.regions,
            volumes: self.core.volumes.table.clone(),
            directories: take_directories(&mut self.core),
            switches: ip.switches,
        };
        commit_checkpoint(&mut self.core, ck, false)?;
        #[cfg(feature = "paranoid")]
        crate::selfcheck::paranoid_check(&mut self.core, &self.writer, "after a checkpoint");
        self.core.journal.committed_since_start();
        self.checkpointer.sid_base = ip.sid_next;
        crate::flush::release_pending(&mut self.core)?;
        self.durability.complete_waiters(&mut self.writer);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use shale_device::{CrashMode, FaultDevice, ZoneEmu, ZoneEmuConfig};
    use shale_format::{Lba, VolumeId, VolumeUid};

    use crate::{Config, Engine, EngineError, ManualClock, Reply, Request};

    type E = Engine<FaultDevice, ZoneEmu<FaultDevice>, ManualClock>;

    fn call(e: &mut E, req: Request) -> Result<Reply, EngineError> {
        let slot = Arc::new(Mutex::new(None));
        let s2 = slot.clone();
        e.submit(req, Box::new(move |r| *s2.lock().unwrap() = Some(r)));
        loop {
            if let Some(r) = slot.lock().unwrap().take() {
                return r;
            }
            if !e.poll() {
                e.wait_io();
            }
        }
    }

    fn block(seed: u64) -> Vec<u8> {
        (0..4096u64)
            .map(|i| (i.wrapping_mul(31) ^ seed) as u8)
            .collect()
    }

    /// The LBAs of every staged relocation.
    fn staged_lbas(e: &E) -> Vec<u64> {
        [&e.compaction, &e.gc]
            .iter()
            .flat_map(|m| m.streams.iter().flat_map(|st| st.entries.iter()))
            .map(|x| x.lba.0)
            .collect()
    }

    /// Staged relocations whose source is no longer valid.
    fn stale_staged(e: &E) -> usize {
        [&e.compaction, &e.gc]
            .iter()
            .flat_map(|m| m.streams.iter().flat_map(|st| st.entries.iter()))
            .filter(|x| !e.core.regions.validity.get(x.source))
            .count()
    }

    /// A small pool: 256-block chunks, one stream, no periodic checkpoint.
    fn small_config() -> Config {
        Config {
            chunk_blocks: 256,
            volumes_max: 4,
            spare_factor: 0.2,
            journal_blocks: 64,
            l2p_cache_bytes_max: Some(16 * 4096),
            l2p_reserved_pages: 2,
            write_buffers_max: 4,
            request_bytes_max: 64 * 1024,
            streams_max: 1,
            requests_per_poll_max: 256,
            // No periodic checkpoint after the one under test.
            checkpoint_interval_bytes: Some(1 << 40),
            ..Config::default()
        }
    }

    /// Every LBA in `newest` reads back the block of its newest seed.
    fn assert_newest(e: &mut E, v: VolumeUid, newest: &std::collections::HashMap<u64, u64>) {
        for (&l, &seed) in newest {
            match call(
                e,
                Request::Read {
                    volume: v,
                    offset: l * 4096,
                    len: 4096,
                },
            )
            .unwrap()
            {
                Reply::Read(d) => {
                    assert!(d == block(seed), "lba {l} is not its newest version")
                }
                r => panic!("{r:?}"),
            }
        }
    }

    /// Rule: a checkpoint drops staged relocations whose source was overwritten before
    /// it. Written after the checkpoint, such a copy would rank above the checkpoint's
    /// L2P in replay and bring back the overwritten version.
    #[test]
    fn stale_staged_relocations_are_dropped_at_a_checkpoint() {
        let config = small_config();
        let mut exercised = 0;
        for seed in 0..8u64 {
            let cache = FaultDevice::new((128 + 8 * 256) * 4096, 4096, seed).unwrap();
            let inner = FaultDevice::new(30 * 256 * 4096, 4096, seed + 1).unwrap();
            let (cc, zc) = (cache.controller(), inner.controller());
            let mut z = ZoneEmuConfig::new(256 * 4096);
            z.zone_count_max = 28;
            let cap = ZoneEmu::format(inner, &z).unwrap();
            let mut e = E::format(cache, cap, ManualClock::new(), config.clone()).unwrap();
            let v = VolumeUid(1);
            call(
                &mut e,
                Request::CreateVolume {
                    name: "a".into(),
                    size_bytes: 3000 * 4096,
                },
            )
            .unwrap();
            let mut newest = std::collections::HashMap::new();
            let mut w = |e: &mut E, lba: u64, s: u64| {
                newest.insert(lba, s);
                call(
                    e,
                    Request::Write {
                        volume: v,
                        offset: lba * 4096,
                        data: block(s),
                        fua: false,
                    },
                )
                .unwrap();
            };
            let mut s = 1;
            for l in 0..600 {
                w(&mut e, l, s);
                s += 1;
            }
            for l in (0..600).step_by(5) {
                w(&mut e, l, s);
                s += 1;
            }
            let mut next = 600;
            let staged = |e: &E| e.compaction.staged_blocks() + e.gc.staged_blocks();
            while staged(&e) == 0 && next < 2500 {
                w(&mut e, next, s);
                s += 1;
                next += 1;
            }
            // No victim read in flight: what is staged now stays staged through the
            // checkpoint's drain.
            e.drain_io().unwrap();
            // Overwrite what is staged, in one go, then checkpoint at once.
            let lbas = staged_lbas(&e);
            if lbas.is_empty() {
                continue;
            }
            // Straight through the write path, with no background step in between
            // that could write the batch first.
            for &l in &lbas {
                newest.insert(l, s);
                let waits = e
                    .writer
                    .start_write(
                        &mut e.core,
                        VolumeId(0),
                        l * 4096,
                        block(s),
                        false,
                        crate::request::Answer::new(Box::new(|r| assert!(r.is_ok()))),
                    )
                    .unwrap();
                assert!(waits.is_none());
                s += 1;
            }
            e.writer.submit_runs(&mut e.core).unwrap();
            let stale = stale_staged(&e);
            if stale == 0 {
                continue;
            }
            exercised += 1;
            e.checkpoint(false).unwrap();
            // Whatever is still staged reaches media after the checkpoint.
            let (mover, core, floor) = e.mover_with_core(false);
            mover.pad_streams(core, floor).unwrap();
            e.gc.pad_streams(&mut e.core, 0).unwrap();
            call(&mut e, Request::Flush).unwrap();
            drop(e.abandon());
            let (_, cache) = cc.crash(&CrashMode::DropAll).unwrap();
            let (_, inner) = zc.crash(&CrashMode::DropAll).unwrap();
            let cap = ZoneEmu::open(inner).unwrap();
            let mut e = E::open(cache, cap, ManualClock::new(), config.clone()).unwrap();
            assert_newest(&mut e, v, &newest);
            assert!(e.locate(v, Lba(0)).unwrap().is_some());
        }
        assert!(
            exercised > 0,
            "no staged relocation went stale before a checkpoint"
        );
    }
}
