//! `dmzoned-model`: a model of zone-granular remapping with random-zone buffering, in
//! the style of Linux dm-zoned (drivers/md/dm-zoned-{target,metadata,reclaim}.c), as
//! CSAL's authors set it up (seed 000 §3: random zones on the Optane, sequential zones
//! on the ZNS drive).
//!
//! The logical space is cut into chunks of one zone. A chunk is mapped to one data
//! zone, and a chunk mapped to a sequential zone may have one buffer zone (a random
//! zone). Every zone keeps a validity bitmap of 4 KiB blocks. As dm-zoned does:
//! - A write to an unmapped chunk maps it to a free random zone and writes in place.
//! - A write to a chunk mapped to a random zone writes in place.
//! - A write to a chunk mapped to a sequential zone goes straight to the zone if it
//!   starts at the zone's write pointer; otherwise it is written in place into the
//!   chunk's buffer zone (allocated on first use), and the blocks it covers become
//!   invalid in the sequential zone.
//! - Reclaim runs while 30% or fewer random zones are unmapped
//!   (`DMZ_RECLAIM_LOW_UNMAP_RND`), on the least recently used mapped random zone
//!   (`map_rnd_list`), by its chunk:
//!   - a random data zone: its valid blocks are copied to a free sequential zone,
//!     holes up to each copied run zero-filled (`dmz_reclaim_align_wp`), and the chunk
//!     remapped there (`dmz_reclaim_rnd_data`; "RC-1" in the seed's Figure 16);
//!   - a sequential zone whose buffer's valid blocks all lie past its write pointer:
//!     the buffer is appended to the zone (`dmz_reclaim_buf`, also RC-1);
//!   - otherwise the sequential zone's valid blocks are copied into the buffer zone
//!     in place, the sequential zone is reset and the chunk remapped to the buffer
//!     (`dmz_reclaim_seq_data`, "RC-2": sequential to random).
//! - Reads take each block from the buffer zone if valid there, else from the data
//!   zone; unmapped blocks read as zeros without I/O.
//!
//! Choices: random zones live on the cache drive (the `optane` preset), 5% of the
//! capacity as for Shale, with the zone size of the sequential zones; sequential zones
//! are the `zns-qlc` preset's zones (4 MiB, as Shale's). Volumes are partitions of the
//! chunk space aligned to chunks, over 90% of the sequential zones (the host spare of
//! the other baselines); the remaining sequential zones are what reclaim allocates
//! from. Left out: dm-zoned's metadata zones (mapping table and bitmaps written on
//! flush), its idle-time reclaim and reclaim throttling, and the block-device layer's
//! overhead; reclaim runs synchronously between user writes, so it never delays them
//! in the model except through the devices' busy time.

use shale_device::{BlockDevice, NullDevice, ZoneAction, ZoneEmu, ZonedDevice};
use shale_flashsim::{FlashSim, StatsHandle, ZnsSim};
use shale_workload::{IoKind, IoOp};

use crate::config::SetupError;
use crate::system::{DeviceReport, DeviceRole, RunError, SystemUnderTest, Traffic};

const BLOCK_BYTES: u64 = 4096;
/// Reclaim starts when unmapped random zones fall to this percentage.
const RECLAIM_LOW_UNMAP_RND_PCT: u64 = 30;
/// Zones of the model's ZNS drive per capacity: 4 MiB zones (Shale's) in `paper`.
pub const DMZONED_ZONES_PER_CAPACITY: u64 = 1024;
/// Smallest zone the model uses.
const ZONE_BYTES_MIN: u64 = 64 << 10;

/// How the model is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmZonedConfig {
    /// Logical capacity of the ZNS drive.
    pub capacity_bytes: u64,
    pub zone_bytes: u64,
    /// Random zones on the cache drive, as a percentage of the capacity.
    pub cache_pct: u8,
    pub tenants: u32,
    /// Percentage of the sequential zones left out of the volumes.
    pub host_spare_pct: u8,
}

impl DmZonedConfig {
    pub fn standard(capacity_bytes: u64, tenants: u32) -> DmZonedConfig {
        DmZonedConfig {
            capacity_bytes,
            zone_bytes: zone_bytes_for(capacity_bytes),
            cache_pct: 5,
            tenants,
            host_spare_pct: crate::raw::DEFAULT_HOST_SPARE_PCT,
        }
    }
}

/// The zone size for a capacity: 1/1024 of it (4 MiB for `paper`) rounded down to a
/// power of two, so `quick` has the same number of zones, and as many random zones,
/// as `paper`.
pub fn zone_bytes_for(capacity_bytes: u64) -> u64 {
    let z = (capacity_bytes / DMZONED_ZONES_PER_CAPACITY).max(ZONE_BYTES_MIN);
    1u64 << (63 - z.leading_zeros())
}

#[derive(Debug, Clone)]
struct Zone {
    /// Random (on the cache drive) or sequential (a zone of the ZNS drive).
    random: bool,
    /// Index on its device.
    index: u32,
    valid: Vec<u64>,
    weight: u32,
    /// Write pointer in blocks (sequential zones).
    wp: u32,
    /// Chunk this zone holds data of (as data or buffer zone).
    chunk: Option<u32>,
    is_buffer: bool,
    /// LRU stamp of random zones in use.
    used: u64,
}

impl Zone {
    fn is_valid(&self, b: u32) -> bool {
        self.valid[(b / 64) as usize] >> (b % 64) & 1 == 1
    }

    /// Marks blocks `first..first + count` valid or invalid, keeping the weight.
    fn set_range(&mut self, first: u32, count: u32, v: bool) {
        let (mut b, end) = (first, first + count);
        while b < end {
            let bit = b % 64;
            let n = (64 - bit).min(end - b);
            let m = if n == 64 {
                u64::MAX
            } else {
                ((1u64 << n) - 1) << bit
            };
            let w = &mut self.valid[(b / 64) as usize];
            let before = w.count_ones();
            if v {
                *w |= m;
            } else {
                *w &= !m;
            }
            self.weight = self.weight + w.count_ones() - before;
            b += n;
        }
    }

    fn clear(&mut self) {
        self.valid.iter_mut().for_each(|w| *w = 0);
        self.weight = 0;
        self.wp = 0;
        self.chunk = None;
        self.is_buffer = false;
    }

    /// Runs of valid blocks `(first, count)` below `end`.
    fn valid_runs(&self, end: u32) -> Vec<(u32, u32)> {
        let mut out: Vec<(u32, u32)> = Vec::new();
        for (i, &word) in self.valid.iter().enumerate() {
            let base = i as u32 * 64;
            if base >= end {
                break;
            }
            let mut w = if end - base < 64 {
                word & ((1u64 << (end - base)) - 1)
            } else {
                word
            };
            while w != 0 {
                let first = w.trailing_zeros();
                let count = (w >> first).trailing_ones();
                let start = base + first;
                match out.last_mut() {
                    Some(last) if last.0 + last.1 == start => last.1 += count,
                    _ => out.push((start, count)),
                }
                w = if first + count >= 64 {
                    0
                } else {
                    w & !(((1u64 << count) - 1) << first)
                };
            }
        }
        out
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct DmzCounters {
    /// Bytes written by reclaim into sequential zones (random to sequential).
    rc1_bytes: u64,
    /// Bytes written by reclaim into random zones (sequential to random).
    rc2_bytes: u64,
    /// Of `rc1_bytes`, zeros written to fill holes before a copied run.
    zero_fill_bytes: u64,
    buffered_writes: u64,
    reclaims: u64,
}

/// The dm-zoned-style model.
#[derive(Debug)]
pub struct DmZonedModel {
    cache: FlashSim<NullDevice>,
    zns: ZnsSim<ZoneEmu<NullDevice>>,
    cache_stats: StatsHandle,
    zns_stats: StatsHandle,
    zones: Vec<Zone>,
    random_count: u32,
    /// Data zone of each chunk.
    map: Vec<Option<u32>>,
    /// Buffer zone of each chunk mapped to a sequential zone.
    buffer: Vec<Option<u32>>,
    free_random: Vec<u32>,
    free_seq: std::collections::VecDeque<u32>,
    zone_blocks: u32,
    zone_bytes: u64,
    clock: u64,
    tenants: u32,
    chunks_per_volume: u32,
    counters: DmzCounters,
    zeros: Vec<u8>,
}

fn zone_err(step: &'static str, zone: u32) -> impl FnOnce(shale_device::ZoneError) -> RunError {
    move |source| RunError::Zone { step, zone, source }
}

fn cache_err(step: &'static str) -> impl FnOnce(shale_device::DeviceError) -> RunError {
    move |e| RunError::Model {
        step,
        reason: e.to_string(),
    }
}

impl DmZonedModel {
    pub fn new(cfg: &DmZonedConfig) -> Result<DmZonedModel, SetupError> {
        let bad = |reason: String| {
            SetupError::Device(shale_device::DeviceError::InvalidGeometry { reason })
        };
        if cfg.zone_bytes == 0 || !cfg.zone_bytes.is_multiple_of(BLOCK_BYTES) {
            return Err(bad(format!(
                "zone size {} not a multiple of 4 KiB",
                cfg.zone_bytes
            )));
        }
        if cfg.host_spare_pct > 90 {
            return Err(SetupError::HostSpareOutOfRange {
                pct: cfg.host_spare_pct,
            });
        }
        let seq_count = u32::try_from(cfg.capacity_bytes / cfg.zone_bytes)
            .map_err(|_| bad("too many zones".into()))?;
        let random_count =
            u32::try_from(cfg.capacity_bytes / 100 * u64::from(cfg.cache_pct) / cfg.zone_bytes)
                .map_err(|_| bad("too many zones".into()))?;
        // Reclaim needs a free random zone to buffer into and one to spare.
        if random_count < 3 || seq_count < 4 {
            return Err(bad(format!(
                "{random_count} random and {seq_count} sequential zones of {} bytes: need 3 and 4",
                cfg.zone_bytes
            )));
        }
        let tenants = cfg.tenants.max(1);
        let usable_chunks = u64::from(seq_count) * u64::from(100 - cfg.host_spare_pct) / 100;
        let chunks_per_volume = u32::try_from(usable_chunks / u64::from(tenants)).unwrap_or(0);
        if chunks_per_volume == 0 {
            return Err(SetupError::VolumesDoNotFit {
                tenants,
                usable_bytes: usable_chunks * cfg.zone_bytes,
                align_bytes: cfg.zone_bytes,
            });
        }
        let zns_preset = shale_flashsim::preset("zns-qlc")?;
        let cache_preset = shale_flashsim::preset("optane")?;
        let emu = crate::zoned_over(
            NullDevice::new(
                crate::zone_emu_inner_bytes(cfg.zone_bytes, seq_count),
                BLOCK_BYTES as u32,
            )?,
            cfg.zone_bytes,
            seq_count,
        )?;
        let zns = ZnsSim::from_preset(emu, &zns_preset)?;
        let cache = FlashSim::from_preset(
            NullDevice::new(u64::from(random_count) * cfg.zone_bytes, BLOCK_BYTES as u32)?,
            &cache_preset,
        )?;
        let zone_blocks = u32::try_from(cfg.zone_bytes / BLOCK_BYTES)
            .map_err(|_| bad("zone too large".into()))?;
        let words = zone_blocks.div_ceil(64) as usize;
        let zone = |random: bool, index: u32| Zone {
            random,
            index,
            valid: vec![0; words],
            weight: 0,
            wp: 0,
            chunk: None,
            is_buffer: false,
            used: 0,
        };
        let mut zones: Vec<Zone> = (0..random_count).map(|i| zone(true, i)).collect();
        zones.extend((0..seq_count).map(|i| zone(false, i)));
        let chunks = (chunks_per_volume * tenants) as usize;
        Ok(DmZonedModel {
            cache_stats: cache.stats_handle(),
            zns_stats: zns.stats_handle(),
            cache,
            zns,
            zones,
            random_count,
            map: vec![None; chunks],
            buffer: vec![None; chunks],
            // Popped from the end: lowest index first.
            free_random: (0..random_count).rev().collect(),
            free_seq: (random_count..random_count + seq_count).collect(),
            zone_blocks,
            zone_bytes: cfg.zone_bytes,
            clock: 0,
            tenants,
            chunks_per_volume,
            counters: DmzCounters::default(),
            zeros: vec![0; cfg.zone_bytes as usize],
        })
    }

    /// Random zones, sequential zones.
    pub fn zone_counts(&self) -> (u32, u32) {
        (
            self.random_count,
            self.zones.len() as u32 - self.random_count,
        )
    }

    fn touch(&mut self, z: u32) {
        self.clock += 1;
        self.zones[z as usize].used = self.clock;
    }

    fn dev_write(&mut self, z: u32, block: u32, blocks: u32) -> Result<(), RunError> {
        let zone = &self.zones[z as usize];
        let len = (u64::from(blocks) * BLOCK_BYTES) as usize;
        let off = u64::from(zone.index) * self.zone_bytes + u64::from(block) * BLOCK_BYTES;
        if zone.random {
            self.cache
                .write_at(off, &self.zeros[..len])
                .map_err(cache_err("random zone write"))
        } else {
            debug_assert_eq!(
                zone.wp, block,
                "sequential zones are written at the pointer"
            );
            let index = zone.index;
            self.zns
                .write_at(off, &self.zeros[..len])
                .map_err(zone_err("sequential zone write", index))?;
            self.zones[z as usize].wp = block + blocks;
            Ok(())
        }
    }

    /// Reads only count: the model never looks at the data it moves.
    fn dev_read(&mut self, z: u32, block: u32, blocks: u32) -> Result<(), RunError> {
        let zone = &self.zones[z as usize];
        let len = u64::from(blocks) * BLOCK_BYTES;
        let off = u64::from(zone.index) * self.zone_bytes + u64::from(block) * BLOCK_BYTES;
        if zone.random {
            self.cache
                .count_read(off, len)
                .map_err(cache_err("random zone read"))
        } else {
            let index = zone.index;
            self.zns
                .count_read(off, len)
                .map_err(zone_err("sequential zone read", index))
        }
    }

    fn free_zone(&mut self, z: u32) -> Result<(), RunError> {
        let random = self.zones[z as usize].random;
        let index = self.zones[z as usize].index;
        self.zones[z as usize].clear();
        if random {
            self.free_random.push(z);
        } else {
            self.zns
                .manage(index, ZoneAction::Reset)
                .map_err(zone_err("sequential zone reset", index))?;
            self.free_seq.push_back(z);
        }
        Ok(())
    }

    fn alloc_random(&mut self, busy_chunk: u32) -> Result<u32, RunError> {
        loop {
            if let Some(z) = self.free_random.pop() {
                return Ok(z);
            }
            if !self.reclaim_one(busy_chunk)? {
                return Err(RunError::Model {
                    step: "random zone allocation",
                    reason: "no random zone free and nothing to reclaim".into(),
                });
            }
        }
    }

    /// Copies the valid blocks of `src` below `end` into sequential zone `dst` at the
    /// same offsets, zero-filling holes before each run. Returns bytes written.
    fn copy_to_seq(&mut self, src: u32, dst: u32, end: u32) -> Result<u64, RunError> {
        let mut written = 0;
        for (first, count) in self.zones[src as usize].valid_runs(end) {
            self.dev_read(src, first, count)?;
            let wp = self.zones[dst as usize].wp;
            if first > wp {
                self.dev_write(dst, wp, first - wp)?;
                let zero = u64::from(first - wp) * BLOCK_BYTES;
                self.counters.zero_fill_bytes += zero;
                written += zero;
            }
            self.dev_write(dst, first, count)?;
            written += u64::from(count) * BLOCK_BYTES;
            self.zones[dst as usize].set_range(first, count, true);
        }
        Ok(written)
    }

    /// Reclaims one zone; false if nothing could be reclaimed.
    fn reclaim_one(&mut self, busy_chunk: u32) -> Result<bool, RunError> {
        // The least recently used random zone in use, by its chunk.
        let victim = (0..self.random_count)
            .filter(|&z| {
                let zone = &self.zones[z as usize];
                zone.chunk.is_some_and(|c| c != busy_chunk)
            })
            .min_by_key(|&z| self.zones[z as usize].used);
        let Some(rz) = victim else {
            return Ok(false);
        };
        self.counters.reclaims += 1;
        let Some(chunk) = self.zones[rz as usize].chunk else {
            return Ok(false);
        };
        let c = chunk as usize;
        let Some(dz) = self.map[c] else {
            return Ok(false);
        };
        if self.zones[dz as usize].random {
            if self.zones[dz as usize].weight == 0 {
                self.map[c] = None;
                self.free_zone(dz)?;
                return Ok(true);
            }
            // dmz_reclaim_rnd_data: random data zone to a new sequential zone.
            let Some(sz) = self.free_seq.pop_front() else {
                return Err(RunError::Model {
                    step: "reclaim",
                    reason: "no free sequential zone".into(),
                });
            };
            let end = self.zone_blocks;
            let w = self.copy_to_seq(dz, sz, end)?;
            self.counters.rc1_bytes += w;
            self.zones[sz as usize].chunk = Some(chunk);
            self.map[c] = Some(sz);
            self.free_zone(dz)?;
            return Ok(true);
        }
        let Some(bz) = self.buffer[c] else {
            return Ok(false);
        };
        let wp = self.zones[dz as usize].wp;
        let first_valid = self.zones[bz as usize]
            .valid_runs(self.zone_blocks)
            .first()
            .map(|r| r.0);
        if first_valid.is_none_or(|f| f >= wp) {
            // dmz_reclaim_buf: append the buffer's blocks to the data zone.
            let end = self.zone_blocks;
            let w = self.copy_to_seq(bz, dz, end)?;
            self.counters.rc1_bytes += w;
            self.buffer[c] = None;
            self.free_zone(bz)?;
        } else {
            // dmz_reclaim_seq_data: the data zone's blocks into the buffer, in place.
            for (first, count) in self.zones[dz as usize].valid_runs(wp) {
                self.dev_read(dz, first, count)?;
                self.dev_write(bz, first, count)?;
                self.counters.rc2_bytes += u64::from(count) * BLOCK_BYTES;
                self.zones[bz as usize].set_range(first, count, true);
            }
            self.buffer[c] = None;
            self.map[c] = Some(bz);
            self.zones[bz as usize].is_buffer = false;
            self.touch(bz);
            self.free_zone(dz)?;
        }
        Ok(true)
    }

    fn reclaim_if_low(&mut self) -> Result<(), RunError> {
        let total = u64::from(self.random_count);
        while (self.free_random.len() as u64) * 100 <= RECLAIM_LOW_UNMAP_RND_PCT * total {
            if !self.reclaim_one(u32::MAX)? {
                break;
            }
        }
        Ok(())
    }

    fn write_chunk(&mut self, chunk: u32, block: u32, blocks: u32) -> Result<(), RunError> {
        let c = chunk as usize;
        let dz = match self.map[c] {
            Some(z) => z,
            None => {
                let z = self.alloc_random(chunk)?;
                self.zones[z as usize].chunk = Some(chunk);
                self.map[c] = Some(z);
                z
            }
        };
        let direct = {
            let zone = &self.zones[dz as usize];
            zone.random || zone.wp == block
        };
        if direct {
            self.dev_write(dz, block, blocks)?;
            self.zones[dz as usize].set_range(block, blocks, true);
            if let Some(bz) = self.buffer[c] {
                self.zones[bz as usize].set_range(block, blocks, false);
            }
            if self.zones[dz as usize].random {
                self.touch(dz);
            }
        } else {
            self.counters.buffered_writes += 1;
            let bz = match self.buffer[c] {
                Some(z) => z,
                None => {
                    let z = self.alloc_random(chunk)?;
                    let zone = &mut self.zones[z as usize];
                    zone.chunk = Some(chunk);
                    zone.is_buffer = true;
                    self.buffer[c] = Some(z);
                    z
                }
            };
            self.dev_write(bz, block, blocks)?;
            self.zones[bz as usize].set_range(block, blocks, true);
            self.zones[dz as usize].set_range(block, blocks, false);
            self.touch(bz);
        }
        Ok(())
    }

    fn read_chunk(&mut self, chunk: u32, block: u32, blocks: u32) -> Result<(), RunError> {
        let c = chunk as usize;
        let Some(dz) = self.map[c] else {
            return Ok(());
        };
        let bz = self.buffer[c];
        // Runs of blocks from one source zone.
        let source = |m: &DmZonedModel, b: u32| -> Option<u32> {
            match bz {
                Some(z) if m.zones[z as usize].is_valid(b) => Some(z),
                _ if m.zones[dz as usize].is_valid(b) => Some(dz),
                _ => None,
            }
        };
        let end = block + blocks;
        let mut b = block;
        while b < end {
            let src = source(self, b);
            let first = b;
            while b < end && source(self, b) == src {
                b += 1;
            }
            if let Some(z) = src {
                self.dev_read(z, first, b - first)?;
            }
        }
        if self.zones[dz as usize].random {
            self.touch(dz);
        }
        Ok(())
    }

    fn trim_chunk(&mut self, chunk: u32, block: u32, blocks: u32) {
        let c = chunk as usize;
        for z in [self.map[c], self.buffer[c]].into_iter().flatten() {
            self.zones[z as usize].set_range(block, blocks, false);
        }
    }
}

impl SystemUnderTest for DmZonedModel {
    fn name(&self) -> &str {
        "dmzoned-model"
    }

    fn volume_count(&self) -> u32 {
        self.tenants
    }

    fn volume_bytes(&self) -> u64 {
        u64::from(self.chunks_per_volume) * self.zone_bytes
    }

    fn sector_bytes(&self) -> u64 {
        BLOCK_BYTES
    }

    fn submit(&mut self, op: &IoOp) -> Result<(), RunError> {
        if op.tenant >= self.tenants {
            return Err(RunError::NoSuchVolume {
                tenant: op.tenant,
                volumes: self.tenants,
            });
        }
        let volume_bytes = self.volume_bytes();
        let in_volume = op
            .offset
            .checked_add(op.len)
            .is_some_and(|end| end <= volume_bytes);
        if !in_volume
            || !op.offset.is_multiple_of(BLOCK_BYTES)
            || !op.len.is_multiple_of(BLOCK_BYTES)
        {
            return Err(RunError::BadRange {
                tenant: op.tenant,
                kind: op.kind,
                offset: op.offset,
                len: op.len,
                volume_bytes,
                sector_bytes: BLOCK_BYTES,
            });
        }
        let zb = u64::from(self.zone_blocks);
        let start = (u64::from(op.tenant) * volume_bytes + op.offset) / BLOCK_BYTES;
        let end = start + op.len / BLOCK_BYTES;
        let mut at = start;
        while at < end {
            let chunk = (at / zb) as u32;
            let block = (at % zb) as u32;
            let blocks = ((chunk as u64 + 1) * zb).min(end) - at;
            let blocks = blocks as u32;
            match op.kind {
                IoKind::Write => {
                    self.write_chunk(chunk, block, blocks)?;
                    self.reclaim_if_low()?;
                }
                IoKind::Read => self.read_chunk(chunk, block, blocks)?,
                IoKind::Trim => self.trim_chunk(chunk, block, blocks),
            }
            at += u64::from(blocks);
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    fn reset_counters(&mut self) {
        self.cache_stats.reset();
        self.zns_stats.reset();
        self.counters = DmzCounters::default();
    }

    fn devices(&self) -> Vec<DeviceReport> {
        vec![
            DeviceReport {
                role: DeviceRole::Capacity,
                preset: "zns-qlc".into(),
                stats: self.zns_stats.stats(),
            },
            DeviceReport {
                role: DeviceRole::Cache,
                preset: "optane".into(),
                stats: self.cache_stats.stats(),
            },
        ]
    }

    fn traffic(&self) -> Vec<Traffic> {
        vec![
            Traffic {
                name: "rc1",
                bytes: self.counters.rc1_bytes,
            },
            Traffic {
                name: "rc2",
                bytes: self.counters.rc2_bytes,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> DmZonedModel {
        // 128 MiB: 32 sequential zones of 4 MiB, and 5% -> 1 random zone is too few;
        // use 1 MiB zones: 128 sequential, 6 random.
        DmZonedModel::new(&DmZonedConfig {
            zone_bytes: 1 << 20,
            ..DmZonedConfig::standard(128 << 20, 4)
        })
        .expect("model")
    }

    fn op(tenant: u32, kind: IoKind, offset: u64, len: u64) -> IoOp {
        IoOp {
            tenant,
            kind,
            offset,
            len,
            not_before_ns: 0,
        }
    }

    /// Every chunk's valid blocks are in exactly one of its zones, zones are mapped
    /// consistently, and free zones are empty.
    fn check(m: &DmZonedModel) {
        let mut owner = vec![None; m.zones.len()];
        for (c, dz) in m.map.iter().enumerate() {
            let Some(dz) = *dz else {
                assert!(m.buffer[c].is_none());
                continue;
            };
            assert_eq!(m.zones[dz as usize].chunk, Some(c as u32));
            assert!(owner[dz as usize].replace(c).is_none());
            if let Some(bz) = m.buffer[c] {
                assert!(m.zones[bz as usize].random && m.zones[bz as usize].is_buffer);
                assert!(!m.zones[dz as usize].random);
                assert!(owner[bz as usize].replace(c).is_none());
                for b in 0..m.zone_blocks {
                    assert!(
                        !(m.zones[bz as usize].is_valid(b) && m.zones[dz as usize].is_valid(b)),
                        "block {b} of chunk {c} valid twice"
                    );
                }
            }
        }
        for &z in m.free_random.iter().chain(m.free_seq.iter()) {
            assert_eq!(m.zones[z as usize].weight, 0);
            assert!(owner[z as usize].is_none());
        }
        let seq_valid_beyond_wp = m
            .zones
            .iter()
            .filter(|z| !z.random)
            .any(|z| (z.wp..m.zone_blocks).any(|b| z.is_valid(b)));
        assert!(!seq_valid_beyond_wp);
    }

    #[test]
    fn bitmap_ranges_and_runs_keep_the_weight() {
        let mut z = Zone {
            random: true,
            index: 0,
            valid: vec![0; 4],
            weight: 0,
            wp: 0,
            chunk: None,
            is_buffer: false,
            used: 0,
        };
        z.set_range(60, 10, true);
        z.set_range(130, 70, true);
        z.set_range(64, 1, false);
        assert_eq!(z.weight, 9 + 70);
        assert_eq!(z.valid_runs(256), vec![(60, 4), (65, 5), (130, 70)]);
        assert_eq!(z.valid_runs(150), vec![(60, 4), (65, 5), (130, 20)]);
        z.set_range(0, 256, true);
        assert_eq!(z.valid_runs(256), vec![(0, 256)]);
        assert_eq!(z.weight, 256);
        assert_eq!(zone_bytes_for(4 << 30), 4 << 20);
        assert_eq!(zone_bytes_for(512 << 20), 512 << 10);
    }

    #[test]
    fn sequential_writes_land_in_random_zones_then_move() {
        let mut m = model();
        let vol = m.volume_bytes();
        for off in (0..vol).step_by(1 << 20) {
            m.submit(&op(0, IoKind::Write, off, 1 << 20))
                .expect("write");
        }
        check(&m);
        let d = m.devices();
        // Everything went through the random zones; all but the last few chunks were
        // moved to sequential zones (RC-1).
        assert_eq!(d[1].stats.host_bytes_written, vol);
        assert!(m.traffic()[0].bytes >= vol / 2, "{:?}", m.traffic());
        assert_eq!(m.traffic()[1].bytes, 0);
    }

    #[test]
    fn random_writes_buffer_and_reclaim_both_ways() {
        let mut m = model();
        let vol = m.volume_bytes();
        for t in 0..4 {
            for off in (0..vol).step_by(1 << 20) {
                m.submit(&op(t, IoKind::Write, off, 1 << 20)).expect("fill");
            }
        }
        m.reset_counters();
        let mut x = 12345u64;
        for _ in 0..4000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let t = (x % 4) as u32;
            let off = (x >> 8) % (vol / 4096) * 4096;
            m.submit(&op(t, IoKind::Write, off, 4096)).expect("write");
            if x.is_multiple_of(7) {
                m.submit(&op(t, IoKind::Read, off, 8192.min(vol - off)))
                    .expect("read");
            }
        }
        check(&m);
        let t = m.traffic();
        assert!(t[0].bytes > 0 && t[1].bytes > 0, "{t:?}");
        // Zone-granular remapping: reclaim moves far more than the users wrote.
        assert!(t[0].bytes + t[1].bytes > 10 * 4000 * 4096, "{t:?}");
    }

    #[test]
    fn reads_come_from_where_the_block_is() {
        let mut m = model();
        m.submit(&op(0, IoKind::Read, 0, 4096))
            .expect("unmapped read");
        assert_eq!(m.devices()[0].stats.host_bytes_read, 0);
        assert_eq!(m.devices()[1].stats.host_bytes_read, 0);
        m.submit(&op(0, IoKind::Write, 0, 8192)).expect("write");
        m.submit(&op(0, IoKind::Read, 0, 16384)).expect("read");
        // Two valid blocks in the random zone; the rest is unmapped.
        assert_eq!(m.devices()[1].stats.host_bytes_read, 8192);
        m.submit(&op(0, IoKind::Trim, 0, 4096)).expect("trim");
        check(&m);
    }

    #[test]
    fn bad_requests_and_setups_are_errors() {
        let mut m = model();
        let vol = m.volume_bytes();
        assert!(matches!(
            m.submit(&op(4, IoKind::Write, 0, 4096)),
            Err(RunError::NoSuchVolume { .. })
        ));
        assert!(matches!(
            m.submit(&op(0, IoKind::Write, vol, 4096)),
            Err(RunError::BadRange { .. })
        ));
        assert!(DmZonedModel::new(&DmZonedConfig {
            zone_bytes: 4 << 20,
            ..DmZonedConfig::standard(64 << 20, 4)
        })
        .is_err());
    }
}
