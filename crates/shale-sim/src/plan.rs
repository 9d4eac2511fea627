//! Crash points, and how a crash treats the writes in flight.
//!
//! A crash point is chosen per cycle, biased toward the moments where a crash is most
//! likely to expose a bug: while compaction or GC relocate blocks, at the metadata
//! writes of a durability point or checkpoint (journal, partial md, L2P pages,
//! checkpoint area, superblock), at chunk and zone closes and zone resets, inside a
//! clean shutdown, and during the open that follows a crash. Plain random moments and
//! crashes after a clean shutdown are in the mix too.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use shale_device::{CrashMode, PendingWriteInfo, TearUnit, WriteId};
use shale_engine::Stats;

use crate::power::{Phase, Target, Trigger};

/// A condition on the engine's counters between two loop iterations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Condition {
    /// Compaction wrote to a zone or took a new victim in this iteration.
    Compaction,
    /// GC wrote to a zone or took a new victim in this iteration.
    Gc,
    /// Relocated blocks are staged in memory (a victim is being drained).
    Relocating,
    /// A zone was reset in this iteration (a durability point released it).
    ZoneReset,
    /// A chunk was freed in this iteration.
    ChunkFreed,
    /// A checkpoint was taken in this iteration.
    Checkpoint,
}

impl Condition {
    pub fn holds(self, before: &Stats, now: &Stats) -> bool {
        match self {
            Condition::Compaction => {
                now.capacity_compaction_write_bytes > before.capacity_compaction_write_bytes
                    || now.compaction_victims > before.compaction_victims
            }
            Condition::Gc => {
                now.capacity_gc_write_bytes > before.capacity_gc_write_bytes
                    || now.gc_victims > before.gc_victims
            }
            Condition::Relocating => now.staged_blocks > 0,
            Condition::ZoneReset => now.zone_resets > before.zone_resets,
            Condition::ChunkFreed => now.chunk_frees > before.chunk_frees,
            Condition::Checkpoint => now.checkpoints > before.checkpoints,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Condition::Compaction => "compaction",
            Condition::Gc => "gc",
            Condition::Relocating => "relocating",
            Condition::ZoneReset => "zone-reset",
            Condition::ChunkFreed => "chunk-freed",
            Condition::Checkpoint => "checkpoint",
        }
    }
}

pub fn target_name(t: Target) -> &'static str {
    match t {
        Target::Metadata => "metadata",
        Target::Superblock => "superblock",
        Target::Checkpoint => "checkpoint",
        Target::Journal => "journal",
        Target::L2p => "l2p",
        Target::VolumeTable => "volume-table",
        Target::ChunkMd => "chunk-md",
        Target::ChunkClose => "chunk-close",
        Target::ZoneWrite => "zone-write",
        Target::ZoneClose => "zone-close",
        Target::ZoneTable => "zone-table",
        Target::ZoneReset => "zone-reset",
        Target::CacheFlush => "cache-flush",
        Target::CapacityFlush => "capacity-flush",
        Target::AnyUpdate => "any-update",
        Target::Bytes { .. } => "bytes",
    }
}

/// When the crash happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// Between two engine loop iterations, after this many.
    Step { steps: u32 },
    /// Between two iterations where `cond` held, skipping the first `skip` of them.
    When { cond: Condition, skip: u32 },
    /// At a device operation, inside an iteration.
    Trip(Trigger),
    /// After a clean shutdown (the devices are crashed anyway; nothing may be lost).
    AfterShutdown,
    /// At a device operation inside a clean shutdown.
    DuringShutdown(Trigger),
}

impl Moment {
    pub fn name(&self) -> String {
        match self {
            Moment::Step { .. } => "step".into(),
            Moment::When { cond, .. } => format!("when:{}", cond.name()),
            Moment::Trip(t) => format!("trip:{}", target_name(t.target)),
            Moment::AfterShutdown => "after-shutdown".into(),
            Moment::DuringShutdown(t) => format!("shutdown:{}", target_name(t.target)),
        }
    }
}

/// One cycle's plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    /// Workload iterations before the moment is armed.
    pub warmup_steps: u32,
    pub moment: Moment,
    /// Iterations after arming before giving up on the moment (then the crash
    /// happens there, counted as missed).
    pub deadline_steps: u32,
    /// Crash the open that follows, at this operation (a crash during recovery).
    pub crash_open: Option<Trigger>,
}

fn trigger(rng: &mut ChaCha8Rng, target: Target, nth_max: u32) -> Trigger {
    Trigger {
        target,
        nth: rng.gen_range(1..=nth_max.max(1)),
        phase: if rng.gen_bool(0.4) {
            Phase::Before
        } else {
            Phase::After
        },
        observe_only: false,
    }
}

/// Chooses a plan. Weights favour the dangerous moments (see the module docs).
pub fn choose(rng: &mut ChaCha8Rng, warmup_max: u32, deadline_steps: u32) -> Plan {
    use Condition as C;
    use Target as T;
    // (weight, what)
    enum Pick {
        Step,
        When(C),
        Trip(T, u32),
        AfterShutdown,
        DuringShutdown,
    }
    let table: [(u32, Pick); 24] = [
        (8, Pick::Step),
        (10, Pick::When(C::Compaction)),
        (10, Pick::When(C::Gc)),
        (6, Pick::When(C::Relocating)),
        (3, Pick::When(C::ZoneReset)),
        (3, Pick::When(C::ChunkFreed)),
        (3, Pick::When(C::Checkpoint)),
        (3, Pick::Trip(T::Metadata, 30)),
        (4, Pick::Trip(T::Checkpoint, 6)),
        (4, Pick::Trip(T::Superblock, 4)),
        (4, Pick::Trip(T::Journal, 8)),
        (5, Pick::Trip(T::L2p, 30)),
        (1, Pick::Trip(T::VolumeTable, 1)),
        (4, Pick::Trip(T::ChunkMd, 20)),
        (4, Pick::Trip(T::ChunkClose, 3)),
        (6, Pick::Trip(T::ZoneWrite, 20)),
        (4, Pick::Trip(T::ZoneClose, 3)),
        (3, Pick::Trip(T::ZoneTable, 6)),
        (3, Pick::Trip(T::ZoneReset, 3)),
        (3, Pick::Trip(T::CacheFlush, 8)),
        (2, Pick::Trip(T::CapacityFlush, 6)),
        (3, Pick::Trip(T::AnyUpdate, 200)),
        (5, Pick::AfterShutdown),
        (6, Pick::DuringShutdown),
    ];
    let total: u32 = table.iter().map(|e| e.0).sum();
    let mut r = rng.gen_range(0..total);
    let mut pick = &table[0].1;
    for (w, p) in &table {
        if r < *w {
            pick = p;
            break;
        }
        r -= w;
    }
    let warmup_steps = rng.gen_range(0..=warmup_max);
    let moment = match *pick {
        Pick::Step => Moment::Step {
            steps: rng.gen_range(1..=warmup_max.max(1)),
        },
        Pick::When(cond) => Moment::When {
            cond,
            skip: rng.gen_range(0..4),
        },
        Pick::Trip(t, n) => Moment::Trip(trigger(rng, t, n)),
        Pick::AfterShutdown => Moment::AfterShutdown,
        Pick::DuringShutdown => {
            // The shutdown checkpoint: L2P write-back, partial md, checkpoint area,
            // the clean superblock, and the zone resets after it.
            let t = match rng.gen_range(0..6) {
                0 => trigger(rng, T::AnyUpdate, 40),
                1 => trigger(rng, T::L2p, 10),
                2 => trigger(rng, T::Checkpoint, 1),
                3 => trigger(rng, T::Superblock, 1),
                // Zone table persists: the capacity flush of the checkpoint, then
                // the resets of zones freed since the last durability point.
                4 => trigger(rng, T::ZoneTable, 4),
                _ => trigger(rng, T::ZoneReset, 2),
            };
            Moment::DuringShutdown(t)
        }
    };
    let crash_open = rng.gen_bool(0.12).then(|| trigger(rng, T::AnyUpdate, 8));
    Plan {
        warmup_steps,
        moment,
        deadline_steps,
        crash_open,
    }
}

/// Picks how a crash treats one device's non-durable pending writes. `fired` is the
/// write the power was cut right after, if it went to this device: it is torn half
/// of the time.
pub fn crash_mode(
    rng: &mut ChaCha8Rng,
    pending: &[PendingWriteInfo],
    fired: Option<(WriteId, u64)>,
) -> (CrashMode, &'static str) {
    let optional: Vec<&PendingWriteInfo> = pending.iter().filter(|p| !p.durable).collect();
    if let Some((id, len)) = fired {
        let unit = if rng.gen_bool(0.5) { 512 } else { 4096 };
        if len > unit && optional.iter().any(|p| p.id == id) && rng.gen_bool(0.5) {
            let keep = optional
                .iter()
                .filter(|p| p.id != id && rng.gen_bool(0.5))
                .map(|p| p.id)
                .collect();
            let keep_bytes = rng.gen_range(1..len.div_ceil(unit)) * unit;
            return (
                CrashMode::TearWrite {
                    keep,
                    id,
                    keep_bytes,
                },
                "tear-write",
            );
        }
    }
    match rng.gen_range(0..100) {
        0..=24 => (CrashMode::DropAll, "drop-all"),
        25..=59 => (
            CrashMode::KeepRandomSubset { seed: rng.gen() },
            "keep-random",
        ),
        60..=79 => (
            CrashMode::Tear {
                seed: rng.gen(),
                unit: TearUnit::Sector512,
            },
            "tear-512",
        ),
        80..=94 => (
            CrashMode::Tear {
                seed: rng.gen(),
                unit: TearUnit::Block4096,
            },
            "tear-4k",
        ),
        _ => (CrashMode::KeepAll, "keep-all"),
    }
}
