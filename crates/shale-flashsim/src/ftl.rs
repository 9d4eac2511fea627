//! The drive's own flash translation layer, as a pure model (no data, no I/O).
//!
//! Logical space is mapped in indirection units (IUs); physical space is a set of
//! superblocks (erase units) of `ius_per_superblock` IU slots each, written in order
//! and erased whole. Every host write programs whole IUs into the open host superblock;
//! GC copies the valid IUs of a victim into the open GC superblock (or the shared one)
//! and erases the victim.
//!
//! Invariants (checked by [`Ftl::self_check`], which the tests run):
//! - `l2p[lpn] == ppn` iff `p2l[ppn] == lpn`; every other slot is `NONE`.
//! - `valid[b]` is the number of mapped slots in superblock `b`.
//! - A superblock is in exactly one place: the free list, an open stream, or the
//!   closed set (greedy buckets / FIFO queue / scanned by cost-benefit).
//! - Free superblocks hold no mapped slot.
//! - Outside GC, at least one superblock is free, so GC can always finish a victim:
//!   a victim has fewer than `ius_per_superblock` valid IUs, which fit in what is left of
//!   the GC open superblock plus at most one fresh superblock, and erasing the victim
//!   gives that superblock back.
//!
//! Partial IUs. A write that covers only part of an IU programs the whole IU: the rest
//! is read from NAND if the IU is mapped (read-modify-write) or filled with zeros if it
//! is not (no read). A discard unmaps only the IUs it covers completely; an IU it
//! covers in part stays mapped and valid (no NAND work, counted in
//! `discard_partial_ius`), as a drive that tracks validity per IU must do -- the device
//! underneath still zeroes those bytes, so reads see zeros either way.

use std::collections::VecDeque;

use crate::config::{FtlConfig, GcPolicy, Geometry};
use crate::error::ModelOp;
use crate::stats::{Counters, FlashStats};
use crate::timing::TimingModel;
use crate::FlashSimError;

/// Unmapped logical IU / empty or invalid physical slot / no superblock.
const NONE: u32 = u32::MAX;

/// GC starts when the host needs a superblock and no more than this many are free.
const GC_FREE_LOW: usize = 1;

/// GC stops once this many are free. With the low mark this puts 1 or 2 superblocks
/// in the free list whenever a victim is chosen (1.5 on average) which, with the GC
/// open superblock half empty on average, is the 2 reserve superblocks of
/// `FtlConfig::reserve_superblocks`.
const GC_FREE_HIGH: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockState {
    Free,
    Open,
    Closed,
}

#[derive(Debug, Clone, Copy)]
struct OpenBlock {
    block: u32,
    next_slot: u32,
}

impl OpenBlock {
    const NONE: OpenBlock = OpenBlock {
        block: NONE,
        next_slot: 0,
    };
}

/// Closed superblocks bucketed by valid count, each bucket an intrusive doubly linked
/// list, so greedy victim choice and every validity change are O(1) (amortised: the
/// minimum pointer only scans upwards between choices).
#[derive(Debug)]
struct Buckets {
    head: Vec<u32>,
    next: Vec<u32>,
    prev: Vec<u32>,
    min: usize,
}

impl Buckets {
    fn new(superblocks: usize, ius_per_superblock: usize) -> Buckets {
        Buckets {
            head: vec![NONE; ius_per_superblock + 1],
            next: vec![NONE; superblocks],
            prev: vec![NONE; superblocks],
            min: ius_per_superblock + 1,
        }
    }

    fn insert(&mut self, b: u32, valid: u32) {
        let v = valid as usize;
        let h = self.head[v];
        self.next[b as usize] = h;
        self.prev[b as usize] = NONE;
        if h != NONE {
            self.prev[h as usize] = b;
        }
        self.head[v] = b;
        self.min = self.min.min(v);
    }

    fn remove(&mut self, b: u32, valid: u32) {
        let (p, n) = (self.prev[b as usize], self.next[b as usize]);
        if p == NONE {
            self.head[valid as usize] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NONE {
            self.prev[n as usize] = p;
        }
    }

    fn pop_min(&mut self) -> Option<u32> {
        while self.min < self.head.len() {
            let b = self.head[self.min];
            if b != NONE {
                self.remove(b, self.min as u32);
                return Some(b);
            }
            self.min += 1;
        }
        None
    }
}

/// A conventional drive's FTL: IU mapping, superblocks, spare space, GC.
#[derive(Debug)]
pub struct Ftl {
    geo: Geometry,
    policy: GcPolicy,
    separate_gc_stream: bool,
    timing: TimingModel,
    iu_shift: u32,
    slots: u32,
    l2p: Vec<u32>,
    p2l: Vec<u32>,
    valid: Vec<u32>,
    state: Vec<BlockState>,
    /// Program clock (IUs programmed so far) when each superblock closed.
    closed_at: Vec<u64>,
    free: VecDeque<u32>,
    host: OpenBlock,
    gc: OpenBlock,
    buckets: Buckets,
    fifo: VecDeque<u32>,
    clock: u64,
    counters: Counters,
}

impl Ftl {
    /// A freshly erased drive of `logical_bytes` (every IU unmapped, every superblock
    /// free).
    pub fn new(
        config: &FtlConfig,
        logical_bytes: u64,
        timing: TimingModel,
    ) -> Result<Ftl, FlashSimError> {
        timing.validate()?;
        let geo = config.geometry(logical_bytes)?;
        let superblocks = geo.superblocks as usize;
        let slots = geo.ius_per_superblock as usize;
        // Geometry keeps every count below u32::MAX, so the casts below are exact.
        Ok(Ftl {
            geo,
            policy: config.gc_policy,
            separate_gc_stream: config.separate_gc_stream,
            timing,
            iu_shift: geo.iu_bytes.trailing_zeros(),
            slots: slots as u32,
            l2p: vec![NONE; geo.logical_ius as usize],
            p2l: vec![NONE; geo.physical_ius as usize],
            valid: vec![0; superblocks],
            state: vec![BlockState::Free; superblocks],
            closed_at: vec![0; superblocks],
            free: (0..superblocks as u32).collect(),
            host: OpenBlock::NONE,
            gc: OpenBlock::NONE,
            buckets: Buckets::new(superblocks, slots),
            fifo: VecDeque::with_capacity(superblocks),
            clock: 0,
            counters: Counters::default(),
        })
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    pub fn timing(&self) -> &TimingModel {
        &self.timing
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Statistics since the drive was created.
    pub fn stats(&self) -> FlashStats {
        FlashStats::from_counters(&self.counters, &self.timing)
    }

    /// IUs currently mapped (valid data the drive must keep).
    pub fn mapped_ius(&self) -> u64 {
        self.valid.iter().map(|&v| u64::from(v)).sum()
    }

    fn check_range(&self, op: ModelOp, offset: u64, len: u64) -> Result<(), FlashSimError> {
        let cap = self.geo.logical_bytes();
        match offset.checked_add(len) {
            Some(end) if end <= cap => Ok(()),
            _ => Err(FlashSimError::OutOfRange {
                op,
                offset,
                len,
                capacity_bytes: cap,
            }),
        }
    }

    /// Logical IUs touched by `[offset, offset + len)`, with the bytes covered in each.
    fn for_each_iu(&mut self, offset: u64, len: u64, mut f: impl FnMut(&mut Ftl, u32, u64)) {
        if len == 0 {
            return;
        }
        let iu = self.geo.iu_bytes;
        let end = offset + len;
        let first = offset >> self.iu_shift;
        let last = (end - 1) >> self.iu_shift;
        for lpn in first..=last {
            let start = lpn << self.iu_shift;
            let covered = end.min(start + iu) - offset.max(start);
            f(self, lpn as u32, covered);
        }
    }

    /// A host write of `len` bytes at `offset`.
    pub fn write(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Write, offset, len)?;
        self.counters.host_write_ops += 1;
        self.counters.host_bytes_written += len;
        self.counters.interface_busy_ps += self.timing.command_ps(len);
        self.for_each_iu(offset, len, |ftl, lpn, covered| ftl.write_iu(lpn, covered));
        Ok(())
    }

    fn write_iu(&mut self, lpn: u32, covered: u64) {
        let iu = self.geo.iu_bytes;
        let old = self.l2p[lpn as usize];
        if covered < iu {
            if old != NONE {
                self.counters.nand_bytes_read_rmw += iu - covered;
            }
            self.counters.nand_bytes_written_rmw += iu - covered;
        }
        self.counters.nand_bytes_written_host += covered;
        if old != NONE {
            self.l2p[lpn as usize] = NONE;
            self.invalidate(old);
        }
        let ppn = self.program_host(lpn);
        self.l2p[lpn as usize] = ppn;
    }

    /// A host read: mapped IUs are read from NAND (the bytes asked for), unmapped ones
    /// come back as zeros from the map alone.
    pub fn read(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Read, offset, len)?;
        self.counters.host_read_ops += 1;
        self.counters.host_bytes_read += len;
        self.counters.interface_busy_ps += self.timing.command_ps(len);
        self.for_each_iu(offset, len, |ftl, lpn, covered| {
            if ftl.l2p[lpn as usize] != NONE {
                ftl.counters.nand_bytes_read_host += covered;
            }
        });
        Ok(())
    }

    /// A host discard (trim); see the module comment for partly covered IUs.
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<(), FlashSimError> {
        self.check_range(ModelOp::Discard, offset, len)?;
        self.counters.host_discard_ops += 1;
        self.counters.host_bytes_discarded += len;
        self.counters.interface_busy_ps += self.timing.command_ps(0);
        let iu = self.geo.iu_bytes;
        self.for_each_iu(offset, len, |ftl, lpn, covered| {
            if covered < iu {
                ftl.counters.discard_partial_ius += 1;
                return;
            }
            let old = ftl.l2p[lpn as usize];
            if old != NONE {
                ftl.l2p[lpn as usize] = NONE;
                ftl.invalidate(old);
            }
        });
        Ok(())
    }

    /// A flush costs a command and nothing else (the model has no volatile cache).
    pub fn flush(&mut self) {
        self.counters.host_flush_ops += 1;
        self.counters.interface_busy_ps += self.timing.command_ps(0);
    }

    fn invalidate(&mut self, ppn: u32) {
        debug_assert_ne!(self.p2l[ppn as usize], NONE);
        self.p2l[ppn as usize] = NONE;
        let b = ppn / self.slots;
        let v = self.valid[b as usize];
        self.valid[b as usize] = v - 1;
        if self.policy == GcPolicy::Greedy && self.state[b as usize] == BlockState::Closed {
            self.buckets.remove(b, v);
            self.buckets.insert(b, v - 1);
        }
    }

    fn program_host(&mut self, lpn: u32) -> u32 {
        if self.host.block == NONE {
            self.collect_until_free();
            // With a shared stream, GC may have opened the superblock the host now uses.
            if self.host.block == NONE {
                self.host = self.take_free();
            }
        }
        let (ppn, full) = Self::place(&mut self.host, self.slots);
        self.store(ppn, lpn);
        if full {
            let b = self.host.block;
            self.host = OpenBlock::NONE;
            self.close(b);
        }
        ppn
    }

    fn program_gc(&mut self, lpn: u32) -> u32 {
        let separate = self.separate_gc_stream;
        let target = if separate { self.gc } else { self.host };
        let mut ob = if target.block == NONE {
            self.take_free()
        } else {
            target
        };
        let (ppn, full) = Self::place(&mut ob, self.slots);
        self.store(ppn, lpn);
        let b = ob.block;
        if full {
            ob = OpenBlock::NONE;
        }
        if separate {
            self.gc = ob;
        } else {
            self.host = ob;
        }
        if full {
            self.close(b);
        }
        ppn
    }

    fn place(ob: &mut OpenBlock, slots: u32) -> (u32, bool) {
        let ppn = ob.block * slots + ob.next_slot;
        ob.next_slot += 1;
        (ppn, ob.next_slot == slots)
    }

    fn store(&mut self, ppn: u32, lpn: u32) {
        self.p2l[ppn as usize] = lpn;
        self.valid[(ppn / self.slots) as usize] += 1;
        self.clock += 1;
    }

    fn take_free(&mut self) -> OpenBlock {
        // The GC reserve guarantees a free superblock here (module invariants).
        let b = self
            .free
            .pop_front()
            .expect("flash model: no free superblock (GC reserve violated)");
        self.state[b as usize] = BlockState::Open;
        OpenBlock {
            block: b,
            next_slot: 0,
        }
    }

    fn close(&mut self, b: u32) {
        self.state[b as usize] = BlockState::Closed;
        self.closed_at[b as usize] = self.clock;
        match self.policy {
            GcPolicy::Greedy => self.buckets.insert(b, self.valid[b as usize]),
            GcPolicy::Fifo => self.fifo.push_back(b),
            GcPolicy::CostBenefit => {}
        }
    }

    /// Runs GC when the free superblocks run low, so the host may take one.
    fn collect_until_free(&mut self) {
        // While fewer than GC_FREE_HIGH are free, the geometry leaves an invalid slot
        // in some closed superblock (config.rs), so every greedy or cost-benefit victim
        // reclaims at least one slot, and FIFO reaches such a victim within one pass
        // over the closed superblocks; two superblocks' worth of slots is all a call
        // ever needs. Past this bound the model has a bug.
        let rounds_max = 2 * (self.geo.ius_per_superblock + 1) * self.geo.superblocks + 16;
        let mut rounds = 0u64;
        if self.free.len() > GC_FREE_LOW {
            return;
        }
        while self.free.len() < GC_FREE_HIGH {
            self.collect_one();
            rounds += 1;
            assert!(
                rounds <= rounds_max,
                "flash model: GC made no progress in {rounds} victims"
            );
        }
    }

    fn select_victim(&mut self) -> u32 {
        let victim = match self.policy {
            GcPolicy::Greedy => self.buckets.pop_min(),
            GcPolicy::Fifo => self.fifo.pop_front(),
            GcPolicy::CostBenefit => self.best_cost_benefit(),
        };
        // Geometry leaves more closed superblocks than the data can fill (config.rs).
        victim.expect("flash model: no closed superblock to collect")
    }

    fn best_cost_benefit(&self) -> Option<u32> {
        let slots = f64::from(self.slots);
        let mut best: Option<(f64, u32, u32)> = None;
        for (b, &st) in self.state.iter().enumerate() {
            if st != BlockState::Closed {
                continue;
            }
            let v = self.valid[b];
            let u = f64::from(v) / slots;
            let age = (self.clock - self.closed_at[b]) as f64 + 1.0;
            let score = (1.0 - u) * age / (1.0 + u);
            let better = match best {
                None => true,
                Some((s, bv, _)) => score > s || (score == s && v < bv),
            };
            if better {
                best = Some((score, v, b as u32));
            }
        }
        best.map(|(_, _, b)| b)
    }

    fn collect_one(&mut self) {
        let v = self.select_victim();
        self.state[v as usize] = BlockState::Open;
        let base = v * self.slots;
        let mut copied = 0u64;
        for ppn in base..base + self.slots {
            let lpn = self.p2l[ppn as usize];
            if lpn == NONE {
                continue;
            }
            self.p2l[ppn as usize] = NONE;
            self.valid[v as usize] -= 1;
            let new = self.program_gc(lpn);
            self.l2p[lpn as usize] = new;
            copied += 1;
        }
        debug_assert_eq!(self.valid[v as usize], 0);
        let bytes = copied * self.geo.iu_bytes;
        self.counters.nand_bytes_read_gc += bytes;
        self.counters.nand_bytes_written_gc += bytes;
        self.counters.erases += 1;
        self.counters.nand_bytes_erased += self.geo.superblock_bytes();
        self.state[v as usize] = BlockState::Free;
        self.free.push_back(v);
    }

    /// O(capacity) consistency check of every invariant in the module comment.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    pub fn self_check(&self) -> Result<(), String> {
        let slots = self.slots as usize;
        for (lpn, &ppn) in self.l2p.iter().enumerate() {
            if ppn != NONE && self.p2l[ppn as usize] as usize != lpn {
                return Err(format!(
                    "l2p[{lpn}] = {ppn} but p2l[{ppn}] = {}",
                    self.p2l[ppn as usize]
                ));
            }
        }
        for (b, chunk) in self.p2l.chunks(slots).enumerate() {
            let mut count = 0u32;
            for (i, &lpn) in chunk.iter().enumerate() {
                if lpn == NONE {
                    continue;
                }
                let ppn = (b * slots + i) as u32;
                if self.l2p[lpn as usize] != ppn {
                    return Err(format!(
                        "p2l[{ppn}] = {lpn} but l2p[{lpn}] = {}",
                        self.l2p[lpn as usize]
                    ));
                }
                count += 1;
            }
            if count != self.valid[b] {
                return Err(format!(
                    "superblock {b}: valid {} but {count} mapped",
                    self.valid[b]
                ));
            }
            if self.state[b] == BlockState::Free && count != 0 {
                return Err(format!("free superblock {b} holds {count} mapped IUs"));
            }
        }
        let mut places = vec![0u8; self.state.len()];
        for &b in &self.free {
            places[b as usize] += 1;
            if self.state[b as usize] != BlockState::Free {
                return Err(format!(
                    "superblock {b} on the free list in state {:?}",
                    self.state[b as usize]
                ));
            }
        }
        for ob in [self.host, self.gc] {
            if ob.block != NONE {
                places[ob.block as usize] += 1;
                if self.state[ob.block as usize] != BlockState::Open {
                    return Err(format!(
                        "open superblock {} in state {:?}",
                        ob.block, self.state[ob.block as usize]
                    ));
                }
            }
        }
        let closed: Vec<u32> = match self.policy {
            GcPolicy::Greedy => {
                let mut out = Vec::new();
                for (v, &h) in self.buckets.head.iter().enumerate() {
                    let mut b = h;
                    while b != NONE {
                        if self.valid[b as usize] as usize != v {
                            return Err(format!(
                                "superblock {b} in bucket {v} has {} valid",
                                self.valid[b as usize]
                            ));
                        }
                        if v < self.buckets.min {
                            return Err(format!(
                                "bucket {v} below the minimum pointer {}",
                                self.buckets.min
                            ));
                        }
                        out.push(b);
                        b = self.buckets.next[b as usize];
                    }
                }
                out
            }
            GcPolicy::Fifo => self.fifo.iter().copied().collect(),
            GcPolicy::CostBenefit => (0..self.state.len() as u32)
                .filter(|&b| self.state[b as usize] == BlockState::Closed)
                .collect(),
        };
        for b in closed {
            places[b as usize] += 1;
            if self.state[b as usize] != BlockState::Closed {
                return Err(format!(
                    "superblock {b} among the closed in state {:?}",
                    self.state[b as usize]
                ));
            }
        }
        if let Some(b) = places.iter().position(|&p| p != 1) {
            return Err(format!("superblock {b} is in {} places", places[b]));
        }
        if self.free.len() < GC_FREE_LOW {
            return Err(format!("only {} free superblocks", self.free.len()));
        }
        let c = &self.counters;
        if c.nand_bytes_read_gc != c.nand_bytes_written_gc {
            return Err("GC reads and GC programs differ".into());
        }
        // Every IU slot programmed and not erased since is in a non-free superblock.
        let programmed =
            (c.nand_bytes_written_host + c.nand_bytes_written_rmw + c.nand_bytes_written_gc)
                / self.geo.iu_bytes;
        let erased = c.erases * u64::from(self.slots);
        let mut used = 0u64;
        for (b, &st) in self.state.iter().enumerate() {
            used += match st {
                BlockState::Free => 0,
                BlockState::Closed => u64::from(self.slots),
                BlockState::Open => [self.host, self.gc]
                    .iter()
                    .find(|ob| ob.block as usize == b)
                    .map_or(0, |ob| u64::from(ob.next_slot)),
            };
        }
        if programmed - erased != used {
            return Err(format!(
                "{programmed} IUs programmed, {erased} erased, but {used} slots in use"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Spare, Superblock};
    use proptest::prelude::*;

    const KIB: u64 = 1024;

    fn timing() -> TimingModel {
        TimingModel {
            interface_bytes_per_sec: 7e9,
            command_iops_max: 1e6,
            program_bytes_per_sec: 2.5e9,
            read_bytes_per_sec: 6e9,
            erase_bytes_per_sec: 250e9,
            positioning_secs: 0.0,
        }
    }

    fn drive(iu: u64, ius_per_superblock: u64, capacity: u64, sf: f64) -> Ftl {
        let cfg = FtlConfig::new(iu, Superblock::Bytes(iu * ius_per_superblock), sf);
        Ftl::new(&cfg, capacity, timing()).expect("valid")
    }

    #[test]
    fn partial_iu_write_programs_the_whole_iu_and_reads_the_rest_once_mapped() {
        let mut f = drive(64 * KIB, 16, 64 << 20, 0.1);
        f.write(0, 4 * KIB).expect("in range");
        let s = f.stats();
        // Unmapped IU: the rest is zero padding, nothing to read.
        assert_eq!(s.nand_bytes_written, 64 * KIB);
        assert_eq!(s.nand_bytes_written_host, 4 * KIB);
        assert_eq!(s.nand_bytes_written_rmw, 60 * KIB);
        assert_eq!(s.nand_bytes_read, 0);
        f.write(4 * KIB, 4 * KIB).expect("in range");
        let s = f.stats();
        assert_eq!(s.nand_bytes_written, 128 * KIB);
        assert_eq!(s.nand_bytes_read_rmw, 60 * KIB);
        assert_eq!(s.waf(), 16.0);
        f.self_check().expect("consistent");
    }

    #[test]
    fn misaligned_write_touches_two_ius() {
        let mut f = drive(64 * KIB, 16, 64 << 20, 0.1);
        f.write(0, 128 * KIB).expect("in range");
        let before = f.stats();
        f.write(60 * KIB, 8 * KIB).expect("in range");
        let s = f.stats().since(&before);
        assert_eq!(s.nand_bytes_written, 128 * KIB);
        assert_eq!(s.nand_bytes_read_rmw, 120 * KIB);
        assert_eq!(s.waf(), 16.0);
    }

    #[test]
    fn aligned_full_iu_writes_have_no_read_modify_write() {
        let mut f = drive(64 * KIB, 16, 64 << 20, 0.1);
        f.write(64 * KIB, 256 * KIB).expect("in range");
        let s = f.stats();
        assert_eq!(s.nand_bytes_written, 256 * KIB);
        assert_eq!(s.nand_bytes_written_rmw + s.nand_bytes_read, 0);
    }

    #[test]
    fn discard_unmaps_whole_ius_and_leaves_partly_covered_ones_mapped() {
        let mut f = drive(64 * KIB, 16, 64 << 20, 0.1);
        f.write(0, 128 * KIB).expect("in range");
        f.discard(0, 68 * KIB).expect("in range");
        assert_eq!(f.mapped_ius(), 1);
        assert_eq!(f.stats().discard_partial_ius, 1);
        let before = f.stats();
        f.write(0, 4 * KIB).expect("in range");
        assert_eq!(
            f.stats().since(&before).nand_bytes_read,
            0,
            "IU 0 was unmapped"
        );
        f.write(64 * KIB, 4 * KIB).expect("in range");
        assert_eq!(
            f.stats().since(&before).nand_bytes_read_rmw,
            60 * KIB,
            "IU 1 stayed mapped"
        );
        f.self_check().expect("consistent");
    }

    #[test]
    fn reads_cost_nand_only_where_mapped() {
        let mut f = drive(4 * KIB, 64, 16 << 20, 0.1);
        f.write(0, 8 * KIB).expect("in range");
        f.read(0, 64 * KIB).expect("in range");
        let s = f.stats();
        assert_eq!(s.host_bytes_read, 64 * KIB);
        assert_eq!(s.nand_bytes_read_host, 8 * KIB);
    }

    #[test]
    fn out_of_range_requests_are_typed_errors_and_change_nothing() {
        let mut f = drive(4 * KIB, 64, 16 << 20, 0.1);
        for (off, len) in [(16 << 20, 1), (u64::MAX, 2), ((16 << 20) - 4096, 8192)] {
            assert!(matches!(
                f.write(off, len),
                Err(FlashSimError::OutOfRange {
                    op: ModelOp::Write,
                    ..
                })
            ));
            assert!(f.read(off, len).is_err());
            assert!(f.discard(off, len).is_err());
        }
        assert_eq!(f.stats(), FlashStats::default());
    }

    #[test]
    fn sequential_overwrites_need_no_gc_copies() {
        for policy in [GcPolicy::Greedy, GcPolicy::Fifo, GcPolicy::CostBenefit] {
            let cfg =
                FtlConfig::new(4 * KIB, Superblock::Bytes(256 * KIB), 0.07).with_policy(policy);
            let cap = 32 << 20;
            let mut f = Ftl::new(&cfg, cap, timing()).expect("valid");
            for _ in 0..5 {
                let mut off = 0;
                while off < cap {
                    f.write(off, 128 * KIB).expect("in range");
                    off += 128 * KIB;
                }
            }
            let s = f.stats();
            assert!(s.erases > 0, "{policy:?}: GC ran");
            assert_eq!(s.nand_bytes_written_gc, 0, "{policy:?}");
            assert_eq!(s.waf(), 1.0, "{policy:?}");
            f.self_check().expect("consistent");
        }
    }

    #[test]
    fn physical_bytes_spare_is_honoured() {
        let cfg = FtlConfig {
            spare: Spare::PhysicalBytes(40 << 20),
            ..FtlConfig::new(4 * KIB, Superblock::Bytes(1 << 20), 0.0)
        };
        let f = Ftl::new(&cfg, 32 << 20, timing()).expect("valid");
        assert_eq!(f.geometry().physical_bytes(), 40 << 20);
        assert_eq!(f.geometry().superblocks, 40);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(u64, u64),
        Discard(u64, u64),
        Read(u64, u64),
    }

    /// Ops in 512-byte units over a drive of `sectors` sectors, mostly writes.
    fn ops(sectors: u64) -> impl Strategy<Value = Vec<Op>> {
        let op = (0u8..10, 0..sectors, 1u64..=64).prop_map(move |(k, start, n)| {
            let n = n.min(sectors - start);
            let (off, len) = (start * 512, n * 512);
            match k {
                0 => Op::Discard(off, len),
                1 => Op::Read(off, len),
                _ => Op::Write(off, len),
            }
        });
        proptest::collection::vec(op, 1..1500)
    }

    fn policy() -> impl Strategy<Value = GcPolicy> {
        prop_oneof![
            Just(GcPolicy::Greedy),
            Just(GcPolicy::Fifo),
            Just(GcPolicy::CostBenefit)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Against a reference map of which IUs hold data: the mapping, the
        /// read-modify-write traffic and every invariant hold for any op sequence,
        /// policy and stream layout, and NAND programs never fall below host writes.
        #[test]
        fn model_matches_a_reference_and_keeps_its_invariants(
            iu_shift in 12u32..=14,
            ius_per_superblock in 2u64..=32,
            spare in 0.0f64..0.4,
            policy in policy(),
            separate in any::<bool>(),
            ops in ops(2048),
        ) {
            let iu = 1u64 << iu_shift;
            let cap = 2048 * 512;
            let cfg = FtlConfig {
                gc_policy: policy,
                separate_gc_stream: separate,
                ..FtlConfig::new(iu, Superblock::Bytes(iu * ius_per_superblock), spare)
            };
            let mut f = Ftl::new(&cfg, cap, timing()).expect("valid");
            let mut mapped = vec![false; (cap / iu) as usize];
            let (mut rmw_read, mut rmw_written) = (0u64, 0u64);
            for (i, op) in ops.iter().enumerate() {
                match *op {
                    Op::Write(off, len) => {
                        for lpn in off / iu..=(off + len - 1) / iu {
                            let (s, e) = (lpn * iu, (lpn + 1) * iu);
                            let covered = (off + len).min(e) - off.max(s);
                            if covered < iu {
                                rmw_written += iu - covered;
                                if mapped[lpn as usize] {
                                    rmw_read += iu - covered;
                                }
                            }
                            mapped[lpn as usize] = true;
                        }
                        f.write(off, len).expect("in range");
                    }
                    Op::Discard(off, len) => {
                        for lpn in off.div_ceil(iu)..(off + len) / iu {
                            mapped[lpn as usize] = false;
                        }
                        f.discard(off, len).expect("in range");
                    }
                    Op::Read(off, len) => f.read(off, len).expect("in range"),
                }
                if i % 97 == 0 {
                    prop_assert_eq!(f.self_check(), Ok(()));
                }
            }
            prop_assert_eq!(f.self_check(), Ok(()));
            let s = f.stats();
            prop_assert_eq!(f.mapped_ius(), mapped.iter().filter(|&&m| m).count() as u64);
            prop_assert_eq!(s.nand_bytes_read_rmw, rmw_read);
            prop_assert_eq!(s.nand_bytes_written_rmw, rmw_written);
            prop_assert_eq!(s.nand_bytes_written_host, s.host_bytes_written);
            prop_assert_eq!(
                s.nand_bytes_written,
                s.nand_bytes_written_host + s.nand_bytes_written_gc + s.nand_bytes_written_rmw
            );
            prop_assert!(s.nand_bytes_written >= s.host_bytes_written);
        }
    }
}
