//! Shale's translation layer: a log-structured, two-tier FTL over a cache device
//! (append-only chunks) and a capacity device (append-only zones).
//!
//! The data path, in the order of the modules:
//! - `request`: what clients send ([`Request`]) and get back ([`Reply`]).
//! - `engine`: the single-threaded event loop ([`Engine`]): queue, poll, completions
//!   routed to the role that owns them, durability points.
//! - `core`: what every role shares (devices, regions, L2P, journal, buffers, the I/O
//!   table); each role owns its own state and takes the core as an argument.
//! - `write/`: user writes appended to the open chunk's group buffers, md entries, runs.
//! - `l2p/`: per-volume directories and the L2P page cache.
//! - `space/`: region states, validity bitmaps, free lists.
//! - `read/`: the reader (from memory or device, verified against md), the md cache, the
//!   block-status query.
//! - `flush`: the durability role (partial md, device flushes, FlushPoints, deferred free).
//! - `mover/`: the mover that relocates live blocks (two instances: compaction, GC);
//!   `compaction/`, `gc/`: their victim policies (pure).
//! - `background`: pacing of compaction, GC, durability points, checkpoints (pure).
//! - `prefetch`: L2P pages loaded ahead of queued requests.
//! - `journal`, `checkpoint`, `open`: persistence; `volume`: volume admin.
//! - `recovery/`: open and recovery after a crash as a table of named steps (declared in
//!   `open`; [`OpenReport`]), reported while they run to an [`OpenProgress`].
//! - `metrics` ([`Stats`]), `selfcheck`, `thread` ([`EngineThread`]).
//! - `check`: the offline checker behind `shale check` ([`check()`]).
#![forbid(unsafe_code)]
// No clock reads or threads inside the engine (the list is in clippy.toml).
#![deny(clippy::disallowed_methods)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod background;
mod buffers;
mod census;
pub mod check;
mod checkpoint;
mod clock;
pub mod compaction;
mod config;
mod copies;
mod core;
mod engine;
mod error;
mod flush;
pub mod gc;
mod handoff;
mod hash;
mod journal;
mod l2p;
mod layout;
mod metrics;
mod mover;
mod open;
mod placement;
mod prefetch;
mod read;
mod recovery;
mod request;
mod scrub;
mod selfcheck;
#[cfg(feature = "paranoid")]
pub use selfcheck::disable_paranoid_checks;
mod space;
mod thread;
mod throttle;
mod tier;
mod volume;
pub use volume::max_unit_shift as max_map_unit_shift;
mod write;

pub use check::{check, CheckCounts, CheckOptions, CheckReport, Finding, Severity};
pub use clock::{Clock, ManualClock, MonotonicClock};
pub use compaction::policy::{CompactionPolicyKind, RegionSnapshot, VictimPolicy};
pub use config::{Config, DirectWritePolicy};
pub use engine::{Engine, Location, Tier};
pub use error::{
    ConfigError, EngineError, FormatDeviceError, OpenError, RecoveryError, SelfCheckError,
};
pub use gc::policy::GcPolicyKind;
pub use handoff::{Handoff, MemHandoff};
pub use metrics::{Stats, VolumeStats};
pub use open::format_layout;
pub use placement::PlacementKind;
pub use recovery::{NoProgress, OpenEvent, OpenProgress, OpenReport, ReplayCounts, StepReport};
pub use request::{
    Completion, Extent, Reply, Request, VolumeInfo, VolumeLayout, ALLOCATION_QUERY_BYTES_MAX,
};
pub use thread::EngineThread;

pub use shale_format::{Lba, Pba, Sid, VolumeGc, VolumeId, VolumeLimits, VolumeUid};
