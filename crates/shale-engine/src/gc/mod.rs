//! Garbage collection of capacity zones: `policy.rs` chooses; the mover (`mover/`, in
//! the GC role) moves live blocks into per-stream GC zones, never mixed with compaction
//! writes.

pub mod policy;
