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

use crate::core::Core;
use crate::layout::{Groups, BS};
use crate::write::chunk_writer::ChunkWriter;
use crate::write::group::MdState;
use crate::{Clock, EngineError, Reply};

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

impl Durability {
    /// Steps 2-5, once the caller has submitted every appended block and drained the
    /// I/O in flight; with `journal == false` (checkpoints) no journal entry is
    /// written and one cache flush suffices.
    pub fn seal(
        &mut self,
        core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &mut ChunkWriter,
        journal: bool,
    ) -> Result<(), EngineError> {
        let groups = Groups {
            blocks: core.geo.chunk_blocks,
        };
        let mut blk = Box::new([0u8; BLOCK_SIZE]);
        for g in writer.groups.iter_mut() {
            if g.md_state != MdState::Filling || g.filled == g.md_durable_entries {
                continue;
            }
            let copy = g.seal_partial(&mut blk);
            let off = core
                .geo
                .chunk_offset(g.region, groups.md_slot(g.group) + copy);
            core.cache
                .write_at(off, &blk[..])
                .map_err(EngineError::cache("partial md write", off))?;
            g.md_newest = Some(copy);
            g.md_durable_entries = g.filled;
            core.stats.cache_md_write_bytes += BS;
        }
        if core.capacity_dirty {
            core.capacity
                .flush()
                .map_err(EngineError::capacity("flush", 0))?;
            core.capacity_dirty = false;
        }
        core.cache.flush().map_err(EngineError::cache("flush", 0))?;
        if journal {
            for r in flush_point_records(core) {
                core.journal.append(r);
            }
            core.stats.cache_md_write_bytes += core.journal.write_pending(&mut core.cache)?;
            core.cache.flush().map_err(EngineError::cache("flush", 0))?;
        }
        Ok(())
    }

    /// True when no write, record, md or freed region happened since the last
    /// durability point (all I/O has been drained by the caller).
    pub fn nothing_to_make_durable(
        &self,
        core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
        writer: &ChunkWriter,
    ) -> bool {
        writer.asn_next == self.durable_asn
            && !core.capacity_dirty
            && core.journal.is_empty()
            && core.regions.pending_free.is_empty()
            && writer
                .groups
                .iter()
                .all(|g| g.filled == g.md_durable_entries || g.md_state != MdState::Filling)
    }

    /// Answers the writes whose blocks are written and every flush and FUA write
    /// waiting: all of it is durable now.
    pub fn complete_waiters(&mut self, writer: &mut ChunkWriter) {
        writer.complete_writes(self);
        for d in self.waiters.drain(..) {
            d.send(Ok(Reply::Done));
        }
    }
}

/// FlushPoint records: the write pointers of the open regions.
pub(crate) fn flush_point_records(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Vec<JournalRecord> {
    let open: Vec<_> = (0..core.geo.region_count())
        .map(shale_format::RegionId)
        .filter(|&r| core.regions.get(r).state == RegionState::Open)
        .map(|r| (r, core.regions.get(r).wp))
        .collect();
    open.chunks(FLUSH_POINT_REGIONS_MAX)
        .map(|part| JournalRecord::FlushPoint {
            regions: part.to_vec(),
        })
        .collect()
}

/// Whether the journal can take the FlushPoint records without overwriting entries
/// recovery needs; when it cannot, a checkpoint makes the same writes durable instead.
pub(crate) fn flush_point_fits(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> bool {
    let lens: Vec<usize> = flush_point_records(core)
        .iter()
        .map(JournalRecord::encoded_len)
        .collect();
    core.journal.fits(core.journal.entries_needed(&lens), 0)
}

/// Step 6: PendingFree regions become Free (zones are reset first).
pub(crate) fn release_pending(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Result<(), EngineError> {
    let pending = std::mem::take(&mut core.regions.pending_free);
    for r in pending {
        if core.regions.get(r).state != RegionState::PendingFree {
            continue;
        }
        if core.geo.is_chunk(r) {
            core.stats.chunk_frees += 1;
        } else {
            let z = core.geo.zone_of(r).0;
            core.capacity
                .manage(z, ZoneAction::Reset)
                .map_err(EngineError::capacity(
                    "zone reset",
                    core.geo.zone_offset(r, 0),
                ))?;
            core.stats.zone_resets += 1;
        }
        let len = if core.geo.is_chunk(r) {
            core.geo.chunk_blocks
        } else {
            core.geo.zone_size_blocks
        };
        core.md_cache
            .invalidate_range(core.geo.region_base(r).0, len);
        core.regions.release(&core.geo, r);
    }
    Ok(())
}
