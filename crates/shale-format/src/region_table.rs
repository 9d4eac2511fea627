//! The region state table: one 32-byte entry per chunk and zone, saved in checkpoints.
//!
//! Invariants: a `Free` region has `valid_count == 0`; `write_pointer` never exceeds the
//! region's size in blocks; `stream` is meaningful only for zones opened for a stream.

use crate::codec::{check_header, check_len_crc, Reader, Writer};
use crate::{FormatError, Sid, Structure};

pub const REGION_TABLE_MAGIC: u32 = u32::from_le_bytes(*b"SHRT");
pub const REGION_TABLE_VERSION: u16 = 1;
pub const REGION_TABLE_HEADER_LEN: usize = 16;
pub const REGION_ENTRY_LEN: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum RegionState {
    #[default]
    Free = 0,
    /// Being written (or with writes still in flight).
    Open = 1,
    Closed = 2,
    /// Empty, waiting for the writes that emptied it to become durable.
    PendingFree = 3,
    /// Never used for data (zone 0: the capacity label).
    Reserved = 4,
    /// Another shard's zone (a pool whose shards share one capacity device): given
    /// away, or never this shard's. Holds nothing of this shard's; never scanned,
    /// reset or written here until the space manager hands it back (`TakeZones`).
    Foreign = 5,
}

/// Which write stream a region serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(u8)]
pub enum RegionRole {
    #[default]
    None = 0,
    User = 1,
    Compaction = 2,
    Gc = 3,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RegionEntry {
    pub state: RegionState,
    pub role: RegionRole,
    pub stream: u16,
    pub sid: Sid,
    pub valid_count: u32,
    pub write_pointer: u32,
    pub close_time: u64,
}

pub fn encode_region_table(entries: &[RegionEntry]) -> Vec<u8> {
    let mut b = Vec::with_capacity(REGION_TABLE_HEADER_LEN + entries.len() * REGION_ENTRY_LEN);
    region_table_chunks(entries, &mut |c| b.extend_from_slice(c));
    b
}

/// Hands the encoded table to `f` a bounded piece at a time (the header, sealed, then
/// entries in batches), so a checkpoint can stream it without building it.
pub(crate) fn region_table_chunks(entries: &[RegionEntry], f: &mut dyn FnMut(&[u8])) {
    let mut header = [0u8; REGION_TABLE_HEADER_LEN];
    let mut w = Writer::new(&mut header);
    w.u32(REGION_TABLE_MAGIC);
    w.u16(REGION_TABLE_VERSION);
    w.u16(0);
    w.u32(0);
    w.u32(entries.len() as u32);
    crate::codec::sealed_chunks(&mut header, |g| region_entry_chunks(entries, g), f);
}

fn region_entry_chunks(entries: &[RegionEntry], f: &mut dyn FnMut(&[u8])) {
    const BATCH: usize = 128;
    let mut buf = [0u8; BATCH * REGION_ENTRY_LEN];
    for batch in entries.chunks(BATCH) {
        let mut w = Writer::new(&mut buf);
        for e in batch {
            w.u8(e.state as u8);
            w.u8(e.role as u8);
            w.u16(e.stream);
            w.u64(e.sid.0);
            w.u32(e.valid_count);
            w.u32(e.write_pointer);
            w.u64(e.close_time);
            w.u32(0);
        }
        f(&buf[..batch.len() * REGION_ENTRY_LEN]);
    }
}

/// Returns the entries and the number of bytes consumed.
pub fn decode_region_table(buf: &[u8], at: u64) -> Result<(Vec<RegionEntry>, usize), FormatError> {
    let s = Structure::RegionTable;
    check_header(
        buf,
        s,
        at,
        REGION_TABLE_MAGIC,
        REGION_TABLE_VERSION,
        REGION_TABLE_HEADER_LEN,
    )?;
    let mut r = Reader::at(buf, 12, s, at);
    let count = r.u32()? as usize;
    let len = count
        .checked_mul(REGION_ENTRY_LEN)
        .and_then(|n| n.checked_add(REGION_TABLE_HEADER_LEN))
        .ok_or_else(|| r.invalid("count", format!("{count} overflows")))?;
    check_len_crc(buf, len, s, at)?;
    let mut v = Vec::with_capacity(count);
    for _ in 0..count {
        let state = match r.u8()? {
            0 => RegionState::Free,
            1 => RegionState::Open,
            2 => RegionState::Closed,
            3 => RegionState::PendingFree,
            4 => RegionState::Reserved,
            5 => RegionState::Foreign,
            x => return Err(r.invalid("state", format!("{x}"))),
        };
        let role = match r.u8()? {
            0 => RegionRole::None,
            1 => RegionRole::User,
            2 => RegionRole::Compaction,
            3 => RegionRole::Gc,
            x => return Err(r.invalid("role", format!("{x}"))),
        };
        let stream = r.u16()?;
        let sid = Sid(r.u64()?);
        let valid_count = r.u32()?;
        let write_pointer = r.u32()?;
        let close_time = r.u64()?;
        r.skip(4)?;
        v.push(RegionEntry {
            state,
            role,
            stream,
            sid,
            valid_count,
            write_pointer,
            close_time,
        });
    }
    Ok((v, len))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn entry() -> impl Strategy<Value = RegionEntry> {
        (
            0u8..6,
            0u8..4,
            any::<u16>(),
            any::<u64>(),
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
        )
            .prop_map(
                |(s, r, stream, sid, valid_count, write_pointer, close_time)| RegionEntry {
                    state: [
                        RegionState::Free,
                        RegionState::Open,
                        RegionState::Closed,
                        RegionState::PendingFree,
                        RegionState::Reserved,
                        RegionState::Foreign,
                    ][s as usize],
                    role: [
                        RegionRole::None,
                        RegionRole::User,
                        RegionRole::Compaction,
                        RegionRole::Gc,
                    ][r as usize],
                    stream,
                    sid: Sid(sid),
                    valid_count,
                    write_pointer,
                    close_time,
                },
            )
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
            let _ = decode_region_table(&bytes, 0);
        }

        #[test]
        fn roundtrip(entries in proptest::collection::vec(entry(), 0..50), tail in 0usize..10) {
            let mut b = encode_region_table(&entries);
            let len = b.len();
            b.extend(std::iter::repeat_n(0xAB, tail));
            prop_assert_eq!(decode_region_table(&b, 0), Ok((entries.clone(), len)));
            if !entries.is_empty() {
                b[REGION_TABLE_HEADER_LEN + 5] ^= 1;
                let is_crc = matches!(decode_region_table(&b, 0), Err(FormatError::ChecksumMismatch { .. }));
                prop_assert!(is_crc);
            }
        }
    }
}
