//! A sparse byte image: storage is allocated in fixed pages on first write, and
//! anything never written (or discarded) reads as zeros. A simulated 4 TiB drive
//! therefore costs only what is written to it.
//!
//! Pages are slots in large anonymous mappings advised for transparent huge pages
//! (`PagePool`), handed out in allocation order, not address order, so the image
//! stays sparse. Random 4 KiB copies over a simulated cache of a few hundred MiB
//! otherwise miss the TLB on nearly every access: with 64 KiB heap pages the
//! engine's iops benchmark spent ~8% more of its thread per write (docs/devices.md).
//!
//! Invariants: every stored page is exactly `PAGE_BYTES` long; a page absent from
//! the map is all zeros; a free slot of the pool is all zeros.

use std::collections::HashMap;

use memmap2::{Advice, MmapMut};

/// Allocation granule of a sparse image.
pub const SPARSE_PAGE_BYTES: usize = 64 * 1024;

const PAGE: u64 = SPARSE_PAGE_BYTES as u64;

/// Bytes of one mapping of the pool: sixteen 2 MiB huge pages even when the kernel
/// does not align the mapping to one (then fifteen are whole).
const SLAB_BYTES: usize = 32 << 20;
const SLOTS_PER_SLAB: u32 = (SLAB_BYTES / SPARSE_PAGE_BYTES) as u32;

/// Page storage: slots of `SPARSE_PAGE_BYTES` in anonymous mappings, mapped as
/// needed (the kernel backs a mapping only where it is touched) and never returned
/// before the image is dropped; freed slots are zeroed and reused first.
#[derive(Default)]
struct PagePool {
    slabs: Vec<MmapMut>,
    /// Freed slots, all zeros.
    free: Vec<u32>,
    /// Slots ever handed out from `slabs`; the ones above are untouched zeros.
    next: u32,
}

impl PagePool {
    fn alloc(&mut self) -> u32 {
        if let Some(slot) = self.free.pop() {
            return slot;
        }
        if self.next == self.slabs.len() as u32 * SLOTS_PER_SLAB {
            self.slabs.push(map_slab());
        }
        self.next += 1;
        self.next - 1
    }

    fn release(&mut self, slot: u32) {
        self.page_mut(slot).fill(0);
        self.free.push(slot);
    }

    /// (slab, byte range in it) of `slot`.
    fn locate(slot: u32) -> (usize, std::ops::Range<usize>) {
        let at = (slot % SLOTS_PER_SLAB) as usize * SPARSE_PAGE_BYTES;
        ((slot / SLOTS_PER_SLAB) as usize, at..at + SPARSE_PAGE_BYTES)
    }

    fn page(&self, slot: u32) -> &[u8] {
        let (slab, range) = Self::locate(slot);
        &self.slabs[slab][range]
    }

    fn page_mut(&mut self, slot: u32) -> &mut [u8] {
        let (slab, range) = Self::locate(slot);
        &mut self.slabs[slab][range]
    }
}

/// One zero-filled slab. Running out of address space is an allocation failure,
/// handled as the standard library handles one for a `Vec`.
fn map_slab() -> MmapMut {
    match MmapMut::map_anon(SLAB_BYTES) {
        Ok(m) => {
            // Advice only: a kernel without transparent huge pages keeps 4 KiB ones.
            let _ = m.advise(Advice::HugePage);
            m
        }
        Err(_) => std::alloc::handle_alloc_error(std::alloc::Layout::new::<[u8; SLAB_BYTES]>()),
    }
}

/// A lazily allocated, zero-filled byte image of a fixed size. Callers check
/// bounds; out-of-range access is a bug and panics.
#[derive(Default)]
pub struct SparseImage {
    size_bytes: u64,
    /// Image page index → pool slot.
    pages: HashMap<u64, u32>,
    pool: PagePool,
}

impl Clone for SparseImage {
    fn clone(&self) -> SparseImage {
        let mut c = SparseImage::new(self.size_bytes);
        for (&page, &slot) in &self.pages {
            let s = c.pool.alloc();
            c.pool.page_mut(s).copy_from_slice(self.pool.page(slot));
            c.pages.insert(page, s);
        }
        c
    }
}

impl std::fmt::Debug for SparseImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseImage")
            .field("size_bytes", &self.size_bytes)
            .field("pages", &self.pages.len())
            .finish()
    }
}

impl SparseImage {
    pub fn new(size_bytes: u64) -> SparseImage {
        SparseImage {
            size_bytes,
            pages: HashMap::new(),
            pool: PagePool::default(),
        }
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Bytes of memory held by page storage.
    pub fn allocated_bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    fn assert_in_bounds(&self, offset: u64, len: usize) {
        let end = offset.checked_add(len as u64);
        assert!(
            end.is_some_and(|e| e <= self.size_bytes),
            "sparse image access {offset}+{len} beyond {}",
            self.size_bytes
        );
    }

    /// Splits `offset..offset+len` into (page index, offset in page, length) pieces.
    fn pieces(offset: u64, len: usize) -> impl Iterator<Item = (u64, usize, usize)> {
        let mut pos = offset;
        let end = offset + len as u64;
        std::iter::from_fn(move || {
            if pos >= end {
                return None;
            }
            let page = pos / PAGE;
            let in_page = (pos % PAGE) as usize;
            let n = ((PAGE - pos % PAGE).min(end - pos)) as usize;
            pos += n as u64;
            Some((page, in_page, n))
        })
    }

    pub fn read(&self, offset: u64, buf: &mut [u8]) {
        self.assert_in_bounds(offset, buf.len());
        let mut done = 0;
        for (page, in_page, n) in Self::pieces(offset, buf.len()) {
            let dst = &mut buf[done..done + n];
            match self.pages.get(&page) {
                Some(&slot) => dst.copy_from_slice(&self.pool.page(slot)[in_page..in_page + n]),
                None => dst.fill(0),
            }
            done += n;
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.assert_in_bounds(offset, data.len());
        let mut done = 0;
        for (page, in_page, n) in Self::pieces(offset, data.len()) {
            let src = &data[done..done + n];
            done += n;
            if let Some(&slot) = self.pages.get(&page) {
                self.pool.page_mut(slot)[in_page..in_page + n].copy_from_slice(src);
            } else if !is_zero(src) {
                // Zeros over an absent page change nothing, so they allocate nothing.
                let slot = self.pool.alloc();
                self.pool.page_mut(slot)[in_page..in_page + n].copy_from_slice(src);
                self.pages.insert(page, slot);
            }
        }
    }

    /// Makes `offset..offset+len` read as zeros, freeing whole pages.
    pub fn zero(&mut self, offset: u64, len: u64) {
        let end = offset.checked_add(len);
        assert!(
            end.is_some_and(|e| e <= self.size_bytes),
            "sparse image zero {offset}+{len} beyond {}",
            self.size_bytes
        );
        let end = offset + len;
        // Whole pages inside the range are dropped; partial ends are zero-filled.
        let first_full = offset.div_ceil(PAGE);
        let last_full = end / PAGE; // exclusive
        if first_full < last_full {
            let span = last_full - first_full;
            if span as usize <= self.pages.len() {
                for page in first_full..last_full {
                    if let Some(slot) = self.pages.remove(&page) {
                        self.pool.release(slot);
                    }
                }
            } else {
                let pool = &mut self.pool;
                self.pages.retain(|&p, &mut slot| {
                    let keep = p < first_full || p >= last_full;
                    if !keep {
                        pool.release(slot);
                    }
                    keep
                });
            }
        }
        let head_end = (first_full * PAGE).min(end);
        self.zero_partial(offset, head_end);
        if last_full >= first_full {
            self.zero_partial((last_full * PAGE).max(offset), end);
        }
    }

    fn zero_partial(&mut self, from: u64, to: u64) {
        if from >= to {
            return;
        }
        for (page, in_page, n) in Self::pieces(from, (to - from) as usize) {
            if let Some(&slot) = self.pages.get(&page) {
                self.pool.page_mut(slot)[in_page..in_page + n].fill(0);
            }
        }
    }
}

/// Whether every byte is zero. Folds fixed chunks without early exit inside a
/// chunk so the compiler vectorizes it (`iter().any` runs a byte at a time).
fn is_zero(b: &[u8]) -> bool {
    b.chunks(256)
        .all(|c| c.iter().fold(0u8, |acc, &x| acc | x) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritten_reads_zero_and_costs_nothing() {
        let img = SparseImage::new(1 << 40);
        let mut b = vec![0xAAu8; 8192];
        img.read((1 << 40) - 8192, &mut b);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(img.allocated_bytes(), 0);
    }

    #[test]
    fn write_across_pages_and_read_back() {
        let mut img = SparseImage::new(1 << 30);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let off = PAGE - 512;
        img.write(off, &data);
        let mut back = vec![0u8; data.len()];
        img.read(off, &mut back);
        assert_eq!(back, data);
        assert_eq!(img.allocated_bytes(), 5 * PAGE);
    }

    #[test]
    fn zero_writes_do_not_allocate() {
        let mut img = SparseImage::new(1 << 30);
        img.write(0, &[0u8; 4096 * 20]);
        assert_eq!(img.allocated_bytes(), 0);
    }

    #[test]
    fn zero_range_frees_whole_pages_and_clears_partials() {
        let mut img = SparseImage::new(1 << 30);
        let data = vec![7u8; 4 * SPARSE_PAGE_BYTES];
        img.write(0, &data);
        img.zero(4096, 2 * PAGE + 4096);
        // Page 1 freed; pages 0 and 2 partially zeroed; page 3 untouched.
        assert_eq!(img.allocated_bytes(), 3 * PAGE);
        let mut back = vec![0u8; data.len()];
        img.read(0, &mut back);
        assert!(back[..4096].iter().all(|&x| x == 7));
        assert!(back[4096..(2 * PAGE + 8192) as usize]
            .iter()
            .all(|&x| x == 0));
        assert!(back[(2 * PAGE + 8192) as usize..].iter().all(|&x| x == 7));
        // A range inside a single page.
        img.zero(3 * PAGE + 512, 512);
        img.read(3 * PAGE, &mut back[..2048]);
        assert!(back[..512].iter().all(|&x| x == 7));
        assert!(back[512..1024].iter().all(|&x| x == 0));
        assert!(back[1024..2048].iter().all(|&x| x == 7));
    }

    #[test]
    fn zero_huge_range_uses_retain() {
        let mut img = SparseImage::new(1 << 40);
        img.write(1 << 39, &[1u8; 4096]);
        img.write(0, &[1u8; 4096]);
        img.zero(4096, (1 << 40) - 4096);
        assert_eq!(img.allocated_bytes(), PAGE);
        let mut b = [0u8; 4096];
        img.read(1 << 39, &mut b);
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn a_freed_slot_comes_back_zeroed() {
        let mut img = SparseImage::new(1 << 30);
        img.write(0, &vec![9u8; SPARSE_PAGE_BYTES]);
        img.zero(0, PAGE);
        assert_eq!(img.allocated_bytes(), 0);
        // The slot just freed is reused for another page, written only in part.
        img.write(5 * PAGE + 100, &[3u8; 10]);
        assert_eq!(img.pool.next, 1, "the freed slot is reused");
        let mut back = vec![0xFFu8; SPARSE_PAGE_BYTES];
        img.read(5 * PAGE, &mut back);
        assert!(back[..100].iter().all(|&x| x == 0));
        assert!(back[100..110].iter().all(|&x| x == 3));
        assert!(back[110..].iter().all(|&x| x == 0));
    }

    #[test]
    fn a_clone_is_independent_and_pages_span_slabs() {
        let mut img = SparseImage::new(1 << 40);
        let pages = u64::from(SLOTS_PER_SLAB) + 3; // into a second slab
        for p in 0..pages {
            img.write(p * (1 << 26), &[(p % 250) as u8 + 1; 512]);
        }
        assert_eq!(img.pool.slabs.len(), 2);
        let copy = img.clone();
        img.zero(0, 1 << 40);
        let mut b = [0u8; 512];
        for p in 0..pages {
            copy.read(p * (1 << 26), &mut b);
            assert!(b.iter().all(|&x| x == (p % 250) as u8 + 1), "page {p}");
            img.read(p * (1 << 26), &mut b);
            assert!(b.iter().all(|&x| x == 0));
        }
    }
}
