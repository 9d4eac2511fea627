//! Victim choice as a pure function of a snapshot.

use shale_format::{RegionId, Sid};

/// What a policy sees of a candidate region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegionSnapshot {
    pub region: RegionId,
    pub valid: u32,
    /// Data blocks the region can hold.
    pub capacity: u32,
    pub sid: Sid,
    /// Engine clock when the region closed.
    pub close_time: u64,
}

/// Chooses a victim among candidates (all closed and eligible).
pub trait VictimPolicy: Send + std::fmt::Debug {
    fn choose(&self, snapshot: &[RegionSnapshot], now: u64) -> Option<RegionId>;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CompactionPolicyKind {
    /// The oldest closed chunk (lowest SID), as SPDK FTL does: every block gets the
    /// longest time in the cache to be overwritten.
    #[default]
    FifoOldestClosed,
    /// Fewest valid blocks (the paper's wording). Starves on skew: chunks full of cold
    /// data are never picked and the newest chunk is compacted as soon as it closes.
    FewestValid,
    /// Highest (1 - u + 1/16) * age / (1 + u): space freed weighed by the chunk's age
    /// since it closed, so a chunk whose data is still being overwritten waits, and a
    /// chunk of cold data (u = 1) still ages into a choice.
    CostBenefit,
}

impl CompactionPolicyKind {
    pub fn policy(self) -> Box<dyn VictimPolicy> {
        match self {
            CompactionPolicyKind::FifoOldestClosed => Box::new(FifoOldestClosed),
            CompactionPolicyKind::FewestValid => Box::new(FewestValid),
            CompactionPolicyKind::CostBenefit => Box::new(CostBenefit),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct FifoOldestClosed;

impl VictimPolicy for FifoOldestClosed {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        s.iter().min_by_key(|r| (r.sid, r.region)).map(|r| r.region)
    }
}

/// Fewest valid blocks; ties to the oldest.
#[derive(Debug, Clone, Copy)]
pub struct FewestValid;

impl VictimPolicy for FewestValid {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        s.iter()
            .min_by_key(|r| (r.valid, r.sid, r.region))
            .map(|r| r.region)
    }
}

/// See [`CompactionPolicyKind::CostBenefit`]; ties to the oldest.
#[derive(Debug, Clone, Copy)]
pub struct CostBenefit;

impl CostBenefit {
    pub fn score(r: &RegionSnapshot, now: u64) -> f64 {
        cost_benefit(r, now, 1.0 / 16.0)
    }
}

/// (1 - u + `floor`) * age / (1 + u): the space a region frees for the cost of moving
/// what it still holds, weighed by its age since it closed (u = valid / capacity).
/// A `floor` above 0 lets a region with nothing to free age into a choice.
pub(crate) fn cost_benefit(r: &RegionSnapshot, now: u64, floor: f64) -> f64 {
    let u = f64::from(r.valid) / f64::from(r.capacity.max(1));
    let age = now.saturating_sub(r.close_time) as f64 + 1.0;
    (1.0 - u + floor) * age / (1.0 + u)
}

impl VictimPolicy for CostBenefit {
    fn choose(&self, s: &[RegionSnapshot], now: u64) -> Option<RegionId> {
        s.iter()
            .max_by(|a, b| {
                Self::score(a, now)
                    .total_cmp(&Self::score(b, now))
                    .then(b.sid.cmp(&a.sid))
            })
            .map(|r| r.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn snaps() -> impl Strategy<Value = Vec<RegionSnapshot>> {
        proptest::collection::vec((0u32..100, 0u32..500, 0u64..50, 0u64..1000), 0..20).prop_map(
            |v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (valid, _, sid, t))| RegionSnapshot {
                        region: RegionId(i as u32),
                        valid,
                        capacity: 100,
                        sid: Sid(sid),
                        close_time: t,
                    })
                    .collect()
            },
        )
    }

    proptest! {
        #[test]
        fn choices_are_candidates_and_extreme(s in snaps()) {
            for p in [
                CompactionPolicyKind::FifoOldestClosed,
                CompactionPolicyKind::FewestValid,
                CompactionPolicyKind::CostBenefit,
            ] {
                let c = p.policy().choose(&s, 1000);
                prop_assert_eq!(c.is_some(), !s.is_empty());
                if let Some(c) = c {
                    let r = s.iter().find(|r| r.region == c);
                    prop_assert!(r.is_some());
                    let r = r.copied().unwrap_or(s[0]);
                    match p {
                        CompactionPolicyKind::FifoOldestClosed => prop_assert!(s.iter().all(|o| o.sid >= r.sid)),
                        CompactionPolicyKind::FewestValid => prop_assert!(s.iter().all(|o| o.valid >= r.valid)),
                        CompactionPolicyKind::CostBenefit => prop_assert!(s
                            .iter()
                            .all(|o| CostBenefit::score(o, 1000) <= CostBenefit::score(&r, 1000))),
                    }
                }
            }
        }
    }

    #[test]
    fn cost_benefit_lets_a_chunk_still_being_overwritten_wait_and_cold_chunks_age() {
        let snap = |region, valid, close_time| RegionSnapshot {
            region: RegionId(region),
            valid,
            capacity: 100,
            sid: Sid(u64::from(region)),
            close_time,
        };
        // A young chunk half overwritten waits for an old one with a quarter freed.
        let s = [snap(1, 75, 0), snap(2, 50, 900)];
        assert_eq!(CostBenefit.choose(&s, 1000), Some(RegionId(1)));
        // A chunk of cold data (nothing overwritten) is still chosen once old enough.
        let s = [snap(1, 100, 0), snap(2, 50, 990)];
        assert_eq!(CostBenefit.choose(&s, 1000), Some(RegionId(1)));
        assert_eq!(CostBenefit.choose(&s, 10), Some(RegionId(2)));
    }
}
