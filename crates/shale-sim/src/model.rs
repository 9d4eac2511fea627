//! The oracle: for every block of every volume, the set of contents a read may
//! return after a crash.
//!
//! The engine's unit of atomicity is the 4 KiB block: a sub-block write is a
//! read-modify-write of the newest content, so every write produces one new *version*
//! of each block it touches, computed here the same way. Per block the model keeps a
//! list of versions, oldest first:
//!
//! - `versions[0]` is the *floor*: the newest content that is known durable;
//! - the rest were written (or trimmed) after it, in submission order, and may or may
//!   not have reached the media.
//!
//! Rules:
//! - A write, write-zeroes or trim of whole blocks adds a version to each block it
//!   changes, when it is submitted (the engine serves requests in order, so a later
//!   read sees it). Trim of a partial block changes nothing (trim is advisory there);
//!   write-zeroes is exact.
//! - A flush moves each block's floor to the newest version whose request had
//!   *completed* when the flush was submitted; the floor moves when the flush
//!   completes. Older versions are dropped: they may never be read again.
//! - A FUA write moves the floor of its own blocks to its version when it completes.
//! - After a crash a block must read as one of its versions, floor or newer. A
//!   flushed trim is a zero floor, so trimmed data never comes back once flushed.
//! - What recovery returns becomes the new floor (a later crash may not take it
//!   back), and the newest content for what follows.
//! - Volume changes (create, resize, delete) are durable when they complete; blocks a
//!   volume gains start as zeros.
//!
//! A version is identified by the request that made it ([`OpId`]) and a 64-bit hash
//! of its content; only the newest content is kept in full (it is what reads before a
//! crash must return, and what sub-block writes patch).

use std::collections::{BTreeMap, BTreeSet};

use shale_engine::VolumeUid;

/// Identifies one request the simulator submitted.
pub type OpId = u64;

/// The version a freshly created (or grown) block has: zeros, durable.
pub const ORIGIN: OpId = 0;

const BS: usize = 4096;
const PAST_MAX: usize = 4;

/// A 64-bit hash of a block's content (four multiply-xorshift lanes over 64-bit
/// words; stable across builds, so traces compare between runs).
pub fn block_hash(b: &[u8]) -> u64 {
    const K: [u64; 4] = [
        0x9E37_79B9_7F4A_7C15,
        0xBF58_476D_1CE4_E5B9,
        0x94D0_49BB_1331_11EB,
        0xD6E8_FEB8_6659_FD93,
    ];
    let mut lanes = [b.len() as u64, 1, 2, 3];
    let mut words = b.chunks_exact(32);
    for c in &mut words {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w.copy_from_slice(&c[8 * i..8 * i + 8]);
            *lane = (*lane ^ u64::from_le_bytes(w)).wrapping_mul(K[i]);
            *lane ^= *lane >> 29;
        }
    }
    let mut h = lanes
        .iter()
        .fold(0u64, |h, &l| (h ^ l).wrapping_mul(K[0]).rotate_left(23));
    for (i, &x) in words.remainder().iter().enumerate() {
        h = (h ^ (u64::from(x) << (8 * (i % 8)))).wrapping_mul(K[1]);
    }
    h ^ (h >> 32)
}

/// True when every byte is zero (a fast path: most blocks of a sparse volume).
pub fn is_zero(b: &[u8]) -> bool {
    // Fixed-size chunks OR-folded without an early exit vectorize well.
    b.chunks(256)
        .all(|c| c.iter().fold(0u8, |acc, &x| acc | x) == 0)
}

fn zero_hash() -> u64 {
    block_hash(&[0u8; BS])
}

#[derive(Debug, Clone)]
struct Hist {
    /// `versions[0]` is the floor; later entries are newer and not yet durable.
    versions: Vec<(OpId, u64)>,
    /// Earlier floors, newest last (stale content, for diagnosis only).
    past: Vec<u64>,
}

impl Hist {
    fn zeros(zero: u64) -> Hist {
        Hist {
            versions: vec![(ORIGIN, zero)],
            past: Vec::new(),
        }
    }

    /// Makes the version of `op` the floor, if it is still allowed and newer.
    fn advance_to(&mut self, op: OpId) {
        let Some(i) = self.versions.iter().rposition(|&(o, _)| o == op) else {
            return;
        };
        for (_, h) in self.versions.drain(..i) {
            if self.past.last() != Some(&h) {
                self.past.push(h);
            }
        }
        if self.past.len() > PAST_MAX {
            let extra = self.past.len() - PAST_MAX;
            self.past.drain(..extra);
        }
    }

    fn collapse(&mut self, h: u64) {
        let i = self.versions.iter().rposition(|&(_, v)| v == h);
        match i {
            Some(i) => self.advance_to(self.versions[i].0),
            None => {
                self.past.push(self.versions[0].1);
                self.versions = vec![(ORIGIN, h)];
            }
        }
        self.versions.truncate(1);
    }
}

/// One volume in the model.
#[derive(Debug, Clone)]
pub struct VolModel {
    pub name: String,
    pub size_blocks: u64,
    /// The volume's mapping unit in blocks: a trim drops whole units only.
    pub unit_blocks: u64,
    /// Distinguishes a volume from an earlier one that had the same id.
    pub incarnation: u64,
    image: Vec<u8>,
    hist: Vec<Hist>,
}

impl VolModel {
    pub fn size_bytes(&self) -> u64 {
        self.size_blocks * BS as u64
    }
}

/// Blocks one request touched, for FUA durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockRange {
    pub volume: VolumeUid,
    pub incarnation: u64,
    pub first: u64,
    pub end: u64,
}

/// Per block, the newest version whose request had completed when a flush was
/// submitted: where the floor moves when that flush completes.
#[derive(Debug, Clone, Default)]
pub struct FlushCut {
    points: Vec<(VolumeUid, u64, u64, OpId)>,
}

impl FlushCut {
    pub fn len(&self) -> usize {
        self.points.len()
    }
    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// A block read back with content the model does not allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub volume: VolumeUid,
    pub lba: u64,
    pub got: u64,
    /// The allowed versions (request id, content hash), floor first.
    pub allowed: Vec<(OpId, u64)>,
    /// What the content is, if the model can tell.
    pub diagnosis: String,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} block {}: read content {:016x} is none of the {} allowed versions {:?} ({})",
            self.volume,
            self.lba,
            self.got,
            self.allowed.len(),
            self.allowed
                .iter()
                .map(|(op, h)| format!("op {op}: {h:016x}"))
                .collect::<Vec<_>>(),
            self.diagnosis
        )
    }
}

/// The oracle. See the module docs for the rules.
#[derive(Debug, Clone)]
pub struct Model {
    vols: BTreeMap<VolumeUid, VolModel>,
    incarnations: u64,
    /// Blocks with versions above the floor.
    dirty: BTreeSet<(VolumeUid, u64)>,
    /// Requests submitted and not (successfully) completed.
    unsettled: BTreeSet<OpId>,
    /// Blocks a failed request may or may not have changed: the engine answers a
    /// failed multi-block request per block, old or new, and says nothing of which.
    unknown: BTreeSet<(VolumeUid, u64)>,
    /// Blocks whose newer versions were computed over a failed request's content (a
    /// sub-block write patches whichever content the engine holds, which the model no
    /// longer knows): reads of them cannot be checked until the next crash settles it.
    unverifiable: BTreeSet<(VolumeUid, u64)>,
    zero: u64,
}

impl Default for Model {
    fn default() -> Self {
        Self::new()
    }
}

impl Model {
    pub fn new() -> Model {
        Model {
            vols: BTreeMap::new(),
            incarnations: 0,
            dirty: BTreeSet::new(),
            unsettled: BTreeSet::new(),
            unknown: BTreeSet::new(),
            unverifiable: BTreeSet::new(),
            zero: zero_hash(),
        }
    }

    pub fn volumes(&self) -> &BTreeMap<VolumeUid, VolModel> {
        &self.vols
    }

    pub fn volume(&self, id: VolumeUid) -> Option<&VolModel> {
        self.vols.get(&id)
    }

    /// Blocks whose content is not yet known durable.
    pub fn dirty_blocks(&self) -> usize {
        self.dirty.len()
    }

    pub fn create(&mut self, id: VolumeUid, name: &str, size_blocks: u64) {
        self.create_mapped(id, name, size_blocks, 1);
    }

    /// A volume mapped in units of `unit_blocks` blocks. A write of part of a unit
    /// rewrites the whole unit in the engine, but with the other blocks' newest
    /// contents, so each block still reads as one of its own versions: the rules
    /// above hold per block, but for trims, which drop whole units only.
    pub fn create_mapped(&mut self, id: VolumeUid, name: &str, size_blocks: u64, unit_blocks: u64) {
        self.incarnations += 1;
        let zero = self.zero;
        self.vols.insert(
            id,
            VolModel {
                name: name.to_string(),
                size_blocks,
                unit_blocks,
                incarnation: self.incarnations,
                image: vec![0; size_blocks as usize * BS],
                hist: vec![Hist::zeros(zero); size_blocks as usize],
            },
        );
    }

    pub fn delete(&mut self, id: VolumeUid) {
        self.vols.remove(&id);
        self.dirty.retain(|&(v, _)| v != id);
    }

    /// Shrinking drops blocks; blocks gained read as zeros (durably: a completed
    /// volume change is durable, and a shrink then grow must not bring data back).
    pub fn resize(&mut self, id: VolumeUid, size_blocks: u64) {
        let zero = self.zero;
        let Some(v) = self.vols.get_mut(&id) else {
            return;
        };
        v.image.resize(size_blocks as usize * BS, 0);
        v.hist.resize(size_blocks as usize, Hist::zeros(zero));
        v.size_blocks = size_blocks;
        self.dirty
            .retain(|&(vol, lba)| vol != id || lba < size_blocks);
    }

    /// The newest content of `len` bytes at `offset` (what a read returns now).
    pub fn newest(&self, id: VolumeUid, offset: u64, len: u64) -> Option<Vec<u8>> {
        let v = self.vols.get(&id)?;
        let end = offset.checked_add(len)?;
        (end <= v.image.len() as u64).then(|| v.image[offset as usize..end as usize].to_vec())
    }

    /// A write of `data` at byte `offset` by request `op`.
    pub fn write(&mut self, op: OpId, id: VolumeUid, offset: u64, data: &[u8]) -> BlockRange {
        self.change(op, id, offset, data.len() as u64, Some(data))
    }

    /// Bytes `offset..offset+len` become zeros (write-zeroes; trim of whole blocks).
    pub fn zero(&mut self, op: OpId, id: VolumeUid, offset: u64, len: u64) -> BlockRange {
        self.change(op, id, offset, len, None)
    }

    /// A request that changes nothing in the model (a trim of partial blocks only,
    /// a read, a flush) is still unsettled until it completes.
    pub fn submitted(&mut self, op: OpId) {
        self.unsettled.insert(op);
    }

    fn change(
        &mut self,
        op: OpId,
        id: VolumeUid,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> BlockRange {
        self.unsettled.insert(op);
        let Some(v) = self.vols.get_mut(&id) else {
            return BlockRange {
                volume: id,
                incarnation: 0,
                first: 0,
                end: 0,
            };
        };
        let end = (offset + len).min(v.image.len() as u64);
        let range = BlockRange {
            volume: id,
            incarnation: v.incarnation,
            first: offset / BS as u64,
            end: end.div_ceil(BS as u64),
        };
        if offset >= end {
            return range;
        }
        let dst = &mut v.image[offset as usize..end as usize];
        match data {
            Some(d) => dst.copy_from_slice(&d[..dst.len()]),
            None => dst.fill(0),
        }
        for lba in range.first..range.end {
            let b = lba as usize * BS;
            let h = block_hash(&v.image[b..b + BS]);
            v.hist[lba as usize].versions.push((op, h));
            self.dirty.insert((id, lba));
        }
        range
    }

    /// Request `op` completed successfully.
    pub fn completed(&mut self, op: OpId) {
        self.unsettled.remove(&op);
    }

    /// Request `op` failed without failing the engine: each block it touched now
    /// holds its old or its new content. Its version stays allowed after a crash (it
    /// may have reached the media, as any unacknowledged write) and stays unsettled,
    /// so no flush makes it the floor. Blocks with versions submitted after it are
    /// marked unverifiable (see [`Model::unverifiable`]).
    pub fn failed(&mut self, op: OpId) {
        for &(id, lba) in &self.dirty {
            let Some(h) = self.vols.get(&id).and_then(|v| v.hist.get(lba as usize)) else {
                continue;
            };
            let Some(i) = h.versions.iter().position(|&(o, _)| o == op) else {
                continue;
            };
            if i + 1 < h.versions.len() {
                self.unverifiable.insert((id, lba));
            } else {
                self.unknown.insert((id, lba));
            }
        }
    }

    /// A read of a block a failed request touched: old or new content are both
    /// right (checked like a read after a crash).
    pub fn is_unknown(&self, id: VolumeUid, lba: u64) -> bool {
        self.unknown.contains(&(id, lba))
    }

    /// See the field's docs: such a block cannot be checked before the next crash.
    pub fn is_unverifiable(&self, id: VolumeUid, lba: u64) -> bool {
        self.unverifiable.contains(&(id, lba))
    }

    /// Whether a failed request left blocks the model cannot follow exactly: the
    /// simulator then crashes before submitting anything new.
    pub fn has_unknown(&self) -> bool {
        !self.unknown.is_empty() || !self.unverifiable.is_empty()
    }

    /// A FUA write completed: its blocks' floors move to its versions.
    pub fn durable(&mut self, op: OpId, r: BlockRange) {
        let Some(v) = self.vols.get_mut(&r.volume) else {
            return;
        };
        if v.incarnation != r.incarnation {
            return;
        }
        for lba in r.first..r.end.min(v.size_blocks) {
            let h = &mut v.hist[lba as usize];
            h.advance_to(op);
            if h.versions.len() == 1 {
                self.dirty.remove(&(r.volume, lba));
            }
        }
    }

    /// The cut of a flush submitted now.
    pub fn cut(&self) -> FlushCut {
        let mut points = Vec::new();
        for &(id, lba) in &self.dirty {
            let Some(v) = self.vols.get(&id) else {
                continue;
            };
            let h = &v.hist[lba as usize];
            if let Some(&(op, _)) = h.versions[1..]
                .iter()
                .rev()
                .find(|(op, _)| !self.unsettled.contains(op))
            {
                points.push((id, v.incarnation, lba, op));
            }
        }
        FlushCut { points }
    }

    /// The flush that took `cut` completed.
    pub fn flushed(&mut self, cut: &FlushCut) {
        for &(id, inc, lba, op) in &cut.points {
            let Some(v) = self.vols.get_mut(&id) else {
                continue;
            };
            if v.incarnation != inc || lba >= v.size_blocks {
                continue;
            }
            let h = &mut v.hist[lba as usize];
            h.advance_to(op);
            if h.versions.len() == 1 {
                self.dirty.remove(&(id, lba));
            }
        }
    }

    /// After a clean shutdown every request has completed and everything is durable.
    pub fn all_durable(&mut self) {
        for (&id, v) in self.vols.iter_mut() {
            for (lba, h) in v.hist.iter_mut().enumerate() {
                let key = (id, lba as u64);
                if self.unknown.contains(&key) || self.unverifiable.contains(&key) {
                    // Which version the engine holds is unknown: a clean shutdown
                    // must not pick one (the simulator crashes instead).
                    continue;
                }
                if let Some(&(op, _)) = h.versions.last() {
                    h.advance_to(op);
                }
            }
        }
        let (unknown, unverifiable) = (&self.unknown, &self.unverifiable);
        self.dirty
            .retain(|k| unknown.contains(k) || unverifiable.contains(k));
        self.unsettled.clear();
    }

    /// The allowed versions of a block, floor first.
    pub fn allowed(&self, id: VolumeUid, lba: u64) -> Option<&[(OpId, u64)]> {
        let v = self.vols.get(&id)?;
        v.hist.get(lba as usize).map(|h| &h.versions[..])
    }

    /// Checks a block read after a crash against its allowed versions.
    pub fn check(&self, id: VolumeUid, lba: u64, data: &[u8]) -> Result<(), Mismatch> {
        if self.zero_only(id, lba) && is_zero(data) {
            return Ok(());
        }
        let got = block_hash(data);
        let Some(allowed) = self.allowed(id, lba) else {
            return Err(Mismatch {
                volume: id,
                lba,
                got,
                allowed: Vec::new(),
                diagnosis: "block outside the model's volume".into(),
            });
        };
        if allowed.iter().any(|&(_, h)| h == got) {
            return Ok(());
        }
        Err(Mismatch {
            volume: id,
            lba,
            got,
            allowed: allowed.to_vec(),
            diagnosis: self.diagnose(id, lba, got),
        })
    }

    /// Checks a block read before any crash: it must be the newest content.
    pub fn check_newest(&self, id: VolumeUid, lba: u64, data: &[u8]) -> Result<(), Mismatch> {
        let got = block_hash(data);
        let Some(h) = self
            .vols
            .get(&id)
            .and_then(|v| v.hist.get(lba as usize))
            .and_then(|h| h.versions.last())
        else {
            return Err(Mismatch {
                volume: id,
                lba,
                got,
                allowed: Vec::new(),
                diagnosis: "block outside the model's volume".into(),
            });
        };
        if h.1 == got {
            return Ok(());
        }
        Err(Mismatch {
            volume: id,
            lba,
            got,
            allowed: vec![*h],
            diagnosis: self.diagnose(id, lba, got),
        })
    }

    fn diagnose(&self, id: VolumeUid, lba: u64, got: u64) -> String {
        if got == self.zero {
            return "zeros: the data was lost or a trim came back".into();
        }
        if let Some(h) = self.vols.get(&id).and_then(|v| v.hist.get(lba as usize)) {
            if h.past.contains(&got) {
                return "stale: an older durable version of this block".into();
            }
        }
        for (&vid, v) in &self.vols {
            for (i, h) in v.hist.iter().enumerate() {
                if h.versions.iter().any(|&(_, x)| x == got) || h.past.contains(&got) {
                    return format!("misdirected: a version of {vid} block {i}");
                }
            }
        }
        "garbage: no version of any block the model knows".into()
    }

    /// The block's only allowed content is zeros (never written, or trimmed and
    /// flushed).
    fn zero_only(&self, id: VolumeUid, lba: u64) -> bool {
        self.allowed(id, lba)
            .is_some_and(|a| a.len() == 1 && a[0].1 == self.zero)
    }

    /// What recovery returned for a block becomes its floor and newest content.
    pub fn observe(&mut self, id: VolumeUid, lba: u64, data: &[u8]) {
        if self.zero_only(id, lba) && is_zero(data) {
            return;
        }
        let Some(v) = self.vols.get_mut(&id) else {
            return;
        };
        let Some(h) = v.hist.get_mut(lba as usize) else {
            return;
        };
        h.collapse(block_hash(data));
        let b = lba as usize * BS;
        v.image[b..b + BS].copy_from_slice(data);
        self.dirty.remove(&(id, lba));
    }

    /// Puts a deleted volume back as `before` had it (`None`: removes the volume): a
    /// volume change that failed, showed in the live engine, and was undone by a
    /// crash. Every block may also read as zeros (the change unmapped it in memory).
    pub fn restore(&mut self, id: VolumeUid, before: Option<VolModel>) {
        self.dirty.retain(|&(v, _)| v != id);
        let Some(v) = before else {
            self.vols.remove(&id);
            return;
        };
        self.vols.insert(id, v);
        self.allow_zeros_from(id, 0);
    }

    /// Undoes a shrink a crash took back: blocks from the shrunk size on come back
    /// from `before` and may also read as zeros; the blocks kept keep their newer
    /// history.
    pub fn unshrink(&mut self, id: VolumeUid, before: &VolModel) {
        let Some(v) = self.vols.get_mut(&id) else {
            return;
        };
        let from = v.size_blocks as usize;
        if before.size_blocks as usize <= from {
            return;
        }
        v.image.extend_from_slice(&before.image[from * BS..]);
        v.hist.extend_from_slice(&before.hist[from..]);
        v.size_blocks = before.size_blocks;
        self.allow_zeros_from(id, from as u64);
    }

    fn allow_zeros_from(&mut self, id: VolumeUid, from: u64) {
        let zero = self.zero;
        let Some(v) = self.vols.get_mut(&id) else {
            return;
        };
        for (lba, h) in v.hist.iter_mut().enumerate().skip(from as usize) {
            if !h.versions.iter().any(|&(_, x)| x == zero) {
                h.versions.push((ORIGIN, zero));
            }
            if h.versions.len() > 1 {
                self.dirty.insert((id, lba as u64));
            }
        }
    }

    /// After a crash and a complete verification: no request is in flight any more.
    pub fn forget_requests(&mut self) {
        self.unsettled.clear();
        self.unknown.clear();
        self.unverifiable.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V: VolumeUid = VolumeUid(0);

    fn block(x: u8) -> Vec<u8> {
        vec![x; BS]
    }

    #[test]
    fn unflushed_writes_allow_every_version_flushed_ones_only_the_newest() {
        let mut m = Model::new();
        m.create(V, "a", 4);
        m.write(1, V, 0, &block(1));
        m.completed(1);
        m.write(2, V, 0, &block(2));
        m.completed(2);
        for x in [0u8, 1, 2] {
            assert!(m.check(V, 0, &block(x)).is_ok(), "{x}");
        }
        let cut = m.cut();
        m.write(3, V, 0, &block(3));
        m.flushed(&cut);
        assert!(m.check(V, 0, &block(0)).is_err());
        assert!(m.check(V, 0, &block(1)).is_err());
        assert!(m.check(V, 0, &block(2)).is_ok());
        assert!(m.check(V, 0, &block(3)).is_ok());
        let e = m.check(V, 0, &block(1)).unwrap_err();
        assert!(e.diagnosis.starts_with("stale"), "{e}");
    }

    #[test]
    fn a_flush_covers_only_requests_completed_before_it() {
        let mut m = Model::new();
        m.create(V, "a", 2);
        m.write(1, V, 0, &block(1));
        let cut = m.cut();
        m.completed(1);
        m.flushed(&cut);
        assert!(m.check(V, 0, &block(0)).is_ok());
        assert!(m.check(V, 0, &block(1)).is_ok());
    }

    #[test]
    fn sub_block_writes_patch_the_newest_content() {
        let mut m = Model::new();
        m.create(V, "a", 2);
        m.write(1, V, 100, &[7u8; 10]);
        m.write(2, V, 4000, &[8u8; 200]);
        let mut want = vec![0u8; 2 * BS];
        want[100..110].fill(7);
        want[4000..4200].fill(8);
        assert_eq!(m.newest(V, 0, 2 * BS as u64).unwrap(), want);
        // Block 0 has versions: zeros, +op1, +op1+op2; never "op2 without op1".
        let mut only2 = vec![0u8; BS];
        only2[4000..].fill(8);
        assert!(m.check(V, 0, &only2).is_err());
        assert!(m.check(V, 0, &want[..BS]).is_ok());
        let mut only1 = vec![0u8; BS];
        only1[100..110].fill(7);
        assert!(m.check(V, 0, &only1).is_ok());
    }

    #[test]
    fn fua_makes_its_own_blocks_durable() {
        let mut m = Model::new();
        m.create(V, "a", 2);
        m.write(1, V, 0, &block(1));
        let r = m.write(2, V, BS as u64, &block(2));
        m.completed(2);
        m.durable(2, r);
        assert!(m.check(V, 0, &block(0)).is_ok());
        assert!(m.check(V, 1, &block(0)).is_err());
        assert!(m.check(V, 1, &block(2)).is_ok());
    }

    #[test]
    fn flushed_trims_stay_trimmed() {
        let mut m = Model::new();
        m.create(V, "a", 2);
        m.write(1, V, 0, &block(5));
        m.completed(1);
        m.flushed(&m.cut());
        m.zero(2, V, 0, BS as u64);
        m.completed(2);
        assert!(m.check(V, 0, &block(5)).is_ok());
        m.flushed(&m.cut());
        let e = m.check(V, 0, &block(5)).unwrap_err();
        assert!(e.diagnosis.starts_with("stale"), "{e}");
    }

    #[test]
    fn recovered_content_becomes_the_floor() {
        let mut m = Model::new();
        m.create(V, "a", 1);
        m.write(1, V, 0, &block(1));
        m.write(2, V, 0, &block(2));
        m.observe(V, 0, &block(1));
        m.forget_requests();
        assert!(m.check(V, 0, &block(1)).is_ok());
        assert!(m.check(V, 0, &block(2)).is_err());
        assert!(m.check(V, 0, &block(0)).is_err());
        assert_eq!(m.newest(V, 0, BS as u64).unwrap(), block(1));
    }

    #[test]
    fn regrown_blocks_are_zero_and_another_volume_is_misdirected() {
        let mut m = Model::new();
        m.create(V, "a", 2);
        m.create(VolumeUid(1), "b", 1);
        m.write(1, V, BS as u64, &block(3));
        m.resize(V, 1);
        m.resize(V, 2);
        assert!(m.check(V, 1, &block(0)).is_ok());
        assert!(m.check(V, 1, &block(3)).is_err());
        m.write(2, VolumeUid(1), 0, &block(9));
        let e = m.check(V, 0, &block(9)).unwrap_err();
        assert!(e.diagnosis.starts_with("misdirected"), "{e}");
    }

    #[test]
    fn an_undone_shrink_brings_back_old_blocks_or_zeros_and_keeps_new_writes() {
        let mut m = Model::new();
        m.create(V, "a", 4);
        m.write(1, V, 3 * BS as u64, &block(3));
        m.completed(1);
        m.flushed(&m.cut());
        let before = m.volume(V).cloned().unwrap();
        m.resize(V, 2);
        m.write(2, V, 0, &block(7));
        m.unshrink(V, &before);
        assert_eq!(m.volume(V).unwrap().size_blocks, 4);
        assert!(
            m.check(V, 0, &block(7)).is_ok(),
            "newer writes stay allowed"
        );
        assert!(m.check(V, 3, &block(3)).is_ok());
        assert!(m.check(V, 3, &block(0)).is_ok());
        assert!(m.check(V, 3, &block(9)).is_err());
        m.restore(V, None);
        assert!(m.volume(V).is_none());
    }

    #[test]
    fn a_failed_request_leaves_old_or_new_and_taints_what_follows_it() {
        let mut m = Model::new();
        m.create(V, "a", 4);
        m.write(1, V, 0, &block(1));
        m.write(1, V, BS as u64, &block(1));
        m.completed(1);
        m.flushed(&m.cut());
        m.write(2, V, 0, &[7u8; 2 * BS]);
        m.write(3, V, BS as u64, &[9u8; 100]);
        m.failed(2);
        assert!(m.has_unknown());
        assert!(m.is_unknown(V, 0) && !m.is_unverifiable(V, 0));
        assert!(
            m.is_unverifiable(V, 1),
            "a later write patched content the model lost"
        );
        assert!(m.check(V, 0, &block(1)).is_ok() && m.check(V, 0, &[7u8; BS]).is_ok());
        assert!(m.check(V, 0, &block(5)).is_err());
        let cut = m.cut();
        assert!(
            cut.points.iter().all(|&(_, _, _, op)| op != 2),
            "a failed request never becomes a floor"
        );
        m.forget_requests();
        assert!(!m.has_unknown());
    }

    #[derive(Debug, Clone)]
    enum Step {
        Write { lba: u8, x: u8 },
        Complete,
        Flush,
        Crash { pick: Vec<u8> },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            4 => (0u8..4, 1u8..255).prop_map(|(lba, x)| Step::Write { lba, x }),
            3 => Just(Step::Complete),
            1 => Just(Step::Flush),
            1 => proptest::collection::vec(any::<u8>(), 4).prop_map(|pick| Step::Crash { pick }),
        ]
    }

    /// A reference store with the contract's semantics, kept the slow way: every
    /// write is remembered with its completion and the flushes that covered it.
    #[derive(Default)]
    struct Reference {
        /// (lba, content, completed, durable)
        log: Vec<(u8, u8, bool, bool)>,
        base: [u8; 4],
    }

    impl Reference {
        /// Contents a crash may leave for `lba`: the newest durable one (or the
        /// base), and anything written after it.
        fn allowed(&self, lba: u8) -> Vec<u8> {
            let mine: Vec<_> = self.log.iter().filter(|e| e.0 == lba).collect();
            let last_durable = mine.iter().rposition(|e| e.3);
            let mut out = vec![];
            match last_durable {
                Some(i) => out.extend(mine[i..].iter().map(|e| e.1)),
                None => {
                    out.push(self.base[lba as usize]);
                    out.extend(mine.iter().map(|e| e.1));
                }
            }
            out
        }
    }

    proptest! {
        /// The model allows exactly what a slow reference of the contract allows.
        #[test]
        fn model_matches_a_reference(steps in proptest::collection::vec(step(), 1..60)) {
            let mut m = Model::new();
            m.create(V, "a", 4);
            let mut r = Reference::default();
            let mut next = 1u64;
            let mut incomplete: Vec<(u64, usize)> = vec![];
            for s in steps {
                match s {
                    Step::Write { lba, x } => {
                        m.write(next, V, u64::from(lba) * BS as u64, &block(x));
                        r.log.push((lba, x, false, false));
                        incomplete.push((next, r.log.len() - 1));
                        next += 1;
                    }
                    Step::Complete => {
                        if !incomplete.is_empty() {
                            let (op, i) = incomplete.remove(0);
                            m.completed(op);
                            r.log[i].2 = true;
                        }
                    }
                    Step::Flush => {
                        let cut = m.cut();
                        m.flushed(&cut);
                        for e in r.log.iter_mut().filter(|e| e.2) {
                            e.3 = true;
                        }
                    }
                    Step::Crash { pick } => {
                        for lba in 0..4u8 {
                            let allowed = r.allowed(lba);
                            for x in 0..=255u8 {
                                let ok = m.check(V, u64::from(lba), &block(x)).is_ok();
                                prop_assert_eq!(ok, allowed.contains(&x), "lba {} x {}", lba, x);
                            }
                            let x = allowed[pick[lba as usize] as usize % allowed.len()];
                            m.observe(V, u64::from(lba), &block(x));
                            r.base[lba as usize] = x;
                        }
                        m.forget_requests();
                        r.log.clear();
                        incomplete.clear();
                    }
                }
            }
        }
    }
}
