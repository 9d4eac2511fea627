//! The on-media format of zone emulation metadata: bytes only, no I/O.
//!
//! Layout at the start of the inner device (all integers little-endian; drawn byte
//! by byte in docs/devices.md):
//!
//! ```text
//! 0            geometry block, copy 0 (4096 bytes; written only by format)
//! 4096         geometry block, copy 1 (identical)
//! 8192         zone table slot 0 (table_slot_bytes)
//! 8192 + T     zone table slot 1 (table_slot_bytes)
//! D            zone 0 (data_offset = 8192 + 2T rounded up to min(1 MiB, zone size
//!              rounded down to a power of two));
//!              zone i at data_offset + i * zone_size
//! ```
//!
//! The geometry never changes after format, so it is mirrored rather than
//! double-buffered. The zone table changes on every flush and zone management
//! command. Both structures carry CRC32C; `format_id` ties a table to the format
//! that wrote it. Two table formats, named by the geometry's version:
//!
//! - version 2 (what format writes): the table is a run of 4 KiB blocks of 252
//!   zones, each block double-buffered on its own: block `i` has a copy in each
//!   slot, each with its own generation and CRC. A persist writes only the blocks
//!   whose zones changed, each to the copy not holding its newest version, so a torn
//!   write leaves that version intact; open takes, block by block, the valid copy
//!   with the higher generation. A reset of one zone of a 16 TiB drive writes 4 KiB,
//!   not the 4 MiB table.
//! - version 1 (pools formatted before): one CRC over the whole table; generation
//!   `g` is written whole to slot `g % 2`, and open takes the valid slot with the
//!   higher generation. Such pools keep this format.

use crate::{DeviceError, ZoneState};

pub(crate) const GEOMETRY_MAGIC: [u8; 8] = *b"SHZEMGEO";
pub(crate) const TABLE_MAGIC: [u8; 8] = *b"SHZEMTAB";
pub(crate) const TABLE_BLOCK_MAGIC: [u8; 8] = *b"SHZEMTBK";
/// The whole-table format (version 1).
pub(crate) const META_VERSION_WHOLE: u32 = 1;
/// The block-by-block format (version 2), the one format writes.
pub(crate) const META_VERSION_BLOCKS: u32 = 2;
/// Size of one geometry block copy; also the alignment of everything in the area.
pub(crate) const META_BLOCK_BYTES: u64 = 4096;
pub(crate) const GEOMETRY_BYTES_USED: usize = 128;
pub(crate) const TABLE_HEADER_BYTES: usize = 64;
pub(crate) const TABLE_ENTRY_BYTES: usize = 16;
/// Zones per table block (version 2): a 64-byte header and 16-byte entries.
pub(crate) const ENTRIES_PER_BLOCK: usize =
    (META_BLOCK_BYTES as usize - TABLE_HEADER_BYTES) / TABLE_ENTRY_BYTES;
/// Offset of table slot 0.
pub(crate) const TABLE_SLOT0_OFFSET: u64 = 2 * META_BLOCK_BYTES;
/// Alignment of the first zone on the inner device (smaller zones align to their
/// own size rounded down to a power of two).
pub(crate) const DATA_ALIGN_BYTES: u64 = 1 << 20;

/// Where zone 0 starts: after both table slots, aligned so that zone-sized writes
/// stay aligned to a drive's indirection units (64 KiB on QLC); an unaligned start
/// would make every sequential zone write a read-modify-write at both edges.
pub(crate) fn data_offset_for(table_slot_bytes: u64, zone_size: u64) -> Option<u64> {
    let end = table_slot_bytes
        .checked_mul(2)?
        .checked_add(TABLE_SLOT0_OFFSET)?;
    let zone_pow2 = 1u64 << (63 - zone_size.max(1).leading_zeros());
    let align = DATA_ALIGN_BYTES.min(zone_pow2).max(META_BLOCK_BYTES);
    end.checked_next_multiple_of(align)
}

/// The static part: what format decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MetaGeometry {
    /// [`META_VERSION_WHOLE`] or [`META_VERSION_BLOCKS`]: how the table is kept.
    pub version: u32,
    pub logical_block_size: u32,
    pub zone_size: u64,
    pub zone_capacity: u64,
    pub zone_count: u32,
    pub max_open_zones: u32,
    pub max_active_zones: u32,
    pub table_slot_bytes: u64,
    pub data_offset: u64,
    pub format_id: u64,
}

/// One persisted zone: its state and write pointer relative to the zone start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableEntry {
    pub state: ZoneState,
    pub wp: u64,
}

/// Bytes of one table slot for `zone_count` zones in the format `format` writes.
pub(crate) fn table_slot_bytes(zone_count: u64) -> u64 {
    table_blocks(zone_count) * META_BLOCK_BYTES
}

/// Table blocks of a version-2 table of `zone_count` zones (at least one).
pub(crate) fn table_blocks(zone_count: u64) -> u64 {
    zone_count.div_ceil(ENTRIES_PER_BLOCK as u64).max(1)
}

/// Bytes of one version-1 (whole) table slot, rounded up to the block size.
pub(crate) fn whole_table_slot_bytes(zone_count: u64) -> u64 {
    let raw = TABLE_HEADER_BYTES as u64 + TABLE_ENTRY_BYTES as u64 * zone_count;
    raw.div_ceil(META_BLOCK_BYTES) * META_BLOCK_BYTES
}

/// The slot bytes a table of `version` needs for `zone_count` zones.
fn slot_bytes_needed(version: u32, zone_count: u64) -> u64 {
    if version == META_VERSION_WHOLE {
        whole_table_slot_bytes(zone_count)
    } else {
        table_slot_bytes(zone_count)
    }
}

pub(crate) fn state_code(s: ZoneState) -> u8 {
    match s {
        ZoneState::Empty => 0,
        ZoneState::ImplicitlyOpen => 1,
        ZoneState::ExplicitlyOpen => 2,
        ZoneState::Closed => 3,
        ZoneState::Full => 4,
        ZoneState::ReadOnly => 5,
        ZoneState::Offline => 6,
    }
}

fn state_from_code(c: u8) -> Option<ZoneState> {
    Some(match c {
        0 => ZoneState::Empty,
        1 => ZoneState::ImplicitlyOpen,
        2 => ZoneState::ExplicitlyOpen,
        3 => ZoneState::Closed,
        4 => ZoneState::Full,
        5 => ZoneState::ReadOnly,
        6 => ZoneState::Offline,
        _ => return None,
    })
}

fn corrupt(reason: String) -> DeviceError {
    DeviceError::CorruptMetadata { reason }
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Fills `block` (META_BLOCK_BYTES long) with the geometry block.
pub(crate) fn encode_geometry(g: &MetaGeometry, block: &mut [u8]) {
    assert_eq!(block.len() as u64, META_BLOCK_BYTES);
    block.fill(0);
    block[0..8].copy_from_slice(&GEOMETRY_MAGIC);
    put_u32(block, 8, g.version);
    put_u32(block, 12, g.logical_block_size);
    put_u64(block, 16, g.zone_size);
    put_u64(block, 24, g.zone_capacity);
    put_u32(block, 32, g.zone_count);
    put_u32(block, 36, g.max_open_zones);
    put_u32(block, 40, g.max_active_zones);
    // 44..48 reserved, zero.
    put_u64(block, 48, g.table_slot_bytes);
    put_u64(block, 56, g.data_offset);
    put_u64(block, 64, g.format_id);
    // 72..124 reserved, zero.
    let crc = crc_fast::crc32_iscsi(&block[..124]);
    put_u32(block, 124, crc);
}

/// Parses and checks one geometry block copy. Checks here are those that need
/// nothing but the block; the caller checks it against the device.
pub(crate) fn decode_geometry(block: &[u8]) -> Result<MetaGeometry, DeviceError> {
    if block.len() < GEOMETRY_BYTES_USED {
        return Err(corrupt(format!("geometry block of {} bytes", block.len())));
    }
    if block[0..8] != GEOMETRY_MAGIC {
        return Err(corrupt(
            "no zone emulation geometry magic (not formatted?)".into(),
        ));
    }
    let version = le_u32(block, 8);
    if version != META_VERSION_WHOLE && version != META_VERSION_BLOCKS {
        return Err(corrupt(format!(
            "geometry version {version}, expected {META_VERSION_WHOLE} or {META_VERSION_BLOCKS}"
        )));
    }
    let stored = le_u32(block, 124);
    let computed = crc_fast::crc32_iscsi(&block[..124]);
    if stored != computed {
        return Err(corrupt(format!(
            "geometry block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    // The CRC covers the used bytes only: unused bytes must be zero, so that a flip
    // anywhere in the block is noticed.
    if block[GEOMETRY_BYTES_USED..].iter().any(|&b| b != 0) {
        return Err(corrupt(
            "geometry block: non-zero bytes after the used area".into(),
        ));
    }
    let g = MetaGeometry {
        version,
        logical_block_size: le_u32(block, 12),
        zone_size: le_u64(block, 16),
        zone_capacity: le_u64(block, 24),
        zone_count: le_u32(block, 32),
        max_open_zones: le_u32(block, 36),
        max_active_zones: le_u32(block, 40),
        table_slot_bytes: le_u64(block, 48),
        data_offset: le_u64(block, 56),
        format_id: le_u64(block, 64),
    };
    let lbs = u64::from(g.logical_block_size);
    let sane = g.logical_block_size.is_power_of_two()
        && (512..=4096).contains(&g.logical_block_size)
        && g.zone_size > 0
        && g.zone_size.is_multiple_of(lbs)
        && g.zone_capacity > 0
        && g.zone_capacity <= g.zone_size
        && g.zone_capacity.is_multiple_of(lbs)
        && g.zone_count > 0
        && g.table_slot_bytes >= slot_bytes_needed(version, u64::from(g.zone_count))
        && g.table_slot_bytes.is_multiple_of(META_BLOCK_BYTES)
        && Some(g.data_offset) == data_offset_for(g.table_slot_bytes, g.zone_size);
    if !sane {
        return Err(corrupt(format!(
            "geometry block fields inconsistent: {g:?}"
        )));
    }
    Ok(g)
}

/// Fills `slot` (table_slot_bytes long) with one generation of the zone table.
pub(crate) fn encode_table(
    format_id: u64,
    generation: u64,
    entries: impl ExactSizeIterator<Item = TableEntry>,
    slot: &mut [u8],
) {
    let n = entries.len();
    let body_end = TABLE_HEADER_BYTES + n * TABLE_ENTRY_BYTES;
    assert!(body_end <= slot.len(), "zone table does not fit its slot");
    slot.fill(0);
    slot[0..8].copy_from_slice(&TABLE_MAGIC);
    put_u32(slot, 8, META_VERSION_WHOLE);
    put_u32(slot, 12, n as u32);
    put_u64(slot, 16, generation);
    put_u64(slot, 24, format_id);
    // 32..60 reserved, zero.
    for (i, e) in entries.enumerate() {
        let at = TABLE_HEADER_BYTES + i * TABLE_ENTRY_BYTES;
        slot[at] = state_code(e.state);
        // at+1..at+8 reserved, zero.
        put_u64(slot, at + 8, e.wp);
    }
    let crc = table_crc(slot, body_end);
    put_u32(slot, 60, crc);
}

/// CRC32C of a table slot's header (before the CRC field) and its entries.
fn table_crc(slot: &[u8], body_end: usize) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&slot[..60]);
    d.update(&slot[TABLE_HEADER_BYTES..body_end]);
    d.finalize() as u32
}

/// Parses one table slot and checks it against the geometry; returns its
/// generation and entries.
pub(crate) fn decode_table(
    g: &MetaGeometry,
    slot: &[u8],
) -> Result<(u64, Vec<TableEntry>), DeviceError> {
    if slot.len() < TABLE_HEADER_BYTES {
        return Err(corrupt(format!("zone table slot of {} bytes", slot.len())));
    }
    if slot[0..8] != TABLE_MAGIC {
        return Err(corrupt("zone table magic missing".into()));
    }
    let version = le_u32(slot, 8);
    if version != META_VERSION_WHOLE || g.version != META_VERSION_WHOLE {
        return Err(corrupt(format!(
            "zone table version {version}, geometry version {}",
            g.version
        )));
    }
    let n = le_u32(slot, 12);
    if n != g.zone_count {
        return Err(corrupt(format!(
            "zone table has {n} zones, geometry says {}",
            g.zone_count
        )));
    }
    let body_end = TABLE_HEADER_BYTES + n as usize * TABLE_ENTRY_BYTES;
    if body_end > slot.len() {
        return Err(corrupt(format!(
            "zone table of {n} zones overflows its slot"
        )));
    }
    let stored = le_u32(slot, 60);
    let computed = table_crc(slot, body_end);
    if stored != computed {
        return Err(corrupt(format!(
            "zone table checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    // Bytes after the entries are outside the CRC: they must be zero (see above).
    if slot[body_end..].iter().any(|&b| b != 0) {
        return Err(corrupt(
            "zone table slot: non-zero bytes after the entries".into(),
        ));
    }
    let generation = le_u64(slot, 16);
    let format_id = le_u64(slot, 24);
    if format_id != g.format_id {
        return Err(corrupt(format!(
            "zone table belongs to format {format_id}, geometry is format {}",
            g.format_id
        )));
    }
    let entries = (0..n as usize)
        .map(|i| decode_entry(g, i, &slot[TABLE_HEADER_BYTES + i * TABLE_ENTRY_BYTES..]))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((generation, entries))
}

fn encode_entry(e: TableEntry, at: &mut [u8]) {
    at[0] = state_code(e.state);
    // 1..8 reserved, zero.
    put_u64(at, 8, e.wp);
}

/// Zone `zone`'s entry from its 16 bytes, checked against the geometry.
fn decode_entry(g: &MetaGeometry, zone: usize, at: &[u8]) -> Result<TableEntry, DeviceError> {
    let state = state_from_code(at[0])
        .ok_or_else(|| corrupt(format!("zone {zone}: unknown state code {}", at[0])))?;
    let wp = le_u64(at, 8);
    let cap = g.zone_capacity;
    let consistent = wp <= cap
        && wp.is_multiple_of(u64::from(g.logical_block_size))
        && match state {
            ZoneState::Empty => wp == 0,
            ZoneState::Full => wp == cap,
            ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen => wp < cap,
            ZoneState::Closed => wp > 0 && wp < cap,
            ZoneState::ReadOnly | ZoneState::Offline => true,
        };
    if !consistent {
        return Err(corrupt(format!(
            "zone {zone}: write pointer {wp} inconsistent with state {state:?}"
        )));
    }
    Ok(TableEntry { state, wp })
}

/// Zones held by table block `index` of a table of `zone_count` zones.
pub(crate) fn block_zones(zone_count: u32, index: u64) -> std::ops::Range<usize> {
    let n = zone_count as usize;
    let start = (index as usize).saturating_mul(ENTRIES_PER_BLOCK).min(n);
    start..(start + ENTRIES_PER_BLOCK).min(n)
}

/// Fills `block` (META_BLOCK_BYTES long) with table block `index` (version 2): the
/// entries of its zones, `generation`, and a CRC32C over every byte but its own.
pub(crate) fn encode_table_block(
    format_id: u64,
    generation: u64,
    index: u64,
    entries: &[TableEntry],
    block: &mut [u8],
) {
    assert_eq!(block.len() as u64, META_BLOCK_BYTES);
    assert!(
        entries.len() <= ENTRIES_PER_BLOCK,
        "too many zones for a block"
    );
    block.fill(0);
    block[0..8].copy_from_slice(&TABLE_BLOCK_MAGIC);
    put_u32(block, 8, META_VERSION_BLOCKS);
    put_u32(block, 12, index as u32);
    put_u64(block, 16, generation);
    put_u64(block, 24, format_id);
    put_u32(block, 32, entries.len() as u32);
    // 36..60 reserved, zero.
    for (i, &e) in entries.iter().enumerate() {
        encode_entry(e, &mut block[TABLE_HEADER_BYTES + i * TABLE_ENTRY_BYTES..]);
    }
    let crc = block_crc(block);
    put_u32(block, 60, crc);
}

/// CRC32C of a table block's every byte except the CRC field (60..64): a flip
/// anywhere, reserved bytes included, is caught.
fn block_crc(block: &[u8]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(&block[..60]);
    d.update(&block[TABLE_HEADER_BYTES..]);
    d.finalize() as u32
}

/// Reseals a table block's CRC (the fuzz targets' way past the checksum).
pub(crate) fn reseal_table_block(block: &mut [u8]) {
    if block.len() as u64 == META_BLOCK_BYTES {
        let crc = block_crc(block);
        put_u32(block, 60, crc);
    }
}

/// Parses one copy of table block `index` (version 2) and checks it against the
/// geometry; returns its generation and its zones' entries.
pub(crate) fn decode_table_block(
    g: &MetaGeometry,
    index: u64,
    block: &[u8],
) -> Result<(u64, Vec<TableEntry>), DeviceError> {
    if block.len() as u64 != META_BLOCK_BYTES {
        return Err(corrupt(format!(
            "zone table block of {} bytes",
            block.len()
        )));
    }
    if block[0..8] != TABLE_BLOCK_MAGIC {
        return Err(corrupt("zone table block magic missing".into()));
    }
    let stored = le_u32(block, 60);
    let computed = block_crc(block);
    if stored != computed {
        return Err(corrupt(format!(
            "zone table block checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        )));
    }
    let version = le_u32(block, 8);
    if version != META_VERSION_BLOCKS || g.version != META_VERSION_BLOCKS {
        return Err(corrupt(format!(
            "zone table block version {version}, geometry version {}",
            g.version
        )));
    }
    let stored_index = u64::from(le_u32(block, 12));
    if stored_index != index {
        return Err(corrupt(format!(
            "zone table block {index} holds block {stored_index}"
        )));
    }
    let format_id = le_u64(block, 24);
    if format_id != g.format_id {
        return Err(corrupt(format!(
            "zone table block belongs to format {format_id}, geometry is format {}",
            g.format_id
        )));
    }
    let zones = block_zones(g.zone_count, index);
    let n = le_u32(block, 32) as usize;
    if n != zones.len() {
        return Err(corrupt(format!(
            "zone table block {index} has {n} zones, geometry says {}",
            zones.len()
        )));
    }
    let entries = zones
        .enumerate()
        .map(|(i, zone)| {
            decode_entry(
                g,
                zone,
                &block[TABLE_HEADER_BYTES + i * TABLE_ENTRY_BYTES..],
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((le_u64(block, 16), entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geo() -> MetaGeometry {
        let t = whole_table_slot_bytes(10);
        MetaGeometry {
            version: META_VERSION_WHOLE,
            logical_block_size: 512,
            zone_size: 1 << 20,
            zone_capacity: 768 << 10,
            zone_count: 10,
            max_open_zones: 3,
            max_active_zones: 5,
            table_slot_bytes: t,
            data_offset: data_offset_for(t, 1 << 20).unwrap_or(0),
            format_id: 7,
        }
    }

    #[test]
    fn geometry_roundtrip_and_every_byte_covered() {
        let g = geo();
        let mut b = vec![0u8; META_BLOCK_BYTES as usize];
        encode_geometry(&g, &mut b);
        assert_eq!(decode_geometry(&b).expect("valid"), g);
        // Any flipped bit in the used part is caught.
        for byte in 0..GEOMETRY_BYTES_USED {
            let mut c = b.clone();
            c[byte] ^= 0x10;
            assert!(
                matches!(
                    decode_geometry(&c),
                    Err(DeviceError::CorruptMetadata { .. })
                ),
                "flip at byte {byte} not detected"
            );
        }
    }

    #[test]
    fn table_roundtrip_and_corruption() {
        let g = geo();
        let mut slot = vec![0u8; g.table_slot_bytes as usize];
        let entries: Vec<TableEntry> = (0..10u64)
            .map(|i| match i % 4 {
                0 => TableEntry {
                    state: ZoneState::Empty,
                    wp: 0,
                },
                1 => TableEntry {
                    state: ZoneState::Closed,
                    wp: 512 * i,
                },
                2 => TableEntry {
                    state: ZoneState::Full,
                    wp: g.zone_capacity,
                },
                _ => TableEntry {
                    state: ZoneState::ImplicitlyOpen,
                    wp: 4096,
                },
            })
            .collect();
        encode_table(7, 42, entries.iter().copied(), &mut slot);
        let (generation, back) = decode_table(&g, &slot).expect("valid");
        assert_eq!(generation, 42);
        assert_eq!(back, entries);
        let used = TABLE_HEADER_BYTES + 10 * TABLE_ENTRY_BYTES;
        for byte in 0..used {
            let mut c = slot.clone();
            c[byte] ^= 0x01;
            assert!(decode_table(&g, &c).is_err(), "flip at byte {byte} missed");
        }
        // A table of another format is refused even with a good checksum.
        encode_table(8, 43, entries.iter().copied(), &mut slot);
        assert!(decode_table(&g, &slot).is_err());
    }

    #[test]
    fn inconsistent_entry_is_corrupt_not_panic() {
        let g = geo();
        let mut slot = vec![0u8; g.table_slot_bytes as usize];
        let bad = [TableEntry {
            state: ZoneState::Empty,
            wp: 512,
        }];
        let mut entries = vec![
            TableEntry {
                state: ZoneState::Empty,
                wp: 0
            };
            9
        ];
        entries.extend_from_slice(&bad);
        encode_table(7, 1, entries.into_iter(), &mut slot);
        assert!(matches!(
            decode_table(&g, &slot),
            Err(DeviceError::CorruptMetadata { .. })
        ));
    }

    #[test]
    fn slot_sizes_are_block_multiples() {
        assert_eq!(whole_table_slot_bytes(0), 4096);
        assert_eq!(whole_table_slot_bytes(252), 4096);
        assert_eq!(whole_table_slot_bytes(253), 8192);
        assert_eq!(ENTRIES_PER_BLOCK, 252);
        assert_eq!(table_slot_bytes(0), 4096);
        assert_eq!(table_slot_bytes(252), 4096);
        assert_eq!(table_slot_bytes(253), 8192);
        assert_eq!(table_slot_bytes(505), 12288);
        // 64 MiB zones of a 16 TiB drive: 1,041 blocks a copy.
        assert_eq!(table_blocks(262_144), 1041);
    }

    /// Version 2: 600 zones in three blocks, the last one partial.
    fn geo_blocks() -> MetaGeometry {
        let t = table_slot_bytes(600);
        MetaGeometry {
            version: META_VERSION_BLOCKS,
            table_slot_bytes: t,
            zone_count: 600,
            data_offset: data_offset_for(t, 1 << 20).unwrap_or(0),
            ..geo()
        }
    }

    fn entry(i: usize, cap: u64) -> TableEntry {
        match i % 3 {
            0 => TableEntry {
                state: ZoneState::Empty,
                wp: 0,
            },
            1 => TableEntry {
                state: ZoneState::Closed,
                wp: 512 * (i as u64 % 100 + 1),
            },
            _ => TableEntry {
                state: ZoneState::Full,
                wp: cap,
            },
        }
    }

    #[test]
    fn table_blocks_roundtrip_and_every_byte_is_covered() {
        let g = geo_blocks();
        assert_eq!(block_zones(600, 0), 0..252);
        assert_eq!(block_zones(600, 2), 504..600);
        assert_eq!(block_zones(600, 3), 600..600);
        let mut block = vec![0u8; META_BLOCK_BYTES as usize];
        for b in 0..3u64 {
            let zones = block_zones(600, b);
            let entries: Vec<TableEntry> =
                zones.clone().map(|i| entry(i, g.zone_capacity)).collect();
            encode_table_block(7, 40 + b, b, &entries, &mut block);
            assert_eq!(
                decode_table_block(&g, b, &block).expect("valid"),
                (40 + b, entries)
            );
            // Another block's place, another format: refused with a good checksum.
            assert!(decode_table_block(&g, (b + 1) % 3, &block).is_err());
            let mut other = block.clone();
            encode_table_block(8, 40, b, &[], &mut other);
            assert!(decode_table_block(&g, b, &other).is_err());
        }
        // Every byte of the block, unused ones included, is covered.
        for byte in 0..block.len() {
            let mut c = block.clone();
            c[byte] ^= 0x04;
            assert!(
                matches!(
                    decode_table_block(&g, 2, &c),
                    Err(DeviceError::CorruptMetadata { .. })
                ),
                "flip at byte {byte} missed"
            );
        }
        // A version-1 geometry does not take version-2 blocks, nor the reverse.
        assert!(decode_table_block(&geo(), 2, &block).is_err());
        let mut slot = vec![0u8; g.table_slot_bytes as usize];
        encode_table(7, 1, (0..600).map(|i| entry(i, g.zone_capacity)), &mut slot);
        assert!(decode_table(&g, &slot).is_err());
    }

    #[test]
    fn both_geometry_versions_roundtrip_and_others_are_refused() {
        for g in [geo(), geo_blocks()] {
            let mut b = vec![0u8; META_BLOCK_BYTES as usize];
            encode_geometry(&g, &mut b);
            assert_eq!(decode_geometry(&b).expect("valid"), g);
        }
        let g = MetaGeometry {
            version: 3,
            ..geo_blocks()
        };
        let mut b = vec![0u8; META_BLOCK_BYTES as usize];
        encode_geometry(&g, &mut b);
        assert!(decode_geometry(&b).is_err());
        // A version-2 slot too small for its blocks is inconsistent.
        let g = MetaGeometry {
            table_slot_bytes: 8192,
            data_offset: data_offset_for(8192, 1 << 20).unwrap_or(0),
            ..geo_blocks()
        };
        encode_geometry(&g, &mut b);
        assert!(decode_geometry(&b).is_err());
    }
}
