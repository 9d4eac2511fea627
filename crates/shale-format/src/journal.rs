//! Journal blocks: the records made durable at each flush between checkpoints.
//!
//! The journal area is a ring of entries; entry `i` is a mirrored pair of identical
//! blocks (area blocks `2i` and `2i + 1`) written together, each entry once per lap
//! (never rewritten in place, so a torn write can only lose the entry being written,
//! and a corrupt copy is caught by its CRC while the other copy still reads). A block
//! carries the checkpoint epoch it follows and a sequence number that never repeats;
//! recovery reads entries from the checkpoint's journal position while the sequence
//! numbers are consecutive and the epoch is the checkpoint's or the next one (the
//! epoch of a checkpoint still being taken).

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{FormatError, Lba, RegionId, Sid, Structure, VolumeId, BLOCK_SIZE};

pub const JOURNAL_MAGIC: u32 = u32::from_le_bytes(*b"SHJL");
pub const JOURNAL_VERSION: u16 = 1;
pub const JOURNAL_HEADER_LEN: usize = 32;
/// Bytes available for records in one block.
pub const JOURNAL_PAYLOAD_MAX: usize = BLOCK_SIZE - JOURNAL_HEADER_LEN;
/// Region write pointers one FlushPoint record can carry.
pub const FLUSH_POINT_REGIONS_MAX: usize = (JOURNAL_PAYLOAD_MAX - 3) / 8;

/// Ring entries of a journal area of `journal_blocks` blocks (two blocks per entry).
pub const fn journal_ring_entries(journal_blocks: u32) -> u32 {
    journal_blocks / 2
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalRecord {
    RegionOpened {
        region: RegionId,
        sid: Sid,
    },
    RegionClosed {
        region: RegionId,
    },
    /// `key` orders the trim among user writes: (open chunk SID, write pointer).
    Trim {
        volume: VolumeId,
        lba: Lba,
        count: u64,
        key_sid: Sid,
        key_pos: u32,
    },
    /// Durable write pointers of the open regions at a flush.
    FlushPoint {
        regions: Vec<(RegionId, u32)>,
    },
    VolumeChanged {
        volume: VolumeId,
        size_blocks: u64,
        live: bool,
    },
}

impl JournalRecord {
    pub fn encoded_len(&self) -> usize {
        1 + match self {
            JournalRecord::RegionOpened { .. } => 12,
            JournalRecord::RegionClosed { .. } => 4,
            JournalRecord::Trim { .. } => 32,
            JournalRecord::FlushPoint { regions } => 2 + 8 * regions.len(),
            JournalRecord::VolumeChanged { .. } => 13,
        }
    }

    fn write(&self, w: &mut Writer<'_>) {
        match self {
            JournalRecord::RegionOpened { region, sid } => {
                w.u8(1);
                w.u32(region.0);
                w.u64(sid.0);
            }
            JournalRecord::RegionClosed { region } => {
                w.u8(2);
                w.u32(region.0);
            }
            JournalRecord::Trim {
                volume,
                lba,
                count,
                key_sid,
                key_pos,
            } => {
                w.u8(3);
                w.u32(volume.0);
                w.u64(lba.0);
                w.u64(*count);
                w.u64(key_sid.0);
                w.u32(*key_pos);
            }
            JournalRecord::FlushPoint { regions } => {
                w.u8(4);
                w.u16(regions.len() as u16);
                for (r, wp) in regions {
                    w.u32(r.0);
                    w.u32(*wp);
                }
            }
            JournalRecord::VolumeChanged {
                volume,
                size_blocks,
                live,
            } => {
                w.u8(5);
                w.u32(volume.0);
                w.u64(*size_blocks);
                w.u8(u8::from(*live));
            }
        }
    }

    fn read(r: &mut Reader<'_>) -> Result<JournalRecord, FormatError> {
        Ok(match r.u8()? {
            1 => JournalRecord::RegionOpened {
                region: RegionId(r.u32()?),
                sid: Sid(r.u64()?),
            },
            2 => JournalRecord::RegionClosed {
                region: RegionId(r.u32()?),
            },
            3 => JournalRecord::Trim {
                volume: VolumeId(r.u32()?),
                lba: Lba(r.u64()?),
                count: r.u64()?,
                key_sid: Sid(r.u64()?),
                key_pos: r.u32()?,
            },
            4 => {
                let n = r.u16()?;
                let mut regions = Vec::with_capacity(usize::from(n).min(FLUSH_POINT_REGIONS_MAX));
                for _ in 0..n {
                    regions.push((RegionId(r.u32()?), r.u32()?));
                }
                JournalRecord::FlushPoint { regions }
            }
            5 => JournalRecord::VolumeChanged {
                volume: VolumeId(r.u32()?),
                size_blocks: r.u64()?,
                live: match r.u8()? {
                    0 => false,
                    1 => true,
                    x => return Err(r.invalid("live", format!("{x}"))),
                },
            },
            t => return Err(r.invalid("record tag", format!("{t}"))),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalBlock {
    pub epoch: u64,
    pub sequence: u64,
    pub records: Vec<JournalRecord>,
}

impl JournalBlock {
    pub fn payload_len(records: &[JournalRecord]) -> usize {
        records.iter().map(JournalRecord::encoded_len).sum()
    }

    /// Encodes the block; `None` if the records do not fit in one block.
    pub fn encode(&self) -> Option<[u8; BLOCK_SIZE]> {
        let used = Self::payload_len(&self.records);
        if used > JOURNAL_PAYLOAD_MAX || self.records.len() > usize::from(u16::MAX) {
            return None;
        }
        if self.records.iter().any(|r| {
            matches!(r, JournalRecord::FlushPoint { regions } if regions.len() > FLUSH_POINT_REGIONS_MAX)
        }) {
            return None;
        }
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(JOURNAL_MAGIC);
        w.u16(JOURNAL_VERSION);
        w.u16(self.records.len() as u16);
        w.u32(0);
        w.u16(used as u16);
        w.u16(0);
        w.u64(self.epoch);
        w.u64(self.sequence);
        for r in &self.records {
            r.write(&mut w);
        }
        seal(&mut b, BLOCK_SIZE);
        Some(b)
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<JournalBlock, FormatError> {
        let s = Structure::JournalBlock;
        check_header(buf, s, at, JOURNAL_MAGIC, JOURNAL_VERSION, BLOCK_SIZE)?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 6, s, at);
        let count = r.u16()?;
        let mut r = Reader::at(buf, 12, s, at);
        let used = usize::from(r.u16()?);
        if used > JOURNAL_PAYLOAD_MAX {
            return Err(r.invalid("used_bytes", format!("{used} > {JOURNAL_PAYLOAD_MAX}")));
        }
        r.skip(2)?;
        let epoch = r.u64()?;
        let sequence = r.u64()?;
        let payload = &buf[..JOURNAL_HEADER_LEN + used];
        let mut r = Reader::at(payload, JOURNAL_HEADER_LEN, s, at);
        let mut records = Vec::with_capacity(usize::from(count).min(JOURNAL_PAYLOAD_MAX));
        for _ in 0..count {
            records.push(JournalRecord::read(&mut r)?);
        }
        if r.pos() != payload.len() {
            return Err(r.invalid(
                "used_bytes",
                format!("records end at {}, header says {}", r.pos(), payload.len()),
            ));
        }
        Ok(JournalBlock {
            epoch,
            sequence,
            records,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn record() -> impl Strategy<Value = JournalRecord> {
        prop_oneof![
            (any::<u32>(), any::<u64>()).prop_map(|(r, s)| JournalRecord::RegionOpened {
                region: RegionId(r),
                sid: Sid(s)
            }),
            any::<u32>().prop_map(|r| JournalRecord::RegionClosed {
                region: RegionId(r)
            }),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                any::<u32>()
            )
                .prop_map(|(v, l, c, s, p)| JournalRecord::Trim {
                    volume: VolumeId(v),
                    lba: Lba(l),
                    count: c,
                    key_sid: Sid(s),
                    key_pos: p
                }),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..20).prop_map(|v| {
                JournalRecord::FlushPoint {
                    regions: v.into_iter().map(|(r, w)| (RegionId(r), w)).collect(),
                }
            }),
            (any::<u32>(), any::<u64>(), any::<bool>()).prop_map(|(v, s, live)| {
                JournalRecord::VolumeChanged {
                    volume: VolumeId(v),
                    size_blocks: s,
                    live,
                }
            }),
        ]
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = JournalBlock::decode(&bytes, 0);
        }

        #[test]
        fn roundtrip(epoch in any::<u64>(), seq in any::<u64>(), records in proptest::collection::vec(record(), 0..30)) {
            let b = JournalBlock { epoch, sequence: seq, records };
            match b.encode() {
                Some(bytes) => prop_assert_eq!(JournalBlock::decode(&bytes, 0), Ok(b)),
                None => prop_assert!(JournalBlock::payload_len(&b.records) > JOURNAL_PAYLOAD_MAX),
            }
        }
    }

    #[test]
    fn oversized_flush_point_is_refused() {
        let regions = (0..FLUSH_POINT_REGIONS_MAX as u32 + 1)
            .map(|r| (RegionId(r), 0))
            .collect();
        let b = JournalBlock {
            epoch: 0,
            sequence: 0,
            records: vec![JournalRecord::FlushPoint { regions }],
        };
        assert!(b.encode().is_none());
    }
}
