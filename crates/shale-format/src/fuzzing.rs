//! Entry points shared by the cargo-fuzz targets (`fuzz/` at the repository root) and
//! the stable stand-in (`tests/fuzz_corpus.rs`), so both exercise the same code.
//!
//! Each takes the bytes of a structure as media could hold them, behind one control
//! byte. Control bit 0 reseals every checksum before decoding: a mutated field would
//! otherwise almost never get past the CRC32C to the field checks behind it. A
//! decoder must return a typed error for any input; when it accepts one, the value
//! must encode and decode back to itself. A broken round trip is a panic here.

use crate::codec::seal;
use crate::{
    decode_md, decode_md_entry, decode_md_header, encode_md, md_claimed_generation, ArrayLabel,
    CapacityLabel, Checkpoint, CheckpointHeader, JournalBlock, Superblock, VolumeTable, BLOCK_SIZE,
    GROUP_DATA_SLOTS, L2P_DIR_HEADER_LEN, REGION_ENTRY_LEN, REGION_TABLE_HEADER_LEN,
};

/// The byte offset decoders are told the structure came from (only echoed in errors).
const AT: u64 = 3 * BLOCK_SIZE as u64;

/// Splits off the control byte; `None` for an empty input.
fn split(data: &[u8]) -> Option<(bool, Vec<u8>)> {
    let (&control, rest) = data.split_first()?;
    Some((control & 1 == 1, rest.to_vec()))
}

/// Reseals a one-block structure whose CRC covers the whole block.
fn reseal_block(buf: &mut [u8]) {
    if buf.len() >= BLOCK_SIZE {
        seal(buf, BLOCK_SIZE);
    }
}

fn u32_at(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

fn u64_at(buf: &[u8], at: usize) -> Option<u64> {
    let b = buf.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// The superblock (cache device blocks 0 and 1).
pub fn superblock(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
    }
    if let Ok(sb) = Superblock::decode(&buf, AT) {
        assert_eq!(sb.validate(), Ok(()), "a decoded superblock validates");
        assert_eq!(Superblock::decode(&sb.encode(), AT), Ok(sb));
    }
}

/// An array member's label (a capacity member's zone 0, a cache mirror's first
/// blocks).
pub fn array_label(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
    }
    if let Ok(l) = ArrayLabel::decode(&buf, AT) {
        assert!(
            usize::from(l.index) < l.members.len(),
            "the carrier is a member"
        );
        assert_eq!(ArrayLabel::decode(&l.encode(), AT), Ok(l));
    }
}

/// The capacity label (capacity device, zone 0).
pub fn capacity_label(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
    }
    if let Ok(l) = CapacityLabel::decode(&buf, AT) {
        assert_eq!(CapacityLabel::decode(&l.encode(), AT), Ok(l));
    }
}

/// An md block (a group's P2L map), whole and entry by entry as the read path and
/// recovery read it.
pub fn md_block(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
    }
    let _ = md_claimed_generation(&buf);
    let header = decode_md_header(&buf, AT);
    // The readers decode single entries of a verified block, and check the index.
    for i in [0, GROUP_DATA_SLOTS - 1, GROUP_DATA_SLOTS, usize::MAX] {
        let _ = decode_md_entry(&buf, i, AT);
    }
    match decode_md(&buf, AT) {
        Ok((h, entries)) => {
            assert_eq!(header.as_ref(), Ok(&h));
            let mut out = vec![0u8; BLOCK_SIZE];
            encode_md(&mut out, &h, &entries);
            assert_eq!(decode_md(&out, AT), Ok((h, entries)));
        }
        Err(_) => {
            // A header that verifies while an entry does not is an entry's error.
        }
    }
}

/// Reseals a checkpoint area: the region table, the volume table block and each L2P
/// directory inside the payload, then the payload CRC and the header, walking the
/// payload the way the decoder does.
fn reseal_checkpoint(buf: &mut [u8]) {
    if buf.len() < BLOCK_SIZE {
        return;
    }
    let payload_len = u64_at(buf, 48)
        .and_then(|n| usize::try_from(n).ok())
        .map_or(0, |n| n.min(buf.len() - BLOCK_SIZE));
    let directories = u32_at(buf, 64).unwrap_or(0);
    {
        let payload = &mut buf[BLOCK_SIZE..BLOCK_SIZE + payload_len];
        let mut pos = 0usize;
        if let Some(count) = u32_at(payload, 12) {
            let len = (count as usize)
                .saturating_mul(REGION_ENTRY_LEN)
                .saturating_add(REGION_TABLE_HEADER_LEN);
            if len <= payload.len() {
                seal(&mut payload[..len], len);
                pos = len;
            }
        }
        if pos + BLOCK_SIZE <= payload.len() {
            seal(&mut payload[pos..pos + BLOCK_SIZE], BLOCK_SIZE);
            pos += BLOCK_SIZE;
            for _ in 0..directories.min(crate::VOLUMES_MAX) {
                let Some(pages) = u32_at(payload, pos + 16) else {
                    break;
                };
                let len = (pages as usize)
                    .saturating_mul(8)
                    .saturating_add(L2P_DIR_HEADER_LEN);
                let Some(end) = pos.checked_add(len).filter(|&e| e <= payload.len()) else {
                    break;
                };
                seal(&mut payload[pos..end], len);
                pos = end;
            }
        }
    }
    let crc = crate::crc32c(&buf[BLOCK_SIZE..BLOCK_SIZE + payload_len]);
    buf[56..60].copy_from_slice(&crc.to_le_bytes());
    seal(buf, BLOCK_SIZE);
}

/// A checkpoint area: header block, then region table, volume table and L2P
/// directories.
pub fn checkpoint(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_checkpoint(&mut buf);
    }
    let _ = CheckpointHeader::decode(&buf, AT);
    if let Ok(c) = Checkpoint::decode(&buf, AT) {
        // Re-encoded, sparse directories may be far smaller than the input: the
        // bound is the pages decoded, not the new length.
        let pages: usize = c.directories.iter().map(|d| d.pages.len()).sum();
        let again = Checkpoint::decode_bounded(&c.encode(), AT, pages as u64);
        let Ok(d) = again else {
            panic!("a decoded checkpoint does not decode once re-encoded: {again:?}");
        };
        assert_eq!(d.regions, c.regions);
        assert_eq!(d.volumes, c.volumes);
        assert_eq!(d.directories, c.directories);
        assert_eq!(d.switches, c.switches);
        let (h, g) = (&c.header, &d.header);
        assert_eq!(
            (
                h.generation,
                h.sid_next,
                h.journal_next_block,
                h.journal_sequence,
                h.time
            ),
            (
                g.generation,
                g.sid_next,
                g.journal_next_block,
                g.journal_sequence,
                g.time
            )
        );
    }
}

/// One journal block (a ring entry is two identical copies of one).
pub fn journal_block(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
    }
    if let Ok(b) = JournalBlock::decode(&buf, AT) {
        let Some(bytes) = b.encode() else {
            panic!("a decoded journal block does not fit a block once re-encoded: {b:?}");
        };
        assert_eq!(JournalBlock::decode(&bytes, AT), Ok(b));
    }
}

/// A hand-off image (a tmpfs file, read by the open after a kill of the process).
/// Resealing reseals each md and journal block the header's counts place, then the
/// whole image.
pub fn handoff_image(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal && buf.len() >= crate::handoff::HANDOFF_HEADER_LEN {
        let md = usize::from(u16::from_le_bytes([buf[6], buf[7]]));
        let journal = u32_at(&buf, 12).unwrap_or(0) as usize;
        let mut pos = crate::handoff::HANDOFF_HEADER_LEN;
        for i in 0..md.saturating_add(journal) {
            let skip = if i < md { 16 } else { 0 };
            let Some(end) = pos
                .checked_add(skip + BLOCK_SIZE)
                .filter(|&e| e <= buf.len())
            else {
                break;
            };
            reseal_block(&mut buf[pos + skip..end]);
            pos = end;
        }
        let len = buf.len();
        seal(&mut buf, len);
    }
    if let Ok(image) = crate::HandoffImage::decode(&buf) {
        let Some(bytes) = image.encode() else {
            panic!("a decoded hand-off image does not encode");
        };
        assert_eq!(crate::HandoffImage::decode(&bytes), Ok(image));
    }
}

/// The volume table block (either version; a version-1 table re-encodes as version 2).
pub fn volume_table(data: &[u8]) {
    let Some((reseal, mut buf)) = split(data) else {
        return;
    };
    if reseal {
        reseal_block(&mut buf);
        // A version-3 table's second block (its limits) has a checksum of its own.
        if buf.len() >= 2 * BLOCK_SIZE {
            reseal_block(&mut buf[BLOCK_SIZE..]);
        }
    }
    if let Ok(t) = VolumeTable::decode(&buf, AT) {
        let again = t.encode_in(t.blocks_needed());
        assert_eq!(VolumeTable::encoded_len(&again), again.len());
        assert_eq!(VolumeTable::decode(&again, AT), Ok(t));
    }
}
