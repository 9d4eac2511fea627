//! The shared core: what every role of the engine reads or changes. The devices, the
//! clock and configuration, the geometry and region table, the L2P, the journal, the md
//! cache, I/O buffers, the table of device I/O in flight, and the counters. Roles own
//! their private state and take the core as an argument; only the event loop
//! (`engine.rs`) holds both.

use shale_device::{BlockDevice, ZonedDevice};
use shale_format::{Lba, Pba, Superblock, VolumeId};

use crate::buffers::BufPool;
use crate::engine::InflightIo;
use crate::journal::Journal;
use crate::l2p::L2p;
use crate::layout::Geometry;
use crate::layout::BS;
use crate::read::md_cache::MdCache;
use crate::space::Regions;
use crate::volume::Volumes;
use crate::{Clock, Config, EngineError, Stats, VolumeStats};

#[derive(Debug)]
pub(crate) struct Core<C: BlockDevice, Z: ZonedDevice, K: Clock> {
    pub cache: C,
    pub capacity: Z,
    pub clock: K,
    pub config: Config,
    pub sb: Superblock,
    pub geo: Geometry,
    pub regions: Regions,
    pub l2p: L2p,
    pub volumes: Volumes,
    pub md_cache: MdCache,
    pub journal: Journal,
    /// The next SID handed out.
    pub sid_next: u64,
    pub stats: Stats,
    /// Device I/O in flight, keyed by tag.
    pub io: IoSlab,
    pub bufs: BufPool,
    /// Placement streams in use.
    pub streams: u32,
    pub placement: crate::placement::Placement,
    /// Zone writes since the capacity device's last flush.
    pub capacity_dirty: bool,
    /// What the open (and recovery) did.
    pub open_report: crate::recovery::OpenReport,
    /// When the devices next want a poll for their own work (ns; see
    /// `BlockDevice::maintain`).
    pub device_wake_ns: u64,
    /// Capacity blocks rebuilt from redundancy after failing their checksum, to be
    /// written anew by compaction (the event loop hands them over).
    pub repairs: Vec<(shale_format::Pba, Box<[u8; crate::layout::BS as usize]>)>,
    /// The validity bits' rebuild after a clean open, while it runs (`census.rs`).
    pub census: Option<crate::census::Census>,
    /// Direct writes in progress (`write/direct.rs`).
    pub directs: crate::write::direct::Directs,
    /// Heat of the cold tier's extents and the blocks going back (`tier.rs`).
    pub tier: crate::tier::Tier,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Core<C, Z, K> {
    pub fn now(&self) -> u64 {
        self.clock.now_ns()
    }

    /// Makes the cache shares and the streams' GC policies follow the volume table
    /// (at open and after every volume change).
    pub fn apply_volume_policies(&mut self) {
        let entries = &self.volumes.table.entries;
        self.regions.shares.clear_shares();
        for e in entries {
            self.regions
                .shares
                .set_share(e.id, e.limits.cache_share_pct);
        }
        let policies: Vec<_> = entries.iter().map(|e| (e.id, e.limits.gc)).collect();
        self.placement.set_gc_policies(&policies, self.streams);
    }

    pub fn next_sid(&mut self) -> shale_format::Sid {
        let s = shale_format::Sid(self.sid_next);
        self.sid_next += 1;
        s
    }

    /// The counters of the volume in `slot`, started afresh when a new volume (uid)
    /// holds it.
    pub fn volume_counters(&mut self, slot: shale_format::VolumeId) -> &mut VolumeStats {
        let uid = self.volumes.get(slot).map(|v| v.uid).unwrap_or_default();
        let i = slot.0 as usize;
        if self.stats.volumes.len() <= i {
            self.stats.volumes.resize(i + 1, VolumeStats::default());
        }
        let c = &mut self.stats.volumes[i];
        if c.uid != uid {
            *c = VolumeStats {
                id: slot,
                uid,
                ..VolumeStats::default()
            };
        }
        c
    }

    /// Where block `lba` of `volume` is (`Pba::NONE`: unmapped). The L2P entry is the
    /// block's, or its mapping unit's first block, which the unit's other blocks
    /// follow in the region's data slots.
    pub fn lookup(&mut self, volume: VolumeId, lba: Lba) -> Result<Pba, EngineError> {
        if let Some(pba) = self.fine_lookup(volume, lba)? {
            return Ok(pba);
        }
        self.coarse_lookup(volume, lba)
    }

    /// A dual volume's sparse-map entry for block `lba`, if it has one (its pages
    /// never written are skipped without a fault).
    pub fn fine_lookup(&mut self, volume: VolumeId, lba: Lba) -> Result<Option<Pba>, EngineError> {
        if !self.volumes.is_dual(volume) {
            return Ok(None);
        }
        let fine = self.volumes.fine_map(volume);
        let page = (lba.0 / self.l2p.format().entries_per_page()) as usize;
        if self.l2p.page_is_empty(fine, page) {
            return Ok(None);
        }
        Ok(self
            .l2p
            .get(&mut self.cache, fine, lba)?
            .filter(|p| !p.is_none()))
    }

    /// Where the unit (or block) map puts block `lba`, overrides aside.
    pub fn coarse_lookup(&mut self, volume: VolumeId, lba: Lba) -> Result<Pba, EngineError> {
        let shift = self.volumes.shift(volume);
        let entry = self
            .l2p
            .get(&mut self.cache, volume, Lba(lba.0 >> shift))?
            .unwrap_or(Pba::NONE);
        let j = lba.0 & ((1u64 << shift) - 1);
        if entry.is_none() || j == 0 {
            return Ok(entry);
        }
        Ok(self.unit_block(entry, j))
    }

    /// Block `j` of the mapping unit whose first block is at `base`.
    pub fn unit_block(&self, base: Pba, j: u64) -> Pba {
        match self.geo.data_advance(base, j) {
            Some(p) => p,
            None => panic!("a mapping unit at {base} runs past its region (block {j})"),
        }
    }

    /// Checks range and size limits of a data request to a live volume (resolved from
    /// its uid).
    pub fn validate_range(
        &self,
        volume: VolumeId,
        offset: u64,
        len: u64,
        data: bool,
    ) -> Result<(), EngineError> {
        let Some(entries) = self.l2p.volume_size(volume) else {
            panic!("{volume}: a resolved volume has no L2P");
        };
        let size_blocks = entries << self.volumes.shift(volume);
        if len == 0 {
            return Err(EngineError::ZeroLength { volume, offset });
        }
        let size_bytes = size_blocks * BS;
        if offset.checked_add(len).is_none_or(|end| end > size_bytes) {
            return Err(EngineError::OutOfRange {
                volume,
                offset,
                len,
                size_bytes,
            });
        }
        if data && len > self.config.request_bytes_max {
            return Err(EngineError::TooLarge {
                volume,
                len,
                max: self.config.request_bytes_max,
            });
        }
        Ok(())
    }
}

/// The device I/O in flight: one entry per I/O, keyed by its tag.
#[derive(Debug, Default)]
pub(crate) struct IoSlab {
    items: Vec<Option<InflightIo>>,
    free: Vec<u32>,
    pub count: usize,
}

impl IoSlab {
    pub fn insert(&mut self, io: InflightIo) -> u64 {
        self.count += 1;
        match self.free.pop() {
            Some(i) => {
                self.items[i as usize] = Some(io);
                u64::from(i)
            }
            None => {
                self.items.push(Some(io));
                (self.items.len() - 1) as u64
            }
        }
    }

    pub fn take(&mut self, tag: u64) -> Option<InflightIo> {
        let io = self.items.get_mut(usize::try_from(tag).ok()?)?.take();
        if io.is_some() {
            self.count -= 1;
            self.free.push(tag as u32);
        }
        io
    }
}
