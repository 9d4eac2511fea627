//! The volume table: one block (two in version 3), stored twice on the cache device
//! (double-buffered by generation) and snapshotted into each checkpoint, whose copy is
//! the one in force.
//!
//! Invariants: at most [`VOLUMES_MAX`] entries, ids unique and below `volumes_max`,
//! names 1..=32 bytes of UTF-8, uids unique and below `uid_next`.
//! `created_sid`/`created_pos` is the user-write position (open chunk SID, write
//! pointer) at creation, so recovery can ignore older md entries of a deleted volume
//! whose id (slot) was reused. The uid is the volume's identity: issued from
//! `uid_next`, which only grows, so a uid names one volume for the pool's lifetime
//! even where its slot is reused; front-ends hold it, not the slot.
//!
//! Version 3 adds each volume's rate limits in a second block (so a copy is two
//! blocks; pools formatted with one-block copies keep writing version 2 and cannot
//! store limits). The second block repeats the generation, so a copy torn between its
//! blocks fails to decode (the open warns; the checkpoint's copy is in force anyway).
//!
//! Version 1 had no uids; its tables decode with uid = slot + 1 and `uid_next` =
//! [`VOLUMES_MAX`] + 1, so the first table written after an upgrade (version 2)
//! issues uids no version-1 volume was given.

use crate::codec::{check_crc, check_header, seal, Reader, Writer};
use crate::{FormatError, Sid, Structure, VolumeId, VolumeUid, BLOCK_SIZE};

pub const VOLUME_TABLE_MAGIC: u32 = u32::from_le_bytes(*b"SHVT");
pub const VOLUME_TABLE_VERSION: u16 = 2;
/// Two blocks: the entries as in version 2, then each entry's limits.
pub const VOLUME_TABLE_VERSION_3: u16 = 3;
/// As version 3, with each entry's mapping unit in the second block. Written only
/// while a volume has a unit above one block, so binaries that predate units refuse
/// exactly the pools whose L2P they would misread.
pub const VOLUME_TABLE_VERSION_4: u16 = 4;
/// As version 4, with each entry's map flags (bit 0: dual mapped) after its unit.
/// Written only while a volume is dual mapped.
pub const VOLUME_TABLE_VERSION_5: u16 = 5;
/// Map flags: the volume has a coarse map in units and a sparse map of 4 KiB
/// overrides.
pub const MAP_FLAG_DUAL: u8 = 1;
/// Largest mapping unit: 16 blocks (64 KiB), a granule of the shards' deal.
pub const MAP_UNIT_SHIFT_MAX: u8 = 4;
pub const VOLUME_LIMITS_MAGIC: u32 = u32::from_le_bytes(*b"SHVL");
/// Bytes of one entry's limits in the second block (the rest reserved, zero).
pub const VOLUME_LIMITS_LEN: usize = 64;
/// The layout before uids; still read.
const VOLUME_TABLE_VERSION_1: u16 = 1;
pub const VOLUME_TABLE_HEADER_LEN: usize = 32;
pub const VOLUME_ENTRY_LEN: usize = 64;
pub const VOLUME_NAME_MAX: usize = 32;
/// Entries that fit in one block.
pub const VOLUMES_MAX: u32 = ((BLOCK_SIZE - VOLUME_TABLE_HEADER_LEN) / VOLUME_ENTRY_LEN) as u32;

/// How GC chooses among the zones of a volume's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeGc {
    /// The pool's policy.
    #[default]
    Pool,
    /// Fewest valid blocks.
    Greedy,
    /// Free space gained weighed by the zone's age.
    CostBenefit,
}

impl VolumeGc {
    pub fn to_u8(self) -> u8 {
        match self {
            VolumeGc::Pool => 0,
            VolumeGc::Greedy => 1,
            VolumeGc::CostBenefit => 2,
        }
    }

    pub fn from_u8(v: u8) -> Option<VolumeGc> {
        Some(match v {
            0 => VolumeGc::Pool,
            1 => VolumeGc::Greedy,
            2 => VolumeGc::CostBenefit,
            _ => return None,
        })
    }
}

/// A volume's rate limits, cache share and GC policy; 0 (and `Pool`) means none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VolumeLimits {
    /// Requests per second (reads, writes, trims and write-zeroes alike).
    pub iops_max: u64,
    /// Bytes read and written per second.
    pub bytes_per_sec_max: u64,
    /// Percent of the cache's data blocks the volume's valid blocks may hold before
    /// compaction takes its chunks first (1 to 100).
    pub cache_share_pct: u8,
    /// How GC chooses among the zones this volume's data goes to.
    pub gc: VolumeGc,
}

impl VolumeLimits {
    pub const NONE: VolumeLimits = VolumeLimits {
        iops_max: 0,
        bytes_per_sec_max: 0,
        cache_share_pct: 0,
        gc: VolumeGc::Pool,
    };

    pub fn is_none(&self) -> bool {
        *self == VolumeLimits::NONE
    }

    /// Whether a rate is limited (the cache share aside).
    pub fn has_rates(&self) -> bool {
        self.iops_max > 0 || self.bytes_per_sec_max > 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeEntry {
    pub id: VolumeId,
    pub uid: VolumeUid,
    pub name: String,
    pub size_blocks: u64,
    pub created_sid: Sid,
    pub created_pos: u32,
    /// Stored only by version 3 tables (two-block copies).
    pub limits: VolumeLimits,
    /// In a shard of a pool of several: the whole volume's size, of which
    /// `size_blocks` is this shard's slice; 0 where the volume is whole here. Stored
    /// only by version 3 tables, in the limits block.
    pub whole_size_blocks: u64,
    /// The volume's mapping unit is `1 << map_unit_shift` blocks (0: 4 KiB, up to
    /// [`MAP_UNIT_SHIFT_MAX`]): its L2P holds one entry per unit, and a unit's blocks
    /// lie in consecutive data slots of one region. Stored only by version 4 tables,
    /// in the second block; fixed for the volume's life.
    pub map_unit_shift: u8,
    /// Dual mapped (SALSA's dual-mapping controller): the unit map above, and a
    /// sparse map of 4 KiB blocks written apart from their unit that overrides it.
    /// Stored only by version 5 tables, which are written only while a volume is.
    pub dual_map: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeTable {
    pub generation: u64,
    /// The uid the next volume created gets; never decreases.
    pub uid_next: VolumeUid,
    pub entries: Vec<VolumeEntry>,
}

impl Default for VolumeTable {
    fn default() -> Self {
        VolumeTable {
            generation: 0,
            uid_next: VolumeUid::FIRST,
            entries: Vec::new(),
        }
    }
}

impl VolumeTable {
    /// Takes the next uid. `None` once 2^64 - 1 have been issued: refusing a create is
    /// better than naming two volumes alike.
    pub fn issue_uid(&mut self) -> Option<VolumeUid> {
        let uid = self.uid_next;
        self.uid_next = VolumeUid(uid.0.checked_add(1)?);
        Some(uid)
    }

    /// Issues `uid`, one another table issued (the shards of a pool share their
    /// volumes' uids), unless this table has issued it or a later one already: a uid
    /// is still never issued twice by one table.
    pub fn issue_uid_from(&mut self, uid: VolumeUid) -> Option<VolumeUid> {
        if uid < self.uid_next {
            return None;
        }
        self.uid_next = VolumeUid(uid.0.checked_add(1)?);
        Some(uid)
    }

    /// Encodes into one block (version 2), without limits. Callers keep the
    /// invariants (checked by `decode`).
    pub fn encode(&self) -> [u8; BLOCK_SIZE] {
        self.encode_entries(VOLUME_TABLE_VERSION)
    }

    /// Encodes into `blocks` blocks: 1 is version 2 (limits are not stored: the
    /// caller refuses them on such pools), 2 is version 3.
    pub fn encode_in(&self, blocks: u32) -> Vec<u8> {
        if blocks < 2 {
            return self.encode().to_vec();
        }
        let version = if self.entries.iter().any(|e| e.dual_map) {
            VOLUME_TABLE_VERSION_5
        } else if self.entries.iter().any(|e| e.map_unit_shift > 0) {
            VOLUME_TABLE_VERSION_4
        } else {
            VOLUME_TABLE_VERSION_3
        };
        let mut out = Vec::with_capacity(2 * BLOCK_SIZE);
        out.extend_from_slice(&self.encode_entries(version));
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(VOLUME_LIMITS_MAGIC);
        w.u16(version);
        w.u16(self.entries.len() as u16);
        w.u32(0); // crc
        w.u32(0);
        w.u64(self.generation);
        w.skip(8);
        for e in self.entries.iter().take(VOLUMES_MAX as usize) {
            w.u16(e.id.0 as u16);
            w.skip(6);
            w.u64(e.limits.iops_max);
            w.u64(e.limits.bytes_per_sec_max);
            w.u8(e.limits.cache_share_pct);
            w.u8(e.limits.gc.to_u8());
            w.u64(e.whole_size_blocks);
            w.u8(e.map_unit_shift);
            w.u8(if e.dual_map { MAP_FLAG_DUAL } else { 0 });
            w.skip(VOLUME_LIMITS_LEN - 36);
        }
        seal(&mut b, BLOCK_SIZE);
        out.extend_from_slice(&b);
        out
    }

    /// Blocks the table needs: 2 once a volume has limits, a mapping unit or is a
    /// slice, else 1.
    pub fn blocks_needed(&self) -> u32 {
        if self
            .entries
            .iter()
            .all(|e| e.limits.is_none() && e.whole_size_blocks == 0 && e.map_unit_shift == 0)
        {
            1
        } else {
            2
        }
    }

    /// The bytes a table of this version starts with says it takes: 2 blocks for
    /// versions 3 and 4, else 1 (a block too short to tell is 1).
    pub fn encoded_len(first_block: &[u8]) -> usize {
        match first_block.get(4..6) {
            Some(&[a, b])
                if [
                    VOLUME_TABLE_VERSION_3,
                    VOLUME_TABLE_VERSION_4,
                    VOLUME_TABLE_VERSION_5,
                ]
                .contains(&u16::from_le_bytes([a, b])) =>
            {
                2 * BLOCK_SIZE
            }
            _ => BLOCK_SIZE,
        }
    }

    fn encode_entries(&self, version: u16) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(VOLUME_TABLE_MAGIC);
        w.u16(version);
        w.u16(self.entries.len() as u16);
        w.u32(0);
        w.u32(0);
        w.u64(self.generation);
        w.u64(self.uid_next.0);
        for e in self.entries.iter().take(VOLUMES_MAX as usize) {
            w.u16(e.id.0 as u16);
            w.u8(1);
            let name = e.name.as_bytes();
            let n = name.len().min(VOLUME_NAME_MAX);
            w.u8(n as u8);
            w.u32(e.created_pos);
            w.u64(e.size_blocks);
            w.u64(e.created_sid.0);
            w.u64(e.uid.0);
            let mut nb = [0u8; VOLUME_NAME_MAX];
            nb[..n].copy_from_slice(&name[..n]);
            w.bytes(&nb);
        }
        seal(&mut b, BLOCK_SIZE);
        b
    }

    pub fn decode(buf: &[u8], at: u64) -> Result<VolumeTable, FormatError> {
        let s = Structure::VolumeTable;
        let version = match buf.get(4..6) {
            Some(&[a, b])
                if [
                    VOLUME_TABLE_VERSION_1,
                    VOLUME_TABLE_VERSION_3,
                    VOLUME_TABLE_VERSION_4,
                    VOLUME_TABLE_VERSION_5,
                ]
                .contains(&u16::from_le_bytes([a, b])) =>
            {
                u16::from_le_bytes([a, b])
            }
            _ => VOLUME_TABLE_VERSION,
        };
        check_header(buf, s, at, VOLUME_TABLE_MAGIC, version, BLOCK_SIZE)?;
        let limits_block = &buf[BLOCK_SIZE.min(buf.len())..];
        let buf = &buf[..BLOCK_SIZE];
        check_crc(buf, s, at)?;
        let mut r = Reader::at(buf, 6, s, at);
        let count = r.u16()?;
        if u32::from(count) > VOLUMES_MAX {
            return Err(r.invalid("count", format!("{count} > {VOLUMES_MAX}")));
        }
        let mut r = Reader::at(buf, 16, s, at);
        let generation = r.u64()?;
        let uid_next = match version {
            VOLUME_TABLE_VERSION_1 => {
                r.skip(8)?;
                VolumeUid(u64::from(VOLUMES_MAX) + 1)
            }
            _ => VolumeUid(r.u64()?),
        };
        let mut entries: Vec<VolumeEntry> = Vec::with_capacity(count.into());
        for _ in 0..count {
            let e = if version == VOLUME_TABLE_VERSION_1 {
                decode_entry_v1(&mut r)?
            } else {
                decode_entry(&mut r)?
            };
            if entries
                .iter()
                .any(|o| o.id == e.id || o.name == e.name || o.uid == e.uid)
            {
                return Err(r.invalid(
                    "id",
                    format!("duplicate volume {} / {} / {:?}", e.id, e.uid, e.name),
                ));
            }
            if e.uid.0 == 0 || e.uid >= uid_next {
                return Err(r.invalid(
                    "uid",
                    format!("{} not in 1..{} (uid_next)", e.uid, uid_next),
                ));
            }
            entries.push(e);
        }
        if version >= VOLUME_TABLE_VERSION_3 {
            decode_limits(
                limits_block,
                at + BLOCK_SIZE as u64,
                version,
                generation,
                &mut entries,
            )?;
        }
        Ok(VolumeTable {
            generation,
            uid_next,
            entries,
        })
    }
}

/// The second block of a version-3 or 4 table: each entry's limits (and, in
/// version 4, its mapping unit), in entry order.
fn decode_limits(
    buf: &[u8],
    at: u64,
    version: u16,
    generation: u64,
    entries: &mut [VolumeEntry],
) -> Result<(), FormatError> {
    let s = Structure::VolumeTable;
    check_header(buf, s, at, VOLUME_LIMITS_MAGIC, version, BLOCK_SIZE)?;
    let buf = &buf[..BLOCK_SIZE];
    check_crc(buf, s, at)?;
    let mut r = Reader::at(buf, 6, s, at);
    let count = usize::from(r.u16()?);
    if count != entries.len() {
        return Err(r.invalid("limits_count", format!("{count} != {}", entries.len())));
    }
    let mut r = Reader::at(buf, 16, s, at);
    let g = r.u64()?;
    if g != generation {
        // The entries' block was written without this one (a torn copy).
        return Err(r.invalid("limits_generation", format!("{g} != {generation}")));
    }
    r.skip(8)?;
    for e in entries.iter_mut() {
        let id = r.u16()?;
        if u32::from(id) != e.id.0 {
            return Err(r.invalid("limits_id", format!("{id} != {}", e.id)));
        }
        r.skip(6)?;
        let iops_max = r.u64()?;
        let bytes_per_sec_max = r.u64()?;
        let cache_share_pct = r.u8()?;
        if cache_share_pct > 100 {
            return Err(r.invalid("cache_share_pct", format!("{cache_share_pct} > 100")));
        }
        let gc_byte = r.u8()?;
        let Some(gc) = VolumeGc::from_u8(gc_byte) else {
            return Err(r.invalid("gc_policy", format!("{gc_byte}")));
        };
        e.limits = VolumeLimits {
            iops_max,
            bytes_per_sec_max,
            cache_share_pct,
            gc,
        };
        e.whole_size_blocks = r.u64()?;
        if e.whole_size_blocks != 0 && e.whole_size_blocks < e.size_blocks {
            return Err(r.invalid(
                "whole_size_blocks",
                format!(
                    "{} is smaller than the slice ({})",
                    e.whole_size_blocks, e.size_blocks
                ),
            ));
        }
        let shift = r.u8()?;
        // Version 3 left the byte reserved (zero); a unit there would be misread.
        if shift > MAP_UNIT_SHIFT_MAX || (version < VOLUME_TABLE_VERSION_4 && shift != 0) {
            return Err(r.invalid("map_unit_shift", format!("{shift}")));
        }
        if e.size_blocks % (1u64 << shift) != 0 {
            return Err(r.invalid(
                "map_unit_shift",
                format!(
                    "size {} blocks is not a whole number of units",
                    e.size_blocks
                ),
            ));
        }
        e.map_unit_shift = shift;
        let flags = r.u8()?;
        // Versions before 5 left the byte reserved (zero); a dual volume needs a unit.
        if flags & !MAP_FLAG_DUAL != 0
            || (version < VOLUME_TABLE_VERSION_5 && flags != 0)
            || (flags & MAP_FLAG_DUAL != 0 && shift == 0)
        {
            return Err(r.invalid("map_flags", format!("{flags} (unit shift {shift})")));
        }
        e.dual_map = flags & MAP_FLAG_DUAL != 0;
        r.skip(VOLUME_LIMITS_LEN - 36)?;
    }
    Ok(())
}

fn decode_name(r: &mut Reader<'_>, n: usize) -> Result<String, FormatError> {
    let nb = r.bytes(VOLUME_NAME_MAX)?;
    Ok(std::str::from_utf8(&nb[..n])
        .map_err(|e| r.invalid("name", e.to_string()))?
        .to_string())
}

fn decode_state_and_name_len(r: &mut Reader<'_>) -> Result<usize, FormatError> {
    let state = r.u8()?;
    if state != 1 {
        return Err(r.invalid("state", format!("{state}")));
    }
    let n = usize::from(r.u8()?);
    if n == 0 || n > VOLUME_NAME_MAX {
        return Err(r.invalid("name_len", format!("{n}")));
    }
    Ok(n)
}

fn decode_entry(r: &mut Reader<'_>) -> Result<VolumeEntry, FormatError> {
    let id = VolumeId(u32::from(r.u16()?));
    let n = decode_state_and_name_len(r)?;
    let created_pos = r.u32()?;
    let size_blocks = r.u64()?;
    let created_sid = Sid(r.u64()?);
    let uid = VolumeUid(r.u64()?);
    let name = decode_name(r, n)?;
    Ok(VolumeEntry {
        id,
        uid,
        name,
        size_blocks,
        created_sid,
        created_pos,
        limits: VolumeLimits::NONE,
        whole_size_blocks: 0,
        map_unit_shift: 0,
        dual_map: false,
    })
}

/// Version 1: id u32, state, name length, 2 pad, size, created SID, created position,
/// 4 pad, name; no uid.
fn decode_entry_v1(r: &mut Reader<'_>) -> Result<VolumeEntry, FormatError> {
    let id = r.u32()?;
    if id >= VOLUMES_MAX {
        return Err(r.invalid("id", format!("{id} >= {VOLUMES_MAX}")));
    }
    let n = decode_state_and_name_len(r)?;
    r.skip(2)?;
    let size_blocks = r.u64()?;
    let created_sid = Sid(r.u64()?);
    let created_pos = r.u32()?;
    r.skip(4)?;
    let name = decode_name(r, n)?;
    Ok(VolumeEntry {
        id: VolumeId(id),
        uid: VolumeUid(u64::from(id) + 1),
        name,
        size_blocks,
        created_sid,
        created_pos,
        limits: VolumeLimits::NONE,
        whole_size_blocks: 0,
        map_unit_shift: 0,
        dual_map: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(id: u32, uid: u64, name: &str) -> VolumeEntry {
        VolumeEntry {
            id: VolumeId(id),
            uid: VolumeUid(uid),
            name: name.into(),
            size_blocks: 256,
            created_sid: Sid(3),
            created_pos: 7,
            limits: VolumeLimits::NONE,
            whole_size_blocks: 0,
            map_unit_shift: 0,
            dual_map: false,
        }
    }

    /// A version-1 block as the previous encoder wrote it.
    fn encode_v1(generation: u64, entries: &[(u32, &str, u64, u64, u32)]) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        let mut w = Writer::new(&mut b);
        w.u32(VOLUME_TABLE_MAGIC);
        w.u16(1);
        w.u16(entries.len() as u16);
        w.u32(0);
        w.u32(0);
        w.u64(generation);
        w.u64(0);
        for &(id, name, size, sid, pos) in entries {
            w.u32(id);
            w.u8(1);
            w.u8(name.len() as u8);
            w.u16(0);
            w.u64(size);
            w.u64(sid);
            w.u32(pos);
            w.u32(0);
            let mut nb = [0u8; VOLUME_NAME_MAX];
            nb[..name.len()].copy_from_slice(name.as_bytes());
            w.bytes(&nb);
        }
        seal(&mut b, BLOCK_SIZE);
        b
    }

    #[test]
    fn version_1_tables_decode_with_uids_above_every_slot() {
        let b = encode_v1(9, &[(0, "a", 100, 4, 5), (3, "db", 200, 6, 0)]);
        let t = VolumeTable::decode(&b, 0).unwrap();
        assert_eq!(t.generation, 9);
        assert_eq!(t.uid_next, VolumeUid(u64::from(VOLUMES_MAX) + 1));
        assert_eq!(
            t.entries,
            vec![
                VolumeEntry {
                    id: VolumeId(0),
                    uid: VolumeUid(1),
                    name: "a".into(),
                    size_blocks: 100,
                    created_sid: Sid(4),
                    created_pos: 5,
                    limits: VolumeLimits::NONE,
                    whole_size_blocks: 0,
                    map_unit_shift: 0,
                    dual_map: false,
                },
                VolumeEntry {
                    id: VolumeId(3),
                    uid: VolumeUid(4),
                    name: "db".into(),
                    size_blocks: 200,
                    created_sid: Sid(6),
                    created_pos: 0,
                    limits: VolumeLimits::NONE,
                    whole_size_blocks: 0,
                    map_unit_shift: 0,
                    dual_map: false,
                },
            ]
        );
        // Written again it is version 2, and reads back the same.
        let again = t.encode();
        assert_eq!(u16::from_le_bytes([again[4], again[5]]), 2);
        assert_eq!(VolumeTable::decode(&again, 0).unwrap(), t);
    }

    /// Rewrites the map-unit byte of entry 0 in the second block and reseals it.
    fn with_unit_byte(mut b: Vec<u8>, version: u16, shift: u8) -> Vec<u8> {
        let second = &mut b[BLOCK_SIZE..];
        second[4..6].copy_from_slice(&version.to_le_bytes());
        second[32 + 34] = shift;
        seal(second, BLOCK_SIZE);
        b
    }

    #[test]
    fn mapping_units_are_checked() {
        let mut t = VolumeTable {
            generation: 1,
            uid_next: VolumeUid(9),
            entries: vec![VolumeEntry {
                size_blocks: 48,
                map_unit_shift: 2,
                dual_map: false,
                ..entry(0, 1, "big")
            }],
        };
        let b = t.encode_in(2);
        assert_eq!(
            VolumeTable::decode(&b, 0).unwrap().entries[0].map_unit_shift,
            2
        );
        // A unit above the largest, a version-3 copy claiming a unit, and a size that
        // is not whole units are refused by name.
        let e = VolumeTable::decode(&with_unit_byte(b.clone(), 4, 5), 0).unwrap_err();
        assert!(e.to_string().contains("map_unit_shift"), "{e}");
        let mut v3 = b.clone();
        v3[4..6].copy_from_slice(&VOLUME_TABLE_VERSION_3.to_le_bytes());
        seal(&mut v3[..BLOCK_SIZE], BLOCK_SIZE);
        let e = VolumeTable::decode(&with_unit_byte(v3, 3, 2), 0).unwrap_err();
        assert!(e.to_string().contains("map_unit_shift"), "{e}");
        t.entries[0].size_blocks = 50;
        let e = VolumeTable::decode(&t.encode_in(2), 0).unwrap_err();
        assert!(e.to_string().contains("whole number of units"), "{e}");
        // A reader that predates version 4 refuses the table instead of misreading it.
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), VOLUME_TABLE_VERSION_4);
    }

    #[test]
    fn dual_maps_are_version_5_and_checked() {
        let t = VolumeTable {
            generation: 1,
            uid_next: VolumeUid(9),
            entries: vec![VolumeEntry {
                size_blocks: 48,
                map_unit_shift: 4,
                dual_map: true,
                ..entry(0, 1, "dual")
            }],
        };
        let b = t.encode_in(2);
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), VOLUME_TABLE_VERSION_5);
        assert!(VolumeTable::decode(&b, 0).unwrap().entries[0].dual_map);
        let with_flags = |mut b: Vec<u8>, version: u16, shift: u8, flags: u8| {
            b[4..6].copy_from_slice(&version.to_le_bytes());
            seal(&mut b[..BLOCK_SIZE], BLOCK_SIZE);
            let second = &mut b[BLOCK_SIZE..];
            second[4..6].copy_from_slice(&version.to_le_bytes());
            second[32 + 34] = shift;
            second[32 + 35] = flags;
            seal(second, BLOCK_SIZE);
            b
        };
        // Unknown flags, a dual volume without a unit, and a version-4 copy claiming
        // a flag are refused by name.
        for (version, shift, flags) in [(5, 4, 2), (5, 0, 1), (4, 4, 1)] {
            let e =
                VolumeTable::decode(&with_flags(b.clone(), version, shift, flags), 0).unwrap_err();
            assert!(e.to_string().contains("map_flags"), "{e}");
        }
    }

    #[test]
    fn uids_are_unique_and_below_uid_next() {
        let mut t = VolumeTable::default();
        let a = t.issue_uid().unwrap();
        let b = t.issue_uid().unwrap();
        assert_eq!(
            (a, b, t.uid_next),
            (VolumeUid(1), VolumeUid(2), VolumeUid(3))
        );
        t.entries = vec![entry(0, 1, "a"), entry(1, 1, "b")];
        assert!(
            VolumeTable::decode(&t.encode(), 0).is_err(),
            "duplicate uid"
        );
        t.entries = vec![entry(0, 3, "a")];
        assert!(
            VolumeTable::decode(&t.encode(), 0).is_err(),
            "uid >= uid_next"
        );
        t.entries = vec![entry(0, 0, "a")];
        assert!(VolumeTable::decode(&t.encode(), 0).is_err(), "uid 0");
        t.entries = vec![entry(0, 2, "a")];
        assert!(VolumeTable::decode(&t.encode(), 0).is_ok());
        t.uid_next = VolumeUid(u64::MAX);
        assert_eq!(t.issue_uid(), None, "the last uid is never issued twice");
    }

    proptest! {
            #[test]
            fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4200)) {
                let _ = VolumeTable::decode(&bytes, 0);
            }

            #[test]
            fn roundtrip(gen in any::<u64>(), vols in proptest::collection::btree_map(0u32..63, ("[a-z]{1,32}", any::<u64>(), any::<u64>(), any::<u32>(), (any::<u64>(), any::<u64>(), 0u8..=100, 0u8..3)), 0..20)) {
                let mut names = std::collections::BTreeSet::new();
                let entries: Vec<VolumeEntry> = vols.into_iter()
                    .filter(|(_, (n, ..))| names.insert(n.clone()))
                    .enumerate()
                    .map(|(i, (id, (name, size_blocks, sid, pos, (iops, bps, share, gc))))| VolumeEntry {
                        id: VolumeId(id), uid: VolumeUid(1000 + i as u64), name, size_blocks,
                        created_sid: Sid(sid), created_pos: pos,
                        limits: VolumeLimits { iops_max: iops, bytes_per_sec_max: bps, cache_share_pct: share, gc: VolumeGc::from_u8(gc).unwrap() },
                        whole_size_blocks: if iops % 2 == 0 { 0 } else { size_blocks.saturating_add(bps % 1000) },
                        map_unit_shift: 0,
    dual_map: false,
                    }).collect();
                let mut t = VolumeTable { generation: gen, uid_next: VolumeUid(5000), entries };
                let b = t.encode_in(2);
                prop_assert_eq!(b.len(), VolumeTable::encoded_len(&b));
                prop_assert_eq!(VolumeTable::decode(&b, 0), Ok(t.clone()));
                // Version 2 drops the limits and the whole sizes.
                for e in &mut t.entries {
                    e.limits = VolumeLimits::NONE;
                    e.whole_size_blocks = 0;
                }
                let b = t.encode_in(1);
                prop_assert_eq!(b.len(), VolumeTable::encoded_len(&b));
                prop_assert_eq!(VolumeTable::decode(&b, 0), Ok(t));
            }

            #[test]
            fn mapping_units_roundtrip_in_version_4(shifts in proptest::collection::vec(0u8..=MAP_UNIT_SHIFT_MAX, 1..10)) {
                let entries: Vec<VolumeEntry> = shifts.iter().enumerate().map(|(i, &sh)| VolumeEntry {
                    size_blocks: 64 << sh,
                    map_unit_shift: sh,
                    ..entry(i as u32, 1 + i as u64, &format!("v{i}"))
                }).collect();
                let t = VolumeTable { generation: 3, uid_next: VolumeUid(100), entries };
                let b = t.encode_in(2);
                let version = u16::from_le_bytes([b[4], b[5]]);
                let any_unit = shifts.iter().any(|&s| s > 0);
                prop_assert_eq!(version, if any_unit { VOLUME_TABLE_VERSION_4 } else { VOLUME_TABLE_VERSION_3 });
                prop_assert_eq!(t.blocks_needed(), if any_unit { 2 } else { 1 });
                prop_assert_eq!(b.len(), VolumeTable::encoded_len(&b));
                prop_assert_eq!(VolumeTable::decode(&b, 0), Ok(t));
            }

            #[test]
            fn a_copy_torn_between_its_blocks_is_refused(gen in 1u64..1000) {
                let mut t = VolumeTable { generation: gen, uid_next: VolumeUid(9), entries: vec![entry(2, 4, "db")] };
                t.entries[0].limits.iops_max = 500;
                let old = t.encode_in(2);
                t.generation += 1;
                t.entries[0].limits.iops_max = 800;
                let new = t.encode_in(2);
                let mut torn = new[..BLOCK_SIZE].to_vec();
                torn.extend_from_slice(&old[BLOCK_SIZE..]);
                prop_assert!(VolumeTable::decode(&torn, 0).is_err());
                // A version-3 copy missing its second block is refused too.
                prop_assert!(VolumeTable::decode(&new[..BLOCK_SIZE], 0).is_err());
                prop_assert_eq!(VolumeTable::decode(&new, 0).unwrap().entries[0].limits.iops_max, 800);
            }

            /// A cache share past 100% is refused by name, however the block is sealed.
            #[test]
            fn a_cache_share_past_100_is_refused(pct in 101u8..=255) {
                let mut t = VolumeTable { generation: 3, uid_next: VolumeUid(9), entries: vec![entry(2, 4, "db")] };
                t.entries[0].limits.cache_share_pct = pct;
                let b = t.encode_in(2);
                let e = VolumeTable::decode(&b, 0).unwrap_err().to_string();
                prop_assert!(e.contains("cache_share_pct"), "{}", e);
            }

            /// An unknown GC policy is refused by name.
            #[test]
            fn an_unknown_gc_policy_is_refused(v in 3u8..=255) {
                let t = VolumeTable { generation: 3, uid_next: VolumeUid(9), entries: vec![entry(2, 4, "db")] };
                let mut b = t.encode_in(2);
                // Entry 0's limits start at 32 in the second block; the policy is byte 25.
                b[BLOCK_SIZE + 32 + 25] = v;
                crate::codec::seal(&mut b[BLOCK_SIZE..], BLOCK_SIZE);
                let e = VolumeTable::decode(&b, 0).unwrap_err().to_string();
                prop_assert!(e.contains("gc_policy"), "{}", e);
            }
        }
}
