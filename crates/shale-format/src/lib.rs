//! Shale's bytes on media: address newtypes and the encoding of every on-disk structure.
//! No I/O happens here; decoders take bytes and the byte offset they were read from (for
//! error messages) and return typed errors, never panicking on any input.
//!
//! Conventions (see docs/format.md for the drawings): block = 4096 bytes; integers
//! little-endian; every structure starts with magic u32, version u16, a
//! structure-specific u16 and a CRC32C u32 computed over the structure with the CRC
//! field taken as zero.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod array_label;
mod checkpoint;
mod codec;
mod error;
pub mod fuzzing;
mod handoff;
mod ids;
mod journal;
mod l2p_dir;
mod l2p_page;
mod l2p_switches;
mod label;
mod md;
mod region_table;
mod superblock;
mod volume_table;

pub use array_label::{
    ArrayLabel, ArrayMember, ArrayRedundancy, ArrayRole, MemberRecord, ARRAY_LABEL_MAGIC,
    ARRAY_LABEL_VERSION, ARRAY_MEMBERS_MAX,
};
pub use checkpoint::{
    Checkpoint, CheckpointHeader, CHECKPOINT_HEADER_LEN, CHECKPOINT_MAGIC, CHECKPOINT_VERSION,
    CHECKPOINT_VERSION_SWITCHES,
};
pub use error::{FormatError, Structure};
pub use handoff::{HandoffImage, HandoffMd, HANDOFF_MAGIC, HANDOFF_VERSION};
pub use ids::{ChunkId, Lba, Pba, RegionId, Sid, VolumeId, VolumeUid, ZoneId};
pub use journal::{
    journal_ring_entries, JournalBlock, JournalRecord, FLUSH_POINT_REGIONS_MAX, JOURNAL_HEADER_LEN,
    JOURNAL_MAGIC, JOURNAL_PAYLOAD_MAX, JOURNAL_VERSION,
};
pub use l2p_dir::{
    L2pDirectory, PageDesc, L2P_DIR_HEADER_LEN, L2P_DIR_MAGIC, L2P_DIR_VERSION,
    L2P_DIR_VERSION_RUNS, L2P_SLOT_NONE,
};
pub use l2p_page::L2pFormat;
pub use l2p_switches::{
    decode_l2p_switches, l2p_switches_len, L2pSwitch, L2P_SWITCHES_HEADER_LEN, L2P_SWITCHES_MAGIC,
    L2P_SWITCHES_VERSION, L2P_SWITCH_LBA_LIMIT, L2P_SWITCH_LEN,
};
pub use label::{CapacityLabel, LABEL_COPIES, LABEL_MAGIC, LABEL_VERSION};
pub use md::{
    decode_md, decode_md_entry, decode_md_header, encode_md, md_claimed_generation, seal_md,
    write_md_entry, EntryKind, MdEntry, MdHeader, MdRegionKind, MD_ENTRY_LEN, MD_HEADER_LEN,
    MD_MAGIC, MD_VERSION, MD_VERSION_DIRECT,
};
pub use region_table::{
    decode_region_table, encode_region_table, RegionEntry, RegionRole, RegionState,
    REGION_ENTRY_LEN, REGION_TABLE_HEADER_LEN, REGION_TABLE_MAGIC,
};
pub use superblock::{
    CacheLayout, CapacityGeometry, ShardTag, Superblock, SHARDS_MAX, SUPERBLOCK_MAGIC,
    SUPERBLOCK_VERSION, SUPERBLOCK_VERSION_2, SUPERBLOCK_VERSION_3, SUPERBLOCK_VERSION_4,
};
pub use volume_table::{
    VolumeEntry, VolumeGc, VolumeLimits, VolumeTable, MAP_UNIT_SHIFT_MAX, VOLUMES_MAX,
    VOLUME_NAME_MAX, VOLUME_TABLE_MAGIC, VOLUME_TABLE_VERSION, VOLUME_TABLE_VERSION_3,
    VOLUME_TABLE_VERSION_4, VOLUME_TABLE_VERSION_5,
};

/// The unit of mapping.
pub const BLOCK_SIZE: usize = 4096;
/// Blocks per group: [`GROUP_DATA_SLOTS`] data slots, then md block A, then md block B.
pub const GROUP_BLOCKS: u32 = 128;
/// Data slots per (full) group.
pub const GROUP_DATA_SLOTS: usize = 126;

/// CRC32C of a data block as stored in md entries.
pub fn block_crc(data: &[u8]) -> u32 {
    crc32c(data)
}

/// CRC32C (Castagnoli, as iSCSI and ext4 use it) of any byte range (L2P pages use
/// this; the CRC lives in the directory). `crc-fast` folds with carry-less multiplies
/// (AVX-512 where present): 4 KiB in 60 ns against 210 ns for the `crc32c` crate's
/// SSE4.2 loop, and the engine checks several 4 KiB blocks per user write.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// The CRC32C of `a ++ data`, given `crc` = `crc32c(a)`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The register before the final inversion is the inverse of the finished CRC.
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, u64::from(!crc));
    d.update(data);
    d.finalize() as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc32c_matches_the_standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
    }

    proptest! {
        /// Against an independent implementation, at every length and split point.
        #[test]
        fn crc32c_agrees_with_the_crc32c_crate(
            data in proptest::collection::vec(any::<u8>(), 0..9000),
            split in any::<prop::sample::Index>(),
        ) {
            prop_assert_eq!(crc32c(&data), crc32c::crc32c(&data));
            let at = split.index(data.len() + 1);
            prop_assert_eq!(
                crc32c_append(crc32c(&data[..at]), &data[at..]),
                crc32c::crc32c(&data)
            );
        }
    }

    /// Garbage behind a valid magic, version and CRC reaches the field checks.
    fn stamp(mut b: Vec<u8>, magic: u32, version: u16, crc_len: usize) -> Vec<u8> {
        if b.len() >= 12 {
            b[..4].copy_from_slice(&magic.to_le_bytes());
            b[4..6].copy_from_slice(&version.to_le_bytes());
            let len = crc_len.min(b.len());
            codec::seal(&mut b, len);
        }
        b
    }

    proptest! {
        #[test]
        fn sealed_garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..8300), small in any::<bool>()) {
            let mut bytes = bytes;
            if small && bytes.len() > 16 {
                // Small counts make the multi-entry decoders walk their entries.
                bytes[12..16].copy_from_slice(&3u32.to_le_bytes());
                bytes[6] = 2;
                bytes[7] = 0;
            }
            let _ = Superblock::decode(&stamp(bytes.clone(), SUPERBLOCK_MAGIC, SUPERBLOCK_VERSION, BLOCK_SIZE), 0);
            let _ = CapacityLabel::decode(&stamp(bytes.clone(), LABEL_MAGIC, LABEL_VERSION, BLOCK_SIZE), 0);
            let _ = decode_md(&stamp(bytes.clone(), MD_MAGIC, MD_VERSION, BLOCK_SIZE), 0);
            let _ = decode_region_table(&stamp(bytes.clone(), REGION_TABLE_MAGIC, 1, REGION_TABLE_HEADER_LEN + 96), 0);
            let _ = L2pDirectory::decode(&stamp(bytes.clone(), L2P_DIR_MAGIC, 1, L2P_DIR_HEADER_LEN + 24), 0, 1 << 16);
            let _ = L2pDirectory::decode(&stamp(bytes.clone(), L2P_DIR_MAGIC, L2P_DIR_VERSION_RUNS, L2P_DIR_HEADER_LEN + 24), 0, 1 << 16);
            let _ = VolumeTable::decode(&stamp(bytes.clone(), VOLUME_TABLE_MAGIC, 1, BLOCK_SIZE), 0);
            let _ = VolumeTable::decode(&stamp(bytes.clone(), VOLUME_TABLE_MAGIC, VOLUME_TABLE_VERSION, BLOCK_SIZE), 0);
            let _ = JournalBlock::decode(&stamp(bytes.clone(), JOURNAL_MAGIC, JOURNAL_VERSION, BLOCK_SIZE), 0);
            let _ = Checkpoint::decode(&stamp(bytes, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, BLOCK_SIZE), 0);
        }
    }
}
