//! The self-check: L2P vs validity bitmaps vs valid counts, region states, free lists.
//! O(mapped blocks + regions); reads uncached L2P pages without disturbing the cache.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Pba, RegionId, RegionRole, RegionState};

use crate::layout::Groups;
use crate::recovery::Meter;
use crate::space::Validity;
use crate::{Clock, Engine, EngineError, SelfCheckError};

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    /// Checks every space invariant; the first violation is returned.
    pub fn self_check(&mut self) -> Result<(), SelfCheckError> {
        self.self_check_metered(&mut Meter::off())
    }

    /// With the `paranoid` feature (tests): the self-check, a violation being a bug.
    /// An I/O error reading L2P pages is left for the engine's next device call.
    #[cfg(feature = "paranoid")]
    pub(crate) fn paranoid_check(&mut self, when: &str) {
        if let Ok(Err(v)) = self.self_check_inner(&mut Meter::off()) {
            panic!("self-check {when}: {v}");
        }
    }

    /// [`Self::self_check`], counting the L2P pages walked on `meter` (the open's
    /// last step).
    pub(crate) fn self_check_metered(
        &mut self,
        meter: &mut Meter<'_>,
    ) -> Result<(), SelfCheckError> {
        match self.self_check_inner(meter) {
            Ok(r) => r,
            Err(e) => Err(SelfCheckError::RegionState {
                region: RegionId(u32::MAX),
                reason: format!("L2P unreadable: {e}"),
            }),
        }
    }

    fn self_check_inner(
        &mut self,
        meter: &mut Meter<'_>,
    ) -> Result<Result<(), SelfCheckError>, EngineError> {
        let mut seen = Validity::new(self.geo.pba_count());
        let mut mapped = vec![0u32; self.geo.region_count() as usize];
        let mut first_err = None;
        let geo = self.geo.clone();
        let validity = &self.regions.validity;
        self.l2p
            .for_each_mapped_metered(&mut self.cache, meter, |volume, lba, pba| {
                if first_err.is_some() {
                    return;
                }
                let Some((r, _)) = geo.region_slot(pba) else {
                    first_err = Some(SelfCheckError::BadPba { volume, lba, pba });
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
            })?;
        if let Some(e) = first_err {
            return Ok(Err(e));
        }
        Ok(self.check_regions(&mapped, &seen))
    }

    fn check_regions(&self, mapped: &[u32], seen: &Validity) -> Result<(), SelfCheckError> {
        let rs = &self.regions;
        let bad =
            |region: RegionId, reason: String| Err(SelfCheckError::RegionState { region, reason });
        // How often each region is on the free and pending lists (counted once: a
        // search per region would be quadratic in the zone count).
        let n = self.geo.region_count() as usize;
        let mut listed_free = vec![0u32; n];
        let mut listed_pending = vec![0u32; n];
        for &r in rs.free_chunks.iter().chain(rs.free_zones.iter()) {
            if let Some(c) = listed_free.get_mut(r.0 as usize) {
                *c += 1;
            }
        }
        for &r in &rs.pending_free {
            if let Some(c) = listed_pending.get_mut(r.0 as usize) {
                *c += 1;
            }
        }
        for i in 0..self.geo.region_count() {
            let r = RegionId(i);
            let reg = rs.get(r);
            let base = self.geo.region_base(r);
            let span = if self.geo.is_chunk(r) {
                self.geo.chunk_blocks
            } else {
                self.geo.zone_size_blocks
            };
            let bits = rs.validity.count_range(base, span);
            if bits != reg.valid || reg.valid != mapped[i as usize] {
                return Err(SelfCheckError::CountMismatch {
                    region: r,
                    recorded: reg.valid,
                    bits,
                    mapped: mapped[i as usize],
                });
            }
            if bits != seen.count_range(base, span) {
                for p in base.0..base.0 + span {
                    if rs.validity.get(Pba(p)) && !seen.get(Pba(p)) {
                        return Err(SelfCheckError::ValidButUnmapped { pba: Pba(p) });
                    }
                }
            }
            let groups = Groups {
                blocks: self.geo.region_blocks(r),
            };
            if reg.wp > groups.end() {
                return bad(
                    r,
                    format!("write pointer {} past the end {}", reg.wp, groups.end()),
                );
            }
            if bits > 0 {
                // Only data slots may be valid: the two md slots of each group and the
                // slots past the last group must be clear.
                let md = (0..groups.count())
                    .flat_map(|g| [groups.md_slot(g), groups.md_slot(g) + 1])
                    .find(|&s| rs.validity.get(Pba(base.0 + s)));
                let tail = rs
                    .validity
                    .first_set(
                        Pba(base.0 + groups.end()),
                        span.saturating_sub(groups.end()),
                    )
                    .map(|p| p.0 - base.0);
                if let Some(s) = md.or(tail) {
                    return bad(r, format!("md or unused slot {s} marked valid"));
                }
            }
            let in_free = listed_free[i as usize] as usize;
            let in_pending = listed_pending[i as usize] as usize;
            match reg.state {
                RegionState::Free => {
                    if in_free != 1
                        || reg.valid != 0
                        || reg.relocations != 0
                        || reg.inflight_writes != 0
                    {
                        return bad(
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
                        return bad(
                            r,
                            format!(
                                "PendingFree but pending {in_pending}x, free {in_free}x, valid {}",
                                reg.valid
                            ),
                        );
                    }
                }
                RegionState::Reserved => {
                    if i != self.geo.chunk_count || reg.valid != 0 {
                        return bad(r, "Reserved region is not zone 0".into());
                    }
                }
                RegionState::Open | RegionState::Closed => {
                    if in_free != 0 || in_pending != 0 {
                        return bad(r, format!("{:?} but on a free/pending list", reg.state));
                    }
                    let chunk = self.geo.is_chunk(r);
                    let role_ok = if chunk {
                        reg.role == RegionRole::User
                    } else {
                        matches!(reg.role, RegionRole::Compaction | RegionRole::Gc)
                    };
                    if !role_ok {
                        return bad(
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
        }
        for (list, chunk) in [(&rs.free_chunks, true), (&rs.free_zones, false)] {
            for &r in list.iter() {
                if r.0 >= self.geo.region_count()
                    || self.geo.is_chunk(r) != chunk
                    || rs.get(r).state != RegionState::Free
                {
                    return Err(SelfCheckError::FreeList {
                        reason: format!(
                            "{r} on a free list but not a Free {}",
                            if chunk { "chunk" } else { "zone" }
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
        let open_user = (0..self.geo.chunk_count)
            .filter(|&c| rs.get(RegionId(c)).state == RegionState::Open)
            .count();
        let unsettled_chunks = {
            let mut v: Vec<_> = self.writer.groups.iter().map(|g| g.region).collect();
            v.dedup();
            v.len()
        };
        if open_user > unsettled_chunks.max(usize::from(self.writer.open.is_some())) + 1 {
            return Err(SelfCheckError::FreeList {
                reason: format!("{open_user} chunks open"),
            });
        }
        Ok(())
    }
}
