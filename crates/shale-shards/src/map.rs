//! Which shard owns which bytes of a volume.
//!
//! A volume's bytes are cut into granules of `granule` bytes; granules are dealt to
//! the shards in groups of `shards`: group `k` (granules `k·n .. k·n + n`) gives each
//! shard exactly one granule, rotated by a hash of `k`. So every shard owns the same
//! share of every volume (a hot region larger than a group spreads over all of them,
//! and a stride of `n` granules does not land on one shard as plain striping would),
//! and a shard's granules, in volume order, are its own dense address space: shard
//! `s` keeps group `k`'s granule at local granule `k`.
//!
//! Consequences the router relies on:
//! - local order follows volume order, so any byte range of a volume is, on each
//!   shard, one contiguous local range (empty or not): a request becomes at most one
//!   request per shard;
//! - a shard's slice of a volume of `size` bytes is exactly the bytes below `size` it
//!   owns ([`ShardMap::local_size`]); the slices add up to `size`, and a byte is
//!   inside the volume exactly when its local address is inside its shard's slice.

use std::ops::Range;

/// Granule size unless configured: a 64 KiB request aligned to it reaches one shard,
/// and a hot set of a few MiB already spreads over every shard.
pub const GRANULE_BYTES_DEFAULT: u64 = 64 << 10;

/// The deal of a volume's granules over `shards` shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardMap {
    shards: u64,
    granule: u64,
}

/// A piece of a request that one shard serves: `len` bytes at `at` in the request
/// (from its offset), at `local` in that shard's slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub shard: usize,
    pub at: u64,
    pub local: u64,
    pub len: u64,
}

impl ShardMap {
    /// `shards` >= 1 and `granule` a positive multiple of 4096 (whole blocks stay on
    /// one shard).
    pub fn new(shards: usize, granule: u64) -> Option<ShardMap> {
        (shards >= 1 && granule >= 4096 && granule.is_multiple_of(4096)).then_some(ShardMap {
            shards: shards as u64,
            granule,
        })
    }

    pub fn shards(&self) -> usize {
        self.shards as usize
    }

    pub fn granule(&self) -> u64 {
        self.granule
    }

    /// The rotation of group `k`: its first granule goes to this shard.
    fn rotation(&self, k: u64) -> u64 {
        if self.shards == 1 {
            return 0;
        }
        // splitmix64's finaliser: cheap and well mixed.
        let mut z = k.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % self.shards
    }

    /// The shard owning byte `offset` of a volume, and its local address there.
    pub fn locate(&self, offset: u64) -> (usize, u64) {
        let g = offset / self.granule;
        let (k, pos) = (g / self.shards, g % self.shards);
        let shard = (pos + self.rotation(k)) % self.shards;
        (shard as usize, k * self.granule + offset % self.granule)
    }

    /// The volume address of `local` in shard `shard`'s slice.
    pub fn global(&self, shard: usize, local: u64) -> u64 {
        let k = local / self.granule;
        let pos = (shard as u64 + self.shards - self.rotation(k)) % self.shards;
        (k * self.shards + pos) * self.granule + local % self.granule
    }

    /// Bytes of a volume of `size` bytes that shard `shard` owns (its slice's size).
    pub fn local_size(&self, shard: usize, size: u64) -> u64 {
        let group = self.granule * self.shards;
        let (k, rem) = (size / group, size % group);
        let pos = (shard as u64 + self.shards - self.rotation(k)) % self.shards;
        k * self.granule + rem.saturating_sub(pos * self.granule).min(self.granule)
    }

    /// The pieces of `[offset, offset + len)`, in volume order: one per granule
    /// touched (a piece never crosses a granule).
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let end = offset.saturating_add(len);
        let mut at = offset;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let (shard, local) = self.locate(at);
            let n = (self.granule - at % self.granule).min(end - at);
            let p = Piece {
                shard,
                at: at - offset,
                local,
                len: n,
            };
            at += n;
            Some(p)
        })
    }

    /// Each shard's local range of `[offset, offset + len)` (empty where it owns none
    /// of it): contiguous, by the deal's construction.
    pub fn ranges(&self, offset: u64, len: u64) -> Vec<Range<u64>> {
        let mut r: Vec<Option<Range<u64>>> = vec![None; self.shards()];
        for p in self.pieces(offset, len) {
            let e = &mut r[p.shard];
            match e {
                None => *e = Some(p.local..p.local + p.len),
                Some(x) => {
                    debug_assert_eq!(x.end, p.local, "a shard's pieces are contiguous");
                    x.end = p.local + p.len;
                }
            }
        }
        r.into_iter().map(|x| x.unwrap_or(0..0)).collect()
    }

    /// Whether `[offset, offset + len)` lies in one granule (one shard serves it
    /// whole, at one local address: the common small request).
    pub fn single(&self, offset: u64, len: u64) -> Option<(usize, u64)> {
        (len > 0 && offset / self.granule == (offset + len - 1) / self.granule)
            .then(|| self.locate(offset))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn map(shards: usize, granule_blocks: u64) -> ShardMap {
        ShardMap::new(shards, granule_blocks * 4096).unwrap()
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(ShardMap::new(0, 65536).is_none());
        assert!(ShardMap::new(2, 0).is_none());
        assert!(ShardMap::new(2, 1000).is_none());
        assert!(ShardMap::new(2, 6000).is_none());
    }

    #[test]
    fn one_shard_is_the_identity() {
        let m = map(1, 16);
        for off in [0, 1, 4095, 65536, 1 << 40] {
            assert_eq!(m.locate(off), (0, off));
            assert_eq!(m.global(0, off), off);
        }
        assert_eq!(m.local_size(0, 12345 * 4096), 12345 * 4096);
    }

    #[test]
    fn every_group_gives_each_shard_one_granule() {
        for n in [2, 3, 4, 7] {
            let m = map(n, 1);
            for k in 0..500u64 {
                let mut seen = vec![false; n];
                for pos in 0..n as u64 {
                    let (s, local) = m.locate((k * n as u64 + pos) * 4096);
                    assert!(!seen[s], "group {k} gave shard {s} two granules");
                    seen[s] = true;
                    assert_eq!(local, k * 4096);
                }
            }
        }
    }

    /// Granules at a stride of the shard count do not all land on one shard.
    #[test]
    fn a_stride_of_the_shard_count_spreads() {
        let m = map(4, 16);
        let mut per = [0u32; 4];
        for k in 0..4000u64 {
            per[m.locate(k * 4 * 65536).0] += 1;
        }
        assert!(per.iter().all(|&c| (800..1200).contains(&c)), "{per:?}");
    }

    proptest! {
        #[test]
        fn locate_and_global_are_inverse(
            n in 1usize..9, gb in 1u64..64, off in 0u64..(1 << 44),
        ) {
            let m = map(n, gb);
            let (s, local) = m.locate(off);
            prop_assert!(s < n);
            prop_assert_eq!(m.global(s, local), off);
        }

        /// The slices add up to the volume, and a byte is inside the volume exactly
        /// when its local address is inside its shard's slice.
        #[test]
        fn slices_partition_the_volume(
            n in 1usize..9, gb in 1u64..8, blocks in 1u64..5000, probe in 0u64..6000,
        ) {
            let m = map(n, gb);
            let size = blocks * 4096;
            let total: u64 = (0..n).map(|s| m.local_size(s, size)).sum();
            prop_assert_eq!(total, size);
            let off = probe * 4096;
            let (s, local) = m.locate(off);
            prop_assert_eq!(off < size, local < m.local_size(s, size));
        }

        /// Pieces cover the range in order without gaps, each inside one granule,
        /// and each shard's pieces are one contiguous local range.
        #[test]
        fn pieces_cover_the_range(
            n in 1usize..9, gb in 1u64..8, off in 0u64..(1 << 30), len in 1u64..(1 << 22),
        ) {
            let m = map(n, gb);
            let mut next = 0;
            for p in m.pieces(off, len) {
                prop_assert_eq!(p.at, next);
                prop_assert_eq!(m.locate(off + p.at), (p.shard, p.local));
                prop_assert_eq!(p.local / m.granule(), (p.local + p.len - 1) / m.granule());
                next += p.len;
            }
            prop_assert_eq!(next, len);
            let ranges = m.ranges(off, len);
            prop_assert_eq!(ranges.iter().map(|r| r.end - r.start).sum::<u64>(), len);
            if let Some((s, local)) = m.single(off, len) {
                prop_assert_eq!(ranges[s].clone(), local..local + len);
            }
        }
    }
}
