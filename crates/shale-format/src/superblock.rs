//! The cache device's superblock (blocks 0 and 1, mirrored by generation).
//!
//! Invariants: the layout fields describe non-overlapping areas inside the cache device,
//! in the order volume table, checkpoint A, checkpoint B, journal, L2P area, data region;
//! `chunk_blocks` is a positive multiple of [`crate::GROUP_BLOCKS`]; the whole PBA space
//! (cache data blocks + zone_count x zone_size_blocks) fits below `u32::MAX`.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{FormatError, L2pFormat, Structure, BLOCK_SIZE, GROUP_BLOCKS};

pub const SUPERBLOCK_MAGIC: u32 = u32::from_le_bytes(*b"SHSB");
pub const SUPERBLOCK_VERSION: u16 = 1;
/// Pools whose volume table copies are two blocks (volume limits): a Shale that knows
/// only version 1 refuses them as too new instead of misreading their volume table.
pub const SUPERBLOCK_VERSION_2: u16 = 2;
/// One shard of a pool of several (`shard` below): a Shale that knows only versions
/// 1 and 2 refuses it instead of serving one shard's blocks as a whole pool.
pub const SUPERBLOCK_VERSION_3: u16 = 3;
/// A pool with a cold tier (`cold_zones`, bytes 160..164): a Shale that knows only
/// versions 1 to 3 refuses it instead of treating slow zones as fast ones.
pub const SUPERBLOCK_VERSION_4: u16 = 4;
/// Most shards a pool may have.
pub const SHARDS_MAX: u8 = 64;
/// Bytes of the superblock covered by the CRC (the rest of the block is zero)...
pub const SUPERBLOCK_LEN: usize = 160;
/// ... and of a version-4 one (the cold tier's zone count after them).
pub const SUPERBLOCK_LEN_4: usize = 164;

/// Where everything lives on the cache device, in 4 KiB blocks from the device start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheLayout {
    pub volume_table_start: u64,
    /// Blocks of each of the volume table's two copies (byte 149; 0, as pools
    /// formatted before it existed have there, means 1): 2 stores volume limits.
    pub volume_table_blocks: u32,
    pub checkpoint_a_start: u64,
    pub checkpoint_b_start: u64,
    pub checkpoint_blocks: u32,
    pub journal_blocks: u32,
    pub journal_start: u64,
    pub l2p_area_start: u64,
    /// Pages of the global L2P page pool; the area holds two slots per page.
    pub l2p_pool_pages: u32,
    pub data_start: u64,
    pub chunk_blocks: u32,
    pub chunk_count: u32,
}

impl CacheLayout {
    /// Blocks of one volume table copy (1 or 2).
    pub fn volume_table_copy_blocks(&self) -> u64 {
        u64::from(self.volume_table_blocks.max(1))
    }
    /// First block of volume table copy `copy` (0 or 1).
    pub fn volume_table_copy(&self, copy: u64) -> u64 {
        self.volume_table_start + copy * self.volume_table_copy_blocks()
    }
    pub fn cache_data_blocks(&self) -> u64 {
        u64::from(self.chunk_blocks) * u64::from(self.chunk_count)
    }
    /// First block past the data region.
    pub fn end(&self) -> u64 {
        self.data_start + self.cache_data_blocks()
    }
    pub fn checkpoint_start(&self, area: u8) -> u64 {
        if area == 0 {
            self.checkpoint_a_start
        } else {
            self.checkpoint_b_start
        }
    }
}

/// Capacity geometry as recorded at format time (in 4 KiB blocks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapacityGeometry {
    pub zone_size_blocks: u32,
    pub zone_capacity_blocks: u32,
    pub zone_count: u32,
}

/// Which shard of which pool a cache device's superblock belongs to (bytes 150..160).
/// A pool of one shard, as every pool formatted before shards existed, has zeros
/// there: index 0, count 0 (read as 1), pool 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardTag {
    pub index: u8,
    /// Shards in the pool, 1..=[`SHARDS_MAX`].
    pub count: u8,
    /// Blocks per granule of the deal of volume blocks to shards (0 for one shard).
    pub granule_blocks: u32,
    /// The same in every shard of one pool (drawn at format), so shards of two pools
    /// are not mixed up; 0 for a pool of one shard.
    pub pool: u32,
}

impl ShardTag {
    /// A pool of one shard.
    pub const ONE: ShardTag = ShardTag {
        index: 0,
        count: 1,
        granule_blocks: 0,
        pool: 0,
    };
}

impl ShardTag {
    fn validate(&self, l: &CacheLayout) -> Result<(), (&'static str, String)> {
        if self.count == 0 || self.count > SHARDS_MAX || self.index >= self.count {
            return Err((
                "shard_count",
                format!(
                    "shard {} of {} (1..={SHARDS_MAX} shards)",
                    self.index, self.count
                ),
            ));
        }
        if self.count > 1 && self.granule_blocks == 0 {
            return Err((
                "shard_granule_blocks",
                "a shard of a pool records a granule of at least one block".to_string(),
            ));
        }
        if self.count > 1 && l.volume_table_blocks < 2 {
            return Err((
                "volume_table_blocks",
                "a shard of a pool keeps two-block volume table copies".to_string(),
            ));
        }
        Ok(())
    }
}

/// Bytes 160..164: the cold tier's zones (version 4, never 0); none before.
fn decode_cold_zones(r: &mut Reader<'_>, version: u16) -> Result<u32, FormatError> {
    if version != SUPERBLOCK_VERSION_4 {
        return Ok(0);
    }
    match r.u32()? {
        0 => Err(r.invalid(
            "cold_zones",
            "0 in a version 4 superblock (version 4 has a cold tier)".to_string(),
        )),
        n => Ok(n),
    }
}

/// Bytes 150..160: a shard of a pool (version 3), zeros before.
fn decode_shard(r: &mut Reader<'_>, version: u16) -> Result<ShardTag, FormatError> {
    let (index, count) = (r.u8()?, r.u8()?);
    let (granule_blocks, pool) = (r.u32()?, r.u32()?);
    match (version, count) {
        (SUPERBLOCK_VERSION_3 | SUPERBLOCK_VERSION_4, 2..) => Ok(ShardTag {
            index,
            count,
            granule_blocks,
            pool,
        }),
        (SUPERBLOCK_VERSION | SUPERBLOCK_VERSION_2 | SUPERBLOCK_VERSION_4, 0)
            if index == 0 && pool == 0 && granule_blocks == 0 =>
        {
            Ok(ShardTag::ONE)
        }
        (v, c) => Err(r.invalid(
            "shard_count",
            format!(
                "{c} (shard {index}, pool {pool:#x}) in a version {v} superblock \
                 (version 3 has 2 or more shards, earlier versions none recorded)"
            ),
        )),
    }
}

impl Default for ShardTag {
    fn default() -> ShardTag {
        ShardTag::ONE
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Superblock {
    pub uuid: [u8; 16],
    pub generation: u64,
    pub clean: bool,
    /// Which checkpoint area holds the latest checkpoint (0 = A, 1 = B).
    pub active_checkpoint: u8,
    pub volumes_max: u32,
    pub user_capacity_blocks: u64,
    pub cache_size_blocks: u64,
    pub layout: CacheLayout,
    pub capacity: CapacityGeometry,
    /// The entry width of the L2P pages (byte 148; 0, as pools formatted before it
    /// existed have there, means 4-byte entries).
    pub l2p: L2pFormat,
    pub shard: ShardTag,
    /// The capacity zones at the end of the address space that are the cold tier (a
    /// slower device after the fast one, `ZonedConcat`); 0: one tier. Version 4.
    pub cold_zones: u32,
}

impl Superblock {
    fn version(&self) -> u16 {
        if self.cold_zones > 0 {
            SUPERBLOCK_VERSION_4
        } else if self.shard.count > 1 {
            SUPERBLOCK_VERSION_3
        } else if self.layout.volume_table_blocks > 1 {
            SUPERBLOCK_VERSION_2
        } else {
            SUPERBLOCK_VERSION
        }
    }

    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(SUPERBLOCK_MAGIC);
        w.u16(self.version());
        w.u16(0);
        w.u32(0); // crc
        w.u32(0);
        w.bytes(&self.uuid); // 16
        w.u64(self.generation); // 32
        w.u8(u8::from(self.clean)); // 40
        w.u8(self.active_checkpoint);
        w.skip(2);
        w.u32(self.volumes_max); // 44
        w.u64(self.user_capacity_blocks); // 48
        w.u64(self.cache_size_blocks); // 56
        let l = &self.layout;
        w.u64(l.volume_table_start); // 64
        w.u64(l.checkpoint_a_start); // 72
        w.u64(l.checkpoint_b_start); // 80
        w.u32(l.checkpoint_blocks); // 88
        w.u32(l.journal_blocks); // 92
        w.u64(l.journal_start); // 96
        w.u64(l.l2p_area_start); // 104
        w.u32(l.l2p_pool_pages); // 112
        w.u32(l.chunk_blocks); // 116
        w.u64(l.data_start); // 120
        w.u32(l.chunk_count); // 128
        let c = &self.capacity;
        w.u32(c.zone_size_blocks); // 132
        w.u32(c.zone_capacity_blocks); // 136
        w.u32(c.zone_count); // 140
        w.u32(BLOCK_SIZE as u32); // 144
        w.u8(self.l2p.entry_bytes()); // 148
                                      // One-block copies are written as 0, as before the field existed.
        w.u8(if l.volume_table_blocks > 1 {
            l.volume_table_blocks as u8
        } else {
            0
        }); // 149
        if self.shard.count > 1 {
            w.u8(self.shard.index); // 150
            w.u8(self.shard.count); // 151
            w.u32(self.shard.granule_blocks); // 152
            w.u32(self.shard.pool); // 156
        } else {
            w.skip(10); // 150..160: zero for a pool of one shard
        }
        if self.cold_zones > 0 {
            w.u32(self.cold_zones); // 160
            debug_assert_eq!(w.pos(), SUPERBLOCK_LEN_4);
        } else {
            debug_assert_eq!(w.pos(), SUPERBLOCK_LEN);
        }
        seal(&mut b, BLOCK_SIZE);
        b
    }

    /// Decodes and validates a superblock; `at` is its byte offset (for errors only).
    pub fn decode(buf: &[u8], at: u64) -> Result<Superblock, FormatError> {
        let s = Structure::Superblock;
        let version = match buf.get(4..6) {
            Some(&[a, b])
                if [
                    SUPERBLOCK_VERSION_2,
                    SUPERBLOCK_VERSION_3,
                    SUPERBLOCK_VERSION_4,
                ]
                .contains(&u16::from_le_bytes([a, b])) =>
            {
                u16::from_le_bytes([a, b])
            }
            _ => SUPERBLOCK_VERSION,
        };
        check_header(buf, s, at, SUPERBLOCK_MAGIC, version, BLOCK_SIZE)?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 16, s, at);
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(r.bytes(16)?);
        let generation = r.u64()?;
        let clean = match r.u8()? {
            0 => false,
            1 => true,
            v => return Err(r.invalid("clean", format!("{v} is neither 0 nor 1"))),
        };
        let active_checkpoint = r.u8()?;
        if active_checkpoint > 1 {
            return Err(r.invalid("active_checkpoint", format!("{active_checkpoint} > 1")));
        }
        r.skip(2)?;
        let volumes_max = r.u32()?;
        let user_capacity_blocks = r.u64()?;
        let cache_size_blocks = r.u64()?;
        let layout = CacheLayout {
            volume_table_start: r.u64()?,
            volume_table_blocks: 1,
            checkpoint_a_start: r.u64()?,
            checkpoint_b_start: r.u64()?,
            checkpoint_blocks: r.u32()?,
            journal_blocks: r.u32()?,
            journal_start: r.u64()?,
            l2p_area_start: r.u64()?,
            l2p_pool_pages: r.u32()?,
            chunk_blocks: r.u32()?,
            data_start: r.u64()?,
            chunk_count: r.u32()?,
        };
        let capacity = CapacityGeometry {
            zone_size_blocks: r.u32()?,
            zone_capacity_blocks: r.u32()?,
            zone_count: r.u32()?,
        };
        let block_size = r.u32()?;
        if block_size != BLOCK_SIZE as u32 {
            return Err(r.invalid("block_size", format!("{block_size} != {BLOCK_SIZE}")));
        }
        let l2p = match r.u8()? {
            0 => L2pFormat::NARROW,
            b => L2pFormat::from_entry_bytes(b)
                .ok_or_else(|| r.invalid("l2p_entry_bytes", format!("{b} is neither 4 nor 5")))?,
        };
        let volume_table_blocks = match (version, r.u8()?) {
            (SUPERBLOCK_VERSION | SUPERBLOCK_VERSION_4, 0 | 1) => 1,
            (SUPERBLOCK_VERSION_2 | SUPERBLOCK_VERSION_3 | SUPERBLOCK_VERSION_4, 2) => 2,
            (v, b) => {
                return Err(r.invalid(
                    "volume_table_blocks",
                    format!("{b} in a version {v} superblock (version 1 has 1, version 2 has 2)"),
                ))
            }
        };
        let layout = CacheLayout {
            volume_table_blocks,
            ..layout
        };
        let shard = decode_shard(&mut r, version)?;
        let cold_zones = decode_cold_zones(&mut r, version)?;
        let sb = Superblock {
            uuid,
            generation,
            clean,
            active_checkpoint,
            volumes_max,
            user_capacity_blocks,
            cache_size_blocks,
            layout,
            capacity,
            l2p,
            shard,
            cold_zones,
        };
        sb.validate()
            .map_err(|(field, reason)| r.invalid(field, reason))?;
        Ok(sb)
    }

    /// Cross-field checks shared by decode and by format before writing.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let l = &self.layout;
        if l.chunk_blocks == 0 || !l.chunk_blocks.is_multiple_of(GROUP_BLOCKS) {
            return Err((
                "chunk_blocks",
                format!(
                    "{} is not a positive multiple of {GROUP_BLOCKS}",
                    l.chunk_blocks
                ),
            ));
        }
        if l.journal_blocks < 4 || !l.journal_blocks.is_multiple_of(2) {
            return Err((
                "journal_blocks",
                format!(
                    "{} is not an even number >= 4 (ring entries are mirrored block pairs)",
                    l.journal_blocks
                ),
            ));
        }
        let areas = [
            (
                "volume_table_start",
                l.volume_table_start,
                2 * l.volume_table_copy_blocks(),
            ),
            (
                "checkpoint_a_start",
                l.checkpoint_a_start,
                u64::from(l.checkpoint_blocks),
            ),
            (
                "checkpoint_b_start",
                l.checkpoint_b_start,
                u64::from(l.checkpoint_blocks),
            ),
            (
                "journal_start",
                l.journal_start,
                u64::from(l.journal_blocks),
            ),
            (
                "l2p_area_start",
                l.l2p_area_start,
                2 * u64::from(l.l2p_pool_pages),
            ),
            ("data_start", l.data_start, l.cache_data_blocks()),
        ];
        let mut next = 2u64;
        for (field, start, len) in areas {
            if start < next {
                return Err((
                    field,
                    format!("{start} overlaps the previous area (ends {next})"),
                ));
            }
            next = start
                .checked_add(len)
                .ok_or((field, "area end overflows".to_string()))?;
        }
        if next > self.cache_size_blocks {
            return Err((
                "cache_size_blocks",
                format!(
                    "layout ends at block {next} past the device ({})",
                    self.cache_size_blocks
                ),
            ));
        }
        self.validate_capacity()?;
        self.shard.validate(l)?;
        if self.volumes_max == 0 || self.volumes_max > crate::VOLUMES_MAX {
            return Err((
                "volumes_max",
                format!("{} not in 1..={}", self.volumes_max, crate::VOLUMES_MAX),
            ));
        }
        Ok(())
    }

    /// The capacity device's fields: zones, the PBA space, the cold tier.
    fn validate_capacity(&self) -> Result<(), (&'static str, String)> {
        let l = &self.layout;
        let c = &self.capacity;
        if c.zone_capacity_blocks > c.zone_size_blocks {
            return Err((
                "zone_capacity_blocks",
                format!(
                    "{} > zone size {}",
                    c.zone_capacity_blocks, c.zone_size_blocks
                ),
            ));
        }
        let pbas = l.cache_data_blocks() + u64::from(c.zone_size_blocks) * u64::from(c.zone_count);
        if pbas > self.l2p.pba_limit() {
            return Err((
                "zone_count",
                format!(
                    "{pbas} PBAs do not fit in {}-byte L2P entries",
                    self.l2p.entry_bytes()
                ),
            ));
        }
        // Zone 0 holds the label; at least one fast data zone stays before the cold.
        if self.cold_zones >= c.zone_count.saturating_sub(1) {
            let reason = format!(
                "{} of {} zones leave no fast data zone",
                self.cold_zones, c.zone_count
            );
            return Err(("cold_zones", reason));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn sample() -> Superblock {
        Superblock {
            uuid: [7; 16],
            generation: 3,
            clean: true,
            active_checkpoint: 1,
            volumes_max: 8,
            user_capacity_blocks: 1000,
            cache_size_blocks: 10_000,
            layout: CacheLayout {
                volume_table_start: 2,
                volume_table_blocks: 1,
                checkpoint_a_start: 4,
                checkpoint_b_start: 14,
                checkpoint_blocks: 10,
                journal_blocks: 16,
                journal_start: 24,
                l2p_area_start: 40,
                l2p_pool_pages: 10,
                data_start: 60,
                chunk_blocks: 256,
                chunk_count: 30,
            },
            capacity: CapacityGeometry {
                zone_size_blocks: 512,
                zone_capacity_blocks: 500,
                zone_count: 20,
            },
            l2p: L2pFormat::NARROW,
            shard: ShardTag::ONE,
            cold_zones: 0,
        }
    }

    /// A cold tier makes a version-4 superblock with its zone count at byte 160; a
    /// zero count there, or one that leaves no fast data zone, is refused by name, and
    /// a Shale that knows only version 3 refuses the version.
    #[test]
    fn a_cold_tier_is_version_4() {
        let mut sb = sample();
        sb.cold_zones = 12;
        let b = sb.encode();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), SUPERBLOCK_VERSION_4);
        assert_eq!(u32::from_le_bytes([b[160], b[161], b[162], b[163]]), 12);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        // With shards and two-block tables too.
        let mut both = sb.clone();
        both.layout.volume_table_blocks = 2;
        both.layout.checkpoint_a_start = 6;
        both.layout.checkpoint_blocks = 8;
        both.shard = ShardTag {
            index: 1,
            count: 2,
            granule_blocks: 16,
            pool: 9,
        };
        assert_eq!(Superblock::decode(&both.encode(), 0).unwrap(), both);
        let reseal = |f: &dyn Fn(&mut [u8; BLOCK_SIZE])| {
            let mut c = b;
            f(&mut c);
            crate::codec::seal(&mut c, BLOCK_SIZE);
            Superblock::decode(&c, 0)
        };
        for (f, field) in [
            (
                &(|c: &mut [u8; BLOCK_SIZE]| c[160..164].fill(0)) as &dyn Fn(&mut [u8; BLOCK_SIZE]),
                "cold_zones",
            ),
            (
                &|c| c[160..164].copy_from_slice(&19u32.to_le_bytes()),
                "cold_zones",
            ),
        ] {
            assert!(
                matches!(reseal(f), Err(FormatError::InvalidField { field: f, .. }) if f == field),
                "{:?}",
                reseal(f)
            );
        }
        // Without a cold tier nothing changes: version 1, zeros from byte 160.
        sb.cold_zones = 0;
        let b = sb.encode();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), SUPERBLOCK_VERSION);
        assert!(b[160..164].iter().all(|&x| x == 0));
    }

    /// A shard of a pool of several records which, in a version-3 superblock that
    /// versions 1 and 2 refuse; its fields are checked.
    #[test]
    fn a_shard_of_a_pool_is_version_3() {
        let mut sb = sample();
        sb.layout.volume_table_blocks = 2;
        sb.layout.checkpoint_a_start = 6;
        sb.layout.checkpoint_blocks = 8;
        sb.shard = ShardTag {
            index: 2,
            count: 4,
            granule_blocks: 16,
            pool: 0xfeed_beef,
        };
        let b = sb.encode();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), SUPERBLOCK_VERSION_3);
        assert_eq!(Superblock::decode(&b, 0).unwrap(), sb);
        let reseal = |f: &dyn Fn(&mut [u8; BLOCK_SIZE])| {
            let mut c = b;
            f(&mut c);
            crate::codec::seal(&mut c, BLOCK_SIZE);
            Superblock::decode(&c, 0)
        };
        // An index past the count, a count of one or past the most, or shard fields
        // in an earlier version are refused with the field named.
        for f in [
            &(|c: &mut [u8; BLOCK_SIZE]| c[150] = 4) as &dyn Fn(&mut [u8; BLOCK_SIZE]),
            &|c| c[151] = 1,
            &|c| c[151] = SHARDS_MAX + 1,
            &|c| c[4..6].copy_from_slice(&SUPERBLOCK_VERSION_2.to_le_bytes()),
        ] {
            assert!(
                matches!(
                    reseal(f),
                    Err(FormatError::InvalidField {
                        field: "shard_count",
                        ..
                    })
                ),
                "{:?}",
                reseal(f)
            );
        }
        // A pool of one shard writes zeros there, as before shards existed.
        sb.shard = ShardTag::ONE;
        assert!(sb.encode()[150..160].iter().all(|&x| x == 0));
        assert_eq!(Superblock::decode(&sb.encode(), 0).unwrap(), sb);
    }

    /// Pools formatted before the entry width was recorded have zero there.
    #[test]
    fn a_superblock_without_an_entry_width_is_narrow() {
        let mut b = sample().encode();
        b[148] = 0;
        crate::codec::seal(&mut b, BLOCK_SIZE);
        assert_eq!(Superblock::decode(&b, 0).unwrap().l2p, L2pFormat::NARROW);
        b[148] = 8;
        crate::codec::seal(&mut b, BLOCK_SIZE);
        assert!(matches!(
            Superblock::decode(&b, 0),
            Err(FormatError::InvalidField {
                field: "l2p_entry_bytes",
                ..
            })
        ));
    }

    /// Two-block volume table copies make a version-2 superblock, which a Shale that
    /// knows only version 1 refuses; version 1 keeps one-block copies.
    #[test]
    fn two_block_volume_tables_are_version_2() {
        let mut sb = sample();
        let v1 = sb.encode();
        assert_eq!(u16::from_le_bytes([v1[4], v1[5]]), SUPERBLOCK_VERSION);
        assert_eq!(v1[149], 0);
        sb.layout.volume_table_blocks = 2;
        sb.layout.checkpoint_a_start = 6;
        sb.layout.checkpoint_blocks = 8;
        let v2 = sb.encode();
        assert_eq!(u16::from_le_bytes([v2[4], v2[5]]), SUPERBLOCK_VERSION_2);
        assert_eq!(Superblock::decode(&v2, 0).unwrap(), sb);
        // Mismatches are refused: version 1 with two-block copies, version 2 with one.
        for (version, blocks) in [(SUPERBLOCK_VERSION, 2u8), (SUPERBLOCK_VERSION_2, 0)] {
            let mut b = v2;
            b[4..6].copy_from_slice(&version.to_le_bytes());
            b[149] = blocks;
            crate::codec::seal(&mut b, BLOCK_SIZE);
            assert!(
                matches!(
                    Superblock::decode(&b, 0),
                    Err(FormatError::InvalidField {
                        field: "volume_table_blocks",
                        ..
                    })
                ),
                "version {version}, {blocks} blocks"
            );
        }
    }

    #[test]
    fn pools_past_32_bit_pbas_need_wide_entries() {
        let mut sb = sample();
        sb.capacity.zone_size_blocks = 1 << 20;
        sb.capacity.zone_capacity_blocks = 1 << 20;
        sb.capacity.zone_count = 8192;
        assert_eq!(sb.validate().unwrap_err().0, "zone_count");
        sb.l2p = L2pFormat::WIDE;
        sb.validate().unwrap();
        assert_eq!(Superblock::decode(&sb.encode(), 0).unwrap(), sb);
    }

    #[test]
    fn roundtrip_and_corruption() {
        let sb = sample();
        let b = sb.encode();
        assert_eq!(Superblock::decode(&b, 0), Ok(sb));
        let mut bad = b;
        bad[100] ^= 1;
        assert!(matches!(
            Superblock::decode(&bad, 4096),
            Err(FormatError::ChecksumMismatch { at: 4096, .. })
        ));
        let mut bad = b;
        bad[0] ^= 1;
        assert!(matches!(
            Superblock::decode(&bad, 0),
            Err(FormatError::BadMagic { .. })
        ));
        let mut bad = b;
        bad[4] = 9;
        assert!(matches!(
            Superblock::decode(&bad, 0),
            Err(FormatError::UnsupportedVersion { found: 9, .. })
        ));
        assert!(matches!(
            Superblock::decode(&b[..100], 0),
            Err(FormatError::Truncated { .. })
        ));
    }

    #[test]
    fn overlapping_layout_is_invalid() {
        let mut sb = sample();
        sb.layout.journal_start = 20;
        let b = sb.encode();
        assert!(matches!(
            Superblock::decode(&b, 0),
            Err(FormatError::InvalidField {
                field: "journal_start",
                ..
            })
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = Superblock::decode(&bytes, 0);
        }

        #[test]
        fn arbitrary_valid_roundtrips(gen in any::<u64>(), clean in any::<bool>(), act in 0u8..2,
                                      uuid in any::<[u8; 16]>(), vols in 1u32..64) {
            let mut sb = sample();
            sb.generation = gen;
            sb.clean = clean;
            sb.active_checkpoint = act;
            sb.uuid = uuid;
            sb.volumes_max = vols;
            prop_assert_eq!(Superblock::decode(&sb.encode(), 0), Ok(sb));
        }
    }
}
