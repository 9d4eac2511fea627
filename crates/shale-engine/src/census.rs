//! The census after an open, in the background.
//!
//! A clean shutdown's checkpoint is taken at one instant, so the valid counts it
//! records are exact, and the engine can serve I/O with them at once; what it lacks is
//! the validity bits, one per block, which only a walk of every L2P page can rebuild
//! (at 1 TiB fully mapped, 211,247 pages and about half a second; at 16 TiB, seconds).
//! After a crash the counts are not known either (an incremental checkpoint's counts
//! are as of its start, its L2P pages may be later): they start at zero and count the
//! bits as they are set (`Regions::counts_unknown`). The walk runs here a batch of
//! pages per loop iteration while user I/O goes on.
//!
//! Why a walk interleaved with writes ends with exact bits: a page is walked in one
//! step, in its current state, and sets the bits of its current mappings. A mapping
//! made after the open sets its bit when made (`mark_valid`); one removed clears its bit
//! when removed (`mark_invalid`; a bit the walk has not set yet stays clear). So after
//! the last page, every mapped block's bit is set and no other. Each region's set bits
//! are tallied on every flip (`Regions::census_bits`); known counts move with every
//! mapping made or removed, unknown ones are the tally.
//!
//! Until then nothing may trust a region's bits or act on a count reaching zero:
//! compaction, GC and the scrub wait, and a region whose count reaches zero is not made
//! PendingFree (`Regions::census_pending`). If space runs short meanwhile the walk
//! speeds up, and a write waiting for space finishes it. At the end every region's
//! tally must equal its count, or the checkpoint was wrong: the engine stops with the
//! reason (nothing has been freed on the strength of those counts, so nothing is lost).
//! A shutdown finishes a walk whose counts were unknown before its checkpoint records
//! them.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Lba, Pba, RegionId, RegionState, VolumeId};

use crate::core::Core;
use crate::layout::{Geometry, Groups};
use crate::recovery::Meter;
use crate::space::Region;
use crate::{Clock, EngineError, OpenError, RecoveryError};

/// Where a mapping met by a census may point: a data slot of an open or closed region,
/// below its zone's write pointer on the device when the open began (`zone_wps`, in
/// blocks). Returns the region.
pub(crate) fn check_mapping(
    geo: &Geometry,
    regions: &[Region],
    zone_wps: &[u32],
    (volume, lba, pba): (VolumeId, Lba, Pba),
) -> Result<RegionId, OpenError> {
    let Some((region, slot)) = geo.region_slot(pba).filter(|&(r, slot)| {
        Groups {
            blocks: geo.region_blocks(r),
        }
        .is_data_slot(slot)
    }) else {
        return Err(OpenError::InconsistentCheckpoint {
            reason: format!("{volume} {lba} maps to {pba}, not a data slot"),
        });
    };
    let state = regions[region.0 as usize].state;
    if !matches!(state, RegionState::Open | RegionState::Closed) {
        return Err(RecoveryError::MappedIntoUnusedRegion {
            volume,
            lba,
            pba,
            region,
            state: format!("{state:?}"),
        }
        .into());
    }
    if !geo.is_chunk(region) {
        let wp = zone_wps
            .get(geo.zone_of(region).0 as usize)
            .copied()
            .unwrap_or(0);
        if slot >= wp {
            return Err(RecoveryError::MappedPastWritePointer {
                volume,
                lba,
                pba,
                region,
                wp,
            }
            .into());
        }
    }
    Ok(region)
}

/// A walk in progress.
#[derive(Debug)]
pub(crate) struct Census {
    /// The next (volume, page) to walk.
    next: (usize, usize),
    /// Each zone's write pointer on the device when the open began (blocks). No zone is
    /// reset while the census runs (no region is freed), so a mapped block must lie
    /// below it.
    zone_wps: Vec<u32>,
    pub pages: u64,
    /// After a failed read: engine-clock time before the next try, and whether the
    /// failure was logged.
    retry_at_ns: u64,
    failing: bool,
}

impl Census {
    pub fn new(zone_wps: Vec<u32>) -> Census {
        Census {
            next: (0, 0),
            zone_wps,
            pages: 0,
            retry_at_ns: 0,
            failing: false,
        }
    }
}

/// How long a census whose page read failed waits before trying again.
const RETRY_NS: u64 = 100_000_000;

/// One bounded step in the background (`batches` times the configured pages): a failed page read is retried later (a user
/// request meeting the same error fails alone; the census is not a reason to stop).
/// A broken invariant (`EngineError::Failed`) is returned.
pub(crate) fn background_step(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    batches: usize,
) -> Result<bool, EngineError> {
    let now = core.now();
    if core.census.as_ref().is_none_or(|c| now < c.retry_at_ns) {
        return Ok(false);
    }
    let pages = core.config.census_pages_per_poll.max(1) as usize * batches;
    match step(core, pages) {
        Err(e @ EngineError::Failed { .. }) => Err(e),
        Err(e) => {
            if let Some(c) = core.census.as_mut() {
                c.retry_at_ns = now + RETRY_NS;
                if !std::mem::replace(&mut c.failing, true) {
                    tracing::warn!(error = %e, "census: an L2P page read failed; retrying");
                }
            }
            Ok(false)
        }
        Ok(done) => {
            if let Some(c) = core.census.as_mut() {
                c.failing = false;
            }
            Ok(done)
        }
    }
}

/// Walks up to `max_pages` more L2P pages; ends the census when none is left.
/// Returns whether it did anything.
pub(crate) fn step(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    max_pages: usize,
) -> Result<bool, EngineError> {
    let Some(mut census) = core.census.take() else {
        return Ok(false);
    };
    let geo = core.geo;
    let regions = &mut core.regions;
    let zone_wps = &census.zone_wps;
    let mut bad: Option<String> = None;
    let kinds = core.volumes.kinds();
    let walked = crate::volume::walk_blocks(
        &mut core.l2p,
        &mut core.cache,
        kinds,
        &geo,
        census.next,
        max_pages,
        &mut Meter::off(),
        |volume, lba, pba, base| {
            if bad.is_some() {
                return;
            }
            // An entry maps a block, or the blocks of a unit from `base` on.
            let Some(pba) = pba else {
                bad = Some(format!(
                    "{volume} {lba}: its unit at {base} leaves its region"
                ));
                return;
            };
            match check_mapping(&geo, &regions.regions, zone_wps, (volume, lba, pba)) {
                // Already set: mapped since the open, or mapped twice (the full
                // self-check finds the latter).
                Ok(r) => {
                    regions.census_set(r, pba, volume);
                }
                Err(e) => bad = Some(e.to_string()),
            }
        },
    );
    let (next, pages) = match walked {
        Ok((n, p)) => (Ok(n), p),
        Err(e) => (Err(e), 0),
    };
    census.pages += pages;
    let next = match next {
        Ok(n) => n,
        Err(e) => {
            // Nothing lost: bits set so far are set again when the walk resumes here.
            core.census = Some(census);
            return Err(e);
        }
    };
    if let Some(reason) = bad {
        return Err(EngineError::Failed {
            reason: format!("census: {reason}"),
        });
    }
    match next {
        Some(n) => {
            census.next = n;
            core.census = Some(census);
        }
        None => finish(core, &census)?,
    }
    Ok(true)
}

/// Walks whatever is left of the census at once (space is needed, or something is
/// about to read the bits).
pub(crate) fn complete(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Result<(), EngineError> {
    while core.census.is_some() {
        step(core, usize::MAX)?;
    }
    Ok(())
}

/// The walk is over: every region's bits must add up to its count (after a crash the
/// counts are the bits, counted as they were set); regions whose count reached zero
/// meanwhile may now wait for reuse.
fn finish(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    census: &Census,
) -> Result<(), EngineError> {
    for (i, (reg, &bits)) in core
        .regions
        .regions
        .iter()
        .zip(&core.regions.census_bits)
        .enumerate()
    {
        if bits != reg.valid {
            let what = if core.regions.counts_unknown {
                "counted"
            } else {
                "by the checkpoint's count"
            };
            return Err(EngineError::Failed {
                reason: format!(
                    "census: {} has {} valid blocks {what} and the L2P maps {bits} into it",
                    RegionId(i as u32),
                    reg.valid
                ),
            });
        }
    }
    core.regions.census_pending = false;
    core.regions.counts_unknown = false;
    core.regions.census_bits = Vec::new();
    for i in 0..core.geo.region_count() {
        core.regions.maybe_pending_free(RegionId(i));
    }
    core.stats.census_pages = census.pages;
    tracing::info!(pages = census.pages, "census done");
    Ok(())
}
