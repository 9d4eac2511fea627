//! L2P pages: one volume's LBA -> PBA entries, 4 KiB at a time, with no header (the
//! page's CRC lives in its directory descriptor).
//!
//! The pool's PBA count picks the entry width at format time. Pools whose PBAs fit
//! in 32 bits (16 TiB) keep 4-byte entries, 1024 to a page: the original format byte
//! for byte, and the least DRAM per cached LBA. Larger pools take 5-byte entries
//! (40-bit PBAs, pools up to 4 PiB), 816 to a page with the last 16 bytes unused.
//! Five bytes rather than eight keeps the table (and so the DRAM the L2P cache needs
//! for the same hit rate) 38% smaller than 64-bit entries would. At either width an
//! entry of all ones is [`Pba::NONE`].

use crate::{Pba, BLOCK_SIZE};

/// The entry width of a pool's L2P pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct L2pFormat {
    entry_bytes: u8,
}

impl Default for L2pFormat {
    /// Narrow, as every pool formatted before the width was recorded.
    fn default() -> L2pFormat {
        L2pFormat::NARROW
    }
}

impl L2pFormat {
    /// 4-byte entries: pools up to 2^32 - 1 PBAs.
    pub const NARROW: L2pFormat = L2pFormat { entry_bytes: 4 };
    /// 5-byte entries: pools up to 2^40 - 1 PBAs.
    pub const WIDE: L2pFormat = L2pFormat { entry_bytes: 5 };
    /// The most entries a page holds at any width (buffers sized for any pool).
    pub const MAX_ENTRIES_PER_PAGE: usize = 1024;

    /// The format with `bytes`-byte entries, if there is one.
    pub const fn from_entry_bytes(bytes: u8) -> Option<L2pFormat> {
        match bytes {
            4 => Some(L2pFormat::NARROW),
            5 => Some(L2pFormat::WIDE),
            _ => None,
        }
    }

    /// The narrowest format that addresses `pbas` PBAs, if any does.
    pub const fn for_pba_count(pbas: u64) -> Option<L2pFormat> {
        if pbas <= L2pFormat::NARROW.pba_limit() {
            Some(L2pFormat::NARROW)
        } else if pbas <= L2pFormat::WIDE.pba_limit() {
            Some(L2pFormat::WIDE)
        } else {
            None
        }
    }

    pub const fn entry_bytes(self) -> u8 {
        self.entry_bytes
    }

    /// LBAs one page maps.
    pub const fn entries_per_page(self) -> u64 {
        match self.entry_bytes {
            4 => 1024,
            // 816 * 5 = 4080: a multiple of 16, and an 8-byte load at the last
            // entry stays inside the page.
            _ => 816,
        }
    }

    /// How many PBAs the format addresses: `0..pba_limit()` (all ones is
    /// [`Pba::NONE`]).
    pub const fn pba_limit(self) -> u64 {
        (1u64 << (8 * self.entry_bytes as u32)) - 1
    }

    /// The page holding `lba` and the entry's index in it.
    #[inline]
    pub fn locate(self, lba: u64) -> (u64, usize) {
        let n = self.entries_per_page();
        (lba / n, (lba % n) as usize)
    }

    /// L2P pages a volume of `blocks` blocks needs.
    pub fn pages_for(self, blocks: u64) -> u64 {
        blocks.div_ceil(self.entries_per_page())
    }

    /// Entry `i` of `page` (a whole page; `i < entries_per_page()`).
    #[inline]
    pub fn get(self, page: &[u8], i: usize) -> Pba {
        if self.entry_bytes == 4 {
            let mut b = [0u8; 4];
            b.copy_from_slice(&page[i * 4..i * 4 + 4]);
            let v = u32::from_le_bytes(b);
            if v == u32::MAX {
                Pba::NONE
            } else {
                Pba(u64::from(v))
            }
        } else {
            let mut b = [0u8; 8];
            b[..5].copy_from_slice(&page[i * 5..i * 5 + 5]);
            let v = u64::from_le_bytes(b);
            if v == L2pFormat::WIDE.pba_limit() {
                Pba::NONE
            } else {
                Pba(v)
            }
        }
    }

    /// Sets entry `i` of `page` to `pba` ([`Pba::NONE`] or below [`Self::pba_limit`]).
    #[inline]
    pub fn set(self, page: &mut [u8], i: usize, pba: Pba) {
        let n = usize::from(self.entry_bytes);
        debug_assert!(pba.is_none() || pba.0 < self.pba_limit(), "{pba} too wide");
        let v = if pba.is_none() {
            self.pba_limit()
        } else {
            pba.0
        };
        page[i * n..i * n + n].copy_from_slice(&v.to_le_bytes()[..n]);
    }

    /// A page with every entry unmapped (the unused tail of a wide page is all ones too).
    pub fn fill_unmapped(page: &mut [u8]) {
        page.fill(0xFF);
    }

    /// Calls `f(i, pba)` for each mapped entry of `page`, in order. Runs of unmapped
    /// entries are skipped 16 at a time by their bytes (all ones), so a page with a
    /// few mappings costs a pass of word compares rather than a decode per entry: a
    /// census of a sparsely mapped pool reads mostly such pages.
    pub fn for_each_mapped(self, page: &[u8], mut f: impl FnMut(usize, Pba)) {
        const GROUP: usize = 16;
        let n = usize::from(self.entry_bytes);
        let epp = self.entries_per_page() as usize;
        for g in 0..epp.div_ceil(GROUP) {
            let first = g * GROUP;
            let last = (first + GROUP).min(epp);
            let bytes = &page[first * n..last * n];
            // A group is 64 or 80 bytes: whole words at either width.
            let unmapped = bytes.chunks_exact(8).all(|w| {
                let mut b = [0u8; 8];
                b.copy_from_slice(w);
                u64::from_le_bytes(b) == u64::MAX
            });
            if unmapped {
                continue;
            }
            for i in first..last {
                let e = self.get(page, i);
                if !e.is_none() {
                    f(i, e);
                }
            }
        }
    }

    /// Decodes the first `out.len()` entries of `page` (at most a page's worth).
    pub fn decode(self, page: &[u8], out: &mut [Pba]) {
        debug_assert!(out.len() as u64 <= self.entries_per_page());
        debug_assert!(page.len() >= BLOCK_SIZE);
        for (i, e) in out.iter_mut().enumerate() {
            *e = self.get(page, i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn narrow_pages_are_the_original_format() {
        let mut page = vec![0u8; BLOCK_SIZE];
        L2pFormat::fill_unmapped(&mut page);
        let f = L2pFormat::NARROW;
        f.set(&mut page, 3, Pba(0x0102_0304));
        assert_eq!(&page[12..16], &0x0102_0304u32.to_le_bytes());
        assert_eq!(&page[16..20], &u32::MAX.to_le_bytes());
        assert_eq!(f.get(&page, 4), Pba::NONE);
        assert_eq!(f.entries_per_page(), 1024);
        assert_eq!(f.locate(2049), (2, 1));
    }

    #[test]
    fn the_narrowest_format_that_fits_is_chosen() {
        assert_eq!(L2pFormat::for_pba_count(1 << 20), Some(L2pFormat::NARROW));
        assert_eq!(
            L2pFormat::for_pba_count(u64::from(u32::MAX)),
            Some(L2pFormat::NARROW)
        );
        assert_eq!(
            L2pFormat::for_pba_count(u64::from(u32::MAX) + 1),
            Some(L2pFormat::WIDE)
        );
        // 1 PiB of 4 KiB blocks.
        assert_eq!(L2pFormat::for_pba_count(1 << 38), Some(L2pFormat::WIDE));
        assert_eq!(L2pFormat::for_pba_count(1 << 40), None);
        assert_eq!(L2pFormat::from_entry_bytes(8), None);
    }

    proptest! {
        #[test]
        fn entries_roundtrip_without_touching_their_neighbours(
            wide in any::<bool>(),
            i in 0usize..1024,
            v in any::<u64>(),
            none in any::<bool>(),
        ) {
            let f = if wide { L2pFormat::WIDE } else { L2pFormat::NARROW };
            let i = i % f.entries_per_page() as usize;
            let pba = if none { Pba::NONE } else { Pba(v % f.pba_limit()) };
            let mut page = vec![0u8; BLOCK_SIZE];
            L2pFormat::fill_unmapped(&mut page);
            f.set(&mut page, i, pba);
            prop_assert_eq!(f.get(&page, i), pba);
            let mut seen = Vec::new();
            f.for_each_mapped(&page, |j, e| seen.push((j, e)));
            prop_assert_eq!(seen, if pba.is_none() { vec![] } else { vec![(i, pba)] });
            let mut all = vec![Pba(0); f.entries_per_page() as usize];
            f.decode(&page, &mut all);
            for (j, &e) in all.iter().enumerate() {
                prop_assert_eq!(e, if j == i { pba } else { Pba::NONE });
            }
        }
    }
}
