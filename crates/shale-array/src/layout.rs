//! Where a stripe's shards live.
//!
//! An array zone `z` is zone `z + LABEL_ZONES` on every member. It is written in rows:
//! row `r` of a zone holds one stripe, `K` data units then `M` parity units of `unit`
//! bytes each, one unit per member, at `r * unit` in every member's zone, so every
//! member writes its zone sequentially, as a zoned drive needs, and never rewrites a
//! row: full-stripe writes only, no read-modify-write and no write hole. Shard `s` of
//! global row `g = z * rows_per_zone + r` lives on member `(s + g) mod n`, so parity
//! rotates across the members (and so does the busiest data position).

use std::fmt;
use std::str::FromStr;

use crate::codec::MAX_SHARDS;

/// Member zones kept for the array's own labels (zones 0 and 1 of each member): labels
/// are appended to one until it is full, then the other is reset and written, so the
/// newest label survives a cut at any point (a single zone would hold none between
/// its reset and the next append).
pub const LABEL_ZONES: u32 = 2;

/// The largest stripe (data bytes of one row): one md group of the engine.
pub const STRIPE_BYTES_MAX: u64 = 512 * 1024;

/// How an array keeps its data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Redundancy {
    /// Striped: every member holds data, nothing survives a lost member.
    None,
    /// Every member holds a whole copy.
    Mirror,
    /// Reed–Solomon, `k` data and `m` parity shards.
    Parity { k: u8, m: u8 },
}

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("redundancy {0:?}: expected none, mirror or K+M (for example 4+1)")]
    Parse(String),
    #[error("redundancy {redundancy} needs {need} members, got {got}")]
    MemberCount {
        redundancy: Redundancy,
        need: String,
        got: usize,
    },
    #[error("stripe unit {unit} bytes: {reason}")]
    Unit { unit: u64, reason: String },
    #[error("members disagree: {0}")]
    Members(String),
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::None => f.write_str("none"),
            Redundancy::Mirror => f.write_str("mirror"),
            Redundancy::Parity { k, m } => write!(f, "{k}+{m}"),
        }
    }
}

impl FromStr for Redundancy {
    type Err = LayoutError;
    fn from_str(s: &str) -> Result<Redundancy, LayoutError> {
        let bad = || LayoutError::Parse(s.to_string());
        match s.trim() {
            "none" => Ok(Redundancy::None),
            "mirror" => Ok(Redundancy::Mirror),
            t => {
                let (k, m) = t.split_once('+').ok_or_else(bad)?;
                let k: u8 = k.trim().parse().map_err(|_| bad())?;
                let m: u8 = m.trim().parse().map_err(|_| bad())?;
                if k == 0 || m == 0 || usize::from(k) + usize::from(m) > MAX_SHARDS {
                    return Err(bad());
                }
                Ok(Redundancy::Parity { k, m })
            }
        }
    }
}

impl Redundancy {
    /// (data shards, parity shards) of a row over `members` devices.
    pub fn shards(self, members: usize) -> Result<(u32, u32), LayoutError> {
        let count = |need: &str| LayoutError::MemberCount {
            redundancy: self,
            need: need.to_string(),
            got: members,
        };
        match self {
            Redundancy::None if (1..=MAX_SHARDS).contains(&members) => Ok((members as u32, 0)),
            Redundancy::None => Err(count("1 to 32")),
            Redundancy::Mirror if (2..=MAX_SHARDS).contains(&members) => {
                Ok((1, members as u32 - 1))
            }
            Redundancy::Mirror => Err(count("2 to 32")),
            Redundancy::Parity { k, m } if usize::from(k) + usize::from(m) == members => {
                Ok((u32::from(k), u32::from(m)))
            }
            Redundancy::Parity { k, m } => Err(count(&format!("exactly {}", k + m))),
        }
    }
}

/// The geometry of one array: which member holds which shard of which row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripeLayout {
    pub members: u32,
    /// Data shards per row (K).
    pub k: u32,
    /// Parity shards per row (M).
    pub m: u32,
    /// Bytes of one shard in one row, on one member.
    pub unit: u64,
    /// Rows in a zone.
    pub rows_per_zone: u64,
}

impl StripeLayout {
    /// The stripe unit for `k` data shards: the smallest multiple of `granule` (the
    /// members' indirection unit, a multiple of 4096) with which `k` units hold a
    /// [`STRIPE_BYTES_MAX`] row. When `k` does not divide the row in whole granules
    /// (3+1, 6+2, or 16 KiB granules at 8+2), the last data unit of each row is
    /// partly zero padding: every row still holds one whole engine group.
    pub fn choose_unit(k: u32, granule: u64) -> Result<u64, LayoutError> {
        if granule == 0 || !granule.is_multiple_of(4096) {
            return Err(LayoutError::Unit {
                unit: granule,
                reason: "the granule must be a non-zero multiple of 4096".into(),
            });
        }
        let k = u64::from(k.max(1));
        let unit = STRIPE_BYTES_MAX.div_ceil(k).div_ceil(granule) * granule;
        if (k - 1) * unit >= STRIPE_BYTES_MAX {
            return Err(LayoutError::Unit {
                unit: granule,
                reason: format!(
                    "{k} data shards of at least {granule} bytes leave one without data in a {STRIPE_BYTES_MAX}-byte row"
                ),
            });
        }
        Ok(unit)
    }

    /// Data bytes in one row: `K × unit`, or one [`STRIPE_BYTES_MAX`] group when the
    /// units are larger (the last data unit then ends in zero padding).
    pub fn stripe_bytes(&self) -> u64 {
        (u64::from(self.k) * self.unit).min(STRIPE_BYTES_MAX)
    }

    /// Data bytes data shard `d` holds in a row (the rest of its unit is zeros).
    pub fn shard_data_bytes(&self, d: u32) -> u64 {
        self.stripe_bytes()
            .saturating_sub(u64::from(d) * self.unit)
            .min(self.unit)
    }

    /// Shards (data then parity) per row.
    pub fn shards(&self) -> u32 {
        self.k + self.m
    }

    fn global_row(&self, zone: u32, row: u64) -> u64 {
        u64::from(zone) * self.rows_per_zone + row
    }

    /// The member holding shard `shard` of row `row` of array zone `zone`.
    pub fn member_of(&self, zone: u32, row: u64, shard: u32) -> u32 {
        ((u64::from(shard) + self.global_row(zone, row)) % u64::from(self.members)) as u32
    }

    /// The shard member `member` holds in row `row` of zone `zone` (the inverse of
    /// [`Self::member_of`]); `None` if it holds none (more members than shards).
    pub fn shard_on(&self, zone: u32, row: u64, member: u32) -> Option<u32> {
        let n = u64::from(self.members);
        let g = self.global_row(zone, row) % n;
        let s = ((u64::from(member) + n - g) % n) as u32;
        (s < self.shards()).then_some(s)
    }

    /// (row, data shard, offset in the unit) of a byte offset inside a zone.
    pub fn locate(&self, rel: u64) -> (u64, u32, u64) {
        let s = self.stripe_bytes();
        let row = rel / s;
        let in_row = rel % s;
        (row, (in_row / self.unit) as u32, in_row % self.unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn redundancy_parses_and_prints() {
        for s in ["none", "mirror", "4+1", "8+3", "1+1"] {
            let r: Redundancy = s.parse().expect(s);
            assert_eq!(r.to_string(), s);
        }
        for s in [
            "", "raid5", "4+", "+1", "0+1", "4+0", "30+3", "4+1+1", "-1+2", "300+1",
        ] {
            assert!(s.parse::<Redundancy>().is_err(), "{s}");
        }
    }

    #[test]
    fn member_counts_follow_the_redundancy() {
        assert_eq!(Redundancy::None.shards(3), Ok((3, 0)));
        assert_eq!(Redundancy::Mirror.shards(2), Ok((1, 1)));
        assert!(Redundancy::Mirror.shards(1).is_err());
        let p = Redundancy::Parity { k: 4, m: 1 };
        assert_eq!(p.shards(5), Ok((4, 1)));
        assert!(p.shards(4).is_err());
        assert!(p.shards(6).is_err());
    }

    #[test]
    fn units_fill_a_group_in_whole_granules() {
        assert_eq!(StripeLayout::choose_unit(4, 16384), Ok(128 * 1024));
        assert_eq!(StripeLayout::choose_unit(8, 16384), Ok(64 * 1024));
        // 6 × 96 KiB: the sixth unit holds 32 KiB of data and 64 KiB of padding.
        assert_eq!(StripeLayout::choose_unit(6, 16384), Ok(96 * 1024));
        // 43 blocks: the third unit holds 42 blocks of data and one of padding.
        assert_eq!(StripeLayout::choose_unit(3, 4096), Ok(172 * 1024));
        assert_eq!(StripeLayout::choose_unit(1, 4096), Ok(512 * 1024));
        assert!(StripeLayout::choose_unit(32, 65536).is_err());
        assert!(StripeLayout::choose_unit(4, 1000).is_err());
    }

    proptest! {
        /// Every member holds at most one shard of a row, every shard has one member,
        /// and `shard_on` inverts `member_of`; over many rows parity visits every member.
        #[test]
        fn placement_is_a_bijection_per_row(n in 1u32..12, extra in 0u32..3, zone in 0u32..50, row in 0u64..1000) {
            let m = extra.min(n - 1);
            let l = StripeLayout { members: n, k: n - m, m, unit: 4096, rows_per_zone: 97 };
            let mut seen = vec![false; n as usize];
            for s in 0..l.shards() {
                let mem = l.member_of(zone, row, s);
                prop_assert!(!seen[mem as usize]);
                seen[mem as usize] = true;
                prop_assert_eq!(l.shard_on(zone, row, mem), Some(s));
            }
            let parity_homes: std::collections::HashSet<u32> =
                (0..u64::from(n)).map(|r| l.member_of(zone, row + r, l.k)).collect();
            if m > 0 {
                prop_assert_eq!(parity_homes.len(), n as usize);
            }
        }

        #[test]
        fn locate_covers_each_byte_once(k in 1u32..9, units in 1u64..8, rel in 0u64..10_000_000) {
            let l = StripeLayout { members: k + 1, k, m: 1, unit: units * 4096, rows_per_zone: 10 };
            let (row, d, off) = l.locate(rel);
            prop_assert!(d < k && off < l.unit);
            prop_assert_eq!(row * l.stripe_bytes() + u64::from(d) * l.unit + off, rel);
        }

        /// A chosen unit gives rows of exactly one group, each data shard holding
        /// some data, the shards' data adding up to the row, and bytes landing in
        /// the data part of their shard.
        #[test]
        fn padded_rows_hold_one_group(k in 1u32..=32, g in 1u64..5, rel in 0u64..10_000_000) {
            let granule = g * 4096;
            let Ok(unit) = StripeLayout::choose_unit(k, granule) else {
                return Ok(());
            };
            prop_assert!(unit.is_multiple_of(granule));
            let l = StripeLayout { members: k + 1, k, m: 1, unit, rows_per_zone: 10 };
            prop_assert_eq!(l.stripe_bytes(), STRIPE_BYTES_MAX);
            let total: u64 = (0..k).map(|d| l.shard_data_bytes(d)).sum();
            prop_assert_eq!(total, STRIPE_BYTES_MAX);
            prop_assert!((0..k).all(|d| l.shard_data_bytes(d) > 0));
            let (_, d, off) = l.locate(rel);
            prop_assert!(off < l.shard_data_bytes(d));
        }
    }
}
