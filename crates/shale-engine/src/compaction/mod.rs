//! Compaction: moving live blocks out of closed cache chunks into per-stream capacity
//! zones. `policy.rs` only chooses a victim; the mover (`mover/`, shared with GC) does
//! the I/O.

pub mod policy;
