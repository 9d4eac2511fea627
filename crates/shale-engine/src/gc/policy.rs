//! GC victim policies (pure).

use shale_format::RegionId;

pub use crate::compaction::policy::{RegionSnapshot, VictimPolicy};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GcPolicyKind {
    /// Fewest valid blocks.
    #[default]
    Greedy,
    /// Highest (1 - u) * age / (1 + u), u = valid / capacity, age = now - close time
    /// (the zone's, never the data's own age).
    CostBenefit,
}

impl GcPolicyKind {
    pub fn policy(self) -> Box<dyn VictimPolicy> {
        match self {
            GcPolicyKind::Greedy => Box::new(Greedy),
            GcPolicyKind::CostBenefit => Box::new(CostBenefit),
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Greedy;

impl VictimPolicy for Greedy {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        s.iter()
            .filter(|r| r.valid < r.capacity)
            .min_by_key(|r| (r.valid, r.sid, r.region))
            .map(|r| r.region)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct CostBenefit;

impl CostBenefit {
    pub fn score(r: &RegionSnapshot, now: u64) -> f64 {
        let u = f64::from(r.valid) / f64::from(r.capacity.max(1));
        let age = now.saturating_sub(r.close_time) as f64 + 1.0;
        (1.0 - u) * age / (1.0 + u)
    }
}

impl VictimPolicy for CostBenefit {
    fn choose(&self, s: &[RegionSnapshot], now: u64) -> Option<RegionId> {
        s.iter()
            .filter(|r| r.valid < r.capacity)
            .max_by(|a, b| {
                Self::score(a, now)
                    .total_cmp(&Self::score(b, now))
                    // Prefer fewer valid, then older, on equal scores.
                    .then(b.valid.cmp(&a.valid))
                    .then(b.sid.cmp(&a.sid))
            })
            .map(|r| r.region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shale_format::Sid;

    fn snaps() -> impl Strategy<Value = Vec<RegionSnapshot>> {
        proptest::collection::vec((0u32..=100, 0u64..50, 0u64..1000), 0..20).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (valid, sid, t))| RegionSnapshot {
                    region: RegionId(i as u32),
                    valid,
                    capacity: 100,
                    sid: Sid(sid),
                    close_time: t,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn never_picks_a_full_zone_and_picks_when_gain_exists(s in snaps(), now in 1000u64..5000) {
            for p in [GcPolicyKind::Greedy, GcPolicyKind::CostBenefit] {
                let c = p.policy().choose(&s, now);
                prop_assert_eq!(c.is_some(), s.iter().any(|r| r.valid < r.capacity));
                if let Some(c) = c {
                    let r = s.iter().find(|r| r.region == c).copied();
                    prop_assert!(r.is_some_and(|r| r.valid < r.capacity));
                    if p == GcPolicyKind::Greedy {
                        let v = r.map_or(0, |r| r.valid);
                        prop_assert!(s.iter().all(|o| o.valid >= v));
                    }
                }
            }
        }
    }

    #[test]
    fn cost_benefit_prefers_old_zones_at_equal_utilisation() {
        let s = [
            RegionSnapshot {
                region: RegionId(1),
                valid: 50,
                capacity: 100,
                sid: Sid(1),
                close_time: 900,
            },
            RegionSnapshot {
                region: RegionId(2),
                valid: 50,
                capacity: 100,
                sid: Sid(2),
                close_time: 100,
            },
            RegionSnapshot {
                region: RegionId(3),
                valid: 40,
                capacity: 100,
                sid: Sid(3),
                close_time: 990,
            },
        ];
        assert_eq!(CostBenefit.choose(&s, 1000), Some(RegionId(2)));
        assert_eq!(Greedy.choose(&s, 1000), Some(RegionId(3)));
    }
}
