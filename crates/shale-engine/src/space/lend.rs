//! Zones and chunks lent between the shards of a pool that share one capacity or
//! cache device: what one shard gives to the space manager and takes from it
//! (`Request::GiveZones`, `Request::TakeZones`, `Request::GiveChunks`,
//! `Request::TakeChunks`; docs/engine.md "Zones lent between shards").
//!
//! A zone is this shard's unless its region state is `Foreign`. A given zone was free
//! here (empty on the device: a zone is reset before it is free) and becomes Foreign;
//! the caller makes that durable with a checkpoint before it answers, so no open after
//! a crash takes the zone back, scans it or resets it while another shard writes it.
//! A taken zone is reset (the shard that held it may have left it written and not
//! claimed it durably) and becomes Free here; nothing is recorded: a crash before
//! the zone is opened (a `RegionOpened` record, made durable with the zone's first
//! claims) leaves it Foreign in every shard, and the pool's open hands it out again.
//!
//! Chunks move the same way. A chunk has no device state to reset, and its md
//! blocks may hold another shard's lives, whose SIDs (counted per shard) could equal
//! or pass the one this shard opens it with: recovery would then take those md
//! blocks for this life's, or skip this life as reused. So a taken chunk's md
//! blocks are overwritten with zeros before it is free here; the next durability
//! point (which any claim in the chunk waits for) makes them durable, and a crash
//! before that leaves the chunk Foreign everywhere, to be taken, and zeroed, again.

use shale_device::{BlockDevice, ZoneAction, ZoneState, ZonedDevice};
use shale_format::{RegionId, RegionState};

use crate::core::Core;
use crate::{Clock, EngineError};

fn refused(reason: String) -> EngineError {
    EngineError::ZoneLending { reason }
}

/// Takes up to `count` free zones off the free list and marks them Foreign, keeping
/// `keep` free zones here. Returns the zones' indices on the capacity device, the
/// oldest free first. The caller checkpoints before it answers.
pub(crate) fn give(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    count: u32,
    keep: usize,
) -> Result<Vec<u32>, EngineError> {
    if core.geo.tiered() {
        return Err(refused("a pool with a cold tier lends no zones".into()));
    }
    let mut n = (count as usize).min(core.regions.free_zones.len().saturating_sub(keep));
    // Only spare is lent: the zones left must still hold all the capacity the
    // format promised, at half the pool's spare.
    let foreign = foreign_zones(&core.regions);
    let promised = core.volumes.user_capacity_blocks;
    while n > 0 && capacity_with(core, foreign + n, true) < promised {
        n -= 1;
    }
    let mut given = Vec::with_capacity(n);
    for _ in 0..n {
        let Some(r) = core.regions.free_zones.pop_front() else {
            break;
        };
        let reg = core.regions.get_mut(r);
        debug_assert_eq!(reg.state, RegionState::Free);
        reg.state = RegionState::Foreign;
        given.push(core.geo.zone_of(r).0);
    }
    core.stats.zones_given += given.len() as u64;
    Ok(given)
}

/// Makes each of `zones` (indices on the capacity device) free here: each must be
/// Foreign here, and is reset on the device unless it is empty. All are checked
/// before any is taken.
pub(crate) fn take(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    zones: &[u32],
) -> Result<(), EngineError> {
    if core.geo.tiered() {
        return Err(refused("a pool with a cold tier lends no zones".into()));
    }
    let mut regions = Vec::with_capacity(zones.len());
    for &z in zones {
        let r = (z >= 1 && z < core.geo.zone_count)
            .then(|| core.geo.zone_region(shale_format::ZoneId(z)))
            .ok_or_else(|| {
                refused(format!(
                    "zone {z} is not a data zone (1..{})",
                    core.geo.zone_count
                ))
            })?;
        let state = core.regions.get(r).state;
        if state != RegionState::Foreign || regions.contains(&r) {
            return Err(refused(format!(
                "zone {z} is not another shard's here ({state:?}{})",
                if regions.contains(&r) {
                    ", named twice"
                } else {
                    ""
                }
            )));
        }
        regions.push(r);
    }
    // Every reset first, then the states: a failed reset takes none of the zones,
    // so the manager may give them all back to the shard that gave them (a zone in
    // transit is empty and nobody's, so resetting it is harmless).
    for &r in &regions {
        let z = core.geo.zone_of(r).0;
        let info = core
            .capacity
            .zone_info(z)
            .map_err(EngineError::capacity("zone report", 0))?;
        if info.state != ZoneState::Empty {
            core.capacity
                .manage(z, ZoneAction::Reset)
                .map_err(EngineError::capacity("zone reset", info.start))?;
        }
    }
    for r in regions {
        let geo = core.geo;
        core.regions.get_mut(r).state = RegionState::Free;
        core.regions.push_free(&geo, r);
        core.stats.zones_taken += 1;
    }
    Ok(())
}

/// Blocks of user capacity this engine's own zones hold: the format's arithmetic
/// (data zones less the reserve, less half the spare) over the zones that are not
/// another shard's, and never more than the format promised. A shard gives zones
/// only while this stays the promise (`give`), so lending moves spare between
/// shards, never capacity a volume may be given. The reserve counted is the
/// format's: a runtime setting (more streams, a higher GC threshold) takes spare,
/// as it does in a shard that lends nothing.
pub(crate) fn capacity_blocks(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> u64 {
    capacity_with(core, foreign_zones(&core.regions), false)
}

/// As `capacity_blocks` with `foreign` zones another shard's; `runtime`: the
/// reserve is the larger of the format's and today's (what a give must leave).
fn capacity_with(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    foreign: usize,
    runtime: bool,
) -> u64 {
    let promised = core.volumes.user_capacity_blocks;
    if foreign == 0 {
        return promised;
    }
    let zone_data = f64::from(
        crate::layout::Groups {
            blocks: core.geo.zone_cap_blocks,
        }
        .data_capacity(),
    );
    let spare = core.config.spare_factor;
    // The promise was made with the format's reserve, which the promise itself
    // tells: zones the shard held at format less those the promise fills at the
    // whole spare. A give also leaves today's reserve, if larger, so zones lent while
    // fewer streams run are not missed when more run again.
    let count = u32::from(core.sb.shard.count.max(1));
    let held_at_format = f64::from(core.geo.zone_count / count) - 1.0;
    let format_reserve = held_at_format - promised as f64 / (zone_data * (1.0 - spare));
    let reserve = if runtime {
        f64::from(crate::open::reserve_zones(&core.config, core.streams)).max(format_reserve)
    } else {
        format_reserve
    };
    let owned = f64::from(core.geo.zone_count - 1) - foreign as f64;
    let user = (owned - reserve).max(0.0) * zone_data * (1.0 - spare / 2.0);
    (user.floor() as u64).min(promised)
}

/// At format on a shared device: zones `owned..` are other shards'.
pub(crate) fn foreign_from(
    geo: &crate::layout::Geometry,
    regions: &mut crate::space::Regions,
    owned: u32,
) {
    for z in owned..geo.zone_count {
        let r = geo.zone_region(shale_format::ZoneId(z));
        regions.get_mut(r).state = RegionState::Foreign;
    }
    regions
        .free_zones
        .retain(|&r| regions.regions[r.0 as usize].state == RegionState::Free);
}

/// The zones of the capacity device that are another shard's here, in order.
pub(crate) fn foreign_list(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Vec<u32> {
    (1..core.geo.zone_count)
        .filter(|&z| {
            let r = core.geo.zone_region(shale_format::ZoneId(z));
            core.regions.get(r).state == RegionState::Foreign
        })
        .collect()
}

/// The zones of the capacity device that are another shard's here.
pub(crate) fn foreign_zones(regions: &crate::space::Regions) -> usize {
    regions
        .regions
        .iter()
        .filter(|r| r.state == RegionState::Foreign)
        .count()
        - regions.foreign_chunks as usize
}

/// Takes up to `count` free chunks off the free list and marks them Foreign. A
/// shard keeps at least half the chunks it held at format, enough for two of the
/// largest requests and a chunk for compaction, and more free chunks than its
/// compaction threshold (giving never starts compaction). Returns the chunks'
/// indices, the oldest free first. The caller checkpoints before it answers.
pub(crate) fn give_chunks(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    count: u32,
) -> Result<Vec<u32>, EngineError> {
    let geo = core.geo;
    let owned = core.regions.owned_chunks(&geo);
    let shards = u32::from(core.sb.shard.count.max(1));
    let data = u64::from(
        crate::layout::Groups {
            blocks: geo.chunk_blocks,
        }
        .data_capacity(),
    );
    let request = core.config.request_bytes_max.div_ceil(crate::layout::BS) + 1;
    let floor = (geo.chunk_count / shards)
        .div_ceil(2)
        .max((2 * request).div_ceil(data) as u32 + 1);
    let free = core.regions.free_chunks.len() as u32;
    let mut n = count.min(owned.saturating_sub(floor));
    while n > 0 {
        let keep = crate::background::compaction_threshold(owned - n, &core.config) as u32 + 1;
        if free >= n + keep {
            break;
        }
        n -= 1;
    }
    let mut given = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let Some(r) = core.regions.free_chunks.pop_front() else {
            break;
        };
        let reg = core.regions.get_mut(r);
        debug_assert_eq!(reg.state, RegionState::Free);
        reg.state = RegionState::Foreign;
        core.regions.foreign_chunks += 1;
        given.push(r.0);
    }
    if !given.is_empty() {
        chunks_held_changed(core);
    }
    core.stats.chunks_given += given.len() as u64;
    Ok(given)
}

/// Makes each of `chunks` free here: each must be Foreign here. Its md blocks are
/// overwritten with zeros first (see the module docs). All are checked, and all
/// zeroed, before any is taken: a failed write takes none, so the manager may give
/// them all back to the shard that gave them (a chunk in transit is nobody's).
pub(crate) fn take_chunks(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    chunks: &[u32],
) -> Result<(), EngineError> {
    let geo = core.geo;
    for (i, &c) in chunks.iter().enumerate() {
        let state = (c < geo.chunk_count).then(|| core.regions.get(RegionId(c)).state);
        if state != Some(RegionState::Foreign) || chunks[..i].contains(&c) {
            return Err(refused(format!(
                "chunk {c} is not another shard's here ({}{})",
                state.map_or_else(
                    || format!("not one of {} chunks", geo.chunk_count),
                    |s| format!("{s:?}")
                ),
                if chunks[..i].contains(&c) {
                    ", named twice"
                } else {
                    ""
                }
            )));
        }
    }
    let groups = crate::layout::Groups {
        blocks: geo.chunk_blocks,
    };
    let zeros = vec![0u8; 2 * shale_format::BLOCK_SIZE];
    for &c in chunks {
        for g in 0..groups.count() {
            // md A and md B are side by side at the end of every group.
            let at = geo.chunk_offset(RegionId(c), groups.md_slot(g));
            core.cache
                .write_at(at, &zeros)
                .map_err(EngineError::cache("taken chunk md clear", at))?;
        }
    }
    for &c in chunks {
        let r = RegionId(c);
        core.regions.get_mut(r).state = RegionState::Free;
        core.regions.foreign_chunks -= 1;
        core.regions.push_free(&geo, r);
        core.stats.chunks_taken += 1;
    }
    chunks_held_changed(core);
    Ok(())
}

/// Cache shares are a percentage of the chunks held.
fn chunks_held_changed(core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>) {
    let geo = core.geo;
    let foreign = core.regions.foreign_chunks;
    core.regions.shares.set_chunks_held(&geo, foreign);
    core.apply_volume_policies();
}

/// The chunks that are another shard's here, in order.
pub(crate) fn foreign_chunk_list(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
) -> Vec<u32> {
    (0..core.geo.chunk_count)
        .filter(|&c| core.regions.get(RegionId(c)).state == RegionState::Foreign)
        .collect()
}

/// At format on a shared cache: chunks `owned..` are other shards'.
pub(crate) fn foreign_chunks_from(
    geo: &crate::layout::Geometry,
    regions: &mut crate::space::Regions,
    owned: u32,
) {
    for c in owned..geo.chunk_count {
        regions.get_mut(RegionId(c)).state = RegionState::Foreign;
    }
    regions.foreign_chunks = geo.chunk_count - owned.min(geo.chunk_count);
    regions
        .free_chunks
        .retain(|&r| regions.regions[r.0 as usize].state == RegionState::Free);
    regions.shares.set_chunks_held(geo, regions.foreign_chunks);
}
