//! What a simulated drive looks like inside: mapping unit, erase unit, spare space and
//! cleaning policy, and the geometry derived from them for a given capacity.

use crate::FlashSimError;

/// Largest indirection unit accepted (real drives use 4..64 KiB).
pub const IU_BYTES_MAX: u64 = 1 << 20;

/// Most indirection units one model maps (tables are `u32`-indexed, `u32::MAX` is
/// the "unmapped" marker).
pub const IU_COUNT_MAX: u64 = (u32::MAX - 1) as u64;

/// How the drive picks the superblock it cleans next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GcPolicy {
    /// Fewest valid IUs (O(1) via buckets of valid counts).
    Greedy,
    /// Oldest closed superblock, whatever it holds.
    Fifo,
    /// Highest `(1 - u) * age / (1 + u)`, age = IUs programmed since the superblock
    /// closed (O(superblocks) per choice).
    CostBenefit,
}

/// Internal spare space.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Spare {
    /// `Sf` = spare / physical, so physical = logical / (1 - Sf), in whole superblocks
    /// (rounded to nearest), plus the reserve superblocks.
    Factor(f64),
    /// Total NAND bytes, reserve included (rounded down to whole superblocks).
    PhysicalBytes(u64),
}

/// Erase-unit (superblock) size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Superblock {
    Bytes(u64),
    /// Logical capacity / divisor, rounded to the nearest IU multiple (at least one
    /// IU) -- how large drives scale: the P5316's 67.4 GB superblock is 1/228 of it.
    CapacityDivisor(u64),
}

/// Configuration of a conventional drive's FTL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FtlConfig {
    /// Mapping granularity; writes that do not cover whole IUs are read-modify-written.
    pub iu_bytes: u64,
    pub superblock: Superblock,
    pub spare: Spare,
    pub gc_policy: GcPolicy,
    /// Host writes and GC copies fill separate open superblocks (as real drives do:
    /// it keeps GC-surviving, colder data apart from fresh writes).
    pub separate_gc_stream: bool,
    /// Superblocks added on top of the spare space for the ones that can never hold
    /// invalid data when GC picks a victim: the free superblocks GC keeps in hand (1.5
    /// on average, see ftl.rs) and the empty half of the GC open superblock. With the
    /// default of 2, the spare GC works with stays `Sf` however few superblocks the
    /// drive has, which is what the analytic model (and any spare factor inferred from
    /// it) assumes.
    pub reserve_superblocks: u32,
}

impl FtlConfig {
    /// A greedy, separate-stream FTL with the given IU, superblock and spare factor.
    pub fn new(iu_bytes: u64, superblock: Superblock, spare_factor: f64) -> FtlConfig {
        FtlConfig {
            iu_bytes,
            superblock,
            spare: Spare::Factor(spare_factor),
            gc_policy: GcPolicy::Greedy,
            separate_gc_stream: true,
            reserve_superblocks: 2,
        }
    }

    pub fn with_policy(mut self, policy: GcPolicy) -> FtlConfig {
        self.gc_policy = policy;
        self
    }

    /// Derives the geometry for a drive of `logical_bytes`.
    pub fn geometry(&self, logical_bytes: u64) -> Result<Geometry, FlashSimError> {
        let iu = self.iu_bytes;
        if !iu.is_power_of_two() || !(512..=IU_BYTES_MAX).contains(&iu) {
            return Err(FlashSimError::IuSize { iu_bytes: iu });
        }
        if logical_bytes == 0 || !logical_bytes.is_multiple_of(iu) {
            return Err(FlashSimError::CapacityNotIuMultiple {
                capacity_bytes: logical_bytes,
                iu_bytes: iu,
            });
        }
        let iu_count = logical_bytes / iu;
        let too_many = |count: u64| FlashSimError::TooManyIus {
            capacity_bytes: logical_bytes,
            iu_count: count,
            max: IU_COUNT_MAX,
        };
        if iu_count > IU_COUNT_MAX {
            return Err(too_many(iu_count));
        }
        let ius_per_superblock = match self.superblock {
            Superblock::Bytes(b) => {
                if b == 0 || !b.is_multiple_of(iu) {
                    return Err(FlashSimError::SuperblockSize {
                        superblock_bytes: b,
                        iu_bytes: iu,
                    });
                }
                b / iu
            }
            Superblock::CapacityDivisor(d) => {
                if d == 0 {
                    return Err(FlashSimError::SuperblockDivisor { divisor: d });
                }
                ((iu_count + d / 2) / d).max(1)
            }
        };
        if ius_per_superblock > IU_COUNT_MAX {
            return Err(too_many(ius_per_superblock));
        }
        let reserve = u64::from(self.reserve_superblocks);
        // GC always finds a victim with an invalid IU once more superblocks exist than
        // the valid data fills plus the two open ones and the free one (see ftl.rs).
        let min_blocks = iu_count / ius_per_superblock + 4;
        let superblocks = match self.spare {
            Spare::Factor(sf) => {
                if !(0.0..=0.9).contains(&sf) {
                    return Err(FlashSimError::SpareFactor { spare_factor: sf });
                }
                let exact = iu_count as f64 / (1.0 - sf) / ius_per_superblock as f64;
                (exact.round() as u64 + reserve).max(min_blocks)
            }
            Spare::PhysicalBytes(p) => {
                let blocks = p / (ius_per_superblock * iu);
                if blocks < min_blocks {
                    return Err(FlashSimError::PhysicalTooSmall {
                        physical_bytes: p,
                        logical_bytes,
                        needed_bytes: min_blocks * ius_per_superblock * iu,
                    });
                }
                blocks
            }
        };
        let physical_ius = superblocks
            .checked_mul(ius_per_superblock)
            .filter(|&n| n <= IU_COUNT_MAX)
            .ok_or_else(|| too_many(superblocks.saturating_mul(ius_per_superblock)))?;
        Ok(Geometry {
            iu_bytes: iu,
            logical_ius: iu_count,
            ius_per_superblock,
            superblocks,
            reserve_superblocks: reserve.min(superblocks),
            physical_ius,
        })
    }
}

/// The derived shape of a conventional drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub iu_bytes: u64,
    pub logical_ius: u64,
    pub ius_per_superblock: u64,
    /// All superblocks, reserve included.
    pub superblocks: u64,
    pub reserve_superblocks: u64,
    pub physical_ius: u64,
}

impl Geometry {
    pub fn logical_bytes(&self) -> u64 {
        self.logical_ius * self.iu_bytes
    }

    pub fn physical_bytes(&self) -> u64 {
        self.physical_ius * self.iu_bytes
    }

    pub fn superblock_bytes(&self) -> u64 {
        self.ius_per_superblock * self.iu_bytes
    }

    /// The spare factor GC works with: spare / physical, the reserve superblocks left
    /// out (they hold the open and free superblocks, see [`FtlConfig`]).
    pub fn effective_spare_factor(&self) -> f64 {
        let usable = (self.superblocks - self.reserve_superblocks) * self.ius_per_superblock;
        1.0 - self.logical_ius as f64 / usable as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_factor_sets_physical_space() {
        let g = FtlConfig::new(4096, Superblock::Bytes(1024 * 4096), 0.07)
            .geometry(1 << 32)
            .expect("valid");
        assert_eq!(g.logical_ius, 1 << 20);
        assert_eq!(g.ius_per_superblock, 1024);
        // 1 Mi / 0.93 / 1024 = 1101.06 -> 1101, plus 2 reserve.
        assert_eq!(g.superblocks, 1103);
        assert!((g.effective_spare_factor() - 0.07).abs() < 1e-3);
    }

    #[test]
    fn capacity_divisor_rounds_to_iu() {
        let g = FtlConfig::new(65536, Superblock::CapacityDivisor(228), 0.11)
            .geometry(2 << 30)
            .expect("valid");
        // 32768 IUs / 228 = 143.7 -> 144 IUs.
        assert_eq!(g.ius_per_superblock, 144);
        assert_eq!(g.superblock_bytes(), 144 * 65536);
    }

    #[test]
    fn bad_configurations_are_typed_errors() {
        let base = FtlConfig::new(4096, Superblock::Bytes(1 << 20), 0.07);
        assert!(matches!(
            FtlConfig {
                iu_bytes: 3000,
                ..base
            }
            .geometry(1 << 30),
            Err(FlashSimError::IuSize { iu_bytes: 3000 })
        ));
        assert!(matches!(
            base.geometry(4096 * 3 + 512),
            Err(FlashSimError::CapacityNotIuMultiple { .. })
        ));
        assert!(matches!(
            base.geometry(0),
            Err(FlashSimError::CapacityNotIuMultiple { .. })
        ));
        assert!(matches!(
            FtlConfig {
                superblock: Superblock::Bytes(5000),
                ..base
            }
            .geometry(1 << 30),
            Err(FlashSimError::SuperblockSize { .. })
        ));
        assert!(matches!(
            FtlConfig {
                spare: Spare::Factor(0.95),
                ..base
            }
            .geometry(1 << 30),
            Err(FlashSimError::SpareFactor { .. })
        ));
        assert!(matches!(
            FtlConfig {
                spare: Spare::PhysicalBytes(1 << 30),
                ..base
            }
            .geometry(1 << 30),
            Err(FlashSimError::PhysicalTooSmall { .. })
        ));
        assert!(matches!(
            FtlConfig {
                iu_bytes: 512,
                ..base
            }
            .geometry(1 << 42),
            Err(FlashSimError::TooManyIus { .. })
        ));
    }

    #[test]
    fn tiny_drives_still_leave_gc_room() {
        let g = FtlConfig::new(4096, Superblock::Bytes(64 * 4096), 0.0)
            .geometry(64 * 4096 * 3)
            .expect("valid");
        assert_eq!(g.superblocks, 3 + 4);
    }
}
