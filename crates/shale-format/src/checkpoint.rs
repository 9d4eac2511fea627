//! A checkpoint: a header block followed by a payload of the region state table, the
//! volume table snapshot and one L2P directory per volume.
//!
//! Invariants: the payload CRC in the header covers exactly `payload_bytes`; the two
//! checkpoint areas alternate, and the superblock names the one that is complete.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{
    decode_region_table, encode_region_table, FormatError, L2pDirectory, RegionEntry, Structure,
    VolumeTable, BLOCK_SIZE,
};

pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SHCP");
pub const CHECKPOINT_VERSION: u16 = 1;
pub const CHECKPOINT_HEADER_LEN: usize = 80;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointHeader {
    pub generation: u64,
    /// The next SID to hand out.
    pub sid_next: u64,
    /// Ring index of the next journal block to write after this checkpoint.
    pub journal_next_block: u32,
    /// Sequence number that block will carry (its epoch is `generation`).
    pub journal_sequence: u64,
    pub payload_bytes: u64,
    pub payload_crc: u32,
    pub region_count: u32,
    pub directory_count: u32,
    /// Engine clock when taken (zone close times are in the same clock).
    pub time: u64,
}

impl CheckpointHeader {
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(CHECKPOINT_MAGIC);
        w.u16(CHECKPOINT_VERSION);
        w.u16(0);
        w.u32(0);
        w.u32(0);
        w.u64(self.generation); // 16
        w.u64(self.sid_next); // 24
        w.u32(self.journal_next_block); // 32
        w.u32(0);
        w.u64(self.journal_sequence); // 40
        w.u64(self.payload_bytes); // 48
        w.u32(self.payload_crc); // 56
        w.u32(self.region_count); // 60
        w.u32(self.directory_count); // 64
        w.u32(0);
        w.u64(self.time); // 72
        debug_assert_eq!(w.pos(), CHECKPOINT_HEADER_LEN);
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<CheckpointHeader, FormatError> {
        let s = Structure::CheckpointHeader;
        check_header(buf, s, at, CHECKPOINT_MAGIC, CHECKPOINT_VERSION, BLOCK_SIZE)?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 16, s, at);
        let generation = r.u64()?;
        let sid_next = r.u64()?;
        let journal_next_block = r.u32()?;
        r.skip(4)?;
        Ok(CheckpointHeader {
            generation,
            sid_next,
            journal_next_block,
            journal_sequence: r.u64()?,
            payload_bytes: r.u64()?,
            payload_crc: r.u32()?,
            region_count: r.u32()?,
            directory_count: {
                let d = r.u32()?;
                r.skip(4)?;
                d
            },
            time: r.u64()?,
        })
    }
}

/// A whole checkpoint in memory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub header: CheckpointHeader,
    pub regions: Vec<RegionEntry>,
    pub volumes: VolumeTable,
    pub directories: Vec<L2pDirectory>,
}

impl Checkpoint {
    /// Bytes the encoded checkpoint takes (header block + payload, rounded up to blocks).
    pub fn encoded_blocks(
        region_count: usize,
        directory_pages: usize,
        directory_count: usize,
    ) -> u64 {
        let payload = crate::REGION_TABLE_HEADER_LEN
            + region_count * crate::REGION_ENTRY_LEN
            + BLOCK_SIZE
            + directory_count * crate::L2P_DIR_HEADER_LEN
            + directory_pages * 8;
        1 + payload.div_ceil(BLOCK_SIZE) as u64
    }

    /// Encodes header + payload, padded to whole blocks. Fills in the header's payload
    /// fields.
    pub fn encode(&self) -> Vec<u8> {
        let mut payload = encode_region_table(&self.regions);
        payload.extend_from_slice(&self.volumes.encode());
        for d in &self.directories {
            d.encode_into(&mut payload);
        }
        let mut h = self.header.clone();
        h.payload_bytes = payload.len() as u64;
        h.payload_crc = crc32c::crc32c(&payload);
        h.region_count = self.regions.len() as u32;
        h.directory_count = self.directories.len() as u32;
        let mut out = h.encode().to_vec();
        out.extend_from_slice(&payload);
        out.resize(out.len().div_ceil(BLOCK_SIZE) * BLOCK_SIZE, 0);
        out
    }

    /// Decodes a checkpoint from the bytes of its area (`at` = the area's byte offset).
    pub fn decode(buf: &[u8], at: u64) -> Result<Checkpoint, FormatError> {
        let header = CheckpointHeader::decode(buf, at)?;
        let s = Structure::CheckpointHeader;
        let pat = at + BLOCK_SIZE as u64;
        let payload_len = usize::try_from(header.payload_bytes).unwrap_or(usize::MAX);
        let end = BLOCK_SIZE
            .checked_add(payload_len)
            .filter(|&e| e <= buf.len())
            .ok_or(FormatError::Truncated {
                structure: s,
                at,
                len: buf.len(),
                need: BLOCK_SIZE.saturating_add(payload_len),
            })?;
        let payload = &buf[BLOCK_SIZE..end];
        let got = crc32c::crc32c(payload);
        if got != header.payload_crc {
            return Err(FormatError::ChecksumMismatch {
                structure: s,
                at: pat,
                expected: header.payload_crc,
                got,
            });
        }
        let (regions, used) = decode_region_table(payload, pat)?;
        if regions.len() != header.region_count as usize {
            return Err(Reader::new(payload, s, at).invalid(
                "region_count",
                format!("{} != {}", regions.len(), header.region_count),
            ));
        }
        let mut pos = used;
        let vt_end = pos
            .checked_add(BLOCK_SIZE)
            .filter(|&e| e <= payload.len())
            .ok_or(FormatError::Truncated {
                structure: Structure::VolumeTable,
                at: pat + pos as u64,
                len: payload.len(),
                need: pos + BLOCK_SIZE,
            })?;
        let volumes = VolumeTable::decode(&payload[pos..vt_end], pat + pos as u64)?;
        pos = vt_end;
        let mut directories =
            Vec::with_capacity((header.directory_count as usize).min(crate::VOLUMES_MAX as usize));
        for _ in 0..header.directory_count {
            let (d, used) = L2pDirectory::decode(&payload[pos..], pat + pos as u64)?;
            directories.push(d);
            pos += used;
        }
        Ok(Checkpoint {
            header,
            regions,
            volumes,
            directories,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PageDesc, Sid, VolumeEntry, VolumeId};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
            let _ = Checkpoint::decode(&bytes, 0);
        }

        #[test]
        fn roundtrip(gen in any::<u64>(), sid in any::<u64>(), jb in any::<u32>(), js in any::<u64>(), time in any::<u64>(),
                     regions in proptest::collection::vec(crate::region_table::tests::entry(), 0..40),
                     dirs in proptest::collection::vec(proptest::collection::vec((any::<u32>(), any::<u32>()), 0..30), 0..5)) {
            let volumes = VolumeTable { generation: 4, entries: dirs.iter().enumerate().map(|(i, d)| VolumeEntry {
                id: VolumeId(i as u32), name: format!("v{i}"), size_blocks: d.len() as u64 * 1024, created_sid: Sid(1), created_pos: 0,
            }).collect() };
            let directories: Vec<L2pDirectory> = dirs.iter().enumerate().map(|(i, d)| L2pDirectory {
                volume: VolumeId(i as u32), pages: d.iter().map(|&(slot, crc32c)| PageDesc { slot, crc32c }).collect(),
            }).collect();
            let dir_pages: usize = directories.iter().map(|d| d.pages.len()).sum();
            let c = Checkpoint {
                header: CheckpointHeader { generation: gen, sid_next: sid, journal_next_block: jb, journal_sequence: js, time, ..Default::default() },
                regions, volumes, directories,
            };
            let mut bytes = c.encode();
            prop_assert_eq!(bytes.len() as u64, Checkpoint::encoded_blocks(c.regions.len(), dir_pages, c.directories.len()) * BLOCK_SIZE as u64);
            let d = Checkpoint::decode(&bytes, 0).unwrap();
            prop_assert_eq!(&d.regions, &c.regions);
            prop_assert_eq!(&d.volumes, &c.volumes);
            prop_assert_eq!(&d.directories, &c.directories);
            prop_assert_eq!(d.header.generation, gen);
            prop_assert_eq!(d.header.time, time);
            bytes[BLOCK_SIZE + 3] ^= 1;
            let is_crc = matches!(Checkpoint::decode(&bytes, 0), Err(FormatError::ChecksumMismatch { .. }));
            prop_assert!(is_crc);
        }
    }
}
