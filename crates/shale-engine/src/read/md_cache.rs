//! An LRU of md blocks under a byte budget, keyed by the PBA of md block A. Reads use
//! it to verify data blocks without a second device read most of the time.

use std::collections::HashMap;

const NONE: u32 = u32::MAX;

#[derive(Debug)]
struct Entry {
    key: u64,
    prev: u32,
    next: u32,
    block: Box<[u8; 4096]>,
}

#[derive(Debug)]
pub(crate) struct MdCache {
    map: HashMap<u64, u32>,
    entries: Vec<Entry>,
    head: u32,
    tail: u32,
    max: usize,
    pub hits: u64,
    pub misses: u64,
}

impl MdCache {
    pub fn new(bytes_max: u64) -> MdCache {
        MdCache {
            map: HashMap::new(),
            entries: Vec::new(),
            head: NONE,
            tail: NONE,
            max: (bytes_max / 4096).max(1) as usize,
            hits: 0,
            misses: 0,
        }
    }

    fn unlink(&mut self, i: u32) {
        let (p, n) = (self.entries[i as usize].prev, self.entries[i as usize].next);
        if p != NONE {
            self.entries[p as usize].next = n;
        } else {
            self.head = n;
        }
        if n != NONE {
            self.entries[n as usize].prev = p;
        } else {
            self.tail = p;
        }
    }

    fn push_front(&mut self, i: u32) {
        self.entries[i as usize].prev = NONE;
        self.entries[i as usize].next = self.head;
        if self.head != NONE {
            self.entries[self.head as usize].prev = i;
        }
        self.head = i;
        if self.tail == NONE {
            self.tail = i;
        }
    }

    pub fn get(&mut self, key: u64) -> Option<&[u8; 4096]> {
        match self.map.get(&key).copied() {
            Some(i) => {
                self.hits += 1;
                self.unlink(i);
                self.push_front(i);
                Some(&self.entries[i as usize].block)
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub fn cached_bytes(&self) -> u64 {
        self.entries.len() as u64 * 4096
    }

    /// Whether `key` is cached (no LRU update, no counting).
    pub fn contains(&self, key: u64) -> bool {
        self.map.contains_key(&key)
    }

    pub fn insert(&mut self, key: u64, block: &[u8]) {
        if let Some(&i) = self.map.get(&key) {
            self.entries[i as usize].block.copy_from_slice(block);
            self.unlink(i);
            self.push_front(i);
            return;
        }
        let i = if self.entries.len() < self.max {
            let mut b = Box::new([0u8; 4096]);
            b.copy_from_slice(block);
            self.entries.push(Entry {
                key,
                prev: NONE,
                next: NONE,
                block: b,
            });
            (self.entries.len() - 1) as u32
        } else {
            let i = self.tail;
            self.unlink(i);
            self.map.remove(&self.entries[i as usize].key);
            self.entries[i as usize].key = key;
            self.entries[i as usize].block.copy_from_slice(block);
            i
        };
        self.map.insert(key, i);
        self.push_front(i);
    }

    /// Forgets every md block of a region being reused.
    pub fn invalidate_range(&mut self, start: u64, len: u32) {
        let keys: Vec<u64> = self
            .map
            .keys()
            .copied()
            .filter(|k| (start..start + u64::from(len)).contains(k))
            .collect();
        for k in keys {
            if let Some(i) = self.map.remove(&k) {
                self.unlink(i);
                self.entries[i as usize].key = u64::MAX;
                // Park the entry at the tail so it is reused first.
                self.entries[i as usize].prev = self.tail;
                self.entries[i as usize].next = NONE;
                if self.tail != NONE {
                    self.entries[self.tail as usize].next = i;
                } else {
                    self.head = i;
                }
                self.tail = i;
            }
        }
    }
}
