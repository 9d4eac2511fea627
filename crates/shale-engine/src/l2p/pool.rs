//! Which pool pages of the L2P area are taken: a bitmap, one bit a pool page.
//!
//! A list of free pages costs 4 bytes a page and a pass over the whole pool at every
//! open (17 MiB and ~50 ms of page faults at 16 TiB, even for an empty pool); the
//! bitmap costs one bit a page and is allocated zeroed, so the kernel backs only the
//! words a page was ever taken in. Pages are taken next-fit from a roving cursor.
//!
//! Invariant: `free` is the number of clear bits below `pages`; bits at and past
//! `pages` in the last word stay clear and are never handed out.

#[derive(Debug)]
pub(super) struct PagePool {
    used: Vec<u64>,
    pages: u32,
    free: u32,
    /// Where the next search starts (a word index).
    cursor: usize,
}

impl PagePool {
    pub fn new(pages: u32) -> PagePool {
        PagePool {
            // `vec![0; n]` allocates zeroed memory: untouched words cost nothing.
            used: vec![0; (pages as usize).div_ceil(64)],
            pages,
            free: pages,
            cursor: 0,
        }
    }

    #[cfg(test)]
    pub fn free(&self) -> u32 {
        self.free
    }

    fn is_used(&self, p: u32) -> bool {
        self.used[p as usize / 64] & (1 << (p % 64)) != 0
    }

    /// Takes a free page, `None` when every page is taken.
    pub fn take(&mut self) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let words = self.used.len();
        for i in 0..words {
            let w = (self.cursor + i) % words;
            let bits = self.used[w];
            if bits == u64::MAX {
                continue;
            }
            let p = (w * 64) as u32 + (!bits).trailing_zeros();
            if p >= self.pages {
                // The tail of the last word: past the pool.
                continue;
            }
            self.used[w] |= 1 << (p % 64);
            self.free -= 1;
            self.cursor = w;
            return Some(p);
        }
        unreachable!("{} pool pages counted free but none found", self.free)
    }

    /// Marks `p` taken (a directory references it). False if it already was or is
    /// past the pool: a corrupt checkpoint, which the caller reports.
    pub fn mark_used(&mut self, p: u32) -> bool {
        if p >= self.pages || self.is_used(p) {
            return false;
        }
        self.used[p as usize / 64] |= 1 << (p % 64);
        self.free -= 1;
        true
    }

    /// Returns `p` to the pool.
    pub fn give(&mut self, p: u32) {
        debug_assert!(self.is_used(p), "pool page {p} given back twice");
        if p < self.pages && self.is_used(p) {
            self.used[p as usize / 64] &= !(1 << (p % 64));
            self.free += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn takes_every_page_once_then_none() {
        for pages in [0u32, 1, 63, 64, 65, 200] {
            let mut pool = PagePool::new(pages);
            let mut got = BTreeSet::new();
            while let Some(p) = pool.take() {
                assert!(p < pages && got.insert(p), "page {p} of {pages}");
            }
            assert_eq!(got.len(), pages as usize);
            assert_eq!(pool.free(), 0);
        }
    }

    #[test]
    fn a_page_marked_twice_or_past_the_pool_is_refused() {
        let mut pool = PagePool::new(70);
        assert!(pool.mark_used(69));
        assert!(!pool.mark_used(69));
        assert!(!pool.mark_used(70));
        assert_eq!(pool.free(), 69);
    }

    proptest! {
        /// Against a set of taken pages: takes hand out only free pages, gives and
        /// marks keep the count.
        #[test]
        fn matches_a_set(pages in 0u32..300, ops in proptest::collection::vec((0u8..3, any::<u32>()), 0..400)) {
            let mut pool = PagePool::new(pages);
            let mut taken = BTreeSet::new();
            for (op, x) in ops {
                match op {
                    0 => match pool.take() {
                        Some(p) => prop_assert!(p < pages && taken.insert(p)),
                        None => prop_assert_eq!(taken.len(), pages as usize),
                    },
                    1 => {
                        if let Some(&p) = taken.iter().nth(x as usize % taken.len().max(1)) {
                            pool.give(p);
                            taken.remove(&p);
                        }
                    }
                    _ => {
                        let p = x % (pages + 2);
                        prop_assert_eq!(pool.mark_used(p), p < pages && taken.insert(p));
                    }
                }
                prop_assert_eq!(pool.free() as usize, pages as usize - taken.len());
            }
        }
    }
}
