//! `raid-model` and `raid5f-model`: the array baselines, models (not the real md or
//! SPDK code) over `K+M` conventional QLC drives (`qlc-p5316` presets, count-only).
//!
//! Both keep data in place on a left-symmetric layout: stripe `s` has its P strip on
//! member `n − 1 − (s mod n)`, Q (if `M = 2`) on the next member, the data strips on
//! the members after those. The volumes are carved from the array's data capacity
//! (= the configuration's capacity) as `raw` carves the single drive: 10%
//! unpartitioned by default.
//!
//! - `raid-model` (md RAID-5/6): every write goes to the members at once. A write is
//!   split into stripe heads (one 4 KiB page on each member, as md's `stripe_head`);
//!   a head whose K data pages are all written needs no read, otherwise md reads
//!   either the old data it replaces and the old parity (read-modify-write, `w + M`
//!   pages) or the data it does not replace (reconstruct-write, `K − w` pages),
//!   whichever is fewer, then writes the new data and all M parity pages. Heads kept in
//!   the stripe cache need no read: [`STRIPE_CACHE_HEADS`] heads, LRU (md's default
//!   `stripe_cache_size` of 256). Strips are [`STRIP_BYTES`].
//! - `raid5f-model` (SPDK raid5f, full-stripe writes only, under a write-back cache):
//!   writes land in an `optane` cache drive (5% of the capacity, as Shale's), in lines
//!   of one stripe. A line whose every page is dirty is written to the members at once
//!   as a full stripe (flush-on-full: one cache read of the line, K data and M parity
//!   strips). When a new stripe needs a line and none is free, the least recently
//!   written line is evicted: the pages it lacks are read from the members, the
//!   dirty ones from the cache, and the whole stripe is written. Reads take dirty pages
//!   from the cache, the rest from the members. raid5f itself is RAID-5 only; `K+2`
//!   runs the same policy with two parities.

use std::collections::{BTreeMap, HashMap};

use shale_array::Redundancy;
use shale_device::{BlockDevice, NullDevice};
use shale_flashsim::{FlashSim, StatsHandle};
use shale_workload::{IoKind, IoOp};

use crate::config::SetupError;
use crate::raw::{partition_bytes, PARTITION_ALIGN_BYTES};
use crate::system::{DeviceReport, DeviceRole, RunError, SystemUnderTest, Traffic};

/// Strip (chunk) size of both models: one indirection unit of the P5316, so every
/// member write of a full strip is IU-aligned. md's default chunk is 512 KiB; 64 KiB
/// keeps "a full stripe" the same size in both models.
pub const STRIP_BYTES: u64 = 64 << 10;
/// md's default `stripe_cache_size`: stripe heads (one page per member) cached.
pub const STRIPE_CACHE_HEADS: usize = 256;
const PAGE: u64 = 4096;
const PAGES_PER_STRIP: u64 = STRIP_BYTES / PAGE;
/// Largest K: a raid5f line's dirty map is one `u128` of pages.
const K_MAX: u32 = (128 / PAGES_PER_STRIP) as u32;

type Drive = FlashSim<NullDevice>;

/// How an array model is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidConfig {
    /// Data capacity of the array (the configuration's capacity).
    pub capacity_bytes: u64,
    pub tenants: u32,
    pub host_spare_pct: u8,
    /// Members; must be K+M.
    pub devices: u32,
    pub redundancy: Redundancy,
    /// Cache size as a percentage of the capacity (`raid5f-model`).
    pub cache_pct: u8,
}

/// Where stripes live.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    k: u32,
    m: u32,
    n: u32,
    stripes: u64,
}

impl Geometry {
    fn new(system: &'static str, cfg: &RaidConfig) -> Result<Geometry, SetupError> {
        let bad = |reason: &str| SetupError::ModelRedundancy {
            system,
            redundancy: cfg.redundancy.to_string(),
            reason: reason.into(),
        };
        let Redundancy::Parity { k, m } = cfg.redundancy else {
            return Err(bad("expected K+1 or K+2"));
        };
        let (k, m) = (u32::from(k), u32::from(m));
        if !(1..=2).contains(&m) {
            return Err(bad("M must be 1 (RAID-5) or 2 (RAID-6)"));
        }
        if !(2..=K_MAX).contains(&k) {
            return Err(bad(&format!("K must be 2 to {K_MAX}")));
        }
        cfg.redundancy.shards(cfg.devices as usize)?;
        let stripes = cfg.capacity_bytes / (u64::from(k) * STRIP_BYTES);
        Ok(Geometry {
            k,
            m,
            n: k + m,
            stripes,
        })
    }

    fn member_bytes(&self) -> u64 {
        self.stripes * STRIP_BYTES
    }

    fn stripe_bytes(&self) -> u64 {
        u64::from(self.k) * STRIP_BYTES
    }

    /// Member of slot `slot` of stripe `s` (data 0..K, then P, Q).
    fn member(&self, s: u64, slot: u32) -> u32 {
        let p = self.n - 1 - (s % u64::from(self.n)) as u32;
        if slot >= self.k {
            (p + slot - self.k) % self.n
        } else {
            (p + self.m + slot) % self.n
        }
    }

    /// (stripe, data column, page within the strip) of array page `page`.
    fn locate(&self, page: u64) -> (u64, u32, u64) {
        let per_stripe = u64::from(self.k) * PAGES_PER_STRIP;
        let s = page / per_stripe;
        let r = page % per_stripe;
        (s, (r / PAGES_PER_STRIP) as u32, r % PAGES_PER_STRIP)
    }
}

/// Member I/O of one request, coalesced per member.
#[derive(Debug, Default)]
struct Batch {
    reads: Vec<Vec<(u64, u64)>>,
    writes: Vec<Vec<(u64, u64)>>,
}

impl Batch {
    fn new(n: u32) -> Batch {
        Batch {
            reads: vec![Vec::new(); n as usize],
            writes: vec![Vec::new(); n as usize],
        }
    }

    fn push(list: &mut Vec<(u64, u64)>, off: u64, len: u64) {
        if let Some(last) = list.last_mut() {
            if last.0 + last.1 == off {
                last.1 += len;
                return;
            }
        }
        list.push((off, len));
    }

    fn read(&mut self, member: u32, off: u64, len: u64) {
        Self::push(&mut self.reads[member as usize], off, len);
    }

    fn write(&mut self, member: u32, off: u64, len: u64) {
        Self::push(&mut self.writes[member as usize], off, len);
    }
}

/// The members and what they did.
#[derive(Debug)]
struct Members {
    geo: Geometry,
    drives: Vec<Drive>,
    stats: Vec<StatsHandle>,
    zeros: Vec<u8>,
}

impl Members {
    fn new(geo: Geometry) -> Result<Members, SetupError> {
        let preset = shale_flashsim::preset("qlc-p5316")?;
        let mut drives = Vec::new();
        let mut stats = Vec::new();
        for _ in 0..geo.n {
            let d = FlashSim::from_preset(NullDevice::new(geo.member_bytes(), 4096)?, &preset)?;
            stats.push(d.stats_handle());
            drives.push(d);
        }
        Ok(Members {
            geo,
            drives,
            stats,
            zeros: Vec::new(),
        })
    }

    /// Issues `batch`: reads first (parity needs them), then writes.
    fn issue(&mut self, batch: &Batch) -> Result<(), shale_device::DeviceError> {
        for (i, list) in batch.reads.iter().enumerate() {
            for &(off, len) in list {
                self.drives[i].count_read(off, len)?;
            }
        }
        for (i, list) in batch.writes.iter().enumerate() {
            for &(off, len) in list {
                let len = len as usize;
                if self.zeros.len() < len {
                    self.zeros.resize(len, 0);
                }
                self.drives[i].write_at(off, &self.zeros[..len])?;
            }
        }
        Ok(())
    }

    fn reports(&self) -> Vec<DeviceReport> {
        self.stats
            .iter()
            .map(|s| DeviceReport {
                role: DeviceRole::Capacity,
                preset: "qlc-p5316".into(),
                stats: s.stats(),
            })
            .collect()
    }

    /// Adds reads of the data pages `pages` (array pages) to `batch`.
    fn read_pages(&self, batch: &mut Batch, first: u64, count: u64) {
        for page in first..first + count {
            let (s, col, p) = self.geo.locate(page);
            batch.read(self.geo.member(s, col), s * STRIP_BYTES + p * PAGE, PAGE);
        }
    }
}

/// A least-recently-used set of keys.
#[derive(Debug, Default)]
struct Lru {
    stamp_of: HashMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
    next: u64,
}

impl Lru {
    fn contains(&self, key: u64) -> bool {
        self.stamp_of.contains_key(&key)
    }

    fn touch(&mut self, key: u64) {
        if let Some(old) = self.stamp_of.insert(key, self.next) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(self.next, key);
        self.next += 1;
    }

    fn remove(&mut self, key: u64) {
        if let Some(old) = self.stamp_of.remove(&key) {
            self.by_stamp.remove(&old);
        }
    }

    fn oldest(&self) -> Option<u64> {
        self.by_stamp.values().next().copied()
    }

    fn len(&self) -> usize {
        self.stamp_of.len()
    }
}

fn range_error(op: &IoOp, volume_bytes: u64) -> RunError {
    RunError::BadRange {
        tenant: op.tenant,
        kind: op.kind,
        offset: op.offset,
        len: op.len,
        volume_bytes,
        sector_bytes: PAGE,
    }
}

/// Array pages of `op` (first, count), checked against the volume.
fn op_pages(op: &IoOp, tenants: u32, volume_bytes: u64) -> Result<(u64, u64), RunError> {
    if op.tenant >= tenants {
        return Err(RunError::NoSuchVolume {
            tenant: op.tenant,
            volumes: tenants,
        });
    }
    if op.len == 0
        || !op.offset.is_multiple_of(PAGE)
        || !op.len.is_multiple_of(PAGE)
        || op
            .offset
            .checked_add(op.len)
            .is_none_or(|e| e > volume_bytes)
    {
        return Err(range_error(op, volume_bytes));
    }
    let base = u64::from(op.tenant) * volume_bytes;
    Ok(((base + op.offset) / PAGE, op.len / PAGE))
}

fn device_error(op: &IoOp) -> impl FnOnce(shale_device::DeviceError) -> RunError + '_ {
    move |source| RunError::Device {
        tenant: op.tenant,
        kind: op.kind,
        offset: op.offset,
        len: op.len,
        source,
    }
}

fn volumes(cfg: &RaidConfig, geo: &Geometry) -> Result<(u32, u64), SetupError> {
    let tenants = cfg.tenants.max(1);
    let data = geo.stripes * geo.stripe_bytes();
    let vb = partition_bytes(data, cfg.host_spare_pct, tenants, PARTITION_ALIGN_BYTES)?;
    Ok((tenants, vb))
}

/// In-place RAID-5/6 with read-modify-write and a stripe cache (md).
#[derive(Debug)]
pub struct RaidModel {
    members: Members,
    tenants: u32,
    volume_bytes: u64,
    cache: Lru,
    /// Member pages read to compute parity since the last reset.
    parity_read_bytes: u64,
    /// Parity pages written since the last reset.
    parity_write_bytes: u64,
}

impl RaidModel {
    pub fn new(cfg: &RaidConfig) -> Result<RaidModel, SetupError> {
        let geo = Geometry::new("raid-model", cfg)?;
        let (tenants, volume_bytes) = volumes(cfg, &geo)?;
        Ok(RaidModel {
            members: Members::new(geo)?,
            tenants,
            volume_bytes,
            cache: Lru::default(),
            parity_read_bytes: 0,
            parity_write_bytes: 0,
        })
    }

    /// Stripe heads of the pages `first..first+count`: head key → written columns.
    fn heads(&self, first: u64, count: u64) -> BTreeMap<u64, u64> {
        let geo = self.members.geo;
        let mut heads: BTreeMap<u64, u64> = BTreeMap::new();
        for page in first..first + count {
            let (s, col, p) = geo.locate(page);
            *heads.entry(s * PAGES_PER_STRIP + p).or_default() |= 1 << col;
        }
        heads
    }

    fn write(&mut self, first: u64, count: u64) -> Batch {
        let geo = self.members.geo;
        let mut batch = Batch::new(geo.n);
        let full = (1u64 << geo.k) - 1;
        for (key, mask) in self.heads(first, count) {
            let (s, p) = (key / PAGES_PER_STRIP, key % PAGES_PER_STRIP);
            let off = s * STRIP_BYTES + p * PAGE;
            let w = mask.count_ones();
            if mask != full && !self.cache.contains(key) {
                let rmw = w + geo.m;
                let rcw = geo.k - w;
                for slot in 0..geo.n {
                    let data = slot < geo.k;
                    let written = data && mask & (1 << slot) != 0;
                    let read = if rmw <= rcw {
                        written || !data
                    } else {
                        data && !written
                    };
                    if read {
                        batch.read(geo.member(s, slot), off, PAGE);
                        self.parity_read_bytes += PAGE;
                    }
                }
            }
            for slot in 0..geo.n {
                if slot >= geo.k || mask & (1 << slot) != 0 {
                    batch.write(geo.member(s, slot), off, PAGE);
                }
            }
            self.parity_write_bytes += u64::from(geo.m) * PAGE;
            self.cache.touch(key);
            if self.cache.len() > STRIPE_CACHE_HEADS {
                if let Some(old) = self.cache.oldest() {
                    self.cache.remove(old);
                }
            }
        }
        batch
    }
}

impl SystemUnderTest for RaidModel {
    fn name(&self) -> &str {
        "raid-model"
    }

    fn volume_count(&self) -> u32 {
        self.tenants
    }

    fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }

    fn sector_bytes(&self) -> u64 {
        PAGE
    }

    fn submit(&mut self, op: &IoOp) -> Result<(), RunError> {
        let (first, count) = op_pages(op, self.tenants, self.volume_bytes)?;
        let batch = match op.kind {
            IoKind::Write => self.write(first, count),
            IoKind::Read => {
                let mut b = Batch::new(self.members.geo.n);
                self.members.read_pages(&mut b, first, count);
                b
            }
            // md passes discards through; the benchmarks' workloads do not trim.
            IoKind::Trim => return Ok(()),
        };
        self.members.issue(&batch).map_err(device_error(op))
    }

    fn drain(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    fn reset_counters(&mut self) {
        for s in &self.members.stats {
            s.reset();
        }
        self.parity_read_bytes = 0;
        self.parity_write_bytes = 0;
    }

    fn devices(&self) -> Vec<DeviceReport> {
        self.members.reports()
    }

    fn traffic(&self) -> Vec<Traffic> {
        vec![
            Traffic {
                name: "parity_reads",
                bytes: self.parity_read_bytes,
            },
            Traffic {
                name: "parity_writes",
                bytes: self.parity_write_bytes,
            },
        ]
    }
}

/// One cache line: a stripe's dirty pages.
#[derive(Debug, Clone, Copy)]
struct Line {
    stripe: u64,
    dirty: u128,
}

/// Full-stripe-only RAID behind a write-back cache (SPDK raid5f under a cache).
#[derive(Debug)]
pub struct Raid5fModel {
    members: Members,
    tenants: u32,
    volume_bytes: u64,
    cache: Drive,
    cache_stats: StatsHandle,
    lines: Vec<Option<Line>>,
    free: Vec<usize>,
    slot_of: HashMap<u64, usize>,
    lru: Lru,
    /// Full stripes written to the members since the last reset.
    flush_bytes: u64,
    /// Pages read from the members to complete evicted partial stripes.
    fill_read_bytes: u64,
}

impl Raid5fModel {
    pub fn new(cfg: &RaidConfig) -> Result<Raid5fModel, SetupError> {
        let geo = Geometry::new("raid5f-model", cfg)?;
        let (tenants, volume_bytes) = volumes(cfg, &geo)?;
        let cache_bytes = cfg.capacity_bytes / 100 * u64::from(cfg.cache_pct);
        let count = (cache_bytes / geo.stripe_bytes()).max(1) as usize;
        let cache = FlashSim::from_preset(
            NullDevice::new(count as u64 * geo.stripe_bytes(), 4096)?,
            &shale_flashsim::preset("optane")?,
        )?;
        Ok(Raid5fModel {
            members: Members::new(geo)?,
            tenants,
            volume_bytes,
            cache_stats: cache.stats_handle(),
            cache,
            lines: vec![None; count],
            free: (0..count).rev().collect(),
            slot_of: HashMap::new(),
            lru: Lru::default(),
            flush_bytes: 0,
            fill_read_bytes: 0,
        })
    }

    fn full_mask(&self) -> u128 {
        let pages = u64::from(self.members.geo.k) * PAGES_PER_STRIP;
        if pages >= 128 {
            u128::MAX
        } else {
            (1u128 << pages) - 1
        }
    }

    fn line_offset(&self, slot: usize) -> u64 {
        slot as u64 * self.members.geo.stripe_bytes()
    }

    /// Writes line `slot` to the members as a full stripe and frees it.
    fn flush(&mut self, slot: usize) -> Result<(), shale_device::DeviceError> {
        let Some(line) = self.lines[slot].take() else {
            return Ok(());
        };
        let geo = self.members.geo;
        let mut batch = Batch::new(geo.n);
        let stripe_pages = u64::from(geo.k) * PAGES_PER_STRIP;
        let base = line.stripe * stripe_pages;
        for i in 0..stripe_pages {
            if line.dirty & (1 << i) == 0 {
                self.members.read_pages(&mut batch, base + i, 1);
                self.fill_read_bytes += PAGE;
            }
        }
        // The dirty pages come from the cache, in runs.
        let mut i = 0;
        while i < stripe_pages {
            if line.dirty & (1 << i) == 0 {
                i += 1;
                continue;
            }
            let start = i;
            while i < stripe_pages && line.dirty & (1 << i) != 0 {
                i += 1;
            }
            let at = self.line_offset(slot) + start * PAGE;
            self.cache.count_read(at, (i - start) * PAGE)?;
        }
        for slot_in in 0..geo.n {
            batch.write(
                geo.member(line.stripe, slot_in),
                line.stripe * STRIP_BYTES,
                STRIP_BYTES,
            );
        }
        self.flush_bytes += u64::from(geo.n) * STRIP_BYTES;
        self.members.issue(&batch)?;
        self.slot_of.remove(&line.stripe);
        self.lru.remove(line.stripe);
        self.free.push(slot);
        Ok(())
    }

    /// The line of `stripe`, taking a free one (evicting the oldest if none).
    fn line_for(&mut self, stripe: u64) -> Result<usize, shale_device::DeviceError> {
        if let Some(&slot) = self.slot_of.get(&stripe) {
            return Ok(slot);
        }
        if self.free.is_empty() {
            if let Some(old) = self.lru.oldest() {
                if let Some(&slot) = self.slot_of.get(&old) {
                    self.flush(slot)?;
                }
            }
        }
        let Some(slot) = self.free.pop() else {
            return Err(shale_device::DeviceError::InvalidGeometry {
                reason: "raid5f-model: no cache line could be freed".into(),
            });
        };
        self.lines[slot] = Some(Line { stripe, dirty: 0 });
        self.slot_of.insert(stripe, slot);
        Ok(slot)
    }

    fn write(&mut self, first: u64, count: u64) -> Result<(), shale_device::DeviceError> {
        let stripe_pages = u64::from(self.members.geo.k) * PAGES_PER_STRIP;
        let mut page = first;
        let end = first + count;
        while page < end {
            let stripe = page / stripe_pages;
            let from = page % stripe_pages;
            let to = (end - stripe * stripe_pages).min(stripe_pages);
            let slot = self.line_for(stripe)?;
            let len = (to - from) * PAGE;
            let at = self.line_offset(slot) + from * PAGE;
            if self.members.zeros.len() < len as usize {
                self.members.zeros.resize(len as usize, 0);
            }
            self.cache
                .write_at(at, &self.members.zeros[..len as usize])?;
            let mask = if to - from >= 128 {
                u128::MAX
            } else {
                ((1u128 << (to - from)) - 1) << from
            };
            let full = self.full_mask();
            let dirty = match self.lines[slot].as_mut() {
                Some(line) => {
                    line.dirty |= mask;
                    line.dirty
                }
                None => 0,
            };
            self.lru.touch(stripe);
            if dirty == full {
                self.flush(slot)?;
            }
            page = stripe * stripe_pages + to;
        }
        Ok(())
    }

    fn read(&mut self, first: u64, count: u64) -> Result<(), shale_device::DeviceError> {
        let stripe_pages = u64::from(self.members.geo.k) * PAGES_PER_STRIP;
        let mut batch = Batch::new(self.members.geo.n);
        for page in first..first + count {
            let stripe = page / stripe_pages;
            let i = page % stripe_pages;
            let cached = self.slot_of.get(&stripe).and_then(|&slot| {
                let line = self.lines[slot]?;
                (line.dirty & (1 << i) != 0).then_some(slot)
            });
            match cached {
                Some(slot) => self
                    .cache
                    .count_read(self.line_offset(slot) + i * PAGE, PAGE)?,
                None => self.members.read_pages(&mut batch, page, 1),
            }
        }
        self.members.issue(&batch)
    }
}

impl SystemUnderTest for Raid5fModel {
    fn name(&self) -> &str {
        "raid5f-model"
    }

    fn volume_count(&self) -> u32 {
        self.tenants
    }

    fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }

    fn sector_bytes(&self) -> u64 {
        PAGE
    }

    fn submit(&mut self, op: &IoOp) -> Result<(), RunError> {
        let (first, count) = op_pages(op, self.tenants, self.volume_bytes)?;
        match op.kind {
            IoKind::Write => self.write(first, count),
            IoKind::Read => self.read(first, count),
            IoKind::Trim => Ok(()),
        }
        .map_err(device_error(op))
    }

    fn drain(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    fn reset_counters(&mut self) {
        for s in &self.members.stats {
            s.reset();
        }
        self.cache_stats.reset();
        self.flush_bytes = 0;
        self.fill_read_bytes = 0;
    }

    fn devices(&self) -> Vec<DeviceReport> {
        let mut d = self.members.reports();
        d.push(DeviceReport {
            role: DeviceRole::Cache,
            preset: "optane".into(),
            stats: self.cache_stats.stats(),
        });
        d
    }

    fn traffic(&self) -> Vec<Traffic> {
        vec![
            Traffic {
                name: "stripe_flush",
                bytes: self.flush_bytes,
            },
            Traffic {
                name: "fill_reads",
                bytes: self.fill_read_bytes,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(n: u32, r: &str) -> RaidConfig {
        RaidConfig {
            capacity_bytes: 64 << 20,
            tenants: 2,
            host_spare_pct: 10,
            devices: n,
            redundancy: r.parse().expect("redundancy"),
            cache_pct: 5,
        }
    }

    fn w(tenant: u32, offset: u64, len: u64) -> IoOp {
        IoOp {
            tenant,
            kind: IoKind::Write,
            offset,
            len,
            not_before_ns: 0,
        }
    }

    fn totals(d: &[DeviceReport], role: DeviceRole) -> (u64, u64) {
        d.iter().filter(|x| x.role == role).fold((0, 0), |a, x| {
            (
                a.0 + x.stats.host_bytes_read,
                a.1 + x.stats.host_bytes_written,
            )
        })
    }

    #[test]
    fn parity_rotates_and_slots_are_distinct() {
        let g = Geometry::new("t", &cfg(6, "4+2")).expect("geo");
        for s in 0..12 {
            let mut seen: Vec<u32> = (0..6).map(|slot| g.member(s, slot)).collect();
            seen.sort_unstable();
            assert_eq!(seen, vec![0, 1, 2, 3, 4, 5]);
        }
        let p: Vec<u32> = (0..6).map(|s| g.member(s, 4)).collect();
        assert_eq!(p, vec![5, 4, 3, 2, 1, 0]);
    }

    #[test]
    fn a_small_write_reads_and_writes_two_pages_each_on_raid5() {
        let mut r = RaidModel::new(&cfg(4, "3+1")).expect("raid");
        r.submit(&w(0, 0, 4096)).expect("write");
        let (read, written) = totals(&r.devices(), DeviceRole::Capacity);
        // rmw = 1 + 1 = 2 reads, rcw = 3 - 1 = 2: rmw; writes data + parity.
        assert_eq!((read, written), (8192, 8192));
        // The head is cached now: the neighbour column needs no read.
        r.submit(&w(0, STRIP_BYTES, 4096)).expect("write");
        let (read, written) = totals(&r.devices(), DeviceRole::Capacity);
        assert_eq!((read, written), (8192, 16384));
        // A full stripe needs no read at all.
        r.reset_counters();
        r.submit(&w(0, 3 * STRIP_BYTES, 3 * STRIP_BYTES))
            .expect("write");
        let (read, written) = totals(&r.devices(), DeviceRole::Capacity);
        assert_eq!((read, written), (0, 4 * STRIP_BYTES));
    }

    #[test]
    fn raid6_small_writes_read_three_pages() {
        let mut r = RaidModel::new(&cfg(6, "4+2")).expect("raid");
        r.submit(&w(0, 0, 4096)).expect("write");
        let (read, written) = totals(&r.devices(), DeviceRole::Capacity);
        // rmw = 1 + 2 = 3, rcw = 4 - 1 = 3: three reads; data + P + Q written.
        assert_eq!((read, written), (3 * 4096, 3 * 4096));
    }

    #[test]
    fn raid5f_writes_only_full_stripes() {
        let mut r = Raid5fModel::new(&cfg(5, "4+1")).expect("raid5f");
        let stripe = 4 * STRIP_BYTES;
        // A full stripe goes through the cache and out at once.
        r.submit(&w(0, 0, stripe)).expect("write");
        let d = r.devices();
        assert_eq!(totals(&d, DeviceRole::Capacity), (0, 5 * STRIP_BYTES));
        assert_eq!(totals(&d, DeviceRole::Cache), (stripe, stripe));
        // Small writes stay in the cache until their line is evicted.
        r.reset_counters();
        let lines = r.lines.len() as u64;
        for i in 0..=lines {
            r.submit(&w(0, i * stripe, 4096)).expect("write");
        }
        let d = r.devices();
        let (read, written) = totals(&d, DeviceRole::Capacity);
        assert_eq!(
            written,
            5 * STRIP_BYTES,
            "one line evicted as a full stripe"
        );
        assert_eq!(
            read,
            stripe - 4096,
            "its missing pages read from the members"
        );
        assert!(written % (5 * STRIP_BYTES) == 0);
    }

    #[test]
    fn bad_layouts_are_typed_errors() {
        for (n, r) in [(4, "4+1"), (4, "1+3"), (2, "mirror"), (10, "9+1")] {
            let e = RaidModel::new(&cfg(n, r)).expect_err(r);
            assert!(
                matches!(
                    e,
                    SetupError::ModelRedundancy { .. } | SetupError::ArrayLayout(_)
                ),
                "{r}: {e}"
            );
        }
        assert!(Raid5fModel::new(&cfg(3, "3+1")).is_err());
    }
}
