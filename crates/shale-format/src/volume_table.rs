//! The volume table: one block, stored twice on the cache device (double-buffered by
//! generation) and snapshotted into each checkpoint.
//!
//! Invariants: at most [`VOLUMES_MAX`] entries, ids unique and below `volumes_max`,
//! names 1..=32 bytes of UTF-8. `created_sid`/`created_pos` is the user-write position
//! (open chunk SID, write pointer) at creation, so recovery can ignore older md entries
//! of a deleted volume whose id was reused.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{FormatError, Sid, Structure, VolumeId, BLOCK_SIZE};

pub const VOLUME_TABLE_MAGIC: u32 = u32::from_le_bytes(*b"SHVT");
pub const VOLUME_TABLE_VERSION: u16 = 1;
pub const VOLUME_TABLE_HEADER_LEN: usize = 32;
pub const VOLUME_ENTRY_LEN: usize = 64;
pub const VOLUME_NAME_MAX: usize = 32;
/// Entries that fit in one block.
pub const VOLUMES_MAX: u32 = ((BLOCK_SIZE - VOLUME_TABLE_HEADER_LEN) / VOLUME_ENTRY_LEN) as u32;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub id: VolumeId,
    pub name: String,
    pub size_blocks: u64,
    pub created_sid: Sid,
    pub created_pos: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VolumeTable {
    pub generation: u64,
    pub entries: Vec<VolumeEntry>,
}

impl VolumeTable {
    /// Encodes into one block. Callers keep the invariants (checked by `validate`).
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(VOLUME_TABLE_MAGIC);
        w.u16(VOLUME_TABLE_VERSION);
        w.u16(self.entries.len() as u16);
        w.u32(0);
        w.u32(0);
        w.u64(self.generation);
        w.u64(0);
        for e in self.entries.iter().take(VOLUMES_MAX as usize) {
            w.u32(e.id.0);
            w.u8(1);
            let name = e.name.as_bytes();
            let n = name.len().min(VOLUME_NAME_MAX);
            w.u8(n as u8);
            w.u16(0);
            w.u64(e.size_blocks);
            w.u64(e.created_sid.0);
            w.u32(e.created_pos);
            w.u32(0);
            let mut nb = [0u8; VOLUME_NAME_MAX];
            nb[..n].copy_from_slice(&name[..n]);
            w.bytes(&nb);
        }
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<VolumeTable, FormatError> {
        let s = Structure::VolumeTable;
        check_header(
            buf,
            s,
            at,
            VOLUME_TABLE_MAGIC,
            VOLUME_TABLE_VERSION,
            BLOCK_SIZE,
        )?;
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 6, s, at);
        let count = r.u16()?;
        if u32::from(count) > VOLUMES_MAX {
            return Err(r.invalid("count", format!("{count} > {VOLUMES_MAX}")));
        }
        let mut r = Reader::at(buf, 16, s, at);
        let generation = r.u64()?;
        r.skip(8)?;
        let mut entries: Vec<VolumeEntry> = Vec::with_capacity(count.into());
        for _ in 0..count {
            let id = VolumeId(r.u32()?);
            let state = r.u8()?;
            if state != 1 {
                return Err(r.invalid("state", format!("{state}")));
            }
            let n = usize::from(r.u8()?);
            if n == 0 || n > VOLUME_NAME_MAX {
                return Err(r.invalid("name_len", format!("{n}")));
            }
            r.skip(2)?;
            let size_blocks = r.u64()?;
            let created_sid = Sid(r.u64()?);
            let created_pos = r.u32()?;
            r.skip(4)?;
            let nb = r.bytes(VOLUME_NAME_MAX)?;
            let name = std::str::from_utf8(&nb[..n])
                .map_err(|e| r.invalid("name", e.to_string()))?
                .to_string();
            if entries.iter().any(|e| e.id == id || e.name == name) {
                return Err(r.invalid("id", format!("duplicate volume {id} / {name:?}")));
            }
            entries.push(VolumeEntry {
                id,
                name,
                size_blocks,
                created_sid,
                created_pos,
            });
        }
        Ok(VolumeTable {
            generation,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
            let _ = VolumeTable::decode(&bytes, 0);
        }

        #[test]
        fn roundtrip(gen in any::<u64>(), vols in proptest::collection::btree_map(0u32..63, ("[a-z]{1,32}", any::<u64>(), any::<u64>(), any::<u32>()), 0..20)) {
            let mut names = std::collections::BTreeSet::new();
            let entries: Vec<VolumeEntry> = vols.into_iter()
                .filter(|(_, (n, ..))| names.insert(n.clone()))
                .map(|(id, (name, size_blocks, sid, pos))| VolumeEntry {
                    id: VolumeId(id), name, size_blocks, created_sid: Sid(sid), created_pos: pos,
                }).collect();
            let t = VolumeTable { generation: gen, entries };
            let b = t.encode();
            prop_assert_eq!(VolumeTable::decode(&b, 0), Ok(t));
        }
    }
}
