//! Each volume's valid blocks in the cache, in all and per chunk, kept in step with
//! the validity bits (a count moves only when a bit of a chunk block changes), and the
//! cache shares set on volumes: while a volume holds more than its share, compaction
//! takes first the closed chunk holding most of the blocks of volumes past their
//! shares (`victim`), so a noisy neighbour's writes leave the cache before a quiet
//! volume's. Victim order is free (any closed chunk may be compacted), so a count that
//! is off only changes which chunk goes first, never what a read returns.

use shale_format::{RegionId, VolumeId};

use crate::compaction::policy::RegionSnapshot;

#[derive(Debug, Default, Clone)]
struct VolumeCache {
    /// Valid blocks in the cache.
    blocks: u64,
    /// Valid blocks per chunk (index = chunk region id).
    per_chunk: Vec<u32>,
    /// The share in blocks (0: none).
    share_blocks: u64,
}

#[derive(Debug, Clone)]
pub(crate) struct CacheShares {
    chunks: usize,
    /// Data blocks of all chunks: what a share is a percentage of.
    cache_data_blocks: u64,
    /// Index = volume id.
    vols: Vec<VolumeCache>,
}

impl CacheShares {
    pub fn new(chunks: u32, cache_data_blocks: u64) -> CacheShares {
        CacheShares {
            chunks: chunks as usize,
            cache_data_blocks,
            vols: Vec::new(),
        }
    }

    /// Data blocks of all chunks (what a share is a percentage of).
    pub fn data_blocks(&self) -> u64 {
        self.cache_data_blocks
    }

    /// Shares are a percentage of the chunks held: all but `foreign` (another
    /// shard's, in a cache the shards of a pool share).
    pub fn set_chunks_held(&mut self, geo: &crate::layout::Geometry, foreign: u32) {
        let data = crate::layout::Groups {
            blocks: geo.chunk_blocks,
        }
        .data_capacity();
        self.cache_data_blocks = u64::from(geo.chunk_count - foreign) * u64::from(data);
    }

    fn vol(&mut self, v: VolumeId) -> &mut VolumeCache {
        let i = v.0 as usize;
        if i >= self.vols.len() {
            self.vols.resize_with(i + 1, VolumeCache::default);
        }
        let chunks = self.chunks;
        let vc = &mut self.vols[i];
        if vc.per_chunk.is_empty() {
            vc.per_chunk = vec![0; chunks];
        }
        vc
    }

    /// A block of region `c` became valid for `v` (zones are not counted).
    pub fn add(&mut self, v: VolumeId, c: RegionId) {
        if c.0 as usize >= self.chunks {
            return;
        }
        let vc = self.vol(v);
        vc.blocks += 1;
        if let Some(n) = vc.per_chunk.get_mut(c.0 as usize) {
            *n += 1;
        }
    }

    /// A block of region `c` that was valid for `v` is not any more.
    pub fn remove(&mut self, v: VolumeId, c: RegionId) {
        if c.0 as usize >= self.chunks {
            return;
        }
        let vc = self.vol(v);
        vc.blocks = vc.blocks.saturating_sub(1);
        if let Some(n) = vc.per_chunk.get_mut(c.0 as usize) {
            *n = n.saturating_sub(1);
        }
    }

    /// Every bit was cleared (a census starts over): every count is zero.
    pub fn clear_counts(&mut self) {
        for vc in &mut self.vols {
            vc.blocks = 0;
            vc.per_chunk.iter_mut().for_each(|n| *n = 0);
        }
    }

    /// Removes every share (the counts stay).
    pub fn clear_shares(&mut self) {
        for vc in &mut self.vols {
            vc.share_blocks = 0;
        }
    }

    /// Sets `v`'s share (0: none).
    pub fn set_share(&mut self, v: VolumeId, pct: u8) {
        let share = self.cache_data_blocks * u64::from(pct.min(100)) / 100;
        // At least one block, so a share of 1% of a tiny cache still holds something.
        self.vol(v).share_blocks = if pct == 0 { 0 } else { share.max(1) };
    }

    /// `v`'s valid blocks in the cache.
    pub fn blocks(&self, v: VolumeId) -> u64 {
        self.vols.get(v.0 as usize).map_or(0, |vc| vc.blocks)
    }

    /// Whether some volume holds more than its share and `slack` blocks.
    pub fn any_over(&self, slack: u64) -> bool {
        self.vols
            .iter()
            .any(|vc| vc.share_blocks > 0 && vc.blocks > vc.share_blocks + slack)
    }

    /// The closed chunk among `snap` holding most blocks of the volumes past their
    /// shares (the older on a tie), if any does.
    pub fn victim(&self, snap: &[RegionSnapshot]) -> Option<RegionId> {
        let over: Vec<&VolumeCache> = self
            .vols
            .iter()
            .filter(|vc| vc.share_blocks > 0 && vc.blocks > vc.share_blocks)
            .collect();
        if over.is_empty() {
            return None;
        }
        snap.iter()
            .map(|r| {
                let held: u64 = over
                    .iter()
                    .map(|vc| {
                        u64::from(vc.per_chunk.get(r.region.0 as usize).copied().unwrap_or(0))
                    })
                    .sum();
                (held, r)
            })
            .filter(|(held, _)| *held > 0)
            .max_by(|(a, x), (b, y)| {
                a.cmp(b)
                    .then(y.sid.cmp(&x.sid))
                    .then(y.region.cmp(&x.region))
            })
            .map(|(_, r)| r.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shale_format::Sid;

    fn snap(region: u32, sid: u64) -> RegionSnapshot {
        RegionSnapshot {
            region: RegionId(region),
            valid: 0,
            capacity: 100,
            sid: Sid(sid),
            close_time: 0,
        }
    }

    #[test]
    fn a_volume_past_its_share_has_its_chunks_taken_first() {
        let mut s = CacheShares::new(4, 1000);
        s.set_share(VolumeId(1), 10); // 100 blocks
        for _ in 0..60 {
            s.add(VolumeId(1), RegionId(2));
            s.add(VolumeId(1), RegionId(3));
            s.add(VolumeId(0), RegionId(0));
        }
        let snaps = [snap(0, 1), snap(2, 3), snap(3, 4)];
        // 120 blocks > 100: the chunk with most of them, the older on a tie.
        assert_eq!(s.victim(&snaps), Some(RegionId(2)));
        s.remove(VolumeId(1), RegionId(2));
        assert_eq!(s.victim(&snaps), Some(RegionId(3)));
        assert!(s.any_over(0) && !s.any_over(20));
        // Within its share: no preference.
        for _ in 0..30 {
            s.remove(VolumeId(1), RegionId(3));
        }
        assert!(!s.any_over(0));
        assert_eq!(s.victim(&snaps), None);
        // A volume without a share is never preferred, however much it holds.
        assert_eq!(s.blocks(VolumeId(0)), 60);
    }

    proptest! {
        /// Counts follow adds and removes exactly (removes only of added blocks), and a
        /// victim is always a candidate holding blocks of a volume past its share.
        #[test]
        fn counts_and_victims(ops in proptest::collection::vec((0u32..3, 0u32..4, any::<bool>()), 0..300), pct in 1u8..=100) {
            let mut s = CacheShares::new(4, 200);
            s.set_share(VolumeId(1), pct);
            let mut model = [[0u64; 4]; 3];
            for (v, c, add) in ops {
                if add {
                    s.add(VolumeId(v), RegionId(c));
                    model[v as usize][c as usize] += 1;
                } else if model[v as usize][c as usize] > 0 {
                    s.remove(VolumeId(v), RegionId(c));
                    model[v as usize][c as usize] -= 1;
                }
            }
            for v in 0..3 {
                prop_assert_eq!(s.blocks(VolumeId(v)), model[v as usize].iter().sum::<u64>());
            }
            let snaps: Vec<RegionSnapshot> = (0..4).map(|c| snap(c, u64::from(c))).collect();
            let share = (200 * u64::from(pct) / 100).max(1);
            let over = model[1].iter().sum::<u64>() > share;
            match s.victim(&snaps) {
                Some(r) => {
                    prop_assert!(over);
                    let best = model[1].iter().max().copied().unwrap_or(0);
                    prop_assert_eq!(model[1][r.0 as usize], best);
                }
                None => prop_assert!(!over || model[1].iter().all(|&n| n == 0)),
            }
        }
    }
}
