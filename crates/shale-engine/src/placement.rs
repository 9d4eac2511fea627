//! Placement: which stream (and so which open zone) a relocated block goes to.
//!
//! `Volume` (the default) sends every block of a volume to one stream, `volume %
//! streams`. `Lifetime` adds lifetime classes after SepBIT (Wang et al., FAST '22),
//! adapted to a cache in front of zones; each volume group then has one stream per class:
//!
//! - A user write infers its block's lifetime from the block it overwrites: `v` = now
//!   minus the old block's birth (the SID of the chunk the user wrote it into; blocks
//!   keep that SID wherever they move). A block overwriting one that lived less than
//!   `ℓ` is short-lived; a first write, or one over a long-lived block, is long-lived.
//!   The guess is one bit per cache slot, in memory only (a crash loses hints, not data:
//!   hintless blocks count as long-lived).
//! - Compaction sends each block to its class's stream.
//! - GC sends blocks out of a short-lived zone, and blocks younger than `4ℓ`, to the
//!   young stream; older ones to the old stream.
//! - `ℓ` is the mean lifespan (open to GC) of the last 16 short-class compaction zones
//!   GC took, in SIDs; until GC takes one it is unbounded (every overwrite is short,
//!   as in SepBIT).
//!
//! Time is the SID counter: it advances once per chunk or zone opened, so in step with
//! bytes written.

use shale_format::{Pba, RegionId, RegionRole, Sid, VolumeGc, VolumeId};

use crate::layout::Geometry;
use crate::space::Regions;

/// How relocations are spread over streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlacementKind {
    /// One stream per volume (volumes share streams beyond the stream count).
    #[default]
    Volume,
    /// Per volume group, one stream per lifetime class (short and long).
    Lifetime,
}

/// Classes per volume group under `Lifetime`. Class 0 is short-lived (compaction) or
/// young (GC), class 1 the rest.
const CLASSES: u32 = 2;
/// Lifespans averaged into `ℓ`.
const WINDOW: usize = 16;
/// GC: blocks younger than this many `ℓ` stay with the young.
const GC_YOUNG_ELLS: u64 = 4;

#[derive(Debug)]
pub(crate) struct Placement {
    kind: PlacementKind,
    /// One bit per cache data block: the user write that put it there was short-lived.
    short: Vec<u64>,
    /// Per zone (index = zone region - first zone region): the oldest birth SID staged
    /// into it since it opened (`u64::MAX`: none known, e.g. after a restart).
    birth: Vec<u64>,
    /// Lifespans (SIDs, open to GC) of the last short-class zones GC took.
    lifespans: [u64; WINDOW],
    taken: usize,
    /// Per stream: the GC policy of the volumes whose data it holds, when they all
    /// chose the same one (`Pool` otherwise, or when none chose).
    stream_gc: Vec<VolumeGc>,
}

impl Placement {
    pub fn new(kind: PlacementKind, geo: &Geometry) -> Placement {
        let lifetime = kind == PlacementKind::Lifetime;
        Placement {
            kind,
            short: if lifetime {
                vec![0; geo.cache_data_blocks.div_ceil(64) as usize]
            } else {
                Vec::new()
            },
            birth: if lifetime {
                vec![u64::MAX; geo.zone_count as usize]
            } else {
                Vec::new()
            },
            lifespans: [0; WINDOW],
            taken: 0,
            stream_gc: Vec::new(),
        }
    }

    /// Records the volumes' GC policies per stream (`volumes`: each volume and its
    /// policy; a stream shared by volumes that differ keeps the pool's).
    pub fn set_gc_policies(&mut self, volumes: &[(VolumeId, VolumeGc)], streams: u32) {
        let streams = streams.max(1);
        let mut table: Vec<Option<Option<VolumeGc>>> = vec![None; streams as usize];
        for &(v, gc) in volumes {
            for class in 0..CLASSES {
                let s = self.slot(v, class, streams);
                table[s] = match table[s] {
                    None => Some(Some(gc)),
                    Some(Some(g)) if g == gc => Some(Some(g)),
                    _ => Some(None),
                };
            }
        }
        self.stream_gc = table
            .into_iter()
            .map(|t| t.flatten().unwrap_or(VolumeGc::Pool))
            .collect();
    }

    /// The GC policy for a zone of `stream`.
    pub fn stream_gc(&self, stream: u16) -> VolumeGc {
        self.stream_gc
            .get(usize::from(stream))
            .copied()
            .unwrap_or(VolumeGc::Pool)
    }

    /// Whether some stream has a policy of its own.
    pub fn has_gc_policies(&self) -> bool {
        self.stream_gc.iter().any(|&g| g != VolumeGc::Pool)
    }

    /// `ℓ` in SIDs (`u64::MAX` until GC took a short-class zone).
    pub fn ell(&self) -> u64 {
        if self.taken == 0 {
            return u64::MAX;
        }
        let n = self.taken.min(WINDOW);
        self.lifespans[..n].iter().sum::<u64>() / n as u64
    }

    /// The stream of `class` for `volume` among `streams`.
    fn slot(&self, volume: VolumeId, class: u32, streams: u32) -> usize {
        match self.kind {
            PlacementKind::Volume => (volume.0 % streams) as usize,
            PlacementKind::Lifetime if streams < CLASSES => (class % streams) as usize,
            PlacementKind::Lifetime => {
                let groups = streams / CLASSES;
                ((volume.0 % groups) * CLASSES + class) as usize
            }
        }
    }

    /// The class a stream holds (0 under `Volume`).
    fn class_of(&self, stream: u16) -> u32 {
        match self.kind {
            PlacementKind::Volume => 0,
            PlacementKind::Lifetime => u32::from(stream) % CLASSES,
        }
    }

    /// The birth SID of the data at `pba`, as far as memory knows: its chunk's SID in
    /// the cache; in a zone, the oldest birth staged into the zone (or the zone's own
    /// SID, which no block in it predates by much after a restart).
    fn birth_of(&self, geo: &Geometry, regions: &Regions, pba: Pba) -> Option<u64> {
        let (r, _) = geo.region_slot(pba)?;
        let reg = regions.get(r);
        if geo.is_chunk(r) {
            return Some(reg.sid.0);
        }
        let b = self.birth[geo.zone_of(r).0 as usize];
        Some(if b == u64::MAX { reg.sid.0 } else { b })
    }

    /// A user write put a block at cache `new`, replacing the one at `old`.
    pub fn user_write(&mut self, geo: &Geometry, regions: &Regions, now: u64, new: Pba, old: Pba) {
        if self.kind != PlacementKind::Lifetime {
            return;
        }
        let short = !old.is_none()
            && self
                .birth_of(geo, regions, old)
                .is_some_and(|b| now.saturating_sub(b) < self.ell());
        let (w, bit) = ((new.0 / 64) as usize, new.0 % 64);
        if let Some(word) = self.short.get_mut(w) {
            if short {
                *word |= 1 << bit;
            } else {
                *word &= !(1 << bit);
            }
        }
    }

    /// The stream compaction sends the block at cache `pba` of `volume` to.
    pub fn compaction_stream(&self, volume: VolumeId, pba: Pba, streams: u32) -> usize {
        let short = self.kind == PlacementKind::Lifetime
            && self
                .short
                .get((pba.0 / 64) as usize)
                .is_some_and(|w| w & (1 << (pba.0 % 64)) != 0);
        self.slot(volume, u32::from(!short), streams)
    }

    /// The streams GC may send the blocks of a zone of `stream` to, as `(first,
    /// count)`: the stream itself, or under `Lifetime` both classes of its volume group
    /// (each volume's blocks stay in its group). A zone written before a restart with
    /// other streams may hold blocks placed elsewhere; the mover sends those to `first`.
    pub fn gc_dests(&self, stream: u16, streams: u32) -> (usize, usize) {
        let streams = streams.max(1) as usize;
        match self.kind {
            PlacementKind::Volume => (usize::from(stream) % streams, 1),
            PlacementKind::Lifetime if streams < CLASSES as usize => (0, streams),
            PlacementKind::Lifetime => {
                let classes = CLASSES as usize;
                let groups = streams / classes;
                ((usize::from(stream) / classes % groups) * classes, classes)
            }
        }
    }

    /// The stream GC sends a block born at `sid` out of zone `victim` to.
    pub fn gc_stream(
        &self,
        regions: &Regions,
        victim: RegionId,
        volume: VolumeId,
        sid: Sid,
        now: u64,
        streams: u32,
    ) -> usize {
        if self.kind == PlacementKind::Volume {
            return self.slot(volume, 0, streams);
        }
        let v = regions.get(victim);
        let from_short = v.role == RegionRole::Compaction && self.class_of(v.stream) == 0;
        let young = now.saturating_sub(sid.0) < self.ell().saturating_mul(GC_YOUNG_ELLS);
        self.slot(volume, u32::from(!(from_short || young)), streams)
    }

    /// Blocks born at `sids` were staged into `zone`.
    pub fn staged(&mut self, geo: &Geometry, zone: RegionId, sids: impl Iterator<Item = Sid>) {
        if let Some(b) = self.birth.get_mut(geo.zone_of(zone).0 as usize) {
            *b = sids.fold(*b, |b, s| b.min(s.0));
        }
    }

    /// `zone` opened: nothing is known of its data yet.
    pub fn zone_opened(&mut self, geo: &Geometry, zone: RegionId) {
        if let Some(b) = self.birth.get_mut(geo.zone_of(zone).0 as usize) {
            *b = u64::MAX;
        }
    }

    /// GC took `victim` as its victim at `now`.
    pub fn gc_took(&mut self, regions: &Regions, victim: RegionId, now: u64) {
        let v = regions.get(victim);
        if self.kind != PlacementKind::Lifetime
            || v.role != RegionRole::Compaction
            || self.class_of(v.stream) != 0
        {
            return;
        }
        self.lifespans[self.taken % WINDOW] = now.saturating_sub(v.sid.0);
        self.taken += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            chunk_blocks: 256,
            chunk_count: 4,
            data_start: 0,
            zone_size_blocks: 1024,
            zone_cap_blocks: 1024,
            zone_count: 8,
            cache_data_blocks: 1024,
            cold_first: u32::MAX,
        }
    }

    #[test]
    fn a_write_over_a_short_lived_block_is_short_lived() {
        let geo = geo();
        let mut regions = Regions::new(&geo);
        let mut p = Placement::new(PlacementKind::Lifetime, &geo);
        let (streams, vol) = (4, VolumeId(3));
        // Chunk 0 was written at SID 10, chunk 1 at 100; zone 2 (region 6) holds
        // blocks born at SID 5.
        regions.open(RegionId(0), Sid(10), RegionRole::User, 0);
        regions.open(RegionId(1), Sid(100), RegionRole::User, 0);
        let zone = RegionId(6);
        regions.open(zone, Sid(90), RegionRole::Compaction, 0);
        p.zone_opened(&geo, zone);
        p.staged(&geo, zone, [Sid(9), Sid(5)].into_iter());
        // Until GC took a short-class zone every overwrite counts as short-lived
        // (SepBIT's unbounded ℓ), and a first write as long-lived.
        assert_eq!(p.ell(), u64::MAX);
        p.user_write(&geo, &regions, 120, Pba(256), Pba(3));
        p.user_write(&geo, &regions, 120, Pba(257), Pba::NONE);
        assert_eq!(p.compaction_stream(vol, Pba(256), streams), 2);
        assert_eq!(p.compaction_stream(vol, Pba(257), streams), 3);
        // GC took the short-class zone 90 SIDs after it opened: ℓ = 90.
        p.gc_took(&regions, zone, 180);
        assert_eq!(p.ell(), 90);
        // Over chunk 1's block (lived 20): short; over chunk 0's (110): long; over the
        // zone's, born at 5 (115), long, though the zone itself opened at 90.
        p.user_write(&geo, &regions, 120, Pba(258), Pba(256));
        p.user_write(&geo, &regions, 120, Pba(259), Pba(3));
        let in_zone = geo.pba(zone, 7);
        p.user_write(&geo, &regions, 120, Pba(260), in_zone);
        assert_eq!(p.compaction_stream(vol, Pba(258), streams), 2);
        assert_eq!(p.compaction_stream(vol, Pba(259), streams), 3);
        assert_eq!(p.compaction_stream(vol, Pba(260), streams), 3);
        // A slot rewritten by a long-lived write loses its old hint.
        p.user_write(&geo, &regions, 120, Pba(256), Pba(3));
        assert_eq!(p.compaction_stream(vol, Pba(256), streams), 3);
        // GC: out of a short-class zone always young; elsewhere young below 4ℓ.
        assert_eq!(p.gc_stream(&regions, zone, vol, Sid(0), 10_000, streams), 2);
        let gc_zone = RegionId(7);
        regions.open(gc_zone, Sid(95), RegionRole::Gc, 1);
        assert_eq!(
            p.gc_stream(&regions, gc_zone, vol, Sid(200), 500, streams),
            2
        );
        assert_eq!(
            p.gc_stream(&regions, gc_zone, vol, Sid(100), 500, streams),
            3
        );
    }

    #[test]
    fn volume_placement_ignores_lifetimes() {
        let geo = geo();
        let regions = Regions::new(&geo);
        let mut p = Placement::new(PlacementKind::Volume, &geo);
        p.user_write(&geo, &regions, 5, Pba(1), Pba(2));
        assert_eq!(p.compaction_stream(VolumeId(9), Pba(1), 4), 1);
        assert_eq!(
            p.gc_stream(&regions, RegionId(6), VolumeId(9), Sid(0), 9, 4),
            1
        );
        assert!(p.short.is_empty() && p.birth.is_empty());
    }

    #[test]
    fn gc_sends_a_zones_blocks_only_to_its_dests() {
        let geo = geo();
        for kind in [PlacementKind::Volume, PlacementKind::Lifetime] {
            let p = Placement::new(kind, &geo);
            for streams in 1..10u32 {
                for v in 0..20 {
                    for c in 0..CLASSES {
                        // A zone opened for this volume's blocks (by compaction or GC)...
                        let zone_stream = p.slot(VolumeId(v), c, streams) as u16;
                        let (first, count) = p.gc_dests(zone_stream, streams);
                        assert!(first + count <= streams as usize);
                        // ...sends them, whatever their class, among its dests.
                        for c2 in 0..CLASSES {
                            let to = p.slot(VolumeId(v), c2, streams);
                            assert!(
                                (first..first + count).contains(&to),
                                "{kind:?} streams {streams} volume {v}: {to} not in {first}+{count}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn slots_of_classes_stay_within_the_streams() {
        let geo = geo();
        let p = Placement::new(PlacementKind::Lifetime, &geo);
        for streams in 1..10 {
            for v in 0..20 {
                for c in 0..CLASSES {
                    let s = p.slot(VolumeId(v), c, streams);
                    assert!(s < streams as usize);
                    if streams >= CLASSES {
                        assert_eq!(p.class_of(s as u16), c);
                    }
                }
            }
        }
        let v = Placement::new(PlacementKind::Volume, &geo);
        assert_eq!(v.slot(VolumeId(13), 1, 8), 5);
    }
}
