//! `opencas-model`: a model of a set-associative write-back cache in front of the QLC
//! drive, in the style of Open CAS (ocf), as CSAL's authors configured it (seed 000 §3:
//! an Optane P5800X caching a P5316, LRU, 64 KiB cache lines to match the drive's IU).
//!
//! What it does, following ocf's write-back engine and cleaner:
//! - The cache is `line_count` lines of 64 KiB in sets of `ways` lines; a core line
//!   (64 KiB of a volume) maps to one set by a hash and may sit in any way of it.
//! - Each line keeps a valid and a dirty bit per 4 KiB sector (ocf keeps them per
//!   512-byte sector; the workloads here never write less than 4 KiB). A write into a
//!   line that is not cached takes a way and writes only the written sectors to the
//!   cache: no read-fill (ocf's write-back engine does not fill either).
//! - A write hit overwrites the sectors in the cache and marks them dirty.
//! - A line is written back only when it is evicted (least recently used way of its
//!   set). Write-back reads the whole line from the cache and writes each contiguous
//!   run of dirty sectors to the QLC as one request, as ocf's cleaner does
//!   (`_ocf_cleaner_core_submit_io`: one core write per dirty range, the full line when
//!   all sectors are dirty). So a line holding one dirty 4 KiB sector costs the QLC a
//!   4 KiB write, which its 64 KiB IU turns into a read-modify-write.
//! - A read served wholly from valid sectors is a cache read. Otherwise the missing
//!   sectors are read from the QLC; a read miss inserts the line (ocf's default
//!   promotion policy, "always") and writes the data read into the cache as clean.
//! - Trim invalidates the covered sectors and is passed to the QLC.
//!
//! Left out: ocf's background cleaner (ALRU) only runs after 10 s without I/O, which a
//! benchmark never gives it, so dirty data leaves the cache only by eviction here;
//! metadata updates and flushes of the cache's own metadata; the per-request locking
//! and queueing; sequential cut-off (off by default for write-back). ocf itself is
//! fully associative (hash buckets over one LRU); the model uses sets so that the
//! lookup is bounded, with enough ways that LRU order within a set is close to global
//! LRU (docs/benchmarks.md).

use shale_device::{BlockDevice, NullDevice};
use shale_flashsim::{FlashSim, StatsHandle};
use shale_workload::{IoKind, IoOp};

use crate::config::SetupError;
use crate::raw::{partition_bytes, PARTITION_ALIGN_BYTES};
use crate::system::{DeviceReport, DeviceRole, RunError, SystemUnderTest, Traffic};

/// Cache line size: the P5316's indirection unit, as the seeds configured it.
pub const OPENCAS_LINE_BYTES: u64 = 64 << 10;
/// Sector granularity of the valid/dirty bits.
const SECTOR_BYTES: u64 = 4096;
const SECTORS_PER_LINE: u32 = (OPENCAS_LINE_BYTES / SECTOR_BYTES) as u32;
/// Ways per set.
pub const OPENCAS_WAYS: u32 = 16;
/// Logical block size of the simulated devices.
const DEVICE_SECTOR_BYTES: u32 = 4096;
/// No core line.
const NO_LINE: u64 = u64::MAX;

/// How the model is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenCasConfig {
    /// Preset of the core (capacity) drive.
    pub core_preset: String,
    /// Preset of the cache drive.
    pub cache_preset: String,
    /// Logical capacity of the core drive.
    pub capacity_bytes: u64,
    /// Cache size as a percentage of the core drive's capacity.
    pub cache_pct: u8,
    pub tenants: u32,
    /// Percentage of the core drive left unpartitioned (as for `raw`).
    pub host_spare_pct: u8,
    pub ways: u32,
}

impl OpenCasConfig {
    /// The seeds' setup: 5% Optane cache over the P5316, 8-way sets.
    pub fn standard(capacity_bytes: u64, tenants: u32) -> OpenCasConfig {
        OpenCasConfig {
            core_preset: "qlc-p5316".into(),
            cache_preset: "optane".into(),
            capacity_bytes,
            cache_pct: 5,
            tenants,
            host_spare_pct: crate::raw::DEFAULT_HOST_SPARE_PCT,
            ways: OPENCAS_WAYS,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Line {
    /// Global core line number, or `NO_LINE`.
    core_line: u64,
    valid: u16,
    dirty: u16,
    /// LRU stamp: larger is more recent.
    used: u64,
}

/// Byte counts of the cache's own traffic.
#[derive(Debug, Default, Clone, Copy)]
struct CasCounters {
    /// Dirty data written back to the core drive.
    flush_bytes: u64,
    /// Data read from the core drive into the cache on read misses.
    fill_bytes: u64,
    write_hits: u64,
    write_misses: u64,
    evictions: u64,
}

/// The Open-CAS-style model.
#[derive(Debug)]
pub struct OpenCasModel {
    core: FlashSim<NullDevice>,
    cache: FlashSim<NullDevice>,
    core_stats: StatsHandle,
    cache_stats: StatsHandle,
    core_preset: String,
    cache_preset: String,
    lines: Vec<Line>,
    sets: u32,
    ways: u32,
    clock: u64,
    tenants: u32,
    volume_bytes: u64,
    counters: CasCounters,
    buf: Vec<u8>,
}

/// Sector mask of `[first, last]` (inclusive) sector indexes within a line.
fn mask(first: u32, last: u32) -> u16 {
    debug_assert!(first <= last && last < SECTORS_PER_LINE);
    let width = last - first + 1;
    let ones: u32 = if width >= 16 {
        0xffff
    } else {
        (1u32 << width) - 1
    };
    (ones << first) as u16
}

/// Contiguous runs of set bits in `m`: `(first sector, count)`.
fn runs(m: u16) -> impl Iterator<Item = (u32, u32)> {
    let mut rest = u32::from(m);
    std::iter::from_fn(move || {
        if rest == 0 {
            return None;
        }
        let first = rest.trailing_zeros();
        let count = (rest >> first).trailing_ones();
        let bits = if count >= 32 {
            u32::MAX
        } else {
            ((1u32 << count) - 1) << first
        };
        rest &= !bits;
        Some((first, count))
    })
}

/// A 64-bit mix so neighbouring core lines land in different sets.
fn set_hash(core_line: u64) -> u64 {
    let mut x = core_line.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl OpenCasModel {
    pub fn new(cfg: &OpenCasConfig) -> Result<OpenCasModel, SetupError> {
        let tenants = cfg.tenants.max(1);
        let volume_bytes = partition_bytes(
            cfg.capacity_bytes,
            cfg.host_spare_pct,
            tenants,
            PARTITION_ALIGN_BYTES,
        )?;
        let core_preset = shale_flashsim::preset(&cfg.core_preset)?;
        let cache_preset = shale_flashsim::preset(&cfg.cache_preset)?;
        let ways = cfg.ways.max(1);
        let cache_bytes = cfg.capacity_bytes / 100 * u64::from(cfg.cache_pct);
        let sets = u32::try_from(cache_bytes / OPENCAS_LINE_BYTES / u64::from(ways))
            .unwrap_or(u32::MAX)
            .max(1);
        let line_count = u64::from(sets) * u64::from(ways);
        let core = FlashSim::from_preset(
            NullDevice::new(cfg.capacity_bytes, DEVICE_SECTOR_BYTES)?,
            &core_preset,
        )?;
        let cache = FlashSim::from_preset(
            NullDevice::new(line_count * OPENCAS_LINE_BYTES, DEVICE_SECTOR_BYTES)?,
            &cache_preset,
        )?;
        Ok(OpenCasModel {
            core_stats: core.stats_handle(),
            cache_stats: cache.stats_handle(),
            core,
            cache,
            core_preset: core_preset.name.to_string(),
            cache_preset: cache_preset.name.to_string(),
            lines: vec![
                Line {
                    core_line: NO_LINE,
                    valid: 0,
                    dirty: 0,
                    used: 0,
                };
                usize::try_from(line_count).unwrap_or(usize::MAX)
            ],
            sets,
            ways,
            clock: 0,
            tenants,
            volume_bytes,
            counters: CasCounters::default(),
            buf: vec![0; OPENCAS_LINE_BYTES as usize],
        })
    }

    /// Lines in the cache.
    pub fn line_count(&self) -> usize {
        self.lines.len()
    }

    /// Number of dirty sectors held.
    pub fn dirty_sectors(&self) -> u64 {
        self.lines
            .iter()
            .map(|l| u64::from(l.dirty.count_ones()))
            .sum()
    }

    fn set_of(&self, core_line: u64) -> usize {
        (set_hash(core_line) % u64::from(self.sets)) as usize
    }

    fn lookup(&self, core_line: u64) -> Option<usize> {
        let base = self.set_of(core_line) * self.ways as usize;
        (base..base + self.ways as usize).find(|&i| self.lines[i].core_line == core_line)
    }

    fn touch(&mut self, slot: usize) {
        self.clock += 1;
        self.lines[slot].used = self.clock;
    }

    fn cache_offset(slot: usize, sector: u32) -> u64 {
        slot as u64 * OPENCAS_LINE_BYTES + u64::from(sector) * SECTOR_BYTES
    }

    /// Writes back the dirty sectors of `slot`: one cache read of the line, one core
    /// write per dirty run.
    fn clean(&mut self, slot: usize) -> Result<(), shale_device::DeviceError> {
        let line = self.lines[slot];
        if line.dirty == 0 {
            return Ok(());
        }
        self.cache.read_at(
            Self::cache_offset(slot, 0),
            &mut self.buf[..OPENCAS_LINE_BYTES as usize],
        )?;
        for (first, count) in runs(line.dirty) {
            let len = u64::from(count) * SECTOR_BYTES;
            let at = line.core_line * OPENCAS_LINE_BYTES + u64::from(first) * SECTOR_BYTES;
            self.core.write_at(at, &self.buf[..len as usize])?;
            self.counters.flush_bytes += len;
        }
        self.lines[slot].dirty = 0;
        Ok(())
    }

    /// A way for `core_line`: an empty one, else the set's least recently used one
    /// after writing it back.
    fn allocate(&mut self, core_line: u64) -> Result<usize, shale_device::DeviceError> {
        let base = self.set_of(core_line) * self.ways as usize;
        let ways = base..base + self.ways as usize;
        let victim = match ways.clone().find(|&i| self.lines[i].core_line == NO_LINE) {
            Some(i) => i,
            None => {
                let i = ways.min_by_key(|&i| self.lines[i].used).unwrap_or(base);
                self.clean(i)?;
                self.counters.evictions += 1;
                i
            }
        };
        self.lines[victim] = Line {
            core_line,
            valid: 0,
            dirty: 0,
            used: 0,
        };
        Ok(victim)
    }

    fn write_line(
        &mut self,
        core_line: u64,
        first: u32,
        last: u32,
    ) -> Result<(), shale_device::DeviceError> {
        let m = mask(first, last);
        let slot = match self.lookup(core_line) {
            Some(s) => {
                self.counters.write_hits += 1;
                s
            }
            None => {
                self.counters.write_misses += 1;
                self.allocate(core_line)?
            }
        };
        let len = u64::from(last - first + 1) * SECTOR_BYTES;
        self.cache
            .write_at(Self::cache_offset(slot, first), &self.buf[..len as usize])?;
        let l = &mut self.lines[slot];
        l.valid |= m;
        l.dirty |= m;
        self.touch(slot);
        Ok(())
    }

    fn read_line(
        &mut self,
        core_line: u64,
        first: u32,
        last: u32,
    ) -> Result<(), shale_device::DeviceError> {
        let m = mask(first, last);
        let core_at =
            |sector: u32| core_line * OPENCAS_LINE_BYTES + u64::from(sector) * SECTOR_BYTES;
        match self.lookup(core_line) {
            Some(slot) => {
                let valid = self.lines[slot].valid;
                for (f, n) in runs(m & valid) {
                    let len = (u64::from(n) * SECTOR_BYTES) as usize;
                    self.cache
                        .read_at(Self::cache_offset(slot, f), &mut self.buf[..len])?;
                }
                for (f, n) in runs(m & !valid) {
                    let len = (u64::from(n) * SECTOR_BYTES) as usize;
                    self.core.read_at(core_at(f), &mut self.buf[..len])?;
                }
                self.touch(slot);
            }
            None => {
                let len = (u64::from(last - first + 1) * SECTOR_BYTES) as usize;
                self.core.read_at(core_at(first), &mut self.buf[..len])?;
                let slot = self.allocate(core_line)?;
                self.cache
                    .write_at(Self::cache_offset(slot, first), &self.buf[..len])?;
                self.counters.fill_bytes += len as u64;
                self.lines[slot].valid = m;
                self.touch(slot);
            }
        }
        Ok(())
    }

    fn trim_line(
        &mut self,
        core_line: u64,
        first: u32,
        last: u32,
    ) -> Result<(), shale_device::DeviceError> {
        if let Some(slot) = self.lookup(core_line) {
            let m = mask(first, last);
            let l = &mut self.lines[slot];
            l.valid &= !m;
            l.dirty &= !m;
            if l.valid == 0 {
                l.core_line = NO_LINE;
            }
        }
        Ok(())
    }
}

impl SystemUnderTest for OpenCasModel {
    fn name(&self) -> &str {
        "opencas-model"
    }

    fn volume_count(&self) -> u32 {
        self.tenants
    }

    fn volume_bytes(&self) -> u64 {
        self.volume_bytes
    }

    fn sector_bytes(&self) -> u64 {
        SECTOR_BYTES
    }

    fn submit(&mut self, op: &IoOp) -> Result<(), RunError> {
        if op.tenant >= self.tenants {
            return Err(RunError::NoSuchVolume {
                tenant: op.tenant,
                volumes: self.tenants,
            });
        }
        let device_err = |source| RunError::Device {
            tenant: op.tenant,
            kind: op.kind,
            offset: op.offset,
            len: op.len,
            source,
        };
        let in_volume = op
            .offset
            .checked_add(op.len)
            .is_some_and(|end| end <= self.volume_bytes);
        if !in_volume
            || !op.offset.is_multiple_of(SECTOR_BYTES)
            || !op.len.is_multiple_of(SECTOR_BYTES)
        {
            return Err(RunError::BadRange {
                tenant: op.tenant,
                kind: op.kind,
                offset: op.offset,
                len: op.len,
                volume_bytes: self.volume_bytes,
                sector_bytes: SECTOR_BYTES,
            });
        }
        if op.len == 0 {
            return Ok(());
        }
        let start = u64::from(op.tenant) * self.volume_bytes + op.offset;
        let end = start + op.len;
        if op.kind == IoKind::Trim {
            self.core.discard(start, op.len).map_err(device_err)?;
        }
        let mut at = start;
        while at < end {
            let core_line = at / OPENCAS_LINE_BYTES;
            let line_end = ((core_line + 1) * OPENCAS_LINE_BYTES).min(end);
            let first = ((at % OPENCAS_LINE_BYTES) / SECTOR_BYTES) as u32;
            let last = ((line_end - 1) % OPENCAS_LINE_BYTES / SECTOR_BYTES) as u32;
            match op.kind {
                IoKind::Write => self.write_line(core_line, first, last),
                IoKind::Read => self.read_line(core_line, first, last),
                IoKind::Trim => self.trim_line(core_line, first, last),
            }
            .map_err(device_err)?;
            at = line_end;
        }
        Ok(())
    }

    fn drain(&mut self) -> Result<(), RunError> {
        Ok(())
    }

    fn reset_counters(&mut self) {
        self.core_stats.reset();
        self.cache_stats.reset();
        self.counters = CasCounters::default();
    }

    fn devices(&self) -> Vec<DeviceReport> {
        vec![
            DeviceReport {
                role: DeviceRole::Capacity,
                preset: self.core_preset.clone(),
                stats: self.core_stats.stats(),
            },
            DeviceReport {
                role: DeviceRole::Cache,
                preset: self.cache_preset.clone(),
                stats: self.cache_stats.stats(),
            },
        ]
    }

    fn traffic(&self) -> Vec<Traffic> {
        vec![
            Traffic {
                name: "flush",
                bytes: self.counters.flush_bytes,
            },
            Traffic {
                name: "fill",
                bytes: self.counters.fill_bytes,
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(capacity_bytes: u64) -> OpenCasModel {
        OpenCasModel::new(&OpenCasConfig::standard(capacity_bytes, 2)).expect("model")
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

    #[test]
    fn masks_and_runs() {
        assert_eq!(mask(0, 15), 0xffff);
        assert_eq!(mask(3, 3), 1 << 3);
        assert_eq!(mask(2, 4), 0b11100);
        let r: Vec<_> = runs(0b1110_0000_0000_0110).collect();
        assert_eq!(r, vec![(1, 2), (13, 3)]);
        assert_eq!(runs(0xffff).collect::<Vec<_>>(), vec![(0, 16)]);
        assert_eq!(runs(0).count(), 0);
    }

    #[test]
    fn cache_is_five_percent_in_sets_of_ways() {
        let m = model(512 << 20);
        // 25.6 MiB of 64 KiB lines in 16-way sets: 409 lines -> 25 sets of 16.
        assert_eq!(m.line_count(), 25 * 16);
    }

    #[test]
    fn writes_stay_in_the_cache_until_evicted() {
        let mut m = model(64 << 20);
        m.submit(&op(0, IoKind::Write, 0, 4096)).expect("write");
        m.submit(&op(0, IoKind::Write, 0, 4096)).expect("overwrite");
        let d = m.devices();
        assert_eq!(d[0].stats.host_bytes_written, 0, "nothing reached the QLC");
        assert_eq!(d[1].stats.host_bytes_written, 8192);
        assert_eq!(m.dirty_sectors(), 1);
        // A read of the cached sector is a cache read; of its neighbour a core read
        // (the line is present but that sector is not valid).
        m.submit(&op(0, IoKind::Read, 0, 4096)).expect("read hit");
        m.submit(&op(0, IoKind::Read, 4096, 4096))
            .expect("read partial");
        let d = m.devices();
        assert_eq!(d[1].stats.host_bytes_read, 4096);
        assert_eq!(d[0].stats.host_bytes_read, 4096);
    }

    #[test]
    fn eviction_writes_back_only_dirty_runs() {
        let mut m = model(64 << 20);
        let lines = m.line_count() as u64;
        let vol = m.volume_bytes();
        // Two separate dirty runs in one line, then enough other lines to evict it.
        m.submit(&op(0, IoKind::Write, 0, 8192)).expect("write");
        m.submit(&op(0, IoKind::Write, 32768, 4096)).expect("write");
        let mut offset = OPENCAS_LINE_BYTES;
        let mut written = 0;
        while m.lookup(0).is_some() {
            assert!(
                offset + OPENCAS_LINE_BYTES <= 2 * vol,
                "line 0 never evicted"
            );
            let (t, o) = if offset < vol {
                (0, offset)
            } else {
                (1, offset - vol)
            };
            m.submit(&op(t, IoKind::Write, o, OPENCAS_LINE_BYTES))
                .expect("fill");
            offset += OPENCAS_LINE_BYTES;
            written += 1;
        }
        assert!(written >= lines / 16, "{written}");
        let core = m.devices()[0].stats;
        // Line 0 went back as two writes: 8 KiB and 4 KiB; every other eviction so
        // far is a full line.
        assert_eq!(core.host_bytes_written % OPENCAS_LINE_BYTES, 12288);
        assert_eq!(m.traffic()[0].bytes, core.host_bytes_written);
    }

    #[test]
    fn read_misses_fill_the_cache_clean() {
        let mut m = model(64 << 20);
        m.submit(&op(1, IoKind::Read, 65536, 65536)).expect("read");
        let d = m.devices();
        assert_eq!(d[0].stats.host_bytes_read, 65536);
        assert_eq!(d[1].stats.host_bytes_written, 65536);
        assert_eq!(m.dirty_sectors(), 0);
        m.submit(&op(1, IoKind::Read, 65536, 65536))
            .expect("read hit");
        assert_eq!(m.devices()[1].stats.host_bytes_read, 65536);
    }

    #[test]
    fn bad_requests_are_errors() {
        let mut m = model(64 << 20);
        let vol = m.volume_bytes();
        assert!(matches!(
            m.submit(&op(2, IoKind::Write, 0, 4096)),
            Err(RunError::NoSuchVolume { .. })
        ));
        assert!(m.submit(&op(0, IoKind::Write, vol, 4096)).is_err());
        assert!(m.submit(&op(0, IoKind::Write, 512, 4096)).is_err());
    }
}
