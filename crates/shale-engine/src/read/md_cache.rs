//! md blocks cached under a byte budget, keyed by the PBA of md block A, in two tiers:
//!
//! - **checks**: per group, one 4-byte check per entry (`md_check`: the entry's data
//!   CRC folded with its volume and LBA) and a bit per entry saying it names data.
//!   A read verifies against these without a second device read; at about 550 bytes
//!   a group instead of 4 KiB, the same budget covers six and a half times the data.
//! - **full**: whole md blocks, for what needs the entries themselves (a failed check's
//!   precise error, repairs, the scrub, `shale check`). An eighth of the budget.
//!
//! Both tiers are filled by every insert and emptied together when a region is
//! reused, so a check never outlives its md.

use crate::hash::U64Map;
use shale_format::{decode_md_entry, Lba, VolumeId, BLOCK_SIZE, GROUP_DATA_SLOTS};

const NONE: u32 = u32::MAX;

/// The check a data block read back as `(volume, lba)` with CRC `data_crc` must match.
/// XOR with a value that depends only on `(volume, lba)` keeps the CRC's own
/// guarantees for corrupted data (for a given block it is a bijection of the CRC); a
/// block of another `(volume, lba)` passes only if the two mix to the same 32 bits.
pub(crate) fn md_check(volume: VolumeId, lba: Lba, data_crc: u32) -> u32 {
    // splitmix64's finalizer: a bijection of the (volume, lba) word, folded to 32 bits.
    let mut z = lba.0 ^ (u64::from(volume.0) << 48) ^ 0x9e37_79b9_7f4a_7c15;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    data_crc ^ (z as u32) ^ ((z >> 32) as u32)
}

/// One group's checks.
#[derive(Debug, Clone)]
pub(crate) struct GroupChecks {
    /// Bit `i`: entry `i` decodes and names user data (`Data` or `Relocated`).
    data: u128,
    check: [u32; GROUP_DATA_SLOTS],
}

impl GroupChecks {
    fn from_md(block: &[u8]) -> GroupChecks {
        let mut g = GroupChecks {
            data: 0,
            check: [0; GROUP_DATA_SLOTS],
        };
        for i in 0..GROUP_DATA_SLOTS {
            if let Ok(e) = decode_md_entry(block, i, 0) {
                if e.kind.holds_data() {
                    g.data |= 1 << i;
                    g.check[i] = md_check(e.volume, e.lba, e.data_crc);
                }
            }
        }
        g
    }

    /// Entry `idx`'s check, if it names data.
    fn get(&self, idx: usize) -> Option<u32> {
        (idx < GROUP_DATA_SLOTS && self.data >> idx & 1 == 1).then(|| self.check[idx])
    }
}

/// Bytes one cached group of checks costs, its LRU links and map slot included.
const CHECKS_BYTES: u64 = std::mem::size_of::<GroupChecks>() as u64 + 32;
/// Bytes one cached full block costs.
const FULL_BYTES: u64 = BLOCK_SIZE as u64 + 32;

#[derive(Debug)]
struct Slot<V> {
    key: u64,
    prev: u32,
    next: u32,
    value: V,
}

/// A least-recently-used map of at most `max` values.
#[derive(Debug)]
struct Lru<V> {
    map: U64Map<u32>,
    slots: Vec<Slot<V>>,
    head: u32,
    tail: u32,
    max: usize,
}

impl<V> Lru<V> {
    fn new(max: usize) -> Lru<V> {
        Lru {
            map: U64Map::default(),
            slots: Vec::new(),
            head: NONE,
            tail: NONE,
            max: max.max(1),
        }
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.slots[i as usize].prev, self.slots[i as usize].next);
        if p != NONE {
            self.slots[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NONE {
            self.slots[n as usize].prev = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.slots[i as usize].prev = NONE;
        self.slots[i as usize].next = self.head;
        if self.head != NONE {
            self.slots[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NONE {
            self.tail = i;
        }
    }

    fn push_back(&mut self, i: u32) {
        self.slots[i as usize].prev = self.tail;
        self.slots[i as usize].next = NONE;
        if self.tail != NONE {
            self.slots[self.tail as usize].next = i;
        } else {
            self.head = i;
        }
        self.tail = i;
    }

    fn get(&mut self, key: u64) -> Option<&V> {
        let i = self.map.get(&key).copied()?;
        self.unlink(i);
        self.push_front(i);
        Some(&self.slots[i as usize].value)
    }

    fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    fn len(&self) -> usize {
        self.slots.len()
    }

    /// Inserts or replaces `key`'s value: `make` builds a new one, `fill` overwrites a
    /// slot being reused (so evicted allocations are recycled).
    fn insert(&mut self, key: u64, make: impl FnOnce() -> V, fill: impl FnOnce(&mut V)) {
        let i = if let Some(&i) = self.map.get(&key) {
            self.unlink(i);
            fill(&mut self.slots[i as usize].value);
            i
        } else if self.slots.len() < self.max {
            self.slots.push(Slot {
                key,
                prev: NONE,
                next: NONE,
                value: make(),
            });
            (self.slots.len() - 1) as u32
        } else {
            let i = self.tail;
            self.unlink(i);
            let old = self.slots[i as usize].key;
            if old != u64::MAX {
                self.map.remove(&old);
            }
            self.slots[i as usize].key = key;
            fill(&mut self.slots[i as usize].value);
            i
        };
        self.map.insert(key, i);
        self.push_front(i);
    }

    /// Forgets every key in `range`, parking their slots at the tail for reuse.
    fn invalidate(&mut self, range: std::ops::Range<u64>) {
        let keys: Vec<u64> = self
            .map
            .keys()
            .copied()
            .filter(|k| range.contains(k))
            .collect();
        for k in keys {
            if let Some(i) = self.map.remove(&k) {
                self.unlink(i);
                self.slots[i as usize].key = u64::MAX;
                self.push_back(i);
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct MdCache {
    checks: Lru<GroupChecks>,
    full: Lru<Box<[u8; BLOCK_SIZE]>>,
    pub hits: u64,
    pub misses: u64,
}

impl MdCache {
    /// A cache of about `bytes_max` bytes: an eighth for whole blocks (at least one),
    /// the rest for checks (at least one group).
    pub fn new(bytes_max: u64) -> MdCache {
        let full_bytes = bytes_max / 8;
        MdCache {
            full: Lru::new((full_bytes / FULL_BYTES) as usize),
            checks: Lru::new(((bytes_max - full_bytes) / CHECKS_BYTES) as usize),
            hits: 0,
            misses: 0,
        }
    }

    /// The check of entry `idx` of the group whose md A is at `key`: `Some(None)` when
    /// the group is cached and that entry names no data; `None` when not cached.
    pub fn check(&mut self, key: u64, idx: usize) -> Option<Option<u32>> {
        match self.checks.get(key) {
            Some(g) => {
                self.hits += 1;
                Some(g.get(idx))
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    /// The whole md block, if cached.
    pub fn get(&mut self, key: u64) -> Option<&[u8; BLOCK_SIZE]> {
        self.full.get(key).map(|b| &**b)
    }

    pub fn cached_bytes(&self) -> u64 {
        self.full.len() as u64 * FULL_BYTES + self.checks.len() as u64 * CHECKS_BYTES
    }

    /// Whether `key`'s checks are cached (no LRU update, no counting).
    pub fn contains(&self, key: u64) -> bool {
        self.checks.contains(key)
    }

    pub fn insert(&mut self, key: u64, block: &[u8]) {
        let g = GroupChecks::from_md(block);
        self.checks.insert(key, || g.clone(), |v| *v = g.clone());
        let copy = |b: &mut Box<[u8; BLOCK_SIZE]>| b.copy_from_slice(&block[..BLOCK_SIZE]);
        self.full.insert(
            key,
            || {
                let mut b = Box::new([0u8; BLOCK_SIZE]);
                copy(&mut b);
                b
            },
            copy,
        );
    }

    /// Forgets every md block of a region being reused.
    pub fn invalidate_range(&mut self, start: u64, len: u32) {
        let range = start..start + u64::from(len);
        self.checks.invalidate(range.clone());
        self.full.invalidate(range);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use shale_format::{
        seal_md, write_md_entry, EntryKind, MdEntry, MdHeader, MdRegionKind, RegionId, Sid,
    };

    fn md_block(entries: &[(usize, MdEntry)]) -> [u8; BLOCK_SIZE] {
        let mut b = [0u8; BLOCK_SIZE];
        for i in 0..GROUP_DATA_SLOTS {
            write_md_entry(&mut b, i, &MdEntry::EMPTY);
        }
        for (i, e) in entries {
            write_md_entry(&mut b, *i, e);
        }
        seal_md(
            &mut b,
            &MdHeader {
                region_kind: MdRegionKind::Zone,
                region: RegionId(3),
                group: 0,
                entry_count: GROUP_DATA_SLOTS as u16,
                region_sid: Sid(1),
                generation: 1,
            },
        );
        b
    }

    fn data(kind: EntryKind, volume: u32, lba: u64, crc: u32) -> MdEntry {
        MdEntry {
            kind,
            volume: VolumeId(volume),
            lba: Lba(lba),
            sid: Sid(1),
            data_crc: crc,
            ..MdEntry::EMPTY
        }
    }

    #[test]
    fn checks_accept_exactly_what_the_entry_names() {
        let b = md_block(&[
            (0, data(EntryKind::Data, 1, 10, 0xabcd)),
            (5, data(EntryKind::Relocated, 2, 1 << 39, 7)),
        ]);
        let mut c = MdCache::new(1 << 20);
        c.insert(100, &b);
        let ok = md_check(VolumeId(1), Lba(10), 0xabcd);
        assert_eq!(c.check(100, 0), Some(Some(ok)));
        assert_eq!(
            c.check(100, 5),
            Some(Some(md_check(VolumeId(2), Lba(1 << 39), 7)))
        );
        // An empty entry names nothing; an uncached group is a miss.
        assert_eq!(c.check(100, 1), Some(None));
        assert_eq!(c.check(101, 0), None);
        // Another block, LBA or volume does not match.
        assert_ne!(ok, md_check(VolumeId(1), Lba(10), 0xabce));
        assert_ne!(ok, md_check(VolumeId(1), Lba(11), 0xabcd));
        assert_ne!(ok, md_check(VolumeId(2), Lba(10), 0xabcd));
        assert_eq!(c.get(100).map(|x| x[..] == b[..]), Some(true));
    }

    #[test]
    fn reuse_of_a_region_forgets_both_tiers() {
        let b = md_block(&[(0, data(EntryKind::Data, 1, 10, 1))]);
        let mut c = MdCache::new(1 << 20);
        c.insert(100, &b);
        c.insert(300, &b);
        c.invalidate_range(64, 128);
        assert!(!c.contains(100) && c.get(100).is_none());
        assert!(c.contains(300) && c.get(300).is_some());
    }

    #[test]
    fn the_budget_holds_six_times_the_groups_of_whole_blocks() {
        let mut c = MdCache::new(4 << 20);
        let b = md_block(&[(0, data(EntryKind::Data, 1, 10, 1))]);
        for k in 0..20_000 {
            c.insert(k * 128, &b);
        }
        assert!(c.cached_bytes() <= 4 << 20, "{}", c.cached_bytes());
        let groups = (0..20_000).filter(|k| c.contains(k * 128)).count();
        // Whole blocks alone: 1,024 groups.
        assert!(groups >= 6 * 1024, "{groups}");
        // The newest are the ones kept.
        assert!(c.contains(19_999 * 128) && !c.contains(0));
    }

    proptest! {
        /// The two tiers behave as LRU maps of their sizes: after any sequence of
        /// inserts, gets and invalidations, a key is cached iff a model says so.
        #[test]
        fn lru_matches_a_model(ops in proptest::collection::vec((0u8..3, 0u64..12), 0..200)) {
            let mut lru: Lru<u64> = Lru::new(4);
            let mut model: Vec<u64> = Vec::new(); // most recent first
            for (op, k) in ops {
                match op {
                    0 => {
                        lru.insert(k, || k, |v| *v = k);
                        model.retain(|&x| x != k);
                        model.insert(0, k);
                        model.truncate(4);
                    }
                    1 => {
                        let got = lru.get(k).copied();
                        let want = model.contains(&k).then_some(k);
                        prop_assert_eq!(got, want);
                        if want.is_some() {
                            model.retain(|&x| x != k);
                            model.insert(0, k);
                        }
                    }
                    _ => {
                        lru.invalidate(k..k + 3);
                        model.retain(|&x| !(k..k + 3).contains(&x));
                    }
                }
                for x in 0..12 {
                    prop_assert_eq!(lru.contains(x), model.contains(&x));
                }
            }
        }
    }
}
