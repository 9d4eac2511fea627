//! Metadata (md) blocks: the per-group P2L map.
//!
//! A region is split into groups of [`GROUP_BLOCKS`] blocks: the data slots, then md
//! block A, then md block B. Entry `i` of a group's md block describes data slot `i`.
//! Invariants: `entry_count <= GROUP_DATA_SLOTS`; entries at index >= `entry_count` are
//! `Empty`; a `Pad` or `Empty` entry carries no volume.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{
    FormatError, Lba, Pba, RegionId, Sid, Structure, VolumeId, BLOCK_SIZE, GROUP_DATA_SLOTS,
};

pub const MD_MAGIC: u32 = u32::from_le_bytes(*b"SHMD");
/// Version 2 widened `source` to 40 bits (its high byte was padding in version 1, whose
/// blocks still decode).
pub const MD_VERSION: u16 = 2;
/// The version of a block holding [`EntryKind::Direct`] entries, so a Shale that does
/// not know them refuses the block instead of skipping the entries. Blocks without
/// such entries keep [`MD_VERSION`].
pub const MD_VERSION_DIRECT: u16 = 3;
pub const MD_HEADER_LEN: usize = 64;
pub const MD_ENTRY_LEN: usize = 32;

/// What a data slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum EntryKind {
    /// Never written (or skipped).
    #[default]
    Empty = 0,
    /// A user write.
    Data = 1,
    /// A block moved by compaction or GC; `source` holds where it came from.
    Relocated = 2,
    /// Filler written to close a batch early.
    Pad = 3,
    /// A user write that went straight to a zone (a large write bypassing the cache).
    /// It ranks in the order of user writes at `(sid, pos)`: the slot `pos` its write
    /// took in the user chunk with SID `sid`; a copy GC makes keeps both.
    Direct = 4,
}

impl EntryKind {
    /// A slot holding a block of user data (a user write, direct or not, or a copy).
    pub fn holds_data(self) -> bool {
        matches!(
            self,
            EntryKind::Data | EntryKind::Relocated | EntryKind::Direct
        )
    }

    fn from_u8(v: u8) -> Option<EntryKind> {
        Some(match v {
            0 => EntryKind::Empty,
            1 => EntryKind::Data,
            2 => EntryKind::Relocated,
            3 => EntryKind::Pad,
            4 => EntryKind::Direct,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MdEntry {
    pub kind: EntryKind,
    pub volume: VolumeId,
    pub lba: Lba,
    pub sid: Sid,
    pub data_crc: u32,
    /// Where a `Relocated` block came from (on media); `NONE` for other kinds.
    pub source: Pba,
    /// A `Direct` block's position in its user chunk (0 for other kinds). Stored where
    /// `source` is, which a direct block has none of on media.
    pub pos: u32,
}

impl MdEntry {
    pub const EMPTY: MdEntry = MdEntry {
        kind: EntryKind::Empty,
        volume: VolumeId::NONE,
        lba: Lba(0),
        sid: Sid(0),
        data_crc: 0,
        source: Pba::NONE,
        pos: 0,
    };

    fn write(&self, w: &mut Writer<'_>) {
        // `source` as 40 bits: the high byte in what version 1 left as padding, all
        // ones for none.
        let source = if self.kind == EntryKind::Direct {
            u64::from(self.pos)
        } else {
            self.source.0.min(SOURCE_NONE)
        };
        w.u32(self.volume.0);
        w.u8(self.kind as u8);
        w.u8((source >> 32) as u8);
        w.skip(2);
        w.u64(self.lba.0);
        w.u64(self.sid.0);
        w.u32(self.data_crc);
        w.u32(source as u32);
    }
}

/// `source` of an entry with none, on media (version 2).
const SOURCE_NONE: u64 = (1 << 40) - 1;

/// Which device family a group belongs to; recorded so a misdirected read is caught.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum MdRegionKind {
    Chunk = 1,
    Zone = 2,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdHeader {
    pub region_kind: MdRegionKind,
    pub region: RegionId,
    pub group: u32,
    pub entry_count: u16,
    pub region_sid: Sid,
    /// Bumped on every rewrite of a cache group's md; readers take the valid copy with the
    /// higher generation. Zone groups write both copies once with the same generation.
    pub generation: u64,
}

/// Encodes an md block into `out` (exactly one block).
pub fn encode_md(out: &mut [u8], h: &MdHeader, entries: &[MdEntry]) {
    debug_assert!(entries.len() <= GROUP_DATA_SLOTS);
    debug_assert_eq!(out.len(), BLOCK_SIZE);
    out.fill(0);
    let direct = entries.iter().any(|e| e.kind == EntryKind::Direct);
    let mut w = Writer::new(out);
    w.u32(MD_MAGIC);
    w.u16(if direct {
        MD_VERSION_DIRECT
    } else {
        MD_VERSION
    });
    w.u16(h.region_kind as u16);
    w.u32(0);
    w.u32(h.region.0); // 12
    w.u32(h.group); // 16
    w.u16(h.entry_count); // 20
    w.u16(0);
    w.u64(h.region_sid.0); // 24
    w.u64(h.generation); // 32
    w.skip(MD_HEADER_LEN - 40);
    for i in 0..GROUP_DATA_SLOTS {
        entries.get(i).unwrap_or(&MdEntry::EMPTY).write(&mut w);
    }
    seal(out, BLOCK_SIZE);
}

/// Encodes only the header of an md block whose entries were filled in place with
/// [`write_md_entry`], then seals it. Avoids copying entries on the write path.
pub fn seal_md(out: &mut [u8], h: &MdHeader) {
    let direct = (0..GROUP_DATA_SLOTS)
        .any(|i| out.get(MD_HEADER_LEN + i * MD_ENTRY_LEN + 4) == Some(&(EntryKind::Direct as u8)));
    let mut w = Writer::new(out);
    w.u32(MD_MAGIC);
    w.u16(if direct {
        MD_VERSION_DIRECT
    } else {
        MD_VERSION
    });
    w.u16(h.region_kind as u16);
    w.u32(0);
    w.u32(h.region.0);
    w.u32(h.group);
    w.u16(h.entry_count);
    w.u16(0);
    w.u64(h.region_sid.0);
    w.u64(h.generation);
    seal(out, BLOCK_SIZE);
}

/// Writes entry `index` of an md block in place.
pub fn write_md_entry(out: &mut [u8], index: usize, e: &MdEntry) {
    let mut w = Writer::at(out, MD_HEADER_LEN + index * MD_ENTRY_LEN);
    e.write(&mut w);
}

/// Decodes and verifies an md block header (and its CRC over the whole block).
pub fn decode_md_header(buf: &[u8], at: u64) -> Result<MdHeader, FormatError> {
    let s = Structure::MdBlock;
    // Version 1 blocks still decode (their `source` is 32 bits); version 3 holds
    // direct entries.
    let version = match md_version(buf) {
        v @ (1 | MD_VERSION_DIRECT) => v,
        _ => MD_VERSION,
    };
    check_header(buf, s, at, MD_MAGIC, version, BLOCK_SIZE)?;
    let buf = &buf[..BLOCK_SIZE];
    check_crc(buf, s, at)?;
    let mut r = Reader::at(buf, 6, s, at);
    let region_kind = match r.u16()? {
        1 => MdRegionKind::Chunk,
        2 => MdRegionKind::Zone,
        v => return Err(r.invalid("region_kind", format!("{v}"))),
    };
    r.skip(4)?;
    let region = RegionId(r.u32()?);
    let group = r.u32()?;
    let entry_count = r.u16()?;
    if usize::from(entry_count) > GROUP_DATA_SLOTS {
        return Err(r.invalid("entry_count", format!("{entry_count} > {GROUP_DATA_SLOTS}")));
    }
    r.skip(2)?;
    let region_sid = Sid(r.u64()?);
    let generation = r.u64()?;
    Ok(MdHeader {
        region_kind,
        region,
        group,
        entry_count,
        region_sid,
        generation,
    })
}

/// The generation an md block claims (bytes 32..40), before any check: only for
/// ordering which of two copies to verify first (`decode_md_header` decides). 0 for a
/// buffer too short to hold it.
pub fn md_claimed_generation(buf: &[u8]) -> u64 {
    buf.get(32..40)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Decodes entry `index` of an md block already verified by [`decode_md_header`].
pub fn decode_md_entry(buf: &[u8], index: usize, at: u64) -> Result<MdEntry, FormatError> {
    let s = Structure::MdBlock;
    if index >= GROUP_DATA_SLOTS {
        return Err(FormatError::InvalidField {
            structure: s,
            at,
            field: "entry index",
            reason: format!("{index} >= {GROUP_DATA_SLOTS}"),
        });
    }
    let version = md_version(buf);
    let v1 = version == 1;
    let mut r = Reader::at(buf, MD_HEADER_LEN + index * MD_ENTRY_LEN, s, at);
    let volume = VolumeId(r.u32()?);
    let kind_byte = r.u8()?;
    let kind = EntryKind::from_u8(kind_byte)
        .filter(|k| *k != EntryKind::Direct || version == MD_VERSION_DIRECT)
        .ok_or_else(|| {
            r.invalid(
                "entry kind",
                format!("{kind_byte} in a version {version} block"),
            )
        })?;
    let source_high = if v1 { 0 } else { u64::from(r.u8()?) };
    r.skip(if v1 { 3 } else { 2 })?;
    let lba = Lba(r.u64()?);
    let sid = Sid(r.u64()?);
    let data_crc = r.u32()?;
    let low = r.u32()?;
    if kind == EntryKind::Direct {
        return Ok(MdEntry {
            kind,
            volume,
            lba,
            sid,
            data_crc,
            source: Pba::NONE,
            pos: low,
        });
    }
    let source = if v1 {
        if low == u32::MAX {
            Pba::NONE
        } else {
            Pba(u64::from(low))
        }
    } else {
        match source_high << 32 | u64::from(low) {
            SOURCE_NONE => Pba::NONE,
            p => Pba(p),
        }
    };
    Ok(MdEntry {
        kind,
        volume,
        lba,
        sid,
        data_crc,
        source,
        pos: 0,
    })
}

/// The version an md block claims (0 if too short to say).
fn md_version(buf: &[u8]) -> u16 {
    buf.get(4..6)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u16::from_le_bytes)
}

/// Decodes a whole md block.
pub fn decode_md(buf: &[u8], at: u64) -> Result<(MdHeader, Vec<MdEntry>), FormatError> {
    let h = decode_md_header(buf, at)?;
    let mut v = Vec::with_capacity(GROUP_DATA_SLOTS);
    for i in 0..GROUP_DATA_SLOTS {
        v.push(decode_md_entry(buf, i, at)?);
    }
    Ok((h, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_claimed_generation_is_the_one_encoded() {
        let mut b = vec![0u8; BLOCK_SIZE];
        let h = MdHeader {
            region_kind: MdRegionKind::Zone,
            region: RegionId(3),
            group: 2,
            entry_count: 0,
            region_sid: Sid(9),
            generation: 0x0102_0304_0506_0708,
        };
        encode_md(&mut b, &h, &[]);
        assert_eq!(md_claimed_generation(&b), h.generation);
        assert_eq!(decode_md_header(&b, 0).unwrap().generation, h.generation);
        assert_eq!(md_claimed_generation(&b[..39]), 0);
    }

    fn entry() -> impl Strategy<Value = MdEntry> {
        (
            0u8..5,
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u32>(),
            prop_oneof![Just(Pba::NONE), (0..SOURCE_NONE).prop_map(Pba)],
            any::<u32>(),
        )
            .prop_map(|(k, v, l, s, c, p, pos)| {
                let kind = EntryKind::from_u8(k).unwrap_or_default();
                let direct = kind == EntryKind::Direct;
                MdEntry {
                    kind,
                    volume: VolumeId(v),
                    lba: Lba(l),
                    sid: Sid(s),
                    data_crc: c,
                    source: if direct { Pba::NONE } else { p },
                    pos: if direct { pos } else { 0 },
                }
            })
    }

    /// A block as version 1 wrote it: `source` a u32 with the bytes before it padding.
    #[test]
    fn version_1_blocks_still_decode() {
        let h = MdHeader {
            region_kind: MdRegionKind::Zone,
            region: RegionId(3),
            group: 1,
            entry_count: 2,
            region_sid: Sid(9),
            generation: 4,
        };
        let mut b = vec![0u8; BLOCK_SIZE];
        encode_md(&mut b, &h, &[]);
        b[4..6].copy_from_slice(&1u16.to_le_bytes());
        for (i, source) in [0x8765_4321u32, u32::MAX].into_iter().enumerate() {
            let at = MD_HEADER_LEN + i * MD_ENTRY_LEN;
            b[at..at + 4].copy_from_slice(&7u32.to_le_bytes());
            b[at + 4] = EntryKind::Relocated as u8;
            b[at + 28..at + 32].copy_from_slice(&source.to_le_bytes());
        }
        seal(&mut b, BLOCK_SIZE);
        let (got, entries) = decode_md(&b, 0).unwrap();
        assert_eq!(got, h);
        assert_eq!(entries[0].source, Pba(0x8765_4321));
        assert_eq!(entries[1].source, Pba::NONE);
        assert_eq!(entries[0].volume, VolumeId(7));
    }

    #[test]
    fn a_40_bit_source_roundtrips() {
        let mut b = vec![0u8; BLOCK_SIZE];
        let e = MdEntry {
            kind: EntryKind::Relocated,
            source: Pba((1 << 38) + 5),
            ..MdEntry::EMPTY
        };
        let h = MdHeader {
            region_kind: MdRegionKind::Zone,
            region: RegionId(3),
            group: 1,
            entry_count: 1,
            region_sid: Sid(9),
            generation: 4,
        };
        encode_md(&mut b, &h, &[e]);
        assert_eq!(decode_md(&b, 0).unwrap().1[0], e);
    }

    /// A block with a direct entry is version 3 (a Shale that knows only version 2
    /// refuses it rather than skip the entry); one without stays version 2, and a
    /// direct entry in a version 2 block is an error.
    #[test]
    fn direct_entries_make_a_version_3_block() {
        let h = MdHeader {
            region_kind: MdRegionKind::Zone,
            region: RegionId(3),
            group: 1,
            entry_count: 2,
            region_sid: Sid(9),
            generation: 1,
        };
        let d = MdEntry {
            kind: EntryKind::Direct,
            volume: VolumeId(2),
            lba: Lba(77),
            sid: Sid(40),
            data_crc: 5,
            source: Pba::NONE,
            pos: 0xfedc_ba98,
        };
        let r = MdEntry {
            kind: EntryKind::Relocated,
            source: Pba(12),
            ..MdEntry::EMPTY
        };
        let mut b = vec![0u8; BLOCK_SIZE];
        encode_md(&mut b, &h, &[r, d]);
        assert_eq!(md_version(&b), MD_VERSION_DIRECT);
        assert_eq!(decode_md(&b, 0).unwrap().1[..2], [r, d]);
        encode_md(&mut b, &h, &[r]);
        assert_eq!(md_version(&b), MD_VERSION);
        // A version 2 block claiming a direct entry.
        let at = MD_HEADER_LEN + MD_ENTRY_LEN;
        b[at + 4] = EntryKind::Direct as u8;
        seal(&mut b, BLOCK_SIZE);
        decode_md_header(&b, 0).unwrap();
        let err = decode_md_entry(&b, 1, 0).unwrap_err().to_string();
        assert!(err.contains("version 2"), "{err}");
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200), i in 0usize..200) {
            let _ = decode_md(&bytes, 0);
            let _ = decode_md_header(&bytes, 0);
            let _ = decode_md_entry(&bytes, i, 0);
        }

        #[test]
        fn roundtrip(entries in proptest::collection::vec(entry(), 0..=GROUP_DATA_SLOTS),
                     region in any::<u32>(), group in any::<u32>(), sid in any::<u64>(), gen in any::<u64>(),
                     zone in any::<bool>()) {
            let h = MdHeader {
                region_kind: if zone { MdRegionKind::Zone } else { MdRegionKind::Chunk },
                region: RegionId(region), group, entry_count: entries.len() as u16,
                region_sid: Sid(sid), generation: gen,
            };
            let mut b = vec![0u8; BLOCK_SIZE];
            encode_md(&mut b, &h, &entries);
            let (h2, e2) = decode_md(&b, 0).unwrap();
            prop_assert_eq!(h2, h.clone());
            prop_assert_eq!(&e2[..entries.len()], &entries[..]);
            prop_assert!(e2[entries.len()..].iter().all(|e| *e == MdEntry::EMPTY));
            // In-place building gives the same bytes.
            let mut c = vec![0u8; BLOCK_SIZE];
            for (i, e) in entries.iter().enumerate() { write_md_entry(&mut c, i, e); }
            for i in entries.len()..GROUP_DATA_SLOTS { write_md_entry(&mut c, i, &MdEntry::EMPTY); }
            seal_md(&mut c, &h);
            prop_assert_eq!(&b, &c);
            b[200] ^= 4;
            let is_crc = matches!(decode_md(&b, 9), Err(FormatError::ChecksumMismatch { at: 9, .. }));
            prop_assert!(is_crc);
        }
    }
}
