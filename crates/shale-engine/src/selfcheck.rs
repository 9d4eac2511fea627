//! The self-check: L2P vs validity bitmaps vs valid counts, region states, free lists.
//! O(mapped blocks + regions); reads uncached L2P pages without disturbing the cache.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Pba, RegionId, RegionRole, RegionState};

use crate::core::Core;
use crate::layout::Groups;
use crate::recovery::Meter;
use crate::space::Validity;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, EngineError, SelfCheckError};

/// Checks every space invariant, counting the L2P pages walked on `meter` (the
/// open's last step); the first violation is returned.
pub(crate) fn self_check(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    meter: &mut Meter<'_>,
) -> Result<(), SelfCheckError> {
    match self_check_inner(core, writer, meter) {
        Ok(r) => r,
        Err(e) => Err(SelfCheckError::RegionState {
            region: RegionId(u32::MAX),
            reason: format!("L2P unreadable: {e}"),
        }),
    }
}

/// The self-check of an open, after the census: the census has just walked every L2P
/// entry, built the validity bits from them (refusing a PBA outside a data slot, past
/// a write pointer or mapped twice) and counted each region, so walking the L2P again
/// would check the census against itself. This checks the rest, whose cost follows
/// the region count and not the data mapped: every region's count against its bits,
/// md and unused slots clear, region states against the free and pending lists, the
/// open streams. The full check (the L2P walked again) is `Engine::self_check` and
/// `shale check`.
pub(crate) fn open_check(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    meter: &mut Meter<'_>,
) -> Result<(), SelfCheckError> {
    meter.start(u64::from(core.geo.region_count()));
    let counted: Vec<u32> = core.regions.regions.iter().map(|r| r.valid).collect();
    check_regions(core, writer, &counted, &core.regions.validity, false)?;
    // The bits of regions holding data (bits rebuilt in the background are checked
    // against the counts when that ends). An empty region's bits are not walked: a
    // census in the open counts each region from the bits it sets, so they agree by
    // construction, and the walk would cost a pass over the whole bitmap (2 GiB at
    // 64 TiB). The full check walks them.
    if !core.regions.census_pending {
        for (i, &n) in counted.iter().enumerate() {
            if n > 0 {
                check_region_blocks(core, RegionId(i as u32), n, &core.regions.validity)?;
            }
        }
    }
    meter.add(u64::from(core.geo.region_count()));
    meter.finish();
    Ok(())
}

#[cfg(feature = "paranoid")]
static PARANOID_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns the `paranoid` feature's checks off for this process. The feature comes with
/// the crate's dev-dependencies, so the benchmarks and examples are built with it too;
/// they call this, or they would time a full self-check after every checkpoint.
#[cfg(feature = "paranoid")]
pub fn disable_paranoid_checks() {
    PARANOID_OFF.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// With the `paranoid` feature (tests): the self-check, a violation being a bug. An
/// I/O error reading L2P pages is left for the engine's next device call (a crash test
/// may have cut the power).
#[cfg(feature = "paranoid")]
pub(crate) fn paranoid_check(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    when: &str,
) {
    // Until the census ends, a mapped block's bit may still be clear.
    if PARANOID_OFF.load(std::sync::atomic::Ordering::Relaxed) || core.regions.census_pending {
        return;
    }
    if let Ok(Err(v)) = self_check_inner(core, writer, &mut Meter::off()) {
        panic!("self-check {when}: {v}");
    }
}

fn self_check_inner(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    meter: &mut Meter<'_>,
) -> Result<Result<(), SelfCheckError>, EngineError> {
    let mut seen = Validity::new(core.geo.pba_count());
    let mut mapped = vec![0u32; core.geo.region_count() as usize];
    let mut first_err = None;
    let geo = core.geo;
    let validity = &core.regions.validity;
    let kinds = core.volumes.kinds();
    crate::volume::walk_all_blocks(
        &mut core.l2p,
        &mut core.cache,
        kinds,
        &geo,
        meter,
        |volume, lba, pba, base| {
            if first_err.is_some() {
                return;
            }
            let Some((pba, (r, _))) = pba.and_then(|p| Some((p, geo.region_slot(p)?))) else {
                first_err = Some(SelfCheckError::BadPba {
                    volume,
                    lba,
                    pba: base,
                });
                return;
            };
            if !validity.get(pba) {
                first_err = Some(SelfCheckError::MappedButInvalid { volume, lba, pba });
                return;
            }
            if seen.set(pba) {
                first_err = Some(SelfCheckError::DoubleMapped { volume, lba, pba });
                return;
            }
            mapped[r.0 as usize] += 1;
        },
    )?;
    if let Some(e) = first_err {
        return Ok(Err(e));
    }
    Ok(check_regions(core, writer, &mapped, &seen, true))
}

fn check_regions(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
    mapped: &[u32],
    seen: &Validity,
    bits: bool,
) -> Result<(), SelfCheckError> {
    let rs = &core.regions;
    // How often each region is on the free and pending lists (counted once: a
    // search per region would be quadratic in the zone count).
    let n = core.geo.region_count() as usize;
    let mut listed_free = vec![0u32; n];
    let mut listed_pending = vec![0u32; n];
    for &r in (rs.free_chunks.iter())
        .chain(&rs.free_zones)
        .chain(&rs.free_cold_zones)
    {
        if let Some(c) = listed_free.get_mut(r.0 as usize) {
            *c += 1;
        }
    }
    for &r in &rs.pending_free {
        if let Some(c) = listed_pending.get_mut(r.0 as usize) {
            *c += 1;
        }
    }
    for i in 0..core.geo.region_count() {
        let r = RegionId(i);
        if bits {
            check_region_blocks(core, r, mapped[i as usize], seen)?;
        }
        check_region_state(
            core,
            r,
            listed_free[i as usize] as usize,
            listed_pending[i as usize] as usize,
        )?;
    }
    check_lists(core, writer)
}

fn bad_region(region: RegionId, reason: String) -> Result<(), SelfCheckError> {
    Err(SelfCheckError::RegionState { region, reason })
}

/// A region's valid count against its validity bits and the L2P entries mapping into
/// it, and only data slots valid.
fn check_region_blocks(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    mapped: u32,
    seen: &Validity,
) -> Result<(), SelfCheckError> {
    let rs = &core.regions;
    let reg = rs.get(r);
    let base = core.geo.region_base(r);
    let span = if core.geo.is_chunk(r) {
        core.geo.chunk_blocks
    } else {
        core.geo.zone_size_blocks
    };
    let bits = rs.validity.count_range(base, span);
    if bits != reg.valid || reg.valid != mapped {
        return Err(SelfCheckError::CountMismatch {
            region: r,
            recorded: reg.valid,
            bits,
            mapped,
        });
    }
    if bits != seen.count_range(base, span) {
        for p in base.0..base.0 + u64::from(span) {
            if rs.validity.get(Pba(p)) && !seen.get(Pba(p)) {
                return Err(SelfCheckError::ValidButUnmapped { pba: Pba(p) });
            }
        }
    }
    let groups = Groups {
        blocks: core.geo.region_blocks(r),
    };
    if reg.wp > groups.end() {
        return bad_region(
            r,
            format!("write pointer {} past the end {}", reg.wp, groups.end()),
        );
    }
    if bits > 0 {
        // Only data slots may be valid: the two md slots of each group and the
        // slots past the last group must be clear.
        let md = (0..groups.count())
            .flat_map(|g| [groups.md_slot(g), groups.md_slot(g) + 1])
            .find(|&s| rs.validity.get(Pba(base.0 + u64::from(s))));
        let tail = rs
            .validity
            .first_set(
                Pba(base.0 + u64::from(groups.end())),
                span.saturating_sub(groups.end()),
            )
            .map(|p| (p.0 - base.0) as u32);
        if let Some(s) = md.or(tail) {
            return bad_region(r, format!("md or unused slot {s} marked valid"));
        }
    }
    Ok(())
}

/// A region's state against the lists it is on, its counts and its role.
fn check_region_state(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    in_free: usize,
    in_pending: usize,
) -> Result<(), SelfCheckError> {
    let reg = core.regions.get(r);
    match reg.state {
        RegionState::Free => {
            if in_free != 1 || reg.valid != 0 || reg.relocations != 0 || reg.inflight_writes != 0 {
                return bad_region(
                    r,
                    format!(
                        "Free but on free list {in_free}x, valid {}, relocations {}",
                        reg.valid, reg.relocations
                    ),
                );
            }
        }
        RegionState::PendingFree => {
            if in_pending != 1 || in_free != 0 || reg.valid != 0 || reg.relocations != 0 {
                return bad_region(
                    r,
                    format!(
                        "PendingFree but pending {in_pending}x, free {in_free}x, valid {}",
                        reg.valid
                    ),
                );
            }
        }
        RegionState::Reserved => {
            if r.0 != core.geo.chunk_count || reg.valid != 0 {
                return bad_region(r, "Reserved region is not zone 0".into());
            }
        }
        RegionState::Foreign => {
            let idle = reg.relocations == 0 && reg.inflight_writes == 0 && !reg.draining;
            if in_free + in_pending != 0 || reg.valid != 0 || !idle {
                return bad_region(
                    r,
                    format!(
                        "Foreign but free {in_free}x, pending {in_pending}x, valid {}, \
                         relocations {}",
                        reg.valid, reg.relocations
                    ),
                );
            }
        }
        RegionState::Open | RegionState::Closed => {
            if in_free != 0 || in_pending != 0 {
                return bad_region(r, format!("{:?} but on a free/pending list", reg.state));
            }
            let chunk = core.geo.is_chunk(r);
            let role_ok = if chunk {
                reg.role == RegionRole::User
            } else {
                matches!(reg.role, RegionRole::Compaction | RegionRole::Gc)
            };
            if !role_ok {
                return bad_region(
                    r,
                    format!(
                        "role {:?} in a {}",
                        reg.role,
                        if chunk { "chunk" } else { "zone" }
                    ),
                );
            }
        }
    }
    Ok(())
}

/// The free and pending lists hold only regions in those states, and no more chunks
/// are open than the writer can account for.
fn check_lists(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    writer: &ChunkWriter,
) -> Result<(), SelfCheckError> {
    let rs = &core.regions;
    for (list, chunk, cold) in [
        (&rs.free_chunks, true, false),
        (&rs.free_zones, false, false),
        (&rs.free_cold_zones, false, true),
    ] {
        for &r in list.iter() {
            if r.0 >= core.geo.region_count()
                || core.geo.is_chunk(r) != chunk
                || core.geo.is_cold(r) != cold
                || rs.get(r).state != RegionState::Free
            {
                return Err(SelfCheckError::FreeList {
                    reason: format!(
                        "{r} on a free list but not a Free {}",
                        if chunk {
                            "chunk"
                        } else if cold {
                            "cold zone"
                        } else {
                            "fast zone"
                        }
                    ),
                });
            }
        }
    }
    for &r in &rs.pending_free {
        if rs.get(r).state != RegionState::PendingFree {
            return Err(SelfCheckError::FreeList {
                reason: format!("{r} on the pending list but {:?}", rs.get(r).state),
            });
        }
    }
    let open_user = (0..core.geo.chunk_count)
        .filter(|&c| rs.get(RegionId(c)).state == RegionState::Open)
        .count();
    let unsettled_chunks = {
        let mut v: Vec<_> = writer.groups.iter().map(|g| g.region).collect();
        v.dedup();
        v.len()
    };
    if open_user > unsettled_chunks.max(usize::from(writer.open.is_some())) + 1 {
        return Err(SelfCheckError::FreeList {
            reason: format!("{open_user} chunks open"),
        });
    }
    let foreign = (0..core.geo.chunk_count)
        .filter(|&c| rs.get(RegionId(c)).state == RegionState::Foreign)
        .count();
    if foreign != rs.foreign_chunks as usize {
        return Err(SelfCheckError::FreeList {
            reason: format!("{foreign} chunks Foreign, {} counted", rs.foreign_chunks),
        });
    }
    Ok(())
}
