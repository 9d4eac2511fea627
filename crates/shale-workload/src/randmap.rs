//! fio's random map (lib/axmap.c): which blocks of a range this pass has touched.
//!
//! A bitmap of bitmaps: bit `j` of level `i + 1` is set when word `j` of level `i` is full,
//! so finding the next free block skips full regions 64× per level. Bits past the end of
//! the range are pre-set, which keeps "word full" a plain comparison.
//!
//! fio's `uniform` pass draws a block uniformly and, when it was already written this
//! pass, takes the *next free block after it* (wrapping at the end of the range). That
//! fallback is not a uniform choice among free blocks: a free block right after a long
//! written run is picked far more often, so gaps fill from their low end and neighbouring
//! blocks are written in ascending order (63% of neighbour pairs over a pass, 95% among
//! the last tenth, against 50% for a random permutation). Shale reproduces that rule
//! rather than a random permutation because it changes what the drive sees.

/// The set of blocks `0..len` written in the current pass.
#[derive(Debug, Clone)]
pub struct RandomMap {
    len: u64,
    set_count: u64,
    /// `levels[0]` has one bit per block; each next level one bit per word below it.
    levels: Vec<Vec<u64>>,
}

const WORD_BITS: u64 = 64;

impl RandomMap {
    /// An empty map of `len` blocks. `len` may be zero (then every block is "used").
    pub fn new(len: u64) -> RandomMap {
        let mut levels = Vec::new();
        let mut bits = len.max(1);
        loop {
            let words = bits.div_ceil(WORD_BITS);
            levels.push(vec![0u64; words as usize]);
            if words == 1 {
                break;
            }
            bits = words;
        }
        let mut map = RandomMap {
            len,
            set_count: 0,
            levels,
        };
        map.reset();
        map
    }

    /// Number of blocks in the range.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Blocks marked in this pass.
    pub fn set_count(&self) -> u64 {
        self.set_count
    }

    /// True once every block of the range has been marked.
    pub fn is_full(&self) -> bool {
        self.set_count == self.len
    }

    /// Starts a new pass: every block free again.
    pub fn reset(&mut self) {
        self.set_count = 0;
        for l in &mut self.levels {
            l.iter_mut().for_each(|w| *w = 0);
        }
        // Pre-set the padding bits of each level (and propagate full words upward).
        let mut bits = self.len;
        for level in 0..self.levels.len() {
            let words = self.levels[level].len() as u64;
            for bit in bits..words * WORD_BITS {
                self.set_bit_at(level, bit);
            }
            bits = words;
        }
    }

    /// Sets bit `bit` at `level`, propagating a word that became full to the level above.
    fn set_bit_at(&mut self, mut level: usize, mut bit: u64) {
        loop {
            let word = (bit / WORD_BITS) as usize;
            let Some(w) = self.levels.get_mut(level).and_then(|l| l.get_mut(word)) else {
                return;
            };
            *w |= 1 << (bit % WORD_BITS);
            if *w != u64::MAX {
                return;
            }
            level += 1;
            bit = word as u64;
        }
    }

    /// Whether block `b` was marked this pass (out-of-range blocks count as marked).
    pub fn is_set(&self, b: u64) -> bool {
        if b >= self.len {
            return true;
        }
        let word = (b / WORD_BITS) as usize;
        self.levels[0][word] & (1 << (b % WORD_BITS)) != 0
    }

    /// Marks block `b`; returns false if it was already marked or is out of range.
    pub fn set(&mut self, b: u64) -> bool {
        if self.is_set(b) {
            return false;
        }
        self.set_bit_at(0, b);
        self.set_count += 1;
        true
    }

    /// First clear bit at `level` at or after `from`, using the level above to skip full
    /// words. Padding bits are set, so any clear bit found is a real one.
    fn first_clear_from(&self, level: usize, from: u64) -> Option<u64> {
        let words = &self.levels[level];
        let mut word = from / WORD_BITS;
        if word >= words.len() as u64 {
            return None;
        }
        let masked = !words[word as usize] & (u64::MAX << (from % WORD_BITS));
        if masked != 0 {
            return Some(word * WORD_BITS + u64::from(masked.trailing_zeros()));
        }
        word += 1;
        let next_word = if level + 1 < self.levels.len() {
            self.first_clear_from(level + 1, word)?
        } else {
            // Top level: a single word, already examined.
            (word..words.len() as u64).find(|&w| words[w as usize] != u64::MAX)?
        };
        let free = !words[next_word as usize];
        debug_assert!(free != 0, "upper level says word {next_word} has room");
        Some(next_word * WORD_BITS + u64::from(free.trailing_zeros()))
    }

    /// fio's `axmap_next_free`: the first free block after `b`, wrapping around to the
    /// start of the range; `None` when the map is full.
    pub fn next_free(&self, b: u64) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let mut next = b.saturating_add(1);
        if next >= self.len {
            next = 0;
        }
        self.first_clear_from(0, next)
            .filter(|&f| f < self.len)
            .or_else(|| {
                if next != 0 {
                    self.first_clear_from(0, 0).filter(|&f| f < self.len)
                } else {
                    None
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious implementation the map must agree with.
    fn naive_next_free(set: &[bool], b: u64) -> Option<u64> {
        let n = set.len() as u64;
        if n == 0 {
            return None;
        }
        let start = if b + 1 >= n { 0 } else { b + 1 };
        (start..n).chain(0..start).find(|&i| !set[i as usize])
    }

    proptest! {
        #[test]
        fn agrees_with_a_plain_bitmap(
            len in 0u64..10_000,
            ops in proptest::collection::vec(any::<u64>(), 0..3000),
        ) {
            let mut map = RandomMap::new(len);
            let mut naive = vec![false; len as usize];
            for (i, raw) in ops.iter().enumerate() {
                let b = if len == 0 { *raw % 16 } else { raw % (len + 2) };
                if i % 3 == 2 {
                    prop_assert_eq!(map.next_free(b), naive_next_free(&naive, b), "b={}", b);
                } else {
                    let was = b < len && naive[b as usize];
                    let changed = map.set(b);
                    prop_assert_eq!(changed, b < len && !was);
                    if b < len {
                        naive[b as usize] = true;
                    }
                }
                prop_assert_eq!(map.set_count(), naive.iter().filter(|&&x| x).count() as u64);
            }
        }
    }

    #[test]
    fn fills_completely_through_next_free() {
        // Multi-level map (more than 64*64 blocks) filled only via next_free.
        let len = 64 * 64 * 3 + 17;
        let mut map = RandomMap::new(len);
        let mut b = 5;
        while let Some(f) = map.next_free(b) {
            assert!(map.set(f));
            b = (f * 7919) % len;
        }
        assert!(map.is_full());
        assert_eq!(map.set_count(), len);
        map.reset();
        assert_eq!(map.set_count(), 0);
        assert_eq!(map.next_free(len - 1), Some(0));
    }

    #[test]
    fn empty_range_has_nothing_free() {
        let map = RandomMap::new(0);
        assert!(map.is_full());
        assert_eq!(map.next_free(0), None);
    }
}
