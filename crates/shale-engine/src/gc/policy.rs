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
    /// The zone opened first (lowest SID) with anything to free. Zones are then reset
    /// in about the order they were written, so a conventional drive under zone
    /// emulation, which packs writes into its erase units in arrival order, finds
    /// its erase units emptied whole instead of copying what other zones left in them.
    Fifo,
}

impl GcPolicyKind {
    pub fn policy(self) -> Box<dyn VictimPolicy> {
        match self {
            GcPolicyKind::Greedy => Box::new(Greedy),
            GcPolicyKind::CostBenefit => Box::new(CostBenefit),
            GcPolicyKind::Fifo => Box::new(Fifo),
        }
    }

    /// The policy that suits the capacity: `Fifo` for zones emulated on a conventional
    /// drive (resetting zones in write order lets its own GC reclaim erase units
    /// without copying; docs/benchmarks.md, "GC policy"), `Greedy` on a zoned drive,
    /// which has no GC of its own to spare.
    pub fn for_capacity(zoned: bool) -> GcPolicyKind {
        if zoned {
            GcPolicyKind::Greedy
        } else {
            GcPolicyKind::Fifo
        }
    }
}

/// The candidates GC can gain anything from: zones not wholly valid.
fn freeable(s: &[RegionSnapshot]) -> impl Iterator<Item = &RegionSnapshot> {
    s.iter().filter(|r| r.valid < r.capacity)
}

#[derive(Debug, Clone, Copy)]
pub struct Greedy;

impl VictimPolicy for Greedy {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        freeable(s)
            .min_by_key(|r| (r.valid, r.sid, r.region))
            .map(|r| r.region)
    }
}

#[derive(Debug, Clone, Copy)]
pub struct CostBenefit;

impl CostBenefit {
    pub fn score(r: &RegionSnapshot, now: u64) -> f64 {
        crate::compaction::policy::cost_benefit(r, now, 0.0)
    }
}

impl VictimPolicy for CostBenefit {
    fn choose(&self, s: &[RegionSnapshot], now: u64) -> Option<RegionId> {
        freeable(s)
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

/// See [`GcPolicyKind::Fifo`].
#[derive(Debug, Clone, Copy)]
pub struct Fifo;

impl VictimPolicy for Fifo {
    fn choose(&self, s: &[RegionSnapshot], _now: u64) -> Option<RegionId> {
        freeable(s)
            .min_by_key(|r| (r.sid, r.region))
            .map(|r| r.region)
    }
}

/// A victim when zones follow different policies (`policy_of`, from the volumes
/// whose data they hold): each policy nominates its best zone among its own, and the
/// pool's policy picks among the nominees. With every zone on the pool's policy this
/// is the pool's own choice.
pub fn choose_per_policy(
    s: &[RegionSnapshot],
    now: u64,
    pool: &dyn VictimPolicy,
    policy_of: impl Fn(RegionId) -> shale_format::VolumeGc,
) -> Option<RegionId> {
    use shale_format::VolumeGc;
    let mut nominees = Vec::with_capacity(3);
    for gc in [VolumeGc::Pool, VolumeGc::Greedy, VolumeGc::CostBenefit] {
        let own: Vec<RegionSnapshot> = s
            .iter()
            .filter(|r| policy_of(r.region) == gc)
            .copied()
            .collect();
        let pick = match gc {
            VolumeGc::Pool => pool.choose(&own, now),
            VolumeGc::Greedy => Greedy.choose(&own, now),
            VolumeGc::CostBenefit => CostBenefit.choose(&own, now),
        };
        if let Some(r) = pick.and_then(|r| own.iter().find(|x| x.region == r)) {
            nominees.push(*r);
        }
    }
    pool.choose(&nominees, now)
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
        /// Per-policy choice: all on the pool's policy is the pool's choice; all on
        /// one policy of their own is that policy's choice; otherwise the pick is a
        /// candidate with something to gain, the nominee of its own group.
        #[test]
        fn per_policy_choice(s in snaps(), now in 1000u64..5000, tags in proptest::collection::vec(0u8..3, 20)) {
            use shale_format::VolumeGc;
            let pool = Greedy;
            let tag = |r: RegionId| VolumeGc::from_u8(tags[r.0 as usize % tags.len()]).unwrap();
            prop_assert_eq!(choose_per_policy(&s, now, &pool, |_| VolumeGc::Pool), pool.choose(&s, now));
            prop_assert_eq!(
                choose_per_policy(&s, now, &pool, |_| VolumeGc::CostBenefit),
                CostBenefit.choose(&s, now)
            );
            if let Some(c) = choose_per_policy(&s, now, &pool, tag) {
                let own: Vec<RegionSnapshot> = s.iter().filter(|r| tag(r.region) == tag(c)).copied().collect();
                let nominee = match tag(c) {
                    VolumeGc::Pool | VolumeGc::Greedy => Greedy.choose(&own, now),
                    VolumeGc::CostBenefit => CostBenefit.choose(&own, now),
                };
                prop_assert_eq!(Some(c), nominee);
            } else {
                prop_assert!(s.iter().all(|r| r.valid >= r.capacity));
            }
        }

        #[test]
        fn never_picks_a_full_zone_and_picks_when_gain_exists(s in snaps(), now in 1000u64..5000) {
            for p in [GcPolicyKind::Greedy, GcPolicyKind::CostBenefit, GcPolicyKind::Fifo] {
                let c = p.policy().choose(&s, now);
                prop_assert_eq!(c.is_some(), s.iter().any(|r| r.valid < r.capacity));
                if let Some(c) = c {
                    let r = s.iter().find(|r| r.region == c).copied();
                    prop_assert!(r.is_some_and(|r| r.valid < r.capacity));
                    if p == GcPolicyKind::Greedy {
                        let v = r.map_or(0, |r| r.valid);
                        prop_assert!(s.iter().all(|o| o.valid >= v));
                    }
                    if p == GcPolicyKind::Fifo {
                        // The oldest of the zones with something to free.
                        let sid = r.map_or(Sid(0), |r| r.sid);
                        prop_assert!(s.iter().all(|o| o.valid >= o.capacity || o.sid >= sid));
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
