//! Deferred relocation switches: L2P updates for pages that are not cached, held until
//! the page is next faulted in.
//!
//! A relocation (compaction, GC) switches an entry only if it still points at the
//! source, and the validity bit of the source answers that without the page. Faulting
//! the page in just to write one entry was a third of the engine's CPU per user write
//! under GC (a 4 KiB read and CRC, and usually a dirty eviction). Instead the switch
//! waits here, chained from the page's slot in `VolumeMap::frame`, and is applied by
//! the next fault of that page, which user I/O does anyway.
//!
//! Each switch is 12 bytes: a link to the previous switch of the same page (newest
//! first), then the new PBA's low 32 bits, then its next 8 (40 bits: the widest L2P
//! entry; all ones is unmapped) with the entry index above them.

use shale_format::Pba;

/// End of a chain.
pub(super) const LINK_NONE: u32 = u32::MAX;
/// The most switches that can wait at once (the link field's range).
pub(super) const DEFERRED_MAX_LIMIT: usize = LINK_NONE as usize - 1;
/// PBAs a switch holds: 40 bits, all ones meaning unmapped.
const PBA_MASK: u64 = (1 << 40) - 1;

#[derive(Debug, Clone, Copy)]
struct Switch {
    /// Previous switch of the same page (`LINK_NONE` at the end); the free list's
    /// link for a free node.
    link: u32,
    pba_low: u32,
    /// PBA bits 32..40 | entry index << 8.
    high: u32,
}

impl Switch {
    fn new(link: u32, index: u32, pba: Pba) -> Switch {
        let p = if pba.is_none() { PBA_MASK } else { pba.0 };
        debug_assert!(p <= PBA_MASK && index < 1 << 24);
        Switch {
            link,
            pba_low: p as u32,
            high: (p >> 32) as u32 | index << 8,
        }
    }

    fn pba(&self) -> Pba {
        let p = u64::from(self.high & 0xFF) << 32 | u64::from(self.pba_low);
        if p == PBA_MASK {
            Pba::NONE
        } else {
            Pba(p)
        }
    }

    fn index(&self) -> u32 {
        self.high >> 8
    }
}

/// A slab of switches with a free list; chains are kept by the caller (page heads).
#[derive(Debug, Default)]
pub(super) struct Deferred {
    nodes: Vec<Switch>,
    free: u32,
    live: usize,
    /// Above this many, the pages with the longest chains are faulted in.
    pub max: usize,
}

impl Deferred {
    pub fn new(max: usize) -> Deferred {
        Deferred {
            nodes: Vec::new(),
            free: LINK_NONE,
            live: 0,
            max: max.min(DEFERRED_MAX_LIMIT),
        }
    }

    pub fn live(&self) -> usize {
        self.live
    }

    /// Bytes of DRAM the slab holds.
    pub fn bytes(&self) -> usize {
        self.nodes.capacity() * std::mem::size_of::<Switch>()
    }

    /// Makes room for `n` more switches at once (a checkpoint's, loaded at open).
    pub fn reserve(&mut self, n: usize) {
        self.nodes.reserve_exact(n.min(DEFERRED_MAX_LIMIT));
    }

    /// Adds switch (`index` -> `pba`) in front of chain `head`; returns the new head.
    pub fn push(&mut self, head: u32, index: u32, pba: Pba) -> u32 {
        let node = Switch::new(head, index, pba);
        self.live += 1;
        if self.free != LINK_NONE {
            let n = self.free;
            self.free = self.nodes[n as usize].link;
            self.nodes[n as usize] = node;
            n
        } else {
            if self.nodes.len() == self.nodes.capacity() {
                // Grow by doubling but never past the bound (plus the one switch that
                // triggers a drain): the slab is part of the L2P's DRAM.
                let len = self.nodes.len();
                let room = (self.max + 1).saturating_sub(len).max(1);
                self.nodes.reserve_exact(len.max(64).min(room));
            }
            self.nodes.push(node);
            (self.nodes.len() - 1) as u32
        }
    }

    /// Removes chain `head`, appending its switches oldest first to `out` as
    /// (entry index, PBA): applied in that order, the newest wins.
    pub fn take(&mut self, head: u32, out: &mut Vec<(u32, Pba)>) {
        let start = out.len();
        let mut n = head;
        while n != LINK_NONE {
            let s = self.nodes[n as usize];
            out.push((s.index(), s.pba()));
            self.nodes[n as usize].link = self.free;
            self.free = n;
            self.live -= 1;
            n = s.link;
        }
        out[start..].reverse();
    }

    /// Switches in chain `head`.
    pub fn chain_len(&self, head: u32) -> usize {
        let mut n = head;
        let mut len = 0;
        while n != LINK_NONE {
            len += 1;
            n = self.nodes[n as usize].link;
        }
        len
    }

    /// Appends chain `head` to `out` oldest first, without removing it.
    pub fn collect(&self, head: u32, out: &mut Vec<(u32, Pba)>) {
        let start = out.len();
        let mut n = head;
        while n != LINK_NONE {
            let s = self.nodes[n as usize];
            out.push((s.index(), s.pba()));
            n = s.link;
        }
        out[start..].reverse();
    }

    /// Calls `f(index, pba)` for chain `head`, oldest first, without removing it.
    pub fn for_each(&self, head: u32, mut f: impl FnMut(u32, Pba)) {
        if head == LINK_NONE {
            return;
        }
        let s = self.nodes[head as usize];
        if s.link == LINK_NONE {
            // One switch (most chains): no buffer to reverse through.
            f(s.index(), s.pba());
            return;
        }
        let mut v = Vec::with_capacity(self.chain_len(head));
        let mut n = head;
        while n != LINK_NONE {
            let s = self.nodes[n as usize];
            v.push((s.index(), s.pba()));
            n = s.link;
        }
        for &(i, p) in v.iter().rev() {
            f(i, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_apply_oldest_first_and_nodes_are_reused() {
        let mut d = Deferred::new(100);
        let mut a = LINK_NONE;
        let mut b = LINK_NONE;
        a = d.push(a, 5, Pba(10));
        b = d.push(b, 1023, Pba(7));
        a = d.push(a, 5, Pba((1 << 39) + 11));
        a = d.push(a, 0, Pba(12));
        b = d.push(b, 1023, Pba::NONE);
        b = d.push(b, 1023, Pba((1 << 40) - 2));
        assert_eq!(d.live(), 6);
        assert_eq!(d.chain_len(a), 3);
        let mut seen = Vec::new();
        d.for_each(a, |i, p| seen.push((i, p)));
        assert_eq!(
            seen,
            vec![(5, Pba(10)), (5, Pba((1 << 39) + 11)), (0, Pba(12))]
        );
        let mut out = Vec::new();
        d.take(a, &mut out);
        assert_eq!(out, seen);
        assert_eq!(d.live(), 3);
        let nodes = d.nodes.len();
        let c = d.push(LINK_NONE, 3, Pba(3));
        let c = d.push(c, 4, Pba(4));
        assert_eq!(d.nodes.len(), nodes, "freed nodes are reused");
        out.clear();
        d.take(b, &mut out);
        assert_eq!(
            out,
            vec![
                (1023, Pba(7)),
                (1023, Pba::NONE),
                (1023, Pba((1 << 40) - 2))
            ]
        );
        out.clear();
        d.take(c, &mut out);
        assert_eq!(out, vec![(3, Pba(3)), (4, Pba(4))]);
        assert_eq!(d.live(), 0);
    }
}
