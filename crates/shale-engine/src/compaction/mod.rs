//! Compaction: moving live blocks out of closed cache chunks into per-stream capacity
//! zones. `policy.rs` only chooses a victim; `compactor.rs` (the Mover, shared with GC)
//! does the I/O.

pub(crate) mod compactor;
pub mod policy;
pub(crate) mod stream;
