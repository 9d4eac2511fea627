//! Where things are: PBA arithmetic, the group structure of regions, and the cache
//! device layout computed at format time.
//!
//! Invariants: a PBA below `cache_data_blocks` is in a chunk, otherwise in a zone; a
//! region's write pointer always rests on a data slot or at the region end (md slots
//! are skipped); groups are 128 blocks except possibly the last (>= 3 blocks).

use shale_format::{
    CacheLayout, CapacityGeometry, Checkpoint, ChunkId, L2pFormat, Pba, RegionId, ZoneId,
    BLOCK_SIZE, GROUP_BLOCKS,
};

pub(crate) const BS: u64 = BLOCK_SIZE as u64;
/// Blocks of each volume table copy in new pools: the second holds volume limits.
pub(crate) const VOLUME_TABLE_BLOCKS: u32 = 2;

/// Address arithmetic over both devices.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geometry {
    pub chunk_blocks: u32,
    pub chunk_count: u32,
    /// Cache device block where chunk 0 starts.
    pub data_start: u64,
    pub zone_size_blocks: u32,
    pub zone_cap_blocks: u32,
    pub zone_count: u32,
    pub cache_data_blocks: u64,
    /// The first zone of the cold tier (`Superblock::cold_zones` at the end of the
    /// zones); `zone_count` when the pool has one tier.
    pub cold_first: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Chunk(ChunkId, u32),
    Zone(ZoneId, u32),
}

impl Geometry {
    pub fn new(layout: &CacheLayout, cap: &CapacityGeometry) -> Geometry {
        Geometry {
            chunk_blocks: layout.chunk_blocks,
            chunk_count: layout.chunk_count,
            data_start: layout.data_start,
            zone_size_blocks: cap.zone_size_blocks,
            zone_cap_blocks: cap.zone_capacity_blocks,
            zone_count: cap.zone_count,
            cache_data_blocks: layout.cache_data_blocks(),
            cold_first: cap.zone_count,
        }
    }

    /// The geometry a superblock describes, its cold tier included.
    pub fn of(sb: &shale_format::Superblock) -> Geometry {
        Geometry {
            cold_first: sb.capacity.zone_count - sb.cold_zones.min(sb.capacity.zone_count),
            ..Geometry::new(&sb.layout, &sb.capacity)
        }
    }

    /// Whether the pool has a cold tier.
    pub fn tiered(&self) -> bool {
        self.cold_first < self.zone_count
    }

    /// Whether region `r` is a zone of the cold tier.
    pub fn is_cold(&self, r: RegionId) -> bool {
        !self.is_chunk(r) && r.0 - self.chunk_count >= self.cold_first
    }

    pub fn region_count(&self) -> u32 {
        self.chunk_count + self.zone_count
    }

    pub fn pba_count(&self) -> u64 {
        self.cache_data_blocks + u64::from(self.zone_size_blocks) * u64::from(self.zone_count)
    }

    pub fn is_chunk(&self, r: RegionId) -> bool {
        r.0 < self.chunk_count
    }

    pub fn chunk_region(&self, c: ChunkId) -> RegionId {
        RegionId(c.0)
    }

    pub fn zone_region(&self, z: ZoneId) -> RegionId {
        RegionId(self.chunk_count + z.0)
    }

    pub fn zone_of(&self, r: RegionId) -> ZoneId {
        ZoneId(r.0 - self.chunk_count)
    }

    /// Blocks usable in a region (zones: their writable capacity; zone 0 none).
    pub fn region_blocks(&self, r: RegionId) -> u32 {
        if self.is_chunk(r) {
            self.chunk_blocks
        } else if r.0 == self.chunk_count {
            0
        } else {
            self.zone_cap_blocks
        }
    }

    pub fn region_base(&self, r: RegionId) -> Pba {
        if self.is_chunk(r) {
            Pba(u64::from(r.0) * u64::from(self.chunk_blocks))
        } else {
            Pba(self.cache_data_blocks
                + u64::from(r.0 - self.chunk_count) * u64::from(self.zone_size_blocks))
        }
    }

    pub fn place(&self, pba: Pba) -> Option<Place> {
        if pba.0 < self.cache_data_blocks {
            let chunk = u64::from(self.chunk_blocks);
            Some(Place::Chunk(
                ChunkId((pba.0 / chunk) as u32),
                (pba.0 % chunk) as u32,
            ))
        } else {
            let rel = pba.0 - self.cache_data_blocks;
            let z = rel / u64::from(self.zone_size_blocks);
            let slot = (rel % u64::from(self.zone_size_blocks)) as u32;
            if z >= u64::from(self.zone_count) || z == 0 || slot >= self.zone_cap_blocks {
                return None;
            }
            Some(Place::Zone(ZoneId(z as u32), slot))
        }
    }

    /// The region and slot of a PBA inside a data region, if any.
    pub fn region_slot(&self, pba: Pba) -> Option<(RegionId, u32)> {
        Some(match self.place(pba)? {
            Place::Chunk(c, s) => (self.chunk_region(c), s),
            Place::Zone(z, s) => (self.zone_region(z), s),
        })
    }

    pub fn pba(&self, r: RegionId, slot: u32) -> Pba {
        Pba(self.region_base(r).0 + u64::from(slot))
    }

    /// Byte offset of a chunk slot on the cache device.
    pub fn chunk_offset(&self, r: RegionId, slot: u32) -> u64 {
        (self.data_start + u64::from(r.0) * u64::from(self.chunk_blocks) + u64::from(slot)) * BS
    }

    /// Byte offset of a zone slot on the capacity device.
    pub fn zone_offset(&self, r: RegionId, slot: u32) -> u64 {
        (u64::from(r.0 - self.chunk_count) * u64::from(self.zone_size_blocks) + u64::from(slot))
            * BS
    }

    /// The PBA `j` data slots after `pba` (a data slot) in the same region, skipping md
    /// slots: where block `j` of a mapping unit starting at `pba` lies. `None` when
    /// the region ends first.
    pub fn data_advance(&self, pba: Pba, j: u64) -> Option<Pba> {
        let (r, slot) = self.region_slot(pba)?;
        let groups = Groups {
            blocks: self.region_blocks(r),
        };
        let d = u64::from(groups.data_index(slot)?) + j;
        let d = u32::try_from(d)
            .ok()
            .filter(|&d| d < groups.data_capacity())?;
        Some(self.pba(r, groups.data_slot(d)))
    }

    /// The PBA `j` data slots before `pba` (a data slot) in the same region: the first
    /// block of the unit whose block `j` is at `pba`. `None` past the region's start.
    pub fn data_retreat(&self, pba: Pba, j: u64) -> Option<Pba> {
        let (r, slot) = self.region_slot(pba)?;
        let groups = Groups {
            blocks: self.region_blocks(r),
        };
        let d = u64::from(groups.data_index(slot)?).checked_sub(j)?;
        Some(self.pba(r, groups.data_slot(d as u32)))
    }

    /// Byte offset of a PBA on its device, and whether it is on the cache.
    pub fn device_offset(&self, pba: Pba) -> Option<(bool, u64)> {
        let (r, s) = self.region_slot(pba)?;
        Some(if self.is_chunk(r) {
            (true, self.chunk_offset(r, s))
        } else {
            (false, self.zone_offset(r, s))
        })
    }
}

/// The group structure of a region of `blocks` blocks.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Groups {
    pub blocks: u32,
}

impl Groups {
    pub fn count(self) -> u32 {
        let full = self.blocks / GROUP_BLOCKS;
        full + u32::from(self.blocks % GROUP_BLOCKS >= 3)
    }
    pub fn start(self, g: u32) -> u32 {
        g * GROUP_BLOCKS
    }
    pub fn len(self, g: u32) -> u32 {
        (self.blocks - g * GROUP_BLOCKS).min(GROUP_BLOCKS)
    }
    pub fn data_slots(self, g: u32) -> u32 {
        self.len(g) - 2
    }
    /// Slot of md block A (B is the next one).
    pub fn md_slot(self, g: u32) -> u32 {
        self.start(g) + self.len(g) - 2
    }
    /// First slot past the usable groups (where a full region's write pointer rests).
    pub fn end(self) -> u32 {
        let c = self.count();
        if c == 0 {
            0
        } else {
            self.start(c - 1) + self.len(c - 1)
        }
    }
    /// (group, index in group) of a slot.
    pub fn locate(self, slot: u32) -> (u32, u32) {
        (slot / GROUP_BLOCKS, slot % GROUP_BLOCKS)
    }
    pub fn is_data_slot(self, slot: u32) -> bool {
        let (g, i) = self.locate(slot);
        g < self.count() && i < self.data_slots(g)
    }
    pub fn data_capacity(self) -> u32 {
        self.data_before(self.count())
    }
    /// The data slot's index among the region's data slots (`None` for an md slot or
    /// a slot past the groups).
    pub fn data_index(self, slot: u32) -> Option<u32> {
        self.is_data_slot(slot).then(|| {
            let (g, i) = self.locate(slot);
            g * (GROUP_BLOCKS - 2) + i
        })
    }
    /// The slot of the region's `d`-th data slot (`d < data_capacity()`); every group
    /// but the last is whole, so the last one's data slots start where a whole
    /// group's would.
    pub fn data_slot(self, d: u32) -> u32 {
        (d / (GROUP_BLOCKS - 2)) * GROUP_BLOCKS + d % (GROUP_BLOCKS - 2)
    }
    /// Data slots in the groups before group `g` (every group but the last is whole).
    pub fn data_before(self, g: u32) -> u32 {
        let g = g.min(self.count());
        let whole = g.min(self.blocks / GROUP_BLOCKS);
        let part = if g > whole {
            self.blocks % GROUP_BLOCKS - 2
        } else {
            0
        };
        whole * (GROUP_BLOCKS - 2) + part
    }
}

/// Sizes chosen at format time.
#[derive(Debug, Clone)]
pub(crate) struct FormatPlan {
    pub layout: CacheLayout,
    pub user_capacity_blocks: u64,
    pub l2p: L2pFormat,
}

/// What a format is asked for, besides the devices' geometry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PlanInput {
    pub chunk_blocks: u32,
    pub volumes_max: u32,
    pub journal_blocks: u32,
    pub spare_factor: f64,
    /// Data zones kept out of the user capacity (GC threshold and open streams).
    pub reserve_zones: u32,
    /// The L2P entry width; `None` takes the narrowest that addresses the pool.
    pub l2p: Option<L2pFormat>,
    /// Chunks begin no earlier than this block (a cache the shards share: each
    /// shard's metadata window ends where its chunks begin).
    pub data_start_min: u64,
}

/// Lays out the cache device. Without a chosen L2P format, narrow entries are tried
/// first and wide ones when the PBAs do not fit (wide pages need a larger L2P area,
/// which leaves fewer chunks, so the layout is planned again).
pub(crate) fn plan(
    cache_blocks: u64,
    cap: &CapacityGeometry,
    input: &PlanInput,
) -> Result<FormatPlan, String> {
    let first = input.l2p.unwrap_or(L2pFormat::NARROW);
    let p = plan_with(cache_blocks, cap, input, first)?;
    let pbas =
        p.layout.cache_data_blocks() + u64::from(cap.zone_size_blocks) * u64::from(cap.zone_count);
    if pbas <= first.pba_limit() {
        return Ok(p);
    }
    if input.l2p.is_none() {
        let p = plan_with(cache_blocks, cap, input, L2pFormat::WIDE)?;
        let pbas = p.layout.cache_data_blocks()
            + u64::from(cap.zone_size_blocks) * u64::from(cap.zone_count);
        if pbas <= L2pFormat::WIDE.pba_limit() {
            return Ok(p);
        }
    }
    Err(format!(
        "{pbas} blocks exceed the PBA space of {}-byte L2P entries ({} blocks)",
        input.l2p.unwrap_or(L2pFormat::WIDE).entry_bytes(),
        input.l2p.unwrap_or(L2pFormat::WIDE).pba_limit()
    ))
}

fn plan_with(
    cache_blocks: u64,
    cap: &CapacityGeometry,
    input: &PlanInput,
    l2p: L2pFormat,
) -> Result<FormatPlan, String> {
    let PlanInput {
        chunk_blocks,
        volumes_max,
        journal_blocks,
        spare_factor,
        reserve_zones,
        ..
    } = *input;
    let zone_data = u64::from(
        Groups {
            blocks: cap.zone_capacity_blocks,
        }
        .data_capacity(),
    );
    if zone_data == 0 {
        return Err(format!(
            "zone capacity {} blocks holds no group",
            cap.zone_capacity_blocks
        ));
    }
    let data_zones = u64::from(cap.zone_count.saturating_sub(1));
    let usable_zones = data_zones.saturating_sub(u64::from(reserve_zones));
    let user = (usable_zones as f64 * zone_data as f64 * (1.0 - spare_factor)).floor() as u64;
    if user == 0 {
        return Err(format!(
            "{} data zones leave no user capacity after {reserve_zones} reserved zones and spare {spare_factor}",
            data_zones
        ));
    }
    let pool_pages = l2p.pages_for(user) + u64::from(volumes_max);
    let pool_pages = u32::try_from(pool_pages).map_err(|_| "L2P pool too large".to_string())?;
    let mut l = CacheLayout {
        volume_table_start: 2,
        volume_table_blocks: VOLUME_TABLE_BLOCKS,
        checkpoint_a_start: 2 + 2 * u64::from(VOLUME_TABLE_BLOCKS),
        chunk_blocks,
        l2p_pool_pages: pool_pages,
        journal_blocks,
        ..Default::default()
    };
    // Upper bound on a checkpoint: every region, every pool page in some directory,
    // and room for a switch per pool page (what the L2P keeps waiting by default).
    let regions = u64::from(cap.zone_count) + cache_blocks / u64::from(chunk_blocks);
    l.checkpoint_blocks = u32::try_from(Checkpoint::encoded_blocks(
        regions as usize,
        pool_pages as usize,
        volumes_max as usize,
        VOLUME_TABLE_BLOCKS,
        crate::l2p::switch_room_at_format(pool_pages),
    ))
    .map_err(|_| "checkpoint too large".to_string())?;
    l.checkpoint_b_start = l.checkpoint_a_start + u64::from(l.checkpoint_blocks);
    l.journal_start = l.checkpoint_b_start + u64::from(l.checkpoint_blocks);
    l.l2p_area_start = l.journal_start + u64::from(journal_blocks);
    // Align the data region to a group so chunk I/O stays aligned on big-IU devices.
    l.data_start = (l.l2p_area_start + 2 * u64::from(pool_pages))
        .max(input.data_start_min)
        .next_multiple_of(u64::from(GROUP_BLOCKS));
    let avail = cache_blocks.saturating_sub(l.data_start);
    let chunks = avail / u64::from(chunk_blocks);
    if chunks < 3 {
        return Err(format!(
            "cache of {cache_blocks} blocks has room for {chunks} chunks of {chunk_blocks} blocks after {} metadata blocks; need >= 3",
            l.data_start
        ));
    }
    l.chunk_count = u32::try_from(chunks).map_err(|_| "too many chunks".to_string())?;
    Ok(FormatPlan {
        layout: l,
        user_capacity_blocks: user,
        l2p,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_before_sums_the_groups_data_slots() {
        for blocks in [
            0, 1, 2, 3, 4, 127, 128, 129, 130, 131, 255, 256, 1000, 16384,
        ] {
            let g = Groups { blocks };
            for n in 0..=g.count() + 1 {
                let sum: u32 = (0..n.min(g.count())).map(|i| g.data_slots(i)).sum();
                assert_eq!(g.data_before(n), sum, "blocks {blocks}, groups {n}");
            }
        }
    }

    #[test]
    fn data_slots_are_numbered_in_order_skipping_md() {
        for blocks in [0, 3, 4, 127, 128, 131, 256, 300, 1000] {
            let g = Groups { blocks };
            let slots: Vec<u32> = (0..blocks).filter(|&s| g.is_data_slot(s)).collect();
            assert_eq!(slots.len() as u32, g.data_capacity(), "blocks {blocks}");
            for (d, &s) in slots.iter().enumerate() {
                assert_eq!(g.data_index(s), Some(d as u32));
                assert_eq!(g.data_slot(d as u32), s);
            }
            assert!((0..blocks).all(|s| g.is_data_slot(s) || g.data_index(s).is_none()));
        }
    }

    #[test]
    fn data_advance_stays_in_the_region() {
        let geo = Geometry {
            chunk_blocks: 300,
            chunk_count: 2,
            data_start: 8,
            zone_size_blocks: 512,
            zone_cap_blocks: 500,
            cold_first: u32::MAX,
            zone_count: 3,
            cache_data_blocks: 600,
        };
        for r in [RegionId(0), RegionId(1), RegionId(3), RegionId(4)] {
            let g = Groups {
                blocks: geo.region_blocks(r),
            };
            let cap = u64::from(g.data_capacity());
            for d in [0u32, 1, 125, 126, 200] {
                let from = geo.pba(r, g.data_slot(d));
                for j in [0u64, 1, 2, 15, 127, cap] {
                    let to = geo.data_advance(from, j);
                    if u64::from(d) + j < cap {
                        let want = geo.pba(r, g.data_slot(d + j as u32));
                        assert_eq!(to, Some(want), "{r} d {d} j {j}");
                        assert_eq!(geo.data_retreat(want, j), Some(from), "{r} d {d} j {j}");
                    } else {
                        assert_eq!(to, None, "{r} d {d} j {j}");
                    }
                }
            }
        }
        // md slots and the label zone are not data slots.
        assert_eq!(geo.data_advance(geo.pba(RegionId(0), 126), 0), None);
        assert_eq!(geo.data_advance(Pba(600), 0), None);
    }

    #[test]
    fn groups_of_odd_regions() {
        let g = Groups { blocks: 300 };
        assert_eq!(g.count(), 3);
        assert_eq!(g.len(2), 44);
        assert_eq!(g.data_slots(2), 42);
        assert_eq!(g.md_slot(2), 256 + 42);
        assert_eq!(g.data_capacity(), 126 * 2 + 42);
        assert_eq!(g.end(), 300);
        let g = Groups { blocks: 258 };
        assert_eq!(g.count(), 2);
        assert_eq!(g.end(), 256);
        assert!(!g.is_data_slot(126));
        assert!(g.is_data_slot(128));
        assert!(!g.is_data_slot(257));
    }

    #[test]
    fn pba_roundtrip() {
        let geo = Geometry {
            chunk_blocks: 256,
            chunk_count: 4,
            data_start: 100,
            zone_size_blocks: 512,
            zone_cap_blocks: 500,
            cold_first: u32::MAX,
            zone_count: 6,
            cache_data_blocks: 1024,
        };
        for r in (0..geo.region_count()).map(RegionId) {
            for s in [0u32, 1, 255] {
                if geo.region_blocks(r) > s {
                    assert_eq!(geo.region_slot(geo.pba(r, s)), Some((r, s)));
                }
            }
        }
        assert_eq!(geo.place(Pba(1024)), None, "zone 0 is the label zone");
        assert_eq!(
            geo.place(Pba(1024 + 512 + 500)),
            None,
            "beyond zone capacity"
        );
        assert_eq!(geo.chunk_offset(RegionId(1), 2), (100 + 256 + 2) * 4096);
    }
}
