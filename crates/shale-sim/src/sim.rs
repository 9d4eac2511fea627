//! The simulator: one seeded run drives a single-threaded `Engine` step by step
//! (`submit`, `poll`) over fault devices on a power rail, under a seeded workload,
//! to a chosen crash point; then it crashes the devices, reopens the engine, checks
//! every block of every volume against the model, and carries on with the recovered
//! engine for the next generation.
//!
//! Everything random comes from the run's seed (workload, crash points, crash modes,
//! device latencies and errors, engine knobs), and the engine is driven from one
//! thread with a manual clock, so a seed replays exactly; the run's [`Trace`] hash
//! says so.
//!
//! Modes:
//! - `Crash`: crash at every crash point. While the engine cannot recover from a
//!   dirty stop, `Engine::open` answers `NeedsRecovery`: that is counted, and the run
//!   continues on freshly formatted devices (a new lineage). When recovery exists,
//!   the same runs verify it with no change here.
//! - `Live`: at every crash point, check the live engine instead (self-check, and
//!   every volume read back must be the model's newest content). Crash points after
//!   and inside a clean shutdown still crash the devices.
//! - `Errors`: as `Crash`, with I/O errors injected into the fault devices between
//!   crash points: every error must be a typed error caused by an injected fault, and
//!   no read may return wrong data.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shale_device::{
    BlockDevice, CacheSplit, CrashMode, ErrorRule, FaultController, FaultDevice, Latency,
    SharedCache, SharedZones, ZoneEmu, ZoneEmuConfig, ZonedDevice,
};
use shale_engine::{
    Config, Engine, EngineError, Handoff, ManualClock, MemHandoff, OpenError, Reply, Request,
    Stats, VolumeInfo, VolumeUid,
};
use shale_format::{CacheLayout, Superblock};
use shale_shards::{LocalShards, ShardsError};

use crate::model::{block_hash, BlockRange, FlushCut, Model, OpId, VolModel};
use crate::plan::{self, Moment, Plan};
use crate::power::{
    CapacityLayout, DevOp, DevOpKind, Fired, Layouts, PowerRail, Powered, SharedCacheLayout, Side,
    Trigger,
};
use crate::report::{Counts, RunReport, Trace, Violation, ViolationKind};
use crate::workload::{Limits, Mix, Op, Workload};

const BS: u64 = 4096;
/// Engine clock advance per loop iteration.
const STEP_NS: u64 = 20_000;
/// Device calls one engine loop iteration may make; more means it spins.
const DEVICE_CALLS_PER_POLL_MAX: u64 = 2_000_000;

/// A shard's capacity device: zone emulation over a fault device on the rail, or a
/// view of one all the shards share (`SimConfig::shared_capacity`).
pub type Cap = Box<dyn ZonedDevice + Send>;
/// A shard's cache device: a fault device on the rail, or a view of one all the
/// shards share (`SimConfig::shared_cache`).
pub type Cache = Box<dyn BlockDevice + Send>;
/// One engine under test.
pub type Eng = Engine<Cache, Cap, ManualClock>;
/// The engines under test: a pool of shards stepped on the simulator's thread (a
/// pool of one is its engine, every request passed through).
pub type Pool = LocalShards<Cache, Cap, ManualClock>;

/// What happens at a crash point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    Crash,
    Live,
    Errors,
    /// The process is killed at the crash point: the devices keep every write they
    /// were given, the hand-off store survives, and every acknowledged write must.
    Kill,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Crash => "crash",
            Mode::Live => "live",
            Mode::Errors => "errors",
            Mode::Kill => "kill",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "crash" => Ok(Mode::Crash),
            "live" => Ok(Mode::Live),
            "errors" => Ok(Mode::Errors),
            "kill" => Ok(Mode::Kill),
            _ => Err(format!("unknown mode {s:?} (crash, live, errors, kill)")),
        }
    }
}

/// Everything a run needs besides its seed.
#[derive(Debug, Clone)]
pub struct SimConfig {
    pub mode: Mode,
    /// Crash points per run.
    pub generations: u32,
    /// Device geometries; each run draws one by weight.
    pub geometries: Vec<Geometry>,
    /// Engine configuration (format-time and runtime); `streams_max` is drawn from
    /// `1..=streams_max` per lineage.
    pub engine: Config,
    pub mix: Mix,
    /// Requests in flight at most; drawn from `1..=queue_depth_max` per lineage.
    pub queue_depth_max: u32,
    /// Workload iterations before a crash point is armed, at most.
    pub warmup_steps_max: u32,
    /// Iterations an armed crash point may wait for its moment.
    pub deadline_steps: u32,
    /// A request not completed after this many iterations is stuck.
    pub request_steps_max: u64,
    /// Prefill passes (see [`Geometry::prefill_passes`]) after the formats that follow a refused open (a lineage that lives
    /// one crash point need not pay for a full prefill).
    pub restart_prefill_passes: u32,
    /// Fault device completion latency, in polls, at most (drawn per lineage).
    pub latency_polls_max: u32,
    /// Only crash points whose name starts with this (`trip:l2p`, `shutdown:`,
    /// `when:gc`...), for aiming a run at one kind of moment.
    pub only: Option<String>,
    /// Harness self-test: this device acknowledges flushes without making anything
    /// durable. Runs must then report violations.
    pub lying_flushes: Option<Side>,
    /// Harness self-test: the simulator acknowledges flush requests itself without
    /// sending them to the engine, so the model believes in durability the engine
    /// never promised. Runs must then report lost data.
    pub phantom_flushes: bool,
    /// Print every crash point, crash and reopen to stderr (for diagnosing a replay).
    pub log: bool,
    /// Engine shards (1..=64): each has a cache and a capacity device of the run's
    /// geometry of its own, all on the one power rail; volumes are dealt over them
    /// in granules of 1, 2 or 16 blocks (drawn per lineage).
    pub shards: u32,
    /// With several shards: one capacity device of `shards` times the geometry's
    /// zones, shared by the shards (`SharedZones` views), free zones moved between
    /// them by the space manager's step at random moments of the workload.
    pub shared_capacity: bool,
    /// With several shards: one cache device too, each shard's metadata in a window
    /// of its own and the chunks shared (`SharedCache` views), free chunks moved
    /// between shards with the zones (implies `shared_capacity`).
    pub shared_cache: bool,
    /// Direct writes (`Config::direct_write_min_bytes`: two blocks and more go
    /// straight to zones) in about a third of the runs.
    pub direct_writes: bool,
}

/// The devices of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub name: &'static str,
    /// Relative chance that a run uses it.
    pub weight: u32,
    /// Cache device size in 4 KiB blocks.
    pub cache_blocks: u64,
    /// Zone size in 4 KiB blocks, and data zones on the capacity device.
    pub zone_blocks: u64,
    pub zones: u32,
    /// Share of the user capacity given to the volumes made at format.
    pub volume_fill_pct: u32,
    /// Sequential passes over every volume after the first format of a run (so
    /// compaction and GC have live data to move from the first crash point on).
    pub prefill_passes: u32,
    /// L2P cache budget in pages, overriding the engine configuration's.
    pub l2p_cache_pages: Option<u64>,
}

impl Geometry {
    /// 4 chunks of 2 groups, 24 zones of one group: compaction and GC never stop.
    pub fn tiny() -> Geometry {
        Geometry {
            name: "tiny",
            weight: 3,
            cache_blocks: 128 + 4 * 256,
            zone_blocks: 128,
            zones: 24,
            volume_fill_pct: 92,
            prefill_passes: 1,
            l2p_cache_pages: None,
        }
    }

    /// The same cache, 40 zones of 4 MiB, volumes of ~80 MiB written sparsely, and
    /// the smallest L2P cache the engine accepts: L2P pages are evicted and written
    /// back all the time (the tiny geometry's table fits in its cache).
    pub fn wide() -> Geometry {
        Geometry {
            name: "wide",
            weight: 1,
            cache_blocks: 256 + 4 * 256,
            zone_blocks: 1024,
            zones: 40,
            volume_fill_pct: 60,
            prefill_passes: 0,
            l2p_cache_pages: Some(6),
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        (u64::from(self.zones) + 2) * self.zone_blocks * BS
    }
}

impl SimConfig {
    /// Tiny devices and tight thresholds: compaction, GC, checkpoints and L2P
    /// write-back run constantly. A cycle takes a few milliseconds in release builds.
    pub fn fast(mode: Mode) -> SimConfig {
        SimConfig {
            mode,
            generations: 50,
            geometries: vec![Geometry::tiny(), Geometry::wide()],
            engine: Config {
                // The simulated clock moves STEP_NS a poll: 200,000 polls.
                stuck_after_ms: 4_000,
                // The scrub runs, so its check of the map from the P2L side (every
                // valid block's md entry maps back to it) runs at every crash point.
                scrub_bytes_per_sec: 256 << 20,
                ..shale_testkit::tiny_config()
            },
            mix: Mix::default(),
            queue_depth_max: 12,
            warmup_steps_max: 120,
            deadline_steps: 1500,
            request_steps_max: 100_000,
            restart_prefill_passes: 0,
            latency_polls_max: 3,
            only: None,
            lying_flushes: None,
            phantom_flushes: false,
            log: false,
            shards: 1,
            shared_capacity: false,
            shared_cache: false,
            direct_writes: true,
        }
    }
}

/// Runs one seed. Never panics on an engine failure: the first violation is in the
/// report, with the seed and the cycle to replay it.
pub fn run(seed: u64, cfg: &SimConfig) -> RunReport {
    let start = Instant::now();
    let mut sim = Sim::new(seed, cfg.clone());
    let violation = sim.run_all().err();
    sim.end_engine();
    sim.trace.mix(u64::from(violation.is_some()));
    RunReport {
        seed,
        mode: cfg.mode,
        counts: sim.counts,
        violation,
        trace: sim.trace,
        elapsed: start.elapsed(),
    }
}

/// A request in flight and what its completion means to the model.
#[derive(Debug)]
enum Pending {
    Write {
        range: BlockRange,
        fua: bool,
    },
    /// Trim or write-zeroes.
    Change,
    Read {
        volume: VolumeUid,
        offset: u64,
        expected: Vec<u8>,
    },
    /// A read after a crash: each block is checked against its allowed versions.
    Verify {
        volume: VolumeUid,
        offset: u64,
    },
    Flush {
        cut: FlushCut,
    },
    Admin(Op),
    /// A volume's cache share and GC policy (no effect on what reads return).
    Limits,
    List,
}

/// A read answered with other bytes than the newest content while writes or changes
/// of its volume submitted before it were still in flight, with errors injected. A
/// request split over shards is answered once every piece has been, so a piece that
/// failed (leaving its blocks as they were) may be behind a later read before the
/// failure is reported. Judged when `waits` complete: a failure of one explains the
/// read; if all succeed, the read was wrong.
#[derive(Debug)]
struct DeferredRead {
    waits: Vec<OpId>,
    detail: String,
}

impl Pending {
    fn kind(&self) -> &'static str {
        match self {
            Pending::Write { fua: true, .. } => "FUA write",
            Pending::Write { .. } => "write",
            Pending::Change => "trim or write-zeroes",
            Pending::Read { .. } => "read",
            Pending::Verify { .. } => "verifying read",
            Pending::Flush { .. } => "flush",
            Pending::Admin(_) => "volume change",
            Pending::Limits => "volume limits",
            Pending::List => "volume list",
        }
    }
}

#[derive(Debug)]
struct InFlight {
    pending: Pending,
    step: u64,
}

#[derive(Debug)]
struct Done {
    op: OpId,
    /// Delivered after the power was cut: a completion no client could have seen.
    after_cut: bool,
    result: Result<Reply, EngineError>,
}

type Inbox = Arc<Mutex<Vec<Done>>>;

/// A volume change that may or may not have taken effect.
#[derive(Debug, Clone)]
struct Uncertain {
    op: Op,
    /// The model reflects it (it failed, yet the live engine showed it done); a crash
    /// may still undo it, since a failed change promised no durability.
    applied: bool,
    /// The volume before the change (`None`: it did not exist, or not needed).
    before: Option<VolModel>,
}

enum Reached {
    Moment,
    Missed,
    EngineFailed,
}

enum OpenFail {
    Zone(shale_device::DeviceError),
    Engine(OpenError),
    /// The shards opened but are not one pool, or could not be made to agree.
    Shards(ShardsError),
}

impl OpenFail {
    fn from_shards(e: ShardsError) -> OpenFail {
        match e {
            ShardsError::Open { source, .. } => OpenFail::Engine(source),
            other => OpenFail::Shards(other),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic".into()
    }
}

/// Whether an error (or anything it was caused by) is an injected device fault.
pub fn caused_by_injection(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if x.to_string().contains("injected") {
            return true;
        }
        cur = x.source();
    }
    false
}

/// `n` views of one capacity device the shards share, boxed.
fn shared_views(emu: ZoneEmu<Powered>, n: usize) -> Result<std::vec::IntoIter<Cap>, String> {
    let views = SharedZones::split(emu, n).map_err(|e| format!("shared capacity: {e}"))?;
    let boxed: Vec<Cap> = views.into_iter().map(|v| Box::new(v) as Cap).collect();
    Ok(boxed.into_iter())
}

/// One shard's cache and capacity devices.
type ShardDevices = (Cache, Cap);

/// Views of one cache device the shards share, boxed.
fn shared_cache_views(cache: Powered, split: CacheSplit) -> Result<Vec<Cache>, String> {
    let views = SharedCache::split(cache, split).map_err(|e| format!("shared cache: {e}"))?;
    Ok(views.into_iter().map(|v| Box::new(v) as Cache).collect())
}

/// The space manager's step counted: zones it moved, or that it failed.
fn count_space_step(counts: &mut Counts, moved: &Result<usize, EngineError>) {
    match moved {
        Ok(n) => counts.zones_moved += *n as u64,
        Err(_) => counts.moves_failed += 1,
    }
}

/// The devices of every shard after a crash: caches in shard order, and one
/// capacity device per shard or one they share.
#[derive(Default)]
struct Crashed {
    caches: Vec<FaultDevice>,
    capacities: Vec<FaultDevice>,
}

/// Prints a zone emulation's zones as they are at open (for diagnosing a replay).
fn log_zones(cap: &dyn ZonedDevice) {
    let mut zones = Vec::new();
    let _ = cap.report_zones(0, cap.geometry().zone_count, &mut zones);
    let line: Vec<String> = zones
        .iter()
        .map(|z| {
            let wp = (z.write_pointer - z.start) / BS;
            format!("{}:{:?}@{wp}", z.index, z.state)
        })
        .collect();
    eprintln!("    zones at open: {}", line.join(" "));
}

/// Reads the layout from the newest valid durable superblock copy.
fn cache_layout(ctl: &FaultController) -> Option<CacheLayout> {
    let mut b = vec![0u8; 2 * BS as usize];
    ctl.read_durable(0, &mut b).ok()?;
    let a = Superblock::decode(&b[..BS as usize], 0).ok();
    let c = Superblock::decode(&b[BS as usize..], BS).ok();
    [a, c]
        .into_iter()
        .flatten()
        .max_by_key(|s| s.generation)
        .map(|s| s.layout)
}

struct Sim {
    cfg: SimConfig,
    geo: Geometry,
    seed: u64,
    rng: ChaCha8Rng,
    workload: Workload,
    clock: ManualClock,
    rail: PowerRail,
    /// Each shard's cache and capacity fault devices, in shard order.
    cache_ctl: Vec<FaultController>,
    cap_ctl: Vec<FaultController>,
    /// How one cache the shards share is divided (`SimConfig::shared_cache`).
    cache_split: Option<CacheSplit>,
    engine: Option<Pool>,
    engine_config: Config,
    /// The lineage's granule (bytes) on a pool of several shards.
    granule: u64,
    /// A panic inside `submit` (volume changes across shards run there), reported by
    /// the next step.
    submit_panic: Option<String>,
    model: Model,
    inbox: Inbox,
    inflight: BTreeMap<OpId, InFlight>,
    /// Reads that disagreed with the newest content, to be judged once the writes
    /// and changes they overlap complete (`DeferredRead`).
    deferred: Vec<DeferredRead>,
    next_op: OpId,
    queue_depth: u32,
    admin_waiting: Option<Op>,
    admin_inflight: bool,
    /// A volume change whose outcome a crash or an error left open.
    admin_uncertain: Option<Uncertain>,
    listed: Option<Vec<VolumeInfo>>,
    /// A volume change failed on an injected error: list the volumes (as a client
    /// would) and adopt whichever outcome the engine reports.
    relist: bool,
    reconcile_on_list: bool,
    errors_on: bool,
    engine_failed: bool,
    /// The lineage's format and prefill are done (self-test sabotage starts here).
    lineage_prefilled: bool,
    /// The last request error an injected fault explained, and the faults injected.
    last_injected: Option<String>,
    injection: Option<String>,
    trace: Trace,
    counts: Counts,
    /// The hand-off stores of kill mode, one per shard (they survive the engine, as
    /// tmpfs survives a killed process).
    handoff: Vec<MemHandoff>,
    cycle: u64,
    lineage: u64,
    generation: u64,
    step: u64,
}

impl Sim {
    fn new(seed: u64, cfg: SimConfig) -> Sim {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let wl_rng = ChaCha8Rng::seed_from_u64(rng.gen());
        let geo = {
            let total: u32 = cfg.geometries.iter().map(|g| g.weight).sum();
            let mut r = rng.gen_range(0..total.max(1));
            let mut pick = cfg
                .geometries
                .first()
                .cloned()
                .unwrap_or_else(Geometry::tiny);
            for g in &cfg.geometries {
                if r < g.weight {
                    pick = g.clone();
                    break;
                }
                r -= g.weight;
            }
            pick
        };
        let limits = Limits {
            request_bytes_max: cfg.engine.request_bytes_max,
            user_capacity_blocks: 0,
            volumes_max: cfg.engine.volumes_max,
            charge_blocks: 1,
            volume_blocks_min: 8,
            unit_shift_max: 0,
        };
        let shards = cfg.shards.max(1) as usize;
        Sim {
            geo,
            workload: Workload::new(wl_rng, cfg.mix.clone(), limits),
            engine_config: cfg.engine.clone(),
            cfg,
            seed,
            rng,
            clock: ManualClock::new(),
            rail: {
                let rail = PowerRail::new();
                rail.set_calls_max(Some(DEVICE_CALLS_PER_POLL_MAX));
                rail
            },
            cache_ctl: Vec::new(),
            cap_ctl: Vec::new(),
            cache_split: None,
            engine: None,
            granule: shale_shards::GRANULE_BYTES_DEFAULT,
            submit_panic: None,
            model: Model::new(),
            inbox: Arc::new(Mutex::new(Vec::new())),
            inflight: BTreeMap::new(),
            deferred: Vec::new(),
            next_op: 1,
            queue_depth: 1,
            admin_waiting: None,
            admin_inflight: false,
            admin_uncertain: None,
            listed: None,
            relist: false,
            reconcile_on_list: false,
            errors_on: false,
            engine_failed: false,
            lineage_prefilled: false,
            last_injected: None,
            injection: None,
            trace: Trace::default(),
            counts: Counts::default(),
            handoff: (0..shards).map(|_| MemHandoff::new()).collect(),
            cycle: 0,
            lineage: 0,
            generation: 0,
            step: 0,
        }
    }

    fn violation(&self, kind: ViolationKind, detail: String) -> Violation {
        Violation {
            kind,
            seed: self.seed,
            mode: self.cfg.mode,
            generations: self.cfg.generations,
            only: self.cfg.only.clone(),
            shards: self.cfg.shards.max(1),
            shared: self.shared(),
            shared_cache: self.shared_cache(),
            cycle: self.cycle,
            lineage: self.lineage,
            generation: self.generation,
            step: self.step,
            detail,
        }
    }

    fn log(&self, line: impl FnOnce() -> String) {
        if self.cfg.log {
            eprintln!(
                "[seed {} cycle {} step {}] {}",
                self.seed,
                self.cycle,
                self.step,
                line()
            );
        }
    }

    fn harness(&self, detail: String) -> Violation {
        self.violation(ViolationKind::Harness, detail)
    }

    fn run_all(&mut self) -> Result<(), Violation> {
        self.new_lineage()?;
        for c in 0..u64::from(self.cfg.generations) {
            self.cycle = c;
            self.one_cycle()?;
        }
        Ok(())
    }

    // ---------------------------------------------------------------- lineages

    /// Fresh devices, a fresh format, volumes, a prefill.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn new_lineage(&mut self) -> Result<(), Violation> {
        self.end_engine();
        self.counts.lineages += 1;
        self.lineage += 1;
        self.generation = 0;
        self.model = Model::new();
        self.inflight.clear();
        self.deferred.clear();
        lock(&self.inbox).clear();
        self.admin_waiting = None;
        self.admin_inflight = false;
        self.admin_uncertain = None;
        self.relist = false;
        self.reconcile_on_list = false;
        self.errors_on = false;
        self.engine_failed = false;
        self.rail.restore();
        self.rail.set_layouts(Layouts::default());
        self.rail.set_lying_flushes(None);
        self.lineage_prefilled = false;

        let mut config = self.cfg.engine.clone();
        config.streams_max = self.rng.gen_range(1..=self.cfg.engine.streams_max.max(1));
        if let Some(pages) = self.geo.l2p_cache_pages {
            config.l2p_cache_bytes_max = Some(pages * BS);
        }
        // Periodic checkpoints: synchronous, or incremental at 1 or 16 pages a poll.
        config.checkpoint_pages_per_poll = [0, 1, 16][self.rng.gen_range(0..3)];
        // The census after a clean open: one L2P page a poll in a third of the runs, so
        // writes and crashes meet it mid-walk (tied to the draw above: no new draw, so
        // every seed replays the run it did).
        config.census_pages_per_poll = if config.checkpoint_pages_per_poll == 1 {
            1
        } else {
            256
        };
        self.queue_depth = self.rng.gen_range(1..=self.cfg.queue_depth_max.max(1));
        let lbs = |rng: &mut ChaCha8Rng| if rng.gen_bool(0.5) { 512 } else { 4096 };
        let cache_lbs = lbs(&mut self.rng);
        let cap_lbs = lbs(&mut self.rng);
        // Wide (5-byte) L2P entries, which pools past 16 TiB take, in the half of the
        // runs with a 512-byte cache block (tied to that draw, as above).
        config.l2p_entry_bytes = Some(if cache_lbs == 512 { 5 } else { 4 });
        // Lifetime placement where the two devices' block sizes differ (half the runs).
        config.placement = if cache_lbs == cap_lbs {
            shale_engine::PlacementKind::Volume
        } else {
            shale_engine::PlacementKind::Lifetime
        };
        // GC and compaction victim policies, from the draws above (no new draw): every
        // policy meets every crash point.
        let k = config.streams_max as usize
            + usize::from(cache_lbs == 512)
            + 2 * usize::from(cap_lbs == 512);
        config.gc_policy = [
            shale_engine::GcPolicyKind::Greedy,
            shale_engine::GcPolicyKind::Fifo,
            shale_engine::GcPolicyKind::CostBenefit,
        ][k % 3];
        config.compaction_policy = if k < 3 {
            shale_engine::CompactionPolicyKind::FifoOldestClosed
        } else {
            shale_engine::CompactionPolicyKind::CostBenefit
        };
        // Direct writes (two blocks and more straight to zones) in about a third of
        // the runs, again from the draws above.
        config.direct_write_min_bytes =
            if self.cfg.direct_writes && config.checkpoint_pages_per_poll != 1 && k % 2 == 1 {
                2 * BS
            } else {
                0
            };
        config.direct_write_policy = shale_engine::DirectWritePolicy::Any;
        // A cold tier (the last third of the zones) in a sixth of the runs, tied to
        // the draws above: GC moves every block it relocates into it, and blocks read
        // twice come back (promotions race overwrites, GC and crashes). The tiers'
        // reserves need a lower GC threshold to leave the small pools a user capacity.
        // (A shared device lends zones, which a tiered pool refuses.)
        if config.checkpoint_pages_per_poll == 16 && cache_lbs == cap_lbs && !self.shared() {
            config.cold_zones = self.geo.zones / 3;
            config.gc_free_zones_min = config.gc_free_zones_min.min(4);
            config.promote_reads = 2;
            self.counts.tiered_lineages += 1;
        } else {
            config.cold_zones = 0;
        }
        let shards = self.cfg.shards.max(1) as usize;
        if shards > 1 {
            // Granules of 1, 2 or 16 blocks: the smaller, the more requests split.
            self.granule = [1, 2, 16][self.rng.gen_range(0..3)] * BS;
            self.trace.mix(self.granule);
        }
        self.cache_ctl.clear();
        self.cap_ctl.clear();
        config.zones_owned = None;
        config.chunks_owned = None;
        config.cache_data_start_min = None;
        self.cache_split = None;
        if self.shared() {
            // A shard lends only spare (down to half of it): a large one, so that the
            // space manager has zones to move in these small pools.
            config.zones_owned = Some(self.geo.zones);
            config.spare_factor = config.spare_factor.max(0.4);
        }
        let (devices, capacity) = self.format_devices(shards, (cache_lbs, cap_lbs), &mut config)?;
        let clock = self.clock.clone();
        let mut pool = Pool::format(devices, || clock.clone(), &config, self.granule)
            .map_err(|e| self.harness(format!("engine format: {e}")))?;
        if self.cfg.mode == Mode::Kill {
            for (e, h) in pool.engines_mut().iter_mut().zip(&self.handoff) {
                e.attach_handoff(Box::new(h.clone()))
                    .map_err(|e| self.harness(format!("hand-off store: {e}")))?;
            }
        }
        let user_blocks = pool.user_capacity_bytes() / BS;
        self.engine = Some(pool);
        self.engine_config = config;
        // One layout per side serves every shard's devices: they are formatted alike.
        let layouts: Vec<Option<CacheLayout>> = self.cache_ctl.iter().map(cache_layout).collect();
        if layouts.windows(2).any(|w| w[0] != w[1]) {
            return Err(self.harness("the shards' cache layouts differ".into()));
        }
        self.rail.set_layouts(Layouts {
            cache: layouts.first().copied().flatten(),
            capacity,
            cache_shared: self.cache_split.map(|s| SharedCacheLayout {
                shards: u64::from(s.shards),
                meta_blocks: s.meta_bytes / BS,
            }),
        });
        // A volume on several shards is a whole number of blocks of at least a granule
        // per shard, and takes up to a granule more than its share in some of them.
        let unit = if shards > 1 {
            self.granule / BS * shards as u64
        } else {
            1
        };
        self.workload = Workload::new(
            ChaCha8Rng::seed_from_u64(self.rng.gen()),
            self.cfg.mix.clone(),
            Limits {
                request_bytes_max: self.cfg.engine.request_bytes_max,
                user_capacity_blocks: user_blocks,
                volumes_max: self.cfg.engine.volumes_max,
                charge_blocks: unit,
                volume_blocks_min: unit.max(8),
                unit_shift_max: self.unit_shift_max(shards),
            },
        );
        self.trace.mix(0x1111);
        self.trace.mix(user_blocks);
        self.trace.mix(u64::from(self.queue_depth));

        // Two or three volumes sharing most of the user capacity.
        let n = self
            .rng
            .gen_range(2..=3u64.min(u64::from(self.cfg.engine.volumes_max)));
        let mut left = user_blocks * u64::from(self.geo.volume_fill_pct) / 100;
        for i in 0..n {
            let size = if i + 1 == n {
                left
            } else {
                left * self.rng.gen_range(30..=60) / 100
            };
            left -= size;
            let size = size / unit * unit;
            if size >= unit.max(8) {
                let name = self.workload.name();
                let (shift, dual) = self.workload.limits().draw_layout(&mut self.rng, size);
                self.submit(Op::Create {
                    name,
                    size_blocks: size,
                    shift,
                    dual,
                });
                self.settle()?;
                // A cache share and a GC policy of its own in the third of the runs
                // with synchronous checkpoints (tied to that draw: no new draw).
                if self.engine_config.checkpoint_pages_per_poll == 0 {
                    self.set_policies(i)?;
                }
            }
        }
        // Prefill: sequential writes over every volume, then a flush.
        let max = self.cfg.engine.request_bytes_max;
        let passes = if self.lineage == 1 {
            self.geo.prefill_passes
        } else {
            self.cfg.restart_prefill_passes
        };
        for _ in 0..passes {
            let vols: Vec<(VolumeUid, u64)> = self
                .model
                .volumes()
                .iter()
                .map(|(&id, v)| (id, v.size_bytes()))
                .collect();
            for (volume, size) in vols {
                let mut off = 0;
                while off < size {
                    let len = max.min(size - off);
                    while self.inflight.len() as u32 >= self.queue_depth {
                        self.step(false)?;
                    }
                    let data = self.workload.data(len as usize);
                    self.submit(Op::Write {
                        volume,
                        offset: off,
                        data,
                        fua: false,
                    });
                    off += len;
                }
            }
        }
        self.submit(Op::Flush);
        self.settle()?;
        self.rail.set_lying_flushes(self.cfg.lying_flushes);
        self.lineage_prefilled = true;
        if self.cfg.mode == Mode::Errors {
            self.inject_errors();
        }
        Ok(())
    }

    /// The engine spun inside one poll (stopped by cutting the power).
    fn stuck(&self, s: &Stats) -> Violation {
        self.violation(
            ViolationKind::Stuck,
            format!(
                "the engine spun inside one poll ({DEVICE_CALLS_PER_POLL_MAX} device calls without returning; stopped by cutting the power){}{}; stats: free chunks {}, free zones {}, staged {}, durability points {}",
                self.injection
                    .as_ref()
                    .map(|m| format!(" with {m} injected"))
                    .unwrap_or_default(),
                self.last_injected
                    .as_ref()
                    .map(|m| format!(", after the request error \"{m}\""))
                    .unwrap_or_default(),
                s.free_chunks,
                s.free_zones,
                s.staged_blocks,
                s.durability_points
            ),
        )
    }

    /// Whether the space manager's step runs now, and with what batch: at random
    /// moments on a shared device (a draw only there: other runs replay as before).
    fn draw_space_step(&mut self, powered: bool) -> Option<u32> {
        if !self.shared() || !powered || !self.rng.gen_ratio(1, 24) {
            return None;
        }
        Some(self.rng.gen_range(1..=3))
    }

    /// Whether the shards share one capacity device.
    fn shared(&self) -> bool {
        (self.cfg.shared_capacity || self.cfg.shared_cache) && self.cfg.shards > 1
    }

    /// Whether the shards share one cache device (and the capacity device).
    fn shared_cache(&self) -> bool {
        self.cfg.shared_cache && self.cfg.shards > 1
    }

    /// Every shard's fault devices (their controllers kept), on the rail, the
    /// capacity formatted for zone emulation: one per shard, or one of `shards` times
    /// the zones that they share (and one cache, divided as `config` asks, which
    /// then says how: `Config::chunks_owned`, `cache_data_start_min`). Also the
    /// capacity's layout.
    fn format_devices(
        &mut self,
        shards: usize,
        (cache_lbs, cap_lbs): (u32, u32),
        config: &mut Config,
    ) -> Result<(Vec<ShardDevices>, Option<CapacityLayout>), Violation> {
        let mut caches = Vec::with_capacity(shards);
        let ways = if self.shared() { shards as u32 } else { 1 };
        let one_cache = self.shared_cache();
        for i in 0..shards {
            // The draws in the order of runs before shared devices (replays hold).
            let cache = if i == 0 || !one_cache {
                // One cache for all: each shard's chunks, and a window of up to 1 MiB
                // more than its metadata.
                let blocks = if one_cache {
                    shards as u64 * (self.geo.cache_blocks + 256)
                } else {
                    self.geo.cache_blocks
                };
                let cache = FaultDevice::new(blocks * BS, cache_lbs, self.rng.gen())
                    .map_err(|e| self.harness(format!("cache device: {e}")))?;
                Some(cache)
            } else {
                None
            };
            let cap = if i == 0 || !self.shared() {
                let bytes = (u64::from(self.geo.zones * ways) + 2) * self.geo.zone_blocks * BS;
                let cap = FaultDevice::new(bytes, cap_lbs, self.rng.gen())
                    .map_err(|e| self.harness(format!("capacity device: {e}")))?;
                Some(cap)
            } else {
                None
            };
            for d in cache.iter().chain(cap.as_ref()) {
                let max = self.rng.gen_range(0..=self.cfg.latency_polls_max);
                d.controller().set_latency(Latency::Polls { min: 0, max });
            }
            let cap = match cap {
                Some(cap) => {
                    self.cap_ctl.push(cap.controller());
                    Some(self.zone_emulation(cap, i, ways)?)
                }
                None => None,
            };
            let cache = cache.map(|cache| {
                self.cache_ctl.push(cache.controller());
                Powered::numbered(cache, Side::Cache, i, self.rail.clone())
            });
            caches.push((cache, cap));
        }
        let mut layout = None;
        let mut devices = Vec::with_capacity(shards);
        let mut views = Vec::new().into_iter();
        for (cache, cap) in caches {
            let cap: Cap = match cap {
                Some(emu) => {
                    let l = CapacityLayout {
                        data_offset: emu.data_offset(),
                        zone_size: emu.geometry().zone_size,
                        zone_capacity: emu.geometry().zone_capacity,
                    };
                    if layout.is_some_and(|c| c != l) {
                        return Err(self.harness("the shards' zone layouts differ".into()));
                    }
                    layout = Some(l);
                    if self.shared() {
                        views = shared_views(emu, shards).map_err(|e| self.harness(e))?;
                        views
                            .next()
                            .ok_or_else(|| self.harness("no views of the shared device".into()))?
                    } else {
                        Box::new(emu)
                    }
                }
                None => views
                    .next()
                    .ok_or_else(|| self.harness("too few views of the shared device".into()))?,
            };
            devices.push((cache, cap));
        }
        let mut out = Vec::with_capacity(shards);
        let mut cache_views = Vec::new().into_iter();
        for (cache, cap) in devices {
            let cache: Cache = match cache {
                Some(c) if one_cache => {
                    let split =
                        shale_shards::cache::cache_split(c.info(), cap.geometry(), config, shards)
                            .map_err(|e| self.harness(format!("shared cache: {e}")))?;
                    config.chunks_owned = Some(split.per());
                    config.cache_data_start_min = Some(split.meta_bytes);
                    self.cache_split = Some(split);
                    cache_views = shared_cache_views(c, split)
                        .map_err(|e| self.harness(e))?
                        .into_iter();
                    cache_views
                        .next()
                        .ok_or_else(|| self.harness("no views of the shared cache".into()))?
                }
                Some(c) => Box::new(c),
                None => cache_views
                    .next()
                    .ok_or_else(|| self.harness("too few views of the shared cache".into()))?,
            };
            out.push((cache, cap));
        }
        Ok((out, layout))
    }

    /// Zone emulation formatted on shard `i`'s capacity fault device (`ways` shards'
    /// zones on a shared one).
    fn zone_emulation(
        &mut self,
        cap: FaultDevice,
        i: usize,
        ways: u32,
    ) -> Result<ZoneEmu<Powered>, Violation> {
        let mut zc = ZoneEmuConfig::new(self.geo.zone_blocks * BS);
        zc.zone_count_max = self.geo.zones * ways;
        zc.max_open_zones = 8 * ways;
        zc.max_active_zones = 8 * ways;
        let rail = self.rail.clone();
        ZoneEmu::format(Powered::numbered(cap, Side::Capacity, i, rail), &zc)
            .map_err(|e| self.harness(format!("zone emulation format: {e}")))
    }

    /// Drops the engine (no shutdown) and adds up its counters.
    fn end_engine(&mut self) {
        if let Some(e) = self.engine.take() {
            let s = e.stats();
            self.add_stats(&s);
            drop(e.abandon());
        }
    }

    fn add_stats(&mut self, s: &Stats) {
        let c = &mut self.counts;
        c.compaction_victims += s.compaction_victims;
        c.gc_victims += s.gc_victims;
        c.checkpoints += s.checkpoints;
        c.durability_points += s.durability_points;
        c.zone_resets += s.zone_resets;
        c.chunk_frees += s.chunk_frees;
        c.chunks_given += s.chunks_given;
        c.relocated_blocks += s.relocated_blocks;
        c.cold_read_blocks += s.cold_read_blocks;
        c.promotions_staged += s.promotions_staged;
        c.l2p_page_reads += s.l2p_page_reads;
        c.l2p_page_writes += s.l2p_page_writes;
        c.l2p_page_reads_ahead += s.l2p_page_reads_ahead;
        c.l2p_page_writes_ahead += s.l2p_page_writes_ahead;
        c.l2p_deferred_switches += s.l2p_deferred_switches;
        c.checkpoint_switches += s.checkpoint_switches;
        c.l2p_evictions_as_switches += s.l2p_evictions_as_switches;
        c.scrub_bytes += s.scrub_bytes;
        for x in [
            s.user_write_bytes,
            s.capacity_compaction_write_bytes,
            s.capacity_gc_write_bytes,
            s.checkpoints,
            s.zone_resets,
        ] {
            self.trace.mix(x);
        }
    }

    /// Errors mode: one kind of fault per lineage segment, on one device.
    fn inject_errors(&mut self) {
        let on_cache = self.rng.gen_bool(0.6);
        // One shard's device (a draw only on a pool of several: seeds of one replay).
        let shard = match self.cache_ctl.len() {
            0 | 1 => 0,
            n => self.rng.gen_range(0..n),
        };
        let ctl = if on_cache {
            self.cache_ctl.get(shard).cloned()
        } else {
            // A shared capacity device is every shard's.
            self.cap_ctl
                .get(shard.min(self.cap_ctl.len().saturating_sub(1)))
                .cloned()
        };
        let Some(ctl) = ctl else { return };
        let size = if on_cache {
            self.geo.cache_blocks * BS
        } else {
            self.geo.capacity_bytes()
        };
        let kind = self.rng.gen_range(0..6);
        let device = match (on_cache, self.cache_ctl.len()) {
            (true, 1) => "cache".to_string(),
            (false, 1) => "capacity".to_string(),
            (true, _) => format!("shard {shard} cache"),
            (false, _) if self.shared() => "shared capacity".to_string(),
            (false, _) => format!("shard {shard} capacity"),
        };
        let what = match kind {
            0 => {
                let ppm = self.rng.gen_range(100..=3000);
                ctl.set_error_rate(ppm, 0);
                format!("{device} read errors at {ppm} ppm")
            }
            1 => {
                let ppm = self.rng.gen_range(50..=1000);
                ctl.set_error_rate(0, ppm);
                format!("{device} write errors at {ppm} ppm")
            }
            2 | 3 => {
                let blocks = self.rng.gen_range(1..=64u64);
                let offset = self.rng.gen_range(0..size / BS) * BS;
                let remaining = self.rng.gen_range(1..=3);
                ctl.add_error_rule(ErrorRule {
                    reads: kind == 2,
                    writes: kind == 3,
                    offset,
                    len: blocks * BS,
                    remaining: Some(remaining),
                });
                format!(
                    "{device} {} errors for {remaining} requests at {offset}+{}",
                    if kind == 2 { "read" } else { "write" },
                    blocks * BS
                )
            }
            4 => {
                let skip = self.rng.gen_range(0..=30);
                ctl.fail_flushes(skip, 1);
                format!("{device} flush {} fails", skip + 1)
            }
            _ => {
                let (r, w) = (self.rng.gen_range(50..=500), self.rng.gen_range(50..=500));
                ctl.set_error_rate(r, w);
                format!("{device} read errors at {r} ppm, write errors at {w} ppm")
            }
        };
        self.injection = Some(what);
        self.trace.mix(0xE000 + kind);
        self.errors_on = true;
    }

    fn clear_errors(&mut self) {
        for c in self.cache_ctl.iter().chain(&self.cap_ctl) {
            c.clear_errors();
        }
        self.errors_on = false;
        self.injection = None;
    }

    // ---------------------------------------------------------------- cycles

    fn one_cycle(&mut self) -> Result<(), Violation> {
        let warmup = self.cfg.warmup_steps_max;
        let mut plan = plan::choose(&mut self.rng, warmup, self.cfg.deadline_steps);
        if let Some(only) = &self.cfg.only {
            for _ in 0..10_000 {
                if plan.moment.name().starts_with(only.as_str()) {
                    break;
                }
                plan = plan::choose(&mut self.rng, warmup, self.cfg.deadline_steps);
            }
        }
        self.counts.cycles += 1;
        self.trace.mix_str(&format!("{plan:?}"));
        self.log(|| format!("plan {plan:?}"));
        self.drive(plan.warmup_steps)?;
        if self.stopping() {
            self.counts.moment(self.stop_reason());
            return self.crash_and_recover(&plan);
        }
        match plan.moment {
            Moment::AfterShutdown => {
                self.counts.moment("after-shutdown");
                self.shutdown_cycle(None, &plan)
            }
            Moment::DuringShutdown(t) => self.shutdown_cycle(Some(t), &plan),
            _ => {
                let reached = self.drive_to(&plan)?;
                let name = plan.moment.name();
                match reached {
                    Reached::Moment => self.counts.moment(&name),
                    Reached::Missed => self.counts.moment(&format!("{name}:missed")),
                    Reached::EngineFailed => self.counts.moment(self.stop_reason()),
                }
                if self.cfg.mode == Mode::Live && !self.stopping() {
                    self.rail.restore();
                    self.live_check()
                } else {
                    self.crash_and_recover(&plan)
                }
            }
        }
    }

    /// Runs `steps` workload iterations (fewer if the engine fails).
    fn drive(&mut self, steps: u32) -> Result<(), Violation> {
        for _ in 0..steps {
            if self.stopping() {
                break;
            }
            self.step(true)?;
        }
        Ok(())
    }

    /// Runs the workload until the plan's moment.
    fn drive_to(&mut self, plan: &Plan) -> Result<Reached, Violation> {
        let observe = self.cfg.mode == Mode::Live;
        match plan.moment {
            Moment::Step { steps } => {
                self.drive(steps)?;
                Ok(if self.stopping() {
                    Reached::EngineFailed
                } else {
                    Reached::Moment
                })
            }
            Moment::When { cond, mut skip } => {
                let mut before = self.stats();
                for _ in 0..plan.deadline_steps {
                    self.step(true)?;
                    if self.stopping() {
                        return Ok(Reached::EngineFailed);
                    }
                    let now = self.stats();
                    if cond.holds(&before, &now) {
                        if skip == 0 {
                            return Ok(Reached::Moment);
                        }
                        skip -= 1;
                    }
                    before = now;
                }
                Ok(Reached::Missed)
            }
            Moment::Trip(mut t) => {
                t.observe_only = observe;
                self.rail.arm(t);
                for _ in 0..plan.deadline_steps {
                    self.step(true)?;
                    if self.rail.fired().is_some() {
                        return Ok(Reached::Moment);
                    }
                    if self.stopping() {
                        return Ok(Reached::EngineFailed);
                    }
                }
                self.rail.disarm();
                Ok(Reached::Missed)
            }
            Moment::AfterShutdown | Moment::DuringShutdown(_) => Ok(Reached::Moment),
        }
    }

    /// The cycle must end in a crash now: the engine failed, or a failed request
    /// left blocks whose content the model cannot follow exactly.
    fn stopping(&self) -> bool {
        self.engine_failed || self.model.has_unknown()
    }

    fn stop_reason(&self) -> &'static str {
        if self.engine_failed {
            "engine-failed"
        } else {
            "request-failed"
        }
    }

    fn stats(&self) -> Stats {
        self.engine.as_ref().map(|e| e.stats()).unwrap_or_default()
    }

    /// Settles requests, shuts down cleanly (or crashes inside the shutdown), then
    /// crashes the devices and reopens. After a clean shutdown nothing may be lost.
    fn shutdown_cycle(&mut self, trigger: Option<Trigger>, plan: &Plan) -> Result<(), Violation> {
        self.settle()?;
        if self.stopping() {
            self.counts.moment(self.stop_reason());
            return self.crash_and_recover(plan);
        }
        if let Some(mut t) = trigger {
            t.observe_only = self.cfg.mode == Mode::Live;
            self.rail.arm(t);
        }
        let Some(e) = self.engine.take() else {
            return Err(self.harness("no engine to shut down".into()));
        };
        let s = e.stats();
        self.add_stats(&s);
        self.log(|| "shutdown".into());
        self.rail.set_log_updates(self.cfg.log);
        let r = catch_unwind(AssertUnwindSafe(move || e.shutdown()));
        self.rail.set_log_updates(false);
        let fired = self.rail.fired().is_some();
        if let Some(t) = trigger {
            let name = format!("shutdown:{}", plan::target_name(t.target));
            if fired {
                self.counts.moment(&name);
            } else {
                self.counts.moment(&format!("{name}:missed"));
            }
        }
        self.rail.disarm();
        let cut = !self.rail.is_on();
        let clean = match r {
            Err(p) => {
                return Err(self.violation(
                    ViolationKind::Panic,
                    format!("engine panicked in shutdown: {}", panic_message(&*p)),
                ))
            }
            Ok(Ok(devices)) => {
                drop(devices);
                !cut
            }
            Ok(Err(e)) => {
                let injected = self.errors_on && caused_by_injection(&e);
                if !cut && !injected {
                    return Err(self.violation(
                        ViolationKind::ShutdownFailed,
                        format!("clean shutdown failed: {e}"),
                    ));
                }
                false
            }
        };
        self.drain()?;
        self.trace.mix(u64::from(clean));
        if clean {
            self.model.all_durable();
            self.admin_uncertain = None;
            let layouts = self.rail.layouts();
            let ctls = (self.cache_ctl.iter().map(|c| (Side::Cache, c)))
                .chain(self.cap_ctl.iter().map(|c| (Side::Capacity, c)));
            for (side, c) in ctls {
                for p in c.pending_writes().iter().filter(|p| !p.durable) {
                    let op = DevOp {
                        side,
                        device: 0,
                        kind: if p.discard {
                            DevOpKind::Discard
                        } else {
                            DevOpKind::Write
                        },
                        offset: p.offset,
                        len: p.len,
                    };
                    let key = format!("{:?}", layouts.place(&op));
                    *self.counts.pending_after_shutdown.entry(key).or_default() += 1;
                }
            }
        } else {
            self.counts.crashes_in_shutdown += 1;
        }
        self.clear_errors();
        self.counts.crashes += 1;
        self.rail.cut();
        let fired = self.rail.take_fired();
        self.note_lost_requests();
        let devices = self.crash_devices(fired.as_ref())?;
        self.recover(devices, plan.crash_open, clean)
    }

    /// Cuts the power where the engine is, crashes both devices, reopens.
    fn crash_and_recover(&mut self, plan: &Plan) -> Result<(), Violation> {
        self.counts.crashes += 1;
        self.rail.cut();
        self.clear_errors();
        let fired = self.rail.take_fired();
        if let Some(f) = &fired {
            self.trace.mix_str(&format!("{f:?}"));
            if self.cache_ctl.len() > 1 {
                *self.counts.cuts_by_shard.entry(f.op.device).or_default() += 1;
            }
        }
        self.end_engine();
        self.note_lost_requests();
        if self.cfg.mode == Mode::Kill {
            // A killed process: what it acknowledged is on the devices or in the
            // hand-off store, so the floor of every block is its last completed
            // version.
            let cut = self.model.cut();
            self.model.flushed(&cut);
        }
        let devices = self.crash_devices(fired.as_ref())?;
        self.recover(devices, plan.crash_open, false)
    }

    /// Requests in flight at a crash never complete; their versions stay allowed.
    fn note_lost_requests(&mut self) {
        for f in std::mem::take(&mut self.inflight).into_values() {
            if let Pending::Admin(op) = f.pending {
                self.admin_uncertain = Some(Uncertain {
                    op,
                    applied: false,
                    before: None,
                });
            }
        }
        lock(&self.inbox).clear();
        self.admin_waiting = None;
        self.admin_inflight = false;
        self.relist = false;
        self.reconcile_on_list = false;
        self.engine_failed = false;
        self.last_injected = None;
    }

    /// Crashes every shard's fault devices, each its own way; returns the restarted
    /// ones, in shard order (a shared capacity device after shard 0's cache).
    fn crash_devices(&mut self, fired: Option<&Fired>) -> Result<Crashed, Violation> {
        let caps = if self.shared() {
            1
        } else {
            self.cache_ctl.len()
        };
        if self.cache_ctl.is_empty() || self.cap_ctl.len() != caps {
            return Err(self.harness("no devices to crash".into()));
        }
        let mut out = Crashed {
            caches: Vec::with_capacity(self.cache_ctl.len()),
            capacities: Vec::with_capacity(caps),
        };
        for shard in 0..self.cache_ctl.len() {
            out.caches
                .push(self.crash_device(fired, Side::Cache, shard)?);
            if shard < caps {
                out.capacities
                    .push(self.crash_device(fired, Side::Capacity, shard)?);
            }
        }
        Ok(out)
    }

    /// Crashes one fault device: keeps, drops or tears its unflushed writes.
    fn crash_device(
        &mut self,
        fired: Option<&Fired>,
        side: Side,
        shard: usize,
    ) -> Result<FaultDevice, Violation> {
        let ctl = match side {
            Side::Cache => self.cache_ctl[shard].clone(),
            Side::Capacity => self.cap_ctl[shard].clone(),
        };
        let pending = ctl.pending_writes();
        let write = fired
            .filter(|f| f.op.side == side && f.op.device == shard)
            .and_then(|f| f.write);
        let (mode, name) = if self.cfg.mode == Mode::Kill {
            (CrashMode::KeepAll, "kill")
        } else {
            plan::crash_mode(&mut self.rng, &pending, write)
        };
        self.log(|| {
            format!(
                "crash {side:?} {shard}: {} pending ({} durable), fired {:?}: {mode:?}",
                pending.len(),
                pending.iter().filter(|p| p.durable).count(),
                fired.map(|f| (f.place, f.phase, f.op.offset, f.op.len)),
            )
        });
        let side_name = match side {
            Side::Cache => "cache",
            Side::Capacity => "capacity",
        };
        self.counts.crash_mode(&format!("{side_name}:{name}"));
        let (report, dev) = ctl
            .crash(&mode)
            .map_err(|e| self.harness(format!("crash {side_name} with {mode:?}: {e}")))?;
        if self.cfg.log {
            let desc = |ids: &[shale_device::WriteId]| -> Vec<String> {
                ids.iter()
                    .filter_map(|id| pending.iter().find(|p| p.id == *id))
                    .map(|p| {
                        format!(
                            "{}{}+{}",
                            if p.discard { "discard " } else { "" },
                            p.offset,
                            p.len
                        )
                    })
                    .collect()
            };
            eprintln!(
                "    {side_name}: kept {:?} dropped {:?} torn {:?}",
                desc(&report.applied),
                desc(&report.dropped),
                report.torn
            );
        }
        self.counts.torn_writes += u64::from(report.torn.is_some());
        self.counts.pending_kept += report.applied.len() as u64;
        self.counts.pending_dropped += report.dropped.len() as u64;
        self.trace.mix(report.applied.len() as u64);
        self.trace.mix(report.dropped.len() as u64);
        self.trace
            .mix(report.torn.map_or(0, |(id, b)| id.0 ^ (b << 40)));
        Ok(dev)
    }

    /// Opens the engine on crashed devices (possibly crashing again during the open),
    /// then verifies every volume; a refused open starts a new lineage.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn recover(
        &mut self,
        devices: Crashed,
        crash_open: Option<Trigger>,
        clean: bool,
    ) -> Result<(), Violation> {
        let mut devices = devices;
        let mut arm = if self.cfg.mode == Mode::Live {
            None
        } else {
            crash_open
        };
        let mut expect_clean = clean;
        // Runtime knobs may change across a restart; the stream count decides which
        // open zones the engine keeps using and which it finishes at open.
        if self.rng.gen_bool(0.3) {
            self.engine_config.streams_max =
                self.rng.gen_range(1..=self.cfg.engine.streams_max.max(1));
            self.trace.mix(u64::from(self.engine_config.streams_max));
        }
        for _ in 0..4 {
            self.rail.restore();
            if let Some(t) = arm.take() {
                self.rail.arm(t);
            }
            let rail = &self.rail;
            let Crashed { caches, capacities } = std::mem::take(&mut devices);
            let caches: Vec<Powered> = caches
                .into_iter()
                .enumerate()
                .map(|(i, c)| Powered::numbered(c, Side::Cache, i, rail.clone()))
                .collect();
            let capacities: Vec<Powered> = capacities
                .into_iter()
                .enumerate()
                .map(|(i, z)| Powered::numbered(z, Side::Capacity, i, rail.clone()))
                .collect();
            let shards = self.cfg.shards.max(1) as usize;
            self.rail.set_log_updates(self.cfg.log);
            let clock = self.clock.clone();
            let config = self.engine_config.clone();
            let log = self.cfg.log;
            let kill = self.cfg.mode == Mode::Kill;
            let handoffs: Vec<Option<Box<dyn Handoff>>> = self
                .handoff
                .iter()
                .map(|h| kill.then(|| Box::new(h.clone()) as Box<dyn Handoff>))
                .collect();
            let opened = catch_unwind(AssertUnwindSafe(move || -> Result<Pool, OpenFail> {
                let mut caps: Vec<Cap> = Vec::with_capacity(shards);
                for inner in capacities {
                    let cap = ZoneEmu::open(inner).map_err(OpenFail::Zone)?;
                    if log {
                        log_zones(&cap);
                    }
                    caps.push(Box::new(cap));
                }
                if caps.len() == 1 && shards > 1 {
                    let shared = caps.pop().map(|c| SharedZones::split(c, shards));
                    let views = shared
                        .transpose()
                        .map_err(|reason| OpenFail::Shards(ShardsError::Space { reason }))?;
                    caps = views
                        .into_iter()
                        .flatten()
                        .map(|v| Box::new(v) as Cap)
                        .collect();
                }
                let caches: Vec<Cache> = if caches.len() == 1 && shards > 1 {
                    // One cache for all, divided as shard 0's superblock says.
                    let mut cache = caches.into_iter().next().expect("one cache");
                    let split = shale_shards::cache::recorded_cache_split(&mut cache)
                        .map_err(OpenFail::Shards)?
                        .ok_or_else(|| {
                            OpenFail::Shards(ShardsError::Space {
                                reason: "shard 0's superblock does not divide the cache".into(),
                            })
                        })?;
                    shared_cache_views(cache, split)
                        .map_err(|reason| OpenFail::Shards(ShardsError::Space { reason }))?
                } else {
                    caches.into_iter().map(|c| Box::new(c) as Cache).collect()
                };
                let opened = caches.into_iter().zip(caps).collect();
                Pool::open_with(opened, || clock.clone(), &config, handoffs)
                    .map(|(pool, _)| pool)
                    .map_err(OpenFail::from_shards)
            }));
            let opened = match opened {
                Ok(o) => o,
                Err(p) => {
                    return Err(self.violation(
                        ViolationKind::Panic,
                        format!("panic while opening after a crash: {}", panic_message(&*p)),
                    ))
                }
            };
            let powered = self.rail.is_on();
            self.rail.disarm();
            self.rail.set_log_updates(false);
            self.log(|| {
                format!(
                    "open (power {}): {}",
                    if powered { "on" } else { "cut" },
                    match &opened {
                        Ok(_) => "ok".to_string(),
                        Err(OpenFail::Zone(e)) => format!("zone emulation: {e}"),
                        Err(OpenFail::Engine(e)) => format!("{e}"),
                        Err(OpenFail::Shards(e)) => format!("{e}"),
                    }
                )
            });
            if !powered {
                // A crash during the open: crash the devices again and retry.
                let fired = self.rail.take_fired();
                self.counts.crashes_in_open += 1;
                self.counts.moment("open:any-update");
                if let Ok(e) = opened {
                    drop(e.abandon());
                }
                expect_clean = false;
                devices = self.crash_devices(fired.as_ref())?;
                continue;
            }
            self.rail.restore();
            return match opened {
                Ok(e) => {
                    self.trace.mix(0x0BE4);
                    self.engine = Some(e);
                    self.verify_reopened(expect_clean)
                }
                Err(OpenFail::Engine(OpenError::NeedsRecovery)) if !expect_clean => {
                    self.trace.mix(0x4EED);
                    self.counts.needs_recovery += 1;
                    self.new_lineage()
                }
                Err(OpenFail::Engine(e)) => Err(self.violation(
                    ViolationKind::OpenFailed,
                    format!(
                        "open after {}: {e}",
                        if expect_clean {
                            "a clean shutdown and a crash"
                        } else {
                            "a crash"
                        }
                    ),
                )),
                Err(OpenFail::Zone(e)) => Err(self.violation(
                    ViolationKind::ZoneEmulationOpen,
                    format!("zone emulation would not reopen after a crash: {e}"),
                )),
                Err(OpenFail::Shards(e)) => Err(self.violation(
                    ViolationKind::OpenFailed,
                    format!("the shards would not open as one pool after a crash: {e}"),
                )),
            };
        }
        Err(self.harness("the open crashed four times in a row".into()))
    }

    /// After a successful open: self-check, the volume set, then every block of every
    /// volume against the model. What was read becomes the model's durable content.
    fn verify_reopened(&mut self, clean: bool) -> Result<(), Violation> {
        if clean {
            self.counts.clean_reopens += 1;
        } else {
            self.counts.recovered += 1;
        }
        self.self_check("after reopen")?;
        self.listed = None;
        self.submit_request(Request::ListVolumes, Pending::List);
        self.settle()?;
        let Some(listed) = self.listed.take() else {
            return Err(self.harness("volume list never came back".into()));
        };
        self.reconcile_volumes(&listed, false)?;
        let max = self.cfg.engine.request_bytes_max;
        let vols: Vec<(VolumeUid, u64)> = self
            .model
            .volumes()
            .iter()
            .map(|(&id, v)| (id, v.size_bytes()))
            .collect();
        for (volume, size) in vols {
            let mut off = 0;
            while off < size {
                let len = max.min(size - off);
                self.submit_request(
                    Request::Read {
                        volume,
                        offset: off,
                        len,
                    },
                    Pending::Verify {
                        volume,
                        offset: off,
                    },
                );
                off += len;
                if self.inflight.len() as u32 >= self.queue_depth.max(4) {
                    self.settle()?;
                }
            }
        }
        self.settle()?;
        self.model.forget_requests();
        self.generation += 1;
        self.trace.mix(0x7E41F1ED);
        if self.cfg.mode == Mode::Errors {
            self.inject_errors();
        }
        Ok(())
    }

    /// Matches the engine's volumes with the model's, settling an uncertain volume
    /// change either way. `live`: listed from the running engine after the change
    /// failed (then a change it shows done stays uncertain until a crash or a clean
    /// shutdown decides it); otherwise listed after a reopen.
    fn reconcile_volumes(&mut self, listed: &[VolumeInfo], live: bool) -> Result<(), Violation> {
        let view = |m: &Model| -> Vec<(u64, String, u64)> {
            m.volumes()
                .iter()
                .map(|(id, v)| (id.0, v.name.clone(), v.size_bytes()))
                .collect()
        };
        let mut got: Vec<(u64, String, u64)> = listed
            .iter()
            .map(|i| (i.uid.0, i.name.clone(), i.size_bytes))
            .collect();
        got.sort();
        let uncertain = self.admin_uncertain.take();
        self.log(|| format!("volumes {got:?}, uncertain change {uncertain:?}"));
        if got == view(&self.model) {
            if live {
                // Not done in memory either: nothing of it can become durable.
                self.admin_uncertain = None;
            } else if let Some(u) = uncertain.filter(|u| u.applied) {
                // Done and kept: durable now (recovery took a checkpoint).
                self.log(|| format!("kept: {:?}", u.op));
            }
            return Ok(());
        }
        if let Some(mut u) = uncertain {
            let mut m = self.model.clone();
            if !u.applied {
                match &u.op {
                    Op::Create {
                        name,
                        size_blocks,
                        shift,
                        ..
                    } => {
                        if let Some(i) = listed.iter().find(|i| &i.name == name) {
                            m.create_mapped(i.uid, name, *size_blocks, 1 << shift);
                        }
                    }
                    Op::Resize {
                        volume,
                        size_blocks,
                    } => m.resize(*volume, *size_blocks),
                    Op::Delete { volume } => m.delete(*volume),
                    _ => {}
                }
            } else {
                // Undone by the crash: the volume as it was before.
                match &u.op {
                    Op::Create { name, .. } => {
                        let id = m
                            .volumes()
                            .iter()
                            .find(|(_, v)| &v.name == name)
                            .map(|(&id, _)| id);
                        if let Some(id) = id {
                            m.restore(id, None);
                        }
                    }
                    Op::Resize { volume, .. } => match &u.before {
                        Some(b)
                            if b.size_blocks > m.volume(*volume).map_or(0, |v| v.size_blocks) =>
                        {
                            m.unshrink(*volume, b)
                        }
                        Some(b) => m.resize(*volume, b.size_blocks),
                        None => {}
                    },
                    Op::Delete { volume } => m.restore(*volume, u.before.clone()),
                    _ => {}
                }
            }
            if view(&m) == got {
                self.model = m;
                if live {
                    u.applied = true;
                    self.admin_uncertain = Some(u);
                }
                return Ok(());
            }
        }
        Err(self.violation(
            ViolationKind::VolumeSet,
            format!(
                "{} the engine has volumes {got:?}, the model {:?}",
                if live {
                    "after a failed volume change"
                } else {
                    "after reopen"
                },
                view(&self.model)
            ),
        ))
    }

    fn self_check(&mut self, when: &str) -> Result<(), Violation> {
        let Some(e) = self.engine.as_mut() else {
            return Err(self.harness("no engine".into()));
        };
        match catch_unwind(AssertUnwindSafe(|| e.self_check())) {
            Ok(Ok(())) => match e.stats().scrub_mapping_errors {
                0 => Ok(()),
                n => Err(self.violation(
                    ViolationKind::SelfCheck,
                    format!("{when}: the scrub found {n} valid blocks the L2P does not map"),
                )),
            },
            Ok(Err((shard, err))) => Err(self.violation(
                ViolationKind::SelfCheck,
                if self.cache_ctl.len() > 1 {
                    format!("self-check {when}, shard {shard}: {err}")
                } else {
                    format!("self-check {when}: {err}")
                },
            )),
            Err(p) => Err(self.violation(
                ViolationKind::Panic,
                format!("self-check {when} panicked: {}", panic_message(&*p)),
            )),
        }
    }

    /// Live mode: the engine as it runs must pass its self-check and read back the
    /// model's newest content everywhere.
    fn live_check(&mut self) -> Result<(), Violation> {
        self.counts.live_checks += 1;
        self.self_check("at a crash point")?;
        let max = self.cfg.engine.request_bytes_max;
        let vols: Vec<(VolumeUid, u64)> = self
            .model
            .volumes()
            .iter()
            .map(|(&id, v)| (id, v.size_bytes()))
            .collect();
        for (volume, size) in vols {
            let mut off = 0;
            while off < size {
                let len = max.min(size - off);
                self.submit(Op::Read {
                    volume,
                    offset: off,
                    len,
                });
                off += len;
            }
        }
        self.settle()
    }

    // ---------------------------------------------------------------- driving

    /// One engine loop iteration, with new requests first if `feed`.
    fn step(&mut self, feed: bool) -> Result<(), Violation> {
        if feed && !self.stopping() {
            self.feed();
        }
        let rebalance = self.draw_space_step(self.rail.is_on());
        let Some(e) = self.engine.as_mut() else {
            return Err(self.harness("no engine to poll".into()));
        };
        let powered = self.rail.is_on();
        self.rail.mark();
        let r = catch_unwind(AssertUnwindSafe(|| {
            let moved = rebalance.map(|batch| e.rebalance(batch));
            let progress = e.poll();
            if !progress && powered {
                e.wait_io();
            }
            moved
        }));
        if let Ok(Some(moved)) = &r {
            count_space_step(&mut self.counts, moved);
        }
        if self.rail.spun() {
            let s = e.stats();
            return Err(self.stuck(&s));
        }
        if let Err(p) = r {
            return Err(self.violation(
                ViolationKind::Panic,
                format!(
                    "engine panicked in poll{}: {}",
                    if self.rail.is_on() {
                        ""
                    } else {
                        " after the power was cut"
                    },
                    panic_message(&*p)
                ),
            ));
        }
        if let Some(p) = self.submit_panic.take() {
            return Err(self.violation(
                ViolationKind::Panic,
                format!("engine panicked in a volume change across shards: {p}"),
            ));
        }
        self.clock.advance_ns(STEP_NS);
        self.step += 1;
        self.drain()?;
        if let Some((&op, f)) = self.inflight.iter().next() {
            // A failed engine answers everything it holds at once; what it did not
            // answer it has lost.
            // (Shards that did not fail answer in their own time: only a pool of one
            // is checked at once.)
            let failure = self
                .engine
                .as_ref()
                .filter(|e| e.engines().len() == 1)
                .and_then(|e| e.failure())
                .map(|(_, reason)| reason);
            if let (Some(reason), true) = (failure, self.rail.is_on()) {
                return Err(self.violation(
                    ViolationKind::Stuck,
                    format!(
                        "request {op} ({}) was never answered by the failed engine: {reason}",
                        f.pending.kind()
                    ),
                ));
            }
            if self.step - f.step > self.cfg.request_steps_max && self.rail.is_on() {
                let s = self.engine.as_ref().map(Pool::stats).unwrap_or_default();
                return Err(self.violation(
                    ViolationKind::Stuck,
                    format!(
                        "request {op} ({}) not completed after {} iterations; {} in flight; stats: free chunks {}/{}, free zones {}/{}, staged {}, durability points {}, checkpoints {}/{}, compaction victims {}, GC victims {}",
                        f.pending.kind(),
                        self.step - f.step,
                        self.inflight.len(),
                        s.free_chunks,
                        s.chunk_count,
                        s.free_zones,
                        s.data_zone_count,
                        s.staged_blocks,
                        s.durability_points,
                        s.checkpoints,
                        s.checkpoints_started,
                        s.compaction_victims,
                        s.gc_victims,
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Polls without new work until nothing is in flight.
    fn settle(&mut self) -> Result<(), Violation> {
        let mut n = 0u64;
        while !self.inflight.is_empty() || self.admin_waiting.is_some() || self.relist {
            if !self.rail.is_on() || self.engine_failed {
                break;
            }
            // A waiting volume change goes out once the queue is empty.
            let feed = (self.admin_waiting.is_some() || self.relist) && self.inflight.is_empty();
            if feed {
                self.feed();
            }
            self.step(false)?;
            n += 1;
            if n > self.cfg.request_steps_max {
                return Err(self.violation(
                    ViolationKind::Stuck,
                    format!("{} requests still in flight", self.inflight.len()),
                ));
            }
        }
        Ok(())
    }

    /// Submits new workload requests, keeping the queue depth; volume changes go out
    /// alone.
    fn feed(&mut self) {
        if self.relist {
            if self.inflight.is_empty() {
                self.relist = false;
                self.reconcile_on_list = true;
                self.submit_request(Request::ListVolumes, Pending::List);
            }
            return;
        }
        if self.reconcile_on_list {
            return;
        }
        if let Some(op) = self.admin_waiting.take() {
            if self.inflight.is_empty() {
                self.admin_inflight = true;
                self.submit(op);
            } else {
                self.admin_waiting = Some(op);
            }
            return;
        }
        if self.admin_inflight {
            return;
        }
        let room = self.queue_depth.saturating_sub(self.inflight.len() as u32);
        if room == 0 {
            return;
        }
        let n = self.rng.gen_range(0..=room.min(4));
        for _ in 0..n {
            match self.workload.next(&self.model) {
                // One undecided volume change at a time.
                Some(op) if op.is_admin() && self.admin_uncertain.is_some() => {}
                Some(op) if op.is_admin() => {
                    self.admin_waiting = Some(op);
                    break;
                }
                Some(op) => self.submit(op),
                None => {}
            }
        }
    }

    /// Updates the model for a request and submits it.
    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn submit(&mut self, op: Op) {
        let id = self.next_op;
        let (req, pending) = match op {
            Op::Write {
                volume,
                offset,
                data,
                fua,
            } => {
                self.counts.bytes_written += data.len() as u64;
                self.trace.mix(block_hash(&data));
                let range = self.model.write(id, volume, offset, &data);
                (
                    Request::Write {
                        volume,
                        offset,
                        data,
                        fua,
                    },
                    Pending::Write { range, fua },
                )
            }
            Op::Read {
                volume,
                offset,
                len,
            } => {
                let expected = self.model.newest(volume, offset, len).unwrap_or_default();
                (
                    Request::Read {
                        volume,
                        offset,
                        len,
                    },
                    Pending::Read {
                        volume,
                        offset,
                        expected,
                    },
                )
            }
            Op::Trim {
                volume,
                offset,
                len,
            } => {
                // Advisory for partial blocks (units): only whole ones are unmapped.
                let unit = self.model.volume(volume).map_or(1, |v| v.unit_blocks) * BS;
                let lo = offset.div_ceil(unit) * unit;
                let hi = (offset + len) / unit * unit;
                if lo < hi {
                    self.model.zero(id, volume, lo, hi - lo);
                } else {
                    self.model.submitted(id);
                }
                (
                    Request::Trim {
                        volume,
                        offset,
                        len,
                    },
                    Pending::Change,
                )
            }
            Op::WriteZeroes {
                volume,
                offset,
                len,
            } => {
                self.model.zero(id, volume, offset, len);
                (
                    Request::WriteZeroes {
                        volume,
                        offset,
                        len,
                    },
                    Pending::Change,
                )
            }
            Op::Flush if self.cfg.phantom_flushes && self.lineage_prefilled => {
                self.next_op += 1;
                let cut = self.model.cut();
                self.model.flushed(&cut);
                return;
            }
            Op::Flush => {
                let cut = self.model.cut();
                self.model.submitted(id);
                (Request::Flush, Pending::Flush { cut })
            }
            Op::Create {
                ref name,
                size_blocks,
                shift,
                dual,
            } => (
                Request::CreateVolumeWith {
                    name: name.clone(),
                    size_bytes: size_blocks * BS,
                    layout: shale_engine::VolumeLayout {
                        map_unit_shift: shift,
                        dual,
                    },
                },
                Pending::Admin(op),
            ),
            Op::Resize {
                volume,
                size_blocks,
            } => (
                Request::ResizeVolume {
                    volume,
                    size_bytes: size_blocks * BS,
                },
                Pending::Admin(op),
            ),
            Op::Delete { volume } => (Request::DeleteVolume { volume }, Pending::Admin(op)),
        };
        self.submit_request(req, pending);
    }

    /// The largest mapping unit shift volumes may take: 64 KiB, or a pool's granule
    /// (a unit never spans shards).
    fn unit_shift_max(&self, shards: usize) -> u8 {
        // And what the zones take: 126 data slots in each group of 128 blocks.
        let zone_slots = self.geo.zone_blocks / 128 * 126;
        let max = shale_engine::max_map_unit_shift(zone_slots);
        if shards > 1 {
            ((self.granule / BS).trailing_zeros() as u8).min(max)
        } else {
            max
        }
    }

    /// Gives the volume created last a cache share (10-40%) and a GC policy, both
    /// from `i`, so compaction order and GC choice differ from the default's.
    fn set_policies(&mut self, i: u64) -> Result<(), Violation> {
        let Some(&uid) = self.model.volumes().keys().next_back() else {
            return Ok(());
        };
        let limits = shale_engine::VolumeLimits {
            cache_share_pct: 10 + (i * 13 % 31) as u8,
            gc: [
                shale_engine::VolumeGc::CostBenefit,
                shale_engine::VolumeGc::Greedy,
                shale_engine::VolumeGc::Pool,
            ][(i % 3) as usize],
            ..shale_engine::VolumeLimits::NONE
        };
        self.submit_request(
            Request::SetVolumeLimits {
                volume: uid,
                limits,
            },
            Pending::Limits,
        );
        self.settle()
    }

    fn submit_request(&mut self, req: Request, pending: Pending) {
        let id = self.next_op;
        self.next_op += 1;
        self.counts.requests += 1;
        self.count_across_shards(&req);
        self.trace.mix(id);
        self.trace.mix_str(request_kind(&req));
        self.inflight.insert(
            id,
            InFlight {
                pending,
                step: self.step,
            },
        );
        let inbox = Arc::clone(&self.inbox);
        let rail = self.rail.clone();
        let done = Box::new(move |result: Result<Reply, EngineError>| {
            let after_cut = !rail.is_on();
            lock(&inbox).push(Done {
                op: id,
                after_cut,
                result,
            });
        });
        if let Some(e) = self.engine.as_mut() {
            // Volume changes across shards run to completion inside `submit`.
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| e.submit(req, done))) {
                self.submit_panic = Some(panic_message(&*p));
            }
        }
    }

    /// Counts a request that a pool of several shards splits, or a volume change it
    /// makes shard by shard.
    fn count_across_shards(&mut self, req: &Request) {
        let Some(map) = self.engine.as_ref().map(Pool::map) else {
            return;
        };
        if map.shards() == 1 {
            return;
        }
        match *req {
            Request::Read { offset, len, .. }
            | Request::Trim { offset, len, .. }
            | Request::WriteZeroes { offset, len, .. } => {
                self.counts.requests_split += u64::from(map.single(offset, len).is_none());
            }
            Request::Write {
                offset, ref data, ..
            } => {
                let len = data.len() as u64;
                self.counts.requests_split += u64::from(map.single(offset, len).is_none());
            }
            Request::CreateVolume { .. }
            | Request::ResizeVolume { .. }
            | Request::DeleteVolume { .. }
            | Request::SetVolumeLimits { .. } => self.counts.volume_changes_across_shards += 1,
            _ => {}
        }
    }

    /// Applies completions to the model and checks them.
    fn drain(&mut self) -> Result<(), Violation> {
        let done = std::mem::take(&mut *lock(&self.inbox));
        for d in done {
            let Some(f) = self.inflight.remove(&d.op) else {
                return Err(self.harness(format!("completion for unknown request {}", d.op)));
            };
            self.trace.mix(d.op);
            if d.after_cut || d.result.is_err() {
                // Unknown or failed: the reads waiting for it are explained.
                self.deferred.retain(|r| !r.waits.contains(&d.op));
            } else {
                self.settle_deferred(d.op)?;
            }
            if d.after_cut {
                // Nobody saw it: the request stays in flight as far as the model knows.
                self.trace.mix(0xC07);
                if let Pending::Admin(op) = f.pending {
                    self.admin_uncertain = Some(Uncertain {
                        op,
                        applied: false,
                        before: None,
                    });
                    self.admin_inflight = false;
                }
                continue;
            }
            match d.result {
                Ok(reply) => self.on_ok(d.op, f.pending, reply)?,
                Err(e) => self.on_err(d.op, f.pending, e)?,
            }
        }
        Ok(())
    }

    /// `op` succeeded: a deferred read waiting only for it was wrong.
    fn settle_deferred(&mut self, op: OpId) -> Result<(), Violation> {
        for r in &mut self.deferred {
            r.waits.retain(|&w| w != op);
        }
        if let Some(i) = self.deferred.iter().position(|r| r.waits.is_empty()) {
            let r = self.deferred.remove(i);
            return Err(self.violation(ViolationKind::WrongData, r.detail));
        }
        Ok(())
    }

    /// With errors injected, the writes of blocks `blocks` of `volume` and the
    /// changes submitted before read `op` and still in flight (`DeferredRead`).
    fn earlier_changes(
        &self,
        op: OpId,
        volume: VolumeUid,
        blocks: std::ops::Range<u64>,
    ) -> Vec<OpId> {
        if !self.errors_on {
            return Vec::new();
        }
        self.inflight
            .range(..op)
            .filter(|(_, f)| match &f.pending {
                Pending::Write { range, .. } => {
                    range.volume == volume && range.first < blocks.end && blocks.start < range.end
                }
                Pending::Change => true,
                _ => false,
            })
            .map(|(&id, _)| id)
            .collect()
    }

    #[allow(clippy::too_many_lines, reason = "predates the limit; to be split")]
    fn on_ok(&mut self, op: OpId, pending: Pending, reply: Reply) -> Result<(), Violation> {
        match pending {
            Pending::Write { range, fua } => {
                self.model.completed(op);
                if fua {
                    self.model.durable(op, range);
                }
            }
            Pending::Change => self.model.completed(op),
            Pending::Limits => {
                if !matches!(reply, Reply::Volume(_)) {
                    return Err(self.harness(format!("limits got {reply:?}")));
                }
            }
            Pending::Flush { cut } => {
                self.model.completed(op);
                self.model.flushed(&cut);
            }
            Pending::Read {
                volume,
                offset,
                expected,
            } => {
                let Reply::Read(data) = reply else {
                    return Err(self.harness(format!("read {op} got {reply:?}")));
                };
                self.trace.mix(u64::from(shale_format::crc32c(&data)));
                self.counts.blocks_verified += (data.len() as u64).div_ceil(BS);
                if data != expected && !self.explained_by_failure(volume, offset, &data, &expected)
                {
                    let at = data
                        .iter()
                        .zip(&expected)
                        .position(|(a, b)| a != b)
                        .unwrap_or(data.len().min(expected.len()));
                    let byte = offset + at as u64;
                    let detail = format!(
                        "read {op} of {volume} {offset}+{} returned {} bytes differing from the newest content first at byte {byte} (block {})",
                        expected.len(),
                        data.len(),
                        byte / BS
                    );
                    let blocks = offset / BS..(offset + data.len() as u64).div_ceil(BS);
                    let waits = self.earlier_changes(op, volume, blocks);
                    if waits.is_empty() {
                        return Err(self.violation(ViolationKind::WrongData, detail));
                    }
                    self.counts.reads_judged_later += 1;
                    self.deferred.push(DeferredRead { waits, detail });
                }
            }
            Pending::Verify { volume, offset } => {
                let Reply::Read(data) = reply else {
                    return Err(self.harness(format!("read {op} got {reply:?}")));
                };
                self.trace.mix(u64::from(shale_format::crc32c(&data)));
                for (i, b) in data.chunks(BS as usize).enumerate() {
                    let lba = offset / BS + i as u64;
                    if self.model.is_unverifiable(volume, lba) {
                        self.counts.blocks_unverifiable += 1;
                        self.model.observe(volume, lba, b);
                        continue;
                    }
                    if let Err(m) = self.model.check(volume, lba, b) {
                        return Err(self.violation(
                            ViolationKind::WrongDataAfterCrash,
                            format!("after the crash: {m}"),
                        ));
                    }
                    let older = self
                        .model
                        .allowed(volume, lba)
                        .is_some_and(|a| a.len() > 1 && a[a.len() - 1].1 != block_hash(b));
                    if older {
                        self.counts.blocks_older += 1;
                    }
                    self.model.observe(volume, lba, b);
                    self.counts.blocks_verified += 1;
                }
            }
            Pending::Admin(a) => {
                self.log(|| format!("volume change done: {a:?}"));
                self.admin_inflight = false;
                match (&a, reply) {
                    (
                        Op::Create {
                            name,
                            size_blocks,
                            shift,
                            dual,
                        },
                        Reply::Volume(info),
                    ) => {
                        self.trace.mix(u64::from(info.id.0));
                        self.model
                            .create_mapped(info.uid, name, *size_blocks, 1 << shift);
                        self.counts.unit_volumes += u64::from(*shift > 0);
                        self.counts.dual_volumes += u64::from(*dual);
                    }
                    (
                        Op::Resize {
                            volume,
                            size_blocks,
                        },
                        Reply::Volume(_),
                    ) => self.model.resize(*volume, *size_blocks),
                    (Op::Delete { volume }, Reply::Done) => self.model.delete(*volume),
                    (a, r) => {
                        return Err(self.harness(format!("{a:?} got {r:?}")));
                    }
                }
            }
            Pending::List => {
                let Reply::Volumes(v) = reply else {
                    return Err(self.harness(format!("list got {reply:?}")));
                };
                if self.reconcile_on_list {
                    self.reconcile_on_list = false;
                    self.reconcile_volumes(&v, true)?;
                } else {
                    self.listed = Some(v);
                }
            }
        }
        Ok(())
    }

    /// A live read differing from the newest content is still right where a failed
    /// request left blocks old or new: each differing block must be one of its
    /// allowed versions, or one the model cannot follow (counted).
    fn explained_by_failure(
        &mut self,
        volume: VolumeUid,
        offset: u64,
        data: &[u8],
        expected: &[u8],
    ) -> bool {
        if !self.model.has_unknown() || data.len() != expected.len() {
            return false;
        }
        let first = offset / BS;
        let end = (offset + data.len() as u64).div_ceil(BS);
        let mut unverifiable = 0;
        for lba in first..end {
            let lo = (lba * BS).max(offset);
            let hi = ((lba + 1) * BS).min(offset + data.len() as u64);
            let (lo, hi) = ((lo - offset) as usize, (hi - offset) as usize);
            if data[lo..hi] == expected[lo..hi] {
                continue;
            }
            if self.model.is_unverifiable(volume, lba) {
                unverifiable += 1;
                continue;
            }
            if !self.model.is_unknown(volume, lba) {
                return false;
            }
            if hi - lo < BS as usize {
                // Part of a block: the model keeps only hashes of older versions.
                unverifiable += 1;
                continue;
            }
            if self.model.check(volume, lba, &data[lo..hi]).is_err() {
                return false;
            }
        }
        self.counts.blocks_unverifiable += unverifiable;
        true
    }

    fn on_err(&mut self, op: OpId, pending: Pending, e: EngineError) -> Result<(), Violation> {
        self.trace.mix_str(&e.to_string());
        self.log(|| format!("request {op} ({}) failed: {e}", pending.kind()));
        if let Pending::Admin(a) = &pending {
            self.admin_inflight = false;
            // A dual volume the L2P pool has no room for at its largest: refused,
            // nothing changed.
            if matches!(&e, EngineError::InvalidVolume { reason } if reason.contains("no L2P room for a"))
            {
                self.counts.dual_refusals += 1;
                return Ok(());
            }
            let before = match a {
                Op::Resize { volume, .. } | Op::Delete { volume } => {
                    self.model.volume(*volume).cloned()
                }
                _ => None,
            };
            self.admin_uncertain = Some(Uncertain {
                op: a.clone(),
                applied: false,
                before,
            });
        }
        if self.errors_on && caused_by_injection(&e) {
            self.counts.injected_errors_surfaced += 1;
            self.last_injected = Some(e.to_string());
            if matches!(pending, Pending::Admin(_)) {
                self.relist = true;
            }
            if let Pending::Write { .. } | Pending::Change = &pending {
                self.model.failed(op);
            }
            if matches!(e, EngineError::Failed { .. }) && !self.engine_failed {
                self.engine_failed = true;
                self.counts.engine_failures_injected += 1;
            }
            return Ok(());
        }
        let kind = if self.errors_on {
            ViolationKind::UnexplainedError
        } else {
            ViolationKind::RequestFailed
        };
        Err(self.violation(
            kind,
            format!("request {op} ({}) failed: {e}", pending.kind()),
        ))
    }
}

fn request_kind(r: &Request) -> &'static str {
    match r {
        Request::Read { .. } => "read",
        Request::Write { .. } => "write",
        Request::Trim { .. } => "trim",
        Request::WriteZeroes { .. } => "zeroes",
        Request::Flush => "flush",
        Request::CreateVolume { .. }
        | Request::CreateVolumeWith { .. }
        | Request::CreateSlice { .. } => "create",
        Request::ResizeVolume { .. } | Request::ResizeSlice { .. } => "resize",
        Request::DeleteVolume { .. } => "delete",
        Request::SetVolumeLimits { .. } => "limits",
        Request::ListVolumes => "list",
        Request::Stats => "stats",
        Request::SelfCheck => "self-check",
        Request::Allocation { .. } => "allocation",
        Request::GiveZones { .. } => "give zones",
        Request::TakeZones { .. } => "take zones",
        Request::ForeignZones => "foreign zones",
        Request::GiveChunks { .. } => "give chunks",
        Request::TakeChunks { .. } => "take chunks",
        Request::ForeignChunks => "foreign chunks",
    }
}
