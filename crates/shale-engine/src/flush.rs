//! Durability points: user flushes, FUA writes, and the moment freed regions become
//! reusable.
//!
//! A durability point (synchronous; it stalls the loop while it runs):
//! 1. submits every appended block and waits for all device I/O in flight;
//! 2. writes the partial md of each unsettled group to the md copy not holding the
//!    newest valid one (generation + 1);
//! 3. flushes the capacity device if it has unflushed writes, then the cache device:
//!    every data and md block written so far is durable;
//! 4. appends a FlushPoint (open regions' write pointers) and writes the journal;
//! 5. flushes the cache device again;
//! 6. releases PendingFree regions (zones are reset) and completes flush/FUA waiters.
//!
//! The journal is written only after the flush in step 3, so a FlushPoint found on
//! media proves that what it claims is durable (even when its own flush in step 5 was
//! cut short): recovery never has to guess whether the last flush completed, and md
//! a FlushPoint claims that is missing or damaged is an error, not a torn write.
//!
//! Cost: a FUA write or flush pays one journal entry write, a capacity flush when
//! zones were written, and two cache flushes, and drains the pipeline. Invariant
//! (deferred free): a region emptied by relocations or overwrites is reused only
//! after step 5 made those writes and their mappings' journal records durable.

use shale_device::{BlockDevice, ZoneAction, ZonedDevice};
use shale_format::{JournalRecord, RegionState, BLOCK_SIZE, FLUSH_POINT_REGIONS_MAX};

use crate::layout::{Groups, BS};
use crate::write::group::MdState;
use crate::{Clock, Engine, EngineError, Reply};

/// Durability points' state: what the last one covered and who waits for the next.
#[derive(Debug, Default)]
pub(crate) struct Durability {
    /// The writer's `asn_next` at the last durability point.
    pub durable_asn: u64,
    /// Flushes and FUA writes waiting for the next durability point.
    pub waiters: Vec<crate::request::Answer>,
    /// A durability point is due at the end of this loop iteration.
    pub requested: bool,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Waits for every device I/O in flight.
    pub(crate) fn drain_io(&mut self) -> Result<(), EngineError> {
        while self.core.io.count > 0 {
            self.reap(1)?;
        }
        Ok(())
    }

    /// Steps 1-5; with `journal == false` (checkpoints) no journal entry is written and
    /// one cache flush suffices.
    pub(crate) fn make_durable(&mut self, journal: bool) -> Result<(), EngineError> {
        self.durability.requested = false;
        self.writer.submit_runs(&mut self.core)?;
        self.drain_io()?;
        let groups = Groups {
            blocks: self.core.geo.chunk_blocks,
        };
        let mut blk = Box::new([0u8; BLOCK_SIZE]);
        for gi in 0..self.writer.groups.len() {
            let g = &mut self.writer.groups[gi];
            if g.md_state != MdState::Filling || g.filled == g.md_durable_entries {
                continue;
            }
            let copy = g.seal_partial(&mut blk);
            let off = self
                .core
                .geo
                .chunk_offset(g.region, groups.md_slot(g.group) + copy);
            self.core
                .cache
                .write_at(off, &blk[..])
                .map_err(EngineError::cache("partial md write", off))?;
            let g = &mut self.writer.groups[gi];
            g.md_newest = Some(copy);
            g.md_durable_entries = g.filled;
            self.core.stats.cache_md_write_bytes += BS;
        }
        if self.core.capacity_dirty {
            self.core
                .capacity
                .flush()
                .map_err(EngineError::capacity("flush", 0))?;
            self.core.capacity_dirty = false;
        }
        self.core
            .cache
            .flush()
            .map_err(EngineError::cache("flush", 0))?;
        if journal {
            for r in self.flush_point_records() {
                self.core.journal.append(r);
            }
            self.core.stats.cache_md_write_bytes +=
                self.core.journal.write_pending(&mut self.core.cache)?;
            self.core
                .cache
                .flush()
                .map_err(EngineError::cache("flush", 0))?;
        }
        Ok(())
    }

    /// FlushPoint records: the write pointers of the open regions.
    pub(crate) fn flush_point_records(&self) -> Vec<JournalRecord> {
        let open: Vec<_> = (0..self.core.geo.region_count())
            .map(shale_format::RegionId)
            .filter(|&r| self.core.regions.get(r).state == RegionState::Open)
            .map(|r| (r, self.core.regions.get(r).wp))
            .collect();
        open.chunks(FLUSH_POINT_REGIONS_MAX)
            .map(|part| JournalRecord::FlushPoint {
                regions: part.to_vec(),
            })
            .collect()
    }

    /// A full durability point (steps 1-6). When the journal cannot take its records
    /// without overwriting entries recovery needs, it is a checkpoint instead (which
    /// makes the same writes durable without the journal).
    pub(crate) fn durability_point(&mut self) -> Result<(), EngineError> {
        self.writer.submit_runs(&mut self.core)?;
        self.drain_io()?;
        if self.nothing_to_make_durable() {
            // An idle flush: everything is already durable; skip the journal block and
            // the device flushes.
            self.durability.requested = false;
            self.core.stats.idle_flushes += 1;
            self.complete_durable_waiters();
            return Ok(());
        }
        let lens: Vec<usize> = self
            .flush_point_records()
            .iter()
            .map(JournalRecord::encoded_len)
            .collect();
        if !self
            .core
            .journal
            .fits(self.core.journal.entries_needed(&lens), 0)
        {
            return self.checkpoint(false);
        }
        self.make_durable(true)?;
        self.durability.durable_asn = self.writer.asn_next;
        self.release_pending()?;
        self.core.stats.durability_points += 1;
        self.complete_durable_waiters();
        Ok(())
    }

    /// True when no write, record, md or freed region happened since the last
    /// durability point (all I/O has been drained by the caller).
    fn nothing_to_make_durable(&self) -> bool {
        self.writer.asn_next == self.durability.durable_asn
            && !self.core.capacity_dirty
            && self.core.journal.is_empty()
            && self.core.regions.pending_free.is_empty()
            && self.writer.groups.iter().all(|g| {
                g.filled == g.md_durable_entries
                    || g.md_state != crate::write::group::MdState::Filling
            })
    }

    pub(crate) fn complete_durable_waiters(&mut self) {
        self.writer.complete_writes(&mut self.durability);
        for d in self.durability.waiters.drain(..) {
            d.send(Ok(Reply::Done));
        }
    }

    /// Step 6: PendingFree regions become Free (zones are reset first).
    pub(crate) fn release_pending(&mut self) -> Result<(), EngineError> {
        let pending = std::mem::take(&mut self.core.regions.pending_free);
        for r in pending {
            if self.core.regions.get(r).state != RegionState::PendingFree {
                continue;
            }
            if self.core.geo.is_chunk(r) {
                self.core.stats.chunk_frees += 1;
            } else {
                let z = self.core.geo.zone_of(r).0;
                self.core
                    .capacity
                    .manage(z, ZoneAction::Reset)
                    .map_err(EngineError::capacity(
                        "zone reset",
                        self.core.geo.zone_offset(r, 0),
                    ))?;
                self.core.stats.zone_resets += 1;
            }
            let len = if self.core.geo.is_chunk(r) {
                self.core.geo.chunk_blocks
            } else {
                self.core.geo.zone_size_blocks
            };
            self.core
                .md_cache
                .invalidate_range(self.core.geo.region_base(r).0, len);
            self.core.regions.release(&self.core.geo, r);
        }
        Ok(())
    }
}
