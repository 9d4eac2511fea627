//! The label of an array member: which pool and array it belongs to, its slot, the
//! layout, and the state of every member as of the label's generation.
//!
//! Every member of an array carries one (capacity members in their zone 0, appended
//! on each update; cache mirrors in two alternating blocks at their start). Open
//! identifies members by these labels, never by path or order: the newest generation
//! among the members present is the array's state, and a member whose own label is
//! older was out of the array when it changed (it is stale, and treated as failed).

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{FormatError, Structure, BLOCK_SIZE};

pub const ARRAY_LABEL_MAGIC: u32 = u32::from_le_bytes(*b"SHAL");
/// Version 2: zoned members keep labels in two zones (version 1 had one, which a cut
/// between its reset and the next append left without any label).
pub const ARRAY_LABEL_VERSION: u16 = 2;
/// Most members an array has.
pub const ARRAY_MEMBERS_MAX: usize = 32;
const HEADER_LEN: usize = 96;
const MEMBER_LEN: usize = 32;
// The largest member table fits in the block.
const _: () = assert!(HEADER_LEN + ARRAY_MEMBERS_MAX * MEMBER_LEN <= BLOCK_SIZE);

/// What an array is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayRole {
    Cache,
    Capacity,
}

/// How an array keeps its data (as `shale-array`'s `Redundancy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayRedundancy {
    None,
    Mirror,
    Parity { k: u8, m: u8 },
}

/// A member's state as recorded in a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberRecord {
    Ok,
    Failed,
    /// Being rebuilt; its zones (or bytes) are valid only where the rebuild reached.
    Rebuilding,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayMember {
    pub uuid: [u8; 16],
    pub state: MemberRecord,
    /// How far a rebuild has come (bytes of a cache mirror; unused for zoned members,
    /// whose write pointers say it).
    pub rebuilt: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArrayLabel {
    /// Shared by the cache and capacity arrays of one pool.
    pub pool: [u8; 16],
    pub role: ArrayRole,
    pub redundancy: ArrayRedundancy,
    /// Stripe unit in bytes (0 for a cache mirror).
    pub unit: u64,
    /// Bumped on every change of a member's state; the newest wins.
    pub generation: u64,
    /// The slot of the member carrying this label.
    pub index: u8,
    /// Every member, by slot.
    pub members: Vec<ArrayMember>,
}

impl ArrayLabel {
    /// The uuid of the member carrying this label.
    pub fn member_uuid(&self) -> Option<[u8; 16]> {
        self.members.get(usize::from(self.index)).map(|m| m.uuid)
    }

    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(ARRAY_LABEL_MAGIC);
        w.u16(ARRAY_LABEL_VERSION);
        w.u16(0);
        w.u32(0); // 8: CRC
        w.u32(BLOCK_SIZE as u32); // 12
        w.bytes(&self.pool); // 16
        w.u8(match self.role {
            ArrayRole::Cache => 1,
            ArrayRole::Capacity => 2,
        }); // 32
        let (kind, k, m) = match self.redundancy {
            ArrayRedundancy::None => (0, 0, 0),
            ArrayRedundancy::Mirror => (1, 0, 0),
            ArrayRedundancy::Parity { k, m } => (2, k, m),
        };
        w.u8(kind); // 33
        w.u8(k); // 34
        w.u8(m); // 35
        w.u8(self.members.len() as u8); // 36
        w.u8(self.index); // 37
        w.u16(0); // 38
        w.u64(self.unit); // 40
        w.u64(self.generation); // 48
        w.skip(HEADER_LEN - 56);
        for mem in &self.members {
            w.bytes(&mem.uuid);
            w.u8(match mem.state {
                MemberRecord::Ok => 1,
                MemberRecord::Failed => 2,
                MemberRecord::Rebuilding => 3,
            });
            w.skip(7);
            w.u64(mem.rebuilt);
        }
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<ArrayLabel, FormatError> {
        let s = Structure::ArrayLabel;
        check_header(
            buf,
            s,
            at,
            ARRAY_LABEL_MAGIC,
            ARRAY_LABEL_VERSION,
            BLOCK_SIZE,
        )?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 12, s, at);
        let bs = r.u32()?;
        if bs != BLOCK_SIZE as u32 {
            return Err(r.invalid("block_size", format!("{bs} != {BLOCK_SIZE}")));
        }
        let mut pool = [0u8; 16];
        pool.copy_from_slice(r.bytes(16)?);
        let role = match r.u8()? {
            1 => ArrayRole::Cache,
            2 => ArrayRole::Capacity,
            v => return Err(r.invalid("role", format!("unknown role {v}"))),
        };
        let (kind, k, m) = (r.u8()?, r.u8()?, r.u8()?);
        let n = r.u8()?;
        let index = r.u8()?;
        let _ = r.u16()?;
        let unit = r.u64()?;
        let generation = r.u64()?;
        if !(1..=ARRAY_MEMBERS_MAX).contains(&usize::from(n)) {
            return Err(r.invalid("members", format!("{n} members")));
        }
        if index >= n {
            return Err(r.invalid("index", format!("slot {index} of {n}")));
        }
        let redundancy = match (kind, k, m) {
            (0, 0, 0) => ArrayRedundancy::None,
            (1, 0, 0) if n >= 2 => ArrayRedundancy::Mirror,
            (2, k, m) if k > 0 && m > 0 && usize::from(k) + usize::from(m) == usize::from(n) => {
                ArrayRedundancy::Parity { k, m }
            }
            _ => {
                return Err(r.invalid(
                    "redundancy",
                    format!("kind {kind} k {k} m {m} over {n} members"),
                ))
            }
        };
        let mut r = Reader::at(buf, HEADER_LEN, s, at);
        let mut members = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let mut uuid = [0u8; 16];
            uuid.copy_from_slice(r.bytes(16)?);
            let state = match r.u8()? {
                1 => MemberRecord::Ok,
                2 => MemberRecord::Failed,
                3 => MemberRecord::Rebuilding,
                v => return Err(r.invalid("member state", format!("unknown state {v}"))),
            };
            let _ = r.bytes(7)?;
            let rebuilt = r.u64()?;
            members.push(ArrayMember {
                uuid,
                state,
                rebuilt,
            });
        }
        Ok(ArrayLabel {
            pool,
            role,
            redundancy,
            unit,
            generation,
            index,
            members,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn label(n: u8, index: u8) -> ArrayLabel {
        ArrayLabel {
            pool: [7; 16],
            role: ArrayRole::Capacity,
            redundancy: ArrayRedundancy::Parity { k: n - 1, m: 1 },
            unit: 128 * 1024,
            generation: 42,
            index,
            members: (0..n)
                .map(|i| ArrayMember {
                    uuid: [i; 16],
                    state: if i == 1 {
                        MemberRecord::Failed
                    } else {
                        MemberRecord::Ok
                    },
                    rebuilt: u64::from(i) * 3,
                })
                .collect(),
        }
    }

    #[test]
    fn roundtrip_and_crc() {
        for n in [2u8, 5, 32] {
            let l = label(n, n - 1);
            let b = l.encode();
            assert_eq!(ArrayLabel::decode(&b, 0), Ok(l.clone()));
            assert_eq!(l.member_uuid(), Some([n - 1; 16]));
            let mut bad = b;
            bad[100] ^= 1;
            assert!(matches!(
                ArrayLabel::decode(&bad, 0),
                Err(FormatError::ChecksumMismatch { .. })
            ));
        }
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = ArrayLabel::decode(&bytes, 0);
        }

        /// A sealed block with any header values decodes or fails typed, never panics.
        #[test]
        fn sealed_garbage_is_refused_cleanly(fields in proptest::collection::vec(any::<u8>(), 40)) {
            let mut b = label(5, 2).encode();
            b[32..72].copy_from_slice(&fields);
            crate::codec::seal(&mut b, BLOCK_SIZE);
            if let Ok(l) = ArrayLabel::decode(&b, 0) {
                prop_assert!(usize::from(l.index) < l.members.len());
            }
        }
    }
}
