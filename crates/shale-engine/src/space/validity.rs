//! One bit per PBA over both devices.

use shale_format::Pba;

#[derive(Debug)]
pub(crate) struct Validity {
    bits: Vec<u64>,
}

impl Validity {
    pub fn new(pba_count: u64) -> Validity {
        Validity {
            bits: vec![0; pba_count.div_ceil(64) as usize],
        }
    }

    pub fn get(&self, pba: Pba) -> bool {
        let i = pba.0 as usize;
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Sets the bit; returns its previous value.
    pub fn set(&mut self, pba: Pba) -> bool {
        let i = pba.0 as usize;
        let w = &mut self.bits[i / 64];
        let old = *w & (1 << (i % 64)) != 0;
        *w |= 1 << (i % 64);
        old
    }

    /// Clears the bit; returns its previous value.
    pub fn clear(&mut self, pba: Pba) -> bool {
        let i = pba.0 as usize;
        let w = &mut self.bits[i / 64];
        let old = *w & (1 << (i % 64)) != 0;
        *w &= !(1 << (i % 64));
        old
    }

    /// Set bits in `[start, start + len)`, a word at a time (whole-device walks at
    /// open and in the self-check count every region).
    pub fn count_range(&self, start: Pba, len: u32) -> u32 {
        let lo = start.0;
        let hi = lo + u64::from(len);
        if lo >= hi {
            return 0;
        }
        let (wl, wh) = ((lo / 64) as usize, ((hi - 1) / 64) as usize);
        let word = |i: usize| self.bits.get(i).copied().unwrap_or(0);
        let lo_mask = u64::MAX << (lo % 64);
        let hi_mask = u64::MAX >> (63 - (hi - 1) % 64);
        if wl == wh {
            return (word(wl) & lo_mask & hi_mask).count_ones();
        }
        let mut n = (word(wl) & lo_mask).count_ones() + (word(wh) & hi_mask).count_ones();
        for i in wl + 1..wh {
            n += word(i).count_ones();
        }
        n
    }

    /// The first set bit in `[start, start + len)`.
    pub fn first_set(&self, start: Pba, len: u32) -> Option<Pba> {
        let mut p = start.0;
        let hi = p + u64::from(len);
        while p < hi {
            let w = self.bits.get((p / 64) as usize).copied().unwrap_or(0) >> (p % 64);
            if w != 0 {
                let at = p + u64::from(w.trailing_zeros());
                return (at < hi).then_some(Pba(at));
            }
            p = (p / 64 + 1) * 64;
        }
        None
    }

    pub fn clear_all(&mut self) {
        // A fresh zeroed allocation rather than a fill: the allocator maps zero pages
        // lazily, where a fill would touch the whole bitmap (2 GiB at 64 TiB, seconds
        // of page faults at open).
        self.bits = vec![0; self.bits.len()];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Word-at-a-time counting and search agree with a bit-by-bit walk.
        #[test]
        fn count_and_first_set_match_a_naive_walk(
            bits in proptest::collection::vec(0u64..1000, 0..200),
            start in 0u64..1000,
            len in 0u32..600,
        ) {
            let mut v = Validity::new(1100);
            for b in &bits {
                v.set(Pba(*b));
            }
            let naive = (start..start + u64::from(len)).filter(|&p| v.get(Pba(p))).count() as u32;
            prop_assert_eq!(v.count_range(Pba(start), len), naive);
            let first = (start..start + u64::from(len)).find(|&p| v.get(Pba(p))).map(Pba);
            prop_assert_eq!(v.first_set(Pba(start), len), first);
        }
    }
}
