//! Pacing of background work: when compaction and GC run, how many bounded steps per
//! loop iteration, and when durability points and checkpoints are forced.
//!
//! Each mover step reads at most one victim group and writes at most one group per
//! stream. Below a threshold the number of steps grows with the deficit; with no free
//! chunk (user writes waiting) the maximum runs every iteration. Checkpoints start by
//! bytes written, journal use or SIDs handed out, and write a bounded number of L2P
//! pages per iteration (`checkpoint.rs`).

use crate::layout::Geometry;
use crate::space::Regions;
use crate::Config;

/// The smallest batch of PendingFree regions released while space is not short.
const PENDING_FREE_BATCH: usize = 4;

/// Free chunks below which compaction runs, of `owned` chunks held (all the cache's
/// but another shard's).
pub(crate) fn compaction_threshold(owned: u32, config: &Config) -> usize {
    ((owned as usize * config.compaction_free_chunks_pct as usize).div_ceil(100)).max(1)
}

/// Free zones below which GC runs: at least the GC reserve + 1.
pub(crate) fn gc_threshold(config: &Config, gc_reserve: usize) -> usize {
    (config.gc_free_zones_min as usize).max(gc_reserve + 1)
}

/// Mover steps this iteration: none above the threshold, more the deeper below it,
/// the most when urgent or when nothing is free.
pub(crate) fn steps_for(config: &Config, free: usize, threshold: usize, urgent: bool) -> u32 {
    let max = config.background_steps_per_poll_max;
    if urgent || free == 0 {
        max
    } else if free < threshold {
        1 + ((threshold - free) as u32 * (max - 1)) / threshold as u32
    } else {
        0
    }
}

/// PendingFree chunks and zones: space the next durability point makes free.
pub(crate) fn pending_counts(geo: &Geometry, regions: &Regions) -> (usize, usize) {
    let chunks = regions
        .pending_free
        .iter()
        .filter(|&&r| geo.is_chunk(r))
        .count();
    (chunks, regions.pending_free.len() - chunks)
}

/// PendingFree zones of the cold tier (counted in `pending_counts`' zones too).
pub(crate) fn pending_cold(geo: &Geometry, regions: &Regions) -> usize {
    if !geo.tiered() {
        return 0;
    }
    regions
        .pending_free
        .iter()
        .filter(|&&r| geo.is_cold(r))
        .count()
}

/// Whether freed space is released now (a durability point): when a writer needs it,
/// when free space is about to run out, or when the batch is large. Each durability
/// point drains the pipeline and flushes both devices, so freed regions go in batches.
pub(crate) fn release_due(
    geo: &Geometry,
    config: &Config,
    regions: &Regions,
    (gc_reserve, cold_reserve): (usize, usize),
    user_blocked: bool,
    zones_blocked: bool,
) -> bool {
    let (pending_chunks, pending_zones) = pending_counts(geo, regions);
    let owned = regions.owned_chunks(geo);
    let chunks_short = pending_chunks > 0
        && (user_blocked
            || regions.free_chunks.len() < compaction_threshold(owned, config).div_ceil(4).max(2));
    let cold_short = geo.tiered() && regions.free_cold_zones.len() <= cold_reserve + 1;
    let zones_short = pending_zones > 0
        && (zones_blocked || regions.free_zones.len() <= gc_reserve + 1 || cold_short);
    let batch_full = pending_chunks >= (owned as usize / 8).max(PENDING_FREE_BATCH)
        || pending_zones >= (geo.zone_count as usize / 64).clamp(PENDING_FREE_BATCH, 64);
    chunks_short || zones_short || batch_full
}
