//! Open and recovery as an ordered list of named steps (docs/recovery.md).
//!
//! Every open runs: superblock, capacity label, checkpoint, volume table, journal,
//! L2P directories; after a clean shutdown then census and resume; after a crash
//! (dirty) replay plan, md scan, resolve, census, regions and a new checkpoint; both
//! end with the self-check. Each step logs its name, duration and the bytes it read
//! (tracing), and reports its start, its progress through long loops and its end to
//! the caller's [`OpenProgress`] (`progress`; the CLI draws them on a terminal).
//!
//! - `load`: the superblock, label, checkpoint and volume table copies, choosing the
//!   valid copies and reporting the others;
//! - `journal_scan`: the journal entries written since the checkpoint;
//! - `progress`: the events a caller sees while the open runs, sent at a bounded rate;
//! - `replay`: which regions to scan and how far, the md scan, conflict resolution
//!   with the SID rules, and applying the result to the L2P.

pub(crate) mod journal_scan;
pub(crate) mod load;
pub(crate) mod progress;
pub(crate) mod replay;

pub(crate) use progress::Meter;
pub use progress::{NoProgress, OpenEvent, OpenProgress};

/// One step of an open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepReport {
    pub name: &'static str,
    /// Engine clock time the step took.
    pub duration_ns: u64,
    /// Bytes the step read from either device.
    pub bytes_read: u64,
    /// A short summary of what it found.
    pub detail: String,
}

/// What replay found (all zero after a clean shutdown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayCounts {
    /// Journal entries read since the checkpoint.
    pub journal_entries: u64,
    pub trims: u64,
    pub regions_scanned: u64,
    /// Regions whose logged life was found reused by a newer, unlogged one (skipped).
    pub regions_reused: u64,
    pub md_groups_read: u64,
    /// md entries of scanned regions that name a block.
    pub entries_seen: u64,
    /// Of those, entries that won their LBA and were mapped.
    pub entries_applied: u64,
    /// Entries that lost to a newer write or trim.
    pub entries_superseded: u64,
    /// Entries of deleted volumes, out of range, or otherwise not mappable.
    pub entries_ignored: u64,
    /// Zones with writes nothing recorded (the crash lost their opening), reset.
    pub stray_zones_reset: u64,
}

/// What `Engine::open` did: the steps, warnings about damaged copies it did not use,
/// and replay counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// The devices had been shut down cleanly (no replay).
    pub clean: bool,
    pub steps: Vec<StepReport>,
    /// Damaged or surprising metadata found and worked around (a corrupt mirror copy,
    /// a torn md or journal write, a newer checkpoint than the superblock names...).
    pub warnings: Vec<String>,
    pub replay: ReplayCounts,
}

impl OpenReport {
    pub fn duration_ns(&self) -> u64 {
        self.steps.iter().map(|s| s.duration_ns).sum()
    }

    pub fn bytes_read(&self) -> u64 {
        self.steps.iter().map(|s| s.bytes_read).sum()
    }

    pub(crate) fn warn(&mut self, msg: String) {
        tracing::warn!(problem = %msg, "open");
        self.warnings.push(msg);
    }
}

/// Times the steps with the engine clock, logs them and reports them to the caller's
/// [`OpenProgress`].
pub(crate) struct Steps<'p> {
    progress: &'p mut dyn OpenProgress,
    /// Index of the step running (or next to run).
    index: usize,
    /// Unknown until the journal says whether the open replays.
    total: Option<usize>,
    started: u64,
    name: &'static str,
}

impl<'p> Steps<'p> {
    pub fn new(progress: &'p mut dyn OpenProgress) -> Steps<'p> {
        Steps {
            progress,
            index: 0,
            total: None,
            started: 0,
            name: "",
        }
    }

    /// The number of steps, once the open knows whether it must replay.
    pub fn set_total(&mut self, total: usize) {
        self.total = Some(total);
    }

    /// Step `name` starts at engine-clock time `now`.
    pub fn begin(&mut self, now: u64, name: &'static str) {
        self.name = name;
        self.started = now;
        self.progress.event(&OpenEvent::StepStarted {
            index: self.index,
            total: self.total,
            name,
        });
    }

    /// Counts the running step's units (`unit` names them, plural).
    pub fn meter(&mut self, unit: &'static str) -> Meter<'_> {
        Meter::new(&mut *self.progress, self.name, unit)
    }

    /// The running step ends at `now`.
    pub fn end(&mut self, now: u64, report: &mut OpenReport, bytes_read: u64, detail: String) {
        let duration_ns = now.saturating_sub(self.started);
        tracing::info!(
            step = self.name,
            duration_ms = duration_ns as f64 / 1e6,
            bytes_read,
            detail = %detail,
            "open step"
        );
        report.steps.push(StepReport {
            name: self.name,
            duration_ns,
            bytes_read,
            detail,
        });
        if let Some(step) = report.steps.last() {
            self.progress.event(&OpenEvent::StepFinished {
                index: self.index,
                step,
            });
        }
        self.index += 1;
    }
}
