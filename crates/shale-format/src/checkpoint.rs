//! A checkpoint: a header block followed by a payload of the region state table, the
//! volume table snapshot, one L2P directory per volume and (version 2) the L2P switch
//! table.
//!
//! Invariants: the payload CRC in the header covers exactly `payload_bytes`; the two
//! checkpoint areas alternate, and the superblock names the one that is complete.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::l2p_switches::{decode_l2p_switches, l2p_switches_len, switch_chunks};
use crate::{
    decode_region_table, FormatError, L2pDirectory, L2pSwitch, RegionEntry, Structure, VolumeTable,
    BLOCK_SIZE,
};

pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SHCP");
pub const CHECKPOINT_VERSION: u16 = 1;
/// A checkpoint with an L2P switch table (written only when it has switches, so a
/// checkpoint without any stays readable by versions that know only version 1).
pub const CHECKPOINT_VERSION_SWITCHES: u16 = 2;
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
    /// Switches in the L2P switch table (version 2; 0: no table).
    pub switch_count: u32,
    /// Engine clock when taken (zone close times are in the same clock).
    pub time: u64,
}

impl CheckpointHeader {
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(CHECKPOINT_MAGIC);
        w.u16(if self.switch_count > 0 {
            CHECKPOINT_VERSION_SWITCHES
        } else {
            CHECKPOINT_VERSION
        });
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
        w.u32(self.switch_count); // 68
        w.u64(self.time); // 72
        debug_assert_eq!(w.pos(), CHECKPOINT_HEADER_LEN);
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<CheckpointHeader, FormatError> {
        let s = Structure::CheckpointHeader;
        let version = match buf.get(4..6) {
            Some(&[a, b]) if u16::from_le_bytes([a, b]) == CHECKPOINT_VERSION_SWITCHES => {
                CHECKPOINT_VERSION_SWITCHES
            }
            _ => CHECKPOINT_VERSION,
        };
        check_header(buf, s, at, CHECKPOINT_MAGIC, version, BLOCK_SIZE)?;
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
            directory_count: r.u32()?,
            switch_count: {
                let n = r.u32()?;
                // Reserved (written as 0) in version 1.
                if version == CHECKPOINT_VERSION_SWITCHES {
                    if n == 0 {
                        return Err(r.invalid("switch_count", "0 in a version 2 header".into()));
                    }
                    n
                } else {
                    0
                }
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
    /// L2P entries newer than the pages the directories reference, sorted by (volume,
    /// LBA), distinct.
    pub switches: Vec<L2pSwitch>,
}

impl Checkpoint {
    /// Bytes the encoded checkpoint takes (header block + payload, rounded up to blocks).
    /// `volume_table_blocks`: 1, or 2 for a table with limits (version 3).
    pub fn encoded_blocks(
        region_count: usize,
        directory_pages: usize,
        directory_count: usize,
        volume_table_blocks: u32,
        switches: usize,
    ) -> u64 {
        let payload = Self::parts_len(
            region_count,
            directory_pages,
            directory_count,
            volume_table_blocks,
        ) + l2p_switches_len(switches);
        1 + payload.div_ceil(BLOCK_SIZE) as u64
    }

    /// Payload bytes before the switch table, at most (directories in the dense form).
    fn parts_len(
        region_count: usize,
        directory_pages: usize,
        directory_count: usize,
        volume_table_blocks: u32,
    ) -> usize {
        crate::REGION_TABLE_HEADER_LEN
            + region_count * crate::REGION_ENTRY_LEN
            + volume_table_blocks.max(1) as usize * BLOCK_SIZE
            + directory_count * crate::L2P_DIR_HEADER_LEN
            + directory_pages * 8
    }

    /// The most switches a checkpoint with these other parts fits in an area of
    /// `area_blocks` (0 when not even one fits).
    pub fn switch_room(
        area_blocks: u64,
        region_count: usize,
        directory_pages: usize,
        directory_count: usize,
        volume_table_blocks: u32,
    ) -> usize {
        let payload = usize::try_from(area_blocks.saturating_sub(1))
            .unwrap_or(usize::MAX / BLOCK_SIZE)
            .saturating_mul(BLOCK_SIZE);
        let parts = Self::parts_len(
            region_count,
            directory_pages,
            directory_count,
            volume_table_blocks,
        ) + crate::L2P_SWITCHES_HEADER_LEN;
        payload.saturating_sub(parts) / crate::L2P_SWITCH_LEN
    }

    /// Encodes header + payload, padded to whole blocks. Fills in the header's payload
    /// fields.
    pub fn encode(&self) -> Vec<u8> {
        let len = Self::encoded_blocks(
            self.regions.len(),
            self.directories.iter().map(|d| d.pages.len()).sum(),
            self.directories.len(),
            self.volumes.blocks_needed(),
            self.switches.len(),
        ) as usize
            * BLOCK_SIZE;
        let mut out = vec![0u8; len];
        let mut piece = vec![0u8; 16 * BLOCK_SIZE];
        let r: Result<u64, std::convert::Infallible> = self.encode_to(&mut piece, |at, b| {
            out[at as usize..at as usize + b.len()].copy_from_slice(b);
            Ok(())
        });
        let Ok(n) = r;
        // The bound is the dense form's; sparse directories take less.
        debug_assert!(n as usize <= len);
        out.truncate(n as usize);
        out
    }

    /// Streams the bytes `encode` returns through `piece` (whole blocks, at least one):
    /// `sink(offset, bytes)` receives the payload in order, in pieces of whole blocks
    /// (the last one zero-padded), then the header block at offset 0, which carries the
    /// payload's length and CRC. Returns the image's length. At TiB scale the image is
    /// megabytes; this holds one piece instead of the image (several times over while
    /// it grows). The first sink error stops the encoding and is returned.
    pub fn encode_to<E>(
        &self,
        piece: &mut [u8],
        mut sink: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<u64, E> {
        assert!(
            piece.len() >= BLOCK_SIZE && piece.len().is_multiple_of(BLOCK_SIZE),
            "checkpoint pieces are whole blocks"
        );
        let mut p = Pieces {
            buf: piece,
            fill: 0,
            at: BLOCK_SIZE as u64,
            crc: 0,
            payload: 0,
            sink: &mut sink,
            err: None,
        };
        crate::region_table::region_table_chunks(&self.regions, &mut |b| p.put(b));
        p.put(&self.volumes.encode_in(self.volumes.blocks_needed()));
        for d in &self.directories {
            d.chunks(&mut |b| p.put(b));
        }
        if !self.switches.is_empty() {
            switch_chunks(&self.switches, &mut |b| p.put(b));
        }
        p.flush(true);
        if let Some(e) = p.err {
            return Err(e);
        }
        let (payload, crc, end) = (p.payload, p.crc, p.at);
        let mut h = self.header.clone();
        h.payload_bytes = payload;
        h.payload_crc = crc;
        h.region_count = self.regions.len() as u32;
        h.directory_count = self.directories.len() as u32;
        h.switch_count = self.switches.len() as u32;
        piece[..BLOCK_SIZE].copy_from_slice(&h.encode());
        sink(0, &piece[..BLOCK_SIZE])?;
        Ok(end)
    }

    /// Decodes a checkpoint from the bytes of its area (`at` = the area's byte offset),
    /// its directories describing at most 8 pages per input byte (what a dense
    /// directory of these bytes could hold).
    pub fn decode(buf: &[u8], at: u64) -> Result<Checkpoint, FormatError> {
        Self::decode_bounded(buf, at, 8 * buf.len() as u64)
    }

    /// [`Self::decode`], its directories describing at most `max_pages` pages in all
    /// (a pool's L2P page count: sparse directories are expanded as they decode).
    pub fn decode_bounded(buf: &[u8], at: u64, max_pages: u64) -> Result<Checkpoint, FormatError> {
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
        let got = crate::crc32c(payload);
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
        let vt_len = VolumeTable::encoded_len(&payload[pos.min(payload.len())..]);
        let vt_end = pos
            .checked_add(vt_len)
            .filter(|&e| e <= payload.len())
            .ok_or(FormatError::Truncated {
                structure: Structure::VolumeTable,
                at: pat + pos as u64,
                len: payload.len(),
                need: pos + vt_len,
            })?;
        let volumes = VolumeTable::decode(&payload[pos..vt_end], pat + pos as u64)?;
        pos = vt_end;
        let mut directories =
            Vec::with_capacity((header.directory_count as usize).min(crate::VOLUMES_MAX as usize));
        let mut left = max_pages;
        for _ in 0..header.directory_count {
            let (d, used) = L2pDirectory::decode(&payload[pos..], pat + pos as u64, left)?;
            left -= d.pages.len() as u64;
            directories.push(d);
            pos += used;
        }
        let switches = if header.switch_count == 0 {
            Vec::new()
        } else {
            let n = header.switch_count as usize;
            let (sw, _) =
                decode_l2p_switches(&payload[pos.min(payload.len())..], pat + pos as u64, n)?;
            if sw.len() != n {
                return Err(Reader::new(payload, s, at)
                    .invalid("switch_count", format!("{} != {n}", sw.len())));
            }
            sw
        };
        Ok(Checkpoint {
            header,
            regions,
            volumes,
            directories,
            switches,
        })
    }
}

/// The payload being streamed: a buffer of whole blocks handed to the sink when full.
struct Pieces<'a, E, F: FnMut(u64, &[u8]) -> Result<(), E>> {
    buf: &'a mut [u8],
    fill: usize,
    /// Image offset of `buf[0]`.
    at: u64,
    crc: u32,
    payload: u64,
    sink: &'a mut F,
    err: Option<E>,
}

impl<E, F: FnMut(u64, &[u8]) -> Result<(), E>> Pieces<'_, E, F> {
    fn put(&mut self, mut b: &[u8]) {
        if self.err.is_some() {
            return;
        }
        self.crc = crate::crc32c_append(self.crc, b);
        self.payload += b.len() as u64;
        while !b.is_empty() {
            let n = b.len().min(self.buf.len() - self.fill);
            self.buf[self.fill..self.fill + n].copy_from_slice(&b[..n]);
            self.fill += n;
            b = &b[n..];
            if self.fill == self.buf.len() {
                self.flush(false);
                if self.err.is_some() {
                    return;
                }
            }
        }
    }

    /// Hands the filled part to the sink (`last`: zero-padded to a whole block).
    fn flush(&mut self, last: bool) {
        if self.fill == 0 || self.err.is_some() {
            return;
        }
        let len = if last {
            let len = self.fill.div_ceil(BLOCK_SIZE) * BLOCK_SIZE;
            self.buf[self.fill..len].fill(0);
            len
        } else {
            self.fill
        };
        if let Err(e) = (self.sink)(self.at, &self.buf[..len]) {
            self.err = Some(e);
        }
        self.at += len as u64;
        self.fill = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PageDesc, Sid, VolumeEntry, VolumeId, VolumeUid};
    use proptest::prelude::*;

    proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..9000)) {
                let _ = Checkpoint::decode(&bytes, 0);
            }

            #[test]
            fn roundtrip(gen in any::<u64>(), sid in any::<u64>(), jb in any::<u32>(), js in any::<u64>(), time in any::<u64>(),
                         regions in proptest::collection::vec(crate::region_table::tests::entry(), 0..40),
                         dirs in proptest::collection::vec(proptest::collection::vec((any::<u32>(), any::<u32>()), 0..30), 0..5),
                         raw_switches in proptest::collection::btree_map((0u32..5, 0u64..100_000), any::<u64>(), 0..40)) {
                let volumes = VolumeTable { generation: 4, uid_next: VolumeUid(100), entries: dirs.iter().enumerate().map(|(i, d)| VolumeEntry {
                    id: VolumeId(i as u32), uid: VolumeUid(i as u64 + 1), name: format!("v{i}"), size_blocks: d.len() as u64 * 1024, created_sid: Sid(1), created_pos: 0, limits: crate::VolumeLimits { iops_max: i as u64 % 2 * 100, bytes_per_sec_max: 0, ..crate::VolumeLimits::NONE }, whole_size_blocks: 0, map_unit_shift: 0,
    dual_map: false,
                }).collect() };
                let directories: Vec<L2pDirectory> = dirs.iter().enumerate().map(|(i, d)| L2pDirectory {
                    volume: VolumeId(i as u32), pages: d.iter().map(|&(slot, crc32c)| PageDesc { slot, crc32c }).collect(),
                }).collect();
                let dir_pages: usize = directories.iter().map(|d| d.pages.len()).sum();
                let switches: Vec<L2pSwitch> = raw_switches.iter().map(|(&(v, l), &p)| L2pSwitch::new(VolumeId(v), crate::Lba(l), crate::Pba(p)).unwrap()).collect();
                let c = Checkpoint {
                    header: CheckpointHeader { generation: gen, sid_next: sid, journal_next_block: jb, journal_sequence: js, time, ..Default::default() },
                    regions, volumes, directories, switches,
                };
                let mut bytes = c.encode();
                let blocks = Checkpoint::encoded_blocks(c.regions.len(), dir_pages, c.directories.len(), c.volumes.blocks_needed(), c.switches.len());
                prop_assert_eq!(bytes.len() as u64, blocks * BLOCK_SIZE as u64);
                // The room an area of exactly this size leaves is at least what it holds.
                prop_assert!(Checkpoint::switch_room(blocks, c.regions.len(), dir_pages, c.directories.len(), c.volumes.blocks_needed()) >= c.switches.len());
                let version = u16::from_le_bytes([bytes[4], bytes[5]]);
                prop_assert_eq!(version, if c.switches.is_empty() { CHECKPOINT_VERSION } else { CHECKPOINT_VERSION_SWITCHES });
                let d = Checkpoint::decode(&bytes, 0).unwrap();
                prop_assert_eq!(&d.regions, &c.regions);
                prop_assert_eq!(&d.volumes, &c.volumes);
                prop_assert_eq!(&d.directories, &c.directories);
                prop_assert_eq!(&d.switches, &c.switches);
                prop_assert_eq!(d.header.generation, gen);
                prop_assert_eq!(d.header.time, time);
                bytes[BLOCK_SIZE + 3] ^= 1;
                let is_crc = matches!(Checkpoint::decode(&bytes, 0), Err(FormatError::ChecksumMismatch { .. }));
                prop_assert!(is_crc);
            }
        }

    /// A checkpoint spanning many pieces streams to the same bytes whatever the piece
    /// size, decodes, and the first sink error stops it.
    #[test]
    fn streaming_matches_whole_image_and_stops_on_error() {
        let regions: Vec<RegionEntry> = (0..3000u32)
            .map(|i| RegionEntry {
                valid_count: i,
                write_pointer: i * 3,
                close_time: u64::from(i) << 20,
                sid: Sid(u64::from(i) + 7),
                ..Default::default()
            })
            .collect();
        let directories: Vec<L2pDirectory> = (0..3u32)
            .map(|v| L2pDirectory {
                volume: VolumeId(v),
                pages: (0..5000 + v * 77)
                    .map(|p| PageDesc {
                        slot: p * 2 + v,
                        crc32c: p ^ 0xdead_beef,
                    })
                    .collect(),
            })
            .collect();
        let c = Checkpoint {
            header: CheckpointHeader {
                generation: 9,
                ..Default::default()
            },
            regions,
            volumes: VolumeTable {
                generation: 1,
                uid_next: VolumeUid(4),
                entries: (0..3)
                    .map(|i| VolumeEntry {
                        id: VolumeId(i),
                        uid: VolumeUid(u64::from(i) + 1),
                        name: format!("v{i}"),
                        size_blocks: 6_000_000,
                        created_sid: Sid(1),
                        created_pos: 0,
                        limits: crate::VolumeLimits::NONE,
                        whole_size_blocks: 0,
                        map_unit_shift: 0,
                        dual_map: false,
                    })
                    .collect(),
            },
            directories,
            switches: (0..20_000u64)
                .map(|i| {
                    L2pSwitch::new(VolumeId((i % 3) as u32), crate::Lba(i * 7), crate::Pba(i))
                        .unwrap()
                })
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        };
        let whole = c.encode();
        assert!(whole.len() > 30 * BLOCK_SIZE);
        for blocks in [1usize, 3, 256] {
            let mut out = vec![0u8; whole.len()];
            let mut piece = vec![0u8; blocks * BLOCK_SIZE];
            let mut calls = 0;
            let n = c
                .encode_to(&mut piece, |at, b| -> Result<(), ()> {
                    assert!(b.len().is_multiple_of(BLOCK_SIZE) && b.len() <= blocks * BLOCK_SIZE);
                    out[at as usize..at as usize + b.len()].copy_from_slice(b);
                    calls += 1;
                    Ok(())
                })
                .unwrap();
            assert_eq!(n as usize, whole.len());
            assert_eq!(out, whole, "pieces of {blocks} blocks");
            assert_eq!(calls, (whole.len() / BLOCK_SIZE - 1).div_ceil(blocks) + 1);
        }
        let d = Checkpoint::decode(&whole, 0).unwrap();
        assert_eq!(
            d,
            Checkpoint {
                header: d.header.clone(),
                ..c.clone()
            }
        );
        let mut piece = vec![0u8; BLOCK_SIZE];
        let mut calls = 0;
        let r = c.encode_to(&mut piece, |_, _| {
            calls += 1;
            if calls == 5 {
                Err("device gone")
            } else {
                Ok(())
            }
        });
        assert_eq!(r, Err("device gone"));
        assert_eq!(calls, 5, "nothing is written after the first error");
    }
}
