//! The hand-off image: what the engine's next durability point would write, kept in
//! memory that outlives the process (a tmpfs file) but not the machine.
//!
//! The engine acknowledges a write once its blocks are on the cache device, before
//! their md and write pointer are durable; a durability point makes them so. Were the
//! process killed in between, the blocks would be on the device (the kernel finishes
//! what was handed to it) but nothing would say where: the write would be lost though
//! the client was told it was done, and a client that outlives the process (a VM whose
//! QEMU reconnects) would go on as if it were not. So before it acknowledges anything,
//! the engine stores this image; the next instance, finding it valid for the pool and
//! continuing the journal on the device exactly, writes it as the dead instance's
//! durability point would have, and recovery then finds every acknowledged write.
//!
//! Layout (little-endian): a 64-byte header (magic, version, md count, journal entry
//! count, CRC32C of the whole image with this field zero, pool UUID, the journal
//! sequence and ring index its first entry continues from), then per md block its
//! chunk region, group and copy (16 bytes) and the sealed block, then the journal
//! entries as encoded [`JournalBlock`]s. Every block carries its own CRC too; the
//! decoder checks them all and never panics.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::md::{decode_md_header, MdRegionKind};
use crate::{FormatError, JournalBlock, RegionId, Structure, BLOCK_SIZE};

pub const HANDOFF_MAGIC: u32 = 0x4F48_4853; // "SHHO"
pub const HANDOFF_VERSION: u16 = 1;
pub const HANDOFF_HEADER_LEN: usize = 64;
pub(crate) const MD_ITEM_LEN: usize = 16 + BLOCK_SIZE;

/// One md block to write: copy `copy` (0 = A, 1 = B) of group `group` of chunk
/// `region`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffMd {
    pub region: RegionId,
    pub group: u32,
    pub copy: u32,
    pub block: Box<[u8; BLOCK_SIZE]>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandoffImage {
    pub pool: [u8; 16],
    /// Sequence number the first journal entry takes (the one after the last entry
    /// on the device when the image was made).
    pub sequence: u64,
    /// Ring index of the first journal entry.
    pub next: u32,
    pub md: Vec<HandoffMd>,
    pub journal: Vec<JournalBlock>,
}

impl HandoffImage {
    pub fn encoded_len(&self) -> usize {
        HANDOFF_HEADER_LEN + self.md.len() * MD_ITEM_LEN + self.journal.len() * BLOCK_SIZE
    }

    /// Encodes the image into `out` (cleared first); `None` if a journal block does
    /// not encode (over-filled).
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Option<()> {
        out.clear();
        out.resize(self.encoded_len(), 0);
        let md_count = u16::try_from(self.md.len()).ok()?;
        let journal_count = u32::try_from(self.journal.len()).ok()?;
        {
            let mut w = Writer::new(&mut out[..HANDOFF_HEADER_LEN]);
            w.u32(HANDOFF_MAGIC);
            w.u16(HANDOFF_VERSION);
            w.u16(md_count);
            w.u32(0);
            w.u32(journal_count);
            w.bytes(&self.pool);
            w.u64(self.sequence);
            w.u32(self.next);
        }
        let mut pos = HANDOFF_HEADER_LEN;
        for m in &self.md {
            let mut w = Writer::at(&mut out[..], pos);
            w.u32(m.region.0);
            w.u32(m.group);
            w.u32(m.copy);
            w.u32(0);
            w.bytes(&m.block[..]);
            pos += MD_ITEM_LEN;
        }
        for j in &self.journal {
            out[pos..pos + BLOCK_SIZE].copy_from_slice(&j.encode()?);
            pos += BLOCK_SIZE;
        }
        let len = out.len();
        seal(&mut out[..], len);
        Some(())
    }

    pub fn encode(&self) -> Option<Vec<u8>> {
        let mut v = Vec::new();
        self.encode_into(&mut v).map(|()| v)
    }

    /// Decodes and checks an image: lengths, CRCs, each md block naming the chunk
    /// group it is stored for, journal entries with consecutive sequence numbers from
    /// the header's.
    pub fn decode(buf: &[u8]) -> Result<HandoffImage, FormatError> {
        let s = Structure::Handoff;
        check_header(
            buf,
            s,
            0,
            HANDOFF_MAGIC,
            HANDOFF_VERSION,
            HANDOFF_HEADER_LEN,
        )?;
        let mut r = Reader::at(buf, 6, s, 0);
        let md_count = usize::from(r.u16()?);
        r.skip(4)?;
        let journal_count = r.u32()? as usize;
        let len = md_count
            .checked_mul(MD_ITEM_LEN)
            .and_then(|m| journal_count.checked_mul(BLOCK_SIZE)?.checked_add(m))
            .and_then(|b| b.checked_add(HANDOFF_HEADER_LEN));
        if len != Some(buf.len()) {
            return Err(r.invalid(
                "counts",
                format!(
                    "{md_count} md blocks and {journal_count} journal entries do not fill {} bytes",
                    buf.len()
                ),
            ));
        }
        check_crc(buf, s, 0)?;
        let mut pool = [0u8; 16];
        pool.copy_from_slice(r.bytes(16)?);
        let sequence = r.u64()?;
        let next = r.u32()?;
        let mut pos = HANDOFF_HEADER_LEN;
        let mut md = Vec::with_capacity(md_count);
        for _ in 0..md_count {
            let mut r = Reader::at(buf, pos, s, 0);
            let region = RegionId(r.u32()?);
            let group = r.u32()?;
            let copy = r.u32()?;
            if copy > 1 {
                return Err(r.invalid("md copy", format!("{copy}")));
            }
            let at = pos as u64 + 16;
            let bytes = &buf[pos + 16..pos + MD_ITEM_LEN];
            let h = decode_md_header(bytes, at)?;
            if h.region != region || h.group != group || h.region_kind != MdRegionKind::Chunk {
                return Err(r.invalid(
                    "md block",
                    format!(
                        "stored for chunk {region} group {group}, names {} group {} ({:?})",
                        h.region, h.group, h.region_kind
                    ),
                ));
            }
            let mut block = Box::new([0u8; BLOCK_SIZE]);
            block.copy_from_slice(bytes);
            md.push(HandoffMd {
                region,
                group,
                copy,
                block,
            });
            pos += MD_ITEM_LEN;
        }
        let mut journal = Vec::with_capacity(journal_count);
        for i in 0..journal_count {
            let b = JournalBlock::decode(&buf[pos..pos + BLOCK_SIZE], pos as u64)?;
            let want = sequence.checked_add(i as u64);
            if Some(b.sequence) != want {
                return Err(Reader::at(buf, pos, s, pos as u64).invalid(
                    "journal sequence",
                    format!("entry {i} has sequence {}, expected {want:?}", b.sequence),
                ));
            }
            journal.push(b);
            pos += BLOCK_SIZE;
        }
        Ok(HandoffImage {
            pool,
            sequence,
            next,
            md,
            journal,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{seal_md, write_md_entry, JournalRecord, MdEntry, MdHeader, Sid};

    fn md_block(region: u32, group: u32) -> Box<[u8; BLOCK_SIZE]> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        write_md_entry(&mut b[..], 0, &MdEntry::EMPTY);
        seal_md(
            &mut b[..],
            &MdHeader {
                region_kind: MdRegionKind::Chunk,
                region: RegionId(region),
                group,
                entry_count: 1,
                region_sid: Sid(7),
                generation: 3,
            },
        );
        b
    }

    fn image() -> HandoffImage {
        HandoffImage {
            pool: [9; 16],
            sequence: 41,
            next: 5,
            md: vec![HandoffMd {
                region: RegionId(3),
                group: 2,
                copy: 1,
                block: md_block(3, 2),
            }],
            journal: vec![
                JournalBlock {
                    epoch: 4,
                    sequence: 41,
                    records: vec![JournalRecord::RegionClosed {
                        region: RegionId(2),
                    }],
                },
                JournalBlock {
                    epoch: 4,
                    sequence: 42,
                    records: vec![JournalRecord::FlushPoint {
                        regions: vec![(RegionId(3), 300)],
                    }],
                },
            ],
        }
    }

    #[test]
    fn an_image_round_trips() {
        let i = image();
        let b = i.encode().unwrap();
        assert_eq!(b.len(), i.encoded_len());
        assert_eq!(HandoffImage::decode(&b).unwrap(), i);
        let empty = HandoffImage {
            md: vec![],
            journal: vec![],
            ..i
        };
        assert_eq!(
            HandoffImage::decode(&empty.encode().unwrap()).unwrap(),
            empty
        );
    }

    #[test]
    fn damage_anywhere_is_a_typed_error() {
        let b = image().encode().unwrap();
        for at in (0..b.len()).step_by(97) {
            let mut d = b.clone();
            d[at] ^= 0x40;
            assert!(HandoffImage::decode(&d).is_err(), "flip at {at} accepted");
        }
        for len in [0, 11, 63, 64, b.len() - 1] {
            assert!(
                HandoffImage::decode(&b[..len]).is_err(),
                "length {len} accepted"
            );
        }
    }

    #[test]
    fn an_md_block_stored_for_another_group_is_refused() {
        let mut i = image();
        i.md[0].group = 5;
        let e = HandoffImage::decode(&i.encode().unwrap()).unwrap_err();
        assert!(e.to_string().contains("stored for chunk"), "{e}");
    }

    #[test]
    fn journal_entries_must_follow_the_header_sequence() {
        let mut i = image();
        i.journal[1].sequence = 44;
        let e = HandoffImage::decode(&i.encode().unwrap()).unwrap_err();
        assert!(e.to_string().contains("journal sequence"), "{e}");
    }
}
