//! Checkpoints: the L2P pages, then the checkpoint area not holding the latest
//! checkpoint (region table, volume table, L2P directories, journal position, SID
//! counter), then the superblock naming it.
//!
//! Two ways to take one:
//! - **synchronous** (clean shutdown, volume changes, `Request::Checkpoint`, a journal
//!   about to overflow): make everything durable, write every dirty L2P page, write the
//!   area and the superblock. The checkpoint reflects one instant.
//! - **incremental** (periodic; bounded work per loop iteration): at its start `T0` a
//!   durability point makes everything durable, staged relocations whose source is no
//!   longer valid are dropped, the region table is snapshotted, the journal's epoch is
//!   bumped (entries from here on belong to the new checkpoint) and every L2P page
//!   dirty at `T0` is marked. Marked pages are written back a few per loop iteration
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
    Checkpoint, CheckpointHeader, L2pDirectory, RegionEntry, RegionState, VolumeId,
};

use crate::layout::BS;
use crate::{Clock, Engine, EngineError};

/// SIDs that may be handed out after the committed checkpoint's `sid_next` before the
/// next checkpoint: recovery restarts the counter this far above it.
pub(crate) const SID_LEASE: u64 = 1 << 32;

/// An incremental checkpoint between its start and its commit.
#[derive(Debug)]
pub(crate) struct CheckpointInProgress {
    pub generation: u64,
    pub regions: Vec<RegionEntry>,
    pub sid_next: u64,
    pub journal_next: u32,
    pub journal_sequence: u64,
    pub time: u64,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// The region table as a checkpoint records it: regions waiting for reuse are
    /// Free (nothing maps into them).
    fn region_snapshot(&self) -> Vec<RegionEntry> {
        let mut regions = self.regions.entries();
        for e in regions.iter_mut() {
            if e.state == RegionState::PendingFree {
                *e = RegionEntry::default();
            }
        }
        regions
    }

    fn directories(&self) -> Vec<L2pDirectory> {
        self.l2p
            .vols
            .iter()
            .enumerate()
            .filter_map(|(v, m)| {
                m.as_ref().map(|m| L2pDirectory {
                    volume: VolumeId(v as u32),
                    pages: m.dir.clone(),
                })
            })
            .collect()
    }

    /// Staged relocations whose source is no longer valid would be born invalid; once
    /// a checkpoint's L2P reflects the newer state they must not reach media after it
    /// (recovery ranks every replayed copy above the checkpoint's L2P). Dropped here.
    fn drop_stale_relocations(&mut self) {
        for gc in [false, true] {
            let mover = if gc {
                &mut self.cleaner
            } else {
                &mut self.compactor
            };
            for st in mover.streams.iter_mut() {
                if st
                    .entries
                    .iter()
                    .all(|e| self.regions.validity.get(e.source))
                {
                    continue;
                }
                let mut keep = 0;
                let mut dropped = Vec::new();
                for i in 0..st.entries.len() {
                    let e = st.entries[i];
                    if self.regions.validity.get(e.source) {
                        if keep != i {
                            st.entries[keep] = e;
                            let (src, dst) = (i * 4096, keep * 4096);
                            st.data.copy_within(src..src + 4096, dst);
                        }
                        keep += 1;
                    } else {
                        dropped.push(e.source);
                    }
                }
                st.entries.truncate(keep);
                st.data.truncate(keep * 4096);
                for src in dropped {
                    if let Some((r, _)) = self.geo.region_slot(src) {
                        self.regions.get_mut(r).relocations -= 1;
                        self.regions.maybe_pending_free(r);
                    }
                    self.stats.relocations_superseded += 1;
                }
            }
        }
    }

    /// A synchronous checkpoint (abandons an incremental one in progress).
    pub(crate) fn checkpoint(&mut self, clean: bool) -> Result<(), EngineError> {
        if self.ckpt.take().is_some() {
            self.l2p.clear_checkpoint_pending();
        }
        self.make_durable(false)?;
        self.durable_asn = self.asn_next;
        self.drop_stale_relocations();
        self.stats.cache_md_write_bytes += self.l2p.write_back_all(&mut self.cache)?;
        self.stats.l2p_page_writes_total = self.l2p.counters.page_writes;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;

        let generation = self.journal.epoch + 1;
        let ck = Checkpoint {
            header: CheckpointHeader {
                generation,
                sid_next: self.sid_next,
                journal_next_block: self.journal.next,
                journal_sequence: self.journal.sequence,
                time: self.now(),
                ..Default::default()
            },
            regions: self.region_snapshot(),
            volumes: self.volumes.table.clone(),
            directories: self.directories(),
        };
        self.commit_checkpoint(&ck, clean)?;
        self.journal.after_checkpoint(generation);
        self.ckpt_sid_base = self.sid_next;
        self.ckpt_user_bytes = self.stats.user_write_bytes;
        self.release_pending()?;
        self.complete_durable_waiters();
        Ok(())
    }

    /// Writes the area not holding the latest checkpoint, then the superblock naming
    /// it.
    fn commit_checkpoint(&mut self, ck: &Checkpoint, clean: bool) -> Result<(), EngineError> {
        let bytes = ck.encode();
        let blocks = bytes.len() as u64 / BS;
        if blocks > u64::from(self.sb.layout.checkpoint_blocks) {
            return Err(EngineError::CheckpointTooLarge {
                needed: blocks,
                area: self.sb.layout.checkpoint_blocks,
            });
        }
        let area = 1 - self.sb.active_checkpoint;
        let off = self.sb.layout.checkpoint_start(area) * BS;
        self.cache
            .write_at(off, &bytes)
            .map_err(EngineError::cache("checkpoint write", off))?;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;
        self.stats.cache_md_write_bytes += bytes.len() as u64;

        self.sb.active_checkpoint = area;
        self.sb.clean = clean;
        self.write_superblock()?;
        self.l2p.checkpoint_committed();
        self.stats.checkpoints += 1;
        Ok(())
    }

    /// Starts an incremental checkpoint (or takes a synchronous one when the pages
    /// per iteration are 0).
    pub(crate) fn checkpoint_begin(&mut self) -> Result<(), EngineError> {
        if self.config.checkpoint_pages_per_poll == 0 {
            return self.checkpoint(false);
        }
        let before = self.stats.checkpoints;
        self.durability_point()?;
        if self.stats.checkpoints != before {
            // The journal was too full: the durability point became a checkpoint.
            return Ok(());
        }
        self.drop_stale_relocations();
        let generation = self.journal.epoch + 1;
        let regions = self.region_snapshot();
        let (journal_next, journal_sequence) = self.journal.begin_epoch(generation);
        self.l2p.mark_checkpoint_pending();
        self.ckpt = Some(CheckpointInProgress {
            generation,
            regions,
            sid_next: self.sid_next,
            journal_next,
            journal_sequence,
            time: self.now(),
        });
        self.ckpt_user_bytes = self.stats.user_write_bytes;
        self.stats.checkpoints_started += 1;
        Ok(())
    }

    /// One bounded step of the checkpoint in progress; commits it when its pages are
    /// written. Returns true if it did anything.
    pub(crate) fn checkpoint_step(&mut self) -> Result<bool, EngineError> {
        if self.ckpt.is_none() {
            return Ok(false);
        }
        let n = if self.journal.nearly_full() {
            // Entries recovery needs are about to be overwritten: finish now.
            usize::MAX
        } else {
            self.config.checkpoint_pages_per_poll as usize
        };
        let bytes = self.l2p.write_back_pending(&mut self.cache, n)?;
        self.stats.cache_md_write_bytes += bytes;
        self.stats.checkpoint_page_writes += bytes / BS;
        if self.l2p.pending_pages() == 0 {
            self.checkpoint_end()?;
        }
        Ok(true)
    }

    fn checkpoint_end(&mut self) -> Result<(), EngineError> {
        self.submit_runs()?;
        self.drain_io()?;
        let fp = self.flush_point_records();
        let lens: Vec<usize> = fp.iter().map(|r| r.encoded_len()).collect();
        if !self.journal.fits(self.journal.entries_needed(&lens), 0) {
            return self.checkpoint(false);
        }
        // Every event a page written since the start reflects becomes durable.
        self.make_durable(true)?;
        self.durable_asn = self.asn_next;
        let Some(ip) = self.ckpt.take() else {
            return Ok(());
        };
        self.stats.l2p_page_writes_total = self.l2p.counters.page_writes;
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
            volumes: self.volumes.table.clone(),
            directories: self.directories(),
        };
        self.commit_checkpoint(&ck, false)?;
        self.journal.committed_since_start();
        self.ckpt_sid_base = ip.sid_next;
        self.release_pending()?;
        self.complete_durable_waiters();
        Ok(())
    }

    /// True when the next checkpoint is due: bytes written, journal use or SIDs.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.ckpt.is_none()
            && (self.stats.user_write_bytes - self.ckpt_user_bytes
                >= self.checkpoint_interval_bytes()
                || self.journal.needs_checkpoint()
                || self.sid_next - self.ckpt_sid_base >= SID_LEASE / 2)
    }

    pub(crate) fn checkpoint_interval_bytes(&self) -> u64 {
        self.config
            .checkpoint_interval_bytes
            .unwrap_or(self.volumes.user_capacity_blocks * BS / 16)
            .max(BS)
    }

    /// Writes the superblock with generation + 1 to the copy that generation selects.
    pub(crate) fn write_superblock(&mut self) -> Result<(), EngineError> {
        self.sb.generation += 1;
        let copy = self.sb.generation % 2;
        let off = copy * BS;
        self.cache
            .write_at(off, &self.sb.encode())
            .map_err(EngineError::cache("superblock write", off))?;
        self.cache.flush().map_err(EngineError::cache("flush", 0))?;
        self.stats.cache_md_write_bytes += BS;
        Ok(())
    }
}
