//! The in-memory region state table and the free lists.

use std::collections::VecDeque;

use shale_format::{Pba, RegionEntry, RegionId, RegionRole, RegionState, Sid, VolumeId};

use crate::layout::{Geometry, Groups};
use crate::space::{CacheShares, Validity};

#[derive(Debug, Clone, Default)]
pub(crate) struct Region {
    pub state: RegionState,
    pub role: RegionRole,
    pub stream: u16,
    pub sid: Sid,
    pub valid: u32,
    pub wp: u32,
    pub close_time: u64,
    /// Blocks read out of this region by a mover and not yet settled (switched or born
    /// invalid). The region may not be freed while this is non-zero.
    pub relocations: u32,
    /// Device writes into this region in flight.
    pub inflight_writes: u32,
    /// A mover has read (or is reading) this region: not a victim candidate again.
    pub draining: bool,
}

impl Region {
    pub fn entry(&self) -> RegionEntry {
        RegionEntry {
            state: self.state,
            role: self.role,
            stream: self.stream,
            sid: self.sid,
            valid_count: self.valid,
            write_pointer: self.wp,
            close_time: self.close_time,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Regions {
    pub regions: Vec<Region>,
    pub validity: Validity,
    pub free_chunks: VecDeque<RegionId>,
    /// Free zones of the fast tier (every zone when the pool has one tier)...
    pub free_zones: VecDeque<RegionId>,
    /// ... and of the cold tier (`Geometry::is_cold`).
    pub free_cold_zones: VecDeque<RegionId>,
    pub pending_free: Vec<RegionId>,
    /// The validity bits are being rebuilt in the background (`census.rs`): a bit may
    /// still be clear for a mapped block, and a count reaching zero waits.
    pub census_pending: bool,
    /// While a census runs: each region's set bits (kept on every transition, so its
    /// end needs no pass over the bitmap).
    pub census_bits: Vec<u32>,
    /// While a census after a crash runs: the counts are not known yet. Each region's
    /// `valid` is then its set bits, exact once every page is walked.
    pub counts_unknown: bool,
    /// Each volume's valid blocks in the cache, moved with the bits of chunk blocks.
    pub shares: CacheShares,
    /// Chunks of a cache the shards of a pool share that are another shard's here
    /// (region state Foreign: `space/lend.rs`).
    pub foreign_chunks: u32,
}

impl Regions {
    pub fn new(geo: &Geometry) -> Regions {
        let mut regions = vec![Region::default(); geo.region_count() as usize];
        regions[geo.chunk_count as usize].state = RegionState::Reserved;
        Regions {
            regions,
            validity: Validity::new(geo.pba_count()),
            free_chunks: (0..geo.chunk_count).map(RegionId).collect(),
            free_zones: (geo.chunk_count + 1..geo.region_count())
                .map(RegionId)
                .filter(|&r| !geo.is_cold(r))
                .collect(),
            free_cold_zones: (geo.chunk_count + 1..geo.region_count())
                .map(RegionId)
                .filter(|&r| geo.is_cold(r))
                .collect(),
            pending_free: Vec::new(),
            census_pending: false,
            census_bits: Vec::new(),
            counts_unknown: false,
            foreign_chunks: 0,
            shares: CacheShares::new(
                geo.chunk_count,
                u64::from(geo.chunk_count)
                    * u64::from(
                        Groups {
                            blocks: geo.chunk_blocks,
                        }
                        .data_capacity(),
                    ),
            ),
        }
    }

    /// A background census begins: every bit clear, none counted. With
    /// `counts_known` (a clean shutdown's exact counts) the counts stay and the census
    /// checks them at its end; otherwise (after a crash) they start at zero and count
    /// the bits as they are set.
    pub fn begin_census(&mut self, counts_known: bool) {
        self.validity.clear_all();
        self.shares.clear_counts();
        self.census_pending = true;
        self.census_bits = vec![0; self.regions.len()];
        self.counts_unknown = !counts_known;
        if !counts_known {
            for r in &mut self.regions {
                r.valid = 0;
            }
        }
    }

    /// The census set `pba`'s bit, in region `r`, unless it was set already (mapped
    /// since the open). Returns whether it was.
    pub fn census_set(&mut self, r: RegionId, pba: Pba, v: VolumeId) -> bool {
        let was = self.validity.set(pba);
        if !was {
            self.shares.add(v, r);
            self.census_bits[r.0 as usize] += 1;
            if self.counts_unknown {
                self.regions[r.0 as usize].valid += 1;
            }
        }
        was
    }

    /// Rebuilds from a checkpoint's table (validity is rebuilt separately by census).
    pub fn from_entries(geo: &Geometry, entries: &[RegionEntry]) -> Regions {
        let mut r = Regions::new(geo);
        r.free_chunks.clear();
        r.free_zones.clear();
        r.free_cold_zones.clear();
        for (i, e) in entries.iter().enumerate() {
            let id = RegionId(i as u32);
            r.regions[i] = Region {
                state: e.state,
                role: e.role,
                stream: e.stream,
                sid: e.sid,
                valid: e.valid_count,
                wp: e.write_pointer,
                close_time: e.close_time,
                ..Default::default()
            };
            if e.state == RegionState::Free {
                r.push_free(geo, id);
            }
            if e.state == RegionState::Foreign && geo.is_chunk(id) {
                r.foreign_chunks += 1;
            }
        }
        r.shares.set_chunks_held(geo, r.foreign_chunks);
        r
    }

    /// The chunks this engine holds (all but another shard's).
    pub fn owned_chunks(&self, geo: &Geometry) -> u32 {
        geo.chunk_count - self.foreign_chunks
    }

    pub fn get(&self, r: RegionId) -> &Region {
        &self.regions[r.0 as usize]
    }

    pub fn get_mut(&mut self, r: RegionId) -> &mut Region {
        &mut self.regions[r.0 as usize]
    }

    /// Marks `pba` valid (a new mapping of volume `v` points at it).
    pub fn mark_valid(&mut self, geo: &Geometry, pba: Pba, v: VolumeId) {
        let Some((r, _)) = geo.region_slot(pba) else {
            panic!("mark_valid of {pba} outside the data regions");
        };
        let was = self.validity.set(pba);
        assert!(!was, "{pba} already valid");
        self.shares.add(v, r);
        self.regions[r.0 as usize].valid += 1;
        if self.census_pending {
            self.census_bits[r.0 as usize] += 1;
        }
    }

    /// Marks `pba` invalid (volume `v`'s mapping moved away); the region may become
    /// PendingFree.
    pub fn mark_invalid(&mut self, geo: &Geometry, pba: Pba, v: VolumeId) {
        let Some((r, _)) = geo.region_slot(pba) else {
            panic!("mark_invalid of {pba} outside the data regions");
        };
        let was = self.validity.clear(pba);
        assert!(was || self.census_pending, "{pba} was not valid");
        if was {
            self.shares.remove(v, r);
        }
        if self.census_pending && was {
            self.census_bits[r.0 as usize] -= 1;
        }
        // Unknown counts are the set bits: a bit the census has not set yet was never
        // counted.
        if was || !self.counts_unknown {
            self.regions[r.0 as usize].valid -= 1;
        }
        self.maybe_pending_free(r);
    }

    /// A closed region with nothing valid and nothing in flight waits for the next
    /// durability point to be reused.
    pub fn maybe_pending_free(&mut self, r: RegionId) {
        let reg = &mut self.regions[r.0 as usize];
        if reg.state == RegionState::Closed
            && !self.census_pending
            && reg.valid == 0
            && reg.relocations == 0
            && reg.inflight_writes == 0
        {
            reg.state = RegionState::PendingFree;
            reg.draining = false;
            self.pending_free.push(r);
        }
    }

    /// Moves a region to the free state (its reuse is now safe).
    pub fn release(&mut self, geo: &Geometry, r: RegionId) {
        let reg = &mut self.regions[r.0 as usize];
        debug_assert_eq!(reg.state, RegionState::PendingFree);
        *reg = Region::default();
        self.push_free(geo, r);
    }

    /// Appends free region `r` to its list: chunks, fast zones or cold zones.
    pub fn push_free(&mut self, geo: &Geometry, r: RegionId) {
        if geo.is_chunk(r) {
            self.free_chunks.push_back(r);
        } else if geo.is_cold(r) {
            self.free_cold_zones.push_back(r);
        } else {
            self.free_zones.push_back(r);
        }
    }

    /// The free zones of one tier.
    pub fn free_zones_of(&self, cold: bool) -> &VecDeque<RegionId> {
        if cold {
            &self.free_cold_zones
        } else {
            &self.free_zones
        }
    }

    /// Opens a region for writing with a new SID.
    pub fn open(&mut self, r: RegionId, sid: Sid, role: RegionRole, stream: u16) {
        let reg = &mut self.regions[r.0 as usize];
        debug_assert_eq!(reg.state, RegionState::Free);
        *reg = Region {
            state: RegionState::Open,
            role,
            stream,
            sid,
            ..Default::default()
        };
    }

    /// Closes an open region once its write pointer reached the end and nothing is in
    /// flight. Returns true if it closed now.
    pub fn try_close(&mut self, geo: &Geometry, r: RegionId, unsettled: bool, now: u64) -> bool {
        let end = Groups {
            blocks: geo.region_blocks(r),
        }
        .end();
        let reg = &mut self.regions[r.0 as usize];
        if reg.state == RegionState::Open && reg.wp >= end && reg.inflight_writes == 0 && !unsettled
        {
            reg.state = RegionState::Closed;
            reg.close_time = now;
            self.maybe_pending_free(r);
            return true;
        }
        false
    }

    pub fn entries(&self) -> Vec<RegionEntry> {
        self.regions.iter().map(Region::entry).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geo() -> Geometry {
        Geometry {
            chunk_blocks: 256,
            chunk_count: 4,
            data_start: 0,
            zone_size_blocks: 256,
            zone_cap_blocks: 256,
            zone_count: 4,
            cache_data_blocks: 1024,
            cold_first: u32::MAX,
        }
    }

    proptest! {
        /// Valid counts follow the bitmap, and a closed region empties into the pending
        /// list exactly once.
        #[test]
        fn counts_follow_bits(ops in proptest::collection::vec((0u32..4, 0u32..252, any::<bool>()), 1..500)) {
            let g = geo();
            let mut r = Regions::new(&g);
            for c in 0..4 {
                let id = RegionId(c);
                let Some(pos) = r.free_chunks.iter().position(|&x| x == id) else { continue };
                r.free_chunks.remove(pos);
                r.open(id, Sid(u64::from(c) + 1), RegionRole::User, 0);
            }
            let mut model = std::collections::HashSet::new();
            for (c, slot, set) in ops {
                let pba = g.pba(RegionId(c), slot);
                if set && !model.contains(&pba) {
                    r.mark_valid(&g, pba, VolumeId(0));
                    model.insert(pba);
                } else if !set && model.remove(&pba) {
                    r.mark_invalid(&g, pba, VolumeId(0));
                }
                for c in 0..4 {
                    let id = RegionId(c);
                    let bits = r.validity.count_range(g.region_base(id), 256);
                    prop_assert_eq!(bits, r.get(id).valid);
                }
            }
            for c in 0..4 {
                let id = RegionId(c);
                r.get_mut(id).wp = 256;
                r.try_close(&g, id, false, 7);
            }
            for &p in &model {
                r.mark_invalid(&g, p, VolumeId(0));
            }
            let mut pending = r.pending_free.clone();
            pending.sort();
            prop_assert_eq!(pending, (0..4).map(RegionId).collect::<Vec<_>>());
            for c in 0..4 {
                r.release(&g, RegionId(c));
            }
            prop_assert_eq!(r.free_chunks.len(), 4);
        }
    }
}
