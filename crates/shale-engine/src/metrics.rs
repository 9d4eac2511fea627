//! Counters. Write amplification is reported as in DESIGN.md: layer WAF = bytes written
//! to the capacity device / bytes tenants wrote; cache writes are reported separately.

/// A snapshot of the engine's counters (bytes unless named otherwise).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub user_read_bytes: u64,
    pub user_write_bytes: u64,
    pub user_trim_bytes: u64,
    /// Blocks appended to the cache (user writes and read-modify-writes).
    pub user_blocks_appended: u64,

    pub cache_data_write_bytes: u64,
    /// md blocks, journal, L2P pages, checkpoints, superblock, volume table.
    pub cache_md_write_bytes: u64,
    pub cache_read_bytes: u64,

    /// Capacity writes by compaction, including md blocks, padding and direct
    /// writes' blocks (which leave in compaction's groups).
    pub capacity_compaction_write_bytes: u64,
    /// Capacity writes by GC, including md blocks and padding.
    pub capacity_gc_write_bytes: u64,
    /// Padding inside the two figures above.
    pub capacity_pad_bytes: u64,
    /// Direct writes' blocks inside compaction's figure (`write/direct.rs`).
    pub capacity_direct_write_bytes: u64,
    /// User bytes of writes that went straight to a zone, and of those, blocks
    /// mapped in their zone, superseded before (by a newer write, trim or volume
    /// change), and written to the cache after waiting too long for a full group.
    pub direct_write_bytes: u64,
    pub direct_blocks_mapped: u64,
    pub direct_blocks_superseded: u64,
    pub direct_blocks_to_cache: u64,
    /// Pad blocks that keep a mapping unit in one region: in the cache before user
    /// units, in zones before moved ones.
    pub unit_pad_blocks: u64,
    pub capacity_read_bytes: u64,

    pub zone_resets: u64,
    pub chunk_frees: u64,
    pub compaction_victims: u64,
    pub gc_victims: u64,
    pub relocated_blocks: u64,
    /// Relocations that lost to a newer write or trim: copies born invalid, and
    /// staged blocks dropped before they were written.
    pub relocations_superseded: u64,

    pub l2p_hits: u64,
    pub l2p_misses: u64,
    pub l2p_page_reads: u64,
    pub l2p_page_writes: u64,
    /// Of those, pages loaded ahead of the requests that needed them, and dirty pages
    /// written back ahead of their eviction (asynchronous; the rest were synchronous).
    pub l2p_page_reads_ahead: u64,
    pub l2p_page_writes_ahead: u64,
    pub(crate) l2p_page_writes_total: u64,
    /// Relocation switches that waited for their page's next fault instead of
    /// faulting it in, and pages faulted in only because too many waited.
    pub l2p_deferred_switches: u64,
    pub l2p_deferred_faults: u64,
    /// Dirty L2P pages evicted as deferred switches of their changed entries
    /// instead of written back.
    pub l2p_evictions_as_switches: u64,
    /// Deferred switches waiting now.
    pub l2p_deferred_waiting: u64,
    pub l2p_cached_pages: u64,
    pub l2p_cache_pages_max: u64,
    /// Bytes per L2P entry: 4, or 5 in pools past 2^32 blocks.
    pub l2p_entry_bytes: u8,
    pub md_cache_hits: u64,
    pub md_cache_misses: u64,
    /// md reads issued with the data read (asynchronous) and on the synchronous
    /// fallback (read-modify-write, or the md evicted before its data arrived).
    pub md_reads: u64,
    pub md_reads_sync: u64,

    /// Checkpoints committed (synchronous and incremental).
    pub checkpoints: u64,
    /// Incremental checkpoints started, and the L2P pages they wrote in the background.
    pub checkpoints_started: u64,
    pub checkpoint_page_writes: u64,
    /// L2P switches committed checkpoints recorded in their switch tables instead of
    /// writing the switches' pages.
    pub checkpoint_switches: u64,
    /// The validity bits are still being rebuilt after a clean open (compaction and
    /// GC wait), and the L2P pages that rebuild has walked so far.
    pub census_pending: bool,
    pub census_pages: u64,
    pub durability_points: u64,
    /// Hand-off images stored, and their bytes (`handoff.rs`).
    pub handoff_stores: u64,
    pub handoff_bytes: u64,
    /// Requests of rate-limited volumes waiting now, and requests the limits delayed
    /// (`throttle.rs`).
    pub throttle_waiting: u64,
    pub throttle_waits: u64,
    /// Flushes that found everything already durable (no device I/O).
    pub idle_flushes: u64,
    /// Allocation (block status) queries answered.
    pub allocation_queries: u64,
    /// Data or md checksum failures seen (reads and relocations).
    pub crc_errors: u64,
    /// Victim blocks whose CRC failed on the first read and matched on a second.
    pub crc_reread_fixes: u64,
    /// Capacity blocks (and md) whose copy failed its checksum and that the device
    /// rebuilt from its redundancy (an array's other members), correct.
    pub crc_rebuilt_fixes: u64,
    /// Rebuilt blocks staged to be written anew (the corrupt copy becomes garbage).
    pub repairs_staged: u64,
    /// Blocks user reads found in the cold tier, and those staged to go back to the
    /// fast tier (read often: `tier.rs`).
    pub cold_read_blocks: u64,
    pub promotions_staged: u64,
    /// Bytes the background scrub read, and the blocks it found failing their check.
    pub scrub_bytes: u64,
    pub scrub_errors: u64,
    /// Valid blocks the scrub found whose md entry's (volume, LBA) does not map back
    /// to them: the L2P and the validity bits disagree (0 unless metadata is damaged).
    pub scrub_mapping_errors: u64,

    pub free_chunks: u64,
    pub chunk_count: u64,
    /// Free zones of the fast tier (every tier's, without a cold one).
    pub free_zones: u64,
    /// Data zones (zone 0 holds the label), the cold tier's included.
    pub data_zone_count: u64,
    /// Zones of the cold tier, and the free ones among them.
    pub cold_zone_count: u64,
    pub free_cold_zones: u64,
    /// Zones of the capacity device that are another shard's here (a pool whose
    /// shards share the device: `space/lend.rs`); not in `data_zone_count`.
    pub foreign_zones: u64,
    /// Zones given to the space manager, and taken from it.
    pub zones_given: u64,
    pub zones_taken: u64,
    /// Chunks of the cache that are another shard's here (a pool whose shards
    /// share the cache); not in `chunk_count`.
    pub foreign_chunks: u64,
    /// Chunks given to the space manager, and taken from it.
    pub chunks_given: u64,
    pub chunks_taken: u64,
    pub streams: u64,
    /// Blocks read out of victims and waiting in DRAM for a full group.
    pub staged_blocks: u64,
    /// I/O buffers allocated (the pool was empty for the size); flat in steady state.
    pub io_buffer_allocs: u64,
    /// Bytes of idle I/O buffers kept for reuse.
    pub io_buffer_pool_bytes: u64,
    /// Bytes of md blocks cached (at most `md_cache_bytes_max`).
    pub md_cache_bytes: u64,

    /// Per live volume, since the engine opened (or the volume was created). In a
    /// snapshot from `Engine::stats`, one entry per live volume in slot order.
    pub volumes: Vec<VolumeStats>,
}

/// One volume's counters. Capacity bytes count the volume's data blocks that
/// compaction and GC moved into zones and that were still live when written; md
/// blocks, padding and copies a newer write overtook are pool-wide overhead, in
/// [`Stats`] only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeStats {
    pub id: shale_format::VolumeId,
    pub uid: shale_format::VolumeUid,
    pub read_ops: u64,
    pub write_ops: u64,
    pub trim_ops: u64,
    pub user_read_bytes: u64,
    pub user_write_bytes: u64,
    pub user_trim_bytes: u64,
    /// Data blocks appended to the cache for this volume (writes and
    /// read-modify-writes).
    pub cache_write_bytes: u64,
    pub capacity_compaction_write_bytes: u64,
    pub capacity_gc_write_bytes: u64,
    /// Rate limits (`throttle.rs`): requests waiting now, requests the limits
    /// delayed, and their time waiting (since the engine started).
    pub throttle_waiting: u64,
    pub throttle_delayed: u64,
    pub throttle_wait_ns: u64,
    /// Its valid blocks in the cache now, in bytes (what a cache share bounds).
    pub cache_valid_bytes: u64,
    /// The size of its L2P table (pages of entries, one per block or per mapping
    /// unit), in bytes: what it takes of the L2P area, and of memory when cached.
    pub l2p_table_bytes: u64,
    /// Of that, a dual volume's sparse map of 4 KiB overrides: its pages in use.
    pub l2p_sparse_bytes: u64,
}

impl VolumeStats {
    pub fn capacity_write_bytes(&self) -> u64 {
        self.capacity_compaction_write_bytes + self.capacity_gc_write_bytes
    }

    /// This volume's capacity bytes written per byte it wrote.
    pub fn layer_waf(&self) -> f64 {
        ratio(self.capacity_write_bytes(), self.user_write_bytes)
    }
}

impl Stats {
    pub fn capacity_write_bytes(&self) -> u64 {
        self.capacity_compaction_write_bytes + self.capacity_gc_write_bytes
    }

    /// Capacity bytes written per user byte written.
    pub fn layer_waf(&self) -> f64 {
        ratio(self.capacity_write_bytes(), self.user_write_bytes)
    }

    /// Cache bytes written (data and metadata) per user byte written.
    pub fn cache_waf(&self) -> f64 {
        ratio(
            self.cache_data_write_bytes + self.cache_md_write_bytes,
            self.user_write_bytes,
        )
    }

    pub fn l2p_hit_rate(&self) -> f64 {
        ratio(self.l2p_hits, self.l2p_hits + self.l2p_misses)
    }
}

impl Stats {
    /// Adds `other`'s counters and gauges to these: the figures of a pool of shards
    /// are the sum of its shards' (a volume's by uid). Of what cannot be summed, the
    /// L2P entry width is the widest and a census is pending while any is.
    #[allow(
        clippy::too_many_lines,
        reason = "a line per counter, destructured so that none is missed"
    )]
    pub fn absorb(&mut self, other: &Stats) {
        // Destructured so a new field is a compile error here until it is merged.
        let Stats {
            user_read_bytes,
            user_write_bytes,
            user_trim_bytes,
            user_blocks_appended,
            cache_data_write_bytes,
            cache_md_write_bytes,
            cache_read_bytes,
            capacity_compaction_write_bytes,
            capacity_gc_write_bytes,
            capacity_pad_bytes,
            capacity_direct_write_bytes,
            direct_write_bytes,
            direct_blocks_mapped,
            direct_blocks_superseded,
            direct_blocks_to_cache,
            unit_pad_blocks,
            capacity_read_bytes,
            zone_resets,
            chunk_frees,
            compaction_victims,
            gc_victims,
            relocated_blocks,
            relocations_superseded,
            l2p_hits,
            l2p_misses,
            l2p_page_reads,
            l2p_page_writes,
            l2p_page_reads_ahead,
            l2p_page_writes_ahead,
            l2p_page_writes_total,
            l2p_deferred_switches,
            l2p_deferred_faults,
            l2p_evictions_as_switches,
            l2p_deferred_waiting,
            l2p_cached_pages,
            l2p_cache_pages_max,
            md_cache_hits,
            md_cache_misses,
            md_reads,
            md_reads_sync,
            checkpoints,
            checkpoints_started,
            checkpoint_page_writes,
            checkpoint_switches,
            census_pages,
            durability_points,
            handoff_stores,
            handoff_bytes,
            throttle_waiting,
            throttle_waits,
            idle_flushes,
            allocation_queries,
            crc_errors,
            crc_reread_fixes,
            crc_rebuilt_fixes,
            repairs_staged,
            cold_read_blocks,
            promotions_staged,
            scrub_bytes,
            scrub_errors,
            scrub_mapping_errors,
            free_chunks,
            chunk_count,
            free_zones,
            data_zone_count,
            cold_zone_count,
            free_cold_zones,
            foreign_zones,
            zones_given,
            zones_taken,
            foreign_chunks,
            chunks_given,
            chunks_taken,
            streams,
            staged_blocks,
            io_buffer_allocs,
            io_buffer_pool_bytes,
            md_cache_bytes,
            l2p_entry_bytes,
            census_pending,
            volumes,
        } = other;
        self.user_read_bytes += user_read_bytes;
        self.user_write_bytes += user_write_bytes;
        self.user_trim_bytes += user_trim_bytes;
        self.user_blocks_appended += user_blocks_appended;
        self.cache_data_write_bytes += cache_data_write_bytes;
        self.cache_md_write_bytes += cache_md_write_bytes;
        self.cache_read_bytes += cache_read_bytes;
        self.capacity_compaction_write_bytes += capacity_compaction_write_bytes;
        self.capacity_gc_write_bytes += capacity_gc_write_bytes;
        self.capacity_pad_bytes += capacity_pad_bytes;
        self.capacity_direct_write_bytes += capacity_direct_write_bytes;
        self.direct_write_bytes += direct_write_bytes;
        self.direct_blocks_mapped += direct_blocks_mapped;
        self.direct_blocks_superseded += direct_blocks_superseded;
        self.direct_blocks_to_cache += direct_blocks_to_cache;
        self.unit_pad_blocks += unit_pad_blocks;
        self.capacity_read_bytes += capacity_read_bytes;
        self.zone_resets += zone_resets;
        self.chunk_frees += chunk_frees;
        self.compaction_victims += compaction_victims;
        self.gc_victims += gc_victims;
        self.relocated_blocks += relocated_blocks;
        self.relocations_superseded += relocations_superseded;
        self.l2p_hits += l2p_hits;
        self.l2p_misses += l2p_misses;
        self.l2p_page_reads += l2p_page_reads;
        self.l2p_page_writes += l2p_page_writes;
        self.l2p_page_reads_ahead += l2p_page_reads_ahead;
        self.l2p_page_writes_ahead += l2p_page_writes_ahead;
        self.l2p_page_writes_total += l2p_page_writes_total;
        self.l2p_deferred_switches += l2p_deferred_switches;
        self.l2p_deferred_faults += l2p_deferred_faults;
        self.l2p_evictions_as_switches += l2p_evictions_as_switches;
        self.l2p_deferred_waiting += l2p_deferred_waiting;
        self.l2p_cached_pages += l2p_cached_pages;
        self.l2p_cache_pages_max += l2p_cache_pages_max;
        self.md_cache_hits += md_cache_hits;
        self.md_cache_misses += md_cache_misses;
        self.md_reads += md_reads;
        self.md_reads_sync += md_reads_sync;
        self.checkpoints += checkpoints;
        self.checkpoints_started += checkpoints_started;
        self.checkpoint_page_writes += checkpoint_page_writes;
        self.checkpoint_switches += checkpoint_switches;
        self.census_pages += census_pages;
        self.durability_points += durability_points;
        self.handoff_stores += handoff_stores;
        self.handoff_bytes += handoff_bytes;
        self.throttle_waiting += throttle_waiting;
        self.throttle_waits += throttle_waits;
        self.idle_flushes += idle_flushes;
        self.allocation_queries += allocation_queries;
        self.crc_errors += crc_errors;
        self.crc_reread_fixes += crc_reread_fixes;
        self.crc_rebuilt_fixes += crc_rebuilt_fixes;
        self.repairs_staged += repairs_staged;
        self.cold_read_blocks += cold_read_blocks;
        self.promotions_staged += promotions_staged;
        self.scrub_bytes += scrub_bytes;
        self.scrub_errors += scrub_errors;
        self.scrub_mapping_errors += scrub_mapping_errors;
        self.free_chunks += free_chunks;
        self.chunk_count += chunk_count;
        self.free_zones += free_zones;
        self.data_zone_count += data_zone_count;
        self.cold_zone_count += cold_zone_count;
        self.free_cold_zones += free_cold_zones;
        self.foreign_zones += foreign_zones;
        self.zones_given += zones_given;
        self.zones_taken += zones_taken;
        self.foreign_chunks += foreign_chunks;
        self.chunks_given += chunks_given;
        self.chunks_taken += chunks_taken;
        self.streams += streams;
        self.staged_blocks += staged_blocks;
        self.io_buffer_allocs += io_buffer_allocs;
        self.io_buffer_pool_bytes += io_buffer_pool_bytes;
        self.md_cache_bytes += md_cache_bytes;
        self.l2p_entry_bytes = self.l2p_entry_bytes.max(*l2p_entry_bytes);
        self.census_pending |= *census_pending;
        for v in volumes {
            match self.volumes.iter_mut().find(|x| x.uid == v.uid) {
                Some(x) => x.absorb(v),
                None => self.volumes.push(v.clone()),
            }
        }
    }
}

impl VolumeStats {
    /// Adds another shard's counters of the same volume (`Stats::absorb`); the id
    /// stays this one's.
    pub fn absorb(&mut self, other: &VolumeStats) {
        let VolumeStats {
            id: _,
            uid: _,
            read_ops,
            write_ops,
            trim_ops,
            user_read_bytes,
            user_write_bytes,
            user_trim_bytes,
            cache_write_bytes,
            capacity_compaction_write_bytes,
            capacity_gc_write_bytes,
            throttle_waiting,
            throttle_delayed,
            throttle_wait_ns,
            cache_valid_bytes,
            l2p_table_bytes,
            l2p_sparse_bytes,
        } = other;
        self.read_ops += read_ops;
        self.write_ops += write_ops;
        self.trim_ops += trim_ops;
        self.user_read_bytes += user_read_bytes;
        self.user_write_bytes += user_write_bytes;
        self.user_trim_bytes += user_trim_bytes;
        self.cache_write_bytes += cache_write_bytes;
        self.capacity_compaction_write_bytes += capacity_compaction_write_bytes;
        self.capacity_gc_write_bytes += capacity_gc_write_bytes;
        self.throttle_waiting += throttle_waiting;
        self.throttle_delayed += throttle_delayed;
        self.throttle_wait_ns += throttle_wait_ns;
        self.cache_valid_bytes += cache_valid_bytes;
        self.l2p_table_bytes += l2p_table_bytes;
        self.l2p_sparse_bytes += l2p_sparse_bytes;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// A snapshot of the counters, with gauges filled in (the staged blocks are the
/// movers').
pub(crate) fn snapshot(
    core: &crate::core::Core<
        impl shale_device::BlockDevice,
        impl shale_device::ZonedDevice,
        impl crate::Clock,
    >,
    staged_blocks: usize,
) -> Stats {
    let mut s = core.stats.clone();
    let l = &core.l2p.counters;
    s.l2p_hits = l.hits;
    s.l2p_misses = l.misses;
    s.l2p_page_reads = l.page_reads;
    s.l2p_page_writes = l.page_writes;
    s.l2p_page_reads_ahead = l.reads_ahead;
    s.l2p_page_writes_ahead = l.writes_ahead;
    // L2P pages are counted here, wherever they were written (evictions,
    // checkpoints), not at each call site.
    s.cache_md_write_bytes += l.page_writes * crate::layout::BS;
    s.l2p_deferred_switches = l.deferred;
    s.l2p_deferred_faults = l.deferred_faults;
    s.l2p_evictions_as_switches = l.evicted_as_switches;
    s.l2p_deferred_waiting = core.l2p.deferred_switches().0 as u64;
    s.l2p_cached_pages = core.l2p.cached_pages() as u64;
    s.l2p_cache_pages_max = core.l2p.frames_max() as u64;
    s.l2p_entry_bytes = core.l2p.format().entry_bytes();
    s.md_cache_hits = core.md_cache.hits;
    s.md_cache_misses = core.md_cache.misses;
    s.census_pending = core.regions.census_pending;
    s.census_pages = core
        .census
        .as_ref()
        .map_or(core.stats.census_pages, |c| c.pages);
    s.free_chunks = core.regions.free_chunks.len() as u64;
    s.foreign_chunks = u64::from(core.regions.foreign_chunks);
    s.chunk_count = u64::from(core.regions.owned_chunks(&core.geo));
    s.free_zones = core.regions.free_zones.len() as u64;
    s.free_cold_zones = core.regions.free_cold_zones.len() as u64;
    s.foreign_zones = crate::space::lend::foreign_zones(&core.regions) as u64;
    s.data_zone_count = u64::from(core.geo.zone_count - 1) - s.foreign_zones;
    s.cold_zone_count = u64::from(core.sb.cold_zones);
    s.io_buffer_allocs = core.bufs.allocs;
    s.io_buffer_pool_bytes = core.bufs.pooled_bytes();
    s.md_cache_bytes = core.md_cache.cached_bytes();
    s.staged_blocks = staged_blocks as u64;
    s.volumes = core
        .volumes
        .table
        .entries
        .iter()
        .map(|v| match core.stats.volumes.get(v.id.0 as usize) {
            Some(c) if c.uid == v.uid => c.clone(),
            _ => VolumeStats {
                id: v.id,
                uid: v.uid,
                ..VolumeStats::default()
            },
        })
        .collect();
    s
}
