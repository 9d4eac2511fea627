//! A placement stream's staged relocations: entries in order, and their blocks packed
//! into group-sized I/O buffers, so a full group leaves for its zone in the buffer it
//! was staged in (no copy), with room left for its two md blocks.
//!
//! Invariant: staged entry `j` has its block at position `head + j` of the
//! concatenated buffers (`GROUP_DATA_SLOTS` data blocks per buffer; each buffer is
//! `GROUP_BLOCKS` long); every buffer holds at least one staged block.

use std::collections::VecDeque;

use shale_device::IoBuf;
use shale_format::{Lba, Pba, RegionId, Sid, VolumeId, BLOCK_SIZE, GROUP_BLOCKS, GROUP_DATA_SLOTS};

use crate::buffers::BufPool;

#[derive(Debug, Clone, Copy)]
pub(crate) struct RelocEntry {
    pub volume: VolumeId,
    pub lba: Lba,
    pub sid: Sid,
    pub crc: u32,
    /// Where the block is now (`NONE` for a direct write's block, which is nowhere
    /// else).
    pub source: Pba,
    /// The block's position among user writes of chunk `sid` if it is a direct
    /// write's (kept when GC moves it), else [`RELOCATED_POS`].
    pub pos: u32,
    /// The direct write whose block this is, while it is written the first time;
    /// else [`crate::write::direct::NO_DIRECT`].
    pub direct: u32,
    /// The mapping unit shift of the block's volume when it was staged: above 0 the
    /// block is one of a unit's, which move together and switch as one.
    pub shift: u8,
}

/// `RelocEntry::pos` of a relocated block: it ranks above every write of its chunk.
pub(crate) const RELOCATED_POS: u32 = u32::MAX;

impl RelocEntry {
    /// The relocation of the block at `source` its md entry `e` describes: it keeps
    /// its SID and CRC, and a direct block its position.
    pub fn moving(e: &shale_format::MdEntry, source: Pba) -> RelocEntry {
        RelocEntry {
            volume: e.volume,
            lba: e.lba,
            sid: e.sid,
            crc: e.data_crc,
            source,
            pos: if e.kind == shale_format::EntryKind::Direct {
                e.pos
            } else {
                RELOCATED_POS
            },
            direct: crate::write::direct::NO_DIRECT,
            shift: 0,
        }
    }

    /// Which block of its unit this is (0 where the volume maps blocks).
    pub fn unit_index(&self) -> u64 {
        self.lba.0 & ((1u64 << self.shift) - 1)
    }

    /// A direct write's block on its way to its first zone.
    pub fn is_fresh_direct(&self) -> bool {
        self.direct != crate::write::direct::NO_DIRECT
    }
}

#[derive(Debug, Default)]
pub(crate) struct Stream {
    pub zone: Option<RegionId>,
    pub entries: VecDeque<RelocEntry>,
    bufs: VecDeque<IoBuf>,
    head: usize,
}

const PER: usize = GROUP_DATA_SLOTS;
const BUF_BLOCKS: usize = GROUP_BLOCKS as usize;

impl Stream {
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn at(&self, j: usize) -> (usize, usize) {
        let p = self.head + j;
        (p / PER, (p % PER) * BLOCK_SIZE)
    }

    /// The block of staged entry `j`.
    pub fn block(&self, j: usize) -> &[u8] {
        let (b, o) = self.at(j);
        &self.bufs[b][o..o + BLOCK_SIZE]
    }

    /// Stages one block at the end.
    pub fn push(&mut self, e: RelocEntry, data: &[u8], pool: &mut BufPool) {
        let (b, o) = self.at(self.entries.len());
        if b == self.bufs.len() {
            self.bufs.push_back(pool.take(BUF_BLOCKS));
        }
        self.bufs[b][o..o + BLOCK_SIZE].copy_from_slice(data);
        self.entries.push_back(e);
    }

    /// If the first `GROUP_DATA_SLOTS` staged entries fill the front buffer exactly,
    /// takes that buffer (with its `GROUP_BLOCKS - GROUP_DATA_SLOTS` spare blocks for
    /// md) and those entries.
    pub fn take_full_group(&mut self) -> Option<(IoBuf, Vec<RelocEntry>)> {
        if self.head != 0 || self.entries.len() < PER {
            return None;
        }
        let buf = self.bufs.pop_front()?;
        Some((buf, self.entries.drain(..PER).collect()))
    }

    /// Drops the first `n` staged entries (their blocks were copied out or are no
    /// longer wanted); returns emptied buffers to `pool`.
    pub fn consume(&mut self, n: usize, pool: &mut BufPool) {
        let n = n.min(self.entries.len());
        self.entries.drain(..n);
        self.head += n;
        while self.head >= PER {
            if let Some(b) = self.bufs.pop_front() {
                pool.give(b);
            }
            self.head -= PER;
        }
        if self.entries.is_empty() {
            for b in self.bufs.drain(..) {
                pool.give(b);
            }
            self.head = 0;
        }
    }

    /// Keeps only the entries `keep` says yes to (in order); returns the others.
    pub fn retain(
        &mut self,
        pool: &mut BufPool,
        keep: impl FnMut(&RelocEntry) -> bool,
    ) -> Vec<RelocEntry> {
        let mut dropped = Vec::new();
        self.retain_with(pool, keep, |e, _| dropped.push(e));
        dropped
    }

    /// `retain`, handing each dropped entry to `dropped` with its block.
    pub fn retain_with(
        &mut self,
        pool: &mut BufPool,
        mut keep: impl FnMut(&RelocEntry) -> bool,
        mut dropped: impl FnMut(RelocEntry, &[u8]),
    ) {
        let mut w = 0;
        let mut tmp = [0u8; BLOCK_SIZE];
        for r in 0..self.entries.len() {
            let e = self.entries[r];
            if !keep(&e) {
                dropped(e, self.block(r));
                continue;
            }
            if w != r {
                tmp.copy_from_slice(self.block(r));
                let (b, o) = self.at(w);
                self.bufs[b][o..o + BLOCK_SIZE].copy_from_slice(&tmp);
                self.entries[w] = e;
            }
            w += 1;
        }
        self.entries.truncate(w);
        let (used, _) = self.at(w.saturating_sub(1));
        let bufs_needed = if w == 0 { 0 } else { used + 1 };
        while self.bufs.len() > bufs_needed {
            if let Some(b) = self.bufs.pop_back() {
                pool.give(b);
            }
        }
        if w == 0 {
            self.head = 0;
        }
    }

    /// Forgets everything staged; returns the entries.
    pub fn clear(&mut self, pool: &mut BufPool) -> Vec<RelocEntry> {
        for b in self.bufs.drain(..) {
            pool.give(b);
        }
        self.head = 0;
        self.entries.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry(i: u64) -> RelocEntry {
        RelocEntry {
            volume: VolumeId(0),
            lba: Lba(i),
            sid: Sid(1),
            crc: 0,
            source: Pba(i),
            pos: RELOCATED_POS,
            direct: crate::write::direct::NO_DIRECT,
            shift: 0,
        }
    }

    fn block(i: u64) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK_SIZE];
        b[..8].copy_from_slice(&i.to_le_bytes());
        b[BLOCK_SIZE - 8..].copy_from_slice(&i.to_le_bytes());
        b
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u8),
        TakeFull,
        Consume(u8),
        Retain(u8),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (1u8..200).prop_map(Op::Push),
            2 => Just(Op::TakeFull),
            2 => any::<u8>().prop_map(Op::Consume),
            1 => (2u8..10).prop_map(Op::Retain),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// The stream behaves like a queue of (entry, block) pairs: blocks stay with
        /// their entries through pushes, whole-group takes, partial consumption,
        /// filtering and clears.
        #[test]
        fn stream_is_a_queue_of_blocks(ops in proptest::collection::vec(op(), 1..60)) {
            let mut pool = BufPool::new();
            let mut s = Stream::default();
            let mut model: VecDeque<u64> = VecDeque::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Push(n) => {
                        for _ in 0..n {
                            s.push(entry(next), &block(next), &mut pool);
                            model.push_back(next);
                            next += 1;
                        }
                    }
                    Op::TakeFull => {
                        if let Some((buf, es)) = s.take_full_group() {
                            prop_assert_eq!(es.len(), PER);
                            prop_assert_eq!(buf.len(), BUF_BLOCKS * BLOCK_SIZE);
                            for (i, e) in es.iter().enumerate() {
                                let want = model.pop_front().unwrap();
                                prop_assert_eq!(e.lba.0, want);
                                prop_assert_eq!(&buf[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE], &block(want)[..]);
                            }
                        }
                    }
                    Op::Consume(n) => {
                        let n = usize::from(n).min(model.len());
                        s.consume(n, &mut pool);
                        model.drain(..n);
                    }
                    Op::Retain(k) => {
                        let k = u64::from(k);
                        let dropped = s.retain(&mut pool, |e| e.lba.0 % k != 0);
                        let want: Vec<u64> = model.iter().copied().filter(|i| i % k == 0).collect();
                        prop_assert_eq!(dropped.iter().map(|e| e.lba.0).collect::<Vec<_>>(), want);
                        model.retain(|i| i % k != 0);
                    }
                    Op::Clear => {
                        let all = s.clear(&mut pool);
                        prop_assert_eq!(all.len(), model.len());
                        model.clear();
                    }
                }
                prop_assert_eq!(s.len(), model.len());
                for (j, &want) in model.iter().enumerate() {
                    prop_assert_eq!(s.entries[j].lba.0, want);
                    prop_assert_eq!(s.block(j), &block(want)[..]);
                }
                prop_assert!(s.bufs.len() <= (s.head + s.len()).div_ceil(PER).max(usize::from(!s.is_empty())));
            }
        }
    }
}
