//! Offset generators: which block-size slot of a volume the next operation touches.
//!
//! A volume of `volume_bytes` holds `slots = volume_bytes / bs` slots (a trailing partial
//! slot is never touched, as in fio). Each generator owns its random streams.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution as _;

use crate::randmap::RandomMap;
use crate::rng::Taus88;
use crate::spec::{Distribution, ZonedSpec};
use crate::zipf::Zipf;

/// Sub-stream ids under a tenant's seed (fio keeps a separate state per purpose too).
pub(crate) mod stream_id {
    pub const OFFSET: u64 = 1;
    pub const ZONE: u64 = 2;
    pub const RWMIX: u64 = 3;
}

#[derive(Debug, Clone)]
pub(crate) enum OffsetGen {
    Seq {
        next: u64,
        slots: u64,
    },
    Uniform {
        rng: Taus88,
        map: RandomMap,
    },
    Random {
        rng: Taus88,
        slots: u64,
    },
    Zipf(Zipf),
    Zoned {
        zone_rng: Taus88,
        rng: Taus88,
        /// For each draw `v` in 1..=100, the zone's `(first_slot, slots)`.
        by_draw: Box<[(u64, u64); 100]>,
    },
    Drift(Box<Drift>),
}

/// `drift:θ`: zipf ranks (rejection-inversion sampling, any θ > 0) placed on
/// blocks by a bijection `rank -> (a·rank + b) mod slots` with `gcd(a, slots) = 1`,
/// `a` and `b` drawn anew every `period` operations: the hot set moves.
#[derive(Debug, Clone)]
pub(crate) struct Drift {
    zipf: rand_distr::Zipf<f64>,
    rng: ChaCha8Rng,
    slots: u64,
    period: u64,
    left: u64,
    a: u64,
    b: u64,
}

impl Drift {
    /// Operations between two hot sets: 1/8 of the volume's blocks.
    pub(crate) const PERIOD_DIVISOR: u64 = 8;

    fn new(slots: u64, theta: f64, seed: u64) -> Drift {
        let slots = slots.max(1);
        Drift {
            // θ and slots were validated (θ > 0, slots >= 1).
            zipf: rand_distr::Zipf::new(slots, theta)
                .unwrap_or_else(|_| unreachable!("validated zipf parameters")),
            rng: ChaCha8Rng::seed_from_u64(seed),
            slots,
            period: (slots / Self::PERIOD_DIVISOR).max(1),
            left: 0,
            a: 1,
            b: 0,
        }
    }

    fn redraw(&mut self) {
        self.b = self.rng.gen_range(0..self.slots);
        self.a = loop {
            let a = self.rng.gen_range(1..self.slots.max(2));
            if gcd(a, self.slots) == 1 {
                break a;
            }
        };
        self.left = self.period;
    }

    /// Where rank `rank` (0-based) lands in the current hot set.
    fn place(&self, rank: u64) -> u64 {
        ((u128::from(self.a) * u128::from(rank) + u128::from(self.b)) % u128::from(self.slots))
            as u64
    }

    fn next_slot(&mut self) -> u64 {
        if self.left == 0 {
            self.redraw();
        }
        self.left -= 1;
        let rank = (self.zipf.sample(&mut self.rng) as u64).clamp(1, self.slots) - 1;
        self.place(rank)
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl OffsetGen {
    /// `slots >= 1` (checked by the configuration).
    pub(crate) fn new(dist: &Distribution, slots: u64, tenant_seed: u64) -> OffsetGen {
        let rng = Taus88::from_seed(tenant_seed, stream_id::OFFSET);
        match dist {
            Distribution::Seq => OffsetGen::Seq { next: 0, slots },
            Distribution::Uniform => OffsetGen::Uniform {
                rng,
                map: RandomMap::new(slots),
            },
            Distribution::Random => OffsetGen::Random { rng, slots },
            Distribution::Zipf { theta } => OffsetGen::Zipf(Zipf::new(slots, *theta, rng)),
            Distribution::Zoned(spec) => OffsetGen::Zoned {
                zone_rng: Taus88::from_seed(tenant_seed, stream_id::ZONE),
                rng,
                by_draw: zone_table(spec, slots),
            },
            Distribution::Drift { theta } => OffsetGen::Drift(Box::new(Drift::new(
                slots,
                *theta,
                tenant_seed ^ (stream_id::OFFSET << 56),
            ))),
        }
    }

    pub(crate) fn next_slot(&mut self) -> u64 {
        match self {
            OffsetGen::Seq { next, slots } => {
                let s = *next;
                *next = if s + 1 >= *slots { 0 } else { s + 1 };
                s
            }
            OffsetGen::Uniform { rng, map } => {
                if map.is_full() {
                    // A pass is complete: fio resets the map and keeps going (loops or
                    // time_based).
                    map.reset();
                }
                let drawn = rng.below(map.len());
                let b = if map.is_set(drawn) {
                    // Not full, so a free block exists.
                    map.next_free(drawn).unwrap_or(drawn)
                } else {
                    drawn
                };
                map.set(b);
                b
            }
            OffsetGen::Random { rng, slots } => rng.below(*slots),
            OffsetGen::Zipf(z) => z.next_block(),
            OffsetGen::Zoned {
                zone_rng,
                rng,
                by_draw,
            } => {
                let v = zone_rng.between(1, 100);
                let (first, len) = by_draw[(v - 1) as usize];
                first + rng.below(len)
            }
            OffsetGen::Drift(d) => d.next_slot(),
        }
    }
}

/// fio's `zone_state_index`: draw `v` in 1..=100 selects the zone whose cumulative access
/// percentage covers `v`; that zone spans `[stotal·n/100, stotal·n/100 + n·(send−stotal)/100)`
/// with integer arithmetic as in fio.
fn zone_table(spec: &ZonedSpec, slots: u64) -> Box<[(u64, u64); 100]> {
    let mut table = Box::new([(0u64, 0u64); 100]);
    let mut access_prev = 0usize;
    let mut range_prev = 0u64;
    for zone in spec.zones() {
        let range_end = range_prev + u64::from(zone.range_pct);
        let first = range_prev * slots / 100;
        let len = slots * (range_end - range_prev) / 100;
        let access_end = access_prev + usize::from(zone.access_pct);
        for entry in table.iter_mut().take(access_end).skip(access_prev) {
            *entry = (first, len);
        }
        access_prev = access_end;
        range_prev = range_end;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(d: &str, slots: u64, seed: u64) -> OffsetGen {
        OffsetGen::new(&d.parse().expect("spec"), slots, seed)
    }

    #[test]
    fn seq_wraps() {
        let mut g = gen("seq", 3, 0);
        let v: Vec<u64> = (0..7).map(|_| g.next_slot()).collect();
        assert_eq!(v, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn uniform_writes_every_block_exactly_once_per_pass() {
        let slots = 10_007;
        let mut g = gen("uniform", slots, 99);
        for pass in 0..3 {
            let mut seen = vec![false; slots as usize];
            for _ in 0..slots {
                let s = g.next_slot();
                assert!(!seen[s as usize], "pass {pass}: slot {s} twice");
                seen[s as usize] = true;
            }
            assert!(seen.iter().all(|&x| x), "pass {pass} missed a slot");
        }
    }

    /// The signature of fio's next-free fallback: a free block right after written ones
    /// inherits their chance of being drawn, so gaps fill from their low end and
    /// neighbouring blocks are written in ascending order far more often than the 50% a
    /// random permutation gives -- almost always among the last blocks of a pass.
    #[test]
    fn uniform_fills_gaps_in_ascending_order() {
        let slots = 100_000u64;
        let mut g = gen("uniform", slots, 5);
        let mut rank = vec![0u64; slots as usize];
        for i in 0..slots {
            rank[g.next_slot() as usize] = i;
        }
        let pairs = 1..slots as usize;
        let ascending = pairs.clone().filter(|&b| rank[b] > rank[b - 1]).count();
        let overall = ascending as f64 / (slots - 1) as f64;
        assert!(
            (0.58..0.70).contains(&overall),
            "ascending neighbours {overall}"
        );
        let tail_start = slots * 9 / 10;
        let tail: Vec<usize> = pairs
            .filter(|&b| rank[b] >= tail_start && rank[b - 1] >= tail_start)
            .collect();
        let tail_asc =
            tail.iter().filter(|&&b| rank[b] > rank[b - 1]).count() as f64 / tail.len() as f64;
        assert!(
            tail_asc > 0.85,
            "ascending neighbours in the tail {tail_asc}"
        );
    }

    #[test]
    fn random_repeats_blocks_within_a_pass() {
        let slots = 10_000u64;
        let mut g = gen("random", slots, 1);
        let mut seen = vec![false; slots as usize];
        for _ in 0..slots {
            seen[g.next_slot() as usize] = true;
        }
        let covered = seen.iter().filter(|&&x| x).count() as f64 / slots as f64;
        // 1 - 1/e of the blocks are touched by n independent draws.
        assert!((0.60..0.66).contains(&covered), "coverage {covered}");
    }

    #[test]
    fn zoned_sends_each_share_to_its_range() {
        let slots = 1000u64;
        let mut g = gen("zoned:60/10:30/20:10/70", slots, 3);
        let mut counts = [0u32; 3];
        let n = 100_000;
        for _ in 0..n {
            let s = g.next_slot();
            assert!(s < slots);
            let zone = if s < 100 {
                0
            } else if s < 300 {
                1
            } else {
                2
            };
            counts[zone] += 1;
        }
        let share = |c: u32| f64::from(c) / f64::from(n);
        assert!((share(counts[0]) - 0.6).abs() < 0.01, "{counts:?}");
        assert!((share(counts[1]) - 0.3).abs() < 0.01, "{counts:?}");
        assert!((share(counts[2]) - 0.1).abs() < 0.01, "{counts:?}");
    }

    #[test]
    fn zoned_leaves_unlisted_range_untouched() {
        let mut g = gen("zoned:100/25", 400, 3);
        for _ in 0..10_000 {
            assert!(g.next_slot() < 100);
        }
    }

    #[test]
    fn every_generator_stays_in_range_on_tiny_volumes() {
        for d in [
            "seq",
            "uniform",
            "random",
            "zipf:1.2",
            "zipf:0.5",
            "zoned:90/10:10/90",
            "drift:1",
            "drift:0.3",
        ] {
            for slots in [1u64, 2, 3, 65] {
                let mut g = gen(d, slots, 8);
                for _ in 0..500 {
                    let s = g.next_slot();
                    assert!(s < slots, "{d} slots {slots}: {s}");
                }
            }
        }
    }

    /// Counts of each block over the next `n` operations.
    fn counts(g: &mut OffsetGen, slots: u64, n: u64) -> Vec<u32> {
        let mut c = vec![0u32; slots as usize];
        for _ in 0..n {
            c[g.next_slot() as usize] += 1;
        }
        c
    }

    /// The `k` most accessed blocks.
    fn hottest(c: &[u32], k: usize) -> std::collections::BTreeSet<usize> {
        let mut order: Vec<usize> = (0..c.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(c[i]));
        order.into_iter().take(k).collect()
    }

    #[test]
    fn drift_is_skewed_within_a_period_and_moves_between_periods() {
        let slots = 80_000u64;
        let period = slots / Drift::PERIOD_DIVISOR;
        let mut g = gen("drift:1", slots, 5);
        let first = counts(&mut g, slots, period);
        let second = counts(&mut g, slots, period);
        // θ = 1 over 80,000 blocks: the top 1% of ranks take ~60% of the draws.
        let top = hottest(&first, 800);
        let share: u32 = top.iter().map(|&i| first[i]).sum();
        assert!(
            f64::from(share) > 0.5 * period as f64,
            "top 1% took {share} of {period}"
        );
        // The next period's hot set is elsewhere.
        let next_top = hottest(&second, 800);
        let kept = top.intersection(&next_top).count();
        assert!(kept < 80, "{kept} of the 800 hottest blocks stayed hot");
    }

    #[test]
    fn drift_places_ranks_one_to_one_and_replays_by_seed() {
        for slots in [1u64, 2, 12, 97, 4096] {
            let mut d = Drift::new(slots, 1.0, 3);
            for _ in 0..4 {
                d.redraw();
                let mut seen: Vec<u64> = (0..slots).map(|r| d.place(r)).collect();
                seen.sort_unstable();
                seen.dedup();
                assert_eq!(seen.len() as u64, slots, "slots {slots}: not a bijection");
            }
        }
        let run = |seed| {
            let mut g = gen("drift:0.8", 5_000, seed);
            (0..2_000).map(|_| g.next_slot()).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }
}
