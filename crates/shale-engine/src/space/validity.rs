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

    pub fn count_range(&self, start: Pba, len: u32) -> u32 {
        (start.0..start.0 + len)
            .filter(|&p| self.get(Pba(p)))
            .count() as u32
    }

    pub fn clear_all(&mut self) {
        self.bits.fill(0);
    }
}
