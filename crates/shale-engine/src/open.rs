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
    CapacityGeometry, CapacityLabel, RegionId, RegionRole, RegionState, Superblock, VolumeTable,
    BLOCK_SIZE,
};

use crate::checkpoint::Checkpointer;
use crate::checkpoint::SID_LEASE;
use crate::core::Core;
use crate::engine::{Completions, Health, IoSlab};
use crate::flush::Durability;
use crate::journal::Journal;
use crate::l2p::{L2p, VolumeMap};
use crate::layout::{plan, Geometry, Groups, BS};
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
use crate::{
    Clock, Config, ConfigError, Engine, EngineError, FormatDeviceError, OpenError, RecoveryError,
    Stats,
};

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
        let geo = Geometry::new(&sb.layout, &sb.capacity);
        let stats = Stats {
            chunk_count: u64::from(geo.chunk_count),
            data_zone_count: u64::from(geo.zone_count - 1),
            streams: u64::from(streams),
            ..Default::default()
        };
        let writer = ChunkWriter::new(config.write_buffers_max, geo.chunk_blocks);
        let compaction = Mover::new(
            RegionRole::Compaction,
            config.compaction_policy.policy(),
            streams,
        );
        let gc = Mover::new(RegionRole::Gc, config.gc_policy.policy(), streams);
        Engine {
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
                capacity_dirty: false,
                open_report: crate::recovery::OpenReport::default(),
            },
            queue: VecDeque::new(),
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
            health: Health::default(),
            completions: Completions::default(),
        }
    }

    /// Formats both devices and returns a running engine with no volumes.
    pub fn format(
        mut cache: C,
        mut capacity: Z,
        clock: K,
        config: Config,
    ) -> Result<Self, FormatDeviceError> {
        config.validate()?;
        let too_small = |device, reason| FormatDeviceError::TooSmall { device, reason };
        let geometry = |reason| FormatDeviceError::Geometry { reason };
        let info = cache.info().clone();
        if info.logical_block_size as usize > BLOCK_SIZE || info.max_io_bytes < BLOCK_SIZE as u32 {
            return Err(geometry(format!(
                "cache block size {} / max I/O {}",
                info.logical_block_size, info.max_io_bytes
            )));
        }
        let zg = capacity.geometry().clone();
        let cap = capacity_geometry(&zg).map_err(geometry)?;
        let streams = streams_for(&config, &zg).map_err(geometry)?;
        let gc_threshold = (config.gc_free_zones_min).max(streams + 2);
        let reserve = gc_threshold + 2 * streams;
        let p = plan(
            info.size_bytes / BS,
            &cap,
            config.chunk_blocks,
            config.volumes_max,
            config.journal_blocks,
            config.spare_factor,
            reserve,
        )
        .map_err(|r| too_small("cache or capacity", r))?;
        // The largest request must fit in the cache with a chunk to spare for compaction.
        let chunk_data = u64::from(
            Groups {
                blocks: config.chunk_blocks,
            }
            .data_capacity(),
        );
        let request_blocks = config.request_bytes_max.div_ceil(BS) + 1;
        if u64::from(p.layout.chunk_count - 1) * chunk_data < 2 * request_blocks {
            return Err(too_small(
                "cache",
                format!(
                    "{} chunks cannot hold two requests of {} bytes",
                    p.layout.chunk_count, config.request_bytes_max
                ),
            ));
        }
        let sb = Superblock {
            uuid: *uuid::Uuid::new_v4().as_bytes(),
            generation: 0,
            clean: true,
            active_checkpoint: 1,
            volumes_max: config.volumes_max,
            user_capacity_blocks: p.user_capacity_blocks,
            cache_size_blocks: info.size_bytes / BS,
            layout: p.layout,
            capacity: cap,
        };
        sb.validate()
            .map_err(|(f, r)| geometry(format!("{f}: {r}")))?;
        let cap_err =
            |step, off| move |e| FormatDeviceError::Engine(EngineError::capacity(step, off)(e));
        // Every zone empty, then the label in zone 0 (finished so it holds no open slot).
        let mut zones = Vec::new();
        capacity
            .report_zones(0, zg.zone_count, &mut zones)
            .map_err(cap_err("report zones", 0))?;
        for z in &zones {
            if z.state != ZoneState::Empty {
                capacity
                    .manage(z.index, ZoneAction::Reset)
                    .map_err(cap_err("zone reset", z.start))?;
            }
        }
        let label = CapacityLabel {
            uuid: sb.uuid,
            geometry: cap,
        };
        let one = label.encode();
        let mut copies = vec![0u8; shale_format::LABEL_COPIES * BLOCK_SIZE];
        for c in copies.chunks_exact_mut(BLOCK_SIZE) {
            c.copy_from_slice(&one);
        }
        capacity
            .write_at(0, &copies)
            .map_err(cap_err("label write", 0))?;
        capacity
            .manage(0, ZoneAction::Finish)
            .map_err(cap_err("zone finish", 0))?;
        capacity.flush().map_err(cap_err("flush", 0))?;
        // Stale metadata from an earlier format must not survive: superblock A, the
        // volume table copies and the journal ring are overwritten.
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
        let vt = VolumeTable::default();
        let voff = sb.layout.volume_table_start * BS;
        cache
            .write_at(voff, &vt.encode())
            .map_err(cache_err("volume table write", voff))?;
        cache
            .write_at(voff + BS, &vt.encode())
            .map_err(cache_err("volume table write", voff + BS))?;

        let geo = Geometry::new(&sb.layout, &sb.capacity);
        let regions = Regions::new(&geo);
        let table_pages = p
            .user_capacity_blocks
            .div_ceil(shale_format::L2P_ENTRIES_PER_PAGE);
        let frames = config.l2p_budget_pages(table_pages)?;
        let l2p = L2p::new(
            config.volumes_max,
            sb.layout.l2p_pool_pages,
            frames,
            sb.layout.l2p_area_start,
        );
        let volumes = Volumes {
            table: vt,
            user_capacity_blocks: p.user_capacity_blocks,
            volumes_max: config.volumes_max,
        };
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
        self.write_superblock()?;
        self.write_superblock()
    }

    /// Opens formatted devices: after a clean shutdown it loads the checkpoint; after a
    /// crash it recovers (replays everything since the checkpoint) and takes a new
    /// checkpoint before returning. `open_report()` says what it did.
    pub fn open(cache: C, capacity: Z, clock: K, config: Config) -> Result<Self, OpenError> {
        Self::open_with_progress(cache, capacity, clock, config, &mut NoProgress)
    }

    /// [`Engine::open`], reporting each step's start and end, and the progress of
    /// long steps, to `progress` as it runs (a recovery can take minutes).
    pub fn open_with_progress(
        mut cache: C,
        mut capacity: Z,
        clock: K,
        mut config: Config,
        progress: &mut dyn OpenProgress,
    ) -> Result<Self, OpenError> {
        config.validate()?;
        let mut report = OpenReport::default();
        let mut steps = Steps::new(progress);

        steps.begin(&clock, "superblock");
        let mut sb = load::superblock(&mut cache, &mut report)?;
        if sb.cache_size_blocks > cache.info().size_bytes / BS {
            return Err(OpenError::GeometryMismatch {
                reason: format!("cache device shrank below {} blocks", sb.cache_size_blocks),
            });
        }
        steps.end(
            &clock,
            &mut report,
            2 * BS,
            format!("generation {}, clean flag {}", sb.generation, sb.clean),
        );

        steps.begin(&clock, "capacity label");
        let label = load::label(&mut capacity, &mut report)?;
        if label.uuid != sb.uuid {
            return Err(OpenError::ForeignCapacity);
        }
        let zg = capacity.geometry().clone();
        let cap =
            capacity_geometry(&zg).map_err(|reason| OpenError::GeometryMismatch { reason })?;
        if cap != sb.capacity || label.geometry != sb.capacity {
            return Err(OpenError::GeometryMismatch {
                reason: format!(
                    "device {cap:?}, superblock {:?}, label {:?}",
                    sb.capacity, label.geometry
                ),
            });
        }
        config.chunk_blocks = sb.layout.chunk_blocks;
        config.volumes_max = sb.volumes_max;
        config.journal_blocks = sb.layout.journal_blocks;
        let streams =
            streams_for(&config, &zg).map_err(|reason| OpenError::GeometryMismatch { reason })?;
        steps.end(
            &clock,
            &mut report,
            2 * BS,
            format!("{} zones", cap.zone_count),
        );

        steps.begin(&clock, "checkpoint");
        let mut bytes = 0;
        let named = sb.active_checkpoint;
        let mut meter = steps.meter("checkpoint blocks");
        let (ck, area) = load::checkpoint(&mut cache, &sb, &mut report, &mut bytes, &mut meter)?;
        meter.finish();
        sb.active_checkpoint = area;
        let geo = Geometry::new(&sb.layout, &sb.capacity);
        let inconsistent = |reason: String| OpenError::InconsistentCheckpoint { reason };
        if ck.regions.len() != geo.region_count() as usize {
            return Err(inconsistent(format!(
                "{} regions, geometry has {}",
                ck.regions.len(),
                geo.region_count()
            )));
        }
        steps.end(
            &clock,
            &mut report,
            bytes,
            format!("area {area}, generation {}", ck.header.generation),
        );

        steps.begin(&clock, "volume table");
        let mut bytes = 0;
        load::volume_tables(&mut cache, &sb, &ck, &mut report, &mut bytes)?;
        steps.end(
            &clock,
            &mut report,
            bytes,
            format!("{} volumes", ck.volumes.entries.len()),
        );

        steps.begin(&clock, "journal");
        let mut bytes = 0;
        let log = journal_scan::read(
            &mut cache,
            &sb,
            ck.header.generation,
            ck.header.journal_next_block,
            ck.header.journal_sequence,
            &mut report,
            &mut bytes,
        )?;
        let clean = sb.clean && log.blocks.is_empty() && area == named;
        if sb.clean && !clean {
            report.warn(format!(
                "the clean flag is set but {} journal entries follow the checkpoint{}: recovering",
                log.blocks.len(),
                if area == named {
                    ""
                } else {
                    " (and a newer checkpoint exists)"
                }
            ));
        }
        steps.end(
            &clock,
            &mut report,
            bytes,
            format!("{} entries since the checkpoint", log.blocks.len()),
        );
        if !clean && !config.recover {
            return Err(OpenError::NeedsRecovery);
        }
        report.clean = clean;
        // Six steps so far and L2P directories; then census and resume, or the six
        // of a replay; then the self-check.
        steps.set_total(6 + if clean { 2 } else { 6 } + usize::from(config.open_self_check));

        steps.begin(&clock, "L2P directories");
        let regions = Regions::from_entries(&geo, &ck.regions);
        let table_pages = sb
            .user_capacity_blocks
            .div_ceil(shale_format::L2P_ENTRIES_PER_PAGE);
        let frames = config
            .l2p_budget_pages(table_pages)
            .map_err(|e: ConfigError| OpenError::Config(e))?;
        let mut l2p = L2p::new(
            sb.volumes_max,
            sb.layout.l2p_pool_pages,
            frames,
            sb.layout.l2p_area_start,
        );
        for d in &ck.directories {
            let Some(v) = ck.volumes.entries.iter().find(|e| e.id == d.volume) else {
                return Err(inconsistent(format!("directory for unknown {}", d.volume)));
            };
            let pages = v.size_blocks.div_ceil(shale_format::L2P_ENTRIES_PER_PAGE) as usize;
            if d.volume.0 >= sb.volumes_max || pages != d.pages.len() {
                return Err(inconsistent(format!(
                    "{}: {} directory pages for {} blocks",
                    d.volume,
                    d.pages.len(),
                    v.size_blocks
                )));
            }
            l2p.vols[d.volume.0 as usize] =
                Some(VolumeMap::from_dir(d.pages.clone(), v.size_blocks));
        }
        if ck
            .volumes
            .entries
            .iter()
            .any(|v| l2p.vols.get(v.id.0 as usize).is_none_or(Option::is_none))
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
        let volumes = Volumes {
            table: ck.volumes.clone(),
            user_capacity_blocks: sb.user_capacity_blocks,
            volumes_max: sb.volumes_max,
        };
        let generation = ck.header.generation;
        // After a crash the new checkpoint's generation must exceed every epoch the
        // crashed run could have written (at most generation + 1).
        let epoch = if clean { generation } else { generation + 1 };
        let journal = Journal::new(
            sb.layout.journal_start,
            sb.layout.journal_blocks,
            log.next,
            log.sequence,
            epoch,
        );
        let now = clock.now_ns();
        let dirs = ck.directories.len();
        let mut e = Self::assemble(
            cache,
            capacity,
            clock,
            config,
            sb,
            regions,
            l2p,
            volumes,
            journal,
            ck.header.sid_next,
            streams,
        );
        if area != named {
            // The next checkpoint goes to the area the on-disk superblock names: name
            // the loaded one first, or a crash during that write would leave the
            // superblock naming a torn area.
            e.core.sb.clean = false;
            e.write_superblock().map_err(OpenError::Engine)?;
        }
        steps.end(&e.core.clock, &mut report, 0, format!("{dirs} volumes"));

        if clean {
            steps.begin(&e.core.clock, "census");
            let zone_wps = e.zone_write_pointers()?;
            let mut meter = steps.meter("L2P pages");
            let bytes = e.census(true, &zone_wps, &mut meter)?;
            meter.finish();
            steps.end(&e.core.clock, &mut report, bytes, e.census_detail());

            steps.begin(&e.core.clock, "resume");
            // Free zones must be empty on the device before reuse, after a clean stop
            // too: a checkpoint records zones freed since the last durability point
            // as Free before their resets, and a crash can come between the two (then
            // a later clean shutdown carries the Free state forward).
            let mut meter = steps.meter("free zones");
            let stray = replay::reset_stray_zones(&mut e.core, &mut meter)?;
            meter.finish();
            e.resume_open_regions(now)?;
            e.write_superblock_dirty()?;
            steps.end(
                &e.core.clock,
                &mut report,
                0,
                format!("open regions resumed, {stray} stray zones reset"),
            );
        } else {
            steps.begin(&e.core.clock, "replay plan");
            let mut rp = replay::plan(
                &e.core.geo,
                &e.core.regions,
                &log.blocks,
                &mut report.warnings,
            );
            let detail = format!(
                "{} regions to scan, {} trims",
                rp.plans.len(),
                rp.trims.len()
            );
            steps.end(&e.core.clock, &mut report, 0, detail);

            steps.begin(&e.core.clock, "md scan");
            let zone_wps = e.zone_write_pointers()?;
            let mut meter = steps.meter("md groups");
            let bytes = replay::scan_md(&mut e.core, &mut rp, &mut report.warnings, &mut meter)?;
            meter.finish();
            let detail = format!(
                "{} md groups, {} entries",
                rp.counts.md_groups_read, rp.counts.entries_seen
            );
            steps.end(&e.core.clock, &mut report, bytes, detail);

            steps.begin(&e.core.clock, "resolve");
            let mut meter = steps.meter("versions");
            let bytes = replay::apply_replay(&mut e.core, &mut rp, &mut meter)?;
            meter.finish();
            let detail = format!(
                "{} versions mapped, {} superseded",
                rp.counts.entries_applied, rp.counts.entries_superseded
            );
            steps.end(&e.core.clock, &mut report, bytes, detail);

            steps.begin(&e.core.clock, "census");
            replay::close_replayed(&mut e.core, &rp, now)?;
            let mut meter = steps.meter("L2P pages");
            let bytes = e.census(false, &zone_wps, &mut meter)?;
            meter.finish();
            steps.end(&e.core.clock, &mut report, bytes, e.census_detail());

            steps.begin(&e.core.clock, "regions");
            let mut meter = steps.meter("free zones");
            rp.counts.stray_zones_reset = replay::reset_stray_zones(&mut e.core, &mut meter)?;
            meter.finish();
            for i in 0..e.core.geo.region_count() {
                e.core.regions.maybe_pending_free(RegionId(i));
            }
            e.core.sid_next = (e.core.sid_next + SID_LEASE).max(rp.max_sid + 1);
            let detail = format!(
                "{} regions closed, {} pending free, {} stray zones reset",
                rp.plans.len(),
                e.core.regions.pending_free.len(),
                rp.counts.stray_zones_reset
            );
            steps.end(&e.core.clock, &mut report, 0, detail);

            steps.begin(&e.core.clock, "new checkpoint");
            let mut meter = steps.meter("dirty L2P pages");
            e.checkpoint_metered(false, &mut meter)
                .map_err(OpenError::Engine)?;
            meter.finish();
            steps.end(
                &e.core.clock,
                &mut report,
                0,
                format!("generation {}", e.core.journal.epoch),
            );
            report.replay = rp.counts;
        }

        if e.core.config.open_self_check {
            steps.begin(&e.core.clock, "self-check");
            let reads0 = e.core.l2p.counters.page_reads;
            let mut meter = steps.meter("L2P pages");
            crate::selfcheck::self_check(&mut e.core, &e.writer, &mut meter)
                .map_err(|err| OpenError::Engine(EngineError::SelfCheck(err)))?;
            meter.finish();
            let bytes = (e.core.l2p.counters.page_reads - reads0) * BS;
            steps.end(&e.core.clock, &mut report, bytes, "ok".into());
        }
        e.core.open_report = report;
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
        let geo = self.core.geo.clone();
        let mut counted = vec![0u32; geo.region_count() as usize];
        let mut err: Option<OpenError> = None;
        self.core.regions.validity.clear_all();
        {
            let validity = &mut self.core.regions.validity;
            let regions = &self.core.regions.regions;
            self.core
                .l2p
                .for_each_mapped_metered(&mut self.core.cache, meter, |volume, lba, pba| {
                    if err.is_some() {
                        return;
                    }
                    let Some((r, slot)) = geo.region_slot(pba).filter(|&(r, slot)| {
                        Groups {
                            blocks: geo.region_blocks(r),
                        }
                        .is_data_slot(slot)
                    }) else {
                        err = Some(OpenError::InconsistentCheckpoint {
                            reason: format!("{volume} {lba} maps to {pba}, not a data slot"),
                        });
                        return;
                    };
                    let state = regions[r.0 as usize].state;
                    if !matches!(state, RegionState::Open | RegionState::Closed) {
                        err = Some(
                            RecoveryError::MappedIntoUnusedRegion {
                                volume,
                                lba,
                                pba,
                                region: r,
                                state: format!("{state:?}"),
                            }
                            .into(),
                        );
                        return;
                    }
                    if !geo.is_chunk(r) {
                        let wp = zone_wps
                            .get(geo.zone_of(r).0 as usize)
                            .copied()
                            .unwrap_or(0);
                        if slot >= wp {
                            err = Some(
                                RecoveryError::MappedPastWritePointer {
                                    volume,
                                    lba,
                                    pba,
                                    region: r,
                                    wp,
                                }
                                .into(),
                            );
                            return;
                        }
                    }
                    if validity.set(pba) {
                        err = Some(OpenError::InconsistentCheckpoint {
                            reason: format!("{pba} mapped twice ({volume} {lba})"),
                        });
                        return;
                    }
                    counted[r.0 as usize] += 1;
                })
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
                if self.core.geo.is_chunk(r) {
                    self.core.regions.free_chunks.push_back(r);
                } else {
                    self.core.regions.free_zones.push_back(r);
                }
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
            let slot_free =
                s < self.core.streams as usize && self.mover(role).streams[s].zone.is_none();
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
        // Staged relocations are dropped: their sources still hold the live copies.
        for role in [RegionRole::Compaction, RegionRole::Gc] {
            for s in 0..self.core.streams as usize {
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
        Ok((self.core.cache, self.core.capacity))
    }
}
