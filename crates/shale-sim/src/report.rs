//! What a run found: counters of every outcome, the first violation (with what it
//! takes to replay it), and a hash of the whole trace (equal seeds must give equal
//! hashes).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::sim::Mode;

/// A running hash of everything that happened in a run (requests, results, crash
/// points, crash reports, recoveries). Stable across builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace(pub u64);

impl Default for Trace {
    fn default() -> Self {
        Trace(0x243F_6A88_85A3_08D3)
    }
}

impl Trace {
    pub fn mix(&mut self, x: u64) {
        let mut h = (self.0 ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        h ^= h >> 31;
        h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 27;
        self.0 = h;
    }

    pub fn mix_str(&mut self, s: &str) {
        self.mix(s.len() as u64);
        for c in s.as_bytes().chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
    }
}

/// Counters of a run (or of many runs, added up).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counts {
    /// Crash points reached (each is one cycle: a crash, a live check, or a crash
    /// after a clean shutdown).
    pub cycles: u64,
    /// Devices crashed and reopened (every mode but live checks).
    pub crashes: u64,
    /// Opens after a crash that succeeded and whose volumes were verified against the
    /// model (dirty crashes only; see `clean_reopens` for the others).
    pub recovered: u64,
    /// Opens refused with `OpenError::NeedsRecovery` (dirty recovery not available).
    pub needs_recovery: u64,
    /// Clean shutdowns followed by a crash and a reopen verified exactly.
    pub clean_reopens: u64,
    /// Crash points inside a clean shutdown.
    pub crashes_in_shutdown: u64,
    /// Crashes during an open (a crash during recovery), followed by another open.
    pub crashes_in_open: u64,
    /// Crash points checked against the live engine instead (live mode).
    pub live_checks: u64,
    /// Fresh formats (the first of a run, and one after every refused open).
    pub lineages: u64,
    /// Volumes created mapped in units larger than a block.
    pub unit_volumes: u64,
    /// Of those, dual mapped; and dual volumes refused for want of L2P room.
    pub dual_volumes: u64,
    pub dual_refusals: u64,
    /// Formats with a cold tier (the last third of the zones).
    pub tiered_lineages: u64,
    /// Crash points by kind (`step`, `when:gc`, `trip:checkpoint`, ...), and how
    /// many armed ones never happened before their deadline (`...:missed`).
    pub moments: BTreeMap<String, u64>,
    /// Crash modes used per device (`cache:drop-all`, `capacity:tear-write`, ...).
    pub crash_modes: BTreeMap<String, u64>,
    /// Writes torn by a crash.
    pub torn_writes: u64,
    /// Non-durable pending writes a crash kept, dropped.
    pub pending_kept: u64,
    pub pending_dropped: u64,
    /// Non-durable writes left pending after a clean shutdown, by what they touch.
    pub pending_after_shutdown: BTreeMap<String, u64>,
    /// Requests submitted, and their bytes.
    pub requests: u64,
    pub bytes_written: u64,
    /// Blocks read back and checked against the model after a crash or at a live check.
    pub blocks_verified: u64,
    /// Blocks that read back as an older allowed version (not the newest) after a crash.
    pub blocks_older: u64,
    /// Blocks read back that the model could not check: content a failed request
    /// left unknown (see `Model::failed`).
    pub blocks_unverifiable: u64,
    /// Reads that disagreed with the newest content while overlapping writes were in
    /// flight, judged when those completed (errors mode: `DeferredRead`).
    pub reads_judged_later: u64,
    /// Errors injected into the devices that surfaced as typed request errors.
    pub injected_errors_surfaced: u64,
    /// Engine failures (fatal) caused by injected errors.
    pub engine_failures_injected: u64,
    /// Engine work seen, summed over all engines of the run.
    pub compaction_victims: u64,
    pub gc_victims: u64,
    pub checkpoints: u64,
    pub durability_points: u64,
    pub zone_resets: u64,
    pub chunk_frees: u64,
    pub relocated_blocks: u64,
    /// Blocks read from a cold tier, and those staged to go back to the fast one.
    pub cold_read_blocks: u64,
    pub promotions_staged: u64,
    pub l2p_page_reads: u64,
    pub l2p_page_reads_ahead: u64,
    pub l2p_page_writes_ahead: u64,
    pub l2p_page_writes: u64,
    pub l2p_deferred_switches: u64,
    pub checkpoint_switches: u64,
    pub l2p_evictions_as_switches: u64,
    pub scrub_bytes: u64,
    /// On a pool of several shards: requests whose bytes span shards (split and
    /// answered once), volume changes made shard by shard, and power cuts by the
    /// shard whose device the cut fell on.
    pub requests_split: u64,
    pub volume_changes_across_shards: u64,
    /// On shards sharing one capacity device: free zones (and chunks, on a shared
    /// cache) the space manager moved, and its steps that failed (an engine failed,
    /// or the power was cut).
    pub zones_moved: u64,
    /// Of those, chunks given away (counted by the engines that gave them).
    pub chunks_given: u64,
    pub moves_failed: u64,
    pub cuts_by_shard: BTreeMap<usize, u64>,
}

impl Counts {
    pub fn add(&mut self, o: &Counts) {
        self.cycles += o.cycles;
        self.crashes += o.crashes;
        self.recovered += o.recovered;
        self.needs_recovery += o.needs_recovery;
        self.clean_reopens += o.clean_reopens;
        self.crashes_in_shutdown += o.crashes_in_shutdown;
        self.crashes_in_open += o.crashes_in_open;
        self.live_checks += o.live_checks;
        self.lineages += o.lineages;
        self.unit_volumes += o.unit_volumes;
        self.dual_volumes += o.dual_volumes;
        self.dual_refusals += o.dual_refusals;
        self.tiered_lineages += o.tiered_lineages;
        self.cold_read_blocks += o.cold_read_blocks;
        self.promotions_staged += o.promotions_staged;
        for (k, v) in &o.moments {
            *self.moments.entry(k.clone()).or_default() += v;
        }
        for (k, v) in &o.crash_modes {
            *self.crash_modes.entry(k.clone()).or_default() += v;
        }
        self.torn_writes += o.torn_writes;
        self.pending_kept += o.pending_kept;
        self.pending_dropped += o.pending_dropped;
        for (k, v) in &o.pending_after_shutdown {
            *self.pending_after_shutdown.entry(k.clone()).or_default() += v;
        }
        self.requests += o.requests;
        self.bytes_written += o.bytes_written;
        self.blocks_verified += o.blocks_verified;
        self.blocks_older += o.blocks_older;
        self.blocks_unverifiable += o.blocks_unverifiable;
        self.reads_judged_later += o.reads_judged_later;
        self.injected_errors_surfaced += o.injected_errors_surfaced;
        self.engine_failures_injected += o.engine_failures_injected;
        self.compaction_victims += o.compaction_victims;
        self.gc_victims += o.gc_victims;
        self.checkpoints += o.checkpoints;
        self.durability_points += o.durability_points;
        self.zone_resets += o.zone_resets;
        self.chunk_frees += o.chunk_frees;
        self.relocated_blocks += o.relocated_blocks;
        self.l2p_page_reads += o.l2p_page_reads;
        self.l2p_page_reads_ahead += o.l2p_page_reads_ahead;
        self.l2p_page_writes_ahead += o.l2p_page_writes_ahead;
        self.l2p_page_writes += o.l2p_page_writes;
        self.l2p_deferred_switches += o.l2p_deferred_switches;
        self.checkpoint_switches += o.checkpoint_switches;
        self.l2p_evictions_as_switches += o.l2p_evictions_as_switches;
        self.scrub_bytes += o.scrub_bytes;
        self.requests_split += o.requests_split;
        self.volume_changes_across_shards += o.volume_changes_across_shards;
        self.zones_moved += o.zones_moved;
        self.chunks_given += o.chunks_given;
        self.moves_failed += o.moves_failed;
        for (k, v) in &o.cuts_by_shard {
            *self.cuts_by_shard.entry(*k).or_default() += v;
        }
    }

    pub fn moment(&mut self, key: &str) {
        *self.moments.entry(key.to_string()).or_default() += 1;
    }

    pub fn crash_mode(&mut self, key: &str) {
        *self.crash_modes.entry(key.to_string()).or_default() += 1;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cycles {}  crashes {}  recovered+verified {}  needs-recovery {}  clean reopens {}  live checks {}",
            self.cycles,
            self.crashes,
            self.recovered,
            self.needs_recovery,
            self.clean_reopens,
            self.live_checks
        )?;
        writeln!(
            f,
            "crashes in shutdown {}  crashes in open {}  formats {} (with a cold tier {})  volumes in units {} (dual {}, refused {})  torn writes {}  pending kept/dropped {}/{}  left pending after shutdown {:?}",
            self.crashes_in_shutdown,
            self.crashes_in_open,
            self.lineages,
            self.tiered_lineages,
            self.unit_volumes,
            self.dual_volumes,
            self.dual_refusals,
            self.torn_writes,
            self.pending_kept,
            self.pending_dropped,
            self.pending_after_shutdown
        )?;
        writeln!(
            f,
            "requests {}  MiB written {}  blocks verified {} (older allowed version {}, unverifiable after a failed request {}, reads judged after the writes they overlap {})  injected errors surfaced {} (engine failures {})",
            self.requests,
            self.bytes_written >> 20,
            self.blocks_verified,
            self.blocks_older,
            self.blocks_unverifiable,
            self.reads_judged_later,
            self.injected_errors_surfaced,
            self.engine_failures_injected
        )?;
        writeln!(
            f,
            "engine: compaction victims {}  GC victims {}  relocated blocks {}  cold reads/promoted {}/{}  checkpoints {}  durability points {}  zone resets {}  chunk frees {}  L2P page reads/writes {}/{} (ahead {}/{})  deferred switches {}  checkpoint switches {}  evictions as switches {}  scrubbed MiB {}",
            self.compaction_victims,
            self.gc_victims,
            self.relocated_blocks,
            self.cold_read_blocks,
            self.promotions_staged,
            self.checkpoints,
            self.durability_points,
            self.zone_resets,
            self.chunk_frees,
            self.l2p_page_reads,
            self.l2p_page_writes,
            self.l2p_page_reads_ahead,
            self.l2p_page_writes_ahead,
            self.l2p_deferred_switches,
            self.checkpoint_switches,
            self.l2p_evictions_as_switches,
            self.scrub_bytes >> 20
        )?;
        let moments: Vec<String> = self
            .moments
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        writeln!(f, "crash points: {}", moments.join(", "))?;
        if !self.cuts_by_shard.is_empty() || self.requests_split > 0 {
            writeln!(
                f,
                "shards: requests split {}  volume changes across shards {}  cuts by shard {:?}  zones and chunks moved {} (chunks given {}, steps failed {})",
                self.requests_split,
                self.volume_changes_across_shards,
                self.cuts_by_shard,
                self.zones_moved,
                self.chunks_given,
                self.moves_failed
            )?;
        }
        let modes: Vec<String> = self
            .crash_modes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        write!(f, "crash modes: {}", modes.join(", "))
    }
}

/// What went wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ViolationKind {
    /// After a crash a block read back with content the model does not allow.
    WrongDataAfterCrash,
    /// Before any crash, a read did not return the newest content.
    WrongData,
    /// A valid request failed although no fault was injected.
    RequestFailed,
    /// With faults injected, an error that no injected fault explains.
    UnexplainedError,
    /// `Engine::open` failed after a crash with something other than
    /// `NeedsRecovery` (or failed after a clean shutdown).
    OpenFailed,
    /// The zone emulation could not reopen its device after a crash.
    ZoneEmulationOpen,
    /// The engine's self-check failed.
    SelfCheck,
    /// The volumes after a reopen are not the model's.
    VolumeSet,
    /// The engine panicked.
    Panic,
    /// A request never completed.
    Stuck,
    /// A clean shutdown failed.
    ShutdownFailed,
    /// The simulator itself could not continue (a bug here, not in the engine).
    Harness,
}

/// The first thing that went wrong in a run, and how to replay it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub seed: u64,
    pub mode: Mode,
    pub generations: u32,
    /// The run's crash point filter (`SimConfig::only`), if any.
    pub only: Option<String>,
    /// Engine shards of the run (`SimConfig::shards`).
    pub shards: u32,
    /// The shards share one capacity device (`SimConfig::shared_capacity`).
    pub shared: bool,
    /// ... and one cache device (`SimConfig::shared_cache`).
    pub shared_cache: bool,
    /// Crash point (cycle) of the run, 0-based.
    pub cycle: u64,
    /// Format count within the run (a new lineage starts after a refused open).
    pub lineage: u64,
    /// Crash points survived by the current lineage.
    pub generation: u64,
    /// Engine loop iterations since the run started.
    pub step: u64,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "VIOLATION {:?} (seed {}, mode {}, cycle {}, lineage {}, generation {}, step {}): {}\n  replay: cargo run -p shale-sim --release --bin crashsim -- --seed {} --cycles {} --generations {} --mode {}{}{}{}",
            self.kind,
            self.seed,
            self.mode,
            self.cycle,
            self.lineage,
            self.generation,
            self.step,
            self.detail,
            self.seed,
            self.generations,
            self.generations,
            self.mode,
            self.only
                .as_ref()
                .map(|o| format!(" --only {o}"))
                .unwrap_or_default(),
            if self.shards > 1 {
                format!(" --shards {}", self.shards)
            } else {
                String::new()
            },
            if self.shared_cache {
                " --shared-cache"
            } else if self.shared {
                " --shared"
            } else {
                ""
            }
        )
    }
}

/// One run of `generations` crash points from one seed.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub seed: u64,
    pub mode: Mode,
    pub counts: Counts,
    pub violation: Option<Violation>,
    pub trace: Trace,
    pub elapsed: Duration,
}
