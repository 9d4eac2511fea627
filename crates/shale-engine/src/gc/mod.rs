//! Garbage collection of capacity zones: `policy.rs` chooses, `cleaner.rs` (the
//! ZoneCleaner, a Mover in the GC role) moves live blocks into per-stream GC zones,
//! never mixed with compaction writes.

pub(crate) mod cleaner;
pub mod policy;
