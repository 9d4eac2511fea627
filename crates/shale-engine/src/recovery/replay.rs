//! Replay after a crash: what happened since the checkpoint, rebuilt from the journal
//! and the md (P2L) of the regions written since.
//!
//! Every block version is ranked by its *key*:
//! - a user write at slot `p` of the chunk whose SID is `s`: `(s, p)` (one user chunk
//!   is open at a time and SIDs grow as regions open, so keys follow write order);
//! - a relocated copy (compaction, GC) carrying SID `s`: `(s, MAX)`. Relocation keeps
//!   the SID, and only moves a block still valid after its chunk closed, so a copy
//!   with SID `s` holds the *last* write of its LBA in chunk `s`: it ranks above every
//!   write of chunk `s` and below every later one. Two copies with the same SID hold
//!   the same data;
//! - a trim: the user write position when it ran, `(open chunk SID, write pointer)`;
//!   writes at or after that position win over it;
//! - a direct write's block in a zone (or a GC copy of it): `(s, p)`, the slot `p` its
//!   write took in user chunk `s` (write/direct.rs), as if written there.
//!
//! Rules: for each LBA the replayed version with the highest key wins (a trim wins
//! by unmapping); the checkpoint's L2P entry is kept only when nothing was replayed
//! for the LBA, since every replayed event happened after the checkpoint began.
//!
//! What is read, per region: a region open at the checkpoint is scanned from the
//! checkpoint's write pointer; a region the journal says was opened since, from slot 0
//! with the SID of its latest `RegionOpened`. The scan ends at the write pointer the
//! last FlushPoint (or `RegionClosed`) claims, for zones also at the device's write
//! pointer. The journal is written only after a flush made the data and md it claims
//! durable (`flush.rs`), so every claimed entry must be in the md: one the md no longer
//! holds is an error (`MdLost`), never a silent rollback. Writes past the last claim
//! were never flushed and are ignored. A region whose md shows a *newer* SID was freed
//! and reused after its logged life (the reuse was never flushed): its logged life is
//! skipped, since freeing it required every live block in it to be relocated or
//! overwritten durably first.

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasherDefault;

use shale_device::{BlockDevice, ZoneState, ZonedDevice};
use shale_format::{
    decode_md_entry, decode_md_header, EntryKind, JournalBlock, JournalRecord, Lba, MdHeader,
    MdRegionKind, Pba, RegionId, RegionRole, RegionState, Sid, VolumeId, BLOCK_SIZE,
};

use super::{Meter, ReplayCounts};
use crate::core::Core;
use crate::hash::{pack, unpack};
use crate::layout::{Groups, BS};
use crate::{Clock, EngineError, OpenError, RecoveryError};

/// Position in the order of user writes (see the module docs).
pub(crate) type Key = (u64, u32);

/// The key of relocated copies of SID `s`.
const RELOCATED_POS: u32 = u32::MAX;
/// Replayed entries on one L2P page at most that wait as deferred switches; a page
/// with more is read and updated. A switch costs 16 bytes in the checkpoint that ends
/// the recovery where a page costs a 4 KiB read and write; the replay may hold twice
/// the L2P's usual bound on waiting switches, and what the checkpoint has no room for
/// is applied, longest chains first (so never more pages than loading them here).
const REPLAY_DEFER_MAX: usize = 64;

/// How far to scan one region, and what it is.
#[derive(Debug, Clone)]
pub(crate) struct RegionPlan {
    pub sid: Sid,
    /// First slot written since the checkpoint began.
    pub start: u32,
    /// Slots below this are durable: a flush point or close in the journal says so.
    pub claimed: u32,
    /// Open at the checkpoint with this SID (its role and stream come from there).
    pub from_checkpoint: bool,
    /// Its md showed a newer SID: the logged life was reused.
    pub reused: bool,
}

/// A trim replayed from the journal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trim {
    pub volume: VolumeId,
    pub lba: u64,
    pub count: u64,
    pub key: Key,
}

/// The winning replayed version of each LBA touched since the checkpoint.
pub(crate) type Overlay = HashMap<u64, (Key, Pba), BuildHasherDefault<crate::hash::U64Hasher>>;

/// Everything replay collects before it touches the L2P.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    pub plans: BTreeMap<u32, RegionPlan>,
    pub trims: Vec<Trim>,
    pub overlay: Overlay,
    pub max_sid: u64,
    pub counts: ReplayCounts,
}

/// Builds the per-region scan plan and the trim list from the checkpoint's region
/// table and the journal.
pub(crate) fn plan(
    geo: &crate::layout::Geometry,
    regions: &crate::space::Regions,
    blocks: &[JournalBlock],
    warnings: &mut Vec<String>,
) -> Replay {
    let mut r = Replay::default();
    for (i, reg) in regions.regions.iter().enumerate() {
        if reg.state == RegionState::Open {
            r.plans.insert(
                i as u32,
                RegionPlan {
                    sid: reg.sid,
                    start: reg.wp,
                    claimed: reg.wp,
                    from_checkpoint: true,
                    reused: false,
                },
            );
        }
        r.max_sid = r.max_sid.max(reg.sid.0);
    }
    for blk in blocks {
        for rec in &blk.records {
            match rec {
                JournalRecord::RegionOpened { region, sid } => {
                    if region.0 >= geo.region_count() || region.0 == geo.chunk_count {
                        warnings.push(format!(
                            "journal: RegionOpened names {region}, not a data region; ignored"
                        ));
                        continue;
                    }
                    r.max_sid = r.max_sid.max(sid.0);
                    r.plans.insert(
                        region.0,
                        RegionPlan {
                            sid: *sid,
                            start: 0,
                            claimed: 0,
                            from_checkpoint: false,
                            reused: false,
                        },
                    );
                }
                JournalRecord::RegionClosed { region } => {
                    let Some(p) = r.plans.get_mut(&region.0) else {
                        continue;
                    };
                    let end = Groups {
                        blocks: geo.region_blocks(*region),
                    }
                    .end();
                    p.claimed = end;
                }
                JournalRecord::FlushPoint { regions: wps } => {
                    for &(region, wp) in wps {
                        let Some(p) = r.plans.get_mut(&region.0) else {
                            continue;
                        };
                        let end = Groups {
                            blocks: geo.region_blocks(region),
                        }
                        .end();
                        let wp = if wp > end {
                            warnings.push(format!(
                                "journal: FlushPoint puts {region} at {wp}, past its end {end}; clamped"
                            ));
                            end
                        } else {
                            wp
                        };
                        p.claimed = p.claimed.max(wp);
                    }
                }
                JournalRecord::Trim {
                    volume,
                    lba,
                    count,
                    key_sid,
                    key_pos,
                } => r.trims.push(Trim {
                    volume: *volume,
                    lba: lba.0,
                    count: *count,
                    key: (key_sid.0, *key_pos),
                }),
                // Volume changes take a checkpoint; their records never reach the
                // journal of a later one.
                JournalRecord::VolumeChanged { .. } => {}
            }
        }
    }
    r.counts.journal_entries = blocks.len() as u64;
    r.counts.trims = r.trims.len() as u64;
    r
}

/// One md copy as found: its header if it decodes and names this group.
fn md_copy(
    buf: &[u8],
    at: u64,
    region: RegionId,
    group: u32,
    kind: MdRegionKind,
) -> Result<MdHeader, String> {
    let h = decode_md_header(buf, at).map_err(|e| e.to_string())?;
    if h.region != region || h.group != group || h.region_kind != kind {
        return Err(format!(
            "md block at byte {at} names {} group {} ({:?}), expected {region} group {group}",
            h.region, h.group, h.region_kind
        ));
    }
    Ok(h)
}

/// Scans the md of every planned region; collects the winning version per LBA.
/// Returns bytes read.
pub(crate) fn scan_md(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    rp: &mut Replay,
    warnings: &mut Vec<String>,
    meter: &mut Meter<'_>,
) -> Result<u64, OpenError> {
    let mut bytes = 0;
    // Each region's scan end and md groups first, so progress has its total.
    let mut scans = Vec::with_capacity(rp.plans.len());
    for (&id, p) in &rp.plans {
        let r = RegionId(id);
        let end = scan_end(core, r, p)?;
        let groups = Groups {
            blocks: core.geo.region_blocks(r),
        };
        let n = if end <= p.start {
            0
        } else {
            let (g0, _) = groups.locate(p.start);
            (g0..groups.count())
                .take_while(|&g| groups.start(g) < end)
                .count() as u64
        };
        scans.push((id, end, n));
    }
    meter.start(scans.iter().map(|s| s.2).sum());
    let mut scanned = Scanned::default();
    for (id, end, groups) in scans {
        let r = RegionId(id);
        let Some(mut p) = rp.plans.get(&id).cloned() else {
            continue;
        };
        scanned.found.clear();
        scanned.context.clear();
        scanned.context_groups = 0;
        let read0 = rp.counts.md_groups_read;
        bytes += scan_region(
            core,
            r,
            &mut p,
            end,
            &mut scanned,
            &mut rp.counts,
            warnings,
            meter,
        )?;
        let Scanned {
            found,
            context,
            context_groups,
        } = &mut scanned;
        // A reused region's scan stops early: the groups it skipped are done too (the
        // scan's reads before its start, for units, are not in its count).
        meter.add(groups.saturating_sub(rp.counts.md_groups_read - read0 - *context_groups));
        // Every SID seen counts, whole unit or not.
        rp.max_sid = found
            .iter()
            .fold(rp.max_sid, |m, &(_, key, _)| m.max(key.0));
        let seen = found.len();
        whole_units(core, found, context, &rp.trims);
        // The other blocks of each unit found count as ignored.
        rp.counts.entries_ignored += (seen - found.len()) as u64;
        if p.reused {
            rp.counts.entries_ignored += found.len() as u64;
        } else {
            for &(k, key, pba) in found.iter() {
                rp.max_sid = rp.max_sid.max(key.0);
                match rp.overlay.get(&k) {
                    Some(&(old, _)) if old >= key => {}
                    _ => {
                        rp.overlay.insert(k, (key, pba));
                    }
                }
            }
        }
        rp.plans.insert(id, p);
    }
    supersede_fine(core, &mut rp.overlay);
    Ok(bytes)
}

/// Folds the blocks of mapping units found in one region into their units: a unit's
/// version is its first block's entry, keyed by (volume, unit) and ranked by the
/// first block's key, and counts only whole: each of its other blocks in the data
/// slots that follow, of the same SID (one write or one move; a unit never spans
/// regions). A unit cut short by the crash is a write never acknowledged, or a move
/// whose source still holds it. Blocks of volumes mapped in blocks are kept as
/// they are.
///
/// `context` holds the entries of the data slots just before the scan's start: a
/// unit whose first blocks are there and whose others were found is a version too.
///
/// A dual volume's single blocks, written apart, may sit side by side like a unit's
/// (two 4 KiB writes in slots that follow): a unit is not whole when a replayed trim of
/// it ranks after its first block and not after its last, since then they were
/// written apart, on either side of the trim, and each is a sparse-map version with
/// its own key.
fn whole_units(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    found: &mut Vec<(u64, Key, Pba)>,
    context: &[(u64, Key, Pba)],
    trims: &[Trim],
) {
    let shift_of = |k: u64| core.volumes.shift(unpack(k).0);
    if found.iter().all(|&(k, ..)| shift_of(k) == 0) {
        return;
    }
    let at: HashMap<Pba, (u64, Key), BuildHasherDefault<crate::hash::U64Hasher>> = context
        .iter()
        .chain(found.iter())
        .filter(|&&(k, ..)| shift_of(k) > 0)
        .map(|&(k, key, pba)| (pba, (k, key)))
        .collect();
    // Units begun in the context are versions here only with a block past it: one
    // wholly before the scan's start is older than the checkpoint, whose map may
    // hold a newer version from another region.
    let past: std::collections::HashSet<Pba, BuildHasherDefault<crate::hash::U64Hasher>> = found
        .iter()
        .filter(|&&(k, ..)| shift_of(k) > 0)
        .map(|&(.., pba)| pba)
        .collect();
    let heads: Vec<(u64, Key, Pba)> = context
        .iter()
        .filter(|&&(k, _, pba)| {
            let shift = shift_of(k);
            shift > 0
                && unpack(k).1.is_multiple_of(1 << shift)
                && (1..1u64 << shift).any(|j| {
                    core.geo
                        .data_advance(pba, j)
                        .is_some_and(|p| past.contains(&p))
                })
        })
        .copied()
        .collect();
    found.extend(heads);
    let whole = |k: u64, key: Key, pba: Pba| {
        let (v, lba) = unpack(k);
        let units = 1u64 << shift_of(k);
        let mut last = key;
        lba % units == 0
            && (1..units).all(|j| {
                core.geo
                    .data_advance(pba, j)
                    .and_then(|p| at.get(&p))
                    .is_some_and(|&(kj, keyj)| {
                        last = last.max(keyj);
                        kj == pack(v, lba + j) && keyj.0 == key.0
                    })
            })
            && !trims.iter().any(|t| {
                t.volume == v
                    && t.lba < lba + units
                    && lba < t.lba.saturating_add(t.count)
                    && t.key > key
                    && t.key <= last
            })
    };
    // A dual volume's blocks that are not of a whole unit found here are versions of
    // single blocks, for its sparse map.
    let in_whole: std::collections::HashSet<Pba, BuildHasherDefault<crate::hash::U64Hasher>> =
        found
            .iter()
            .filter(|&&(k, key, pba)| {
                shift_of(k) > 0 && core.volumes.is_dual(unpack(k).0) && whole(k, key, pba)
            })
            .flat_map(|&(k, _, pba)| {
                (0..1u64 << shift_of(k)).filter_map(move |j| core.geo.data_advance(pba, j))
            })
            .collect();
    let context_at: std::collections::HashSet<Pba, BuildHasherDefault<crate::hash::U64Hasher>> =
        context.iter().map(|&(.., pba)| pba).collect();
    found.retain_mut(|(k, key, pba)| {
        let shift = shift_of(*k);
        if shift == 0 {
            return true;
        }
        let (v, lba) = unpack(*k);
        let dual = core.volumes.is_dual(v);
        if dual && !in_whole.contains(pba) {
            // A head taken from the context is a version only as a whole unit.
            *k = pack(v, lba | FINE_KEY);
            return !context_at.contains(pba);
        }
        if lba % (1u64 << shift) != 0 {
            return false;
        }
        let w = whole(*k, *key, *pba);
        *k = pack(v, lba >> shift);
        w
    });
}

/// Marks a replayed version's LBA as a dual volume's sparse-map block (LBAs are
/// below 2^57 there: volumes are far smaller).
pub(crate) const FINE_KEY: u64 = 1 << 57;

/// After every region is scanned: a dual volume's whole unit replayed supersedes
/// the sparse-map entries of its blocks older than it (replayed or from the
/// checkpoint), which become unmaps (`Pba::NONE`). A sparse-map version as new as
/// the unit is kept: a block moved alone after its unit moved whole carries the
/// same key, and is the later copy.
fn supersede_fine(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    overlay: &mut Overlay,
) {
    let units: Vec<(u64, Key)> = overlay
        .iter()
        .filter(|(&k, _)| {
            let (v, e) = unpack(k);
            e & FINE_KEY == 0 && core.volumes.is_dual(v)
        })
        .map(|(&k, &(key, _))| (k, key))
        .collect();
    for (k, key) in units {
        let (v, u) = unpack(k);
        let shift = core.volumes.shift(v);
        for j in 0..1u64 << shift {
            let fk = pack(v, ((u << shift) + j) | FINE_KEY);
            match overlay.get(&fk) {
                Some(&(fkey, _)) if fkey >= key => {}
                _ => {
                    overlay.insert(fk, (key, Pba::NONE));
                }
            }
        }
    }
}

/// Where the scan of region `r` ends: its claimed end, for a zone also the
/// device's write pointer.
fn scan_end(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    p: &RegionPlan,
) -> Result<u32, OpenError> {
    let groups = Groups {
        blocks: core.geo.region_blocks(r),
    };
    let mut end = p.claimed.min(groups.end());
    if !core.geo.is_chunk(r) {
        let z = core.geo.zone_of(r).0;
        let info = core
            .capacity
            .zone_info(z)
            .map_err(|e| OpenError::Engine(EngineError::capacity("zone report", 0)(e)))?;
        let wp = ((info.write_pointer - info.start) / BS) as u32;
        let wp = if info.state == ZoneState::Full {
            groups.end()
        } else {
            wp
        };
        end = end.min(wp);
    }
    Ok(end)
}

/// What one region's scan found: the versions since the checkpoint, and the entries
/// of the data slots just before the scan's start with the md groups read for them.
#[derive(Debug, Default)]
struct Scanned {
    found: Vec<(u64, Key, Pba)>,
    context: Vec<(u64, Key, Pba)>,
    context_groups: u64,
}

/// Where a scan from `start` reads from. A unit moved into a zone may have its first
/// blocks written before the checkpoint and the rest after (it switches once all are
/// written): the data slots just before the scan's start are read too, as context for
/// such units (`whole_units`).
fn context_start(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    groups: Groups,
    start: u32,
) -> u32 {
    let context_slots = core.volumes.max_unit_blocks() as u32 - 1;
    if context_slots == 0 || start == 0 {
        return start;
    }
    // A write pointer rests on a data slot or at the region's end.
    let d = groups
        .data_index(start)
        .unwrap_or_else(|| groups.data_capacity());
    groups.data_slot(d.saturating_sub(context_slots)).min(start)
}

/// Scans one region's md from the plan's start to `end` ([`Self::scan_end`]),
/// counting the md groups read on `meter`.
#[allow(clippy::too_many_arguments)]
fn scan_region(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    p: &mut RegionPlan,
    end: u32,
    scanned: &mut Scanned,
    counts: &mut ReplayCounts,
    warnings: &mut Vec<String>,
    meter: &mut Meter<'_>,
) -> Result<u64, OpenError> {
    let chunk = core.geo.is_chunk(r);
    let groups = Groups {
        blocks: core.geo.region_blocks(r),
    };
    if end <= p.start {
        return Ok(0);
    }
    counts.regions_scanned += 1;
    let kind = [MdRegionKind::Zone, MdRegionKind::Chunk][usize::from(chunk)];
    let mut bytes = 0;
    let mut two = vec![0u8; 2 * BLOCK_SIZE];
    let from = context_start(core, groups, p.start);
    let (g0, _) = groups.locate(from);
    for g in g0..groups.count() {
        let gstart = groups.start(g);
        if gstart >= end {
            break;
        }
        let k = groups.data_slots(g);
        // Data slots of this group the journal says are durable (a group read for
        // context only proves nothing new).
        let context_only = gstart + k <= p.start;
        let proven_n = end.saturating_sub(gstart).min(k) * u32::from(!context_only);
        let md_slot = groups.md_slot(g);
        let at = read_group_md(core, r, g, md_slot, kind, p.sid, proven_n, &mut two)?;
        bytes += 2 * BS;
        counts.md_groups_read += 1;
        if context_only {
            scanned.context_groups += 1;
        } else {
            meter.add(1);
        }
        let copies = [
            md_copy(&two[..BLOCK_SIZE], at, r, g, kind),
            md_copy(&two[BLOCK_SIZE..], at + BS, r, g, kind),
        ];
        let Some(best) = best_copy(&copies, &two, p, r, g, counts, warnings) else {
            // A newer life of the region: the logged one was freed.
            return Ok(bytes);
        };
        let best = best.and_then(|c| copies[c].as_ref().ok().map(|h| (c, h)));
        let have = best.map_or(0, |(_, h)| u32::from(h.entry_count));
        if have < proven_n {
            return Err(RecoveryError::MdLost {
                region: r,
                group: g,
                have,
                need: proven_n,
                reason: match (&copies[0], &copies[1]) {
                    (Err(a), Err(b)) => format!("copy A: {a}; copy B: {b}"),
                    _ => "the newest valid copy holds fewer entries than a completed flush made durable (the newer copy is damaged)".into(),
                },
            }
            .into());
        }
        let Some((c, h)) = best else { continue };
        let md = &two[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE];
        let n = u32::from(h.entry_count).min(k);
        for i in 0..n {
            let slot = gstart + i;
            if slot < from || slot >= end {
                continue;
            }
            let Ok(e) = decode_md_entry(md, i as usize, at + (c as u64) * BS) else {
                continue;
            };
            let key = match entry_key(&e, chunk, p.sid, slot) {
                Ok(Some(key)) => key,
                Ok(None) => continue,
                Err(()) => {
                    counts.entries_ignored += 1;
                    warnings.push(format!(
                        "{r} slot {slot}: md entry of kind {:?} with {} does not belong in this region; ignored",
                        e.kind, e.sid
                    ));
                    continue;
                }
            };
            let version = (pack(e.volume, e.lba.0), key, core.geo.pba(r, slot));
            if slot < p.start {
                if mappable(core, e.volume, e.lba, key) {
                    scanned.context.push(version);
                }
                continue;
            }
            counts.entries_seen += 1;
            if !mappable(core, e.volume, e.lba, key) {
                counts.entries_ignored += 1;
                continue;
            }
            scanned.found.push(version);
        }
    }
    Ok(bytes)
}

/// The key of md entry `e` at `slot` of a region (a chunk when `chunk`) whose logged
/// life has SID `sid`: `None` for an empty or pad slot, an error for an entry that
/// does not belong in such a region.
fn entry_key(
    e: &shale_format::MdEntry,
    chunk: bool,
    sid: Sid,
    slot: u32,
) -> Result<Option<Key>, ()> {
    Ok(Some(match (e.kind, chunk) {
        (EntryKind::Data, true) if e.sid == sid => (e.sid.0, slot),
        (EntryKind::Relocated, false) => (e.sid.0, RELOCATED_POS),
        // A direct write's block (or a GC copy of one) ranks at the chunk slot its
        // write took.
        (EntryKind::Direct, false) if e.pos != RELOCATED_POS => (e.sid.0, e.pos),
        (EntryKind::Empty | EntryKind::Pad, _) => return Ok(None),
        _ => return Err(()),
    }))
}

/// Which md copy of group `g` to replay: the one of the logged life (`p.sid`) with the
/// higher generation, if any (`Some(None)`: neither). `None` when a copy belongs to a
/// newer life of the region: it was reused after its last flush, and `p` is marked so.
fn best_copy(
    copies: &[Result<MdHeader, String>; 2],
    two: &[u8],
    p: &mut RegionPlan,
    r: RegionId,
    g: u32,
    counts: &mut ReplayCounts,
    warnings: &mut Vec<String>,
) -> Option<Option<usize>> {
    let mut best: Option<(usize, &MdHeader)> = None;
    for (c, h) in copies.iter().enumerate() {
        match h {
            Ok(h) if h.region_sid == p.sid => {
                if best.is_none_or(|(_, b)| h.generation > b.generation) {
                    best = Some((c, h));
                }
            }
            Ok(h) if h.region_sid > p.sid => {
                p.reused = true;
                counts.regions_reused += 1;
                warnings.push(format!(
                    "{r}: md of group {g} has {} (newer than the logged {}): reused after its last flush; its logged life is skipped",
                    h.region_sid, p.sid
                ));
                return None;
            }
            Ok(_) => {}
            Err(e) => {
                let never_written = two[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE]
                    .iter()
                    .all(|&b| b == 0);
                if !never_written {
                    warnings.push(format!(
                        "{r} group {g} md copy {}: {e} (torn by the crash, or damaged; not used)",
                        ["A", "B"][c]
                    ));
                }
            }
        }
    }
    Some(best.map(|(c, _)| c))
}

/// Reads group `g`'s two md copies into `two` and returns their byte offset. When
/// neither holds the `proven_n` entries the journal proves durable (damage on this
/// cache mirror or capacity member), the device's other copies are read: another
/// mirror's (mended in place; nothing else writes during recovery), or the array's
/// rebuild.
#[allow(clippy::too_many_arguments)]
fn read_group_md(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    g: u32,
    md_slot: u32,
    kind: MdRegionKind,
    sid: Sid,
    proven_n: u32,
    two: &mut [u8],
) -> Result<u64, OpenError> {
    let at = read_region(core, r, md_slot, two)?;
    let entries = |two: &[u8]| {
        (0..2)
            .filter_map(|c| {
                let at = at + c as u64 * BS;
                md_copy(&two[c * BLOCK_SIZE..(c + 1) * BLOCK_SIZE], at, r, g, kind).ok()
            })
            .filter(|h| h.region_sid == sid)
            .map(|h| u32::from(h.entry_count))
            .max()
            .unwrap_or(0)
    };
    if entries(two) < proven_n {
        let ok = |x: &[u8]| entries(x) >= proven_n;
        if core.geo.is_chunk(r) {
            crate::copies::reread(&mut core.cache, "md", at, two, true, ok);
        } else {
            crate::copies::reread_capacity(&mut core.capacity, "md", at, two, ok);
        }
    }
    Ok(at)
}

/// Reads `buf.len()` bytes of region `r` from `slot`; returns the byte offset.
fn read_region(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    r: RegionId,
    slot: u32,
    buf: &mut [u8],
) -> Result<u64, OpenError> {
    if core.geo.is_chunk(r) {
        let off = core.geo.chunk_offset(r, slot);
        core.cache
            .read_at(off, buf)
            .map_err(|e| OpenError::Engine(EngineError::cache("md scan read", off)(e)))?;
        Ok(off)
    } else {
        let off = core.geo.zone_offset(r, slot);
        core.capacity
            .read_at(off, buf)
            .map_err(|e| OpenError::Engine(EngineError::capacity("md scan read", off)(e)))?;
        Ok(off)
    }
}

/// An md entry can be mapped: its volume is live, the LBA inside it, and the
/// entry not older than the volume (an earlier volume with the same id).
fn mappable(
    core: &Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    v: VolumeId,
    lba: Lba,
    key: Key,
) -> bool {
    let Some(vol) = core.volumes.get(v) else {
        return false;
    };
    if lba.0 >= vol.size_blocks || lba.0 >= 1 << 58 {
        return false;
    }
    let created = (vol.created_sid.0, vol.created_pos);
    if key.1 == RELOCATED_POS {
        key.0 >= created.0
    } else {
        key >= created
    }
}

/// One map's trimmed ranges: start -> (end, key of the last trim covering them).
type Painted = BTreeMap<u64, (u64, Key)>;

/// Applies the replayed trims to the L2P (both maps of a dual volume). Returns, per
/// map, what they painted: later trims paint over earlier ones, disjoint ranges with
/// the key of the last trim covering them.
fn apply_trims(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    rp: &Replay,
    meter: &mut Meter<'_>,
) -> Result<Vec<Painted>, OpenError> {
    let mut painted: Vec<Painted> = vec![BTreeMap::new(); core.volumes.maps_max() as usize];
    for t in &rp.trims {
        meter.add(1);
        let Some(size) = core.l2p.volume_size(t.volume) else {
            continue;
        };
        // In L2P entries: a volume mapped in units trims whole units.
        let shift = core.volumes.shift(t.volume);
        let lo = t.lba.div_ceil(1 << shift).min(size);
        let hi = (t.lba.saturating_add(t.count) >> shift).min(size);
        if lo >= hi {
            continue;
        }
        unmap_replayed(core, t.volume, lo, hi)?;
        if let Some(m) = painted.get_mut(t.volume.0 as usize) {
            paint(m, lo, hi, t.key);
        }
        if core.volumes.is_dual(t.volume) {
            // A dual volume's sparse map too, in blocks.
            let fine = core.volumes.fine_map(t.volume);
            unmap_replayed(core, fine, lo << shift, hi << shift)?;
            if let Some(m) = painted.get_mut(fine.0 as usize) {
                paint(m, lo << shift, hi << shift, t.key);
            }
        }
    }
    Ok(painted)
}

/// Applies trims, then the winning versions, to the L2P. Returns the L2P bytes read.
/// Counts trims and versions on `meter`.
pub(crate) fn apply_replay(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    rp: &mut Replay,
    meter: &mut Meter<'_>,
) -> Result<u64, OpenError> {
    let reads0 = core.l2p.counters.page_reads;
    meter.start((rp.trims.len() + rp.overlay.len()) as u64);
    let painted = apply_trims(core, rp, meter)?;
    let mut entries: Vec<(u64, Key, Pba)> = rp
        .overlay
        .drain()
        .map(|(k, (key, p))| (k, key, p))
        .collect();
    entries.sort_unstable_by_key(|e| e.0);
    // A page with few replayed entries takes them as deferred switches: no page read
    // now, and the checkpoint that ends the recovery records them instead of writing
    // the page (relocations of scattered data touch one page each). A page with more
    // is loaded, a batch of such pages at a time ahead of the loop, and updated.
    let epp = core.l2p.format().entries_per_page();
    // The L2P map and entry a replayed version goes to: a dual volume's sparse-map
    // versions to its sparse map.
    let volumes_max = core.volumes.volumes_max;
    let target = move |k: u64| {
        let (v, lba) = unpack(k);
        if lba & FINE_KEY != 0 {
            (VolumeId(volumes_max + v.0), lba & !FINE_KEY)
        } else {
            (v, lba)
        }
    };
    let page_of = |e: &(u64, Key, Pba)| {
        let (v, lba) = target(e.0);
        (v, (lba / epp) as usize)
    };
    // The end of the run of entries on the page of entry `i`.
    let run_end = |i: usize| {
        let page = page_of(&entries[i]);
        let mut j = i + 1;
        while j < entries.len() && page_of(&entries[j]) == page {
            j += 1;
        }
        j
    };
    let batch = core.l2p.load_batch();
    // Entries below `ahead` are on pages already loaded (or left to switches).
    let mut ahead = 0;
    let mut start = 0;
    while start < entries.len() {
        let end = run_end(start);
        let load = end - start > REPLAY_DEFER_MAX;
        if load && start >= ahead {
            let mut pages: Vec<(VolumeId, usize)> = Vec::with_capacity(batch);
            ahead = start;
            while ahead < entries.len() && pages.len() < batch {
                let e = run_end(ahead);
                if e - ahead > REPLAY_DEFER_MAX {
                    pages.push(page_of(&entries[ahead]));
                }
                ahead = e;
            }
            core.l2p
                .load_pages(&mut core.cache, &pages)
                .map_err(OpenError::Engine)?;
        }
        for &(k, key, pba) in &entries[start..end] {
            let (v, lba) = target(k);
            meter.add(1);
            // An unmap of a sparse-map entry where that map's page holds nothing.
            if pba.is_none() && core.l2p.page_is_empty(v, (lba / epp) as usize) {
                continue;
            }
            let trimmed = painted
                .get(v.0 as usize)
                .and_then(|m| m.range(..=lba).next_back())
                .is_some_and(|(_, &(end, tkey))| lba < end && tkey > key);
            if trimmed {
                continue;
            }
            if load {
                core.l2p
                    .set(&mut core.cache, v, Lba(lba), pba)
                    .map_err(OpenError::Engine)?;
            } else {
                core.l2p.set_lazily(v, Lba(lba), pba);
                core.l2p
                    .bound_deferred_for_replay(&mut core.cache)
                    .map_err(OpenError::Engine)?;
            }
            rp.counts.entries_applied += 1;
        }
        start = end;
    }
    // Everything seen that was not ignored, torn or mapped lost to a newer
    // version (another copy, a later write, or a trim).
    let c = &mut rp.counts;
    c.entries_superseded = c
        .entries_seen
        .saturating_sub(c.entries_ignored + c.entries_applied);
    Ok((core.l2p.counters.page_reads - reads0) * BS)
}

/// Unmaps `lo..hi` of `v` in the L2P only (validity is rebuilt afterwards).
fn unmap_replayed(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    v: VolumeId,
    lo: u64,
    hi: u64,
) -> Result<(), OpenError> {
    let mut lba = lo;
    while lba < hi {
        let epp = core.l2p.format().entries_per_page();
        let page = (lba / epp) as usize;
        let page_end = ((page as u64 + 1) * epp).min(hi);
        if core.l2p.page_is_empty(v, page) {
            lba = page_end;
            continue;
        }
        while lba < page_end {
            core.l2p
                .set(&mut core.cache, v, Lba(lba), Pba::NONE)
                .map_err(OpenError::Engine)?;
            lba += 1;
        }
    }
    Ok(())
}

/// After replay: the scanned regions are closed as they are (a life is never
/// continued after a crash), zones finished on the device. Their role and stream
/// come from the checkpoint when they were open there.
pub(crate) fn close_replayed(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    rp: &Replay,
    now: u64,
) -> Result<(), OpenError> {
    for (&id, p) in &rp.plans {
        let r = RegionId(id);
        let groups = Groups {
            blocks: core.geo.region_blocks(r),
        };
        let (role, stream) = if p.from_checkpoint {
            let reg = core.regions.get(r);
            (reg.role, reg.stream)
        } else if core.geo.is_chunk(r) {
            (RegionRole::User, 0)
        } else {
            (RegionRole::Compaction, 0)
        };
        let reg = core.regions.get_mut(r);
        reg.state = RegionState::Closed;
        reg.sid = p.sid;
        reg.role = role;
        reg.stream = stream;
        reg.wp = groups.end();
        reg.valid = 0;
        reg.close_time = now;
        if !core.geo.is_chunk(r) {
            let z = core.geo.zone_of(r).0;
            let info = core
                .capacity
                .zone_info(z)
                .map_err(|e| OpenError::Engine(EngineError::capacity("zone report", 0)(e)))?;
            if info.write_pointer > info.start && info.state != ZoneState::Full {
                core.capacity
                    .manage(z, shale_device::ZoneAction::Finish)
                    .map_err(|e| {
                        OpenError::Engine(EngineError::capacity("zone finish", info.start)(e))
                    })?;
            }
        }
    }
    // A chunk another shard's at the checkpoint, taken and opened since, is this
    // shard's now.
    let geo = core.geo;
    let foreign = (0..geo.chunk_count)
        .filter(|&c| core.regions.get(RegionId(c)).state == RegionState::Foreign)
        .count() as u32;
    if foreign != core.regions.foreign_chunks {
        core.regions.foreign_chunks = foreign;
        core.regions.shares.set_chunks_held(&geo, foreign);
        core.apply_volume_policies();
    }
    core.regions
        .free_chunks
        .retain(|r| !rp.plans.contains_key(&r.0));
    core.regions
        .free_zones
        .retain(|r| !rp.plans.contains_key(&r.0));
    core.regions
        .free_cold_zones
        .retain(|r| !rp.plans.contains_key(&r.0));
    Ok(())
}

/// Zones recorded Free must be empty on the device: writes to a zone whose opening
/// was never made durable are discarded. Returns how many zones were reset.
/// Counts the free zones checked on `meter`.
pub(crate) fn reset_stray_zones(
    core: &mut Core<impl BlockDevice, impl ZonedDevice, impl Clock>,
    meter: &mut Meter<'_>,
) -> Result<u64, OpenError> {
    let mut n = 0;
    let free: Vec<RegionId> = (core.regions.free_zones.iter())
        .chain(&core.regions.free_cold_zones)
        .copied()
        .collect();
    meter.start(free.len() as u64);
    for r in free {
        meter.add(1);
        let z = core.geo.zone_of(r).0;
        let info = core
            .capacity
            .zone_info(z)
            .map_err(|e| OpenError::Engine(EngineError::capacity("zone report", 0)(e)))?;
        if info.state != ZoneState::Empty {
            core.capacity
                .manage(z, shale_device::ZoneAction::Reset)
                .map_err(|e| {
                    OpenError::Engine(EngineError::capacity("zone reset", info.start)(e))
                })?;
            n += 1;
        }
    }
    Ok(n)
}

/// Paints `[lo, hi)` with `key` over disjoint ranges.
fn paint(m: &mut BTreeMap<u64, (u64, Key)>, lo: u64, hi: u64, key: Key) {
    // A range starting before `lo` and reaching into it is cut at `lo` (and its tail
    // past `hi` kept).
    if let Some((&s, &(e, k))) = m.range(..lo).next_back() {
        if e > lo {
            m.insert(s, (lo, k));
            if e > hi {
                m.insert(hi, (e, k));
            }
        }
    }
    let inside: Vec<u64> = m.range(lo..hi).map(|(&s, _)| s).collect();
    for s in inside {
        if let Some((e, k)) = m.remove(&s) {
            if e > hi {
                m.insert(hi, (e, k));
            }
        }
    }
    m.insert(lo, (hi, key));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covering(m: &BTreeMap<u64, (u64, Key)>, lba: u64) -> Option<Key> {
        m.range(..=lba)
            .next_back()
            .filter(|(_, &(e, _))| lba < e)
            .map(|(_, &(_, k))| k)
    }

    #[test]
    fn later_trims_paint_over_earlier_ones() {
        let mut m = BTreeMap::new();
        paint(&mut m, 10, 20, (1, 0));
        paint(&mut m, 15, 30, (2, 0));
        paint(&mut m, 0, 12, (3, 0));
        paint(&mut m, 16, 18, (4, 0));
        let want = |l| match l {
            0..=11 => Some((3, 0)),
            12..=14 => Some((1, 0)),
            16 | 17 => Some((4, 0)),
            15 | 18..=29 => Some((2, 0)),
            _ => None,
        };
        for l in 0..40 {
            assert_eq!(covering(&m, l), want(l), "lba {l}");
        }
    }
}
