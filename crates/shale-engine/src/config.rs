//! Engine configuration. Format-time fields are recorded in the superblock and taken
//! from there on open; the rest are runtime knobs.

use crate::compaction::policy::CompactionPolicyKind;
use crate::gc::policy::GcPolicyKind;
use crate::placement::PlacementKind;
use crate::ConfigError;
use shale_format::{ShardTag, GROUP_BLOCKS, SHARDS_MAX, VOLUMES_MAX};

/// Which large writes go straight to a zone (`write/direct.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DirectWritePolicy {
    /// Only a write that starts where an earlier large write of its volume ended
    /// (`write/sequential.rs`): sequential runs are cold, large random writes often
    /// hot, and the cache absorbs their overwrites.
    #[default]
    Sequential,
    /// Every large write.
    Any,
}

impl std::str::FromStr for DirectWritePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sequential" => Ok(DirectWritePolicy::Sequential),
            "any" => Ok(DirectWritePolicy::Any),
            other => Err(format!(
                "unknown direct write policy {other:?} (expected sequential or any)"
            )),
        }
    }
}

impl std::fmt::Display for DirectWritePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DirectWritePolicy::Sequential => "sequential",
            DirectWritePolicy::Any => "any",
        })
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    // ---- recorded at format time ----
    /// Blocks per cache chunk; a multiple of 128.
    pub chunk_blocks: u32,
    pub volumes_max: u32,
    /// Spare factor Sf = spare / physical capacity space.
    pub spare_factor: f64,
    pub journal_blocks: u32,
    /// Bytes per L2P entry (4: pools up to 16 TiB of PBAs, 5: up to 4 PiB); `None`
    /// takes the narrowest that addresses the pool. Forcing 5 on a small pool runs
    /// the wide format where tests can reach it.
    pub l2p_entry_bytes: Option<u8>,
    /// Which shard of a pool of several this engine is (`shale-shards`); a pool of
    /// one shard by default.
    pub shard: ShardTag,
    /// Zones at the end of the capacity device that are a slower, cold tier (the
    /// device is then the fast one's zones followed by the cold one's, as
    /// `shale_device::ZonedConcat::tiers` makes it); 0: one tier. GC moves every
    /// block it relocates into the cold tier, and blocks read often there come back
    /// (`promote_reads`).
    pub cold_zones: u32,
    /// The pool's UUID, for a caller that labels devices of its own with it (the
    /// daemon's cold tier). At format: the superblock's and the capacity label's (a
    /// new one when `None`). At open: the UUID such a device was labelled with; the
    /// pool is refused (`OpenError::ForeignDevice`) when its superblock's differs.
    pub pool_uuid: Option<[u8; 16]>,
    /// At format, on a capacity device the shards of a pool share (each through its
    /// own view, `shale_device::SharedZones`): this shard owns zones `0..n` of its
    /// view (zone 0 its label) and the others are Foreign here (`space/lend.rs`);
    /// its user capacity is what those zones hold, and only they are reset. `None`:
    /// every zone.
    pub zones_owned: Option<u32>,
    /// At format, on a cache the shards of a pool share (each through its own view):
    /// this shard owns chunks `0..n` of its view and the others are Foreign here
    /// (`space/lend.rs`). `None`: every chunk.
    pub chunks_owned: Option<u32>,
    /// At format: the cache's chunks begin no earlier than this byte (a cache the
    /// shards share: each shard's metadata window ends there). `None`: right after
    /// the metadata.
    pub cache_data_start_min: Option<u64>,

    // ---- runtime ----
    /// Compaction runs while free chunks are below this percentage of all chunks.
    pub compaction_free_chunks_pct: u32,
    /// GC runs while free zones are below this.
    pub gc_free_zones_min: u32,
    /// DRAM for cached L2P pages; `None` = the default budget below.
    pub l2p_cache_bytes_max: Option<u64>,
    /// The default L2P budget: 1/`l2p_cache_divisor` of the table counted at 4 bytes
    /// an entry (20: 41 MiB per TiB of volumes, which keeps the engine within 100 MiB
    /// per TiB of capacity; the seeds' configuration caches 1/8)...
    pub l2p_cache_divisor: u32,
    /// ... and never less than the whole table up to this many bytes (32 MiB: pools of
    /// up to 32 GiB of volumes, the daemon's embedded default among them, stay wholly
    /// cached; 0 for the plain ratio).
    pub l2p_cache_floor_bytes: u64,
    /// Pages kept back for background work.
    pub l2p_reserved_pages: u32,
    /// DRAM for cached md (used to verify reads): per-entry checks and, in an eighth,
    /// whole blocks. 4 MiB covers about 3.3 GiB of data; at TiB scale random reads miss any affordable md cache
    /// (a miss is one md read issued with the data read), so more buys little.
    pub md_cache_bytes_max: u64,
    /// In-memory group buffers for user writes (backpressure when all are unsettled).
    pub write_buffers_max: u32,
    /// Largest read or write request; larger ones are refused.
    pub request_bytes_max: u64,
    /// Placement streams (each has one compaction zone and one GC zone open); volumes
    /// share streams by `volume id % streams` when there are more volumes.
    pub streams_max: u32,
    pub compaction_policy: CompactionPolicyKind,
    pub gc_policy: GcPolicyKind,
    /// How relocations are spread over the streams (`placement.rs`).
    pub placement: PlacementKind,
    /// Requests taken from the queue per engine loop iteration.
    pub requests_per_poll_max: u32,
    /// Background steps run per loop iteration at most (each moves <= one group).
    pub background_steps_per_poll_max: u32,
    /// User bytes written between periodic checkpoints; `None` = 1/16 of the user
    /// capacity.
    pub checkpoint_interval_bytes: Option<u64>,
    /// L2P pages a checkpoint writes per loop iteration (bounding the stall it adds to
    /// user I/O); 0 takes periodic checkpoints synchronously.
    pub checkpoint_pages_per_poll: u32,
    /// Recover after an unclean stop; when false, open refuses with `NeedsRecovery`.
    pub recover: bool,
    /// Run the self-check at the end of open (its cost follows the region count; the
    /// census before it has walked the L2P).
    pub open_self_check: bool,
    /// After a clean shutdown, rebuild the validity bits in the background while I/O
    /// is served (`census.rs`) instead of walking every L2P page before the open
    /// returns. Compaction and GC wait for it (or finish it when space runs short).
    pub census_in_background: bool,
    /// L2P pages the background census walks per loop iteration while space is not
    /// short (read in runs of nearby slots: 256 pages are at most 1 MiB).
    pub census_pages_per_poll: u32,
    /// Check each block compaction moves against its CRC (GC always checks). A copy
    /// keeps its original CRC, so a corrupt block stays detectable on every later
    /// read either way; checking before the source is erased only adds the chance to
    /// heal a transient read error by reading again. That matters on the capacity
    /// tier (QLC, data at rest for long, a zone reset erases the source), hardly on
    /// the cache tier (fast media written moments ago), and costs a CRC per block,
    /// so compaction skips it unless asked, or unless the cache is mirrored: then a
    /// block failing its check is read from another mirror, and the good copy is
    /// what reaches the capacity tier (and its parity). The daemon turns it on with
    /// two or more cache devices.
    pub verify_compaction_reads: bool,
    /// How long (engine clock) a write may wait for cache space, or queued work go
    /// without any progress and no I/O in flight, before the engine declares itself
    /// stuck and fails. Time, not loop iterations: a slow device slows the loop, a
    /// fast spin speeds it up, and neither should decide when to give up.
    pub stuck_after_ms: u64,
    /// Pace of the background scrub over the capacity zones in use, bytes per
    /// second of engine-clock time; 0 turns it off (`scrub.rs`).
    pub scrub_bytes_per_sec: u64,
    /// Writes of at least this many bytes (whole blocks) go straight to a zone
    /// instead of through the cache (`write/direct.rs`); 0 sends every write through
    /// the cache.
    pub direct_write_min_bytes: u64,
    /// Which writes of at least `direct_write_min_bytes` go straight to a zone.
    pub direct_write_policy: DirectWritePolicy,
    /// Under `Sequential`: how long a run of such writes, each where the one before
    /// ended, must be before the writes continuing it go straight to a zone.
    pub direct_run_min_bytes: u64,
    /// How long (engine clock, microseconds) a direct write's blocks wait for a zone
    /// group to fill before they go to the cache instead.
    pub direct_linger_us: u64,
    /// With a cold tier: reads of a 1 MiB extent of a volume (its heat, halved as
    /// reads go on) that bring a block read from the cold tier back into the fast
    /// one; 0 never does.
    pub promote_reads: u32,
    /// How long (engine clock, microseconds) blocks on their way back wait for a
    /// zone group to fill before the group is written padded.
    pub promote_linger_us: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            chunk_blocks: 1024,
            volumes_max: 16,
            spare_factor: 0.18,
            journal_blocks: 256,
            l2p_entry_bytes: None,
            shard: ShardTag::ONE,
            cold_zones: 0,
            zones_owned: None,
            chunks_owned: None,
            cache_data_start_min: None,
            pool_uuid: None,
            compaction_free_chunks_pct: 20,
            gc_free_zones_min: 5,
            l2p_cache_bytes_max: None,
            l2p_cache_divisor: 20,
            l2p_cache_floor_bytes: 32 << 20,
            l2p_reserved_pages: 4,
            md_cache_bytes_max: 4 << 20,
            write_buffers_max: 16,
            request_bytes_max: 4 << 20,
            streams_max: 8,
            compaction_policy: CompactionPolicyKind::FifoOldestClosed,
            gc_policy: GcPolicyKind::Greedy,
            placement: PlacementKind::Volume,
            requests_per_poll_max: 256,
            background_steps_per_poll_max: 4,
            checkpoint_interval_bytes: None,
            checkpoint_pages_per_poll: 16,
            recover: true,
            open_self_check: true,
            census_in_background: true,
            census_pages_per_poll: 256,
            verify_compaction_reads: false,
            stuck_after_ms: 60_000,
            scrub_bytes_per_sec: 0,
            direct_write_min_bytes: 0,
            direct_write_policy: DirectWritePolicy::Sequential,
            direct_run_min_bytes: 1 << 20,
            direct_linger_us: 2_000,
            promote_reads: 4,
            promote_linger_us: 50_000,
        }
    }
}

impl Config {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, reason: String| Err(ConfigError::Invalid { field, reason });
        if self.chunk_blocks == 0 || !self.chunk_blocks.is_multiple_of(GROUP_BLOCKS) {
            return bad(
                "chunk_blocks",
                format!(
                    "{} is not a positive multiple of {GROUP_BLOCKS}",
                    self.chunk_blocks
                ),
            );
        }
        if self.stuck_after_ms == 0 {
            return bad("stuck_after_ms", "must be positive".into());
        }
        if self.volumes_max == 0 || self.volumes_max > VOLUMES_MAX {
            return bad(
                "volumes_max",
                format!("{} not in 1..={VOLUMES_MAX}", self.volumes_max),
            );
        }
        if !(0.0..0.9).contains(&self.spare_factor) {
            return bad(
                "spare_factor",
                format!("{} not in [0, 0.9)", self.spare_factor),
            );
        }
        if self.journal_blocks < 8 || !self.journal_blocks.is_multiple_of(2) {
            return bad(
                "journal_blocks",
                format!(
                    "{} is not an even number >= 8 (entries are mirrored block pairs)",
                    self.journal_blocks
                ),
            );
        }
        if self.compaction_free_chunks_pct > 90 {
            return bad(
                "compaction_free_chunks_pct",
                format!("{} > 90", self.compaction_free_chunks_pct),
            );
        }
        if self.write_buffers_max < 2 {
            return bad(
                "write_buffers_max",
                format!("{} < 2", self.write_buffers_max),
            );
        }
        if self.request_bytes_max < 4096 || self.request_bytes_max > 16 << 20 {
            return bad(
                "request_bytes_max",
                format!("{} not in 4096..=16 MiB", self.request_bytes_max),
            );
        }
        let groups = self
            .request_bytes_max
            .div_ceil(4096)
            .div_ceil(shale_format::GROUP_DATA_SLOTS as u64)
            + 2;
        if u64::from(self.write_buffers_max) < groups {
            return bad(
                "write_buffers_max",
                format!(
                    "{} buffers cannot hold a request of {} bytes (need {groups})",
                    self.write_buffers_max, self.request_bytes_max
                ),
            );
        }
        let t = &self.shard;
        if t.count == 0 || t.count > SHARDS_MAX || t.index >= t.count {
            return bad(
                "shard",
                format!("shard {} of {} (1..={SHARDS_MAX} shards)", t.index, t.count),
            );
        }
        if self.streams_max == 0 {
            return bad("streams_max", "0".into());
        }
        if self.direct_write_min_bytes != 0
            && (self.direct_write_min_bytes < 4096
                || !self.direct_write_min_bytes.is_multiple_of(4096))
        {
            return bad(
                "direct_write_min_bytes",
                format!(
                    "{} is neither 0 (off) nor a positive multiple of 4096",
                    self.direct_write_min_bytes
                ),
            );
        }
        if self.direct_run_min_bytes == 0 {
            return bad("direct_run_min_bytes", "must be positive".into());
        }
        if self.requests_per_poll_max == 0 || self.background_steps_per_poll_max == 0 {
            return bad(
                "requests_per_poll_max",
                "per-poll limits must be positive".into(),
            );
        }
        Ok(())
    }

    /// L2P pages the largest request can touch, plus the reserve and a margin.
    pub fn l2p_min_pages(&self) -> u64 {
        let req_blocks = self.request_bytes_max.div_ceil(4096) + 1;
        // The narrower page count of wide entries bounds both formats.
        req_blocks.div_ceil(shale_format::L2pFormat::WIDE.entries_per_page())
            + 1
            + u64::from(self.l2p_reserved_pages)
            + 2
    }

    /// The L2P page budget for `user_blocks` of volumes mapped in `table_pages` pages;
    /// refuses budgets that are too small to make progress.
    pub fn l2p_budget_pages(&self, user_blocks: u64, table_pages: u64) -> Result<u64, ConfigError> {
        let min = self.l2p_min_pages();
        match self.l2p_cache_bytes_max {
            Some(bytes) => {
                let pages = bytes / 4096;
                if pages < min {
                    return Err(ConfigError::L2pBudgetTooSmall {
                        bytes,
                        pages,
                        min_pages: min,
                        reserved: self.l2p_reserved_pages,
                    });
                }
                Ok(pages)
            }
            None => {
                let share = user_blocks.div_ceil(1024) / u64::from(self.l2p_cache_divisor.max(1));
                let floor = table_pages.min(self.l2p_cache_floor_bytes / 4096);
                Ok(share.max(floor).max(min))
            }
        }
    }
}
