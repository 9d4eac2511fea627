//! Format and open: laying out fresh devices, and bringing an engine back from its
//! last checkpoint, after a clean shutdown or (with replay) after a crash.
//!
//! Open steps, in order (`recovery/` has the details and docs/recovery.md the why):
//! superblock, capacity label, checkpoint, volume table, journal, L2P directories;
//! then after a clean shutdown: census (validity rebuilt from the L2P and checked
//! against the recorded counts), resume (open regions continue at their next group
//! boundary), superblock rewritten with clean = 0 in both copies; after a crash:
//! replay plan, md scan, resolve, census, regions (replayed regions closed, stray zones
//! reset), checkpoint. Both end with the self-check.

use std::collections::VecDeque;

use shale_device::{BlockDevice, ZoneAction, ZoneState, ZonedDevice};
use shale_format::{
    CapacityGeometry, CapacityLabel, L2pFormat, RegionId, RegionRole, RegionState, Superblock,
    VolumeId, VolumeTable, BLOCK_SIZE,
};

use crate::checkpoint::Checkpointer;
use crate::checkpoint::SID_LEASE;
use crate::core::Core;
use crate::core::IoSlab;
use crate::engine::{Completions, Health};
use crate::flush::Durability;
use crate::journal::Journal;
use crate::l2p::{L2p, VolumeMap};
use crate::layout::{plan, Geometry, Groups, PlanInput, BS};
use crate::mover::Mover;
use crate::prefetch::Prefetch;
use crate::read::md_cache::MdCache;
use crate::read::reader::Reader;
use crate::recovery::{
    journal_scan, load, replay, Meter, NoProgress, OpenProgress, OpenReport, Steps,
};
use crate::space::Regions;
use crate::volume::Volumes;
use crate::write::chunk_writer::ChunkWriter;
use crate::{Clock, Config, ConfigError, Engine, EngineError, FormatDeviceError, OpenError, Stats};

fn streams_for(config: &Config, z: &shale_device::ZoneGeometry) -> Result<u32, String> {
    let mut streams = config.streams_max.min(config.volumes_max);
    let limit = [z.max_open_zones, z.max_active_zones]
        .into_iter()
        .filter(|&l| l > 0)
        .min();
    if let Some(limit) = limit {
        streams = streams.min(limit / 2);
    }
    if streams == 0 {
        return Err(format!(
            "open/active zone limit {limit:?} leaves no room for a compaction and a GC zone"
        ));
    }
    Ok(streams)
}

fn capacity_geometry(z: &shale_device::ZoneGeometry) -> Result<CapacityGeometry, String> {
    if !z.zone_size.is_multiple_of(BS)
        || !z.zone_capacity.is_multiple_of(BS)
        || z.zone_capacity == 0
    {
        return Err(format!(
            "zone size {} / capacity {} not multiples of 4096",
            z.zone_size, z.zone_capacity
        ));
    }
    if z.zone_count < 3 {
        return Err(format!(
            "{} zones; need at least 3 (label + 2 data)",
            z.zone_count
        ));
    }
    // Zone writes are whole md groups at group boundaries (and a zone's short last
    // group ends at its capacity), so a device (an array) that takes writes only in
    // units works if its unit divides a group and the zone capacity.
    let group = u64::from(shale_format::GROUP_BLOCKS) * BS;
    let unit = u64::from(z.write_unit.max(1));
    if !group.is_multiple_of(unit) || !z.zone_capacity.is_multiple_of(unit) {
        return Err(format!(
            "write unit {unit} bytes must divide a {group}-byte zone group and the zone capacity {}",
            z.zone_capacity
        ));
    }
    let size = u32::try_from(z.zone_size / BS).map_err(|_| "zone too large".to_string())?;
    Ok(CapacityGeometry {
        zone_size_blocks: size,
        zone_capacity_blocks: (z.zone_capacity / BS) as u32,
        zone_count: z.zone_count,
    })
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Engine<C, Z, K> {
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        cache: C,
        capacity: Z,
        clock: K,
        config: Config,
        sb: Superblock,
        regions: Regions,
        l2p: L2p,
        volumes: Volumes,
        journal: Journal,
        sid_next: u64,
        streams: u32,
    ) -> Self {
        let geo = Geometry::of(&sb);
        let stats = Stats {
            chunk_count: u64::from(geo.chunk_count),
            data_zone_count: u64::from(geo.zone_count - 1),
            streams: u64::from(streams),
            ..Default::default()
        };
        let writer = ChunkWriter::new(config.write_buffers_max, geo.chunk_blocks);
        let placement = crate::placement::Placement::new(config.placement, &geo);
        let mut throttle = crate::throttle::Throttle::default();
        let none_waits = throttle.sync(
            volumes.table.entries.iter().map(|e| {
                let count = sb.shard.count;
                (e.uid, crate::volume::shard_limits(e.limits, count))
            }),
            clock.now_ns(),
        );
        debug_assert!(none_waits.is_empty());
        let compaction = Mover::new(
            RegionRole::Compaction,
            config.compaction_policy.policy(),
            streams,
        );
        // With a cold tier GC has one more stream, past the placement streams: the
        // cold zone it moves blocks into.
        let gc_streams = streams + u32::from(geo.tiered());
        let gc = Mover::new(RegionRole::Gc, config.gc_policy.policy(), gc_streams);
        let mut engine = Engine {
            core: Core {
                cache,
                capacity,
                clock,
                md_cache: MdCache::new(config.md_cache_bytes_max),
                config,
                sb,
                geo,
                regions,
                l2p,
                volumes,
                journal,
                sid_next,
                stats,
                io: IoSlab::default(),
                bufs: crate::buffers::BufPool::new(),
                streams,
                placement,
                capacity_dirty: false,
                open_report: crate::recovery::OpenReport::default(),
                device_wake_ns: shale_device::MAINTAIN_IDLE,
                repairs: Vec::new(),
                tier: crate::tier::Tier::default(),
                census: None,
                directs: Default::default(),
            },
            queue: VecDeque::new(),
            throttle,
            writer,
            reader: Reader::default(),
            compaction,
            gc,
            durability: Durability::default(),
            checkpointer: Checkpointer {
                current: None,
                user_bytes_at_start: 0,
                sid_base: sid_next,
            },
            prefetch: Prefetch::default(),
            scrubber: crate::scrub::Scrubber::default(),
            health: Health::default(),
            completions: Completions::default(),
            handoff: None,
        };
        engine.core.apply_volume_policies();
        engine
    }

    /// Formats both devices and returns a running engine with no volumes.
    pub fn format(
        mut cache: C,
        mut capacity: Z,
        clock: K,
        config: Config,
    ) -> Result<Self, FormatDeviceError> {
        config.validate()?;
        let (sb, streams) = format_plan(cache.info(), capacity.geometry(), &config)?;
        let owned = config.zones_owned.unwrap_or(sb.capacity.zone_count);
        format_capacity(&mut capacity, &sb, owned)?;
        format_cache(&mut cache, &sb)?;
        let vt = VolumeTable::default();
        let geo = Geometry::of(&sb);
        let mut regions = Regions::new(&geo);
        crate::space::lend::foreign_from(&geo, &mut regions, owned);
        let chunks = config.chunks_owned.unwrap_or(geo.chunk_count);
        crate::space::lend::foreign_chunks_from(&geo, &mut regions, chunks);
        let table_pages = sb.l2p.pages_for(sb.user_capacity_blocks);
        let frames = config.l2p_budget_pages(sb.user_capacity_blocks, table_pages)?;
        let l2p = L2p::new(
            sb.l2p,
            2 * config.volumes_max,
            sb.layout.l2p_pool_pages,
            frames,
            sb.layout.l2p_area_start,
        );
        let volumes = Volumes::new(vt, sb.user_capacity_blocks, config.volumes_max);
        let journal = Journal::new(sb.layout.journal_start, sb.layout.journal_blocks, 0, 0, 0);
        let mut e = Self::assemble(
            cache, capacity, clock, config, sb, regions, l2p, volumes, journal, 1, streams,
        );
        e.checkpoint(true)?;
        e.write_superblock_dirty()?;
        Ok(e)
    }

    /// Clears the clean flag in both superblock copies: were only the newest written,
    /// a damaged newest copy would bring back the older clean one, and an open would
    /// then trust a checkpoint the running engine has moved past.
    fn write_superblock_dirty(&mut self) -> Result<(), EngineError> {
        self.core.sb.clean = false;
        crate::checkpoint::write_superblock(&mut self.core)?;
        crate::checkpoint::write_superblock(&mut self.core)
    }

    /// Opens formatted devices: after a clean shutdown it loads the checkpoint; after a
    /// crash it recovers (replays everything since the checkpoint) and takes a new
    /// checkpoint before returning. `open_report()` says what it did.
    pub fn open(cache: C, capacity: Z, clock: K, config: Config) -> Result<Self, OpenError> {
        Self::open_with_progress(cache, capacity, clock, config, &mut NoProgress)
    }

    /// [`Engine::open`], reporting each step's start and end, and the progress of
    /// long steps, to `progress` as it runs (a recovery can take minutes). The steps
    /// are declared in the tables at the end of this file.
    pub fn open_with_progress(
        cache: C,
        capacity: Z,
        clock: K,
        config: Config,
        progress: &mut dyn OpenProgress,
    ) -> Result<Self, OpenError> {
        Self::open_with(cache, capacity, clock, config, progress, None)
    }

    /// [`Engine::open_with_progress`] with a hand-off store (`handoff.rs`): after a
    /// kill of the process, the image the dead instance left there is written first,
    /// so recovery finds every write it acknowledged; then the store is attached to
    /// the new engine.
    pub fn open_with(
        cache: C,
        capacity: Z,
        clock: K,
        config: Config,
        progress: &mut dyn OpenProgress,
        handoff: Option<Box<dyn crate::Handoff>>,
    ) -> Result<Self, OpenError> {
        config.validate()?;
        let mut steps = Steps::new(progress);
        let mut loading = Loading {
            cache,
            capacity,
            clock,
            config,
            report: OpenReport::default(),
            found: None,
            checkpoint: None,
            log: None,
            parts: None,
            handoff,
        };
        let take_handoff = loading.handoff.is_some();
        run_steps(&mut steps, &mut loading, &Loading::LOAD_STEPS)?;
        if take_handoff {
            run_steps(&mut steps, &mut loading, &[Loading::HANDOFF])?;
        }
        let handoff = loading.handoff.take();
        let clean = loading.clean();
        if !clean && !loading.config.recover {
            return Err(OpenError::NeedsRecovery);
        }
        loading.report.clean = clean;
        // The load steps and L2P directories; then census and resume, or the six of a
        // replay; then the self-check.
        let self_check = loading.config.open_self_check;
        steps.set_total(
            Loading::<C, Z, K>::LOAD_STEPS.len()
                + usize::from(take_handoff)
                + 1
                + if clean {
                    Opening::<C, Z, K>::CLEAN_STEPS.len()
                } else {
                    Opening::<C, Z, K>::REPLAY_STEPS.len()
                }
                + usize::from(self_check),
        );
        run_steps(&mut steps, &mut loading, &[Loading::L2P_DIRECTORIES])?;
        let mut opening = loading.into_engine()?;
        if clean {
            run_steps(&mut steps, &mut opening, &Opening::CLEAN_STEPS)?;
        } else {
            run_steps(&mut steps, &mut opening, &Opening::REPLAY_STEPS)?;
        }
        if self_check {
            run_steps(&mut steps, &mut opening, &[Opening::SELF_CHECK])?;
        }
        let mut e = opening.engine;
        e.core.open_report = opening.report;
        if let Some(h) = handoff {
            // Everything the image claimed is in the new checkpoint now.
            e.attach_handoff(h).map_err(|e| {
                OpenError::Engine(EngineError::Failed {
                    reason: format!("clearing the hand-off store: {e}"),
                })
            })?;
        }
        Ok(e)
    }

    /// What the last open did: its steps (name, time, bytes read), warnings about
    /// damaged metadata it worked around, and what replay found.
    pub fn open_report(&self) -> &OpenReport {
        &self.core.open_report
    }

    /// Each zone's device write pointer in blocks (its capacity when full).
    fn zone_write_pointers(&self) -> Result<Vec<u32>, OpenError> {
        let mut zones = Vec::new();
        self.core
            .capacity
            .report_zones(0, self.core.geo.zone_count, &mut zones)
            .map_err(|e| OpenError::Engine(EngineError::capacity("zone report", 0)(e)))?;
        Ok(zones
            .iter()
            .map(|z| match z.state {
                ZoneState::Full => self.core.geo.zone_cap_blocks,
                _ => ((z.write_pointer - z.start) / BS) as u32,
            })
            .collect())
    }

    fn census_detail(&self) -> String {
        let valid: u64 = self
            .core
            .regions
            .regions
            .iter()
            .map(|r| u64::from(r.valid))
            .sum();
        format!("{valid} mapped blocks")
    }

    /// Rebuilds validity from the L2P. With `check_counts` the recorded counts must
    /// match (a clean shutdown recorded them exactly); otherwise they are set. Every
    /// mapped PBA must be a data slot of an open or closed region, below the write
    /// pointer its zone had on the device when the open began. Returns bytes read.
    fn census(
        &mut self,
        check_counts: bool,
        zone_wps: &[u32],
        meter: &mut Meter<'_>,
    ) -> Result<u64, OpenError> {
        let reads0 = self.core.l2p.counters.page_reads;
        let geo = self.core.geo;
        let mut counted = vec![0u32; geo.region_count() as usize];
        let mut err: Option<OpenError> = None;
        self.core.regions.validity.clear_all();
        self.core.regions.shares.clear_counts();
        {
            let validity = &mut self.core.regions.validity;
            let shares = &mut self.core.regions.shares;
            let regions = &self.core.regions.regions;
            let kinds = self.core.volumes.kinds();
            crate::volume::walk_all_blocks(
                &mut self.core.l2p,
                &mut self.core.cache,
                kinds,
                &geo,
                meter,
                |volume, lba, pba, base| {
                    if err.is_some() {
                        return;
                    }
                    let Some(pba) = pba else {
                        err = Some(OpenError::InconsistentCheckpoint {
                            reason: format!("{volume} {lba}: its unit at {base} leaves its region"),
                        });
                        return;
                    };
                    let r = match crate::census::check_mapping(
                        &geo,
                        regions,
                        zone_wps,
                        (volume, lba, pba),
                    ) {
                        Ok(r) => r,
                        Err(e) => {
                            err = Some(e);
                            return;
                        }
                    };
                    if validity.set(pba) {
                        err = Some(OpenError::InconsistentCheckpoint {
                            reason: format!("{pba} mapped twice ({volume} {lba})"),
                        });
                        return;
                    }
                    shares.add(volume, r);
                    counted[r.0 as usize] += 1;
                },
            )
            .map_err(OpenError::Engine)?;
        }
        if let Some(e) = err {
            return Err(e);
        }
        for (i, reg) in self.core.regions.regions.iter_mut().enumerate() {
            if check_counts && reg.valid != counted[i] {
                return Err(OpenError::CensusMismatch {
                    region: RegionId(i as u32),
                    recorded: reg.valid,
                    counted: counted[i],
                });
            }
            reg.valid = counted[i];
        }
        Ok((self.core.l2p.counters.page_reads - reads0) * BS)
    }

    /// Open regions continue at their next group boundary (the partial group's md was
    /// written at shutdown; its unused slots are skipped).
    fn resume_open_regions(&mut self, now: u64) -> Result<(), OpenError> {
        let inconsistent = |reason: String| OpenError::InconsistentCheckpoint { reason };
        for i in 0..self.core.geo.region_count() {
            let r = RegionId(i);
            let reg = self.core.regions.get(r).clone();
            if reg.state == RegionState::PendingFree {
                self.core.regions.get_mut(r).state = RegionState::Free;
                let geo = self.core.geo;
                self.core.regions.push_free(&geo, r);
                continue;
            }
            if reg.state != RegionState::Open {
                continue;
            }
            let groups = Groups {
                blocks: self.core.geo.region_blocks(r),
            };
            let (g, idx) = groups.locate(reg.wp);
            let wp = if idx == 0 || reg.wp >= groups.end() {
                reg.wp
            } else if g + 1 < groups.count() {
                groups.start(g + 1)
            } else {
                groups.end()
            };
            self.core.regions.get_mut(r).wp = wp;
            if self.core.geo.is_chunk(r) {
                if reg.role != RegionRole::User || self.writer.open.is_some() {
                    return Err(inconsistent(format!("{r}: unexpected open chunk")));
                }
                if wp >= groups.end() {
                    self.core.regions.try_close(&self.core.geo, r, false, now);
                } else {
                    self.writer.open = Some(r);
                    let used: u32 = (0..groups.locate(wp).0).map(|x| groups.data_slots(x)).sum();
                    self.writer.open_remaining = u64::from(groups.data_capacity() - used);
                }
                continue;
            }
            let z = self.core.geo.zone_of(r).0;
            let info = self
                .core
                .capacity
                .zone_info(z)
                .map_err(|e| OpenError::Engine(EngineError::capacity("zone report", 0)(e)))?;
            let expect = info.start + u64::from(wp) * BS;
            if info.write_pointer != expect && info.state != ZoneState::Full {
                return Err(inconsistent(format!(
                    "{r}: device write pointer {} but checkpoint says {expect}",
                    info.write_pointer
                )));
            }
            let s = usize::from(reg.stream);
            let role = reg.role;
            // The GC's cold stream (the one past the placement streams) writes only
            // cold zones, the others only fast ones.
            let cold_stream = s == self.core.streams as usize;
            let slot_free = s < self.mover(role).streams.len()
                && self.mover(role).streams[s].zone.is_none()
                && cold_stream == self.core.geo.is_cold(r);
            if wp < groups.end()
                && slot_free
                && matches!(role, RegionRole::Compaction | RegionRole::Gc)
            {
                self.mover(role).streams[s].zone = Some(r);
            } else {
                // Stream layout changed (or zone full): close it as it is.
                if info.state != ZoneState::Full {
                    self.core
                        .capacity
                        .manage(z, ZoneAction::Finish)
                        .map_err(|e| {
                            OpenError::Engine(EngineError::capacity("zone finish", info.start)(e))
                        })?;
                }
                let reg = self.core.regions.get_mut(r);
                reg.wp = groups.end();
                self.core.regions.try_close(&self.core.geo, r, false, now);
            }
        }
        Ok(())
    }

    /// Clean shutdown: drains everything, checkpoints with the clean flag, and returns
    /// the devices.
    pub fn shutdown(mut self) -> Result<(C, Z), EngineError> {
        if let Some(r) = &self.health.fatal {
            return Err(EngineError::Failed { reason: r.clone() });
        }
        self.run_until_idle()?;
        // Counts a crash left unknown are rebuilt by the census: the clean checkpoint
        // below records them, and the next open trusts them.
        if self.core.regions.counts_unknown {
            crate::census::complete(&mut self.core)?;
        }
        // Staged relocations are dropped: their sources still hold the live copies.
        for role in [RegionRole::Compaction, RegionRole::Gc] {
            for s in 0..self.mover(role).streams.len() {
                let entries = match role {
                    RegionRole::Gc => self.gc.streams[s].clear(&mut self.core.bufs),
                    _ => self.compaction.streams[s].clear(&mut self.core.bufs),
                };
                for e in entries {
                    if let Some((src, _)) = self.core.geo.region_slot(e.source) {
                        self.core.regions.get_mut(src).relocations -= 1;
                        self.core.regions.maybe_pending_free(src);
                    }
                }
            }
            let m = self.mover(role);
            if let Some(v) = m.victim.take() {
                self.core.regions.get_mut(v).draining = false;
            }
        }
        for r in self.core.regions.regions.iter_mut() {
            r.draining = false;
        }
        // The next open resumes open chunks at their next group boundary; record that
        // now, so every slot below a recorded write pointer past the checkpoint was
        // written (recovery relies on it to prove md entries durable).
        let now = self.core.now();
        for c in 0..self.core.geo.chunk_count {
            let r = RegionId(c);
            let reg = self.core.regions.get(r);
            if reg.state != RegionState::Open {
                continue;
            }
            let groups = Groups {
                blocks: self.core.geo.chunk_blocks,
            };
            let (g, idx) = groups.locate(reg.wp);
            if idx != 0 && reg.wp < groups.end() {
                self.core.regions.get_mut(r).wp = if g + 1 < groups.count() {
                    groups.start(g + 1)
                } else {
                    groups.end()
                };
            }
            if self.core.regions.try_close(&self.core.geo, r, false, now)
                && self.writer.open == Some(r)
            {
                self.writer.open = None;
            }
        }
        self.checkpoint(true)?;
        if let Some(h) = self.handoff.as_mut() {
            // Everything is in the clean checkpoint: nothing is left to hand off.
            if let Err(e) = h.store.clear() {
                tracing::warn!(error = %e, "clearing the hand-off store");
            }
        }
        Ok((self.core.cache, self.core.capacity))
    }
}

/// The cache layout a format would write on a cache of `cache` and a capacity of
/// `capacity` with `config`: where a caller dividing one cache device between shards
/// learns how much metadata each needs (`shale_device::SharedCache`).
pub fn format_layout(
    cache: &shale_device::DeviceInfo,
    capacity: &shale_device::ZoneGeometry,
    config: &Config,
) -> Result<shale_format::CacheLayout, FormatDeviceError> {
    config.validate()?;
    Ok(format_plan(cache, capacity, config)?.0.layout)
}

/// The superblock a format writes, and the placement streams, for these devices
/// and this configuration; refused when the devices are too small or unusable.
fn format_plan(
    info: &shale_device::DeviceInfo,
    zg: &shale_device::ZoneGeometry,
    config: &Config,
) -> Result<(Superblock, u32), FormatDeviceError> {
    let too_small = |device, reason| FormatDeviceError::TooSmall { device, reason };
    let geometry = |reason| FormatDeviceError::Geometry { reason };
    if info.logical_block_size as usize > BLOCK_SIZE || info.max_io_bytes < BLOCK_SIZE as u32 {
        return Err(geometry(format!(
            "cache block size {} / max I/O {}",
            info.logical_block_size, info.max_io_bytes
        )));
    }
    let cap = capacity_geometry(zg).map_err(geometry)?;
    let streams = streams_for(config, zg).map_err(geometry)?;
    // A cold tier keeps its own GC threshold free, and GC's cold zone open.
    let cold_reserve = if config.cold_zones > 0 {
        config.gc_free_zones_min.max(3) + 1
    } else {
        0
    };
    // Fast zones kept free: GC's threshold and the open zones, a compaction and a GC
    // zone per stream; with a cold tier GC's zones are cold ones, its one open there.
    let fast_reserve = if config.cold_zones > 0 {
        config.gc_free_zones_min.max(streams + 2) + streams
    } else {
        reserve_zones(config, streams)
    };
    let reserve = fast_reserve + cold_reserve;
    // The fast tier needs its reserve and a data zone, the cold one its own reserve
    // and a data zone.
    let fast_zones = cap.zone_count.saturating_sub(config.cold_zones + 1);
    if config.cold_zones > 0 && (fast_zones <= fast_reserve || config.cold_zones <= cold_reserve) {
        return Err(too_small(
            "capacity",
            format!(
                "{fast_zones} fast and {} cold zones: each tier needs more than its reserve ({fast_reserve} and {cold_reserve})",
                config.cold_zones,
            ),
        ));
    }
    let l2p =
        match config.l2p_entry_bytes {
            None => None,
            Some(b) => Some(L2pFormat::from_entry_bytes(b).ok_or_else(|| {
                geometry(format!("L2P entries of {b} bytes (4 or 5 are supported)"))
            })?),
        };
    // Zones other shards own hold none of this shard's capacity.
    let others = match config.zones_owned {
        Some(n) if n < 2 || n > cap.zone_count || config.cold_zones > 0 => {
            return Err(geometry(format!(
                "{n} of {} zones owned (at least 2, and no cold tier)",
                cap.zone_count
            )))
        }
        Some(n) => cap.zone_count - n,
        None => 0,
    };
    let input = PlanInput {
        chunk_blocks: config.chunk_blocks,
        volumes_max: config.volumes_max,
        journal_blocks: config.journal_blocks,
        spare_factor: config.spare_factor,
        reserve_zones: reserve + others,
        l2p,
        data_start_min: config.cache_data_start_min.unwrap_or(0) / BS,
    };
    let p =
        plan(info.size_bytes / BS, &cap, &input).map_err(|r| too_small("cache or capacity", r))?;
    cache_holds_requests(config, p.layout.chunk_count)?;
    let sb = Superblock {
        uuid: config
            .pool_uuid
            .unwrap_or_else(|| *uuid::Uuid::new_v4().as_bytes()),
        generation: 0,
        clean: true,
        active_checkpoint: 1,
        volumes_max: config.volumes_max,
        user_capacity_blocks: p.user_capacity_blocks,
        cache_size_blocks: info.size_bytes / BS,
        layout: p.layout,
        capacity: cap,
        l2p: p.l2p,
        shard: config.shard,
        cold_zones: config.cold_zones,
    };
    sb.validate()
        .map_err(|(f, r)| geometry(format!("{f}: {r}")))?;
    Ok((sb, streams))
}

/// The largest request must fit in the chunks this shard owns, with a chunk to
/// spare for compaction (chunks other shards own hold none of its writes).
fn cache_holds_requests(config: &Config, chunk_count: u32) -> Result<(), FormatDeviceError> {
    let chunk_data = u64::from(
        Groups {
            blocks: config.chunk_blocks,
        }
        .data_capacity(),
    );
    let request_blocks = config.request_bytes_max.div_ceil(BS) + 1;
    let chunks = match config.chunks_owned {
        Some(n) if n > chunk_count => {
            return Err(FormatDeviceError::Geometry {
                reason: format!("{n} of {chunk_count} chunks owned"),
            })
        }
        Some(n) => n,
        None => chunk_count,
    };
    if u64::from(chunks.saturating_sub(1)) * chunk_data < 2 * request_blocks {
        return Err(FormatDeviceError::TooSmall {
            device: "cache",
            reason: format!(
                "{chunks} chunks cannot hold two requests of {} bytes",
                config.request_bytes_max
            ),
        });
    }
    Ok(())
}

/// Fast zones a one-tier pool keeps free and out of its user capacity: GC's
/// threshold and the open zones, a compaction and a GC zone per stream.
pub(crate) fn reserve_zones(config: &Config, streams: u32) -> u32 {
    config.gc_free_zones_min.max(streams + 2) + 2 * streams
}

/// Every zone empty, then the label in zone 0 (finished so it holds no open slot).
fn format_capacity(
    capacity: &mut impl ZonedDevice,
    sb: &Superblock,
    owned: u32,
) -> Result<(), FormatDeviceError> {
    let cap_err =
        |step, off| move |e| FormatDeviceError::Engine(EngineError::capacity(step, off)(e));
    let mut zones = Vec::new();
    let zone_count = capacity.geometry().zone_count;
    capacity
        .report_zones(0, zone_count, &mut zones)
        .map_err(cap_err("report zones", 0))?;
    // Zones past `owned` are other shards' (a shared device): theirs to format.
    for z in zones.iter().filter(|z| z.index < owned) {
        if z.state != ZoneState::Empty {
            capacity
                .manage(z.index, ZoneAction::Reset)
                .map_err(cap_err("zone reset", z.start))?;
        }
    }
    let label = CapacityLabel {
        uuid: sb.uuid,
        geometry: sb.capacity,
    };
    let one = label.encode();
    // Padded with zeros to the device's write unit (an array's stripe).
    let unit = (capacity.geometry().write_unit as usize).max(BLOCK_SIZE);
    let len = (shale_format::LABEL_COPIES * BLOCK_SIZE).next_multiple_of(unit);
    let mut copies = vec![0u8; len];
    for c in copies
        .chunks_exact_mut(BLOCK_SIZE)
        .take(shale_format::LABEL_COPIES)
    {
        c.copy_from_slice(&one);
    }
    capacity
        .write_at(0, &copies)
        .map_err(cap_err("label write", 0))?;
    capacity
        .manage(0, ZoneAction::Finish)
        .map_err(cap_err("zone finish", 0))?;
    capacity.flush().map_err(cap_err("flush", 0))
}

/// Stale metadata from an earlier format must not survive: superblock A, the volume
/// table copies and the journal ring are overwritten.
fn format_cache(cache: &mut impl BlockDevice, sb: &Superblock) -> Result<(), FormatDeviceError> {
    let cache_err =
        |step, off| move |e| FormatDeviceError::Engine(EngineError::cache(step, off)(e));
    cache
        .write_at(0, &sb.encode())
        .map_err(cache_err("superblock write", 0))?;
    let zeros = vec![0u8; (sb.layout.journal_blocks as usize) * BLOCK_SIZE];
    let joff = sb.layout.journal_start * BS;
    cache
        .write_at(joff, &zeros)
        .map_err(cache_err("journal clear", joff))?;
    let vt = VolumeTable::default().encode_in(sb.layout.volume_table_blocks);
    for copy in 0..2 {
        let voff = sb.layout.volume_table_copy(copy) * BS;
        cache
            .write_at(voff, &vt)
            .map_err(cache_err("volume table write", voff))?;
    }
    Ok(())
}

/// What a step returns: the bytes it read and a short detail for the report.
type StepDone = Result<(u64, String), OpenError>;

/// One named step of an open: timed, logged and reported by `run_steps`.
struct Step<S> {
    name: &'static str,
    /// The units the step counts on a meter, if it reports progress.
    unit: Option<&'static str>,
    run: fn(&mut S, &mut Meter<'_>) -> StepDone,
}

/// What every open state gives the step runner.
trait OpenState {
    fn now(&self) -> u64;
    fn report(&mut self) -> &mut OpenReport;
}

/// Runs `table` in order; the first failing step ends the open (it gets no
/// `StepFinished`). Nothing needs undoing on failure: a step writes to the devices
/// only what a later open can read again (a superblock naming an area already
/// durable, the clean flag cleared, zone resets, a new checkpoint).
fn run_steps<S: OpenState>(
    steps: &mut Steps<'_>,
    state: &mut S,
    table: &[Step<S>],
) -> Result<(), OpenError> {
    for step in table {
        steps.begin(state.now(), step.name);
        let (bytes, detail) = match step.unit {
            Some(unit) => {
                let mut meter = steps.meter(unit);
                let done = (step.run)(state, &mut meter)?;
                meter.finish();
                done
            }
            None => (step.run)(state, &mut Meter::off())?,
        };
        let now = state.now();
        steps.end(now, state.report(), bytes, detail);
    }
    Ok(())
}

/// The superblock and the capacity's geometry, as the first steps found them.
struct Found {
    sb: Superblock,
    streams: u32,
    /// The checkpoint area the superblock names.
    named: u8,
}

/// The pieces of an engine the L2P directories step builds.
struct Parts {
    regions: Regions,
    l2p: L2p,
    volumes: Volumes,
    journal: Journal,
}

/// An open before the engine exists: the devices and what the steps have read.
struct Loading<C, Z, K> {
    cache: C,
    capacity: Z,
    clock: K,
    config: Config,
    report: OpenReport,
    found: Option<Found>,
    /// The checkpoint loaded and the area it came from.
    checkpoint: Option<(shale_format::Checkpoint, u8)>,
    log: Option<journal_scan::JournalLog>,
    parts: Option<Parts>,
    /// The hand-off store, until the engine exists.
    handoff: Option<Box<dyn crate::Handoff>>,
}

impl<C, Z, K: Clock> OpenState for Loading<C, Z, K> {
    fn now(&self) -> u64 {
        self.clock.now_ns()
    }
    fn report(&mut self) -> &mut OpenReport {
        &mut self.report
    }
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Loading<C, Z, K> {
    fn found(&self) -> &Found {
        self.found.as_ref().expect("the superblock step ran")
    }

    fn checkpoint(&self) -> &(shale_format::Checkpoint, u8) {
        self.checkpoint.as_ref().expect("the checkpoint step ran")
    }

    fn log(&self) -> &journal_scan::JournalLog {
        self.log.as_ref().expect("the journal step ran")
    }

    /// A clean open: the clean flag set, no journal entries past the checkpoint, and
    /// the checkpoint loaded the one the superblock names.
    fn clean(&self) -> bool {
        let f = self.found();
        f.sb.clean && self.log().blocks.is_empty() && self.checkpoint().1 == f.named
    }

    /// Builds the engine from what the steps loaded. When the checkpoint loaded is
    /// not the one the superblock names, the superblock is made to name it first:
    /// the next checkpoint goes to the other area, and a crash during that write must
    /// not leave the superblock naming a torn area.
    fn into_engine(self) -> Result<Opening<C, Z, K>, OpenError> {
        let Loading {
            cache,
            capacity,
            clock,
            config,
            report,
            found,
            checkpoint,
            log,
            parts,
            handoff: _,
        } = self;
        let (Some(found), Some((ck, area)), Some(log), Some(parts)) =
            (found, checkpoint, log, parts)
        else {
            unreachable!("into_engine runs after every load step");
        };
        let now = clock.now_ns();
        let mut sb = found.sb;
        sb.active_checkpoint = area;
        let mut engine = Engine::assemble(
            cache,
            capacity,
            clock,
            config,
            sb,
            parts.regions,
            parts.l2p,
            parts.volumes,
            parts.journal,
            ck.header.sid_next,
            found.streams,
        );
        if area != found.named {
            engine.core.sb.clean = false;
            crate::checkpoint::write_superblock(&mut engine.core).map_err(OpenError::Engine)?;
        }
        Ok(Opening {
            engine,
            report,
            journal: log.blocks,
            replay: None,
            zone_wps: Vec::new(),
            now,
        })
    }
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Loading<C, Z, K> {
    /// What an open reads before it knows whether it must replay.
    const LOAD_STEPS: [Step<Self>; 5] = [
        Step {
            name: "superblock",
            unit: None,
            run: Self::superblock,
        },
        Step {
            name: "capacity label",
            unit: None,
            run: Self::capacity_label,
        },
        Step {
            name: "checkpoint",
            unit: Some("checkpoint blocks"),
            run: Self::load_checkpoint,
        },
        Step {
            name: "volume table",
            unit: None,
            run: Self::volume_table,
        },
        Step {
            name: "journal",
            unit: None,
            run: Self::journal,
        },
    ];

    /// With a hand-off store attached, after the journal: the dead instance's image.
    const HANDOFF: Step<Self> = Step {
        name: "hand-off",
        unit: None,
        run: Self::take_handoff,
    };

    const L2P_DIRECTORIES: Step<Self> = Step {
        name: "L2P directories",
        unit: None,
        run: Self::l2p_directories,
    };

    fn superblock(&mut self, _: &mut Meter<'_>) -> StepDone {
        let sb = load::superblock(&mut self.cache, &mut self.report)?;
        if sb.cache_size_blocks > self.cache.info().size_bytes / BS {
            return Err(OpenError::GeometryMismatch {
                reason: format!("cache device shrank below {} blocks", sb.cache_size_blocks),
            });
        }
        let detail = format!("generation {}, clean flag {}", sb.generation, sb.clean);
        self.found = Some(Found {
            named: sb.active_checkpoint,
            sb,
            streams: 0,
        });
        Ok((2 * BS, detail))
    }

    fn capacity_label(&mut self, _: &mut Meter<'_>) -> StepDone {
        let label = load::label(&mut self.capacity, &mut self.report)?;
        let Some(Found { sb, streams, .. }) = self.found.as_mut() else {
            unreachable!("the superblock step ran");
        };
        if label.uuid != sb.uuid {
            return Err(OpenError::ForeignCapacity);
        }
        if self.config.pool_uuid.is_some_and(|u| u != sb.uuid) {
            return Err(OpenError::ForeignDevice);
        }
        let zg = self.capacity.geometry().clone();
        let cap =
            capacity_geometry(&zg).map_err(|reason| OpenError::GeometryMismatch { reason })?;
        if cap != sb.capacity || label.geometry != sb.capacity {
            // A tiered pool opened without its cold device has just the fast zones.
            let cold_missing =
                sb.cold_zones > 0 && cap.zone_count + sb.cold_zones == sb.capacity.zone_count;
            let hint = if cold_missing {
                format!(
                    " (the pool has a cold tier of {} zones after these: its device is missing)",
                    sb.cold_zones
                )
            } else {
                String::new()
            };
            return Err(OpenError::GeometryMismatch {
                reason: format!(
                    "device {cap:?}, superblock {:?}, label {:?}{hint}",
                    sb.capacity, label.geometry
                ),
            });
        }
        self.config.chunk_blocks = sb.layout.chunk_blocks;
        self.config.volumes_max = sb.volumes_max;
        self.config.journal_blocks = sb.layout.journal_blocks;
        *streams = streams_for(&self.config, &zg)
            .map_err(|reason| OpenError::GeometryMismatch { reason })?;
        Ok((2 * BS, format!("{} zones", cap.zone_count)))
    }

    fn load_checkpoint(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let mut bytes = 0;
        let sb = &self.found.as_ref().expect("the superblock step ran").sb;
        let (ck, area) =
            load::checkpoint(&mut self.cache, sb, &mut self.report, &mut bytes, meter)?;
        let geo = Geometry::of(sb);
        if ck.regions.len() != geo.region_count() as usize {
            return Err(OpenError::InconsistentCheckpoint {
                reason: format!(
                    "{} regions, geometry has {}",
                    ck.regions.len(),
                    geo.region_count()
                ),
            });
        }
        let detail = format!("area {area}, generation {}", ck.header.generation);
        self.checkpoint = Some((ck, area));
        Ok((bytes, detail))
    }

    fn volume_table(&mut self, _: &mut Meter<'_>) -> StepDone {
        let mut bytes = 0;
        let (ck, _) = self.checkpoint.as_ref().expect("the checkpoint step ran");
        let sb = &self.found.as_ref().expect("the superblock step ran").sb;
        load::volume_tables(&mut self.cache, sb, ck, &mut self.report, &mut bytes)?;
        Ok((bytes, format!("{} volumes", ck.volumes.entries.len())))
    }

    fn journal(&mut self, _: &mut Meter<'_>) -> StepDone {
        let mut bytes = 0;
        let (ck, area) = self.checkpoint.as_ref().expect("the checkpoint step ran");
        let f = self.found.as_ref().expect("the superblock step ran");
        let log = journal_scan::read(
            &mut self.cache,
            &f.sb,
            ck.header.generation,
            ck.header.journal_next_block,
            ck.header.journal_sequence,
            &mut self.report,
            &mut bytes,
        )?;
        let clean = f.sb.clean && log.blocks.is_empty() && *area == f.named;
        if f.sb.clean && !clean {
            self.report.warn(format!(
                "the clean flag is set but {} journal entries follow the checkpoint{}: recovering",
                log.blocks.len(),
                if *area == f.named {
                    ""
                } else {
                    " (and a newer checkpoint exists)"
                }
            ));
        }
        let detail = format!("{} entries since the checkpoint", log.blocks.len());
        self.log = Some(log);
        Ok((bytes, detail))
    }

    /// Writes the hand-off image a killed instance left, if it continues the journal
    /// on the device, then reads the journal again (`handoff.rs`).
    fn take_handoff(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let (ck_generation, dirty) = {
            let (ck, _) = self.checkpoint();
            (ck.header.generation, !self.clean())
        };
        let sb = self.found().sb.clone();
        let Some(store) = self.handoff.as_mut() else {
            return Ok((0, "no store".into()));
        };
        let bytes = match store.open(sb.uuid) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok((0, "none left".into())),
            Err(e) => {
                self.report.warn(format!(
                    "hand-off store unreadable ({e}); recovering without it"
                ));
                return Ok((0, "store unreadable".into()));
            }
        };
        let read = bytes.len() as u64;
        if !dirty {
            return Ok((read, "clean shutdown: nothing to take".into()));
        }
        if !self.config.recover {
            // The open is refused (NeedsRecovery): the image stays for the one that
            // recovers.
            return Ok((read, "left for a recovering open".into()));
        }
        let image = match shale_format::HandoffImage::decode(&bytes) {
            Ok(i) => i,
            Err(e) => {
                self.report.warn(format!(
                    "hand-off image damaged ({e}); recovering without it"
                ));
                return Ok((read, "damaged".into()));
            }
        };
        let log = self.log.as_ref().expect("the journal step ran");
        let written = match crate::handoff::apply(
            &mut self.cache,
            &mut self.capacity,
            &sb,
            &image,
            log,
            ck_generation,
        ) {
            Ok(w) => w,
            Err(crate::handoff::Refused::Stale(why)) => {
                return Ok((read, format!("stale: {why}")));
            }
            Err(crate::handoff::Refused::Invalid(why)) => {
                self.report.warn(format!(
                    "hand-off image refused: {why}; recovering without it"
                ));
                return Ok((read, "refused".into()));
            }
            Err(crate::handoff::Refused::Io(e)) => return Err(OpenError::Engine(e)),
        };
        if written == (0, 0) {
            return Ok((read, "already on the device".into()));
        }
        let (more, _) = self.journal(meter)?;
        Ok((
            read + more,
            format!(
                "{} md blocks and {} journal entries written",
                written.0, written.1
            ),
        ))
    }

    /// The region table, the L2P with every volume's directory, the volume table and
    /// the journal, checked against each other.
    fn l2p_directories(&mut self, _: &mut Meter<'_>) -> StepDone {
        let inconsistent = |reason: String| OpenError::InconsistentCheckpoint { reason };
        let clean = self.clean();
        let sb = &self.found.as_ref().expect("the superblock step ran").sb;
        let (ck, _) = self.checkpoint.as_mut().expect("the checkpoint step ran");
        let geo = Geometry::of(sb);
        let regions = Regions::from_entries(&geo, &ck.regions);
        let table_pages = sb.l2p.pages_for(sb.user_capacity_blocks);
        let frames = self
            .config
            .l2p_budget_pages(sb.user_capacity_blocks, table_pages)
            .map_err(|e: ConfigError| OpenError::Config(e))?;
        let mut l2p = L2p::new(
            sb.l2p,
            2 * sb.volumes_max,
            sb.layout.l2p_pool_pages,
            frames,
            sb.layout.l2p_area_start,
        );
        for d in &mut ck.directories {
            let entries = directory_entries(sb, &ck.volumes, d).map_err(inconsistent)?;
            // Moved, not copied: the directories are megabytes per TiB (and the
            // checkpoint's copy is not needed past this step).
            let pages = std::mem::take(&mut d.pages);
            l2p.vols[d.volume.0 as usize] = Some(VolumeMap::from_dir(pages, entries));
        }
        let has = |m: u32| l2p.vols.get(m as usize).is_some_and(Option::is_some);
        if ck
            .volumes
            .entries
            .iter()
            .any(|v| !has(v.id.0) || (v.dual_map && !has(sb.volumes_max + v.id.0)))
        {
            return Err(inconsistent("volume without an L2P directory".into()));
        }
        let allocated: u64 = ck.volumes.entries.iter().map(|v| v.size_blocks).sum();
        if allocated > sb.user_capacity_blocks {
            return Err(inconsistent(format!(
                "volumes take {allocated} blocks of {}",
                sb.user_capacity_blocks
            )));
        }
        l2p.rebuild_pool(sb.layout.l2p_pool_pages)
            .map_err(inconsistent)?;
        // The L2P changes the checkpoint recorded instead of their pages: each names a
        // live volume, an LBA inside it and a block of the pool, or unmaps an LBA of
        // the volume's last page (a shrink's unmaps past the new end are switches too:
        // the page still holds what they unmapped, which a later grow must not map).
        if ck.switches.len() > l2p.deferred_max() {
            return Err(inconsistent(format!(
                "{} L2P switches, more than the {} this pool keeps waiting",
                ck.switches.len(),
                l2p.deferred_max()
            )));
        }
        for sw in &ck.switches {
            let fits = l2p.volume_size(sw.volume()).is_some_and(|n| {
                let lba = sw.lba().0;
                if sw.pba.is_none() {
                    lba < sb.l2p.pages_for(n) * sb.l2p.entries_per_page()
                } else {
                    lba < n && geo.place(sw.pba).is_some()
                }
            });
            if !fits {
                return Err(inconsistent(format!(
                    "L2P switch {} {} -> {}: no such volume, LBA or block",
                    sw.volume(),
                    sw.lba(),
                    sw.pba
                )));
            }
        }
        l2p.load_switches(&std::mem::take(&mut ck.switches));
        let volumes = Volumes::new(ck.volumes.clone(), sb.user_capacity_blocks, sb.volumes_max);
        let generation = ck.header.generation;
        // After a crash the new checkpoint's generation must exceed every epoch the
        // crashed run could have written (at most generation + 1).
        let epoch = if clean { generation } else { generation + 1 };
        let log = self.log.as_ref().expect("the journal step ran");
        let journal = Journal::new(
            sb.layout.journal_start,
            sb.layout.journal_blocks,
            log.next,
            log.sequence,
            epoch,
        );
        let detail = format!("{} volumes", ck.directories.len());
        self.parts = Some(Parts {
            regions,
            l2p,
            volumes,
            journal,
        });
        Ok((0, detail))
    }
}

/// An open once the engine exists: clean (census, resume) or a replay.
struct Opening<C: BlockDevice, Z: ZonedDevice, K: Clock> {
    engine: Engine<C, Z, K>,
    report: OpenReport,
    /// The journal entries since the checkpoint.
    journal: Vec<shale_format::JournalBlock>,
    replay: Option<replay::Replay>,
    /// Each zone's device write pointer when the open began.
    zone_wps: Vec<u32>,
    /// Engine-clock time the engine was built (regions closed by the open close then).
    now: u64,
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> OpenState for Opening<C, Z, K> {
    fn now(&self) -> u64 {
        self.engine.core.now()
    }
    fn report(&mut self) -> &mut OpenReport {
        &mut self.report
    }
}

impl<C: BlockDevice, Z: ZonedDevice, K: Clock> Opening<C, Z, K> {
    /// After a clean shutdown.
    const CLEAN_STEPS: [Step<Self>; 2] = [
        Step {
            name: "census",
            unit: Some("L2P pages"),
            run: Self::census_clean,
        },
        Step {
            name: "resume",
            unit: Some("free zones"),
            run: Self::resume,
        },
    ];

    /// After a crash.
    const REPLAY_STEPS: [Step<Self>; 6] = [
        Step {
            name: "replay plan",
            unit: None,
            run: Self::replay_plan,
        },
        Step {
            name: "md scan",
            unit: Some("md groups"),
            run: Self::md_scan,
        },
        Step {
            name: "resolve",
            unit: Some("versions"),
            run: Self::resolve,
        },
        Step {
            name: "census",
            unit: Some("L2P pages"),
            run: Self::census_replayed,
        },
        Step {
            name: "regions",
            unit: Some("free zones"),
            run: Self::regions,
        },
        Step {
            name: "new checkpoint",
            unit: Some("dirty L2P pages"),
            run: Self::new_checkpoint,
        },
    ];

    const SELF_CHECK: Step<Self> = Step {
        name: "self-check",
        unit: Some("regions"),
        run: Self::self_check,
    };

    fn replay(&mut self) -> &mut replay::Replay {
        self.replay.as_mut().expect("the replay plan step ran")
    }

    fn census_clean(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let e = &mut self.engine;
        let zone_wps = e.zone_write_pointers()?;
        if e.core.config.census_in_background {
            // The checkpoint's counts are exact (a clean shutdown takes it at one
            // instant); the bits are rebuilt while I/O is served.
            e.core.regions.begin_census(true);
            e.core.census = Some(crate::census::Census::new(zone_wps));
            return Ok((
                0,
                format!("{}; bits rebuilt in the background", e.census_detail()),
            ));
        }
        let bytes = e.census(true, &zone_wps, meter)?;
        Ok((bytes, e.census_detail()))
    }

    fn resume(&mut self, meter: &mut Meter<'_>) -> StepDone {
        // Free zones must be empty on the device before reuse, after a clean stop
        // too: a checkpoint records zones freed since the last durability point
        // as Free before their resets, and a crash can come between the two (then
        // a later clean shutdown carries the Free state forward).
        let e = &mut self.engine;
        let stray = replay::reset_stray_zones(&mut e.core, meter)?;
        meter.finish();
        e.resume_open_regions(self.now)?;
        // A shutdown during a background census records regions emptied meanwhile as
        // Closed with nothing valid: once the counts are checked (a census inside the
        // open) they wait for reuse like any emptied region, released (zones reset) by
        // the next durability point. A background census does this when it ends.
        if !e.core.regions.census_pending {
            for i in 0..e.core.geo.region_count() {
                e.core.regions.maybe_pending_free(RegionId(i));
            }
        }
        e.write_superblock_dirty()?;
        Ok((
            0,
            format!("open regions resumed, {stray} stray zones reset"),
        ))
    }

    fn replay_plan(&mut self, _: &mut Meter<'_>) -> StepDone {
        let core = &self.engine.core;
        let rp = replay::plan(
            &core.geo,
            &core.regions,
            &self.journal,
            &mut self.report.warnings,
        );
        let detail = format!(
            "{} regions to scan, {} trims",
            rp.plans.len(),
            rp.trims.len()
        );
        self.replay = Some(rp);
        Ok((0, detail))
    }

    fn md_scan(&mut self, meter: &mut Meter<'_>) -> StepDone {
        self.zone_wps = self.engine.zone_write_pointers()?;
        let Some(rp) = self.replay.as_mut() else {
            unreachable!("the replay plan step ran");
        };
        let bytes = replay::scan_md(&mut self.engine.core, rp, &mut self.report.warnings, meter)?;
        let detail = format!(
            "{} md groups, {} entries",
            rp.counts.md_groups_read, rp.counts.entries_seen
        );
        Ok((bytes, detail))
    }

    fn resolve(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let Some(rp) = self.replay.as_mut() else {
            unreachable!("the replay plan step ran");
        };
        let bytes = replay::apply_replay(&mut self.engine.core, rp, meter)?;
        let detail = format!(
            "{} versions mapped, {} superseded",
            rp.counts.entries_applied, rp.counts.entries_superseded
        );
        Ok((bytes, detail))
    }

    fn census_replayed(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let now = self.now;
        let Some(rp) = self.replay.as_ref() else {
            unreachable!("the replay plan step ran");
        };
        let e = &mut self.engine;
        replay::close_replayed(&mut e.core, rp, now)?;
        if e.core.config.census_in_background {
            // The counts are rebuilt with the bits, in the background: until the walk
            // ends they are not trusted (compaction and GC wait, no region is freed, a
            // shutdown finishes the walk before its checkpoint records them), so the
            // open's cost follows what was written since the checkpoint.
            e.core.regions.begin_census(false);
            e.core.census = Some(crate::census::Census::new(self.zone_wps.clone()));
            return Ok((0, "counts and bits rebuilt in the background".into()));
        }
        let bytes = e.census(false, &self.zone_wps, meter)?;
        Ok((bytes, e.census_detail()))
    }

    fn regions(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let stray = replay::reset_stray_zones(&mut self.engine.core, meter)?;
        meter.finish();
        let core = &mut self.engine.core;
        for i in 0..core.geo.region_count() {
            core.regions.maybe_pending_free(RegionId(i));
        }
        let Some(rp) = self.replay.as_mut() else {
            unreachable!("the replay plan step ran");
        };
        rp.counts.stray_zones_reset = stray;
        core.sid_next = (core.sid_next + SID_LEASE).max(rp.max_sid + 1);
        let detail = format!(
            "{} regions closed, {} pending free, {} stray zones reset",
            rp.plans.len(),
            core.regions.pending_free.len(),
            stray
        );
        Ok((0, detail))
    }

    fn new_checkpoint(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let e = &mut self.engine;
        let (pages, switches) = (
            e.core.l2p.counters.page_writes,
            e.core.stats.checkpoint_switches,
        );
        e.checkpoint_metered(false, meter)
            .map_err(OpenError::Engine)?;
        self.report.replay = self.replay().counts.clone();
        let c = &self.engine.core;
        Ok((
            0,
            format!(
                "generation {}, {} L2P pages written, {} switches recorded",
                c.journal.epoch,
                c.l2p.counters.page_writes - pages,
                c.stats.checkpoint_switches - switches
            ),
        ))
    }

    fn self_check(&mut self, meter: &mut Meter<'_>) -> StepDone {
        let e = &self.engine;
        crate::selfcheck::open_check(&e.core, &e.writer, meter)
            .map_err(|err| OpenError::Engine(EngineError::SelfCheck(err)))?;
        Ok((0, "ok".into()))
    }
}

/// The entries of the map directory `d` describes, or why it belongs to no map of
/// `volumes`: a volume's own map (in blocks or units), or, at the id `volumes_max`
/// past it, a dual volume's sparse map of blocks.
fn directory_entries(
    sb: &Superblock,
    volumes: &VolumeTable,
    d: &shale_format::L2pDirectory,
) -> Result<u64, String> {
    let fine = d.volume.0 >= sb.volumes_max;
    let owner = VolumeId(d.volume.0 % sb.volumes_max.max(1));
    let Some(v) = volumes
        .entries
        .iter()
        .find(|e| e.id == owner && (!fine || e.dual_map))
    else {
        return Err(format!("directory for unknown {}", d.volume));
    };
    let entries = if fine {
        v.size_blocks
    } else {
        v.size_blocks >> v.map_unit_shift
    };
    let pages = sb.l2p.pages_for(entries) as usize;
    if d.volume.0 >= 2 * sb.volumes_max || pages != d.pages.len() {
        return Err(format!(
            "{}: {} directory pages for {} blocks",
            d.volume,
            d.pages.len(),
            v.size_blocks
        ));
    }
    Ok(entries)
}
