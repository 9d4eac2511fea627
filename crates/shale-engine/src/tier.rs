//! The cold tier's way back (SALSA's hybrid controller, seed 002 §IV-B): every read of
//! a block in the cold tier warms its 1 MiB extent of the volume; once an extent's heat
//! reaches `Config::promote_reads`, the blocks read from it are staged, as relocations of
//! their cold copies, into compaction's streams, which write them to fast zones with
//! their next group (or padded after `promote_linger_us`). Heat halves once as many cold
//! reads have gone by as there are extents tracked (at least `HALVE_READS_MIN`), so
//! yesterday's hot data cools.
//!
//! The way down is GC's (`mover`): with a cold tier, every block GC moves goes to a cold
//! zone.

use shale_format::{Lba, Pba, RegionId, VolumeId, VolumeUid, BLOCK_SIZE};

use crate::compaction::policy::{RegionSnapshot, VictimPolicy};

/// Blocks per extent whose reads count together (1 MiB): files are read in runs.
pub(crate) const EXTENT_SHIFT: u32 = 8;
/// Cold reads between two halvings, at least.
const HALVE_READS_MIN: u64 = 1 << 16;
/// Blocks waiting to be staged at most; reads past it promote nothing.
const PENDING_MAX: usize = 4096;

/// GC's choice among fast zones: the oldest, however full. The fast tier is a log whose
/// tail goes down: what outlived a pass through it is the coldest data there is, and
/// moving a full zone still frees a fast one (its blocks go to the cold tier). Greedy
/// would keep cold data forever (a full zone never looks worth emptying) and send
/// down the survivors of hot zones instead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Demote;

impl VictimPolicy for Demote {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        s.iter().min_by_key(|r| (r.sid, r.region)).map(|r| r.region)
    }
}

/// One volume's heat: a saturating count per extent.
#[derive(Debug, Default)]
struct VolumeHeat {
    uid: Option<VolumeUid>,
    extents: Vec<u8>,
}

/// Heat of the extents read from the cold tier, and the blocks on their way back.
#[derive(Debug, Default)]
pub(crate) struct Tier {
    heat: Vec<VolumeHeat>,
    extents: u64,
    reads: u64,
    /// Blocks read from the cold tier, hot enough to go back: (cold copy, data).
    pub pending: Vec<(Pba, Box<[u8; BLOCK_SIZE]>)>,
    /// Since when (engine clock, ns) blocks staged for promotion have waited for a
    /// group, if any do.
    pub staged_since: Option<u64>,
}

impl Tier {
    /// A read of `lba` of volume `v` (`uid`) came from the cold tier: its extent's heat
    /// after this read, which counts (`count`) or only looks (a read's later blocks
    /// in the same extent).
    pub fn warm(&mut self, v: VolumeId, uid: VolumeUid, lba: Lba, count: bool) -> u32 {
        let i = v.0 as usize;
        if self.heat.len() <= i {
            self.heat.resize_with(i + 1, VolumeHeat::default);
        }
        let h = &mut self.heat[i];
        if h.uid != Some(uid) {
            // A volume deleted and its id reused starts cold.
            self.extents -= h.extents.len() as u64;
            *h = VolumeHeat {
                uid: Some(uid),
                extents: Vec::new(),
            };
        }
        let e = (lba.0 >> EXTENT_SHIFT) as usize;
        if h.extents.len() <= e {
            self.extents += (e + 1 - h.extents.len()) as u64;
            h.extents.resize(e + 1, 0);
        }
        if !count {
            return u32::from(h.extents[e]);
        }
        h.extents[e] = h.extents[e].saturating_add(1);
        let heat = u32::from(h.extents[e]);
        self.reads += 1;
        if self.reads >= self.extents.max(HALVE_READS_MIN) {
            self.reads = 0;
            for h in &mut self.heat {
                for x in &mut h.extents {
                    *x /= 2;
                }
            }
        }
        heat
    }

    /// Queues a hot block read from `pba` for promotion, unless too many wait.
    pub fn queue(&mut self, pba: Pba, data: &[u8]) {
        if self.pending.len() >= PENDING_MAX || self.pending.iter().any(|(p, _)| *p == pba) {
            return;
        }
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        b.copy_from_slice(data);
        self.pending.push((pba, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shale_format::Sid;

    proptest! {
        /// `Demote` takes the oldest candidate (lowest SID, then region), full ones
        /// included, and nothing only when there is no candidate.
        #[test]
        fn demote_takes_the_oldest_zone_however_full(
            v in proptest::collection::vec((0u32..=100, 0u64..50), 0..20),
        ) {
            let snap: Vec<RegionSnapshot> = v
                .iter()
                .enumerate()
                .map(|(i, &(valid, sid))| RegionSnapshot {
                    region: RegionId(i as u32 + 7),
                    valid,
                    capacity: 100,
                    sid: Sid(sid),
                    close_time: 0,
                })
                .collect();
            let got = Demote.choose(&snap, 0);
            let want = snap.iter().min_by_key(|r| (r.sid, r.region)).map(|r| r.region);
            prop_assert_eq!(got, want);
            if let Some(g) = got {
                let r = snap.iter().find(|r| r.region == g).expect("a candidate");
                prop_assert!(snap.iter().all(|o| o.sid >= r.sid));
            }
        }
    }

    #[test]
    fn heat_counts_per_extent_and_cools() {
        let mut t = Tier::default();
        let (v, uid) = (VolumeId(2), VolumeUid(9));
        assert_eq!(t.warm(v, uid, Lba(0), true), 1);
        assert_eq!(
            t.warm(v, uid, Lba(255), true),
            2,
            "one extent of 256 blocks"
        );
        assert_eq!(t.warm(v, uid, Lba(256), true), 1);
        assert_eq!(t.warm(v, uid, Lba(257), false), 1, "looks without counting");
        // Another volume under the same id starts cold.
        assert_eq!(t.warm(v, VolumeUid(10), Lba(0), true), 1);
        // Saturates instead of wrapping, and halves after enough reads.
        for _ in 0..300 {
            t.warm(VolumeId(0), uid, Lba(0), true);
        }
        let before = t.warm(VolumeId(0), uid, Lba(0), true);
        assert_eq!(before, 255);
        for i in 0..HALVE_READS_MIN {
            t.warm(VolumeId(1), uid, Lba(i << EXTENT_SHIFT), true);
        }
        assert!(t.warm(VolumeId(0), uid, Lba(0), true) < 255, "halved");
    }

    #[test]
    fn the_queue_is_bounded_and_takes_a_block_once() {
        let mut t = Tier::default();
        let data = [7u8; BLOCK_SIZE];
        t.queue(Pba(5), &data);
        t.queue(Pba(5), &data);
        assert_eq!(t.pending.len(), 1);
        for i in 0..2 * PENDING_MAX as u64 {
            t.queue(Pba(100 + i), &data);
        }
        assert_eq!(t.pending.len(), PENDING_MAX);
    }
}
