//! Volumes: create, resize, delete, list. Each change rewrites the volume table (the
//! copy its generation selects), journals a VolumeChanged record and takes a
//! checkpoint, so a volume's L2P pages can be recycled safely.
//!
//! Invariants: the sum of volume sizes never exceeds the user capacity (no thin
//! provisioning); names are unique, 1..=32 bytes; ids are table slots < volumes_max;
//! uids are issued from the table's `uid_next` and never reused, so a request naming
//! a deleted volume's uid finds nothing even after its slot is taken again.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{
    JournalRecord, VolumeEntry, VolumeId, VolumeLimits, VolumeTable, VolumeUid, MAP_UNIT_SHIFT_MAX,
    VOLUMES_MAX, VOLUME_NAME_MAX,
};

use crate::core::Core;
use crate::layout::BS;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, EngineError, VolumeInfo, VolumeLayout};

/// Calls `f` for each block an L2P entry maps: `entry` of a volume whose mapping
/// unit shift is `shift`, mapped to `base`. The blocks are `(lba, pba)`, `pba`
/// `None` where the unit would leave `base`'s region (a corrupt map).
pub(crate) fn entry_blocks(
    geo: &crate::layout::Geometry,
    shift: u8,
    entry: shale_format::Lba,
    base: shale_format::Pba,
    mut f: impl FnMut(shale_format::Lba, Option<shale_format::Pba>),
) {
    for j in 0..1u64 << shift {
        let pba = if j == 0 {
            Some(base)
        } else {
            geo.data_advance(base, j)
        };
        f(shale_format::Lba((entry.0 << shift) + j), pba);
    }
}

/// What a walk of the maps needs of the volumes (a copy: walks borrow the rest of
/// the core).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MapKinds {
    shifts: [u8; VOLUMES_MAX as usize],
    duals: [bool; VOLUMES_MAX as usize],
    volumes_max: u32,
}

/// L2P pages one step of [`walk_blocks`] gathers before it resolves their entries.
const WALK_BATCH_PAGES: usize = 64;

/// Calls `f(volume, lba, pba, entry_pba)` for every mapped block of every volume,
/// over at most `max_pages` L2P pages from `from` (as `L2p::for_each_mapped_from`):
/// each entry expanded to its unit's blocks, `pba` `None` where the unit would leave
/// its region (a corrupt map). A dual volume's blocks come from its sparse map and
/// from its unit map where the sparse map has no entry (the unit map's copy of a
/// block the sparse map holds is stale, and skipped). Returns where the walk goes
/// on and the pages walked.
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_blocks<C: BlockDevice>(
    l2p: &mut crate::l2p::L2p,
    cache: &mut C,
    kinds: MapKinds,
    geo: &crate::layout::Geometry,
    from: (usize, usize),
    max_pages: usize,
    meter: &mut crate::recovery::Meter<'_>,
    mut f: impl FnMut(VolumeId, shale_format::Lba, Option<shale_format::Pba>, shale_format::Pba),
) -> Result<(Option<(usize, usize)>, u64), EngineError> {
    let epp = l2p.format().entries_per_page();
    let mut next = Some(from);
    let mut pages = 0u64;
    let mut batch: Vec<(VolumeId, shale_format::Lba, shale_format::Pba)> = Vec::new();
    let mut fine_page: Option<(VolumeId, u64, bool)> = None;
    let mut fine_buf = Box::new([shale_format::Pba::NONE; crate::l2p::MAX_EPP]);
    let mut left = max_pages;
    while let Some(at) = next {
        if left == 0 {
            break;
        }
        let take = left.min(WALK_BATCH_PAGES);
        left -= take;
        batch.clear();
        let mut last = None;
        next = l2p.for_each_mapped_from(at, take, cache, meter, |map, entry, base| {
            if last != Some((map, entry.0 / epp)) {
                last = Some((map, entry.0 / epp));
                pages += 1;
            }
            batch.push((map, entry, base));
        })?;
        for &(map, entry, base) in &batch {
            if map.0 >= kinds.volumes_max {
                let volume = VolumeId(map.0 - kinds.volumes_max);
                f(volume, entry, Some(base), base);
                continue;
            }
            let shift = kinds.shifts.get(map.0 as usize).copied().unwrap_or(0);
            if !kinds.duals.get(map.0 as usize).copied().unwrap_or(false) {
                entry_blocks(geo, shift, entry, base, |lba, pba| f(map, lba, pba, base));
                continue;
            }
            let fine = VolumeId(kinds.volumes_max + map.0);
            let mut blocks = Vec::with_capacity(1 << shift);
            entry_blocks(geo, shift, entry, base, |lba, pba| blocks.push((lba, pba)));
            for (lba, pba) in blocks {
                let p = lba.0 / epp;
                if fine_page.is_none_or(|(m, q, _)| (m, q) != (fine, p)) {
                    let any = l2p.peek_page(cache, fine, p as usize, &mut fine_buf)?;
                    fine_page = Some((fine, p, any));
                }
                let shadowed = fine_page.is_some_and(|(.., any)| any)
                    && !fine_buf[(lba.0 % epp) as usize].is_none();
                if !shadowed {
                    f(map, lba, pba, base);
                }
            }
        }
    }
    Ok((next, pages))
}

/// [`walk_blocks`] over every page, counted on `meter`.
pub(crate) fn walk_all_blocks<C: BlockDevice>(
    l2p: &mut crate::l2p::L2p,
    cache: &mut C,
    kinds: MapKinds,
    geo: &crate::layout::Geometry,
    meter: &mut crate::recovery::Meter<'_>,
    f: impl FnMut(VolumeId, shale_format::Lba, Option<shale_format::Pba>, shale_format::Pba),
) -> Result<(), EngineError> {
    meter.start(l2p.walked_pages() as u64);
    walk_blocks(l2p, cache, kinds, geo, (0, 0), usize::MAX, meter, f)?;
    Ok(())
}

/// A shard's slice of a volume (`shale-shards`): the uid to create it under (`None`:
/// issue one, as the first shard does) and the whole volume's size.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Slice {
    pub uid: Option<VolumeUid>,
    pub whole_size_bytes: u64,
}

/// A volume change made in memory, to be persisted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VolumeChange {
    pub volume: VolumeId,
    pub size_blocks: u64,
    pub live: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Volumes {
    pub table: VolumeTable,
    pub user_capacity_blocks: u64,
    pub volumes_max: u32,
    /// Each slot's mapping unit shift (0 for a free slot), kept with the table: the
    /// data path asks for every request and every moved block.
    shifts: [u8; VOLUMES_MAX as usize],
    /// Each slot's dual mapping (a sparse 4 KiB map over its unit map).
    duals: [bool; VOLUMES_MAX as usize],
}

impl Volumes {
    pub fn new(table: VolumeTable, user_capacity_blocks: u64, volumes_max: u32) -> Volumes {
        let mut v = Volumes {
            table,
            user_capacity_blocks,
            volumes_max,
            shifts: [0; VOLUMES_MAX as usize],
            duals: [false; VOLUMES_MAX as usize],
        };
        for e in &v.table.entries {
            if let Some(s) = v.shifts.get_mut(e.id.0 as usize) {
                *s = e.map_unit_shift;
                v.duals[e.id.0 as usize] = e.dual_map;
            }
        }
        v
    }

    /// Whether volume `id` is dual mapped: its unit map, and a sparse map of blocks
    /// ([`Self::fine_map`]) whose entries override it.
    pub fn is_dual(&self, id: VolumeId) -> bool {
        self.duals.get(id.0 as usize).copied().unwrap_or(false)
    }

    /// The L2P map id of dual volume `id`'s sparse map of blocks: past every
    /// volume's own id.
    pub fn fine_map(&self, id: VolumeId) -> VolumeId {
        VolumeId(self.volumes_max + id.0)
    }

    /// The L2P maps the engine keeps: a unit (or block) map per volume slot, and a
    /// sparse block map per dual volume slot.
    pub fn maps_max(&self) -> u32 {
        2 * self.volumes_max
    }

    /// What walks of the maps need to know of the volumes.
    pub fn kinds(&self) -> MapKinds {
        MapKinds {
            shifts: self.shifts,
            duals: self.duals,
            volumes_max: self.volumes_max,
        }
    }

    /// The largest mapping unit of any volume, in blocks.
    pub fn max_unit_blocks(&self) -> u64 {
        1 << self.shifts.iter().copied().max().unwrap_or(0)
    }

    /// Volume `id`'s mapping unit shift: its L2P entry for block `lba` is
    /// `lba >> shift`, and the block is `lba & ((1 << shift) - 1)` data slots past it.
    pub fn shift(&self, id: VolumeId) -> u32 {
        self.shifts.get(id.0 as usize).map_or(0, |&s| u32::from(s))
    }

    pub fn allocated_blocks(&self) -> u64 {
        self.table.entries.iter().map(|e| e.size_blocks).sum()
    }

    pub fn get(&self, id: VolumeId) -> Option<&VolumeEntry> {
        self.table.entries.iter().find(|e| e.id == id)
    }

    /// The slot of the live volume `uid`, if it exists (at most `VOLUMES_MAX` entries:
    /// a scan is cheaper than keeping an index in step).
    pub fn resolve(&self, uid: VolumeUid) -> Option<VolumeId> {
        self.table
            .entries
            .iter()
            .find(|e| e.uid == uid)
            .map(|e| e.id)
    }

    fn info(e: &VolumeEntry) -> VolumeInfo {
        VolumeInfo {
            id: e.id,
            uid: e.uid,
            name: e.name.clone(),
            size_bytes: e.size_blocks * BS,
            whole_size_bytes: if e.whole_size_blocks == 0 {
                e.size_blocks * BS
            } else {
                e.whole_size_blocks * BS
            },
            limits: e.limits,
            layout: VolumeLayout {
                map_unit_shift: e.map_unit_shift,
                dual: e.dual_map,
            },
        }
    }
}

/// A slice's whole-volume size in blocks (0: the volume is whole here): at least the
/// slice, in whole blocks.
fn whole_blocks(slice_blocks: u64, whole: Option<u64>) -> Result<u64, EngineError> {
    let Some(whole) = whole else { return Ok(0) };
    // Only a shard's superblock (version 3) names whole sizes, and its volume
    // table copies are two blocks, where they are kept.
    if !whole.is_multiple_of(BS) || whole / BS < slice_blocks {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "whole size {whole} is not a multiple of 4096 at least the slice's ({})",
                slice_blocks * BS
            ),
        });
    }
    Ok(whole / BS)
}

fn size_blocks(size_bytes: u64) -> Result<u64, EngineError> {
    if size_bytes == 0 || !size_bytes.is_multiple_of(BS) {
        return Err(EngineError::InvalidVolume {
            reason: format!("size {size_bytes} is not a positive multiple of 4096"),
        });
    }
    Ok(size_bytes / BS)
}

/// The rates one shard of `shards` enforces for a volume limited to `l`: a volume's
/// blocks are dealt evenly to the shards, so each admits its share of the rate (at
/// least one request and one block a second).
pub(crate) fn shard_limits(l: VolumeLimits, shards: u8) -> VolumeLimits {
    let n = u64::from(shards.max(1));
    let share = |rate: u64, floor: u64| {
        if rate == 0 {
            0
        } else {
            rate.div_ceil(n).max(floor)
        }
    };
    VolumeLimits {
        iops_max: share(l.iops_max, 1),
        bytes_per_sec_max: share(l.bytes_per_sec_max, BS),
        ..l
    }
}

/// A unit's worst pads (one block short of a unit) are at most this fraction of a zone's
/// data slots: `(unit - 1) * UNIT_PAD_SHARE_MAX <= zone data slots`.
pub(crate) const UNIT_PAD_SHARE_MAX: u64 = 32;

/// The largest mapping unit shift zones of `zone_slots` data slots take.
pub fn max_unit_shift(zone_slots: u64) -> u8 {
    (0..=MAP_UNIT_SHIFT_MAX)
        .rev()
        .find(|&s| ((1u64 << s) - 1) * UNIT_PAD_SHARE_MAX <= zone_slots)
        .unwrap_or(0)
}

/// Refuses a size that is not whole units of `layout`.
fn whole_units(blocks: u64, layout: VolumeLayout) -> Result<(), EngineError> {
    if !blocks.is_multiple_of(1u64 << layout.map_unit_shift) {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "size {} is not a multiple of the volume's mapping unit ({})",
                blocks * BS,
                layout.map_unit_bytes()
            ),
        });
    }
    Ok(())
}

/// L2P pages volume `e` may come to hold: its unit map's, and a dual volume's
/// sparse map may grow to a page per 4 KiB map page.
fn pages_at_most(fmt: shale_format::L2pFormat, blocks: u64, layout: VolumeLayout) -> u64 {
    fmt.pages_for(blocks >> layout.map_unit_shift)
        + if layout.dual {
            fmt.pages_for(blocks)
        } else {
            0
        }
}

/// Refuses a dual volume without a unit (its coarse map).
fn dual_needs_unit(layout: VolumeLayout) -> Result<(), EngineError> {
    if layout.dual && layout.map_unit_shift == 0 {
        return Err(EngineError::InvalidVolume {
            reason: "dual mapping needs a mapping unit above 4 KiB (its coarse map)".into(),
        });
    }
    Ok(())
}

/// Refuses volume `id` (`None`: a new one) at `blocks` when the L2P pool could not
/// hold every volume's maps at their largest. Pools are sized for 4 KiB maps of the
/// whole user capacity, so only dual volumes, whose two maps may take a sixteenth
/// more than a 4 KiB volume's one, can run out: a dual volume, or a volume beside
/// them, may be refused.
fn map_room(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    id: Option<VolumeId>,
    blocks: u64,
    layout: VolumeLayout,
) -> Result<(), EngineError> {
    let fmt = core.l2p.format();
    let held: u64 = core
        .volumes
        .table
        .entries
        .iter()
        .filter(|e| Some(e.id) != id)
        .map(|e| {
            let l = VolumeLayout {
                map_unit_shift: e.map_unit_shift,
                dual: e.dual_map,
            };
            pages_at_most(fmt, e.size_blocks, l)
        })
        .sum();
    let pool = u64::from(core.sb.layout.l2p_pool_pages);
    let needed = pages_at_most(fmt, blocks, layout);
    if held + needed > pool {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "no L2P room for a {}volume of {} bytes: its maps may take {needed} pages, and the pool has {} of {pool} left with every volume's maps at their largest (a dual-mapped volume's may take a sixteenth more than a 4 KiB volume's); make it smaller, or map dual volumes in units only",
                if layout.dual { "dual-mapped " } else { "" },
                blocks * BS,
                pool.saturating_sub(held)
            ),
        });
    }
    Ok(())
}

/// Makes a volume in memory; the caller persists the change.
/// User capacity not yet given to a volume, in blocks: the zones this engine owns
/// bound it (`space/lend.rs`).
fn available_blocks(core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>) -> u64 {
    crate::space::lend::capacity_blocks(core).saturating_sub(core.volumes.allocated_blocks())
}

pub(crate) fn create(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    name: &str,
    size_bytes: u64,
    slice: Option<Slice>,
    layout: VolumeLayout,
) -> Result<(VolumeInfo, VolumeChange), EngineError> {
    let blocks = size_blocks(size_bytes)?;
    if layout.map_unit_shift > MAP_UNIT_SHIFT_MAX {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "a mapping unit of {} bytes is past the largest, {}",
                layout.map_unit_bytes(),
                BS << MAP_UNIT_SHIFT_MAX
            ),
        });
    }
    if layout.map_unit_shift > 0 && core.sb.layout.volume_table_blocks < 2 {
        return Err(EngineError::InvalidVolume {
            reason: "this pool was formatted before mapping units existed (its volume table has no room for them); a pool formatted by this version stores them".into(),
        });
    }
    whole_units(blocks, layout)?;
    dual_needs_unit(layout)?;
    // A zone may end in pads before a unit that does not fit (fewer than a unit):
    // where zones are small that costs too much of the capacity (and of GC's room),
    // so a unit is at most a 32nd of a zone's data slots, plus one block.
    let zone_slots = u64::from(
        crate::layout::Groups {
            blocks: core.geo.zone_cap_blocks,
        }
        .data_capacity(),
    );
    let unit_blocks = 1u64 << layout.map_unit_shift;
    if (unit_blocks - 1) * UNIT_PAD_SHARE_MAX > zone_slots {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "a mapping unit of {} bytes on zones of {} data blocks: zones end in up to a unit of pads, so units are limited to {} bytes here",
                layout.map_unit_bytes(),
                zone_slots,
                BS << max_unit_shift(zone_slots)
            ),
        });
    }
    let whole_size_blocks = whole_blocks(blocks, slice.map(|s| s.whole_size_bytes))?;
    if name.is_empty() || name.len() > VOLUME_NAME_MAX {
        return Err(EngineError::InvalidVolume {
            reason: format!("name {name:?} must be 1..={VOLUME_NAME_MAX} bytes"),
        });
    }
    if core.volumes.table.entries.iter().any(|e| e.name == name) {
        return Err(EngineError::InvalidVolume {
            reason: format!("a volume named {name:?} exists"),
        });
    }
    let available = available_blocks(core);
    if blocks > available {
        return Err(EngineError::NoSpace {
            what: "volume create",
            needed: blocks,
            available,
        });
    }
    map_room(core, None, blocks, layout)?;
    let Some(id) = (0..core.volumes.volumes_max)
        .map(VolumeId)
        .find(|&id| core.volumes.get(id).is_none())
    else {
        return Err(EngineError::InvalidVolume {
            reason: format!("all {} volume slots in use", core.volumes.volumes_max),
        });
    };
    let uid = match slice.and_then(|s| s.uid) {
        None => core.volumes.table.issue_uid(),
        Some(uid) => core.volumes.table.issue_uid_from(uid),
    };
    let Some(uid) = uid else {
        return Err(EngineError::InvalidVolume {
            reason: "every volume uid has been issued".into(),
        });
    };
    let (created_sid, created_pos) = writer.write_position(core);
    let e = VolumeEntry {
        id,
        uid,
        name: name.to_string(),
        size_blocks: blocks,
        created_sid,
        created_pos,
        limits: VolumeLimits::NONE,
        whole_size_blocks,
        map_unit_shift: layout.map_unit_shift,
        dual_map: layout.dual,
    };
    let info = Volumes::info(&e);
    core.volumes.table.entries.push(e);
    core.volumes.shifts[id.0 as usize] = layout.map_unit_shift;
    core.volumes.duals[id.0 as usize] = layout.dual;
    core.l2p.add_volume(id, blocks >> layout.map_unit_shift);
    if layout.dual {
        core.l2p.add_volume(core.volumes.fine_map(id), blocks);
    }
    Ok((
        info,
        VolumeChange {
            volume: id,
            size_blocks: blocks,
            live: true,
        },
    ))
}

/// Resizes a volume in memory (a shrink unmaps what it cuts off); the caller
/// persists the change.
pub(crate) fn resize(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &mut ChunkWriter,
    uid: VolumeUid,
    size_bytes: u64,
    whole_size_bytes: Option<u64>,
) -> Result<(VolumeInfo, VolumeChange), EngineError> {
    let blocks = size_blocks(size_bytes)?;
    let whole_size_blocks = whole_blocks(blocks, whole_size_bytes)?;
    let Some(id) = core.volumes.resolve(uid) else {
        return Err(EngineError::NoSuchVolume { volume: uid });
    };
    let Some(old) = core.volumes.get(id).map(|e| e.size_blocks) else {
        unreachable!("resolved above");
    };
    let shift = core.volumes.shift(id);
    let layout = VolumeLayout {
        map_unit_shift: shift as u8,
        dual: core.volumes.is_dual(id),
    };
    whole_units(blocks, layout)?;
    if blocks > old {
        let available = available_blocks(core);
        if blocks - old > available {
            return Err(EngineError::NoSpace {
                what: "volume grow",
                needed: blocks - old,
                available,
            });
        }
        map_room(core, Some(id), blocks, layout)?;
    } else if blocks < old {
        writer.unmap_range(core, id, blocks, old - blocks)?;
    }
    core.l2p.resize_volume(id, blocks >> shift);
    if layout.dual {
        core.l2p.resize_volume(core.volumes.fine_map(id), blocks);
    }
    let Some(e) = core.volumes.table.entries.iter_mut().find(|e| e.id == id) else {
        unreachable!("volume checked above");
    };
    e.size_blocks = blocks;
    e.whole_size_blocks = whole_size_blocks;
    let info = Volumes::info(e);
    Ok((
        info,
        VolumeChange {
            volume: id,
            size_blocks: blocks,
            live: true,
        },
    ))
}

/// Sets a volume's rate limits in memory; the caller persists the change. A pool
/// whose volume table copies are one block (formatted before limits existed) has
/// nowhere to keep them.
pub(crate) fn set_limits(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    uid: VolumeUid,
    limits: VolumeLimits,
) -> Result<(VolumeInfo, VolumeChange), EngineError> {
    let Some(id) = core.volumes.resolve(uid) else {
        return Err(EngineError::NoSuchVolume { volume: uid });
    };
    if !limits.is_none() && core.sb.layout.volume_table_blocks < 2 {
        return Err(EngineError::InvalidVolume {
            reason: "this pool was formatted before volume limits existed (its volume table has no room for them); a pool formatted by this version stores them".into(),
        });
    }
    if limits.cache_share_pct > 100 {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "a cache share of {}% is past the whole cache",
                limits.cache_share_pct
            ),
        });
    }
    if limits.bytes_per_sec_max > 0 && limits.bytes_per_sec_max < BS {
        return Err(EngineError::InvalidVolume {
            reason: format!(
                "a byte rate of {} per second is below one block ({BS})",
                limits.bytes_per_sec_max
            ),
        });
    }
    let Some(e) = core.volumes.table.entries.iter_mut().find(|e| e.id == id) else {
        unreachable!("resolved above");
    };
    e.limits = limits;
    let info = Volumes::info(e);
    let change = VolumeChange {
        volume: id,
        size_blocks: e.size_blocks,
        live: true,
    };
    Ok((info, change))
}

/// Deletes a volume in memory (unmapping all of it); the caller persists the
/// change.
pub(crate) fn delete(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &mut ChunkWriter,
    uid: VolumeUid,
) -> Result<VolumeChange, EngineError> {
    let Some(id) = core.volumes.resolve(uid) else {
        return Err(EngineError::NoSuchVolume { volume: uid });
    };
    let Some(size) = core.volumes.get(id).map(|e| e.size_blocks) else {
        unreachable!("resolved above");
    };
    writer.unmap_range(core, id, 0, size)?;
    core.directs.sequential.forget(id);
    core.l2p.remove_volume(id);
    if core.volumes.is_dual(id) {
        core.l2p.remove_volume(core.volumes.fine_map(id));
    }
    core.volumes.table.entries.retain(|e| e.id != id);
    core.volumes.shifts[id.0 as usize] = 0;
    core.volumes.duals[id.0 as usize] = false;
    Ok(VolumeChange {
        volume: id,
        size_blocks: 0,
        live: false,
    })
}

/// Writes the volume table (the copy its generation selects) and journals the
/// change; a checkpoint must follow (the caller takes it).
pub(crate) fn record_change(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    change: &VolumeChange,
) -> Result<(), EngineError> {
    core.volumes.table.generation += 1;
    core.volumes.table.entries.sort_by_key(|e| e.id);
    let copy = core.volumes.table.generation % 2;
    let off = core.sb.layout.volume_table_copy(copy) * BS;
    let bytes = core
        .volumes
        .table
        .encode_in(core.sb.layout.volume_table_blocks);
    core.cache
        .write_at(off, &bytes)
        .map_err(EngineError::cache("volume table write", off))?;
    core.stats.cache_md_write_bytes += bytes.len() as u64;
    core.journal.append(JournalRecord::VolumeChanged {
        volume: change.volume,
        size_blocks: change.size_blocks,
        live: change.live,
    });
    Ok(())
}

pub(crate) fn list(volumes: &Volumes) -> Vec<VolumeInfo> {
    volumes.table.entries.iter().map(Volumes::info).collect()
}
